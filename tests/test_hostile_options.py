"""Hostile and careless option values, every command: out-of-range seeds,
empty lists, GPU-only variants on the CPU, bad tolerances, threads, names
and dtypes, options without effect in their mode, and what a user's --impl
returns or prints. Each is one line on stderr and exit 2 (a failed run: exit
1), never an internal error, a hang or a C error string.

The cases run the CLI in process (the `run` fixture of conftest.py)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from helpers import cli, fail_if_a_model_runs, one_line, registered_commands


# ---------------------------------------------------------------------------
# --seed outside 0 ... 2^64-1, in every command


# Every registered command that takes --seed: the range is checked as the
# option is parsed (options.seed_in_range), before arguments the command needs
# or anything else, so the command's name alone is enough.
@pytest.mark.parametrize("seed", ["-1", str(2**64)])
@pytest.mark.parametrize("command", registered_commands("--seed"))
def test_seed_outside_uint64_exits_2_naming_the_range(run, command, seed):
    files = ["a", "b", "c"] if command == "compare builds" else []  # its three files are arguments click wants first
    one_line(run(*command.split(), *files, "--seed", seed), 2, "--seed", "2^64-1")


def test_the_largest_seed_is_accepted(run):
    r = run("accumulate", "--n", "10", "--dist", "normal", "--device", "cpu", "--methods", "sequential",
            "--acc-dtypes", "fp32", "--seed", str(2**64 - 1), "--json")
    assert r.code == 0, r.err
    assert r.json()["params"]["seed"] == 2**64 - 1


# ---------------------------------------------------------------------------
# empty lists, GPU-only methods on the CPU, --rows without --cols


@pytest.mark.parametrize("args", [
    ["nondeterminism", "--sections", ",,", "--device", "cpu"],
    ["nondeterminism", "--sections", "", "--device", "cpu"],
    ["bench", ",,", "--device", "cpu"],
    ["bench", "--sections", "", "--device", "cpu"],
    ["accumulate", "--methods", "", "--device", "cpu"],
    ["accumulate", "--methods", ",,", "--device", "cpu"],
    ["accumulate", "--acc-dtypes", "", "--device", "cpu"],
    ["accumulate", "--acc-dtypes", " , ", "--device", "cpu"],
    ["softmax", "--methods", ",,", "--device", "cpu"],
    ["softmax", "--dtypes", ",", "--device", "cpu"],
    ["compare", "op", "softmax", "--dtypes", ",", "--device", "cpu"],
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
# tolerances


@pytest.mark.parametrize("side", ["RTOL", "ATOL"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1e-3"])
def test_tolerances_must_be_finite_and_non_negative(run, side, value):
    tol = f"{value},0" if side == "RTOL" else f"0,{value}"
    one_line(run("compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--tol", tol), 2, side)


def test_tolerance_validator_is_reusable():
    from precisionlab.numerics import compare as comparison
    from precisionlab.errors import UsageError

    comparison.check_override(None, None)
    comparison.check_override(0.0, 0.0)
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(UsageError):
            comparison.check_override(1e-3, bad)


# ---------------------------------------------------------------------------
# nondeterminism below its emulated block count


@pytest.mark.parametrize("n", [1, 100, 527])
def test_nondeterminism_small_n_works(run, n):
    r = run("nondeterminism", "--n", str(n), "--runs", "2", "--sections", "atomics,threads", "--device", "cpu",
            "--json")
    assert r.code == 0, r.err
    d = r.json()
    assert d["params"]["emulated_blocks"] == min(n, 528)
    assert {row["section"] for row in d["rows"]} == {"atomics", "threads"}


# ---------------------------------------------------------------------------
# what an --impl returns, raises or prints


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
    r = run("compare", "op", "softmax", "--shape", "2x8", "--dtypes", "bf16", "--device", "cpu",
            "--impl", f"{impl_module}:{fn}")
    one_line(r, 1, f"{impl_module}:{fn}", *words)
    assert "\x1b" not in r.err and "\x07" not in r.err


def test_a_correct_impl_passes(run, impl_module):
    r = run("compare", "op", "softmax", "--shape", "2x8", "--dtypes", "bf16", "--device", "cpu",
            "--impl", f"{impl_module}:correct", "--json")
    assert r.code == 0, r.err


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


FD_WRITES = '''
import ctypes, os, subprocess, sys
import torch

def writes_to_fd_1(x):
    os.write(1, b"os.write from the kernel\\n")
    ctypes.CDLL(None).printf(b"printf from the kernel\\n")  # C's buffered stdout
    subprocess.run([sys.executable, "-c", "print('a child of the kernel')"])
    return torch.softmax(x, -1)
'''


def test_what_the_users_code_writes_to_fd_1_stays_off_stdout(tmp_path):
    """What bypasses sys.stdout (os.write(1, ...), a C extension's printf, a
    child process) still broke --json: fd 1 points at stderr while the user's
    code runs. A real process: the in-process runner's stdout is not fd 1."""
    (tmp_path / "fd_writes.py").write_text(FD_WRITES)
    from helpers import ROOT

    r = cli("compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--impl", "fd_writes:writes_to_fd_1",
            "--json", env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert r.code == 0, r.err
    json.loads(r.out)
    for text in ("os.write from the kernel", "printf from the kernel", "a child of the kernel"):
        assert text not in r.out and text in r.err, text


# ---------------------------------------------------------------------------
# threads, names, paths, dtypes, scales


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


@pytest.mark.parametrize("args,opt", [
    (["compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--impl", ""], "--impl"),
    (["compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--out-dtype", ""], "--out-dtype"),
    (["compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--from", ""], "--from"),
    (["compare", "model", "--steps", "1", "--model", ""], "--model"),
    (["compare", "layers", "--steps", "1", "--model", ""], "--model"),
    (["compare", "metrics", "--tokens", "16", "--text", ""], "--text"),
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
    (["softmax", "--values", "1,2", "--device", "cpu", "--methods", "stable", "--dtypes", "fp32,fp32,float32"], "dtypes"),
    (["compare", "op", "softmax", "--shape", "2x8", "--device", "cpu", "--cases", "random", "--dtypes",
      "bf16,bf16,bfloat16"], "dtypes"),
    (["compare", "model", "--steps", "1", "--dtypes", "bf16,bf16"], "dtypes"),
    (["compare", "layers", "--steps", "1", "--dtypes", "bf16,bf16"], "dtypes"),
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


def test_compare_op_shape_and_from_are_one_or_the_other(run, tmp_path):
    """--shape 8x8 with a 4x8 --from file ran the file's 4x8 and reported shape [8, 8] in params."""
    np.save(tmp_path / "x.npy", np.ones((4, 8), np.float32))
    one_line(run("compare", "op", "softmax", "--device", "cpu", "--shape", "8x8", "--from", str(tmp_path / "x.npy")),
             2, "--shape", "--from")


def test_no_gpu_is_exit_3_without_the_c_functions_name():
    from precisionlab import native

    if native.gpu_status().count:
        pytest.skip("a GPU is present")
    one_line(cli("softmax", "--device", "cuda"), 3, "no CUDA GPU available")


def test_formats_runs_with_its_options(run):
    """The command's --formats option and its report module shared a name:
    every formats run ended in 'internal error: AttributeError'."""
    r = run("formats", "--n", "1024", "--shape", "16x64x16", "--device", "cpu", "--formats", "mxfp8_e4m3",
            "--blocks", "32", "--dists", "normal", "--json")
    assert r.code == 0, r.err
    assert {row["format"] for row in r.json()["rows"]} >= {"mxfp8_e4m3"}


# ---------------------------------------------------------------------------
# compare model's verbs: an option another verb reads is no option of this one


@pytest.mark.parametrize("args,words", [
    (["compare", "tensors", "A", "B", "--dtypes", "-,-,bf16"], ["--dtypes", "three"]),
    (["compare", "model", "--threads", "0"], ["--threads", "at least 1"]),
    (["compare", "contracts", "--threads", "100000"], ["--threads", "at most"]),
    (["compare", "rollout", "--threads", "-1"], ["--threads", "at least 1"]),
    (["compare", "metrics", "--threads", "1"], ["--threads", "No such option"]),
    (["compare", "layers", "--threads", "1"], ["--threads", "No such option"]),
    (["compare", "model", "--tokens", "5"], ["--tokens", "No such option"]),
    (["compare", "layers", "--tokens", "5"], ["--tokens", "No such option"]),
    (["compare", "layers", "--dump", "D", "--tokens", "5"], ["--tokens", "No such option"]),
    (["compare", "layers", "--text", "T"], ["--text", "No such option"]),
    (["compare", "layers", "--save-logits", "x.st"], ["--save-logits", "No such option"]),
    (["compare", "layers", "--max-kld", "1"], ["--max-kld", "No such option"]),
    (["compare", "model", "--min-top1", "1"], ["--min-top1", "No such option"]),
    (["compare", "contracts", "--plot", "P.png"], ["--plot", "No such option"]),
    (["compare", "metrics", "--steps", "3"], ["--steps", "No such option"]),
    (["compare", "metrics", "--prompt", "x"], ["--prompt", "No such option"]),
    (["compare", "model", "--inject", "layers.0.mlp:scale=2"], ["--inject", "No such option"]),
    (["nondeterminism", "endpoint", "http://127.0.0.1:9", "--plot", "P.png"], ["--plot", "No such option"]),
    (["nondeterminism", "--plot", "P.png", "endpoint", "http://127.0.0.1:9"], ["--plot", "sections' options"]),
    (["nondeterminism", "--sections", "threads", "--n", "100", "--runs", "2", "--device", "cpu", "--plot", "P.png"],
     ["--plot", "atomics"]),
], ids=lambda a: " ".join(a) if isinstance(a, list) and a and a[0] in ("compare", "nondeterminism") else "")
def test_an_option_of_another_verb_is_a_usage_error(run, tmp_path, monkeypatch, args, words):
    """Each was accepted and ignored (exit 0), or, for --threads, not validated
    in that mode while every other command refuses it."""
    fail_if_a_model_runs(monkeypatch)
    sub = {"D": str(tmp_path / "d"), "P.png": str(tmp_path / "p.png"), "T": str(tmp_path / "t.txt"),
           "A": str(tmp_path / "a.npy"), "B": str(tmp_path / "b.npy")}
    for k in ("A", "B"):
        np.save(sub[k], np.ones(3, np.float32))
    r = run(*[sub.get(a, a) for a in args])
    one_line(r, 2, *words)
    assert not os.path.exists(sub["P.png"]) and not os.path.exists(sub["D"])


def test_each_verb_keeps_few_options():
    """Issue 38's limits: no leaf command over 22 options, no compare verb over 14
    (compare model had 31 behind a table of modes; compare layers' one-model and
    two-model halves are two verbs, compare contracts' draft one option); --help
    is not counted."""
    import typer

    from precisionlab.cli.app import app

    def leaves(cmd, path):
        subs = getattr(cmd, "commands", {})
        if not subs or path == ("nondeterminism",):  # a group with a run of its own is a leaf too
            yield path, [p for p in cmd.params if p.name != "help"]
        for name, sub in subs.items():
            yield from leaves(sub, (*path, name))

    # options only: compare op's OP and compare tensors' FILES are arguments, what the verb acts on
    found = {path: [p for p in params if p.param_type_name == "option"]
             for path, params in leaves(typer.main.get_command(app), ())}
    assert ("compare", "metrics") in found and ("nondeterminism", "endpoint") in found
    assert ("compare", "engine-layers") in found
    for path, params in found.items():
        limit = 14 if path[:1] == ("compare",) and len(path) == 2 else 22
        assert len(params) <= limit, (path, len(params))
