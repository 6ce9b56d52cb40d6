"""onnxruntime (`--engine onnx:FILE[,threads=N,provider=NAME,opt=LEVEL,batch=N]`): an
InferenceSession over a graph input_ids (batch, tokens) -> logits (batch,
tokens, vocab), as precisionlab export --to onnx writes it. What decides its
numbers: the graph's dtype (the file), the execution provider, the graph
optimisation level (all: onnxruntime fuses and may reorder), the intra-op
threads and the batch (batch=N: the sequence and N-1 others of its length in
one run), all in info(). The tokenizer is the character vocabulary the file
carries in its metadata (precisionlab.vocab); without one the reference's ids
are used and that is said."""

from __future__ import annotations

import json

from precisionlab.engines.chatter import captured
from precisionlab.engines.external import ExternalEngine, batch_of, batched_knobs, file_spec, split_spec
from precisionlab.errors import UsageError

KEYS = {"threads": "intra_op_num_threads (default: torch's thread count)", "provider": "execution provider (default CPUExecutionProvider)",
        "opt": "graph optimisation: all (default) | basic | off",
        "batch": "prompts in each run: the compared one and N-1 others of its length (default 1)"}
_OPT = {"all": "ORT_ENABLE_ALL", "basic": "ORT_ENABLE_BASIC", "off": "ORT_DISABLE_ALL"}


class OnnxEngine(ExternalEngine):
    @classmethod
    def check(cls, arg):
        path, opts = file_spec(arg, "onnx", KEYS, "onnxruntime")
        if opts.get("opt", "all") not in _OPT:
            raise UsageError(f"engine onnx: opt is one of {', '.join(_OPT)}")
        batched_knobs(opts, "onnx", checking=True)

    def __init__(self, arg, device: str):
        self.check(arg)
        import onnxruntime as ort

        path, opts = split_spec(arg, "onnx", KEYS)
        so = ort.SessionOptions()
        so.intra_op_num_threads, self.batch = batched_knobs(opts, "onnx")
        so.inter_op_num_threads = 1
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPT[opts.get("opt", "all")])
        provider = opts.get("provider", "CPUExecutionProvider")
        if provider not in ort.get_available_providers():
            raise UsageError(f"engine onnx: provider {provider!r} not available here "
                             f"({', '.join(ort.get_available_providers())})")
        with captured("onnxruntime"):  # its logger's lines (fd 2) held back, or under the error line: chatter.py
            try:
                self.sess = ort.InferenceSession(path, sess_options=so, providers=[provider])
            except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph types
                raise UsageError(f"engine onnx:{path}: onnxruntime cannot load it ({str(e).splitlines()[0]})") from None
        meta = self.sess.get_modelmeta().custom_metadata_map
        self.chars = json.loads(meta["precisionlab.vocab"]) if "precisionlab.vocab" in meta else None
        self.vocabulary = self.chars is not None  # without one it reads the reference's ids
        out = self.sess.get_outputs()[0]
        self.vocab = int(out.shape[-1]) if isinstance(out.shape[-1], int) else len(self.chars or [])
        self.settings = {"provider": self.sess.get_providers()[0], "threads": so.intra_op_num_threads,
                         "graph_optimization": opts.get("opt", "all"), "output_type": out.type,
                         "batch_size": self.batch}
        self.device = "cpu"
        self.name = f"onnx:{path}"
        self.max_len = int(meta.get("precisionlab.max_seq_len", 1 << 16))
        self.version = ort.__version__

    ENGINE = "onnxruntime"

    def encode(self, text: str, source: str = "--prompt") -> list[int]:
        if self.chars is None:
            raise UsageError(f"{self.name}: the file carries no vocabulary (precisionlab.vocab)")
        index = {c: i for i, c in enumerate(self.chars)}
        missing = sorted({c for c in text if c not in index})
        if missing:
            raise UsageError(f"{source} has characters {self.name} does not know: {''.join(missing)!r}")
        return [index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids) if self.chars else ""

    def rows(self, ids):
        import numpy as np

        feed = {"input_ids": np.asarray(batch_of(ids, self.batch), dtype=np.int64)}
        with captured("onnxruntime"):  # a run logs too (its arena's growth, a buffer it could not reuse)
            return self.sess.run(None, feed)[0][0]
