"""Run every GPU kernel once on small odd sizes, for compute-sanitizer
(memcheck, racecheck) under `make sanitize`. No torch: the device-pointer
kernels get exact-size buffers from the library's own allocator, so an
overrun of one element is outside any allocation. A kernel added to the
project adds its calls here."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from precisionlab import native  # noqa: E402
from precisionlab.catalog import formats

FP32 = formats.get("fp32").code  # format codes by name, never literals


def main() -> int:
    if native.gpu_status().count == 0:
        print(f"no GPU: {native.gpu_status().reason}", file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    calls = 0
    for n in (1, 33, 1025, 100_003):
        x = rng.standard_normal(n)
        for storage in (f for f in formats.FORMATS.values() if not f.storage_only):
            xs = storage.round(x)
            for acc in ("fp32", "bf16", "fp64"):
                for method in (v.name for v in native.variants("sum", "cuda")):
                    native.sum_cuda(xs, storage.code, formats.get(acc).code, method, runs=2)
                    calls += 1
    for rows, cols in ((1, 1), (3, 33), (2, 1000), (2, 4096), (2, 32768), (1, 40000), (1, 151936)):
        x = rng.standard_normal((rows, cols))
        for name in ("fp32", "bf16", "fp16"):
            fmt = formats.get(name)
            xs = np.ascontiguousarray(fmt.round(x).astype(fmt.dtype))
            for method in (v.name for v in native.variants("softmax", "cuda")):
                for masked in native.MASKED:
                    native.softmax_cuda(xs, fmt.code, method, masked)
                    calls += 1
    calls += _device_pointer_kernels(rng)
    print(f"sanitize: {calls} kernel calls ran")
    return 0


def _device_pointer_kernels(rng) -> int:
    """Kernels with only a device-pointer API."""
    dev = native.DeviceArray.from_numpy
    calls = 0
    for rows, cols in ((1, 1), (3, 33), (300, 4096)):
        for name in ("fp32", "bf16", "fp16"):
            fmt = formats.get(name)
            x, w, b = (np.ascontiguousarray(fmt.round(rng.standard_normal(shape)).astype(fmt.dtype))
                       for shape in ((rows, cols), (cols,), (cols,)))
            dx, dw, db, dy = dev(x), dev(w), dev(b), native.DeviceArray(x.shape, x.dtype)
            for version in (v.name for v in native.variants("rmsnorm", "cuda")):
                native.rmsnorm_cuda(dx.ptr, rows, cols, fmt.code, dw.ptr, 1e-6, dy.ptr, version)
            native.layernorm_cuda(dx.ptr, rows, cols, fmt.code, dw.ptr, db.ptr, 1e-5, dy.ptr)
            native.softmax_cuda_device(dx.ptr, rows, cols, fmt.code, "stable_adaptive", dy.ptr)
            dy.numpy()  # synchronises: a kernel's error surfaces here
            calls += 4
    for m, k, n in ((1, 1, 1), (17, 33, 45), (128, 1000, 96)):
        a, bm = dev(rng.standard_normal((m, k)).astype(np.float32)), dev(rng.standard_normal((k, n)).astype(np.float32))
        c = native.DeviceArray((m, n), np.float32)
        for version in (v.name for v in native.variants("matmul", "cuda")):
            splits = 3 if version.startswith("splitk") else 1
            work = native.DeviceArray((max(4, native.matmul_workspace_bytes(m, n, version, splits)),), np.uint8)
            native.matmul_cuda(a.ptr, bm.ptr, m, n, k, FP32, c.ptr, variant=version, splits=splits, work_ptr=work.ptr,
                               work_bytes=work.nbytes)
            c.numpy()
            calls += 1
    for m, k, n in ((1, 1, 1), (5, 129, 7), (33, 4097, 3)):  # the accumulator models: every kind, reverse too
        e4m3 = formats.get("fp8_e4m3")
        a = dev(e4m3.round(rng.standard_normal((m, k))).astype(np.float32))
        bm = dev(e4m3.round(rng.standard_normal((k, n))).astype(np.float32))
        c = native.DeviceArray((m, n), np.float32)
        for kind in native.accumulator_kinds():
            for order in ("forward", "reverse"):
                model = native.accumulator(kind, bits=14, group=32, rounding="rne", interval=128, order=order)
                for version in (v.name for v in native.variants("matmul_acc", "cuda")):
                    native.matmul_acc_cuda(a.ptr, bm.ptr, m, n, k, e4m3.code, model, c.ptr, version)
                    c.numpy()
                    calls += 1
    for rows, keys, d, causal in ((1, 1, 8, False), (37, 101, 40, True), (70, 300, 64, False)):  # flash, odd tiles
        q, k, v = (dev(rng.standard_normal(shape).astype(np.float32)) for shape in ((rows, d), (keys, d), (keys, d)))
        out, lse = native.DeviceArray((rows, d), np.float32), native.DeviceArray((rows,), np.float32)
        for p in ("bf16", "fp8_e4m3"):
            cfg = native.flash_config(16, 24, formats.get(p).code, causal, 8.0, 4.0)
            for version in (v.name for v in native.variants("flash_attention", "cuda")):
                native.flash_attention_cuda(q.ptr, k.ptr, v.ptr, rows, keys, d, d, cfg, out.ptr, lse.ptr, version)
                out.numpy()
                calls += 1
    for name in ("fp32", "bf16", "fp16"):  # swiglu, rope, attention on odd sizes
        fmt = formats.get(name)
        arr = lambda *shape, fmt=fmt: dev(np.ascontiguousarray(fmt.round(rng.standard_normal(shape)).astype(fmt.dtype)))
        g, u, y = arr(1001), arr(1001), native.DeviceArray((1001,), fmt.dtype)
        native.swiglu_cuda(g.ptr, u.ptr, 1001, fmt.code, y.ptr)
        x, pos, yr = arr(7, 66), dev(np.arange(7, dtype=np.int64) * 5000), native.DeviceArray((7, 66), fmt.dtype)
        for phase in ("fp32", "bf16"):
            native.rope_cuda(x.ptr, 7, 66, fmt.code, pos.ptr, 10000.0, formats.get(phase).code, yr.ptr)
        q, k, v = arr(3, 5, 24), arr(3, 301, 24), arr(3, 301, 40)
        ks, ya = dev(np.array([0, 7, 299], np.int32)), native.DeviceArray((3, 5, 40), fmt.dtype)
        for causal in (False, True):
            native.attention_cuda(q.ptr, k.ptr, v.ptr, 3, 5, 301, 24, 40, fmt.code, causal, ks.ptr, 0.2, ya.ptr)
        ya.numpy()
        calls += 5
    for n, block in ((1, 32), (33, 32), (1001, 16), (100_003, 32)):
        x = rng.standard_normal(n).astype(np.float32)
        dx, dc, ds = dev(x), native.DeviceArray((n,), np.uint8), native.DeviceArray((-(-n // block),), np.uint8)
        dy = native.DeviceArray((n,), np.float32)
        for fmt, f in native.block_formats().items():
            for rule in (["nearest"] if f.scale.name != "e8m0" else ["floor", "rceil", "ceil", "even"]):
                for version in (v.name for v in native.variants("blockscale_quantize", "cuda")):
                    ts = native.blockscale_quantize_cuda(dx.ptr, n, fmt, rule, dc.ptr, ds.ptr, block=block,
                                                         tensor_amax=float(np.max(np.abs(x))), variant=version)
                    native.blockscale_dequantize_cuda(dc.ptr, ds.ptr, ts, n, fmt, dy.ptr, block=block)
                    dy.numpy()
                    calls += 2
    return calls


if __name__ == "__main__":
    sys.exit(main())
