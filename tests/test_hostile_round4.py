"""Hostile and careless inputs, round four (issue 45): what an export may
replace, values and timing from servers, knobs passed to C, options that
change an allocation, and the smaller cases; each with the siblings of its
mechanism."""

from __future__ import annotations

import importlib.util
import os

import pytest

from helpers import fail_if_a_model_runs, one_line


def _packages_present(monkeypatch, *names):
    """export's package checks pass for `names` (the refusals under test come after them)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: object() if n in names else real(n, *a))


def _user_folder(tmp_path, model_file="config.json"):
    d = tmp_path / "mine"
    d.mkdir()
    (d / model_file).write_text("{}")
    (d / "my_notes.txt").write_text("notes")
    (d / "README_mine.md").write_text("readme")
    return d


def _contents(d):
    return {p.name: p.read_bytes() for p in d.iterdir()}


# ---------------------------------------------------------------------------
# (1) export never empties a user's folder


@pytest.mark.parametrize("to, model_file", [("hf", "config.json"), ("ct2:float32", "model.bin")])
def test_export_refuses_a_users_model_folder_without_force(run, tmp_path, monkeypatch, to, model_file):
    """DIR held config.json (or model.bin) plus the user's notes: the export replaced it whole, exit 0."""
    _packages_present(monkeypatch, "ctranslate2")
    fail_if_a_model_runs(monkeypatch)
    d = _user_folder(tmp_path, model_file)
    before = _contents(d)
    one_line(run("export", "embedded", "--to", to, "--out", str(d)), 2, "--force", "not empty")
    assert _contents(d) == before


def test_export_with_force_fills_the_folder_and_keeps_the_users_files(run, tmp_path):
    d = _user_folder(tmp_path)
    r = run("export", "embedded", "--to", "hf", "--out", str(d), "--force", "--json")
    assert r.code == 0, r.err
    assert (d / "my_notes.txt").read_text() == "notes" and (d / "README_mine.md").read_text() == "readme"
    assert (d / "config.json").read_text() != "{}" and (d / "model.safetensors").is_file()
    import json

    names = {f["name"] for f in json.loads(r.out)["rows"]}
    assert "my_notes.txt" not in names and "config.json" in names  # only what the run wrote is listed


def test_atomic_dir_never_deletes_a_file_it_did_not_write(tmp_path):
    from precisionlab.errors import RunError, UsageError
    from precisionlab.io import outputs

    d = _user_folder(tmp_path)
    before = _contents(d)
    with pytest.raises(UsageError):
        outputs.atomic_dir(d, lambda tmp: (open(os.path.join(tmp, "config.json"), "w").write("new")))
    assert _contents(d) == before
    (d / "sub").mkdir()
    with pytest.raises(RunError):  # a member that is the user's folder: nothing written at all
        outputs.atomic_dir(d, lambda tmp: [open(os.path.join(tmp, n), "w").write("new") for n in ("a", "sub")],
                           force=True)
    assert not (d / "a").exists() and (d / "sub").is_dir()
    assert outputs.atomic_dir(d, lambda tmp: open(os.path.join(tmp, "config.json"), "w").write("new"),
                              force=True) == ["config.json"]
    assert (d / "config.json").read_text() == "new" and (d / "my_notes.txt").read_text() == "notes"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_an_empty_folder_is_filled_without_force(tmp_path):
    from precisionlab.io import outputs

    d = tmp_path / "empty"
    d.mkdir()
    outputs.atomic_dir(d, lambda tmp: open(os.path.join(tmp, "x"), "w").write("1"))
    assert (d / "x").read_text() == "1"


# ---------------------------------------------------------------------------
# (2) side files and --out's extension; (7) a link as --out


def test_the_onnx_side_file_is_refused_if_it_exists(run, tmp_path, monkeypatch):
    _packages_present(monkeypatch, "onnx")
    fail_if_a_model_runs(monkeypatch)
    side = tmp_path / "m.onnx.precisionlab-source.json"
    side.write_text("mine")
    one_line(run("export", "embedded", "--to", "onnx:fp32", "--out", str(tmp_path / "m.onnx")), 2,
             "m.onnx.precisionlab-source.json", "--force")
    assert side.read_text() == "mine"


@pytest.mark.parametrize("to, name", [("gguf:f32", "notes.txt"), ("gguf:q8_0", "m"), ("onnx:fp32", "m.gguf")])
def test_an_out_whose_extension_is_not_the_formats_is_refused(run, tmp_path, monkeypatch, to, name):
    _packages_present(monkeypatch, "gguf", "onnx")
    fail_if_a_model_runs(monkeypatch)
    f = tmp_path / name
    f.write_text("my text")
    one_line(run("export", "embedded", "--to", to, "--out", str(f)), 2, "extension" if "." in name else "no ext")
    assert f.read_text() == "my text"


def test_the_success_line_names_the_side_file():
    from precisionlab.engines.export import ExportResult
    from precisionlab.report import export as report
    from precisionlab.report.console import stdout

    res = ExportResult("embedded", "onnx:fp32", "m.onnx", [], [{"name": "m.onnx", "bytes": 3}],
                       {"export_s": 1.0}, ["m.onnx.precisionlab-source.json"])
    with stdout.capture() as cap:
        report.table(res)
    assert "m.onnx.precisionlab-source.json" in cap.get()


@pytest.mark.parametrize("to", ["hf", "ct2:float32"])
def test_an_out_that_is_a_link_to_a_folder_is_refused_before_the_run(run, tmp_path, monkeypatch, to):
    """NotADirectoryError after the whole export had run."""
    _packages_present(monkeypatch, "ctranslate2")
    fail_if_a_model_runs(monkeypatch)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    one_line(run("export", "embedded", "--to", to, "--out", str(tmp_path / "link")), 2, "symbolic link")
