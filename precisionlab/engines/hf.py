"""The Hugging Face engine (`--model hf:DIR`, or a bare DIR): a transformers
causal LM from a local directory or a repo id already in the local cache,
never the network, never code from the model (trust_remote_code=False, and a
folder whose config names custom code is refused before transformers reads
it). Its KV-cache hook is a transformers DynamicCache whose update() passes
the new keys and values through the layer's store (stored_cache_class)."""

from __future__ import annotations

import functools
import inspect
import os
from contextlib import contextmanager
from pathlib import Path

from precisionlab.engines.model_folders import quiet_library, refuse_foreign_code
from precisionlab.engines.protocol import Engine, KVStores, cast_copy
from precisionlab.errors import RunError, UsageError

# Positions scored together by --metrics, at most (and at most the model's own).
WINDOW = 1024

def _transformers_version() -> str:
    import transformers

    return getattr(transformers, "__version__", "?")


def _stored_dtype() -> dict:
    """from_pretrained's keyword for loading the weights in the dtype they are
    stored in: `dtype` from transformers 4.56 (the default in 5.x),
    `torch_dtype` before (whose default was fp32)."""
    from packaging.version import Version

    return {"dtype" if Version(_transformers_version()) >= Version("4.56") else "torch_dtype": "auto"}


def cache_keyword(module, command: str) -> str:
    """The forward() keyword a cache object is passed by: `cache` in
    transformers 5.x (`past_key_values` deprecated there, to go in 5.40),
    `past_key_values` before. Neither: one line, exit 1."""
    try:
        names = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        names = {}
    for kw in ("cache", "past_key_values"):
        if kw in names:
            return kw
    raise RunError(f"transformers {_transformers_version()}: {type(module).__name__}.forward "
                   f"takes neither cache= nor past_key_values=; {command} cannot hand it a cache")


def returned_cache(out):
    """The cache a forward() call returns, under either name (see cache_keyword)."""
    for name in ("cache", "past_key_values"):
        found = getattr(out, name, None)
        if found is not None:
            return found
    raise RunError("the model returned no cache (use_cache=True): it cannot be decoded step by step")


@functools.cache
def stored_cache_class():
    """A transformers DynamicCache whose update(key_states, value_states,
    layer_idx, ...) passes the new keys and values through the layer's
    store before appending them, and returns what attention reads. update()
    with that head is the one Cache surface stable from transformers 4.36 to
    5.x (its later arguments changed name: cache_kwargs, then kwargs; they
    pass through untouched). Anything else: one line, exit 1."""
    try:
        from transformers import DynamicCache
    except ImportError:
        raise RunError(f"transformers {_transformers_version()} has no DynamicCache; kvcache --model needs "
                       "transformers >= 4.45") from None
    try:
        head = list(inspect.signature(DynamicCache.update).parameters)[:4]
    except (TypeError, ValueError):
        head = []
    if head != ["self", "key_states", "value_states", "layer_idx"]:
        raise RunError(f"transformers {_transformers_version()}: DynamicCache.update is not "
                       f"update(key_states, value_states, layer_idx, ...) (found {head}); kvcache --model cannot "
                       "put its fp8 rounding in this version's cache")

    class StoredCache(DynamicCache):
        def __init__(self, stores: KVStores | None, config):
            try:
                super().__init__(config=config)  # what the model itself builds (sliding layers included)
            except TypeError:  # transformers before 4.56: no config argument
                super().__init__()
            self.stores = stores
            self.calls = 0

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            self.calls += 1
            if self.stores is not None:
                key_states, value_states = self.stores[layer_idx](key_states, value_states)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return StoredCache


@contextmanager
def _head_in(model, dtype: str | None):
    """The model's LM head (get_output_embeddings(), a Linear) computing in
    `dtype` for the calls inside: its input and weights cast up, the product
    in that dtype. The model's own forward still runs around it (a logit
    soft-cap or scaling after the head applies as shipped). The head's forward
    is replaced on the instance, not wrapped in a hook, so the low-precision
    product is never computed as well; the instance attribute is removed after."""
    if dtype is None:
        yield
        return
    import torch

    from precisionlab.catalog import formats

    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise RunError(f"{type(model).__name__}'s output embeddings are a {type(head).__name__}, not a Linear: "
                       f"its LM head cannot be computed in {dtype} alone")
    want = formats.get(dtype).torch_dtype

    def forward(x):
        bias = None if head.bias is None else head.bias.to(want)
        return torch.nn.functional.linear(x.to(want), head.weight.to(want), bias)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


class HFEngine(Engine):
    batches = True  # transformers takes attention_mask and position_ids
    forks = True    # its DynamicCache deep-copies
    chats = True    # its tokenizer's apply_chat_template (engines/chat.py)
    stores_kv = True  # session(stores) builds a StoredCache that calls stores[i] on every update
    @classmethod
    def check(cls, arg):
        import importlib.util

        if not arg:
            raise UsageError("--model hf: needs a directory or a cached repo id (hf:DIR)")
        if importlib.util.find_spec("transformers") is None:
            raise UsageError("--model needs transformers: pip install 'precisionlab[hf]'")
        p = Path(arg)
        if not p.exists() and ("/" not in arg or arg.startswith(("/", ".", "~")) or arg.count("/") > 1):
            raise UsageError(f"--model {arg!r}: no such directory (a repo id looks like org/name)")
        if p.exists() and not p.is_dir():
            raise UsageError(f"--model {arg!r} is a file; give the model's directory")
        if p.is_dir():
            refuse_foreign_code(p)
            ggufs = sorted(f.name for f in p.glob("*.gguf"))
            if ggufs and not (p / "config.json").is_file():  # transformers would fail inside with a ValueError
                raise UsageError(f"hf:{arg!r} holds a GGUF file ({ggufs[0]!r}) and no config.json: give it as "
                                 f"llamacpp:FILE, or make a Hugging Face folder of it with "
                                 f"`precisionlab export llamacpp:FILE --to hf --out DIR`")

    @classmethod
    def shape(cls, arg, steps, prompt):
        from precisionlab.engines import shape

        return shape.model_shape(arg, steps, prompt)

    @classmethod
    def module_tree(cls, arg):
        """The architecture from config.json on the meta device: every module
        name, no weight read (the weights load is the slow part of a big
        model; this costs the torch and transformers imports only)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        cls.check(arg)
        import torch
        import transformers

        try:
            with quiet_library():
                config = transformers.AutoConfig.from_pretrained(arg, local_files_only=True, trust_remote_code=False)
                if getattr(config, "auto_map", None):
                    raise UsageError(f"--model {arg!r}: its config maps to custom code (auto_map); "
                                     "precisionlab never runs code from a model")
                with torch.device("meta"):
                    return transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False)
        except UsageError:
            raise
        except Exception:  # the load proper reports an unusable folder in its own words
            return None

    def __init__(self, arg: str, device: str):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the network, whatever the cache says
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        self.check(arg)
        import transformers

        try:
            with quiet_library():
                config = transformers.AutoConfig.from_pretrained(arg, local_files_only=True, trust_remote_code=False)
                if getattr(config, "auto_map", None):  # a cached repo id: its config is only readable now
                    raise UsageError(f"--model {arg!r}: its config maps to custom code (auto_map); "
                                     "precisionlab never runs code from a model")
                # trust_remote_code=False on every loader: a model folder never runs its own code
                self.tok = transformers.AutoTokenizer.from_pretrained(arg, trust_remote_code=False,
                                                                      local_files_only=True)
                self.stored = transformers.AutoModelForCausalLM.from_pretrained(arg, trust_remote_code=False,
                                                                                config=config, local_files_only=True,
                                                                                **_stored_dtype())
        except UsageError:
            raise
        except Exception as e:  # OSError, ValueError, KeyError... from an unusable directory or cache entry
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UsageError(f"--model {arg!r}: not a loadable causal LM offline ({msg})") from None
        # The weights as stored (transformers loads a checkpoint in its own dtype): held once, each
        # compute dtype cast from them when a run asks (model); fp32 is made on first use (base)
        self.stored = self.stored.to(device).eval()
        self._fp32 = self.stored if _dtype_name(self.stored) == "fp32" else None
        self.device = device
        self.name = arg
        self.max_len = getattr(self.stored.config, "max_position_embeddings", 1 << 20)
        self.window = max(1, min(WINDOW, int(self.max_len)))

    @property
    def base(self):
        """The model in fp32, made from the stored weights on first use and kept
        (a run that reads `base` holds fp32 for its length: --layers, kvcache)."""
        if self._fp32 is None:
            self._fp32 = cast_copy(self.stored, "fp32")
        return self._fp32

    def info(self) -> dict:
        n = sum(p.numel() for p in self.stored.parameters())
        return {"name": self.name, "parameters": n, "vocab": int(self.stored.config.vocab_size),
                "max_seq_len": self.max_len, "architecture": type(self.stored).__name__}

    def cache_info(self) -> dict:
        cfg = self.stored.config
        return self.info() | {"layers": int(getattr(cfg, "num_hidden_layers", 0) or 0),
                              "heads": int(getattr(cfg, "num_attention_heads", 0) or 0),
                              "transformers": _transformers_version()}

    def encode(self, text: str, source: str = "--prompt") -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids) -> str:
        return self.tok.decode(ids)

    @classmethod
    def has_chat_template(cls, arg):
        from precisionlab.engines import chat

        return chat.folder_has_template(arg)

    def chat_ids(self, prompt: str) -> list[int]:
        from precisionlab.engines import chat

        return chat.hf_ids(self.tok, prompt, f"hf:{self.name}")

    def forward(self, model, ids, head_dtype: str | None = None):
        import torch

        with torch.no_grad(), _head_in(model, head_dtype):  # no KV cache: a module re-run (--layers) must not
            return model(input_ids=ids, use_cache=False).logits  # append to one

    def forward_batch(self, model, ids, attention_mask=None, position_ids=None):
        import torch

        with torch.no_grad():
            return model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False).logits

    def model(self, dtype: str):
        """Cast from the stored weights (cast_copy: a dtype they are stored in
        shares them); fp32 is `base` where a run has made it, else a copy of
        the run's own, freed when the run drops it."""
        self.check_dtype(dtype)
        if dtype == "fp32" and self._fp32 is not None:
            return self._fp32
        m = cast_copy(self.stored, dtype)
        if dtype == "fp64":
            _fp64_norms(m)
            # an MoE's experts run through torch's grouped_mm by default, which has no float64 kernel
            if getattr(m.config, "_experts_implementation", None) not in (None, "eager"):
                m.set_experts_implementation("eager")
        return m

    def session(self, model, stores: KVStores | None = None):
        """stores None: the cache the model builds itself, handed back each
        step; else a StoredCache, which must see update() called (a model that
        caches some other way would silently bypass the stores)."""
        state = {"cache": None if stores is None else stored_cache_class()(stores, model.config),
                 "own": stores is None}
        return self._feed(model, state)

    def fork(self, feed):
        import copy

        return self._feed(feed.model, {"cache": copy.deepcopy(feed.state["cache"]), "own": feed.state["own"]})

    def _feed(self, model, state: dict):
        import torch

        kw = cache_keyword(model, "precisionlab")

        def feed(ids: list[int]):
            x = torch.tensor([ids], device=self.device)
            with torch.no_grad():
                if state["cache"] is None:
                    out = model(input_ids=x, use_cache=True)
                else:
                    out = self._call(model, kw, state["cache"], x)
            if state["own"]:
                state["cache"] = returned_cache(out)
            return out.logits[0]

        feed.model, feed.state = model, state
        return feed

    def calibrate(self, model, stores: KVStores, ids: list[int]) -> None:
        """The decoder alone: calibration needs no logits (a 150k vocabulary over 512 tokens would be 300 MB)."""
        import torch

        decoder = getattr(model, "base_model", None) or model
        with torch.no_grad():
            self._call(decoder, cache_keyword(decoder, "precisionlab"), stored_cache_class()(stores, model.config),
                       torch.tensor([ids], device=self.device))

    @staticmethod
    def _call(module, kw, cache, x):
        out = module(input_ids=x, use_cache=True, **{kw: cache})
        if getattr(cache, "calls", None) == 0:
            raise RunError(f"{type(module).__name__} (transformers {_transformers_version()}) never called its KV "
                           "cache's update(): kvcache --model cannot see what this model caches")
        return out


def _dtype_name(model) -> str:
    """The catalog name of the dtype most of the model's weights are in ("" for one the catalog lacks)."""
    from collections import Counter

    from precisionlab.catalog import formats

    counts = Counter()
    for p in model.parameters():
        counts[p.dtype] += p.numel()
    dtype = counts.most_common(1)[0][0] if counts else None
    return next((f for f in ("fp64", *formats.COMPUTE) if formats.get(f).torch_dtype == dtype), "")


def _fp64_norms(model) -> None:
    """transformers' RMSNorms (Llama, Qwen, Mistral...) cast their input to
    fp32 whatever the model's dtype: in an fp64 copy (the contracts' re-run)
    that would put fp32 rounding back into the yardstick. Each such norm of
    the copy computes in fp64 instead; the fp32/bf16 copies are untouched."""
    import types

    import torch

    def forward(self, hidden_states):
        x = hidden_states.to(torch.float64)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(hidden_states.dtype)

    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(forward, module)
