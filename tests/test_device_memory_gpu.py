"""The device-pointer kernels (matmul, RMSNorm, LayerNorm, the adaptive
softmax) on the library's own device memory (native.DeviceArray), no torch
needed: on a GPU, and on the CPU emulator (make emu-test). Two tests rely on
the emulator's shuffled block order to see atomics vary; a GPU usually varies
too, but need not on every run, so they are the emulator's alone."""

import emulate_gpu
import ml_dtypes
import numpy as np
import pytest

from precisionlab import native
from precisionlab.catalog import formats

FP32 = formats.get("fp32").code
BF16 = formats.get("bf16").code  # format codes by name, never literals

pytestmark = pytest.mark.gpu

NP = {1: np.float32, 2: np.float16, 3: ml_dtypes.bfloat16}
TOL = {1: 1e-5, 2: 2e-3, 3: 1e-2}  # relative L2, as the torch-based GPU matmul test


def Dev(arr: np.ndarray | None = None, like: np.ndarray | None = None, nbytes: int = 0) -> native.DeviceArray:
    """A copy of arr in device memory, or room for an array like `like`, or nbytes."""
    if arr is not None:
        return native.DeviceArray.from_numpy(arr)
    if like is not None:
        return native.DeviceArray(like.shape, like.dtype)
    return native.DeviceArray((nbytes,), np.uint8)


def rel_l2(got, ref):
    got = got.astype(np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def matmul(a, b, code, version, splits=1):
    m, k = a.shape
    n = b.shape[1]
    da, db, dc = Dev(a), Dev(b), Dev(like=np.empty((m, n), a.dtype))
    nbytes = native.matmul_workspace_bytes(m, n, version, splits)
    work = Dev(nbytes=max(nbytes, 4))
    native.matmul_cuda(da.ptr, db.ptr, m, n, k, code, dc.ptr, variant=version, splits=splits, work_ptr=work.ptr,
                       work_bytes=work.nbytes)
    return dc.numpy()


@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 33, 15), (77, 1000, 45)])  # nothing a multiple of the tile
@pytest.mark.parametrize("code", [1, 2, 3])
@pytest.mark.parametrize("version", ["naive", "tiled", "splitk_ordered", "splitk_atomic"])
def test_matmul_versions_match_float64(version, code, shape):
    m, k, n = shape
    rng = np.random.default_rng(k)
    a = rng.standard_normal((m, k)).astype(NP[code])
    b = rng.standard_normal((k, n)).astype(NP[code])
    c = matmul(a, b, code, version, splits=4 if version.startswith("splitk") else 1)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert rel_l2(c, ref) < TOL[code]


@pytest.mark.parametrize("code", [1, 3])
@pytest.mark.parametrize("version, splits", [("naive", 1), ("tiled", 1), ("splitk_ordered", 3)])
def test_matmul_matches_a_step_by_step_emulation(version, splits, code):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((9, 70)).astype(NP[code])
    b = rng.standard_normal((70, 7)).astype(NP[code])
    want = emulate_gpu.matmul(a, b, splits)
    assert np.array_equal(matmul(a, b, code, version, splits).view(np.uint16 if code == 3 else np.uint32),
                          want.view(np.uint16 if code == 3 else np.uint32))


@pytest.mark.emulator
def test_matmul_tiled_is_the_naive_chain_and_splitk_ordered_is_fixed():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((40, 4096)).astype(np.float32)
    b = rng.standard_normal((4096, 24)).astype(np.float32)
    naive, tiled = matmul(a, b, 1, "naive"), matmul(a, b, 1, "tiled")
    assert np.array_equal(naive, tiled)  # the same ascending-k FMA chain
    ordered = {matmul(a, b, 1, "splitk_ordered", 8).tobytes() for _ in range(4)}
    atomic = {matmul(a, b, 1, "splitk_atomic", 8).tobytes() for _ in range(6)}
    assert len(ordered) == 1  # whatever order the blocks ran in
    assert len(atomic) > 1  # the slices land in the order the blocks ran


def norms(x, code, w, b, version="block"):
    rows, cols = x.shape
    dx, dy = Dev(x), Dev(like=x)
    dw = Dev(w)
    if b is None:
        native.rmsnorm_cuda(dx.ptr, rows, cols, code, dw.ptr, 1e-6, dy.ptr, version)
    else:
        dbias = Dev(b)
        native.layernorm_cuda(dx.ptr, rows, cols, code, dw.ptr, dbias.ptr, 1e-5, dy.ptr)
    return dy.numpy()


@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 33), (5, 1025), (2, 4096)])
@pytest.mark.parametrize("code", [1, 3])
def test_norms_match_the_cpu_kernels(rows, cols, code):
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((rows, cols)) * 3 + 1).astype(NP[code])
    w = rng.standard_normal(cols).astype(NP[code])
    b = rng.standard_normal(cols).astype(NP[code])
    tol = {1: 1e-5, 3: 1e-2}[code]
    for version in ("block", "adaptive"):
        got = norms(x, code, w, None, version)
        assert rel_l2(got, native.rmsnorm_cpu(x, code, w, 1e-6).astype(np.float64)) < tol
    got = norms(x, code, w, b)
    assert rel_l2(got, native.layernorm_cpu(x, code, w, b, 1e-5).astype(np.float64)) < tol


def softmax_device(x, method):
    dx, dy = Dev(x), Dev(like=x)
    native.softmax_cuda_device(dx.ptr, x.shape[0], x.shape[1], FP32, method, dy.ptr)
    return dy.numpy()


def test_batch_invariant_kernels_and_batch_dependent_ones():
    """Rows computed alone vs inside a batch of 257: the same bits from the
    kernels whose launch depends on cols alone; some rows differ where the
    launch follows the batch size (a block per row below 132 rows, a warp
    above), as the CPU emulation in nondeterminism shows."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((257, 4096)).astype(np.float32)
    w = np.ones(4096, np.float32)
    run = {
        "rmsnorm block": (lambda v: norms(v, 1, w, None, "block"), True),
        "rmsnorm adaptive": (lambda v: norms(v, 1, w, None, "adaptive"), False),
        "softmax stable": (lambda v: softmax_device(v, "stable"), True),
        "softmax stable_adaptive": (lambda v: softmax_device(v, "stable_adaptive"), False),
    }
    for name, (fn, invariant) in run.items():
        batched = fn(x)
        changed = sum(not np.array_equal(fn(x[r:r + 1])[0], batched[r]) for r in range(32))
        assert (changed == 0) == invariant, (name, changed)


def test_misaligned_device_pointers_are_refused():
    x = Dev(np.zeros(64, np.float32))
    with pytest.raises(native.UsageError, match="aligned"):
        native.softmax_cuda_device(x.ptr + 2, 2, 8, FP32, "stable", x.ptr)
    with pytest.raises(native.UsageError, match="aligned"):
        native.rmsnorm_cuda(x.ptr + 1, 2, 8, BF16, None, 1e-6, x.ptr)
    work = Dev(nbytes=native.sum_workspace_bytes(8, FP32, "tree"))
    with pytest.raises(native.UsageError, match="aligned"):
        native.sum_cuda_device(x.ptr + 2, 8, FP32, FP32, "tree", work.ptr, work.nbytes, x.ptr)
    with pytest.raises(native.UsageError, match="aligned"):
        native.matmul_cuda(x.ptr + 2, x.ptr, 2, 2, 2, FP32, x.ptr, variant="naive")


@pytest.mark.emulator
def test_atomic_sum_follows_the_block_order_and_the_tree_does_not():
    # the GPU test draws 200 runs of 2^24; the emulator gets the same lesson from less
    x = np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32).astype(np.float64)
    atomic = native.sum_cuda(x, FP32, FP32, "atomic", runs=12)
    tree = native.sum_cuda(x, FP32, FP32, "tree", runs=12)
    assert len(set(atomic.tolist())) > 1
    assert len(set(tree.tolist())) == 1
