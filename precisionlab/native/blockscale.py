"""Block-scaled formats (cuda/blockscale.cu): the library declares the minifloats,
block formats and scale rules once; these records are read from its tables,
never restated here."""

from __future__ import annotations

import ctypes
from ctypes import c_char_p, c_double, c_float, c_int
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from precisionlab.errors import UsageError
from precisionlab.native.catalog import ValueRange, _from_desc, _variant_id
from precisionlab.native.loader import _call, _table



class _MinifloatDesc(ctypes.Structure):  # struct pl_minifloat_desc
    _fields_ = [("name", c_char_p), ("bits", c_int), ("ebits", c_int), ("mbits", c_int), ("bias", c_int),
                ("emin", c_int), ("emax", c_int), ("max", c_double), ("min_subnormal", c_double),
                ("has_inf", c_int), ("has_nan", c_int)]


class _BlockFormatDesc(ctypes.Structure):  # struct pl_block_format_desc
    _fields_ = [("name", c_char_p), ("element", c_int), ("block", c_int), ("scale", c_int),
                ("tensor_scale_bits", c_int)]


@dataclass(frozen=True)
class Minifloat(ValueRange):
    id: int
    name: str
    bits: int
    ebits: int
    mbits: int
    bias: int


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



@lru_cache(maxsize=1)
def minifloats() -> dict[str, Minifloat]:
    def one(i):
        d = _MinifloatDesc()
        _call("pl_minifloat_info", i, ctypes.byref(d))
        return _from_desc(Minifloat, d, id=i)
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
