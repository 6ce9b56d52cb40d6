"""A test engine, `shift:C[,ids=1][,top=K]`: the embedded model's fp32 logits
plus the constant C, handed over as numpy rows the way a real engine's are (an
ExternalEngine, like llama.cpp's: no torch modules, computes as it was
opened). Softmax ignores a constant shift, so `compare model --engine` has an
exact answer against the embedded reference: KL 0, top-1 agreement 100 %, the
same greedy path, a max |Δ logit| of C, and 0 once the shift is removed, each
up to the float32 rounding of the addition.

ids=1 declares no vocabulary (the engine reads the reference's token ids, as
an ONNX file without one does); top=K declares that only the top K
log-probabilities come back (as an endpoint's do). Registered by a test with
one line: registry.register("shift", ShiftEngine).
"""

from __future__ import annotations

from precisionlab.engines.external import ExternalEngine, int_opt, split_spec
from precisionlab.errors import UsageError

KEYS = {"ids": "1: no vocabulary, read the reference's ids (default 0)",
        "top": "K: only the top K log-probabilities come back (default 0: every logit)"}


class ShiftEngine(ExternalEngine):
    ENGINE = "shift (a test engine)"

    @classmethod
    def check(cls, arg):
        shift, opts = split_spec(arg, "shift", KEYS)
        try:
            float(shift)
        except ValueError:
            raise UsageError(f"engine shift: {shift!r} is not a number") from None
        int_opt(opts, "ids", 0, "shift")
        int_opt(opts, "top", 0, "shift")

    def __init__(self, arg, device: str):
        from precisionlab.engines.embedded import EmbeddedEngine

        self.check(arg)
        shift, opts = split_spec(arg, "shift", KEYS)
        self.inner = EmbeddedEngine(None, "cpu")
        self.shift = float(shift)
        self.vocabulary = int_opt(opts, "ids", 0, "shift") == 0
        self.top_k = int_opt(opts, "top", 0, "shift") or None
        self.name, self.device, self.max_len = f"shift:{arg}", "cpu", self.inner.max_len
        self.vocab, self.version = int(self.inner.info()["vocab"]), "test"
        self.settings = {"shift": self.shift, "vocabulary": self.vocabulary, "top_k": self.top_k}

    def encode(self, text: str, source: str = "--prompt") -> list[int]:
        if not self.vocabulary:
            raise UsageError(f"{self.name}: reads the reference's token ids")
        return self.inner.encode(text, source)

    def decode(self, ids) -> str:
        return self.inner.decode(ids) if self.vocabulary else ""

    def rows(self, ids):
        import torch

        with torch.no_grad():
            logits = self.inner.forward(self.inner.base, torch.tensor([ids]))[0]
        return logits.double().numpy() + self.shift  # logits() rounds them to float32

    def top_logprobs(self, ids: list[int]) -> list[dict[int, float]]:
        import numpy as np

        from precisionlab.numerics.distribution import log_softmax

        lp = log_softmax(self.logits(ids)[:-1])
        return [{int(j): float(row[j]) for j in np.argsort(-row, kind="stable")[:self.top_k]} for row in lp]
