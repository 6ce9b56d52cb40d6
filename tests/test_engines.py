"""Engines by spec string (engines/registry.py): parsing, refusals before torch
is imported, a bare DIR read as hf:DIR, and what adding an engine costs: the
FakeEngine below (one class) registered at test time (one line) runs compare
model and kvcache, and gives the embedded model's numbers, which it wraps."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cli, save_tiny_qwen, strict_json, registered

from precisionlab.engines import registry
from precisionlab.engines.protocol import Engine
from precisionlab.errors import UsageError


def test_spec_parsing(tmp_path, monkeypatch):
    assert registry.parse(None) == ("embedded", None) == registry.parse("embedded")
    assert registry.parse("hf:models/qwen") == ("hf", "models/qwen")
    assert registry.parse("models/qwen") == ("hf", "models/qwen")      # bare DIR (or org/name): hf
    assert registry.parse("Qwen/Qwen3-0.6B") == ("hf", "Qwen/Qwen3-0.6B")
    assert registry.parse("hf:a:b") == ("hf", "a:b")                  # only the first colon splits
    assert registry.parse("embedded:x") == ("embedded", "x")           # refused by the engine (below)
    with pytest.raises(UsageError, match=r"no engine 'tgi'; known: embedded, hf, llamacpp, ct2, onnx, openai"):
        registry.parse("tgi:model")
    assert registry.parse("llamacpp:model.gguf") == ("llamacpp", "model.gguf")
    # an existing folder whose name looks like a spec is a folder
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run1:final").mkdir()
    assert registry.parse("run1:final") == ("hf", "run1:final")


def test_engine_arguments_are_checked_before_loading(tmp_path):
    for spec, needle in (("embedded:x", "takes no argument"), ("hf:", "needs a directory"),
                         ("/nonexistent/model", "no such directory"), ("hf:./nowhere/at/all", "no such directory")):
        with pytest.raises(UsageError, match=needle):
            registry.resolve(spec)
    f = tmp_path / "weights.bin"
    f.write_bytes(b"")
    with pytest.raises(UsageError, match="is a file"):
        registry.resolve(str(f))


def test_register_refuses_a_taken_or_malformed_prefix():
    with pytest.raises(ValueError, match="taken"):
        registry.register("hf", "x:Y")
    with pytest.raises(ValueError, match="lowercase word"):
        registry.register("Fake", "x:Y")
    with pytest.raises(ValueError, match="ships with"):
        registry.unregister("embedded")


# An unknown engine or an unopenable argument: one stderr line, exit 2, and torch never imported.
_PROBE = ("import sys\nfrom precisionlab.cli import main\nsys.argv = ['precisionlab', *sys.argv[1:]]\n"
          "try:\n    main()\nexcept SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n")


@pytest.mark.parametrize("args", [
    ["compare", "model", "--model", "tgi:model"],
    ["compare", "metrics", "--model", "hf:/nonexistent/model"],
    ["compare", "layers", "--model", "embedded:x"],
    ["kvcache", "--model", "tgi:model"],
])
def test_a_bad_spec_exits_2_before_torch(args):
    r = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert r.stdout.split() == ["2", "False"], (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--model" in lines[0] and "Traceback" not in r.stderr
    if "tgi" in args[-1]:
        assert "known: embedded, hf, llamacpp" in lines[0]


def test_model_help_names_the_specs():
    r = cli("compare", "model", "--help")
    assert r.code == 0 and "hf:DIR" in r.out and "embedded" in r.out


def test_a_bare_dir_is_hf(tmp_path):
    pytest.importorskip("transformers")
    folder = str(save_tiny_qwen(tmp_path / "tiny"))
    from precisionlab.engines.hf import HFEngine

    assert registry.resolve(folder) == (HFEngine, folder) == registry.resolve("hf:" + folder)
    docs = []
    for spec in (folder, "hf:" + folder):
        r = cli("compare", "model", "--model", spec, "--steps", "3", "--prompt", "the cat sat", "--json")
        assert r.code == 0, r.err
        docs.append(strict_json(r.out))
    assert docs[0]["rows"] == docs[1]["rows"] and docs[0]["model"] == docs[1]["model"]
    assert [d["params"]["model"] for d in docs] == [folder, "hf:" + folder]


# ---------------------------------------------------------------------------
# a new engine: one class, one registry line


class FakeEngine(Engine):
    """An adapter over the embedded model under another name: what a new
    engine writes (llama.cpp's would call its own library in the same places)."""

    window = 128
    stores_kv = True  # session(model, stores) hands the stores to the embedded model's kv_store, declared

    @classmethod
    def check(cls, arg):
        if not arg:
            raise UsageError("--model fake: needs a name (fake:NAME)")

    def __init__(self, arg, device):
        from precisionlab.engines.embedded import EmbeddedEngine

        self.inner = EmbeddedEngine(None, device)
        self.base, self.device, self.max_len = self.inner.base, device, self.inner.max_len
        self.name = f"fake engine {arg!r} over the embedded model"

    def info(self):
        return self.inner.info() | {"name": self.name}

    def encode(self, text, source="--prompt"):
        return self.inner.encode(text, source)

    def decode(self, ids):
        return self.inner.decode(ids)

    def forward(self, model, ids):
        return self.inner.forward(model, ids)

    def session(self, model, stores=None):
        return self.inner.session(model, stores)  # the KV-cache hook: the embedded model's kv_store


@pytest.fixture
def fake_engine():
    yield from registered({"fake": FakeEngine})


def _invoke(*args):
    from typer.testing import CliRunner

    from precisionlab.cli.app import app

    r = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return strict_json(r.stdout)


def test_a_registered_engine_runs_compare_model_and_kvcache(fake_engine):
    fake = _invoke("compare", "model", "--model", "fake:x", "--steps", "3", "--json")
    ref = _invoke("compare", "model", "--model", "embedded", "--steps", "3", "--json")
    assert fake["params"]["model"] == "fake:x" and fake["model"]["name"] == "fake engine 'x' over the embedded model"
    assert fake["rows"] == ref["rows"] and fake["summary"] == ref["summary"]  # the embedded model's numbers
    kv = ["kvcache", "--steps", "3", "--dtypes", "fp8_e4m3", "--scales", "dynamic", "--json"]
    fake_kv, ref_kv = _invoke(*kv, "--model", "fake:x"), _invoke(*kv)
    assert fake_kv["rows"] == ref_kv["rows"] and fake_kv["rows"][2]["entries"] > 0
    assert registry.parse("fake:x") == ("fake", "x")
