"""The spec_verify contract of compare model --contracts (experiments/contracts.py
runs it beside prefill_vs_decode, through its measure and its fp64 verdict).

Speculative decoding verifies k drafted tokens in one forward pass of
M = k + 1 rows over the KV cache, where plain decoding computes one row a
step; the two take different GEMM and attention paths, so the "same" logits
can differ in their last bits, and a greedy verify then rejects a draft that
decoding would have produced. The contract: the prompt prefilled, then the
sequence walked in windows of M positions; at each window the cache (built
by decoding, one token a step) is copied and fed the M tokens as one verify
chunk, while the decode session goes on through the same M positions one
token a step. Reference: the decoded rows; compared: the verify rows. For
k = 1, 2, 4, 8 (--draft-widths).

Beside the contract's figures (contracts.measure: share bit-identical, max
|Δ logprob| in nats and ulps, the first position that differs and its top-2
margin; the fp64 re-run's verdict), first_flip() names the first position
whose greedy token the verify chunk changes, with the decoded top-2 margin
there, and acceptance() the greedy verification of a draft under both
streams. The draft is the sequence's own next tokens, or a draft model's or a
token stream's (--draft, --draft-tokens: experiments/spec_draft.py), fed as
the window's chunk on both sides: the decoded rows' rejections are the
draft's own disagreement, the verify rows' extra ones the acceptance lost to
numerics, and each window whose accepted count differs has exactly one flip
that changed it (the first row where the two streams disagree about the
draft token: before it both accept, after it the window is over for one of
them); those flips are counted, and how many sit at a near tie.
"""

from __future__ import annotations

import numpy as np

from precisionlab.catalog import formats

DRAFT_WIDTHS = (1, 2, 4, 8)
CONTRACT = "spec_verify"
# A flip at a near tie: the decoded top-1/top-2 margin within this many ulps (of the run's dtype at the top-1
# logit). A reordered sum of up to 9 partial results, each rounded, moves each logit by up to about 4 ulps and
# so the margin by up to about 8; a flip across a wider margin is more than the verify path's rounding.
NEAR_TIE_ULPS = 8


def plan(widths, steps: int) -> list[tuple[str, str, dict]]:
    """The contract's rows, one a draft width whose window (k + 1 positions)
    fits in the `steps` decoded positions after the prompt."""
    return [(CONTRACT, f"verify k={k}, M={k + 1}", {"draft": k})
            for k in widths if k + 1 <= steps]


def windows(start: int, n: int, m: int) -> range:
    """The first positions of the windows of m positions from `start` that fit in n."""
    return range(start, n - m + 1, m)


def contract(ctx, model, draft: int):
    """(decoded rows, verify rows, the first position compared): positions
    prompt ... the last whole window of M = draft + 1, each window's chunk the
    sequence's token there and the draft's k tokens (ctx.proposals)."""
    m = draft + 1
    engine, seq, start = ctx.engine, ctx.seq, ctx.prefix
    decode = engine.session(model)
    decode(seq[:start])  # the prompt, prefilled
    ref, got = [], []
    for pos in windows(start, len(seq), m):
        chunk = [seq[pos], *ctx.proposals(pos, draft)]
        got.append(engine.fork(decode)(chunk))  # verify: M rows in one pass over the decoded cache
        if chunk == seq[pos:pos + m]:  # the draft is the sequence here: the decode session walks it itself
            ref.extend(decode([t]) for t in chunk)
            continue
        side = engine.fork(decode)  # the draft's tokens one a step on a copy; the session walks the sequence on
        ref.extend(side([t]) for t in chunk)
        for t in seq[pos:pos + m]:
            decode([t])
    return ctx.torch.cat(ref), ctx.torch.cat(got), start


def _margins_ulps(a: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row's top-1/top-2 logit margin, and the same in ulps of `dtype` at its top-1 logit."""
    top2 = np.sort(a, axis=1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]
    return margins, margins / formats.get(dtype).spacing(top2[:, 1])


def first_flip(ref, got, start: int, dtype: str) -> dict:
    """The first position whose argmax differs between the two runs, with the
    reference's top-1/top-2 logit margin there (in logits and in ulps of
    `dtype`), and how many positions flip at a near tie (NEAR_TIE_ULPS)."""
    a = ref.detach().cpu().double().numpy()
    b = got.detach().cpu().double().numpy()
    flips = np.flatnonzero(a.argmax(axis=1) != b.argmax(axis=1))
    margins, ulps = _margins_ulps(a, dtype)
    first = int(flips[0]) if flips.size else None
    return {"first_flip_position": None if first is None else start + first,
            "margin_at_first_flip": None if first is None else float(margins[first]),
            "margin_ulps_at_first_flip": None if first is None else float(ulps[first]),
            "near_tie_flips": int(np.count_nonzero(ulps[flips] <= NEAR_TIE_ULPS))}


def _accepted(top: np.ndarray, row: int, drafts: list[int]) -> int:
    """Greedy verification: the drafts accepted from `row` on, up to the first whose row's argmax disagrees."""
    n = 0
    while n < len(drafts) and top[row + n] == drafts[n]:
        n += 1
    return n


def acceptance(ref, got, drafts: list[list[int]], dtype: str) -> dict:
    """Greedy verification of each window's draft (drafts[w]: k tokens; the
    window's rows are w * (k + 1) ...; row j judges draft j, the last row
    gives the bonus token) under the decoded rows and under the verify rows.
    acceptance_lost: their difference; draft_rejected: the decoded rows' own
    rejections (the draft's disagreement with the target); acceptance_flips:
    the windows whose count differs, each through one flip (the first row where
    one stream accepts and the other does not), and how many of those sit at
    a near tie. Each such flip moves the count by 1 to k: so |acceptance_lost|
    <= k x acceptance_flips, equal to it where every flip loses and is the
    window's last draft (k = 1 and a draft decoding accepts)."""
    a = ref.detach().cpu().double().numpy()
    b = got.detach().cpu().double().numpy()
    top_a, top_b = a.argmax(axis=1), b.argmax(axis=1)
    _, ulps = _margins_ulps(a, dtype)
    counts = {"drafts": 0, "accepted_decode": 0, "accepted_verify": 0, "acceptance_flips": 0,
              "acceptance_flips_near_tie": 0}
    m = (len(drafts[0]) + 1) if drafts else 1
    for w, d in enumerate(drafts):
        n_dec, n_ver = _accepted(top_a, w * m, d), _accepted(top_b, w * m, d)
        counts["drafts"] += len(d)
        counts["accepted_decode"] += n_dec
        counts["accepted_verify"] += n_ver
        if n_dec != n_ver:
            counts["acceptance_flips"] += 1
            counts["acceptance_flips_near_tie"] += int(ulps[w * m + min(n_dec, n_ver)] <= NEAR_TIE_ULPS)
    n = counts["drafts"]
    counts |= {"acceptance_lost": counts["accepted_decode"] - counts["accepted_verify"],
               "draft_rejected": n - counts["accepted_decode"],
               "acceptance_rate_decode": counts["accepted_decode"] / n if n else None,
               "acceptance_rate_verify": counts["accepted_verify"] / n if n else None}
    return counts


def extra(ctx, contract_name: str, ref, got, start: int, kw: dict, dtype: str) -> dict:
    """The fields this contract adds to its rows (none for the others): k, the
    first flip, and the acceptance of greedy verification."""
    if contract_name != CONTRACT:
        return {}
    k = kw["draft"]
    drafts = [ctx.proposals(pos, k) for pos in windows(start, len(ctx.seq), k + 1)]
    return {"draft": k, **first_flip(ref, got, start, dtype), **acceptance(ref, got, drafts, dtype)}


def takeaways(rows: list[dict], draft_from: str) -> list[str]:
    """One line a dtype: the acceptance each width loses to numerics, beside the draft's own rejections."""
    out = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows if r["contract"] == CONTRACT):
        mine = [r for r in rows if r["contract"] == CONTRACT and r["dtype"] == dtype and r["supported"]]
        if not mine:
            continue
        parts = [f"k={r['draft']}: decoding accepts {r['accepted_decode']} of {r['drafts']} drafts "
                 f"({r['draft_rejected']} rejected: the draft's own), the verify chunk {r['accepted_verify']}: "
                 f"{r['acceptance_lost']} lost to numerics at {r['acceptance_flips']} flips, "
                 f"{r['acceptance_flips_near_tie']} of them near ties" for r in mine]
        out.append(f"{dtype} spec_verify, {draft_from} as the draft: " + "; ".join(parts) + ".")
    return out
