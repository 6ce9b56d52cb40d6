"""numerics/divergence.py: each rule fires on a case built to fire it and stays
silent on one built not to, against hand-computed float64 values."""

import math

import numpy as np
import pytest

from precisionlab.numerics import divergence as dv
from precisionlab.numerics.compare import RATIO_THRESHOLD


# --- scale_fit ------------------------------------------------------------------------------


def test_scale_fit_of_an_exact_scale():
    t = np.array([1.0, -2.0, 3.0, -4.0])
    y = 1.25 * t  # exact in binary: s = 1.25 exactly
    s, z = dv.scale_fit(y, t, 0.01)
    assert s == 1.25
    # z = |s - 1| / (yard / sqrt(n)) = 0.25 / (0.01 / 2) = 50
    assert z == pytest.approx(50.0, rel=1e-15)


def test_scale_fit_of_unbiased_noise_is_one():
    t = np.array([1.0, 1.0, 1.0, 1.0])
    y = np.array([1.5, 0.5, 1.5, 0.5])  # y.t = 4 = t.t: no scale at all
    assert dv.scale_fit(y, t, 0.5) == (1.0, 0.0)


def test_scale_fit_ignores_non_finite_and_degenerate_cases():
    t = np.array([2.0, np.inf, 4.0])
    y = np.array([3.0, 1.0, 6.0])  # over the finite pairs y = 1.5 t
    s, z = dv.scale_fit(y, t, 0.1)
    assert s == 1.5 and z == pytest.approx(0.5 / (0.1 / math.sqrt(2)), rel=1e-15)
    assert dv.scale_fit(y, np.zeros(3), 0.1) == (1.0, 0.0)      # all-zero reference
    assert dv.scale_fit(y, t, 0.0) == (1.0, 0.0)                # zero yardstick
    assert dv.scale_fit(y, t, math.inf) == (1.0, 0.0)           # the precision overflowed
    assert dv.scale_fit(np.array([2.0]), np.array([1.0]), 0.1) == (1.0, 0.0)  # one element


# --- overflow ------------------------------------------------------------------------------------


def test_overflow_counts_only_where_the_reference_is_finite():
    ref = np.array([1.0, np.inf, 3.0, 4.0, np.nan])
    side = np.array([np.inf, np.inf, -np.inf, np.nan, np.nan])
    assert dv.overflow_count(ref, side) == 3      # the inf and NaN where ref is inf/NaN are not overflow
    assert dv.overflow_split(ref, side) == (2, 1)
    assert dv.overflow_count(ref, ref) == 0
    rows = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert list(dv.overflow_count(rows, np.array([[np.inf, 2.0], [np.inf, np.inf]]), axis=1)) == [1, 2]


def test_overflow_flag_fires_and_stays_silent():
    f = dv.judge_tensor(0.0, 0.01, overflow=(3, 0))
    assert [x.rule for x in f] == ["overflow"] and f[0].text == "overflow: 3 inf where REF is finite"
    assert dv.judge_tensor(0.0, 0.01, overflow=(2, 1))[0].text == "overflow: 2 inf, 1 NaN where REF is finite"
    assert dv.judge_tensor(0.0, 0.01, overflow=(0, 0)) == []


# --- ratio --------------------------------------------------------------------------------------


def test_ratio_rule_names_its_number():
    f = dv.judge_tensor(0.063, 0.01)  # 6.3x
    assert [x.rule for x in f] == ["ratio"] and f[0].text == "beyond 4x: 6.3x"
    assert f[0].value == pytest.approx(6.3, rel=1e-15)
    assert dv.judge_tensor(0.04, 0.01) == []  # exactly 4x is not beyond
    assert dv.judge_tensor(0.5, 0.0)[0].text == "beyond 4x: infx"  # a difference where rounding costs nothing
    assert dv.judge_tensor(1.0, 1.0, ratio=RATIO_THRESHOLD + 1)[0].value == RATIO_THRESHOLD + 1  # caller's ratio


# --- scale_fit as a rule ---------------------------------------------------------------------------


def test_scale_rule_fires_with_s_and_z():
    f = dv.judge_tensor(0.012, 0.01, scale=(1.0057, 88.4))
    assert [x.rule for x in f] == ["scale_fit"] and f[0].text == "YOURS = 1.0057 x REF_LOW, z = 88"
    assert dv.judge_tensor(0.012, 0.01, scale=(1.0057, 88.4), against="clean")[0].text.endswith("x clean, z = 88")


def test_scale_rule_stays_silent_under_z_or_under_the_effect_gate():
    assert dv.judge_tensor(0.012, 0.01, scale=(1.0057, dv.BIAS_Z)) == []       # z not beyond BIAS_Z
    # z huge (millions of elements) but |s - 1| = 4e-3 under half the measured rounding error 0.01
    assert dv.judge_tensor(0.012, 0.01, scale=(1.004, 500.0)) == []
    assert dv.judge_tensor(0.012, 0.01, scale=(1.006, 500.0))[0].rule == "scale_fit"
    assert dv.judge_tensor(0.012, 0.01, scale=(0.994, 500.0))[0].rule == "scale_fit"  # either direction


def test_a_scale_under_one_rounding_of_the_format_is_no_effect():
    """issue 40, 0: a clean f32 GGUF of a 576-wide model under llama.cpp fits s - 1 = 1.6e-8 at z = 54 at its
    first norm, against an fp32 yardstick of 5.8e-8. One fp32 rounding is 2^-24 = 6.0e-8: a constant rounded
    apart on the way gives that much, so no flag; the same z with s - 1 = 1e-6 (17 roundings) is one."""
    u32 = dv.rounding("fp32")
    assert u32 == 2.0 ** -24
    assert dv.judge_tensor(6.0e-8, 5.8e-8, scale=(1 + 1.6e-8, 54.0), rounding=u32) == []
    assert dv.judge_tensor(6.0e-8, 5.8e-8, scale=(1 + 1e-6, 54.0), rounding=u32)[0].rule == "scale_fit"
    # the floor is the larger of the two: a bf16 yardstick far under bf16's rounding still needs one rounding
    ubf = dv.rounding("bf16")
    assert dv.scale_effect(1e-4, ubf) == ubf == 2.0 ** -8
    assert dv.judge_tensor(3e-4, 1e-4, scale=(1.003, 500.0), rounding=ubf) == []
    assert dv.judge_tensor(3e-4, 1e-4, scale=(1.005, 500.0), rounding=ubf)[0].rule == "scale_fit"


def test_the_effect_gate_does_not_move_with_the_element_count():
    """z grows as sqrt(n) for a fixed systematic scale; the effect gate must not: the same s and yardstick
    are judged the same at 128 and at 20736 elements, flagged or not by |s - 1| alone once z is past."""
    rng = np.random.default_rng(0)
    for n in (4096, 20736, 200_000):
        t = rng.standard_normal(n)
        noise = 1e-7 * rng.standard_normal(n) * np.abs(t)
        y_small, y_big = t * (1 + 2e-8) + noise, t * (1 + 3e-6) + noise
        yard = float(np.linalg.norm(noise) / np.linalg.norm(t))
        for y, want in ((y_small, []), (y_big, ["scale_fit"])):
            s, z = dv.scale_fit(y, t, yard)
            got = [f.rule for f in dv.judge_tensor(yard, yard, scale=(s, max(z, 2 * dv.BIAS_Z)),
                                                   rounding=dv.rounding("fp32"))]
            assert got == want, (n, s, z)


def test_flags_come_in_rule_order():
    f = dv.judge_tensor(0.1, 0.01, scale=(1.05, 100.0), overflow=(1, 0))
    assert [x.rule for x in f] == ["overflow", "ratio", "scale_fit"]
    assert dv.row_fields(f)["rule"] == "overflow" and dv.row_fields([]) == {
        "flagged": False, "rule": None, "reason": None, "flags": []}


# --- order rules --------------------------------------------------------------------------------


def _rows(diffs, ratios):
    return [dv.Judged(f"t{i}", d, r) for i, (d, r) in enumerate(zip(diffs, ratios, strict=True))]


def test_first_to_differ_after_bit_identical_tensors():
    rows = _rows([0.0, 0.0, 0.0, 3e-3, 4e-3], [0.0, 0.0, 0.0, 1.5, 1.6])
    d = dv.first_divergence(rows)
    assert d.name == "t3" and d.flag.rule == "first_differs"
    assert d.flag.text == "first to differ (3 upstream bit-identical)"
    assert not rows[4].flags  # one row at most


def test_first_to_differ_stays_silent():
    # at the very first tensor nothing upstream vouches for the inputs
    assert dv.first_divergence(_rows([3e-3, 3e-3], [1.5, 1.5])) is None
    # an honest kernel on bit-identical inputs differs by a fraction of the rounding
    assert dv.first_divergence(_rows([0.0, 0.0, 4e-4, 5e-4], [0.0, 0.0, 0.1, 0.1])) is None
    assert dv.first_divergence(_rows([0.0, 0.0, 0.0], [0.0, 0.0, 0.0])) is None  # a clean copy


def test_first_jump():
    rows = _rows([1e-3, 1.1e-3, 1.32e-2, 2e-2], [1.0, 1.0, 1.5, 1.5])
    d = dv.first_divergence(rows)
    # 1.32e-2 / 1.1e-3 = 12 (in float64 11.999999999999998; shown as 12)
    assert d.name == "t2" and d.flag.rule == "first_jump" and d.flag.text == "first jump: rel-L2 12x the tensor before"
    assert d.flag.value == pytest.approx(12.0, rel=1e-14)


def test_first_jump_stays_silent():
    assert dv.first_divergence(_rows([1e-3, 9.9e-3, 9e-2], [1.0, 1.0, 1.0])) is None  # 9.9x, then 9.09x
    # an honest jump (ratio under 1) does not count and does not use the rule up
    rows = _rows([1e-5, 3e-3, 3.5e-3, 5e-2], [0.1, 0.5, 1.2, 2.0])
    d = dv.first_divergence(rows)
    assert d.name == "t3" and d.flag.rule == "first_jump" and "14.3x" in d.flag.text
    assert not rows[1].flags


def test_per_tensor_flags_come_before_order_flags_and_name_the_first():
    rows = _rows([0.0, 3e-3, 0.1], [0.0, 1.5, 40.0])
    rows[2].flags = dv.judge_tensor(0.1, 2.5e-3)
    rows[1].flags = dv.judge_tensor(3e-3, 2e-3, scale=(1.005, 60.0))
    d = dv.first_divergence(rows)
    assert d.name == "t1" and d.flag.rule == "scale_fit"
    assert [f.rule for f in rows[1].flags] == ["scale_fit", "first_differs"]
    assert d.as_dict()["text"] == "YOURS = 1.0050 x REF_LOW, z = 60"


def test_the_fit_spreads_over_rows_where_rounding_is_one_factor_per_row():
    """A norm rounds one factor per row; with one row carrying most of the norm (a trained model's first
    token) the fit's spread is a few rows', not n elements': per-row factors of a few fp32 roundings give no
    verdict, where the element spread alone gives z in the hundreds. The same scale on every row keeps z large."""
    rng = np.random.default_rng(1)
    t = rng.standard_normal((8, 576))
    t[0] *= 30.0                                  # the massive first row: about 93 % of the norm
    u = 2.0 ** -24
    factors = 1 + 4 * u * rng.standard_normal((8, 1))
    y = t * factors
    yard = float(np.linalg.norm(y - t) / np.linalg.norm(t))
    s, z = dv.scale_fit(y, t, yard)
    assert abs(s - 1) / (yard / math.sqrt(t.size)) > dv.BIAS_Z  # what the element spread alone would call it
    assert z < 3
    s, z = dv.scale_fit(t * 1.01 * factors, t, yard)
    assert s == pytest.approx(1.01, rel=1e-6) and z > 1e3
    assert dv.row_spread(y[0], t[0], s) == 0.0     # one row: the element spread stands alone
