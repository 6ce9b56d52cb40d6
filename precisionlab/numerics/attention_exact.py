"""Exact expected values for the attention edge cases (attention-cases),
computed without any attention kernel: closed forms in fractions where the
answer is rational, float64 with a stated error bound where it needs exp, cos
or tanh.

Bounds: math.exp, math.cos and math.tanh are within 1 ulp on the platforms
this runs on (glibc, macOS libm); a closed form of a few of them, with a few
correctly rounded float64 operations, is within REL_BOUND of the real value,
far below any tolerance a case uses (fp32's is 1.3e-6).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from precisionlab.catalog import formats

REL_BOUND = 1e-14  # relative: float64 closed forms of a few exp/cos/tanh and + - x /
TILE = 128  # the key tile a kernel's running denominator is held between (FlashAttention's Bc)


def sink_share(n: int, sink: float) -> float:
    """The attention output when every visible score is 0 and V = 1, with a
    sink logit s: n / (n + e^s) (0 for an empty key range: all mass on the
    sink, which has no value). Written with e^-s past float64's exp range."""
    if n == 0:
        return 0.0
    if sink > 700:
        t = n * math.exp(-sink)
        return t / (1.0 + t)
    return n / (n + math.exp(sink))


def softmax_out(scores: list[float], values: np.ndarray, sink: float | None = None) -> np.ndarray:
    """sum_j e^(x_j) v_j / (e^sink + sum_j e^(x_j)), float64 with math.fsum,
    shifted by the largest logit (the sink's included); zeros for no key and
    no sink. values: keys x dv."""
    logits = list(scores) + ([sink] if sink is not None else [])
    if not scores:
        return np.zeros(values.shape[1])
    m = max(logits)
    w = [math.exp(x - m) for x in scores]
    den = math.fsum(w + ([math.exp(sink - m)] if sink is not None else []))
    return np.array([math.fsum(wj * float(values[j, c]) for j, wj in enumerate(w)) / den
                     for c in range(values.shape[1])])


def softcapped(score: float, cap: float) -> float:
    """cap tanh(score / cap): Gemma's logit soft-cap."""
    return cap * math.tanh(score / cap)


def window(q_pos: int, width: int) -> tuple[int, int]:
    """The keys a query at q_pos sees under a causal sliding window of
    `width` keys to the left (FlashAttention's window_size = (width, 0)):
    q_pos - width ... q_pos, clipped at key 0."""
    return max(0, q_pos - width), q_pos


def range_moments(first: int, last: int) -> tuple[Fraction, Fraction]:
    """The mean of j and of j^2 over the keys first ... last: the output of
    uniform attention over them with V = (j, j^2)."""
    n = last - first + 1
    s1 = Fraction(last * (last + 1) - (first - 1) * first, 2)
    sq = lambda m: Fraction(m * (m + 1) * (2 * m + 1), 6)
    s2 = sq(last) - sq(first - 1)
    return s1 / n, s2 / n


def range_from_moments(mean: float, mean_sq: float) -> tuple[float, float] | None:
    """The contiguous key range whose uniform moments are these (the inverse
    of range_moments: n^2 = 12 var + 1): what a kernel's output says it saw."""
    var = mean_sq - mean * mean
    if not (math.isfinite(var) and var >= -0.5):
        return None
    n = math.sqrt(max(0.0, 12.0 * var + 1.0))
    return mean - (n - 1) / 2, mean + (n - 1) / 2


def rope_cos(position: int, theta: float = 1.0) -> float:
    """cos(position theta), the exact phase's cosine (float64, within 1 ulp:
    libm reduces the argument exactly)."""
    return math.cos(position * theta)


def stored_position(position: int, fmt: str) -> float:
    """The position as a phase table held in `fmt` stores it: bf16(15962) =
    15936, bf16(4095) = 4096, fp16 past 65519: inf."""
    return float(formats.get(fmt).round(np.array([float(position)]))[0])


def first_bad_position(fmt: str, bound: float, top: int, theta: float = 1.0) -> int | None:
    """The smallest position 0 ... top whose phase, taken from a table in
    `fmt` (the position stored in fmt, times theta, rounded to fmt), moves
    cos by more than `bound` (a non-finite phase counts)."""
    pos = np.arange(top + 1, dtype=np.float64)
    f = formats.get(fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        phase = f.round(f.round(pos) * theta) if fmt != "fp64" else pos * theta
        err = np.abs(np.cos(phase) - np.cos(pos * theta))
    bad = np.flatnonzero(~(err <= bound))
    return int(bad[0]) if bad.size else None


def held_denominator(keys: int, fmt: str, tile: int = TILE) -> float:
    """The softmax denominator of a row of `keys` equal scores (every P = 1)
    when each tile's sum is exact and the running sum is held in `fmt`
    between tiles: l = fmt(l + tile sum), tile after tile (the pattern of a
    kernel that keeps l in the input format)."""
    f = formats.get(fmt)
    acc = np.zeros(1)
    for lo in range(0, keys, tile):
        with np.errstate(over="ignore"):
            acc = f.round(acc + min(tile, keys - lo))
    return float(acc[0])


def denominator_rel_error(keys: int, fmt: str, tile: int = TILE) -> float:
    got = held_denominator(keys, fmt, tile)
    return abs(got - keys) / keys if math.isfinite(got) else math.inf


def first_denominator_failure(fmt: str, bound: float, top: int, tile: int = TILE) -> int | None:
    """The smallest row length (a multiple of the tile, up to top) whose held
    denominator is off by more than `bound` relative (inf counts)."""
    f = formats.get(fmt)
    acc = np.zeros(1)
    for lo in range(0, top, tile):
        n = min(tile, top - lo)
        with np.errstate(over="ignore"):
            acc = f.round(acc + n)
        got = float(acc[0])
        if not (abs(got - (lo + n)) <= bound * (lo + n)):
            return lo + n
    return None
