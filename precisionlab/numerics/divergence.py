"""The divergence rules, declared once: what `compare tensors` (two- and
three-way) and `compare model --layers` flag, and which tensor they name as
the first divergence.

Each rule gives a `Flag`: the rule's name (`rule`, the JSON's word) and a text
that states the rule with its number, so every printed verdict says why it
fired ("beyond 4x: 6.3x", never "beyond 4x" for a 1.07x flag).

Per tensor, `judge_tensor(diff, yardstick, ...)`:

  overflow    YOURS (the low-precision run) is non-finite where the reference
              is finite: "overflow: 3 inf where REF is finite". Always a flag:
              an inf that the precision itself produces is still an inf the
              user's logits will carry.
  ratio       numerics.compare's verdict: diff more than RATIO_THRESHOLD times
              the yardstick (what the precision costs there): "beyond 4x: 6.3x".
  scale_fit   YOURS = s x REF_LOW by least squares (`scale_fit`), with z =
              |s - 1| over the spread rounding alone gives s; flagged past
              BIAS_Z when |s - 1| is also an effect: beyond one rounding of
              the format and beyond SCALE_MIN_SHARE of the yardstick
              (`scale_effect`): "YOURS = 1.0057 x REF_LOW, z = 88".

Over the compared tensors in execution order, `first_divergence(rows)` adds
the two rules that need the tensors before, then names the first flagged one:

  first_differs  the first tensor whose diff is not 0 when every compared
                 tensor before it (at least one) is bit-identical:
                 "first to differ (14 upstream bit-identical)";
  first_jump     the first tensor whose diff is more than JUMP times the
                 tensor before's (a non-zero one): "first jump: rel-L2 12x the
                 tensor before".

The order rules are gated, or every re-implementation would be flagged at its
first matmul. first_differs: the tensor's diff is at least one rounding of
its low format (the format's unit roundoff, `Judged.rounding`): with
bit-identical inputs two honest kernels round the same value twice and differ
only in the few elements where their accumulations round apart, far under
one rounding; a bug the size of one rounding or more is not that. (The
yardstick (2) is no gate here: in a dump it is the low run's accumulated
error, which an engine with bit-identical inputs does not carry; a 0.5 %
scale in a bf16 MLP sits at 0.6x it and at 1.5x one rounding.) Without a
format it falls back to the first_jump gate. first_jump: the tensor's diff at
least ORDER_MIN_RATIO times its yardstick (past the first difference both
runs carry upstream errors, as the yardstick does).

`first_divergence` takes only rows that were actually compared: a tensor
missing from a file or refused for its shape is the caller's to list apart,
never a divergence.

numpy only (compare tensors on .npz files never imports torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from precisionlab.catalog import formats
from precisionlab.numerics.compare import RATIO_THRESHOLD, judge

# A difference that is a systematic scaling, not rounding: the least-squares
# fit yours ~ s * trusted. Rounding errors are unbiased, so over n elements of
# relative size yard the fitted s strays from 1 by about yard / sqrt(n).
# Measured: a planted 1 % scale in a bf16 MLP of the embedded model (3.4x its
# rounding by rel-L2, under the 4x rule) sits at z of several hundred in
# --layers (tests/test_layers.py), a 0.5 % one at s = 1.0057, z = 82 (ratio
# 1.97x); clean modules at z < 12. In a three-way dump comparison the
# yardstick is the low run's accumulated error, so z is smaller: the same
# 0.5 % in the tiny Qwen3 of scripts/engine_bugs.py gives s = 1.0057, z = 18
# (ratio 0.58x), and first_differs names it there. Flagged past BIAS_Z.
#
# z alone is no verdict: it grows as sqrt(n), so at real width (36 tokens x
# 576 = 20736 elements) any tiny systematic difference passes it. A clean f32
# GGUF of a 576-wide Qwen3 under llama.cpp gives s - 1 = 1.6e-8 at z = 54 at
# its first norm: a quarter of one fp32 rounding, which one scalar constant
# rounded apart (an eps, 1/sqrt(d), a norm weight) produces. So the scale
# must also be an EFFECT, |s - 1| beyond both
#   - one rounding of the format (its unit roundoff u): a single constant
#     rounded differently on the way shifts s by up to u, honestly; and
#   - SCALE_MIN_SHARE of the rounding error measured at that tensor (the
#     yardstick, rel-L2): a scale |s - 1| adds (s - 1)^2 to the squared
#     error, so at half the yardstick it is a fifth of the error energy, and
#     under it the scale changes the error by less than rounding's own spread
#     from tensor to tensor (the clean ratio moves 1.0-1.6x).
# Both are independent of n: the same gate at 128 and 20736 elements.
#
# Nor are rounding errors independent element by element: a norm's factor, a
# softmax's denominator, are one rounding per row, and in a trained model one
# row (the first token's massive activations) can carry most of a tensor's
# norm. The fit's spread is then that of a few rows, not of n elements: on
# SmolLM2-135M an exact f32 GGUF under llama.cpp fitted s - 1 = 3.3e-7 at an
# MLP (1.5x its yardstick, 5.5 fp32 roundings) at "z = 103" over 4608
# elements. So z divides by the larger of the element spread and the rows'
# own: the spread of the per-row fits s_r about s, weighted as the fit
# weighs them (row_spread). A scale a bug puts on every row moves every s_r
# alike and keeps z large; rounding's per-row factors scatter them.
BIAS_Z = 20.0
SCALE_MIN_SHARE = 0.5
# The first jump: diff rising by more than this factor from the tensor before.
JUMP = 10.0
# The order rules' gate: the tensor's diff at least this many times its yardstick.
ORDER_MIN_RATIO = 1.0

RULES = ("overflow", "ratio", "scale_fit", "first_differs", "first_jump", "tolerance")


@dataclass(frozen=True)
class Flag:
    """One rule that fired: its name (RULES), the rule with its number as a
    text, and that number."""
    rule: str
    text: str
    value: float

    def as_dict(self) -> dict:
        return {"rule": self.rule, "text": self.text, "value": self.value}


# --- the measurements the rules read ----------------------------------------------------------


def scale_fit(y: np.ndarray, t: np.ndarray, yard: float) -> tuple[float, float]:
    """(s, z): the least-squares scale of y against t (y ~ s t) over the
    elements finite in both, and |s - 1| over its rounding spread yard /
    sqrt(n). (1, 0) where the fit means nothing: t all zero, fewer than two
    elements, or a yardstick that is 0 or not finite."""
    both = np.isfinite(y) & np.isfinite(t)
    yv, tv = np.asarray(y, dtype=np.float64)[both], np.asarray(t, dtype=np.float64)[both]
    tt = float(np.dot(tv, tv))
    if tt == 0 or not math.isfinite(yard) or yard == 0 or yv.size < 2:
        return 1.0, 0.0
    s = float(np.dot(yv, tv)) / tt
    spread = max(yard / math.sqrt(yv.size), row_spread(y, t, s))
    return s, abs(s - 1) / spread


def row_spread(y: np.ndarray, t: np.ndarray, s: float) -> float:
    """The spread of the fitted s from the rows (the last axis): s is the
    norm-weighted mean of the per-row fits s_r (weights w_r = |t_r|^2 / |t|^2),
    so its variance is sigma^2 sum w_r^2 with sigma^2 the weighted (reliability)
    variance of the s_r. 0 where rows cannot say (one row, a 1-D tensor):
    the element spread stands alone."""
    a, b = np.asarray(y, dtype=np.float64), np.asarray(t, dtype=np.float64)
    if a.ndim < 2 or a.shape != b.shape:
        return 0.0
    both = np.isfinite(a) & np.isfinite(b)
    a, b = np.where(both, a, 0.0).reshape(-1, a.shape[-1]), np.where(both, b, 0.0).reshape(-1, b.shape[-1])
    tt = np.einsum("ij,ij->i", b, b)
    keep = tt > 0
    if np.count_nonzero(keep) < 2:
        return 0.0
    s_r = np.einsum("ij,ij->i", a[keep], b[keep]) / tt[keep]
    w = tt[keep] / tt[keep].sum()
    w2 = float(np.dot(w, w))
    if 1 - w2 <= 1e-12:
        return 0.0
    sigma2 = float(np.dot(w, (s_r - s) ** 2)) / (1 - w2)
    return math.sqrt(sigma2 * w2)


def overflow_count(ref: np.ndarray, side: np.ndarray, axis=None):
    """How many elements `side` has non-finite (inf or NaN) where `ref` is
    finite: the whole array's count (axis None, an int) or per slice along
    `axis` (an array; compare logits counts per position)."""
    bad = np.isfinite(ref) & ~np.isfinite(side)
    return int(np.count_nonzero(bad)) if axis is None else np.count_nonzero(bad, axis=axis)


def overflow_split(ref: np.ndarray, side: np.ndarray) -> tuple[int, int]:
    """(inf, NaN): overflow_count split by kind, for the flag's text."""
    fin = np.isfinite(ref)
    return int(np.count_nonzero(fin & np.isinf(side))), int(np.count_nonzero(fin & np.isnan(side)))


def overflow_text(n_inf: int, n_nan: int, ref: str = "REF") -> str:
    parts = ([f"{n_inf} inf"] if n_inf else []) + ([f"{n_nan} NaN"] if n_nan else [])
    return f"overflow: {', '.join(parts)} where {ref} is finite"


# --- overflow that hides as finite values -----------------------------------------------------

# What checks a norm kernel: `compare op` runs the user's RMSNorm against the
# exact one on rows whose squares leave the low format's range.
NORM_HINT = "check the kernel: precisionlab compare op rmsnorm --dtypes {fmt} --impl MODULE:FUNCTION"


def _rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a.reshape(-1, a.shape[-1]) if a.ndim >= 1 and a.size else a.reshape(0, 0)


def constant_rows(ref: np.ndarray, side: np.ndarray) -> tuple[int, int, int]:
    """(zero, constant, rows): the rows (along the last axis, at least two
    elements each) where `side` is all 0, or all one other value, while
    `ref`'s row is not constant. An RMSNorm whose sum of squares overflowed
    gives x * rsqrt(inf) = 0: a finite row that no inf rule sees."""
    r, y = _rows(ref), _rows(side)
    if r.shape != y.shape or r.ndim != 2 or r.shape[1] < 2 or not r.shape[0]:
        return 0, 0, 0
    with np.errstate(invalid="ignore"):  # a row with inf - inf or NaN is no constant row here
        flat_y = np.isfinite(y).all(axis=1) & (y.max(axis=1) == y.min(axis=1))
        varied_r = np.isfinite(r).all(axis=1) & (r.max(axis=1) != r.min(axis=1))
    hit = flat_y & varied_r
    zero = hit & (y[:, 0] == 0)
    return int(zero.sum()), int((hit & ~zero).sum()), int(r.shape[0])


def range_excess(ref32: np.ndarray, fmt_name: str | None, ref: str = "REF_FP32") -> str | None:
    """Where REF_FP32's values, or its rows' sums of squares (what an RMSNorm
    accumulates), leave the low format's finite range: one phrase, or None.
    Values past it overflow in any kernel; squares past it only in one that
    accumulates them in the low format."""
    if fmt_name is None:
        return None
    fmax = formats.get(fmt_name).max
    r = _rows(ref32)
    r = np.where(np.isfinite(r), r, 0.0)
    if not r.size or not fmax:
        return None
    amax = float(np.abs(r).max())
    if amax > fmax:
        return f"{ref} reaches {amax:.3g}, past {fmt_name}'s max {fmax:.5g}"
    sumsq = float((r * r).sum(axis=1).max())
    if sumsq > fmax:
        return f"{ref}'s row sum of squares reaches {sumsq:.3g}, past {fmt_name}'s max {fmax:.5g}"
    return None


def hidden_overflow_flag(rows: tuple[int, int, int], fmt_name: str | None, cause: str | None = None,
                         ref: str = "REF") -> Flag | None:
    """The overflow rule for a row that overflow turned finite: YOURS' rows
    all zero (or constant) where `ref`'s vary, with the range excess that
    explains it (`cause`, at this tensor or its input) and the `compare op`
    run that checks the kernel. None where no such row is found."""
    zero, const, n = rows
    if not (zero or const):
        return None
    what = (f"{zero} of {n} rows of YOURS are 0" if zero else f"{const} of {n} rows of YOURS are constant")
    text = (f"overflow hidden: {what} where {ref}'s are not; a row of zeros: an overflow upstream made "
            f"rsqrt(inf) = 0?" + (f" ({cause})" if cause else "") + "; "
            + NORM_HINT.format(fmt=fmt_name or "fp16"))
    return Flag("overflow", text, float(zero + const))


def _x(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.3g}"


# --- per tensor -------------------------------------------------------------------------------


def judge_tensor(diff: float, yardstick: float, *, ratio: float | None = None,
                 scale: tuple[float, float] | None = None, overflow: tuple[int, int] = (0, 0),
                 against: str = "REF_LOW", ref: str = "REF", rounding: float | None = None) -> list[Flag]:
    """The per-tensor rules that fire on one compared tensor, in the order
    overflow, ratio, scale_fit (the first is the one a table shows).

    diff       YOURS' error: (3), YOURS vs REF_LOW (rel-L2);
    yardstick  (2): what the precision costs there (rel-L2);
    ratio      the verdict's ratio when the caller measured it otherwise
               (compare.three_way_ratio over finite elements); else
               compare.judge(diff, yardstick);
    scale      (s, z) from scale_fit, or None where no fit was made;
    overflow   (inf, NaN) from overflow_split: YOURS non-finite where `ref` is
               finite;
    against    the name of the side s scales (REF_LOW, or "clean" in --layers);
    rounding   one rounding of the compared format (`rounding(fmt)`), the
               scale's floor; None where no format is known.
    """
    flags = []
    if overflow[0] or overflow[1]:
        flags.append(Flag("overflow", overflow_text(*overflow, ref), float(overflow[0] + overflow[1])))
    r = judge(diff, yardstick)[0] if ratio is None else ratio
    if r > RATIO_THRESHOLD:
        flags.append(Flag("ratio", f"beyond {RATIO_THRESHOLD:g}x: {_x(r)}x", r))
    if scale is not None:
        s, z = scale
        if z > BIAS_Z and abs(s - 1) > scale_effect(yardstick, rounding):
            flags.append(Flag("scale_fit", f"YOURS = {s:.4f} x {against}, z = {z:.0f}", z))
    return flags


def scale_effect(yardstick: float, rounding: float | None = None) -> float:
    """The smallest |s - 1| the scale fit calls a bug: beyond one rounding of
    the format and beyond SCALE_MIN_SHARE of the tensor's measured rounding
    error (see SCALE_MIN_SHARE's comment). A yardstick that is not finite
    counts as none (the ratio and overflow rules speak there)."""
    share = SCALE_MIN_SHARE * yardstick if math.isfinite(yardstick) else 0.0
    return max(share, rounding or 0.0)


def rounding(fmt_name: str | None) -> float | None:
    """One rounding of a format, relative: its unit roundoff 2^-p (half its
    eps); None for an exact (integer) format."""
    return None if fmt_name is None else formats.get(fmt_name).eps / 2


def tolerance_flag(n_outside: int, n: int, rtol: float, atol: float) -> Flag:
    """Two-way compare tensors' verdict (no yardstick there): elements outside
    numerics.compare's tolerance, "12 of 4096 outside rtol 0.016, atol 1e-05"."""
    return Flag("tolerance", f"{n_outside} of {n} outside rtol {rtol:g}, atol {atol:g}", float(n_outside))


# --- over the compared tensors, in execution order --------------------------------------------


@dataclass
class Judged:
    """One compared tensor as first_divergence reads it: its name, diff (3),
    ratio, and the per-tensor flags (judge_tensor); first_divergence appends
    the order rules' flags to `flags`."""
    name: str
    diff: float
    ratio: float
    flags: list[Flag] = field(default_factory=list)
    rounding: float | None = None  # one rounding of the low format (unit roundoff): first_differs' gate

    @property
    def flagged(self) -> bool:
        return bool(self.flags)


@dataclass(frozen=True)
class Divergence:
    """The first divergence: its index among the rows given, its name and the
    flag that names it (the first of its flags)."""
    index: int
    name: str
    flag: Flag

    def as_dict(self) -> dict:
        return {"name": self.name, "rule": self.flag.rule, "text": self.flag.text, "value": self.flag.value}


def first_divergence(rows: list[Judged]) -> Divergence | None:
    """Adds the order rules (first_differs, first_jump) to the rows' flags and
    returns the first flagged row, or None.

    rows: the tensors that were compared, in execution order, and only those
    (a missing or shape-refused tensor is not a row). Each order rule fires on
    one row at most: first_differs on the first row that differs at all
    (when that difference is at least one rounding), first_jump on the first
    jump whose row passes its gate (an honest jump before it, a ratio under
    ORDER_MIN_RATIO, does not use it up). Calling it again on the same rows,
    or on more rows after them (--fail-fast), adds nothing twice. A row
    flagged by both an order rule and a per-tensor rule keeps the per-tensor
    flag first."""
    identical = 0  # compared rows before this one, all bit-identical so far
    differs_done = jump_done = False
    prev = None
    for r in rows:
        gate = r.ratio >= ORDER_MIN_RATIO
        if not differs_done and r.diff != 0:
            differs_done = True
            big = r.diff >= r.rounding if r.rounding else gate
            if identical >= 1 and big and not any(f.rule == "first_differs" for f in r.flags):
                said = f", {_x(r.diff / r.rounding)} roundings" if r.rounding else ""
                r.flags.append(Flag("first_differs", f"first to differ ({identical} upstream bit-identical{said})",
                                    float(identical)))
        elif r.diff == 0 and not differs_done:
            identical += 1
        if not jump_done and gate and prev is not None and 0 < prev < math.inf and r.diff > JUMP * prev:
            jump_done = True
            k = r.diff / prev
            if not any(f.rule == "first_jump" for f in r.flags):
                r.flags.append(Flag("first_jump", f"first jump: rel-L2 {_x(k)}x the tensor before", k))
        prev = r.diff
    for i, r in enumerate(rows):
        if r.flags:
            return Divergence(i, r.name, r.flags[0])
    return None


def row_fields(flags: list[Flag]) -> dict:
    """The JSON fields a judged row carries: flagged, rule (the first flag's,
    or None), reason (its text) and every flag that fired."""
    return {"flagged": bool(flags), "rule": flags[0].rule if flags else None,
            "reason": flags[0].text if flags else None, "flags": [f.as_dict() for f in flags]}
