"""GPU accumulate kernels: determinism of the tree, results within the bound,
the device-pointer API, and argument checks that keep the context alive."""

import math

import emulate_gpu
import numpy as np
import pytest

from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.experiments import accumulate as acc

FP32 = formats.get("fp32").code
FP64 = formats.get("fp64").code  # format codes by name, never literals

pytestmark = pytest.mark.gpu
GPU_SUMS = [v.name for v in native.variants("sum", "cuda")]  # the library's catalog


def stored(storage, n, seed=0, dist="normal"):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) if dist == "normal" else rng.random(n)
    return formats.get(storage).round(x)


@pytest.mark.parametrize("storage", ["fp32", "bf16", "fp16", "fp64", "fp8_e4m3"])
@pytest.mark.parametrize("accumulator", ["fp32", "bf16", "fp64"])
@pytest.mark.parametrize("method", ["tree", "tree_kahan"])
@pytest.mark.emu_slow
def test_tree_gives_the_same_bits_every_run(storage, accumulator, method):
    x = stored(storage, (1 << 20) + 3)
    r = native.sum_cuda(x, formats.get(storage).code, formats.get(accumulator).code, method, runs=20)
    assert len(set(r.view(np.uint64).tolist())) == 1


@pytest.mark.parametrize("n", [1, 31, 33, 1025, (1 << 22) + 1])
@pytest.mark.parametrize("method", GPU_SUMS)
@pytest.mark.parametrize("accumulator", ["fp32", "bf16", "fp64"])
def test_results_within_the_bound(n, method, accumulator):
    x = stored("fp32", n, seed=n)
    fmt = formats.get(accumulator)
    got = float(native.sum_cuda(x, formats.get("fp32").code, fmt.code, method)[0])
    exact = math.fsum(x.tolist())
    abs_sum = math.fsum(np.abs(x).tolist())
    bound, kind = acc._bound(method, n, fmt, formats.get("fp32"), abs_sum, exact, gpu=True)
    assert kind in ("rigorous", "vacuous")
    assert abs(got - exact) <= bound


@pytest.mark.parametrize("n", [1, 31, 33, 1025, 100_003])
def test_small_integers_sum_exactly(n):
    x = np.arange(n, dtype=np.float64) % 7  # every partial sum is an integer < 2^24
    for method in GPU_SUMS:
        assert native.sum_cuda(x, 1, 1, method)[0] == math.fsum(x.tolist())


def test_fp32_tree_is_accurate():
    x = stored("fp32", 1 << 24, dist="uniform")
    got = native.sum_cuda(x, 1, 1, "tree")[0]
    exact = math.fsum(x.tolist())
    assert abs(got - exact) / exact < 1e-5


@pytest.mark.torch_cuda
def test_device_pointer_api_matches_and_accepts_unaligned_views():
    torch = pytest.importorskip("torch")
    x = torch.randn((1 << 20) + 1, device="cuda", dtype=torch.float32)
    work = torch.empty(native.sum_workspace_bytes(x.numel(), 1, "tree"), dtype=torch.uint8, device="cuda")
    out = torch.empty(1, dtype=torch.float64, device="cuda")
    native.sum_cuda_device(x.data_ptr(), x.numel(), 1, 1, "tree", work.data_ptr(), work.numel(), out.data_ptr())
    torch.cuda.synchronize()
    host = native.sum_cuda(x.double().cpu().numpy(), 1, 1, "tree")[0]
    assert out.item() == host
    view = x[1:]  # 4 bytes past a 16-byte boundary: the scalar path
    native.sum_cuda_device(view.data_ptr(), view.numel(), 1, 1, "tree", work.data_ptr(), work.numel(), out.data_ptr())
    torch.cuda.synchronize()
    exact = math.fsum(view.double().cpu().numpy().tolist())
    assert abs(out.item() - exact) <= 1e-3 * math.fsum(view.abs().double().cpu().numpy().tolist())


@pytest.mark.torch_cuda
def test_bad_device_arguments_are_statuses_not_crashes():
    torch = pytest.importorskip("torch")
    host = np.ones(16, dtype=np.float32)
    work = torch.empty(1 << 16, dtype=torch.uint8, device="cuda")
    out = torch.empty(1, dtype=torch.float64, device="cuda")
    with pytest.raises(UsageError, match="not a device pointer"):
        native.sum_cuda_device(host.ctypes.data, 16, 1, 1, "tree", work.data_ptr(), work.numel(), out.data_ptr())
    with pytest.raises(UsageError, match="workspace"):
        native.sum_cuda_device(work.data_ptr(), 16, 1, 1, "tree", work.data_ptr(), 8, out.data_ptr())
    with pytest.raises(UsageError, match="accumulator"):
        native.sum_cuda(np.ones(4), 1, formats.get("fp16").code, "tree")
    # the context survived: a normal call still works
    assert native.sum_cuda(np.ones(4), FP32, FP32, "tree")[0] == 4.0


def test_out_of_memory_is_a_status():
    from precisionlab.errors import RunError

    with pytest.raises(RunError, match="out of memory|cudaMalloc|allocation"):
        # 2^40 fp64 values: 8 TiB, more than any GPU; the host buffer fails first or the device one does
        native._call("pl_sum_cuda", native._dptr(np.ones(1)), 1 << 40, FP64, FP64, native.variant("sum", "tree").id, 1,
                     native._dptr(np.ones(1)))


def test_fp8_storage_keeps_infinities():
    # e5m2 has inf: the GPU's upload must not saturate it to 57344 as the
    # saturating constructor does; e4m3fn has none, so overflow is NaN there
    e5m2, e4m3, fp32 = (formats.get(n).code for n in ("fp8_e5m2", "fp8_e4m3", "fp32"))
    for method in ("tree", "atomic"):
        assert native.sum_cuda(np.array([np.inf]), e5m2, fp32, method)[0] == np.inf
        assert native.sum_cuda(np.array([1e6, 1.0]), e5m2, fp32, method)[0] == np.inf  # 1e6 rounds to inf
        assert np.isnan(native.sum_cuda(np.array([np.inf, -np.inf]), e5m2, fp32, method)[0])
        assert np.isnan(native.sum_cuda(np.array([1e6]), e4m3, fp32, method)[0])


def test_matmul_workspace_validates_its_variant():
    with pytest.raises(UsageError, match="unknown matmul variant 99"):
        native._call("pl_matmul_workspace_bytes", 4, 4, 99, 1, native.ctypes.byref(native.c_size_t()))
    assert native.matmul_workspace_bytes(4, 4, "tiled", 0) == 0  # splits do not apply to unsplit versions


@pytest.mark.parametrize("n", [1, 31, 33, 1025, 100_003])
@pytest.mark.parametrize("storage", ["fp32", "bf16"])
@pytest.mark.parametrize("accumulator", ["fp32", "bf16", "fp64"])
@pytest.mark.parametrize("method", ["tree", "tree_kahan"])
def test_tree_matches_a_step_by_step_emulation(method, accumulator, storage, n):
    # the kernel's order replayed in numpy (tests/emulate_gpu.py): the same bits
    x = stored(storage, n, seed=n)
    got = native.sum_cuda(x, formats.get(storage).code, formats.get(accumulator).code, method)[0]
    want = emulate_gpu.tree_sum(x.astype(formats.get(storage).dtype), accumulator, kahan=method == "tree_kahan",
                                sms=native.device_info().sm_count)
    assert got == want or (np.isnan(got) and np.isnan(want)), (got, want)


def test_point_one_in_bf16_summed_on_the_gpu():
    # the literature's values: the fp32 sum of bf16-stored 0.1 is exact in every
    # order (each partial sum is a multiple of 205/2048 below 2^24)
    x = np.full(10_000, 0.1)
    bf16, fp32 = formats.get("bf16").code, formats.get("fp32").code
    for method in GPU_SUMS:
        assert native.sum_cuda(x, bf16, fp32, method)[0] == 1000.9765625


def test_the_command_on_the_gpu():
    from helpers import cli, strict_json

    rows = strict_json(cli("accumulate", "--dtype", "bf16", "--n", "10000", "--device", "cuda", "--json").out)["rows"]
    gpu = {(r["variant"], r["accumulator"]): r["result"] for r in rows if r["device"] == "cuda"}
    assert {m for m, _ in gpu} == set(GPU_SUMS)
    assert all(gpu[m, "fp32"] == 1000.9765625 for m in GPU_SUMS)
