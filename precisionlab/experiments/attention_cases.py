"""attention-cases: the attention edge cases production kernels got wrong, each
with an exact expected value (numerics/attention_exact.py), run on the user's
kernel (--impl) or on the project's FlashAttention emulator and the
library's attention op. The calling convention is attention_kernels.py's.

Every input is exact in fp32, bf16 and fp16 (small integers, dyadic
fractions, scales that are powers of two), so a case's expected value does
not depend on the format and a difference is the kernel's. A case passes
when every output is within atol + rtol max |expected| (torch.testing's
(rtol, atol) for the format, numerics/compare.py; normwise over the call's
outputs) of the expected value, plus the expected value's own bound; a case
with its own tolerance says why. NaN never agrees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.experiments import attention_kernels as ak
from precisionlab.io import inputs
from precisionlab.numerics import attention_exact as ax
from precisionlab.numerics import compare as comparison
from precisionlab.report.output import Rows
from precisionlab.runtime import memory

DTYPES = formats.COMPUTE
MIN_KEYS = 4096          # the denominator sweep: 4096, 8192, ... up to --max-keys
MAX_KEYS = 1 << 24       # past this, a refusal: the sweep would take hours on the emulator
BOUND = 0.01             # the relative error the takeaways name a row length and a position by
ROPE_THETAS = (1.0, 10000.0 ** (-1 / 64))  # a table's fastest pair, and its second pair at d = 128, base 1e4
ROPE_TOP = 1 << 20


@dataclass
class Call:
    """One kernel call and what it must return."""
    label: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    kwargs: dict
    expected: np.ndarray   # rows x dv, float64
    bound: float = 0.0     # the expected value's own absolute error bound
    keys: int = 0


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    build: Callable        # (cfg) -> list[Call]
    atol: float | None = None  # the case's own tolerance (rtol 0), else the format's
    visible: Callable | None = None  # (dtype) -> (bool, why): can the format see the effect at all


@dataclass
class CasesConfig:
    impl: str | None = None
    cases: tuple[str, ...] | None = None
    dtypes: tuple[str, ...] = tuple(formats.ATTENTION_CASES_DEFAULT)
    max_keys: int = 1 << 20
    bound: float = BOUND


# ---------------------------------------------------------------------------
# inputs


def _uniform(rows: int, keys: int, v: np.ndarray, **kwargs) -> tuple:
    """q = 0: every visible score is 0."""
    return np.zeros((rows, 2)), np.zeros((keys, 2)), v, dict(scale=1.0, **kwargs)


def _dyadic(shape, seed: int) -> np.ndarray:
    """Seeded multiples of 1/4 in [-2, 2]: exact in every format here."""
    return np.random.default_rng(seed).integers(-8, 9, size=shape) / 4.0


def _scores(q, k, scale, softcap=None) -> np.ndarray:
    s = (q @ k.T) * scale  # exact: dyadic values, a power-of-two scale
    return s if softcap is None else np.vectorize(lambda x: ax.softcapped(x, softcap))(s)


def _expected(q, k, v, scale, mask=None, sink=None, softcap=None) -> np.ndarray:
    s = _scores(q, k, scale, softcap)
    vis = np.ones(s.shape, bool) if mask is None else mask
    return np.stack([ax.softmax_out([float(x) for x in s[i][vis[i]]], v[vis[i]], sink) for i in range(s.shape[0])])


def _random_call(label, rows, keys, seed, mask=None, sink=None, softcap=None, splits=1, q_mul=1.0) -> Call:
    q, k, v = _dyadic((rows, 8), seed) * q_mul, _dyadic((keys, 8), seed + 1), _dyadic((keys, 4), seed + 2)
    kw = {"scale": 0.25, "splits": splits}
    for name, val in (("mask", mask), ("sink", sink), ("softcap", softcap)):
        if val is not None:
            kw[name] = val
    exp = _expected(q, k, v, 0.25, mask, sink, softcap)
    return Call(label, q, k, v, kw, exp, ax.REL_BOUND * float(np.max(np.abs(v))), keys)


def _sink_call(label, keys, sink, mask=None, splits=1) -> Call:
    q, k, v, kw = _uniform(1 if mask is None else mask.shape[0], keys, np.ones((keys, 1)), sink=sink,
                           splits=splits)
    if mask is not None:
        kw["mask"] = mask
    seen = [keys] if mask is None else [int(r.sum()) for r in mask]
    exp = np.array([[ax.sink_share(n, sink)] for n in seen])
    return Call(label, q, k, v, kw, exp, ax.REL_BOUND, keys)


# ---------------------------------------------------------------------------
# the cases


def _sinks() -> list[Case]:
    def hole(cfg):
        mask = np.ones((1, 512), bool)
        mask[0, 100:301] = False  # across the split boundaries at 128 and 256
        return [_sink_call("512 keys, 100...300 masked, 4 splits, sink 2", 512, 2.0, mask, 4)]

    def empty(cfg):
        mask = np.ones((2, 64), bool)
        mask[0] = False
        return [_sink_call("row 0 sees no key, row 1 all 64, sink 0", 64, 0.0, mask, 2)]

    def masked_split(cfg):
        mask = np.ones((1, 512), bool)
        mask[0, 128:256] = False  # one whole partition of four
        return [_sink_call("512 keys, 128...255 masked, 4 splits, sink 3", 512, 3.0, mask, 4)]

    return [
        Case("sink", "QK = 0, V = 1, sink s: n / (n + e^s)",
             lambda cfg: [_sink_call("128 keys, sink 5", 128, 5.0), _sink_call("3 keys, sink 0", 3, 0.0)]),
        Case("sink_splits", "the sink counted once over 4 split-KV partitions",
             lambda cfg: [_sink_call("512 keys, 4 splits, sink 1", 512, 1.0, splits=4)]),
        Case("sink_empty_range", "a row that sees no key: all mass on the sink, output 0, never NaN", empty),
        Case("sink_mask_hole", "a mask hole across split boundaries: the sink counted once", hole),
        Case("sink_large", "sink logit 100 (e^100 overflows fp32): the max must include the sink",
             lambda cfg: [_sink_call("64 keys, sink 100, 2 splits", 64, 100.0, splits=2)]),
        Case("sink_masked_split", "a fully masked partition (a -100000 placeholder max overflows e^(s - max))",
             masked_split),
        Case("sink_zero_init", "a zero-initialised sink (s = 0) beside 16 scores of 6.4375: moves the output "
             "by ~1e-4", _zero_sink, atol=_ZERO_SINK_EFFECT / 4, visible=_zero_sink_visible),
    ]


def _zero_sink(cfg) -> list[Call]:
    keys = 16
    q = np.array([[6.4375, 0.0]])
    k = np.tile([1.0, 0.0], (keys, 1))
    v = np.ones((keys, 1))
    exp = np.array([[ax.softmax_out([6.4375] * keys, v, 0.0)[0]]])
    return [Call("16 keys, scores 6.4375, sink 0", q, k, v, {"scale": 1.0, "sink": 0.0}, exp, ax.REL_BOUND, keys)]


_ZERO_SINK_EFFECT = 1.0 / (1.0 + 16 * math.exp(6.4375))  # 1 - the expected output: what a dropped sink loses


def _zero_sink_visible(dtype: str) -> tuple[bool, str]:
    """Whether an output near 1 stored in dtype can differ from 1 by the
    sink's effect: half a unit in the last place below 1 is 2^-p."""
    half_ulp = 2.0 ** -formats.get(dtype).precision
    ok = _ZERO_SINK_EFFECT > 2 * half_ulp
    return ok, (f"the sink moves the output by {_ZERO_SINK_EFFECT:.2e}, {'above' if ok else 'below'} "
                f"{dtype}'s resolution at 1 ({half_ulp:.2e}): a dropped sink {'fails' if ok else 'passes'}")


def _splits() -> list[Case]:
    def masked(cfg):
        mask = np.ones((4, 512), bool)
        mask[:, 128:256] = False
        return [_random_call("512 keys, 128...255 masked, 4 splits", 4, 512, 11, mask=mask, splits=4)]

    return [
        Case("random", "seeded dyadic q, k, v: plain attention against float64",
             lambda cfg: [_random_call("4 rows, 300 keys", 4, 300, 1)]),
        Case("empty_split", "3 keys over 8 splits: empty partitions (-inf - -inf = NaN unless guarded)",
             lambda cfg: [_random_call("3 keys, 8 splits", 2, 3, 3, splits=8)]),
        Case("empty_split_sink", "empty partitions with a sink: counted once",
             lambda cfg: [_random_call("3 keys, 8 splits, sink 1", 2, 3, 5, sink=1.0, splits=8)]),
        Case("masked_split", "a fully masked partition among 4: no NaN", masked),
    ]


def _softcap() -> list[Case]:
    def build(splits):
        def calls(cfg):
            # q x 512: each row's largest raw score past 800, where e^(30 - raw max) is 0 in every format
            # (float64's too); capped at 30 they stay within (-30, 30)
            call = _random_call(f"cap 30, {splits} split(s)", 4, 256, 21, softcap=30.0, splits=splits, q_mul=512.0)
            call.label = f"raw scores up to {np.max(_scores(call.q, call.k, 0.25)):g}, " + call.label
            return [call]
        return calls

    return [
        Case("softcap", "soft-cap 30 over raw scores past 800: the max taken after the cap", build(1)),
        Case("softcap_splits", "the same over 4 splits: each split's max seeded with capped scores", build(4)),
    ]


def _window(cfg) -> list[Call]:
    """One row a call at position p, window 128 over 512 keys: V holds
    indicators of the first and last key it must see and of the keys just
    outside, so the output names an off-by-one at either edge."""
    keys, width, calls = 512, 128, []
    for p in (0, 5, 128, 129, 300, 511):
        first, last = ax.window(p, width)
        v = np.zeros((keys, 4))
        v[first, 0], v[last, 1] = 1.0, 1.0
        if first > 0:
            v[first - 1, 2] = 1.0
        if last + 1 < keys:
            v[last + 1, 3] = 1.0
        n = last - first + 1
        exp = np.array([[1.0 / n, 1.0 / n, 0.0, 0.0]])
        q, k, _, kw = _uniform(1, keys, v, window=width, q_pos=np.array([p]), splits=4)
        calls.append(Call(f"position {p}: keys {first}...{last}", q, k, v, kw, exp, ax.REL_BOUND, keys))
    return calls


def _rope(cfg) -> list[Call]:
    """d = 2 (theta = 1): q = (4, 0) at position p, k_0 = (1, 0) at 0 and
    k_1 = 0; out = e^(4 cos p) / (e^(4 cos p) + 1) with V = (1, 0)."""
    calls = []
    for p in (7, 4095, 15962, 65535, 300000, (1 << 20) - 1):
        q, k, v = np.array([[4.0, 0.0]]), np.array([[1.0, 0.0], [0.0, 0.0]]), np.array([[1.0], [0.0]])
        x = 4.0 * ax.rope_cos(p)
        exp = np.array([[1.0 / (1.0 + math.exp(-x))]])
        calls.append(Call(f"position {p}: cos {ax.rope_cos(p):+.3f}", q, k, v,
                          {"scale": 1.0, "rope_base": 10000.0, "q_pos": np.array([p])}, exp, ax.REL_BOUND, 2))
    return calls


def _varlen(cfg) -> list[Call]:
    """Verify-shaped: M = k + 1 query rows at the last positions of L keys,
    causal bottom-right, 4 splits; V = (1 on the M drafted keys, 1): row i
    (position L - M + i) sees i + 1 of them among L - M + i + 1 keys."""
    calls = []
    for keys in (9, 130, 1031):
        for m in (2, 3, 5, 9):
            j, i = np.arange(keys)[None, :], np.arange(m)[:, None]
            mask = j <= i + keys - m
            v = np.stack([(np.arange(keys) >= keys - m).astype(float), np.ones(keys)], axis=1)
            exp = np.array([[(r + 1) / (keys - m + r + 1), 1.0] for r in range(m)])
            q, k, _, kw = _uniform(m, keys, v, mask=mask, splits=4)
            calls.append(Call(f"L {keys}, M {m}", q, k, v, kw, exp, ax.REL_BOUND, keys))
    return calls


def sweep_lengths(max_keys: int) -> list[int]:
    out, n = [], MIN_KEYS
    while n <= max_keys:
        out.append(n)
        n *= 2
    return out


def _denominator(cfg) -> list[Call]:
    """q = 0 over N keys, V = (1 on even keys, 1): (1/2, 1) exactly, whatever
    N; a denominator held in a 16-bit format drifts from the numerator."""
    return [_denominator_call(keys) for keys in sweep_lengths(cfg.max_keys)]


def _denominator_call(keys: int) -> Call:
    v = np.stack([(np.arange(keys) % 2 == 0).astype(float), np.ones(keys)], axis=1)
    q, k, _, kw = _uniform(1, keys, v)
    return Call(f"{keys} keys", q, k, v, kw, np.array([[0.5, 1.0]]), 0.0, keys)


def all_cases() -> list[Case]:
    return (_sinks() + _splits() + _softcap() + [
        Case("window_edge", "a sliding window of 128: the first and the last visible key, none beyond", _window),
        Case("rope_phases", "RoPE at positions up to 2^20: cos(p) from exact phases (a bf16 table: 15962 -> 15936)",
             _rope),
        Case("varlen_verify", "verify chunks of M = 2, 3, 5, 9 rows after caches of 9, 130, 1031 keys, 4 splits",
             _varlen),
        Case("denominator", "row length 4096 ... --max-keys with equal scores: V's mean must stay 1/2",
             _denominator),
    ])


CASE_NAMES = tuple(c.name for c in all_cases())


# ---------------------------------------------------------------------------
# running them


def check(cfg: CasesConfig) -> list[Case]:
    if not cfg.dtypes:
        raise UsageError("--dtypes: give at least one format")
    if not 0 < cfg.bound < 1:
        raise UsageError(f"--bound {cfg.bound}: a relative error between 0 and 1")
    if not MIN_KEYS <= cfg.max_keys <= MAX_KEYS:
        raise UsageError(f"--max-keys {cfg.max_keys}: between {MIN_KEYS} and {MAX_KEYS}")
    chosen = all_cases()
    if cfg.cases:
        unknown = [c for c in cfg.cases if c not in CASE_NAMES]
        if unknown:
            raise UsageError(f"--cases {','.join(unknown)}: choose from {', '.join(CASE_NAMES)}")
        chosen = [c for c in chosen if c.name in cfg.cases]
    if any(c.name == "denominator" for c in chosen):  # the longest row, before anything is allocated
        # the case's float64 inputs and their stored copy, as the emulator's run on one row of N keys holds them,
        # plus as much again for the user's kernel's own temporaries
        need = 2 * memory.attention(1, cfg.max_keys, 2, 128, 1, 0)
        inputs.check_memory(need, f"attention-cases --max-keys {cfg.max_keys}")
    return chosen


def run(cfg: CasesConfig, advance=lambda k=1: None) -> Rows:
    cases = check(cfg)
    kernels = [ak.user(cfg.impl)] if cfg.impl else list(ak.BUILTIN)
    rows, sweep = [], []
    for kernel in kernels:
        for case in cases:
            for dtype in cfg.dtypes:
                row, points = _run_case(kernel, case, dtype, cfg)
                rows.append(row)
                sweep.extend(points)
                advance()
    params = {"impl": cfg.impl, "variants": [k.name for k in kernels], "cases": [c.name for c in cases],
              "dtypes": list(cfg.dtypes), "max_keys": cfg.max_keys, "rope_top": ROPE_TOP, "bound": cfg.bound,
              "device": "cpu"}
    res = Rows(params=params, rows=rows, any_failed=any(r["status"] == "fail" for r in rows))
    res.flags = {"sweep": sweep, "facts": facts(cfg)}
    res.takeaways = takeaways(rows, sweep, res.flags["facts"], cfg)
    return res


def _tolerance(case: Case, dtype: str) -> tuple[float, float]:
    return (0.0, case.atol) if case.atol is not None else comparison.tolerances(dtype)


def _run_case(kernel: ak.Kernel, case: Case, dtype: str, cfg: CasesConfig) -> tuple[dict, list[dict]]:
    rtol, atol = _tolerance(case, dtype)
    row = {"variant": kernel.name, "case": case.name, "dtype": dtype, "what": case.what, "status": "pass",
           "calls": 0, "failed_calls": 0, "worst_call": None, "expected": None, "observed": None,
           "max_abs_error": 0.0, "rtol": rtol, "atol": atol, "note": None,
           "first_failing_keys": None}
    if case.visible is not None:
        ok, why = case.visible(dtype)
        if not ok:
            row.update(status="invisible", note=why)
            return row, []
    points, worst = [], -1.0
    for call in case.build(cfg):
        try:
            got = _call(kernel, call, dtype)
        except ak.NotSupported as e:
            row.update(status="not supported", note=str(e))
            return row, []
        except Exception as e:  # the kernel's own failure is this case's finding, not the command's
            got, err = None, f"{type(e).__name__}: {e}"
        else:
            err = None
        row["calls"] += 1
        bad, score, at = _judge(got, call, rtol, atol)
        if case.name == "denominator":
            points.append({"variant": kernel.name, "dtype": dtype, "keys": call.keys,
                           "rel_error": _rel_error(got, call)})
        if err is not None or bad:
            row["failed_calls"] += 1
        if err is not None:
            score, at = math.inf, None
        if score > worst:
            worst = score
            row.update(worst_call=call.label, max_abs_error=score if err is None else None,
                       expected=float(call.expected.flat[at]) if at is not None else None,
                       observed=float(np.asarray(got, np.float64).flat[at]) if at is not None else None,
                       note=err)
    if row["failed_calls"]:
        row["status"] = "fail"
    if points:
        row["first_failing_keys"] = _first_failing(kernel, dtype, points, cfg.bound)
    return row, points


def _first_failing(kernel: ak.Kernel, dtype: str, points: list[dict], bound: float) -> int | None:
    """The smallest row length, to a tile of 128 keys, whose output is off by
    more than the bound: bisected between the sweep's last length within it
    and its first beyond (the error assumed to grow with the length there)."""
    bad = [p["keys"] for p in points if not p["rel_error"] <= bound]
    if not bad:
        return None
    hi = min(bad)
    lo = max([p["keys"] for p in points if p["keys"] < hi], default=0)
    while hi - lo > ax.TILE:
        mid = (lo + hi) // 2 // ax.TILE * ax.TILE
        call = _denominator_call(mid)
        try:
            e = _rel_error(_call(kernel, call, dtype), call)
        except Exception:  # a failure at this length counts as beyond the bound
            e = math.inf
        lo, hi = (mid, hi) if e <= bound else (lo, mid)
    return hi


def _call(kernel: ak.Kernel, call: Call, dtype: str) -> np.ndarray:
    q, k, v = (ak.as_format(a, dtype) for a in (call.q, call.k, call.v))
    kw = {name: val for name, val in call.kwargs.items() if not (name == "splits" and val == 1)}
    return kernel.call(q, k, v, **kw)


def _judge(got, call: Call, rtol: float, atol: float) -> tuple[bool, float, int | None]:
    """(failed, the largest |got - expected| (inf for a non-finite or a
    misshapen result), its flat index)."""
    if got is None:
        return True, math.inf, None
    try:
        g = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        return True, math.inf, None
    if g.shape != call.expected.shape:
        return True, math.inf, None
    err = np.abs(g - call.expected)
    err = np.where(np.isfinite(err), err, np.inf)  # NaN never agrees
    at = int(np.argmax(err))
    # normwise: rtol times the call's largest expected output, so an output that cancels to near 0 is judged at
    # its row's scale (a P stored in bf16 moves every output by about rtol max |v|)
    limit = atol + rtol * float(np.max(np.abs(call.expected))) + call.bound
    return bool(np.any(~(err <= limit))), float(err.flat[at]), at


def _rel_error(got, call: Call) -> float:
    """The denominator case's |mean of V's first column - 1/2| / (1/2)."""
    try:
        g = float(np.asarray(got, np.float64).flat[0])
    except (TypeError, ValueError, IndexError):
        return math.inf
    e = abs(g - 0.5) / 0.5
    return e if math.isfinite(e) else math.inf


def facts(cfg: CasesConfig) -> list[dict]:
    """What each format does to the two quantities the issue names, computed
    (numerics/attention_exact.py), beside any kernel: the row length past
    which a denominator held in it between tiles of 128 keys is off by more
    than the bound, and the position past which a phase table in it moves
    cos by more than the bound."""
    out = []
    for dtype in formats.COMPUTE:
        den = ax.first_denominator_failure(dtype, cfg.bound, cfg.max_keys)
        rope = [ax.first_bad_position(dtype, cfg.bound, ROPE_TOP, t) for t in ROPE_THETAS]
        visible, _ = _zero_sink_visible(dtype)
        out.append({"dtype": dtype, "denominator_first_keys": den, "rope_first_position": rope[0],
                    "rope_first_position_slow": rope[1], "zero_sink_visible": visible})
    return out


def takeaways(rows: list[dict], sweep: list[dict], fact_rows: list[dict], cfg: CasesConfig) -> list[str]:
    out = []
    for r in rows:
        if r["status"] == "fail":
            seen = "no result" if r["observed"] is None else f"observed {r['observed']:.6g}"
            want = "" if r["expected"] is None else f"expected {r['expected']:.6g}, "
            out.append(f"{r['variant']} fails {r['case']} in {r['dtype']} ({r['worst_call']}): {want}{seen}"
                       + (f" ({r['note']})" if r["note"] else ""))
    pct = f"{cfg.bound * 100:g} %"
    for r in rows:
        if r.get("first_failing_keys") is not None:
            out.append(f"{r['variant']} in {r['dtype']}: from {r['first_failing_keys']:,} keys (to {ax.TILE}) the "
                       f"output is off by more than {pct}: its softmax denominator drifts from the numerator")
    for f in fact_rows:
        if f["denominator_first_keys"] is not None:
            out.append(f"a softmax denominator held in {f['dtype']} between tiles of {ax.TILE} keys is off by more "
                       f"than {pct} from {f['denominator_first_keys']:,} keys (equal scores)")
        first = [(p, t) for p, t in zip((f["rope_first_position"], f["rope_first_position_slow"]), ROPE_THETAS, strict=True)
                 if p is not None]
        if first:
            out.append(f"a RoPE phase table in {f['dtype']} moves cos by more than {cfg.bound:g} from position "
                       + "; ".join(f"{p:,} at theta {t:.4g}" for p, t in first)
                       + (f" (bf16(15962) = {ax.stored_position(15962, 'bf16'):g}: cos {ax.rope_cos(15962):+.3f} "
                          f"becomes {ax.rope_cos(15936):+.3f})" if f["dtype"] == "bf16" else ""))
    return out
