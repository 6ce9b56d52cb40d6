"""The dtype registry: names, aliases, bits, unit roundoff, spacing, max.

Numbers come from numpy/ml_dtypes' finfo, not from hand-typed tables, and
numpy-side rounding goes through ml_dtypes. `code` is the pl_format enum of
cuda/precisionlab.h; None for a storage-only format (fp4, fp6): values are
rounded to it here, and the library's arithmetic kernels never see it (the
block-scaled kernels of cuda/blockscale.cu declare their own element table,
which tests/test_blockscale.py checks against these dtypes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from precisionlab.errors import UsageError


@dataclass(frozen=True)
class Format:
    name: str
    code: int | None
    dtype: np.dtype
    aliases: tuple[str, ...] = field(default=())

    @property
    def finfo(self):
        return ml_dtypes.finfo(self.dtype)

    @property
    def bits(self) -> int:
        """Bits per value (fp4 is 4, whatever byte it sits in)."""
        return int(self.finfo.bits)

    @property
    def storage_only(self) -> bool:
        """A format values are stored in but no kernel computes in (fp4, fp6)."""
        return self.code is None

    @property
    def precision(self) -> int:
        """Significand bits, the implicit one included (p)."""
        return int(self.finfo.nmant) + 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return int(self.finfo.minexp)

    @property
    def max(self) -> float:
        return float(self.finfo.max)

    @property
    def smallest_normal(self) -> float:
        return float(self.finfo.smallest_normal)

    @property
    def unit_roundoff(self) -> float:
        """u = 2^-p: the largest relative error of one round-to-nearest."""
        return 2.0 ** -self.precision

    @property
    def eps(self) -> float:
        """Machine epsilon 2^(1-p): the gap between 1 and the next value."""
        return 2.0 ** (1 - self.precision)

    def spacing(self, x) -> np.ndarray:
        """Gap between adjacent values of this format in the binade of |x| (its ulp)."""
        x = np.abs(np.asarray(x, dtype=np.float64))
        _, e = np.frexp(x)  # x = m * 2^e, 0.5 <= m < 1, so floor(log2 x) = e - 1
        e = np.where(x == 0, self.emin, np.maximum(e - 1, self.emin))
        return np.ldexp(1.0, e - self.precision + 1)

    def round(self, x) -> np.ndarray:
        """Round float64 values to this format (nearest, ties to even), back as float64."""
        x = np.asarray(x, dtype=np.float64)
        if self.code == FP64_CODE:
            return x.copy()
        if self.storage_only:
            return _round_saturating(x, self.dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            if self.code == FP32_CODE:
                return x.astype(np.float32).astype(np.float64)
            # ml_dtypes casts float64 to bf16/fp16/fp8 through float32, rounding
            # twice: 1 + 2^-8 + 2^-30 becomes 1.0 in bf16, where the correct
            # answer is 1.0078125. Rounding to float32 *to odd* first keeps the
            # sticky bit, and the second rounding is then exact (24 >= p + 2).
            return _round_to_odd_fp32(x).astype(self.dtype).astype(np.float64)

    def __str__(self) -> str:
        return self.name


FP64_CODE, FP32_CODE = 0, 1


def _round_to_odd_fp32(x: np.ndarray) -> np.ndarray:
    f = x.astype(np.float32)
    back = f.astype(np.float64)
    fix = (back != x) & np.isfinite(back) & ((f.view(np.uint32) & 1) == 0)
    if fix.any():
        toward = np.where(x[fix] > back[fix], np.inf, -np.inf).astype(np.float32)
        f[fix] = np.nextafter(f[fix], toward)
    return f


def _round_saturating(x: np.ndarray, dtype) -> np.ndarray:
    """Round to a format with neither inf nor NaN (fp4 e2m1, fp6 e2m3/e3m2):
    nearest even, finite overflow saturating to +-max (OCP MX v1.0's
    conversion, and ml_dtypes' cast); NaN and +-inf, which it cannot hold,
    come back NaN (ml_dtypes would give -0 for NaN and +-max for inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = _round_to_odd_fp32(x).astype(dtype).astype(np.float64)
    y[~np.isfinite(x)] = np.nan
    return y


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("fp64", 0, np.dtype(np.float64), ("float64", "f64", "double")),
        Format("fp32", 1, np.dtype(np.float32), ("float32", "f32", "float", "single")),
        Format("fp16", 2, np.dtype(np.float16), ("float16", "f16", "half")),
        Format("bf16", 3, np.dtype(ml_dtypes.bfloat16), ("bfloat16",)),
        Format("fp8_e4m3", 4, np.dtype(ml_dtypes.float8_e4m3fn),
               ("e4m3", "float8_e4m3fn", "fp8e4m3", "float8_e4m3")),  # e4m3fn: no inf, overflow is NaN
        Format("fp8_e5m2", 5, np.dtype(ml_dtypes.float8_e5m2), ("e5m2", "float8_e5m2", "fp8e5m2")),
        # storage-only element formats of the OCP MX block formats: no inf, no NaN
        Format("fp4_e2m1", None, np.dtype(ml_dtypes.float4_e2m1fn), ("fp4", "e2m1", "float4_e2m1fn")),
        Format("fp6_e2m3", None, np.dtype(ml_dtypes.float6_e2m3fn), ("e2m3", "float6_e2m3fn")),
        Format("fp6_e3m2", None, np.dtype(ml_dtypes.float6_e3m2fn), ("e3m2", "float6_e3m2fn")),
    )
}

_LOOKUP = {alias: f for f in FORMATS.values() for alias in (f.name, *f.aliases)}


def get(name: str) -> Format:
    """A format by name or alias, case-insensitive; UsageError when unknown."""
    key = name.strip().lower().replace("-", "_")
    if key not in _LOOKUP:
        raise UsageError(f"unknown dtype {name!r}; choose from {', '.join(FORMATS)}")
    return _LOOKUP[key]


def parse_list(text: str) -> list[Format]:
    """'bf16,fp32' -> formats, in order, without repeats."""
    out: list[Format] = []
    for part in text.split(","):
        if part.strip():
            f = get(part)
            if f not in out:
                out.append(f)
    if not out:
        raise UsageError("empty dtype list")
    return out
