"""Hostile and careless inputs, every command: no foreign code runs, only the
named files are written, no input ends in an internal error, a hang or a C
error string, and strings from outside are shown as text.

Most cases run the CLI in process (main() with sys.argv set, output captured),
which keeps the module fast; the few that need a real process (stdin, a
signal, the output encoding, a FIFO that would hang) use a subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from helpers import ROOT, cli, save_tiny_qwen, strict_json

SEED_COMMANDS = [
    ["accumulate", "--n", "10", "--device", "cpu"],
    ["softmax", "--values", "1,2", "--device", "cpu"],
    ["compare", "op", "softmax", "--shape", "2x8", "--device", "cpu"],
    ["compare", "model", "--steps", "2"],
    ["nondeterminism", "--n", "100", "--runs", "2", "--sections", "threads", "--device", "cpu"],
    ["tf32", "--m", "8", "--n", "8", "--k", "8", "--no-sweep", "--device", "cpu"],
    ["bench", "accumulate", "--cpu-n", "1000", "--device", "cpu", "--quick"],
]


# ---------------------------------------------------------------------------
# the in-process runner


class Result:
    def __init__(self, code, out, err):
        self.code, self.out, self.err = code, out, err

    def json(self):
        return strict_json(self.out)


@pytest.fixture
def run(capsys, monkeypatch):
    """run(*args) -> Result: precisionlab's main() as the console script runs it."""
    from precisionlab import cli as cli_mod

    monkeypatch.delenv("PRECISIONLAB_DEBUG", raising=False)

    def _run(*args: str) -> Result:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["precisionlab", *args])
        with pytest.raises(SystemExit) as e:
            cli_mod.main()
        cap = capsys.readouterr()
        code = e.value.code if isinstance(e.value.code, int) else (0 if e.value.code is None else 1)
        return Result(code, cap.out, cap.err)

    return _run


def one_line(r: Result, code: int, *words: str) -> None:
    assert r.code == code, (r.code, r.out[-500:], r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("precisionlab: "), r.err
    assert "internal error" not in r.err and "Traceback" not in r.err
    assert not re.search(r"\bpl_[a-z_]+:", r.err), f"a C error string reached the user: {r.err}"
    for w in words:
        assert w in r.err, (w, r.err)


# ---------------------------------------------------------------------------
# 3. --seed outside 0 ... 2^64-1, in every command


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
@pytest.mark.parametrize("args", SEED_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_seed_outside_uint64_exits_2_naming_the_range(run, args, seed):
    one_line(run(*args, "--seed", seed), 2, "--seed", "2^64-1")


def test_the_largest_seed_is_accepted(run):
    r = run("accumulate", "--n", "10", "--dist", "normal", "--device", "cpu", "--methods", "sequential",
            "--accumulators", "fp32", "--seed", str(2**64 - 1), "--json")
    assert r.code == 0, r.err
    assert r.json()["params"]["seed"] == 2**64 - 1


# ---------------------------------------------------------------------------
# 3. empty lists, GPU-only methods on the CPU, --rows without --cols


@pytest.mark.parametrize("args", [
    ["nondeterminism", "--sections", ",,", "--device", "cpu"],
    ["nondeterminism", "--sections", "", "--device", "cpu"],
    ["bench", ",,", "--device", "cpu"],
    ["bench", "--sections", "", "--device", "cpu"],
    ["accumulate", "--methods", "", "--device", "cpu"],
    ["accumulate", "--methods", ",,", "--device", "cpu"],
    ["accumulate", "--accumulators", "", "--device", "cpu"],
    ["accumulate", "--accumulators", " , ", "--device", "cpu"],
    ["softmax", "--methods", ",,", "--device", "cpu"],
    ["softmax", "--dtype", ",", "--device", "cpu"],
    ["compare", "op", "softmax", "--dtype", ",", "--device", "cpu"],
    ["compare", "model", "--dtypes", ","],
], ids=lambda a: " ".join(a))
def test_empty_lists_exit_2(run, args):
    one_line(run(*args), 2)


@pytest.mark.parametrize("args,where", [
    (["accumulate", "--methods", "tree", "--device", "cpu"], "GPU"),
    (["accumulate", "--methods", "tree_kahan", "--device", "cpu"], "GPU"),
    (["accumulate", "--methods", "atomic", "--device", "cpu"], "GPU"),
    (["accumulate", "--methods", "sequential,tree", "--device", "cpu"], "GPU"),
    (["softmax", "--methods", "single_pass", "--device", "cpu", "--values", "1,2"], "GPU"),
    (["softmax", "--methods", "online_vec", "--device", "cpu"], "GPU"),
    (["softmax", "--methods", "stable,single_pass", "--device", "cpu"], "GPU"),
    (["bench", "softmax", "--device", "cpu"], "GPU"),
    (["bench", "matmul", "--device", "cpu"], "GPU"),
    (["bench", "--sections", "accumulate,softmax", "--device", "cpu"], "GPU"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_gpu_only_methods_on_the_cpu_exit_2_saying_where_they_run(run, args, where):
    one_line(run(*args), 2, where)


@pytest.mark.parametrize("args", [["--cols", "8"], ["--rows", "3"]])
def test_softmax_rows_and_cols_go_together(run, args):
    one_line(run("softmax", *args, "--device", "cpu"), 2, "--rows", "--cols")


def test_softmax_rows_and_cols_together_work(run):
    r = run("softmax", "--rows", "3", "--cols", "8", "--device", "cpu", "--json")
    assert r.code == 0, r.err
    assert r.json()["params"]["cases"] == ["random 3x8"]


# ---------------------------------------------------------------------------
# 3. tolerances


@pytest.mark.parametrize("opt", ["--atol", "--rtol"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1e-3"])
def test_tolerances_must_be_finite_and_non_negative(run, opt, value):
    one_line(run("compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", opt, value), 2, opt)


def test_tolerance_validator_is_reusable():
    from precisionlab.numerics import compare as comparison
    from precisionlab.errors import UsageError

    comparison.check_override(None, None)
    comparison.check_override(0.0, 0.0)
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(UsageError):
            comparison.check_override(1e-3, bad)


# ---------------------------------------------------------------------------
# 3. nondeterminism below its emulated block count


@pytest.mark.parametrize("n", [1, 100, 527])
def test_nondeterminism_small_n_works(run, n):
    r = run("nondeterminism", "--n", str(n), "--runs", "2", "--sections", "atomics,threads", "--device", "cpu",
            "--json")
    assert r.code == 0, r.err
    d = r.json()
    assert d["params"]["emulated_blocks"] == min(n, 528)
    assert {row["section"] for row in d["rows"]} == {"atomics", "threads"}


# ---------------------------------------------------------------------------
# 3. what an --impl returns


IMPLS = '''
import sys
import numpy as np
import torch

def returns_none(x): return None
def returns_numpy(x): return torch.softmax(x.float(), -1).numpy()
def wrong_shape(x): return torch.softmax(x, -1)[:, :1]
def wrong_dtype(x): return torch.softmax(x.double(), -1)
def raises(x): raise ValueError("kernel exploded \\x1b]0;owned\\x07")
def exits(x): sys.exit(3)
def returns_list(x): return torch.softmax(x, -1).tolist()
def correct(x): return torch.softmax(x, -1)
'''


def _importable(tmp_path, monkeypatch, name: str, code: str) -> str:
    """A module of the user's, importable by `name` for the test (removed after by monkeypatch)."""
    (tmp_path / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


@pytest.fixture
def impl_module(tmp_path, monkeypatch):
    yield _importable(tmp_path, monkeypatch, "hostile_impls", IMPLS)
    sys.modules.pop("hostile_impls", None)


@pytest.mark.parametrize("fn,words", [
    ("returns_none", ["returned None"]),
    ("returns_numpy", ["numpy.ndarray"]),
    ("wrong_shape", ["shape (2, 1)", "(2, 8)"]),
    ("wrong_dtype", ["torch.float64"]),
    ("raises", ["ValueError", "kernel exploded"]),
    ("exits", ["sys.exit(3)"]),
    ("returns_list", ["list"]),
])
def test_a_bad_impl_exits_1_naming_it_and_what_it_returned(run, impl_module, fn, words):
    r = run("compare", "op", "softmax", "--shape", "2x8", "--dtype", "bf16", "--device", "cpu",
            "--impl", f"{impl_module}:{fn}")
    one_line(r, 1, f"{impl_module}:{fn}", *words)
    assert "\x1b" not in r.err and "\x07" not in r.err


def test_a_correct_impl_passes(run, impl_module):
    r = run("compare", "op", "softmax", "--shape", "2x8", "--dtype", "bf16", "--device", "cpu",
            "--impl", f"{impl_module}:correct", "--json")
    assert r.code == 0, r.err


# ---------------------------------------------------------------------------
# 1. foreign code never runs: compare model


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
# 1. .pt weights_only, .npy/.npz without pickles, safetensors through its library


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


@pytest.mark.parametrize("command", [["accumulate", "--from"], ["softmax", "--from"], ["compare", "tensors"]])
def test_npy_with_pickled_objects_is_refused(run, tmp_path, command):
    bad = tmp_path / "objects.npy"
    np.save(bad, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    args = [*command, str(bad)] + ([str(bad)] if command[-1] == "tensors" else ["--device", "cpu"])
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
# 1. strings from outside are text: report.safe_text / report.printable

HOSTILE = ["[/]", "[bold red]boom[/bold red]", "\x1b]0;owned\x07", "a\rb", "\x9b31mred", "e\u202eRIGHT-TO-LEFT",
           ":thumbs_up:", "trailing\\", "nul\x00del\x7f", "tab\there\nnewline"]


@pytest.mark.parametrize("s", HOSTILE, ids=repr)
def test_safe_text_shows_the_string_as_written_with_controls_escaped(s):
    from rich.console import Console

    from precisionlab.report import console as report

    shown = report.printable(s)
    assert not re.search("[\x00-\x1f\x7f-\x9f\u202a-\u202e]", shown)
    c = Console(width=200, file=open(os.devnull, "w"), emoji=False, record=True, color_system=None)
    c.print(report.safe_text(s), highlight=False)
    c.print("[bold]" + report.safe_text(s) + "[/bold]", highlight=False)  # inside markup, too
    expected = shown[:-1] + "\\x5c" if shown.endswith("\\") else shown  # a trailing backslash is shown escaped
    assert c.export_text().split("\n")[:2] == [expected, expected]


@pytest.mark.parametrize("name", ["[/]", "x\x1b]0;owned\x07y", "[red]z", ":thumbs_up:"], ids=repr)
def test_a_hostile_file_name_is_shown_as_text(run, tmp_path, name):
    f = tmp_path / f"{name}.npy"  # "[/]" names a file "]" in a folder "[": the path holds the closing tag
    f.parent.mkdir(parents=True, exist_ok=True)
    np.save(f, np.full(10, 0.5))
    r = run("accumulate", "--from", str(f), "--device", "cpu", "--methods", "sequential", "--accumulators", "fp32")
    assert r.code == 0, r.err
    assert "\x1b" not in r.out and "\x07" not in r.out
    assert report_printable(name) in r.out


def report_printable(s):
    from precisionlab.report import console as report

    return report.printable(s)


def test_one_line_errors_escape_control_characters(run):
    r = run("accumulate", "--from", "/nonexistent/\x1b]0;owned\x07.npy")
    one_line(r, 2)
    assert "\x1b" not in r.err and "\\x1b" in r.err


# ---------------------------------------------------------------------------
# 2. --plot writes exactly PATH, refused before the run


def _no_run(monkeypatch):
    """Make every experiment fail if it runs: a bad --plot must be refused first."""
    import importlib

    for mod in ("accumulate", "model", "nondeterminism", "tf32"):
        m = importlib.import_module(f"precisionlab.experiments.{mod}")
        monkeypatch.setattr(m, "run", lambda *a, **k: pytest.fail("the experiment ran before --plot was checked"))


PLOT_COMMANDS = {
    "accumulate": ["accumulate", "--n", "10", "--device", "cpu"],
    "model": ["compare", "model", "--steps", "2"],
    "nondeterminism": ["nondeterminism", "--n", "100", "--runs", "2", "--device", "cpu"],
    "tf32": ["tf32", "--m", "8", "--n", "8", "--k", "8", "--device", "cpu"],
}


@pytest.mark.parametrize("bad", ["", "   ", "/dev/null", "DIR", "-", "DIR/missing/x.png", "DIR/x.txt", "DIR/noext",
                                 "/proc/x.png"])
@pytest.mark.parametrize("command", list(PLOT_COMMANDS))
def test_bad_plot_paths_exit_2_before_the_run(run, tmp_path, monkeypatch, command, bad):
    _no_run(monkeypatch)
    path = str(tmp_path) if bad == "DIR" else bad.replace("DIR", str(tmp_path))
    before = set(os.listdir(tmp_path))
    r = run(*PLOT_COMMANDS[command], "--plot", path)
    one_line(r, 2, "--plot")
    assert set(os.listdir(tmp_path)) == before
    assert not os.path.exists("/dev/null.png") or os.path.getmtime("/dev/null.png") < time.time() - 3600


@pytest.mark.parametrize("ext,magic", [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_plot_writes_exactly_the_path_named(run, tmp_path, ext, magic):
    path = tmp_path / f"sum{ext}"
    r = run("accumulate", "--n", "100", "--device", "cpu", "--methods", "sequential", "--accumulators", "fp32",
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


# ---------------------------------------------------------------------------
# 3. files that are not regular files


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


# ---------------------------------------------------------------------------
# 3. no arguments, Ctrl-C


def test_no_arguments_prints_the_help():
    r = cli()
    assert "Usage" in r.out and "accumulate" in r.out
    assert "precisionlab: \n" not in r.err and not r.err.strip().startswith("precisionlab:")


def test_ctrl_c_inside_a_long_kernel_answers_within_2_s(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PRECISIONLAB_DEBUG", None)
    p = subprocess.Popen([sys.executable, "-m", "precisionlab", "tf32", "--m", "4096", "--n", "4096", "--k", "4096",
                          "--no-sweep", "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=tmp_path)
    time.sleep(4)  # past the imports, into the matmuls
    assert p.poll() is None, "the run ended before the signal"
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    elapsed = time.monotonic() - t0
    assert p.returncode == 130 and err.decode() == "precisionlab: interrupted\n", (p.returncode, err)
    assert elapsed < 2.0, elapsed
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------
# 3. output that cannot encode Unicode, narrow terminals


def test_ascii_only_output_degrades():
    r = cli("accumulate", "--n", "100", "--device", "cpu", "--methods", "sequential,kahan", "--accumulators",
            "fp32,bf16", env={"PYTHONIOENCODING": "ascii", "LANG": "C", "LC_ALL": "C"})
    assert r.code == 0, r.err
    r.out.encode("ascii")
    assert "internal error" not in r.err and "\n* " in r.out  # ASCII bullets


@pytest.mark.parametrize("args", [
    ["compare", "model", "--steps", "3"],
    ["softmax", "--values", "1,2", "--device", "cpu"],
    ["nondeterminism", "--n", "100", "--runs", "2", "--sections", "threads", "--device", "cpu"],
], ids=lambda a: a[0] if a[0] != "compare" else "compare model")
def test_an_ascii_stdout_gets_ascii(run, monkeypatch, args):
    import io

    raw = io.BytesIO()
    ascii_out = io.TextIOWrapper(raw, encoding="ascii", errors="strict", write_through=True)
    monkeypatch.setattr(sys, "stdout", ascii_out)
    r = run(*args)
    assert r.code == 0, r.err
    text = raw.getvalue().decode("ascii")  # raises on anything else
    assert "internal error" not in r.err and "\n* " in text


NARROW = {
    "accumulate": ["accumulate", "--n", "100", "--device", "cpu", "--methods", "sequential,kahan,pairwise",
                   "--accumulators", "fp32,bf16"],
    "softmax": ["softmax", "--values", "1,2,3;-inf,-inf,-inf", "--device", "cpu", "--methods", "naive,stable"],
    "compare op": ["compare", "op", "rmsnorm", "--shape", "2x16", "--device", "cpu"],
    "tf32": ["tf32", "--m", "16", "--n", "16", "--k", "32", "--no-sweep", "--device", "cpu"],
    "nondeterminism": ["nondeterminism", "--n", "100", "--runs", "2", "--sections", "atomics,threads",
                       "--device", "cpu"],
}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]\d+)?")


@pytest.mark.parametrize("width", [20, 30, 40, 50, 60])
@pytest.mark.parametrize("command", list(NARROW))
def test_narrow_terminals_keep_every_number(run, monkeypatch, command, width):
    """Every number of the wide table is in the narrow output (folding may
    break a line, never drop a digit)."""
    _narrow_keeps_numbers(run, monkeypatch, NARROW[command], width)


def _narrow_keeps_numbers(run, monkeypatch, argv, width):
    from precisionlab.report import console as report

    def table_numbers(text):
        """Numbers in the table cells, except timings (they change from run to run)."""
        out, header = [], []
        for line in text.splitlines():
            if line.startswith("┃"):
                header = [h.strip() for h in line.strip("┃").split("┃")]
            elif line.startswith("│"):
                cells = [c.strip() for c in line.strip("│").split("│")]
                out += [m for h, c in zip(header, cells) if not re.search(r"time|/s", h)
                        for m in _NUMBER.findall(c)]
        return out

    monkeypatch.setattr(report.stdout, "width", 400)
    wide = run(*argv)
    assert wide.code in (0, 1), wide.err
    numbers = table_numbers(wide.out)
    assert numbers
    monkeypatch.setattr(report.stdout, "width", width)
    narrow = run(*argv)
    assert narrow.code == wide.code, narrow.err
    assert max(len(line) for line in narrow.out.splitlines()) <= width
    flat = "".join(narrow.out.split())
    missing = [n for n in numbers if n not in flat]
    assert not missing, missing


NARROW_NEWER = {  # the newer renderers, at the narrowest width the issue met (COLUMNS=20)
    "formats": ["formats", "--n", "1024", "--shape", "16x64x16", "--dists", "normal", "--rules", "floor",
                "--device", "cpu"],
    "kvcache": ["kvcache", "--steps", "2", "--scales", "unit"],
    "compare model --layers": ["compare", "model", "--layers", "--steps", "2", "--dtypes", "bf16"],
}


@pytest.mark.parametrize("command", list(NARROW_NEWER))
def test_narrow_terminals_keep_every_number_of_the_newer_commands(run, monkeypatch, command):
    _narrow_keeps_numbers(run, monkeypatch, NARROW_NEWER[command], 20)


def test_columns_sets_the_width_of_a_pipe():
    r = cli(*NARROW["accumulate"], env={"COLUMNS": "40"})
    assert r.code == 0, r.err
    assert max(len(line) for line in r.out.splitlines()) <= 40


# ---------------------------------------------------------------------------
# the audit of hostile option values and files (branch hostile)


@pytest.mark.parametrize("args", [
    ["compare", "op", "softmax", "--shape", "2x8", "--device", "cpu"],
    ["tf32", "--m", "8", "--n", "8", "--k", "8", "--no-sweep", "--device", "cpu"],
    ["compare", "model", "--steps", "1"],
], ids=lambda a: " ".join(a[:2]))
def test_absurd_threads_exit_2_instead_of_crashing_torch(args):
    """--threads 100000 segfaulted in torch's OpenMP pool (20000: libgomp's
    'Thread creation failed', exit 1). A subprocess: the crash would end pytest."""
    r = cli(*args, "--threads", "100000", timeout=120)
    assert r.code == 2, (r.code, r.err[-500:])
    assert r.err.count("\n") == 1 and r.err.startswith("precisionlab: --threads must be at most"), r.err


def test_threads_upper_bound_is_per_core():
    from precisionlab.runtime import threads
    from precisionlab.errors import UsageError

    assert threads.check(threads.max_threads()) == threads.max_threads()
    with pytest.raises(UsageError, match="at most"):
        threads.check(threads.max_threads() + 1)


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


@pytest.mark.parametrize("args,opt", [
    (["compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--impl", ""], "--impl"),
    (["compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--out-dtype", ""], "--out-dtype"),
    (["compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--from", ""], "--from"),
    (["compare", "model", "--steps", "1", "--model", ""], "--model"),
    (["compare", "model", "--steps", "1", "--layers", "--model", ""], "--model"),
    (["compare", "model", "--metrics", "--tokens", "16", "--text", ""], "--text"),
    (["kvcache", "--steps", "1", "--model", ""], "--model"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_an_empty_name_is_refused_not_taken_for_the_default(run, args, opt):
    """--impl "" ran (and passed) the project's own kernels, --model "" the
    embedded model, --text "" the shipped text, --from "" random inputs: a
    script whose variable was unset got a green run of something else."""
    one_line(run(*args), 2, opt, "empty")


@pytest.mark.parametrize("args", [["accumulate", "--device", "cpu", "--from", ""],
                                  ["softmax", "--device", "cpu", "--from", ""],
                                  ["compare", "tensors", "", "x.npy"]], ids=lambda a: a[0])
def test_an_empty_path_is_named_as_such(run, args):
    """It was 'is a directory, not a file' (Path('') is '.')."""
    r = run(*args)
    one_line(r, 2, "empty path")
    assert "directory" not in r.err


@pytest.mark.parametrize("blocks", ["", " "])
def test_formats_empty_blocks_list_exits_2(run, blocks):
    """--blocks "" ran the default 16,32, where --formats "", --rules "" and --dists "" exit 2."""
    one_line(run("formats", "--n", "64", "--shape", "4x32x4", "--device", "cpu", "--blocks", blocks), 2, "--blocks")


@pytest.mark.parametrize("scale", ["nan", "inf", "-inf"])
def test_softmax_scale_must_be_finite(run, scale):
    """--scale nan turned every random logit into NaN and exited 0 (compare op already refused it)."""
    one_line(run("softmax", "--rows", "2", "--cols", "8", "--device", "cpu", "--scale", scale), 2, "--scale")



@pytest.mark.parametrize("args,field", [
    (["softmax", "--values", "1,2", "--device", "cpu", "--methods", "stable", "--dtype", "fp32,fp32,float32"], "dtypes"),
    (["compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--cases", "random", "--dtype",
      "bf16,bf16,bfloat16"], "dtypes"),
    (["compare", "model", "--steps", "1", "--dtypes", "bf16,bf16"], "dtypes"),
    (["compare", "model", "--layers", "--steps", "1", "--dtypes", "bf16,bf16"], "dtypes"),
], ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else a)
def test_a_repeated_dtype_runs_once(run, args, field):
    """Repeats in these lists ran the same work twice and printed every row twice;
    the other lists (--variants, --accumulators, --sections, ...) already dropped them."""
    r = run(*args, "--json")
    assert r.code in (0, 1), r.err
    d = r.json()
    assert d["params"][field] in (["fp32"], ["bf16"]), d["params"][field]
    keys = [json.dumps({k: v for k, v in row.items() if isinstance(v, (str, int, float)) or v is None}, sort_keys=True)
            for row in d["rows"]]
    assert len(keys) == len(set(keys)), "repeated rows"


def test_a_closed_stdout_is_one_line_not_a_traceback():
    """`precisionlab info >&-` ended in a traceback (sys.stdout is None, report's console read its isatty())."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PRECISIONLAB_DEBUG", None)
    p = subprocess.run([sys.executable, "-m", "precisionlab", "accumulate", "--n", "10", "--device", "cpu"],
                       stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, timeout=120,
                       preexec_fn=lambda: os.close(1))
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith("precisionlab: stdout is closed") and p.stderr.count("\n") == 1, p.stderr


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


def test_compare_op_shape_and_from_are_one_or_the_other(run, tmp_path):
    """--shape 8x8 with a 4x8 --from file ran the file's 4x8 and reported shape [8, 8] in params."""
    np.save(tmp_path / "x.npy", np.ones((4, 8), np.float32))
    one_line(run("compare", "op", "softmax", "--device", "cpu", "--shape", "8x8", "--from", str(tmp_path / "x.npy")),
             2, "--shape", "--from")


def test_a_full_disk_is_a_failed_run_said_as_the_system_says_it():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    p = subprocess.run(f"{sys.executable} -m precisionlab accumulate --n 10 > /dev/full", shell=True,
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=120)
    one_line(Result(p.returncode, p.stdout, p.stderr), 1, "No space left on device")


def test_no_gpu_is_exit_3_without_the_c_functions_name():
    from precisionlab import native

    if native.gpu_status().count:
        pytest.skip("a GPU is present")
    one_line(cli("softmax", "--device", "cuda"), 3, "no CUDA GPU available")


# ---------------------------------------------------------------------------
# issue 30: the newer commands (--layers, --dump, --metrics, compare logits,
# compare tensors, formats, kvcache, completion, the library lookup)


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


@pytest.mark.parametrize("case,code", [("same", 0), ("finite_where_inf", 1)])
def test_an_overflowed_yardstick_still_passes_a_faithful_engine(run, tmp_path, case, code):
    """The finite rule changes nothing else: YOURS equal to REF_LOW passes, and
    a YOURS that is finite where REF_LOW overflowed is still a difference."""
    ref32, low = _overflowed()
    yours = low.copy()
    if case == "finite_where_inf":
        yours[0] = 65504.0
    r = run("compare", "tensors", *_three_way(tmp_path, ref32, low, yours), "--json")
    assert r.code == code, r.err
    row = r.json()["rows"][0]
    assert row["ratio"] == (0.0 if code == 0 else "inf")


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


def _fail_if_run(monkeypatch):
    """Every model-running experiment fails if it starts: the refusal must come first."""
    from precisionlab.engines import embedded, hf
    from precisionlab.experiments import logits

    boom = lambda *a, **k: pytest.fail("the run started before its outputs were checked")  # noqa: E731
    monkeypatch.setattr(embedded.EmbeddedEngine, "__init__", boom)  # opening an engine is the run's start
    monkeypatch.setattr(hf.HFEngine, "__init__", boom)
    monkeypatch.setattr(logits, "distribution", None)


@pytest.mark.parametrize("case", ["save_logits_is_text", "save_logits_bf16_is_text", "save_logits_hard_link",
                                  "plot_is_text", "save_logits_in_model", "plot_is_logits_ref",
                                  "plot_is_logits_yours", "plot_is_from", "plot_is_model_file",
                                  "dump_is_model", "dump_holds_text_dir", "dump_inside_model"])
def test_an_output_that_is_an_input_is_refused_before_the_run(run, tmp_path, monkeypatch, case):
    """--save-logits FILE naming the --text just read overwrote it, exit 0.
    Every writing option is checked against every input of its run."""
    _fail_if_run(monkeypatch)
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
        "save_logits_is_text": ["compare", "model", "--metrics", "--text", str(text), "--save-logits", str(text)],
        "save_logits_bf16_is_text": ["compare", "model", "--metrics", "--dtypes", "bf16", "--text", str(text),
                                     "--save-logits", f"bf16={text}"],
        "save_logits_hard_link": ["compare", "model", "--metrics", "--text", str(text), "--save-logits", str(link)],
        "plot_is_text": ["compare", "model", "--metrics", "--text", str(text), "--plot", str(text)],
        "save_logits_in_model": ["compare", "model", "--metrics", "--model", str(model), "--save-logits",
                                 str(model / "config.json")],
        "plot_is_logits_ref": ["compare", "logits", str(text), str(link.with_name("y")), "--plot", str(text)],
        "plot_is_logits_yours": ["compare", "logits", str(link), str(text), "--plot", str(text)],
        "plot_is_from": ["accumulate", "--device", "cpu", "--from", str(text), "--plot", str(text)],
        "plot_is_model_file": ["compare", "model", "--model", str(model), "--plot", str(model / "p.png")],
        "dump_is_model": ["compare", "model", "--layers", "--model", str(model), "--dump", str(model)],
        "dump_holds_text_dir": ["compare", "model", "--layers", "--model", str(dump_home / "m"),
                                "--dump", str(dump_home)],
        "dump_inside_model": ["compare", "model", "--layers", "--model", str(model), "--dump", str(model / "d")],
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
    _fail_if_run(monkeypatch)
    d = tmp_path / "d"
    d.mkdir()
    if member == "dir":
        (d / "bf16.safetensors").mkdir()
    else:
        (d / "bf16.safetensors").symlink_to(tmp_path / "elsewhere")
    r = run("compare", "model", "--layers", "--steps", "1", "--dtypes", "bf16", "--dump", str(d))
    one_line(r, 2, "--dump", "bf16.safetensors")
    assert sorted(os.listdir(d)) == ["bf16.safetensors"]  # nothing written, no temporary file


def test_a_failed_dump_write_leaves_no_temporary_file(tmp_path):
    """atomic_write removes its temporary file whatever stops the write (here the rename fails)."""
    from precisionlab.io import outputs

    (tmp_path / "x.safetensors").mkdir()
    with pytest.raises(OSError):
        outputs.atomic_write(tmp_path / "x.safetensors", b"data")
    assert os.listdir(tmp_path) == ["x.safetensors"]


@pytest.mark.parametrize("args,words", [
    (["compare", "tensors", "A", "B", "--c-dtype", "bf16"], ["--c-dtype", "three"]),
    (["compare", "model", "--metrics", "--threads", "0"], ["--threads", "at least 1"]),
    (["compare", "model", "--layers", "--threads", "100000"], ["--threads", "at most"]),
    (["compare", "model", "--dump", "D", "--threads", "-1"], ["--threads", "at least 1"]),
    (["compare", "model", "--metrics", "--threads", "1"], ["--threads", "no effect in --metrics"]),
    (["compare", "model", "--layers", "--threads", "1"], ["--threads", "no effect in --layers"]),
    (["compare", "model", "--tokens", "5"], ["--tokens", "no effect", "--metrics"]),
    (["compare", "model", "--layers", "--tokens", "5"], ["--tokens", "no effect in --layers", "--metrics"]),
    (["compare", "model", "--dump", "D", "--tokens", "5"], ["--tokens", "--metrics"]),
    (["compare", "model", "--layers", "--text", "T"], ["--text", "--metrics"]),
    (["compare", "model", "--layers", "--save-logits", "x.st"], ["--save-logits", "--metrics"]),
    (["compare", "model", "--layers", "--max-kld", "1"], ["--max-kld", "--metrics"]),
    (["compare", "model", "--layers", "--min-top1", "1"], ["--min-top1", "--metrics"]),
    (["compare", "model", "--min-top1", "1"], ["--min-top1", "--metrics"]),
    (["compare", "model", "--layers", "--plot", "P.png"], ["--plot", "no effect in --layers"]),
    (["compare", "model", "--dump", "D", "--plot", "P.png"], ["--plot", "--layers"]),
    (["compare", "model", "--metrics", "--steps", "3"], ["--steps", "no effect in --metrics"]),
    (["compare", "model", "--metrics", "--prompt", "x"], ["--prompt", "no effect in --metrics"]),
    (["compare", "model", "--inject", "layers.0.mlp:scale=2"], ["--inject", "no effect", "--layers"]),
    (["nondeterminism", "--sections", "threads", "--n", "100", "--runs", "2", "--device", "cpu", "--plot", "P.png"],
     ["--plot", "atomics"]),
], ids=lambda a: " ".join(a) if isinstance(a, list) and a and a[0] in ("compare", "nondeterminism") else "")
def test_an_option_without_effect_in_its_mode_is_a_usage_error(run, tmp_path, monkeypatch, args, words):
    """Each was accepted and ignored (exit 0), or, for --threads, not validated
    in that mode while every other command refuses it."""
    _fail_if_run(monkeypatch)
    sub = {"D": str(tmp_path / "d"), "P.png": str(tmp_path / "p.png"), "T": str(tmp_path / "t.txt"),
           "A": str(tmp_path / "a.npy"), "B": str(tmp_path / "b.npy")}
    for k in ("A", "B"):
        np.save(sub[k], np.ones(3, np.float32))
    r = run(*[sub.get(a, a) for a in args])
    one_line(r, 2, *words)
    assert not os.path.exists(sub["P.png"]) and not os.path.exists(sub["D"])


def test_every_option_of_compare_model_is_in_the_mode_table():
    """A new option of compare model declares the modes it works in, or it would be ignored in the others."""
    import inspect

    from precisionlab.cli import compare_model

    everywhere = {"ctx", "device", "seed", "json_out"}
    mode_switches = {"metrics", "layers", "dump", "contracts", "trainer", "rollout", "engine"}  # they choose the mode
    params = set(inspect.signature(compare_model.command).parameters)
    assert params - everywhere - mode_switches == set(compare_model.APPLIES)


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
        "--metrics --text": ["compare", "model", "--metrics", "--tokens", "8", "--text", str(text)],
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
    one_line(Result(*_cli3("accumulate", "--device", "cpu", "--from", str(p))), 2, "Permission denied")


def _cli3(*args):
    r = cli(*args)
    return r.code, r.out, r.err


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_install_completion_into_a_read_only_rc_file_is_one_line(tmp_path, shell):
    """'internal error: PermissionError' when the rc file may not be written.
    HOME is a temporary folder; writes there are refused as for a read-only
    file (root may write mode-444 files, so the refusal is made in the child,
    which runs main() as the console script does)."""
    import subprocess

    from helpers import ROOT

    code = f"""
import pathlib, sys
home = {str(tmp_path)!r}
real_write, real_open = pathlib.Path.write_text, pathlib.Path.open
def refuse(path):
    raise PermissionError(13, "Permission denied", str(path))
pathlib.Path.write_text = lambda self, *a, **k: refuse(self) if str(self).startswith(home) else real_write(self, *a, **k)
pathlib.Path.open = lambda self, mode="r", *a, **k: (refuse(self) if str(self).startswith(home) and set(mode) & set("wa")
                                                     else real_open(self, mode, *a, **k))
sys.argv = ["precisionlab", "--install-completion", {shell!r}]
from precisionlab.cli import main
main()
"""
    env = {k: v for k, v in os.environ.items() if k != "PRECISIONLAB_DEBUG"}
    # typer's own switch: the shell is the option's value, not found from this
    # process's parents (which differ between a terminal, make and CI)
    env.update(HOME=str(tmp_path), SHELL=f"/bin/{shell}", PYTHONPATH=str(ROOT),
               _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    one_line(Result(p.returncode, p.stdout, p.stderr), 1, "--install-completion", "cannot write", str(tmp_path),
             "Permission denied")


@pytest.mark.parametrize("found", ["sh", None])
def test_install_completion_from_a_shell_typer_cannot_serve_is_a_usage_error(tmp_path, found):
    """Run from sh (or from a parent no shell at all), typer printed 'Shell sh is
    not supported.' on stdout and exited 1; CI's make runs under sh."""
    import subprocess

    from helpers import ROOT

    code = f"""
import sys
from typer import _completion_shared
_completion_shared._get_shell_name = lambda: {found!r}
sys.argv = ["precisionlab", "--install-completion"]
from precisionlab.cli import main
main()
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PRECISIONLAB_DEBUG",
                                                          "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    one_line(Result(p.returncode, p.stdout, p.stderr), 2, "--install-completion", "bash", "--show-completion")
    assert p.stdout == "" and not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("lib,words", [("DIR", ["is a directory", "libprecisionlab.so"]),
                                       ("DIR/missing.so", ["does not exist"])])
def test_a_bad_library_path_says_what_is_wrong_with_the_library(tmp_path, lib, words):
    """PRECISIONLAB_LIB=DIR was 'does not exist'; and compare tensors blamed the
    data: "cannot read 'a' from ok.pt: LibraryNotFound ..."."""
    import torch

    torch.save({"a": torch.ones(3)}, tmp_path / "ok.pt")
    env = {"PRECISIONLAB_LIB": lib.replace("DIR", str(tmp_path))}
    for args in (["softmax", "--values", "1,2", "--device", "cpu"], ["compare", "tensors", str(tmp_path / "ok.pt"), str(tmp_path / "ok.pt")]):
        r = cli(*args, env=env)
        one_line(Result(r.code, r.out, r.err), 1, "PRECISIONLAB_LIB", *words)
        assert "cannot read" not in r.err and "ok.pt" not in r.err


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


def test_a_logits_file_declaring_too_many_positions_is_refused_from_its_header(run, tmp_path, monkeypatch):
    """512M declared positions: the tokens were read with no memory check and
    the run ended in 'out of memory' (exit 1). The header says the size first."""
    from precisionlab.io import inputs

    monkeypatch.setattr(inputs, "memory_limit", lambda: 1 << 30)
    ref, yours = tmp_path / "ref.st", tmp_path / "yours.st"
    for p in (ref, yours):
        _declared_logits(p, 1 << 29)
    r = run("compare", "logits", str(ref), str(yours))
    one_line(r, 2, "needs about", "536870912 positions", str(ref))


USERS_CODE = '''
import torch
print("hello from the import")

def raises_on_edges(x):
    if not torch.isfinite(x).all():
        raise ValueError("edge \\x1b]0;owned\\x07 \\x1b[2J")
    return torch.softmax(x, -1)

def prints(x):
    print("hello from the kernel \\x1b[31m")
    return torch.softmax(x, -1)
'''


@pytest.fixture
def users_module(tmp_path, monkeypatch):
    yield _importable(tmp_path, monkeypatch, "users_code", USERS_CODE)
    sys.modules.pop("users_code", None)


def test_the_users_exception_text_is_escaped_in_the_table(run, users_module):
    """An edge case's exception, shown in its flagged row, printed its escape
    sequences raw: the user's kernel could retitle or clear the terminal."""
    r = run("compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--impl", f"{users_module}:raises_on_edges")
    assert r.code == 1, r.err
    assert "\x1b" not in r.out and "\x07" not in r.out
    assert "\\x1b]0;owned\\x07" in "".join(r.out.split())


@pytest.mark.parametrize("json_out", [True, False])
def test_what_the_users_code_prints_stays_off_stdout(run, users_module, json_out):
    """A print() inside --impl (or at its import) broke --json: stdout is the JSON alone."""
    r = run("compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--impl", f"{users_module}:prints",
            *(["--json"] if json_out else []))
    assert r.code == 0, r.err
    assert "hello from" not in r.out and "hello from the kernel" in r.err and "hello from the import" in r.err
    if json_out:
        r.json()


def test_formats_runs_with_its_options(run):
    """The command's --formats option and its report module shared a name:
    every formats run ended in 'internal error: AttributeError'."""
    r = run("formats", "--n", "1024", "--shape", "16x64x16", "--device", "cpu", "--formats", "mxfp8_e4m3",
            "--blocks", "32", "--dists", "normal", "--json")
    assert r.code == 0, r.err
    assert {row["format"] for row in r.json()["rows"]} >= {"mxfp8_e4m3"}
