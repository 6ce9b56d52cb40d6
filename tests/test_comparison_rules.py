"""numerics/compare.py, the one owner of the comparison rules: its tolerance
table, the override rule, rel-L2, the ratio and the verdict, checked against
independent references; compare op and compare tensors judging by the same
numbers; and no other module defining its own copy."""

import ast
import math
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import mpmath
import numpy as np
import pytest

from helpers import ROOT, cli, strict_json
from precisionlab.errors import UsageError
from precisionlab.numerics import compare as comparison

# The formats compare op can judge (fp32 in rows (0)/(1), the rest as --dtype);
# fp64 is only ever compare op's reference, never a row's format.
OP_FORMATS = ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1")
ML_DTYPES = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
             "fp6_e2m3": ml_dtypes.float6_e2m3fn, "fp6_e3m2": ml_dtypes.float6_e3m2fn,
             "fp4_e2m1": ml_dtypes.float4_e2m1fn}


# --- the tolerance table -------------------------------------------------------------------


def test_table_is_torch_testing_for_the_formats_torch_has():
    import torch
    from torch.testing._comparison import default_tolerances

    for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32),
                     ("fp64", torch.float64)):
        assert comparison.tolerances(name) == default_tolerances(torch.empty(0, dtype=dt))


def test_low_bit_formats_get_their_spacing_at_one():
    # torch has no entry (it would compare with rtol = atol = 0). The rule:
    # rtol = eps = 2^(1-p), here from ml_dtypes' own finfo, atol 1e-5.
    for name, dt in ML_DTYPES.items():
        assert comparison.tolerances(name) == (float(ml_dtypes.finfo(dt).eps), 1e-5)
    assert comparison.tolerances("fp8_e4m3") == (0.125, 1e-5)
    assert comparison.tolerances(None) == (0.0, 0.0)  # integers: exact


def test_every_catalog_format_has_a_row():
    from precisionlab.catalog import formats

    assert set(comparison.tolerance_formats()) == set(formats.FORMATS) >= set(OP_FORMATS) | {"fp64"}
    for name in comparison.tolerance_formats():
        rtol, atol = comparison.tolerances(name)
        assert 0 < rtol < 1 and 0 < atol


# --- the override rule -----------------------------------------------------------------------


def test_override_both_or_neither():
    assert comparison.resolve("bf16", None, None) == comparison.tolerances("bf16")
    assert comparison.resolve("bf16", 0.0, 0.0) == (0.0, 0.0)
    assert comparison.resolve(None, 1e-3, 2e-3) == (1e-3, 2e-3)
    for rtol, atol, word in ((None, 1e-3, "--atol"), (1e-3, None, "--rtol")):
        with pytest.raises(UsageError, match=f"Both --rtol and --atol must be either specified or omitted.*{word}"):
            comparison.check_override(rtol, atol)
    for bad in (math.nan, math.inf, -math.inf, -1e-3):
        for rtol, atol in ((bad, 1e-3), (1e-3, bad), (bad, None), (None, bad)):
            with pytest.raises(UsageError, match="must be a finite number >= 0"):
                comparison.check_override(rtol, atol)


# --- rel-L2 ----------------------------------------------------------------------------------


def _reference_rel_l2(x, ref) -> float:
    """||x - ref|| / ||ref|| in 60-digit mpmath from the exact rationals, then rounded to a double."""
    with mpmath.workdps(60):
        num = sum((Fraction(float(a)) - Fraction(float(b))) ** 2 for a, b in zip(x, ref, strict=True))
        den = sum(Fraction(float(b)) ** 2 for b in ref)
        return float(mpmath.sqrt(mpmath.mpf(num.numerator) / num.denominator / (mpmath.mpf(den.numerator) / den.denominator)))


def test_rel_l2_of_known_vectors():
    assert comparison.rel_l2(np.array([3.75, 5.0]), np.array([3.0, 4.0])) == 0.25   # ||(.75, 1)|| / 5
    assert comparison.rel_l2(np.array([1e200, 3e200]) * 2, np.array([1e200, 3e200])) == 1.0   # no overflow
    assert comparison.rel_l2(np.array([3e-200, 4e-200]), np.array([3e-200, 4e-200]) * 2) == 0.5   # no underflow
    rng = np.random.default_rng(7)
    for n in (1, 5, 1000):
        ref = rng.standard_normal(n)
        x = ref + rng.standard_normal(n) * 1e-3
        assert comparison.rel_l2(x, ref) == _reference_rel_l2(x, ref)
        assert comparison.rel_l2(x.astype(np.float32), ref) == _reference_rel_l2(x.astype(np.float32), ref)


def test_nan_never_agrees():
    nan, inf = math.nan, math.inf
    assert comparison.rel_l2(np.array([nan, 1.0]), np.array([nan, 1.0])) == inf
    assert comparison.rel_l2(np.array([nan, 1.0]), np.array([nan, 1.0]), equal_nan=True) == 0.0
    assert comparison.rel_l2(np.array([1.0, 2.0]), np.array([nan, 2.0])) == inf     # never NaN itself
    assert comparison.rel_l2(np.array([nan, 2.0]), np.array([1.0, 2.0]), equal_nan=True) == inf
    # the same infinity agrees (as in torch.testing) and adds nothing; the finite rest is measured
    assert comparison.rel_l2(np.array([inf, 3.75, 5.0]), np.array([inf, 3.0, 4.0])) == 0.25
    assert comparison.rel_l2(np.array([-inf, 1.0]), np.array([inf, 1.0])) == inf
    assert comparison.rel_l2(np.array([inf, 1.0]), np.array([1.0, 1.0])) == inf


def test_all_zero_reference():
    assert comparison.rel_l2(np.zeros(3), np.zeros(3)) == 0.0
    assert comparison.rel_l2(np.array([0.0, 5e-324, 0.0]), np.zeros(3)) == math.inf   # never a huge number
    assert comparison.rel_l2(np.zeros(0), np.zeros(0)) == 0.0


# --- the ratio and the verdict -----------------------------------------------------------------


def test_ratio_and_its_zero_yardstick():
    assert comparison.ratio(2e-3, 1e-3) == 2.0
    assert comparison.ratio(0.0, 0.0) == 0.0              # the precision costs nothing, and nothing was added
    assert comparison.ratio(1e-300, 0.0) == math.inf      # ... and something was
    assert comparison.ratio(math.inf, 1e-3) == math.inf
    assert comparison.ratio(math.nan, 1e-3) == math.inf   # NaN agrees with nothing
    assert comparison.ratio(1e-3, math.inf) == 0.0        # the yardstick itself overflowed
    assert comparison.RATIO_THRESHOLD == 4.0
    assert comparison.judge(4e-3, 1e-3) == (4.0, False)   # at the threshold: rounding
    assert comparison.judge(4.0000001e-3, 1e-3)[1] and comparison.judge(1e-3, 0.0) == (math.inf, True)


# --- compare op and compare tensors: the same numbers, the same refusal -----------------------


def test_compare_op_and_compare_tensors_judge_with_the_same_tolerances(tmp_path):
    r = cli("compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--cases", "random",
            "--dtypes", ",".join(f for f in OP_FORMATS if f != "fp32"), "--json")
    assert r.code in (0, 1), r.err
    op = {}
    for row in strict_json(r.out)["rows"]:
        op.setdefault(row["dtype"], set()).add((row["rtol"], row["atol"]))
    assert set(op) == set(OP_FORMATS)
    x = np.linspace(-1, 1, 16)
    np.save(tmp_path / "a.npy", x)                 # float64: the higher-precision side
    np.save(tmp_path / "b.npy", x.astype(np.float32))
    for name in OP_FORMATS:
        r = cli("compare", "tensors", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--dtypes", f"-,{name}", "--json")
        assert r.code in (0, 1), r.err
        row = strict_json(r.out)["rows"][0]
        assert row["tolerance_format"] == name
        assert op[name] == {(row["rtol"], row["atol"])} == {comparison.tolerances(name)}, name


@pytest.mark.parametrize("half", [("--atol", "1e-3"), ("--rtol", "1e-3")])
def test_half_specified_tolerance_is_refused_by_both(tmp_path, half):
    # --rtol/--atol are old spellings folded into --tol (cli/aliases.py): half a pair keeps its refusal
    np.save(tmp_path / "a.npy", np.ones(4))
    for args in (("compare", "op", "softmax", "--shape", "2x8", "--device", "cpu"),
                 ("compare", "tensors", str(tmp_path / "a.npy"), str(tmp_path / "a.npy"))):
        r = cli(*args, *half)
        lines = r.err.strip().splitlines()
        assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, (args, r.err)
        assert "Both --rtol and --atol must be either specified or omitted" in lines[0] and half[0] in lines[0]
    r = cli("compare", "tensors", str(tmp_path / "a.npy"), str(tmp_path / "a.npy"), "--tol", "0,1e-3", "--json")
    assert r.code == 0 and (strict_json(r.out)["rows"][0]["rtol"], strict_json(r.out)["rows"][0]["atol"]) == (0, 1e-3)


# --- one definition each ------------------------------------------------------------------------

OWNED_FUNCTIONS = {"rel_l2", "_rel_l2", "_rel_rmse", "ratio", "_ratio", "tolerances", "default_tolerances",
                   "check_tolerance", "nonfinite_split"}
OWNED_CONSTANTS = {"RATIO_THRESHOLD", "ASSERT_CLOSE_DEFAULTS"}


def test_each_rule_is_defined_once():
    owner = Path("precisionlab/numerics/compare.py")
    found = []
    for path in sorted((ROOT / "precisionlab").rglob("*.py")):
        rel = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in OWNED_FUNCTIONS:
                found.append((rel, node.name))
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            found += [(rel, t.id) for t in targets if isinstance(t, ast.Name) and t.id in OWNED_CONSTANTS]
    assert sorted(n for p, n in found if p == owner) == ["ASSERT_CLOSE_DEFAULTS", "RATIO_THRESHOLD", "ratio",
                                                         "rel_l2", "tolerances"]
    assert [(str(p), n) for p, n in found if p != owner] == []
