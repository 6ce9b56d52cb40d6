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


def _softmax_rows(values: str, *extra: str) -> list[dict]:
    doc = cli("softmax", f"--values={values}", "--variants", "stable,online", "--device", "cpu", *extra, "--json")
    assert doc.code == 0, doc.err
    return doc.json()["rows"]


def test_softmax_row_sum_error_is_the_exact_sums_distance_from_one():
    # fp32 softmax of [20, -20] sums to 1 - 4.2e-18 exactly: the sum's double is
    # 1.0, and row_sum_error once printed 0.0.
    for row in _softmax_rows("20,-20"):
        total = sum((Fraction(p) for p in row["output"]), Fraction(0))
        assert total != 1
        assert row["row_sum_error"] == float(abs(total - 1))


def test_softmax_lse_error_against_an_accurate_log_sum_exp():
    # lse of [-104, 0] is log(1 + e^-104) = 6.8e-46; the kernel's fp32 lse is 0,
    # and a float64 m + log(s) reference is 0 too, so the error printed 0.0.
    import mpmath as mp

    mp.mp.prec = 200
    true_lse = mp.log(1 + mp.exp(-104))
    for row in _softmax_rows("-104,0"):
        assert row["lse"] == 0.0
        # the reference is float64 (exp and log1p each within an ulp): 1e-12 relative
        assert row["lse_max_abs_error"] == pytest.approx(float(abs(mp.mpf(row["lse"]) - true_lse)), rel=1e-12, abs=0)


def test_softmax_masked_row_under_zero_policy_has_lse_error_zero():
    # --masked zero: an all -inf row has log-sum-exp -inf, and the kernel's -inf
    # is exactly that: error 0, not NaN (-inf minus -inf).
    for row in _softmax_rows("-inf,-inf,-inf", "--masked", "zero"):
        assert row["lse"] == "-inf"
        assert row["lse_max_abs_error"] == 0.0
