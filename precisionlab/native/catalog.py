"""The library's own table of what it implements: its variants and formats
(cuda/catalog.cu), read once."""

from __future__ import annotations

import ctypes
import dataclasses
from ctypes import POINTER, c_char_p, c_double, c_int
from dataclasses import dataclass
from functools import lru_cache


from precisionlab.errors import UsageError
from precisionlab.native.loader import _call, _table



class _SassRule(ctypes.Structure):  # pl_sass_rule
    _fields_ = [("kernel", c_char_p), ("checks", ctypes.c_int32), ("dtypes", ctypes.c_uint32), ("ceiling", c_double)]


class _VariantDesc(ctypes.Structure):  # pl_variant_desc
    _fields_ = [("op", c_char_p), ("name", c_char_p), ("id", ctypes.c_int32), ("kind", ctypes.c_int32),
                ("devices", ctypes.c_int32), ("order", ctypes.c_int32), ("batch_invariant", ctypes.c_int32),
                ("deterministic", ctypes.c_int32), ("is_default", ctypes.c_int32), ("summary", c_char_p),
                ("dtypes", ctypes.c_uint32), ("nsass", ctypes.c_int32), ("sass", POINTER(_SassRule))]


class _FormatDesc(ctypes.Structure):  # pl_format_desc
    _fields_ = [("name", c_char_p), ("bits", ctypes.c_int32), ("precision", ctypes.c_int32),
                ("emin", ctypes.c_int32), ("emax", ctypes.c_int32), ("max", c_double), ("min_subnormal", c_double),
                ("has_inf", ctypes.c_int32), ("has_nan", ctypes.c_int32), ("bytes", ctypes.c_int32)]


KINDS = ("algorithm", "kernel", "bug")                                       # pl_variant_kind
INPUT_ORDERS = ("as_given", "reversed", "ascending_abs", "descending_abs")   # pl_input_order
_DEVICE_BITS = (("cpu", 1), ("cuda", 2))                                     # pl_device_bits
_SASS_CHECK_BITS = (("single_pass", 1), ("streaming", 2), ("two_an_sm", 4), ("shared_loops", 8))  # pl_sass_check


@dataclass(frozen=True)
class SassCeiling:
    """One of a variant's GPU kernels as make sass-check holds it (pl_sass_rule):
    the checks it gets and its most instructions per element for these dtypes."""
    kernel: str  # the __global__ function template's name
    checks: tuple[str, ...]  # of "single_pass", "streaming", "two_an_sm", "shared_loops"
    dtypes: tuple[str, ...]  # format names
    ceiling: float

    def to_json(self) -> dict:
        return {"function": self.kernel, "checks": list(self.checks), "dtypes": list(self.dtypes),
                "ceiling": self.ceiling}


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
    dtypes: tuple[str, ...] = ()  # the formats it takes, by name (the sum's: its accumulator)
    sass_ceiling: tuple[SassCeiling, ...] = ()  # its kernels' instruction ceilings, per kernel and dtype

    def to_json(self) -> dict:
        return {"op": self.op, "name": self.name, "id": self.id, "kind": self.kind, "devices": list(self.devices),
                "order": self.order, "batch_invariant": self.batch_invariant, "deterministic": self.deterministic,
                "default": self.default, "summary": self.summary, "dtypes": list(self.dtypes),
                "sass_ceiling": [c.to_json() for c in self.sass_ceiling]}


def _format_names(bits: int) -> tuple[str, ...]:
    """The names of the formats whose bit (1 << code) is set, in code order."""
    return tuple(f.name for f in format_table() if bits >> f.code & 1)


@lru_cache(maxsize=1)
def catalog() -> tuple[Variant, ...]:
    """Every variant the library implements, in its order (ops by name, rows as declared)."""
    count = c_int()
    _call("pl_variant_count", ctypes.byref(count))
    out = []
    for i in range(count.value):
        d = _VariantDesc()
        _call("pl_variant_info", i, ctypes.byref(d))
        sass = tuple(SassCeiling(r.kernel.decode(), tuple(n for n, bit in _SASS_CHECK_BITS if r.checks & bit),
                                 _format_names(r.dtypes), r.ceiling) for r in (d.sass[k] for k in range(d.nsass)))
        out.append(Variant(d.op.decode(), d.name.decode(), d.id, KINDS[d.kind],
                           tuple(n for n, bit in _DEVICE_BITS if d.devices & bit), INPUT_ORDERS[d.order],
                           None if d.batch_invariant < 0 else bool(d.batch_invariant), bool(d.deterministic),
                           bool(d.is_default), d.summary.decode(), _format_names(d.dtypes), sass))
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


@dataclass(frozen=True, kw_only=True)
class ValueRange:
    """What every format description of the library carries (pl_format_desc,
    pl_minifloat_desc): the exponent range, the largest finite value, the
    smallest subnormal, and whether inf and NaN exist."""
    emin: int
    emax: int
    max: float
    min_subnormal: float
    has_inf: bool
    has_nan: bool


def _from_desc(cls, d: ctypes.Structure, **given):
    """A `cls` record from the library's struct `d`: each field not given is
    d's field of the same name (C strings decoded, has_* flags as bools)."""
    def value(name: str):
        v = getattr(d, name)
        return v.decode() if isinstance(v, bytes) else bool(v) if name.startswith("has_") else v
    return cls(**given, **{f.name: value(f.name) for f in dataclasses.fields(cls) if f.name not in given})


@dataclass(frozen=True)
class FormatDesc(ValueRange):
    """One arithmetic format as the library declares it (pl_format_desc)."""
    code: int
    name: str
    bits: int
    precision: int
    bytes: int


@lru_cache(maxsize=1)
def format_table() -> tuple[FormatDesc, ...]:
    """The library's arithmetic formats (pl_format codes), in code order."""
    def one(i):
        d = _FormatDesc()
        _call("pl_format_info", i, ctypes.byref(d))
        return _from_desc(FormatDesc, d, code=i)
    return tuple(_table(one))
