"""nondeterminism: the CPU emulation, the batch-invariant kernels, and (marked
gpu) the real atomics, split-K and batch-invariant kernels."""

import numpy as np
import pytest

from helpers import cli, strict_json
from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.numerics import metrics
from precisionlab.experiments import nondeterminism as nd


def cfg(**kw):
    kw.setdefault("device", "cpu")
    return nd.NondetConfig(**kw)


def test_emulated_atomics_vary_and_the_tree_does_not():
    res = nd.run(cfg(runs=30, n=1 << 20, sections="atomics"))
    atomic = next(r for r in res.rows if r["variant"] == "atomic")
    tree = next(r for r in res.rows if r["variant"] == "tree")
    assert atomic["emulated"] and atomic["distinct"] > 1 and atomic["max_spread_ulps"] > 0
    assert tree["distinct"] == 1 and tree["max_abs_diff"] == 0


def test_emulated_atomics_on_exact_data_agree():
    x = (np.arange(1 << 20) % 4).astype(np.float64)  # every partial sum is an integer below 2^24
    parts = nd.block_partials(x, nd.EMULATED_BLOCKS)
    fp32 = formats.get("fp32").code
    rng = np.random.default_rng(0)
    results = [native.accumulate_cpu(parts[rng.permutation(parts.size)], fp32, "sequential").result for _ in range(20)]
    assert len(set(results)) == 1 and results[0] == metrics.exact_sum(x)


def test_splitk_fixed_order_is_deterministic_but_not_unsplit():
    res = nd.run(cfg(runs=8, n=1000, sections="splitk"))
    atomic = next(r for r in res.rows if r["variant"] == "splitk_atomic")
    fixed = next(r for r in res.rows if r["variant"] == "splitk_ordered")
    assert atomic["distinct"] > 1 and fixed["distinct"] == 1
    assert fixed["max_abs_diff_vs_unsplit"] > 0


def test_batch_invariant_kernels_give_zero_difference():
    res = nd.run(cfg(runs=2, n=1000, sections="batch"))
    kernels = [r for r in res.rows if r["op"] in ("softmax", "rmsnorm")]
    inv = [r for r in kernels if native.variant(r["op"], r["variant"]).batch_invariant]
    dep = [r for r in kernels if not native.variant(r["op"], r["variant"]).batch_invariant]
    assert len(inv) == 2 and all(r["max_abs_diff"] == 0 and r["rows_changed"] == 0 for r in inv)
    assert all(r["differs_at"] and set(r["differs_at"]) <= {257, 1024} for r in dep)  # batch >= 132 SMs: a warp per row


def test_threads_change_the_sum():
    x = np.random.default_rng(0).standard_normal(1_000_001).astype(np.float32).astype(np.float64)
    sums = {t: native.sum_cpu_threads(x, t) for t in (1, 2, 4, 8)}
    assert len(set(sums.values())) > 1
    assert native.sum_cpu_threads(x, 2) == sums[2]  # the same thread count, the same bits


def test_command_json():
    r = cli("nondeterminism", "--runs", "5", "--n", "100000", "--device", "cpu", "--json")
    assert r.code == 0, r.err
    d = strict_json(r.out)
    for row in d["rows"]:
        for key in ("section", "variant", "device", "runs", "distinct", "max_spread_ulps", "max_abs_diff"):
            assert key in row
    assert {row["section"] for row in d["rows"]} == set(nd.SECTIONS)
    assert set(d["takeaways"]) == set(nd.SECTIONS)


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "h.png"
    r = cli("nondeterminism", "--runs", "20", "--n", "100000", "--sections", "atomics", "--device", "cpu",
            "--plot", str(png))
    assert r.code == 0 and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args", [["--runs", "1"], ["--runs", "0"], ["--n", str(10**13)], ["--n", "0"],
                                  ["--sections", "nope"]])
def test_bad_input_exits_2(args):
    r = cli("nondeterminism", *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


# --- GPU ------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.emu_slow
def test_gpu_atomics_vary_tree_does_not():
    x = np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32).astype(np.float64)
    fp32 = formats.get("fp32").code
    atomic = native.sum_cuda(x, fp32, fp32, "atomic", runs=200)
    tree = native.sum_cuda(x, fp32, fp32, "tree", runs=200)
    assert len(set(atomic.tolist())) > 1
    assert len(set(tree.tolist())) == 1


@pytest.mark.gpu
def test_gpu_splitk_and_batch_invariance(monkeypatch):
    # this project's kernels on device memory of its own: no torch CUDA needed
    # (torch's matmul row says so where it has none); a split-K small enough
    # for the CPU emulator too
    monkeypatch.setitem(nd.SPLITK, "m", 32)
    monkeypatch.setitem(nd.SPLITK, "n", 32)
    monkeypatch.setitem(nd.SPLITK, "k", 1024)
    res = nd.run(nd.NondetConfig(runs=8, n=1000, device="cuda", sections="splitk,batch"))
    fixed = next(r for r in res.rows if r["section"] == "splitk" and r["variant"] == "splitk_ordered")
    assert fixed["distinct"] == 1
    inv = [r for r in res.rows if r["section"] == "batch" and r["variant"] in ("stable", "block")]
    assert len(inv) == 2 and all(r["max_abs_diff"] == 0 and r["rows_changed"] == 0 for r in inv)


@pytest.mark.gpu
@pytest.mark.torch_cuda
def test_gpu_torch_ops_deterministic_mode():
    res = nd.run(nd.NondetConfig(runs=50, n=1000, device="cuda", sections="torch_ops"))
    on = [r for r in res.rows if r["deterministic"]]
    assert all(r.get("refused") or r["distinct"] == 1 for r in on)
    mm = next(r for r in on if r["op"] == "mm")  # CUBLAS_WORKSPACE_CONFIG is set: it must run
    assert not mm.get("refused") and mm["distinct"] == 1


def test_torch_ops_on_the_cpu_are_deterministic_and_restore_the_mode():
    torch = pytest.importorskip("torch")
    res = nd.run(nd.NondetConfig(runs=5, n=1000, device="cpu", sections="torch_ops"))
    rows = [r for r in res.rows if r["section"] == "torch_ops"]
    assert len(rows) == 6 and any(r["op"] == "mm" for r in rows)
    assert all(r["distinct"] == 1 and r["max_abs_diff"] == 0 for r in rows)
    assert not torch.are_deterministic_algorithms_enabled()
    assert res.params["CUBLAS_WORKSPACE_CONFIG_source"] in (None, "from the environment")  # cpu: not set by the run
