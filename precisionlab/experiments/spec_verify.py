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
there: the acceptance a greedy verifier loses to numerics alone (the draft
here is the decoded token itself, so every flip is a rejection that the
draft model did not cause).
"""

from __future__ import annotations

import numpy as np

DRAFT_WIDTHS = (1, 2, 4, 8)
CONTRACT = "spec_verify"


def plan(widths, steps: int) -> list[tuple[str, str, dict]]:
    """The contract's rows, one a draft width whose window (k + 1 positions)
    fits in the `steps` decoded positions after the prompt."""
    return [(CONTRACT, f"verify k={k}, M={k + 1}", {"draft": k})
            for k in widths if k + 1 <= steps]


def contract(ctx, model, draft: int):
    """(decoded rows, verify rows, the first position compared): positions
    prompt ... the last whole window of M = draft + 1."""
    m = draft + 1
    engine, seq, start = ctx.engine, ctx.seq, ctx.prefix
    decode = engine.session(model)
    decode(seq[:start])  # the prompt, prefilled
    ref, got = [], []
    for pos in range(start, len(seq) - m + 1, m):
        got.append(engine.fork(decode)(seq[pos:pos + m]))  # verify: M rows in one pass over the decoded cache
        ref.extend(decode([t]) for t in seq[pos:pos + m])   # the same positions, one token a step
    return ctx.torch.cat(ref), ctx.torch.cat(got), start


def first_flip(ref, got, start: int) -> dict:
    """The first position whose argmax differs between the two runs, with the
    reference's top-1/top-2 logit margin there, and how many positions flip
    with a margin under 1e-3 of the logits' scale (near ties)."""
    a = ref.detach().cpu().double().numpy()
    b = got.detach().cpu().double().numpy()
    flips = np.flatnonzero(a.argmax(axis=1) != b.argmax(axis=1))
    top2 = np.sort(a, axis=1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    first = int(flips[0]) if flips.size else None
    return {"first_flip_position": None if first is None else start + first,
            "margin_at_first_flip": None if first is None else float(margins[first]),
            "near_tie_flips": int(np.count_nonzero(margins[flips] <= 1e-3 * scale)) if flips.size else 0}


def acceptance(ref, got, seq: list[int], start: int, draft: int) -> dict:
    """Greedy verification of the sequence's own next tokens as the draft:
    in each window of M = draft + 1 rows, row j judges draft token
    seq[pos + j + 1] (j < draft; the last row gives the bonus token), and the
    drafts are accepted up to the first row whose argmax disagrees. Counted
    under the decoded rows and under the verify rows: the difference is the
    acceptance lost to numerics; the decoded rows' own rejections are the
    draft's disagreement with this run (the sequence is the fp32 greedy
    stream, so in fp32 none)."""
    m = draft + 1
    a = ref.detach().cpu().double().numpy().argmax(axis=1)
    b = got.detach().cpu().double().numpy().argmax(axis=1)
    counts = {"drafts": 0, "accepted_decode": 0, "accepted_verify": 0}
    for w in range(len(a) // m):
        targets = [seq[start + w * m + j + 1] for j in range(draft)]
        counts["drafts"] += draft
        for key, top in (("accepted_decode", a), ("accepted_verify", b)):
            for j, t in enumerate(targets):
                if top[w * m + j] != t:
                    break
                counts[key] += 1
    counts["acceptance_lost"] = counts["accepted_decode"] - counts["accepted_verify"]
    return counts


def extra(ctx, contract_name: str, ref, got, start: int, kw: dict) -> dict:
    """The fields this contract adds to its rows (none for the others): k, the
    first flip, and the acceptance of greedy verification."""
    if contract_name != CONTRACT:
        return {}
    return {"draft": kw["draft"], **first_flip(ref, got, start),
            **acceptance(ref, got, ctx.seq, start, kw["draft"])}


def takeaways(rows: list[dict]) -> list[str]:
    """One line a dtype: the acceptance each width loses to numerics, beside the draft's own rejections."""
    out = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows if r["contract"] == CONTRACT):
        mine = [r for r in rows if r["contract"] == CONTRACT and r["dtype"] == dtype and r["supported"]]
        if not mine:
            continue
        parts = [f"k={r['draft']}: {r['accepted_verify']} of {r['drafts']} drafts accepted by the verify chunk, "
                 f"{r['accepted_decode']} by decoding ({r['acceptance_lost']} lost to numerics)" for r in mine]
        out.append(f"{dtype} spec_verify, the greedy stream as the draft: " + "; ".join(parts) + ".")
    return out
