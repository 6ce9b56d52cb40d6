"""What an engine can do is declared on its class (engines/protocol.py), read by
the experiments, never probed: the defaults, each shipped adapter's
declaration, a declaration always backed by the method it promises, the one
`require` check that turns a missing capability into "not supported" or a
refusal, and a new engine (tests/shift_engine.py: one module, one registry
line) running compare model --engine, whose exact answer is known."""

import math
import os
import subprocess
import sys

import pytest
from helpers import ROOT, loaded_timeout, strict_json, registered
from shift_engine import ShiftEngine

from precisionlab.engines import registry
from precisionlab.engines.protocol import CAPABILITIES, Engine, NotSupported, require
from precisionlab.errors import UsageError

# prefix -> (has_modules, captures_layers, vocabulary, batches, forks, top_k, compute_dtypes), as each adapter's
# docstring describes it; written out here, not read from the classes under test.
DECLARED = {
    "embedded": (True, False, True, True, True, None, ("fp32", "bf16", "fp16", "fp64")),
    "hf": (True, False, True, True, True, None, ("fp32", "bf16", "fp16", "fp64")),
    "llamacpp": (False, True, True, False, True, None, ("fp32",)),  # fork(): one context, feeds rebuild past their common prefix
    "ct2": (False, False, True, False, False, None, ("fp32",)),
    "onnx": (False, False, True, False, False, None, ("fp32",)),
    "openai": (False, False, False, False, False, 5, ("fp32",)),
}
NAMES = ("has_modules", "captures_layers", "vocabulary", "batches", "forks", "top_k", "compute_dtypes")


class Bare(Engine):
    """The least an engine writes: what the defaults must make safe."""

    name = "bare"

    def info(self):
        return {}

    def encode(self, text, source="--prompt"):
        return [0]

    def decode(self, ids):
        return ""

    def forward(self, model, ids, head_dtype=None):
        return ids

    def session(self, model, stores=None):
        return lambda ids: ids


def test_defaults_are_those_of_a_torch_model_that_offers_nothing_extra():
    assert (Bare.has_modules, Bare.captures_layers, Bare.vocabulary, Bare.batches, Bare.forks, Bare.top_k,
            Bare.echoes_prompt) == (True, False, True, False, False, None, False)
    assert "fp64" in Bare.compute_dtypes and "fp32" in Bare.compute_dtypes
    e = Bare()
    with pytest.raises(NotSupported, match="copying a KV cache"):
        e.fork(lambda ids: ids)
    with pytest.raises(NotSupported, match="attention mask"):
        e.forward_batch(None, [[1]], attention_mask=[[1]])
    assert e.forward_batch(None, "ids") == "ids"  # a plain batch is forward's
    with pytest.raises(UsageError, match="^bare: computes in fp32, bf16, fp16, fp64, not fp8_e4m3$"):
        e.model("fp8_e4m3")  # refused before the (absent) model is copied
    with pytest.raises(NotSupported):
        e.capture_layers([1, 2])
    with pytest.raises(NotSupported):
        e.top_logprobs([1, 2])


@pytest.mark.parametrize("prefix", sorted(DECLARED))
def test_each_shipped_adapter_declares_what_it_does(prefix):
    cls = registry.engine_class(prefix)
    assert tuple(getattr(cls, n) for n in NAMES) == DECLARED[prefix]


@pytest.mark.parametrize("prefix", sorted(registry.ENGINES))  # every registered engine, a new one included
def test_a_declared_capability_is_backed_by_its_method(prefix):
    """Declared True <=> the adapter overrides the method that provides it
    (the base's raises NotSupported): a declaration cannot lie either way."""
    cls = registry.engine_class(prefix)
    assert cls.forks == (cls.fork is not Engine.fork)
    assert cls.batches == (cls.forward_batch is not Engine.forward_batch)
    assert cls.captures_layers == (cls.capture_layers is not Engine.capture_layers)
    assert (cls.top_k is not None) == (cls.top_logprobs is not Engine.top_logprobs)
    assert cls.generates == (cls.generate is not Engine.generate)
    assert cls.generates == (prefix == "openai")  # only the endpoint decodes by itself


def test_require_names_what_is_missing():
    require(Bare, "has_modules", "--layers")  # present: nothing raised
    with pytest.raises(NotSupported) as e:
        require(Bare(), "forks")
    assert str(e.value) == CAPABILITIES["forks"]  # contracts reports "not supported by this engine (...)"
    with pytest.raises(UsageError, match=r"^llama\.cpp: --layers --reference needs the model's torch modules"):
        require(registry.engine_class("llamacpp"), "has_modules", "--layers --reference", UsageError)
    with pytest.raises(UsageError, match=r"^bare: --dump needs per-layer outputs"):
        require(Bare(), "captures_layers", "--dump", UsageError)


# ---------------------------------------------------------------------------
# a new engine: tests/shift_engine.py and this one line


@pytest.fixture
def shift_engine():
    yield from registered({"shift": ShiftEngine})


# The whole CLI (main(), as a user runs it) in a child with the engine registered: one line.
REGISTERED = ("import sys; sys.path.insert(0, {tests!r}); from shift_engine import ShiftEngine; "
              "from precisionlab.engines import registry; registry.register('shift', ShiftEngine); "
              "sys.argv[0] = 'precisionlab'; from precisionlab.cli import main; main()")


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if k != "PRECISIONLAB_DEBUG"} | {"PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", REGISTERED.format(tests=str(ROOT / "tests")), *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=loaded_timeout(300))


def _compare_engine(*specs, tokens=64, steps=6):
    args = ["compare", "model", "--reference", "embedded", "--tokens", str(tokens), "--steps", str(steps), "--json"]
    for s in specs:
        args += ["--engine", s]
    r = _cli(*args)
    assert r.returncode == 0, r.stderr
    return strict_json(r.stdout)


# The shift's float32 rounding: |x + C| < 128 for the embedded model's logits, so each shifted
# logit is off by at most half an ulp at 128, 2^-17; chosen before running.
ROUNDING = 2.0 ** -17


def test_a_registered_engine_runs_compare_model_engine_with_its_exact_answer():
    full, no_vocab = _compare_engine("shift:2", "shift:0.5,ids=1")["rows"]
    top, = _compare_engine("shift:3,top=4", steps=0)["rows"]  # a top-k stream that cannot decode: no --steps
    for row, c in ((full, 2.0), (no_vocab, 0.5)):
        assert row["positions"] == 64 and row["greedy_diverged_at"] is None
        assert row["top1_agree_pct"] == 100.0
        assert 0.0 <= row["kld_mean"] <= 1e-9 and row["kld_max"] <= 1e-9
        assert row["max_abs_diff_shifted"] <= ROUNDING
        assert abs(row["max_abs_diff"] - c) <= ROUNDING
        assert row["bit_identical"] is False
    assert full["tokens"] == "identical" and full["engine"]["engine"] == "shift (a test engine)"
    assert no_vocab["tokens"].startswith("none (")  # vocabulary False: the reference's ids, said so
    assert top["top_k"] == 4 and top["positions"] == 64 and top["greedy_steps"] == 0
    assert top["top1_agree_pct"] == 100.0 and 0.0 <= top["kld_lower_bound_mean"] <= 1e-9
    assert top["tokens"].startswith("the reference's ids, sent as token ids")  # echoes_prompt False
    assert not math.isnan(top["kld_lower_bound_max"])


def test_steps_on_a_top_k_engine_that_cannot_decode_is_refused_not_a_silent_dash():
    """issue 41: greedy_steps 0 under --steps N read as "no divergence"."""
    r = _cli("compare", "engine", "--reference", "embedded", "--engine", "shift:3,top=4", "--tokens", "8",
             "--steps", "4")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1].endswith(
        "--steps 4 (greedy decoding; --steps 0 skips it) needs greedy tokens generated by the engine itself "
        "(a server's completions)"), r.stderr


def test_layers_refuses_an_engine_without_modules_or_captures():
    for args in (["--engine", "shift:1"], ["--reference", "shift:1"]):
        r = _cli("compare", "engine-layers", *args, *(["--engine", "embedded"] if "--reference" in args else []),
                 "--steps", "2")
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert "shift (a test engine) exposes no intermediate tensors" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_engine_instance_refuses_what_it_does_not_declare(shift_engine):
    e, _ = registry.resolve("shift:1")
    assert e is ShiftEngine
    eng = registry.open_engine("shift:1", "cpu")
    with pytest.raises(NotSupported, match="copying a KV cache"):
        eng.fork(eng.session(None))
    with pytest.raises(UsageError, match="shift:1: --layers needs the model's torch modules"):
        eng.sites(None)
    with pytest.raises(UsageError, match="computes in the settings it was opened with"):
        eng.model("bf16")


def test_no_experiment_probes_an_engine_or_imports_an_adapter():
    """The rule of issue 38: experiments read declared capabilities only."""
    probe = subprocess.run(["grep", "-rnE", r"getattr\((eng|engine|ref|yours|cls|ycls|model)\b|hasattr\((eng|engine|ref|yours|cls|ycls|model)\b"
                            r"|top_k_only|capture_layers\"", "precisionlab/experiments"],
                           capture_output=True, text=True, cwd=ROOT)
    assert probe.stdout == ""
    adapters = subprocess.run(["grep", "-rnE", r"engines\.(openai|llamacpp|hf|embedded|ct2|onnx|external)\b",
                               "precisionlab/experiments"], capture_output=True, text=True, cwd=ROOT)
    assert adapters.stdout == ""
