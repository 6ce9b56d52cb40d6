"""The GPU tree sum (cuda/accumulate.cu, versions 1 and 2) replayed step by
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
    kslice = -(-(-(-k // splits)) // tile) * tile
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
