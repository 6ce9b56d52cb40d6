"""compare model --engine SPEC --reference SPEC: a real engine's next-token
distributions against a reference run of the same model, teacher-forced over
one token sequence, and the first greedy divergence from a prompt.

The reference tokenises the text; each engine's own tokenizer must give the
same ids (a BOS the engine prepends is named as a shift and left out, so both
read the same tokens; any other difference ends the run, naming the first
position: statistics over misaligned tokens would mean nothing). The
distribution statistics are numerics/distribution's, as in --metrics, with
the reference in the fp32 column; beside them the max |Δ logit| after
removing each row's constant shift (softmax ignores one): half the row's
range of differences, the smallest max |Δ - c| over all shifts c.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from precisionlab.engines import protocol
from precisionlab.engines.registry import DEFAULT_PROMPT, open_engine
from precisionlab.errors import RunError, UsageError
from precisionlab.experiments import logits as lexp
from precisionlab.experiments import startup
from precisionlab.experiments.startup import default_reference, token_check  # noqa: F401 (their home before)
from precisionlab.numerics import distribution
from precisionlab.numerics.metrics import exact_mean
from precisionlab.runtime import memory

DEFAULT_TOKENS = 512  # the engines re-run whole windows; 512 positions take seconds on a tiny model


@dataclass
class EnginesConfig:
    engines: list[str]
    reference: str | None = None  # None: the source the engines' export recorded, else the embedded model
    text: str | None = None
    tokens: int = DEFAULT_TOKENS
    steps: int = 50
    prompt: str = DEFAULT_PROMPT
    device: str = "cpu"
    max_kld: float | None = None
    min_top1: float | None = None


@dataclass
class EnginesResult:
    params: dict
    reference: dict
    rows: list[dict]
    failures: list[str]
    takeaways: list[str] = field(default_factory=list)
    timing: dict = field(default_factory=dict)


def shifted_max_abs(ref: np.ndarray, low: np.ndarray) -> float:
    """max over rows of min_c max_j |low - ref - c|: (max - min) / 2 of each row's differences."""
    d = low.astype(np.float64) - ref.astype(np.float64)
    return float(np.max((d.max(axis=1) - d.min(axis=1)) / 2)) if d.size else 0.0


def bit_identical(ref: np.ndarray, low: np.ndarray) -> bool:
    """Every logit the same bits (float32 widened to float64 exactly, so -0 and
    +0 differ); a NaN on either side is never identical (two NaNs never agree)."""
    if ref.shape != low.shape or np.isnan(ref).any() or np.isnan(low).any():
        return False
    return bool(np.array_equal(np.ascontiguousarray(ref, dtype=np.float64).view(np.uint64),
                               np.ascontiguousarray(low, dtype=np.float64).view(np.uint64)))


def _encode(engine, text: str, need: int, source: str):
    if not engine.vocabulary:  # e.g. an ONNX file without one: it reads the reference's ids
        return None
    return engine.prefix_ids(text, need + 1, source)[:need + 1]  # one more: room for a BOS


def _greedy(engine, model, prompt_ids, steps):
    return protocol.greedy(engine, model, prompt_ids, steps, strict=False)


def _divergence(ref_tokens, eng_tokens, ref_rows) -> tuple[int | None, float | None]:
    """The first step where the two greedy paths differ, and the reference's top-1 - top-2 margin there."""
    div = next((i for i, (a, b) in enumerate(zip(ref_tokens, eng_tokens, strict=False)) if a != b), None)
    if div is None:
        return None, None
    top = np.sort(ref_rows[div])[-2:]
    return div, float(top[1] - top[0])


def _endpoint_greedy(eng, prompt_ids, steps, ref_tokens, ref_rows) -> dict:
    """--steps through an endpoint's own decoding (generates), or a refusal naming what is missing: a top-k
    stream has no logits for protocol.greedy, and a "-" would read as "no divergence"."""
    if steps == 0:
        return {"greedy_steps": 0, "greedy_diverged_at": None, "reference_margin_at_divergence": None}
    got = eng.generate(prompt_ids, steps)
    div, margin = _divergence(ref_tokens, got, ref_rows)
    if div is None and len(got) < steps:
        div = len(got)  # it stopped (an end token) where the reference went on
    return {"greedy_steps": len(got), "greedy_diverged_at": div, "reference_margin_at_divergence": margin}


def _top_k_row(spec, eng, ref, ref_model, ids, targets, n, device, advance, greedy) -> dict:
    """An endpoint that returns only the top K log-probabilities: a KLD lower
    bound (top K plus one tail bucket) and top-1 agreement; greedy decoding
    through the endpoint's own completions (greedy: prompt_ids, steps,
    ref_tokens, ref_rows)."""
    import torch

    if greedy[1]:  # refused before any request: the metrics alone would leave --steps silently unanswered
        protocol.require(eng, "generates", f"--steps {greedy[1]} (greedy decoding; --steps 0 skips it)", UsageError)
    t1 = time.perf_counter()
    vocab = int(ref.info()["vocab"])
    eng.bind(lambda i: ref.decode([i]), vocab)
    bounds, agree = [], []
    for start in range(0, n, ref.window):
        stop = min(n, start + ref.window)
        R = lexp.to_numpy(ref.forward(ref_model, torch.tensor([ids[start:stop]], device=device))[0])
        R = R.astype(np.float64)
        top = eng.top_logprobs(ids[start:stop + 1])
        bounds.append(distribution.kl_lower_bound_top_k(distribution.log_softmax(R), top))
        agree.append(np.array([bool(t) and max(t, key=t.get) == int(np.argmax(r)) for t, r in zip(top, R, strict=False)]))
        advance()
    b, a = np.concatenate(bounds), np.concatenate(agree)
    checked = ("checked against the echo" if eng.echoes_prompt
               else "sent as token ids, one prefix a request (no echo to check them against)")
    return {"engine_spec": spec, "engine": eng.info(), "tokens": f"the reference's ids, {checked}",
            "positions": int(b.size), "kld_lower_bound_mean": exact_mean(b),
            "kld_lower_bound_max": float(np.max(b)), "top_k": eng.top_k,
            "kld_note": "a lower bound: KL over the endpoint's top k tokens plus one bucket for the rest",
            "top1_agree_pct": 100.0 * int(a.sum()) / a.size, **_endpoint_greedy(eng, *greedy),
            "engine_s": time.perf_counter() - t1}


def _estimate(shapes: list, tokens: int) -> int:
    """runtime/memory.compare_engine from the reference's shape and the engines'; 0 where the reference's
    cannot be read (its loader's own error follows)."""
    if shapes[0] is None:
        return 0
    return memory.compare_engine(shapes[0], shapes[1:], tokens)


def run(cfg: EnginesConfig, advance=lambda k=1: None) -> EnginesResult:
    lexp.check_gates(cfg.max_kld, cfg.min_top1)
    if cfg.tokens <= 0:
        raise UsageError(f"--tokens must be > 0 (got {cfg.tokens})")
    startup.check_run(cfg.steps, cfg.prompt, zero_steps_ok=True)
    text = lexp.read_text(cfg.text) if cfg.text else lexp.default_text()
    source = f"--text {cfg.text!r}" if cfg.text else "the held-out Shakespeare text"
    device = startup.device(cfg.device)
    t0 = time.perf_counter()
    ref_spec, ref_from = default_reference(cfg.reference, cfg.engines)
    # every engine's memory, the reference's and the largest engine's, before any of them loads: they are
    # then opened one after another
    startup.check_memory([startup.Load(s, device, cfg.steps, cfg.prompt) for s in (ref_spec, *cfg.engines)],
                         lambda shapes: _estimate(shapes, cfg.tokens),
                         f"compare engine --reference {ref_spec} --tokens {cfg.tokens}")
    import torch

    ref = open_engine(ref_spec, device)
    ref_model = ref.model("fp32")
    ids = lexp.token_ids(ref, text, cfg.tokens + 1, source)
    prompt_ids = ref.prompt_ids(cfg.prompt, cfg.steps)
    targets = np.asarray(ids[1:], dtype=np.int64)
    n = cfg.tokens
    rows, failures = [], []
    with startup.numerics(), torch.no_grad():
        ref_tokens, ref_rows = _greedy(ref, ref_model, prompt_ids, cfg.steps)
        ref_windows: dict[tuple[int, int], np.ndarray] = {}
        for spec in cfg.engines:
            eng = open_engine(spec, device)
            if eng.top_k is not None:
                rows.append(_top_k_row(spec, eng, ref, ref_model, ids, targets, n, device, advance,
                                       (prompt_ids, cfg.steps, ref_tokens, ref_rows)))
                continue
            eng_model = eng.model("fp32")
            t1 = time.perf_counter()
            tokens_note = token_check(ids, _encode(eng, text, cfg.tokens + 1, source), spec)
            prompt_note = token_check(prompt_ids, _encode(eng, cfg.prompt, len(prompt_ids), "--prompt"), spec)
            window = min(ref.window, eng.window)
            ref_parts, eng_parts = [], []
            forward_s = 0.0
            for start in range(0, n, window):
                chunk = ids[start:min(n, start + window)]
                x = torch.tensor([chunk], device=device)
                if (start, window) not in ref_windows:
                    ref_windows[start, window] = lexp.to_numpy(ref.forward(ref_model, x)[0]).astype(np.float64)
                ref_parts.append(ref_windows[start, window])
                t2 = time.perf_counter()
                eng_parts.append(lexp.to_numpy(eng.forward(eng_model, x)[0]).astype(np.float64))
                forward_s += time.perf_counter() - t2
                advance()
            R, E = np.concatenate(ref_parts), np.concatenate(eng_parts)
            if R.shape != E.shape:
                raise RunError(f"{spec}: {E.shape[1]} logits per position against the reference's {R.shape[1]}")
            stats = distribution.position_stats(R, E, targets)
            eng_tokens, _ = _greedy(eng, eng_model, prompt_ids, cfg.steps)
            div, margin = _divergence(ref_tokens, eng_tokens, ref_rows)
            row = {"engine_spec": spec, "engine": eng.info(), "tokens": tokens_note, "prompt_tokens": prompt_note,
                   **distribution.summarize(stats), "max_abs_diff_shifted": shifted_max_abs(R, E),
                   "max_abs_diff": float(np.max(np.abs(E - R))) if R.size else 0.0,
                   "bit_identical": bit_identical(R, E), "forward_s": forward_s,
                   "greedy_steps": cfg.steps, "greedy_diverged_at": div, "reference_margin_at_divergence": margin,
                   "engine_s": time.perf_counter() - t1}
            rows.append(row)
            eng.close()
    # takeaways and the gates name a row by its `dtype`; here that is the engine's spec
    full = [{**r, "dtype": r["engine_spec"]} for r in rows if "kld_mean" in r]
    failures = lexp.gate_failures(full, cfg.max_kld, cfg.min_top1)
    params = {"engines": cfg.engines, "reference": ref_spec, "reference_from": ref_from, "text": cfg.text or
              "held-out Shakespeare (last 5 %)", "tokens": n, "steps": cfg.steps, "prompt": cfg.prompt,
              "device": device}
    bound_lines = [f"{r['engine_spec']}: KLD >= {r['kld_lower_bound_mean']:.3g} nats on average (a lower bound from "
                   f"the top {r['top_k']} log-probabilities and a tail bucket), top-1 agreement "
                   f"{r['top1_agree_pct']:.2f} %." for r in rows if "kld_mean" not in r]
    return EnginesResult(params, ref.info(), rows, failures, lexp.takeaways(full) + bound_lines,
                         {"run_s": time.perf_counter() - t0})
