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


def emu_limited(prods: list[Fraction], c: Fraction, bits: int, group: int, rounding: str) -> Fraction:
    for g0 in range(0, len(prods), group):
        terms = [c] + prods[g0:g0 + group]
        nz = [t for t in terms if t != 0]
        if not nz:
            c = Fraction(0)
            continue
        u = Fraction(2) ** (max(floor_log2(t) for t in nz) - bits + 1)
        # int(): toward zero; round(): Fraction's nearest, ties to even; math.floor(): toward -inf
        cut = [{"trunc": int, "rne": round, "floor": math.floor}[rounding](t / u) * u for t in terms]
        c = round_f32(sum(cut, Fraction(0)))
    return c


def emulate(model: str, x: list[Fraction], y: list[Fraction]) -> np.float32:
    a = acc.parse(model)  # the spelling only: its fields say which semantics to follow
    if a.order == "reverse":
        x, y = x[::-1], y[::-1]
    prods = [xi * yi for xi, yi in zip(x, y)]
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
        return to_f32(emu_limited(prods, Fraction(0), a.bits, a.group, a.rounding))
    c = Fraction(0)
    for k0 in range(0, len(prods), a.interval):
        chunk = emu_limited(prods[k0:k0 + a.interval], Fraction(0), a.bits, a.group, a.rounding)
        c = round_f32(c + chunk)
    return to_f32(c)


def emulate_onto(model: str, c: Fraction, x: list[Fraction], y: list[Fraction]) -> Fraction:
    """c + x.y under the model, c an fp32 value (the docstring's "Accumulating
    onto a running value"), step by step in rationals."""
    a = acc.parse(model)
    if a.order == "reverse":
        x, y = x[::-1], y[::-1]
    prods = [xi * yi for xi, yi in zip(x, y)]
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
        return emu_limited(prods, c, a.bits, a.group, a.rounding)
    for k0 in range(0, len(prods), a.interval):  # promote: each chunk from 0, added to c chunk after chunk
        c = round_f32(c + emu_limited(prods[k0:k0 + a.interval], Fraction(0), a.bits, a.group, a.rounding))
    return c


def draw(rng, shape, dtype, spread=0.0):
    x = rng.standard_normal(shape) * np.exp2(rng.uniform(-spread, spread, shape))
    return x.astype(dtype).astype(np.float64)


MODELS = ["exact", "fp32", "fp32:order=reverse", "fp32-pairwise", "hopper-fp8", "hopper-fp8:rounding=rne",
          "hopper-fp8:rounding=floor", "hopper-fp8:bits=10:group=4", "hopper-fp8:bits=20:group=7:order=reverse",
          "hopper-fp8:bits=11:group=5:rounding=floor", "promote:128", "promote:16", "promote:5:group=4:bits=12",
          "promote:40:rounding=rne", "promote:24:group=8:rounding=floor"]
DTYPES = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2, "bf16": ml_dtypes.bfloat16,
          "fp16": np.float16, "fp32": np.float32}


@pytest.mark.parametrize("backend", acc.BACKENDS)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("k", [1, 3, 17, 33, 129])
def test_bit_for_bit_against_fractions(model, k, backend):
    rng = np.random.default_rng(k * 7919 + MODELS.index(model))
    for name, dtype in DTYPES.items():
        spread = 6.0 if name in ("bf16", "fp32") else 2.0  # wide exponents: alignment shifts of many bits
        a, b = draw(rng, (2, k), dtype, spread), draw(rng, (k, 3), dtype, spread)
        got = acc.parse(model).matmul(a, b, backend=backend, dtype=name)
        assert got.dtype == np.float32
        want = np.array([[emulate(model, [Fraction(v) for v in a[i]], [Fraction(v) for v in b[:, j]])
                          for j in range(3)] for i in range(2)], dtype=np.float32)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, got, want)


@pytest.mark.parametrize("model", MODELS + ["fp32-pairwise:order=reverse", "exact:order=reverse", "promote:1"])
@pytest.mark.parametrize("k", [1, 5, 37, 70])
def test_accumulate_onto_a_running_value_bit_for_bit(model, k):
    """Accumulator.accumulate(c, A, B), the attention emulator's P.V step,
    against the docstring's semantics in rationals, c of both signs and of
    magnitudes near, above and below the products'."""
    rng = np.random.default_rng([k, 31, len(model)])
    for name, dtype in DTYPES.items():
        spread = 6.0 if name in ("bf16", "fp32") else 2.0
        a, b = draw(rng, (2, k), dtype, spread), draw(rng, (k, 3), dtype, spread)
        c = (rng.standard_normal((2, 3)) * np.array([[1.0, 2.0**12, 2.0**-12]])).astype(np.float32)
        got = acc.parse(model).accumulate(c, a, b)
        assert got.dtype == np.float32
        want = np.array([[to_f32(emulate_onto(model, Fraction(float(c[i, j])), [Fraction(v) for v in a[i]],
                                              [Fraction(v) for v in b[:, j]])) for j in range(3)] for i in range(2)],
                        dtype=np.float32)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, got, want)
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
                "tensorcore", "hopper-fp8:rounding=up", "hopper-fp8:bits=52", ""):
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
        "acc_bits": 12, "acc_group": 16, "acc_rounding": "rne", "acc_interval": 64, "acc_order": "reverse"}
    assert acc.parse("fp32").fields() == {"accumulator": "fp32", "acc_kind": "fp32", "acc_bits": None,
                                          "acc_group": None, "acc_rounding": None, "acc_interval": None,
                                          "acc_order": "forward"}
    for m in MODELS:  # the spelling is the model: parsing it back gives the same fields
        assert acc.parse(acc.parse(m).fields()["accumulator"]) == acc.parse(m)


# The error's size. Setup fixed before running: A (64 x 4096) and B (4096 x 64)
# standard normal, cast to fp8 e4m3 by ml_dtypes, seed 0; the reference is
# float64 A @ B of those stored values (so only accumulation is measured);
# max_rel_error = max |c - ref| / max |ref| (docs/json.md). The published
# "maximum relative error near 2 % at K = 4096" (DeepSeek-V3) names neither the
# distribution nor the definition; this faithful 14-bit model, cutting toward
# zero, gives 0.29 % here (and 6.6 % for all-positive uniform [0, 1) inputs,
# where every cut loses toward zero), so the test holds the estimate the model
# itself makes: the largest entries (~224) carry ulp 2^(7 - 13) = 2^-6 and lose
# tens of ulps over 128 groups (a biased half ulp for each of the 4096
# truncated products, partly cancelling by sign): 0.1 % to 1 % of max |ref|.
# Read as DeepSeek-V3 words it ("sign-fill right shifting": two's-complement
# terms, so the cut is toward -inf, rounding=floor), the same problem loses
# 5.5 %: every cut loses downward, nothing cancels. Measured, not chosen
# before: the published figure lies between the two readings, and which one
# Hopper does is scaled_mm_check.py's fit on an H200 (both are candidates).


def _fp8_problem(k, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((64, k)).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    b = rng.standard_normal((k, 64)).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return a, b, a @ b


def _max_rel(model, a, b, ref):
    c = acc.parse(model).matmul(a, b).astype(np.float64)
    return float(np.max(np.abs(c - ref)) / np.max(np.abs(ref)))


def test_hopper_fp8_error_at_k4096_and_promotion():
    a, b, ref = _fp8_problem(4096)
    fast = _max_rel("hopper-fp8", a, b, ref)
    assert 1e-3 <= fast <= 1e-2, fast
    assert _max_rel("promote:128", a, b, ref) * 10 <= fast
    assert _max_rel("hopper-fp8:rounding=rne", a, b, ref) < fast  # unbiased cuts lose less


@pytest.mark.xfail(strict=True, reason="measured 0.29 % (cut toward zero, the default) and 5.5 % (rounding=floor) "
                   "with standard normal e4m3 inputs (the construction above, fixed before running): the issue's "
                   "0.5-5 % band for the published 'near 2 %' holds for neither reading of truncation; "
                   "test_hopper_fp8_error_at_k4096_and_promotion holds the model's own estimate, "
                   "test_floor_reading_brackets_the_published_figure the other")
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
