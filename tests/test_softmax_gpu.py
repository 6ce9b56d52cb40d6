"""GPU softmax kernels against float64, the bugs on real lanes, the device API."""

import numpy as np
import pytest

from test_softmax import (COLS, SHIFTED, check_close, check_non_finite_rows, check_partly_masked,
                          check_no_rescale_bug, check_zero_identity_bug, run)
from precisionlab import native
from precisionlab.catalog import formats

FP32 = formats.get("fp32").code
BF16 = formats.get("bf16").code  # format codes by name, never literals

pytestmark = pytest.mark.gpu

GPU_METHODS = [v.name for v in native.variants("softmax", "cuda") if v.default]  # what the command runs


# plus the single-pass kernel's register tiers: 1, 2, 4 and 8 (fp32) vectors a thread
TIER_COLS = [1032, 4096, 8192, 8200, 16384, 32768]  # every register tier and an odd thread count


@pytest.mark.parametrize("cols", COLS + TIER_COLS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("method", GPU_METHODS)
def test_gpu_kernels_against_float64(cols, dtype, method):
    rows = 3 if cols < 100_000 else 2
    x = np.random.default_rng(cols).standard_normal((rows, cols)) * 4.0
    y, lse, s = run(x, dtype, method, device="cuda")
    check_close(y, s, dtype)
    assert ((y >= 0) & (y <= 1)).all()


@pytest.mark.parametrize("method", GPU_METHODS)
def test_gpu_edge_cases(method):
    for x in ([1000, 1001, 1002], [-1000, -1001, -1002]):
        y = run(x, method=method, device="cuda")[0]
        assert np.isnan(y).all() if method == "naive" else np.isfinite(y).all()
    assert np.isnan(run([-np.inf] * 8, method=method, device="cuda")[0]).all()
    y, lse, _ = run([-np.inf] * 8, method=method, masked="zero", device="cuda")
    assert (y == 0).all() and lse[0] == -np.inf


# cols that take each kernel's paths: scalar fallback (not a multiple of the
# vector), one vector a thread, several, and past 32768 columns (single_pass:
# a cluster of CTAs)
MASK_COLS = [2, 31, 32, 64, 65, 100, 1025, 2048, 4096, 4097, 40960]


@pytest.mark.parametrize("cols", MASK_COLS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("method", GPU_METHODS)
def test_gpu_partly_masked_rows_are_ordinary(method, dtype, cols):
    check_partly_masked(method, "cuda", cols, dtype)


@pytest.mark.parametrize("method", SHIFTED + ["single_pass", "online_vec", "cluster"])
def test_gpu_non_finite_rows(method):
    check_non_finite_rows(method, "cuda")
    for cols in (8, 4096, 40960):  # the vector paths: a NaN among -inf, under the zero policy
        x = np.full(cols, -np.inf)
        x[cols // 2] = np.nan
        y, lse, _ = run(x, method=method, masked="zero", device="cuda")
        assert np.isnan(y).all() and np.isnan(lse).all()


@pytest.mark.parametrize("method", ["naive", "bug_zero_identity", "bug_zero_start", "bug_no_rescale", "lowp_accum"])
def test_gpu_masked_zero_policy_holds_for_every_method(method):
    y, lse, _ = run([-np.inf] * 4, method=method, masked="zero", device="cuda")
    assert (y == 0).all() and lse[0] == -np.inf


def test_gpu_bugs():
    check_zero_identity_bug("cuda")
    check_no_rescale_bug("cuda")
    # a tree of equal bf16 partials is exact: the GPU hides what the CPU's long chain shows
    assert (run(np.zeros(512), "bf16", "lowp_accum", device="cuda")[0] == 1 / 512).all()


@pytest.mark.torch_cuda
def test_device_api_matches_torch():
    torch = pytest.importorskip("torch")
    for dt, code in ((torch.float32, 1), (torch.bfloat16, 3)):
        x = torch.randn(64, 4096, device="cuda", dtype=torch.float32).to(dt) * 3
        y = torch.empty_like(x)
        for method in ("single_pass", "online_vec", "stable"):
            native.softmax_cuda_device(x.data_ptr(), 64, 4096, code, method, y.data_ptr())
            torch.cuda.synchronize()
            ref = torch.softmax(x.double(), dim=-1)
            tol = 1e-6 if dt == torch.float32 else 1e-2
            torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol / 4096)


def test_device_api_rejects_host_pointers():
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(native.UsageError, match="not a device pointer"):
        native.softmax_cuda_device(x.ctypes.data, 2, 8, FP32, "stable", x.ctypes.data)


@pytest.mark.torch_cuda
def test_device_api_rejects_misaligned_pointers():
    # a misaligned access would be a sticky error that ends the CUDA context
    torch = pytest.importorskip("torch")
    x = torch.zeros(64, device="cuda")
    with pytest.raises(native.UsageError, match="aligned"):
        native.softmax_cuda_device(x.data_ptr() + 2, 2, 8, FP32, "stable", x.data_ptr())
    with pytest.raises(native.UsageError, match="aligned"):
        native.rmsnorm_cuda(x.data_ptr() + 1, 2, 8, BF16, None, 1e-6, x.data_ptr())
    with pytest.raises(native.UsageError, match="aligned"):
        work = torch.empty(native.sum_workspace_bytes(8, FP32, "tree"), dtype=torch.uint8, device="cuda")
        native.sum_cuda_device(x.data_ptr() + 2, 8, FP32, FP32, "tree", work.data_ptr(), work.numel(), x.data_ptr())
    y = torch.ones(2, 8, device="cuda")  # and the context is still fine
    assert torch.softmax(y, -1).sum().item() == pytest.approx(2.0)


def test_the_command_on_the_gpu():
    from helpers import cli, strict_json

    rows = strict_json(cli("softmax", "--device", "cuda", "--json").out)["rows"]
    gpu = [r for r in rows if r["device"] == "cuda" and r["kind"] == "variant"]
    assert {r["variant"] for r in gpu} == set(GPU_METHODS)
    for r in gpu:  # every shifted kernel passes every case with a finite reference
        if r["variant"] != "naive" and r["case"] not in ("masked", "nan"):
            assert r["passed"] and r["finite"], r
        if r["case"] in ("masked", "nan"):
            assert not r["passed"]  # a non-finite output never passes


# Every benchmark shape's row length, the vocab-wide rows included, against
# float64 (two rows each: the kernels are one block per row, so the row count
# changes only the grid).
@pytest.mark.parametrize("cols", sorted({c for _, c in __import__("precisionlab.experiments.bench",
                                                                    fromlist=["SOFTMAX_SHAPES"]).SOFTMAX_SHAPES}))
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("method", ["stable", "online", "online_vec", "single_pass"])
def test_gpu_benchmark_shapes_against_float64(cols, dtype, method):
    x = np.random.default_rng(cols + 1).standard_normal((2, cols)) * 4.0
    y, lse, s = run(x, dtype, method, device="cuda")
    check_close(y, s, dtype)


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9])
@pytest.mark.parametrize("cols", [8, 128, 256, 264, 512, 1000, 1024])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_warp_per_row_single_pass(rows, cols, dtype):
    # rows that do not fill the last block, every register tier of version 4,
    # a masked row and a partly masked one among ordinary rows
    x = np.random.default_rng(rows * cols).standard_normal((rows, cols)) * 4.0
    if rows > 2:
        x[1, :] = -np.inf
        x[2, : cols // 2] = -np.inf
    y, lse, s = run(x, dtype, "single_pass", device="cuda")
    ordinary = [r for r in range(rows) if r != 1 or rows <= 2]
    check_close(y[ordinary], s[ordinary], dtype)
    if rows > 2:
        assert np.isnan(y[1]).all() and np.isnan(lse[1])
        assert (y[2, : cols // 2] == 0).all()
    yz, lsez, _ = run(x, dtype, "single_pass", masked="zero", device="cuda")
    if rows > 2:
        assert (yz[1] == 0).all() and lsez[1] == -np.inf
    np.testing.assert_array_equal(yz[ordinary], y[ordinary])


def test_launch_plan_tiers():
    # what bench records beside each figure is what the launcher runs: one plan
    fp32, bf16 = formats.get("fp32").code, formats.get("bf16").code
    # 16 elements a thread (4 fp32 vectors, 2 bf16) while 512 threads hold
    # the row: 32 registers a thread, so 2048 threads (several rows) an SM
    assert native.softmax_cuda_plan(8, 4096, fp32, "single_pass", 132) == {
        "variant": "single_pass", "kernel": 2, "vpt": 4, "threads": 256, "rows_per_block": 1, "cluster": 1}
    assert native.softmax_cuda_plan(8, 2048, bf16, "single_pass", 132) == {
        "variant": "single_pass", "kernel": 2, "vpt": 2, "threads": 128, "rows_per_block": 1, "cluster": 1}
    assert native.softmax_cuda_plan(8, 1028, fp32, "single_pass", 132)["threads"] == 96  # 65 threads' work
    # then twice that, up to 16384 elements in 512 threads, so that two CTAs
    # share an SM's registers (make sass-check holds them to 64 a thread)
    assert native.softmax_cuda_plan(8, 16384, fp32, "single_pass", 132) == {
        "variant": "single_pass", "kernel": 2, "vpt": 8, "threads": 512, "rows_per_block": 1, "cluster": 1}
    assert native.softmax_cuda_plan(8, 16384, bf16, "single_pass", 132) == {
        "variant": "single_pass", "kernel": 2, "vpt": 4, "threads": 512, "rows_per_block": 1, "cluster": 1}
    assert native.softmax_cuda_plan(8, 8192, fp32, "single_pass", 132)["vpt"] == 4
    assert native.softmax_cuda_plan(8, 8192 + 4, fp32, "single_pass", 132)["vpt"] == 8
    # longer rows: split over a thread-block cluster (version 5, test_softmax_cluster_gpu.py),
    # 32768 columns over two CTAs of 512 threads
    for dtype, vpt in ((fp32, 8), (bf16, 4)):
        assert native.softmax_cuda_plan(8, 32768, dtype, "single_pass", 132) == {
            "variant": "cluster", "kernel": 5, "vpt": vpt, "threads": 512, "rows_per_block": 1, "cluster": 2}
    assert native.softmax_cuda_plan(8, 151936, bf16, "single_pass", 132)["variant"] == "cluster"
    # short rows: a warp per row, four rows a block
    assert native.softmax_cuda_plan(8, 1024, fp32, "single_pass", 132) == {
        "variant": "single_pass", "kernel": 4, "vpt": 8, "threads": 128, "rows_per_block": 4, "cluster": 1}
    assert native.softmax_cuda_plan(8, 1024, bf16, "single_pass", 132)["vpt"] == 4
    assert native.softmax_cuda_plan(8, 2048, bf16, "single_pass", 132)["kernel"] == 2
    assert native.softmax_cuda_plan(8, 1001, bf16, "single_pass", 132)["variant"] == "online"  # ragged rows
    assert native.softmax_cuda_plan(8, 1000, fp32, "stable_adaptive", 132)["threads"] == 1024
    assert native.softmax_cuda_plan(200, 1000, fp32, "stable_adaptive", 132)["threads"] == 32
    with pytest.raises(native.UsageError):
        native.softmax_cuda_plan(8, 0, fp32, "stable", 132)
