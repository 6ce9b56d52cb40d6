"""What the real engines (llama.cpp, CTranslate2, onnxruntime, an OpenAI-style
endpoint) share behind the Engine protocol.

Such an engine computes in the settings it was opened with (a GGUF's types, a
CTranslate2 compute_type, an ONNX graph's dtype), not in a dtype precisionlab
picks: model("fp32") is the engine as opened and any other dtype is refused.
Its settings come from the spec, `PREFIX:PATH,key=value,...`, and are all
reported by info(), since they decide its numbers; threads=N is one key for
all of them (default: torch's thread count). The session below re-runs the
whole sequence each step (exact, and quadratic in the steps): the fallback
of an engine whose API offers no cache to step on (CTranslate2's
forward_batch, the ONNX graphs export writes). llama.cpp overrides it with
a session through its own KV cache (engines/llamacpp.py).
"""

from __future__ import annotations

from pathlib import Path

from precisionlab.engines.protocol import Engine, KVStores
from precisionlab.errors import UsageError


def split_spec(arg: str | None, prefix: str, keys: dict[str, str]) -> tuple[str, dict[str, str]]:
    """`PATH,key=value,...` -> (PATH, {key: value}); keys maps each known key to its help."""
    if not arg:
        raise UsageError(f"engine {prefix}: needs a path ({prefix}:PATH[,key=value...])")
    path, *rest = arg.split(",")
    opts = {}
    for item in rest:
        k, eq, v = item.partition("=")
        if not eq or k not in keys:
            known = ", ".join(f"{k} ({h})" for k, h in keys.items())
            comma = ("; a path with a comma cannot be named in a spec (the comma starts KEY=VALUE): rename "
                     "it or link it to a name without one" if not eq else "")
            raise UsageError(f"engine {prefix}:{arg}: {item!r} is not KEY=VALUE with a known key: {known}{comma}")
        opts[k] = v
    return path, opts


def int_opt(opts: dict, key: str, default: int, prefix: str, least: int = 0, most: int | None = None,
            bound: str = "") -> int:
    """An integer knob, within [least, most] before it reaches an engine's C code (threads=100000
    segfaulted llama.cpp); `bound` says where `most` comes from, in the refusal."""
    raw = str(opts.get(key, default))
    if len(raw) > 30:  # int() of a long digit string is slow, or refused
        raise UsageError(f"engine {prefix}: {key}={raw[:20]!r}...: too long for an integer")
    try:
        v = int(raw)
    except ValueError:
        raise UsageError(f"engine {prefix}: {key}={opts[key]!r} is not an integer") from None
    if v < least:
        raise UsageError(f"engine {prefix}: {key} must be >= {least}")
    if most is not None and v > most:
        raise UsageError(f"engine {prefix}: {key}={v} is past the bound of {most}{' (' + bound + ')' if bound else ''}")
    return v


def thread_bound() -> int:
    """The most threads an engine knob may ask: 4 per CPU, at least 64 (to study summation orders on a
    small machine), at most 1024."""
    import os

    return min(1024, max(64, 4 * (os.cpu_count() or 1)))


def default_threads() -> int:
    """What torch uses here (torch.get_num_threads(): the reference's own count), so an engine and
    the reference it is compared with run on as many threads unless the spec says otherwise."""
    import torch

    return int(torch.get_num_threads())


def threads_opt(opts: dict, prefix: str, least: int = 1, checking: bool = False) -> int:
    """threads=N, bounded by thread_bound() (named in the refusal); absent: default_threads(). Every
    engine reports it as `threads` in info(), whatever its own API calls it. `checking`: a spec checked
    before anything loads, where an absent key needs no torch to be imported."""
    import os

    if "threads" not in opts:
        return 0 if checking else default_threads()
    return int_opt(opts, "threads", 1, prefix, least, thread_bound(),
                   f"4 per CPU of this machine's {os.cpu_count() or 1}, at least 64, at most 1024")


# Sizes an engine knob may ask (a batch of copies of the prompt, a context's KV cache): past this the
# allocation is the knob's, not the model's, and a typo (batch=1000000) would fill the memory.
MAX_BATCH = 4096
MAX_CTX = 1 << 20


def batched_knobs(opts: dict, prefix: str, checking: bool = False) -> tuple[int, int]:
    """(threads, batch) of an engine that runs batch_of's copies of the prompt in one call (ct2, onnx):
    threads=N as threads_opt (`checking` as there), batch=N from 1 to MAX_BATCH."""
    return (threads_opt(opts, prefix, checking=checking),
            int_opt(opts, "batch", 1, prefix, least=1, most=MAX_BATCH, bound="copies of the prompt in one batch"))


def batch_of(ids: list[int], n: int) -> list[list[int]]:
    """A batch of n prompts whose first is ids and the others its rotations (by
    i * len / n): n sequences of one length, other tokens, so an engine's batched
    kernels run while row 0 is the sequence compared (spec key batch=N)."""
    k = len(ids)
    return [list(ids[i * k // n:]) + list(ids[:i * k // n]) for i in range(n)]


def need_package(module: str, extra: str, prefix: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UsageError(f"engine {prefix}: needs the {module} package: pip install 'precisionlab[{extra}]'")


class ExternalEngine(Engine):
    window = 1024
    has_modules = False        # the engine's graph, not torch modules: no hooks, no dtype copies
    exposes_routing = False    # nor its routers' logits
    compute_dtypes = ("fp32",)  # "fp32": the engine as opened (its own settings decide its types)
    vocab: int              # the logical vocabulary: columns beyond it (engine padding) are trimmed
    padded_from: int | None = None  # the engine's own width where it padded the vocabulary

    def rows(self, ids: list[int]):
        """(len(ids), width) float logits for one sequence, every position, from the engine (numpy)."""
        raise NotImplementedError

    def model(self, dtype: str):
        if dtype not in self.compute_dtypes:
            raise UsageError(f"{self.name}: computes in the settings it was opened with; --dtypes {dtype} does "
                             "not apply (compare engine --engine SPEC --reference SPEC compares two engines)")
        return None

    def logits(self, ids: list[int]):
        """rows(), with a vocabulary padded by the engine trimmed to the logical one (and that said in info())."""
        import numpy as np

        out = np.asarray(self.rows(list(ids)), dtype=np.float32)
        if out.shape[1] > self.vocab:
            self.padded_from = int(out.shape[1])
            out = out[:, :self.vocab]
        return out

    def forward(self, model, ids):
        import numpy as np
        import torch

        batch = ids.tolist() if hasattr(ids, "tolist") else ids
        if len(batch) == 1:  # one sequence (compare engine's windows): no stacked copy of vocabulary-wide rows
            return torch.from_numpy(self.logits(batch[0])[None])
        return torch.from_numpy(np.stack([self.logits(row) for row in batch]))

    def session(self, model, stores: KVStores | None = None):
        import torch

        if stores is not None:
            raise UsageError(f"{self.name}: its KV cache is the engine's own; kvcache's stores cannot reach it")
        seen: list[int] = []

        def feed(ids: list[int]):
            start = len(seen)
            seen.extend(ids)
            return torch.from_numpy(self.logits(seen)[start:])

        return feed

    def info(self) -> dict:
        """The settings that decide its numbers, beside what every engine reports."""
        return {"name": self.name, "engine": self.ENGINE, "version": self.version, "vocab": self.vocab,
                "max_seq_len": self.max_len, "parameters": None, **self.extra_info(), **self.settings,
                **self.trim_note()}

    def extra_info(self) -> dict:
        return {}

    def trim_note(self) -> dict:
        return {} if self.padded_from is None else {"vocab_padded_from": self.padded_from,
                                                    "vocab_note": f"the engine's {self.padded_from} columns trimmed "
                                                                  f"to the model's {self.vocab}"}


def file_spec(arg: str | None, prefix: str, keys: dict[str, str], module: str, what: str = "") -> tuple[str, dict]:
    """An engine spec that names one file: (path, settings), the engine's
    package and the file checked (exit 2 naming what is missing)."""
    path, opts = split_spec(arg, prefix, keys)
    # the file first: a wrong path is refused by its name whether or not the engine's package is installed
    if not Path(path).is_file():
        raise UsageError(f"engine {prefix}:{path}: no such file{what}")
    need_package(module, prefix, prefix)
    return path, opts
