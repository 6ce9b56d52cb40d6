"""What reaches the user's terminal from hostile strings and careless
environments: strings from outside shown as text (control characters, markup,
bidi escaped), no arguments, Ctrl-C, an ASCII or closed stdout, narrow
terminals, a full disk, completion installed where it cannot be, a bad
library path: one line and an exit code, never a traceback or a hang.

Most cases run the CLI in process (the `run` fixture of conftest.py); the few
that need a real process (a signal, the output encoding) use a subprocess."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import ROOT, Run, cli, loaded_timeout, one_line


# ---------------------------------------------------------------------------
# strings from outside are text: report.safe_text / report.printable


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
    r = run("accumulate", "--from", str(f), "--device", "cpu", "--methods", "sequential", "--acc-dtypes", "fp32")
    assert r.code == 0, r.err
    assert "\x1b" not in r.out and "\x07" not in r.out
    assert report_printable(name) in r.out.replace("\n", "")  # a long temporary path folds at the table's width


def report_printable(s):
    from precisionlab.report import console as report

    return report.printable(s)


def test_one_line_errors_escape_control_characters(run):
    r = run("accumulate", "--from", "/nonexistent/\x1b]0;owned\x07.npy")
    one_line(r, 2)
    assert "\x1b" not in r.err and "\\x1b" in r.err


# ---------------------------------------------------------------------------
# no arguments, Ctrl-C


def test_no_arguments_prints_the_help():
    r = cli()
    assert "Usage" in r.out and "accumulate" in r.out
    assert "precisionlab: \n" not in r.err and not r.err.strip().startswith("precisionlab:")


@pytest.mark.serial
def test_ctrl_c_inside_a_long_kernel_answers_within_2_s(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PRECISIONLAB_DEBUG", None)
    p = subprocess.Popen([sys.executable, "-m", "precisionlab", "tf32", "--m", "4096", "--n", "4096", "--k", "4096",
                          "--no-sweep", "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=tmp_path)
    time.sleep(loaded_timeout(4))  # past the imports, into the matmuls (a loaded machine imports slower)
    assert p.poll() is None, "the run ended before the signal"
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    elapsed = time.monotonic() - t0
    assert p.returncode == 130 and err.decode() == "precisionlab: interrupted\n", (p.returncode, err)
    assert elapsed < 2.0, elapsed
    assert os.listdir(tmp_path) == []


def test_ctrl_c_while_the_command_line_is_still_importing_is_one_line():
    """A Ctrl-C that lands during the imports (a second or more on a loaded
    machine) was Python's KeyboardInterrupt traceback; the import raising it
    is planted, so the moment is certain."""
    plant = ("import builtins, sys\n"
             "real = builtins.__import__\n"
             "def imp(name, *a, **k):\n"
             "    if name == 'precisionlab.cli.app':\n"
             "        raise KeyboardInterrupt\n"
             "    return real(name, *a, **k)\n"
             "builtins.__import__ = imp\n"
             "sys.argv = ['precisionlab', 'info']\n"
             "from precisionlab.cli import main\n"
             "main()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", plant], capture_output=True, text=True, env=env, timeout=loaded_timeout(60))
    assert (p.returncode, p.stderr, p.stdout) == (130, "precisionlab: interrupted\n", "")


# ---------------------------------------------------------------------------
# output that cannot encode Unicode, narrow terminals, a closed stdout, a full disk


def test_ascii_only_output_degrades():
    r = cli("accumulate", "--n", "100", "--device", "cpu", "--methods", "sequential,kahan", "--acc-dtypes",
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
                   "--acc-dtypes", "fp32,bf16"],
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
                out += [m for h, c in zip(header, cells, strict=True) if not re.search(r"time|/s", h)
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
    "compare layers": ["compare", "layers", "--steps", "2", "--dtypes", "bf16"],
    "compare rollout": ["compare", "rollout", "--trainer", "embedded", "--rollout", "embedded", "--samples", "2",
                                "--tokens", "8", "--top-p", "0.9"],
    "compare logprobs": ["compare", "logprobs", str(ROOT / "docs/data/logprobs/trainer.safetensors"),
                         str(ROOT / "docs/data/logprobs/rollout-top-p.jsonl"), "--worst", "2"],
    "compare tensors": ["compare", "tensors", *(str(ROOT / f"docs/data/dumps/{d}.safetensors")
                                                for d in ("fp32", "bf16", "engine"))],
    "compare logits": ["compare", "logits", str(ROOT / "docs/data/logits/ref.safetensors"),
                       str(ROOT / "docs/data/logits/bf16.safetensors")],
}


@pytest.mark.parametrize("command", list(NARROW_NEWER))
def test_narrow_terminals_keep_every_number_of_the_newer_commands(run, monkeypatch, command):
    _narrow_keeps_numbers(run, monkeypatch, NARROW_NEWER[command], 20)


def test_columns_sets_the_width_of_a_pipe():
    r = cli(*NARROW["accumulate"], env={"COLUMNS": "40"})
    assert r.code == 0, r.err
    assert max(len(line) for line in r.out.splitlines()) <= 40


def test_a_closed_stdout_is_one_line_not_a_traceback():
    """`precisionlab info >&-` ended in a traceback (sys.stdout is None, report's console read its isatty())."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PRECISIONLAB_DEBUG", None)
    p = subprocess.run([sys.executable, "-m", "precisionlab", "accumulate", "--n", "10", "--device", "cpu"],
                       stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, timeout=120,
                       preexec_fn=lambda: os.close(1))
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith("precisionlab: stdout is closed") and p.stderr.count("\n") == 1, p.stderr


def test_a_full_disk_is_a_failed_run_said_as_the_system_says_it():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    p = subprocess.run(f"{sys.executable} -m precisionlab accumulate --n 10 > /dev/full", shell=True,
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=120)
    one_line(Run(p.returncode, p.stdout, p.stderr), 1, "No space left on device")


# ---------------------------------------------------------------------------
# completion and the library lookup


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
    one_line(Run(p.returncode, p.stdout, p.stderr), 1, "--install-completion", "cannot write", str(tmp_path),
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
    one_line(Run(p.returncode, p.stdout, p.stderr), 2, "--install-completion", "bash", "--show-completion")
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
        one_line(r, 1, "PRECISIONLAB_LIB", *words)
        assert "cannot read" not in r.err and "ok.pt" not in r.err


# The one rule (report.console.printable): what str.isprintable() refuses is
# escaped as repr() would write it; everything else, any script, shows as is.
@pytest.mark.parametrize("s, shown", [
    ("tab\there\nnew\rline", "tab\\there\\nnew\\rline"),
    ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),
    ("nul\x00del\x7f csi\x9b", "nul\\x00del\\x7f csi\\x9b"),
    ("e\u202eRIGHT\u2066", "e\\u202eRIGHT\\u2066"),
    ("line\u2028sep zero\u200bwidth", "line\\u2028sep zero\\u200bwidth"),
    ("tag\U000e0001 lone\udcff", "tag\\U000e0001 lone\\udcff"),
    ("nbsp\xa0", "nbsp\\xa0"),
    ("naïve é 字 🙂 a b", "naïve é 字 🙂 a b"),
    ("trailing\\", "trailing\\"),
], ids=repr)
def test_printable_escapes_what_isprintable_refuses(s, shown):
    from precisionlab.report import console as report

    assert report.printable(s) == shown
