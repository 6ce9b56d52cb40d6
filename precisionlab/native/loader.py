"""The loader: find libprecisionlab.so, declare its prototypes once (the table
below, each C prototype beside its binding; tests/test_native_header.py holds it
to cuda/precisionlab.h), and turn statuses into exceptions.

Layers, bottom up: `_load()` finds and opens the library; `_PROTOTYPES` is the
raw binding table (the C prototype sits beside each entry); `_call()` checks
every status; the functions at the bottom are the public API.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_int64, c_size_t, c_uint64, c_void_p
from functools import lru_cache
from pathlib import Path

import numpy as np

from precisionlab.errors import NoDeviceError, RunError, UsageError

LIB_NAME = "libprecisionlab.so"
ABI_VERSION = 5  # PL_ABI_VERSION in cuda/precisionlab.h

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
    # int pl_accumulator_kind_info(int id, const char** name)
    "pl_accumulator_kind_info": (c_int, [c_int, POINTER(c_char_p)]),
    # int pl_accumulator_rounding_info(int id, const char** name)
    "pl_accumulator_rounding_info": (c_int, [c_int, POINTER(c_char_p)]),
    # int pl_accumulator_align_info(int id, const char** name)
    "pl_accumulator_align_info": (c_int, [c_int, POINTER(c_char_p)]),
    # int pl_matmul_acc_cpu(const float* a, const float* b, int64_t m, int64_t n, int64_t k, int format,
    #                       const pl_accumulator* acc, float* c)
    "pl_matmul_acc_cpu": (c_int, [c_void_p, c_void_p, c_int64, c_int64, c_int64, c_int, c_void_p, c_void_p]),
    # int pl_matmul_acc_cuda(const float* a_dev, const float* b_dev, int64_t m, int64_t n, int64_t k, int format,
    #                        const pl_accumulator* acc, float* c_dev, int variant)
    "pl_matmul_acc_cuda": (c_int, [c_void_p, c_void_p, c_int64, c_int64, c_int64, c_int, c_void_p, c_void_p,
                                   c_int]),
    # int pl_flash_attention_cpu(const float* q, const float* k, const float* v, int64_t rows, int64_t keys,
    #                            int64_t d, int64_t dv, const pl_flash_config* cfg, float* out, float* lse)
    "pl_flash_attention_cpu": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_int64, c_int64, c_void_p,
                                       c_void_p, c_void_p]),
    # int pl_flash_attention_shared_bytes(int64_t d, int64_t dv, const pl_flash_config* cfg, size_t* bytes)
    "pl_flash_attention_shared_bytes": (c_int, [c_int64, c_int64, c_void_p, _sz]),
    # int pl_flash_attention_cuda(const float* q_dev, const float* k_dev, const float* v_dev, int64_t rows,
    #                             int64_t keys, int64_t d, int64_t dv, const pl_flash_config* cfg, float* out_dev,
    #                             float* lse_dev, int variant)
    "pl_flash_attention_cuda": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_int64, c_int64, c_void_p,
                                        c_void_p, c_void_p, c_int]),
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
    here = Path(__file__).resolve().parent.parent  # the package folder
    env = os.environ.get("PRECISIONLAB_LIB")
    paths = [Path(env)] if env else []
    return paths + [here / "lib" / LIB_NAME, here.parent / "build" / LIB_NAME]


@lru_cache(maxsize=1)
def _load() -> ctypes.CDLL:
    env = os.environ.get("PRECISIONLAB_LIB")
    if env and not Path(env).is_file():  # say what it is: a folder is the commonest slip
        what = ("is a directory; name the library file in it (.../" + LIB_NAME + ")" if Path(env).is_dir()
                else "is not a regular file" if Path(env).exists() else "does not exist")
        raise LibraryNotFound(f"PRECISIONLAB_LIB={env} {what}")
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


def _table(count_fn) -> list:
    out, i = [], 0
    while True:
        try:
            item = count_fn(i)
        except UsageError:  # the first unknown id ends the table
            return out
        out.append(item)
        i += 1
