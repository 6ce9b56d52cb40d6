"""compare layers --heads: inside attention, head by head (issue 40).

A wrong softmax scale and a wrong query-to-KV-head mapping both show as
"layers.0.self_attn departs"; they differ in which heads depart. Per
attention module two rows are captured on both sides (engines/hooks.py names
them): `<attn>.probs`, the softmax probabilities, and `<attn>.heads`, the
output projection's input split into query heads. Each head is judged as a
tensor of its own, by the same rules and against its own yardstick (that
head's rel-L2 under the view's rounding: REF fp32 vs fp64, REF low vs REF
fp32), so a head that departs is one that departs beyond what rounding costs
that head. The pattern is then read:

  every head departs        a cause every head shares (the scale, the input);
  some heads depart         a per-head cause; where they are exactly the heads
                            whose KV head differs between the interleaved
                            mapping (query head h reads KV head h // group)
                            and the tiled one (h % kv_heads), the mapping is named.
"""

from __future__ import annotations

import numpy as np

from precisionlab.numerics import compare, divergence

KINDS = ("heads", "probs")
# ([batch,] tokens, heads, head_dim) and ([batch,] heads, query, key): counted from the end, a batch axis or none
HEAD_AXIS = {"heads": -2, "probs": -3}
SUFFIXES = {".heads": "heads", ".probs": "probs"}


def kind_of(name: str) -> str | None:
    """A tensor's per-head kind from its name (engines/hooks.py's <attn>.heads, <attn>.probs), else None."""
    return next((k for suffix, k in SUFFIXES.items() if name.endswith(suffix)), None)


def split(a: np.ndarray, kind: str) -> np.ndarray:
    """Head first, its rows kept: (heads, rows, last axis), rows being tokens (a head's outputs) or queries (its
    probabilities), so the scale fit's spread counts rows (numerics/divergence.row_spread)."""
    h = np.moveaxis(a, HEAD_AXIS[kind], 0)
    return h.reshape(h.shape[0], -1, h.shape[-1])


def per_head(kind: str, pairs: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], rounding) -> dict:
    """view -> [{head, error, yardstick, ratio, scale_fit, bias_z, departs}] from each view's
    (YOURS, REF at that view, REF fp32-or-fp64 it is measured against): error = YOURS vs REF,
    yardstick = REF vs its own better-precision run, for that head's values alone.

    A head departs by the overflow and ratio rules. Its scale fit is shown, not judged: a head is a few rows
    (tokens, queries), and on SmolLM2 an exact f32 GGUF under llama.cpp puts the three query heads of one KV
    head at s - 1 = -1.7e-6 (28 fp32 roundings, the heads' own rounding error, consistent over their rows:
    z = 24), a systematic offset no user acts on. The whole tensor's row keeps the scale fit."""
    out = {}
    for view, (y, r, better) in pairs.items():
        Y, R, B = split(y, kind), split(r, kind), split(better, kind)
        heads = []
        for h in range(R.shape[0]):
            err, yard = compare.rel_l2(Y[h], R[h]), compare.rel_l2(R[h], B[h])
            s, z = divergence.scale_fit(Y[h], R[h], yard)
            ratio = compare.ratio(err, yard)
            flags = divergence.judge_tensor(err, yard, ratio=ratio, overflow=divergence.overflow_split(R[h], Y[h]),
                                            rounding=rounding(view))
            heads.append({"head": h, "error": err, "yardstick": yard, "ratio": ratio, "scale_fit": s, "bias_z": z,
                          "departs": bool(flags), "rule": flags[0].rule if flags else None,
                          "reason": flags[0].text if flags else None})
        out[view] = heads
    return out


def flags(rows: list[dict]) -> dict:
    """(module, view) -> [Flag]: a per-head row whose heads depart is flagged by its worst head's rule, so the
    rules apply per head (a head departing alone, under the whole tensor's line, still counts)."""
    out = {}
    for r in rows:
        for view, heads in r.get("per_head", {}).items():
            gone = [h for h in heads if h["departs"]]
            if gone:
                worst = max(gone, key=lambda h: h["ratio"])
                text = f"heads {_list(h['head'] for h in gone)} of {len(heads)} depart (head {worst['head']}: " \
                       f"{worst['reason']})"
                out[(r["module"], view)] = [divergence.Flag(worst["rule"], text, worst["ratio"])]
    return out


def tiled_heads(n_heads: int, kv_heads: int | None) -> list[int]:
    """The query heads whose KV head differs between the interleaved mapping (h // group) and the tiled one
    (h % kv_heads); none without grouped KV heads."""
    if not kv_heads or kv_heads >= n_heads or n_heads % kv_heads:
        return []
    group = n_heads // kv_heads
    return [h for h in range(n_heads) if h // group != h % kv_heads]


def pattern(heads: list[dict], kv_heads: int | None) -> dict:
    """Which heads depart and what that pattern points to."""
    n = len(heads)
    gone = [h["head"] for h in heads if h["departs"]]
    if not gone:
        return {"departing": [], "pattern": "none", "reading": ""}
    ratios = [h["ratio"] for h in heads if h["departs"]]
    span = f"ratios {min(ratios):.3g}x to {max(ratios):.3g}x"
    if len(gone) == n and n > 1:
        return {"departing": gone, "pattern": "all",
                "reading": f"all {n} heads depart ({span}): a cause every head shares (the softmax scale, the "
                           "attention's input), not a head mapping"}
    if kv_heads is None:  # a dump does not say: any KV head count whose tiled mapping moves exactly these heads
        kv_heads = next((kv for kv in range(2, n) if n % kv == 0 and tiled_heads(n, kv) == gone), None)
    tiled = tiled_heads(n, kv_heads)
    reading = f"heads {_list(gone)} of {n} depart ({span}), the others agree to rounding: a per-head cause"
    if tiled and gone == tiled:
        group = n // kv_heads
        reading += (f"; exactly the heads whose KV head differs between the interleaved mapping (query head h "
                    f"reads KV head h // {group}) and the tiled one (h % {kv_heads}): GQA heads tiled instead of "
                    "interleaved?")
    elif kv_heads and kv_heads < n:
        reading += f" (their KV heads, interleaved: {_list(sorted({h // (n // kv_heads) for h in gone}))})"
    return {"departing": gone, "pattern": "all" if len(gone) == n else "some", "reading": reading}


def _list(xs) -> str:
    return ",".join(str(x) for x in xs)


def read(rows: list[dict], views: list[str], kv_heads: int | None) -> list[str]:
    """Each per-head row's pattern per view (row["views"][view]["heads_departing"], ...), and the takeaways:
    per view, the first per-head row (execution order) where heads depart, read; later rows inherit its error."""
    takeaways = []
    for view in views:
        first = None
        for r in rows:
            heads = r.get("per_head", {}).get(view)
            if heads is None or view not in r.get("views", {}):
                continue
            p = pattern(heads, kv_heads)
            r["views"][view].update({"heads_departing": p["departing"], "heads_pattern": p["pattern"]})
            if first is None and p["departing"]:
                first = (r["module"], p["reading"])
        if first:
            end = "" if first[1].endswith("?") else "."
            takeaways.append(f"inside attention ({view}): at {first[0]}, {first[1]}{end}")
    return takeaways
