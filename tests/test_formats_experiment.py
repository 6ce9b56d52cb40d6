"""`precisionlab formats`: the clipping, flushing and matmul statistics of the
block-scaled formats, checked against facts derived independently of the
kernels (the significand of a block's amax decides FLOOR's clipping), and the
command's usage errors, JSON and plot."""

import math
import os

import numpy as np
import pytest
from helpers import cli, strict_json

from precisionlab import native
from precisionlab.experiments import formats as exp


def _rows(**kw):
    cfg = exp.FormatsConfig(device="cpu", n=kw.pop("n", 1 << 14), shape=kw.pop("shape", "8x256x8"), **kw)
    return exp.run(cfg).rows


def _get(rows, **want):
    return next(r for r in rows if all(r.get(k) == v for k, v in want.items()))


@pytest.mark.parametrize("fmt, m_max", [("mxfp4", 1.5), ("mxfp8_e4m3", 1.75), ("mxfp6_e2m3", 1.875)])
def test_floor_clips_exactly_the_blocks_whose_amax_significand_exceeds_max_over_2_to_emax(fmt, m_max):
    """FLOOR's X = 2^(floor(log2 amax) - emax), so amax / X = m 2^emax with m the
    significand of amax: it clips iff m > max / 2^emax. Counted here from the
    data alone, and compared with the share the experiment reports."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 32 * 4001)).astype(np.float32)  # 4001 blocks of 32
    y, codes = exp._Quantizer(["cpu"]).roundtrip(x, fmt, "floor", 32)
    amax = np.max(np.abs(x.reshape(-1, 32).astype(np.float64)), axis=1)
    m, _ = np.frexp(amax)
    want = float(np.mean(2 * m > m_max))
    got = exp._clip_share(y, x, codes, 32, native.block_formats()[fmt].element)
    assert got == want
    y, codes = exp._Quantizer(["cpu"]).roundtrip(x, fmt, "rceil", 32)
    assert exp._clip_share(y, x, codes, 32, native.block_formats()[fmt].element) == 0.0


def test_gaussian_blocks_of_32_floor_clips_a_third_rceil_none():
    """The literature's 30-37 % for MXFP4 FLOOR on Gaussian blocks of 32 (and
    below the 41.5 % a log-uniform significand would give); RCEIL and CEIL never
    clip, EVEN clips less than FLOOR."""
    rows = _rows(formats="mxfp4", blocks="32", dists="normal", n=1 << 16)
    share = {r["rule"]: r["clip_share"] for r in rows if r["format"] == "mxfp4"}
    assert 0.30 <= share["floor"] <= 0.37
    assert share["rceil"] == 0 and share["ceil"] == 0
    assert 0 < share["even"] < share["floor"]


def test_rule_orderings_and_outliers():
    rows = _rows(formats="mxfp4,mxfp8_e4m3", blocks="32", dists="normal,outlier_10x,outlier_30x,outlier_100x")
    for fmt in ("mxfp4", "mxfp8_e4m3"):
        for dist in ("normal", "outlier_100x"):
            # CEIL's scale is never below RCEIL's: it flushes at least as many elements
            assert (_get(rows, format=fmt, rule="ceil", dist=dist)["flush_share"]
                    >= _get(rows, format=fmt, rule="rceil", dist=dist)["flush_share"])
    flush = [_get(rows, format="mxfp4", rule="rceil", dist=d)["flush_share"]
             for d in ("normal", "outlier_10x", "outlier_30x", "outlier_100x")]
    assert flush == sorted(flush) and flush[-1] > 0.5  # a 100x outlier pushes most of its block to zero


def test_matmul_rel_l2_is_against_float64_and_orders_the_formats():
    rows = _rows(formats="mxfp8_e4m3,mxfp4", rules="rceil", blocks="32", dists="normal", shape="16x512x16")
    err = {r["format"]: r["matmul_rel_l2"] for r in rows}
    assert 0 < err["bf16"] < 1e-2  # bf16's u = 2^-9 per operand
    assert err["bf16"] < err["fp8_e4m3 per-tensor"] < err["fp8_e5m2 per-tensor"]
    assert err["mxfp8_e4m3"] < err["mxfp4"]
    assert 0.5 < err["mxfp8_e4m3"] / err["fp8_e4m3 per-tensor"] < 2  # Gaussian data: a block scale buys little
    for r in rows:
        assert math.isfinite(r["rel_l2"]) and r["rel_l2"] > 0


def test_cli_json_is_strict_and_complete():
    r = cli("formats", "--formats", "nvfp4,mxfp4", "--rules", "nearest,floor", "--blocks", "16,33",
            "--dists", "student_t", "--n", "1000", "--shape", "4x100x4", "--device", "cpu", "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert doc["command"] == "formats"
    got = {(x["format"], x["rule"], x["block"]) for x in doc["rows"]}
    assert got == {("nvfp4", "nearest", 16), ("nvfp4", "nearest", 33), ("mxfp4", "floor", 16), ("mxfp4", "floor", 33),
                   ("bf16", None, None), ("fp8_e4m3 per-tensor", None, None), ("fp8_e5m2 per-tensor", None, None)}


@pytest.mark.parametrize("args, code, text", [
    (["--blocks", "0"], 2, "block sizes"),
    (["--blocks", "2000"], 2, "block sizes"),
    (["--formats", "mxfp9"], 2, "unknown block format"),
    (["--formats", "mxfp4", "--rules", "nearest"], 2, "no format takes"),
    (["--dists", "cauchy"], 2, "unknown distribution"),
    (["--shape", "4x4"], 2, "MxKxN"),
    (["--n", "0"], 2, "--n"),
    (["--seed", "-1"], 2, "--seed"),
    (["--device", "cuda"], 3, "no CUDA GPU"),
])
def test_cli_usage_errors(args, code, text):
    if code == 3 and native.gpu_status().count:
        pytest.skip("a GPU is present")
    r = cli("formats", *args)
    assert r.code == code and text in r.err and "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) == 1


def test_plot_path_is_checked_before_the_run_and_written_atomically(tmp_path):
    r = cli("formats", "--plot", str(tmp_path / "missing" / "f.png"))
    assert r.code == 2 and "does not exist" in r.err
    r = cli("formats", "--plot", str(tmp_path / "f.txt"))
    assert r.code == 2 and ".png" in r.err
    r = cli("formats", "--plot", str(tmp_path))
    assert r.code == 2
    out = tmp_path / "f.png"
    r = cli("formats", "--formats", "mxfp4", "--rules", "rceil", "--blocks", "32", "--dists", "normal", "--n", "512",
            "--shape", "2x64x2", "--device", "cpu", "--plot", str(out))
    assert r.code == 0, r.err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == ["f.png"]  # no temporary left behind


@pytest.mark.parametrize("argv", [["formats", "--help"], ["formats", "--formats", "mxfp4", "--dists", "normal",
                                                          "--blocks", "32", "--n", "64", "--shape", "2x32x2",
                                                          "--device", "cpu", "--json"]])
def test_formats_needs_no_torch(argv):
    from helpers import cli_in_process

    assert "TORCH=False" in cli_in_process(*argv).stderr


MODELS = ("exact", "fp32", "promote:128", "hopper-fp8")


@pytest.fixture(scope="module")
def accumulator_rows():
    return _rows(formats="mxfp8_e4m3", rules="rceil", blocks="32", dists="normal", shape="8x4096x8", n=64,
                 baselines=False, accumulators=",".join(MODELS))


def test_accumulator_rows_are_the_models_matmul_bit_for_bit(accumulator_rows):
    """--accumulator: each row's matmul is numerics.accumulators' model on the
    same dequantized operands (rebuilt here as run() builds them; the numpy
    models, where the run used the library's C++ ones)."""
    from precisionlab.numerics import accumulators, compare

    assert [r["accumulator"] for r in accumulator_rows] == list(MODELS)
    rng = np.random.default_rng([0, 0, 32])
    exp._data("normal", 1, 64, 32, rng)  # the element statistics' vector comes first
    a, bt = exp._data("normal", 8, 4096, 32, rng), exp._data("normal", 8, 4096, 32, rng)
    q = exp._Quantizer(["cpu"])
    a_hat, bt_hat = q.roundtrip(a, "mxfp8_e4m3", "rceil", 32)[0], q.roundtrip(bt, "mxfp8_e4m3", "rceil", 32)[0]
    ref = a.astype(np.float64) @ bt.astype(np.float64).T
    for r in accumulator_rows:
        c = accumulators.parse(r["accumulator"]).matmul(a_hat, bt_hat.T)
        assert r["matmul_rel_l2"] == compare.rel_l2(c, ref), r["accumulator"]


def test_accumulator_errors_follow_the_models(accumulator_rows):
    """Against the float64 product of the same MXFP8 operands (exact products):
    exact is one fp32 rounding (u = 2^-24 relative a value, so under 1e-7 in
    rel-L2); IEEE fp32 is a few u sqrt(K) at most; promote:128 truncates to 14
    bits inside each chunk only (above fp32's); hopper-fp8 truncates the
    running sum of the whole K = 4096 at every group: above promote:128's.
    (The issue's 10x is for the largest relative error over 64 x 64 outputs,
    tests/test_accumulators.py's; this rel-L2 over 8 x 8 measured 8.9x.)"""
    err = {r["accumulator"]: r["accumulation_rel_l2"] for r in accumulator_rows}
    assert err["exact"] < 1e-7
    assert err["exact"] <= err["fp32"] < err["promote:128"] < err["hopper-fp8"]
    assert len({r["matmul_rel_l2"] for r in accumulator_rows}) == len(MODELS)  # each model changes the bits


def test_accumulator_option_errors_and_table():
    r = cli("formats", "--accumulator", "hopper-fp9", "--device", "cpu")
    assert r.code == 2 and "--accumulator" in r.err and len(r.err.strip().splitlines()) == 1
    r = cli("formats", "--formats", "mxfp4", "--rules", "rceil", "--blocks", "32", "--dists", "normal", "--n", "64",
            "--shape", "4x64x4", "--no-baselines", "--device", "cpu", "--accumulator", "exact,promote:32")
    assert r.code == 0, r.err
    assert "accumulator" in r.out and "promote:32" in r.out
