"""The comparison rules, declared once: what compare op, compare tensors,
compare model --layers, kvcache and formats judge with.

  tolerances   (rtol, atol) per format: torch.testing.assert_close's table
               for fp64/fp32/fp16/bf16, a rule from the format's precision
               for the rest of the catalog (fp8, fp6, fp4);
  override     --rtol and --atol: each finite and >= 0, both or neither
               (torch.testing refuses a half-specified pair too);
  rel_l2       ||x - ref|| / ||ref||, exact, with one rule for non-finite
               values and for an all-zero reference;
  ratio        (3) / (2), or (1) / (0): how many times the yardstick an
               error is, with its rules for zero and non-finite yardsticks;
  flagged      the verdict: a ratio above RATIO_THRESHOLD.

numpy only: comparing .npz files never imports torch (tests hold the table
equal to torch's own).
"""

from __future__ import annotations

import math

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.numerics import metrics

# --- tolerances ------------------------------------------------------------------------

# torch.testing.assert_close's defaults (rtol, atol), copied from torch's
# _DTYPE_PRECISIONS so that no comparison needs torch to know them.
ASSERT_CLOSE_DEFAULTS = {"fp64": (1e-7, 1e-7), "fp32": (1.3e-6, 1e-5), "fp16": (1e-3, 1e-5), "bf16": (1.6e-2, 1e-5)}
# torch has no entry for the low-bit formats (it compares fp8 with rtol =
# atol = 0, so every rounded element is "outside"). Here: one spacing at 1
# relative (the format's eps, 2^(1-p): two roundings' worth), and torch's
# usual absolute floor.
LOW_BIT_ATOL = 1e-5


def tolerance_formats() -> tuple[str, ...]:
    """Every format the table covers: the catalog's, in its order."""
    return tuple(formats.FORMATS)


def tolerances(fmt_name: str | None) -> tuple[float, float]:
    """(rtol, atol) for values of this format; None (integers) is exact: (0, 0)."""
    if fmt_name is None:
        return 0.0, 0.0
    if fmt_name in ASSERT_CLOSE_DEFAULTS:
        return ASSERT_CLOSE_DEFAULTS[fmt_name]
    return formats.get(fmt_name).eps, LOW_BIT_ATOL


def check_override(rtol: float | None, atol: float | None) -> None:
    """--rtol / --atol as the user gave them: each finite and >= 0 (NaN would
    pass every comparison), and both or neither, as torch.testing asks: half
    a pair would silently mix the user's number with a default."""
    for name, v in (("--rtol", rtol), ("--atol", atol)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise UsageError(f"{name} must be a finite number >= 0 (got {v})")
    if (rtol is None) != (atol is None):
        given = "--rtol" if atol is None else "--atol"
        raise UsageError(f"Both --rtol and --atol must be either specified or omitted (got only {given})")


def resolve(fmt_name: str | None, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """(rtol, atol) for this format: the override when given (checked), else the table's."""
    check_override(rtol, atol)
    return (rtol, atol) if rtol is not None else tolerances(fmt_name)


# --- rel-L2 ------------------------------------------------------------------------------


def nonfinite_pairs(x: np.ndarray, ref: np.ndarray, equal_nan: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The non-finite rule, as masks (agree, mismatch) over the pairs: the same
    infinity on both sides agrees, NaN with NaN only under equal_nan (compare
    op's masked rows, compare tensors --equal-nan), and any other pair with a
    non-finite side is a mismatch."""
    finite = np.isfinite(x) & np.isfinite(ref)
    agree = ~finite & (x == ref)
    if equal_nan:
        agree |= np.isnan(x) & np.isnan(ref)
    return agree, ~finite & ~agree


def rel_l2(x: np.ndarray, ref: np.ndarray, equal_nan: bool = False) -> float:
    """||x - ref|| / ||ref|| over float64 values, from exact sums, rounded once.

    Pairs that agree under the non-finite rule add nothing; any mismatch makes
    it inf (never NaN: a NaN is the largest error there is). An all-zero
    reference gives 0 when x equals it and inf for any difference."""
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if not (np.isfinite(x).all() and np.isfinite(ref).all()):
        agree, mismatch = nonfinite_pairs(x, ref, equal_nan)
        if mismatch.any():
            return math.inf
        x, ref = x[~agree], ref[~agree]
    return metrics.exact_rel_l2(x, ref)


def typical_row_rel_l2(x: np.ndarray, ref: np.ndarray) -> float:
    """The median over rows (the last axis) of each row's rel-L2, over the rows
    whose reference is finite and not all zero; 0 where there are none.

    rel_l2 weighs elements by their square: where a few carry a tensor's norm
    (a trained model's massive activations, 1.4e4 among values of 1-100 in
    SmolLM2's MLPs) it is one draw of those elements' rounding, which can fall
    far below what rounding costs the rest (5.3e-8, under one fp32 rounding,
    where each other row costs 5e-7). The median row is what rounding
    typically costs there."""
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if x.ndim < 2 or x.shape != ref.shape:
        return 0.0
    x, ref = x.reshape(-1, x.shape[-1]), ref.reshape(-1, ref.shape[-1])
    ok = np.isfinite(x).all(1) & np.isfinite(ref).all(1) & (np.abs(ref).sum(1) > 0)
    if not ok.any():
        return 0.0
    return float(np.median(np.linalg.norm(x[ok] - ref[ok], axis=1) / np.linalg.norm(ref[ok], axis=1)))


# --- the ratio and the verdict ------------------------------------------------------------

# (3) more than this many times (2), or (1) more than this many times (0), is
# flagged. A correct kernel and torch make rounding choices of the same size as
# the format itself, so the ratio sits near 1 (0 to ~2 for this project's
# kernels); an accumulator in the low format, or a real bug, lands 10x and
# beyond. 4 leaves room for honest differences in reduction order without
# hiding either.
RATIO_THRESHOLD = 4.0


def ratio(got: float, base: float) -> float:
    """got / base, two rel-L2s: an error in units of its yardstick.

    A non-finite error (inf, or NaN, which agrees with nothing) is inf. An
    infinite yardstick (the precision itself overflows there) makes any finite
    error 0. A zero yardstick (the precision costs nothing there) makes any
    difference inf and none 0."""
    if not math.isfinite(got):
        return math.inf
    if math.isnan(base):
        return math.inf
    if math.isinf(base):
        return 0.0
    if base > 0:
        return got / base
    return 0.0 if got == 0 else math.inf


def flagged(r: float) -> bool:
    """The verdict on a ratio: beyond RATIO_THRESHOLD is a likely bug, not rounding."""
    return r > RATIO_THRESHOLD


def judge(got: float, base: float) -> tuple[float, bool]:
    """(ratio, flagged) of an error against its yardstick."""
    r = ratio(got, base)
    return r, flagged(r)


# --- one comparison, measured -------------------------------------------------------------


class Measured:
    """metrics.error_report over the pairs that do not agree under the
    non-finite rule, with rel_l2 by the rule above: the exact sums are the
    report's own (computed once), inf when a pair mismatches."""

    def __init__(self, actual: np.ndarray, reference: np.ndarray, fmt, rtol: float, atol: float,
                 equal_nan: bool = False):
        agree, mismatch = nonfinite_pairs(actual, reference, equal_nan)
        self.kept = ~agree
        self.report = metrics.error_report(actual[self.kept], reference[self.kept], fmt, atol, rtol)
        self.mismatch = int(np.count_nonzero(mismatch))
        self.reference_nonfinite = int(np.count_nonzero(~np.isfinite(reference)))
        self.rel_l2 = math.inf if self.mismatch else self.report.rel_l2

def finite_yardstick(ref32: np.ndarray, low: np.ndarray, yours: np.ndarray, equal_nan: bool = False) -> dict:
    """(2) and (3) again over the elements where all three files are finite.

    One element of REF_LOW that overflowed to inf makes the whole-tensor
    yardstick inf, and an inf yardstick would excuse any (3): YOURS matching
    that inf but 100x off everywhere else would pass. So the verdict judges the
    finite elements by what they cost there, and the count of the others is
    reported (they are judged by the non-finite rules of rel-L2 and the
    tolerance check, which still flag a YOURS that differs from REF_LOW there)."""
    keep = np.isfinite(ref32) & np.isfinite(low) & np.isfinite(yours)
    k = int(keep.size - np.count_nonzero(keep))
    if k:
        ref32, low, yours = ref32[keep], low[keep], yours[keep]
    return {"yardstick_finite": rel_l2(low, ref32, equal_nan), "rel_l2_finite": rel_l2(yours, low, equal_nan),
            "nonfinite_elements": k}


def three_way_ratio(y3: float, fin: dict) -> float:
    """The verdict's (3)/(2): inf where YOURS is non-finite where REF_LOW is
    not (or the reverse), else the finite elements' ratio (finite_yardstick).
    Where every element is finite, or every non-finite one agrees in all three
    files, this is ratio(y3, y2) exactly."""
    if not math.isfinite(y3):
        return math.inf
    return ratio(fin["rel_l2_finite"], fin["yardstick_finite"])


# --- a contract: two computations of one thing that should agree up to rounding ---------------------
# (compare contracts re-runs a broken one in fp64; compare pair judges two files of one precision)

# How many roundings deep two orderings of one forward pass may differ, in units of the precision's u at
# the largest |logit| of a position, before the difference is beyond rounding. The clean engines' breaks
# measure a few u (tests/test_pair.py; the embedded model's fp32 contracts stay below 1e-3 nats at logits of
# O(10)); a planted bug measures thousands. 64 u: a few dozen roundings, fixed before the bugs were measured.
ROUNDING_DEPTH = 64


def rounding_ratio(dtype: str, exact: str) -> float:
    """The Δ ratio (exact / run) below which a break is rounding: the
    geometric middle of what rounding predicts (u_exact / u_dtype: the same
    computation, rounded finer) and what an algorithmic difference gives
    (about 1: it does not depend on the precision)."""
    return math.sqrt(formats.get(exact).unit_roundoff / formats.get(dtype).unit_roundoff)


def rounding_bound(dtype: str, largest_abs_logit: np.ndarray) -> np.ndarray:
    """Per position, the largest |Δ log-prob| rounding in `dtype` explains:
    ROUNDING_DEPTH roundings of the position's largest |logit| (|Δ log-prob|
    is at most twice the largest |Δ logit|; the depth covers the factor). At
    least 1: the log-sum-exp a log-prob subtracts is O(1) whatever the logits."""
    return ROUNDING_DEPTH * formats.get(dtype).unit_roundoff * np.maximum(largest_abs_logit, 1.0)


def _log_softmax_rows(x: np.ndarray) -> np.ndarray:
    top = np.max(np.where(np.isfinite(x), x, -np.inf), axis=1, keepdims=True)
    z = x - np.where(np.isfinite(top), top, 0.0)
    return z - np.log(np.sum(np.exp(z), axis=1, keepdims=True))


def logprob_diff_rows(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two runs' logit rows (positions x vocab, float64) -> per position the
    largest |Δ log-prob| over the vocabulary (inf where one side is
    non-finite and the other not, or a NaN; 0 for a token -inf in both) and
    x's largest finite |logit| (the scale rounding_bound takes)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lx, ly = _log_softmax_rows(x), _log_softmax_rows(y)
        d = np.abs(lx - ly)
    d = np.where(np.isneginf(lx) & np.isneginf(ly), 0.0, np.where(np.isnan(d), np.inf, d))
    return d.max(axis=1), np.max(np.where(np.isfinite(x), np.abs(x), 0.0), axis=1)
