"""`compare engine-layers --engine llamacpp:` on SmolLM2-135M-Instruct (make smollm2; skipped where it is not
cached), a real trained model (issue 40): (a) an F32 GGUF exported from the fp32 folder, run with an f32 KV
cache, flags nothing (exit 0), head by head included (--heads); (b) the original Q4_1 file against that folder leaves REF fp32 at the first
quantised matmul (the first attention), which the quantisation yardstick calls what Q4_1 costs (exit 0);
(c) a 1 % scale planted on top of one quantised tensor (its blocks' scales and minimums, edited in a copy
of the file through the gguf package) is still named at its module. Short runs: 8 tokens."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import strict_json

SMOL = Path(os.environ.get("PRECISIONLAB_CACHE") or Path.home() / ".cache" / "precisionlab") / "smollm2"
SMOL_GGUF, SMOL_HF = SMOL / "SmolLM2-135M-Instruct.Q4_1.gguf", SMOL / "hf"
needs_smol = pytest.mark.skipif(not (SMOL_GGUF.is_file() and (SMOL_HF / "config.json").is_file()),
                                reason="SmolLM2 not cached: make smollm2")
PLANTED, PLANTED_MODULE = "blk.3.ffn_down.weight", "model.layers.3.mlp"
RUN = ["--reference", f"hf:{SMOL_HF}", "--steps", "4", "--dtypes", "bf16", "--json"]


@pytest.fixture(autouse=True)
def _engines():
    pytest.importorskip("transformers")
    pytest.importorskip("llama_cpp", reason="llama.cpp's engine needs llama-cpp-python (precisionlab[engines])")
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package (precisionlab[engines])")


def _layers(run, spec, *more):
    r = run("compare", "engine-layers", "--engine", spec, *RUN, *more)
    return r, strict_json(r.out) if r.out.strip() else None


def plant_q4_1_scale(src: Path, dst: Path, tensor: str, scale: float) -> None:
    """A copy of a GGUF with one Q4_1 tensor scaled: each block is d * q + m (d, m half precision, then 16
    bytes of 4-bit q), so d and m times `scale` scale every value (to half precision's rounding of d, m)."""
    import gguf

    shutil.copyfile(src, dst)
    reader = gguf.GGUFReader(dst, "r+")
    t = next(t for t in reader.tensors if t.name == tensor)
    assert t.tensor_type == gguf.GGMLQuantizationType.Q4_1
    blocks = t.data.reshape(-1, 20)
    blocks[:, :4].view(np.float16)[:] *= np.float16(scale)
    reader.data.flush()


@needs_smol
def test_an_f32_gguf_with_an_f32_cache_flags_nothing(run, tmp_path):
    f32 = tmp_path / "smol-f32.gguf"
    assert run("export", f"hf:{SMOL_HF}", "--to", "gguf:f32", "--out", str(f32)).code == 0
    r, doc = _layers(run, f"llamacpp:{f32},kv=f32", "--heads")
    assert r.code == 0, (r.err, doc and doc["flags"][:3])
    assert doc["flags"] == [] and doc["first_divergence"] is None
    rows = [x for x in doc["rows"] if x.get("views")]
    # every block's norms, attention (and inside it, llama.cpp's kqv_out per head), MLP and output; the final
    # norm, the head
    assert len(rows) == 30 * 6 + 2
    assert max(x["views"]["fp32"]["ratio"] for x in rows) < 4
    heads = [h for x in rows if x["kind"] == "heads" for h in x["per_head"]["fp32"]]
    assert len(heads) == 30 * 9 and not any(h["departs"] for h in heads)


@needs_smol
def test_the_q4_1_file_departs_at_the_first_quantised_matmul_as_quantisation(run):
    r, doc = _layers(run, f"llamacpp:{SMOL_GGUF}")
    assert r.code == 0, (r.err, doc and doc["flags"][:3])
    assert doc["params"]["quant_view"] == "q4_1" and doc["flags"] == []
    departs = doc["params"]["quant_departs_at"]
    assert departs["module"] == "model.layers.0.self_attn"   # q_proj: the first Q4_1 matmul
    assert departs["fp32_ratio"] > 1e3 and departs["quant_ratio"] < 4
    first = next(x for x in doc["rows"] if x["module"] == "model.layers.0.input_layernorm")
    assert first["views"]["fp32"]["ratio"] < 4                # before it, fp32's rounding
    assert any("It leaves REF fp32 first at model.layers.0.self_attn" in t for t in doc["takeaways"])
    # the folder was made from this file: every tensor is REF's weight quantised the same way (q/k permuted)
    assert not any("GGUF tensors are not REF's weights" in n for n in doc["notes"])


@needs_smol
def test_a_one_percent_scale_on_a_q4_1_tensor_is_named_at_its_module(run, tmp_path):
    bug = tmp_path / "smol-q4_1-bug.gguf"
    plant_q4_1_scale(SMOL_GGUF, bug, PLANTED, 1.01)
    r, doc = _layers(run, f"llamacpp:{bug}")
    assert r.code == 1, r.err
    assert doc["first_divergence"] == PLANTED_MODULE
    row = next(x for x in doc["rows"] if x["module"] == PLANTED_MODULE)
    assert all(f["order"] >= row["order"] for f in doc["flags"])  # nothing upstream of it
    assert abs(row["views"]["q4_1"]["scale_fit"] - 1.01) < 3e-3
    assert any("GGUF tensors are not REF's weights" in n and "model.layers.3.mlp.down_proj.weight" in n
               for n in doc["notes"])
