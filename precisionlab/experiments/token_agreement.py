"""Where an engine's own tokenizer splits a text differently from the
reference's, as a finding of compare engine (the engine reads the
reference's ids either way, so the comparison itself goes on).

The two id sequences are aligned with difflib (longest matching blocks);
each run of ids that differs is one place, shown as the pieces each side
cut the text into (both decoded by the engine's vocabulary: the same
model's, so an id means one string on both sides) and named by the kind of
text where they disagree: a whitespace run (the pre-tokenizer's \\s+ rules:
llama.cpp's pre-tokenizer keeps "\\n\\n" whole where transformers' split it),
a digit group (\\p{N} grouping), punctuation, or letters (a merge the other
side's BPE did not make). Only places inside the text both sides cover are
counted: the last ids of each side may stop at another character.
"""

from __future__ import annotations

import difflib
from collections import Counter

_MAX_RULES = 5


def _kind(text: str) -> str:
    if not text:
        return "empty"
    if text.isspace():
        return "whitespace run (the pre-tokenizer's \\s+ split)"
    if text.isdigit():
        return "digit group (the pre-tokenizer's \\p{N} grouping)"
    if all(not c.isalnum() and not c.isspace() for c in text):
        return "punctuation"
    return "letters (a BPE merge one side made)"


def _places(ref_ids: list[int], eng_ids: list[int]) -> list[tuple[int, int, int, int]]:
    """(i1, i2, j1, j2) of each differing run inside the text both cover (a run at the end of either is dropped)."""
    ops = difflib.SequenceMatcher(None, ref_ids, eng_ids, autojunk=False).get_opcodes()
    out = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in ops if tag != "equal"]
    if out and (out[-1][1] == len(ref_ids) or out[-1][3] == len(eng_ids)):
        out.pop()
    return out


def finding(ref_ids: list[int], eng_ids: list[int], piece) -> dict:
    """The disagreement between the reference's ids and the engine's over one
    text: places, the positions of the reference they cover, the first, and the
    most common splits with their kind. `piece(id)` is the id's text."""
    places = _places(ref_ids, eng_ids)
    splits: Counter = Counter()
    for i1, i2, j1, j2 in places:
        splits[(tuple(piece(t) for t in ref_ids[i1:i2]), tuple(piece(t) for t in eng_ids[j1:j2]))] += 1
    rules = []
    for (ref_p, eng_p), count in splits.most_common(_MAX_RULES):
        ref_text, eng_text = "".join(ref_p), "".join(eng_p)
        kind = _kind(ref_text) if ref_text == eng_text else "different text (a normaliser or a BOS/EOS)"
        rules.append({"reference": [ascii(p) for p in ref_p], "engine": [ascii(p) for p in eng_p],
                      "places": count, "kind": kind})
    covered = sum(i2 - i1 for i1, i2, _, _ in places)
    return {"places": len(places), "reference_positions": covered, "of_positions": len(ref_ids),
            "first_at": places[0][0] if places else None, "splits": rules}


def describe(f: dict) -> str:
    """One line for the table and the takeaways."""
    if not f["places"]:
        return "no place differs inside the text both cover"
    top = f["splits"][0]
    return (f"{f['places']} places ({f['reference_positions']} of {f['of_positions']} reference tokens), first at "
            f"token {f['first_at']}; most often {top['kind']}: reference {' '.join(top['reference'])} "
            f"against engine {' '.join(top['engine'])} ({top['places']}x)")
