"""Inside attention, `compare engine-layers --engine python:... --reference hf:DIR --heads` (issue 40): the user's
independent plain-PyTorch Qwen3 (tests/qwen3_plain.py, 4 query heads over 2 KV heads) gives its softmax
probabilities and per-head outputs under docs/dumps-from-your-engine.md's names; transformers' are hooked.
A 5 % softmax scale makes every head depart; GQA heads tiled instead of interleaved make only heads 1 and 2
depart (the heads whose KV head differs: h // 2 vs h % 2), and the reading names the mapping; the clean
engine flags nothing, head by head included."""

import pytest
from helpers import ROOT, cli, save_tiny_qwen, strict_json

from precisionlab.experiments import layers_heads

pytest.importorskip("transformers")
FACTORY = """import sys
sys.path.insert(0, {tests!r})
from qwen3_user_engine import capturing

def factory(device):
    return capturing({folder!r}, {bug!r}, device)
"""
ATTN0 = "model.layers.0.self_attn"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(save_tiny_qwen(tmp_path_factory.mktemp("heads-qwen3")))


def _run(tmp_path_factory, folder, bug):
    f = tmp_path_factory.mktemp("user") / "my_engine.py"
    f.write_text(FACTORY.format(tests=str(ROOT / "tests"), folder=folder, bug=bug))
    r = cli("compare", "engine-layers", "--engine", f"python:{f}:factory", "--reference", f"hf:{folder}", "--heads",
            "--dtypes", "bf16", "--prompt", "the cat sat on a mat", "--steps", "6", "--json")
    return r, strict_json(r.out) if r.out.strip() else None


def _row(doc, name):
    return next(x for x in doc["rows"] if x["module"] == name)


def test_the_clean_engine_flags_nothing_head_by_head(tmp_path_factory, folder):
    r, doc = _run(tmp_path_factory, folder, None)
    assert r.code == 0, (r.err, doc and doc["flags"][:3])
    assert doc["flags"] == [] and doc["first_divergence"] is None
    for name in (f"{ATTN0}.probs", f"{ATTN0}.heads"):
        row = _row(doc, name)
        assert len(row["per_head"]["fp32"]) == 4
        assert not any(h["departs"] for v in row["per_head"].values() for h in v)
    assert not any("inside attention" in t for t in doc["takeaways"])


def test_a_wrong_softmax_scale_makes_every_head_depart(tmp_path_factory, folder):
    r, doc = _run(tmp_path_factory, folder, "attn_scale")
    assert r.code == 1, r.err
    assert doc["first_divergence"] == f"{ATTN0}.probs"  # inside attention, before its output
    for name in (f"{ATTN0}.probs", f"{ATTN0}.heads"):
        v = _row(doc, name)["views"]["fp32"]
        assert v["heads_departing"] == [0, 1, 2, 3] and v["heads_pattern"] == "all"
    assert any(t.startswith(f"inside attention (fp32): at {ATTN0}.probs, all 4 heads depart") for t in doc["takeaways"])


def test_gqa_heads_tiled_instead_of_interleaved_depart_only_where_the_kv_head_differs(tmp_path_factory, folder):
    assert layers_heads.tiled_heads(4, 2) == [1, 2]  # h // 2 = [0, 0, 1, 1] against h % 2 = [0, 1, 0, 1]
    r, doc = _run(tmp_path_factory, folder, "gqa_tiled")
    assert r.code == 1, r.err
    assert doc["first_divergence"] == f"{ATTN0}.probs"
    for name in (f"{ATTN0}.probs", f"{ATTN0}.heads"):
        row = _row(doc, name)
        v = row["views"]["fp32"]
        assert v["heads_departing"] == [1, 2] and v["heads_pattern"] == "some"
        # the heads that read the right KV head agree to fp32 rounding: within the ratio line, head by head
        assert all(h["ratio"] <= 4 for h in row["per_head"]["fp32"] if h["head"] in (0, 3))
    reading = next(t for t in doc["takeaways"] if t.startswith("inside attention (fp32)"))
    assert "heads 1,2 of 4 depart" in reading and "GQA heads tiled instead of interleaved" in reading


def test_heads_needs_two_models():
    r = cli("compare", "layers", "--heads")  # one model's verb has no --heads: engine-layers' option
    assert r.code == 2 and "--heads" in r.err and "Traceback" not in r.err and r.err.count("\n") == 1


def test_per_head_tensors_in_dumps_are_judged_head_by_head(tmp_path, folder):
    """The dump route (docs/dumps-from-your-engine.md): REF_FP32 and REF_LOW written by scripts/dump_hooks.py
    with heads=True from transformers' eager attention, YOURS the plain engine in bf16 with its GQA heads
    tiled, under the same names in its own layout (no batch axis). compare tensors judges
    <attn>.heads head by head and names the mapping from the heads alone (no KV head count in a dump)."""
    import sys

    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3ForCausalLM

    sys.path.insert(0, str(ROOT / "scripts"))
    from dump_hooks import DumpHooks
    from qwen3_user_engine import capturing

    ids = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 9, 10, 11]
    for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        model = Qwen3ForCausalLM.from_pretrained(folder, dtype=dtype).eval()
        model.set_attn_implementation("eager")
        with torch.no_grad(), DumpHooks(model, ["model.layers.0.self_attn"], heads=True) as dump:
            model(torch.tensor([ids]))
        dump.save(tmp_path / f"{label}.safetensors")
    assert set(dump.tensors) == {f"{ATTN0}.heads", f"{ATTN0}.probs", ATTN0}
    engine = capturing(folder, "gqa_tiled")
    engine.base = engine.base.to(torch.bfloat16)
    got = engine.capture_layers(ids)
    save_file({k: torch.from_numpy(got[k]).to(torch.bfloat16).contiguous() for k in (f"{ATTN0}.heads", f"{ATTN0}.probs")},
              str(tmp_path / "yours.safetensors"))
    r = cli("compare", "tensors", str(tmp_path / "fp32.safetensors"), str(tmp_path / "bf16.safetensors"),
            str(tmp_path / "yours.safetensors"), "--json")
    doc = strict_json(r.out)
    assert r.code == 1, r.err
    rows = {x["name"]: x for x in doc["rows"]}
    for name in (f"{ATTN0}.heads", f"{ATTN0}.probs"):
        assert rows[name]["heads_departing"] == [1, 2], rows[name]["per_head"]
        assert len(rows[name]["per_head"]) == 4
    assert any("GQA heads tiled instead of interleaved" in t for t in doc["takeaways"])
