"""The accumulate experiment: rows, bounds, stagnation prediction, takeaways."""

import math

import pytest

from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.experiments import accumulate as acc


def run(**kw):
    kw.setdefault("device", "cpu")
    return acc.run(acc.AccumulateConfig(**kw))


def row(res, accumulator, method, device="cpu"):
    (r,) = [r for r in res.rows if r["accumulator"] == accumulator and r["variant"] == method and r["device"] == device]
    return r


def test_the_book_table():
    res = run(dtype="bf16", n=10_000)
    assert row(res, "bf16", "sequential")["result"] == 32.0
    assert row(res, "fp16", "sequential")["result"] == 256.0
    assert row(res, "fp32", "sequential")["result"] == 1000.9765625
    assert res.exact_stored == 1000.9765625
    assert res.exact_intended == math.fsum([0.1] * 10_000)
    assert run(dtype="fp32", n=10_000, accumulators="fp32")
    assert row(run(dtype="fp32", n=10_000, accumulators="fp32"), "fp32", "sequential")["result"] == 999.9028930664062


def test_stall_measured_and_predicted():
    res = run(dtype="bf16", n=10_000)
    r = row(res, "bf16", "sequential")
    assert r["stall_value"] == 32.0 and r["predicted_stall"] == 32.0
    assert res.rows[0]["stall_step"] > 0
    ones = run(dtype="fp32", value=1.0, n=5000, accumulators="bf16,fp16", methods="sequential")
    assert row(ones, "bf16", "sequential")["stall_value"] == 256.0 == row(ones, "bf16", "sequential")["predicted_stall"]
    assert row(ones, "fp16", "sequential")["stall_value"] == 2048.0 == row(ones, "fp16", "sequential")["predicted_stall"]


@pytest.mark.parametrize("value", [0.1, 0.3, 1.0, 3.0, 7.5, -0.1, 1e-3])
@pytest.mark.parametrize("accumulator", ["bf16", "fp16"])
def test_predicted_stall_is_where_the_sum_stops(value, accumulator):
    fmt = formats.get(accumulator)
    v = float(formats.get("fp32").round([value])[0])
    pred = acc._predicted_stall(v, fmt)
    n = int(abs(pred / v)) * 2 + 10
    if n > 3_000_000:
        pytest.skip("stall too far away")
    r = row(run(dtype="fp32", value=value, n=n, accumulators=accumulator, methods="sequential"),
            accumulator, "sequential")
    assert r["stall_value"] is not None
    assert 0 <= (r["stall_value"] - pred) * math.copysign(1, v) < 2 * abs(v)


def test_defaults_apply_only_what_applies():
    const = run(dtype="bf16", n=100)
    methods = {(r["accumulator"], r["variant"]) for r in const.rows}
    assert ("bf16", "stochastic") in methods and ("fp32", "stochastic") not in methods
    assert not any(m in acc.ORDERS for _, m in methods)  # orders do nothing to a constant input
    rand = run(dtype="bf16", n=100, dist="normal")
    assert {"reverse", "sorted", "sorted_desc"} <= {r["variant"] for r in rand.rows}


@pytest.mark.parametrize("storage", ["fp32", "bf16", "fp16", "fp8_e4m3"])
@pytest.mark.parametrize("dist", ["uniform", "normal", "lognormal"])
def test_rigorous_bounds_hold(storage, dist):
    res = run(dtype=storage, n=2000, dist=dist, seed=3)
    rigorous = [r for r in res.rows if r["bound_kind"] == "rigorous"]
    assert rigorous
    for r in rigorous:
        assert r["abs_error"] <= r["bound"], r


def test_bound_is_vacuous_where_nu_reaches_one():
    r = row(run(dtype="bf16", n=10_000), "bf16", "sequential")
    assert r["bound_kind"] == "vacuous" and r["bound"] == math.inf
    assert acc.gamma(10, 0.5) == math.inf and acc.gamma(1, 2.0**-24) == pytest.approx(2.0**-24)


def test_order_dependence_is_shown():
    res = run(dtype="fp32", values="1e8,1,-1e8", accumulators="fp32")
    got = {r["variant"]: r["result"] for r in res.rows}
    assert got["sequential"] == 0.0 and got["sorted_desc"] == 1.0 and got["neumaier"] == 1.0
    assert got["reverse"] == 0.0 and got["pairwise"] == 0.0
    assert any(t.startswith("Order matters in fp32") for t in res.takeaways)


def test_takeaways_name_the_dominant_effect():
    res = run(dtype="bf16", n=10_000)
    assert "accumulation dominates" in res.takeaways[0]
    assert any("stalled for good at 32.0" in t and "spacing there is 0.25" in t for t in res.takeaways)


def test_nan_input_is_reported():
    res = run(values="1,nan,2")
    assert all(math.isnan(r["result"]) for r in res.rows)
    assert math.isnan(res.exact_stored)
    assert all(r["within_bound"] is False for r in res.rows)


def test_input_choices_are_exclusive():
    with pytest.raises(UsageError):
        run(values="1,2", dist="normal")


def test_gpu_rows_are_marked_unavailable_under_auto():
    from precisionlab import native

    if native.gpu_status().count:
        pytest.skip("a GPU is present")
    res = run(dtype="bf16", n=100, device="auto")
    gpu = [r for r in res.rows if r["device"] == "cuda"]
    assert gpu and all(not r["available"] and r["note"] for r in gpu)
    assert {r["variant"] for r in gpu} == {"tree", "tree_kahan", "atomic"}


def test_a_value_stored_as_inf_moves_the_sum_by_inf_and_absorbs_nothing():
    """fp16 stores 70000 as inf: the representation error is +inf (the intended
    sum is 70001), not NaN, and a sum at inf is not a rounding stall (no
    spacing there explains it)."""
    res = acc.run(acc.AccumulateConfig(values="70000,1", dtype="fp16", accumulators="fp32", methods="sequential",
                                       device="cpu"))
    assert res.exact_intended == 70001.0 and res.representation_error == math.inf
    assert all(r["stall_step"] is None for r in res.rows)
    assert not any("absorbed" in t or "spacing there" in t for t in res.takeaways), res.takeaways
    res = acc.run(acc.AccumulateConfig(values="0.1,0.2,0.3", dtype="bf16", accumulators="fp64", methods="sequential",
                                       device="cpu"))
    from fractions import Fraction

    import ml_dtypes
    import numpy as np

    stored = sum(Fraction(float(np.float64(v).astype(ml_dtypes.bfloat16))) for v in (0.1, 0.2, 0.3))
    assert res.representation_error == float(stored - sum(map(Fraction, (0.1, 0.2, 0.3))))  # rounded once
