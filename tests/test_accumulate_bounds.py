"""Higham's a-priori bound, checked independently: every row the experiment
calls rigorous must hold |result - exact| <= bound, with the exact sum and the
error computed in rational arithmetic (fractions), over thousands of seeded
random inputs that reach the subnormals and the overflow threshold of every
storage and accumulator format. Overflow is labelled as such, and the
predicted stall is where the sum really stops."""

import math
from fractions import Fraction

import numpy as np
import pytest

from precisionlab.catalog import formats
from precisionlab.experiments import accumulate as acc

STORAGES = ["bf16", "fp16", "fp32", "fp64"]
ACCUMULATORS = "fp8_e4m3,fp8_e5m2,bf16,fp16,fp32,fp64"
CPU_METHODS = ",".join(acc.CPU_METHODS)


def _values(rng, n: int) -> list[float]:
    """n values from one of several regimes: tiny (around the smallest
    subnormals of the narrow formats), huge (near their largest values),
    mixed magnitudes across the whole range, constant, or cancelling."""
    kind = rng.integers(6)
    sign = rng.choice([-1.0, 1.0], n) if rng.random() < 0.5 else np.ones(n)
    if kind == 0:  # tiny: 2^-30 .. 2^-12 covers fp16/fp8 subnormals
        v = np.ldexp(rng.random(n) + 0.5, rng.integers(-30, -12, n))
    elif kind == 1:  # huge: near 448 (e4m3), 57344 (e5m2), 65504 (fp16)
        v = rng.choice([300.0, 448.0, 3e4, 57344.0, 6e4, 65504.0], n) * (0.5 + rng.random(n))
    elif kind == 2:  # anywhere from 2^-140 to 2^20: bf16/fp32 subnormals to fp16 overflow
        v = np.ldexp(rng.random(n) + 0.5, rng.integers(-140, 20, n))
    elif kind == 3:  # a constant
        v = np.full(n, np.ldexp(rng.random() + 0.5, int(rng.integers(-30, 8))))
    elif kind == 4:  # cancellation
        v = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 4)
        v = np.concatenate([v, -v[: n // 2]])[:n]
    else:  # very large, near the fp32 and fp64 tops
        v = np.ldexp(rng.random(n) + 0.5, rng.integers(100, 128, n)) if rng.random() < 0.5 else \
            np.ldexp(rng.random(n) + 0.5, rng.integers(1000, 1024, n))
    return (sign * v).tolist()


def _exact(stored: list[float]) -> Fraction:
    total = Fraction(0)
    for x in stored:
        total += Fraction(x)
    return total


@pytest.mark.parametrize("storage", STORAGES)
def test_rigorous_bound_holds_on_random_inputs(storage):
    rng = np.random.default_rng(20261130 + STORAGES.index(storage))
    fmt = formats.get(storage)
    checked = overflowed = 0
    for case in range(400):
        n = int(rng.choice([1, 2, 3, 7, 16, 50, 129]))
        vals = _values(rng, n)
        res = acc.run(acc.AccumulateConfig(dtype=storage, values=",".join(map(repr, vals)), device="cpu",
                                           methods=CPU_METHODS, accumulators=ACCUMULATORS, seed=case))
        stored = fmt.round(np.array(vals)).tolist()
        finite = all(math.isfinite(x) for x in stored)
        exact = _exact(stored) if finite else None
        for r in res.rows:
            if r["bound_kind"] == "overflow":
                # only a finite input whose sum left the accumulator's range
                assert finite and not math.isfinite(r["result"]), r
                overflowed += 1
                continue
            if r["bound_kind"] != "rigorous":
                continue
            assert finite and math.isfinite(r["result"]) and math.isfinite(r["bound"]), r
            err = abs(Fraction(r["result"]) - exact)
            assert err <= Fraction(r["bound"]), (storage, vals, r)
            assert r["within_bound"] is True
            checked += 1
    assert checked > 5000 and overflowed > 0


def test_underflow_case_from_the_issue_is_within_bound():
    # 3e-8 is below fp16's smallest normal: every rounding errs by up to half
    # a subnormal spacing, far more than u times the value.
    res = acc.run(acc.AccumulateConfig(dtype="fp32", value=3e-8, n=50, accumulators="fp16",
                                       methods="sequential,pairwise", device="cpu"))
    for r in res.rows:
        assert r["bound_kind"] == "rigorous" and r["within_bound"], r
        assert r["bound"] >= 50 * 2.0**-25  # the underflow term: n roundings of 2^(emin - p)


def test_overflow_is_shown_as_overflow():
    res = acc.run(acc.AccumulateConfig(dtype="fp16", values="65504,65504", accumulators="fp16", device="cpu"))
    assert res.rows and all(r["bound_kind"] == "overflow" and r["within_bound"] is None for r in res.rows)
    assert all(r["abs_error"] == math.inf or math.isnan(r["result"]) for r in res.rows)
    assert any("Overflow in fp16" in t for t in res.takeaways)


@pytest.mark.parametrize("values", ["1e300,1e300", "1e308,1e308"])
def test_fp64_overflow_rows_instead_of_a_crash(values):
    res = acc.run(acc.AccumulateConfig(dtype="fp64", values=values, device="cpu"))
    fp64 = [r for r in res.rows if r["accumulator"] == "fp64"]
    if values == "1e308,1e308":  # 2e308 is past the double range: every accumulator overflows
        assert all(r["bound_kind"] == "overflow" for r in res.rows)
        assert all(r["abs_error"] == math.inf or math.isnan(r["result"]) for r in res.rows)
    else:
        assert all(r["result"] == 2e300 and r["bound_kind"] in ("rigorous", "first-order") for r in fp64)
        assert all(r["bound_kind"] == "overflow" for r in res.rows if r["accumulator"] != "fp64")


def test_first_order_estimate_past_nu_one_is_no_bound():
    res = acc.run(acc.AccumulateConfig(dtype="bf16", n=300, methods="kahan,neumaier", accumulators="bf16",
                                       device="cpu"))
    assert all(r["bound_kind"] == "vacuous" and r["bound"] == math.inf for r in res.rows)


@pytest.mark.parametrize("value, accumulator", [(1e-8, "fp16"), (2.0**-25, "fp16"), (-2.0**-25, "fp16"),
                                                (2.0**-134, "bf16"), (2.0**-10, "fp8_e4m3")])
def test_addend_below_half_the_smallest_subnormal_never_leaves_zero(value, accumulator):
    fmt = formats.get(accumulator)
    assert abs(value) <= float(fmt.finfo.smallest_subnormal) / 2
    res = acc.run(acc.AccumulateConfig(dtype="fp32", value=value, n=50, accumulators=accumulator,
                                       methods="sequential", device="cpu"))
    (r,) = res.rows
    assert r["result"] == 0.0 and r["stall_value"] == 0.0 and r["stall_step"] == 1
    assert r["predicted_stall"] == 0.0


def test_addend_just_above_half_the_smallest_subnormal_moves():
    fmt = formats.get("fp16")
    v = float(np.nextafter(np.float32(float(fmt.finfo.smallest_subnormal) / 2), np.float32(1)))
    pred = acc._predicted_stall(v, fmt)
    assert pred > 0
    res = acc.run(acc.AccumulateConfig(dtype="fp32", value=v, n=int(2 * pred / v) + 10, accumulators="fp16",
                                       methods="sequential", device="cpu"))
    assert res.rows[0]["stall_value"] == pred


@pytest.mark.parametrize("v", [1e300, 1e308, 1.7976931348623157e308])
def test_predicted_stall_past_the_range_is_none(v):
    assert acc._predicted_stall(v, formats.get("fp64")) is None


def test_exact_sum_survives_an_intermediate_overflow():
    from precisionlab.numerics import metrics

    # fsum raises on the intermediate 2e308 though the sum is 1e308
    assert metrics.exact_sum(np.array([1e308, 1e308, -1e308])) == 1e308
    assert metrics.exact_sum(np.array([1e308, 1e308, -1e308, 5e-324])) == 1e308
    assert metrics.exact_sum(np.array([1e308, 1e308, -1e308, -1e308, 5e-324])) == 5e-324
    assert metrics.exact_sum(np.array([1e308, 1e308])) == math.inf
    assert metrics.exact_sum(np.array([-1e308, -1e308, 1.0])) == -math.inf
