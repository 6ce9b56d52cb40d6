"""The user's own engine, `--model python:FILE:factory` (issue 40): an
independent plain-PyTorch Qwen3 (tests/qwen3_plain.py, written from the
architecture; the weights of a tiny Hugging Face Qwen3 built here) behind the
Engine protocol (tests/qwen3_user_engine.py, docs/your-engine.md's template).
The clean engine matches transformers first and passes every contract; each
planted serving-path bug is found by compare contracts and called
"persists in fp64"; a batch-size-dependent reduction order is rounding; an
engine lacking a call gets "not supported" for what needed it while the rest run."""

import pytest
import torch
from helpers import ROOT, cli, save_tiny_qwen, strict_json

from precisionlab.engines import registry
from precisionlab.engines.python_spec import PythonEngine
from precisionlab.errors import RunError, UsageError
from precisionlab.experiments import contracts as exp

pytest.importorskip("transformers")
SMALL = dict(prompt="the cat sat", dtypes="fp32", steps=12, batches=(2, 16), chunks=(7, 64))
# The clean fp32 engine agrees with transformers to a few fp32 roundings of logits O(1): 1e-5, chosen before running.
HF_BOUND = 1e-5
FACTORY = """import os, sys
sys.path.insert(0, {tests!r})
from qwen3_user_engine import engine

def factory(device):
    return engine({folder!r}, {bug!r}, device)

def not_an_engine(device):
    return object()

def lacking(device):
    from qwen3_user_engine import PlainQwen3Engine

    class NoFork(PlainQwen3Engine):
        forks = False  # declares no fork: the prefix-cache contract cannot run

    return NoFork({folder!r}, None, device)
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(save_tiny_qwen(tmp_path_factory.mktemp("plain-qwen3")))


def _spec(tmp_path_factory, folder, bug=None, name="factory"):
    d = tmp_path_factory.mktemp("user")
    f = d / "my_engine.py"
    f.write_text(FACTORY.format(tests=str(ROOT / "tests"), folder=folder, bug=bug))
    return f"python:{f}:{name}"


def test_the_plain_engine_matches_hugging_face_first(folder):
    from qwen3_user_engine import engine
    from transformers import Qwen3ForCausalLM

    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]])
    with torch.no_grad():
        want = Qwen3ForCausalLM.from_pretrained(folder).eval()(ids).logits
    e = engine(folder)
    got = e.forward(e.base, ids)
    assert (got - want).abs().max().item() <= HF_BOUND
    # and its KV-cache decode reproduces its own prefill to the same bound
    feed = e.session(e.base)
    steps = torch.cat([feed(ids[0, :4])] + [feed(ids[0, i:i + 1]) for i in range(4, ids.shape[1])])
    assert (steps - got[0]).abs().max().item() <= HF_BOUND


def _verdicts(spec):
    res = exp.run(exp.ContractsConfig(model=spec, **SMALL))
    return res, {r["label"]: r["verdict"] for r in res.rows}


@pytest.mark.parametrize("bug, broken", [
    ("kv_bf16_decode", {"decode 1 token a step", "chunks of 7", "prefix from a saved cache"}),
    ("chunk_mask", {"chunks of 7", "prefix from a saved cache"}),
    ("unmasked_padding", {"8 pads, batch of 1", "8 pads, batch of 2"}),
    ("decode_position", {"decode 1 token a step", "chunks of 7", "prefix from a saved cache"}),
])
def test_each_planted_bug_persists_in_fp64(tmp_path_factory, folder, bug, broken):
    res, v = _verdicts(_spec(tmp_path_factory, folder, bug))
    algorithmic = {k for k, x in v.items() if x == "algorithmic"}
    assert broken <= algorithmic, v
    for r in res.rows:
        if r["verdict"] == "algorithmic":
            assert "persists in fp64" in r["note"] and r["exact_max_abs_diff"] > 1e-6, r
    assert any("persisting in fp64" in t for t in res.takeaways)


def test_a_batch_dependent_reduction_order_is_rounding(tmp_path_factory, folder):
    res, v = _verdicts(_spec(tmp_path_factory, folder, "batch_order"))
    assert v["batch of 2"] == v["batch of 16"] == "rounding"
    assert "algorithmic" not in v.values()
    assert any("batch-dependent order" in t for t in res.takeaways)


def test_the_clean_engine_passes_every_contract_through_the_cli(tmp_path_factory, folder):
    spec = _spec(tmp_path_factory, folder)
    r = cli("compare", "contracts", "--model", spec, "--prompt", "the cat sat", "--steps", "8", "--dtypes", "fp32",
            "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    verdicts = {row["verdict"] for row in doc["rows"]}
    assert verdicts <= {"holds", "rounding"}, doc["rows"]
    assert doc["model"]["name"].startswith("plain-qwen3")


def test_a_call_the_engine_lacks_is_not_supported_while_the_rest_run(tmp_path_factory, folder):
    res, v = _verdicts(_spec(tmp_path_factory, folder, None, "lacking"))
    assert v["prefix from a saved cache"] == "not supported"
    assert all(x != "not supported" for k, x in v.items() if not k.startswith(("prefix from", "verify")))
    assert any(t.startswith("not supported by this engine") for t in res.takeaways)


def test_spec_refusals_are_one_line(tmp_path_factory, folder):
    for spec, needle in (("python:nowhere_at_all_xyz:factory", "cannot import nowhere_at_all_xyz"),
                         ("python:/no/such/file.py:factory", "no such file"),
                         ("python:json", "give python:package.module:factory"),
                         ("python:json:nothing_here", "has no callable nothing_here")):
        with pytest.raises(UsageError, match=needle):
            registry.resolve(spec)
    with pytest.raises(UsageError, match="not an Engine"):
        registry.open_engine(_spec(tmp_path_factory, folder, None, "not_an_engine"), "cpu")
    r = cli("compare", "contracts", "--model", "python:/no/such/file.py:factory")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, r.err


def test_what_the_users_code_raises_is_one_line(tmp_path_factory, folder):
    eng = registry.open_engine(_spec(tmp_path_factory, folder), "cpu")
    assert isinstance(eng, PythonEngine) and eng.batches and eng.forks and not eng.captures_layers
    with pytest.raises(RunError, match=r"forward\(\) raised"):
        eng.forward(eng.model("fp32"), "not token ids")


# --- docs/your-engine.md's template, as it stands -----------------------------------------------------


def test_the_docs_template_is_the_tested_file_and_runs_every_contract_it_declares():
    page = (ROOT / "docs" / "your-engine.md").read_text()
    code = (ROOT / "docs" / "data" / "your_engine.py").read_text()
    assert f"```python\n{code}```" in page  # the page shows the file the test runs
    assert len(code.splitlines()) <= 60
    res = exp.run(exp.ContractsConfig(model=f"python:{ROOT / 'docs' / 'data' / 'your_engine.py'}:factory",
                                      prompt="ROMEO:\n", dtypes="fp32", steps=6, batches=(2,), chunks=(7,)))
    v = {r["label"]: r["verdict"] for r in res.rows}
    assert v["8 pads, batch of 1"] == v["prefix from a saved cache"] == "not supported"  # declared neither
    assert v["prefix under two continuations"] == "holds" and v["batch of 2"] == "holds"
    assert set(v.values()) <= {"holds", "rounding", "not supported"}, v


def test_the_template_runs_in_the_other_model_verbs():
    spec = f"python:{ROOT / 'docs' / 'data' / 'your_engine.py'}:factory"
    for args in (["metrics", "--model", spec, "--tokens", "64", "--dtypes", "bf16"],
                 ["rollout", "--trainer", spec, "--rollout", spec, "--samples", "2", "--tokens", "6"],
                 ["model", "--model", spec, "--steps", "3", "--dtypes", "bf16"]):
        r = cli("compare", *args, "--json")
        assert r.code == 0, (args, r.err)
        assert strict_json(r.out)["command"] == f"compare {args[0]}"


def test_compare_engine_takes_the_users_engine(tmp_path_factory, folder):
    """compare engine --engine python:... against the folder it reimplements: the clean engine's logits are
    transformers' to fp32 rounding (HF_BOUND; KL ~ Var/2 ~ 1e-11, bounded here by 1e-9); a 5 % attention scale
    departs past ten times that bound. (A first bound of 1e-6 was too high for this tiny random model, whose
    attention scores are small: the bug measured 2.3e-7, so the line is now set by rounding's ceiling, not by
    a guess at the bug's size.)"""
    def run(bug):
        r = cli("compare", "engine", "--engine", _spec(tmp_path_factory, folder, bug), "--reference", f"hf:{folder}",
                "--tokens", "48",
                "--steps", "6", "--json", timeout=600)
        assert r.code == 0, r.err
        return strict_json(r.out)["rows"][0]
    clean = run(None)
    assert clean["tokens"] == "identical" and clean["positions"] > 20
    assert clean["max_abs_diff"] <= HF_BOUND and clean["kld_mean"] < 1e-9
    assert run("attn_scale")["kld_mean"] > 1e-8


def test_kvcache_refuses_an_engine_whose_cache_it_cannot_reach():
    """kvcache quantises the cache through session(model, stores): an engine that does not declare stores_kv
    (the template keeps its cache inside) is refused in one line before any run, not measured as if it had."""
    r = cli("kvcache", "--model", f"python:{ROOT / 'docs' / 'data' / 'your_engine.py'}:factory")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "kvcache needs a KV cache written and read back through precisionlab's stores" in r.err
