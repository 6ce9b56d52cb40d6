"""Numbers the commands print, against independent exact references computed
here in rationals (fractions) and mpmath, never through the project's own
reference code. Each test names the case that once printed a wrong number."""

import math
from fractions import Fraction

import pytest

from helpers import cli


def rnd(q: Fraction, p: int, emin: int) -> Fraction:
    """q rounded to nearest even with p significand bits and smallest normal
    exponent emin (no overflow handling: the cases here stay in range)."""
    if q == 0:
        return q
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    quantum = Fraction(2) ** (max(e, emin) - p + 1)
    r = a / quantum
    fl = r.numerator // r.denominator
    rem = r - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2):
        fl += 1
    return (fl * quantum) if q > 0 else -(fl * quantum)


def binade_spacing(q: Fraction, p: int, emin: int) -> Fraction:
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    return Fraction(2) ** (max(e, emin) - p + 1)


FMT = {"fp64": (53, -1022), "fp32": (24, -126), "fp16": (11, -14), "bf16": (8, -126)}


@pytest.mark.parametrize("values", ["1,1e-30", "6.045301223363671e-09,-257,0.0", "1,-3e-17,2e-17"])
def test_accumulate_errors_are_against_the_exact_sum_not_its_double(values):
    # 1 + 1e-30 in fp64: the result 1.0 is the exact sum's double, but 1e-30
    # away from the exact sum; abs_error once printed 0.0 (and rel_error, ulps 0).
    doc = cli("accumulate", "--dtype", "fp64", "--values", values, "--variants", "sequential,pairwise",
              "--accumulators", "fp64,fp32,bf16", "--device", "cpu", "--json").json()
    xs = [Fraction(float(v)) for v in values.split(",")]
    exact = sum(xs, Fraction(0))
    checked = 0
    for row in doc["rows"]:
        p, emin = FMT[row["accumulator"]]
        s = Fraction(0)
        for x in xs:  # sequential: each addition rounded once; pairwise of <= 3 values: ((x0 + x1) + x2)
            s = rnd(s + x, p, emin)
        assert row["result"] == float(s)
        err = abs(s - exact)
        assert row["abs_error"] == float(err)
        assert row["rel_error"] == float(err / abs(exact))
        assert row["ulps"] == float(err / binade_spacing(exact, p, emin))
        checked += 1
    assert checked == 6
