"""fp4 e2m1 and fp6 e2m3/e3m2 as storage formats: the dtype registry's
records and rounding, `accumulate --dtype fp4_e2m1` and `compare op --dtype
fp6_e2m3`, run as a user would."""

import math

import ml_dtypes
import numpy as np
import pytest
from helpers import cli

from precisionlab.catalog import formats

ML = {"fp4_e2m1": ml_dtypes.float4_e2m1fn, "fp6_e2m3": ml_dtypes.float6_e2m3fn, "fp6_e3m2": ml_dtypes.float6_e3m2fn}


@pytest.mark.parametrize("name", ML)
def test_registry_describes_them_by_bits(name):
    f = formats.get(name)
    fi = ml_dtypes.finfo(ML[name])
    assert f.storage_only and f.code is None
    assert f.bits == fi.bits < 8  # bits, not the byte numpy keeps them in
    assert f.max == float(fi.max) and f.precision == fi.nmant + 1 and f.emin == fi.minexp


@pytest.mark.parametrize("name", ML)
def test_round_is_nearest_even_saturating_and_keeps_nan(name):
    f = formats.get(name)
    codes = np.arange(2 ** f.bits, dtype=np.uint8)
    values = np.unique(codes.view(ML[name]).astype(np.float64))
    assert np.array_equal(f.round(values), values)  # every value is a fixed point
    mids = (values[:-1] + values[1:]) / 2
    lo, hi = values[:-1], values[1:]
    lo_even = (lo.astype(ML[name]).view(np.uint8) & 1) == 0  # the even significand's neighbour takes the tie
    assert np.array_equal(f.round(mids), np.where(lo_even, lo, hi))
    assert f.round([f.max * 3, -1e300])[0] == f.max and f.round([-1e300])[0] == -f.max
    assert np.isnan(f.round([math.nan, math.inf, -math.inf])).all()  # no code for them: never a silent 0 or max


def test_accumulate_takes_fp4_storage_and_refuses_it_as_accumulator():
    r = cli("accumulate", "--dtype", "fp4_e2m1", "--value", "1.4", "--n", "100", "--device", "cpu", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["params"]["dtype"] == "fp4_e2m1"
    assert doc["exact_stored"] == 150.0  # 1.4 is stored as 1.5
    r = cli("accumulate", "--dtype", "bf16", "--accumulators", "fp4", "--n", "10")
    assert r.code == 2 and "fp4_e2m1 is not an accumulator format" in r.err


def test_compare_op_takes_storage_formats():
    r = cli("compare", "op", "rmsnorm", "--dtype", "fp6_e2m3,fp4_e2m1", "--shape", "4x64", "--device", "cpu", "--json")
    assert r.code == 0, r.err
    rows = r.json()["rows"]
    cost = {row["dtype"]: row["rel_l2"] for row in rows if row["comparison"] == 2}
    assert 0 < cost["fp6_e2m3"] < cost["fp4_e2m1"]  # fewer bits, larger cost of storing the inputs
    r = cli("compare", "op", "rmsnorm", "--dtype", "fp64")
    assert r.code == 2 and "storage format" in r.err
