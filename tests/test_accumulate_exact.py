"""accumulate's exact references through the library's superaccumulator
(pl_exact_sum_terms): the terms it hands back have exactly the exact sum of
the input (checked in rationals), and math.fsum of them is math.fsum of the
input (metrics.exact_sum, the oracle), bit for bit, on hostile inputs: huge
cancellation, subnormals, the whole exponent range, partial sums past the
double range, signed zeros, inf and NaN."""

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab import native
from precisionlab.numerics import metrics
from precisionlab.experiments import accumulate_cpu as C

MAX = 1.7976931348623157e308
TINY = 5e-324
SPECIAL = st.sampled_from([0.0, -0.0, 1.0, -1.0, TINY, -TINY, 2.2250738585072014e-308, -2.225073858507201e-308,
                           MAX, -MAX, 2.0**1023, -(2.0**1023), 1e308, -1e308, 2.0**-1022 - TINY, 1 + 2.0**-52])
FINITE = st.one_of(SPECIAL, st.floats(allow_nan=False, allow_infinity=False))


def bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or bits(a) == bits(b)


def exact(values) -> Fraction:
    return sum((Fraction(v) for v in values), Fraction(0))


def check(x: np.ndarray, rational: bool = True) -> None:
    for absolute in (False, True):
        terms, special = native.exact_sum_terms(x, absolute)
        v = np.abs(x) if absolute else x
        assert (special == 1) == (not np.isfinite(x).all())
        if special == 0:
            assert len(terms) <= native.EXACT_SUM_TERMS
            assert not rational or exact(terms) == exact(v.tolist())
        elif special == 2 and rational:  # only where the sum itself is within a few binades of the double range
            assert abs(exact(v.tolist())) >= 2**990
    e = metrics.exact_sum(x)
    got = C.exact_sum(x, constant=False)
    assert same(got, e), (got, e)
    want_abs = metrics.exact_sum(np.abs(x))
    assert same(C.exact_abs_sum(x, e), want_abs)


@settings(max_examples=300, deadline=None)
@given(st.lists(FINITE, min_size=0, max_size=80), st.integers(1, 20), st.randoms(use_true_random=False))
def test_terms_are_the_exact_sum_and_fsum_of_them_is_fsum(values, reps, rnd):
    # tiled and shuffled: several 512-value blocks, so the carries between digits run
    values = values * reps
    rnd.shuffle(values)
    check(np.array(values, dtype=np.float64))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(FINITE, st.sampled_from([math.inf, -math.inf, math.nan])), min_size=1, max_size=60))
def test_non_finite_inputs_follow_exact_sums_rules(values):
    check(np.array(values, dtype=np.float64))


@pytest.mark.parametrize("name, x", [
    ("cancellation", np.array([1e308, 1.0, -1e308, 2.0**-1074] * 1000)),
    ("partial sums past the double range", np.array([1e308] * 700 + [-1e308] * 699)),
    ("beyond the range", np.array([MAX] * 3 + [-1.0])),
    ("just inside", np.array([MAX, 2.0**970, -(2.0**970), -TINY])),
    ("subnormals only", np.full(100_003, TINY) * np.tile([1.0, -1.0, 3.0], 33_335)[:100_003]),
    ("every digit carries", np.tile([2.0 - 2.0**-52, -(2.0**-1022) * (2 - 2.0**-52), 2.0**1023 * (2 - 2.0**-52)],
                                    40_000)),
    ("one sign, many carries", np.full(300_007, -(2.0**60) * (2 - 2.0**-52))),
    ("negative zeros", np.full(1_025, -0.0)),
    ("zeros of both signs", np.array([-0.0] * 600 + [0.0])),
    ("exact zero from cancellation", np.concatenate([np.arange(1, 2_001) * 0.1, -np.arange(1, 2_001) * 0.1])),
])
def test_hostile_inputs(name, x):
    check(x)


def test_long_random_inputs_over_the_exponent_range():
    rng = np.random.default_rng(19)
    for n in (3_000, 200_000):  # rationals over the whole range are slow: the short one only
        x = rng.standard_normal(n) * np.exp2(rng.integers(-1100, 1000, n).astype(np.float64))
        check(x, rational=n < 10_000)
        check(np.concatenate([x, -x[::-1], [TINY]]), rational=n < 10_000)


def test_the_reference_of_a_long_normal_input_is_fsum_of_it():
    x = np.random.default_rng(3).standard_normal(2_000_003).astype(np.float32).astype(np.float64)
    assert same(C.exact_sum(x), math.fsum(x.tolist()))
    assert same(C.exact_abs_sum(x, C.exact_sum(x)), math.fsum(np.abs(x).tolist()))
