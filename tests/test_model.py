"""compare model: the embedded model, the comparison's ranges, the Hugging Face
path on a tiny Qwen3 built offline, and bad input."""

import pytest
import torch

from helpers import cli, save_tiny_qwen, strict_json
from precisionlab.experiments import model as exp
from precisionlab.engines import charlm


@pytest.fixture(scope="module")
def default_run():
    return exp.run(exp.ModelConfig(steps=50))


def test_weights_load_and_fp32_is_an_exact_upcast():
    m32, tok = charlm.load_default(torch.float32)
    m16, _ = charlm.load_default(torch.bfloat16)
    for (name, a), (_, b) in zip(m32.state_dict().items(), m16.state_dict().items(), strict=True):
        assert a.dtype == torch.float32 and b.dtype == torch.bfloat16
        assert torch.equal(a, b.float()), name  # shipped in bf16: fp32 adds no information
    assert len(tok) > 50 and tok.decode(tok.encode("ROMEO:\n")) == "ROMEO:\n"


def test_cache_matches_recomputation():
    """The one greedy loop (a KV-cache session: prefill, then one token a step)
    against recomputing the whole sequence at every step, written out here."""
    from precisionlab.engines.protocol import greedy
    from precisionlab.engines.registry import open_engine

    engine = open_engine("embedded", "cpu")
    prompt = engine.encode("ROMEO:\n")
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(30):
            ids.append(int(engine.base(torch.tensor([ids]))[0][0, -1].argmax()))
    tokens, rows = greedy(engine, engine.base, prompt, 30)
    assert tokens == ids[len(prompt):] and rows.shape == (30, len(engine.tok))


def test_deterministic(default_run):
    again = exp.run(exp.ModelConfig(steps=50))
    assert again.texts == default_run.texts
    assert [r["rel_l2"] for r in again.rows] == [r["rel_l2"] for r in default_run.rows]


def test_fp32_distribution_is_peaked(default_run):
    info = default_run.model_info
    assert info["mean_top1_probability_fp32"] > 0.3 > 10 * info["uniform_probability"]


def test_error_ranges(default_run):
    by = {s["dtype"]: s for s in default_run.summary}
    assert 1e-4 < by["bf16"]["mean_rel_l2"] < 1e-1
    assert by["fp16"]["mean_rel_l2"] < by["bf16"]["mean_rel_l2"]
    for s in default_run.summary:
        if s["diverged_at"] is not None:
            assert s["fp32_margin_at_divergence"] >= 0
    assert len(default_run.rows) == 2 * 50 and all(r["finite"] for r in default_run.rows)


def test_command_json_and_plot(tmp_path):
    png = tmp_path / "m.png"
    r = cli("compare", "model", "--steps", "20", "--json", "--plot", str(png))
    assert r.code == 0, r.err
    d = strict_json(r.out)
    assert {s["dtype"] for s in d["summary"]} == {"bf16", "fp16"} and len(d["rows"]) == 40
    assert set(d["texts"]) == {"fp32", "bf16", "fp16"}
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    pytest.importorskip("transformers")
    return save_tiny_qwen(tmp_path_factory.mktemp("tiny-qwen3"))


def test_hugging_face_model_offline(tiny_qwen):
    r = cli("compare", "model", "--model", str(tiny_qwen), "--steps", "6", "--prompt", "the cat sat", "--json",
            env={"HF_HUB_OFFLINE": "1"})
    assert r.code == 0, r.err
    d = strict_json(r.out)
    assert d["model"]["architecture"] == "Qwen3ForCausalLM" and len(d["rows"]) == 12
    assert all(row["finite"] for row in d["rows"])


@pytest.mark.parametrize("args", [
    ["--model", "/nonexistent/model"],
    ["--steps", "0"],
    ["--prompt", ""],
    ["--prompt", "ROMEO \u2603"],        # a character the model never saw
    ["--steps", "5000"],                 # past the model's positions
    ["--dtypes", "fp8"],
])
def test_bad_input_exits_2(args):
    r = cli("compare", "model", *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_a_directory_that_is_not_a_model(tmp_path):
    pytest.importorskip("transformers")
    r = cli("compare", "model", "--model", str(tmp_path))
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


@pytest.mark.gpu
@pytest.mark.torch_cuda
def test_model_on_gpu():
    res = exp.run(exp.ModelConfig(steps=20, device="cuda"))
    by = {s["dtype"]: s for s in res.summary}
    assert 1e-4 < by["bf16"]["mean_rel_l2"] < 1e-1
