"""llama.cpp through llama-cpp-python (`--engine llamacpp:FILE.gguf[,key=value...]`).

Every position's logits come from one eval() with logits_all=True. The
settings that decide its numbers are the GGUF's tensor types (the file) and
these, all reported by info(): the KV cache's types (kv=f16 is llama.cpp's
default; kv=f32 keeps the cache exact), flash attention (its CPU kernel
accumulates V in f16), n_threads (the order of its sums), n_batch and
n_ubatch (how a prompt is split into graphs). Defaults are llama.cpp's own,
except n_threads=1 (a fixed summation order) and flash=0.
"""

from __future__ import annotations

from pathlib import Path

from precisionlab.engines.external import ExternalEngine, int_opt, need_package, split_spec
from precisionlab.errors import UsageError

KEYS = {"kv": "KV cache type: f16 (llama.cpp's default) | f32 | bf16 | q8_0", "flash": "flash attention 0|1",
        "threads": "n_threads (default 1)", "batch": "n_batch (default 512)", "ubatch": "n_ubatch (default 512)",
        "ctx": "n_ctx (default: the model's, at most 4096)"}
# ggml_type ids (ggml.h) of the KV cache types offered
_KV = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}


class LlamaCppEngine(ExternalEngine):
    @classmethod
    def check(cls, arg):
        path, opts = split_spec(arg, "llamacpp", KEYS)
        need_package("llama_cpp", "llamacpp", "llamacpp")
        if not Path(path).is_file():
            raise UsageError(f"engine llamacpp:{path}: no such file (a .gguf)")
        if opts.get("kv", "f16") not in _KV:
            raise UsageError(f"engine llamacpp: kv={opts['kv']!r}; one of {', '.join(_KV)}")
        if opts.get("flash", "0") not in ("0", "1"):
            raise UsageError("engine llamacpp: flash is 0 or 1")
        for k in ("threads", "batch", "ubatch", "ctx"):
            int_opt(opts, k, 1, "llamacpp")

    def __init__(self, arg, device: str):
        self.check(arg)
        import llama_cpp

        path, opts = split_spec(arg, "llamacpp", KEYS)
        self.path = path
        kv = opts.get("kv", "f16")
        self.settings = {"kv_cache_type": kv, "flash_attn": opts.get("flash", "0") == "1",
                         "n_threads": int_opt(opts, "threads", 1, "llamacpp"),
                         "n_batch": int_opt(opts, "batch", 512, "llamacpp"),
                         "n_ubatch": int_opt(opts, "ubatch", 512, "llamacpp")}
        try:
            probe = llama_cpp.Llama(path, vocab_only=True, verbose=False)
            arch = probe.metadata.get("general.architecture", "")
            train_ctx = int(probe.metadata.get(f"{arch}.context_length", 4096))
            del probe
            ctx = int_opt(opts, "ctx", min(train_ctx, 4096), "llamacpp") or min(train_ctx, 4096)
            self.llm = llama_cpp.Llama(path, logits_all=True, n_ctx=ctx, n_threads=self.settings["n_threads"],
                                       n_threads_batch=self.settings["n_threads"], n_batch=self.settings["n_batch"],
                                       n_ubatch=self.settings["n_ubatch"], type_k=_KV[kv], type_v=_KV[kv],
                                       flash_attn=self.settings["flash_attn"], n_gpu_layers=0, verbose=False)
        except (ValueError, RuntimeError) as e:
            raise UsageError(f"engine llamacpp:{path}: llama.cpp cannot load it ({str(e).splitlines()[0]})") from None
        self.settings["n_ctx"] = ctx
        self.device = "cpu"
        self.name = f"llamacpp:{path}"
        self.vocab = int(self.llm.n_vocab())
        self.max_len = ctx
        self.window = min(1024, ctx)
        meta = self.llm.metadata
        self.file_type = meta.get("general.file_type")
        self.version = getattr(llama_cpp, "__version__", "?")

    def info(self) -> dict:
        return {"name": self.name, "engine": "llama.cpp", "version": self.version, "vocab": self.vocab,
                "max_seq_len": self.max_len, "parameters": None, "gguf_file_type": self.file_type,
                **self.settings, **self.trim_note()}

    def encode(self, text: str, source: str = "--prompt") -> list[int]:
        # add_bos=True: a BOS only where the GGUF says the model wants one (llama.cpp's rule)
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))

    def decode(self, ids) -> str:
        return self.llm.detokenize([int(i) for i in ids]).decode("utf-8", "replace")

    def rows(self, ids):
        import numpy as np

        if len(ids) > self.max_len:
            raise UsageError(f"{self.name}: {len(ids)} tokens exceed n_ctx {self.max_len}")
        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self.llm.scores[:len(ids)], dtype=np.float32)
