"""compare model --layers, --inject and --dump: a clean bf16 run flags nothing
beyond the yardstick; each injected perturbation is named as the first
divergence, by the layer comparison and by a three-way compare tensors over
the dumps (the buggy side renamed through --map); on the embedded model and on
a tiny Qwen3 and Llama built offline."""

import json

import pytest
import torch

from helpers import cli, strict_json
from precisionlab.experiments import layers as lexp
from precisionlab.experiments import tensors as texp
from precisionlab.numerics import divergence

WORDS = ["[UNK]", "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "it"]


def _tiny(out, arch):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config,
                              Qwen3ForCausalLM)

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    torch.manual_seed(0)
    common = dict(vocab_size=len(WORDS), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common)) if arch == "qwen3" else \
        LlamaForCausalLM(LlamaConfig(**common))
    model.save_pretrained(out)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module", params=["embedded", "qwen3", "llama"])
def model(request, tmp_path_factory):
    """(model dir or None, prompt, steps, injections that must be found, expected module names)."""
    if request.param == "embedded":
        return None, "ROMEO:\n", 60, {"layers.2.mlp:scale=1.1": "layers.2.mlp",
                                      "layers.1.attn_norm:eps=1": "layers.1.attn_norm",
                                      "rope:rope=bf16": "rope"}
    path = _tiny(tmp_path_factory.mktemp(request.param), request.param)
    return path, "the cat sat", 60, {"layers.2.mlp:scale=1.1": "model.layers.2.mlp",
                                      "layers.1.input_layernorm:eps=1e-2": "model.layers.1.input_layernorm",
                                      "rotary_emb:rope=bf16": "model.rotary_emb"}


def _run(model, inject=(), dump=None, dtypes="bf16"):
    path, prompt, steps, _ = model
    return lexp.run(lexp.LayersConfig(model=path, prompt=prompt, steps=steps, dtypes=dtypes, inject=list(inject),
                                      dump=dump))


def _renamed(src, dst):
    """An engine's dump: other names, no recorded order."""
    from safetensors.torch import load_file, save_file

    save_file({f"engine.{k}": v for k, v in load_file(src).items()}, dst)


def test_clean_run_flags_nothing_and_injections_are_found(model, tmp_path):
    clean = _run(model, dump=str(tmp_path / "clean"))
    assert clean.first_divergence is None and not any(r["flagged"] for r in clean.rows)
    kinds = [r["kind"] for r in clean.rows]
    assert {"embed", "rope", "norm", "attn", "mlp", "block", "final_norm", "lm_head"} <= set(kinds)
    assert kinds[-1] == "lm_head" and all(r["yardstick"] > 0 for r in clean.rows if r["kind"] in ("mlp", "attn"))
    # accumulated error grows past the local one somewhere downstream: the columns measure different things
    assert any(r["accumulated"] > 2 * r["local"] for r in clean.rows)
    for i, (spec, module) in enumerate(model[3].items()):
        bug = tmp_path / f"bug{i}"  # a folder each: --dump refuses to replace a dump without --force
        res = _run(model, inject=[spec], dump=str(bug))
        assert res.first_divergence == module, (spec, [(r["module"], r["ratio"]) for r in res.rows if r["flagged"]])
        row = next(r for r in res.rows if r["module"] == module)
        assert row["flagged"] and row["ratio"] > lexp.RATIO_THRESHOLD
        before = [r for r in res.rows if r["order"] < row["order"]]
        assert not any(r["flagged"] for r in before)
        _renamed(str(bug / "bf16.safetensors"), str(tmp_path / "engine.safetensors"))
        three = texp.compare(texp.CompareTensorsConfig(
            files=[str(tmp_path / "clean" / "fp32.safetensors"), str(tmp_path / "clean" / "bf16.safetensors"),
                   str(tmp_path / "engine.safetensors")], maps=[r"^engine\.="]))
        assert three.flags["first_divergence"] == module, spec
        assert [r["name"] for r in three.rows] == [r["module"] for r in clean.rows if r["dtype"] == "bf16"]


def test_dump_files_hold_order_tokens_and_run_dtypes(tmp_path):
    from safetensors import safe_open

    res = lexp.run(lexp.LayersConfig(steps=8, dump=str(tmp_path / "d")))
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["bf16.safetensors", "fp16.safetensors",
                                                                   "fp32.safetensors"]
    order = [r["module"] for r in res.rows if r["dtype"] == "bf16"]
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with safe_open(str(tmp_path / "d" / f"{name}.safetensors"), "pt") as f:
            meta = f.metadata()
            assert json.loads(meta["precisionlab.order"]) == order
            assert len(json.loads(meta["precisionlab.token_ids"])) == res.params["tokens"]
            assert f.get_tensor("layers.0.mlp").dtype == dt
    r = cli("compare", "tensors", str(tmp_path / "d" / "bf16.safetensors"), str(tmp_path / "d" / "fp32.safetensors"),
            "--json")
    assert [row["name"] for row in strict_json(r.out)["rows"]] == order


def test_fp16_overflow_is_named_where_it_first_happens():
    res = lexp.run(lexp.LayersConfig(steps=8, dtypes="fp16", inject=["layers.1.mlp:scale=1e5"]))
    pit = [p for p in res.pitfalls if p["pitfall"] == "fp16_overflow"]
    assert res.first_divergence == "layers.1.mlp"
    assert pit and pit[0]["module"] == "layers.1.mlp"


def test_cli_layers_json_and_exit_codes(tmp_path):
    r = cli("compare", "layers", "--steps", "10", "--dtypes", "bf16", "--json")
    assert r.code == 0, r.err
    d = strict_json(r.out)
    assert d["first_divergence"] is None and d["rows"] and d["first_divergence_by_dtype"] == {"bf16": None}
    r = cli("compare", "layers", "--steps", "10", "--dtypes", "bf16", "--inject", "layers.3.mlp:scale=1.5")
    assert r.code == 1 and "first divergence: layers.3.mlp" in r.out


@pytest.mark.parametrize("args", [
    ["--inject", "nosuch.module:scale=2"],
    ["--inject", "layers.1.mlp:eps=1e-3"],          # not a norm
    ["--inject", "layers.1.mlp:rope=bf16"],         # not the rope
    ["--inject", "rope:rope=fp8"],
    ["--inject", "lm_head:eps=1"],                  # the tied head is no module
    ["--inject", "rope:scale=2"],
    ["--inject", "logits:noise=1"],                 # not applied by --layers
    ["--dump", "/nonexistent/dir/x"],
])
def test_bad_layers_input_exits_2(args):
    r = cli("compare", "layers", "--steps", "4", *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, r.err


def test_dump_into_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = cli("compare", "layers", "--steps", "4", "--dump", str(f))
    assert r.code == 2 and f.read_text() == "x"


def test_a_one_percent_scale_in_bf16_is_found_by_its_bias(model):
    # 3.4x the bf16 MLP's rounding by rel-L2, under the 4x rule; but rounding is
    # unbiased and a scale is not: the fitted scale is hundreds of its spreads from 1
    module = model[3]["layers.2.mlp:scale=1.1"]
    res = _run(model, inject=["layers.2.mlp:scale=1.01"])
    assert res.first_divergence == module, [(r["module"], r["ratio"], r["bias_z"]) for r in res.rows if r["injected"]]
    row = next(r for r in res.rows if r["module"] == module)
    assert abs(row["scale_fit"] - 1.01) < 0.002 and row["bias_z"] > divergence.BIAS_Z


def test_an_lm_head_that_overflows_fp16_is_the_head_pitfall(tmp_path):
    # logits past 65504: the head in fp16 gives inf where fp32 on the same input
    # stays finite, which is why engines keep the LM head in fp32
    from transformers import AutoModelForCausalLM

    path = _tiny(tmp_path / "q", "qwen3")
    m = AutoModelForCausalLM.from_pretrained(path)
    assert not m.config.tie_word_embeddings
    with torch.no_grad():
        m.lm_head.weight.mul_(1e6)
    m.save_pretrained(path)
    res = lexp.run(lexp.LayersConfig(model=path, prompt="the cat sat", steps=20, dtypes="fp16"))
    found = {(p["pitfall"], p["module"]) for p in res.pitfalls}
    assert ("head_low_precision", "model.norm + lm_head") in found and ("fp16_overflow", "lm_head") in found
    head = next(r for r in res.rows if r["kind"] == "lm_head")
    assert head["accumulated"] == float("inf") and head["logits_rel_l2_head_in_fp32"] < 1e-2
    # the trusted fp16 head overflows too, so it is not the module's own error (ratio 0), but an overflow
    # where fp32 is finite is no rounding: flagged by its own rule, exit 1 (issue 25: this was "rounding",
    # first divergence none, exit 0, and a CI gate passed)
    assert res.first_divergence == "lm_head" and head["rule"] == "overflow" and head["ratio"] == 0
    assert head["reason"].startswith("overflow: ") and head["reason"].endswith(" inf where fp32 is finite")
    # the same model in bf16 (fp32's range) keeps its head: no pitfall there
    assert not any(p["pitfall"] == "head_low_precision"
                   for p in lexp.run(lexp.LayersConfig(model=path, prompt="the cat sat", steps=20,
                                                       dtypes="bf16")).pitfalls)


def test_memory_is_estimated_before_the_model_is_opened(monkeypatch):
    # compare model --layers checks its own estimate (memory.compare_layers of engines.shape.model_shape) first
    from precisionlab.io import inputs
    from precisionlab.engines import shape
    from precisionlab.runtime import memory
    from precisionlab.errors import UsageError

    seen = []
    monkeypatch.setattr(inputs, "memory_limit", lambda: 1 << 20)
    monkeypatch.setattr(memory, "compare_layers", lambda *a, **k: seen.append(k) or (2 << 20))
    with pytest.raises(UsageError, match=r"compare layers --model embedded --steps 3 needs about 2 MiB"):
        lexp.run(lexp.LayersConfig(steps=3, dtypes="bf16"))
    assert seen == [{"dump": False}]
    monkeypatch.undo()
    # the estimate grows with what a run keeps: positions, and the dump's copies
    s50 = shape.model_shape(None, 50, "ROMEO:\n")
    assert memory.compare_layers(s50, dump=True) > memory.compare_layers(s50) > \
        memory.compare_layers(shape.model_shape(None, 10, "ROMEO:\n"))
