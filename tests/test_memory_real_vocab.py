"""Memory at a real model's size (issue 39), cheaply: the weights held once
in the dtype they are stored in, each compute dtype cast from them; a real
vocabulary (151,936 logits a position) at a tiny hidden size, where compare
metrics' buffers follow --tokens and compare contracts runs the batches that
fit; and every estimate made from the folder's headers and config.json
before a weight is read.

The measured peaks of these commands at three sizes are tests/test_memory.py's;
scripts/bench_realsize.py measures a Qwen3-0.6B shape."""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, loaded_timeout, save_tiny_qwen
from precisionlab.engines.shape import ModelShape, model_shape
from precisionlab.runtime import memory

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

QWEN_VOCAB = 151_936
GiB = 1 << 30
# A Qwen3-0.6B shape (hidden 1024, 28 layers, 16 heads, vocabulary 151,936, tied: 596M parameters in bf16)
QWEN06 = ModelShape(params=596_049_920, seq=0, vocab=QWEN_VOCAB, hidden=1024, layers=28, heads=16, kind="hf",
                    positions=40960, stored=2 * 596_049_920, dtype="bf16")


@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory):
    return str(save_tiny_qwen(tmp_path_factory.mktemp("bf16") / "q", hidden=32, edit=lambda m: m.to(torch.bfloat16)))


@pytest.fixture(scope="module")
def real_vocab(tmp_path_factory):
    return str(save_tiny_qwen(tmp_path_factory.mktemp("vocab") / "q", hidden=32, vocab=QWEN_VOCAB))


def test_weights_held_as_stored_and_each_dtype_cast_from_them(bf16_folder):
    import copy

    import transformers

    from precisionlab.engines.hf import HFEngine

    e = HFEngine(bf16_folder, "cpu")
    assert {p.dtype for p in e.stored.parameters()} == {torch.bfloat16}
    assert e._fp32 is None  # no fp32 base until a run reads it
    stored = {p.data_ptr() for p in e.stored.parameters()}
    # the stored dtype's copy shares the weights; another dtype's holds its own
    assert {p.data_ptr() for p in e.model("bf16").parameters()} == stored
    assert not stored & {p.data_ptr() for p in e.model("fp16").parameters()}
    # the numbers of the former load (fp32 base, a deep copy then .to(dtype)), bit for bit
    old = transformers.AutoModelForCausalLM.from_pretrained(bf16_folder, dtype=torch.float32).eval()
    x = torch.tensor([[1, 2, 3, 4, 5, 6]])
    for dtype in ("fp32", "bf16", "fp16"):
        former = copy.deepcopy(old).to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
        assert torch.equal(e.forward(e.model(dtype), x), e.forward(former, x)), dtype
    assert e._fp32 is None  # model("fp32") made a run's own copy, not kept
    assert e.base is e.model("fp32")  # once made, base is the fp32 run's model: never a second fp32 copy


def test_shape_counts_the_stored_bytes(bf16_folder):
    s = model_shape(bf16_folder, 4, "the cat")
    assert s.weight_bytes == 2 * s.params
    assert memory.copy_bytes(s, "bf16") == 0 and memory.copy_bytes(s, "fp32") == 4 * s.params


def test_estimates_count_the_weights_once_plus_the_copies():
    w = QWEN06.weight_bytes
    p = QWEN06.params
    # compare model: one compute copy at a time, the largest fp32's
    assert memory.weights(QWEN06, ["fp32", "bf16", "fp16"]) == w + 4 * p
    assert memory.weights(QWEN06) == 2 * w  # the load: the file mapped beside the tensors read from it
    # compare metrics: fp32 and fp16 beside the stored bf16
    assert memory.weights(QWEN06, "fp32", "bf16", "fp16") == w + 6 * p


def test_metrics_sized_by_tokens_at_the_real_vocabulary():
    from precisionlab.experiments import logits

    weights = memory.weights(QWEN06, "fp32", "bf16", "fp16")
    small, large = (logits.estimate(QWEN06._replace(seq=0), t, ["bf16", "fp16"], {}, 0.0) - weights
                    for t in (128, 2048))
    # the buffers: 128 positions' logits and a chunk's float64 statistics, well under a 1024-position window's
    assert small < QWEN_VOCAB * 1024 * 12 < large
    # 2048 positions: one 1024-position window's logits in two dtypes at a time (under 16 bytes a logit),
    # not every dtype's float64 windows (the former 128 bytes a logit and dtype: 57 GiB)
    assert large < QWEN_VOCAB * 1024 * 16
    # a 1.5B shape at 2048 tokens fits a 24 GB machine with room to spare
    b15 = QWEN06._replace(params=1_543_714_304, stored=2 * 1_543_714_304, hidden=1536, heads=12)
    assert logits.estimate(b15, 2048, ["bf16", "fp16"], {}, 0.0) < 16 * GiB


def _cli(args, prelude=""):
    env = {k: v for k, v in os.environ.items() if k != "PRECISIONLAB_DEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    code = prelude + "\nimport sys\nfrom precisionlab.cli import main\nsys.argv = ['precisionlab', *sys.argv[1:]]\nmain()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=loaded_timeout(300), cwd=ROOT)


def test_contracts_run_the_batches_that_fit(real_vocab):
    from precisionlab.experiments import contracts

    shape = model_shape(real_vocab, 4 + contracts.PADS, "the cat sat")
    dtypes = ["fp32"]
    fits16, fits64 = (memory.compare_contracts(shape, b, dtypes) for b in (16, 64))
    assert fits16 < fits64
    limit = (fits16 + fits64) // 2  # room for a batch of 16, not of 64
    r = _cli(["compare", "contracts", "--model", real_vocab, "--steps", "4", "--prompt", "the cat sat", "--dtypes",
              "fp32", "--draft-widths", "2", "--json"],
             f"import precisionlab.io.inputs as I; I.memory_limit = lambda: {limit}")
    assert r.returncode == 0, r.stderr[-1000:]
    doc = json.loads(r.stdout)
    assert doc["params"]["batches"] == [2, 4, 16]
    assert [b["batch"] for b in doc["params"]["batches_left_out"]] == [64]
    assert "batch of 64 not run" in doc["params"]["batches_left_out"][0]["reason"]
    assert sorted({row["batch"] for row in doc["rows"] if row["contract"] == "batch"}) == [2, 4, 16]
    assert any("batch of 64 not run" in t for t in doc["takeaways"])


NO_WEIGHTS = ("import precisionlab.io.inputs as I; I.memory_limit = lambda: {limit}\n"
              "import safetensors.torch as T, transformers\n"
              "def refuse(*a, **k): raise SystemExit('a weight was read')\n"
              "T.load_file = T.load = refuse\n"
              "transformers.AutoModelForCausalLM.from_pretrained = refuse\n")


@pytest.mark.parametrize("command", [["compare", "model", "--steps", "4"], ["compare", "metrics", "--tokens", "64"],
                                     ["compare", "layers", "--steps", "4"], ["compare", "contracts", "--steps", "4"]],
                         ids=" ".join)
def test_refused_from_the_config_before_a_weight_is_read(real_vocab, command):
    """Under a limit below the weights plus one real-vocabulary window, each
    command refuses (exit 2, one line naming both numbers), and no loader
    ran: the estimate came from config.json and the safetensors header."""
    shape = model_shape(real_vocab, 0, "")
    limit = shape.weight_bytes + 4 * QWEN_VOCAB  # the weights and one fp32 row of logits
    r = _cli([*command, "--model", real_vocab, "--prompt", "the cat sat"] if command[1] != "metrics"
             else [*command, "--model", real_vocab], NO_WEIGHTS.format(limit=limit))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-800:]
    assert " ".join(command[:2]) in lines[0] and "needs about" in lines[0], lines[0]
