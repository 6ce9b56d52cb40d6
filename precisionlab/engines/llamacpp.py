"""llama.cpp through llama-cpp-python (`--engine llamacpp:FILE.gguf[,key=value...]`).

Every position's logits come from one eval() with logits_all=True. The
settings that decide its numbers are the GGUF's tensor types (the file) and
these, all reported by info(): the KV cache's types (kv=f16 is llama.cpp's
default; kv=f32 keeps the cache exact), flash attention (its CPU kernel
accumulates V in f16), n_threads (the order of its sums), n_batch and
n_ubatch (how a prompt is split into graphs), and the extra weight buffers
(extra=1: AMX and repacked CPU kernels, which compute quantised matmuls in
their own order). Defaults are llama.cpp's own, except n_threads (threads=N,
reported as `threads`): torch's thread count, as the reference runs; llama.cpp
gives each thread whole dot products, so the count has not changed a bit of
its logits (docs/engines.md's run-to-run table), flash=0, and extra=0 for a quantised GGUF on a CPU with AMX:
llama.cpp's AMX kernels (llama-cpp-python 0.3.36) segfault there on small
models (a 128 x 352 MLP in q8_0 or q4_0), and a crash is never an answer.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from precisionlab.engines.chatter import captured
from precisionlab.engines.external import MAX_CTX, ExternalEngine, file_spec, int_opt, split_spec, threads_opt
from precisionlab.errors import UsageError

KEYS = {"kv": "KV cache type: f16 (llama.cpp's default) | f32 | bf16 | q8_0", "flash": "flash attention 0|1",
        "threads": "n_threads (default: torch's thread count)", "batch": "n_batch (default 512)", "ubatch": "n_ubatch (default 512)",
        "ctx": "n_ctx (default: the model's, at most 4096)",
        "extra": "extra weight buffers, AMX/repacked kernels, 0|1 (default 1; 0 for a quantised GGUF on an AMX CPU)"}
# ggml_type ids (ggml.h) of the KV cache types offered
_KV = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}


# llama_ftype values of unquantised files: ALL_F32, MOSTLY_F16, MOSTLY_BF16
_UNQUANTISED_FTYPES = {"0", "1", "32"}


def _cpu_has_amx(llama_cpp) -> bool:
    """What ggml itself detected on this CPU (its system info line)."""
    return b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


def _quantised_amx_default(llama_cpp, path: str) -> bool:
    """Whether extra=0 is this file's default (and extra=1 refused): a quantised GGUF on a CPU with AMX
    (benchmarks open the file raw with the same buffers)."""
    probe = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    quantised = str(probe.metadata.get("general.file_type", "")) not in _UNQUANTISED_FTYPES
    del probe
    return quantised and _cpu_has_amx(llama_cpp)


@contextlib.contextmanager
def _model_params(llama_cpp, **fields):
    """Llama() takes no use_extra_bufts: its defaults, with these fields set,
    for the one construction inside this block."""
    module = llama_cpp.llama_cpp
    default = module.llama_model_default_params

    def params():
        p = default()
        for k, v in fields.items():
            setattr(p, k, v)
        return p

    module.llama_model_default_params = params
    try:
        yield
    finally:
        module.llama_model_default_params = default


def check_sizes(opts: dict) -> None:
    """threads, batch, ubatch and ctx bounded before llama.cpp sees them: threads=100000 segfaulted
    it, and ubatch=0 ran with a split it cannot use (it used another, unreported)."""
    threads_opt(opts, "llamacpp", least=1, checking=True)
    batch = int_opt(opts, "batch", 512, "llamacpp", 1, MAX_CTX, "llama.cpp's n_ctx bound here")
    int_opt(opts, "ubatch", min(512, batch), "llamacpp", 1, batch, "n_batch: a micro-batch splits a batch")
    int_opt(opts, "ctx", 0, "llamacpp", 0, MAX_CTX, "2^20 positions; 0 is the model's own")


def _used_sizes(llama_cpp, llm, settings: dict) -> None:
    """n_batch and n_ubatch as llama.cpp set them (it clamps them to n_ctx and n_batch), beside
    what was asked where they differ."""
    try:
        used = {"n_batch": int(llama_cpp.llama_n_batch(llm._ctx.ctx)),
                "n_ubatch": int(llama_cpp.llama_n_ubatch(llm._ctx.ctx))}
    except (AttributeError, TypeError):  # a llama-cpp-python without them: what was asked stands
        return
    for k, v in used.items():
        if settings[k] != v:
            settings[f"{k}_asked"] = settings[k]
            settings[k] = v


class LlamaCppEngine(ExternalEngine):
    captures_layers = True  # its eval callback hands over every GGML tensor (capture below)
    forks = True  # fork(): feeds that share one context, each rebuilding past the prefix it holds in common
    chats = True  # the GGUF's tokenizer.chat_template, rendered as transformers does (engines/chat.py)
    @classmethod
    def check(cls, arg):
        path, opts = file_spec(arg, "llamacpp", KEYS, "llama_cpp", " (a .gguf)")
        if opts.get("kv", "f16") not in _KV:
            raise UsageError(f"engine llamacpp: kv={opts['kv']!r}; one of {', '.join(_KV)}")
        if opts.get("flash", "0") not in ("0", "1"):
            raise UsageError("engine llamacpp: flash is 0 or 1")
        if opts.get("extra", "0") not in ("0", "1"):
            raise UsageError("engine llamacpp: extra is 0 or 1")
        check_sizes(opts)

    def __init__(self, arg, device: str):
        self.check(arg)
        import llama_cpp

        path, opts = split_spec(arg, "llamacpp", KEYS)
        self.path = path
        kv = opts.get("kv", "f16")
        batch = int_opt(opts, "batch", 512, "llamacpp", 1)
        self.settings = {"kv_cache_type": kv, "flash_attn": opts.get("flash", "0") == "1",
                         "threads": threads_opt(opts, "llamacpp", least=1),
                         "n_batch": batch, "n_ubatch": int_opt(opts, "ubatch", min(512, batch), "llamacpp", 1)}
        with captured("llama.cpp"):
            self._open(llama_cpp, path, opts, kv)

    def _open(self, llama_cpp, path: str, opts: dict, kv: str) -> None:
        """The model and its context (llama.cpp's own lines captured around this: chatter.py)."""
        try:
            probe = llama_cpp.Llama(path, vocab_only=True, verbose=False)
            arch = probe.metadata.get("general.architecture", "")
            train_ctx = int(probe.metadata.get(f"{arch}.context_length", 4096))
            # a file that does not say its type counts as quantised (the safe side)
            quantised = str(probe.metadata.get("general.file_type", "")) not in _UNQUANTISED_FTYPES
            del probe
            ctx = int_opt(opts, "ctx", 0, "llamacpp") or min(train_ctx, 4096)  # 0: the file's, at most 4096
            if ctx < 1:  # a value from the file (its context_length), on its way to C
                raise UsageError(f"engine llamacpp:{path}: the file's {arch}.context_length is {train_ctx}, not a "
                                 "positive count; give ctx=N")
            amx_quantised = quantised and _cpu_has_amx(llama_cpp)
            extra = opts.get("extra", "0" if amx_quantised else "1") == "1"
            if extra and amx_quantised:
                # llama-cpp-python 0.3.36's AMX-repacked kernels segfault in an every-logit eval of a quantised
                # file (seen on an Intel Xeon, 512 positions): refused, never run into a crash
                raise UsageError(f"engine llamacpp:{path}: extra=1 on a quantised GGUF on this AMX CPU crashes "
                                 "llama.cpp's repacked kernels when every position's logits are kept; use extra=0")
            self.settings["extra_bufts"] = extra
            with _model_params(llama_cpp, use_extra_bufts=extra):
                self.llm = llama_cpp.Llama(path, logits_all=True, n_ctx=ctx, n_threads=self.settings["threads"],
                                           n_threads_batch=self.settings["threads"], n_batch=self.settings["n_batch"],
                                           n_ubatch=self.settings["n_ubatch"], type_k=_KV[kv], type_v=_KV[kv],
                                           flash_attn=self.settings["flash_attn"], n_gpu_layers=0, verbose=False)
        except (ValueError, RuntimeError) as e:
            raise UsageError(f"engine llamacpp:{path}: llama.cpp cannot load it ({str(e).splitlines()[0]})") from None
        self.settings["n_ctx"] = ctx
        _used_sizes(llama_cpp, self.llm, self.settings)
        self.device = "cpu"
        self.name = f"llamacpp:{path}"
        self.vocab = int(self.llm.n_vocab())
        self.max_len = ctx
        self.window = min(1024, ctx)
        meta = self.llm.metadata
        self.file_type = meta.get("general.file_type")
        self.version = getattr(llama_cpp, "__version__", "?")

    ENGINE = "llama.cpp"

    def extra_info(self) -> dict:
        return {"gguf_file_type": self.file_type}

    def capture_layers(self, ids: list[int]) -> dict:
        """Every mapped layer output for one eval of ids, by Hugging Face module name (capture())."""
        return capture(self, ids)

    def encode(self, text: str, source: str = "--prompt") -> list[int]:
        # add_bos=True: a BOS only where the GGUF says the model wants one (llama.cpp's rule)
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))

    def decode(self, ids) -> str:
        return self.llm.detokenize([int(i) for i in ids]).decode("utf-8", "replace")

    @classmethod
    def has_chat_template(cls, arg):
        from precisionlab.engines import chat

        return chat.gguf_has_template(split_spec(arg, "llamacpp", KEYS)[0])

    def chat_ids(self, prompt: str) -> list[int]:
        """The GGUF's template rendered with its BOS/EOS strings, then llama.cpp's own tokenizer over it: special
        tokens parsed, no BOS added (the template writes the one the model wants)."""
        from precisionlab.engines import chat

        template = self.llm.metadata.get(chat.TEMPLATE_KEY)
        if not template:
            raise chat.no_chat_template(self.name, f"no {chat.TEMPLATE_KEY} in the GGUF's metadata")
        special = {name: self.llm.detokenize([tok], special=True).decode("utf-8", "replace")
                   for name, tok in (("bos_token", self.llm.token_bos()), ("eos_token", self.llm.token_eos()))
                   if tok >= 0}
        text = chat.render(template, prompt, self.name, **special)
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    exact_dtype = "fp32"  # llama.cpp computes in the file's types: no fp64 re-run exists

    def session(self, model, stores=None):
        """A feed that steps on through llama.cpp's own KV cache (one context,
        llm.eval after what it holds): the first call prefills, each later one
        evaluates only its new tokens, as a server's decode or verify step."""
        if stores is not None:
            return super().session(model, stores)  # refused there, in one line
        return self._feed([])

    def fork(self, feed):
        """A feed from a copy of `feed`'s cache: the context is shared, and each
        feed holds its own tokens; before it evaluates, the cache is cut back to
        the longest prefix it has in common with them (llm.eval removes what
        lies past llm.n_tokens) and rebuilt past that where another feed wrote."""
        return self._feed(list(feed.tokens))

    def _feed(self, tokens: list[int]):
        import numpy as np
        import torch

        def feed(ids: list[int]):
            mine = feed.tokens
            if len(mine) + len(ids) > self.max_len:
                raise UsageError(f"{self.name}: {len(mine) + len(ids)} tokens exceed n_ctx {self.max_len}")
            common = _common_prefix(self.llm.input_ids[:self.llm.n_tokens], mine)
            self.llm.n_tokens = common
            if common < len(mine):
                self.llm.eval(mine[common:])
            self.llm.eval(list(ids))
            out = np.array(self.llm.scores[len(mine):len(mine) + len(ids)], dtype=np.float32)
            mine.extend(ids)
            if out.shape[1] > self.vocab:
                self.padded_from = int(out.shape[1])
                out = out[:, :self.vocab]
            return torch.from_numpy(out)

        feed.tokens = list(tokens)
        return feed

    def rows(self, ids):
        import numpy as np

        if len(ids) > self.max_len:
            raise UsageError(f"{self.name}: {len(ids)} tokens exceed n_ctx {self.max_len}")
        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self.llm.scores[:len(ids)], dtype=np.float32)


def _common_prefix(held, mine: list[int]) -> int:
    """How many leading ids the context holds (`held`, llama.cpp's input_ids) in common with a feed's own, in
    one numpy comparison: a Python loop over them cost every greedy step time in proportion to its position
    (0.18 s over 400 steps at 460 tokens), a decode that grew faster than its steps."""
    import numpy as np

    n = min(len(held), len(mine))
    differ = np.flatnonzero(np.asarray(held[:n]) != np.asarray(mine[:n], dtype=np.int64))
    return int(differ[0]) if differ.size else n


# llama.cpp's graph names (the cb() names its model builders give, with "-N"
# for layer N) -> the Hugging Face module names --layers reports. kqv_out-N,
# the attention before its output projection (tokens x heads * head_dim, head
# by head), is --heads' <attn>.heads (engines/hooks.py). Left out: ffn_inp-N
# (the residual sum inside a block), and inp_embd (a table lookup, exact on both
# sides: comparing it would only make every later module "the first to differ").
GGML_TO_HF = {"attn_norm": "model.layers.{}.input_layernorm", "attn_out": "model.layers.{}.self_attn",
              "Qcur_normed": "model.layers.{}.self_attn.q_norm", "Kcur_normed": "model.layers.{}.self_attn.k_norm",
              "ffn_norm": "model.layers.{}.post_attention_layernorm", "ffn_out": "model.layers.{}.mlp",
              "l_out": "model.layers.{}", "result_norm": "model.norm", "result_output": "lm_head",
              "kqv_out": "model.layers.{}.self_attn.heads"}
# the dotted GGUF weight names (blk.N.attn_norm) name the same modules
_BLK = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "attn_q_norm": "Qcur_normed",
        "attn_k_norm": "Kcur_normed", "output_norm": "result_norm", "output": "result_output"}


def hf_site(ggml_name: str) -> str | None:
    """A GGML graph name (attn_norm-3, result_norm) or GGUF weight name (blk.3.attn_norm[.weight],
    output_norm) -> the Hugging Face module --layers names, None where none matches."""
    parts = ggml_name.removesuffix(".weight").split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLK:
        return hf_site(f"{_BLK[parts[2]]}-{parts[1]}")
    if len(parts) == 1 and parts[0] in ("output_norm", "output"):
        return GGML_TO_HF[_BLK[parts[0]]]
    head, dash, layer = ggml_name.rpartition("-")
    if dash and layer.isdigit() and head in GGML_TO_HF:
        return GGML_TO_HF[head].format(layer)
    return GGML_TO_HF.get(ggml_name) if "{}" not in GGML_TO_HF.get(ggml_name, "{}") else None


def capture(engine: LlamaCppEngine, ids: list[int]) -> dict[str, "np.ndarray"]:
    """Each mapped graph tensor's value (float32, tokens x width) for one
    eval of ids, under its Hugging Face name, through llama.cpp's eval
    callback (cb_eval): the context is rebuilt with the callback set, since
    llama-cpp-python takes it only at context creation. The tensor's type and
    shape are read from the head of struct ggml_tensor (type, buffer, ne[4]),
    a layout ggml has kept since 2023; only F32 tensors are taken."""
    import ctypes

    import llama_cpp
    import numpy as np
    from llama_cpp import _internals

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_get_name.restype, lib.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    lib.ggml_nbytes.restype, lib.ggml_nbytes.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]

    class Head(ctypes.Structure):  # the start of struct ggml_tensor
        _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4)]

    got: dict[str, np.ndarray] = {}

    def cb(t, ask, _user):
        name = (lib.ggml_get_name(t) or b"").decode("utf-8", "replace")
        site = hf_site(name)
        head = Head.from_address(t)
        if ask:
            return site is not None and head.type == 0  # GGML_TYPE_F32
        if site is not None and head.type == 0:
            n = lib.ggml_nbytes(t)
            buf = np.empty(n // 4, dtype=np.float32)
            lib.ggml_backend_tensor_get(t, buf.ctypes.data, 0, n)
            width = int(head.ne[0])
            got[site] = buf.reshape(-1, width).copy()
        return True

    llm = engine.llm
    callback = llama_cpp.ggml_backend_sched_eval_callback(cb)
    params = llm.context_params
    params.cb_eval = callback
    old = llm._ctx
    with captured("llama.cpp"):  # llama.cpp's own log lines (n_ctx_seq ...): chatter.py
        llm._ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=False)
    try:
        llm._batch = _internals.LlamaBatch(n_tokens=llm.n_batch, embd=0, n_seq_max=params.n_ctx, verbose=False)
        engine.rows(ids)
    finally:
        params.cb_eval = llama_cpp.ggml_backend_sched_eval_callback()
        llm._ctx = old
    return got
