"""The C accumulate kernels against the literature and, bit for bit, against the
independent step-by-step emulation in emulate.py."""

import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import emulate
from precisionlab import native
from precisionlab.catalog import formats

# every CPU sum kernel of the catalog: a new one fails here until emulate.py knows it
CPU_METHODS = [v.name for v in native.variants("sum", "cpu") if v.order == "as_given"]
ACCUMULATORS = ["bf16", "fp16", "fp32", "fp64", "fp8_e4m3", "fp8_e5m2"]
STORAGES = ["fp64", "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
ODD_SIZES = [1, 2, 31, 33, 1025]


def csum(x, acc, method="sequential", seed=0):
    return native.accumulate_cpu(np.asarray(x, dtype=np.float64), formats.get(acc).code, method, seed=seed)


def bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def same_bits(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or bits(a) == bits(b)


# --- known values ------------------------------------------------------------


@pytest.mark.parametrize("storage, acc, expected", [
    ("bf16", "bf16", 32.0),
    ("bf16", "fp16", 256.0),
    ("bf16", "fp32", 1000.9765625),
    ("fp32", "fp32", 999.9028930664062),
])
def test_point_one_ten_thousand_times(storage, acc, expected):
    x = formats.get(storage).round(np.full(10_000, 0.1))
    assert csum(x, acc).result == expected


@pytest.mark.parametrize("acc, stall", [("bf16", 256.0), ("fp16", 2048.0)])
def test_ones_stagnate(acc, stall):
    r = csum(np.ones(5000), acc)
    assert r.result == stall
    assert r.stall_value == stall
    assert r.stall_step == int(stall)  # index of the first absorbed 1: after `stall` additions


def test_bf16_stored_point_one_is_what_the_book_says():
    assert formats.get("bf16").round(np.array([0.1]))[0] == 0.10009765625


def test_order_dependence_in_fp32():
    # (1e8 + 1) - 1e8 = 0 but (1e8 - 1e8) + 1 = 1
    assert csum([1e8, 1.0, -1e8], "fp32").result == 0.0
    assert csum([1e8, -1e8, 1.0], "fp32").result == 1.0
    assert csum([1e8, 1.0, -1e8], "fp32", "neumaier").result == 1.0


def test_stochastic_rounding_escapes_the_stall():
    x = formats.get("bf16").round(np.full(10_000, 0.1))
    r = csum(x, "bf16", "stochastic", seed=1)
    exact = math.fsum(x)
    assert abs(r.result - exact) < 0.1 * exact  # the deterministic sum is off by 97 %
    assert csum(x, "bf16", "stochastic", seed=1).result == r.result  # seeded: reproducible


def test_trace_is_the_running_sum():
    x = np.ones(300)
    r = native.accumulate_cpu(x, formats.get("bf16").code, "sequential", trace=True)
    assert r.trace[0] == 1.0 and r.trace[255] == 256.0 and r.trace[-1] == 256.0
    assert np.all(np.diff(r.trace[:256]) == 1.0)


def test_nan_and_inf_are_computed_not_crashed():
    for m in CPU_METHODS:
        assert math.isnan(csum([1.0, math.nan, 2.0], "fp32", m).result)
        assert math.isnan(csum([math.inf, -math.inf], "fp32", m).result)
    assert csum([1.0, math.inf], "fp32", "sequential").result == math.inf
    assert csum([1.0, math.inf], "fp32", "pairwise").result == math.inf


def test_overflow_follows_the_format():
    assert csum([60000.0, 60000.0], "fp16").result == math.inf
    assert math.isnan(csum([400.0, 400.0], "fp8_e4m3").result)  # e4m3fn has no infinity


# --- bit-exact against the emulation -----------------------------------------


def values(storage: str, n: int, seed: int, spread: float) -> np.ndarray:
    """Random mixed-sign values over a range of magnitudes, stored in `storage`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * np.exp2(rng.uniform(-spread, spread, n))
    return formats.get(storage).round(x)


@pytest.mark.parametrize("method", CPU_METHODS)
@pytest.mark.parametrize("acc", ACCUMULATORS)
@pytest.mark.parametrize("n", ODD_SIZES)
def test_bit_exact_odd_sizes(method, acc, n):
    x = values("fp32", n, seed=n, spread=6)
    got = csum(x, acc, method, seed=7).result
    want = emulate.run(method, x, acc, seed=7)
    assert same_bits(got, want), f"{method}/{acc} n={n}: C {got!r} vs emulation {want!r}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=st.sampled_from(CPU_METHODS),
    storage=st.sampled_from(STORAGES),
    acc=st.sampled_from(ACCUMULATORS),
    n=st.one_of(st.sampled_from(ODD_SIZES), st.integers(1, 300)),
    seed=st.integers(0, 2**32 - 1),
    spread=st.sampled_from([0.0, 4.0, 20.0, 60.0]),  # 60: underflow to (signed) zero and overflow
)
def test_bit_exact_random(method, storage, acc, n, seed, spread):
    x = values(storage, n, seed, spread)
    got = csum(x, acc, method, seed=seed).result
    want = emulate.run(method, x, acc, seed=seed)
    assert same_bits(got, want), f"{method} {storage}->{acc} n={n}: C {got!r} vs emulation {want!r}"


def test_wide_storage_rounds_once_not_twice():
    # 1 + (2^-8 + 2^-60): the exact sum lies just above a bf16 midpoint, but its
    # double rounding is the midpoint itself, which would then tie to even (1.0).
    x = [1.0, 2.0**-8 + 2.0**-60]
    assert 1.0 + x[1] == 1.0 + 2.0**-8  # the double sum lost the deciding bit
    assert csum(x, "bf16").result == 1.0078125
    assert emulate.sequential(x, "bf16") == 1.0078125
    assert csum([1.0 + 2.0**-8, 2.0**-100], "bf16", "pairwise").result == 1.0078125


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), fmt=st.sampled_from(STORAGES))
def test_library_rounding_matches_formats_round(seed, fmt):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(257) * np.exp2(rng.uniform(-140, 140, 257))
    x[:4] = [1 + 2.0**-8 + 2.0**-30, -(1 + 2.0**-8 + 2.0**-30), 3e38, -5e-46]
    a = native.round_to(x, formats.get(fmt).code)
    b = formats.get(fmt).round(x)
    assert np.array_equal(a.view(np.uint64), b.view(np.uint64)) or np.array_equal(a, b, equal_nan=True)
    c = np.array([emulate.round_exact(__import__("fractions").Fraction(v), fmt) for v in x])
    assert np.array_equal(a, c, equal_nan=True)
