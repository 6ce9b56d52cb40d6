"""router: how often an MoE router's top-k changes under each precision path.

For each path (gate GEMM input format x accumulator x router-logit format x
correction-bias format, numerics/routing.py declares each step once) and each
layer: the share of tokens whose top-k set differs from the float64 path, the
routed-weight mass moved (L1), the flips by the reference's top-k margin in
ulps, the "any layer flipped" share beside the independence prediction
1 - prod(1 - p_l), and the verdict: the same path re-run in float64 either
keeps a flip (algorithmic) or loses it (rounding, with its margin in ulps).
With --impl the user's router kernel meets the adversarial cases instead
(experiments/router_cases.py).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.io import inputs
from precisionlab.experiments.router_setup import (  # noqa: F401 (re-exported: the command's names)
    BIAS_PRESETS, DTYPES, MAX_PATHS, SYNTHETIC, RouterConfig, RouterResult, _check_sizes, algorithm, bias_vector,
    input_kind, verdict)
from precisionlab.numerics import routing


def paths(cfg: RouterConfig, synthetic_gemm: bool) -> list[routing.Precision]:
    from precisionlab.numerics import accumulators

    gates = formats.parse_list(cfg.gate_dtypes, DTYPES, "--gate-dtypes") if synthetic_gemm else ["fp32"]
    accs = [a.name for a in accumulators.parse_option(cfg.accumulator)] if synthetic_gemm else ["fp32"]
    logits = formats.parse_list(cfg.logit_dtypes, DTYPES, "--logit-dtypes")
    if cfg.bias in (None, "none") and cfg.bias_dtypes is not None:
        raise UsageError("--bias-dtypes stores the correction bias: it goes with --bias")
    biases = formats.parse_list(cfg.bias_dtypes or "fp32", DTYPES, "--bias-dtypes") if cfg.bias not in (None, "none") \
        else [None]
    out = [routing.Precision(*p) for p in itertools.product(gates, accs, logits, biases)]
    if len(out) > MAX_PATHS:
        raise UsageError(f"{len(out)} precision paths; at most {MAX_PATHS} in one run")
    return out


def estimate_bytes(tokens: int, hidden: int, experts: int, layers: int, n_paths: int, peak_acc: int) -> int:
    """The peak before anything is built: the inputs of one layer (float64 and
    their rounded copies), the logits of every path and layer, a path's
    scores, choices and dense weights, the accumulator model's own peak."""
    per_layer = 8 * (tokens * hidden * 3 + experts * hidden * 3)
    logits = 8 * tokens * experts * layers * (n_paths + 1)
    routed = 8 * tokens * experts * 8 * (n_paths + 1)
    return per_layer + logits + routed + peak_acc + 32 * 2**20


def layer_inputs(cfg: RouterConfig, layer: int, scales: tuple[float, float]):
    """One synthetic layer: (hidden (T, H), gate (E, H)) float64, or (logits (T, E), None)."""
    rng = np.random.default_rng([cfg.seed, layer])
    if cfg.inputs == "logits":
        return formats.get("fp32").round(rng.standard_normal((cfg.tokens, cfg.experts)) * scales[0]), None
    if cfg.inputs == "margins":
        return formats.get("fp32").round(with_margins(rng, cfg.tokens, cfg.experts, cfg.top_k, *scales)), None
    hidden = rng.standard_normal((cfg.tokens, cfg.hidden)) * scales[0]
    gate = rng.standard_normal((cfg.experts, cfg.hidden)) * (scales[1] / math.sqrt(cfg.hidden))
    return hidden, gate


def with_margins(rng, tokens: int, experts: int, k: int, sd: float, mean: float) -> np.ndarray:
    """(T, E) float64 logits ~ N(0, sd^2) whose top-k margin is set, token by token, to a draw of an
    exponential of mean `mean`: the top k logits are moved together (their order kept) so that the k-th
    sits that far above the (k+1)-th. The margin distribution is the input; what a precision does to a
    given margin is then read off the flips (fp32 storage moves a margin by at most an ulp or two)."""
    x = rng.standard_normal((tokens, experts)) * sd
    if k >= experts:
        return x
    order = np.argsort(-x, axis=1, kind="stable")
    rows = np.arange(tokens)[:, None]
    s = x[rows, order]
    s[:, :k] += (s[:, k] + rng.exponential(mean, tokens) - s[:, k - 1])[:, None]
    x[rows, order] = s
    return x


def _scales(text: str) -> tuple[float, float]:
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        vals = []
    if len(vals) not in (1, 2) or not all(math.isfinite(v) and v > 0 for v in vals):
        raise UsageError(f"--scales is HIDDEN,GATE (or one scale for --inputs logits), positive (got {text!r})")
    return (vals[0], vals[-1])


def run(cfg: RouterConfig, advance=lambda k=1: None) -> RouterResult:
    kind = input_kind(cfg.inputs)
    if cfg.impl is not None:
        from precisionlab.experiments import router_cases

        if kind not in SYNTHETIC:
            raise UsageError("--impl runs its own adversarial cases; --inputs FILE or a model goes without it")
        return router_cases.run(cfg, advance)
    if cfg.threshold is not None:
        raise UsageError("--threshold names your kernel's fused/unfused token count: it goes with --impl")
    _check_sizes(cfg)
    scales = _scales(cfg.scales)
    gemm = kind in ("gate", "model")
    ps = paths(cfg, gemm)
    layers, alg, info = _sources(cfg, kind, scales, len(ps), advance)
    bias = bias_vector(cfg, cfg.experts)
    flips = {p: [] for p in ps}  # per path: each layer's (T,) flipped mask
    rows, ulps_of = [], {p: [] for p in ps}
    for layer, (name, x, gate, layer_bias) in enumerate(layers()):
        b = bias if layer_bias is None else layer_bias
        ref_logits = x if gate is None else routing.gate_logits(x, gate, routing.FP64)
        ref = routing.route(ref_logits, b, alg, routing.FP64)
        margin, kth = routing.margins(ref, alg.top_k, routing.margin_scale(alg, b))
        for p in ps:
            logits = routing.store_logits(x, p) if gate is None else routing.gate_logits(x, gate, p)
            row, flipped, m_ulps = measure(p, layer, ref, routing.route(logits, b, alg, p), ref, margin, kth,
                                           cfg.experts)
            rows.append(row | ({"module": name} if name else {}))
            flips[p].append(flipped)
            ulps_of[p].append(m_ulps)
            advance()
    return finish(cfg, alg, ps, rows, flips, ulps_of, bias, gemm, info)


def _sources(cfg: RouterConfig, kind: str, scales, n_paths: int, advance):
    """(a callable yielding each layer's (module name or None, x, gate or None, bias or None), the
    algorithm, what the inputs were). x: hidden states (T, H) with a gate, else logits (T, E).
    Sizes are set on cfg from a dump or a model, and memory is checked before anything is built."""
    from precisionlab.numerics import accumulators

    if kind == "dump":
        from precisionlab.io import routing_files

        dump = routing_files.read_logits(cfg.inputs, "--inputs")
        cfg.layers, cfg.tokens, cfg.experts = dump.shape
        return (lambda: ((None, dump[i], None, None) for i in range(cfg.layers))), algorithm(cfg, cfg.experts), None
    if kind == "model":
        from precisionlab.experiments import router_model

        alg, info, captured = router_model.capture(cfg.inputs, cfg.tokens, cfg.seed, n_paths, advance)
        cfg.layers, cfg.experts, cfg.hidden = len(captured), captured[0][2].shape[0], captured[0][2].shape[1]
        cfg.tokens = captured[0][1].shape[0]
        return (lambda: iter(captured)), alg, info
    alg = algorithm(cfg, cfg.experts)
    peak = max(a.peak_bytes(cfg.tokens, cfg.experts, cfg.hidden) for a in accumulators.parse_option(cfg.accumulator)) \
        if kind == "gate" else 0
    inputs.check_memory(estimate_bytes(cfg.tokens, cfg.hidden if kind == "gate" else 0, cfg.experts, 1, n_paths,
                                       peak) + 8 * cfg.tokens * cfg.experts * cfg.layers * n_paths,
                        f"router {cfg.tokens} tokens x {cfg.experts} experts x {cfg.layers} layers")

    def gen():
        for layer in range(cfg.layers):
            x, gate = layer_inputs(cfg, layer, scales)
            yield None, x, gate, None
    return gen, alg, None


def measure(p: routing.Precision, layer, ref: routing.Routed, got: routing.Routed, rerun64: routing.Routed,
            margin: np.ndarray, kth: np.ndarray, experts: int):
    """One path at one layer against the reference: its row, the flipped mask, the margins in ulps.
    rerun64: the same path run in float64 (for the emulated paths, the reference itself)."""
    flipped = ~routing.same_set(got.ids, ref.ids)
    m_ulps = routing.margin_ulps(margin, kth, p.narrowest)
    stats = routing.flip_fields(ref, got, ~routing.same_set(rerun64.ids, ref.ids), m_ulps, experts)
    row = {"path": p.label(), "gate_dtype": p.gate_dtype, "accumulator": p.accumulator,
           "logit_dtype": p.logit_dtype, "bias_dtype": p.bias_dtype, "layer": layer, **stats,
           "margin_dtype": p.narrowest, "verdict": verdict(stats["flips"], stats["flips_persisting_fp64"])}
    return row, flipped, m_ulps


def finish(cfg, alg, ps, rows, flips, ulps_of, bias, gemm, info=None) -> RouterResult:
    buckets, summary = [], []
    for p in ps:
        per_layer = [r["flip_share"] for r in rows if r["path"] == p.label()]
        any_layer = np.any(np.stack(flips[p]), axis=0)
        pred = routing.independence_prediction(per_layer)
        # the band, fixed before any run: 4 binomial standard errors of the prediction over these tokens
        band = 4 * math.sqrt(pred * (1 - pred) / any_layer.size)
        summary.append({"path": p.label(), "gate_dtype": p.gate_dtype, "accumulator": p.accumulator,
                        "logit_dtype": p.logit_dtype, "bias_dtype": p.bias_dtype, "layer": "all",
                        "tokens": int(any_layer.size), "flip_share": float(np.mean(per_layer)),
                        "any_layer_flip_share": float(any_layer.mean()), "independence_prediction": pred,
                        "independence_band": band,
                        "correlated": bool(abs(any_layer.mean() - pred) > band) if len(per_layer) > 1 else None})
        for b in routing.margin_buckets(np.concatenate(ulps_of[p]), np.concatenate(flips[p])):
            buckets.append({"path": p.label(), "margin_dtype": p.narrowest, **b})
    distinct = None if bias is None else {
        d: int(np.unique(formats.get(d).round(bias)).size) for d in {p.bias_dtype for p in ps} if d is not None}
    params = {"source": f"synthetic {cfg.inputs}" if cfg.inputs in SYNTHETIC else cfg.inputs, "model": info,
              "tokens": cfg.tokens, "experts": cfg.experts,
              "hidden": cfg.hidden if gemm else None, "layers": cfg.layers, "top_k": alg.top_k,
              "scoring": alg.scoring, "n_group": alg.n_group, "topk_group": alg.topk_group,
              "normalize": alg.normalize, "ties": alg.tie, "scales": cfg.scales if cfg.inputs in SYNTHETIC else None,
              "bias": cfg.bias, "bias_distinct_values": distinct, "seed": cfg.seed,
              "margin_edges_ulps": list(routing.MARGIN_EDGES_ULPS), "margin_scale": routing.margin_scale(alg, bias)}
    return RouterResult(params, rows + summary, buckets, [], takeaways(rows, summary, distinct, bias))


def takeaways(rows, summary, distinct, bias) -> list[str]:
    out = []
    worst = max(summary, key=lambda s: s["flip_share"])
    if worst["flip_share"] > 0:
        out.append(f"Worst path: {worst['path']}: {100 * worst['flip_share']:.2f} % of tokens per layer change their "
                   f"top-k set; {100 * worst['any_layer_flip_share']:.2f} % in at least one layer (independence "
                   f"predicts {100 * worst['independence_prediction']:.2f} %).")
    for s in summary:
        if s["correlated"]:
            out.append(f"{s['path']}: the flips are correlated across layers: {100 * s['any_layer_flip_share']:.2f} % "
                       f"of tokens flip in some layer, independence predicts {100 * s['independence_prediction']:.2f} "
                       f"% +- {100 * s['independence_band']:.2f} %.")
    clean = [s["path"] for s in summary if s["flip_share"] == 0]
    if clean:
        out.append(f"No flips at all: {'; '.join(clean)}.")
    if distinct and bias is not None:
        out.append(f"The {bias.size} correction biases take " + ", ".join(
            f"{n} distinct {d} values" for d, n in sorted(distinct.items())) + ".")
    if any(r["flips_persisting_fp64"] for r in rows):
        out.append("Some flips persist when the path runs in fp64: an algorithmic difference, not rounding.")
    elif any(r["flips"] for r in rows):
        out.append("Every flip vanishes when the same path runs in fp64: rounding, at the margins shown (in ulps of "
                   "the path's narrowest format).")
    return out
