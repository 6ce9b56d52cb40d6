"""Attention kernels a user might pass to `attention-cases --impl`: one
correct split-KV kernel (tiles of 128 keys, the partitions combined by their
log-sum-exp, the sink folded into the first partition's running state), and
the same kernel with one bug planted each, as shipped in 2026 kernels.

Written from the calling convention (precisionlab/experiments/attention_kernels.py's
docstring), in float64 numpy, never from the project's emulator."""

import ml_dtypes
import numpy as np

TILE = 128


def _rope(x, pos, base, table):
    d = x.shape[1]
    half = d // 2
    theta = base ** (-2.0 * np.arange(half) / d)
    p = np.asarray(pos, np.float64)
    if table == "bf16":  # the bug: the phase table in bf16, the position rounded first
        p = p.astype(ml_dtypes.bfloat16).astype(np.float64)
        phase = (p[:, None] * theta[None, :]).astype(ml_dtypes.bfloat16).astype(np.float64)
    else:
        phase = p[:, None] * theta[None, :]
    c, s = np.cos(phase), np.sin(phase)
    a, b = x[:, :half], x[:, half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=1)


def _scores(q, k, scale, mask, softcap, window, q_pos, rope_base, bug):
    keys = k.shape[0]
    if rope_base is not None:
        table = "bf16" if bug == "bf16_rope_table" else "fp64"
        q, k = _rope(q, q_pos, rope_base, table), _rope(k, np.arange(keys), rope_base, table)
    raw = (q @ k.T) * scale
    vis = np.ones(raw.shape, bool) if mask is None else np.asarray(mask, bool).copy()
    if window is not None:
        j = np.arange(keys)[None, :]
        p = np.asarray(q_pos)[:, None]
        vis &= (j >= p - window) & (j <= p)
    s = raw if softcap is None else softcap * np.tanh(raw / softcap)
    return np.where(vis, s, -np.inf), np.where(vis, raw, -np.inf), vis


def _partition(s, raw, v, lo, hi, sink, bug, first=True):
    """One split's running (m, l, o) over tiles lo ... hi, the sink folded in
    when `sink` is given: m = sink, l = 1 to start."""
    rows = s.shape[0]
    m = np.full(rows, -np.inf if sink is None else sink)
    l = np.zeros(rows) if sink is None else np.ones(rows)
    o = np.zeros((rows, v.shape[1]))
    for t0 in range(lo, hi, TILE):
        t1 = min(hi, t0 + TILE)
        st = s[:, t0:t1]
        # the bugs: the max taken over the raw scores, the cap applied after it (everywhere, or only in the
        # partitions after the first: a split path seeded from the uncapped scores)
        uncapped = bug == "softcap_after_max" or (bug == "softcap_split_seed" and not first)
        top = np.max(raw[:, t0:t1] if uncapped else st, axis=1)
        m_new = np.maximum(m, top)
        with np.errstate(invalid="ignore", over="ignore"):
            if bug == "empty_split_nan":  # the bug: no guard for a tile that sees no key (-inf - -inf)
                alpha, p = np.exp(m - m_new), np.exp(st - m_new[:, None])
            else:
                safe = np.where(np.isfinite(m_new), m_new, 0.0)
                alpha = np.where(np.isfinite(m), np.exp(m - safe), 0.0)
                p = np.where(np.isfinite(st), np.exp(st - safe[:, None]), 0.0)
        l = l * alpha + p.sum(axis=1)
        if bug == "bf16_denominator":  # the bug: the running denominator held in bf16 between tiles
            l = l.astype(ml_dtypes.bfloat16).astype(np.float64)
        o = o * alpha[:, None] + p @ v[t0:t1]
        m = m_new
    return m, l, o


def make(bug=None):
    def attention(q, k, v, *, scale, mask=None, sink=None, softcap=None, window=None, q_pos=None, rope_base=None,
                  splits=1):
        out_dtype = q.dtype
        q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
        s, raw, _ = _scores(q, k, scale, mask, softcap, window, q_pos, rope_base, bug)
        keys = k.shape[0]
        tiles = -(-keys // TILE)
        per = -(-tiles // splits)
        parts = []
        for i in range(splits):
            lo, hi = min(keys, i * per * TILE), min(keys, (i + 1) * per * TILE)
            with_sink = sink if (sink is not None and bug != "sink_dropped" and (i == 0 or bug == "sink_twice")) \
                else None
            parts.append(_partition(s, raw, v, lo, hi, with_sink, bug, first=i == 0))
        with np.errstate(invalid="ignore", divide="ignore"):
            lse = np.stack([np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf) for m, l, _ in parts])
            if bug == "empty_split_nan":  # the bug: each split normalised without a guard (0 / 0 = NaN)
                outs = [o / l[:, None] for _, l, o in parts]
            else:
                outs = [np.where(l[:, None] > 0, o / np.where(l > 0, l, 1.0)[:, None], 0.0) for _, l, o in parts]
            top = np.max(lse, axis=0)
            safe = np.where(np.isfinite(top), top, 0.0)
            w = np.exp(lse - safe)
            total = w.sum(axis=0)
            out = sum(w[i][:, None] * outs[i] for i in range(splits))
            out = np.where(total[:, None] > 0, out / np.where(total > 0, total, 1.0)[:, None], 0.0) \
                if bug != "empty_split_nan" else out / total[:, None]
        return out.astype(out_dtype)

    attention.__name__ = bug or "correct"
    return attention


correct = make()
sink_twice = make("sink_twice")
sink_dropped = make("sink_dropped")
empty_split_nan = make("empty_split_nan")
bf16_denominator = make("bf16_denominator")
bf16_rope_table = make("bf16_rope_table")
softcap_after_max = make("softcap_after_max")
softcap_split_seed = make("softcap_split_seed")


def no_sinks(q, k, v, *, scale, splits=1, mask=None):
    """A kernel without sinks, soft-cap, windows or RoPE: those cases are not supported, never failed."""
    return correct(q, k, v, scale=scale, mask=mask, splits=splits)


def raises(q, k, v, **kwargs):
    raise RuntimeError("kernel launch failed")


def prints(q, k, v, **kwargs):
    print("debug output from the kernel")
    return correct(q, k, v, **kwargs)

