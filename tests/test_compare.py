"""The error report and the three-comparison verdicts (tensor dumps: test_tensors.py)."""

import math

import numpy as np
import pytest
import torch

from helpers import ROOT, cli, strict_json
from precisionlab import formats, metrics
from precisionlab.experiments import compare

FP32 = formats.get("fp32")


# --- metrics -------------------------------------------------------------------


def test_report_hand_computed():
    r = metrics.error_report([1.0, 2.0, 4.0], [1.0, 2.5, 4.0], FP32, atol=0.1, rtol=0.0)
    assert r.max_abs == 0.5 and r.mean_abs == pytest.approx(0.5 / 3)
    assert r.rel_l2 == pytest.approx(0.5 / math.sqrt(1 + 6.25 + 16))
    assert r.worst_index == (1,) and r.n_outside == 1 and r.frac_outside == pytest.approx(1 / 3)
    assert r.max_ulps == pytest.approx(0.5 / 2.0**-22)  # fp32 spacing at 2.5 is 2^-22
    assert r.median_ulps == 0.0 and r.finite and not r.passed


def test_report_zeros():
    r = metrics.error_report(np.zeros(4), np.zeros(4), FP32, 0.0, 0.0)
    assert r.passed and r.max_abs == 0 and r.rel_l2 == 0
    r = metrics.error_report(np.full(4, 1e-3), np.zeros(4), FP32, 0.0, 0.0)
    assert not r.passed and math.isfinite(r.rel_l2) and r.rel_l2 > 1e200  # denominator clamped, not a division by 0


def test_nan_never_agrees():
    one = metrics.error_report([1.0, np.nan], [1.0, 2.0], FP32, 1.0, 1.0)
    assert one.n_outside == 1 and one.nonfinite_actual == 1 and one.nonfinite_reference == 0 and not one.passed
    assert one.worst_index == (1,)
    both = metrics.error_report([np.nan], [np.nan], FP32, 1.0, 1.0)
    assert not both.passed and both.nan_both == 1 and both.nonfinite_actual == 1 == both.nonfinite_reference


def test_inf_never_agrees():
    r = metrics.error_report([np.inf, 1.0], [np.inf, 1.0], FP32, 1.0, 1.0)
    assert not r.passed and r.n_outside == 1 and r.max_abs == 0.0


def test_empty_is_defined():
    r = metrics.error_report(np.zeros(0), np.zeros(0), FP32, 0.0, 0.0)
    assert r.n == 0 and r.passed and r.max_abs == 0 and r.worst_index is None


def test_default_tolerances_come_from_torch():
    from torch.testing._comparison import default_tolerances

    for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32),
                     ("fp64", torch.float64)):
        assert metrics.default_tolerances(formats.get(name)) == default_tolerances(torch.empty(0, dtype=dt))


# --- compare op ------------------------------------------------------------------


def run_op(op, impl=None, shape=None, dtypes="bf16,fp16"):
    return compare.compare_op(compare.CompareOpConfig(op=op, impl=impl, shape=shape, dtypes=dtypes, device="cpu"))


@pytest.mark.parametrize("op", compare.OPS)
def test_project_kernels_are_not_flagged(op):
    res = run_op(op)
    assert not res.any_failed, [r["verdict"] for r in res.rows]
    ratios = [r["ratio"] for r in res.rows if r["comparison"] in (1, 3)]
    assert all(x <= compare.RATIO_THRESHOLD for x in ratios)
    assert {r["comparison"] for r in res.rows} == {0, 1, 2, 3}


@pytest.fixture()
def impls_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))


def test_bf16_accumulation_is_flagged(impls_on_path):
    res = run_op("rmsnorm", impl="impls.kernels:rmsnorm_accumulates_in_input_dtype", dtypes="bf16")
    r3 = next(r for r in res.rows if r["comparison"] == 3)
    assert r3["flagged"] and r3["ratio"] > compare.RATIO_THRESHOLD and "accumulat" in r3["verdict"]
    mm = run_op("matmul", impl="impls.kernels:matmul_accumulates_in_input_dtype", shape="64x1024x64", dtypes="bf16")
    assert next(r for r in mm.rows if r["comparison"] == 3)["flagged"]


def test_transposed_weight_is_flagged(impls_on_path):
    res = run_op("matmul", impl="impls.kernels:matmul_transposed_weight", shape="64x256x256")
    r1 = next(r for r in res.rows if r["comparison"] == 1)
    assert r1["flagged"] and "a bug" in r1["verdict"] and r1["ratio"] > 1000
    assert res.any_failed


def test_correct_user_implementations_are_not_flagged(impls_on_path):
    assert not run_op("rmsnorm", impl="impls.kernels:rmsnorm_correct").any_failed
    assert not run_op("matmul", impl="impls.kernels:matmul_correct").any_failed


def test_compare_op_cli_exit_codes_and_json():
    r = cli("compare", "op", "rmsnorm", "--device", "cpu", "--json", "--shape", "8x512")
    assert r.code == 0, r.err
    d = strict_json(r.out)
    assert len(d["rows"]) == 6 and d["flags"]["torch.backends.cuda.matmul.allow_tf32"] is False
    r = cli("compare", "op", "matmul", "--device", "cpu", "--shape", "16x64x64",
            "--impl", "tests.impls.kernels:matmul_transposed_weight")
    assert r.code == 1 and "a bug" in r.out


@pytest.mark.parametrize("args", [
    ["compare", "op", "conv2d"],
    ["compare", "op", "matmul", "--shape", "64x64"],
    ["compare", "op", "rmsnorm", "--shape", "0x4"],
    ["compare", "op", "rmsnorm", "--dtype", "fp8"],
    ["compare", "op", "rmsnorm", "--impl", "nope"],
    ["compare", "op", "rmsnorm", "--impl", "no.such.module:f"],
    ["compare", "op", "rmsnorm", "--impl", "tests.impls.kernels:missing"],
])
def test_compare_op_usage_errors(args):
    r = cli(*args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_user_kernel_that_raises_is_a_failed_run():
    r = cli("compare", "op", "matmul", "--device", "cpu", "--shape", "8x8x8", "--impl", "tests.impls.kernels:raises")
    assert r.code == 1 and "kernel exploded" in r.err and "Traceback" not in r.err
