"""The CPU accumulate kernels' fast path (double arithmetic and a two-op bit
rounding, exact paths only where the bits say so) against their exact path
(every operation rounded to odd, then rounded by integer arithmetic): the same
bits, for every storage and accumulator format and every method, on random
inputs, exact ties, subnormals, overflow and the special values. The exact path
itself is held to the independent emulation in test_accumulate_kernels.py."""

import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from precisionlab import native
from precisionlab.catalog import formats

# every CPU sum kernel of the library's catalog (the reordered rows run the sequential one)
METHODS = [v.name for v in native.variants("sum", "cpu") if v.order == "as_given"]
STORAGES = ["fp64", "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
TF32 = next(d.code for d in native.format_table() if d.name == "tf32")  # the library has it, the registry does not
ACCUMULATORS = [formats.get(a).code for a in STORAGES] + [TF32]
# precision, emin, max of each accumulator code (the library's table; tests/test_catalog.py holds it to ml_dtypes)
ACC_RANGE = {d.code: (d.precision, d.emin, d.max) for d in native.format_table()}
KINDS = ["scaled", "ties", "extreme", "specials", "constant", "cancel"]


def bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or bits(a) == bits(b)


def values(kind: str, n: int, acc: int, rng: np.random.Generator) -> np.ndarray:
    p, emin, mx = ACC_RANGE[acc]
    emax = math.frexp(mx)[1] - 1
    if kind == "scaled":  # ordinary data over a range of magnitudes
        return rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))
    if kind == "ties":  # integers near 2^p at one scale: exact sums land on midpoints
        e = int(rng.integers(max(emin, -60), min(emax, 60) - p))
        return rng.integers(-(2 ** (p + 1)), 2 ** (p + 1), n).astype(np.float64) * 2.0**e
    if kind == "extreme":  # the accumulator's subnormals and its overflow
        lo, hi = max(emin - p - 3, -1070), min(emax + 2, 1020)
        return rng.standard_normal(n) * np.exp2(rng.integers(lo, hi, n).astype(np.float64))
    if kind == "constant":  # stagnation
        return np.full(n, rng.standard_normal() * 2.0 ** int(rng.integers(-8, 8)))
    if kind == "cancel":  # +a, -a pairs and large terms that cancel
        a = rng.standard_normal(n) * np.exp2(rng.integers(-4, 12, n))
        a[1::2] = -a[0::2][: a[1::2].size] * (1 + rng.integers(0, 2, a[1::2].size) * 2.0**-20)
        return a
    # specials scattered through ordinary values
    x = rng.standard_normal(n)
    sub = math.ldexp(1.0, emin - p + 1)
    pool = [0.0, -0.0, mx, -mx, sub, -sub, math.ldexp(1.0, emin), mx * (1 + 2.0 ** -(p + 1)), math.inf,
            -math.inf, math.nan, 2.0 ** (emin - 1), 1.5 * sub]
    k = rng.integers(0, min(n, 4) + 1)
    for i in rng.choice(n, size=k, replace=False):
        x[i] = pool[int(rng.integers(0, len(pool)))]
    return x


@st.composite
def cases(draw):
    storage = draw(st.sampled_from(STORAGES))
    acc = draw(st.sampled_from(ACCUMULATORS))
    kind = draw(st.sampled_from(KINDS))
    n = draw(st.one_of(st.integers(1, 70), st.integers(60, 700)))  # pairwise blocks are 64 values
    seed = draw(st.integers(0, 2**32 - 1))
    x = values(kind, n, acc, np.random.default_rng(seed))
    with np.errstate(over="ignore", invalid="ignore"):
        stored = formats.get(storage).round(x)
    return stored, acc, seed


def check_equal(stored, acc, seed):
    for m in METHODS:
        trace = m in ("sequential", "stochastic")
        fast = native.accumulate_cpu(stored, acc, m, seed=seed, trace=trace)
        exact = native.accumulate_cpu(stored, acc, m, seed=seed, trace=trace, exact_path=True)
        where = f"{m}, accumulator code {acc}, n={stored.size}"
        assert same(fast.result, exact.result), f"{where}: fast {fast.result!r} exact {exact.result!r}"
        assert fast.stall_step == exact.stall_step, where
        assert same(fast.stall_value, exact.stall_value), where
        if trace:
            fb, eb = fast.trace.view(np.uint64), exact.trace.view(np.uint64)
            differ = (fb != eb) & ~(np.isnan(fast.trace) & np.isnan(exact.trace))
            assert not differ.any(), f"{where}: traces part at step {int(np.argmax(differ))}"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fast_path_is_the_exact_path(case):
    check_equal(*case)


@pytest.mark.parametrize("acc", ACCUMULATORS)
@pytest.mark.parametrize("storage", STORAGES)
def test_fast_path_on_long_normal_data(storage, acc):
    # long enough for many pairwise blocks and for sums to reach stagnation
    x = formats.get(storage).round(np.random.default_rng(acc).standard_normal(20_011) * 3.0)
    check_equal(x, acc, seed=acc)


def test_fast_path_with_the_stored_format_wider_than_the_accumulator_ties_at_the_double_level():
    # 1 + 2^-8 + 2^-60: the double sum 1 + 2^-8 is a bf16 midpoint, the exact sum is above it.
    x = np.array([1.0, 2.0**-8 + 2.0**-60])
    r = native.accumulate_cpu(x, formats.get("bf16").code, "sequential")
    assert r.result == 1.0078125  # rounded up, as the exact sum says; ties-to-even would give 1.0
    assert same(r.result, native.accumulate_cpu(x, formats.get("bf16").code, "sequential", exact_path=True).result)


@pytest.mark.parametrize("acc", ["bf16", "fp16"])
def test_fast_path_switching_between_narrow_and_wide_values(acc):
    # Kahan and Neumaier run a loop of their own while every x is narrow (a
    # value of the accumulator's format, or p bits) and leave it for the
    # general loop at a wide one, for a run of 256, then try again: values of
    # the format with wide ones (fp32 values, subnormals, out of range) strewn
    # at random, in runs and alone, across many runs.
    rng = np.random.default_rng(11)
    code = formats.get(acc).code
    for trial in range(6):
        n = 5_000
        x = formats.get(acc).round(rng.standard_normal(n) * 4.0)
        k = int(rng.integers(1, 40))
        where = rng.choice(n, size=k, replace=False)
        wide = np.array([1 + 2.0**-20, 2.0**-24, 2.0**-130, 1e6, -3.0000001, 70000.0, 2.0**-149 * 3])
        x[where] = rng.choice(wide, size=k) * rng.choice([1.0, -1.0], size=k)
        if trial % 2:
            start = int(rng.integers(0, n - 600))
            x[start:start + 600] = rng.standard_normal(600)  # a long wide stretch
        check_equal(x, code, seed=trial)
