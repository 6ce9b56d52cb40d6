"""A FlashAttention forward pass emulated bit for bit in numpy: tiled online
softmax with FlashAttention's precision knobs, and its float64 reference.

One query row at a time is what the maths does; the code is vectorised over
rows (a chunk of CHUNK_ROWS at a time: rows are independent, so chunking
changes no bit) and loops over key tiles in the kernel's order. Every value
the kernel holds in fp32 registers is held here as a float64 array carrying an
fp32 value, rounded after each operation (R below: float64 -> fp32 nearest, ties
to even). For +, -, x and / of fp32 operands that is the correctly rounded fp32
result (53 >= 2 x 24 + 2: double rounding is harmless); a fused multiply-add
is rounded once (its exact value rounded to odd in float64 first, then to fp32).

Notation: S the raw scores (Q K^T, neither scaled nor descaled), c the scale
in log2 units, m the stored running max (raw units), l the running sum, O the
running output (unnormalised), all per row. Knobs (FlashConfig):

``block_r`` (Br), ``block_c`` (Bc)
    Key tiles of Bc keys. Br only decides which key tiles a block of Br query
    rows visits under ``causal`` (below); rows are otherwise independent.
``max_offset`` (log2 units, FA3's ``Max_offset``: 8 in its FP8 path)
    P = 2^(S c - (m c - max_offset)): P lies in (0, 2^max_offset] instead of
    (0, 1], using more of FP8's range. It cancels in O / l.
``rescale_threshold`` (log2 units of the scaled scores, FA4's
    ``rescale_threshold``): when a tile raises the row's max from m_old to
    m_new, the stored max and O, l are rescaled only if (m_old - m_new) c <
    -threshold, i.e. the max grew by more than the threshold; otherwise m stays
    m_old and P of this tile may reach 2^(max_offset + threshold). 0: eager.
``p_dtype`` (fp64, fp32, bf16, fp16, fp8_e4m3, fp8_e5m2), ``p_scale``
    The P fed to the P.V product: cast(R(P p_scale)), nearest even; FP8 casts
    saturate at the format's max (``cvt.rn.satfinite``), so P above 448
    (e4m3) is clamped: counted as saturated. A positive P stored as 0: flushed.
    fp64: P as computed, unrounded. The sum l is taken over the fp32 P before
    the cast (as FA's ``reduce_sum`` on the scores), so what the cast loses is
    lost from O only: the row's mass.
``input_dtype``, ``q_descale``/``k_descale``/``v_descale``
    Q, K, V stored as cast(x / descale) (FP8: saturating; the default descale
    of an FP8 input is R(amax / max), 1 for the others). c = R(R(c0 q_descale)
    k_descale), c0 = R(softmax_scale log2(e)); O is multiplied by v_descale at
    the end (FA3's ``finalize(v_descale)``).
``qk_accumulator``, ``pv_accumulator``
    numerics.accumulators models (exact, fp32, fp32-pairwise, hopper-fp8,
    promote:N) or ``fp64`` (float64 BLAS, then R). The P.V MMA accumulates into
    the O it already holds (``Accumulator.accumulate``).
``promote_tiles`` n (two-level accumulation)
    None: the MMA accumulates into O. n: into a second accumulator T from +0,
    and every n tiles of a split (and after its last) O = R(O + T), T = +0;
    a rescale multiplies both.
``splits``, ``combine_order`` (forward | reverse)
    Split-KV (FA2's num_splits): the n_blocks = ceil(S_k / Bc) tiles are split
    into runs of ceil(n_blocks / splits) consecutive tiles; each split runs the
    loop below and writes its normalised O_s and lse_s; then the combine. One
    split writes O directly, with no combine.
``causal``
    The R query rows are the last R positions (bottom-right alignment, FA2's
    convention for seqlen_q <= seqlen_k): row i sees keys j <= i + S_k - R,
    others are S = -inf. Row block b (rows [b Br, (b+1) Br)) visits the tiles
    below ceil(min(S_k, (b+1) Br + S_k - R) / Bc) only (FA's n_block_max):
    its rows' state is left unchanged by the tiles it skips.
``arithmetic`` (fp32 | fp64)
    fp64: R is the identity, every operation rounded to float64, and no
    flush to zero: with p_dtype and both accumulators fp64, this is the exact
    model (real-number attention up to float64 rounding), the same order of
    operations as the kernel's.

The order of operations, per split, per row, tile after tile (t = 1, 2, ...):

 1. S = qk_accumulator(Q, K_tile^T); masked entries -inf.
 2. m_new = max(m, max S) (the first tile: m = -inf before); m_safe = m_new,
    or 0 where m_new = -inf.
 3. a = R(R(m - m_safe) c); from the second tile on, where threshold > 0 and
    a >= -threshold: m_new = m (not rescaled), m_safe likewise, alpha = 1;
    otherwise alpha = exp2(a) (0 where m = -inf). m = m_new.
 4. ms = fma(m_safe, c, -max_offset), or 0 where m = -inf (FA3's Check_inf).
 5. P = exp2(fma(S, c, -ms)): 2^x rounded to fp32 (float64's exp2, then R),
    below 2^-126 flushed to +0 (``ex2.approx.ftz``; not under fp64).
 6. l = R(l alpha), then l = R(l + P_k) for k in the tile's order.
 7. P_stored = cast(R(P p_scale)) (step 6's P; p_scale 1: no multiply).
 8. O = R(O alpha) (and T = R(T alpha)); then O (or T) = pv_accumulator's
    accumulate(O or T, P_stored, V_tile).
 9. two-level: after every promote_tiles-th tile and the split's last,
    O = R(O + T), T = +0.
Then, per split: inv = R(1 / l) (0 where l = 0), f = R(inv R(v_descale /
p_scale)), O_s = R(O f); lse_s = fma(m_safe, R(c ln 2), R(log(R(l
2^-max_offset)))), -inf where l = 0. Combine (splits > 1), in combine_order:
lse_max = max lse_s (0 if -inf); total = R(total + R(exp(R(lse_s -
lse_max)))) from 0; lse = R(R(log total) + lse_max) (+inf where total = 0);
w_s = R(exp(R(lse_s - lse))); O = fma(w_s, O_s, O) from 0. Last, O is cast to
``out_dtype``. exp and log are float64's, then R (the hardware's approximate
MUFU results are not modelled).

Measurements beside the result, none of which changes it: the row's mass
kept, sum over keys of P_stored / p_scale 2^((m_used - M) c - max_offset)
over sum of 2^((S - M) c) (M the row's largest S, m_used the max the key's
tile used: float64, online), the P entries saturated and flushed, and the
running error: after each tile, the split's partial output (O + T) / l
against the float64 attention of the keys the split has seen so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import RunError
from precisionlab.numerics import accumulators

P_DTYPES = formats.ATTENTION_P
INPUT_DTYPES = formats.ATTENTION_INPUTS
OUT_DTYPES = formats.COMPUTE
ARITHMETIC = formats.IEEE_ARITHMETIC
COMBINE_ORDERS = ("forward", "reverse")
CHUNK_ROWS = 256  # rows emulated together: the hopper-fp8 model holds rows x d x (group + 1) x 6 doubles
LOG2E = 1.4426950408889634
FTZ = 2.0 ** -126
FP8 = formats.FP8


@dataclass(frozen=True)
class FlashConfig:
    block_r: int = 128
    block_c: int = 128
    max_offset: float = 0.0
    rescale_threshold: float = 0.0
    p_dtype: str = "bf16"
    p_scale: float = 1.0
    input_dtype: str = "fp32"
    q_descale: float | None = None
    k_descale: float | None = None
    v_descale: float | None = None
    qk_accumulator: str = "fp32"
    pv_accumulator: str = "fp32"
    promote_tiles: int | None = None
    splits: int = 1
    combine_order: str = "forward"
    causal: bool = False
    arithmetic: str = "fp32"
    out_dtype: str = "fp32"
    softmax_scale: float | None = None  # None: 1 / sqrt(d)

    def check(self) -> None:
        """ValueError naming the knob that is out of range."""
        # named as the options spell them (attention, compare op attention --emulate flash)
        positive = "a positive integer"
        for name, v, ok, rule in (
                ("block_r", self.block_r, self.block_r > 0, positive),
                ("block_c", self.block_c, self.block_c > 0, positive),
                ("splits", self.splits, self.splits > 0, positive),
                ("promote_tiles", self.promote_tiles, self.promote_tiles is None or self.promote_tiles > 0, positive),
                ("max_offset", self.max_offset, math.isfinite(self.max_offset) and 0 <= self.max_offset <= 64,
                 "a number from 0 to 64 (log2 units)"),
                ("rescale_threshold", self.rescale_threshold,
                 math.isfinite(self.rescale_threshold) and 0 <= self.rescale_threshold <= 64,
                 "a number from 0 to 64 (log2 units)"),
                ("p_scale", self.p_scale, math.isfinite(self.p_scale) and self.p_scale > 0,
                 "a finite positive number")):
            if not ok:
                raise ValueError(f"--{name.replace('_', '-')} {v}: must be {rule}")
        for name, v, allowed in (("p_dtype", self.p_dtype, P_DTYPES), ("input_dtype", self.input_dtype, INPUT_DTYPES),
                                 ("out_dtype", self.out_dtype, OUT_DTYPES), ("arithmetic", self.arithmetic, ARITHMETIC),
                                 ("combine_order", self.combine_order, COMBINE_ORDERS)):
            if v not in allowed:
                raise ValueError(f"{name} {v!r}: choose from {', '.join(allowed)}")
        for name in ("q_descale", "k_descale", "v_descale", "softmax_scale"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} {v} must be a positive number")
        model(self.qk_accumulator)
        model(self.pv_accumulator)
        # An overflow to inf would poison O (and the accumulator models refuse it): refuse what can reach it.
        # P reaches 2^(max_offset + rescale_threshold); R(P p_scale) is taken in the arithmetic's format, and a
        # P format that does not saturate (all but FP8) gives inf past its largest value; 1 / p_scale, which
        # undoes the scale at the end, must be finite too.
        wide = formats.get(self.arithmetic).max
        top = 2.0 ** (self.max_offset + self.rescale_threshold) * self.p_scale
        for what, limit in ((f"the {self.arithmetic} arithmetic's", wide),
                            (f"{self.p_dtype}'s", wide if self.p_dtype in FP8 else formats.get(self.p_dtype).max)):
            if top > limit:
                raise ValueError(f"--p-scale {self.p_scale:g}: P can reach 2^(max_offset + rescale_threshold) x "
                                 f"p_scale = {top:g}, past {what} largest value {limit:g}: it would give inf")
        if 1.0 / self.p_scale > wide:
            raise ValueError(f"--p-scale {self.p_scale:g}: its reciprocal, which undoes it at the end, is past the "
                             f"{self.arithmetic} arithmetic's largest value {wide:g}")


def model(name: str):
    """An accumulator model, or None for fp64 (float64 BLAS)."""
    return None if name == "fp64" else accumulators.parse(name)


def bf16_path(cfg: FlashConfig) -> FlashConfig:
    """The non-FP8 path the FP8 runs are compared with: the same tiling,
    splits, inputs, masking and QK product; P in bf16 without scale or offset,
    eager rescale, fp32 accumulation into O, fp32 arithmetic."""
    return replace(cfg, max_offset=0.0, rescale_threshold=0.0, p_dtype="bf16", p_scale=1.0, pv_accumulator="fp32",
                   promote_tiles=None, arithmetic="fp32", out_dtype="fp32")


# ---------------------------------------------------------------------------
# rounding


def _r32(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def _fma32(a, b, c):
    """fp32(a b + c), rounded once: a b is exact in float64 (fp32 operands),
    the sum is rounded to odd in float64 (TwoSum gives what it missed), then to
    fp32 (53 >= 24 + 2)."""
    a, b, c = (np.asarray(x, dtype=np.float64) for x in (a, b, c))
    p = a * b
    with np.errstate(invalid="ignore"):
        s = np.atleast_1d(p + c).copy()
        bp = s - c
        err = np.atleast_1d((p - bp) + (c - (s - bp)))
    fix = np.isfinite(s) & (err != 0) & ((s.view(np.uint64) & 1) == 0)
    if fix.any():
        s[fix] = np.nextafter(s[fix], np.where(err[fix] > 0, np.inf, -np.inf))
    return _r32(s).reshape(np.shape(p + c))


class _Arith:
    """R, fma, exp2 of the chosen arithmetic."""

    def __init__(self, kind: str):
        self.fp32 = kind == "fp32"

    def r(self, x):
        return _r32(x) if self.fp32 else np.asarray(x, dtype=np.float64)

    def fma(self, a, b, c):
        return _fma32(a, b, c) if self.fp32 else np.asarray(a, dtype=np.float64) * b + c

    def exp2(self, x):
        y = np.exp2(np.asarray(x, dtype=np.float64))
        if not self.fp32:
            return y
        y = _r32(y)
        return np.where(y < FTZ, 0.0, y)

    def exp(self, x):
        return self.r(np.exp(x))

    def log(self, x):
        with np.errstate(divide="ignore"):
            return self.r(np.log(x))


def cast(x: np.ndarray, dtype: str) -> tuple[np.ndarray, int]:
    """x (>= 0 or any sign, finite) cast to dtype, nearest even, FP8 saturating
    at its max; with the number of entries clamped there."""
    if dtype == "fp64":
        return np.asarray(x, dtype=np.float64), 0
    fmt = formats.get(dtype)
    saturated = 0
    if dtype in FP8:
        over = np.abs(x) > fmt.max
        saturated = int(np.count_nonzero(over))
        if saturated:
            x = np.clip(x, -fmt.max, fmt.max)
    return fmt.round(x), saturated


def quantize(x: np.ndarray, dtype: str, descale: float | None) -> tuple[np.ndarray, float]:
    """An input stored as cast(x / descale): (the stored values, the descale).
    FP8's default descale: R(amax / max), so amax maps to the format's max."""
    if descale is None:
        amax = float(np.max(np.abs(x))) if x.size else 0.0
        descale = float(_r32(amax / formats.get(dtype).max)) if dtype in FP8 and amax > 0 else 1.0
    stored, _ = cast(np.asarray(x, dtype=np.float64) / descale, dtype)
    return stored, descale


# ---------------------------------------------------------------------------
# the emulator


@dataclass
class FlashRun:
    out: np.ndarray                 # R x d, float64 holding out_dtype values
    lse: np.ndarray                 # R, the combined (or only split's) lse, natural log units
    mass_kept: np.ndarray           # R
    p_entries: int                  # P values computed for unmasked keys
    p_saturated: int
    p_flushed: int
    tile_ends: list[int] = field(default_factory=list)     # the key after each tile, in processing order
    tile_split: list[int] = field(default_factory=list)
    running_rel_l2: list[float] = field(default_factory=list)
    rescales: int = 0               # row-tile steps whose max was raised and rescaled
    lazy_skips: int = 0             # ... raised but not rescaled (within the threshold)


def split_ranges(n_blocks: int, splits: int) -> list[tuple[int, int]]:
    per = -(-n_blocks // splits)
    return [(min(s * per, n_blocks), min((s + 1) * per, n_blocks)) for s in range(splits)]


def attention(q, k, v, cfg: FlashConfig, track: bool = True) -> FlashRun:
    """The emulated forward pass of q (R x d) against k, v (S_k x d), float64
    inputs as given (rounded to input_dtype here). track: measure the running
    error against float64 (the result is the same either way)."""
    cfg.check()
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if q.ndim != 2 or k.ndim != 2 or v.ndim != 2 or q.shape[1] != k.shape[1] or k.shape[0] != v.shape[0]:
        raise ValueError(f"shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    if cfg.causal and q.shape[0] > k.shape[0]:
        raise ValueError("causal needs no more query rows than keys (bottom-right alignment)")
    qs, qd = quantize(q, cfg.input_dtype, cfg.q_descale)
    ks, kd = quantize(k, cfg.input_dtype, cfg.k_descale)
    vs, vd = quantize(v, cfg.input_dtype, cfg.v_descale)
    d = q.shape[1]
    scale = cfg.softmax_scale if cfg.softmax_scale is not None else 1.0 / math.sqrt(d)
    ar = _Arith(cfg.arithmetic)
    c = ar.r(ar.r(ar.r(scale * LOG2E) * qd) * kd)
    n_blocks = -(-k.shape[0] // cfg.block_c)
    ranges = split_ranges(n_blocks, cfg.splits)
    rows = q.shape[0]
    out = np.empty((rows, v.shape[1]))
    lse = np.empty(rows)
    mass = np.empty(rows)
    totals = {"p_entries": 0, "p_saturated": 0, "p_flushed": 0, "rescales": 0, "lazy_skips": 0}
    err2: dict[int, list[float]] = {}
    order = [(s, t) for s, (a, b) in enumerate(ranges) for t in range(a, b)]
    for r0 in range(0, rows, CHUNK_ROWS):
        r1 = min(rows, r0 + CHUNK_ROWS)
        o, ls, mk = _chunk(q[r0:r1], k, v, qs[r0:r1], ks, vs, vd, c, scale, r0, rows, ranges, cfg, ar, totals,
                           err2 if track else None)
        out[r0:r1], lse[r0:r1], mass[r0:r1] = o, ls, mk
    run = FlashRun(out=out, lse=lse, mass_kept=mass, **totals)
    if track:
        run.tile_ends = [min((t + 1) * cfg.block_c, k.shape[0]) for _, t in order]
        run.tile_split = [s for s, _ in order]
        run.running_rel_l2 = [math.sqrt(err2[t][0] / err2[t][1]) if err2[t][1] > 0 else 0.0 for _, t in order]
    return run


def _visible(rows_abs: np.ndarray, lo: int, hi: int, s_k: int, rows_total: int, causal: bool) -> np.ndarray:
    """rows x (hi - lo): whether each key of the tile is visible to each row."""
    if not causal:
        return np.ones((rows_abs.size, hi - lo), dtype=bool)
    last = rows_abs + s_k - rows_total
    return np.arange(lo, hi)[None, :] <= last[:, None]


def _chunk(q, k, v, qs, ks, vs, vd, c, scale, r0, rows_total, ranges, cfg, ar, totals, err2):
    rows, dv = q.shape[0], v.shape[1]
    s_k = k.shape[0]
    rows_abs = np.arange(r0, r0 + rows)
    qk, pv = model(cfg.qk_accumulator), model(cfg.pv_accumulator)
    if cfg.causal:  # FA's n_block_max for each row's block of Br rows
        block_last = np.minimum(rows_total, (rows_abs // cfg.block_r + 1) * cfg.block_r) - 1
        tiles_max = -(-np.minimum(s_k, block_last + 1 + s_k - rows_total) // cfg.block_c)
    else:
        tiles_max = np.full(rows, -(-s_k // cfg.block_c))
    # the mass kept and the float64 reference over the whole row (online, float64)
    m_big = np.full(rows, -np.inf)
    mass_stored = np.zeros(rows)
    mass_exact = np.zeros(rows)
    outs, lses = [], []
    for lo_t, hi_t in ranges:
        m = np.full(rows, -np.inf)
        l = np.zeros(rows)
        o = np.zeros((rows, dv))
        tacc = np.zeros((rows, dv)) if cfg.promote_tiles else None
        ref_m = np.full(rows, -np.inf)
        ref_l = np.zeros(rows)
        ref_o = np.zeros((rows, dv))
        for n, t in enumerate(range(lo_t, hi_t), start=1):
            lo, hi = t * cfg.block_c, min(s_k, (t + 1) * cfg.block_c)
            active = t < tiles_max
            vis = _visible(rows_abs, lo, hi, s_k, rows_total, cfg.causal)
            if err2 is not None:  # float64 attention of the keys the split has seen so far
                s64 = (q @ k[lo:hi].T) * scale
                s64 = np.where(vis, s64, -np.inf)
                ref_m, ref_l, ref_o = _online64(ref_m, ref_l, ref_o, s64, v[lo:hi])
            if not active.any():
                continue
            # 1. scores
            s = (ar.r(qs @ ks[lo:hi].T) if qk is None else
                 qk.accumulate(np.zeros((rows, hi - lo), np.float32), qs, ks[lo:hi].T, a_dtype=cfg.input_dtype,
                               b_dtype=cfg.input_dtype).astype(np.float64))
            s = np.where(vis, s, -np.inf)
            # 2-3. max and rescale
            m_tile = np.max(s, axis=1)
            m_new = np.maximum(m, m_tile)
            m_safe = np.where(m_new == -np.inf, 0.0, m_new)
            with np.errstate(invalid="ignore"):
                a = ar.r(ar.r(m - m_safe) * c)
            first = n == 1
            keep = np.zeros(rows, dtype=bool)
            if not first and cfg.rescale_threshold > 0:
                keep = (a >= -cfg.rescale_threshold) & (m != -np.inf)
                m_new = np.where(keep, m, m_new)
                m_safe = np.where(keep, np.where(m == -np.inf, 0.0, m), m_safe)
            alpha = np.where(keep, 1.0, ar.exp2(np.where(m == -np.inf, -np.inf, a)))
            raised = active & (m_tile > m) & (m != -np.inf)
            totals["rescales"] += int(np.count_nonzero(raised & ~keep))
            totals["lazy_skips"] += int(np.count_nonzero(raised & keep))
            m_used = np.where(active, m_new, m)
            # 4-5. P
            ms = np.where(m_new == -np.inf, 0.0, ar.fma(m_safe, c, -cfg.max_offset))
            with np.errstate(invalid="ignore"):
                x = ar.fma(s, c, -ms[:, None])
            p = np.where(vis, ar.exp2(x), 0.0)
            # 6. l
            l_new = ar.r(l * alpha)
            if ar.fp32:  # float32 additions, each correctly rounded: R(l + P_k) in order
                l32, p32 = l_new.astype(np.float32), p.astype(np.float32)
                for j in range(p.shape[1]):
                    l32 += p32[:, j]
                l_new = l32.astype(np.float64)
            else:
                l_new = l_new + np.sum(p, axis=1)
            # 7. the stored P
            pp = ar.r(p * cfg.p_scale) if cfg.p_scale != 1.0 else p
            stored, _ = cast(pp, cfg.p_dtype)
            sat = (np.abs(pp) > formats.get(cfg.p_dtype).max) if cfg.p_dtype in FP8 else np.zeros(pp.shape, bool)
            live = vis & active[:, None]
            totals["p_entries"] += int(np.count_nonzero(live))
            totals["p_saturated"] += int(np.count_nonzero(sat & live))
            totals["p_flushed"] += int(np.count_nonzero((p > 0) & (stored == 0) & live))
            # 8. O
            o_new = ar.r(o * alpha[:, None])
            t_new = ar.r(tacc * alpha[:, None]) if tacc is not None else None
            target = t_new if t_new is not None else o_new
            with np.errstate(over="ignore", invalid="ignore"):
                if pv is None:
                    target = ar.r(target + stored @ vs[lo:hi])
                else:
                    target = pv.accumulate(target.astype(np.float32), stored, vs[lo:hi], a_dtype=cfg.p_dtype,
                                           b_dtype=cfg.input_dtype).astype(np.float64)
            if not np.isfinite(target[active]).all():  # inf in O poisons the row; the models take finite values
                raise RunError(f"O overflowed {cfg.arithmetic} in the P.V product of key tile {t} (P x p_scale "
                               f"up to {2.0 ** (cfg.max_offset + cfg.rescale_threshold) * cfg.p_scale:g}, summed "
                               "over the keys): a smaller --p-scale keeps it finite")
            if t_new is not None:
                t_new = target
                if n % cfg.promote_tiles == 0 or t == hi_t - 1:
                    o_new = ar.r(o_new + t_new)
                    t_new = np.zeros_like(t_new)
            else:
                o_new = target
            a2 = active[:, None]
            m, l, o = np.where(active, m_new, m), np.where(active, l_new, l), np.where(a2, o_new, o)
            if tacc is not None:
                tacc = np.where(a2, t_new, tacc)
            # the mass: stored P undone to the row's own frame, against 2^((S - M) c), float64 online
            s_ok = np.where(live, s, -np.inf)
            big_new = np.maximum(m_big, np.max(s_ok, axis=1))
            safe = np.where(big_new == -np.inf, 0.0, big_new)
            shrink = np.where(m_big == -np.inf, 0.0, np.exp2((m_big - safe) * c))
            w = np.where(live, stored / cfg.p_scale, 0.0) * np.exp2((np.where(np.isfinite(m_used), m_used, 0.0)
                                                                   - safe) * c - cfg.max_offset)[:, None]
            with np.errstate(invalid="ignore"):
                e = np.where(live, np.exp2((s - safe[:, None]) * c), 0.0)
            mass_stored = mass_stored * shrink + np.sum(w, axis=1)
            mass_exact = mass_exact * shrink + np.sum(e, axis=1)
            m_big = big_new
            if err2 is not None:
                part = (o + (tacc if tacc is not None else 0.0)) * (vd / cfg.p_scale)
                with np.errstate(invalid="ignore", divide="ignore"):
                    part = np.where(l[:, None] > 0, part / l[:, None], 0.0)
                    ref = np.where(ref_l[:, None] > 0, ref_o / ref_l[:, None], 0.0)
                acc = err2.setdefault(t, [0.0, 0.0])
                acc[0] += float(np.sum((part - ref) ** 2))
                acc[1] += float(np.sum(ref ** 2))
        # the split's normalised output and lse
        with np.errstate(divide="ignore"):
            inv = np.where(l > 0, ar.r(1.0 / np.where(l > 0, l, 1.0)), 0.0)
        f = ar.r(inv * ar.r(vd / cfg.p_scale))
        o_s = ar.r(o * f[:, None])
        m_safe_end = np.where(m == -np.inf, 0.0, m)
        lg = ar.log(ar.r(l * 2.0 ** -cfg.max_offset))
        lse_s = np.where(l > 0, ar.fma(m_safe_end, ar.r(c * math.log(2.0)), np.where(l > 0, lg, 0.0)), -np.inf)
        outs.append(o_s)
        lses.append(lse_s)
    if len(ranges) == 1:
        o_fin, lse_fin = outs[0], lses[0]
    else:
        o_fin, lse_fin = _combine(outs, lses, cfg.combine_order, ar)
    if cfg.out_dtype != "fp32":
        o_fin = formats.get(cfg.out_dtype).round(o_fin)
    with np.errstate(invalid="ignore", divide="ignore"):
        kept = np.where(mass_exact > 0, mass_stored / mass_exact, np.nan)
    return o_fin, lse_fin, kept


def _combine(outs, lses, order, ar):
    idx = list(range(len(outs)))
    if order == "reverse":
        idx.reverse()
    lse = np.stack(lses)
    lse_max = np.max(lse, axis=0)
    lse_max = np.where(lse_max == -np.inf, 0.0, lse_max)
    total = np.zeros_like(lse_max)
    for s in idx:
        total = ar.r(total + ar.exp(ar.r(lse[s] - lse_max)))
    lse_fin = np.where(total > 0, ar.r(ar.log(np.where(total > 0, total, 1.0)) + lse_max), np.inf)
    o = np.zeros_like(outs[0])
    for s in idx:
        with np.errstate(invalid="ignore"):
            w = ar.exp(ar.r(lse[s] - lse_fin))
        w = np.where(np.isfinite(lse_fin), w, 0.0)
        o = ar.fma(w[:, None], outs[s], o)
    return o, lse_fin


def _online64(m, l, o, s, v):
    """One tile of float64 online softmax (the reference's, for prefixes)."""
    m_new = np.maximum(m, np.max(s, axis=1))
    safe = np.where(m_new == -np.inf, 0.0, m_new)
    alpha = np.where(m == -np.inf, 0.0, np.exp(m - safe))
    with np.errstate(invalid="ignore"):
        e = np.where(np.isfinite(s), np.exp(s - safe[:, None]), 0.0)
    return m_new, l * alpha + np.sum(e, axis=1), o * alpha[:, None] + e @ v


def reference(q, k, v, causal: bool = False, softmax_scale: float | None = None, block: int = 512) -> np.ndarray:
    """float64 attention of the inputs as given: softmax(q k^T scale) v,
    a tile of keys at a time (online, in float64: a relative error of a few
    float64 roundings, far below any fp32 effect measured here)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[1])
    rows, s_k = q.shape[0], k.shape[0]
    m, l, o = np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, v.shape[1]))
    for lo in range(0, s_k, block):
        hi = min(s_k, lo + block)
        s = (q @ k[lo:hi].T) * scale
        s = np.where(_visible(np.arange(rows), lo, hi, s_k, rows, causal), s, -np.inf)
        m, l, o = _online64(m, l, o, s, v[lo:hi])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(l[:, None] > 0, o / l[:, None], 0.0)
