"""Two-way compare logits (issue 40): it states a verdict where two files can
give one (both runs in one precision: beyond that precision's rounding is
not rounding) or says in one line why it cannot; and a -inf logit in YOURS
where REF is finite is probability mass removed (a masked token), not an
overflow (docs/compare-model.md: an overflow is inf or NaN)."""

import numpy as np
import pytest
from helpers import cli, strict_json

from precisionlab.io import logits_file

N, V = 64, 50


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("twoway")
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((N, V)) * 3.0
    tok = rng.integers(0, V, N)
    # one fp32 rounding of each logit: what two orderings of one computation give at most, and less
    rounded = (ref * (1 + np.float64(2.0 ** -24) * rng.choice([-1, 1], ref.shape))).astype(np.float32)
    shifted = ref.copy()
    shifted[np.arange(N), tok] += 0.0056  # a difference no fp32 rounding makes (issue 40: 0.0056 nats)
    masked = ref.copy()
    masked[[2, 7], 4] = -np.inf
    out = {}
    for name, x, dtype in (("ref", ref, "fp32"), ("rounded", rounded, "fp32"), ("bug", shifted, "fp32"),
                           ("bf16", ref, "bf16"), ("masked", masked, "fp32")):
        p = str(d / f"{name}.safetensors")
        logits_file.write(p, x.astype(np.float32), tok, {"dtype": dtype})
        out[name] = p
    return out


def _yours(f, name):
    r = cli("compare", "logits", f["ref"], f[name], "--json")
    return r, strict_json(r.out)


def test_two_fp32_runs_beyond_rounding_are_called_so(files):
    r, d = _yours(files, "bug")
    y = d["rows"][0]
    assert y["verdict"] == "beyond rounding" and "not rounding" in y["verdict_note"]
    assert any(t.startswith("Verdict: REF and YOURS are both fp32 and differ beyond") for t in d["takeaways"])
    r, d = _yours(files, "rounded")
    assert d["rows"][0]["verdict"] == "rounding", d["rows"][0]


def test_no_verdict_is_one_line_saying_why(files):
    r, d = _yours(files, "bf16")
    y = d["rows"][0]
    assert y["verdict"] is None and y["verdict_note"].startswith("No verdict") and "REF_LOW" in y["verdict_note"]
    assert "\n" not in y["verdict_note"]


def test_a_minus_inf_where_ref_is_finite_is_mass_removed_not_overflow(files):
    r, d = _yours(files, "masked")
    assert r.code == 0, r.err
    y = d["rows"][0]
    assert y["nonfinite_positions"] == 0 and y["mass_removed_positions"] == 2
    assert y["first_mass_removed_positions"] == [2, 7] and y["mass_removed_entries"] == 2
    assert any("probability mass removed" in t for t in d["takeaways"])
    assert not any("overflow" in t and "mass" not in t for t in d["takeaways"])


def test_the_two_way_footnote_explains_only_the_columns_printed(files):
    """Two files have no REF_LOW: the table has no ratio column, and its footnote names none (issue 40, 3)."""
    r = cli("compare", "logits", files["ref"], files["bug"])
    assert "KLD: KL(P_REF || P_side)" in r.out + r.err
    for absent in ("YOURS / REF_LOW", "(n): too few", "! beyond 4x"):
        assert absent not in r.out + r.err, absent
