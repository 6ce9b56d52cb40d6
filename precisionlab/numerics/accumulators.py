"""Accumulator models: how a matmul's dot products are carried, bit for bit.

The storage format of A and B is one thing, the accumulator another. Each model
here takes A (M x K) and B (K x N) whose values are already in their storage
format (fp8, bf16, fp16, fp32, given as float64 or float32 arrays, finite) and
returns C (M x N) as float32 values, exactly as the model defines it. Every
product a_ik * b_kj of two such values is exact in float64 (at most 2 x 24
significant bits), so the models start from exact products.

The models, each one output element c = sum_k a_k b_k at a time:

``exact``
    One rounding: c = fp32(the exact sum), nearest, ties to even.
``fp32``
    IEEE sequential: c = 0, then for k in order c = fp32(c + fp32(a_k b_k)).
    (Products of inputs with at most 12 significant bits, fp8/bf16/fp16, are
    exact in fp32, so there this is also the FMA chain.)
``fp32-pairwise``
    p_k = fp32(a_k b_k); then level by level, adjacent pairs are added in fp32
    (p_0 + p_1, p_2 + p_3, ...), an odd last element passing up unchanged,
    until one value is left.
``hopper-fp8`` (parameters ``bits`` B = 14, ``group`` g = 32, ``rounding``
    trunc | rne | floor, ``align`` product | value, ``out`` O = min(B, 24))
    A tensor core's fused dot-add of g products into an fp32 accumulator c
    (g = 32 is the depth of Hopper's FP8 wgmma instruction, k = 32), as
    MMA-Sim (Xie et al., arXiv 2511.10909) found it on Hopper by targeted and
    randomised tests, bit for bit: B = 14 is its 13 fractional bits. c starts
    at +0; for each group G of g consecutive k (the last may be shorter), the
    terms are T = {c} U {a_k b_k : k in G}, all exact. Each term has an
    alignment exponent E(t): for a product, with
    align=product (the hardware's), the sum of its factors' exponents
    E(a) + E(b), E(x) = floor(log2 |x|) but never below the smallest normal
    exponent of x's format (a subnormal factor sits at its format's emin), so a
    product whose significands multiply past 2 keeps one bit more; with
    align=value, floor(log2 |a_k b_k|) of the exact product. c's exponent is
    floor(log2 |c|) but never below -126 (a subnormal c sits at fp32's emin).
    A zero term (c = 0, or a product with a zero factor) takes part at
    -133 with align=product: MMA-Sim 2.1.1's e_zero for an fp32 result on
    Hopper and Blackwell, below every non-zero term of an fp32 accumulator, so
    a zero never raises the group's exponent; with c = 0 tiny products (of
    bf16, tf32 or fp32 factors) align at -133 rather than -126. The group's
    exponent is e = the largest of the terms' exponents. With align=value
    (this project's earlier model) a zero product takes no part and e is at
    least -126, fp32's smallest normal exponent. With u = 2^(e - B + 1)
    every term is cut to a multiple of u: toward zero (trunc, a sign-magnitude
    datapath, the hardware's), to the nearest, ties to even (rne), or toward
    -inf (floor: what an arithmetic, sign-filling right shift of a
    two's-complement term does, a reading of DeepSeek-V3's account). trunc and
    floor agree on positive terms; on negative ones floor loses up to a u
    more, so its errors pile up toward -inf, group after group. The cut terms
    are added exactly into S. The output is S normalised and cut again, with
    the same rounding, to O significant bits: to a multiple of
    2^(max(floor(log2 |S|), -126) - O + 1). For FP8 on Hopper O = B = 14 (an
    "e8m13" value in an fp32 register); O = 24 is a plain fp32 result. A sum
    that carries past 2^(e+1) loses its last bits here; a result beyond fp32's
    largest value is inf; a zero S, or one cut to zero, is +0. That value is
    the new c. The order inside a group does not matter (the sum is exact);
    the order of the groups does. MMA-Sim's other NVIDIA fused dot-adds are
    the same algorithm: Hopper's bf16/fp16 wgmma is
    ``hopper-fp8:bits=26:group=16`` (25 fractional bits, an fp32 result cut
    toward zero).
``promote:N`` (the same B, g, rounding, align, O)
    DeepSeek-V3's promotion: the K products are split into chunks of N
    consecutive k; each chunk is accumulated by ``hopper-fp8`` from +0 (its
    groups of g start at the chunk's start), and the chunk's fp32 result is
    added to an fp32 accumulator on the CUDA cores: c = fp32(c + chunk), chunk
    after chunk.

Accumulating onto a running value (``Accumulator.accumulate(c, A, B)``, as a
kernel's MMA adds into the accumulator it already holds, FlashAttention's O):
c (M x N, fp32 values) takes the place of the +0 start: ``exact``: fp32(c + the
exact sum); ``fp32``: the chain starts at c; ``fp32-pairwise``: fp32(c + the
pairwise tree); ``hopper-fp8``: c is the first group's accumulator (in its
exponent max); ``promote:N``: each chunk from +0, added to c in fp32 chunk
after chunk (c = fp32(c + chunk), the first chunk onto the given c).
``matmul(A, B)`` is ``accumulate(+0, A, B)``. The formats of A and B
(``dtype`` of both, or ``a_dtype`` / ``b_dtype``; fp32 unless given) set each
factor's smallest normal exponent for align=product.

Every model takes ``order`` = forward | reverse: the K axis is traversed in
that order (reverse: k = K-1 first), which decides the sequence of groups,
chunks and additions.

Spelling (``parse``): ``KIND[:N][:key=value]...``, e.g. ``exact``, ``fp32``,
``fp32:order=reverse``, ``fp32-pairwise``, ``hopper-fp8``,
``hopper-fp8:bits=13:group=16:rounding=rne``, ``hopper-fp8:align=value:out=24``,
``promote:128``, ``promote:64:bits=14``. ``Accumulator.name`` writes it back, the defaults left
out.

Vectorised over the M x N outputs; the loop runs over K (groups, chunks or
single k), never over elements, in the order a kernel would follow: for
``hopper-fp8``, per group: products, exponent max with c, cut, exact sum, one
fp32 rounding.

Two implementations of these definitions: this module's numpy
(``backend="numpy"``) and the library's C++ (``backend="native"``,
cuda/matmul_accumulator.cu: integer arithmetic on the significands, one
output at a time, the same code as its CUDA kernel). tests/test_accumulators.py
holds both to a fractions emulation and to each other, bit for bit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.errors import RunError, UsageError

BACKENDS = ("numpy", "native")
KINDS = ("exact", "fp32", "fp32-pairwise", "hopper-fp8", "promote")
ROUNDINGS = ("trunc", "rne", "floor")
ALIGNS = ("product", "value")  # the alignment exponent of a product: its factors' exponents summed, or its value's
ORDERS = ("forward", "reverse")
LIMITED = ("hopper-fp8", "promote")  # the kinds with B, g, the cut's rounding, align and O
DEFAULT_BITS = 14
DEFAULT_GROUP = 32
MAX_BITS = 40  # the cut terms' exact sum must stay within float64's 53 bits: (g + 1) 2^(B + 1) < 2^53
MAX_OUT = 24  # the output is an fp32 value: at most its 24 significant bits
F32_EMIN = -126  # fp32's smallest normal exponent: where a subnormal c aligns, and the floor of align=value
# A zero term's alignment exponent with align=product: MMA-Sim 2.1.1's e_zero for an fp32 result (Hopper,
# Blackwell; nv_ptx/sim.py), below every non-zero fp32 c, so a zero never sets the group's exponent.
ZERO_EXP = -133
MAX_INTERVAL = 2**63 - 1  # pl_accumulator.interval is an int64
MAX_GROUP = 2**31 - 1  # pl_accumulator.group an int32
_DECIMAL = re.compile(r"[0-9]+")  # str.isdigit() also takes '²', which int() refuses


@dataclass(frozen=True)
class Accumulator:
    kind: str
    bits: int = DEFAULT_BITS
    group: int = DEFAULT_GROUP
    rounding: str = "trunc"
    interval: int | None = None  # promote's N
    order: str = "forward"
    align: str = "product"
    out: int | None = None  # O, the output's significant bits; None: min(B, 24)

    @property
    def out_bits(self) -> int:
        return self.out if self.out is not None else min(self.bits, MAX_OUT)

    @property
    def name(self) -> str:
        s = self.kind + (f":{self.interval}" if self.kind == "promote" else "")
        extra = []
        if self.kind in ("hopper-fp8", "promote"):
            if self.bits != DEFAULT_BITS:
                extra.append(f"bits={self.bits}")
            if self.group != DEFAULT_GROUP:
                extra.append(f"group={self.group}")
            if self.rounding != "trunc":
                extra.append(f"rounding={self.rounding}")
            if self.align != "product":
                extra.append(f"align={self.align}")
            if self.out is not None:
                extra.append(f"out={self.out}")
        if self.order != "forward":
            extra.append(f"order={self.order}")
        return ":".join([s, *extra])

    def matmul(self, a, b, backend: str = "numpy", dtype: str = "fp32") -> np.ndarray:
        """C = A @ B under this model, float32 (M x N). backend "native": the
        library's implementation, which also checks that every value is one of
        `dtype` (fp32 holds them all)."""
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"shapes {a.shape} @ {b.shape} do not multiply")
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise ValueError("the accumulator models take finite inputs")
        if backend == "native":
            return self._native(a, b, dtype)
        if backend != "numpy":
            raise ValueError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
        if self.order == "reverse":
            a, b = a[:, ::-1], b[::-1, :]
        bt = np.ascontiguousarray(b.T)  # (N, K): products are a[:, None, ks] * bt[None, :, ks]
        if self.kind == "exact":
            return _exact(a, bt)
        if self.kind == "fp32":
            return _fp32_sequential(a, b)
        if self.kind == "fp32-pairwise":
            return _fp32_pairwise(a, bt)
        emins = (formats.get(dtype).emin,) * 2
        if self.kind == "hopper-fp8":
            return _limited(a, bt, np.zeros((a.shape[0], bt.shape[0])), self, emins).astype(np.float32)
        return _promote(a, bt, self, emins)

    def accumulate(self, c, a, b, a_dtype: str = "fp32", b_dtype: str = "fp32") -> np.ndarray:
        """c + A @ B under this model, c (M x N, fp32 values) the running
        accumulator (see the module's docstring), float32 (M x N); A's values
        are `a_dtype` values, B's `b_dtype` values."""
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        c = np.asarray(c, dtype=np.float32)
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0] or c.shape != (a.shape[0], b.shape[1]):
            raise ValueError(f"shapes {c.shape} + {a.shape} @ {b.shape} do not add up")
        if not (np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(c).all()):
            raise ValueError("the accumulator models take finite inputs")
        if self.order == "reverse":
            a, b = a[:, ::-1], b[::-1, :]
        if self.kind == "fp32":
            return _fp32_chain(c.copy(), a, b)
        emins = (formats.get(a_dtype).emin, formats.get(b_dtype).emin)
        if self.kind == "hopper-fp8":
            bt = np.ascontiguousarray(b.T)
            return _limited(a, bt, c.astype(np.float64), self, emins).astype(np.float32)
        if self.kind == "exact":
            return _exact(a, np.ascontiguousarray(b.T), c)
        if self.kind == "promote":
            return _promote(a, np.ascontiguousarray(b.T), self, emins, c)
        return c + _fp32_pairwise(a, np.ascontiguousarray(b.T))  # fp32 + fp32, correctly rounded

    def _native(self, a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
        m, n = a.shape[0], b.shape[1]
        if a.shape[1] == 0:  # the library takes k >= 1; an empty sum is +0 in every model
            return np.zeros((m, n), dtype=np.float32)
        if m == 0 or n == 0:
            return np.zeros((m, n), dtype=np.float32)
        model = native.accumulator(self.kind, self.bits, self.group, self.rounding, self.interval or 0, self.order,
                                   self.align, self.out_bits)
        return native.matmul_acc_cpu(a.astype(np.float32), b.astype(np.float32), formats.get(dtype).code, model)

    def fields(self) -> dict:
        """Every parameter, for a --json row: the spelling and each field
        (null where the kind has none)."""
        limited = self.kind in ("hopper-fp8", "promote")
        return {"accumulator": self.name, "acc_kind": self.kind,
                "acc_bits": self.bits if limited else None, "acc_group": self.group if limited else None,
                "acc_rounding": self.rounding if limited else None, "acc_interval": self.interval,
                "acc_order": self.order, "acc_align": self.align if limited else None,
                "acc_out": self.out_bits if limited else None}

    def peak_bytes(self, m: int, n: int, k: int) -> int:
        """The arrays alive at this model's peak, for a memory check before running."""
        if self.kind == "fp32-pairwise":
            return 4 * m * n * k * 2  # the products and the first level
        if self.kind == "exact":
            return 8 * m * n * (EXACT_CHUNK * 4 + 64)  # a chunk's products and their extraction
        if self.kind == "fp32":
            return 4 * m * n * 4
        g = min(self.group, k, self.interval or k)  # a group holds at most the K (or the chunk) there is
        return 8 * m * n * (g + 1) * 8  # one group's terms, their exponents and their cut copies


def parse(text: str) -> Accumulator:
    """'promote:128:bits=13' -> Accumulator; ValueError with the reason otherwise."""
    parts = [p.strip() for p in text.strip().split(":")]
    kind = parts[0]
    if kind not in KINDS:
        raise ValueError(f"unknown accumulator {text!r}; choose from {', '.join(KINDS)} "
                         "(e.g. hopper-fp8, promote:128, hopper-fp8:bits=13:group=16:rounding=rne)")
    rest = parts[1:]
    fields: dict = {}
    if kind == "promote":
        if not rest or not _DECIMAL.fullmatch(rest[0]) or not 0 < int(rest[0]) <= MAX_INTERVAL:
            raise ValueError(f"accumulator {text!r}: promote needs its interval, promote:N with 0 < N < 2^63")
        fields["interval"] = int(rest[0])
        rest = rest[1:]
    allowed = ("bits", "group", "rounding", "align", "out", "order") if kind in LIMITED else ("order",)
    for p in rest:
        key, eq, value = p.partition("=")
        if not eq or key not in allowed:
            raise ValueError(f"accumulator {text!r}: {p!r} is not one of {', '.join(k + '=' for k in allowed)}")
        if key in fields:
            raise ValueError(f"accumulator {text!r}: {key}= is given twice")
        if key in ("bits", "group", "out"):
            if not _DECIMAL.fullmatch(value) or int(value) <= 0:
                raise ValueError(f"accumulator {text!r}: {key} must be a positive integer")
            fields[key] = int(value)
        elif key == "rounding" and value not in ROUNDINGS:
            raise ValueError(f"accumulator {text!r}: rounding is one of {', '.join(ROUNDINGS)}")
        elif key == "order" and value not in ORDERS:
            raise ValueError(f"accumulator {text!r}: order is one of {', '.join(ORDERS)}")
        elif key == "align" and value not in ALIGNS:
            raise ValueError(f"accumulator {text!r}: align is one of {', '.join(ALIGNS)}")
        else:
            fields[key] = value
    acc = replace(Accumulator(kind), **fields)
    if acc.group > MAX_GROUP:
        raise ValueError(f"accumulator {text!r}: group must be below 2^31 (got {acc.group})")
    if acc.bits > MAX_BITS or (acc.group + 1) << (acc.bits + 1) >= 1 << 53:  # integers: no overflow
        raise ValueError(f"accumulator {text!r}: bits={acc.bits} with group={acc.group} would not sum exactly "
                         f"here (at most bits={MAX_BITS} and (group + 1) 2^(bits + 1) < 2^53)")
    if acc.out is not None:
        if acc.out > MAX_OUT:
            raise ValueError(f"accumulator {text!r}: out is at most {MAX_OUT} (an fp32 result's significant bits)")
        if acc.out == min(acc.bits, MAX_OUT):
            acc = replace(acc, out=None)  # the default, spelled: one name for one model
    return acc


def published_names() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(kinds, roundings, aligns) as the library publishes them (pl_accumulator_*_info);
    this module's own KINDS, ROUNDINGS, ALIGNS where it does not load (the numpy
    backend runs the same models; tests/test_accumulators.py holds the two equal)."""
    try:
        return (tuple(native.accumulator_kinds()), tuple(native.accumulator_roundings()),
                tuple(native.accumulator_aligns()))
    except RunError:
        return KINDS, ROUNDINGS, ALIGNS


def spellings_help() -> str:
    """Every model's spelling and every field a model takes, for --help: built from
    the published names, so a kind, rounding or alignment the library adds is listed."""
    kinds, roundings, aligns = published_names()
    names = [f"{k}:N" if k == "promote" else k for k in kinds]  # promote's interval N is part of its name
    limited = " and ".join(n for k, n in zip(kinds, names, strict=True) if k in LIMITED)
    return (f"{', '.join(names)}; {limited} take :bits=B :group=G :rounding={'|'.join(roundings)} "
            f":align={'|'.join(aligns)} :out=O, every model :order={'|'.join(ORDERS)}")


def library_formats() -> frozenset[str]:
    """The formats the library's matmul_acc takes (its catalog's table); none where it does not load."""
    try:
        return frozenset(d for v in native.variants("matmul_acc", "cpu") for d in v.dtypes)
    except RunError:
        return frozenset()


def default_backend(dtype: str = "fp32") -> str:
    """"native" where the library loads and takes `dtype`'s values, else "numpy": the same bits either way."""
    return "native" if dtype in library_formats() else "numpy"


def parse_list(text: str, bits: int | None = None, rounding: str | None = None) -> list[Accumulator]:
    """'hopper-fp8,promote:128' -> both, in order, each once. `bits` and
    `rounding` (--acc-bits, --acc-rounding) set B and the cut's rounding of
    every limited-precision model (hopper-fp8, promote:N) in the list that
    does not spell its own (``:bits=``, ``:rounding=``); ValueError when no
    model in the list takes them."""
    names = [s for s in (t.strip() for t in text.split(",")) if s]
    if not names:
        raise ValueError(f"empty accumulator list {text!r}")
    extra = {key: value for key, value in (("bits", bits), ("rounding", rounding)) if value is not None}
    if extra:
        if not any(parse(n).kind in LIMITED for n in names):
            given = " and ".join(f"--acc-{key}" for key in extra)
            raise ValueError(f"{given} set the limited-precision models' fields (hopper-fp8, promote:N); "
                             f"{text!r} has none")
        names = [_with_defaults(n, extra) for n in names]
    return list({a.name: a for a in map(parse, names)}.values())


def parse_option(text: str, bits: int | None = None, rounding: str | None = None) -> list[Accumulator]:
    """--accumulator with --acc-bits and --acc-rounding, as every command
    takes them (tf32, formats, compare op matmul): the models, or a
    UsageError (exit 2) naming the option."""
    if bits is not None and not 0 < bits <= MAX_BITS:
        raise UsageError(f"--acc-bits {bits}: between 1 and {MAX_BITS}")
    if rounding is not None and rounding not in ROUNDINGS:
        raise UsageError(f"--acc-rounding {rounding!r}: one of {', '.join(ROUNDINGS)}")
    try:
        return parse_list(text, bits, rounding)
    except ValueError as e:
        raise UsageError(f"--accumulator: {e}") from None


def fold_fields(text: str, bits: int | None = None, rounding: str | None = None) -> str:
    """--accumulator's text with the old --acc-bits/--acc-rounding spelled
    into each limited model that does not spell its own (`hopper-fp8` ->
    `hopper-fp8:bits=B:rounding=R`): what the alias layer rewrites the old
    options into; the same refusals (exit 2) as parse_option gives them."""
    parse_option(text, bits, rounding)
    extra = {key: value for key, value in (("bits", bits), ("rounding", rounding)) if value is not None}
    return ",".join(_with_defaults(n, extra) for n in (t.strip() for t in text.split(",")) if n)


def _with_defaults(name: str, extra: dict) -> str:
    """A limited model's spelling with the fields it leaves out added (its own win)."""
    parts = [p.strip() for p in name.strip().split(":")]
    if parts[0] not in LIMITED:
        return name
    spelled = {p.partition("=")[0] for p in parts[1:]}
    return ":".join(parts + [f"{key}={value}" for key, value in extra.items() if key not in spelled])


# ---------------------------------------------------------------------------
# fp32 in IEEE order


def _fp32_sequential(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    c = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for k in range(a.shape[1]):
        # two float32 operations, each correctly rounded: no FMA contraction in numpy
        c = c + a32[:, k:k + 1] * b32[k:k + 1, :]
    return c


def _fp32_chain(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """c = fp32(c + fp32(a_k b_k)), k in order, in place on c (float32): the
    same two correctly rounded operations as _fp32_sequential, without a new
    array a step (a long chain over a big c is memory-bound)."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    prod = np.empty_like(c)
    for k in range(a.shape[1]):
        np.multiply(a32[:, k:k + 1], b32[k:k + 1, :], out=prod)
        np.add(c, prod, out=c)
    return c


def _fp32_pairwise(a: np.ndarray, bt: np.ndarray) -> np.ndarray:
    level = a.astype(np.float32)[:, None, :] * bt.astype(np.float32)[None, :, :]
    if level.shape[-1] == 0:
        return np.zeros(level.shape[:2], dtype=np.float32)
    while level.shape[-1] > 1:
        n = level.shape[-1]
        pairs = level[..., 0:n - 1:2] + level[..., 1:n:2]
        level = np.concatenate([pairs, level[..., n - 1:]], axis=-1) if n % 2 else pairs
    return level[..., 0]


# ---------------------------------------------------------------------------
# limited-precision fused groups


_CUTS = {"trunc": np.trunc, "rne": np.rint, "floor": np.floor}  # np.rint: nearest, ties to even


def _align_exponents(x: np.ndarray, emin: int) -> np.ndarray:
    """E(x) of each factor for align=product: floor(log2 |x|), never below its
    format's smallest normal exponent (a zero's is meaningless: the product's
    exponent is ZERO_EXP, set where the product is formed)."""
    _, e = np.frexp(np.abs(x))  # |x| = m 2^e, 0.5 <= m < 1: floor(log2 |x|) = e - 1
    return np.maximum(e - 1, emin)


def _cut_to(x: np.ndarray, shift: np.ndarray, rounding: str) -> np.ndarray:
    """x / 2^shift cut to an integer (float64). Exact: a power-of-two scaling
    far from float64's limits, of values with at most 53 significant bits."""
    return _CUTS[rounding](np.ldexp(x, -shift))


def _fused_group(c: np.ndarray, p: np.ndarray, ep: np.ndarray | None, acc: Accumulator) -> np.ndarray:
    """One MMA step: c (M x N, fp32 values) plus the group's exact products p
    (M x N x g), ep their alignment exponents (None: align=value, each
    product's own), aligned to the largest, cut to B bits, summed exactly,
    the sum cut to O significant bits. Returned as float64 holding fp32 values."""
    floor = F32_EMIN if ep is None else ZERO_EXP  # align=value: never below -126; product: a zero's -133
    _, ec = np.frexp(np.abs(c))
    ec = np.where(c != 0, np.maximum(ec - 1, F32_EMIN), floor)  # a subnormal c aligns at -126
    if ep is None:  # align=value: a zero product has no exponent, and never raises e above the floor
        _, ep = np.frexp(np.abs(p))
        ep = np.where(p != 0, ep - 1, floor)
    else:  # align=product: a product with a zero factor takes part at ZERO_EXP
        ep = np.where(p != 0, ep, ZERO_EXP)
    e = np.maximum(ec, np.max(ep, axis=-1, initial=floor))
    shift = e - acc.bits + 1
    total = _cut_to(c, shift, acc.rounding) + np.sum(_cut_to(p, shift[..., None], acc.rounding), axis=-1)
    # |total| < (g + 1) 2^(B + 1) <= 2^53: integers, exact in any order. Now normalise and cut to O bits.
    _, top = np.frexp(np.abs(total))  # |total| < 2^top
    e_s = np.maximum(top - 1 + shift, F32_EMIN)
    q = e_s - acc.out_bits + 1
    r = _cut_to(total, q - shift, acc.rounding)  # at most O (+1 when rne carries) bits: exact
    with np.errstate(over="ignore"):
        out = np.ldexp(r, q).astype(np.float32).astype(np.float64)  # exact, or beyond fp32's range: inf
    return out + 0.0  # -0 to +0: a zero sum, or one cut to zero, is +0


def _limited(a: np.ndarray, bt: np.ndarray, c: np.ndarray, acc: Accumulator, emins: tuple[int, int]) -> np.ndarray:
    ea = _align_exponents(a, emins[0]) if acc.align == "product" else None
    eb = _align_exponents(bt, emins[1]) if acc.align == "product" else None
    for k0 in range(0, a.shape[1], acc.group):
        ks = slice(k0, k0 + acc.group)
        p = a[:, None, ks] * bt[None, :, ks]
        ep = ea[:, None, ks] + eb[None, :, ks] if ea is not None else None
        c = _fused_group(c, p, ep, acc)
    return c


def _promote(a: np.ndarray, bt: np.ndarray, acc: Accumulator, emins: tuple[int, int],
             c: np.ndarray | None = None) -> np.ndarray:
    """Chunk after chunk, each from +0, added into c (+0 unless given) in fp32."""
    m, n = a.shape[0], bt.shape[0]
    c = np.zeros((m, n), dtype=np.float32) if c is None else c
    for k0 in range(0, a.shape[1], acc.interval):
        chunk = _limited(a[:, k0:k0 + acc.interval], bt[:, k0:k0 + acc.interval], np.zeros((m, n)), acc, emins)
        c = c + chunk.astype(np.float32)  # the CUDA-core fp32 addition, correctly rounded
    return c


# ---------------------------------------------------------------------------
# exact: error-free extraction, then one rounding

EXACT_CHUNK = 512


def _extract(p: np.ndarray) -> list[np.ndarray]:
    """Float64 arrays (M x N) whose sum is exactly p's sum over its last axis.
    Rump, Ogita and Oishi's ExtractVector: with sigma = 2^(M + ceil(log2 max|p|)),
    M = ceil(log2(n + 2)), q = (sigma + p) - sigma is exact, so is p - q, and
    the q's sum exactly in float64 (multiples of ulp(sigma)/2 below sigma in
    total). Repeat on the remainders until they are all zero."""
    n = p.shape[-1]
    big = math.ceil(math.log2(n + 2))
    out = []
    while True:
        amax = np.max(np.abs(p), axis=-1)
        if not np.any(amax > 0):
            return out
        _, e = np.frexp(amax)  # amax < 2^e
        sigma = np.where(amax > 0, np.ldexp(1.0, e + big), 0.0)[..., None]
        q = (sigma + p) - sigma
        p = p - q
        out.append(np.sum(q, axis=-1))


def _exact(a: np.ndarray, bt: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    m, n = a.shape[0], bt.shape[0]
    levels: list[np.ndarray] = [] if c is None else [c.astype(np.float64)]
    for k0 in range(0, a.shape[1], EXACT_CHUNK):
        levels += _extract(a[:, None, k0:k0 + EXACT_CHUNK] * bt[None, :, k0:k0 + EXACT_CHUNK])
    while len(levels) > 2:  # fold the chunks' levels together: far fewer rationals below
        folded = _extract(np.stack(levels, axis=-1))
        if len(folded) >= len(levels):  # values more than ~50 bits apart do not fold: the rationals sum them
            break
        levels = folded
    if not levels:
        return np.zeros((m, n), dtype=np.float32)
    stacked = np.stack(levels, axis=-1).reshape(m * n, -1)
    out = np.empty(m * n, dtype=np.float32)
    for i, row in enumerate(stacked.tolist()):
        out[i] = _fraction_to_fp32(sum(map(Fraction, row), Fraction(0)))
    return out.reshape(m, n)


def _fraction_to_fp32(q: Fraction) -> np.float32:
    """fp32 nearest (ties to even) of a rational: its double rounded to odd
    keeps the sticky bit, and the second rounding to fp32 is then correct
    (53 >= 24 + 2)."""
    f = float(q)  # correctly rounded
    rest = q - Fraction(f)
    if rest != 0 and (np.float64(f).view(np.uint64) & 1) == 0:
        f = math.nextafter(f, math.inf if rest > 0 else -math.inf)
    return np.float32(f) + np.float32(0.0)
