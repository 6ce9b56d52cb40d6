"""A quantisation yardstick (issue 40, 5): `compare layers --engine
llamacpp:FILE` on a q8_0 GGUF is judged against REF with its weights quantised
as the GGUF holds them (experiments/quant_yardstick), not against fp32's
rounding (which flags every module by 1e5x: q8_0 doing what it should). A
clean q8_0 export of the embedded model is "as close as q8_0 allows" (exit 0);
a 1 % scale planted on one MLP's weights before the q8_0 export is named at
that MLP, and the GGUF tensor that is not REF's weight quantised is listed."""

import pytest

from helpers import embedded_planted_ggufs, gguf_layers

PLANTED = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def q8(tmp_path_factory):
    pytest.importorskip("transformers")
    return embedded_planted_ggufs(tmp_path_factory.mktemp("q8"), PLANTED, 1.01, "q8_0")


def test_a_clean_q8_0_gguf_is_as_close_as_q8_0_allows(run, q8):
    ref, clean, _ = q8
    doc = gguf_layers(run, clean, ref, 0)
    assert doc["params"]["quant_view"] == "q8_0"
    assert doc["first_divergence"] is None and doc["flags"] == []
    rows = [x for x in doc["rows"] if x.get("views")]
    assert len(rows) >= 5 * 5 + 2
    # by fp32's rounding every module would be far beyond 4x: that is what q8_0 costs, shown, not judged
    assert min(x["views"]["fp32"]["ratio"] for x in rows[1:]) > 1e3
    assert all("rule" not in x["views"]["fp32"] for x in rows)
    # against REF quantised the same way, each module within 4x (q8_0's activations add about as much again)
    assert max(x["views"]["q8_0"]["ratio"] for x in rows) < 4
    assert any("what quantisation costs" in t for t in doc["takeaways"])
    assert not any("GGUF tensors are not REF's weights" in n for n in doc["notes"])


def test_a_one_percent_scale_on_top_of_q8_0_is_named_at_its_module(run, q8):
    ref, _, bug = q8
    doc = gguf_layers(run, bug, ref, 1)
    assert doc["first_divergence"] == "model.layers.1.mlp"
    f = next(f for f in doc["flags"] if f["view"] == "q8_0")
    assert f["module"] == "model.layers.1.mlp" and f["rule"] in ("ratio", "scale_fit")
    row = next(x for x in doc["rows"] if x["module"] == "model.layers.1.mlp")
    assert abs(row["views"]["q8_0"]["scale_fit"] - 1.01) < 3e-3
    assert all(f["order"] >= row["order"] for f in doc["flags"])  # nothing upstream of it
    assert any("GGUF tensors are not REF's weights" in n and PLANTED in n for n in doc["notes"])


def test_the_view_is_made_for_block_quantised_ggufs_only(q8, tmp_path):
    """F16/BF16 weights make llama.cpp round the activations to that type as well, which REF with rounded
    weights does not model: those engines keep the fp32 and low-dtype views (quant_yardstick.FLOAT_TYPES)."""
    from precisionlab.engines.exporters import gguf
    from precisionlab.experiments import quant_yardstick

    ref, clean, _ = q8
    assert quant_yardstick.plan(f"llamacpp:{clean},kv=f32").view == "q8_0"
    gguf.write(str(ref), str(tmp_path / "b.gguf"), "bf16")
    gguf.write(str(ref), str(tmp_path / "f.gguf"), "f32")
    assert quant_yardstick.plan(f"llamacpp:{tmp_path / 'b.gguf'}") is None
    assert quant_yardstick.plan(f"llamacpp:{tmp_path / 'f.gguf'},kv=f32") is None
    assert quant_yardstick.plan(f"hf:{ref}") is None
