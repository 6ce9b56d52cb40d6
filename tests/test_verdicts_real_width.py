"""Verdicts that hold at real width (issue 40, 0): the scale-fit rule's z grows
with the element count, so at SmolLM2's width (hidden 576) a clean f32 GGUF of
a Hugging Face folder fitted s - 1 = 1.6e-8 at z = 54 at its first norm and
was flagged. The rule now also asks for an effect (numerics/divergence's
scale_effect). A random 576-wide Qwen3 (SmolLM2's hidden size) and its exact
f32 GGUF under llama.cpp flag nothing; the same GGUF with 1 % planted on one
MLP's down projection is named there."""

import pytest

from helpers import gguf_layers, need_gguf_engine, planted_gguf_pair, save_char_qwen

pytest.importorskip("transformers")

PROMPT = ["--prompt", "ROMEO:\nIs this the way to the market, good sir? I have walked", "--steps", "8"]
PLANTED = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    need_gguf_engine()
    root = tmp_path_factory.mktemp("w576")
    ref = save_char_qwen(root / "hf", hidden=576, positions=128, seed=0)
    clean, bug = planted_gguf_pair(root, ref, PLANTED, 1.01, "f32")
    return ref, clean, bug


def test_an_exact_f32_gguf_at_width_576_flags_nothing(run, wide):
    ref, clean, _ = wide
    doc = gguf_layers(run, clean, ref, 0, prompt=PROMPT)
    assert doc["first_divergence"] is None and doc["flags"] == []
    assert doc["params"]["quant_view"] is None  # f32 weights: judged by fp32's rounding
    rows = [row for row in doc["rows"] if "fp32" in row["views"]]
    assert len(rows) >= 2 * 5 + 2
    # the fits are there and z is large somewhere (the old false alarm): only the effect gate keeps it silent
    worst = max(rows, key=lambda row: row["views"]["fp32"]["bias_z"])["views"]["fp32"]
    assert abs(worst["scale_fit"] - 1) < 2.0 ** -24, worst  # under one fp32 rounding


def test_a_one_percent_scale_at_width_576_is_named_at_its_module(run, wide):
    ref, _, bug = wide
    doc = gguf_layers(run, bug, ref, 1, prompt=PROMPT)
    assert doc["first_divergence"] == "model.layers.1.mlp"
    row = next(x for x in doc["rows"] if x["module"] == "model.layers.1.mlp")
    assert abs(row["views"]["fp32"]["scale_fit"] - 1.01) < 1e-3
    at = {f["rule"] for f in doc["flags"] if f["view"] == "fp32" and f["module"] == "model.layers.1.mlp"}
    assert "scale_fit" in at and "ratio" in at
    # nothing before it is flagged in fp32
    assert all(f["order"] >= row["order"] for f in doc["flags"] if f["view"] == "fp32")
