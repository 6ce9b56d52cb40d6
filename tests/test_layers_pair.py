"""compare engine-layers: two models on the same tokens, module
by module. A bug planted in a COPY of a tiny Qwen3 built at test time (a 0.5 %
scale in one MLP, a wrong RMSNorm eps, RoPE in bf16, a skipped q/k norm) is
named at its module with the rule that fired and its number; the clean copy
flags nothing; one model's --layers on the bug copy still runs as before (it
cannot see a bug that is in both its runs); --plot is written or refused."""

import json
import shutil

import pytest

from helpers import ROOT, embedded_planted_ggufs, gguf_layers, save_tiny_qwen, strict_json

pytest.importorskip("transformers")

PROMPT = ["--prompt", "the cat sat", "--steps", "12"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_qwen(tmp_path_factory.mktemp("ref") / "ref", hidden=32, layers=3)


def _copy(base, tmp_path, name, weights=None, config=None):
    """A copy of the model folder, with weights[tensor] multiplied in and config keys replaced."""
    from safetensors.torch import load_file, save_file

    dst = tmp_path / name
    shutil.copytree(base, dst)
    if weights:
        st = dst / "model.safetensors"
        tensors = load_file(st)
        for k, f in weights.items():
            tensors[k] = tensors[k] * f
        save_file(tensors, st, metadata={"format": "pt"})
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _pair(run, yours, base, *extra):
    r = run("compare", "engine-layers", "--engine", f"hf:{yours}", "--reference", f"hf:{base}", "--dtypes",
            "bf16", *PROMPT, *extra, "--json")
    return r, strict_json(r.out) if r.out.strip() else None


def _first_flag(doc, view):
    return next(f for f in doc["flags"] if f["view"] == view)


def test_the_clean_copy_flags_nothing(run, base, tmp_path):
    r, doc = _pair(run, _copy(base, tmp_path, "clean"), base)
    assert r.code == 0, r.err
    assert doc["first_divergence"] is None and doc["flags"] == []
    assert doc["params"]["compared"] == len(doc["rows"]) >= 3 * 6
    assert all(row["views"]["fp32"]["error"] == 0 for row in doc["rows"])  # the same weights, the same order
    assert doc["missing"] == {"only_reference": [], "only_yours": []}


def test_a_half_percent_scale_in_one_mlp_is_named_there(run, base, tmp_path):
    bug = _copy(base, tmp_path, "scaled", weights={"model.layers.1.mlp.down_proj.weight": 1.005})
    r, doc = _pair(run, bug, base)
    assert r.code == 1, r.err
    assert doc["first_divergence"] == "model.layers.1.mlp"
    f32 = _first_flag(doc, "fp32")
    # fp32 vs fp32: a 0.5 % error over fp32's own rounding (~1e-7) is tens of thousands of times it
    assert f32["module"] == "model.layers.1.mlp" and f32["rule"] == "ratio" and f32["value"] > 1e3
    row = next(r for r in doc["rows"] if r["module"] == "model.layers.1.mlp")
    at = {f["rule"]: f for f in doc["flags"] if f["view"] == "fp32" and f["module"] == "model.layers.1.mlp"}
    assert set(at) == {"ratio", "scale_fit", "first_differs"}
    assert at["first_differs"]["value"] == row["order"] and "upstream bit-identical" in at["first_differs"]["text"]
    assert "YOURS = 1.0050 x REF" in at["scale_fit"]["text"] and at["scale_fit"]["value"] > 1e3
    assert abs(row["views"]["fp32"]["scale_fit"] - 1.005) < 1e-4
    # every module before it is exactly REF's
    assert all(r["views"]["fp32"]["error"] == 0 for r in doc["rows"] if r["order"] < row["order"])
    # bf16's three-way view: under 4x its rounding and its scale fit's z under 20 on 36 tokens x 32 wide;
    # only the order rule names it (the first module to differ after bit-identical ones, by over one
    # bf16 rounding), while the fp32 view reads it at 1e4x
    assert row["views"]["bf16"]["ratio"] < 4 and doc["first_divergence_by_view"]["bf16"] == "model.layers.1.mlp"
    assert [f["rule"] for f in doc["flags"] if f["view"] == "bf16" and f["module"] == row["module"]] == \
        ["first_differs"]
    assert abs(row["views"]["bf16"]["scale_fit"] - 1.005) < 1e-3


def test_a_wrong_rmsnorm_eps_is_named_at_the_first_norm(run, base, tmp_path):
    bug = _copy(base, tmp_path, "eps", config={"rms_norm_eps": 1e-2})
    r, doc = _pair(run, bug, base)
    assert r.code == 1, r.err
    assert doc["first_divergence"] == "model.layers.0.input_layernorm"
    f = _first_flag(doc, "fp32")
    assert f["module"] == "model.layers.0.input_layernorm" and f["rule"] == "ratio" and f["value"] > 1e3


class _Planted:
    """An hf engine whose base model carries one bug (set by the test)."""
    bug = None

    @classmethod
    def make(cls, bug):
        from precisionlab.engines.hf import HFEngine

        class Buggy(HFEngine):
            def __init__(self, arg, device):
                super().__init__(arg, device)
                bug(self.base)

        return Buggy


def _rope_in_bf16(model):
    import torch

    from precisionlab.engines import hooks

    hooks._hf_rope_in(model.model.rotary_emb, torch.bfloat16)


def _skip_q_norm(model):
    model.model.layers[1].self_attn.q_norm.forward = lambda x: x


@pytest.mark.parametrize("bug, module", [(_rope_in_bf16, "model.rotary_emb"),
                                         (_skip_q_norm, "model.layers.1.self_attn.q_norm")])
def test_rope_in_bf16_and_a_skipped_q_norm_are_named(run, base, tmp_path, bug, module):
    from precisionlab.engines import registry

    registry.register("planted", _Planted.make(bug))
    try:
        r = run("compare", "engine-layers", "--engine", f"planted:{_copy(base, tmp_path, 'c')}", "--reference",
                f"hf:{base}", "--dtypes", "bf16", *PROMPT, "--json")
    finally:
        registry.unregister("planted")
    assert r.code == 1, r.err
    doc = strict_json(r.out)
    assert doc["first_divergence"] == module
    f = _first_flag(doc, "fp32")
    assert f["module"] == module and f["rule"] in ("ratio", "scale_fit") and float(f["value"]) > 1e3


def test_one_models_layers_on_the_bug_copy_runs_as_before(run, base, tmp_path):
    bug = _copy(base, tmp_path, "scaled", weights={"model.layers.1.mlp.down_proj.weight": 1.005})
    r = run("compare", "layers", "--model", f"hf:{bug}", "--dtypes", "bf16", *PROMPT, "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert doc["first_divergence"] is None and "rows" in doc and doc["rows"][0]["dtype"] == "bf16"


def test_the_table_names_the_rule_and_its_number(run, base, tmp_path):
    bug = _copy(base, tmp_path, "scaled", weights={"model.layers.1.mlp.down_proj.weight": 1.005})
    r = run("compare", "engine-layers", "--engine", f"hf:{bug}", "--reference", f"hf:{base}", "--dtypes",
            "bf16", *PROMPT)
    assert r.code == 1
    assert "first divergence: model.layers.1.mlp" in r.out
    assert "fp32: ratio: beyond 4x: 1.74e+04x" in r.out.replace("\n", "") or "fp32: ratio: beyond 4x:" in r.out


@pytest.mark.parametrize("reference", [True, False])
def test_plot_is_written(run, base, tmp_path, reference):
    pytest.importorskip("matplotlib")
    out = tmp_path / "layers.png"
    verb = ["engine-layers", "--engine", f"hf:{base}", "--reference", f"hf:{base}"] if reference else \
        ["layers", "--model", f"hf:{base}"]
    r = run("compare", *verb, "--dtypes", "bf16", *PROMPT, "--plot", str(out))
    assert r.code == 0, r.err
    assert out.is_file() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("reference", [True, False])
def test_plot_to_an_unwritable_kind_is_refused_before_the_run(run, base, tmp_path, reference, monkeypatch):
    pytest.importorskip("matplotlib")
    from helpers import fail_if_a_model_runs

    fail_if_a_model_runs(monkeypatch)
    verb = ["engine-layers", "--engine", f"hf:{base}", "--reference", f"hf:{base}"] if reference else \
        ["layers", "--model", f"hf:{base}"]
    r = run("compare", *verb, *PROMPT, "--plot", str(tmp_path / "x.nosuchkind"))
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "--plot" in r.err
    assert not (tmp_path / "x.nosuchkind").exists()


@pytest.mark.parametrize("spec", ["openai:http://127.0.0.1:9/v1", "ct2:/no/such/dir", "onnx:/no/such.onnx"])
def test_an_engine_without_intermediates_is_one_line(run, base, spec):
    r = run("compare", "engine-layers", "--engine", spec, "--reference", f"hf:{base}", *PROMPT)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "exposes no intermediate tensors" in r.err


def test_inject_is_one_models_option(run, base):
    r = run("compare", "engine-layers", "--engine", f"hf:{base}", "--reference", f"hf:{base}", "--inject",
            "layers.0.mlp:scale=2", *PROMPT)
    assert r.code == 2 and "--inject" in r.err


# --- llama.cpp: --layers --engine llamacpp:FILE.gguf ---------------------------------------------

@pytest.fixture(scope="module")
def embedded_hf(tmp_path_factory):
    """The embedded model as a Hugging Face folder and two f32 GGUFs of it: clean, and with
    layer 2's attention norm weight scaled by 1.01 in the GGUF only (the HF folder stays clean)."""
    return embedded_planted_ggufs(tmp_path_factory.mktemp("emb"), "model.layers.2.input_layernorm.weight", 1.01,
                                  "f32")


def test_llamacpp_clean_f32_gguf_flags_nothing(run, embedded_hf):
    ref, clean, _ = embedded_hf
    doc = gguf_layers(run, clean, ref, 0)
    names = {row["module"] for row in doc["rows"]}
    for layer in range(5):  # every block's norms, q/k norms, MLP and output, by their HF names
        for site in ("", ".input_layernorm", ".self_attn.q_norm", ".post_attention_layernorm", ".mlp"):
            assert f"model.layers.{layer}{site}" in names, (layer, site)
    assert {"model.norm", "lm_head"} <= names
    assert "model.embed_tokens" in doc["missing"]["only_reference"]  # listed apart, never a divergence
    worst = max(row["views"]["fp32"]["ratio"] for row in doc["rows"])
    assert worst < 4, worst  # fp32 vs fp32 within 4x of fp32's own rounding at every module


def test_llamacpp_planted_norm_scale_is_named_at_its_layer(run, embedded_hf):
    ref, _, bug = embedded_hf
    doc = gguf_layers(run, bug, ref, 1)
    assert doc["first_divergence"] == "model.layers.2.input_layernorm"
    f = _first_flag(doc, "fp32")
    assert f["module"] == "model.layers.2.input_layernorm" and f["rule"] == "ratio" and f["value"] > 100
    row = next(x for x in doc["rows"] if x["module"] == f["module"])
    assert abs(row["views"]["fp32"]["scale_fit"] - 1.01) < 1e-3


def test_llamacpp_reference_defaults_to_the_exports_source(run, embedded_hf, tmp_path):
    from helpers import cli

    ref, _, _ = embedded_hf
    out = tmp_path / "m.gguf"
    assert cli("export", f"hf:{ref}", "--to", "gguf:f32", "--out", str(out)).code == 0
    doc = gguf_layers(run, out, None, 0)
    assert doc["params"]["reference"] == f"hf:{ref.resolve()}"
    assert doc["params"]["reference_from"] == "recorded in the export"


def test_llamacpp_export_of_the_embedded_model_meets_it_by_name(run, embedded_hf, tmp_path):
    """The embedded model names its modules its own way; against an engine it runs as its HF export."""
    from helpers import cli

    out = tmp_path / "e.gguf"
    assert cli("export", "embedded", "--to", "gguf:f32", "--out", str(out)).code == 0
    doc = gguf_layers(run, out, None, 0)
    assert doc["params"]["reference"] == "embedded" and doc["params"]["reference_from"].startswith("recorded")
    assert doc["params"]["compared"] >= 5 * 5 + 2  # the norms, q/k norms, MLPs, blocks, final norm and head


def test_an_fp16_overflow_in_yours_is_flagged_as_overflow(run, base, tmp_path):
    """YOURS' MLP weights past fp16's range: its fp16 run turns inf where REF's fp16 run is finite."""
    bug = _copy(base, tmp_path, "huge", weights={"model.layers.1.mlp.down_proj.weight": 1e7})
    r = run("compare", "engine-layers", "--engine", f"hf:{bug}", "--reference", f"hf:{base}", "--dtypes", "fp16",
            *PROMPT, "--json")
    assert r.code == 1, r.err
    doc = strict_json(r.out)
    f = _first_flag(doc, "fp16")
    assert f["module"] == "model.layers.1.mlp" and f["rule"] == "overflow" and "where REF_LOW is finite" in f["text"]
    assert f["value"] >= 1 and doc["first_divergence"] == "model.layers.1.mlp"


@pytest.mark.parametrize("args, words", [
    (["--engine", "embedded", "--reference", "/no/such/dir"], ["--reference", "no such directory"]),
    (["--engine", "embedded", "--reference", ""], ["--reference", "empty"]),
    (["--engine", "", "--reference", "embedded"], ["--engine", "empty"]),
    (["--reference", "embedded"], ["needs --engine"]),
    (["--engine", "openai:http://127.0.0.1:9/v1", "--engine", "ct2:/x"], ["one --engine"]),
    (["--engine", "embedded", "--reference", "embedded", "--dump", "D"], ["--dump"]),  # one model's option
])
def test_two_model_usage_errors_are_one_line_before_any_load(run, monkeypatch, args, words):
    from helpers import fail_if_a_model_runs, one_line

    fail_if_a_model_runs(monkeypatch)
    one_line(run("compare", "engine-layers", *args), 2, *words)


def test_wide_adds_each_views_scale_fit(run, base):
    r = run("compare", "engine-layers", "--engine", f"hf:{base}", "--reference", f"hf:{base}", "--dtypes", "bf16",
            *PROMPT, "--wide")
    assert r.code == 0, r.err
    assert "fp32 scale (z)" in r.out and "bf16 scale (z)" in r.out and "1.00000 (0)" in r.out


def test_memory_is_estimated_from_both_models_before_either_loads():
    """runtime/memory.compare_layers_pair, checked before open_engine: under a 50 MiB limit the embedded pair at
    100 steps (estimate 72 MiB; measured peaks 68 MiB at 100 steps, 74-75 at 300, 154-236 at 600 in two runs of
    one child after another: too unsteady for tests/test_memory.py's 1.5x band, so not held there) is one line,
    exit 2, and no engine was opened."""
    import subprocess
    import sys

    argv = ["precisionlab", "compare", "engine-layers", "--engine", "embedded", "--reference", "embedded", "--steps", "100"]
    code = ("import precisionlab.io.inputs as I; I.memory_limit = lambda: 50 * 2**20\n"
            "import precisionlab.engines.registry as R\n"
            "def refuse(*a, **k): raise SystemExit('an engine was opened')\n"
            f"R.open_engine = refuse\nimport sys, runpy\nsys.argv = {argv!r}\n"
            "runpy.run_module('precisionlab', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and not r.stdout, (r.returncode, r.stderr)
    assert "compare engine-layers --engine embedded --reference embedded" in err and "needs about 72 MiB of memory, 50 MiB" in err, err


def test_the_pair_estimate_counts_yours_weights_and_each_low_dtype():
    from precisionlab.engines.shape import model_shape
    from precisionlab.runtime import memory

    shape = model_shape(None, 100, "ROMEO:\n")
    both, ext = memory.compare_layers_pair(shape, shape, 2), memory.compare_layers_pair(shape, None, 2)
    # YOURS' weights (held in fp32: its fp32 run's model), 4 bytes a parameter: its low copies are made one at
    # a time after REF's fp64 copy is dropped, and are smaller than it (memory._pair_weights)
    assert both - ext == 4 * shape.params
    elements = shape.seq * (7 * shape.hidden * shape.layers + shape.vocab)
    per_low = memory.compare_layers_pair(shape, shape, 3) - both
    assert per_low == 4 * elements + 16 * shape.seq * max(shape.hidden, shape.vocab)
