"""Matmul under an accumulator model (cuda/matmul_accumulator.cu): the struct
mirror, the library's names of the kinds and roundings, and the two entry
points. numerics/accumulators.py parses the models' spellings and runs them
through here with backend="native"."""

from __future__ import annotations

import ctypes
from ctypes import c_char_p, c_int32, c_int64
from functools import lru_cache

import numpy as np

from precisionlab.native.catalog import INPUT_ORDERS, _variant_id
from precisionlab.native.loader import _call, _table

ORDERS = {"forward": INPUT_ORDERS.index("as_given"), "reverse": INPUT_ORDERS.index("reversed")}


class _Accumulator(ctypes.Structure):  # pl_accumulator
    _fields_ = [("kind", c_int32), ("bits", c_int32), ("group", c_int32), ("rounding", c_int32),
                ("interval", c_int64), ("order", c_int32), ("align", c_int32), ("out_bits", c_int32)]


def _names(fn: str) -> dict[str, int]:
    def one(i):
        name = c_char_p()
        _call(fn, i, ctypes.byref(name))
        return name.value.decode(), i
    return dict(_table(one))


@lru_cache(maxsize=1)
def accumulator_kinds() -> dict[str, int]:
    """pl_accumulator_kind by name ("exact", "fp32", "fp32-pairwise", "hopper-fp8", "promote")."""
    return _names("pl_accumulator_kind_info")


@lru_cache(maxsize=1)
def accumulator_roundings() -> dict[str, int]:
    return _names("pl_accumulator_rounding_info")


@lru_cache(maxsize=1)
def accumulator_aligns() -> dict[str, int]:
    return _names("pl_accumulator_align_info")


def accumulator(kind: str, bits: int = 14, group: int = 32, rounding: str = "trunc", interval: int = 0,
                order: str = "forward", align: str = "product", out_bits: int | None = None) -> _Accumulator:
    """The C struct of a model (out_bits None: min(bits, 24), the model's default); the library checks its
    fields (a KeyError here: a name it lacks)."""
    out = min(bits, 24) if out_bits is None else out_bits
    return _Accumulator(accumulator_kinds()[kind], bits, group, accumulator_roundings()[rounding], interval,
                        ORDERS[order], accumulator_aligns()[align], out)


def matmul_acc_cpu(a, b, format_code: int, acc: _Accumulator) -> np.ndarray:
    """C = A @ B (float32, m x n) under the model, A and B values of the format (cast to float32: exact for them)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"shapes {a.shape} @ {b.shape} do not multiply")
    c = np.empty((a.shape[0], b.shape[1]), np.float32)
    _call("pl_matmul_acc_cpu", a.ctypes.data, b.ctypes.data, a.shape[0], b.shape[1], a.shape[1], format_code,
          ctypes.byref(acc), c.ctypes.data)
    return c


def matmul_acc_cuda(a_ptr: int, b_ptr: int, m: int, n: int, k: int, format_code: int, acc: _Accumulator,
                    c_ptr: int, variant: str = "thread_per_output") -> None:
    """Launch on device pointers of float32 (asynchronous)."""
    _call("pl_matmul_acc_cuda", a_ptr, b_ptr, m, n, k, format_code, ctypes.byref(acc), c_ptr,
          _variant_id("matmul_acc", variant))
