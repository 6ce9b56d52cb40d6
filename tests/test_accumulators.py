"""Accumulator models against an independent emulation, one output element at
a time, in rationals (fractions.Fraction), following the semantics written in
precisionlab/numerics/accumulators.py's docstring; nothing here calls the
module's arithmetic. Inputs are drawn in float64 and cast by ml_dtypes to the
storage format (any rounding will do: the models take the stored values)."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from precisionlab.numerics import accumulators as acc

F32_P, F32_EMIN = 24, -126
ZERO_EXP = -133  # MMA-Sim 2.1.1 nv_ptx/sim.py: e_zero for an fp32 result on Hopper and Blackwell


def floor_log2(q: Fraction) -> int:
    q = abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    return e if Fraction(2) ** e <= q else e - 1


def round_f32(q: Fraction) -> Fraction:
    """Nearest fp32, ties to even, from the definition (finite range only)."""
    if q == 0:
        return Fraction(0)
    ulp = Fraction(2) ** (max(floor_log2(q), F32_EMIN) - F32_P + 1)
    return round(q / ulp) * ulp  # Fraction.__round__: half to even


def to_f32(q: Fraction) -> np.float32:
    v = np.float32(float(q))
    assert Fraction(float(v)) == q  # q is an fp32 value: the conversion is exact
    return v


CUTS = {"trunc": int, "rne": round, "floor": math.floor}  # toward zero; Fraction's nearest, ties to even; toward -inf


def emu_limited(pairs: list[tuple[Fraction, Fraction]], c: Fraction, a: acc.Accumulator,
                emins: tuple[int, int] = (F32_EMIN, F32_EMIN)) -> Fraction:
    """The fused dot-add group after group: pairs (a_k, b_k), emins their formats' smallest normal exponents."""
    def exp_of(t: Fraction, emin: int) -> int:  # a non-zero factor's: at least its format's emin
        return max(floor_log2(t), emin)

    out_bits = a.out if a.out is not None else min(a.bits, F32_P)
    for g0 in range(0, len(pairs), a.group):
        group = pairs[g0:g0 + a.group]
        terms = [c] + [x * y for x, y in group]
        if a.align == "product":  # MMA-Sim 2.1.1: every term takes part, a zero one at e_zero = -133
            es = [max(floor_log2(c), F32_EMIN) if c != 0 else ZERO_EXP]
            es += [exp_of(x, emins[0]) + exp_of(y, emins[1]) if x * y != 0 else ZERO_EXP for x, y in group]
        else:  # align=value: non-zero terms only, and never below -126
            es = [F32_EMIN] + ([floor_log2(c)] if c != 0 else [])
            es += [floor_log2(x * y) for x, y in group if x * y != 0]
        u = Fraction(2) ** (max(es) - a.bits + 1)
        s = sum((CUTS[a.rounding](t / u) * u for t in terms), Fraction(0))
        if s != 0:
            q = Fraction(2) ** (max(floor_log2(s), F32_EMIN) - out_bits + 1)
            s = CUTS[a.rounding](s / q) * q
        c = s
    return c


def emulate(model: str, x: list[Fraction], y: list[Fraction], emins=(F32_EMIN, F32_EMIN)) -> np.float32:
    a = acc.parse(model)  # the spelling only: its fields say which semantics to follow
    if a.order == "reverse":
        x, y = x[::-1], y[::-1]
    pairs = list(zip(x, y, strict=True))
    prods = [xi * yi for xi, yi in zip(x, y, strict=True)]
    if a.kind == "exact":
        return to_f32(round_f32(sum(prods, Fraction(0))))
    if a.kind == "fp32":
        c = Fraction(0)
        for p in prods:
            c = round_f32(c + round_f32(p))
        return to_f32(c)
    if a.kind == "fp32-pairwise":
        level = [round_f32(p) for p in prods] or [Fraction(0)]
        while len(level) > 1:
            nxt = [round_f32(level[i] + level[i + 1]) for i in range(0, len(level) - 1, 2)]
            level = nxt + ([level[-1]] if len(level) % 2 else [])
        return to_f32(level[0])
    if a.kind == "hopper-fp8":
        return to_f32(emu_limited(pairs, Fraction(0), a, emins))
    c = Fraction(0)
    for k0 in range(0, len(prods), a.interval):
        chunk = emu_limited(pairs[k0:k0 + a.interval], Fraction(0), a, emins)
        c = round_f32(c + chunk)
    return to_f32(c)


def emulate_onto(model: str, c: Fraction, x: list[Fraction], y: list[Fraction],
                 emins=(F32_EMIN, F32_EMIN)) -> Fraction:
    """c + x.y under the model, c an fp32 value (the docstring's "Accumulating
    onto a running value"), step by step in rationals."""
    a = acc.parse(model)
    if a.order == "reverse":
        x, y = x[::-1], y[::-1]
    pairs = list(zip(x, y, strict=True))
    prods = [xi * yi for xi, yi in zip(x, y, strict=True)]
    if a.kind == "exact":
        return round_f32(c + sum(prods, Fraction(0)))
    if a.kind == "fp32":
        for p in prods:
            c = round_f32(c + round_f32(p))
        return c
    if a.kind == "fp32-pairwise":
        level = [round_f32(p) for p in prods] or [Fraction(0)]
        while len(level) > 1:
            nxt = [round_f32(level[i] + level[i + 1]) for i in range(0, len(level) - 1, 2)]
            level = nxt + ([level[-1]] if len(level) % 2 else [])
        return round_f32(c + level[0])
    if a.kind == "hopper-fp8":
        return emu_limited(pairs, c, a, emins)
    for k0 in range(0, len(prods), a.interval):  # promote: each chunk from 0, added to c chunk after chunk
        c = round_f32(c + emu_limited(pairs[k0:k0 + a.interval], Fraction(0), a, emins))
    return c


def draw(rng, shape, dtype, spread=0.0):
    x = rng.standard_normal(shape) * np.exp2(rng.uniform(-spread, spread, shape))
    return x.astype(dtype).astype(np.float64)


MODELS = ["exact", "fp32", "fp32:order=reverse", "fp32-pairwise", "hopper-fp8", "hopper-fp8:rounding=rne",
          "hopper-fp8:rounding=floor", "hopper-fp8:bits=10:group=4", "hopper-fp8:bits=20:group=7:order=reverse",
          "hopper-fp8:bits=11:group=5:rounding=floor", "hopper-fp8:align=value", "hopper-fp8:align=value:out=24",
          "hopper-fp8:out=6:rounding=rne", "hopper-fp8:bits=26:group=16", "hopper-fp8:bits=30:group=3:out=20",
          "promote:128", "promote:16", "promote:5:group=4:bits=12", "promote:40:rounding=rne",
          "promote:24:group=8:rounding=floor", "promote:8:align=value:rounding=floor:out=24"]
DTYPES = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2, "bf16": ml_dtypes.bfloat16,
          "fp16": np.float16, "fp32": np.float32}
# Each format's smallest normal exponent, from its definition (not from precisionlab's catalog): a subnormal
# factor aligns there under align=product.
EMINS = {"fp8_e4m3": -6, "fp8_e5m2": -14, "bf16": -126, "fp16": -14, "fp32": -126, "tf32": -126, "fp64": -1022}
# The draws: (format, log2 of the scale, spread). The first five are the usual values; the others sit low
# enough that subnormal factors (fp8, fp16) and products below 2^-126 (bf16, fp32: the -126 floor of the
# alignment) are common.
DRAWS = [("fp8_e4m3", 0, 2.0), ("fp8_e5m2", 0, 2.0), ("bf16", 0, 6.0), ("fp16", 0, 2.0), ("fp32", 0, 6.0),
         ("fp8_e4m3", -6, 2.0), ("fp8_e5m2", -14, 3.0), ("fp16", -14, 3.0), ("bf16", -64, 6.0),
         ("fp32", -66, 6.0)]


def draw_as(rng, shape, name, scale, spread):
    return draw(rng, shape, DTYPES[name], spread) if scale == 0 else \
        (draw(rng, shape, np.float64, spread) * 2.0**scale).astype(DTYPES[name]).astype(np.float64)


@pytest.mark.parametrize("backend", acc.BACKENDS)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("k", [1, 3, 17, 33, 129])
def test_bit_for_bit_against_fractions(model, k, backend):
    rng = np.random.default_rng(k * 7919 + MODELS.index(model))
    for name, scale, spread in DRAWS:  # wide exponents: alignment shifts of many bits
        a, b = draw_as(rng, (2, k), name, scale, spread), draw_as(rng, (k, 3), name, scale, spread)
        got = acc.parse(model).matmul(a, b, backend=backend, dtype=name)
        assert got.dtype == np.float32
        emins = (EMINS[name], EMINS[name])
        want = np.array([[emulate(model, [Fraction(v) for v in a[i]], [Fraction(v) for v in b[:, j]], emins)
                          for j in range(3)] for i in range(2)], dtype=np.float32)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, scale, got, want)


@pytest.mark.parametrize("model", MODELS + ["fp32-pairwise:order=reverse", "exact:order=reverse", "promote:1"])
@pytest.mark.parametrize("k", [1, 5, 37, 70])
def test_accumulate_onto_a_running_value_bit_for_bit(model, k):
    """Accumulator.accumulate(c, A, B), the attention emulator's P.V step,
    against the docstring's semantics in rationals, c of both signs and of
    magnitudes near, above and below the products'."""
    rng = np.random.default_rng([k, 31, len(model)])
    # one format each side, as the attention emulator's P (e4m3) . V (bf16); then the draws' own
    for (na, sa, pa), (nb, sb, pb) in [(DRAWS[0], DRAWS[2]), (DRAWS[5], DRAWS[3])] + [(d, d) for d in DRAWS]:
        a, b = draw_as(rng, (2, k), na, sa, pa), draw_as(rng, (k, 3), nb, sb, pb)
        c = (rng.standard_normal((2, 3)) * np.array([[1.0, 2.0**12, 2.0**-12]]) * 2.0**max(sa, sb)).astype(np.float32)
        got = acc.parse(model).accumulate(c, a, b, a_dtype=na, b_dtype=nb)
        assert got.dtype == np.float32
        want = np.array([[to_f32(emulate_onto(model, Fraction(float(c[i, j])), [Fraction(v) for v in a[i]],
                                              [Fraction(v) for v in b[:, j]], (EMINS[na], EMINS[nb])))
                          for j in range(3)] for i in range(2)], dtype=np.float32)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (na, nb, got, want)
    zero = np.zeros((2, 3), np.float32)  # matmul is accumulate(+0, ...)
    assert np.array_equal(acc.parse(model).accumulate(zero, a, b).view(np.uint32),
                          acc.parse(model).matmul(a, b).view(np.uint32))


def test_cancellation_and_zeros():
    """Exact cancellation gives +0 in every model (IEEE's nearest); an all-zero group keeps c at +0."""
    a = np.array([[1.0, -1.0, 0.0, 0.0, 2.0**-9, -(2.0**-9)]])
    b = np.ones((6, 1))
    for model in MODELS:
        got = acc.parse(model).matmul(a, b)
        assert got.view(np.uint32)[0, 0] == 0, model


def test_a_zero_product_never_sets_the_groups_exponent():
    """MMA-Sim 2.1.1 gives a zero product the exponent -133 (its e_zero for an
    fp32 result), whatever the other factor: an instruction whose products are
    all zero leaves a tiny c as it is. The case the MMA-Sim run of issue 41
    found: e4m3, c = 0x02fd9c00 (3.7266e-37, exponent -122, 13 fractional
    bits) onto 0 x 448 products. Aligned at -126 + E(448) = -118 (the old
    convention) it came back 0x02fd8000; MMA-Sim gives 0x02fd9c00."""
    c = np.array([[0x02FD9C00]], np.uint32).view(np.float32)
    got = acc.parse("hopper-fp8").accumulate(c, np.zeros((1, 32)), np.full((32, 1), 448.0), "fp8_e4m3", "fp8_e4m3")
    assert got.view(np.uint32)[0, 0] == 0x02FD9C00


@pytest.mark.parametrize("model", ["hopper-fp8", "hopper-fp8:bits=26:group=16"])
@pytest.mark.parametrize("backend", acc.BACKENDS)
def test_zero_products_after_a_tiny_group_keep_it(model, backend):
    """The same class from +0, on both backends: the first group leaves
    c = 1.5 x 2^-122 (bf16 factors), the second holds only 0 x 2^120. At the
    old -126 + 120 = -6 the second group cut c to +0; at -133 it stays."""
    g = acc.parse(model).group
    a = [1.5 * 2.0**-61] + [0.0] * (2 * g - 1)
    b = [2.0**-61] + [1.0] * (g - 1) + [2.0**120] * g
    assert _one(model, a, b, "bf16", backend) == 1.5 * 2.0**-122


def test_floor_cuts_toward_minus_infinity():
    """Below the cut's unit u = 2^(e - B + 1) a term loses toward zero (trunc),
    to nearest (rne) or toward -inf (floor). B = 9, one group: e = 0, u = 2^-8,
    and the pair +-2^-9 is half a unit each: trunc drops both (0), rne rounds
    both to even (0), floor keeps -2^-9 as -2^-8, so an exact cancellation
    no longer cancels."""
    a = np.array([[1.0, -1.0, 2.0**-9, -(2.0**-9)]])
    b = np.ones((4, 1))
    got = {r: float(acc.parse(f"hopper-fp8:bits=9:rounding={r}").matmul(a, b)[0, 0]) for r in acc.ROUNDINGS}
    assert got == {"trunc": 0.0, "rne": 0.0, "floor": -(2.0**-8)}, got
    # positive terms: floor is trunc; a negative term floor cuts up in magnitude by one unit
    assert float(acc.parse("hopper-fp8:bits=9:rounding=floor").matmul(np.array([[1.0, -(2.0**-10) * 3]]),
                                                                      np.ones((2, 1)))[0, 0]) == 1.0 - 2.0**-8


def _one(model: str, a: list[float], b: list[float], dtype: str, backend: str) -> float:
    return float(acc.parse(model).matmul(np.array([a]), np.array(b)[:, None], backend=backend, dtype=dtype)[0, 0])


@pytest.mark.parametrize("backend", acc.BACKENDS)
def test_mma_sim_hopper_features_each_read_off_one_output(backend):
    """What MMA-Sim (arXiv 2511.10909) found in Hopper's FP8 fused dot-add,
    each on one crafted output, B = 14 (u = 2^(e - 13)):
    - a product aligns on its factors' exponents summed: 1.5 x 1.5 = 2.25
      aligns at 2^0 (not 2^1), so with -1.25 beside it the sum 1 + 2^-13
      keeps its last bit (align=value cuts at 2^-12 and loses it);
    - the step's result is cut to 14 bits: 1.75 + 0.5 + 2^-13 carries into
      2^1, where 14 bits end at 2^-12 (out=24 keeps the 2^-13);
    - a subnormal factor sits at its format's emin: e4m3's 2^-9 aligns at 2^-6,
      so with B = 10 the unit is 2^-15 and a 2^-18 product is cut away (at its
      value's exponent, -9, it would be kept);
    - a bf16 product 2^-140 with c = 0 aligns at c's -133 and is kept, but
      the result's 14 bits, counted from fp32's emin -126, end at 2^-139: +0;
      Hopper's bf16 width (B = 26) keeps it;
    - a zero term takes part at -133 (MMA-Sim 2.1.1's e_zero), below every
      other term: 0 x 2^120 does not raise the group's exponent, so 2^-30
      (1 + 2^-7) stays whole, as with align=value, which leaves it out."""
    assert _one("hopper-fp8", [1.5, 1.25, 2.0**-13], [1.5, -1.0, 1.0], "bf16", backend) == 1 + 2.0**-13
    assert _one("hopper-fp8:align=value", [1.5, 1.25, 2.0**-13], [1.5, -1.0, 1.0], "bf16", backend) == 1.0
    assert _one("hopper-fp8", [1.75, 0.5, 2.0**-13], [1.0, 1.0, 1.0], "bf16", backend) == 2.25
    assert _one("hopper-fp8:out=24", [1.75, 0.5, 2.0**-13], [1.0, 1.0, 1.0], "bf16", backend) == 2.25 + 2.0**-13
    assert _one("hopper-fp8:bits=10", [2.0**-9, 2.0**-9], [1.0, 2.0**-9], "fp8_e4m3", backend) == 2.0**-9
    assert _one("hopper-fp8:bits=10:align=value", [2.0**-9, 2.0**-9], [1.0, 2.0**-9], "fp8_e4m3",
                backend) == 2.0**-9 + 2.0**-18
    assert _one("hopper-fp8", [2.0**-70], [2.0**-70], "bf16", backend) == 0.0
    assert _one("hopper-fp8:bits=26:group=16", [2.0**-70], [2.0**-70], "bf16", backend) == 2.0**-140
    tiny = 2.0**-30 * (1 + 2.0**-7)
    assert _one("hopper-fp8:bits=26:group=16", [0.0, tiny], [2.0**120, 1.0], "bf16", backend) == tiny
    assert _one("hopper-fp8:bits=26:group=16:align=value", [0.0, tiny], [2.0**120, 1.0], "bf16", backend) == tiny


def test_hopper_fp8_outputs_carry_at_most_14_significant_bits():
    """Hopper's FP8 accumulator is "e8m13" in an fp32 register (MMA-Sim; the
    H200 check counts the same on torch._scaled_mm's outputs): every output's
    fp32 mantissa ends in ten zero bits; promote:N's CUDA-core additions of
    such values at other exponents widen most of them (measured 29 % still
    within 14 bits at K = 1024, eight chunks)."""
    a, b, _ = _fp8_problem(1024)
    fast = acc.parse("hopper-fp8").matmul(a, b, dtype="fp8_e4m3").view(np.uint32)
    assert np.all(fast & 0x3FF == 0)
    slow = acc.parse("promote:128").matmul(a, b, dtype="fp8_e4m3").view(np.uint32)
    assert np.mean(slow & 0x3FF == 0) < 0.5


def fsum_exact_f32(x: np.ndarray, y: np.ndarray) -> np.float32:
    """fp32 nearest of the exact dot product through math.fsum: the products of
    these inputs are exact doubles; fsum gives the nearest double s, fsum of
    the products and -s the sign of what s missed; s rounded to odd, then to
    fp32, is correctly rounded (53 >= 24 + 2)."""
    p = (x * y).tolist()
    s = math.fsum(p)
    rest = math.fsum(p + [-s])
    if rest != 0 and (np.float64(s).view(np.uint64) & 1) == 0:
        s = math.nextafter(s, math.copysign(math.inf, rest))
    return np.float32(s) + np.float32(0)


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "bf16", "fp32"])
def test_exact_against_fsum(dtype):
    rng = np.random.default_rng(5)
    spread = 2.0 if dtype == "fp8_e4m3" else 8.0  # e4m3 ends at 448: wider would overflow to NaN
    a, b = draw(rng, (8, 1000), DTYPES[dtype], spread), draw(rng, (1000, 8), DTYPES[dtype], spread)
    got = acc.parse("exact").matmul(a, b)
    want = np.array([[fsum_exact_f32(a[i], b[:, j]) for j in range(8)] for i in range(8)], dtype=np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("backend", acc.BACKENDS)
def test_exact_over_values_far_apart_ends_and_is_exact(backend):
    """Values 2^100 and more apart do not fold into fewer float64 levels (each
    extraction keeps ~50 bits below the largest): the exact model once looped
    on them forever; it sums what is left in rationals."""
    a = np.array([[1e30, 1e-30, 1.0, -1e-20, 3.0**-40]], dtype=np.float32).astype(np.float64)
    b = np.array([[1.0], [1.0], [2.0**-60], [1.0], [1.0]], dtype=np.float32).astype(np.float64)
    got = acc.parse("exact").matmul(a, b, backend=backend)
    assert got[0, 0] == fsum_exact_f32(a[0], b[:, 0]) == np.float32(1e30)
    c = np.array([[2.0**-70]], np.float32)
    tiny = np.array([[2.0**-120, -(2.0**-140), 2.0**-149]], np.float32).astype(np.float64)
    onto = acc.parse("exact").accumulate(c, tiny, np.ones((3, 1)))  # c far above three levels of products
    want = round_f32(Fraction(2) ** -70 + sum(map(Fraction, tiny[0].tolist()), Fraction(0)))
    assert Fraction(float(onto[0, 0])) == want


def test_parse_spellings():
    assert acc.parse("promote:128").interval == 128
    assert acc.parse("hopper-fp8:bits=13:group=16:rounding=rne").name == "hopper-fp8:bits=13:group=16:rounding=rne"
    assert acc.parse("hopper-fp8:bits=14:group=32").name == "hopper-fp8"
    assert [a.name for a in acc.parse_list("fp32, hopper-fp8,fp32")] == ["fp32", "hopper-fp8"]
    for bad in ("promote", "promote:0", "promote:x", "hopper-fp8:bits=0", "hopper-fp8:colour=red", "fp32:bits=3",
                "tensorcore", "hopper-fp8:rounding=up", "hopper-fp8:bits=52", "hopper-fp8:align=left",
                "hopper-fp8:out=25", "hopper-fp8:out=0", "fp32:out=8", "exact:align=value", ""):
        with pytest.raises(ValueError):
            acc.parse_list(bad) if bad == "" else acc.parse(bad)
    # hostile spellings: each a ValueError that says why, never an OverflowError or a C int that wraps
    for bad, said in (("hopper-fp8:group=1" + "0" * 400, "group must be below 2^31"),
                      ("hopper-fp8:bits=30:group=16777216", "would not sum exactly"),
                      ("hopper-fp8:bits=1:group=4294967296", "group must be below 2^31"),
                      ("promote:" + "9" * 30, "0 < N < 2^63"), ("promote:9223372036854775808", "0 < N < 2^63"),
                      ("hopper-fp8:bits=\u00b2", "bits must be a positive integer"),  # '²'.isdigit() is True
                      ("hopper-fp8:rounding=floor:rounding=rne", "rounding= is given twice"),
                      ("promote:8:bits=12:bits=12", "bits= is given twice")):
        with pytest.raises(ValueError, match=re.escape(said)):
            acc.parse(bad)
    assert acc.parse("promote:9223372036854775807").interval == 2**63 - 1  # the int64's largest: one chunk


def test_acc_bits_and_rounding_fill_the_fields_a_model_does_not_spell():
    got = acc.parse_list("hopper-fp8, promote:128:bits=12, exact, hopper-fp8:rounding=trunc", bits=10, rounding="rne")
    assert [a.name for a in got] == ["hopper-fp8:bits=10:rounding=rne", "promote:128:bits=12:rounding=rne", "exact",
                                     "hopper-fp8:bits=10"]
    assert [(a.bits, a.rounding) for a in got] == [(10, "rne"), (12, "rne"), (14, "trunc"), (10, "trunc")]
    assert acc.parse_list("promote:64", bits=14)[0].name == "promote:64"  # the default, left out of the name
    with pytest.raises(ValueError, match="--acc-bits"):
        acc.parse_list("exact,fp32", bits=10)
    with pytest.raises(ValueError, match="--acc-rounding"):
        acc.parse_list("fp32-pairwise", rounding="rne")


def test_fields_carry_every_parameter():
    assert acc.parse("promote:64:bits=12:group=16:rounding=rne:order=reverse").fields() == {
        "accumulator": "promote:64:bits=12:group=16:rounding=rne:order=reverse", "acc_kind": "promote",
        "acc_bits": 12, "acc_group": 16, "acc_rounding": "rne", "acc_interval": 64, "acc_order": "reverse",
        "acc_align": "product", "acc_out": 12}
    assert acc.parse("hopper-fp8:align=value:out=24").fields()["accumulator"] == "hopper-fp8:align=value:out=24"
    assert acc.parse("hopper-fp8:bits=30").fields()["acc_out"] == 24  # O = min(B, 24)
    assert acc.parse("hopper-fp8:out=14").name == "hopper-fp8"  # the default, spelled: one name for one model
    assert acc.parse("fp32").fields() == {"accumulator": "fp32", "acc_kind": "fp32", "acc_bits": None,
                                          "acc_group": None, "acc_rounding": None, "acc_interval": None,
                                          "acc_order": "forward", "acc_align": None, "acc_out": None}
    for m in MODELS:  # the spelling is the model: parsing it back gives the same fields
        assert acc.parse(acc.parse(m).fields()["accumulator"]) == acc.parse(m)


# The error's size. Setup fixed before running: A (64 x 4096) and B (4096 x 64)
# standard normal, cast to fp8 e4m3 by ml_dtypes, seed 0; the reference is
# float64 A @ B of those stored values (so only accumulation is measured);
# max_rel_error = max |c - ref| / max |ref| (docs/json.md). The published
# "maximum relative error near 2 % at K = 4096" (DeepSeek-V3) names neither the
# distribution nor the definition. hopper-fp8 is MMA-Sim's Hopper model, which
# its authors validated bit for bit on the hardware with randomised tests; it
# gives 0.29 % here, the same as this project's model before it (which aligned
# on the products' values and kept a full fp32 result: they differ in 15-25 %
# of the outputs, by an ulp of 14 bits, not in the error's size). The test
# holds the estimate the model itself makes: the largest entries (~224) carry
# ulp 2^(7 - 13) = 2^-6 and lose tens of ulps over 128 groups (a biased half
# ulp for each of the 4096 truncated products, partly cancelling by sign): 0.1 %
# to 1 % of max |ref|. The error depends on the products' signs more than on K:
# all-positive inputs, whose cuts all lose the same way, lose several percent
# (test_positive_products_lose_far_more). Read as DeepSeek-V3 words it
# ("sign-fill right shifting": two's-complement terms, so the cut is toward
# -inf, rounding=floor), the same problem loses 5.5 %; MMA-Sim found the cut
# toward zero, so floor stays a lab variant.


def _fp8_problem(k, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((64, k)).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    b = rng.standard_normal((k, 64)).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return a, b, a @ b


def _max_rel(model, a, b, ref):
    c = acc.parse(model).matmul(a, b, dtype="fp8_e4m3").astype(np.float64)
    return float(np.max(np.abs(c - ref)) / np.max(np.abs(ref)))


def test_hopper_fp8_error_at_k4096_and_promotion():
    a, b, ref = _fp8_problem(4096)
    fast = _max_rel("hopper-fp8", a, b, ref)
    assert 1e-3 <= fast <= 1e-2, fast
    assert _max_rel("promote:128", a, b, ref) * 10 <= fast
    assert _max_rel("hopper-fp8:rounding=rne", a, b, ref) < fast  # unbiased cuts lose less


@pytest.mark.xfail(strict=True, reason="measured 0.29 % with standard normal e4m3 inputs (the construction above, "
                   "fixed before running) under MMA-Sim's hardware-validated Hopper model (and 5.5 % under the "
                   "rounding=floor reading): the issue's 0.5-5 % band for the published 'near 2 %' does not hold "
                   "for zero-mean random inputs; test_hopper_fp8_error_at_k4096_and_promotion holds the model's "
                   "own estimate, test_positive_products_lose_far_more what the figure depends on")
def test_hopper_fp8_error_at_k4096_in_the_issues_band():
    """The issue's claim as written: K = 4096, FP8 e4m3, hopper-fp8, max relative error within 0.5-5 %."""
    a, b, ref = _fp8_problem(4096)
    assert 5e-3 <= _max_rel("hopper-fp8", a, b, ref) <= 5e-2


def test_floor_reading_brackets_the_published_figure():
    """Toward -inf every cut loses downward, so the error is biased and grows faster than toward zero: at K = 4096
    it lies above the published 2 % where trunc lies below it (measured 5.5 % and 0.29 %: not a reproduction, a
    bracket), promote:128 still cuts it 10x or more, and the mean error is negative (a drift, not noise)."""
    a, b, ref = _fp8_problem(4096)
    floor, trunc = _max_rel("hopper-fp8:rounding=floor", a, b, ref), _max_rel("hopper-fp8", a, b, ref)
    assert trunc < 0.02 < floor, (trunc, floor)
    assert _max_rel("promote:128:rounding=floor", a, b, ref) * 10 <= floor
    drift = acc.parse("hopper-fp8:rounding=floor").matmul(a, b).astype(np.float64) - ref
    assert np.mean(drift) < -0.5 * np.mean(np.abs(drift))  # nearly every output lands below its exact value


def test_positive_products_lose_far_more():
    """With every product positive (uniform [0, 1) inputs) each cut toward zero
    loses downward and nothing cancels, while the sum grows as K, not sqrt(K):
    the same K = 4096 loses 10x or more what zero-mean inputs lose, and stays
    within truncation's bound (each of the 4096 products loses less than one
    unit of 2^(e - 13) with e <= log2(max |ref|): under 4096 x 2^-13 = 50 %)."""
    rng = np.random.default_rng(0)
    a = rng.random((64, 4096)).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    b = rng.random((4096, 64)).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    positive = _max_rel("hopper-fp8", a, b, a @ b)
    assert positive >= 10 * _max_rel("hopper-fp8", *_fp8_problem(4096)), positive
    assert positive < 0.5


def test_error_grows_with_k_and_interval():
    errs = {k: _max_rel("hopper-fp8", *_fp8_problem(k)) for k in (256, 4096)}
    assert errs[256] * 2 < errs[4096], errs  # more groups, more cuts at a larger exponent
    a, b, ref = _fp8_problem(4096)
    by_n = [_max_rel(f"promote:{n}", a, b, ref) for n in (32, 1024)]
    assert by_n[0] < by_n[1], by_n


# ---------------------------------------------------------------------------
# tf32 --accumulator


def test_tf32_accumulator_section_json():
    from helpers import cli, json_glossary_problems, strict_json

    r = cli("tf32", "--accumulator", "hopper-fp8,promote:128,exact", "--dtypes", "fp8_e4m3,bf16",
            "--k", "256,4096", "--json")
    assert r.code == 0, r.err
    d = strict_json(r.out)
    assert json_glossary_problems(d) == []
    assert d["params"]["accumulators"] == ["hopper-fp8", "promote:128", "exact"]
    assert d["params"]["dtypes"] == ["fp8_e4m3", "bf16"] and d["params"]["k"] == [256, 4096]
    rows = {(x["dtype"], x["accumulator"], x["k"]): x for x in d["rows"]}
    assert len(rows) == 12 and all(x["section"] == "accumulator" and x["m"] == x["n"] == 64 for x in rows.values())
    fast, promoted = rows[("fp8_e4m3", "hopper-fp8", 4096)], rows[("fp8_e4m3", "promote:128", 4096)]
    assert 1e-3 <= fast["max_rel_error"] <= 1e-2  # the band of test_hopper_fp8_error_at_k4096_and_promotion
    assert promoted["max_rel_error"] * 10 <= fast["max_rel_error"]
    assert rows[("fp8_e4m3", "hopper-fp8", 256)]["max_rel_error"] < fast["max_rel_error"]
    assert rows[("bf16", "exact", 4096)]["max_rel_error"] <= 2.0**-24  # one rounding of each output


def test_tf32_accumulator_refuses_bad_options():  # (no torch import: tests/test_cli.py)
    from helpers import cli

    for args, word in ((["--accumulator", "tensorcore"], "unknown accumulator"),
                       (["--accumulator", "promote:0"], "promote"),
                       (["--accumulator", "fp32", "--dtypes", "fp7"], "--dtypes: unknown format"),
                       (["--k", "256,512"], "--k takes one value"),
                       (["--accumulator", "fp32", "--k", "x"], "--k"),
                       (["--accumulator", "fp32", "--k", "0"], "--k 0")):
        r = cli("tf32", *args)
        assert r.code == 2 and word in r.err and len(r.err.strip().splitlines()) == 1, (args, r.err)


# ---------------------------------------------------------------------------
# the library's implementation (backend="native", cuda/matmul_accumulator.cu)
# against the numpy one: two codes written from the docstring, bit for bit.

NATIVE_MODELS = MODELS + ["hopper-fp8:group=1", "hopper-fp8:bits=1", "hopper-fp8:bits=24:group=1000",
                          "hopper-fp8:bits=40:group=31:rounding=rne", "hopper-fp8:bits=1:rounding=floor",
                          "hopper-fp8:bits=40:group=31:rounding=floor", "promote:1", "promote:4097",
                          "promote:33:order=reverse:rounding=rne", "fp32-pairwise:order=reverse",
                          "exact:order=reverse"]


@pytest.mark.parametrize("model", NATIVE_MODELS)
@pytest.mark.parametrize("k", [1, 3, 17, 33, 129, 4097])
def test_native_matches_numpy_bit_for_bit(model, k):
    rng = np.random.default_rng([k, NATIVE_MODELS.index(model)])
    m = acc.parse(model)
    for name, dtype in DTYPES.items():
        spread = {"fp8_e4m3": 2.0, "fp8_e5m2": 4.0, "fp16": 4.0}.get(name, 30.0)  # fp32, bf16: shifts past 48 bits
        if m.kind == "exact":  # numpy's extraction takes a pass per ~50 bits of the products' range: keep it short
            spread = min(spread, 6.0)
        a, b = draw(rng, (3, k), dtype, spread), draw(rng, (k, 5), dtype, spread)
        if k > 3:
            a[0, : k // 2] = 0.0  # zero products: all-zero groups, and the sign of zero
            b[: k // 3, 1] = -b[: k // 3, 2]
        want = m.matmul(a, b)
        got = m.matmul(a, b, backend="native", dtype=name)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, got, want)


def test_native_at_the_edges_of_fp32():
    """Subnormal products (down to 2^-298, below fp32's range, where the fused
    groups' one rounding lands in fp32's subnormals or at 0), exact
    cancellation, and sums past fp32's largest value (inf in every model but
    exact's one rounding when it stays finite)."""
    tiny = np.float32(2.0**-149)
    cases = {
        "subnormal": (np.array([[tiny, -tiny, 2.0**-126, 3 * tiny]]), np.array([[tiny], [tiny], [2.0**-20], [0.5]])),
        "underflow": (np.array([[2.0**-100, -(2.0**-100), 2.0**-140]]), np.array([[2.0**-40], [2.0**-41], [1.0]])),
        "overflow": (np.full((1, 40), 2.0**126), np.full((40, 1), 4.0)),
        "cancel": (np.array([[3e38, 3e38, -3e38, -3e38, 1.0]], dtype=np.float32).astype(np.float64),
                   np.array([[1.0], [1.0], [1.0], [1.0], [2.0**-30]])),
    }
    for model in NATIVE_MODELS:
        m = acc.parse(model)
        for case, (a, b) in cases.items():
            with np.errstate(over="ignore", invalid="ignore"):
                want = m.matmul(a, b)
            got = m.matmul(a, b, backend="native")
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (model, case, got, want)


def test_native_kind_names_are_the_modules():
    from precisionlab import native

    assert tuple(native.accumulator_kinds()) == acc.KINDS
    assert tuple(native.accumulator_roundings()) == acc.ROUNDINGS
    assert tuple(native.accumulator_aligns()) == acc.ALIGNS
    assert acc.default_backend() == "native"


def _call_status(fn, *args):
    from precisionlab import native

    lib = native._load()
    return getattr(lib, fn)(*args), (lib.pl_last_error() or b"").decode()


def test_native_refuses_bad_arguments_with_a_message():
    import ctypes

    from precisionlab import native
    from precisionlab.catalog import formats

    fp32 = formats.get("fp32").code
    x = np.ones(64, np.float32)
    p = x.ctypes.data
    good = native.accumulator("promote", interval=8)

    def model(**change):
        a = native.accumulator("promote", interval=8)
        for key, v in change.items():
            setattr(a, key, v)
        return ctypes.byref(a)

    fn = "pl_matmul_acc_cpu"
    cases = [
        ((None, p, 2, 2, 2, fp32, ctypes.byref(good), p), native.NULL_POINTER, "a is NULL"),
        ((p, None, 2, 2, 2, fp32, ctypes.byref(good), p), native.NULL_POINTER, "b is NULL"),
        ((p, p, 2, 2, 2, fp32, None, p), native.NULL_POINTER, "acc is NULL"),
        ((p, p, 2, 2, 2, fp32, ctypes.byref(good), None), native.NULL_POINTER, "c is NULL"),
        ((p, p, 0, 2, 2, fp32, ctypes.byref(good), p), native.INVALID_ARGUMENT, "m, n, k must be > 0"),
        ((p, p, 2, 2, -1, fp32, ctypes.byref(good), p), native.INVALID_ARGUMENT, "m, n, k must be > 0"),
        ((p, p, 1 << 40, 2, 1 << 30, fp32, ctypes.byref(good), p), native.SIZE_OVERFLOW, "overflow"),
        ((p, p, 2, 2, 2, 99, ctypes.byref(good), p), native.INVALID_ARGUMENT, "unknown format 99"),
        ((p, p, 2, 2, 2, formats.get("fp64").code, ctypes.byref(good), p), native.UNSUPPORTED, "format fp64"),
        ((p, p, 2, 2, 2, fp32, model(kind=7), p), native.INVALID_ARGUMENT, "unknown accumulator kind 7"),
        ((p, p, 2, 2, 2, fp32, model(kind=-1), p), native.INVALID_ARGUMENT, "unknown accumulator kind -1"),
        ((p, p, 2, 2, 2, fp32, model(bits=0), p), native.INVALID_ARGUMENT, r"bits must be in \[1, 40\] \(got 0\)"),
        ((p, p, 2, 2, 2, fp32, model(bits=41), p), native.INVALID_ARGUMENT, r"bits must be in \[1, 40\]"),
        ((p, p, 2, 2, 2, fp32, model(bits=40, group=8192), p), native.INVALID_ARGUMENT, "below 2\\^53"),
        ((p, p, 2, 2, 2, fp32, model(group=0), p), native.INVALID_ARGUMENT, "group must be >= 1"),
        ((p, p, 2, 2, 2, fp32, model(rounding=3), p), native.INVALID_ARGUMENT, "unknown acc->rounding 3"),
        ((p, p, 2, 2, 2, fp32, model(interval=0), p), native.INVALID_ARGUMENT, "interval must be >= 1"),
        ((p, p, 2, 2, 2, fp32, model(order=2), p), native.INVALID_ARGUMENT, "order must be"),
        ((p, p, 2, 2, 2, fp32, model(align=2), p), native.INVALID_ARGUMENT, "unknown acc->align 2"),
        ((p, p, 2, 2, 2, fp32, model(out_bits=0), p), native.INVALID_ARGUMENT, r"out_bits must be in \[1, 24\]"),
        ((p, p, 2, 2, 2, fp32, model(out_bits=25), p), native.INVALID_ARGUMENT, r"out_bits must be in \[1, 24\]"),
    ]
    for args, status, said in cases:
        st, msg = _call_status(fn, *args)
        assert st == status and re.match(rf"{fn}: .*{said}", msg), (args, st, msg)
    # the fields a kind does not read are not checked: fp32 with bits = 0 runs
    st, msg = _call_status(fn, p, p, 2, 2, 2, fp32, ctypes.byref(native.accumulator("fp32", bits=0, group=0)), p)
    assert st == native.OK, msg


def test_native_refuses_values_outside_the_format():
    from precisionlab import native
    from precisionlab.catalog import formats
    from precisionlab.errors import UsageError

    a = np.ones((2, 3))
    a[1, 2] = 1.0 + 2.0**-10  # a bf16 has 8 significand bits: not a bf16 value
    with pytest.raises(UsageError, match=r"pl_matmul_acc_cpu: a\[5\] = 1.0009765\d* is not a bf16 value"):
        native.matmul_acc_cpu(a, np.ones((3, 2)), formats.get("bf16").code, native.accumulator("exact"))
    b = np.full((3, 2), 500.0)  # past e4m3's 448
    with pytest.raises(UsageError, match=r"b\[0\] = 500 is not a fp8_e4m3 value"):
        native.matmul_acc_cpu(np.ones((2, 3)), b, formats.get("fp8_e4m3").code, native.accumulator("fp32"))
    with pytest.raises(UsageError, match=r"a\[0\] = 1.125 is not a fp8_e5m2 value"):  # e5m2: 3 significand bits
        native.matmul_acc_cpu(np.full((1, 1), 1.125), np.ones((1, 1)), formats.get("fp8_e5m2").code,
                              native.accumulator("fp32"))


def test_promotion_takeaway_pairs_each_promote_with_its_own_unpromoted_model():
    """promote:N:rounding=floor is weighed against hopper-fp8:rounding=floor, not the default's trunc, and with
    no such twin in the sweep it says nothing."""
    from precisionlab.experiments.tf32 import accumulator_takeaways

    rows = [{"dtype": "fp8_e4m3", "accumulator": a, "k": k, "max_rel_error": v}
            for a, k, v in (("hopper-fp8", 4096, 3e-3), ("hopper-fp8:rounding=floor", 4096, 6e-2),
                            ("promote:128", 4096, 1.5e-4), ("promote:128:rounding=floor", 4096, 8e-4),
                            ("promote:64:bits=12", 4096, 1e-3))]
    said = [x for x in accumulator_takeaways(rows) if " at K=4096: " in x]
    assert said == [
        "fp8_e4m3 at K=4096: promote:128 cuts hopper-fp8's error 20x (3.00e-03 to 1.50e-04): each chunk starts "
        "from zero, so its 14 bits are spent at the chunk's size, and fp32 carries the total.",
        "fp8_e4m3 at K=4096: promote:128:rounding=floor cuts hopper-fp8:rounding=floor's error 75x (6.00e-02 to "
        "8.00e-04): each chunk starts from zero, so its 14 bits are spent at the chunk's size, and fp32 carries "
        "the total."], said
