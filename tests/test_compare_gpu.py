"""The CUDA norm and matmul kernels through the compare discipline, and the
device API's argument checks."""

import emulate_gpu
import pytest
import torch

from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.numerics import torch_ops
from precisionlab.experiments import compare

FP32 = formats.get("fp32").code  # format codes by name, never literals

pytestmark = [pytest.mark.gpu, pytest.mark.torch_cuda]


@pytest.mark.parametrize("op", compare.OPS)
def test_cuda_kernels_are_not_flagged(op):
    res = compare.compare_op(compare.CompareOpConfig(op=op, device="cuda"))
    assert not res.any_failed, [r["verdict"] for r in res.rows]


@pytest.mark.parametrize("version", ["naive", "tiled", "splitk_ordered", "splitk_atomic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matmul_versions_match_float64(version, dtype):
    m, k, n = 77, 1000, 45  # nothing a multiple of the tile
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = torch.randn(k, n, device="cuda").to(dtype)
    c = torch.empty(m, n, device="cuda", dtype=dtype)
    splits = 4 if version.startswith("splitk") else 1
    nbytes = native.matmul_workspace_bytes(m, n, version, splits)
    work = torch.empty(max(nbytes, 4), dtype=torch.uint8, device="cuda")
    native.matmul_cuda(a.data_ptr(), b.data_ptr(), m, n, k, formats.from_torch(dtype).code, c.data_ptr(), variant=version,
                       splits=splits, work_ptr=work.data_ptr(), work_bytes=work.numel())
    ref = a.double() @ b.double()
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    assert ((c.double() - ref).norm() / ref.norm()).item() < tol


@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 33), (257, 4096), (2, 65536)])
def test_norms_match_torch(rows, cols):
    x = torch.randn(rows, cols, device="cuda") + 0.5
    w = torch.randn(cols, device="cuda")
    b = torch.randn(cols, device="cuda")
    y = torch_ops.rmsnorm(x, w, 1e-6)
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (cols,), w, 1e-6), rtol=1e-5, atol=1e-5)
    y = torch_ops.layernorm(x, w, b, 1e-5)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (cols,), w, b, 1e-5), rtol=1e-5, atol=1e-5)


def test_matmul_device_api_checks():
    a = torch.randn(8, 8, device="cuda")
    with pytest.raises(native.UsageError, match="workspace"):
        native.matmul_cuda(a.data_ptr(), a.data_ptr(), 8, 8, 8, FP32, a.data_ptr(), variant="splitk_ordered", splits=2)
    host = torch.randn(8, 8)
    with pytest.raises(native.UsageError, match="not a device pointer"):
        native.matmul_cuda(host.data_ptr(), a.data_ptr(), 8, 8, 8, FP32, a.data_ptr())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("version, splits", [("naive", 1), ("tiled", 1), ("splitk_ordered", 3)])
def test_matmul_matches_a_step_by_step_emulation(version, splits, dtype):
    # the check test_device_memory_gpu.py makes, through torch's tensors
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(9, 70, generator=g).to(dtype), torch.randn(70, 7, generator=g).to(dtype)
    want = emulate_gpu.matmul(torch_ops.to_numpy(a), torch_ops.to_numpy(b), splits)
    a, b = a.cuda(), b.cuda()
    c = torch.empty(9, 7, device="cuda", dtype=dtype)
    work = torch.empty(max(native.matmul_workspace_bytes(9, 7, version, splits), 4), dtype=torch.uint8, device="cuda")
    native.matmul_cuda(a.data_ptr(), b.data_ptr(), 9, 7, 70, formats.from_torch(dtype).code, c.data_ptr(), variant=version,
                       splits=splits, work_ptr=work.data_ptr(), work_bytes=work.numel())
    got = torch_ops.to_numpy(c.cpu())
    assert got.tobytes() == want.tobytes()
