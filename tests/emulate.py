"""An independent, step-by-step emulation of the accumulate kernels.

Written apart from the library and from precisionlab's own Python: every
operation's exact result is a fractions.Fraction, rounded once to the
accumulator format through numpy and ml_dtypes casts. The casts only round
correctly from a value that carries its sticky bit, so the exact value is first
rounded *to odd* at double (and, for formats below fp32, at float32) precision:
round-to-odd at p + 2 or more bits followed by round-to-nearest at p bits is
the correctly rounded result.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import ml_dtypes
import numpy as np

DTYPES = {
    "fp64": np.dtype(np.float64),
    "fp32": np.dtype(np.float32),
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp8_e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
    "fp8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}


def _bits(d: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", d))[0]


def _odd53(q: Fraction) -> float:
    d = float(q)  # CPython's Fraction -> float is correctly rounded
    if Fraction(d) != q and _bits(d) % 2 == 0:
        d = math.nextafter(d, math.inf if q > d else -math.inf)
    return d


def _odd24(d: float) -> np.float32:
    with np.errstate(over="ignore"):
        f = np.float32(d)
    if np.isfinite(f) and float(f) != d and int(f.view(np.uint32)) % 2 == 0:
        f = np.nextafter(f, np.float32(np.inf if d > float(f) else -np.inf))
    return f


def round_exact(q: Fraction, fmt: str) -> float:
    """The exact value q rounded to nearest-even in fmt, as a double."""
    if fmt == "fp64":
        return float(q)
    d = _odd53(q)
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt == "fp32":
            return float(np.float32(d))
        return float(np.array([_odd24(d)], dtype=np.float32).astype(DTYPES[fmt])[0])


def add(a: float, b: float, fmt: str) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        return round_exact_nonfinite(a + b, fmt)
    q = Fraction(a) + Fraction(b)
    if q == 0:  # IEEE: an exact zero sum is +0 unless both operands are -0
        return -0.0 if (math.copysign(1, a) < 0 and math.copysign(1, b) < 0) else 0.0
    return round_exact(q, fmt)


def sub(a: float, b: float, fmt: str) -> float:
    return add(a, -b, fmt)


def round_exact_nonfinite(x: float, fmt: str) -> float:
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.array([x]).astype(DTYPES[fmt])[0]) if fmt != "fp64" else x


# ---------------------------------------------------------------------------


def sequential(x, fmt: str) -> float:
    s = 0.0
    for v in x:
        s = add(s, float(v), fmt)
    return s


def pairwise(x, fmt: str) -> float:
    """Level by level: adjacent pairs, an odd last element carried up unchanged."""
    level = [float(v) for v in x]
    while len(level) > 1:
        nxt = [add(level[i], level[i + 1], fmt) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    x = level[0]
    if x == 0:
        return x  # a lone zero keeps its sign; Fraction would drop it
    return round_exact(Fraction(x), fmt) if math.isfinite(x) else round_exact_nonfinite(x, fmt)


def kahan(x, fmt: str) -> float:
    s = c = 0.0
    for v in x:
        y = sub(float(v), c, fmt)
        t = add(s, y, fmt)
        c = sub(sub(t, s, fmt), y, fmt)
        s = t
    return s


def neumaier(x, fmt: str) -> float:
    s = c = 0.0
    for v in x:
        v = float(v)
        t = add(s, v, fmt)
        lost = add(sub(s, t, fmt), v, fmt) if abs(s) >= abs(v) else add(sub(v, t, fmt), s, fmt)
        c = add(c, lost, fmt)
        s = t
    return add(s, c, fmt)


# Stochastic rounding -------------------------------------------------------

M64 = 2**64 - 1


def splitmix64(seed: int, counter: int) -> int:
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def uniform(seed: int, counter: int) -> Fraction:
    return Fraction(splitmix64(seed, counter) >> 11, 2**53)


def round_stochastic(q: Fraction, fmt: str, u: Fraction) -> float:
    """Round up (in magnitude) with probability equal to the distance from the
    lower neighbour, in units of the spacing. The distance is taken from the
    round-to-odd double of q, as the kernel defines it."""
    if fmt == "fp64":
        return float(q)
    v = Fraction(_odd53(q))
    if v == 0:
        return 0.0
    fi = ml_dtypes.finfo(DTYPES[fmt])
    a = abs(v)
    e = max(math.frexp(float(a))[1] - 1, int(fi.minexp))
    quantum = Fraction(2) ** (e - int(fi.nmant))
    lo = (a // quantum) * quantum
    frac = (a - lo) / quantum
    r = lo + quantum if u < frac else lo
    r = float(r)
    if r > float(fi.max):
        r = math.inf if fmt != "fp8_e4m3" else math.nan
    return -r if v < 0 else r


def stochastic(x, fmt: str, seed: int) -> float:
    s = 0.0
    for i, v in enumerate(x):
        if not (math.isfinite(s) and math.isfinite(float(v))):
            s = round_exact_nonfinite(s + float(v), fmt)
            continue
        s = round_stochastic(Fraction(s) + Fraction(float(v)), fmt, uniform(seed, i))
    return s


def run(method: str, x, fmt: str, seed: int = 0) -> float:
    if method == "stochastic":
        return stochastic(x, fmt, seed)
    return {"sequential": sequential, "pairwise": pairwise, "kahan": kahan, "neumaier": neumaier}[method](x, fmt)
