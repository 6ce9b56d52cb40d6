"""Hostile and careless inputs, round four (issue 45), the 'mostly met' rows of
its Done-when: a URL's secrets in the files the tool writes (not only on
stderr, tables and --json), onnxruntime's and CTranslate2's own stderr lines
held back as llama.cpp's are, and ct2's knobs bounded before C sees them."""

from __future__ import annotations

import ast
import logging
import os
import threading
from pathlib import Path

import pytest

from helpers import cli, one_line

SECRET_URL = "http://user:hunter2@127.0.0.1:9"
MASKED_URL = "http://***@127.0.0.1:9"
PKG = Path(__file__).resolve().parent.parent / "precisionlab"


# ---------------------------------------------------------------------------
# (9) a password in a URL is masked in every file the tool writes, as on stderr
#
# What can carry one: the openai: engine's URL, but an openai engine is no model (no dump, no --save-logits,
# never compare engine's cached reference); a python: engine's info() name (its author's words: a remote
# service's URL), which reaches the cached reference's info and compare model's plot title; and any path
# the user names (--text, hf:DIR), which a file records as given. An export's recorded source is
# Path.resolve()d, which never holds "//": it cannot spell scheme://user@.


def test_the_one_helper_masks_every_value_a_file_records():
    from precisionlab.io import urls

    meta = urls.recorded({"model": f"openai:{SECRET_URL}/v1,top=5", "window": 128, "mail": "me@example.com"})
    assert meta == {"model": f"openai:{MASKED_URL}/v1,top=5", "window": "128", "mail": "me@example.com"}
    doc = urls.masked({"info": {"name": f"python:{SECRET_URL}", "n": [1, 2.5, None, (f"{SECRET_URL}/x",)]}})
    assert doc == {"info": {"name": f"python:{MASKED_URL}", "n": [1, 2.5, None, [f"{MASKED_URL}/x"]]}}


def test_a_logits_files_metadata_records_a_url_without_its_secret(tmp_path):
    """compare metrics --save-logits wrote `model` and `text` as given."""
    import numpy as np
    from safetensors import safe_open

    from precisionlab.io import logits_file

    path = str(tmp_path / "l.safetensors")
    logits_file.write(path, np.zeros((2, 3), np.float32), np.zeros(2, np.int64),
                      {"model": f"hf:{SECRET_URL}/m", "text": f"{SECRET_URL}/t.txt", "window": 8})
    with safe_open(path, "np") as f:
        meta = f.metadata()
    assert meta["model"] == f"hf:{MASKED_URL}/m" and meta["text"] == f"{MASKED_URL}/t.txt" and meta["window"] == "8"
    assert b"hunter2" not in Path(path).read_bytes()


def test_a_layers_dump_records_the_models_name_without_its_secret(tmp_path):
    """compare layers --dump DIR: the safetensors metadata precisionlab.model was engine.name as is."""
    import torch

    from precisionlab.experiments import layers

    class Engine:
        name = f"python:{SECRET_URL}/engine.py:make"

    cap = layers._Run(["m.a"], {"m.a": torch.ones(2, 3)}, {}, 0.0)
    written = layers._dump(tmp_path, "bf16", cap, ["m.a"], [1, 2], Engine(), [])
    data = Path(written).read_bytes()
    assert b"hunter2" not in data and f"python:{MASKED_URL}/engine.py:make".encode() in data


def test_a_cached_references_info_is_recorded_without_its_secret(tmp_path, monkeypatch):
    """compare engine's reference cache kept the reference's info() (a python: engine names itself) as is."""
    import numpy as np

    from precisionlab.io import reference_cache

    monkeypatch.setenv("PRECISIONLAB_REFERENCE_CACHE", str(tmp_path))
    k = "0" * 64
    path = reference_cache.store(k, {"info": {"name": f"remote at {SECRET_URL}/v1"}, "window": 8},
                                 {"ids": np.arange(3)})
    assert path is not None and b"hunter2" not in Path(path).read_bytes()
    meta, arrays = reference_cache.load(k)
    assert meta["info"]["name"] == f"remote at {MASKED_URL}/v1" and arrays["ids"].tolist() == [0, 1, 2]


def test_a_plots_title_and_legend_are_written_without_the_secret(tmp_path):
    """compare model --plot titles the figure with the model's name (a python: engine's own words)."""
    matplotlib = pytest.importorskip("matplotlib")
    from precisionlab.report import plots

    path = tmp_path / "p.svg"
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # the text as text, so it can be read back
        with plots.figure(str(path), f"remote at {SECRET_URL}: low precision against fp32", "step", "rel-L2") as ax:
            ax.plot([0, 1], [1, 2], label=f"{SECRET_URL} bf16")
    svg = path.read_text()
    assert "hunter2" not in svg and MASKED_URL in svg


def test_a_path_in_the_form_of_a_url_is_masked_in_the_logits_file_end_to_end(run, tmp_path):
    """The one route without an openai engine that carries the text to a writer from the CLI: a --text
    path the user named (a folder `http:` holding `user:hunter2@127.0.0.1:9`, named with //)."""
    from safetensors import safe_open

    folder = tmp_path / "http:" / "user:hunter2@127.0.0.1:9"
    folder.mkdir(parents=True)
    (folder / "t.txt").write_text((PKG / "engines" / "data" / "shakespeare.txt").read_text()[:2000])
    text, out = f"{tmp_path}/{SECRET_URL}/t.txt", tmp_path / "l.safetensors"
    r = run("compare", "metrics", "--text", text, "--tokens", "16", "--dtypes", "bf16",
            "--save-logits", f"bf16={out}")
    assert r.code == 0, r.err
    # the table wraps a long path where the terminal's width falls (it depends on the temporary folder's
    # length): the output is read with its whitespace removed, so a secret split by a wrap is still found
    shown = "".join((r.out + r.err).split())
    assert "hunter2" not in shown and MASKED_URL in shown
    with safe_open(str(out), "np") as f:
        assert f.metadata()["text"] == f"{tmp_path}/{MASKED_URL}/t.txt"


def _calls(tree, name):
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "attr", None) == name or getattr(n.func, "id", None) == name)]


def _writers():
    """(module, line, what) of each figure save and each save_file(metadata=...) that is not a literal
    of constants: where a file the tool writes could record a name."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        mod, tree = path.relative_to(PKG).as_posix(), ast.parse(path.read_text(encoding="utf-8"))
        found += [(mod, c.lineno, "savefig") for c in _calls(tree, "savefig")]
        for c in _calls(tree, "save_file"):
            meta = next((k.value for k in c.keywords if k.arg == "metadata"), None)
            literal = isinstance(meta, ast.Dict) and all(isinstance(v, ast.Constant) for v in meta.values)
            if meta is not None and not literal:
                found.append((mod, c.lineno, ast.unparse(meta)))
    return found


def test_every_file_writer_that_records_a_name_goes_through_the_one_helper():
    """Every figure is saved by report/plots.save (which masks its texts); every safetensors metadata is
    urls.recorded's (a dump's, a logits file's), or a literal, or the embedded weights' own (config, vocab)."""
    stray = [(mod, line, what) for mod, line, what in _writers()
             if not (mod == "report/plots.py" and what == "savefig")
             and not (mod == "engines/charlm.py" and what == "meta")
             and not (mod == "experiments/layers.py" and what == "meta")  # meta = urls.recorded({...}), above it
             and not what.startswith("urls.recorded(")]
    assert not stray, f"a writer that bypasses io.urls: {stray}"
    src = (PKG / "experiments" / "layers.py").read_text()
    assert "meta = urls.recorded({" in src


# ---------------------------------------------------------------------------
# (9) onnxruntime's and CTranslate2's own lines are held back, as llama.cpp's


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from precisionlab.engines import export

    out = tmp_path_factory.mktemp("onnx") / "m.onnx"
    export.run("embedded", "onnx:fp32", str(out))
    return out


@pytest.fixture(scope="module")
def ct2_folder(tmp_path_factory):
    pytest.importorskip("ctranslate2")
    from precisionlab.engines import export

    out = tmp_path_factory.mktemp("ct2") / "m"
    export.run("embedded", "ct2:float32", str(out))
    return out


@pytest.fixture
def ort_verbose():
    """onnxruntime's default logger at VERBOSE: its session and arena lines on fd 2, deterministically."""
    ort = pytest.importorskip("onnxruntime")
    ort.set_default_logger_severity(0)
    yield
    ort.set_default_logger_severity(2)  # its default (WARNING): onnxruntime has no getter to restore from


def test_onnxruntimes_lines_are_held_back_from_its_session_and_its_runs(onnx_file, ort_verbose, capfd, monkeypatch):
    """Only llama.cpp was wrapped: onnxruntime's C++ logger wrote its session's and its runs' lines to fd 2."""
    from precisionlab.engines.onnx import OnnxEngine

    capfd.readouterr()
    e = OnnxEngine(str(onnx_file), "cpu")
    assert e.rows([1, 2, 3]).shape[0] == 3
    assert capfd.readouterr().err == ""
    monkeypatch.setenv("PRECISIONLAB_DEBUG", "1")
    e = OnnxEngine(str(onnx_file), "cpu")
    opened = capfd.readouterr().err
    e.rows([1, 2, 3])
    ran = capfd.readouterr().err
    assert "onnxruntime" in opened and "inference_session" in opened, opened[:2000]
    assert "onnxruntime" in ran, ran[:2000]  # a run's own lines (its arena's), held back the same way


def test_ctranslate2s_lines_are_held_back_from_its_load_and_its_runs(ct2_folder, capfd, monkeypatch):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from precisionlab.engines.ct2 import CT2Engine

    level = ctranslate2.get_log_level()
    ctranslate2.set_log_level(logging.INFO)  # its CPU and model lines at every load, as CT2_VERBOSE=1 asks
    try:
        capfd.readouterr()
        e = CT2Engine(str(ct2_folder), "cpu")
        real = e.gen

        class Speaking:  # ct2 says nothing during forward_batch at any level here: one that does, as a C++ log would
            compute_type = real.compute_type

            def forward_batch(self, batch):
                os.write(2, b"[ctranslate2] [warning] a line of the run\n")
                return real.forward_batch(batch)

        e.gen = Speaking()
        assert e.rows([1, 2, 3]).shape[0] == 3
        assert capfd.readouterr().err == ""
        monkeypatch.setenv("PRECISIONLAB_DEBUG", "1")
        CT2Engine(str(ct2_folder), "cpu")
        assert "Loaded model" in capfd.readouterr().err
        e.rows([1, 2, 3])
        assert "a line of the run" in capfd.readouterr().err
    finally:
        ctranslate2.set_log_level(level)


def test_a_ct2_verbose_users_compare_engine_prints_no_line_of_ctranslate2s(ct2_folder):
    """The CLI end to end, as a user with CT2_VERBOSE=1 in their environment runs it: ct2's ten lines
    (CPU, ISA, backends, the model) came before the table; now only under PRECISIONLAB_DEBUG=1."""
    args = ("compare", "engine", "--engine", f"ct2:{ct2_folder}", "--tokens", "16", "--steps", "2")
    quiet = cli(*args, env={"CT2_VERBOSE": "1"})
    assert quiet.code == 0, quiet.err
    assert quiet.err == "", quiet.err
    shown = cli(*args, env={"CT2_VERBOSE": "1", "PRECISIONLAB_DEBUG": "1"})
    assert shown.code == 0 and "[ctranslate2]" in shown.err, shown.err


def test_a_verbose_onnxruntimes_compare_engine_prints_no_line_of_its_own(onnx_file):
    """The CLI end to end with onnxruntime's logger at VERBOSE (hundreds of lines reached stderr)."""
    from helpers import cli_in_process

    r = cli_in_process("compare", "engine", "--engine", f"onnx:{onnx_file}", "--tokens", "16", "--steps", "2",
                       pre="import onnxruntime\nonnxruntime.set_default_logger_severity(0)")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.rsplit("TORCH=", 1)[0] == "", r.stderr[:2000]


@pytest.mark.parametrize("stream", ["a capture", "fd 2"])
def test_another_threads_line_passes_a_window(capfd, monkeypatch, stream):
    """ORT's and ct2's runs are windows now, and a long compare engine spends most of its time in them:
    the progress ticker (another thread) must still reach stderr, while the library's lines are held."""
    import sys

    from precisionlab.engines.chatter import captured

    if stream == "fd 2":  # the CLI's own sys.stderr writes to fd 2, which a window points at its log
        monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False, buffering=1))

    def tick():
        sys.stderr.write("precisionlab: compare engine: engine windows 3/9 (0:42)\n")
        sys.stderr.flush()

    capfd.readouterr()
    with captured("lib"):
        os.write(2, b"lib: a line of the library\n")
        t = threading.Thread(target=tick)
        t.start()
        t.join()
        print("lib: its log callback's line", file=sys.stderr)
    err = capfd.readouterr().err
    assert "engine windows 3/9" in err and "lib:" not in err, err


_WARNING = {"onnxruntime": b"2026-01-01 [W:onnxruntime:, graph.cc:1 f] the graph has an old opset\n",
            "ctranslate2": b"[2026-01-01] [ctranslate2] [thread 1] [warning] the model is an old revision\n"}
_INFO = {"onnxruntime": b"2026-01-01 [I:onnxruntime:Default, bfc_arena.cc:205 Extend] Extended allocation\n",
         "ctranslate2": b"[2026-01-01] [ctranslate2] [thread 1] [info]  - Selected ISA: AVX2\n"}


@pytest.mark.parametrize("library", ["onnxruntime", "ctranslate2"])
def test_a_load_that_fails_is_explained_by_the_librarys_warning_not_its_information(tmp_path, monkeypatch,
                                                                                   capfd, library):
    """The one error line carries the library's line that explains it (raised inside the window, as
    llama.cpp's): its warning, not an information line it printed after (under a verbose level)."""
    lib = pytest.importorskip(library)
    from precisionlab.errors import UsageError

    def fails(*a, **k):
        os.write(2, _WARNING[library] + _INFO[library])
        raise RuntimeError("cannot read the file")

    if library == "onnxruntime":
        from precisionlab.engines.onnx import OnnxEngine

        monkeypatch.setattr(lib, "InferenceSession", fails)
        (tmp_path / "m.onnx").write_bytes(b"x")
        opening = lambda: OnnxEngine(str(tmp_path / "m.onnx"), "cpu")  # noqa: E731
    else:
        from precisionlab.engines.ct2 import CT2Engine

        monkeypatch.setattr(lib, "Generator", fails)
        (tmp_path / "model.bin").write_bytes(b"x")
        opening = lambda: CT2Engine(str(tmp_path), "cpu")  # noqa: E731
    capfd.readouterr()
    with pytest.raises(UsageError) as e:
        opening()
    said = _WARNING[library].decode().strip()
    assert str(e.value).endswith(f"cannot load it (cannot read the file) ({library} said: {said})"), str(e.value)
    assert capfd.readouterr().err == ""


# ---------------------------------------------------------------------------
# (5) ct2's knobs passed to C are bounded, the bound named (onnx's are tested in test_hostile_round4)


def _ct2_folder_never_opened(tmp_path, monkeypatch):
    from precisionlab.engines import ct2

    monkeypatch.setattr(ct2, "need_package", lambda *a: None)
    ctranslate2 = pytest.importorskip("ctranslate2")
    monkeypatch.setattr(ctranslate2, "Generator", lambda *a, **k: pytest.fail("C saw the knob"))
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.bin").write_bytes(b"not opened: refused first")
    return d


@pytest.mark.parametrize("knobs, words", [
    ("threads=100000", ["threads=100000", "bound", "per CPU"]),
    ("threads=0", ["threads must be >= 1"]),
    ("batch=10000000", ["batch=10000000", "bound of 4096"]),
    ("batch=0", ["batch must be >= 1"]),
    ("threads=" + "9" * 5000, ["too long"]),
])
def test_a_ct2_knob_past_its_bound_is_refused_before_c_sees_it(tmp_path, monkeypatch, knobs, words):
    from precisionlab.engines import registry
    from precisionlab.engines.ct2 import CT2Engine
    from precisionlab.errors import UsageError

    d = _ct2_folder_never_opened(tmp_path, monkeypatch)
    for open_it in (lambda: registry.resolve(f"ct2:{d},{knobs}"), lambda: CT2Engine(f"{d},{knobs}", "cpu")):
        with pytest.raises(UsageError) as e:
            open_it()
        assert all(w in str(e.value) for w in words), str(e.value)


def test_a_ct2_knob_past_its_bound_is_one_line_from_the_cli(run, tmp_path, monkeypatch):
    d = _ct2_folder_never_opened(tmp_path, monkeypatch)
    one_line(run("compare", "engine", "--engine", f"ct2:{d},threads=100000"), 2, "threads=100000", "bound")
