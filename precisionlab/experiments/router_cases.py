"""router --impl: your router kernel against the emulated fp64 router on the
inputs that break routers.

Your function is loaded as compare op loads --impl (experiments/compare.py's
load_impl) and called as

    weights, ids = fn(logits, bias, top_k=K, n_group=N, topk_group=M, scoring="softmax"|"sigmoid",
                      normalize=True|False)

logits a (tokens, experts) torch tensor, bias an (experts,) tensor of the
same dtype or None; it returns (tokens, K) weights and integer expert ids. It
is called on float32 tensors; where a case differs from the reference, again
on float64 tensors of the same values: a difference that persists there is
algorithmic (the all-negative kernel whose running max starts at 0, a dropped
bias, a wrong group mask), and the case fails; one that vanishes is your
kernel's fp32 rounding at a near-tie, and the case passes, saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.io import inputs
from precisionlab.numerics import compare as comparison
from precisionlab.numerics import routing
from precisionlab.runtime import memory

CASE_TOKENS = 256
MAX_THRESHOLD = 1 << 20


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    build: Callable  # (rng, tokens, experts, alg, bias) -> (logits float64 of fp32 values, bias or None)


def _fp32(x):
    return formats.get("fp32").round(x)


def _random(rng, t, e, alg, bias):
    return _fp32(rng.standard_normal((t, e))), bias


def _all_negative(rng, t, e, alg, bias):
    return _fp32(-1.0 - np.abs(rng.standard_normal((t, e)))), bias


def _exact_ties(rng, t, e, alg, bias):
    return rng.integers(0, 4, (t, e)).astype(np.float64), bias


def _near_ties(rng, t, e, alg, bias):
    """The (k+1)-th best logit one fp32 ulp below the k-th, at the lower index for half the tokens."""
    x = _fp32(rng.standard_normal((t, e)))
    order = np.argsort(-x, axis=1, kind="stable")
    rows = np.arange(t)
    a, b = order[:, alg.top_k - 1], order[:, alg.top_k]
    hi_idx, lo_idx = np.maximum(a, b), np.minimum(a, b)
    top, low = np.where(rows % 2 == 0, hi_idx, lo_idx), np.where(rows % 2 == 0, lo_idx, hi_idx)
    v = x[rows, a].astype(np.float32)
    x[rows, top] = v
    x[rows, low] = np.nextafter(v, np.float32(-np.inf))
    return x, bias


def _dominating_bias(rng, t, e, alg, bias):
    b = np.zeros(e)
    b[min(3, e - 1)] = 100.0
    return _fp32(rng.standard_normal((t, e))), b


def _equal_group_maxima(rng, t, e, alg, bias):
    """Group 1 a copy of group 0, for every token: their group scores tie exactly."""
    x = _fp32(rng.standard_normal((t, e)))
    per = e // alg.n_group
    x[:, per:2 * per] = x[:, :per]
    return x, bias


CASES = [
    Case("random", "logits ~ N(0, 1)", _random),
    Case("all_negative", "every logit below -1 (a running max that starts at 0 never moves)", _all_negative),
    Case("exact_ties", "logits from {0, 1, 2, 3}: ties at the k-th place (the tie rule decides)", _exact_ties),
    Case("near_ties", "the (k+1)-th logit one fp32 ulp below the k-th", _near_ties),
    Case("dominating_bias", "bias +100 on expert 3: chosen every time, weighted by its score alone",
         _dominating_bias),
    Case("equal_group_maxima", "group 1 a copy of group 0: their group scores tie", _equal_group_maxima),
]


def run(cfg, advance=lambda k=1: None):
    from precisionlab.experiments import router_setup as exp
    from precisionlab.runtime.user_code import load_impl

    exp._check_sizes(cfg)
    if cfg.threshold is not None and not 2 <= cfg.threshold <= MAX_THRESHOLD:
        raise UsageError(f"--threshold must be in 2 ... {MAX_THRESHOLD} (got {cfg.threshold})")
    # the largest case, before any is built: the threshold's upper side or the fixed cases' tokens
    tokens = CASE_TOKENS if cfg.threshold is None else max(CASE_TOKENS, cfg.threshold + 1)
    inputs.check_memory(memory.router_cases(tokens, cfg.experts),
                        f"router --impl: {tokens} tokens x {cfg.experts} experts")
    alg = exp.algorithm(cfg, cfg.experts)
    bias = exp.bias_vector(cfg, cfg.experts)
    fn = load_impl(cfg.impl)
    # a case for a feature the router has not: no groups, no equal group maxima; no bias, no dominating one
    skip = {"equal_group_maxima"} if alg.n_group == 1 else set()
    skip |= {"dominating_bias"} if bias is None else set()
    plan = [(c, CASE_TOKENS) for c in CASES if c.name not in skip]
    if cfg.threshold is not None:
        plan += [(Case(f"threshold_{side}", f"random logits, {n} tokens ({side} your threshold {cfg.threshold})",
                       _random), n) for side, n in (("below", cfg.threshold - 1), ("above", cfg.threshold + 1))]
    rows = []
    for i, (case, tokens) in enumerate(plan):
        rng = np.random.default_rng([cfg.seed, i])
        logits, b = case.build(rng, tokens, cfg.experts, alg, None if bias is None else _fp32(bias))
        rows.append(evaluate(fn, case, logits, b, alg, cfg.experts))
        advance()
    params = {"impl": cfg.impl, "experts": cfg.experts, "top_k": alg.top_k, "scoring": alg.scoring,
              "n_group": alg.n_group, "topk_group": alg.topk_group, "normalize": alg.normalize, "ties": alg.tie,
              "bias": cfg.bias, "threshold": cfg.threshold, "seed": cfg.seed}
    failed = [r for r in rows if not r["passed"]]
    rounding = [r["case"] for r in rows if r["passed"] and r["verdict"] != "pass"]
    take = [f"Your router passes every case ({len(rows)})."] if not failed else [
        f"{r['case']}: {r['verdict']}; {r['first_difference']}" for r in failed]
    if rounding:
        take.append(f"Differences that vanish in fp64 (rounding at near-ties, not a bug): {', '.join(rounding)}.")
    return exp.RouterResult(params, rows, [], rows, take)


def _call(fn, logits, bias, alg, dtype):
    """Your kernel on torch tensors of `dtype`: (weights, ids) as numpy, or the reason it failed."""
    import torch

    from precisionlab.runtime.user_code import users_code

    lt = torch.from_numpy(np.ascontiguousarray(logits)).to(dtype)
    bt = None if bias is None else torch.from_numpy(np.ascontiguousarray(bias)).to(dtype)
    try:
        with users_code():
            out = fn(lt, bt, top_k=alg.top_k, n_group=alg.n_group, topk_group=alg.topk_group, scoring=alg.scoring,
                     normalize=alg.normalize)
        w, ids = out
        w = np.asarray(torch.as_tensor(w).detach().cpu().to(torch.float64).numpy())
        ids = np.asarray(torch.as_tensor(ids).detach().cpu().numpy())
    except SystemExit as e:  # your kernel may not end the run for us
        return None, f"called sys.exit({e.code!r})"
    except Exception as e:  # the user's code: any failure is that case's result, not a crash
        return None, f"{type(e).__name__}: {e}"
    want = (logits.shape[0], alg.top_k)
    if w.shape != want or ids.shape != want or ids.dtype.kind not in "iu":
        return None, f"returned weights {w.shape} and ids {ids.shape} {ids.dtype}; expected {want} and integer ids"
    if ((ids < 0) | (ids >= logits.shape[1])).any():
        return None, f"returned an expert id outside 0 ... {logits.shape[1] - 1}"
    return routing.Routed(ids.astype(np.int64), w, np.empty((0, 0))), None


def _compare(got: routing.Routed, ref: routing.Routed, experts: int, fmt: str):
    flipped = ~routing.same_set(got.ids, ref.ids)
    rtol, atol = comparison.tolerances(fmt)
    dw, rw = routing.dense_weights(got, experts), routing.dense_weights(ref, experts)
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(dw - rw) <= atol + rtol * np.abs(rw))  # a NaN weight never agrees
    off = flipped | bad.any(axis=1)
    err = float(np.nanmax(np.abs(dw - rw))) if np.isfinite(dw).any() else float("nan")
    return flipped, off, err


def evaluate(fn, case: Case, logits, bias, alg: routing.Algorithm, experts: int) -> dict:
    import torch

    ref = routing.route(logits, bias, alg, routing.FP64)
    row = {"case": case.name, "what": case.what, "tokens": int(logits.shape[0]), "flips": None,
           "weights_max_abs_error": None, "passed": False, "verdict": "", "first_difference": None}
    got, why = _call(fn, logits, bias, alg, torch.float32)
    if got is None:
        row.update(verdict="error", first_difference=why)
        return row
    flipped, off, err = _compare(got, ref, experts, "fp32")
    row.update(flips=int(flipped.sum()), weights_max_abs_error=err, passed=not off.any())
    if row["passed"]:
        row["verdict"] = "pass"
        return row
    t = int(np.flatnonzero(off)[0])
    row["first_difference"] = (f"token {t}: expected experts {ref.ids[t].tolist()} weights "
                               f"{np.round(ref.weights[t], 6).tolist()}, got {got.ids[t].tolist()} "
                               f"{np.round(got.weights[t], 6).tolist()}")
    got64, why64 = _call(fn, logits, bias, alg, torch.float64)
    if got64 is None:
        row["verdict"] = f"fails; the fp64 re-run failed too ({why64})"
        return row
    _, off64, _ = _compare(got64, ref, experts, "fp64")
    if off64[off].any():
        row["verdict"] = "persists in fp64: algorithmic"
        return row
    # every difference vanishes in fp64: your kernel's fp32 rounding at a near-tie, not a bug
    row["passed"] = True
    row["verdict"] = "vanishes in fp64: rounding"
    if alg.n_group == 1:  # with groups a flip may come from the group choice, whose margin this is not
        margin, kth = routing.margins(ref, alg.top_k, routing.margin_scale(alg, bias))
        row["verdict"] += f" (margin {np.median(routing.margin_ulps(margin[off], kth[off], 'fp32')):.3g} fp32 ulps)"
    return row
