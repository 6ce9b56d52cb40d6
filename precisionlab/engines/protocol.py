"""The Engine protocol: what every model adapter offers the model commands
(compare model, --metrics, --layers, kvcache), and the one greedy loop they
all decode with.

An engine is opened by a spec string through engines/registry.py. It holds
its model once, in fp32 (`base`); every run works on `model(dtype)` copies or
on `base` itself, through these calls only, so an experiment never asks which
engine it has. Torch is imported by the adapters, never here: the CLI checks a
spec (`check`) before anything slow is loaded.

What an engine can do is declared on its class (the capabilities below, with
the defaults of an engine that holds its model as torch modules), never
probed: an experiment reads `engine.top_k` or `cls.has_modules`, and a call
the engine does not offer raises NotSupported through `require`.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import RunError, UsageError

# A KV-cache hook: layer index -> (keys, values) -> (keys, values) as the cache
# stores them and attention reads them back; keys after RoPE, (batch, heads,
# tokens, head_dim). kvcache's Stores is one; None: the cache as shipped.
KVStores = Mapping[int, Callable]


class NotSupported(Exception):
    """An Engine call this engine does not offer (a batch with an attention
    mask, a KV cache copied): callers report "not supported by this engine"
    for what needed it, and carry on."""


# Each boolean capability's meaning: what a refusal says is missing.
CAPABILITIES = {
    "has_modules": "the model's torch modules (an hf: or the embedded model)",
    "captures_layers": "per-layer outputs captured by the engine itself",
    "vocabulary": "a vocabulary of its own",
    "batches": "an attention mask / position ids in a batch",
    "forks": "copying a KV cache",
}


def require(engine, capability: str, needed_by: str = "", error: type[Exception] = NotSupported) -> None:
    """The one check of a declared capability, on an engine or its class. A
    missing one raises NotSupported naming what is missing (the caller reports
    "not supported by this engine (...)" and carries on), or `error` with the
    whole sentence (UsageError: the run is refused, exit 2)."""
    if getattr(engine, capability):
        return
    if error is NotSupported:
        raise NotSupported(CAPABILITIES[capability])
    cls = engine if isinstance(engine, type) else type(engine)
    who = ("" if engine is cls else getattr(engine, "name", "")) or cls.ENGINE or cls.__name__
    raise error(f"{who}: {needed_by} needs {CAPABILITIES[capability]}")


class Engine(ABC):
    """One model behind the calls the experiments make. Subclasses set
    `name`, `device`, `base`, `max_len` and `window` in __init__(arg, device),
    and override the capabilities they differ in."""

    name: str           # what the JSON's model.name says
    device: str         # "cpu" | "cuda", resolved
    base = None         # the model in fp32 (a torch module)
    max_len: int        # positions the model takes
    window: int         # positions scored together by --metrics (teacher-forced windows)
    score_threads: int | None = None  # torch threads for --metrics; None: torch's own choice
    exact_dtype: str = "fp64"  # the precision a broken contract is re-run in (fp32 where an engine has no fp64)
    pad_id: int = 0            # the token left padding is made of (masked: its value must not matter)
    ENGINE: str = ""           # the engine's own name (llama.cpp, onnxruntime, ...); "" for a torch model

    # --- capabilities: declared, read by the experiments, never probed ----------------------
    # Class attributes (an adapter may refine one per instance in __init__, e.g. from its file),
    # so the ones a run needs before anything loads are read from the class.
    top_k: int | None = None      # only the top k log-probabilities per position come back (an endpoint);
    #                               None: every logit (forward/session)
    has_modules: bool = True      # `base` is a torch module: hooks watch its sites (--layers), model(dtype)
    #                               copies it in any of compute_dtypes
    captures_layers: bool = False  # capture_layers(ids) returns per-layer outputs itself (no modules needed)
    vocabulary: bool = True       # it tokenises text itself; False: it reads the reference's token ids
    batches: bool = False         # forward_batch takes a left-padded batch (attention mask, position ids)
    forks: bool = False           # fork() copies a KV cache
    echoes_prompt: bool = False   # its top-k rows came from one echo of the prompt (checked against the echo)
    compute_dtypes: tuple[str, ...] = (*formats.COMPUTE, "fp64")  # what model(dtype) takes; an engine
    #                               that computes only as it was opened: ("fp32",), model("fp32") being that

    # --- before anything is loaded (classmethods: no torch, no weights) --------------------

    @classmethod
    def check(cls, arg: str | None) -> None:
        """Refuse (UsageError, exit 2) a spec argument this engine cannot open,
        cheaply: no torch, no weights read."""

    @classmethod
    def shape(cls, arg: str | None, steps: int, prompt: str):
        """The model's sizes (engines/shape.py's ModelShape) for the memory
        estimate, read before anything is loaded; None: unknown (no estimate)."""
        return None

    @classmethod
    def module_tree(cls, arg: str | None):
        """The model's modules without its weights (a torch module on the meta
        device, built from its config), for checking --inject's module names
        before the weights load; None where that is not cheaper than loading
        (the names are then checked right after the load, before any forward
        pass)."""
        return None

    # --- what decides its numbers, and its tokens --------------------------------------------

    @abstractmethod
    def info(self) -> dict:
        """The JSON's `model` object for compare model: name, parameters, vocab,
        max_seq_len, and whatever else decides the numbers."""

    def cache_info(self) -> dict:
        """kvcache's `model` object: the same, with the model's layers and heads."""
        return self.info()

    @abstractmethod
    def encode(self, text: str, source: str = "--prompt") -> list[int]:
        """Token ids; text the tokenizer cannot take is a UsageError naming `source`."""

    @abstractmethod
    def decode(self, ids) -> str: ...

    def prefix_ids(self, text: str, need: int, source: str) -> list[int]:
        """At least the first `need` tokens of `text` (fewer only where the text
        is shorter), tokenising no more than it must: a prefix of 16 characters
        per token first, the whole text only when that falls short."""
        ids = self.encode(text[:need * 16], source)
        if len(ids) < need and len(text) > need * 16:
            ids = self.encode(text, source)
        return ids

    def prompt_ids(self, prompt: str, steps: int) -> list[int]:
        """The prompt's ids, checked to leave room for `steps` more positions."""
        ids = self.encode(prompt, "--prompt")
        if not ids:
            raise UsageError("--prompt encodes to no tokens")
        if len(ids) + steps > self.max_len:
            raise UsageError(f"prompt ({len(ids)} tokens) + --steps {steps} exceeds the model's "
                             f"{self.max_len} positions")
        return ids

    # --- computing --------------------------------------------------------------------------

    def model(self, dtype: str):
        """A copy of the model computing in `dtype` (a catalog name: fp32, bf16, fp16)."""
        if dtype not in self.compute_dtypes:
            raise UsageError(f"{self.name}: computes in {', '.join(self.compute_dtypes)}, not {dtype}")
        return copy.deepcopy(self.base).to(formats.get(dtype).torch_dtype)

    @abstractmethod
    def forward(self, model, ids, head_dtype: str | None = None):
        """(batch, tokens) token ids -> (batch, tokens, vocab) logits in the
        model's dtype: one pass, every position, no KV cache. head_dtype (a
        catalog name): the LM head alone computed in that dtype, its input
        the final hidden states as the model's dtype left them, cast up (the
        logits then come in head_dtype); None: the model as it is."""

    @abstractmethod
    def session(self, model, stores: KVStores | None = None) -> Callable:
        """feed(ids) -> (len(ids), vocab) logits: the first call prefills, each
        later one steps on from what the session's KV cache holds. `stores`
        (the KV-cache hook) passes each layer's new keys and values through
        stores[layer] before they are cached."""

    def forward_batch(self, model, ids, attention_mask=None, position_ids=None):
        """(batch, tokens) ids -> (batch, tokens, vocab) logits, one pass, no
        KV cache. attention_mask (batch, tokens; 1 = a token, 0 = padding no
        query may attend to) and position_ids (batch, tokens; each token's
        position in its own sequence) describe a left-padded batch; an engine
        that cannot take them raises NotSupported."""
        if attention_mask is not None or position_ids is not None:
            require(self, "batches", "forward_batch with an attention mask / position ids")
        return self.forward(model, ids)

    def fork(self, feed: Callable) -> Callable:
        """A new feed that steps on from a copy of what `feed`'s KV cache holds
        (a prefix served from a saved cache); `feed` itself is left as it was."""
        require(self, "forks", "a prefix served from a saved cache")
        raise NotImplementedError(f"{type(self).__name__} declares forks but has no fork()")

    def capture_layers(self, ids: list[int]) -> dict:
        """{module name (Hugging Face's): float numpy output} for one fp32
        pass over ids, from the engine itself (captures_layers)."""
        require(self, "captures_layers", "--layers")
        raise NotImplementedError(f"{type(self).__name__} declares captures_layers but has no capture_layers()")

    def top_logprobs(self, ids: list[int]) -> list[dict[int, float]]:
        """For each position i < len(ids) - 1: {id: log-probability} over the
        top `top_k` (an engine with top_k set)."""
        raise NotSupported(f"{self.name}: returns every logit, not top-k log-probabilities")

    def bind(self, decode_one: Callable[[int], str], vocab: int) -> None:
        """The reference's vocabulary, for an engine without one (vocabulary
        False) that maps token strings back to ids; others ignore it."""

    def calibrate(self, model, stores: KVStores, ids: list[int]) -> None:
        """One pass over ids through `stores`, for what they record (no logits needed)."""
        self.session(model, stores)(ids)

    def sites(self, model) -> list:
        """The modules --layers watches (engines/hooks.py's Site list): the
        engine owns its sites; this default finds a Hugging Face-style
        decoder's (embeddings, .layers blocks, norms, attention, MLP, head)."""
        from precisionlab.engines import hooks

        require(self, "has_modules", "--layers", UsageError)
        return hooks.sites(model)

    def close(self) -> None:
        """Undo any hook left on `base`."""


def check_finite(logits: np.ndarray, dtype: str, step: int, where: str) -> None:
    """Non-finite logits end the run (exit 1): every figure after them would be
    NaN, and an argmax over NaN picks token 0 and calls it a prediction."""
    if np.all(np.isfinite(logits)):
        return
    n_nan, n_inf = int(np.isnan(logits).sum()), int(np.isinf(logits).sum())
    raise RunError(f"{dtype} logits became non-finite at step {step} ({where}): {n_nan} NaN and {n_inf} inf of "
                   f"{logits.size}; NaN or inf in the weights, or an overflow in {dtype}")


def greedy(engine: Engine, model, prompt: list[int], steps: int, dtype: str = "fp32", *,
           stores: KVStores | None = None, strict: bool = True,
           where: str = "greedy decoding") -> tuple[list[int], np.ndarray]:
    """Greedy decoding from a fresh session: (tokens, the float64 logit rows
    each was chosen from). A non-finite row ends the path there: the run fails
    (strict: exit 1, naming dtype, step and `where`), or the path is shorter."""
    feed = engine.session(model, stores)
    tokens: list[int] = []
    rows: list[np.ndarray] = []
    logits = feed(prompt)[-1]
    for step in range(steps):
        last = logits.double().cpu().numpy()
        if not np.isfinite(last).all():
            if strict:
                check_finite(last, dtype, step, where)
            break
        rows.append(last)
        tokens.append(int(np.argmax(last)))
        if step + 1 < steps:  # the last token needs no logits of its own
            logits = feed(tokens[-1:])[-1]
    return tokens, np.stack(rows) if rows else np.empty((0, 0))
