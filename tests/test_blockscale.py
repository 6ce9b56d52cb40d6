"""The block-scaled quantize/dequantize kernels (cuda/blockscale.cu), host and
GPU, bit for bit against an independent step-by-step emulation built on
ml_dtypes' element casts: every code of every element format, every e8m0
code, ties, random data over fp32's whole range, partial blocks, NaN, inf and
zero blocks. The emulation below derives each scale rule from its textbook
statement (float64 log2 facts, a search for RCEIL), not from the kernel's bit
tricks."""

import math

import ml_dtypes
import numpy as np
import pytest

from precisionlab import native
from precisionlab.errors import UsageError

ELEMENT_DTYPES = {"fp4_e2m1": ml_dtypes.float4_e2m1fn, "fp6_e2m3": ml_dtypes.float6_e2m3fn,
                  "fp6_e3m2": ml_dtypes.float6_e3m2fn, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
                  "fp8_e5m2": ml_dtypes.float8_e5m2}
MX = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]
MX_RULES = ["floor", "rceil", "ceil", "even"]


# ---------------------------------------------------------------------------
# the independent emulation


def _elem(fmt: str):
    return ELEMENT_DTYPES[native.block_formats()[fmt].element.name]


def _elem_values(dtype) -> np.ndarray:
    """Every code of an element format and its value (ml_dtypes' decode)."""
    bits = ml_dtypes.finfo(dtype).bits
    codes = np.arange(2 ** bits, dtype=np.uint8)
    return codes, codes.view(dtype).astype(np.float64)


def emu_scale_exp(amax: float, dtype, rule: str) -> int:
    fi = ml_dtypes.finfo(dtype)
    emax, top, mbits = int(fi.maxexp) - 1, float(fi.max), int(fi.nmant)
    m, e = math.frexp(amax)  # amax = m 2^e, m in [0.5, 1)
    E, sig = e - 1, 2 * m    # amax = sig 2^E, sig in [1, 2)
    if rule == "floor":
        x = E - emax
    elif rule == "ceil":
        x = (E + (sig != 1.0)) - emax  # ceil(log2 amax): E unless amax is an exact power of two
    elif rule == "even":
        rounded = math.floor(sig * 2 ** mbits + 0.5) / 2 ** mbits  # amax's significand to the element's bits, half up
        x = E + (rounded >= 2.0) - emax
    else:  # rceil: the smallest power of two X with amax / X <= max
        x = E - emax - 3
        while amax > math.ldexp(top, x):
            x += 1
    return min(max(x, -127), 127)


def emu_quantize(x: np.ndarray, fmt: str, rule: str, block: int):
    x = np.asarray(x, np.float32)
    f = native.block_formats()[fmt]
    dtype = _elem(fmt)
    top = float(ml_dtypes.finfo(dtype).max)
    n = x.size
    nb = -(-n // block)
    codes = np.zeros(n, np.uint8)
    scales = np.zeros(nb, np.uint8)
    tensor_scale = np.float32(1.0)
    if f.name == "nvfp4":
        amax_t = np.float32(np.max(np.abs(x)))
        g_enc = np.float32(1.0)
        if np.isfinite(amax_t) and amax_t > 0:
            with np.errstate(over="ignore"):
                g_enc = np.float32(np.float32(2688.0) / amax_t)
            g_enc = min(g_enc, np.float32(np.finfo(np.float32).max))
        tensor_scale = np.float32(np.float32(1.0) / g_enc)
    for b in range(nb):
        v = x[b * block:(b + 1) * block]
        with np.errstate(invalid="ignore"):
            amax = np.float32(np.max(np.abs(v)))
        if not np.isfinite(amax):
            scales[b] = 0x7F if f.name == "nvfp4" else 0xFF
            continue
        if f.name == "nvfp4":
            with np.errstate(over="ignore"):
                t = np.float32(np.float32(amax / np.float32(6.0)) * g_enc)
            s8 = np.array([min(t, 448.0)], np.float32).astype(ml_dtypes.float8_e4m3fn)
            scales[b] = s8.view(np.uint8)[0]
            s = np.float32(s8.astype(np.float32)[0])
            enc = np.float32(0.0) if s == 0 else np.float32(g_enc / s)
            with np.errstate(over="ignore"):
                p = (v * enc).astype(np.float32)
            q = np.clip(p, -top, top).astype(dtype)
        else:
            e = -127 if amax == 0 else emu_scale_exp(float(amax), dtype, rule)
            scales[b] = e + 127
            q = np.clip(v.astype(np.float64) / 2.0 ** e, -top, top).astype(np.float32).astype(dtype)
        codes[b * block:(b + 1) * block] = q.view(np.uint8)
    return codes, scales, float(tensor_scale)


def emu_dequantize(codes, scales, tensor_scale, fmt: str, block: int) -> np.ndarray:
    dtype = _elem(fmt)
    p = codes.view(dtype).astype(np.float64)
    sc = np.repeat(scales, block)[: codes.size]
    if fmt == "nvfp4":
        s = sc.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        return ((p.astype(np.float32) * s).astype(np.float32) * np.float32(tensor_scale)).astype(np.float32)
    x = sc.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)  # 2^(k - 127), NaN for 255
    with np.errstate(over="ignore"):
        return (p * x).astype(np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def check(x, fmt, rule, block):
    q = native.blockscale_quantize_cpu(x, fmt, rule, block)
    codes, scales, ts = emu_quantize(np.asarray(x, np.float32), fmt, rule, block)
    bad = np.flatnonzero(q.codes != codes)
    assert bad.size == 0, (f"{fmt}/{rule}/{block}: {bad.size} codes differ, first at {bad[0]}: "
                           f"x={np.asarray(x, np.float32)[bad[0]]!r} got {q.codes[bad[0]]:#x} want {codes[bad[0]]:#x} "
                           f"scale got {q.scales[bad[0] // block]} want {scales[bad[0] // block]}")
    assert np.array_equal(q.scales, scales), f"{fmt}/{rule}/{block}: scales differ"
    assert np.float32(q.tensor_scale) == np.float32(ts)
    y = native.blockscale_dequantize_cpu(q)
    assert same_bits(y, emu_dequantize(codes, scales, ts, fmt, block))
    return q, y


def rules_of(fmt):
    return ["nearest"] if fmt == "nvfp4" else MX_RULES


ALL = [(f, r) for f in MX + ["nvfp4"] for r in rules_of(f)]


# ---------------------------------------------------------------------------
# the catalog


def test_catalog_agrees_with_ml_dtypes():
    mfs = native.minifloats()
    for name, dtype in {**ELEMENT_DTYPES, "e8m0": ml_dtypes.float8_e8m0fnu}.items():
        fi, m = ml_dtypes.finfo(dtype), mfs[name]
        assert m.bits == fi.bits and m.mbits == fi.nmant, name  # bits, not bytes: fp4 is 4
        assert m.max == float(fi.max) and m.emax == fi.maxexp - 1, name
        assert m.emin == fi.minexp and m.min_subnormal == float(fi.smallest_subnormal), name
    assert mfs["fp4_e2m1"].bits == 4 and mfs["fp6_e3m2"].bits == 6
    bf = native.block_formats()
    assert [(f.element.name, f.block, f.scale.name) for f in bf.values()] == [
        ("fp8_e4m3", 32, "e8m0"), ("fp8_e5m2", 32, "e8m0"), ("fp6_e2m3", 32, "e8m0"), ("fp6_e3m2", 32, "e8m0"),
        ("fp4_e2m1", 32, "e8m0"), ("fp4_e2m1", 16, "fp8_e4m3")]
    assert bf["nvfp4"].tensor_scale_bits == 32 and bf["mxfp4"].bits_per_element == 4.25
    assert list(native.scale_rules()) == ["floor", "rceil", "ceil", "even", "nearest"]


# ---------------------------------------------------------------------------
# every code


@pytest.mark.parametrize("fmt", MX)
def test_every_element_code_round_trips(fmt):
    """A block holding every finite code's value and max_elem: FLOOR's scale is
    2^0, so each code must come back as itself, and dequantize to its value."""
    codes, values = _elem_values(_elem(fmt))
    finite = np.isfinite(values)
    x = np.concatenate([values[finite], [float(ml_dtypes.finfo(_elem(fmt)).max)]]).astype(np.float32)
    q, y = check(x, fmt, "floor", x.size)
    assert q.scales[0] == 127
    assert np.array_equal(q.codes[:-1], codes[finite])  # -0 keeps its sign code
    assert same_bits(y[:-1], values[finite].astype(np.float32))


@pytest.mark.parametrize("fmt", MX)
def test_every_tie_and_neighbour_rounds_as_ml_dtypes(fmt):
    """Midpoints between adjacent values (ties to even), a hair either side of
    them, and values past max (saturation)."""
    _, values = _elem_values(_elem(fmt))
    v = np.unique(values[np.isfinite(values) & (values >= 0)])
    mids = (v[:-1] + v[1:]) / 2
    top = v[-1]
    x = np.concatenate([mids, np.nextafter(mids.astype(np.float32), np.float32(0)),
                        np.nextafter(mids.astype(np.float32), np.float32(np.inf)), [top * 1.01, top * 1.25, top]])
    x = np.concatenate([x, -x]).astype(np.float32)
    for block in (x.size, 7):
        check(x, fmt, "floor", block)


@pytest.mark.parametrize("fmt", MX)
def test_every_e8m0_code(fmt):
    """Quantize: a block whose amax is 2^(k - 127 + emax_elem) gets scale code k
    under FLOOR, for every k an fp32 amax reaches (codes past 254 - emax_elem
    need amax >= 2^128: no fp32 block has a scale there). Dequantize: every scale code 0..255
    (255: NaN) times a few element codes, against ml_dtypes' e8m0 decode."""
    emax = native.block_formats()[fmt].element.emax
    ks = [k for k in range(255) if -149 <= k - 127 + emax <= 127]
    assert ks == list(range(255 - emax))
    for k in ks:
        x = np.array([2.0 ** (k - 127 + emax), 1e-45, -0.0], np.float32)
        q, _ = check(x, fmt, "floor", 3)
        assert q.scales[0] == k
    codes, values = _elem_values(_elem(fmt))
    pick = codes[np.isfinite(values)][[0, 1, 2, -1]]
    for k in range(256):
        q = native.BlockScaled(native.block_formats()[fmt], 1, "floor", pick.copy(), np.full(pick.size, k, np.uint8),
                               1.0)
        assert same_bits(native.blockscale_dequantize_cpu(q), emu_dequantize(pick, q.scales, 1.0, fmt, 1))


def test_every_e4m3_scale_code_of_nvfp4_dequantizes():
    codes = np.arange(16, dtype=np.uint8)
    for k in range(256):
        q = native.BlockScaled(native.block_formats()["nvfp4"], 16, "nearest", codes, np.array([k], np.uint8),
                               0.37109375)
        assert same_bits(native.blockscale_dequantize_cpu(q), emu_dequantize(codes, q.scales, 0.37109375, "nvfp4", 16))


# ---------------------------------------------------------------------------
# random data, odd sizes, special blocks


def _wide_fp32(rng, n):
    """Finite fp32 values across the whole range: random bit patterns, subnormals included."""
    b = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    x = b.view(np.float32)
    return np.where(np.isfinite(x), x, np.float32(1.0))


@pytest.mark.parametrize("fmt, rule", ALL)
def test_random_data_and_partial_blocks_match_the_emulation(fmt, rule):
    rng = np.random.default_rng(sum(map(ord, fmt + rule)))
    for n, block in [(1, 32), (31, 32), (33, 32), (1000, 16), (4097, 32), (77, 17), (50, 1), (3000, 1024)]:
        check(rng.standard_normal(n).astype(np.float32), fmt, rule, block)
        check((rng.standard_t(2, n) * 2.0 ** rng.integers(-20, 20)).astype(np.float32), fmt, rule, block)
    check(_wide_fp32(rng, 5003), fmt, rule, 32)
    check(_wide_fp32(rng, 999) * np.float32(2.0 ** -100), fmt, rule, 16)  # deep subnormals: the -127 clamp


def test_partial_block_is_scaled_by_its_own_elements():
    x = np.concatenate([np.full(32, 1000.0), [3.0]]).astype(np.float32)
    q = native.blockscale_quantize_cpu(x, "mxfp4", "floor", 32)
    assert q.scales.size == 2 and q.scales[1] == 127 + 1 - 2  # floor(log2 3) - emax(e2m1)
    padded = native.blockscale_quantize_cpu(np.concatenate([x, np.zeros(31, np.float32)]), "mxfp4", "floor", 32)
    assert np.array_equal(padded.scales, q.scales) and np.array_equal(padded.codes[:33], q.codes)


@pytest.mark.parametrize("fmt, rule", ALL)
def test_nan_inf_and_zero_blocks(fmt, rule):
    x = np.ones(16 * 5, np.float32)
    x[0:16] = 0.0
    x[5] = -0.0
    x[16 + 3] = np.nan
    x[32 + 7] = np.inf
    x[48 + 1] = -np.inf
    q, y = check(x, fmt, rule, 16)
    nan_scale = 0x7F if fmt == "nvfp4" else 0xFF
    assert list(q.scales[1:4]) == [nan_scale] * 3 and q.scales[4] != nan_scale
    assert np.isnan(y[16:64]).all() and np.isfinite(y[64:]).all()
    if fmt != "nvfp4":  # NVFP4's 1/6 scale is rounded to e4m3 (0.171875): ones come back as 1.03125
        assert (y[64:] == 1.0).all()
    assert (y[:16] == 0).all() and np.signbit(y[5]) and not np.signbit(y[6])


def test_floor_clips_and_rceil_never_does():
    """FLOOR saturates a block's largest element whenever its significand
    exceeds max_elem / 2^emax; RCEIL's scale is the tightest that never does."""
    x = np.array([7.0, 1.0], np.float32)  # e2m1: floor gives X = 1, 7 > 6 clips
    floor = native.blockscale_quantize_cpu(x, "mxfp4", "floor", 2)
    rceil = native.blockscale_quantize_cpu(x, "mxfp4", "rceil", 2)
    assert native.blockscale_dequantize_cpu(floor)[0] == 6.0
    assert rceil.scales[0] == 128 and native.blockscale_dequantize_cpu(rceil)[0] == 8.0  # 7/2 = 3.5 -> 4, times 2


def test_arguments_are_validated_by_the_library():
    x = np.ones(8, np.float32)
    with pytest.raises(UsageError, match="block must be"):
        native.blockscale_quantize_cpu(x, "mxfp4", "floor", 0)
    with pytest.raises(UsageError, match="block must be"):
        native.blockscale_quantize_cpu(x, "mxfp4", "floor", 4096)
    with pytest.raises(UsageError, match="nvfp4 takes"):
        native.blockscale_quantize_cpu(x, "nvfp4", "floor")
    with pytest.raises(UsageError, match="mxfp4 takes"):
        native.blockscale_quantize_cpu(x, "mxfp4", "nearest")
    with pytest.raises(UsageError, match="tensor_amax"):
        native.blockscale_quantize_cpu(x, "nvfp4", "nearest", tensor_amax=-1.0)
    lib = native._load()
    codes = np.empty(8, np.uint8)
    assert lib.pl_blockscale_quantize_cpu(x.ctypes.data, 8, 99, 32, 0, 0.0, codes.ctypes.data, codes.ctypes.data,
                                          None) == native.INVALID_ARGUMENT
    assert lib.pl_blockscale_quantize_cpu(x.ctypes.data, 0, 0, 32, 0, 0.0, codes.ctypes.data, codes.ctypes.data,
                                          None) == native.INVALID_ARGUMENT
    assert lib.pl_blockscale_quantize_cpu(None, 8, 0, 32, 0, 0.0, codes.ctypes.data, codes.ctypes.data,
                                          None) == native.NULL_POINTER
    assert lib.pl_blockscale_quantize_cpu(x.ctypes.data, 8, 5, 16, 4, 1.0, codes.ctypes.data, codes.ctypes.data,
                                          None) == native.NULL_POINTER  # NVFP4 without its tensor scale
    assert lib.pl_blockscale_dequantize_cpu(codes.ctypes.data, codes.ctypes.data, 1.0, 8, 0, 0,
                                            x.ctypes.data) == native.INVALID_ARGUMENT
    short = native.BlockScaled(native.block_formats()["mxfp4"], 4, "floor", codes, codes[:1], 1.0)
    with pytest.raises(UsageError, match="need 2 scales"):
        native.blockscale_dequantize_cpu(short)


def test_nvfp4_tensor_scale_follows_the_recipe():
    x = np.array([1.0, -3.0, 0.5, 2688.0 / 7], np.float32)
    q = native.blockscale_quantize_cpu(x, "nvfp4", "nearest", 16)
    assert np.float32(q.tensor_scale) == np.float32(1.0) / (np.float32(2688.0) / np.float32(2688.0 / 7))
    zero = native.blockscale_quantize_cpu(np.zeros(5, np.float32), "nvfp4", "nearest")
    assert zero.tensor_scale == 1.0 and (native.blockscale_dequantize_cpu(zero) == 0).all()
