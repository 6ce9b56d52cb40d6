"""tf32 (CPU emulation here; real TF32 under the gpu marker), info, bench."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import cli, strict_json
from precisionlab import native
from precisionlab.experiments import tf32
from precisionlab.runtime import torch_flags


def tf32_by_bits(x: np.ndarray) -> np.ndarray:
    """An independent TF32 rounding on the fp32 bit pattern: add half of the 13
    dropped bits (plus the kept lsb, for ties to even) and clear them."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    finite = (b & 0x7F800000) != 0x7F800000
    lsb = (b >> 13) & 1
    r = np.where(finite, (b + 0xFFF + lsb) & ~np.uint64(0x1FFF), b)
    return r.astype(np.uint32).view(np.float32)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31), spread=st.sampled_from([1, 20, 126]))
def test_tf32_rounding_bit_exact(seed, spread):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(4096) * np.exp2(rng.integers(-spread, spread, 4096))).astype(np.float32)
    x[:8] = [1 + 2**-11, 1 + 3 * 2**-11, 2049, 2051, np.finfo(np.float32).max, 1e-40, -0.0, np.inf]
    got = tf32.emulate_inputs(x, "tf32")
    want = tf32_by_bits(x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_emulated_tf32_error_at_k4096():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 4096)).astype(np.float32)
    b = rng.standard_normal((4096, 128)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    rel = lambda c: np.linalg.norm(c - ref) / np.linalg.norm(ref)
    e_tf32 = rel(tf32.matmul_emulated(a, b, "tf32"))
    assert 1e-4 < e_tf32 < 1e-3
    assert rel(tf32.matmul_emulated(a, b, "fp32")) < 1e-5
    assert 1e-3 < rel(tf32.matmul_emulated(a, b, "bf16")) < 1e-2


def test_emulated_tf32_breaks_integer_exactness():
    a, b, want = tf32.integer_problem()
    assert np.array_equal(tf32.matmul_emulated(a, b, "fp32"), want)
    assert np.count_nonzero(tf32.matmul_emulated(a, b, "tf32") != want) > 0


def test_tf32_command_json_and_flags_restored():
    r = cli("tf32", "--m", "256", "--n", "256", "--k", "512", "--sweep-mn", "64", "--device", "cpu", "--json")
    assert r.code == 0, r.err
    d = strict_json(r.out)
    modes = {x["mode"]: x for x in d["rows"] if x["section"] == "modes"}
    assert set(modes) == {"fp32", "tf32", "bf16", "fp16"}
    assert modes["tf32"]["emulated"] and not modes["fp32"]["emulated"]
    assert modes["tf32"]["rel_l2"] > 100 * modes["fp32"]["rel_l2"]
    assert {x["k"] for x in d["rows"] if x["section"] == "k_sweep"} == set(tf32.K_SWEEP)
    assert "torch.backends.cuda.matmul.allow_tf32" in d["flags_before"]


def test_tf32_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "k.png"
    r = cli("tf32", "--m", "64", "--n", "64", "--k", "64", "--sweep-mn", "32", "--device", "cpu", "--plot", str(png))
    assert r.code == 0 and png.read_bytes()[:4] == b"\x89PNG" and "plot written" in r.err


def enter_every_flag_mode():
    for mode in tf32.gpu_modes():
        if mode not in ("bf16", "fp16"):
            with torch_flags.matmul_mode(mode):
                pass


def test_flags_are_restored_in_process():
    before = torch_flags.torch_flags()
    tf32.run(tf32.Tf32Config(m=32, n=32, k=32, sweep=False, device="cpu"))
    enter_every_flag_mode()
    assert torch_flags.torch_flags() == before


@pytest.mark.parametrize("args", [["--k", "0"], ["--m", "-1"], ["--n", "10000000"], ["--m", "60000", "--n", "60000"]])
def test_tf32_bad_sizes_exit_2(args):
    r = cli("tf32", *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_info_runs_without_gpu():
    r = cli("info")
    assert r.code == 0 and "library" in r.out
    d = strict_json(cli("info", "--json").out)
    assert d["versions"]["numpy"] and d["library"]["abi"] == native.ABI_VERSION
    assert "torch.backends.cuda.matmul.allow_tf32" in d["flags"]
    assert d["cpu"]["threads"] >= 1 and isinstance(d["rows"], list)
    if native.gpu_status().count == 0:
        assert d["gpus"] == [] and d["cuda"]["unavailable"]
        assert "none" in r.out


def test_bench_quick_smoke_json():
    r = cli("bench", "--quick", "--cpu-n", "100000", "--json")
    assert r.code == 0, r.err
    d = strict_json(r.out)
    cpu = [x for x in d["rows"] if x["device"] == "cpu"]
    assert {x["variant"] for x in cpu} >= {"numpy.sum", "sequential", "pairwise", "kahan", "neumaier"}
    for x in cpu:
        if x["section"] == "attention":  # the emulator's row: a time, no bandwidth
            assert x["time_s"] > 0
            continue
        assert x["time_s"] > 0 and x["gbps"] > 0 and x["vs_baseline"] > 0


def test_bench_bad_section_exits_2():
    assert cli("bench", "--sections", "nope").code == 2
    assert cli("bench", "nope").code == 2
    assert cli("bench", "softmax", "--sections", "matmul").code == 2


def test_bench_section_as_argument():
    d = strict_json(cli("bench", "accumulate", "--quick", "--cpu-n", "1000", "--device", "cpu", "--json").out)
    assert d["params"]["sections"] == ["accumulate"]


@pytest.mark.gpu
@pytest.mark.torch_cuda
def test_gpu_tf32_error_and_integer_exactness():
    res = tf32.run(tf32.Tf32Config(m=1024, n=1024, k=4096, sweep=False, device="cuda"))
    modes = {r["mode"]: r for r in res.rows if r["section"] == "modes"}
    assert modes["tf32 (allow_tf32=True)"]["rel_l2"] > 20 * modes["fp32 (tf32 off)"]["rel_l2"]
    assert 1e-4 < modes["tf32 (allow_tf32=True)"]["rel_l2"] < 1e-3
    ints = {r["mode"]: r for r in res.rows if r["section"] == "integer"}
    assert ints["fp32 (tf32 off)"]["wrong"] == 0
    assert ints["tf32 (allow_tf32=True)"]["wrong"] > 0


@pytest.mark.parametrize("start", ["highest", "high", "medium"])
def test_every_mode_restores_the_flags(start):
    torch = pytest.importorskip("torch")
    was = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(start)
        before = torch_flags.torch_flags()
        enter_every_flag_mode()
        assert torch_flags.torch_flags() == before  # and reading them does not raise
    finally:
        torch.set_float32_matmul_precision(was)
