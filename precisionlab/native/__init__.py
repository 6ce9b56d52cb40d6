"""The library's public API for numpy callers: each entry point wrapped once over
the loader (loader.py), the catalog of variants and formats (catalog.py), the
block-scaled formats (blockscale.py) and the accumulator models' matmul
(matmul_acc.py). No GPU is an answer (gpu_status()), not
an exception."""

from __future__ import annotations

import ctypes
import math
import os
from ctypes import c_double, c_int, c_int64, c_size_t, c_void_p
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from precisionlab.errors import NoDeviceError, RunError, UsageError  # noqa: F401  (native.RunError in callers)
from precisionlab.native.loader import (  # noqa: F401  (the package's API)
    _table,
    LIB_NAME,
    ABI_VERSION,
    OK,
    INVALID_ARGUMENT,
    NULL_POINTER,
    SIZE_OVERFLOW,
    UNSUPPORTED,
    NO_DEVICE,
    NO_CUDA,
    CUDA_ERROR,
    OUT_OF_MEMORY,
    MASKED,
    _d,
    _i64,
    _int,
    _sz,
    _PROTOTYPES,
    LibraryNotFound,
    LibraryLoadError,
    NativeError,
    candidate_paths,
    _load,
    library_path,
    _call,
    _error,
    _dptr,
    _as_f64,
)
from precisionlab.native.catalog import (  # noqa: F401  (the package's API)
    _VariantDesc,
    _FormatDesc,
    KINDS,
    INPUT_ORDERS,
    _DEVICE_BITS,
    Variant,
    SassCeiling,
    catalog,
    variants,
    variant,
    _variant_id,
    FormatDesc,
    format_table,
)
from precisionlab.native.blockscale import (  # noqa: F401  (the package's API)
    _MinifloatDesc,
    _BlockFormatDesc,
    Minifloat,
    BlockFormat,
    minifloats,
    block_formats,
    scale_rules,
    BlockScaled,
    _block_args,
    blockscale_quantize_cpu,
    blockscale_dequantize_cpu,
    blockscale_quantize_cuda,
    blockscale_dequantize_cuda,
)


from precisionlab.native.matmul_acc import (  # noqa: F401  (the package's API)
    _Accumulator,
    accumulator_kinds,
    accumulator_aligns,
    accumulator_roundings,
    accumulator,
    matmul_acc_cpu,
    matmul_acc_cuda,
)

from precisionlab.native.flash import (  # noqa: F401  (the package's API)
    FlashConfig,
    flash_config,
    flash_attention_cpu,
    flash_attention_shared_bytes,
    flash_attention_cuda,
)

def build_info() -> str:
    return _load().pl_build_info().decode()


@dataclass(frozen=True)
class GpuStatus:
    count: int
    reason: str  # why there is none; "" when count > 0


@lru_cache(maxsize=1)
def gpu_status() -> GpuStatus:
    """How many CUDA devices the library sees. No GPU is an answer, not an error."""
    lib = _load()
    count = c_int(0)
    status = lib.pl_cuda_device_count(ctypes.byref(count))
    if status == OK:
        return GpuStatus(count.value, "")
    if status in (NO_DEVICE, NO_CUDA):
        # the reason users read, without the C function's name
        reason = lib.pl_last_error().decode(errors="replace").removeprefix("pl_cuda_device_count: ")
        if status == NO_DEVICE:
            reason = no_gpu_reason(reason, *cuda_versions(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        return GpuStatus(0, reason)
    raise _error("pl_cuda_device_count", status)


def no_gpu_reason(cuda_error: str, runtime: int, driver: int, visible: str | None) -> str:
    """Why there is no GPU, as a user should read it. The CUDA runtime (linked
    statically) answers a machine with no NVIDIA driver at all with
    cudaErrorInsufficientDriver, "CUDA driver version is insufficient", which
    reads like a broken install: without a driver (its version 0) that is
    simply no GPU on this machine. A driver older than the runtime is the real
    insufficient driver. cuda_error is pl_last_error's line, kept in the
    answer where it adds something; runtime and driver are the CUDA versions
    (cuda_versions(): 1000 * major + 10 * minor, the driver's 0 without one);
    visible is $CUDA_VISIBLE_DEVICES."""
    if "cudaErrorInsufficientDriver" in cuda_error:
        if driver == 0:
            return "no GPU on this machine: no NVIDIA driver is installed"
        return (f"the NVIDIA driver supports CUDA up to {driver // 1000}.{driver % 1000 // 10}, older than the "
                f"library's CUDA runtime {runtime // 1000}.{runtime % 1000 // 10}: update the driver ({cuda_error})")
    if "cudaErrorNoDevice" in cuda_error or "no CUDA device found" in cuda_error:
        if visible is not None and visible.strip() in ("", "-1"):
            return f"no GPU visible: CUDA_VISIBLE_DEVICES={visible!r} hides them"
        return "no GPU on this machine: the NVIDIA driver sees no device"
    return cuda_error


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    sm_count: int
    compute_capability: str
    total_mem_bytes: int


class DeviceArray:
    """A numpy-shaped buffer in device memory from the library itself, so this
    project's kernels need no framework's tensors. Freed when dropped."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        if any(d < 0 for d in self.shape):
            raise UsageError(f"a device array's shape cannot be negative: {self.shape}")
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize  # Python ints: no wrap-around
        if self.nbytes >= 1 << 63:
            raise UsageError(f"a device array of shape {self.shape} is too large")
        self._free = _load().pl_device_free
        ptr = c_void_p()
        _call("pl_device_alloc", max(self.nbytes, 1), ctypes.byref(ptr))
        self.ptr: int = ptr.value

    @classmethod
    def from_numpy(cls, a: np.ndarray) -> "DeviceArray":
        a = np.ascontiguousarray(a)
        d = cls(a.shape, a.dtype)
        if a.nbytes:
            _call("pl_copy_to_device", d.ptr, a.ctypes.data, a.nbytes)
        return d

    def numpy(self, rows: int | None = None) -> np.ndarray:
        """A host copy: the whole array, or its first `rows` along axis 0."""
        shape = self.shape if rows is None else (min(rows, self.shape[0]),) + self.shape[1:]
        out = np.empty(shape, self.dtype)
        if out.nbytes:
            _call("pl_copy_to_host", out.ctypes.data, self.ptr, out.nbytes)
        return out

    def __del__(self):
        if getattr(self, "ptr", None):
            self._free(self.ptr)
            self.ptr = None


def device_info(device: int = 0) -> DeviceInfo:
    name = ctypes.create_string_buffer(256)
    sms, major, minor, mem = c_int(), c_int(), c_int(), c_size_t()
    _call("pl_cuda_device_info", device, name, 256, ctypes.byref(sms), ctypes.byref(major), ctypes.byref(minor),
          ctypes.byref(mem))
    return DeviceInfo(name.value.decode(), sms.value, f"{major.value}.{minor.value}", mem.value)


TF32 = 6  # PL_TF32: a compute format, rounding only


def cuda_versions() -> tuple[int, int]:
    """(runtime, driver) as 1000 * major + 10 * minor; (0, 0) without CUDA."""
    rt, drv = c_int(), c_int()
    status = _load().pl_cuda_versions(ctypes.byref(rt), ctypes.byref(drv))
    return (rt.value, drv.value) if status == OK else (0, 0)


def round_to(x, format_code: int) -> np.ndarray:
    """The library's exact round-to-nearest-even of float64 values to a format."""
    x = _as_f64(x)
    y = np.empty_like(x)
    if x.size:
        _call("pl_round", _dptr(x), x.size, format_code, _dptr(y))
    return y


@dataclass(frozen=True)
class CpuSum:
    result: float
    stall_step: int  # -1: never stalled
    stall_value: float
    trace: np.ndarray | None


def accumulate_cpu(x, accumulator: int, method: str, seed: int = 0, trace: bool = False,
                   exact_path: bool = False) -> CpuSum:
    """Sum float64 values (already stored values) with an emulated accumulator format.
    exact_path: the library's general rounding on every operation (same bits, slower)."""
    x = _as_f64(x)
    out, step, value = c_double(), c_int64(), c_double()
    tr = np.empty_like(x) if trace else None
    _call("pl_accumulate_cpu_exact" if exact_path else "pl_accumulate_cpu", _dptr(x), x.size, accumulator, _variant_id("sum", method), seed & (2**64 - 1),
          ctypes.byref(out), ctypes.byref(step), ctypes.byref(value), _dptr(tr) if trace else None)
    return CpuSum(out.value, step.value, value.value, tr)


def sort_by_magnitude(x: np.ndarray, descending: bool = False, out: np.ndarray | None = None,
                      work: np.ndarray | None = None) -> np.ndarray:
    """x stably sorted by |x| (increasing, or decreasing), NaN last: the sorted
    summation orders. out and work (float64, x's size) are allocated when not given."""
    x = _as_f64(x)
    out = np.empty_like(x) if out is None else out
    work = np.empty_like(x) if work is None else work
    if out.shape != x.shape or work.shape != x.shape or out.dtype != np.float64 or work.dtype != np.float64 \
            or not (out.flags.c_contiguous and work.flags.c_contiguous):
        raise ValueError("sort_by_magnitude: out and work must be contiguous float64 arrays of x's size")
    if x.size:
        _call("pl_sort_by_magnitude", _dptr(x), x.size, int(descending), _dptr(out), _dptr(work))
    return out


def arranged(x: np.ndarray, order: str) -> np.ndarray:
    """x arranged in one of the catalog's input orders (a sum variant's `order`,
    INPUT_ORDERS), in a new float64 array: what a reordered variant's kernel runs on."""
    if order not in INPUT_ORDERS:
        raise ValueError(f"arranged: unknown order {order!r}; one of {', '.join(INPUT_ORDERS)}")
    if order == "as_given":
        return np.array(x, dtype=np.float64)
    if order == "reversed":
        return np.ascontiguousarray(_as_f64(x)[::-1])
    return sort_by_magnitude(x, descending=order == "descending_abs")


def sort_float32_by_magnitude(x: np.ndarray, descending: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """sort_by_magnitude for x whose values are all float32 values, with no work
    array (UsageError otherwise)."""
    x = _as_f64(x)
    out = np.empty_like(x) if out is None else out
    if out.shape != x.shape or out.dtype != np.float64 or not out.flags.c_contiguous or np.shares_memory(out, x):
        raise ValueError("sort_float32_by_magnitude: out must be a contiguous float64 array of x's size, apart from x")
    if x.size:
        _call("pl_sort_float32_by_magnitude", _dptr(x), x.size, int(descending), _dptr(out))
    return out


def reverse_magnitude_order(sorted_x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """sort_by_magnitude(x, descending=True) from sorted_x = sort_by_magnitude(x),
    in O(n); out=sorted_x works in place."""
    if out is not None and out is sorted_x:
        if sorted_x.dtype != np.float64 or not sorted_x.flags.c_contiguous:
            raise ValueError("reverse_magnitude_order: in place needs a contiguous float64 array")
    else:
        sorted_x = _as_f64(sorted_x)
        out = np.empty_like(sorted_x) if out is None else out
        if out.shape != sorted_x.shape or out.dtype != np.float64 or not out.flags.c_contiguous \
                or np.shares_memory(out, sorted_x):
            raise ValueError("reverse_magnitude_order: out must be sorted_x itself or a contiguous float64 array "
                             "of its size, apart from it")
    if sorted_x.size:
        _call("pl_reverse_magnitude_order", _dptr(sorted_x), sorted_x.size, _dptr(out))
    return out


EXACT_SUM_TERMS = 2176  # PL_EXACT_SUM_TERMS in cuda/precisionlab.h


def exact_sum_terms(x, absolute: bool = False) -> tuple[list[float] | None, int]:
    """The exact sum of x (or of |x|) as at most EXACT_SUM_TERMS doubles with
    the same exact sum: math.fsum of them is math.fsum of x, bit for bit.
    (terms, 0); or (None, 1) when x holds a NaN or an infinity, (None, 2) when
    the sum is near or past the double range: the caller's own rules then."""
    x = _as_f64(x)
    terms = np.empty(EXACT_SUM_TERMS, dtype=np.float64)
    k, special = c_int64(), c_int()
    _call("pl_exact_sum_terms", _dptr(x), x.size, int(absolute), _dptr(terms), terms.size, ctypes.byref(k),
          ctypes.byref(special))
    return (terms[:k.value].tolist(), 0) if special.value == 0 else (None, special.value)


def sum_cuda(x, storage: int, accumulator: int, method: str, runs: int = 1) -> np.ndarray:
    """Upload float64 values as `storage`, sum them `runs` times on the GPU; the results."""
    x = _as_f64(x)
    results = np.empty(runs, dtype=np.float64)
    _call("pl_sum_cuda", _dptr(x), x.size, storage, accumulator, _variant_id("sum", method), runs, _dptr(results))
    return results


def sum_workspace_bytes(n: int, storage: int, method: str) -> int:
    out = c_size_t()
    _call("pl_sum_workspace_bytes", n, storage, _variant_id("sum", method), ctypes.byref(out))
    return out.value


def sum_cuda_device(x_ptr: int, n: int, storage: int, accumulator: int, method: str, work_ptr: int,
                    work_bytes: int, out_ptr: int) -> None:
    """Launch a GPU sum on device pointers (e.g. torch data_ptr()); asynchronous."""
    _call("pl_sum_cuda_device", x_ptr, n, storage, accumulator, _variant_id("sum", method), work_ptr, work_bytes, out_ptr)


def _softmax(fn: str, x: np.ndarray, dtype_code: int, method: str, masked: str) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim != 2 or not x.flags.c_contiguous:
        raise ValueError("softmax input must be a C-contiguous 2-D array")
    rows, cols = x.shape
    y = np.empty_like(x)
    lse = np.empty(rows, dtype=np.float64)
    _call(fn, x.ctypes.data, rows, cols, dtype_code, _variant_id("softmax", method), MASKED[masked], y.ctypes.data, _dptr(lse))
    return y, lse


def softmax_cpu(x: np.ndarray, dtype_code: int, method: str, masked: str = "nan") -> tuple[np.ndarray, np.ndarray]:
    """Row softmax of x (a 2-D array already in the storage dtype) on the CPU: (y, lse)."""
    return _softmax("pl_softmax_cpu", x, dtype_code, method, masked)


def softmax_cuda(x: np.ndarray, dtype_code: int, method: str, masked: str = "nan") -> tuple[np.ndarray, np.ndarray]:
    """As softmax_cpu, through the GPU kernels (upload, run, download)."""
    return _softmax("pl_softmax_cuda", x, dtype_code, method, masked)


def softmax_cuda_device(x_ptr: int, rows: int, cols: int, dtype_code: int, method: str, y_ptr: int,
                        masked: str = "nan", lse_ptr: int | None = None) -> None:
    """Launch a GPU softmax on device pointers; asynchronous."""
    _call("pl_softmax_cuda_device", x_ptr, rows, cols, dtype_code, _variant_id("softmax", method), MASKED[masked], y_ptr,
          lse_ptr)


SOFTMAX_PLAN_FIELDS = ("variant", "kernel", "vpt", "threads", "rows_per_block", "cluster")  # pl_softmax_plan


def softmax_cuda_plan(rows: int, cols: int, dtype_code: int, method: str, sm_count: int) -> dict:
    """The launch a GPU softmax call gets (aligned pointers): the variant actually
    run, the kernel (softmax.cu's version number), vectors a thread, threads,
    rows a block, cluster size."""
    plan = (ctypes.c_int32 * len(SOFTMAX_PLAN_FIELDS))()
    _call("pl_softmax_cuda_plan", rows, cols, dtype_code, _variant_id("softmax", method), sm_count, ctypes.addressof(plan))
    out = dict(zip(SOFTMAX_PLAN_FIELDS, plan, strict=True))
    out["variant"] = next(v.name for v in variants("softmax") if v.id == out["variant"])
    return out


def swiglu_cpu(gate: np.ndarray, up: np.ndarray, dtype_code: int) -> np.ndarray:
    """silu(gate) * up, arrays already in the storage dtype, same shape."""
    gate, up = np.ascontiguousarray(gate), np.ascontiguousarray(up)
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise UsageError(f"swiglu: gate {gate.shape} {gate.dtype} and up {up.shape} {up.dtype} must match")
    y = np.empty_like(gate)
    _call("pl_swiglu_cpu", gate.ctypes.data, up.ctypes.data, gate.size, dtype_code, y.ctypes.data)
    return y


def swiglu_cuda(gate_ptr: int, up_ptr: int, n: int, dtype_code: int, y_ptr: int) -> None:
    _call("pl_swiglu_cuda", gate_ptr, up_ptr, n, dtype_code, y_ptr)


def rope_cpu(x: np.ndarray, dtype_code: int, pos: np.ndarray, base: float, phase_code: int) -> np.ndarray:
    """RoPE of the rows of x (rows x dim, storage dtype) at positions pos (one a row)."""
    x = np.ascontiguousarray(x)
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    if x.ndim != 2 or pos.shape != (x.shape[0],):
        raise UsageError(f"rope: x must be rows x dim and pos one position a row (got {x.shape}, {pos.shape})")
    y = np.empty_like(x)
    _call("pl_rope_cpu", x.ctypes.data, x.shape[0], x.shape[1], dtype_code, pos.ctypes.data, base, phase_code,
          y.ctypes.data)
    return y


def rope_cuda(x_ptr: int, rows: int, dim: int, dtype_code: int, pos_ptr: int, base: float, phase_code: int,
              y_ptr: int) -> None:
    _call("pl_rope_cuda", x_ptr, rows, dim, dtype_code, pos_ptr, base, phase_code, y_ptr)


def attention_cpu(q: np.ndarray, k: np.ndarray, v: np.ndarray, dtype_code: int, causal: bool,
                  kv_start: np.ndarray | None, scale: float) -> np.ndarray:
    """Attention over bh x t x d arrays in the storage dtype; kv_start int32 per bh (or None)."""
    q, k, v = (np.ascontiguousarray(a) for a in (q, k, v))
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or q.shape[0] != k.shape[0] or k.shape[:2] != v.shape[:2] \
            or q.shape[2] != k.shape[2]:
        raise UsageError(f"attention: q bh x tq x d, k bh x tk x d, v bh x tk x dv (got {q.shape}, {k.shape}, {v.shape})")
    ks = None if kv_start is None else np.ascontiguousarray(kv_start, dtype=np.int32)
    if ks is not None and ks.shape != (q.shape[0],):
        raise UsageError(f"attention: kv_start needs one entry a head-batch (got {ks.shape})")
    y = np.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype)
    _call("pl_attention_cpu", q.ctypes.data, k.ctypes.data, v.ctypes.data, q.shape[0], q.shape[1], k.shape[1],
          q.shape[2], v.shape[2], dtype_code, int(causal), None if ks is None else ks.ctypes.data, scale, y.ctypes.data)
    return y


def attention_cuda(q_ptr: int, k_ptr: int, v_ptr: int, bh: int, tq: int, tk: int, d: int, dv: int, dtype_code: int,
                   causal: bool, kv_start_ptr: int | None, scale: float, y_ptr: int) -> None:
    _call("pl_attention_cuda", q_ptr, k_ptr, v_ptr, bh, tq, tk, d, dv, dtype_code, int(causal), kv_start_ptr, scale,
          y_ptr)


def softmax_lanes(cols: int) -> int:
    return _load().pl_softmax_lanes(cols)


# --- norms and matmul: numpy arrays already in the storage dtype (CPU), or
#     device pointers (GPU, asynchronous) ------------------------------------


def _ptr(a: np.ndarray | None):
    return None if a is None else np.ascontiguousarray(a).ctypes.data


def rmsnorm_cpu(x: np.ndarray, dtype_code: int, w: np.ndarray | None, eps: float) -> np.ndarray:
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    w = None if w is None else np.ascontiguousarray(w)
    _call("pl_rmsnorm_cpu", x.ctypes.data, x.shape[0], x.shape[1], dtype_code, _ptr(w), eps, y.ctypes.data)
    return y


def layernorm_cpu(x: np.ndarray, dtype_code: int, w: np.ndarray | None, b: np.ndarray | None,
                  eps: float) -> np.ndarray:
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    w = None if w is None else np.ascontiguousarray(w)
    b = None if b is None else np.ascontiguousarray(b)
    _call("pl_layernorm_cpu", x.ctypes.data, x.shape[0], x.shape[1], dtype_code, _ptr(w), _ptr(b), eps,
          y.ctypes.data)
    return y


def matmul_cpu(a: np.ndarray, b: np.ndarray, dtype_code: int) -> np.ndarray:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul shapes {a.shape} @ {b.shape}")
    c = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    _call("pl_matmul_cpu", a.ctypes.data, b.ctypes.data, a.shape[0], b.shape[1], a.shape[1], dtype_code, c.ctypes.data)
    return c


def rmsnorm_cuda(x_ptr: int, rows: int, cols: int, dtype_code: int, w_ptr: int | None, eps: float, y_ptr: int,
                 variant: str = "block") -> None:
    _call("pl_rmsnorm_cuda", x_ptr, rows, cols, dtype_code, w_ptr, eps, y_ptr, _variant_id("rmsnorm", variant))


def layernorm_cuda(x_ptr: int, rows: int, cols: int, dtype_code: int, w_ptr: int | None, b_ptr: int | None,
                   eps: float, y_ptr: int) -> None:
    _call("pl_layernorm_cuda", x_ptr, rows, cols, dtype_code, w_ptr, b_ptr, eps, y_ptr)


def matmul_workspace_bytes(m: int, n: int, variant: str, splits: int = 1) -> int:
    out = c_size_t()
    _call("pl_matmul_workspace_bytes", m, n, _variant_id("matmul", variant), splits, ctypes.byref(out))
    return out.value


def matmul_cuda(a_ptr: int, b_ptr: int, m: int, n: int, k: int, dtype_code: int, c_ptr: int, variant: str = "tiled",
                splits: int = 1, work_ptr: int | None = None, work_bytes: int = 0) -> None:
    _call("pl_matmul_cuda", a_ptr, b_ptr, m, n, k, dtype_code, _variant_id("matmul", variant), splits, work_ptr, work_bytes,
          c_ptr)


def sum_cpu_threads(x, threads: int) -> float:
    """fp32 sum in `threads` chunks, one thread each, chunk sums added in order."""
    x = _as_f64(x)
    out = c_double()
    _call("pl_sum_cpu_threads", _dptr(x), x.size, threads, ctypes.byref(out))
    return out.value


def softmax_cpu_lanes(x: np.ndarray, dtype_code: int, lanes: int) -> np.ndarray:
    """Stable softmax with the sum in the order of a `lanes`-thread GPU block."""
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    _call("pl_softmax_cpu_lanes", x.ctypes.data, x.shape[0], x.shape[1], dtype_code, y.ctypes.data, lanes)
    return y


def rmsnorm_cpu_lanes(x: np.ndarray, dtype_code: int, w: np.ndarray | None, eps: float, lanes: int) -> np.ndarray:
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    w = None if w is None else np.ascontiguousarray(w)
    _call("pl_rmsnorm_cpu_lanes", x.ctypes.data, x.shape[0], x.shape[1], dtype_code, _ptr(w), eps, y.ctypes.data,
          lanes)
    return y


def adaptive_lanes(rows: int, cols: int, sm_count: int) -> int:
    return _load().pl_adaptive_lanes(rows, cols, sm_count)


def allreduce_cpu(partials: np.ndarray, format_code: int, order: str, offset: int = 0, chunk: int = 1,
                  step: int = -1) -> np.ndarray:
    """The ranks' partials (ranks x n, values of the format) summed in an
    all-reduce's order, every addition rounded to the format (allreduce.cu)."""
    p = _as_f64(partials)
    if p.ndim != 2 or p.shape[1] == 0:
        raise UsageError(f"partials must be ranks x n with n > 0 (got shape {p.shape})")
    out = np.empty(p.shape[1], dtype=np.float64)
    _call("pl_allreduce_cpu", _dptr(p), p.shape[0], p.shape[1], format_code, _variant_id("allreduce", order), offset, chunk,
          step, _dptr(out))
    return out
