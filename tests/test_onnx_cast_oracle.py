"""ONNX's Cast reference as an outside oracle for precisionlab's rounding to
fp8, fp6 and fp4 (issue 41, bullet 2).

The expected values are computed at test time by onnx's own reference
implementation (onnx.reference.ReferenceEvaluator running one Cast node,
FLOAT -> FLOAT8E4M3FN / FLOAT8E5M2 / FLOAT6E2M3 / FLOAT6E3M2 / FLOAT4E2M1),
with saturate=1 and saturate=0: the wheel ships no backend/test/data, and the
reference is what its case generator (onnx/backend/test/case/node/cast.py)
writes those files from. The inputs: every exact tie between adjacent values
of the target, one float32 step either side of each tie, every representable
value, the subnormals, values just past max (its tie with the next binade and
one step either side), far past max, float32's own max and smallest
subnormal, +-0, +-inf, NaN, and 20,000 random values spread log-uniformly
across the format's range, all with both signs.

What each mode is held against:
- saturate=0 (overflow -> NaN for e4m3fn, inf for e5m2): Format.round, the
  catalog's rounding, and the library's pl_round (native.round_to), its exact
  integer-arithmetic rounding.
- saturate=1 (overflow and +-inf -> +-max): numerics.flash_attention.cast,
  the saturating cast the attention emulator stores P and Q/K/V with; and the
  library's block-format element encode (cuda/blockscale.cu's mf_encode,
  saturating), driven through MX blocks of two elements whose first is
  2^emax_elem, which makes the block's scale 1 so the second element is
  encoded as itself (finite values below 2^(emax_elem + 1) only: a NaN or inf
  makes an MX block NaN, and a larger value moves the scale).
- fp6/fp4 have no inf or NaN; ONNX rounds them the same in both modes
  (saturating). Their finite values are held against Format.round and the
  library's encode as above. Non-finite inputs are left out on purpose:
  Format.round answers NaN for a value the format cannot hold, ONNX +-max for
  +-inf and -0 for NaN (ml_dtypes' cast), which is no rounding question.

- FLOAT8E8M0 (the MX scale type): ONNX's Cast with round_mode down / up
  against the library's FLOOR / CEIL block scales (see the test's comment).

Independence: onnx 1.23's reference casts with ml_dtypes (astype, and
np.clip before it when saturating), which Format.round also ends in, so the
Format.round comparisons check the catalog's float64 -> float32 -> format
path and its saturation, not ml_dtypes itself; pl_round and mf_encode are
integer arithmetic written here, owing ml_dtypes nothing. The fnuz variants
(FLOAT8E4M3FNUZ, FLOAT8E5M2FNUZ) are not formats precisionlab's catalog has,
so they are not compared.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnx.reference")

from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.native import blockscale
from precisionlab.numerics import flash_attention

FP8 = {"fp8_e4m3": "FLOAT8E4M3FN", "fp8_e5m2": "FLOAT8E5M2"}
NARROW = {"fp6_e2m3": "FLOAT6E2M3", "fp6_e3m2": "FLOAT6E3M2", "fp4_e2m1": "FLOAT4E2M1"}
# the MX block format whose elements are each catalog format
BLOCK_OF = {"fp8_e4m3": "mxfp8_e4m3", "fp8_e5m2": "mxfp8_e5m2", "fp6_e2m3": "mxfp6_e2m3",
            "fp6_e3m2": "mxfp6_e3m2", "fp4_e2m1": "mxfp4"}


def onnx_cast(x: np.ndarray, onnx_type: str, saturate: int, **attrs) -> np.ndarray:
    """ONNX's reference Cast of float32 values, back as float64."""
    if not hasattr(TensorProto, onnx_type):
        pytest.skip(f"onnx {onnx.__version__} has no {onnx_type}")
    to = getattr(TensorProto, onnx_type)
    node = helper.make_node("Cast", ["x"], ["y"], to=to, saturate=saturate, **attrs)
    graph = helper.make_graph([node], "cast", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", to, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx.defs.onnx_opset_version())])
    y = ReferenceEvaluator(model).run(None, {"x": np.asarray(x, np.float32)})[0]
    return np.asarray(y).astype(np.float64)


def grid(fmt) -> np.ndarray:
    """Every finite non-negative value of the format, from its catalog facts
    (precision p, emin, max), in increasing order."""
    p, q_min = fmt.precision, fmt.emin - fmt.precision + 1
    subnormals = [k * 2.0 ** q_min for k in range(2 ** (p - 1))]
    normals = [(2 ** (p - 1) + k) * 2.0 ** (e - p + 1) for e in range(fmt.emin, fmt.emax + 1)
               for k in range(2 ** (p - 1))]
    return np.array([v for v in subnormals + normals if v <= fmt.max])


def inputs(fmt, seed: int) -> np.ndarray:
    """The float32 inputs described in the module's docstring, both signs."""
    g = grid(fmt)
    ties = (g[:-1] + g[1:]) / 2  # exact in float32: p + 1 <= 5 significand bits
    top = g[-1] - g[-2]          # the spacing at max: max's tie with the next binade is max + top / 2
    past = np.array([fmt.max + top / 2, fmt.max + top, 2 * fmt.max, 1e30, np.finfo(np.float32).max])
    specials = np.array([0.0, 2.0 ** -149, np.inf, np.nan, 2.0 ** (fmt.emin - fmt.precision)])
    rng = np.random.default_rng(seed)
    lo, hi = fmt.emin - fmt.precision - 2, np.log2(2 * fmt.max)
    rand = np.exp2(rng.uniform(lo, hi, 20_000))
    mags = np.concatenate([g, ties, past, specials, rand]).astype(np.float32)
    with np.errstate(over="ignore"):  # float32 max steps up to inf: kept out below
        steps = np.concatenate([np.nextafter(mags, np.float32(0)), np.nextafter(mags, np.float32(np.inf))])
    mags = np.concatenate([mags, steps[np.isfinite(steps)]])
    return np.concatenate([mags, -mags])


def mismatches(x: np.ndarray, want: np.ndarray, got: np.ndarray) -> list[str]:
    """Where two results differ: value, NaN-ness, or the sign of a zero.
    NaN is matched by NaN-ness alone (two NaNs are not compared as values)."""
    nan_w, nan_g = np.isnan(want), np.isnan(got)
    with np.errstate(invalid="ignore"):
        bad = (nan_w != nan_g) | (~nan_w & ~nan_g & ((want != got) | (np.signbit(want) != np.signbit(got))))
    idx = np.flatnonzero(bad)
    return [f"x={float(x[i])!r}: onnx {want[i]!r}, precisionlab {got[i]!r}" for i in idx[:8]] + (
        [f"... {idx.size} in all of {x.size}"] if idx.size else [])


def unit_scale_encode(x: np.ndarray, name: str) -> np.ndarray:
    """The library's saturating element encode of finite |x| < 2^(emax + 1):
    MX blocks [2^emax, x] have amax in [2^emax, 2^(emax + 1)), so the FLOOR
    rule's scale is 2^0 and each x is encoded as itself."""
    fmt = BLOCK_OF[name]
    emax = blockscale.block_formats()[fmt].element.emax
    pairs = np.stack([np.full(x.size, 2.0 ** emax, np.float32), x.astype(np.float32)], axis=1).ravel()
    q = blockscale.blockscale_quantize_cpu(pairs, fmt, "floor", block=2)
    assert (q.scales == 127).all(), "a block's scale moved off 2^0: the test's inputs are wrong"
    return blockscale.blockscale_dequantize_cpu(q).astype(np.float64)[1::2]


def encodable(x: np.ndarray, name: str) -> np.ndarray:
    emax = blockscale.block_formats()[BLOCK_OF[name]].element.emax
    return np.isfinite(x) & (np.abs(x) < 2.0 ** (emax + 1))


@pytest.mark.parametrize("name", list(FP8))
def test_fp8_non_saturating_is_onnx_saturate_0(name):
    fmt = formats.get(name)
    x = inputs(fmt, seed=1)
    want = onnx_cast(x, FP8[name], saturate=0)
    far = np.isfinite(x) & (np.abs(x) >= 2 * fmt.max)
    overflow = np.isnan(want[far]) if name == "fp8_e4m3" else np.isinf(want[far])
    assert far.any() and overflow.all()  # the mode is the one the docstring says
    assert mismatches(x, want, fmt.round(x.astype(np.float64))) == []
    assert mismatches(x, want, native.round_to(x.astype(np.float64), fmt.code)) == []


@pytest.mark.parametrize("name", list(FP8))
def test_fp8_saturating_is_onnx_saturate_1(name):
    fmt = formats.get(name)
    x = inputs(fmt, seed=2)
    want = onnx_cast(x, FP8[name], saturate=1)
    assert np.nanmax(np.abs(want)) == fmt.max and not np.isinf(want).any()
    got, clamped = flash_attention.cast(x.astype(np.float64), name)
    assert mismatches(x, want, got) == []
    assert clamped == int(np.count_nonzero(np.abs(x) > fmt.max))
    ok = encodable(x, name)
    assert ok.sum() > 20_000  # the library's encode sees most of the inputs
    assert mismatches(x[ok], want[ok], unit_scale_encode(x[ok], name)) == []


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("name", list(NARROW))
def test_fp6_fp4_are_onnx_cast(name, saturate):
    fmt = formats.get(name)
    x = inputs(fmt, seed=3)
    x = x[np.isfinite(x)]
    want = onnx_cast(x, NARROW[name], saturate=saturate)
    assert mismatches(x, want, fmt.round(x.astype(np.float64))) == []
    ok = encodable(x, name)
    assert mismatches(x[ok], want[ok], unit_scale_encode(x[ok], name)) == []


def test_the_inputs_hold_the_corner_cases():
    """The generator really makes ties, past-max values and subnormals (a
    grid bug would otherwise make every comparison above vacuous)."""
    fmt = formats.get("fp8_e4m3")
    x = inputs(fmt, seed=1).astype(np.float64)
    for v in (464.0, 448.0 + 32.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 1.0625, -0.0):
        assert v in x or (v == -0.0 and (np.signbit(x) & (x == 0)).any())
    assert np.isnan(x).any() and np.isposinf(x).any() and np.isneginf(x).any()


# ONNX's FLOAT8E8M0 Cast (numpy_helper.to_float8e8m0: its own bit arithmetic
# on the float32 exponent, no ml_dtypes rounding) against the MX scale rules:
# FLOOR's scale is amax / 2^emax_elem cast with round_mode="down", CEIL's with
# round_mode="up" (OCP v1.0's X = 2^(floor(log2 amax) - emax_elem), and its
# ceil variant). amax / 2^emax_elem is exact in float32 while it is normal,
# which the inputs keep to: for a subnormal ONNX's "up" reads the exponent
# field 0 as 2^-127 and steps to 2^-126 (2^-149 -> 2^-126), where the smallest
# e8m0 value at or above it is 2^-127: no rounding question of the library's.
E8M0_MODE = {"floor": "down", "ceil": "up"}


@pytest.mark.parametrize("rule", list(E8M0_MODE))
@pytest.mark.parametrize("fmt", sorted(set(BLOCK_OF.values())))
def test_mx_scale_is_onnx_e8m0_cast(fmt, rule):
    emax = blockscale.block_formats()[fmt].element.emax
    rng = np.random.default_rng(4)
    lo, hi = -126 + emax, 127  # amax / 2^emax stays a normal float32
    powers = np.exp2(np.arange(lo, hi + 1, dtype=np.float64)).astype(np.float32)
    amax = np.concatenate([
        powers, np.nextafter(powers, np.float32(0)), np.nextafter(powers, np.float32(np.inf)),
        np.exp2(rng.uniform(lo, hi + 1, 5_000)).astype(np.float32), [0.0, np.finfo(np.float32).max]])
    amax = amax[np.isfinite(amax) & ((amax == 0) | (amax >= 2.0 ** lo))].astype(np.float32)
    ratio = (amax.astype(np.float64) * 2.0 ** -emax).astype(np.float32)  # exact: a power-of-two step, normal
    assert np.array_equal(ratio.astype(np.float64) * 2.0 ** emax, amax.astype(np.float64))
    want = onnx_cast(ratio, "FLOAT8E8M0", 1, round_mode=E8M0_MODE[rule])
    want_codes = np.log2(want) + 127  # e8m0's value 2^(code - 127); it holds no zero (code 0 is 2^-127)
    q = blockscale.blockscale_quantize_cpu(amax, fmt, rule, block=1)  # one element a block: its |x| is amax
    bad = np.flatnonzero(q.scales != want_codes)
    assert bad.size == 0, [(float(amax[i]), int(q.scales[i]), float(want_codes[i])) for i in bad[:5]]
