"""The only ctypes code: find libprecisionlab.so, declare its prototypes once,
turn statuses into exceptions, and wrap each entry point for numpy callers.

Layers, bottom up: `_load()` finds and opens the library; `_PROTOTYPES` is the
raw binding table (the C prototype sits beside each entry); `_call()` checks
every status; the functions at the bottom are the public API.
"""

from __future__ import annotations

import ctypes
import math
import os
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_int64, c_size_t, c_uint64, c_void_p
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from precisionlab.errors import NoDeviceError, RunError, UsageError

LIB_NAME = "libprecisionlab.so"
ABI_VERSION = 3  # PL_ABI_VERSION in cuda/precisionlab.h

# pl_status
OK, INVALID_ARGUMENT, NULL_POINTER, SIZE_OVERFLOW, UNSUPPORTED = 0, 1, 2, 3, 4
NO_DEVICE, NO_CUDA, CUDA_ERROR, OUT_OF_MEMORY = 5, 6, 7, 8

MASKED = {"nan": 0, "zero": 1}  # pl_masked_policy: what an all -inf row gives (a policy, not a variant)

_d = POINTER(c_double)
_i64 = POINTER(c_int64)
_int = POINTER(c_int)
_sz = POINTER(c_size_t)

# name: (restype, argtypes)        C prototype
_PROTOTYPES = {
    "pl_abi_version": (c_int, []),  # int pl_abi_version(void)
    "pl_error_string": (c_char_p, [c_int]),  # const char* pl_error_string(int status)
    "pl_last_error": (c_char_p, []),  # const char* pl_last_error(void)
    "pl_build_info": (c_char_p, []),  # const char* pl_build_info(void)
    "pl_variant_count": (c_int, [_int]),  # int pl_variant_count(int* count)
    "pl_variant_info": (c_int, [c_int, c_void_p]),  # int pl_variant_info(int index, pl_variant_desc* out)
    "pl_format_info": (c_int, [c_int, c_void_p]),  # int pl_format_info(int code, pl_format_desc* out)
    "pl_cuda_device_count": (c_int, [_int]),  # int pl_cuda_device_count(int* count)
    # int pl_cuda_versions(int* runtime, int* driver)
    "pl_cuda_versions": (c_int, [_int, _int]),
    # int pl_cuda_device_info(int device, char* name, int name_len, int* sm_count,
    #                         int* cc_major, int* cc_minor, size_t* total_mem)
    "pl_cuda_device_info": (c_int, [c_int, c_char_p, c_int, _int, _int, _int, _sz]),
    "pl_device_alloc": (c_int, [c_size_t, POINTER(c_void_p)]),  # int pl_device_alloc(size_t bytes, void** dev)
    "pl_device_free": (c_int, [c_void_p]),  # int pl_device_free(void* dev)
    # int pl_copy_to_device(void* dev, const void* host, size_t bytes)
    "pl_copy_to_device": (c_int, [c_void_p, c_void_p, c_size_t]),
    # int pl_copy_to_host(void* host, const void* dev, size_t bytes)
    "pl_copy_to_host": (c_int, [c_void_p, c_void_p, c_size_t]),
    # int pl_round(const double* x, int64_t n, int format, double* y)
    "pl_round": (c_int, [_d, c_int64, c_int, _d]),
    # int pl_accumulate_cpu(const double* x, int64_t n, int accumulator, int method, uint64_t seed,
    #                       double* result, int64_t* stall_step, double* stall_value, double* trace)
    "pl_accumulate_cpu": (c_int, [_d, c_int64, c_int, c_int, c_uint64, _d, _i64, _d, _d]),
    # int pl_accumulate_cpu_exact(...): pl_accumulate_cpu's arguments, exact path only
    "pl_accumulate_cpu_exact": (c_int, [_d, c_int64, c_int, c_int, c_uint64, _d, _i64, _d, _d]),
    # int pl_sort_by_magnitude(const double* x, int64_t n, int descending, double* out, double* work)
    "pl_sort_by_magnitude": (c_int, [_d, c_int64, c_int, _d, _d]),
    # int pl_sort_float32_by_magnitude(const double* x, int64_t n, int descending, double* out)
    "pl_sort_float32_by_magnitude": (c_int, [_d, c_int64, c_int, _d]),
    # int pl_reverse_magnitude_order(const double* sorted, int64_t n, double* out)
    "pl_reverse_magnitude_order": (c_int, [_d, c_int64, _d]),
    # int pl_exact_sum_terms(const double* x, int64_t n, int absolute, double* terms, int64_t capacity,
    #                        int64_t* nterms, int* special)
    "pl_exact_sum_terms": (c_int, [_d, c_int64, c_int, _d, c_int64, _i64, _int]),
    # int pl_sum_cpu_threads(const double* x, int64_t n, int threads, double* result)
    "pl_sum_cpu_threads": (c_int, [_d, c_int64, c_int, _d]),
    # int pl_softmax_cpu_lanes(const void* x, int64_t rows, int64_t cols, int dtype, void* y, int lanes)
    "pl_softmax_cpu_lanes": (c_int, [c_void_p, c_int64, c_int64, c_int, c_void_p, c_int]),
    # int pl_rmsnorm_cpu_lanes(const void* x, int64_t rows, int64_t cols, int dtype, const void* w, float eps,
    #                          void* y, int lanes)
    "pl_rmsnorm_cpu_lanes": (c_int, [c_void_p, c_int64, c_int64, c_int, c_void_p, c_float, c_void_p, c_int]),
    # int pl_adaptive_lanes(int64_t rows, int64_t cols, int sm_count)
    "pl_adaptive_lanes": (c_int, [c_int64, c_int64, c_int]),
    # int pl_sum_workspace_bytes(int64_t n, int storage, int method, size_t* bytes)
    "pl_sum_workspace_bytes": (c_int, [c_int64, c_int, c_int, _sz]),
    # int pl_sum_cuda_device(const void* x_dev, int64_t n, int storage, int accumulator, int method,
    #                        void* work_dev, size_t work_bytes, double* out_dev)
    "pl_sum_cuda_device": (c_int, [c_void_p, c_int64, c_int, c_int, c_int, c_void_p, c_size_t, c_void_p]),
    # int pl_sum_cuda(const double* x, int64_t n, int storage, int accumulator, int method,
    #                 int runs, double* results)
    "pl_sum_cuda": (c_int, [_d, c_int64, c_int, c_int, c_int, c_int, _d]),
    # int pl_softmax_lanes(int64_t cols)
    "pl_softmax_lanes": (c_int, [c_int64]),
    # int pl_softmax_cpu(const void* x, int64_t rows, int64_t cols, int dtype, int method, int masked,
    #                    void* y, double* lse)
    "pl_softmax_cpu": (c_int, [c_void_p, c_int64, c_int64, c_int, c_int, c_int, c_void_p, _d]),
    # int pl_swiglu_cpu(const void* gate, const void* up, int64_t n, int dtype, void* y)
    "pl_swiglu_cpu": (c_int, [c_void_p, c_void_p, c_int64, c_int, c_void_p]),
    # int pl_swiglu_cuda(const void* gate_dev, const void* up_dev, int64_t n, int dtype, void* y_dev)
    "pl_swiglu_cuda": (c_int, [c_void_p, c_void_p, c_int64, c_int, c_void_p]),
    # int pl_rope_cpu(const void* x, int64_t rows, int64_t dim, int dtype, const int64_t* pos, float base, int phase,
    #                 void* y)
    "pl_rope_cpu": (c_int, [c_void_p, c_int64, c_int64, c_int, c_void_p, c_float, c_int, c_void_p]),
    # int pl_rope_cuda(same, device pointers)
    "pl_rope_cuda": (c_int, [c_void_p, c_int64, c_int64, c_int, c_void_p, c_float, c_int, c_void_p]),
    # int pl_attention_cpu(const void* q, const void* k, const void* v, int64_t bh, int64_t tq, int64_t tk,
    #                      int64_t d, int64_t dv, int dtype, int causal, const int32_t* kv_start, float scale, void* y)
    "pl_attention_cpu": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_int64, c_int64, c_int64, c_int,
                                 c_int, c_void_p, c_float, c_void_p]),
    # int pl_attention_cuda(same, device pointers)
    "pl_attention_cuda": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_int64, c_int64, c_int64, c_int,
                                  c_int, c_void_p, c_float, c_void_p]),
    # int pl_softmax_cuda_plan(int64_t rows, int64_t cols, int dtype, int method, int sm_count, pl_softmax_plan* plan)
    "pl_softmax_cuda_plan": (c_int, [c_int64, c_int64, c_int, c_int, c_int, c_void_p]),
    # int pl_softmax_cuda(same, host pointers)
    "pl_softmax_cuda": (c_int, [c_void_p, c_int64, c_int64, c_int, c_int, c_int, c_void_p, _d]),
    # int pl_softmax_cuda_device(const void* x_dev, int64_t rows, int64_t cols, int dtype, int method,
    #                            int masked, void* y_dev, float* lse_dev)
    "pl_softmax_cuda_device": (c_int, [c_void_p, c_int64, c_int64, c_int, c_int, c_int, c_void_p, c_void_p]),
    # int pl_rmsnorm_cpu(const void* x, int64_t rows, int64_t cols, int dtype, const void* w, float eps, void* y)
    "pl_rmsnorm_cpu": (c_int, [c_void_p, c_int64, c_int64, c_int, c_void_p, c_float, c_void_p]),
    # int pl_layernorm_cpu(const void* x, int64_t rows, int64_t cols, int dtype, const void* w, const void* b,
    #                      float eps, void* y)
    "pl_layernorm_cpu": (c_int, [c_void_p, c_int64, c_int64, c_int, c_void_p, c_void_p, c_float, c_void_p]),
    # int pl_rmsnorm_cuda(const void* x_dev, int64_t rows, int64_t cols, int dtype, const void* w_dev, float eps,
    #                     void* y_dev, int variant)
    "pl_rmsnorm_cuda": (c_int, [c_void_p, c_int64, c_int64, c_int, c_void_p, c_float, c_void_p, c_int]),
    # int pl_layernorm_cuda(const void* x_dev, int64_t rows, int64_t cols, int dtype, const void* w_dev,
    #                       const void* b_dev, float eps, void* y_dev)
    "pl_layernorm_cuda": (c_int, [c_void_p, c_int64, c_int64, c_int, c_void_p, c_void_p, c_float, c_void_p]),
    # int pl_matmul_cpu(const void* a, const void* b, int64_t m, int64_t n, int64_t k, int dtype, void* c)
    "pl_matmul_cpu": (c_int, [c_void_p, c_void_p, c_int64, c_int64, c_int64, c_int, c_void_p]),
    # int pl_matmul_workspace_bytes(int64_t m, int64_t n, int variant, int splits, size_t* bytes)
    "pl_matmul_workspace_bytes": (c_int, [c_int64, c_int64, c_int, c_int, _sz]),
    # int pl_matmul_cuda(const void* a_dev, const void* b_dev, int64_t m, int64_t n, int64_t k, int dtype,
    #                    int variant, int splits, void* work_dev, size_t work_bytes, void* c_dev)
    "pl_matmul_cuda": (c_int, [c_void_p, c_void_p, c_int64, c_int64, c_int64, c_int, c_int, c_int, c_void_p, c_size_t,
                               c_void_p]),
    # int pl_allreduce_cpu(const double* partials, int ranks, int64_t n, int format, int order, int64_t offset,
    #                      int64_t chunk, int step, double* out)
    "pl_allreduce_cpu": (c_int, [_d, c_int, c_int64, c_int, c_int, c_int64, c_int64, c_int, _d]),
    # int pl_minifloat_info(int id, struct pl_minifloat_desc* out)
    "pl_minifloat_info": (c_int, [c_int, c_void_p]),
    # int pl_block_format_info(int id, struct pl_block_format_desc* out)
    "pl_block_format_info": (c_int, [c_int, c_void_p]),
    # int pl_scale_rule_info(int id, const char** name)
    "pl_scale_rule_info": (c_int, [c_int, POINTER(c_char_p)]),
    # int pl_blockscale_quantize_cpu(const float* x, int64_t n, int format, int block, int rule, float tensor_amax,
    #                                uint8_t* codes, uint8_t* scales, float* tensor_scale)
    "pl_blockscale_quantize_cpu": (c_int, [c_void_p, c_int64, c_int, c_int, c_int, c_float, c_void_p, c_void_p,
                                           c_void_p]),
    # int pl_blockscale_dequantize_cpu(const uint8_t* codes, const uint8_t* scales, float tensor_scale, int64_t n,
    #                                  int format, int block, float* y)
    "pl_blockscale_dequantize_cpu": (c_int, [c_void_p, c_void_p, c_float, c_int64, c_int, c_int, c_void_p]),
    # int pl_blockscale_quantize_cuda(const float* x_dev, int64_t n, int format, int block, int rule,
    #                                 float tensor_amax, uint8_t* codes_dev, uint8_t* scales_dev,
    #                                 float* tensor_scale, int variant)
    "pl_blockscale_quantize_cuda": (c_int, [c_void_p, c_int64, c_int, c_int, c_int, c_float, c_void_p, c_void_p,
                                            c_void_p, c_int]),
    # int pl_blockscale_dequantize_cuda(const uint8_t* codes_dev, const uint8_t* scales_dev, float tensor_scale,
    #                                   int64_t n, int format, int block, float* y_dev, int variant)
    "pl_blockscale_dequantize_cuda": (c_int, [c_void_p, c_void_p, c_float, c_int64, c_int, c_int, c_void_p, c_int]),
}


class LibraryNotFound(RunError):
    pass


class LibraryLoadError(RunError):
    pass


class NativeError(RunError):
    """A non-OK status from the library: the function, the status and the C message."""

    def __init__(self, func: str, status: int, message: str):
        self.func, self.status, self.message = func, status, message
        super().__init__(message or f"{func}: status {status}")


def candidate_paths() -> list[Path]:
    """$PRECISIONLAB_LIB, then the package's lib/, then the repository's build/."""
    here = Path(__file__).resolve().parent
    env = os.environ.get("PRECISIONLAB_LIB")
    paths = [Path(env)] if env else []
    return paths + [here / "lib" / LIB_NAME, here.parent / "build" / LIB_NAME]


@lru_cache(maxsize=1)
def _load() -> ctypes.CDLL:
    env = os.environ.get("PRECISIONLAB_LIB")
    if env and not Path(env).is_file():
        raise LibraryNotFound(f"PRECISIONLAB_LIB={env} does not exist")
    path = next((p for p in candidate_paths() if p.is_file()), None)
    if path is None:
        raise LibraryNotFound(f"{LIB_NAME} not built: run `make lib`")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise LibraryLoadError(f"{path} was found but failed to load: {e}") from None
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise LibraryLoadError(f"{path} lacks {name}: rebuild with `make lib`") from None
        fn.restype, fn.argtypes = restype, argtypes
    abi = lib.pl_abi_version()
    if abi != ABI_VERSION:
        raise LibraryLoadError(f"{path} has ABI {abi}, this package needs {ABI_VERSION}: rebuild with `make lib`")
    lib._pl_path = str(path)
    return lib


def library_path() -> str:
    return _load()._pl_path


def _call(name: str, *args) -> None:
    lib = _load()
    status = getattr(lib, name)(*args)
    if status != OK:
        raise _error(name, status)


def _error(name: str, status: int) -> Exception:
    lib = _load()
    message = (lib.pl_last_error() or b"").decode(errors="replace") or lib.pl_error_string(status).decode()
    if status in (NO_DEVICE, NO_CUDA):
        return NoDeviceError(message)
    if status in (INVALID_ARGUMENT, NULL_POINTER, SIZE_OVERFLOW, UNSUPPORTED):
        return UsageError(message)
    return NativeError(name, status, message)


def _dptr(a: np.ndarray):
    return a.ctypes.data_as(_d)


def _as_f64(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64)


# ---------------------------------------------------------------------------
# the catalog: the library's own table of its variants and formats


class _VariantDesc(ctypes.Structure):  # pl_variant_desc
    _fields_ = [("op", c_char_p), ("name", c_char_p), ("id", ctypes.c_int32), ("kind", ctypes.c_int32),
                ("devices", ctypes.c_int32), ("order", ctypes.c_int32), ("batch_invariant", ctypes.c_int32),
                ("deterministic", ctypes.c_int32), ("is_default", ctypes.c_int32), ("summary", c_char_p)]


class _FormatDesc(ctypes.Structure):  # pl_format_desc
    _fields_ = [("name", c_char_p), ("bits", ctypes.c_int32), ("precision", ctypes.c_int32),
                ("emin", ctypes.c_int32), ("emax", ctypes.c_int32), ("max", c_double), ("min_subnormal", c_double),
                ("has_inf", ctypes.c_int32), ("has_nan", ctypes.c_int32), ("bytes", ctypes.c_int32)]


KINDS = ("algorithm", "kernel", "bug")                                       # pl_variant_kind
INPUT_ORDERS = ("as_given", "reversed", "ascending_abs", "descending_abs")   # pl_input_order
_DEVICE_BITS = (("cpu", 1), ("cuda", 2))                                     # pl_device_bits


@dataclass(frozen=True)
class Variant:
    """One row of the library's catalog (pl_variant_desc)."""
    op: str
    name: str
    id: int
    kind: str  # algorithm | kernel | bug
    devices: tuple[str, ...]  # of "cpu", "cuda"
    order: str  # how the caller arranges the input (the sum's reordered variants)
    batch_invariant: bool | None  # None: the op has no batch
    deterministic: bool
    default: bool
    summary: str

    def to_json(self) -> dict:
        return {"op": self.op, "name": self.name, "id": self.id, "kind": self.kind, "devices": list(self.devices),
                "order": self.order, "batch_invariant": self.batch_invariant, "deterministic": self.deterministic,
                "default": self.default, "summary": self.summary}


@lru_cache(maxsize=1)
def catalog() -> tuple[Variant, ...]:
    """Every variant the library implements, in its order (ops by name, rows as declared)."""
    count = c_int()
    _call("pl_variant_count", ctypes.byref(count))
    out = []
    for i in range(count.value):
        d = _VariantDesc()
        _call("pl_variant_info", i, ctypes.byref(d))
        out.append(Variant(d.op.decode(), d.name.decode(), d.id, KINDS[d.kind],
                           tuple(n for n, bit in _DEVICE_BITS if d.devices & bit), INPUT_ORDERS[d.order],
                           None if d.batch_invariant < 0 else bool(d.batch_invariant), bool(d.deterministic),
                           bool(d.is_default), d.summary.decode()))
    return tuple(out)


def variants(op: str, device: str | None = None, kind: str | None = None) -> list[Variant]:
    """The op's variants, optionally only those on a device ("cpu", "cuda") or of a kind."""
    return [v for v in catalog() if v.op == op and (device is None or device in v.devices)
            and (kind is None or v.kind == kind)]


def variant(op: str, name: str) -> Variant:
    """The op's variant by name (case-insensitive); UsageError naming the choices."""
    key = name.strip().lower()
    for v in variants(op):
        if v.name == key:
            return v
    raise UsageError(f"unknown {op} variant {name!r}; choose from {', '.join(v.name for v in variants(op))}")


def _variant_id(op: str, name: str) -> int:
    """The id the op's entry points take; they check the device themselves (pl_check_variant)."""
    return variant(op, name).id


@dataclass(frozen=True)
class FormatDesc:
    """One arithmetic format as the library declares it (pl_format_desc)."""
    code: int
    name: str
    bits: int
    precision: int
    emin: int
    emax: int
    max: float
    min_subnormal: float
    has_inf: bool
    has_nan: bool
    bytes: int


@lru_cache(maxsize=1)
def format_table() -> tuple[FormatDesc, ...]:
    """The library's arithmetic formats (pl_format codes), in code order."""
    def one(i):
        d = _FormatDesc()
        _call("pl_format_info", i, ctypes.byref(d))
        return FormatDesc(i, d.name.decode(), d.bits, d.precision, d.emin, d.emax, d.max, d.min_subnormal,
                          bool(d.has_inf), bool(d.has_nan), d.bytes)
    return tuple(_table(one))


# ---------------------------------------------------------------------------
# public API


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
        # the reason users read ("no usable CUDA driver or device (...)"), without the C function's name
        reason = lib.pl_last_error().decode(errors="replace")
        return GpuStatus(0, reason.removeprefix("pl_cuda_device_count: "))
    raise _error("pl_cuda_device_count", status)


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
    out = dict(zip(SOFTMAX_PLAN_FIELDS, plan))
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
# --- block-scaled formats (cuda/blockscale.cu) -------------------------------
# The library declares the minifloats, block formats and scale rules once;
# these records are read from its tables, never restated here.


class _MinifloatDesc(ctypes.Structure):  # struct pl_minifloat_desc
    _fields_ = [("name", c_char_p), ("bits", c_int), ("ebits", c_int), ("mbits", c_int), ("bias", c_int),
                ("emin", c_int), ("emax", c_int), ("max", c_double), ("min_subnormal", c_double),
                ("has_inf", c_int), ("has_nan", c_int)]


class _BlockFormatDesc(ctypes.Structure):  # struct pl_block_format_desc
    _fields_ = [("name", c_char_p), ("element", c_int), ("block", c_int), ("scale", c_int),
                ("tensor_scale_bits", c_int)]


@dataclass(frozen=True)
class Minifloat:
    id: int
    name: str
    bits: int
    ebits: int
    mbits: int
    bias: int
    emin: int
    emax: int
    max: float
    min_subnormal: float
    has_inf: bool
    has_nan: bool


@dataclass(frozen=True)
class BlockFormat:
    id: int
    name: str
    element: Minifloat
    block: int
    scale: Minifloat
    tensor_scale_bits: int

    @property
    def bits_per_element(self) -> float:
        """Storage cost with the format's own block size: element bits plus the shared scale's share."""
        return self.element.bits + self.scale.bits / self.block


def _table(count_fn) -> list:
    out, i = [], 0
    while True:
        try:
            item = count_fn(i)
        except UsageError:  # the first unknown id ends the table
            return out
        out.append(item)
        i += 1


@lru_cache(maxsize=1)
def minifloats() -> dict[str, Minifloat]:
    def one(i):
        d = _MinifloatDesc()
        _call("pl_minifloat_info", i, ctypes.byref(d))
        return Minifloat(i, d.name.decode(), d.bits, d.ebits, d.mbits, d.bias, d.emin, d.emax, d.max,
                         d.min_subnormal, bool(d.has_inf), bool(d.has_nan))
    return {m.name: m for m in _table(one)}


@lru_cache(maxsize=1)
def block_formats() -> dict[str, BlockFormat]:
    by_id = {m.id: m for m in minifloats().values()}

    def one(i):
        d = _BlockFormatDesc()
        _call("pl_block_format_info", i, ctypes.byref(d))
        return BlockFormat(i, d.name.decode(), by_id[d.element], d.block, by_id[d.scale], d.tensor_scale_bits)
    return {f.name: f for f in _table(one)}


@lru_cache(maxsize=1)
def scale_rules() -> dict[str, int]:
    def one(i):
        name = c_char_p()
        _call("pl_scale_rule_info", i, ctypes.byref(name))
        return name.value.decode(), i
    return dict(_table(one))


@dataclass(frozen=True)
class BlockScaled:
    """A tensor in a block-scaled format: one code per byte, one scale code per block."""
    format: BlockFormat
    block: int
    rule: str
    codes: np.ndarray  # uint8, n
    scales: np.ndarray  # uint8, ceil(n / block)
    tensor_scale: float  # NVFP4's fp32 decode scale; 1.0 otherwise


def _block_args(fmt: str, block: int | None, rule: str) -> tuple[BlockFormat, int, int]:
    f = block_formats()[fmt]
    return f, f.block if block is None else int(block), scale_rules()[rule]


def blockscale_quantize_cpu(x, fmt: str, rule: str, block: int | None = None,
                            tensor_amax: float | None = None) -> BlockScaled:
    """Quantize fp32 values (x is cast to float32 first). NVFP4's tensor_amax defaults to max |x|."""
    x = np.ascontiguousarray(x, dtype=np.float32).ravel()
    f, block, rule_id = _block_args(fmt, block, rule)
    if tensor_amax is None:
        tensor_amax = float(np.max(np.abs(x))) if x.size else 0.0
    codes = np.empty(x.size, np.uint8)
    scales = np.empty(max(-(-x.size // max(block, 1)), 1), np.uint8)
    ts = c_float(1.0)
    _call("pl_blockscale_quantize_cpu", x.ctypes.data, x.size, f.id, block, rule_id, tensor_amax, codes.ctypes.data,
          scales.ctypes.data, ctypes.byref(ts))
    return BlockScaled(f, block, rule, codes, scales, float(ts.value))


def blockscale_dequantize_cpu(q: BlockScaled) -> np.ndarray:
    y = np.empty(q.codes.size, np.float32)
    codes, scales = np.ascontiguousarray(q.codes, np.uint8), np.ascontiguousarray(q.scales, np.uint8)
    if q.block >= 1 and scales.size < -(-codes.size // q.block):  # the C side reads one scale per block
        raise UsageError(f"{codes.size} codes in blocks of {q.block} need {-(-codes.size // q.block)} scales, "
                         f"got {scales.size}")
    _call("pl_blockscale_dequantize_cpu", codes.ctypes.data, scales.ctypes.data, q.tensor_scale, codes.size,
          q.format.id, q.block, y.ctypes.data)
    return y


def blockscale_quantize_cuda(x_ptr: int, n: int, fmt: str, rule: str, codes_ptr: int, scales_ptr: int,
                             block: int | None = None, tensor_amax: float = 0.0,
                             variant: str = "warp_per_block") -> float:
    """Launch the GPU quantize on device pointers (asynchronous); returns NVFP4's decode scale (1.0 otherwise)."""
    f, block, rule_id = _block_args(fmt, block, rule)
    ts = c_float(1.0)
    _call("pl_blockscale_quantize_cuda", x_ptr, n, f.id, block, rule_id, tensor_amax, codes_ptr, scales_ptr,
          ctypes.byref(ts), _variant_id("blockscale_quantize", variant))
    return float(ts.value)


def blockscale_dequantize_cuda(codes_ptr: int, scales_ptr: int, tensor_scale: float, n: int, fmt: str, y_ptr: int,
                               block: int | None = None, variant: str = "thread_per_element") -> None:
    f, block, _ = _block_args(fmt, block, "floor")
    _call("pl_blockscale_dequantize_cuda", codes_ptr, scales_ptr, tensor_scale, n, f.id, block, y_ptr,
          _variant_id("blockscale_dequantize", variant))
