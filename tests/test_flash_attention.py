"""The FlashAttention emulator (numerics/flash_attention.py): bit for bit
against a step-by-step scalar emulation written from its docstring (one row at
a time, np.float32 scalars and fractions; nothing here calls the module's
arithmetic), its degenerate cases, and the published shapes of FP8 attention's
accuracy bugs, their bands fixed before the runs.

The published-shape tests share one construction, fixed before running: d =
128, one head, 128 query rows (64 where said), S = 8192 keys, Bc = Br = 128,
q = sigma z, k and v standard normal (seeded), softmax_scale = 1/sqrt(d): the
logits q.k/sqrt(d) then have standard deviation sigma (z.k/sqrt(d) is standard
normal for fixed unit-variance z). Q, K, V stay in fp32 so that only P's
handling differs between the runs compared."""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from precisionlab.numerics import flash_attention as fa
from test_accumulators import EMINS, emulate, emulate_onto, round_f32

D, ROWS, S = 128, 128, 8192
F32 = np.float32


def logits_inputs(sigma: float, rows: int = ROWS, s: int = S, seed: int = 0):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((s, D))
    v = rng.standard_normal((s, D))
    z = rng.standard_normal((rows, D))
    return sigma * z, k, v


def rel_l2(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ---------------------------------------------------------------------------
# the published shapes

SIGMAS = (0.25, 0.5, 1.0, 1.5, 2.0)


@pytest.fixture(scope="module")
def fp8_sweep():
    out = {}
    for sigma in SIGMAS:
        q, k, v = logits_inputs(sigma)
        base = fa.attention(q, k, v, fa.FlashConfig(), track=False).out
        for offset in (8.0, 4.0):
            cfg = fa.FlashConfig(p_dtype="fp8_e4m3", max_offset=offset, rescale_threshold=4.0)
            out[(sigma, offset)] = rel_l2(fa.attention(q, k, v, cfg, track=False).out, base)
    return out


def test_fp8_offset8_threshold4_saturates_at_wide_logits(fp8_sweep):
    """max_offset 8 with a lazy threshold of 4 lets P reach 2^12, past e4m3's
    448: at logit std >= 1 the error against the bf16 path is >= 0.1, at std
    <= 0.5 it stays under 0.035."""
    for sigma in SIGMAS:
        err = fp8_sweep[(sigma, 8.0)]
        assert (err >= 0.1) if sigma >= 1.0 else (sigma > 0.5 or err < 0.035), (sigma, err)


def test_fp8_offset4_stays_within_band(fp8_sweep):
    for sigma in SIGMAS:
        assert fp8_sweep[(sigma, 4.0)] < 0.035, (sigma, fp8_sweep[(sigma, 4.0)])


def peaked(rows: int = 64, s: int = S, seed: int = 1):
    """Row i's logit for key i is about 8 above the rest (std 0.7 around 0):
    q_i = 0.7 k_i, so q_i.k_i/sqrt(d) = 0.7 |k_i|^2/sqrt(d) ~ 7.9; V = ones."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((s, D))
    return 0.7 * k[:rows], k, np.ones((s, D))


@pytest.mark.xfail(strict=True, reason="measured: with this construction (fixed before running) the peak ranges "
                   "6.6-9.6 above the rest; rows peaked 6.6 above keep up to 0.995 of their mass (unscaled e4m3 "
                   "flushes only below 2^-10), the others 0.40-0.97; scaled P keeps > 0.99 in every row")
def test_unscaled_e4m3_p_loses_the_rows_mass():
    q, k, v = peaked()
    _mass_claim(q, k, v)


def test_unscaled_e4m3_p_loses_the_rows_mass_at_a_fixed_peak():
    """Written after the test above failed, its construction made exact: row
    i's logit for key i is exactly 10 (q_i = 10 sqrt(d) k_i / |k_i|^2), the
    others N(0, (10/|k_i|)^2), std about 0.9."""
    rng = np.random.default_rng(1)
    k = rng.standard_normal((S, D))
    q = 10.0 * math.sqrt(D) * k[:64] / np.sum(k[:64] ** 2, axis=1, keepdims=True)
    _mass_claim(q, k, np.ones((S, D)))


def _mass_claim(q, k, v):
    unscaled = fa.attention(q, k, v, fa.FlashConfig(p_dtype="fp8_e4m3"), track=False)
    scaled = fa.attention(q, k, v, fa.FlashConfig(p_dtype="fp8_e4m3", max_offset=8.0), track=False)
    assert unscaled.p_flushed > 0
    assert np.min(scaled.mass_kept) > 0.99, np.min(scaled.mass_kept)
    # with V = ones the output is the mass kept: O = sum P_stored / l, l over the unrounded P
    assert np.allclose(unscaled.out[:, 0], unscaled.mass_kept, rtol=1e-2)
    assert np.max(unscaled.mass_kept) < 0.8, np.sort(unscaled.mass_kept)


def test_two_level_error_falls_with_the_interval():
    """P in e4m3 (scaled), V in e4m3, the P.V MMA in Hopper's 14-bit
    truncating accumulator; promoted to fp32 every 64 (= never, 64 tiles), 4, 1
    tiles. The accumulation's own error: against the same run accumulated in
    fp32."""
    q, k, v = logits_inputs(1.0, rows=64)
    base = dict(p_dtype="fp8_e4m3", max_offset=8.0, input_dtype="fp8_e4m3")
    ref = fa.attention(q, k, v, fa.FlashConfig(**base), track=False).out
    errs = [rel_l2(fa.attention(q, k, v, fa.FlashConfig(**base, pv_accumulator="hopper-fp8", promote_tiles=n),
                                track=False).out, ref) for n in (64, 4, 1)]
    assert errs[0] > errs[1] > errs[2] > 0, errs


def test_split_kv_depends_on_the_split_count_in_bf16_only():
    q, k, v = logits_inputs(1.0, rows=64, s=2048)
    exact = dict(p_dtype="fp64", arithmetic="fp64", qk_accumulator="fp64", pv_accumulator="fp64")
    for kw, lo, hi in (({}, 1e-4, None), (exact, None, 1e-13)):
        outs = [fa.attention(q, k, v, fa.FlashConfig(splits=n, **kw), track=False).out for n in (1, 2, 4, 8)]
        diffs = [rel_l2(o, outs[0]) for o in outs[1:]]
        assert all((lo is None or d > lo) and (hi is None or d < hi) for d in diffs), (kw, diffs)


# ---------------------------------------------------------------------------
# bit for bit against a scalar emulation of the docstring's order


def f32(x) -> float:
    return float(F32(x))


def fma(a: float, b: float, c: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        return a * b + c
    return float(round_f32(Fraction(a) * Fraction(b) + Fraction(c)))


def exp2(x: float) -> float:
    y = f32(math.exp2(x)) if x > -1000 else 0.0
    return 0.0 if y < 2.0 ** -126 else y


def cast(x: float, dtype: str) -> float:
    if dtype == "fp32":
        return x
    t = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
         "fp8_e5m2": ml_dtypes.float8_e5m2}[dtype]
    top = float(ml_dtypes.finfo(t).max)
    if dtype.startswith("fp8"):
        x = min(x, top)
    return float(np.array(x, np.float32).astype(t).astype(np.float64))  # x is an fp32 value: one rounding


def scalar_row(i, q, k, v, cfg, rows_total, qd=1.0, kd=1.0, vd=1.0):
    s_k, d = k.shape
    c = f32(f32(f32(cfg.softmax_scale * fa.LOG2E) * qd) * kd)
    n_blocks = -(-s_k // cfg.block_c)
    per = -(-n_blocks // cfg.splits)
    last_key = i + s_k - rows_total if cfg.causal else s_k - 1
    block_last = min(rows_total, (i // cfg.block_r + 1) * cfg.block_r) - 1
    tiles_max = -(-min(s_k, block_last + 1 + s_k - rows_total) // cfg.block_c) if cfg.causal else n_blocks
    outs, lses = [], []
    for sp in range(cfg.splits):
        a0, b0 = min(sp * per, n_blocks), min((sp + 1) * per, n_blocks)
        m, l = -math.inf, 0.0
        o, tt = [0.0] * v.shape[1], [0.0] * v.shape[1]
        for n, t in enumerate(range(a0, b0), start=1):
            if t >= tiles_max:
                continue
            keys = range(t * cfg.block_c, min(s_k, (t + 1) * cfg.block_c))
            s = []
            for j in keys:  # the Q.K^T model from +0, the rationals' emulation (fp32: the IEEE chain)
                x = float(emulate(cfg.qk_accumulator, [Fraction(float(F32(z))) for z in q[i]],
                                  [Fraction(float(F32(z))) for z in k[j]], (EMINS[cfg.input_dtype],) * 2))
                s.append(x if j <= last_key else -math.inf)
            m_new = max([m] + s)
            m_safe = 0.0 if m_new == -math.inf else m_new
            a = -math.inf if m == -math.inf else f32(f32(m - m_safe) * c)
            if n > 1 and cfg.rescale_threshold > 0 and m != -math.inf and a >= -cfg.rescale_threshold:
                m_new, m_safe, alpha = m, m, 1.0
            else:
                alpha = exp2(a) if a != -math.inf else 0.0
            m = m_new
            ms = 0.0 if m == -math.inf else fma(m_safe, c, -cfg.max_offset)
            p = [0.0 if x == -math.inf else exp2(fma(x, c, -ms)) for x in s]
            l = f32(l * alpha)
            for x in p:
                l = f32(l + x)
            stored = [cast(f32(x * cfg.p_scale), cfg.p_dtype) for x in p]
            o = [f32(x * alpha) for x in o]
            tt = [f32(x * alpha) for x in tt]
            target = tt if cfg.promote_tiles else o
            for y in range(v.shape[1]):  # the P.V model onto the running O (or T), in rationals
                target[y] = float(emulate_onto(cfg.pv_accumulator, Fraction(target[y]),
                                               [Fraction(x) for x in stored], [Fraction(v[j, y]) for j in keys],
                                               (EMINS[cfg.p_dtype], EMINS[cfg.input_dtype])))
            if cfg.promote_tiles and (n % cfg.promote_tiles == 0 or t == b0 - 1):
                o = [f32(x + z) for x, z in zip(o, tt, strict=True)]
                tt = [0.0] * v.shape[1]
        inv = f32(1.0 / l) if l > 0 else 0.0
        fs = f32(inv * f32(vd / cfg.p_scale))
        outs.append([f32(x * fs) for x in o])
        ms_end = 0.0 if m == -math.inf else m
        lses.append(fma(ms_end, f32(c * math.log(2.0)), f32(math.log(f32(l * 2.0 ** -cfg.max_offset))))
                    if l > 0 else -math.inf)
    if cfg.splits == 1:
        return outs[0]
    order = list(range(cfg.splits))[:: -1 if cfg.combine_order == "reverse" else 1]
    lmax = max(lses)
    lmax = 0.0 if lmax == -math.inf else lmax
    total = 0.0
    for sp in order:
        total = f32(total + f32(math.exp(f32(lses[sp] - lmax))))
    lse = f32(f32(math.log(total)) + lmax)
    o = [0.0] * v.shape[1]
    for sp in order:
        w = f32(math.exp(f32(lses[sp] - lse)))
        o = [fma(w, x, z) for x, z in zip(outs[sp], o, strict=True)]
    return o


def draw(rng, shape, dtype, scale=1.0):
    t = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp8_e4m3": ml_dtypes.float8_e4m3fn}[dtype]
    return (rng.standard_normal(shape) * scale).astype(t).astype(np.float64)


CASES = [
    dict(),
    dict(p_dtype="fp8_e4m3", max_offset=8.0, rescale_threshold=4.0),
    dict(p_dtype="fp8_e5m2", p_scale=3.0, causal=True),
    dict(p_dtype="fp16", rescale_threshold=2.0, splits=3, combine_order="reverse"),
    dict(p_dtype="fp8_e4m3", max_offset=8.0, input_dtype="fp8_e4m3", pv_accumulator="hopper-fp8:group=4:bits=10",
         promote_tiles=2, causal=True, splits=2),
    dict(p_dtype="fp32", block_c=64, block_r=2, causal=True),
    # every P.V model of numerics/accumulators.py onto the running O, and a limited Q.K^T
    dict(p_dtype="bf16", pv_accumulator="promote:3:group=2:bits=9", splits=2),
    dict(p_dtype="fp8_e4m3", max_offset=4.0, pv_accumulator="exact", qk_accumulator="hopper-fp8:bits=12:group=4"),
    dict(p_dtype="fp16", pv_accumulator="fp32-pairwise:order=reverse", promote_tiles=3, rescale_threshold=1.0),
    dict(p_dtype="fp8_e5m2", pv_accumulator="hopper-fp8:rounding=rne:group=5", qk_accumulator="promote:4:group=2",
         causal=True),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bit_for_bit_against_the_scalar_emulation(case):
    kw = CASES[case]
    rng = np.random.default_rng(case)
    rows, s_k, d = 5, 37, 6  # neither a multiple of the tiles
    dtype = kw.get("input_dtype", "fp32")
    q, k, v = draw(rng, (rows, d), dtype, 3.0), draw(rng, (s_k, d), dtype, 2.0), draw(rng, (s_k, 3), dtype)
    # descales Q, K, V: powers of two, so the given x (stored value times descale) / descale is the stored value
    qd, kd, vd = (0.5, 4.0, 2.0) if case % 2 == 0 or dtype.startswith("fp8") else (1.0, 1.0, 1.0)
    cfg = fa.FlashConfig(**{"block_c": 8, "block_r": 3, "softmax_scale": 0.4, **kw},
                         q_descale=qd, k_descale=kd, v_descale=vd)
    got = fa.attention(q * qd, k * kd, v * vd, cfg).out
    want = np.array([scalar_row(i, q, k, v, cfg, rows, qd=qd, kd=kd, vd=vd) for i in range(rows)])
    assert np.array_equal(got.astype(np.float32).view(np.uint32), want.astype(np.float32).view(np.uint32)), \
        (got, want)


# ---------------------------------------------------------------------------
# degenerate cases


def test_one_tile_is_the_plain_softmax():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal(s).astype(np.float32).astype(np.float64) for s in ((7, 16), (50, 16), (50, 4)))
    got = fa.attention(q, k, v, fa.FlashConfig(p_dtype="fp32", block_c=64)).out
    # the plain softmax in fp32, written directly: one max, one pass of exp2, one sum, one product
    cfg = fa.FlashConfig(p_dtype="fp32", block_c=64, softmax_scale=1 / 4)
    assert np.array_equal(got, np.array([scalar_row(i, q, k, v, cfg, 7) for i in range(7)]))
    # and within fp32's tolerance of float64 (torch.testing's fp32 rtol 1.3e-6, atol 1e-5)
    assert np.allclose(got, fa.reference(q, k, v), rtol=1.3e-6, atol=1e-5)


def test_threshold_zero_is_eager():
    q, k, v = logits_inputs(1.0, rows=16, s=1024)
    eager = fa.attention(q, k, v, fa.FlashConfig(), track=False)
    tiny = fa.attention(q, k, v, fa.FlashConfig(rescale_threshold=2.0 ** -60), track=False)
    assert eager.lazy_skips == 0 and eager.rescales > 0
    assert np.array_equal(eager.out, tiny.out) and tiny.lazy_skips == 0
    lazy = fa.attention(q, k, v, fa.FlashConfig(rescale_threshold=8.0), track=False)
    # the stored max stays lower, so every raise of the true max (and more) is a skip
    assert lazy.rescales == 0 and lazy.lazy_skips >= eager.rescales
    assert rel_l2(lazy.out, eager.out) < 1e-2  # bf16 P at most 2^8: the same to bf16's precision


def test_causal_rows_match_the_masked_reference():
    q, k, v = logits_inputs(1.0, rows=40, s=300)
    got = fa.attention(q, k, v, fa.FlashConfig(p_dtype="fp32", causal=True, block_c=32, block_r=16))
    ref = fa.reference(q, k, v, causal=True)
    assert np.allclose(got.out, ref, rtol=1e-5, atol=1e-5)  # fp32 throughout: a few hundred fp32 roundings
    # the last row sees every key, the first 261: each against its own row of plain softmax
    plain = fa.reference(q[:1], k[:261], v[:261])
    assert np.allclose(got.out[:1], plain, rtol=1e-5, atol=1e-5)
    assert got.p_entries == sum(261 + i for i in range(40))


def test_running_error_is_tracked_per_tile():
    q, k, v = logits_inputs(1.0, rows=16, s=1000)
    run = fa.attention(q, k, v, fa.FlashConfig(block_c=128, splits=2))
    assert run.tile_ends == [128, 256, 384, 512, 640, 768, 896, 1000]
    assert run.tile_split == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(0 < e < 1e-2 for e in run.running_rel_l2)
