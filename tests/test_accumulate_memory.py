"""accumulate's CPU side: the memory estimate against measured peak RSS, the
refusal before allocating, rows on threads, the radix orders and the exact
sums against their plain numpy / metrics definitions (the exact sums' hostile
inputs: test_accumulate_exact.py)."""

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.numerics import metrics
from precisionlab.errors import UsageError
from precisionlab.experiments import accumulate as A
from precisionlab.experiments import accumulate_cpu as C

# A fresh interpreter per size, and its VmHWM, the high-water mark of its own
# address space: ru_maxrss would not do, Linux carries it across fork and exec
# from the parent (pytest, torch loaded: 220 MiB more than the child ever held).
MEASURE = textwrap.dedent("""
    import json, sys
    from precisionlab.experiments import accumulate as A
    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    cfg = A.AccumulateConfig(**json.loads(sys.argv[1]))
    base = status("VmRSS")
    A.run(cfg)
    print(status("VmHWM") - base)
""")


def measured_growth(**cfg) -> int:
    out = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(cfg)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.parametrize("case", [
    # normal values: the orders run (one array: the sort runs in its bytes)
    dict(dist="normal", dtype="fp32", device="cpu"),
    # fp64 storage: the orders' array and the sort's work array
    dict(dist="normal", dtype="fp64", device="cpu"),
    # the constant default input: no orders, products for sums
    dict(dtype="bf16", device="cpu"),
    # running-sum traces kept
    dict(dist="uniform", dtype="bf16", device="cpu", methods="sequential,pairwise", trace=True),
])
def test_memory_estimate_within_one_and_a_half_times_the_measured_peak(case):
    for n in (2_000_000, 4_000_000, 8_000_000):
        cfg = dict(case, n=n)
        orders = "methods" not in case and "dist" in case
        traced = 4 if case.get("trace") else 0  # sequential on the four default accumulators
        est = C.memory_estimate(n, orders, traced, narrow=case["dtype"] != "fp64")
        got = measured_growth(**cfg)
        assert est / 1.5 <= got <= est * 1.5, f"n={n}: estimate {est / 2**20:.0f} MiB, measured {got / 2**20:.0f} MiB"


def test_refuses_before_allocating_when_the_estimate_exceeds_the_limit(monkeypatch):
    n = 3_000_000
    est = C.memory_estimate(n, True, 0)
    monkeypatch.setattr(inputs, "memory_limit", lambda: est - 1)
    with pytest.raises(UsageError, match="--n 3000000 needs about"):
        A.run(A.AccumulateConfig(n=n, dist="normal", device="cpu"))
    monkeypatch.setattr(inputs, "memory_limit", lambda: est + 1)
    A.run(A.AccumulateConfig(n=n, dist="normal", device="cpu", methods="sequential,sorted", accumulators="fp32"))


def test_rows_on_threads_equal_rows_one_at_a_time():
    cfg = dict(n=30_011, dist="lognormal", dtype="bf16", device="cpu", trace=True, seed=5)
    one = A.run(A.AccumulateConfig(**cfg, workers=1))
    two = A.run(A.AccumulateConfig(**cfg, workers=2))
    assert [(r["accumulator"], r["variant"]) for r in one.rows] == [(r["accumulator"], r["variant"]) for r in two.rows]
    for a, b in zip(one.rows, two.rows, strict=True):
        assert a["result"] == b["result"] and a["stall_step"] == b["stall_step"], (a["accumulator"], a["variant"])
    assert one.traces.keys() == two.traces.keys()
    for k in one.traces:
        assert np.array_equal(one.traces[k], two.traces[k])
    # and each row is the kernel on the order the method names
    stored = formats.get("bf16").round(inputs.generate(cfg["n"], "lognormal", 5))
    by = {(r["accumulator"], r["variant"]): r["result"] for r in two.rows}
    order = stored[np.argsort(-np.abs(stored), kind="stable")]
    assert by[("fp16", "sorted_desc")] == native.accumulate_cpu(order, formats.get("fp16").code, "sequential").result
    assert by[("bf16", "reverse")] == native.accumulate_cpu(stored[::-1], formats.get("bf16").code, "sequential").result


SPECIAL = st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, math.inf, -math.inf, math.nan, 5e-324, -5e-324])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(SPECIAL, st.floats(allow_nan=False, width=16)), min_size=1, max_size=300),
       st.booleans())
def test_sort_by_magnitude_is_numpys_stable_argsort(values, descending):
    x = np.array(values, dtype=np.float64)
    want = x[np.argsort(-np.abs(x) if descending else np.abs(x), kind="stable")]
    got = native.sort_by_magnitude(x, descending)
    assert np.array_equal(np.isnan(want), np.isnan(got))
    ok = ~np.isnan(want)
    assert np.array_equal(want[ok].view(np.uint64), got[ok].view(np.uint64))  # -0.0 and 0.0 in their places


def same_order(want: np.ndarray, got: np.ndarray) -> bool:
    ok = ~np.isnan(want)
    return np.array_equal(np.isnan(want), np.isnan(got)) and np.array_equal(want[ok].view(np.uint64),
                                                                             got[ok].view(np.uint64))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(SPECIAL.filter(lambda v: v != v or float(np.float32(v)) == v), st.floats(width=32),
                          st.floats(width=32, min_value=-(2.0**-126), max_value=2.0**-126)),
                min_size=1, max_size=300), st.booleans())
def test_float32_sort_in_one_array_is_the_general_sort(values, descending):
    x = np.array(values, dtype=np.float64)
    want = native.sort_by_magnitude(x, descending)
    assert same_order(want, native.sort_float32_by_magnitude(x, descending))


def test_float32_sort_refuses_values_that_are_not_float32_values():
    with pytest.raises(UsageError, match="not a float32 value"):
        native.sort_float32_by_magnitude(np.array([1.0, 0.1]))
    with pytest.raises(UsageError, match="not a float32 value"):
        native.sort_float32_by_magnitude(np.array([2.0**-150]))  # below float32's subnormals


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(SPECIAL, st.floats(width=16)), min_size=1, max_size=300))
def test_decreasing_order_from_the_increasing_one_is_the_decreasing_sort(values):
    # narrow values: many runs of equal |x| with both signs, whose order within a run matters
    x = np.array(values, dtype=np.float64)
    want = native.sort_by_magnitude(x, descending=True)
    up = native.sort_by_magnitude(x)
    assert same_order(want, native.reverse_magnitude_order(up))
    assert same_order(want, native.reverse_magnitude_order(up, out=up))  # in place


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(SPECIAL, st.floats(allow_nan=False, allow_infinity=False)), min_size=1, max_size=60),
       st.integers(1, 5))
def test_streamed_sums_are_the_exact_sums(values, reps):
    x = np.tile(np.array(values, dtype=np.float64), reps)
    exact = metrics.exact_sum(x)
    got = C.exact_sum(x)
    assert (math.isnan(got) and math.isnan(exact)) or (got == exact and math.copysign(1, got) == math.copysign(1, exact))
    want_abs = metrics.exact_sum(np.abs(x))
    got_abs = C.exact_abs_sum(x, exact)
    assert (math.isnan(got_abs) and math.isnan(want_abs)) or got_abs == want_abs


@pytest.mark.parametrize("v", [0.1, -3.0, 1e300, -1e308, 5e-324, -0.0])
def test_constant_sums_are_products_equal_to_fsum(v):
    x = np.full(100_003, v)
    assert C.exact_sum(x) == metrics.exact_sum(x)
    assert math.copysign(1, C.exact_sum(x)) == math.copysign(1, metrics.exact_sum(x))
