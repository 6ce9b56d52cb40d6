"""The GPU tree sum (cuda/sum_cuda.cu, versions 1 and 2) replayed step by
step in numpy, in the kernel's order, rounding as the kernel does: fp32 and
fp64 accumulators add in their own precision; a bf16 accumulator adds in fp32
and rounds the result to bf16 (ml_dtypes, from float32: a single rounding).
Written from the kernel's documented order, apart from the library, so the GPU
result can be checked bit for bit (on a GPU, or on the CPU emulator).

The order: a grid of min(ceil(n / per_block), 4 x SMs) blocks of 512 threads;
with 16-byte-aligned x, thread t of the grid takes 16-byte packs t, t + stride,
... four at a time while four remain, then one at a time, each pack's
elements in turn; then the elements past the last whole pack, also grid-
strided. Each block sums its threads with shuffle-down trees (warps, then the
warp sums); a second one-block pass of 1024 threads does the same over the
block sums.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

THREADS, UNROLL, BLOCKS_PER_SM, MAX_BLOCKS = 512, 4, 4, 4096


def _adder(acc: str):
    if acc == "fp64":
        return np.float64, lambda a, b: np.float64(a) + np.float64(b)
    if acc == "fp32":
        return np.float32, lambda a, b: np.float32(a) + np.float32(b)
    bf16 = ml_dtypes.bfloat16
    return np.float32, lambda a, b: np.float32(bf16(np.float32(a) + np.float32(b)))


def _thread_sum(values, acc: str, kahan: bool):
    reg, add = _adder(acc)
    s, c = reg(0), reg(0)
    for x in values:
        x = reg(x)
        if kahan:
            y = add(x, -c)
            t = add(s, y)
            c = add(add(t, -s), -y)
            s = t
        else:
            s = add(s, x)
    return add(s, -c) if kahan else s


def _block_sum(per_thread, acc: str):
    reg, add = _adder(acc)
    v = [reg(x) for x in per_thread]
    warp_sums = []
    for w in range(len(v) // 32):
        warp_sums.append(_warp_sum(v[32 * w:32 * w + 32], add))
    return _warp_sum(warp_sums + [reg(0)] * (32 - len(warp_sums)), add)


def _warp_sum(lanes, add):
    lanes = list(lanes)
    for d in (16, 8, 4, 2, 1):  # __shfl_down_sync: a lane past 31 reads its own value
        lanes = [add(lanes[i], lanes[i + d] if i + d < 32 else lanes[i]) for i in range(32)]
    return lanes[0]


def tree_sum(x: np.ndarray, acc: str, kahan: bool = False, aligned: bool = True, sms: int = 132) -> float:
    """x: the stored values, in their storage dtype."""
    n = x.size
    per_pack = 16 // x.dtype.itemsize
    per_block = THREADS * per_pack * UNROLL
    blocks = max(1, min(-(-n // per_block), min(sms * BLOCKS_PER_SM, MAX_BLOCKS)))
    stride = blocks * THREADS
    npacks = n // per_pack if aligned else 0
    wide = x.astype(np.float64)  # exact: every storage format widens exactly
    partials = []
    for b in range(blocks):
        per_thread = []
        for t in range(b * THREADS, (b + 1) * THREADS):
            order = []
            p = t
            while p + (UNROLL - 1) * stride < npacks:
                for u in range(UNROLL):
                    order.extend(range((p + u * stride) * per_pack, (p + u * stride + 1) * per_pack))
                p += UNROLL * stride
            while p < npacks:
                order.extend(range(p * per_pack, (p + 1) * per_pack))
                p += stride
            order.extend(range(npacks * per_pack + t, n, stride))
            per_thread.append(_thread_sum(wide[order], acc, kahan))
        partials.append(_block_sum(per_thread, acc))
    reg, add = _adder(acc)
    # the second pass: 1024 threads, at most one block sum each (s = 0 + partial)
    second = [add(reg(0), partials[t]) if t < blocks else reg(0) for t in range(1024)]
    return float(_block_sum(second, acc))


def matmul(a: np.ndarray, b: np.ndarray, splits: int = 1, tile: int = 16) -> np.ndarray:
    """The GPU matmul's bits (cuda/matmul.cu): per output element an fp32
    fused multiply-add chain in ascending k (naive and tiled: one chain; split-K
    ordered: one chain per K slice of the launcher's size, the slices then
    added in slice order in fp32), stored in the inputs' format. Each FMA is
    exact product plus sum, rounded once (fractions, via emulate.round_exact)."""
    from fractions import Fraction

    from emulate import round_exact

    m, k = a.shape
    n = b.shape[1]
    per_split = -(-k // splits)  # ceiling divisions: each split's share, rounded up to whole tiles
    kslice = -(-per_split // tile) * tile
    bounds = [(k0, min(k0 + kslice, k)) for k0 in range(0, k, kslice)]
    fa = [[Fraction(float(v)) for v in row] for row in a.astype(np.float64)]
    fb = [[Fraction(float(v)) for v in row] for row in b.astype(np.float64)]
    out = np.empty((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            total = 0.0
            for k0, k1 in bounds:
                s = 0.0
                for p in range(k0, k1):
                    s = round_exact(fa[i][p] * fb[p][j] + Fraction(s), "fp32")
                total = float(np.float32(total) + np.float32(s)) if len(bounds) > 1 else s
            out[i, j] = total
    return out.astype(a.dtype)  # fp32 to the storage format: one rounding


# ---------------------------------------------------------------------------
# softmax version 5 (cuda/softmax.cu, softmax_cluster): a row split over a
# thread-block cluster, replayed step by step in fp32 numpy. Written from the
# kernel's documented layout and order:
#   - the row is nvec = cols / N 16-byte vectors (N = 4 fp32, 8 bf16/fp16); the
#     cluster C is the smallest of 2, 4, 8, 16 whose pieces ceil(nvec / C) fit
#     512 threads at 16 elements a thread (4 vectors fp32, 2 bf16/fp16) or
#     twice that: 16384 elements a CTA, so that two CTAs share an SM's
#     registers, at the fewer vectors a thread that do; failing that
#     (rows past 16 x 16384 columns), the smallest whose pieces fit 1024
#     threads at those tiers. CTA r holds vectors [r * piece, (r + 1) * piece)
#     of the row (the last piece short or empty);
#   - threads = ceil(piece / vpt) rounded up to a warp; thread t of a CTA holds
#     the piece's vectors t, t + threads, ... (vpt of them, missing ones -inf),
#     takes its max (NaN-propagating) over them in order, then exp(v - max)
#     (shift 0 for an all -inf thread) and their sum in that order;
#   - the CTA's (max, sum) pairs meet in a block all-reduce: a butterfly of
#     xor shuffles 16, 8, 4, 2, 1 in each warp, the warps' results (lane 0's)
#     into warp 0 (empty slots (-inf, 0)) and the same butterfly there;
#   - the row's pair is rank 0's combined with rank 1's, then 2's, ... C - 1's;
#   - each element is written as e * (exp(m_thread - M) / S), rounded to the
#     storage format; lse = M + log(S); a masked row (M = -inf) gives S = NaN,
#     or zeros and lse -inf under the zero policy.
# exp and log are the C library's expf/logf, which the CPU emulator's kernels
# call too: bit for bit against the emulator (a GPU's expf is a few ulps apart).

import ctypes  # noqa: E402
import ctypes.util  # noqa: E402

_LIBM = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
_LIBM.expf.restype = _LIBM.logf.restype = ctypes.c_float
_LIBM.expf.argtypes = _LIBM.logf.argtypes = [ctypes.c_float]
_expf = np.frompyfunc(lambda v: _LIBM.expf(float(v)), 1, 1)
F32 = np.float32
NEG_INF = F32(-np.inf)


def expf(a) -> np.ndarray:
    return np.asarray(_expf(np.asarray(a, F32)), dtype=F32)


def logf(a: float) -> np.float32:
    return F32(_LIBM.logf(float(a)))


def _max_nan(a, b):
    return np.where((a > b) | np.isnan(a), a, b).astype(F32)


def _combine(am, as_, bm, bs):
    m = _max_nan(am, bm)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.where(m == NEG_INF, as_ + bs, as_ * expf(am - m) + bs * expf(bm - m)).astype(F32)
    return m, s


def _warp_allreduce(m, s):
    """Butterfly over lanes (arrays of 32k values, warps contiguous)."""
    lanes = np.arange(m.size)
    for d in (16, 8, 4, 2, 1):
        partner = lanes ^ d
        m, s = _combine(m, s, m[partner], s[partner])
    return m, s


def _block_allreduce(m, s):
    m, s = _warp_allreduce(m, s)
    pm, ps = m[::32], s[::32]  # lane 0 of each warp
    wm, ws = np.full(32, NEG_INF), np.zeros(32, F32)
    wm[:pm.size], ws[:ps.size] = pm, ps
    m, s = _warp_allreduce(wm.astype(F32), ws)
    return m[0], s[0]


def softmax_cluster_plan(cols: int, elem_bytes: int, max_cluster: int = 16) -> tuple[int, int, int, int]:
    """(cluster C, piece vectors, vectors a thread, threads), or None to fall
    back; max_cluster: 16, or 8 on a device that cannot schedule 16."""
    n = 16 // elem_bytes
    if cols % n:
        return None

    def vpt_for(v, max_threads):
        tiers = (4, 8) if elem_bytes == 4 else (2, 4)
        return next((t for t in tiers if v <= t * max_threads), 0)

    nvec = cols // n
    for max_threads in (512, 1024):
        for c in (c for c in (2, 4, 8, 16) if c <= max_cluster):
            piece = -(-nvec // c)
            vpt = vpt_for(piece, max_threads)
            if vpt:
                per_thread = -(-piece // vpt)
                return c, piece, vpt, max(32, -(-per_thread // 32) * 32)
    return None


def softmax_cluster_row(x: np.ndarray, storage, masked: str = "nan",
                        max_cluster: int = 16) -> tuple[np.ndarray, np.float32]:
    """One row of stored logits (its storage type) through version 5: (y in the
    storage type, lse in fp32)."""
    elem = np.dtype(storage).itemsize
    n = 16 // elem
    c, piece, vpt, threads = softmax_cluster_plan(x.size, elem, max_cluster)
    v = x.astype(F32).reshape(-1, n)  # the row's vectors, widened exactly
    nvec = v.shape[0]
    pairs, keep = [], []
    for r in range(c):
        lo = r * piece
        mine = min(piece, nvec - lo)
        idx = np.arange(threads)[:, None] + threads * np.arange(vpt)[None, :]  # [thread, k] -> vector of the piece
        ok = idx < mine
        vals = np.where(ok[:, :, None], v[np.clip(lo + idx, 0, nvec - 1)], NEG_INF).reshape(threads, vpt * n)
        tm = np.full(threads, NEG_INF)
        for j in range(vals.shape[1]):
            tm = _max_nan(tm, vals[:, j])
        shift = np.where(tm == NEG_INF, F32(0), tm).astype(F32)
        with np.errstate(invalid="ignore"):
            ex = expf(vals - shift[:, None])
        s = np.zeros(threads, F32)
        for j in range(ex.shape[1]):
            s = (s + ex[:, j]).astype(F32)
        pairs.append(_block_allreduce(tm, s))
        keep.append((lo, mine, idx, ok, tm, ex))
    m, s = pairs[0]
    for pm, ps in pairs[1:]:
        m, s = _combine(m, s, pm, ps)
    m, s = F32(m), F32(s)
    zero = m == NEG_INF and masked == "zero"
    if m == NEG_INF and not zero:
        s = F32(np.nan)
    y = np.empty((nvec, n), F32)
    for lo, _mine, idx, ok, tm, ex in keep:
        with np.errstate(invalid="ignore", divide="ignore"):
            scale = np.zeros(tm.size, F32) if zero else (expf(tm - m) / s).astype(F32)
        out = (ex * scale[:, None]).astype(F32).reshape(idx.shape[0], idx.shape[1], n)
        y[lo + idx[ok]] = out[ok]
    lse = NEG_INF if zero else F32(m + logf(s))
    return y.reshape(-1).astype(storage), lse
