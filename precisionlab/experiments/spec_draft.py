"""compare contracts --draft SPEC / --draft tokens:FILE: the draft whose
tokens spec_verify's windows verify (experiments/spec_verify.py).

Without either, the draft is the sequence itself (the fp32 greedy stream):
decoding then rejects nothing in fp32, and every rejection the verify chunk
adds is the target's numerics. With a draft, each window's chunk is the
sequence's token at the window's start followed by the draft's k tokens:

- --draft SPEC: a second model (a smaller or quantised export) proposes k
  tokens greedily, in fp32, after the target's sequence up to the window's
  start, as a speculative decoder's draft model would;
- --draft tokens:FILE: a token stream (the formats --token-ids reads) gives
  the draft's token for each position after the prompt: id i is the draft's
  token at position prompt + i (the first of them, the token after the
  prompt, is never judged: every window starts from the sequence's token).

The draft reads the target's token ids. A draft model whose tokenizer reads
the sequence's text into other ids is refused (exit 2) rather than mapped
through text: its tokens would cover other spans than the target's positions,
so "the k positions after the window's start" would not be the same
positions on both sides, and its disagreement would be the tokenizers', not
the draft's. An id the draft proposes outside the target's vocabulary is
refused the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from precisionlab.engines.protocol import greedy, require
from precisionlab.errors import RunError, UsageError
from precisionlab.experiments import startup
from precisionlab.runtime import memory

SEQUENCE = "the sequence"  # draft_from without --draft
TOKENS = "tokens:"  # --draft tokens:FILE, a token stream; any other --draft is a model spec
STREAM = "--draft tokens:"  # draft_from and the messages of a token-stream draft


@dataclass(frozen=True)
class DraftOptions:
    spec: str | None = None          # --draft SPEC: a model spec
    tokens: list[int] | None = None  # --draft tokens:FILE: the stream's ids, read (io/token_ids)
    tokens_file: str | None = None   # where they came from, for the params

    @property
    def given(self) -> str | None:
        return "--draft" if self.spec is not None else STREAM if self.tokens is not None else None


def check(opts: DraftOptions, target: str | None, widths: list, steps: int) -> None:
    """Before anything loads (exit 2): a target that runs a
    verify chunk after a copied cache; a window that fits in --steps; a draft
    model's engine known, openable and giving every logit (its greedy
    proposals read the argmax of the whole vocabulary)."""
    if opts.given is None:
        return
    require(startup.resolve(target, "--model")[0], "forks", f"{opts.given} (a verify chunk after a copied cache)",
            UsageError)
    if not widths:
        raise UsageError(f"{opts.given}: no draft width fits in --steps {steps} (a window is k + 1 <= --steps "
                         "positions)")
    if opts.spec is not None:
        cls, _ = startup.resolve(opts.spec, "--draft")
        if cls.top_k is not None:
            raise UsageError(f"--draft {opts.spec}: its engine returns only the top {cls.top_k} log-probabilities; "
                             "a greedy draft needs every logit")


def load(opts: DraftOptions, device: str, steps: int, prompt: str) -> list[startup.Load]:
    """The draft model's Load beside the target's (none without --draft)."""
    return [] if opts.spec is None else [startup.Load(opts.spec, device, steps, prompt, "--draft")]


def estimate(shapes: list, same_engine: bool) -> int:
    """The draft's bytes (runtime/memory.contracts_draft) from its shape and
    the target's (shapes[0], shapes[1]); 0 where the draft's is unknown."""
    target, draft = shapes[0], shapes[1]
    if draft is None:
        return 0
    return memory.contracts_draft(draft, weights=not same_engine,
                                  fixed=target is None or target.kind != draft.kind)


def proposer(opts: DraftOptions, engine, draft, seq: list[int], start: int, windows: list[int],
             width: int) -> tuple[Callable[[int, int], list[int]] | None, str | None]:
    """(proposals(pos, k): the draft's k tokens after position pos, or None
    for the sequence's own; the draft model's token check). `windows`: every
    window start the widths reach; `width`: the widest k."""
    vocab = int(engine.info()["vocab"])
    if opts.tokens is not None:
        return _from_stream(opts.tokens, start, len(seq) - start, vocab), None
    if draft is None:
        return None, None
    check_note = _same_tokens(opts.spec, engine, draft, seq)
    if len(seq) > draft.max_len:  # its proposals reach the sequence's last position
        raise UsageError(f"--draft {opts.spec}: takes {draft.max_len} positions; the prompt and --steps need "
                         f"{len(seq)}")
    model = draft.model("fp32")
    found = {}
    for pos in windows:  # each window's k tokens, greedy from the sequence up to its start (fp32, the draft's own)
        found[pos], _ = greedy(draft, model, seq[:pos + 1], width, "fp32", where="the draft's greedy proposals")
        bad = [t for t in found[pos] if t >= vocab]
        if bad:
            raise UsageError(f"--draft {opts.spec}: proposed id {bad[0]}, outside the target's vocabulary of "
                             f"{vocab}: the two models do not share a vocabulary")
    return (lambda pos, k: found[pos][:k]), check_note


def _from_stream(ids: list[int], start: int, steps: int, vocab: int) -> Callable[[int, int], list[int]]:
    """The stream's token for each position after the prompt, checked: one a
    position the windows reach (--steps of them), each in the target's vocabulary."""
    if len(ids) < steps:
        raise UsageError(f"{STREAM} holds {len(ids)} ids; the draft needs one for each of the --steps {steps} "
                         "positions after the prompt")
    if max(ids) >= vocab:
        i = max(range(len(ids)), key=ids.__getitem__)
        raise UsageError(f"{STREAM} id {ids[i]} (at {i}) is outside the model's vocabulary of {vocab}")
    return lambda pos, k: ids[pos + 1 - start:pos + 1 - start + k]


def _same_tokens(spec: str, engine, draft, seq: list[int]) -> str:
    """startup.token_check of the two tokenizers on the sequence's text: the
    target's and the draft's own ids for it; a difference is a usage error."""
    if draft is engine:
        return "identical (the target's own engine)"
    text = engine.decode(seq)
    try:
        mine = draft.encode(text, "--draft")
    except (UsageError, NotImplementedError):  # no tokenizer of its own: it reads the target's ids
        mine = None
    try:
        return startup.token_check(engine.encode(text, "--prompt"), mine, f"--draft {spec}")
    except RunError as e:
        raise UsageError(str(e)) from None
