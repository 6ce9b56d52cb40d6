"""Run every GPU kernel once on small odd sizes, for compute-sanitizer
(memcheck, racecheck) under `make sanitize`. The host-API kernels need no
torch; the device-pointer ones (norms, matmul, the adaptive softmax) take
torch tensors, so make sanitize turns its caching allocator off. A kernel added to
the project adds its calls here."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from precisionlab import formats, native  # noqa: E402


def main() -> int:
    if native.gpu_status().count == 0:
        print(f"no GPU: {native.gpu_status().reason}", file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    calls = 0
    for n in (1, 33, 1025, 100_003):
        x = rng.standard_normal(n)
        for storage in formats.FORMATS.values():
            xs = storage.round(x)
            for acc in ("fp32", "bf16", "fp64"):
                for method in native.GPU_METHODS:
                    native.sum_cuda(xs, storage.code, formats.get(acc).code, method, runs=2)
                    calls += 1
    for rows, cols in ((1, 1), (3, 33), (2, 1000), (2, 4096), (1, 40000), (1, 151936)):
        x = rng.standard_normal((rows, cols))
        for name in ("fp32", "bf16", "fp16"):
            fmt = formats.get(name)
            xs = np.ascontiguousarray(fmt.round(x).astype(fmt.dtype))
            for method in native.SOFTMAX_METHODS:
                for masked in native.MASKED:
                    native.softmax_cuda(xs, fmt.code, method, masked)
                    calls += 1
    calls += _torch_kernels(rng)
    print(f"sanitize: {calls} kernel calls ran")
    return 0


def _torch_kernels(rng) -> int:
    """Kernels with only a device-pointer API: their memory comes from torch."""
    import torch

    calls = 0
    for rows, cols in ((1, 1), (3, 33), (300, 4096)):
        for dt, code in ((torch.float32, 1), (torch.bfloat16, 3), (torch.float16, 2)):
            x = torch.randn(rows, cols, device="cuda").to(dt)
            w, b, y = torch.randn(cols, device="cuda").to(dt), torch.randn(cols, device="cuda").to(dt), torch.empty_like(x)
            for version in native.NORM_VERSIONS:
                native.rmsnorm_cuda(x.data_ptr(), rows, cols, code, w.data_ptr(), 1e-6, y.data_ptr(), version)
            native.layernorm_cuda(x.data_ptr(), rows, cols, code, w.data_ptr(), b.data_ptr(), 1e-5, y.data_ptr())
            native.softmax_cuda_device(x.data_ptr(), rows, cols, code, "stable_adaptive", y.data_ptr())
            calls += 4
    for m, k, n in ((1, 1, 1), (17, 33, 45), (128, 1000, 96)):
        a, bm = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
        c = torch.empty(m, n, device="cuda")
        for version in native.MATMUL_VERSIONS:
            splits = 3 if version.startswith("splitk") else 1
            work = torch.empty(max(4, native.matmul_workspace_bytes(m, n, version, splits)), dtype=torch.uint8,
                               device="cuda")
            native.matmul_cuda(a.data_ptr(), bm.data_ptr(), m, n, k, 1, c.data_ptr(), version=version, splits=splits,
                               work_ptr=work.data_ptr(), work_bytes=work.numel())
            calls += 1
    torch.cuda.synchronize()
    return calls


if __name__ == "__main__":
    sys.exit(main())
