"""compare model: one model in fp32 and in bf16/fp16 on the same input.

Free-running: greedy decoding in each dtype; where does it first leave the
fp32 path, and how close were fp32's top two logits there?
Teacher-forced: every dtype reads the fp32 greedy path, so the per-step logit
errors stay comparable after the free-running paths split.

--model names an engine (engines/registry.py). The default, `embedded`,
ships with the package: a trained character-level decoder stored in bf16, so
its fp32 run is an exact upcast and the differences measure the arithmetic
alone. `hf:DIR` (or a bare DIR) loads a Hugging Face causal LM from a local
directory or the local cache, never the network.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from precisionlab.engines.protocol import check_finite, greedy
from precisionlab.engines.registry import DEFAULT_SPEC, ModelRun
from precisionlab.experiments import startup
from precisionlab.runtime import memory, progress, threads
from precisionlab.catalog import formats
from precisionlab.numerics import metrics

LOW_DTYPES = formats.LOW_COMPUTE  # each run against the fp32 one


@dataclass
class ModelConfig(ModelRun):
    threads: int | None = None  # torch CPU threads; None: sized for the model (precisionlab.runtime.threads)


@dataclass
class ModelResult:
    params: dict
    rows: list[dict]       # teacher-forced, one per (dtype, step)
    summary: list[dict]    # free-running, one per dtype
    texts: dict[str, str]
    model_info: dict
    takeaways: list[str]
    timing: dict


def run(cfg: ModelConfig, advance=lambda k=1: None) -> ModelResult:
    startup.check_run(cfg.steps, cfg.prompt)
    startup.check_chat(cfg.model, cfg.chat)
    threads.check(cfg.threads)
    lows = startup.parse_dtypes(cfg.dtypes, LOW_DTYPES)  # no repeated rows
    device = startup.device(cfg.device)
    import torch

    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    engine = startup.open_engine(cfg.model, device, cfg.steps, cfg.prompt, lambda s: memory.compare_model(s, lows),
                                 f"compare model --model {cfg.model or DEFAULT_SPEC} --steps {cfg.steps}")
    prompt = engine.prompt_ids(cfg.prompt, cfg.steps, cfg.chat)
    t_load = time.perf_counter() - t0
    # One decoding step is ~2 flops per parameter: the work each torch call does.
    with startup.numerics(cfg.threads, 2.0 * engine.info()["parameters"], device) as n_threads:
        return _run(cfg, engine, prompt, lows, device, t_load, n_threads, advance)


def _run(cfg: ModelConfig, engine, prompt, lows, device, t_load, n_threads, advance) -> ModelResult:
    import torch

    t1 = time.perf_counter()  # IEEE fp32, the threads sized: startup.numerics, around this
    ref_model = engine.model("fp32")
    ref_tokens, ref_step_logits = greedy(engine, ref_model, prompt, cfg.steps, "fp32")
    path = prompt + ref_tokens
    x = torch.tensor([path[:-1]], device=device)  # teacher-forced: every dtype reads fp32's tokens
    progress.stage("fp32 teacher-forced")
    ref_tf = engine.forward(ref_model, x)[0].double().cpu().numpy()[len(prompt) - 1:]
    for i, row in enumerate(ref_tf):
        check_finite(row, "fp32", i, "teacher-forced")
    del ref_model  # one compute copy at a time (runtime/memory.compare_model): each dropped when its run ends
    advance()
    texts = {"fp32": engine.decode(ref_tokens)}
    summary, rows = [], []
    for low in lows:
        m = engine.model(low)
        tokens, _ = greedy(engine, m, prompt, cfg.steps, low)
        progress.stage(f"{low} teacher-forced")
        tf = engine.forward(m, x)[0].double().cpu().numpy()[len(prompt) - 1:]
        del m
        for i, row in enumerate(tf):
            check_finite(row, low, i, "teacher-forced, reading fp32's tokens")
        texts[low] = engine.decode(tokens)
        div = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens, strict=False)) if a != b), None)
        step_reports = []
        for i in range(cfg.steps):
            rep = metrics.error_report(tf[i], ref_tf[i], None, 0.0, 0.0)
            step_reports.append(rep)
            rows.append({"dtype": low, "step": i, "token_fp32": ref_tokens[i], "token": tokens[i],
                         "agree": tokens[i] == ref_tokens[i] and (div is None or i < div),
                         "max_abs_error": rep.max_abs_error, "rel_l2": rep.rel_l2, "finite": rep.finite,
                         "argmax_agrees": int(np.argmax(tf[i])) == ref_tokens[i]})
        margin = None
        if div is not None:
            top2 = np.sort(ref_step_logits[div])[-2:]
            margin = float(top2[1] - top2[0])
        rel = [r.rel_l2 for r in step_reports]
        summary.append({
            "dtype": low, "agree": div is None, "diverged_at": div, "fp32_margin_at_divergence": margin,
            "divergence_char": None if div is None else len(engine.decode(tokens[:div])),
            "fp32_token_at_divergence": None if div is None else engine.decode([ref_tokens[div]]),
            "token_at_divergence": None if div is None else engine.decode([tokens[div]]),
            "mean_rel_l2": float(np.mean(rel)), "max_rel_l2": float(np.max(rel)),
            "max_abs_error": float(max(r.max_abs_error for r in step_reports)),
            "teacher_forced_argmax_flips": int(sum(not r["argmax_agrees"] for r in rows if r["dtype"] == low)),
        })
        advance()
    probs = _softmax(ref_tf)
    top1 = float(np.mean(np.max(probs, axis=1)))
    t_run = time.perf_counter() - t1
    info = engine.info() | {"mean_top1_probability_fp32": top1, "uniform_probability": 1.0 / ref_tf.shape[1]}
    return ModelResult(
        params={"model": cfg.model or DEFAULT_SPEC, "steps": cfg.steps, "prompt": cfg.prompt, "chat": cfg.chat,
                "dtypes": lows, "device": device, "seed": cfg.seed, "prompt_tokens": len(prompt)},
        rows=rows, summary=summary, texts=texts, model_info=info, takeaways=takeaways(summary, info),
        timing={"load_s": t_load, "run_s": t_run, "torch_threads": n_threads},
    )


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def takeaways(summary: list[dict], info: dict) -> list[str]:
    top1 = info["mean_top1_probability_fp32"]
    lines = [f"fp32's mean top-1 probability along its own path is {top1:.2f} (uniform would be "
             f"{info['uniform_probability']:.3f}): "
             + ("the argmax is rarely a near-tie, so a flip is a precision effect." if top1 >= 0.3 else
                "close to uniform, so argmax flips here are mostly tie-breaking noise.")]
    for s in summary:
        if s["agree"]:
            lines.append(f"{s['dtype']}: the same tokens as fp32 all the way; logits off by rel-L2 "
                         f"{s['mean_rel_l2']:.1e} on average.")
        else:
            lines.append(f"{s['dtype']}: leaves the fp32 path at step {s['diverged_at']} "
                         f"({s['token_at_divergence']!r} for {s['fp32_token_at_divergence']!r}), where fp32's top two "
                         f"logits were {s['fp32_margin_at_divergence']:.3g} apart, below the largest logit error "
                         f"{s['max_abs_error']:.2g}; teacher-forced rel-L2 {s['mean_rel_l2']:.1e}.")
            if s["fp32_margin_at_divergence"] is not None and s["fp32_margin_at_divergence"] > s["max_abs_error"]:
                lines[-1] = lines[-1].replace("below the largest", "yet above the largest")
    return lines
