"""CTranslate2 (`--engine ct2:DIR[,compute=TYPE,threads=N]`): a Generator's
forward_batch, which returns every position's logits (a StorageView). What
decides its numbers: the compute_type it runs (asked for, and the one it
actually chose: bfloat16 on a CPU without fast bf16 becomes float32, said so
in info()), intra_threads, and the batch it runs in (batch=N: the sequence
and N-1 others of its length in one forward_batch). The tokenizer is the folder's tokenizer.json
(precisionlab export copies it there), read with the tokenizers package."""

from __future__ import annotations

from pathlib import Path

from precisionlab.engines.chatter import captured
from precisionlab.engines.external import ExternalEngine, batch_of, batched_knobs, need_package, split_spec
from precisionlab.errors import UsageError

KEYS = {"compute": "compute_type (default: the stored type)", "threads": "intra_threads (default: torch's thread count)",
        "batch": "prompts in each forward_batch: the compared one and N-1 others of its length (default 1)"}


class CT2Engine(ExternalEngine):
    @classmethod
    def check(cls, arg):
        path, opts = split_spec(arg, "ct2", KEYS)
        need_package("ctranslate2", "ct2", "ct2")
        if not (Path(path) / "model.bin").is_file():
            raise UsageError(f"engine ct2:{path}: not a CTranslate2 model folder (no model.bin)")
        batched_knobs(opts, "ct2", checking=True)

    def __init__(self, arg, device: str):
        self.check(arg)
        import ctranslate2

        path, opts = split_spec(arg, "ct2", KEYS)
        asked = opts.get("compute", "default")
        threads, self.batch = batched_knobs(opts, "ct2")
        # its logger's lines (fd 2: the CPU, the model, under CT2_VERBOSE) held back, or under the error: chatter.py
        with captured("ctranslate2"):
            try:
                self.gen = ctranslate2.Generator(path, device=device, compute_type=asked, intra_threads=threads)
            except (ValueError, RuntimeError) as e:
                raise UsageError(f"engine ct2:{path}: ctranslate2 cannot load it ({str(e).splitlines()[0]})") from None
        tok = Path(path) / "tokenizer.json"
        self.tok = None
        if tok.is_file():
            from tokenizers import Tokenizer

            self.tok = Tokenizer.from_file(str(tok))
        import json

        self.vocab = len(json.loads((Path(path) / "vocabulary.json").read_text()))
        self.settings = {"compute_type_asked": asked, "compute_type": self.gen.compute_type, "threads": threads,
                         "batch_size": self.batch, "device": device}
        self.device = device
        self.name = f"ct2:{path}"
        self.max_len = 1 << 16
        self.version = ctranslate2.__version__

    ENGINE = "ctranslate2"

    def encode(self, text: str, source: str = "--prompt") -> list[int]:
        if self.tok is None:
            raise UsageError(f"{self.name}: no tokenizer.json in the folder; give --prompt's ids another way")
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        return "" if self.tok is None else self.tok.decode([int(i) for i in ids])

    def rows(self, ids):
        import numpy as np

        with captured("ctranslate2"):  # its logger may speak during a run as well
            return np.array(self.gen.forward_batch(batch_of(ids, self.batch)))[0]
