"""FlashAttention's forward pass in the library (cuda/flash_attention.cu): the
pl_flash_config mirror and its entry points. numerics/flash_attention.py is the
definition these are held to, bit for bit (tests/test_flash_attention*.py)."""

from __future__ import annotations

import ctypes
from ctypes import c_double, c_float, c_int32, c_size_t

import numpy as np

from precisionlab.native.catalog import _variant_id
from precisionlab.native.loader import _call


class FlashConfig(ctypes.Structure):  # pl_flash_config
    _fields_ = [("block_r", c_int32), ("block_c", c_int32), ("p_format", c_int32), ("causal", c_int32),
                ("max_offset", c_float), ("rescale_threshold", c_float), ("p_scale", c_float),
                ("softmax_scale", c_double)]


def flash_config(block_r: int, block_c: int, p_format: int, causal: bool = False, max_offset: float = 0.0,
                 rescale_threshold: float = 0.0, p_scale: float = 1.0, softmax_scale: float | None = None) -> FlashConfig:
    """The C struct (the library checks its fields); softmax_scale None: 1 / sqrt(d)."""
    return FlashConfig(block_r, block_c, p_format, int(causal), max_offset, rescale_threshold, p_scale,
                       0.0 if softmax_scale is None else softmax_scale)


def _shapes(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k, v = (np.ascontiguousarray(a, dtype=np.float32) for a in (q, k, v))
    if q.ndim != 2 or k.ndim != 2 or v.ndim != 2 or q.shape[1] != k.shape[1] or k.shape[0] != v.shape[0]:
        raise ValueError(f"shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    return q, k, v


def flash_attention_cpu(q, k, v, cfg: FlashConfig) -> tuple[np.ndarray, np.ndarray]:
    """(out rows x dv, lse rows), float32, from fp32 q (rows x d), k (keys x d), v (keys x dv)."""
    q, k, v = _shapes(q, k, v)
    out = np.empty((q.shape[0], v.shape[1]), np.float32)
    lse = np.empty(q.shape[0], np.float32)
    _call("pl_flash_attention_cpu", q.ctypes.data, k.ctypes.data, v.ctypes.data, q.shape[0], k.shape[0], q.shape[1],
          v.shape[1], ctypes.byref(cfg), out.ctypes.data, lse.ctypes.data)
    return out, lse


def flash_attention_shared_bytes(d: int, dv: int, cfg: FlashConfig) -> int:
    out = c_size_t()
    _call("pl_flash_attention_shared_bytes", d, dv, ctypes.byref(cfg), ctypes.byref(out))
    return out.value


def flash_attention_cuda(q_ptr: int, k_ptr: int, v_ptr: int, rows: int, keys: int, d: int, dv: int,
                         cfg: FlashConfig, out_ptr: int, lse_ptr: int | None, variant: str = "tiled") -> None:
    """Launch on device pointers of float32 (asynchronous)."""
    _call("pl_flash_attention_cuda", q_ptr, k_ptr, v_ptr, rows, keys, d, dv, ctypes.byref(cfg), out_ptr, lse_ptr,
          _variant_id("flash_attention", variant))
