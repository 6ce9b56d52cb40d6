"""SwiGLU, RoPE and attention (cuda/swiglu.cu, rope.cu, attention.cu): the
host kernels and the CUDA versions against independent float64 references
written here in numpy, on odd sizes, with the edge cases each op is known for.

Tolerances (relative L2 over the output, chosen per storage format before
looking): fp32 1e-6 (a few fp32 roundings and libm's exp/cos/sin, against
2^-24 = 6e-8 per rounding), bf16 1e-2 and fp16 2e-3 (the output rounding
alone is 2^-9 = 2e-3 and 2^-12 = 2.4e-4 relative at most; the inputs were
rounded before the reference too, so what remains is that output rounding
and fp32 arithmetic).
"""

import math

import ml_dtypes
import numpy as np
import pytest

from precisionlab import native
from precisionlab.catalog import formats

FP32 = formats.get("fp32").code  # format codes by name, never literals

CODES = {name: formats.get(name).code for name in ("fp32", "fp16", "bf16")}
NP = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}
REL = {"fp32": 1e-6, "bf16": 1e-2, "fp16": 2e-3}


def rel_l2(got, ref):
    got = np.asarray(got, dtype=np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


# --- float64 references ------------------------------------------------------


def swiglu_ref(g, u):
    g, u = g.astype(np.float64), u.astype(np.float64)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g)) * u


def rope_ref(x, pos, base=10000.0):
    x = x.astype(np.float64)
    h = x.shape[1] // 2
    inv = base ** (-2.0 * np.arange(h) / x.shape[1])
    a = pos.astype(np.float64)[:, None] * inv[None, :]
    c, s = np.cos(a), np.sin(a)
    return np.concatenate([x[:, :h] * c - x[:, h:] * s, x[:, h:] * c + x[:, :h] * s], axis=1)


def attention_ref(q, k, v, causal, kv_start, scale):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    bh, tq, _ = q.shape
    tk = k.shape[1]
    out = np.zeros((bh, tq, v.shape[2]))
    for b in range(bh):
        start = 0 if kv_start is None else int(kv_start[b])
        for i in range(tq):
            vis = [j for j in range(tk) if j >= start and (not causal or j <= i + tk - tq)]
            if not vis:
                continue  # sees no key: zeros
            s = np.array([scale * math.fsum(q[b, i] * k[b, j]) for j in vis])
            p = np.exp(s - s.max())
            out[b, i] = (p[:, None] * v[b, vis]).sum(0) / math.fsum(p)
    return out


def stored(a, dtype):
    return np.asarray(a).astype(NP[dtype])


# --- host kernels -------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("n", [1, 7, 1000, 4099])
def test_swiglu_against_float64(dtype, n):
    rng = np.random.default_rng(n)
    g, u = stored(rng.standard_normal(n) * 3, dtype), stored(rng.standard_normal(n), dtype)
    y = native.swiglu_cpu(g, u, CODES[dtype])
    assert y.dtype == NP[dtype] and rel_l2(y, swiglu_ref(g, u)) < REL[dtype]


def test_swiglu_edges():
    g = np.array([-200.0, -88.0, 0.0, 88.0, 200.0, np.nan, np.inf, -np.inf], np.float32)
    y = native.swiglu_cpu(g, np.ones_like(g), FP32)
    assert y[0] == 0 and np.signbit(y[0])  # exp(200) overflows: g / inf = -0, the limit, with its sign
    assert y[1] == np.float32(-88.0 / (1.0 + math.exp(88.0)))  # tiny but still a normal fp32
    assert y[2] == 0 and y[3] == np.float32(88.0) and y[4] == np.float32(200.0)
    assert np.isnan(y[5])
    assert y[6] == np.inf  # inf / (1 + exp(-inf)) = inf
    assert np.isnan(y[7])  # -inf / (1 + inf): the formula's NaN, not the limit 0


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("rows,dim", [(1, 2), (5, 64), (33, 128), (7, 130)])
def test_rope_against_float64(dtype, rows, dim):
    rng = np.random.default_rng(rows * dim)
    x = stored(rng.standard_normal((rows, dim)), dtype)
    pos = rng.integers(0, 4096, rows)
    y = native.rope_cpu(x, CODES[dtype], pos, 10000.0, FP32)
    # fp32 phases carry the angle's own rounding: |p * inv_freq| up to 4096
    # rad has an ulp of 2^-12, so allow that on top of the output rounding
    tol = max(REL[dtype], 2e-4) if dtype == "fp32" else REL[dtype]
    assert rel_l2(y, rope_ref(x, pos)) < tol


def test_rope_position_zero_is_the_identity_and_the_norm_is_kept():
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_array_equal(native.rope_cpu(x, FP32, np.zeros(4, np.int64), 10000.0, FP32), x)
    y = native.rope_cpu(x, FP32, np.array([1, 100, 1000, 30000]), 10000.0, FP32).astype(np.float64)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x.astype(np.float64), axis=1), rtol=1e-6)


def test_rope_bf16_phases_are_the_long_position_pitfall():
    # fp32 phases stay close at every position; bf16 phases are fine near 0 and
    # wrong at 32768, where a bf16 angle is a multiple of 256 radians
    x = np.random.default_rng(1).standard_normal((2, 128)).astype(np.float32)
    errs = {}
    for name, pos in (("short", np.array([3, 7])), ("long", np.array([32000, 32767]))):
        ref = rope_ref(x, pos)
        errs[name] = {ph: rel_l2(native.rope_cpu(x, 1, pos, 10000.0, CODES[ph]), ref) for ph in ("fp32", "bf16")}
    assert errs["short"]["fp32"] < 1e-6 and errs["long"]["fp32"] < 1e-3
    assert errs["short"]["bf16"] < 2e-2
    assert errs["long"]["bf16"] > 0.3 > 10 * errs["long"]["fp32"]


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("bh,tq,tk,d,dv", [(1, 1, 1, 1, 1), (2, 5, 9, 16, 8), (3, 17, 17, 64, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_against_float64(dtype, bh, tq, tk, d, dv, causal):
    rng = np.random.default_rng(bh * tq * tk + d)
    q, k = stored(rng.standard_normal((bh, tq, d)), dtype), stored(rng.standard_normal((bh, tk, d)), dtype)
    v = stored(rng.standard_normal((bh, tk, dv)), dtype)
    ks = np.arange(bh, dtype=np.int32) * 2  # left padding 0, 2, 4
    scale = d ** -0.5
    y = native.attention_cpu(q, k, v, CODES[dtype], causal, ks, scale)
    ref = attention_ref(q, k, v, causal, ks, scale)
    assert y.shape == (bh, tq, dv)
    masked = ~np.any(ref != 0, axis=2)
    assert (y[masked].astype(np.float64) == 0).all()          # fully masked rows: zeros
    if (~masked).any():
        assert rel_l2(y[~masked], ref[~masked]) < REL[dtype]


def test_attention_fully_masked_rows_are_zeros_not_nan():
    q = np.ones((1, 4, 8), np.float32)
    y = native.attention_cpu(q, q, q, FP32, True, np.array([3], np.int32), 1.0)
    assert (y[0, :3] == 0).all() and np.isfinite(y).all() and (y[0, 3] == 1).all()


def test_arguments_are_checked():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(native.UsageError, match="dim even"):
        native.rope_cpu(x, FP32, np.zeros(2, np.int64), 10000.0, FP32)
    with pytest.raises(native.UsageError, match="base"):
        native.rope_cpu(np.zeros((2, 4), np.float32), FP32, np.zeros(2, np.int64), 0.5, FP32)
    with pytest.raises(native.UsageError, match="tq"):
        native.attention_cpu(np.zeros((1, 4, 2), np.float32), np.zeros((1, 2, 2), np.float32),
                             np.zeros((1, 2, 2), np.float32), FP32, True, None, 1.0)
    with pytest.raises(native.UsageError, match="must match"):
        native.swiglu_cpu(np.zeros(3, np.float32), np.zeros(4, np.float32), FP32)


# --- CUDA versions (a GPU, or make emu-test) -----------------------------------


def dev(a):
    return native.DeviceArray.from_numpy(a)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_gpu_swiglu(dtype):
    rng = np.random.default_rng(5)
    g, u = stored(rng.standard_normal(3001) * 4, dtype), stored(rng.standard_normal(3001), dtype)
    dg, du, dy = dev(g), dev(u), native.DeviceArray(g.shape, g.dtype)
    native.swiglu_cuda(dg.ptr, du.ptr, g.size, CODES[dtype], dy.ptr)
    assert rel_l2(dy.numpy(), swiglu_ref(g, u)) < REL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("phase", ["fp32", "bf16"])
def test_gpu_rope_matches_the_host(dtype, phase):
    rng = np.random.default_rng(6)
    x = stored(rng.standard_normal((9, 66)), dtype)
    pos = np.array([0, 1, 5, 100, 1000, 4095, 8191, 30000, 32767], np.int64)
    dx, dp, dy = dev(x), dev(pos), native.DeviceArray(x.shape, x.dtype)
    native.rope_cuda(dx.ptr, 9, 66, CODES[dtype], dp.ptr, 10000.0, CODES[phase], dy.ptr)
    host = native.rope_cpu(x, CODES[dtype], pos, 10000.0, CODES[phase])
    # the same formula: only cos/sin's last bits (CUDA's vs libm's) may differ
    assert rel_l2(dy.numpy(), host.astype(np.float64)) < (1e-5 if phase == "fp32" else 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_attention_against_float64(dtype, causal):
    rng = np.random.default_rng(7)
    bh, tq, tk, d, dv = 3, 7, 300, 24, 40
    q, k = stored(rng.standard_normal((bh, tq, d)), dtype), stored(rng.standard_normal((bh, tk, d)), dtype)
    v = stored(rng.standard_normal((bh, tk, dv)), dtype)
    ks = np.array([0, 17, 296], np.int32)  # the last head-batch: queries 0-2 see no key under the causal mask
    dq, dk, dv_, dks = dev(q), dev(k), dev(v), dev(ks)
    dy = native.DeviceArray((bh, tq, dv), q.dtype)
    native.attention_cuda(dq.ptr, dk.ptr, dv_.ptr, bh, tq, tk, d, dv, CODES[dtype], causal, dks.ptr, d ** -0.5, dy.ptr)
    y = dy.numpy()
    ref = attention_ref(q, k, v, causal, ks, d ** -0.5)
    masked = ~np.any(ref != 0, axis=2)
    assert masked.any() == causal
    assert (y[masked].astype(np.float64) == 0).all() and np.isfinite(y.astype(np.float64)).all()
    assert rel_l2(y[~masked], ref[~masked]) < REL[dtype]


@pytest.mark.gpu
def test_gpu_attention_refuses_what_version_1_cannot_hold():
    q = np.zeros((1, 1, 4), np.float32)
    k = np.zeros((1, 8193, 4), np.float32)
    dq, dk, dy = dev(q), dev(k), native.DeviceArray((1, 1, 4), np.float32)
    with pytest.raises(native.UsageError, match="tk <= 8192"):
        native.attention_cuda(dq.ptr, dk.ptr, dk.ptr, 1, 1, 8193, 4, 4, FP32, True, None, 1.0, dy.ptr)
