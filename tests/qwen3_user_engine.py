"""A python: engine spec as a user writes one (docs/your-engine.md's
template, filled in): tests/qwen3_plain.py's independent Qwen3 behind the
Engine protocol, with prefill, KV-cache decode, chunked prefill, left-padded
batches and forked caches. engine(folder, bug) is what a factory returns;
the tests write a two-line module whose factory calls it."""

from __future__ import annotations

import copy

import torch
from qwen3_plain import ATTENTION_BUGS, BUGS, load

from precisionlab.engines.protocol import Engine


class PlainQwen3Engine(Engine):
    batches = True   # forward_batch takes an attention mask and position ids
    forks = True     # fork() copies a KV cache

    def __init__(self, folder: str, bug: str | None = None, device: str = "cpu"):
        from tokenizers import Tokenizer

        assert bug is None or bug in BUGS + ATTENTION_BUGS, bug
        self.base, self.bug, self.device = load(folder), bug, device
        self.tok = Tokenizer.from_file(f"{folder}/tokenizer.json")
        self.name = f"plain-qwen3{'' if bug is None else '+' + bug}"
        self.max_len = self.window = int(self.base.cfg["max_position_embeddings"])

    def info(self):
        return {"name": self.name, "vocab": self.base.cfg["vocab_size"], "max_seq_len": self.max_len,
                "parameters": sum(p.numel() for p in self.base.parameters()), "bug": self.bug}

    def encode(self, text, source="--prompt"):
        return self.tok.encode(text).ids

    def decode(self, ids):
        return self.tok.decode(list(ids))

    def forward(self, model, ids, head_dtype=None):
        return self.forward_batch(model, ids)

    @torch.no_grad()
    def forward_batch(self, model, ids, attention_mask=None, position_ids=None):
        B, T = ids.shape
        keep = torch.ones(B, T, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if self.bug == "unmasked_padding":  # the pads are attended to
            keep = torch.ones_like(keep)
        pos = torch.arange(T).expand(B, T) if position_ids is None else position_ids
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        mask = causal & keep[:, None, :] | torch.eye(T, dtype=torch.bool)  # a pad sees itself: no NaN row
        return model.run(ids, pos, mask, bug=self.bug)

    def session(self, model, stores=None):
        cache: list = []
        return self._feed(model, cache, [0])

    def _feed(self, model, cache, seen):
        @torch.no_grad()
        def feed(ids):
            ids = torch.as_tensor(ids).reshape(1, -1)
            T, past = ids.shape[1], seen[0]
            decoding = past > 0
            shift = 1 if (self.bug == "decode_position" and decoding) else 0
            pos = torch.arange(past, past + T)[None] + shift
            mask = torch.ones(T, past + T, dtype=torch.bool)
            mask[:, past:] = torch.tril(torch.ones(T, T, dtype=torch.bool))
            if self.bug == "chunk_mask" and decoding and T > 1:  # the previous chunk's last position hidden
                mask[:, past - 1] = False
            seen[0] += T
            return model.run(ids, pos, mask[None], cache=cache, bug=self.bug, decoding=decoding)[0]
        feed.state = (model, cache, seen)
        return feed

    def fork(self, feed):
        model, cache, seen = feed.state
        return self._feed(model, [[k.clone(), v.clone()] for k, v in cache], [seen[0]])

    def model(self, dtype):
        from precisionlab.catalog import formats

        return copy.deepcopy(self.base).to(formats.get(dtype).torch_dtype)


def engine(folder: str, bug: str | None = None, device: str = "cpu") -> PlainQwen3Engine:
    return PlainQwen3Engine(folder, bug, device)


class CapturingQwen3Engine(PlainQwen3Engine):
    """The same engine giving its per-layer tensors itself (compare layers --engine, --heads): transformers'
    module names, and inside attention <attn>.probs (heads, query, key) and <attn>.heads (tokens, heads,
    head_dim), as docs/dumps-from-your-engine.md names them."""
    has_modules = False      # not transformers' module tree: hooks cannot watch it
    captures_layers = True

    @torch.no_grad()
    def capture_layers(self, ids):
        record = {}
        x = torch.tensor([list(ids)])
        T = x.shape[1]
        self.base.run(x, torch.arange(T)[None], torch.tril(torch.ones(T, T, dtype=torch.bool))[None],
                      bug=self.bug, record=record)
        return {k: v[0].float().numpy() for k, v in record.items()}  # numpy has no bf16: exact in fp32


def capturing(folder: str, bug: str | None = None, device: str = "cpu") -> CapturingQwen3Engine:
    return CapturingQwen3Engine(folder, bug, device)
