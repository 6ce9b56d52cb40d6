"""The dtype registry: names, aliases, bits, unit roundoff, spacing, max.

The facts are the library's: each format is declared once, in its table
(pl_format_info for the arithmetic formats, pl_minifloat_info for the
storage-only element formats fp4 and fp6 of the block-scaled formats), and
Format records are built from it, joined in TWINS below to their numpy /
ml_dtypes and torch dtypes and their aliases. tests/test_catalog.py holds the
library's numbers equal to ml_dtypes' finfo. `code` is the pl_format code the
arithmetic kernels take; None for a storage-only format: values are rounded
to it here (through ml_dtypes), and the arithmetic kernels never see it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import ml_dtypes
import numpy as np

from precisionlab.errors import UsageError


@dataclass(frozen=True)
class Format:
    name: str
    code: int | None
    dtype: np.dtype
    aliases: tuple[str, ...] = field(default=())
    bits: int = 0        # bits a value (fp4: 4, whatever byte it sits in)
    precision: int = 0   # significand bits, the implicit one included (p)
    emin: int = 0        # exponent of the smallest normal
    emax: int = 0        # exponent of the largest normal
    max: float = 0.0     # largest finite value
    has_inf: bool = True
    has_nan: bool = True
    torch_name: str | None = None  # the torch dtype's attribute name, where torch has one

    @property
    def finfo(self):
        """ml_dtypes' / numpy's finfo of the numpy twin."""
        return ml_dtypes.finfo(self.dtype)

    @property
    def storage_only(self) -> bool:
        """A format values are stored in but no kernel computes in (fp4, fp6)."""
        return self.code is None

    @property
    def torch_dtype(self):
        """The torch dtype (imports torch: call it only on torch paths)."""
        if self.torch_name is None:
            raise UsageError(f"torch has no {self.name} dtype")
        import torch
        return getattr(torch, self.torch_name)

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** self.emin

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
        if self.dtype == np.float64:
            return x.copy()
        if self.storage_only:
            return _round_saturating(x, self.dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            if self.dtype == np.float32:
                return x.astype(np.float32).astype(np.float64)
            # ml_dtypes casts float64 to bf16/fp16/fp8 through float32, rounding
            # twice: 1 + 2^-8 + 2^-30 becomes 1.0 in bf16, where the correct
            # answer is 1.0078125. Rounding to float32 *to odd* first keeps the
            # sticky bit, and the second rounding is then exact (24 >= p + 2).
            return _round_to_odd_fp32(x).astype(self.dtype).astype(np.float64)

    def __str__(self) -> str:
        return self.name



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


# The numpy / torch twins and aliases of the library's formats, by the
# library's name: the one map from a format to its dtypes. A library format
# without a numpy twin (tf32, a compute mode of the tensor cores) is not a
# format values can be held in here.
TWINS: dict[str, tuple[np.dtype, str | None, tuple[str, ...]]] = {
    "fp64": (np.dtype(np.float64), "float64", ("float64", "f64", "double")),
    "fp32": (np.dtype(np.float32), "float32", ("float32", "f32", "float", "single")),
    "fp16": (np.dtype(np.float16), "float16", ("float16", "f16", "half")),
    "bf16": (np.dtype(ml_dtypes.bfloat16), "bfloat16", ("bfloat16",)),
    # e4m3fn: no inf, overflow is NaN
    "fp8_e4m3": (np.dtype(ml_dtypes.float8_e4m3fn), "float8_e4m3fn",
                 ("e4m3", "float8_e4m3fn", "fp8e4m3", "float8_e4m3")),
    "fp8_e5m2": (np.dtype(ml_dtypes.float8_e5m2), "float8_e5m2", ("e5m2", "float8_e5m2", "fp8e5m2")),
    # storage-only element formats of the OCP MX block formats: no inf, no NaN
    "fp4_e2m1": (np.dtype(ml_dtypes.float4_e2m1fn), None, ("fp4", "e2m1", "float4_e2m1fn")),
    "fp6_e2m3": (np.dtype(ml_dtypes.float6_e2m3fn), None, ("e2m3", "float6_e2m3fn")),
    "fp6_e3m2": (np.dtype(ml_dtypes.float6_e3m2fn), None, ("e3m2", "float6_e3m2fn")),
}


@lru_cache(maxsize=1)
def _formats() -> dict[str, Format]:
    from precisionlab import native  # the library's tables

    out: dict[str, Format] = {}
    for d in native.format_table():
        if d.name in TWINS:
            dt, tn, al = TWINS[d.name]
            out[d.name] = Format(d.name, d.code, dt, al, d.bits, d.precision, d.emin, d.emax, d.max, d.has_inf, d.has_nan,
                                 tn)
    for m in native.minifloats().values():
        if m.name in TWINS and m.name not in out:
            dt, tn, al = TWINS[m.name]
            out[m.name] = Format(m.name, None, dt, al, m.bits, m.mbits + 1, m.emin, m.emax, m.max, m.has_inf,
                                 m.has_nan, tn)
    return {name: out[name] for name in TWINS if name in out}


def _key(name: str) -> str:
    """The case rule every name and alias is looked up by: case-insensitive,
    surrounding blanks ignored, '-' the same as '_' ('Float8-E4M3FN')."""
    return name.strip().lower().replace("-", "_")


# Every name and alias to its canonical name. From TWINS alone, so that the
# options' help and parsing need neither the library nor torch.
CANONICAL: dict[str, str] = {alias: name for name, (_, _, aliases) in TWINS.items() for alias in (name, *aliases)}


class Subset(tuple):
    """Canonical format names, in the order help texts and defaults list them,
    with what they are (a noun phrase: the refusal says "X is not <what>")."""

    what: str

    def __new__(cls, names, what: str):
        unknown = [n for n in names if n not in TWINS]
        if unknown:
            raise ValueError(f"not catalog formats: {unknown}")
        out = super().__new__(cls, names)
        out.what = what
        return out


# The named subsets, each declared once; every option that takes a format
# parses against one of them (parse_list, parse_one), and the help lists it.
# tests/test_catalog.py checks them against the library's table (which
# formats are storage only, which have a pl_format code) and torch's dtypes.
ALL = Subset(tuple(TWINS), "a catalog format")
# The accumulator models' inputs (numerics/accumulators.py): values a float32
# holds exactly, so every product of two is exact in float64; fp64 inputs would
# be rounded to fp32 before the model saw them.
MODEL_INPUTS = Subset(tuple(n for n in TWINS if n != "fp64"), "an input format of the accumulator models "
                      "(fp32 or narrower)")
# torch and this project's op kernels compute in these (numerics.torch_ops).
COMPUTE = Subset(("fp32", "bf16", "fp16"), "a format torch computes in")
# The low precisions a model or an op runs in against its fp32 run.
LOW_COMPUTE = Subset(("bf16", "fp16"), "a low precision torch computes in")
FP8 = Subset(("fp8_e4m3", "fp8_e5m2"), "an fp8 format")
# The element formats of the block-scaled formats: no pl_format code, no torch
# dtype, no kernel computes in them (Format.storage_only); widest first.
STORAGE_ONLY = Subset(("fp6_e2m3", "fp6_e3m2", "fp4_e2m1"), "a storage-only format")
# Formats values are only stored in here: rounded to them (Format.round) and
# computed from in fp32; what compare op's storage rows measure.
STORAGE = Subset(FP8 + STORAGE_ONLY, "a storage format")
# The formats the sum kernels accumulate in: every one with a pl_format code.
ACCUMULATORS = Subset(("fp64", "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"), "an accumulator format")
DEFAULT_ACCUMULATORS = Subset(("bf16", "fp16", "fp32", "fp64"), "a default accumulator")
GPU_ACCUMULATORS = Subset(("bf16", "fp32", "fp64"), "an accumulator the GPU sums take")
# Stochastic rounding is a bf16/fp16 technique: the others only when asked for.
STOCHASTIC_ACCUMULATORS = Subset(LOW_COMPUTE, "a stochastic-rounding accumulator")
# What compare op --dtype tests: computed in a low precision, or stored in one.
OP_LOW = Subset(LOW_COMPUTE + STORAGE, "a low precision or a storage format")
# The arithmetic an emulator runs in (the FlashAttention emulator: fp32 as the
# kernel does, fp64 as the exact model).
# The FlashAttention emulator's formats: what P is stored in before P.V (fp64:
# not stored), what Q, K, V are held in, what the output is written in.
ATTENTION_P = Subset(("fp64", *COMPUTE, *FP8), "a format P can be stored in")
ATTENTION_INPUTS = Subset(COMPUTE + FP8, "a format Q, K and V can be held in")
# What an ONNX export computes in.
ONNX_EXPORT = Subset(("fp32", "fp16"), "an ONNX export precision")
IEEE_ARITHMETIC = Subset(("fp32", "fp64"), "an IEEE arithmetic")
# What bench times the GPU sums' accumulators in, and what the tensor-parallel
# replay of nondeterminism runs in.
TIMED_ACCUMULATORS = Subset(("fp32", "bf16"), "an accumulator bench times")
TP_DTYPES = Subset(("fp32", "bf16"), "a format the tensor-parallel ranks compute in")
# attention-cases' default --dtypes: a kernel's reference format and the one most kernels ship in.
PAIR_DTYPES = Subset(("fp64", *COMPUTE), "a precision compare pair judges two runs in")
ATTENTION_CASES_DEFAULT = Subset(("fp32", "bf16"), "a format attention-cases runs by default")
# router's default --gate-dtypes and --logit-dtypes: fp32, and bf16, the format
# of the router GEMM in the routing bugs docs/router.md starts from.
ROUTER_DEFAULT = Subset(("fp32", "bf16"), "a format router runs by default")
# What a tensor dump's values can be declared to have been before dumping: any
# format (fp6/fp4 values come dumped in a wider dtype); it decides the tolerances.
DUMPED = ALL


def find(name: str) -> str | None:
    """The canonical name of a format name or alias (case rule: _key); None when unknown."""
    return CANONICAL.get(_key(name))


def parse_list(text: str | None, subset: Subset, option: str, default: Subset | None = None) -> list[str]:
    """An option's comma list of formats -> canonical names, in order, without
    repeats (an alias is its format: 'bf16,bfloat16' is one). None (not
    given) -> `default`, else the whole subset. An empty list, an unknown name
    or a format outside `subset` is a UsageError naming `option` and the subset."""
    if text is None:
        return list(subset if default is None else default)
    out: list[str] = []
    for part in text.split(","):
        if part.strip():
            name = _in_subset(part, subset, option)
            if name not in out:
                out.append(name)
    if not out:
        raise UsageError(f"{option}: empty list {text!r}; choose from {', '.join(subset)}")
    return out


def parse_one(text: str, subset: Subset, option: str) -> str:
    """An option's one format -> its canonical name (the rules of parse_list)."""
    if not text.strip():
        raise UsageError(f"{option}: empty format name; choose from {', '.join(subset)}")
    return _in_subset(text, subset, option)


def _in_subset(text: str, subset: Subset, option: str) -> str:
    name = find(text)
    if name is None:
        raise UsageError(f"{option}: unknown format {text.strip()!r}; choose from {', '.join(subset)}")
    if name not in subset:
        raise UsageError(f"{option}: {name} is not {subset.what}; choose from {', '.join(subset)}")
    return name


def __getattr__(name: str):
    # FORMATS is built from the library on first use, so importing this module
    # (and --help) never needs the library.
    if name == "FORMATS":
        return _formats()
    raise AttributeError(name)


def from_numpy(dtype) -> Format | None:
    """The format whose numpy twin is dtype, or None."""
    dtype = np.dtype(dtype)
    return next((f for f in _formats().values() if f.dtype == dtype), None)


def torch_to_numpy(t):
    """A CPU torch tensor as numpy in its own format: the bits, viewed as the
    numpy twin (ml_dtypes for bf16 and fp8, which numpy lacks), never a cast."""
    import torch

    t = t.detach().contiguous()
    fmt = from_torch(t.dtype)
    if fmt is None or fmt.dtype.kind == "f" and fmt.dtype.type in (np.float16, np.float32, np.float64):
        return t.numpy()
    same_width = {1: torch.uint8, 2: torch.int16}[t.element_size()]
    return t.view(same_width).numpy().view(fmt.dtype)


def numpy_to_torch(a: np.ndarray):
    """The inverse of torch_to_numpy: numpy (ml_dtypes included) to a torch tensor, bits kept."""
    import torch

    a = np.ascontiguousarray(a)
    fmt = from_numpy(a.dtype)
    if fmt is None or fmt.torch_name is None or a.dtype.type in (np.float16, np.float32, np.float64):
        return torch.from_numpy(a)
    same_width = {1: np.uint8, 2: np.int16}[a.dtype.itemsize]
    return torch.from_numpy(a.view(same_width)).view(fmt.torch_dtype)


def from_torch(dtype) -> Format | None:
    """The format whose torch twin is dtype (a torch.dtype), or None."""
    name = str(dtype).removeprefix("torch.")
    return next((f for f in _formats().values() if f.torch_name == name), None)


def get(name: str) -> Format:
    """A format by name or alias (case rule: _key); UsageError when unknown.
    An option's text goes through parse_one or parse_list instead, which also
    name the option and its subset."""
    canonical = find(name)
    if canonical is None or canonical not in _formats():
        raise UsageError(f"unknown dtype {name!r}; choose from {', '.join(_formats())}")
    return _formats()[canonical]
