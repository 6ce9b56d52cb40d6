"""What a hostile-input sweep of every command found (2026-12-03), one test a
finding: each was an internal error, a hang, a leaked warning, a wrong exit
code or a file mode nobody asked for, and each is now the house's answer (one
stderr line and exit 2 for a usage error, 1 for a failed run, 3 for no GPU)."""

from __future__ import annotations

import http.server
import json
import os
import stat
import threading

import numpy as np
import pytest

from helpers import cli, one_line


# ---------------------------------------------------------------------------
# integers: ASCII decimal, one per piece, never an empty list taken for the default


@pytest.mark.parametrize("args", [
    ["tf32", "--accumulator", "fp32", "--k", ""],
    ["tf32", "--accumulator", "fp32", "--k", "\u0661\u0660"],  # Arabic-Indic 10: int() takes it
    ["tf32", "--accumulator", "fp32", "--k", "1_0"],
    ["tf32", "--accumulator", "fp32", "--k", "16,,32"],
    ["formats", "--blocks", "\u0661\u0666", "--device", "cpu"],
    ["compare", "op", "matmul", "--shape", "8x\u0661\u0660x8", "--device", "cpu"],
])
def test_integers_are_ascii_decimal(run, args):
    one_line(run(*args), 2)


# ---------------------------------------------------------------------------
# tf32 --accumulator


@pytest.mark.parametrize("dtype", ["fp4_e2m1", "fp6_e3m2"])
def test_every_dtype_runs_through_the_models(run, dtype):
    """The storage-only formats have no library code: they run on numpy's
    models, in their own format (they were a ctypes TypeError)."""
    r = run("tf32", "--accumulator", "fp32,hopper-fp8", "--dtypes", dtype, "--k", "64", "--json")
    assert r.code == 0, r.err
    assert {x["dtype"] for x in r.json()["rows"]} == {dtype}


def test_fp64_inputs_are_refused_by_the_models(run):
    """The models take values a float32 holds: fp64 inputs were cast to fp32
    before the fp32 chain saw them (at K = 1 fp32 then differed from exact)."""
    one_line(run("tf32", "--accumulator", "exact,fp32", "--dtypes", "fp64", "--k", "1"), 2, "fp64",
             "accumulator models")


def test_the_errors_are_the_exact_values_rounded_once(run):
    """fp32 inputs at K = 16: float64's own sum of the products rounds (the
    last digits of max_rel_error were off by 1e-9 relative); the oracle is
    rational: every product and sum exact, each figure rounded once."""
    from fractions import Fraction


    from precisionlab.catalog import formats

    r = run("tf32", "--accumulator", "exact,fp32", "--dtypes", "fp32", "--k", "16", "--json")
    rows = {x["accumulator"]: x for x in r.json()["rows"]}
    rng = np.random.default_rng([0, 16])  # the command's inputs: seed 0, K 16, 64 x 16 x 64
    fp32 = formats.get("fp32")
    a, b = fp32.round(rng.standard_normal((64, 16))), fp32.round(rng.standard_normal((16, 64)))
    exact = [[sum(Fraction(x) * Fraction(y) for x, y in zip(a[i], b[:, j], strict=True)) for j in range(64)] for i in range(64)]
    scale = max(abs(q) for row in exact for q in row)
    c = np.float32(0) + np.zeros((64, 64), np.float32)
    for k in range(16):  # the fp32 chain: c = fp32(c + fp32(a_k b_k))
        c = c + a[:, k:k + 1].astype(np.float32) * b[k:k + 1, :].astype(np.float32)
    # q to double to fp32 rounds q correctly: 53 >= 2 x 24 + 2 bits makes the double rounding innocuous
    for name, got in (("exact", [[float(np.float32(float(q))) for q in row] for row in exact]), ("fp32", c.tolist())):
        err = max(abs(Fraction(float(got[i][j])) - exact[i][j]) for i in range(64) for j in range(64))
        assert rows[name]["max_abs_error"] == float(err), name
        assert rows[name]["max_rel_error"] == float(err / scale), name


def test_a_tile_wider_than_the_sequence_is_estimated_at_the_sequence(run):
    """--block-c 10^12 on 5 keys holds 5 keys a tile: it was refused as 447035 GiB."""
    r = run("attention", "--seq", "5", "--rows", "3", "--dim", "4", "--std", "1", "--block-c", str(10**12), "--json")
    assert r.code == 0, r.err


def test_a_group_past_k_is_estimated_at_k(run):
    """group=2^31-1 on K = 64 holds 64 products: it was estimated at the group's
    size (524288 GiB) and refused."""
    r = run("tf32", "--accumulator", "hopper-fp8:group=2147483647:bits=1", "--k", "64", "--json")
    assert r.code == 0, r.err


def test_k_past_the_ceiling_is_refused(run):
    from precisionlab.experiments import tf32

    one_line(run("tf32", "--accumulator", "fp32", "--k", str(tf32.ACC_MAX_K + 1)), 2, str(tf32.ACC_MAX_K))


def test_device_cuda_without_a_gpu_is_exit_3_with_the_models_too(run):
    from precisionlab import native

    if native.gpu_status().count:
        pytest.skip("a GPU is here: --device cuda is satisfied")
    one_line(run("tf32", "--accumulator", "exact", "--k", "64", "--device", "cuda"), 3, "--device cuda")


# ---------------------------------------------------------------------------
# attention --p-scale


@pytest.mark.parametrize("scale, code, words", [
    ("1e39", 2, "past the fp32 arithmetic's largest value"),  # P x p_scale itself overflows fp32
    ("1e-45", 2, "its reciprocal"),  # 1 / p_scale, which undoes it at the end, overflows
    ("1e38", 1, "O overflowed fp32"),  # P fits, P.V summed over the keys does not: a failed run
])
def test_a_p_scale_that_overflows_is_said_so(run, scale, code, words):
    one_line(run("attention", "--seq", "256", "--rows", "16", "--dim", "32", "--p-scale", scale), code, words)


def test_a_large_p_scale_that_fits_still_runs(run):
    r = run("attention", "--seq", "256", "--rows", "16", "--dim", "32", "--p-scale", "1e37", "--json")
    assert r.code == 0 and r.err == "", r.err


# ---------------------------------------------------------------------------
# files


def _npy_with_header(path, shape, data: bytes = b"") -> str:
    """A .npy whose header declares `shape` of float32, followed by `data`."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % (shape,)
    header = header.ljust(118) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin1") + data)
    return str(path)


@pytest.mark.parametrize("shape, words", [
    ((-1, 64), "negative size"),
    ((10**11, 10**8), "the file holds 64"),  # numpy's memmap overflowed computing the size, and said so on stderr
    ((2**32, 2**32, 16), "the file holds 64"),
])
def test_a_npy_header_that_lies_is_one_line(run, tmp_path, shape, words):
    path = _npy_with_header(tmp_path / "bad.npy", shape, b"\0" * 64)
    one_line(run("compare", "tensors", path, path), 2, words)
    one_line(run("compare", "op", "softmax", "--from", path, "--device", "cpu"), 2, words)


def test_a_huge_token_id_is_one_line(run, tmp_path):
    rec = {"token_ids": [5], "logprobs": [-0.5], "top_logprobs": [{"99999999999999999999999": -0.5}]}
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps(rec) + "\n")
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"token_ids": [5], "logprobs": [-0.5]}) + "\n")
    one_line(run("compare", "logprobs", str(a), str(b)), 2, "2^63 - 1")


def test_an_exported_folder_has_the_usual_modes(tmp_path):
    """safetensors writes model.safetensors 0600; the folder's files get what the umask gives every file."""
    out = tmp_path / "hf"
    r = cli("export", "embedded", "--to", "hf", "--out", str(out))
    assert r.code == 0, r.err
    mask = os.umask(0)
    os.umask(mask)
    for f in out.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask, f


# ---------------------------------------------------------------------------
# servers and URLs


@pytest.mark.parametrize("url, words", [("http://[::1", "Invalid IPv6"), ("http://127.0.0.1:99999", "Port")])
def test_a_malformed_endpoint_url_is_a_usage_error(run, url, words):
    one_line(run("nondeterminism", "endpoint", url, "--requests", "2"), 2, words)


def test_an_answer_nested_past_the_stack_is_a_failed_run(run):
    """100000 nested arrays from the server: json's RecursionError was an internal error."""
    class Deep(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):  # /v1/models: one model, as a server names what it serves
            self._send(b'{"data": [{"id": "m"}]}')

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._send(b"[" * 100000 + b"]" * 100000)

        def _send(self, body):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:  # the client gave up reading: fine
                pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Deep)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        port = server.server_address[1]
        one_line(run("nondeterminism", "endpoint", f"http://127.0.0.1:{port}", "--requests", "2",
                     "--concurrency", "1", "--cache", "on"), 1, "no usable answer", "RecursionError")
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------
# warnings


def test_numpy_warnings_stay_off_stderr(run):
    """compare op matmul at 1e30 overflows fp32 on purpose and counts it; numpy's RuntimeWarnings said it again
    on stderr, six lines of them."""
    r = run("compare", "op", "matmul", "--device", "cpu", "--shape", "4x4x4", "--scale", "1e30", "--accumulator",
            "exact")
    assert r.code in (0, 1) and "Warning" not in r.err, r.err


@pytest.mark.parametrize("command", [["kvcache", "--steps", "2"], ["compare", "model", "--steps", "2"],
                                     ["nondeterminism", "endpoint", "http://127.0.0.1:9"]])
def test_a_prompt_that_is_not_utf8_is_a_usage_error(run, command):
    """Bytes that are not UTF-8 reach Python as lone surrogates ('\\xff' as
    '\\udcff'): they were an internal UnicodeEncodeError; no server is contacted."""
    one_line(run(*command, "--prompt", "a\udcff\x01"), 2, "--prompt", "not UTF-8", "0xff")


def test_a_prompt_as_bytes_from_the_shell_is_refused_too():
    r = cli("kvcache", "--steps", "2", "--prompt", os.fsdecode(b"\xff\x01"))
    one_line(r, 2, "not UTF-8")
