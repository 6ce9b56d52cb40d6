"""Exact references and error measures.

References come from math.fsum (the correctly rounded sum of the doubles it is
given) and float64, never from Python's sum(), whose algorithm changed in 3.12.
NaN never agrees with anything, NaN included.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from precisionlab.numerics import ddexp
from precisionlab.catalog.formats import Format


def exact_sum(values: np.ndarray) -> float:
    """The correctly rounded double of the exact sum of `values`.

    Non-finite inputs follow IEEE: any NaN, or +inf with -inf, gives NaN; an
    infinity otherwise gives that infinity. A finite sum beyond the double range
    is inf with its sign (fsum raises there; the sum is recomputed scaled by an
    exact power of two to find the sign).
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    finite = np.isfinite(v)
    if not finite.all():
        bad = v[~finite]
        if np.isnan(bad).any() or (np.isposinf(bad).any() and np.isneginf(bad).any()):
            return math.nan
        return float(bad[0])
    try:
        return math.fsum(_chunked(v))
    except OverflowError:  # a partial sum left the double range; the total may not have
        return _exact_sum_wide(v)


def exact_mean(values: np.ndarray) -> float:
    """The mean, correctly rounded: the exact sum over the count, rounded once
    (a sum that overflows the double range does not make a finite mean inf);
    the non-finite rules are exact_sum's; NaN when empty."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if not v.size:
        return math.nan
    q = _exact_total([v])
    return exact_sum(v) if q is None else q_to_float(q / v.size)


def q_to_float(q: Fraction) -> float:
    """The correctly rounded double of a rational (int / int division is), inf with its sign past the range."""
    try:
        return float(q)
    except OverflowError:
        return math.inf if q > 0 else -math.inf


def exp_or_inf(x: float) -> float:
    """math.exp with IEEE's answer past the range (math.exp raises OverflowError there)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _exact_sum_wide(v: np.ndarray) -> float:
    """exact_sum where fsum overflowed. Scaled by 2^-64 the partial sums fit,
    and the scaling is exact while no value or result falls below 2^-958
    (then 2^-64 of it is still normal); otherwise, rare, sum exactly in
    rationals. Rounding back: the correctly rounded double, inf past it."""
    from fractions import Fraction

    tiny = 2.0**-958
    scaled = math.fsum(_chunked(v * 2.0**-64))
    if abs(scaled) >= tiny * 2.0**-64 and not np.any((v != 0) & (np.abs(v) < tiny)):
        try:
            return math.ldexp(scaled, 64)
        except OverflowError:
            return math.copysign(math.inf, scaled)
    total = Fraction(0)
    for x in v.tolist():
        total += Fraction(x)
    return q_to_float(total)


def _chunked(v: np.ndarray, size: int = 1 << 20):
    """The values as Python floats, a chunk at a time: fsum stays exact (it sees
    one stream) and 10^8 values never become 10^8 float objects at once."""
    return itertools.chain.from_iterable(v[i:i + size].tolist() for i in range(0, v.size, size))


def abs_error(result: float, exact: float, exact_q: Fraction | None = None) -> float:
    """|result - exact|, correctly rounded. exact is a double; exact_q, when
    given, is the exact value it rounds (a sum's exact rational value): the
    error is then measured against that, not against its rounding, so a
    result equal to the rounded double still shows its true error."""
    if math.isnan(result) or math.isnan(exact):
        return math.nan
    if math.isinf(result) or math.isinf(exact):
        return 0.0 if result == exact else math.inf
    if exact_q is not None:
        return float(abs(Fraction(result) - exact_q))
    return abs(result - exact)


def rel_error(result: float, exact: float, exact_q: Fraction | None = None) -> float:
    err = abs_error(result, exact, exact_q)
    if math.isnan(err) or err == 0.0:
        return err
    if math.isinf(exact) or math.isinf(err):
        return math.inf
    if exact_q is not None:
        return float(abs(Fraction(result) - exact_q) / abs(exact_q)) if exact_q != 0 else math.inf
    return err / abs(exact) if exact != 0.0 else math.inf


def ulp_error(result: float, exact: float, fmt: Format, exact_q: Fraction | None = None) -> float:
    """|result - exact| in units of fmt's spacing at the exact value (with
    exact_q: in the binade of the exact value itself, which its rounding to a
    double can carry up to the next power of two)."""
    err = abs_error(result, exact, exact_q)
    if math.isnan(err) or math.isinf(err) or err == 0.0:
        return err
    if exact_q is not None:
        return float(abs(Fraction(result) - exact_q) / spacing_exact(exact_q, fmt))
    return err / float(fmt.spacing(exact))


def floor_log2(q: Fraction) -> int:
    """floor(log2 |q|) of a non-zero rational, exactly."""
    q = abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > q else e


def spacing_exact(q: Fraction, fmt: Format) -> Fraction:
    """fmt's spacing in the binade of the exact value q (Format.spacing, exactly)."""
    e = fmt.emin if q == 0 else max(floor_log2(q), fmt.emin)
    return Fraction(2) ** (e - fmt.precision + 1)


# ---------------------------------------------------------------------------
# error report: one function every comparison in the project goes through


@dataclass(frozen=True)
class ErrorReport:
    """How far `actual` is from `reference`: a report, not a verdict.

    max_abs_error, mean_abs_error, rel_l2 and the ulp figures cover the elements finite on
    both sides; every other element is a failure and is counted in
    nonfinite_actual / nonfinite_reference (nan_both counts NaN on both sides,
    which is a failure too: two NaNs never agree).
    """

    n: int
    max_abs_error: float
    mean_abs_error: float
    rel_l2: float
    max_ulps: float
    median_ulps: float
    worst_index: tuple | None
    n_outside: int
    frac_outside: float
    nonfinite_actual: int
    nonfinite_reference: int
    nan_both: int
    atol: float
    rtol: float

    @property
    def finite(self) -> bool:
        return self.nonfinite_actual == 0 and self.nonfinite_reference == 0

    @property
    def passed(self) -> bool:
        return self.n_outside == 0

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        d["finite"] = self.finite
        d["passed"] = self.passed
        return d




def error_report(actual, reference, fmt: Format | None, atol: float, rtol: float,
                 reference_lo=None) -> ErrorReport:
    """Compare two arrays of the same shape, elementwise, in float64.

    fmt is the tested format, whose spacing at each reference value is the ulp;
    None measures ulps in float64. An element is outside when either side is
    non-finite or |a - r| > atol + rtol * |r|. reference_lo, when given, is the
    low half of a double-double reference r + reference_lo (finite where r is):
    the differences are then taken from that, not from r alone.
    """
    a = np.asarray(actual, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if a.shape != r.shape:
        raise ValueError(f"shape mismatch: {a.shape} vs {r.shape}")
    n = a.size
    fa, fr = np.isfinite(a), np.isfinite(r)
    both = fa & fr
    nan_both = int(np.count_nonzero(np.isnan(a) & np.isnan(r)))
    if reference_lo is not None:
        return _error_report_dd(a, r, np.asarray(reference_lo, dtype=np.float64), fmt, atol, rtol, fa, fr, nan_both)
    diff = np.abs(np.subtract(a, r, where=both, out=np.zeros_like(a)))
    outside = ~both | (diff > atol + rtol * np.abs(np.where(fr, r, 0.0)))
    n_out = int(np.count_nonzero(outside))
    if np.any(both):
        d = diff[both]
        ab, rb = a[both], r[both]
        rel_l2 = exact_rel_l2(ab, rb)  # over the pairs finite on both sides: a report, not a verdict
        spacing = (fmt.spacing(rb) if fmt is not None else np.spacing(np.abs(rb)))
        ulps = d / spacing
        flat_worst = int(np.flatnonzero(both)[int(np.argmax(d))])
        max_abs_error, mean_abs_error = float(d.max()), exact_mean_abs_difference(ab, rb)
        max_ulps, median_ulps = float(ulps.max()), float(np.median(ulps))
    else:
        rel_l2 = max_abs_error = mean_abs_error = max_ulps = median_ulps = 0.0 if n == 0 else math.nan
        flat_worst = None
    if n_out and not np.all(both):  # a non-finite element is the worst there is
        flat_worst = int(np.flatnonzero(~both)[0])
    worst = tuple(int(i) for i in np.unravel_index(flat_worst, a.shape)) if flat_worst is not None else None
    return ErrorReport(
        n=n, max_abs_error=max_abs_error, mean_abs_error=mean_abs_error, rel_l2=rel_l2, max_ulps=max_ulps, median_ulps=median_ulps,
        worst_index=worst, n_outside=n_out, frac_outside=n_out / n if n else 0.0,
        nonfinite_actual=int(n - np.count_nonzero(fa)), nonfinite_reference=int(n - np.count_nonzero(fr)),
        nan_both=nan_both, atol=atol, rtol=rtol,
    )


# ---------------------------------------------------------------------------
# norms and dot products, exactly: rel-L2 and cosine to the last bit, with no
# overflow or underflow of the squares (float64 norms of 1e200 are inf, of
# 1e-200 are 0)


EXACT_CHUNK = 1 << 14  # elements at a time: the exact sums' temporaries stay a few MiB


def _exponent(*arrays: np.ndarray) -> int:
    """k with the arrays' largest magnitude times 2^-k in [0.5, 1) (0 for all zeros).
    Scaling by 2^-k is exact for every element but those 2^-1022 below the
    largest (negligible far past 2^-106 in any sum of squares or products)."""
    amax = max((float(np.max(np.abs(a))) if a.size else 0.0) for a in arrays)
    return math.frexp(amax)[1] if amax > 0 else 0


class ExactSum:
    """Exact sums of many arrays, added a part at a time: the library's exact
    terms of each, kept, and summed exactly (in rationals) at the end. A part
    whose sum nears the double range is added value by value; one holding a
    NaN or an infinity has no exact sum (add returns False, total None)."""

    def __init__(self):
        self.terms: list[float] = []
        self.extra = Fraction(0)
        self.finite = True

    def add(self, part: np.ndarray) -> bool:
        from precisionlab import native

        terms, special = native.exact_sum_terms(part)
        if special == 0:
            self.terms += terms
        elif special == 1:  # NaN or an infinity
            self.finite = False
        else:  # a sum near the double range: stay exact all the same
            self.extra += sum(map(Fraction, part.tolist()), Fraction(0))
        return self.finite

    def total(self) -> Fraction | None:
        if not self.finite:
            return None
        acc = ExactSum()
        acc.add(np.array(self.terms, dtype=np.float64))  # the terms' own exact terms: far fewer
        return sum(map(Fraction, acc.terms), Fraction(0)) + acc.extra + self.extra


def _exact_total(parts: list[np.ndarray]) -> Fraction:
    """The exact sum of every element of every part, as a rational."""
    acc = ExactSum()
    for part in parts:
        for i in range(0, part.size, EXACT_CHUNK):
            acc.add(part.ravel()[i:i + EXACT_CHUNK])
    return acc.total()


def exact_dot(x: np.ndarray, y: np.ndarray) -> Fraction:
    """sum(x * y) of finite float64 arrays, exactly."""
    x, y = x.ravel(), y.ravel()
    kx, ky = _exponent(x), _exponent(y)
    acc = ExactSum()
    for i in range(0, x.size, EXACT_CHUNK):
        hi, lo = ddexp.two_prod(np.ldexp(x[i:i + EXACT_CHUNK], -kx), np.ldexp(y[i:i + EXACT_CHUNK], -ky))
        acc.add(hi)
        acc.add(lo)
    return acc.total() * Fraction(2) ** (kx + ky)


def exact_matmul_dd(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a @ b of finite float64 matrices whose products are exact in float64
    (values of 26 significant bits or fewer: fp32 and narrower), each entry's
    exact sum as hi + lo: hi its correctly rounded double, lo the rest rounded
    (float64 BLAS rounds every partial sum: its last digits are not the
    exact value's)."""
    m, n = a.shape[0], b.shape[1]
    hi, lo = np.empty((m, n)), np.empty((m, n))
    for i in range(m):
        terms = np.ascontiguousarray((a[i][:, None] * b).T)  # n x K products, each exact
        for j in range(n):
            q = _exact_total([terms[j]])
            hi[i, j] = q_to_float(q)
            lo[i, j] = q_to_float(q - Fraction(hi[i, j])) if math.isfinite(hi[i, j]) else 0.0
    return hi, lo


def _sum_squares_dd(h: np.ndarray, l: np.ndarray, k: int, acc: "ExactSum") -> None:
    """Adds (h + l)^2 * 4^-k, elementwise, to acc exactly: h^2 + 2 h l + l^2 after scaling by 2^-k."""
    sh, sl = np.ldexp(h, -k), np.ldexp(l, -k)
    for x, y, w in ((sh, sh, 1.0), (sh, sl, 2.0), (sl, sl, 1.0)):
        hi, lo = ddexp.two_prod(x, y)
        acc.add(hi * w)
        acc.add(lo * w)


def exact_sum_squares_of_difference(a: np.ndarray, b: np.ndarray) -> Fraction:
    """sum((a - b)^2) of finite float64 arrays, exactly: each difference as
    TwoSum's dh + dl, and (dh + dl)^2 = dh^2 + 2 dh dl + dl^2, each product exact."""
    a, b = a.ravel(), b.ravel()
    k = _exponent(a, b)
    acc = ExactSum()
    for i in range(0, a.size, EXACT_CHUNK):
        dh, dl = ddexp.two_sum(np.ldexp(a[i:i + EXACT_CHUNK], -k), -np.ldexp(b[i:i + EXACT_CHUNK], -k))
        _sum_squares_dd(dh, dl, 0, acc)
    return acc.total() * Fraction(4) ** k


def sqrt_to_float(q: Fraction) -> float:
    """The correctly rounded double of sqrt(q), q >= 0 rational (inf past the range)."""
    if q == 0:
        return 0.0
    n, d = q.numerator, q.denominator
    e = n.bit_length() - d.bit_length()
    shift = 2 * (64 - e // 2)  # even: sqrt(q * 2^shift) has about 64 bits
    num, den = (n << shift, d) if shift >= 0 else (n, d << -shift)
    scaled, rem = divmod(num, den)
    r = math.isqrt(scaled)
    exact = rem == 0 and r * r == scaled
    # r has >= 63 bits: r + 1/2 stands in for an inexact root (never a midpoint of 53 bits)
    value = Fraction(2 * r + (0 if exact else 1), 2) / Fraction(2) ** (shift // 2)
    try:
        return float(value)
    except OverflowError:
        return math.inf


def sqrt_ratio(num: Fraction, den: Fraction) -> float:
    """sqrt(num / den) correctly rounded, num, den >= 0. den = 0 (a norm
    against an all-zero reference): 0 when num is 0, else inf, never a huge
    finite number."""
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return sqrt_to_float(num / den)


def exact_rel_l2(x: np.ndarray, ref: np.ndarray) -> float:
    """||x - ref|| / ||ref|| of finite float64 arrays: exact sums (a float64
    norm overflows past 1e154 and underflows below 1e-154), the root rounded
    once. The comparison rules (non-finite values) are numerics.compare.rel_l2's."""
    return sqrt_ratio(exact_sum_squares_of_difference(x, ref), exact_dot(ref, ref))


def exact_mean_difference(a: np.ndarray, b: np.ndarray) -> float:
    """mean(a - b) of finite float64 arrays, of the exact differences, rounded once (NaN when empty)."""
    if a.size == 0:
        return math.nan
    return q_to_float(_exact_total([a, -b]) / a.size)


def exact_mean_square_difference(a: np.ndarray, b: np.ndarray) -> Fraction:
    """mean((a - b)^2) of finite float64 arrays, exactly (the exact differences; no overflow at any size)."""
    return exact_sum_squares_of_difference(a, b) / a.size


def exact_mean_abs_difference(a: np.ndarray, b: np.ndarray) -> float:
    """mean(|a - b|) of finite float64 arrays, exactly, rounded once: each
    difference as TwoSum's dh + dl (|dl| <= half an ulp of dh, so
    |a - b| = |dh| + sign(dh) dl), summed exactly."""
    if a.size == 0:
        return math.nan
    a, b = a.ravel(), b.ravel()
    k = _exponent(a, b)
    acc = ExactSum()
    for i in range(0, a.size, EXACT_CHUNK):
        dh, dl = ddexp.two_sum(np.ldexp(a[i:i + EXACT_CHUNK], -k), -np.ldexp(b[i:i + EXACT_CHUNK], -k))
        acc.add(np.abs(dh))
        acc.add(np.sign(dh) * dl)
    return float(acc.total() * Fraction(2) ** k / a.size)


def _error_report_dd(a, r, r_lo, fmt, atol, rtol, fa, fr, nan_both) -> ErrorReport:
    """error_report against the double-double reference r + r_lo: each
    difference a - r - r_lo carried as a double-double (dh + dl), the sums
    exact, each figure rounded once. A chunk at a time (EXACT_CHUNK): the
    temporaries stay small; only the ulps (for their median) are full-size."""
    n = a.size
    both = fa & fr
    a1, r1, lo1, both1 = a.ravel(), r.ravel(), r_lo.ravel(), both.ravel()
    n_both = int(np.count_nonzero(both1))
    n_out = n - n_both  # a non-finite element is outside
    if n_both == 0:
        v = 0.0 if n == 0 else math.nan
        flat_worst = int(np.flatnonzero(~both1)[0]) if n_out else None
        worst = tuple(int(i) for i in np.unravel_index(flat_worst, a.shape)) if flat_worst is not None else None
        return ErrorReport(n=n, max_abs_error=v, mean_abs_error=v, rel_l2=v, max_ulps=v, median_ulps=v,
                           worst_index=worst, n_outside=n_out, frac_outside=n_out / n if n else 0.0,
                           nonfinite_actual=int(n - np.count_nonzero(fa)),
                           nonfinite_reference=int(n - np.count_nonzero(fr)), nan_both=nan_both, atol=atol, rtol=rtol)

    def chunks():
        for i in range(0, n, EXACT_CHUNK):
            m = both1[i:i + EXACT_CHUNK]
            ac, rc, lc = a1[i:i + EXACT_CHUNK][m], r1[i:i + EXACT_CHUNK][m], lo1[i:i + EXACT_CHUNK][m]
            sh, sl = ddexp.two_sum(ac, -rc)  # a - r exactly; then minus lo: the two small parts' sum carried
            dh, dl = ddexp.two_sum(sh, sl - lc)
            yield i, m, ac, rc, lc, dh, dl

    kd = kr = 0
    best, flat_worst = -1.0, None
    for i, m, _ac, rc, _lc, dh, _dl in chunks():  # first pass: the largest error and the scales
        d = np.abs(dh)
        kd = max(kd, _exponent(dh))
        kr = max(kr, _exponent(rc))
        if d.size and float(d.max()) > best:
            best = float(d.max())
            flat_worst = i + int(np.flatnonzero(m)[int(np.argmax(d))])
    num, den, total = ExactSum(), ExactSum(), ExactSum()
    ulps = np.empty(n_both)
    at = 0
    for _i, _m, _ac, rc, lc, dh, dl in chunks():
        d = np.abs(dh)
        n_out += int(np.count_nonzero(d > atol + rtol * np.abs(rc)))
        _sum_squares_dd(dh, dl, kd, num)
        _sum_squares_dd(rc, lc, kr, den)
        total.add(np.ldexp(d, -kd))
        total.add(np.ldexp(np.sign(dh) * dl, -kd))
        spacing = fmt.spacing(rc) if fmt is not None else np.spacing(np.abs(rc))
        if fmt is not None:  # r + lo just below a power of two r lies in the binade below: half the spacing
            below = (np.frexp(np.abs(rc))[0] == 0.5) & (lc * np.sign(rc) < 0) & (np.abs(rc) > fmt.smallest_normal)
            spacing = np.where(below, spacing / 2, spacing)
        ulps[at:at + d.size] = d / spacing
        at += d.size
    num_q, den_q = num.total() * Fraction(4) ** kd, den.total() * Fraction(4) ** kr
    rel_l2 = sqrt_ratio(num_q, den_q)
    mean_abs_error = float(total.total() * Fraction(2) ** kd / n_both)
    if n_out and n_both < n:  # a non-finite element is the worst there is
        flat_worst = int(np.flatnonzero(~both1)[0])
    worst = tuple(int(i) for i in np.unravel_index(flat_worst, a.shape)) if flat_worst is not None else None
    return ErrorReport(
        n=n, max_abs_error=best, mean_abs_error=mean_abs_error, rel_l2=rel_l2, max_ulps=float(ulps.max()),
        median_ulps=float(np.median(ulps)), worst_index=worst, n_outside=n_out, frac_outside=n_out / n if n else 0.0,
        nonfinite_actual=int(n - np.count_nonzero(fa)), nonfinite_reference=int(n - np.count_nonzero(fr)),
        nan_both=nan_both, atol=atol, rtol=rtol,
    )
