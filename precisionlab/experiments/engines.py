"""compare engine --engine SPEC --reference SPEC: a real engine's next-token
distributions against a reference run of the same model, teacher-forced over
one token sequence, and the first greedy divergence from a prompt.

Both sides read the same tokens: the reference tokenises the text and the
engine reads those ids (every engine here takes ids). Where the engine's own
tokenizer would split the text otherwise, that is reported as a finding of
its own (experiments/token_agreement: where, how often, which kind of split),
not a refusal; a BOS the engine prepends is named as a shift. The reference's
side (ids, greedy path, teacher-forced logits) is computed once per model,
text and settings and kept in io/reference_cache, so further engines and
further runs read it without loading the reference. Greedy decoding runs
through each engine's session (llama.cpp's own KV cache: each step evaluates
one token). The distribution statistics are numerics/distribution's, as in
compare metrics, with the reference in the fp32 column; beside them the max
|Δ logit| after removing each row's constant shift (softmax ignores one):
half the row's range of differences, the smallest max |Δ - c| over all
shifts c.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from precisionlab.engines import protocol
from precisionlab.io import reference_cache
from precisionlab.engines.registry import DEFAULT_PROMPT, open_engine
from precisionlab.errors import RunError, UsageError
from precisionlab.experiments import logits as lexp
from precisionlab.experiments import startup, token_agreement
from precisionlab.experiments.startup import default_reference, token_check  # noqa: F401 (their home before)
from precisionlab.numerics import distribution
from precisionlab.numerics.metrics import exact_mean
from precisionlab.runtime import memory, progress

DEFAULT_TOKENS = 512  # one window of teacher forcing; seconds on a tiny model


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
    reference_cache: bool = True  # the reference's logits read from / written to io/reference_cache
    chat: bool = False  # --chat: --prompt under the reference's chat template (the ids every engine reads)


@dataclass
class EnginesResult:
    params: dict
    reference: dict
    rows: list[dict]
    failures: list[str]
    takeaways: list[str] = field(default_factory=list)
    timing: dict = field(default_factory=dict)


def _widened(ref: np.ndarray, low: np.ndarray):
    """(ref, low) a block of rows at a time, each widened to float64 (exactly): as the statistics read them
    (distribution.BLOCK_ENTRIES), never two float64 copies of the whole matrices (400 MB at 512 x 49,152,
    written and read back through memory)."""
    k = max(1, distribution.BLOCK_ENTRIES // max(1, ref.shape[1]))
    for i in range(0, ref.shape[0], k):
        yield (np.ascontiguousarray(ref[i:i + k], dtype=np.float64),
               np.ascontiguousarray(low[i:i + k], dtype=np.float64))


def shifted_max_abs(ref: np.ndarray, low: np.ndarray) -> float:
    """max over rows of min_c max_j |low - ref - c|: (max - min) / 2 of each row's differences."""
    if not low.size:
        return 0.0
    return float(np.max([np.max((d.max(axis=1) - d.min(axis=1)) / 2) for d in (b - a for a, b in _widened(ref, low))]))


def max_abs_diff(ref: np.ndarray, low: np.ndarray) -> float:
    """max |low - ref| over every logit, in float64 (NaN where either side has one)."""
    return float(np.max([np.max(np.abs(b - a)) for a, b in _widened(ref, low)])) if low.size else 0.0


def bit_identical(ref: np.ndarray, low: np.ndarray) -> bool:
    """Every logit the same bits (float32 widened to float64 exactly, so -0 and
    +0 differ); a NaN on either side is never identical (two NaNs never agree)."""
    if ref.shape != low.shape:
        return False
    return all(not (np.isnan(a).any() or np.isnan(b).any()) and np.array_equal(a.view(np.uint64), b.view(np.uint64))
               for a, b in _widened(ref, low))


def _encode(engine, text: str, need: int, source: str):
    if not engine.vocabulary:  # e.g. an ONNX file without one: it reads the reference's ids
        return None
    return engine.prefix_ids(text, need + 1, source)[:need + 1]  # one more: room for a BOS


def _greedy(engine, model, prompt_ids, steps):
    return protocol.greedy(engine, model, prompt_ids, steps, strict=False)


def _divergence(ref_tokens, eng_tokens, ref_margins) -> tuple[int | None, float | None]:
    """The first step where the two greedy paths differ, and the reference's top-1 - top-2 margin there."""
    div = next((i for i, (a, b) in enumerate(zip(ref_tokens, eng_tokens, strict=False)) if a != b), None)
    if div is None or div >= len(ref_margins):
        return div, None
    return div, float(ref_margins[div])


def _endpoint_greedy(eng, prompt_ids, steps, ref_tokens, ref_margins) -> dict:
    """--steps through an endpoint's own decoding (generates), or a refusal naming what is missing: a top-k
    stream has no logits for protocol.greedy, and a "-" would read as "no divergence"."""
    if steps == 0:
        return {"greedy_steps": 0, "greedy_diverged_at": None, "reference_margin_at_divergence": None}
    got = eng.generate(prompt_ids, steps)
    div, margin = _divergence(ref_tokens, got, ref_margins)
    if div is None and len(got) < steps:
        div = len(got)  # it stopped (an end token) where the reference went on
    return {"greedy_steps": len(got), "greedy_diverged_at": div, "reference_margin_at_divergence": margin}


def _top_k_row(spec, eng, ref, ref_model, ids, targets, n, device, advance, greedy) -> dict:
    """An endpoint that returns only the top K log-probabilities: a KLD lower
    bound (top K plus one tail bucket) and top-1 agreement; greedy decoding
    through the endpoint's own completions (greedy: prompt_ids, steps,
    ref_tokens, ref_margins)."""
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


def _tokens(ref_ids: list[int], eng_ids: list[int] | None, spec: str, eng) -> tuple[str, dict | None]:
    """(the `tokens` note, the disagreement finding or None): the engine reads the reference's ids
    either way, so a tokenizer that splits the text otherwise is reported, never a refusal."""
    try:
        return token_check(ref_ids, eng_ids, spec), None
    except RunError:
        pass
    if eng_ids and ref_ids and eng_ids[0] != ref_ids[0] and eng_ids[1:2] == ref_ids[:1]:
        eng_ids = eng_ids[1:]  # a BOS the engine prepends is the shift token_check names, not a split
    found = token_agreement.finding(ref_ids, eng_ids, lambda i: eng.decode([i]))
    return ("differ: the engine read the reference's ids; its own tokenizer splits the text otherwise, "
            + token_agreement.describe(found)), found


def _prompt_note(eng, cfg: EnginesConfig, prompt_ids: list[int], spec: str) -> str:
    """The `prompt_tokens` note: the engine's own ids for the prompt (under its own chat template with --chat)
    against the reference's, which it read."""
    if not cfg.chat:
        return _tokens(prompt_ids, _encode(eng, cfg.prompt, len(prompt_ids), "--prompt"), spec, eng)[0]
    if not eng.chats:
        return "the reference's chat-templated ids (--chat; the engine applies no chat template of its own)"
    try:
        own = eng.chat_ids(cfg.prompt)
    except UsageError as e:  # this file has no template of its own: the reference's ids stand
        return f"the reference's chat-templated ids ({e})"
    return _tokens(prompt_ids, own, spec, eng)[0]


class Reference:
    """The reference's side of compare engine: its ids, greedy path and
    teacher-forced logits, from io/reference_cache where an entry matches, else
    computed (the reference opened then, once) and stored there."""

    def __init__(self, spec: str, cfg: EnginesConfig, text: str, source: str, device: str, use_cache: bool):
        import torch

        self.spec, self.cfg, self.text, self.source, self.device = spec, cfg, text, source, device
        self.use_cache = use_cache
        self._eng = self._model = None
        self.hits, self.misses, self.compute_s = 0, 0, 0.0
        self.settings = {"text_sha256": reference_cache.text_digest(text), "tokens": cfg.tokens, "dtype": "fp32",
                         "device": device, "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
        # the greedy part's own settings: the teacher-forced logits do not depend on them, so a run with other
        # --steps or another --prompt reads the text's logits from the cache and computes only its greedy path
        self.greedy = {"prompt": cfg.prompt, "chat": cfg.chat, "steps": cfg.steps}
        self.identity = reference_cache.model_identity(spec, _own_files(spec)) if use_cache else {}

    def engine(self):
        """The reference itself, opened on first use."""
        if self._eng is None:
            self._eng = open_engine(self.spec, self.device)
            self._model = self._eng.model("fp32")
        return self._eng, self._model

    def _entry(self, part: str, compute, **more):
        k = reference_cache.key(self.identity, part=part, **self.settings, **more) if self.use_cache else ""
        got = reference_cache.load(k) if self.use_cache else None
        if got is not None:
            self.hits += 1
            return got
        self.misses += 1
        t = time.perf_counter()
        meta, arrays = compute()
        self.compute_s += time.perf_counter() - t
        if self.use_cache:
            reference_cache.store(k, meta, arrays)
        return meta, arrays

    def start(self):
        """(info, window, ids, prompt_ids, greedy tokens, greedy margins: top-1 minus top-2 at each step)."""
        def compute():
            ref, model = self.engine()
            ids = lexp.token_ids(ref, self.text, self.cfg.tokens + 1, self.source)
            prompt_ids = ref.prompt_ids(self.cfg.prompt, self.cfg.steps, self.cfg.chat)
            tokens, rows = _greedy(ref, model, prompt_ids, self.cfg.steps)
            top = np.sort(rows, axis=1)[:, -2:] if len(tokens) else np.zeros((0, 2))
            margins = top[:, 1] - top[:, 0] if top.shape[1] == 2 else np.zeros(len(tokens))
            return ({"info": ref.info(), "window": ref.window},
                    {"ids": np.asarray(ids, np.int64), "prompt_ids": np.asarray(prompt_ids, np.int64),
                     "greedy": np.asarray(tokens, np.int64), "margins": np.asarray(margins, np.float64)})

        meta, a = self._entry("start", compute, **self.greedy)
        return (meta["info"], int(meta["window"]), a["ids"].tolist(), a["prompt_ids"].tolist(), a["greedy"].tolist(),
                a["margins"])

    def rows(self, ids: list[int], window: int, advance):
        """(n, vocab) logits at every position of ids[:n], each window of `window` positions one forward."""
        import torch

        def compute():
            ref, model = self.engine()
            parts = []
            for start in range(0, self.cfg.tokens, window):
                progress.stage("reference windows", start // window, -(-self.cfg.tokens // window))
                x = torch.tensor([ids[start:min(self.cfg.tokens, start + window)]], device=self.device)
                parts.append(reference_cache.compact(lexp.to_numpy(ref.forward(model, x)[0])))
                advance()
            return {}, {"logits": np.concatenate(parts)}

        return self._entry("logits", compute, window=window)[1]["logits"]

    def note(self) -> dict:
        where = str(reference_cache.cache_dir()) if self.use_cache else None
        return {"reference_cache": "off" if not self.use_cache else ("hit" if not self.misses else
                                                                       "miss" if not self.hits else "partly"),
                "reference_cache_dir": where, "reference_s": self.compute_s}


def _own_files(spec: str) -> list:
    """The files that make a model its spec names no file of (the embedded model: weights and code)."""
    if spec.partition(":")[0] != "embedded":
        return []
    from pathlib import Path

    from precisionlab.engines import charlm, embedded

    return [charlm.DEFAULT_WEIGHTS, Path(charlm.__file__), Path(embedded.__file__)]


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
    startup.check_chat(ref_spec, cfg.chat, "--reference")
    # every engine's memory, the reference's and the largest engine's, before any of them loads: they are
    # then opened one after another
    startup.check_memory([startup.Load(s, device, cfg.steps, cfg.prompt) for s in (ref_spec, *cfg.engines)],
                         lambda shapes: _estimate(shapes, cfg.tokens),
                         f"compare engine --reference {ref_spec} --tokens {cfg.tokens} --steps {cfg.steps}")
    import torch

    rows = []
    with startup.numerics(), torch.no_grad():
        ref = Reference(ref_spec, cfg, text, source, device, cfg.reference_cache)
        ref_info, ref_window, ids, prompt_ids, ref_tokens, ref_margins = ref.start()
        for spec in cfg.engines:
            rows.append(_engine_row(spec, cfg, ref, ref_window, ids, prompt_ids, ref_tokens, ref_margins, text,
                                    source, device, advance))
    # takeaways and the gates name a row by its `dtype`; here that is the engine's spec
    full = [{**r, "dtype": r["engine_spec"]} for r in rows if "kld_mean" in r]
    failures = lexp.gate_failures(full, cfg.max_kld, cfg.min_top1)
    params = {"engines": cfg.engines, "reference": ref_spec, "reference_from": ref_from, "text": cfg.text or
              "held-out Shakespeare (last 5 %)", "tokens": cfg.tokens, "steps": cfg.steps, "prompt": cfg.prompt,
              "chat": cfg.chat, "device": device}
    bound_lines = [f"{r['engine_spec']}: KLD >= {r['kld_lower_bound_mean']:.3g} nats on average (a lower bound from "
                   f"the top {r['top_k']} log-probabilities and a tail bucket), top-1 agreement "
                   f"{r['top1_agree_pct']:.2f} %." for r in rows if "kld_mean" not in r]
    token_lines = [f"{r['engine_spec']}: its own tokenizer splits the text otherwise than the reference's "
                   f"({token_agreement.describe(r['token_disagreement'])}); it read the reference's ids."
                   for r in rows if r.get("token_disagreement")]
    return EnginesResult(params, ref_info, rows, failures, lexp.takeaways(full) + bound_lines + token_lines,
                         {"run_s": time.perf_counter() - t0, **ref.note()})


def _engine_row(spec, cfg, ref, ref_window, ids, prompt_ids, ref_tokens, ref_margins, text, source, device,
                advance) -> dict:
    """One engine's row: opened, teacher-forced over the reference's ids, greedy from its prompt ids, closed."""
    import torch

    eng = open_engine(spec, device)
    if eng.top_k is not None:
        ref_eng, ref_model = ref.engine()
        return _top_k_row(spec, eng, ref_eng, ref_model, ids, ids[1:], cfg.tokens, device, advance,
                          (prompt_ids, cfg.steps, ref_tokens, ref_margins))
    eng_model = eng.model("fp32")
    window = min(ref_window, eng.window)
    R = ref.rows(ids, window, advance)  # before the engine's clock: a miss is the reference's time
    t1 = time.perf_counter()
    tokens_note, disagreement = _tokens(ids, _encode(eng, text, cfg.tokens + 1, source), spec, eng)
    prompt_note = _prompt_note(eng, cfg, prompt_ids, spec)
    n = cfg.tokens
    eng_parts, forward_s = [], 0.0
    for start in range(0, n, window):
        progress.stage(f"{spec} windows", start // window, -(-n // window))
        x = torch.tensor([ids[start:min(n, start + window)]], device=device)
        t2 = time.perf_counter()
        eng_parts.append(lexp.to_numpy(eng.forward(eng_model, x)[0]))
        forward_s += time.perf_counter() - t2
        advance()
    E = eng_parts[0] if len(eng_parts) == 1 else np.concatenate(eng_parts)  # one window: no copy
    if R.shape != E.shape:
        raise RunError(f"{spec}: {E.shape[1]} logits per position against the reference's {R.shape[1]}")
    # widened block by block, on as many threads as the engine's forward had (torch's count)
    stats = distribution.position_stats(R, E, np.asarray(ids[1:n + 1], dtype=np.int64), torch.get_num_threads())
    t3 = time.perf_counter()
    eng_tokens, _ = _greedy(eng, eng_model, prompt_ids, cfg.steps)
    greedy_s = time.perf_counter() - t3
    div, margin = _divergence(ref_tokens, eng_tokens, ref_margins)
    row = {"engine_spec": spec, "engine": eng.info(), "tokens": tokens_note, "prompt_tokens": prompt_note,
           **distribution.summarize(stats), "max_abs_diff_shifted": shifted_max_abs(R, E),
           "max_abs_diff": max_abs_diff(R, E), "bit_identical": bit_identical(R, E), "forward_s": forward_s, "greedy_s": greedy_s,
           "greedy_steps": cfg.steps, "greedy_diverged_at": div,
           "reference_margin_at_divergence": margin,
           "engine_s": time.perf_counter() - t1}
    if disagreement is not None:
        row["token_disagreement"] = disagreement
    eng.close()
    return row
