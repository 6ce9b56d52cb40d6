"""compare op names the cause of a planted bug from the pattern across its input cases
(experiments/op_diagnosis.py states each rule and why its threshold is what it is)."""

import pytest

from helpers import ROOT
from precisionlab.experiments import compare, op_diagnosis


@pytest.fixture(autouse=True)
def impls_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))


def run_op(op, impl=None, shape=None, dtypes="bf16"):
    return compare.compare_op(compare.CompareOpConfig(op=op, impl=impl, shape=shape, dtypes=dtypes, device="cpu"))


def causes(res) -> dict:
    got = {c["cause"]: c for c in res.causes}
    assert len(got) == len(res.causes), "one bullet a cause"
    assert [c["text"] for c in res.causes] == res.takeaways  # and nothing else, no repeats
    for c in res.causes:  # every bullet names its cases
        assert c["cases"] and all(name in c["text"] for name in c["cases"]), c["text"]
    return got


def excess(cause, case, comparison):
    return max(max(r["ratio"], 1.0) for r in cause["rows"] if r["case"] == case and r["comparison"] == comparison)


@pytest.mark.parametrize("op,impl", [("rmsnorm", "rmsnorm_fixed_eps"), ("layernorm", "layernorm_fixed_eps")])
def test_a_hard_coded_eps_is_named_from_the_growth_as_inputs_shrink(op, impl):
    res = run_op(op, f"impls.kernels:{impl}", "8x256", "bf16,fp16")
    got = causes(res)
    assert set(got) == {"eps"}, res.takeaways  # not accumulation, not rounding
    eps = got["eps"]
    assert "wrong eps" in eps["text"] and "tiny_scale" in eps["cases"] and "large_scale" not in eps["cases"]
    assert excess(eps, "tiny_scale", 1) >= op_diagnosis.GROWTH * excess(eps, "random", 1)


def test_a_softmax_without_the_max_subtraction_is_one_overflow_bullet_naming_the_cases():
    res = run_op("softmax", "impls.kernels:softmax_without_max_subtraction", "8x256")
    got = causes(res)
    ov = got["exp_overflow"]
    assert "exp overflow: subtract the row max" in ov["text"]
    assert set(ov["cases"]) == {"large", "shifted", "very_negative"}  # where |x| passes exp's range; random is fine
    # the +inf logit is a NaN convention, its own bullet; nothing else is said
    assert set(got) <= {"exp_overflow", "nonfinite"} and len(res.takeaways) <= 2


def test_rope_with_bf16_angles_is_named_from_the_long_positions():
    res = run_op("rope", "impls.kernels:rope_bf16_phases")
    got = causes(res)
    assert set(got) == {"rope_phases"}, res.takeaways
    rope = got["rope_phases"]
    assert "long_positions" in rope["cases"]
    assert excess(rope, "long_positions", 3) >= op_diagnosis.GROWTH * excess(rope, "short_positions", 3)


@pytest.mark.parametrize("op,impl,shape,long_case", [
    ("matmul", "matmul_accumulates_in_input_dtype", "64x1024x64", "long_k"),
    ("rmsnorm", "rmsnorm_accumulates_in_input_dtype", "8x1024", "long_rows"),
])
def test_a_bf16_accumulation_is_named_from_the_growth_with_length(op, impl, shape, long_case):
    res = run_op(op, f"impls.kernels:{impl}", shape)
    got = causes(res)
    acc = got["accumulation"]
    assert "accumulation in low precision" in acc["text"] and long_case in acc["cases"]
    assert excess(acc, long_case, 3) >= op_diagnosis.LENGTH_GROWTH * excess(acc, "random", 3)
    assert "eps" not in got and "rope_phases" not in got and "exp_overflow" not in got


@pytest.mark.parametrize("op,impl", [("rmsnorm", "impls.kernels:rmsnorm_correct"), ("matmul", "impls.kernels:matmul_correct"),
                                     ("softmax", None), ("rope", None)])
def test_a_correct_op_gets_no_cause(op, impl):
    res = run_op(op, impl, "16x512" if op != "matmul" else "32x512x32", "bf16,fp16")
    # every comparison (torch's CPU matmul may change bits with the batch: the contract's line, not a cause)
    assert not any(r["flagged"] for r in res.rows) and res.causes == []
    assert "every comparison within" in res.takeaways[0]
    assert all(not t.startswith(("cpu bf16:", "cpu fp16:", "cpu fp32:")) or "batch" in t for t in res.takeaways[1:])
