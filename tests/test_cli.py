"""CLI conventions every command keeps: exit codes, one-line errors, strict JSON
on stdout alone, and no torch import where it is not needed."""


import numpy as np
import pytest

from helpers import cli, cli_in_process, strict_json


def one_line_error(r, code):
    assert r.code == code, (r.code, r.err)
    assert r.out == ""
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("precisionlab: "), r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize("args", [
    ["accumulate", "--dtype", "fp12"],
    ["accumulate", "--n", "0"],
    ["accumulate", "--n", "-5"],
    ["accumulate", "--n", str(10**15)],
    ["accumulate", "--n", "abc"],
    ["accumulate", "--values", ""],
    ["accumulate", "--values", "1,,2"],
    ["accumulate", "--values", "1,x"],
    ["accumulate", "--from", "/nonexistent/file.npy"],
    ["accumulate", "--from", "/tmp"],
    ["accumulate", "--device", "tpu"],
    ["accumulate", "--methods", "magic"],
    ["accumulate", "--acc-dtypes", "int8"],
    ["accumulate", "--dist", "cauchy"],
    ["accumulate", "--values", "1,2", "--dist", "normal"],
])
def test_usage_errors_exit_2_in_one_line(args):
    one_line_error(cli(*args), 2)


def test_bad_npy_files(tmp_path):
    text = tmp_path / "text.npy"
    text.write_text("hello")
    strings = tmp_path / "strings.npy"
    np.save(strings, np.array(["a", "b"]))
    empty = tmp_path / "empty.npy"
    np.save(empty, np.array([], dtype=np.float32))
    for f in (text, strings, empty):
        one_line_error(cli("accumulate", "--from", str(f)), 2)


def test_from_file_reads_values(tmp_path):
    f = tmp_path / "v.npy"
    np.save(f, np.full((100, 100), 0.1, dtype=np.float32))
    d = strict_json(cli("accumulate", "--from", str(f), "--methods", "sequential", "--acc-dtypes", "bf16",
                        "--device", "cpu", "--json").out)
    assert d["params"]["n"] == 10_000 and d["rows"][0]["result"] == 32.0


def test_device_cuda_without_gpu_exits_3():
    from precisionlab import native

    if native.gpu_status().count:
        pytest.skip("a GPU is present")
    one_line_error(cli("accumulate", "--device", "cuda"), 3)
    # all is the CPU plus the GPU where present: without one, the CPU rows alone
    r = cli("accumulate", "--device", "all", "--n", "100", "--json")
    assert r.code == 0 and strict_json(r.out)["devices"]["cuda"] is False, r.err


def test_debug_env_shows_the_traceback():
    r = cli("accumulate", "--dtype", "fp12", env={"PRECISIONLAB_DEBUG": "1"})
    assert r.code != 0 and "Traceback" in r.err


def test_json_is_strict_and_alone_on_stdout():
    r = cli("accumulate", "--values", "1,nan,2", "--json")
    assert r.code == 0
    d = strict_json(r.out)  # raises on NaN/Infinity literals
    assert {"command", "versions", "params", "rows", "exact_stored", "exact_intended"} <= d.keys()
    assert d["params"]["seed"] == 0 and "cpu_name" in d
    row = d["rows"][0]
    for key in ("device", "variant", "dtype", "accumulator", "result", "abs_error", "rel_error", "ulps", "bound"):
        assert key in row
    assert row["result"] == "nan" and d["exact_stored"] == "nan"


def test_inf_is_reported_as_a_string():
    d = strict_json(cli("accumulate", "--values", "1,inf", "--device", "cpu", "--json").out)
    assert d["exact_stored"] == "inf"
    assert {r["result"] for r in d["rows"]} <= {"inf", "nan"}


def test_table_goes_to_stdout():
    r = cli("accumulate", "--dtype", "bf16", "--n", "10000", "--device", "cpu")
    assert r.code == 0
    assert "32.0" in r.out and "1000.9765625" in r.out and "stalled for good at 32.0" in r.out


def test_seed_changes_random_inputs_and_is_reproducible():
    a = strict_json(cli("accumulate", "--dist", "normal", "--n", "1000", "--seed", "1", "--json").out)
    b = strict_json(cli("accumulate", "--dist", "normal", "--n", "1000", "--seed", "1", "--json").out)
    c = strict_json(cli("accumulate", "--dist", "normal", "--n", "1000", "--seed", "2", "--json").out)
    assert a["rows"] == b["rows"] or [r["result"] for r in a["rows"]] == [r["result"] for r in b["rows"]]
    assert a["exact_stored"] != c["exact_stored"]


@pytest.mark.parametrize("argv", [["--help"], ["accumulate", "--help"],
                                  ["accumulate", "--n", "100", "--device", "cpu"],
                                  ["accumulate", "--n", "100", "--json"],
                                  ["tf32", "--accumulator", "hopper-fp8", "--k", "64", "--json"]])
def test_no_torch_where_not_needed(argv):
    assert "TORCH=False" in cli_in_process(*argv).stderr


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "run.png"
    r = cli("accumulate", "--n", "3000", "--device", "cpu", "--plot", str(png))
    assert r.code == 0 and png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot written" in r.err  # the hint goes to stderr


@pytest.mark.parametrize("argv", [
    ["accumulate", "--n", "10"],
    ["softmax", "--values", "1,2,3"],
    ["nondeterminism", "--runs", "2", "--n", "1000", "--sections", "batch,threads"],
    ["tf32", "--m", "16", "--n", "16", "--k", "16", "--no-sweep"],
    ["info"],
])
def test_json_rows_are_flat_objects(argv):
    d = strict_json(cli(*argv, "--device", "cpu", "--json").out if argv[0] != "info" else cli(*argv, "--json").out)
    assert d["rows"] and all(isinstance(r, dict) for r in d["rows"])
    assert not [k for r in d["rows"] for k, v in r.items() if isinstance(v, dict)]


def test_the_tests_command_lists_are_the_registry():
    # helpers.registered_commands, which the --seed, --plot, --from and JSON-glossary tests parametrize over
    from helpers import registered_commands

    from precisionlab.cli.app import COMMANDS

    every = registered_commands()
    assert every == [f"{g} {n}" if g else n for g, n, _ in COMMANDS]
    assert "compare op" in registered_commands("--from") and "info" not in registered_commands("--seed")
    assert set(registered_commands("--plot")) < set(every)
