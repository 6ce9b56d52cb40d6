"""attention: the FlashAttention emulator (numerics/flash_attention.py) at one
set of knobs, over a sweep of logit spreads, against float64 and against the
bf16 path (same tiling, P in bf16, fp32 accumulation).

Inputs, one head: k, v standard normal (S x d), q = std z with z standard
normal (rows x d), softmax_scale 1/sqrt(d), so the logits q.k/sqrt(d) have
standard deviation `std`; seeded by (seed, the std's index)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from precisionlab.io import inputs
from precisionlab.numerics import flash_attention as fa
from precisionlab.runtime import memory
from precisionlab.errors import UsageError

JUMP = 10.0  # the running error's growth from one tile to the next that marks a jump
MAX_SEQ = 1 << 17


@dataclass
class AttentionConfig:
    seq: int = 4096
    rows: int = 128
    dim: int = 128
    stds: tuple[float, ...] = (0.5, 1.0, 2.0)
    seed: int = 0
    flash: fa.FlashConfig = field(default_factory=fa.FlashConfig)


@dataclass
class AttentionResult:
    params: dict
    rows: list[dict]
    takeaways: list[str]


def check(cfg: AttentionConfig) -> None:
    for name, v, hi in (("--seq", cfg.seq, MAX_SEQ), ("--rows", cfg.rows, MAX_SEQ), ("--dim", cfg.dim, 1024)):
        if not 0 < v <= hi:
            raise UsageError(f"{name} {v}: between 1 and {hi}")
    if not cfg.stds or not all(math.isfinite(s) and 0 < s <= 64 for s in cfg.stds):
        raise UsageError(f"--std {','.join(map(str, cfg.stds))}: positive numbers up to 64")
    try:
        cfg.flash.check()
    except ValueError as e:
        raise UsageError(str(e)) from None
    if cfg.flash.causal and cfg.rows > cfg.seq:
        raise UsageError("--causal needs --rows <= --seq (the rows are the last positions)")
    f = cfg.flash
    peak = max((m.peak_bytes(min(cfg.rows, fa.CHUNK_ROWS), cfg.dim, min(f.block_c, cfg.seq))
                for m in (fa.model(f.pv_accumulator), fa.model(f.qk_accumulator)) if m is not None), default=0)
    inputs.check_memory(memory.attention(cfg.rows, cfg.seq, cfg.dim, f.block_c, fa.CHUNK_ROWS, peak, f.splits),
                        f"attention --seq {cfg.seq} --rows {cfg.rows} --dim {cfg.dim} --splits {f.splits}")


def draw(cfg: AttentionConfig, i: int, std: float):
    rng = np.random.default_rng([cfg.seed, i])
    k = rng.standard_normal((cfg.seq, cfg.dim))
    v = rng.standard_normal((cfg.seq, cfg.dim))
    return std * rng.standard_normal((cfg.rows, cfg.dim)), k, v


def first_jump(errors: list[float]) -> int | None:
    """The index of the first tile whose running error is > JUMP x the tile's before."""
    for i in range(1, len(errors)):
        if errors[i - 1] > 0 and errors[i] > JUMP * errors[i - 1]:
            return i
    return None


def run(cfg: AttentionConfig, advance=lambda k=1: None) -> AttentionResult:
    check(cfg)
    knobs = asdict(cfg.flash)
    rows = []
    for i, std in enumerate(cfg.stds):
        q, k, v = draw(cfg, i, std)
        ref = fa.reference(q, k, v, cfg.flash.causal)
        t0 = time.perf_counter()
        got = fa.attention(q, k, v, cfg.flash)
        dt = time.perf_counter() - t0
        base = fa.attention(q, k, v, fa.bf16_path(cfg.flash), track=False).out
        advance()
        jump = first_jump(got.running_rel_l2)
        rows.append({
            **knobs, "seq": cfg.seq, "rows": cfg.rows, "dim": cfg.dim, "std": std, "seed": cfg.seed,
            "rel_l2": _rel(got.out, ref), "max_abs_error": float(np.max(np.abs(got.out - ref))),
            "rel_l2_vs_bf16": _rel(got.out, base), "max_abs_diff_vs_bf16": float(np.max(np.abs(got.out - base))),
            "bf16_rel_l2": _rel(base, ref),
            "min_mass_kept": float(np.nanmin(got.mass_kept)), "mean_mass_kept": float(np.nanmean(got.mass_kept)),
            "p_entries": got.p_entries, "p_saturated": got.p_saturated, "p_flushed": got.p_flushed,
            "rescales": got.rescales, "lazy_skips": got.lazy_skips,
            "jump_position": None if jump is None else got.tile_ends[jump - 1],
            "tile_ends": got.tile_ends, "running_rel_l2": got.running_rel_l2, "time_s": dt})
    return AttentionResult(params={**knobs, "seq": cfg.seq, "rows": cfg.rows, "dim": cfg.dim,
                                   "stds": list(cfg.stds), "seed": cfg.seed, "device": "cpu"},
                           rows=rows, takeaways=takeaways(rows))


def _rel(a, b) -> float:
    den = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / den if den > 0 else float(np.linalg.norm(a - b))


def takeaways(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        if r["p_saturated"]:
            top = 2.0 ** (r["max_offset"] + r["rescale_threshold"]) * r["p_scale"]
            out.append(f"std {r['std']:g}: {r['p_saturated']} of {r['p_entries']} P entries saturated at "
                       f"{r['p_dtype']}'s max (P can reach 2^(max_offset + threshold) x p_scale = {top:g}); error "
                       f"against the bf16 path {r['rel_l2_vs_bf16']:.3g}.")
        if r["min_mass_kept"] < 0.99:
            out.append(f"std {r['std']:g}: a row keeps only {r['min_mass_kept']:.3f} of its probability mass "
                       f"({r['p_flushed']} P entries flushed to zero in {r['p_dtype']}).")
        if r["jump_position"] is not None:
            out.append(f"std {r['std']:g}: the running error first jumps > {JUMP:g}x in the tile starting at key "
                       f"{r['jump_position']}.")
    return out


