"""The error report and the three-comparison verdicts (tensor dumps: test_tensors.py)."""

import math

import numpy as np
import pytest

from helpers import ROOT, cli, one_line, strict_json
from precisionlab.catalog import formats
from precisionlab.numerics import compare as comparison, metrics
from precisionlab.experiments import compare, op_rows

FP32 = formats.get("fp32")


# --- metrics -------------------------------------------------------------------


def test_report_hand_computed():
    r = metrics.error_report([1.0, 2.0, 4.0], [1.0, 2.5, 4.0], FP32, atol=0.1, rtol=0.0)
    assert r.max_abs_error == 0.5 and r.mean_abs_error == pytest.approx(0.5 / 3)
    assert r.rel_l2 == pytest.approx(0.5 / math.sqrt(1 + 6.25 + 16))
    assert r.worst_index == (1,) and r.n_outside == 1 and r.frac_outside == pytest.approx(1 / 3)
    assert r.max_ulps == pytest.approx(0.5 / 2.0**-22)  # fp32 spacing at 2.5 is 2^-22
    assert r.median_ulps == 0.0 and r.finite and not r.passed


def test_report_zeros():
    r = metrics.error_report(np.zeros(4), np.zeros(4), FP32, 0.0, 0.0)
    assert r.passed and r.max_abs_error == 0 and r.rel_l2 == 0
    r = metrics.error_report(np.full(4, 1e-3), np.zeros(4), FP32, 0.0, 0.0)
    assert not r.passed and r.rel_l2 == math.inf  # against an all-zero reference: infinite, never a huge finite number


def test_nan_never_agrees():
    one = metrics.error_report([1.0, np.nan], [1.0, 2.0], FP32, 1.0, 1.0)
    assert one.n_outside == 1 and one.nonfinite_actual == 1 and one.nonfinite_reference == 0 and not one.passed
    assert one.worst_index == (1,)
    both = metrics.error_report([np.nan], [np.nan], FP32, 1.0, 1.0)
    assert not both.passed and both.nan_both == 1 and both.nonfinite_actual == 1 == both.nonfinite_reference


def test_inf_never_agrees():
    r = metrics.error_report([np.inf, 1.0], [np.inf, 1.0], FP32, 1.0, 1.0)
    assert not r.passed and r.n_outside == 1 and r.max_abs_error == 0.0


def test_empty_is_defined():
    r = metrics.error_report(np.zeros(0), np.zeros(0), FP32, 0.0, 0.0)
    assert r.n == 0 and r.passed and r.max_abs_error == 0 and r.worst_index is None


# --- compare op ------------------------------------------------------------------


def run_op(op, impl=None, shape=None, dtypes="bf16,fp16"):
    return compare.compare_op(compare.CompareOpConfig(op=op, impl=impl, shape=shape, dtypes=dtypes, device="cpu"))


@pytest.mark.parametrize("op", compare.OPS)
def test_project_kernels_are_not_flagged(op):
    res = run_op(op)
    assert not res.any_failed, [r["verdict"] for r in res.rows]
    ratios = [r["ratio"] for r in res.rows if r["comparison"] in (1, 3)]
    assert all(x <= comparison.RATIO_THRESHOLD for x in ratios)
    assert {r["comparison"] for r in res.rows} == {0, 1, 2, 3}


@pytest.fixture()
def impls_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))


def test_bf16_accumulation_is_flagged(impls_on_path):
    res = run_op("rmsnorm", impl="impls.kernels:rmsnorm_accumulates_in_input_dtype", dtypes="bf16")
    r3 = next(r for r in res.rows if r["comparison"] == 3)
    assert r3["flagged"] and r3["ratio"] > comparison.RATIO_THRESHOLD
    # named from the growth with length (long_rows); the fp32 path's sequential sum, a flat ~9x, is its own line
    assert res.causes[0]["cause"] == "accumulation" and "eps" not in {c["cause"] for c in res.causes}
    mm = run_op("matmul", impl="impls.kernels:matmul_accumulates_in_input_dtype", shape="64x1024x64", dtypes="bf16")
    assert next(r for r in mm.rows if r["comparison"] == 3)["flagged"]


def test_transposed_weight_is_flagged(impls_on_path):
    res = run_op("matmul", impl="impls.kernels:matmul_transposed_weight", shape="64x256x256")
    r1 = next(r for r in res.rows if r["comparison"] == 1)
    assert r1["flagged"] and "a bug" in r1["verdict"] and r1["ratio"] > 1000
    assert res.any_failed


def test_correct_user_implementations_are_not_flagged(impls_on_path):
    assert not run_op("rmsnorm", impl="impls.kernels:rmsnorm_correct").any_failed
    mm = run_op("matmul", impl="impls.kernels:matmul_correct")
    assert not any(r["flagged"] for r in mm.rows)  # every comparison; torch's CPU matmul may change bits with
    # the batch (its kernel choice depends on the shape): the contract reports that, it is not a precision bug


def test_compare_op_cli_exit_codes_and_json():
    r = cli("compare", "op", "rmsnorm", "--device", "cpu", "--json", "--shape", "8x512")
    assert r.code == 0, r.err
    d = strict_json(r.out)
    assert len([r for r in d["rows"] if r["case"] == "random"]) == 6
    assert d["flags"]["torch.backends.cuda.matmul.allow_tf32"] is False
    assert {c["contract"] for c in d["contracts"]} == {"batch_invariance", "determinism"} and d["advice"]
    r = cli("compare", "op", "matmul", "--device", "cpu", "--shape", "16x64x64",
            "--impl", "tests.impls.kernels:matmul_transposed_weight")
    assert r.code == 1 and "a bug" in r.out


@pytest.mark.parametrize("args", [  # after `compare op`
    ["conv2d"], ["matmul", "--shape", "64x64"], ["rmsnorm", "--shape", "0x4"], ["rmsnorm", "--dtypes", "fp8"],
    ["rmsnorm", "--impl", "nope"], ["rmsnorm", "--impl", "no.such.module:f"],
    ["rmsnorm", "--impl", "tests.impls.kernels:missing"],
], ids=" ".join)
def test_compare_op_usage_errors(args):
    one_line(cli("compare", "op", *args), 2)


def test_user_kernel_that_raises_is_a_failed_run():
    r = cli("compare", "op", "matmul", "--device", "cpu", "--shape", "8x8x8", "--impl", "tests.impls.kernels:raises")
    assert r.code == 1 and "kernel exploded" in r.err and "Traceback" not in r.err


def test_rope_with_low_precision_phases_is_flagged(impls_on_path):
    # the positions reach 32767, where bf16 angles are multiples of 256 rad
    res = run_op("rope", impl="impls.kernels:rope_bf16_phases", dtypes="bf16")
    r3 = next(r for r in res.rows if r["comparison"] == 3)
    assert r3["flagged"] and r3["ratio"] > 10 * comparison.RATIO_THRESHOLD


def test_attention_and_swiglu_user_kernels(impls_on_path):
    assert not run_op("swiglu", impl="impls.kernels:swiglu_correct").any_failed
    res = run_op("attention", impl="impls.kernels:attention_without_the_padding_mask", shape="4x64x32", dtypes="bf16")
    assert next(r for r in res.rows if r["comparison"] == 1)["flagged"]


def test_new_op_shapes_are_checked():
    with pytest.raises(compare.UsageError, match="even"):
        compare.parse_shape("rope", "8x63")
    with pytest.raises(compare.UsageError, match="BHxTxD"):
        compare.parse_shape("attention", "8x64")


# --- the harness: edge cases, output contracts, batch invariance, advisor -------------


def flagged_cases(res, comparison=3):
    return {r["case"] for r in res.rows if r["flagged"] and r["comparison"] == comparison}


def test_softmax_without_the_max_subtraction_is_flagged_by_the_large_logits(impls_on_path):
    res = run_op("softmax", impl="impls.kernels:softmax_without_max_subtraction", shape="8x256", dtypes="bf16")
    assert res.any_failed
    bad = flagged_cases(res, 1) | flagged_cases(res, 3)
    assert {"large", "shifted"} <= bad and "random" not in bad


def test_output_contracts_are_flagged_rows_with_the_reason(impls_on_path):
    res = run_op("rmsnorm", impl="impls.kernels:rmsnorm_returns_fp32", shape="8x256", dtypes="bf16")
    r3 = [r for r in res.rows if r["comparison"] == 3]
    assert r3 and all(r["flagged"] and "returned dtype torch.float32 where torch.bfloat16" in r["verdict"]
                  for r in r3)
    res = run_op("softmax", impl="impls.kernels:softmax_returns_numpy", shape="8x256", dtypes="bf16")
    assert all("not a torch.Tensor" in r["verdict"] for r in res.rows if r["comparison"] in (1, 3))
    res = run_op("softmax", impl="impls.kernels:softmax_wrong_shape", shape="8x256", dtypes="bf16")
    assert all("returned shape" in r["verdict"] for r in res.rows if r["comparison"] in (1, 3))
    r = cli("compare", "op", "softmax", "--device", "cpu", "--shape", "8x256", "--dtypes", "bf16", "--cases", "random",
            "--impl", "tests.impls.kernels:softmax_wrong_shape")
    assert r.code == 1 and "returned shape" in r.out and "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) == 1 and "softmax_wrong_shape returned shape" in r.err


def test_a_batch_variant_kernel_is_flagged_with_the_batch_size(impls_on_path):
    res = run_op("softmax", impl="impls.kernels:softmax_batch_variant", shape="8x256", dtypes="bf16")
    bi = {c["dtype"]: c for c in res.contracts if c["contract"] == "batch_invariance"}
    # fp32 shows it; in bf16 the two orders usually round to the same output, and then bf16 holds
    assert bi["fp32"]["flagged"] and bi["fp32"]["first_batch_changed"] == 257
    assert all(not c["flagged"] for c in res.contracts if c["contract"] == "determinism")
    assert any("batch size 257" in t for t in res.takeaways)


def test_the_advisors_tolerance_passes_and_ten_percent_less_fails():
    import torch
    from precisionlab.numerics import torch_ops
    from precisionlab.experiments import op_harness

    x, w, eps = compare.make_inputs("rmsnorm", (16, 512), 0, "cpu")
    xb, wb = x.bfloat16(), w.bfloat16()
    got = op_rows.to_numpy(torch_ops.rmsnorm(xb, wb, eps))  # bf16 against fp32: differences to advise on
    ref = op_rows.to_numpy(torch.nn.functional.rms_norm(x, (512,), w, eps))
    a = op_harness.advise(got, ref)
    assert a["min_atol"] > 0 and 0 < a["min_rtol"] < math.inf
    assert op_harness.passes(got, ref, a["min_atol"], 0) and not op_harness.passes(got, ref, 0.9 * a["min_atol"], 0)
    assert op_harness.passes(got, ref, 0, a["min_rtol"]) and not op_harness.passes(got, ref, 0, 0.9 * a["min_rtol"])
    # a difference where the reference is 0: no rtol can pass
    assert op_harness.advise(np.array([1e-9]), np.array([0.0]))["min_rtol"] == math.inf


def test_matmul_bound_holds_for_the_projects_kernel():
    res = run_op("matmul", shape="32x2048x32", dtypes="bf16")
    (adv,) = res.advice
    assert adv["within_bound"] and adv["k"] == 2048 and 0 < adv["max_error_over_bound"] <= 1


def test_inputs_from_a_file(tmp_path):
    x = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32) * 50
    np.save(tmp_path / "x.npy", x)
    res = compare.compare_op(compare.CompareOpConfig(op="softmax", from_file=str(tmp_path / "x.npy"), device="cpu",
                                                     dtypes="bf16", cases="file"))
    assert res.rows[0]["shape"] == [6, 40] and not res.any_failed
    with pytest.raises(compare.UsageError, match="2-D"):
        np.save(tmp_path / "bad.npy", x.ravel())
        compare.compare_op(compare.CompareOpConfig(op="softmax", from_file=str(tmp_path / "bad.npy"), device="cpu"))


def test_the_shape_stated_is_the_files(tmp_path, run):
    """With --from the header, params.shape and the rows are the file's: a
    2x3 @ 3x2 matmul is 2x3x2 with 4 outputs, and a file holding only a gets
    b generated at the file's K (2x3x256); the case is `file`, not `random`."""
    np.savez(tmp_path / "ab.npz", a=np.arange(6.0).reshape(2, 3), b=np.ones((3, 2)))
    np.savez(tmp_path / "a.npz", a=np.arange(6.0).reshape(2, 3))
    r = run("compare", "op", "matmul", "--from", str(tmp_path / "ab.npz"), "--device", "cpu", "--dtypes", "bf16",
            "--cases", "file")
    assert "compare op matmul 2x3x2:" in r.out and "0/4" in r.out and "random" not in r.out, r.out
    d = strict_json(run("compare", "op", "matmul", "--from", str(tmp_path / "a.npz"), "--device", "cpu",
                        "--dtypes", "bf16", "--cases", "file", "--json").out)
    assert d["params"]["shape"] == [2, 3, 256] and list(d["params"]["cases"]) == ["file"]
    assert {r["case"] for r in d["rows"]} == {"file"} and all(r["n"] == 512 for r in d["rows"])
    one_line(run("compare", "op", "matmul", "--from", str(tmp_path / "a.npz"), "--device", "cpu",
                 "--cases", "random"), 2, "unknown case 'random'", "file")


def test_masked_zero_policy_and_case_selection():
    res = compare.compare_op(compare.CompareOpConfig(op="softmax", device="cpu", dtypes="bf16", masked="zero",
                                                     cases="masked_rows,non_finite", shape="8x64"))
    assert {r["case"] for r in res.rows} == {"masked_rows", "non_finite"}
    assert not res.any_failed  # the project's kernels follow the policy
    # a kernel that keeps the textbook NaN is flagged under the zero policy, on the masked rows only
    res = compare.compare_op(compare.CompareOpConfig(op="softmax", device="cpu", dtypes="bf16", masked="zero",
                                                     cases="random,masked_rows", shape="8x64",
                                                     impl="tests.impls.kernels:softmax_without_max_subtraction"))
    assert flagged_cases(res) == {"masked_rows"}
    with pytest.raises(compare.UsageError, match="unknown case"):
        compare.op_harness.select("softmax", "nope")


def test_the_typical_row_is_the_yardstick_where_one_element_carries_the_norm():
    """A massive activation (1.4e4 among O(1) values) makes a tensor's rel-L2 one draw of that element's
    rounding; the median row's rel-L2 is what rounding costs the rest."""
    from precisionlab.numerics.compare import rel_l2, typical_row_rel_l2

    rng = np.random.default_rng(0)
    ref = rng.standard_normal((8, 64))
    ref[0, 3] = 1.4e4
    rel = np.full_like(ref, 1e-6)
    rel[0, 3] = 1e-8                     # the massive element happened to round well
    x = ref * (1 + rel)
    assert rel_l2(x, ref) == pytest.approx(1e-8, rel=0.05)
    assert typical_row_rel_l2(x, ref) == pytest.approx(1e-6, rel=1e-6)
    assert typical_row_rel_l2(x[0], ref[0]) == 0.0          # one row: no rows to say
    assert typical_row_rel_l2(np.zeros((2, 3)), np.zeros((2, 3))) == 0.0
