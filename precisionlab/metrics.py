"""Exact references and error measures.

References come from math.fsum (the correctly rounded sum of the doubles it is
given) and float64, never from Python's sum(), whose algorithm changed in 3.12.
NaN never agrees with anything, NaN included.
"""

from __future__ import annotations

import math

import numpy as np

from precisionlab.formats import Format


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
        return math.fsum(v.tolist())
    except OverflowError:
        return math.copysign(math.inf, math.fsum((v * 2.0**-64).tolist()))


def abs_error(result: float, exact: float) -> float:
    if math.isnan(result) or math.isnan(exact):
        return math.nan
    if math.isinf(result) or math.isinf(exact):
        return 0.0 if result == exact else math.inf
    return abs(result - exact)


def rel_error(result: float, exact: float) -> float:
    err = abs_error(result, exact)
    if math.isnan(err) or err == 0.0:
        return err
    if math.isinf(exact):
        return math.inf
    return err / abs(exact) if exact != 0.0 else math.inf


def ulp_error(result: float, exact: float, fmt: Format) -> float:
    """|result - exact| in units of fmt's spacing at the exact value."""
    err = abs_error(result, exact)
    if math.isnan(err) or math.isinf(err) or err == 0.0:
        return err
    return err / float(fmt.spacing(exact))
