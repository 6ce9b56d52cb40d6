"""Hostile and careless files, every command: no foreign code runs (model
folders with custom code, pickles in .pt/.npy/.npz), only the named files are
written (--plot, --save-logits, --dump: atomically, never over an input), and
files that are not regular, unreadable, empty, lying in their headers or
holding non-finite values end in one line and an exit code, never an internal
error or a hang.

Most cases run the CLI in process (the `run` fixture of conftest.py); the few
that need a real process (stdin, a FIFO that would hang) use a subprocess."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

import numpy as np
import pytest

from helpers import ROOT, cli, fail_if_a_model_runs, one_line, registered_commands, save_tiny_qwen


# ---------------------------------------------------------------------------
# foreign code never runs: compare model


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """A tiny Qwen3 with a vocabulary of hostile tokens, and three variants:
    NaN weights, a config with auto_map and the code it names, auto_map in the
    tokenizer's config."""
    pytest.importorskip("transformers")
    import torch

    words = ["[UNK]", "the", "cat", "sat", "[/]", "[bold]x", "\x1b]0;owned\x07", "\x1b[2J", "on", "a", "mat", "it"]
    root = tmp_path_factory.mktemp("models")
    marker = root / "PWNED"
    out = {}
    for kind in ("good", "nan", "auto_map", "tokenizer_auto_map"):
        d = root / kind

        def nan_mlp(m):
            with torch.no_grad():
                m.model.layers[1].mlp.down_proj.weight.fill_(float("nan"))
        save_tiny_qwen(d, words=words, edit=nan_mlp if kind == "nan" else None)
        code = f"open({str(marker)!r}, 'w').write('ran')\nfrom transformers import *\n"
        if kind == "auto_map":
            c = json.loads((d / "config.json").read_text())
            c["model_type"] = "hostile"  # no native class: only the folder's code could load it
            c["auto_map"] = {"AutoConfig": "evil.Cfg", "AutoModelForCausalLM": "evil.Model"}
            (d / "config.json").write_text(json.dumps(c))
            (d / "evil.py").write_text(code)
        if kind == "tokenizer_auto_map":
            c = json.loads((d / "tokenizer_config.json").read_text())
            c["auto_map"] = {"AutoTokenizer": ["evil.Tok", None]}
            (d / "tokenizer_config.json").write_text(json.dumps(c))
            (d / "evil.py").write_text(code)
        out[kind] = d
    out["marker"] = marker
    return out


@pytest.mark.parametrize("command", [["compare", "model"], ["kvcache"]], ids=" ".join)
@pytest.mark.parametrize("kind", ["auto_map", "tokenizer_auto_map"])
def test_a_model_folder_with_custom_code_is_refused_without_reading_stdin(run, tiny_models, monkeypatch, kind,
                                                                          command):
    import io

    stdin = io.StringIO("y\ny\ny\n")  # the answer a prompt would take
    monkeypatch.setattr(sys, "stdin", stdin)
    r = run(*command, "--model", str(tiny_models[kind]), "--steps", "2", "--prompt", "the cat", "--json")
    one_line(r, 2, "auto_map")
    assert r.out == ""  # no prompt text, no JSON: nothing on stdout
    assert stdin.tell() == 0, "stdin was read"
    assert not tiny_models["marker"].exists(), "the model folder's code ran"


def test_every_from_pretrained_in_the_package_says_trust_remote_code_false():
    """Every loader call in the source, on every path (exporters too, which the run above does not reach),
    writes trust_remote_code=False in the call itself, as a literal: a model folder never runs its own code."""
    import ast

    missing = []
    for path in sorted((ROOT / "precisionlab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_pretrained":
                kw = {k.arg: k.value for k in node.keywords}
                value = kw.get("trust_remote_code")
                if not (isinstance(value, ast.Constant) and value.value is False):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, missing


@pytest.mark.parametrize("command", [["compare", "model"], ["kvcache", "--scales", "dynamic"]], ids=" ".join)
def test_every_transformers_loader_gets_trust_remote_code_false(run, tiny_models, monkeypatch, command):
    import transformers

    calls = []
    for cls in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        real = cls.from_pretrained

        def spy(*a, _real=real, _name=cls.__name__, **kw):
            calls.append((_name, kw.get("trust_remote_code", "missing")))
            return _real(*a, **kw)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    r = run(*command, "--model", str(tiny_models["good"]), "--steps", "2", "--prompt", "the cat", "--json")
    assert r.code == 0, r.err
    names = {n for n, _ in calls}
    assert {"AutoTokenizer", "AutoModelForCausalLM"} <= names
    assert all(v is False for _, v in calls), calls


def test_a_model_folder_holding_a_fifo_is_refused_at_once(run, tiny_models, tmp_path):
    d = tmp_path / "fifo-model"
    d.mkdir()
    for f in tiny_models["good"].iterdir():
        if f.name != "config.json":
            (d / f.name).symlink_to(f)
    fifo = d / "config.json"
    os.mkfifo(fifo)
    done = threading.Event()

    def unblock():  # a reader stuck on the FIFO gets garbage after 20 s, so a regression fails rather than hangs
        if not done.wait(20):
            fd = os.open(fifo, os.O_WRONLY)
            os.write(fd, b"not json")
            os.close(fd)

    threading.Thread(target=unblock, daemon=True).start()
    t0 = time.monotonic()
    r = run("compare", "model", "--model", str(d), "--steps", "2")
    done.set()
    one_line(r, 2, "not a regular file")
    assert time.monotonic() - t0 < 15


def test_non_finite_logits_exit_1_naming_step_and_dtype(run, tiny_models):
    r = run("compare", "model", "--model", str(tiny_models["nan"]), "--steps", "3", "--prompt", "the cat")
    one_line(r, 1, "fp32", "step 0", "non-finite")


def test_hostile_tokens_and_prompt_are_shown_as_text(run, tiny_models):
    prompt = "the [/] [bold]x \x1b]0;owned\x07 cat"
    r = run("compare", "model", "--model", str(tiny_models["good"]), "--steps", "4", "--prompt", prompt)
    assert r.code == 0, r.err
    assert "\x1b" not in r.out and "\x07" not in r.out
    assert "[/]" in r.out and "[bold]x" in r.out and "\\x1b]0;owned\\x07" in r.out


# ---------------------------------------------------------------------------
# .pt weights_only, .npy/.npz without pickles, safetensors through its library


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pt_with_a_pickled_object_is_refused_and_never_runs(run, tmp_path):
    import torch

    marker = tmp_path / "PWNED"
    bad = tmp_path / "bad.pt"
    torch.save({"x": _Payload(str(marker))}, bad)
    good = tmp_path / "good.pt"
    torch.save({"x": torch.ones(3)}, good)
    one_line(run("compare", "tensors", str(bad), str(good)), 2, "weights_only")
    assert not marker.exists()


# The arguments a command needs before its --from (compare op: the op).
FROM_NEEDS = {"compare op": ["softmax"]}


# every registered command that takes --from (helpers.registered_commands), and compare tensors' two files
@pytest.mark.parametrize("command", [*registered_commands("--from"), "compare tensors"])
def test_npy_with_pickled_objects_is_refused(run, tmp_path, command):
    bad = tmp_path / "objects.npy"
    np.save(bad, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    if command == "compare tensors":
        args = ["compare", "tensors", str(bad), str(bad)]
    else:
        args = [*command.split(), *FROM_NEEDS.get(command, []), "--from", str(bad), "--device", "cpu"]
    one_line(run(*args), 2)


def test_npz_with_a_pickled_member_is_refused(run, tmp_path):
    bad = tmp_path / "objects.npz"
    np.savez(bad, x=np.array([{"a": 1}], dtype=object))
    one_line(run("compare", "tensors", str(bad), str(bad)), 2)


def test_safetensors_load_through_their_library(run, tmp_path):
    import torch
    from safetensors.torch import save_file

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, str(a))
    save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, str(b))
    r = run("compare", "tensors", str(a), str(b), "--json")
    assert r.code == 0, r.err
    assert [row["name"] for row in r.json()["rows"]] == ["w"]


# ---------------------------------------------------------------------------
# --plot writes exactly PATH, refused before the run


def _no_run(monkeypatch):
    """Make every experiment fail if it runs: a bad --plot must be refused first."""
    import importlib
    import pkgutil

    from precisionlab import experiments

    for info in pkgutil.iter_modules(experiments.__path__):
        m = importlib.import_module(f"precisionlab.experiments.{info.name}")
        if callable(getattr(m, "run", None)):
            monkeypatch.setattr(m, "run", lambda *a, **k: pytest.fail("the experiment ran before --plot was checked"))


# The cheapest run of each command that takes --plot; the test runs every
# registered command with the option (helpers.registered_commands) and fails
# for one missing here.
PLOT_ARGS = {
    "accumulate": ["--n", "10", "--device", "cpu"],
    "compare model": ["--steps", "2"],
    "nondeterminism": ["--n", "100", "--runs", "2", "--device", "cpu"],
    "tf32": ["--m", "8", "--n", "8", "--k", "8", "--device", "cpu"],
    "compare logits": ["docs/data/logits/ref.safetensors", "docs/data/logits/bf16.safetensors"],
    "compare logprobs": ["docs/data/logprobs/trainer.safetensors", "docs/data/logprobs/rollout-top-p.jsonl"],
    "formats": ["--n", "4096", "--shape", "16x256x16", "--dists", "normal", "--device", "cpu"],
    "attention": ["--seq", "512", "--rows", "8", "--std", "1"],
    "compare metrics": ["--tokens", "16"],
    "compare layers": ["--steps", "2"],
    "compare engine-layers": ["--engine", "embedded", "--reference", "embedded", "--steps", "2"],
    "compare rollout": ["--trainer", "embedded", "--rollout", "embedded", "--samples", "1", "--tokens", "4"],
    "compare builds": ["docs/data/builds/ref.safetensors", "docs/data/builds/f16.safetensors",
                       "docs/data/builds/q8_0.safetensors"],
    "attention-cases": ["--cases", "sink", "--dtypes", "fp32", "--max-keys", "4096"],
    "router": ["--tokens", "64", "--layers", "1", "--experts", "16", "--hidden", "16", "--top-k", "2"],
}


@pytest.mark.parametrize("bad", ["", "   ", "/dev/null", "DIR", "-", "DIR/missing/x.png", "DIR/x.txt", "DIR/noext",
                                 "/proc/x.png"])
@pytest.mark.parametrize("command", registered_commands("--plot"))
def test_bad_plot_paths_exit_2_before_the_run(run, tmp_path, monkeypatch, command, bad):
    assert command in PLOT_ARGS, f"{command} takes --plot: give its cheapest run in PLOT_ARGS"
    _no_run(monkeypatch)
    path = str(tmp_path) if bad == "DIR" else bad.replace("DIR", str(tmp_path))
    before = set(os.listdir(tmp_path))
    r = run(*command.split(), *[str(ROOT / a) if a.startswith("docs/") else a for a in PLOT_ARGS[command]],
            "--plot", path)
    one_line(r, 2, "--plot")
    assert set(os.listdir(tmp_path)) == before
    assert not os.path.exists("/dev/null.png") or os.path.getmtime("/dev/null.png") < time.time() - 3600


@pytest.mark.parametrize("ext,magic", [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_plot_writes_exactly_the_path_named(run, tmp_path, ext, magic):
    path = tmp_path / f"sum{ext}"
    r = run("accumulate", "--n", "100", "--device", "cpu", "--methods", "sequential", "--acc-dtypes", "fp32",
            "--plot", str(path))
    assert r.code == 0, r.err
    assert os.listdir(tmp_path) == [path.name]  # no temporary file left, no extension appended
    assert path.read_bytes().startswith(magic)
    assert str(path) in r.err  # the hint names the file written


def test_atomic_write_leaves_no_partial_file(tmp_path):
    from precisionlab.io import outputs

    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def dies(tmp):
        with open(tmp, "wb") as f:
            f.write(b"half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        outputs.atomic_write(target, dies)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def test_concurrent_atomic_writes_never_mix(tmp_path):
    from precisionlab.io import outputs

    target = tmp_path / "out.bin"
    payloads = [bytes([i]) * 200_000 for i in range(4)]
    seen = []

    def writer(p):
        for _ in range(10):
            outputs.atomic_write(target, p)

    def reader():
        for _ in range(50):
            if target.exists():
                seen.append(target.read_bytes())

    threads = [threading.Thread(target=writer, args=(p,)) for p in payloads] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert target.read_bytes() in payloads and all(s in payloads for s in seen)
    assert os.listdir(tmp_path) == ["out.bin"]


@pytest.mark.parametrize("bad", ["", "DIR", "DIR/missing/a.bin", "DIR/a.exe", "/dev/null"])
def test_check_output_path_is_reusable(tmp_path, bad):
    from precisionlab.io import outputs
    from precisionlab.errors import UsageError

    path = str(tmp_path) if bad == "DIR" else bad.replace("DIR", str(tmp_path))
    with pytest.raises(UsageError):
        outputs.check_output_path(path, (".bin", ".safetensors"), "--dump")
    assert outputs.check_output_path(str(tmp_path / "a.bin"), (".bin",), "--dump").name == "a.bin"


@pytest.mark.parametrize("bad", ["", "   "])
def test_compare_logits_empty_plot_path_exits_2(run, tmp_path, bad):
    """compare logits --plot '' ran and drew nothing (exit 0); every other --plot refuses it."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    files = []
    for tag in "ab":
        p = str(tmp_path / f"{tag}.safetensors")
        save_file({"logits": rng.standard_normal((6, 8)).astype(np.float32), "tokens": np.arange(6, dtype=np.int64)}, p)
        files.append(p)
    one_line(run("compare", "logits", *files, "--plot", bad), 2, "--plot")


# ---------------------------------------------------------------------------
# files that are not regular files, or that this user may not read


def test_a_fifo_is_refused_at_once(run, tmp_path):
    fifo = tmp_path / "values.npy"
    os.mkfifo(fifo)
    one_line(run("accumulate", "--from", str(fifo), "--device", "cpu"), 2, "FIFO")
    one_line(run("softmax", "--from", str(fifo), "--device", "cpu"), 2, "FIFO")


def test_a_socket_and_a_device_are_refused(run, tmp_path):
    sock_path = tmp_path / "s.npy"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock_path))
    try:
        one_line(run("accumulate", "--from", str(sock_path), "--device", "cpu"), 2, "socket")
    finally:
        s.close()
    one_line(run("accumulate", "--from", "/dev/zero", "--device", "cpu"), 2, "device")


def test_check_regular_file_is_reusable(tmp_path):
    from precisionlab.io import inputs
    from precisionlab.errors import UsageError

    f = tmp_path / "a.npy"
    f.write_bytes(b"x")
    assert inputs.check_regular_file(str(f), "A") == f
    os.mkfifo(tmp_path / "fifo")
    for bad in (tmp_path / "fifo", tmp_path, tmp_path / "missing", "/dev/null"):
        with pytest.raises(UsageError):
            inputs.check_regular_file(str(bad), "A")


@pytest.fixture
def refuse_reading(monkeypatch):
    """refuse(path): opening `path` for reading raises PermissionError, as the OS
    does for another user's mode-600 file (tests run as root, who reads
    everything, so os.open, open and io.open are told to refuse instead)."""
    import builtins
    import errno
    import io

    refused: set[str] = set()

    def denied(path):
        try:
            return os.path.realpath(os.fspath(path)) in refused
        except TypeError:  # a file descriptor
            return False

    real_os_open, real_open = os.open, builtins.open

    def os_open(path, flags, *a, **k):
        if denied(path) and not flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_os_open(path, flags, *a, **k)

    def open_(file, mode="r", *a, **k):
        if denied(file) and not set(mode) & set("wax+"):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(io, "open", open_)
    return lambda p: refused.add(os.path.realpath(p))


def _tensor_file(path, ext):
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    if ext == ".npy":
        np.save(path, x)
    elif ext == ".npz":
        np.savez(path, x=x)
    elif ext == ".safetensors":
        from safetensors.numpy import save_file
        save_file({"x": x}, str(path))
    else:
        import torch
        torch.save({"x": torch.from_numpy(x)}, path)


@pytest.mark.parametrize("reader", ["accumulate --from", "softmax --from", "compare op --from .npz",
                                    "compare op --from .pt", "compare op --from .safetensors",
                                    "compare tensors .npy", "compare tensors .npz", "compare tensors .pt",
                                    "compare tensors .safetensors", "--metrics --text", "compare logits"])
def test_an_input_this_user_may_not_read_is_one_line_and_exit_2(run, tmp_path, refuse_reading, reader):
    """--from a file the user may not read ended in 'internal error:
    PermissionError' (exit 1). Every reader goes through one check."""
    ext = reader.split()[-1] if reader.split()[-1].startswith(".") else ".npy"
    good, bad = tmp_path / f"good{ext}", tmp_path / f"bad{ext}"
    for p in (good, bad):
        _tensor_file(p, ext)
    text = tmp_path / "t.txt"
    text.write_text("ROMEO: hi\n" * 20)
    args = {
        "accumulate --from": ["accumulate", "--device", "cpu", "--from", str(bad)],
        "softmax --from": ["softmax", "--device", "cpu", "--from", str(bad)],
        "--metrics --text": ["compare", "metrics", "--tokens", "8", "--text", str(text)],
        "compare logits": ["compare", "logits", str(good), str(bad)],
    }.get(reader)
    if reader.startswith("compare op"):
        args = ["compare", "op", "softmax", "--device", "cpu", "--from", str(bad)]
    elif reader.startswith("compare tensors"):
        args = ["compare", "tensors", str(good), str(bad)]
    if reader == "compare logits":
        from precisionlab.io import logits_file
        for p in (good, bad):
            logits_file.write(str(p), np.zeros((4, 5), np.float32), np.arange(4), {})
    refused = text if reader == "--metrics --text" else bad
    refuse_reading(refused)
    r = run(*args)
    one_line(r, 2, str(refused), "Permission denied")


@pytest.mark.parametrize("command", [["compare", "model"], ["kvcache"]], ids=" ".join)
@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_model_file_this_user_may_not_read_is_named(run, tiny_models, refuse_reading, command, name):
    """A model.safetensors the user may not read was "No such file or directory"
    (safetensors' words for it): the folder's files are opened once before the run."""
    refuse_reading(tiny_models["good"] / name)
    r = run(*command, "--model", str(tiny_models["good"]), "--steps", "2", "--prompt", "the cat")
    one_line(r, 2, name, "Permission denied")
    assert "No such file" not in r.err


def test_a_file_that_becomes_unreadable_after_the_check_is_still_one_line(run, tmp_path, monkeypatch):
    """The .npy header read after check_regular_file maps an OSError too."""
    import builtins

    from precisionlab.io import inputs

    p = tmp_path / "x.npy"
    np.save(p, np.ones(4))
    real = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied", str(f))) if os.fspath(f) == str(p) else real(f, *a, **k))
    with pytest.raises(Exception) as e:
        inputs.npy_header(str(p))
    assert type(e.value).__name__ == "UsageError" and "Permission denied" in str(e.value)


def test_a_mode_000_file_is_refused_for_a_user_who_cannot_read_it(tmp_path):
    """The real thing, where the tests do not run as root."""
    if os.geteuid() == 0:
        pytest.skip("root reads mode-000 files: the in-process refusal above stands in")
    p = tmp_path / "x.npy"
    np.save(p, np.ones(4))
    p.chmod(0)
    one_line(cli("accumulate", "--device", "cpu", "--from", str(p)), 2, "Permission denied")


# ---------------------------------------------------------------------------
# tensor and logits files: empty, 0-d, integer, lying headers


@pytest.mark.parametrize("a,b,code", [(1.0, 1.0, 0), (1.0, 2.0, 1), (1.0, float("nan"), 1)])
@pytest.mark.parametrize("ext", [".npy", ".safetensors"])
def test_0d_tensors_are_compared(run, tmp_path, ext, a, b, code):
    """A scalar (0-d) tensor in two dumps ended in 'internal error: TypeError:
    return arrays must be of ArrayType' (np.subtract of 0-d arrays is a scalar)."""
    paths = []
    for tag, v in (("a", a), ("b", b)):
        p = tmp_path / f"{tag}{ext}"
        if ext == ".npy":
            np.save(p, np.float32(v))
        else:
            from safetensors.numpy import save_file
            save_file({"s": np.array(v, np.float32)}, str(p))
        paths.append(str(p))
    r = run("compare", "tensors", *paths, "--json")
    assert r.code == code, (r.code, r.err)
    row = r.json()["rows"][0]
    assert row["shapes"] == [[], []] and row["n"] == 1 and row["passed"] == (code == 0)
    assert "internal error" not in r.err


@pytest.mark.parametrize("ext", [".npz", ".safetensors"])
def test_a_tensor_file_without_tensors_is_a_usage_error(run, tmp_path, ext):
    """Two empty dumps printed '0 of 0 compared tensors within tolerance' and
    exited 0: a CI check on an engine that wrote nothing passed. A .pt without
    tensors was already refused; now every format is."""
    paths = [str(tmp_path / f"{t}{ext}") for t in "ab"]
    for p in paths:
        if ext == ".npz":
            np.savez(p)
        else:
            from safetensors.numpy import save_file
            save_file({}, p)
    one_line(run("compare", "tensors", *paths), 2, "holds no tensors")
    one_line(run("compare", "op", "softmax", "--device", "cpu", "--from", paths[0]), 2, "holds no tensors")


@pytest.mark.parametrize("op,arrays,bad", [
    ("rope", {"x": (4, 8), "positions": [0.5, 1, 2, 3]}, "positions"),
    ("rope", {"x": (4, 8), "positions": [0, float("nan"), 2, 3]}, "positions"),
    ("rope", {"x": (4, 8), "positions": [0, 1, float("inf"), 1e30]}, "positions"),
    ("attention", {"q": (2, 8, 4), "k": (2, 8, 4), "v": (2, 8, 4), "kv_start": [float("nan"), 1]}, "kv_start"),
    ("attention", {"q": (2, 8, 4), "k": (2, 8, 4), "v": (2, 8, 4), "kv_start": [2.0**40, 1]}, "kv_start"),
])
def test_integer_inputs_from_a_file_must_be_integers(run, tmp_path, op, arrays, bad):
    """A float positions/kv_start with NaN, 1.5 or 1e30 was cast to whatever integer
    the cast gave and the run went on (exit 0)."""
    rng = np.random.default_rng(0)
    data = {k: (rng.standard_normal(v).astype(np.float32) if isinstance(v, tuple) else np.array(v, np.float64))
            for k, v in arrays.items()}
    np.savez(tmp_path / "in.npz", **data)
    one_line(run("compare", "op", op, "--device", "cpu", "--from", str(tmp_path / "in.npz")), 2, bad, "integers")


def test_integer_inputs_from_a_file_still_work(run, tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "in.npz", x=rng.standard_normal((4, 8)).astype(np.float32),
             positions=np.array([0, 5, 1000, -3], np.float64))
    r = run("compare", "op", "rope", "--device", "cpu", "--from", str(tmp_path / "in.npz"), "--json")
    assert r.code in (0, 1), r.err


def test_a_tensor_file_passes_the_library_errors_through():
    from precisionlab.io import tensorfiles
    from precisionlab.native.loader import LibraryNotFound

    def get(name):
        raise LibraryNotFound("PRECISIONLAB_LIB=/x does not exist")

    tf = tensorfiles.TensorFile("ok.pt", ["a"], {"a": (3,)}, {"a": "float32"}, False, {}, get)
    with pytest.raises(LibraryNotFound):
        tf.get("a")


def test_reading_an_npz_reads_its_directory_once_whatever_the_member_count(run, tmp_path, monkeypatch):
    """10,000 small members gave no result in 600 s: every member reopened the
    archive, re-reading its whole central directory (N members: N^2 work).
    Counted, not timed: directory reads for N and 2N members must be the same."""
    import zipfile

    reads = []
    real = zipfile.ZipFile._RealGetContents
    monkeypatch.setattr(zipfile.ZipFile, "_RealGetContents", lambda self: (reads.append(1), real(self))[1])
    counts = {}
    for n in (50, 100):
        p = tmp_path / f"m{n}.npz"
        np.savez(p, **{f"t{i}": np.full(4, i, np.float32) for i in range(n)})
        reads.clear()
        r = run("compare", "tensors", str(p), str(p), "--json")
        assert r.code == 0 and len(r.json()["rows"]) == n, r.err
        counts[n] = len(reads)
    assert counts[50] == counts[100] <= 4, counts  # a few per file, never one per member


def _declared_logits(path, positions, vocab=1):
    """A safetensors logits file declaring `positions` rows, its data a hole
    (a sparse file: gigabytes declared, nothing on disk)."""
    header = {"logits": {"dtype": "BF16", "shape": [positions, vocab], "data_offsets": [0, 2 * positions * vocab]},
              "tokens": {"dtype": "I64", "shape": [positions],
                         "data_offsets": [2 * positions * vocab, 2 * positions * vocab + 8 * positions]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(8 + len(text) + 10 * positions * vocab)


@pytest.mark.parametrize("positions, limit", [(1 << 29, 1 << 30), (1 << 22, 512 << 20)], ids=["tokens", "results"])
def test_a_logits_file_declaring_too_many_positions_is_refused_from_its_header(run, tmp_path, monkeypatch,
                                                                               positions, limit):
    """512M declared positions under 1 GiB: the tokens were read with no memory
    check and the run ended in 'out of memory' (exit 1); the header says the
    size first. 4M under 512 MiB: the tokens fit (80 MB) but the results (about
    224 bytes a position for each side compared, 940 MB) do not; the check
    counted the tokens alone, and 512M positions that fitted were killed for
    memory minutes later."""
    from precisionlab.io import inputs

    monkeypatch.setattr(inputs, "memory_limit", lambda: limit)
    ref, yours = tmp_path / "ref.st", tmp_path / "yours.st"
    for p in (ref, yours):
        _declared_logits(p, positions)
    r = run("compare", "logits", str(ref), str(yours))
    one_line(r, 2, "needs about", f"{positions} positions", str(ref))


# ---------------------------------------------------------------------------
# overflowed values in compare tensors: the finite yardstick


def _three_way(tmp_path, ref32, low, yours):
    paths = []
    for tag, v in (("ref32", ref32), ("low", low), ("yours", yours)):
        np.save(tmp_path / f"{tag}.npy", np.asarray(v, np.float32))
        paths.append(str(tmp_path / f"{tag}.npy"))
    return paths


def _overflowed(n=1000):
    """REF_FP32, and REF_LOW as its fp16 rounding with element 0 overflowed to inf."""
    rng = np.random.default_rng(30)
    ref32 = rng.standard_normal(n).astype(np.float32)
    low = ref32.astype(np.float16).astype(np.float32)
    ref32[0], low[0] = 70000.0, np.inf  # past fp16's 65504
    return ref32, low


def test_one_overflowed_element_does_not_excuse_the_finite_rest(run, tmp_path):
    """REF_LOW inf at one element made the yardstick inf and ratio (3)/(2) 0:
    YOURS, matching that inf but 100x the rounding error everywhere else,
    was 'ok', exit 0."""
    ref32, low = _overflowed()
    yours = low + 100 * (low - ref32)  # inf at element 0 (inf + 100 * inf), 100x off elsewhere
    assert np.isinf(yours[0]) and np.isfinite(yours[1:]).all()
    r = run("compare", "tensors", *_three_way(tmp_path, ref32, low, yours), "--json")
    assert r.code == 1, r.err
    row = r.json()["rows"][0]
    assert row["flagged"] and row["status"] == "flagged"
    assert row["yardstick"] == "inf" and row["nonfinite_elements"] == 1
    # the finite elements' ratio is 100 (the error scaled by 100, rounded to fp32: within 1e-3 of it)
    assert row["ratio"] == pytest.approx(100, rel=1e-3)
    assert any("non-finite yardstick" in t and "tensor" in t for t in r.json()["takeaways"])


@pytest.mark.parametrize("case,rule", [("same", "overflow"), ("finite_where_inf", "ratio")])
def test_an_overflowed_yardstick_judges_the_finite_rest_and_the_overflow_fails(run, tmp_path, case, rule):
    """The finite rule changes nothing else: YOURS equal to REF_LOW has ratio 0
    on the finite elements, and a YOURS that is finite where REF_LOW overflowed
    is still a difference. But YOURS inf where REF_FP32 is finite is an
    overflow, flagged by its own rule and exit 1 even when REF_LOW overflows
    there too (issue 25: an fp16 overflow was 'rounding', exit 0, and a CI
    gate passed)."""
    ref32, low = _overflowed()
    yours = low.copy()
    if case == "finite_where_inf":
        yours[0] = 65504.0
    r = run("compare", "tensors", *_three_way(tmp_path, ref32, low, yours), "--json")
    assert r.code == 1, r.err
    row = r.json()["rows"][0]
    assert row["ratio"] == (0.0 if case == "same" else "inf")
    assert row["rule"] == rule and row["overflow"] == (1 if case == "same" else 0)
    if case == "same":
        assert row["reason"] == "overflow: 1 inf where REF_FP32 is finite"


def test_the_finite_yardstick_equals_the_whole_one_when_all_is_finite():
    from precisionlab.numerics import compare as comparison

    rng = np.random.default_rng(1)
    a = rng.standard_normal(100)
    b, c = a + 1e-3 * rng.standard_normal(100), a + 2e-3 * rng.standard_normal(100)
    fin = comparison.finite_yardstick(a, b, c)
    assert fin["nonfinite_elements"] == 0
    y2, y3 = comparison.rel_l2(b, a), comparison.rel_l2(c, b)
    assert fin["yardstick_finite"] == y2 and fin["rel_l2_finite"] == y3
    assert comparison.three_way_ratio(y3, fin) == comparison.ratio(y3, y2)


# ---------------------------------------------------------------------------
# outputs: never an input, never half written


@pytest.mark.parametrize("case", ["save_logits_is_text", "save_logits_bf16_is_text", "save_logits_hard_link",
                                  "plot_is_text", "save_logits_in_model", "plot_is_logits_ref",
                                  "plot_is_logits_yours", "plot_is_from", "plot_is_model_file",
                                  "dump_is_model", "dump_holds_text_dir", "dump_inside_model",
                                  "plot_in_trainer_model", "plot_in_rollout_model", "plot_in_logprobs_tokenizer",
                                  "export_over_its_model", "export_inside_its_model", "export_onto_a_model_file"])
def test_an_output_that_is_an_input_is_refused_before_the_run(run, tmp_path, monkeypatch, case):
    """--save-logits FILE naming the --text just read overwrote it, exit 0.
    Every writing option is checked against every input of its run (the
    rollout mode's --plot, compare logprobs' --plot and export's --out wrote
    into the folders they read, exit 0)."""
    if case == "export_onto_a_model_file":
        pytest.importorskip("gguf")
    fail_if_a_model_runs(monkeypatch)
    text = tmp_path / "text.png"  # a name every output option accepts
    text.write_text("ROMEO: hello\n" * 50)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "p.png").write_bytes(b"weights")
    link = tmp_path / "link.st"
    os.link(text, link)
    dump_home = tmp_path / "dumps"
    dump_home.mkdir()
    (dump_home / "m").mkdir()  # a model folder inside the dump's: --dump would write around what it reads
    (dump_home / "m" / "config.json").write_text("{}")
    args = {
        "save_logits_is_text": ["compare", "metrics", "--text", str(text), "--save-logits", str(text)],
        "save_logits_bf16_is_text": ["compare", "metrics", "--dtypes", "bf16", "--text", str(text),
                                     "--save-logits", f"bf16={text}"],
        "save_logits_hard_link": ["compare", "metrics", "--text", str(text), "--save-logits", str(link)],
        "plot_is_text": ["compare", "metrics", "--text", str(text), "--plot", str(text)],
        "save_logits_in_model": ["compare", "metrics", "--model", str(model), "--save-logits",
                                 str(model / "config.json")],
        "plot_is_logits_ref": ["compare", "logits", str(text), str(link.with_name("y")), "--plot", str(text)],
        "plot_is_logits_yours": ["compare", "logits", str(link), str(text), "--plot", str(text)],
        "plot_is_from": ["accumulate", "--device", "cpu", "--from", str(text), "--plot", str(text)],
        "plot_is_model_file": ["compare", "model", "--model", str(model), "--plot", str(model / "p.png")],
        "dump_is_model": ["compare", "layers", "--model", str(model), "--dump", str(model)],
        "dump_holds_text_dir": ["compare", "layers", "--model", str(dump_home / "m"),
                                "--dump", str(dump_home)],
        "dump_inside_model": ["compare", "layers", "--model", str(model), "--dump", str(model / "d")],
        "plot_in_trainer_model": ["compare", "rollout", "--trainer", str(model), "--rollout", "embedded",
                                  "--plot", str(model / "p.png")],
        "plot_in_rollout_model": ["compare", "rollout", "--trainer", "embedded", "--rollout", f"hf:{model}",
                                  "--plot", str(model / "p.png")],
        "plot_in_logprobs_tokenizer": ["compare", "logprobs", str(link), str(link), "--tokenizer", str(model),
                                       "--plot", str(model / "p.png")],
        "export_over_its_model": ["export", f"hf:{model}", "--to", "hf", "--out", str(model)],
        "export_inside_its_model": ["export", f"hf:{model}", "--to", "hf", "--out", str(model / "d")],
        "export_onto_a_model_file": ["export", f"hf:{model}", "--to", "gguf:f32", "--out", str(model / "p.png")],
    }[case]
    before = {p: p.read_bytes() for p in (text, model / "config.json", model / "p.png")}
    r = run(*args)
    one_line(r, 2, "which the run reads")
    assert {p: p.read_bytes() for p in before} == before
    assert not (model / "d").exists()


@pytest.mark.parametrize("member", ["dir", "link"])
def test_a_dump_member_that_cannot_be_a_file_is_refused_before_the_run(run, tmp_path, monkeypatch, member):
    """DIR/fp32.safetensors being a directory ended in 'internal error:
    IsADirectoryError' after the whole run."""
    fail_if_a_model_runs(monkeypatch)
    d = tmp_path / "d"
    d.mkdir()
    if member == "dir":
        (d / "bf16.safetensors").mkdir()
    else:
        (d / "bf16.safetensors").symlink_to(tmp_path / "elsewhere")
    r = run("compare", "layers", "--steps", "1", "--dtypes", "bf16", "--dump", str(d))
    one_line(r, 2, "--dump", "bf16.safetensors")
    assert sorted(os.listdir(d)) == ["bf16.safetensors"]  # nothing written, no temporary file


def test_a_failed_dump_write_leaves_no_temporary_file(tmp_path):
    """atomic_write removes its temporary file whatever stops the write (here the rename fails)."""
    from precisionlab.io import outputs

    (tmp_path / "x.safetensors").mkdir()
    with pytest.raises(OSError):
        outputs.atomic_write(tmp_path / "x.safetensors", b"data")
    assert os.listdir(tmp_path) == ["x.safetensors"]


@pytest.mark.parametrize("dtype, values, code", [
    (np.int64, [2**60 + 1, -2**60], 2),       # 61 significant bits: float64 would round it, and the sum to 0
    (np.int64, [2**60, -2**60, 5], 0),        # past 2^53 but exactly a double
    (np.uint64, [2**64 - 1, 1], 2),
    (np.int64, [-2**63, 1], 0),               # -2^63 is a double
    (np.longdouble, [1.0, 2.0], 0),
])
def test_integers_and_long_doubles_are_read_only_where_exactly_doubles(run, tmp_path, dtype, values, code):
    """accumulate --from and compare tensors measure against the values as
    read: a value float64 would round is refused by name, not rounded."""
    a = np.array(values, dtype=dtype)
    if dtype is np.longdouble and np.finfo(np.longdouble).nmant > 52:
        a[0] += np.longdouble(2) ** -60  # a bit past a double's 53 (x86's 80-bit long double has 64)
        code = 2
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", np.zeros(len(values)))
    for args in (["accumulate", "--device", "cpu", "--from", str(tmp_path / "a.npy"), "--dtype", "fp64",
                  "--acc-dtypes", "fp64", "--variants", "sequential"],
                 ["compare", "tensors", str(tmp_path / "a.npy"), str(tmp_path / "b.npy")]):
        r = run(*args)
        if code == 2:
            one_line(r, 2, "not exactly a double", "element 0")
        else:
            assert r.code in (0, 1) and "not exactly" not in r.err, (args, r.err)
