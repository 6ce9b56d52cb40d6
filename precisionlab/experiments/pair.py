"""compare pair A B: two logits files of one engine at one precision that
should agree (prefill vs decode, chunked vs whole, alone vs batched, or any
pair the user names) judged as a contract, from the files alone.

The yardstick is that precision's rounding on those values: per position,
ROUNDING_DEPTH roundings of the largest |logit| (numerics.compare's
rounding_bound). Given the same pair computed in fp64 (--exact A64 B64), the
verdict is compare contracts' own: a difference that shrinks as rounding
would (by about u_fp64 / u) is rounding; one that stays "persists in fp64:
algorithmic". The first position that differs at all, the first beyond
rounding, and with --chunk N whether the breaks begin at chunk starts (a
boundary bug: the mask or the positions across chunks).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.io import logits_file
from precisionlab.numerics.compare import ROUNDING_DEPTH, logprob_diff_rows, rounding_bound, rounding_ratio

STORED = {"F64": "fp64", "F32": "fp32", "F16": "fp16", "BF16": "bf16"}
DTYPES = formats.PAIR_DTYPES
SLICE = 256  # positions read at a time: a large vocabulary never sits whole in float64


@dataclass
class PairConfig:
    a: str
    b: str
    exact_a: str | None = None
    exact_b: str | None = None
    dtype: str | None = None  # None: the files' metadata `dtype`, else their stored type
    chunk: int | None = None


@dataclass
class PairResult:
    params: dict
    row: dict
    takeaways: list[str]
    failures: list[str]
    timing: dict = field(default_factory=dict)


def _dtype(cfg: PairConfig, fa) -> str:
    if cfg.dtype is not None:
        return formats.parse_one(cfg.dtype, DTYPES, "--dtype")
    said = fa.metadata.get("dtype")
    return said if said in DTYPES else STORED[fa.dtype]


def _open_pair(a: str, b: str, names: tuple[str, str]):
    fa = logits_file.open_file(a, names[0])
    fb = logits_file.open_file(b, names[1])
    logits_file.check_pair(fa, fb, names[1])
    return fa, fb


def per_position(fa, fb) -> dict[str, np.ndarray]:
    """Per position: bit-identical, the largest |Δ log-prob| over the vocabulary
    (inf where one side is non-finite and the other not, or both NaN), and
    A's largest finite |logit| (the rounding scale)."""
    same, diff, scale = [], [], []
    for lo in range(0, fa.positions, SLICE):
        hi = min(lo + SLICE, fa.positions)
        x, y = fa.rows(lo, hi), fb.rows(lo, hi)
        same.append(np.all(x == y, axis=1))  # NaN == NaN is False: two NaNs never agree
        d, sc = logprob_diff_rows(x, y)
        diff.append(d)
        scale.append(sc)
    return {"same": np.concatenate(same), "diff": np.concatenate(diff), "scale": np.concatenate(scale)}


def chunk_starts(beyond: np.ndarray, chunk: int) -> dict:
    """Where the breaks sit against chunks of `chunk` positions: the chunks with
    a break, those whose first break is the chunk's first position, and
    whether the first chunk (nothing before it to get wrong) is clean."""
    n = beyond.size
    broken, at_start = 0, 0
    for c0 in range(0, n, chunk):
        hits = np.flatnonzero(beyond[c0:c0 + chunk])
        if hits.size:
            broken += 1
            at_start += int(hits[0] == 0)
    chunks = (n + chunk - 1) // chunk
    first_clean = not bool(beyond[:chunk].any())
    return {"chunk": chunk, "chunks": chunks, "chunks_broken": broken, "chunks_broken_at_start": at_start,
            "first_chunk_clean": first_clean,
            "at_chunk_starts": bool(broken and at_start == broken and first_clean)}


def run(cfg: PairConfig, advance=lambda k=1: None) -> PairResult:
    if cfg.chunk is not None and cfg.chunk <= 0:
        raise UsageError(f"--chunk takes a positive number of positions (got {cfg.chunk})")
    if (cfg.exact_a is None) != (cfg.exact_b is None):
        raise UsageError("--exact takes the fp64 pair: A64 and B64, both")
    t0 = time.perf_counter()
    fa, fb = _open_pair(cfg.a, cfg.b, ("A", "B"))
    dtype = _dtype(cfg, fa)
    exact = None
    if cfg.exact_a is not None and dtype == "fp64":
        raise UsageError("A and B are fp64 already: --exact (the fp64 pair) adds nothing")
    if cfg.exact_a is not None:
        ea, eb = _open_pair(cfg.exact_a, cfg.exact_b, ("A64", "B64"))
        logits_file.check_pair(fa, ea, "A64")
        exact = per_position(ea, eb)
    pp = per_position(fa, fb)
    advance()
    row = judge(pp, dtype, exact, cfg.chunk)
    takeaways, failures = _say(row, dtype)
    params = {"a": cfg.a, "b": cfg.b, "exact_a": cfg.exact_a, "exact_b": cfg.exact_b, "dtype": dtype,
              "chunk": cfg.chunk, "positions": fa.positions, "vocab": fa.vocab, "rounding_depth": ROUNDING_DEPTH}
    return PairResult(params, row, takeaways, failures, {"run_s": time.perf_counter() - t0})


def judge(pp: dict, dtype: str, exact: dict | None, chunk: int | None) -> dict:
    bound = rounding_bound(dtype, pp["scale"])
    d = pp["diff"]
    beyond = d > bound
    differs = ~pp["same"]
    dmax = float(d.max())
    row = {"positions": int(d.size), "bit_identical_share": float(pp["same"].mean()), "max_abs_diff": dmax,
           "first_diff_position": int(np.argmax(differs)) if differs.any() else None,
           "rounding_bound_at_max": float(bound[int(np.argmax(d))]),
           "beyond_rounding_positions": int(beyond.sum()),
           "first_beyond_rounding_position": int(np.argmax(beyond)) if beyond.any() else None,
           "worst_bound_ratio": float(np.max(d / bound)),
           "exact_max_abs_diff": None, "exact_bit_identical_share": None}
    if not differs.any():
        row |= {"verdict": "holds", "note": "bit-identical"}
    elif exact is not None:
        d64 = float(exact["diff"].max())
        row |= {"exact_max_abs_diff": d64, "exact_bit_identical_share": float(exact["same"].mean())}
        ratio = d64 / dmax if dmax > 0 and math.isfinite(dmax) else (0.0 if d64 == 0 else math.inf)
        if exact["same"].all() or ratio <= rounding_ratio(dtype, "fp64"):
            row |= {"verdict": "rounding", "note": f"rounding: vanishes in fp64 (max |Δ logprob| {dmax:.3g} -> "
                                                   f"{d64:.3g} nats)"}
        else:
            row |= {"verdict": "algorithmic", "note": f"persists in fp64: algorithmic (max |Δ logprob| "
                                                      f"{dmax:.3g} -> {d64:.3g} nats)"}
    elif beyond.any():
        row |= {"verdict": "algorithmic",
                "note": f"beyond {dtype} rounding: algorithmic ({row['worst_bound_ratio']:.3g}x the rounding bound "
                        f"at worst; give the fp64 pair with --exact to confirm it persists in fp64)"}
    else:
        row |= {"verdict": "rounding", "note": f"rounding: within {ROUNDING_DEPTH} roundings of {dtype} at every "
                                               f"position ({row['worst_bound_ratio']:.2g}x the bound at worst)"}
    row["chunks"] = chunk_starts(beyond, chunk) if chunk else None
    return row


def _say(row: dict, dtype: str) -> tuple[list[str], list[str]]:
    lines = [f"A and B ({dtype}): {row['note']}."]
    if row["first_diff_position"] is not None:
        lines.append(f"They first differ at position {row['first_diff_position']}"
                     + (f"; first beyond rounding at {row['first_beyond_rounding_position']} "
                        f"({row['beyond_rounding_positions']} of {row['positions']} positions)"
                        if row["first_beyond_rounding_position"] is not None else "") + ".")
    c = row["chunks"]
    if c and c["chunks_broken"]:
        if c["at_chunk_starts"]:
            lines.append(f"Every break begins at a chunk start ({c['chunks_broken']} of {c['chunks']} chunks of "
                         f"{c['chunk']}; the first chunk clean): a chunk boundary bug (the mask or the positions "
                         "across chunks).")
        else:
            lines.append(f"The breaks do not begin at chunk starts of {c['chunk']} ({c['chunks_broken_at_start']} "
                         f"of {c['chunks_broken']} broken chunks do; first chunk "
                         f"{'clean' if c['first_chunk_clean'] else 'broken'}).")
    failures = [f"A and B break their contract: {row['note']}"] if row["verdict"] == "algorithmic" else []
    return lines, failures
