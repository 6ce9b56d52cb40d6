"""`--model python:package.module:factory` or `python:path/file.py:factory`:
the user's own engine, written in Python, in every model check.

Only the module the user names is imported (their code, run deliberately, as
compare op's --impl runs theirs: runtime/user_code.py loads both). The
factory, called with the device ("cpu" | "cuda"), returns an Engine
(engines/protocol.py) that implements the calls it can - forward, session
(decode with a KV cache), forward_batch, fork, capture_layers, model(dtype) -
and declares them as the shipped adapters do, with the base class's
capabilities (batches, forks, captures_layers, has_modules, compute_dtypes).
A call it does not declare is reported "not supported" by the checks while
the others run. docs/your-engine.md holds a template.

This adapter passes each call on to that object, with what the user's code
prints kept off stdout and what it raises turned into one line (exit 1)
naming the call. Its class declares every call as possible (it has each
method); the instance takes the user's own declarations.
"""

from __future__ import annotations

from precisionlab.engines.protocol import CAPABILITIES, Engine, KVStores, NotSupported
from precisionlab.errors import NoDeviceError, RunError, UsageError
from precisionlab.runtime.user_code import load_callable, users_code

OPTION = "--model python:"
SPEC = "python:package.module:factory or python:path/file.py:factory"
# What the instance copies from the user's engine (its declarations).
DECLARED = (*CAPABILITIES, "compute_dtypes", "exact_dtype", "pad_id", "echoes_prompt", "score_threads")


class PythonEngine(Engine):
    ENGINE = "a Python engine (python:)"
    batches = True          # possible: the instance says whether the user's engine takes a batch
    forks = True
    captures_layers = True

    @classmethod
    def check(cls, arg: str | None) -> None:
        if not arg or ":" not in arg:
            raise UsageError(f"--model python:{arg or ''}: give {SPEC}")
        load_callable(arg, OPTION + arg, "factory")

    def __init__(self, arg: str, device: str):
        factory = load_callable(arg, OPTION + arg, "factory")
        try:
            with users_code():
                inner = factory(device)
        except (UsageError, RunError, NoDeviceError):
            raise
        except Exception as e:
            raise RunError(f"python:{arg}: the factory raised {type(e).__name__}: {e}") from None
        if not isinstance(inner, Engine):
            raise UsageError(f"python:{arg}: the factory returned a {type(inner).__name__}, not an Engine "
                             "(precisionlab.engines.protocol.Engine; see docs/your-engine.md)")
        self.inner, self.spec = inner, arg
        for key in DECLARED:
            setattr(self, key, getattr(inner, key))
        self.name = f"python:{arg}"
        self.device = getattr(inner, "device", device)
        self.max_len = int(inner.max_len)
        self.window = int(getattr(inner, "window", self.max_len))
        self.base = inner.base

    def _call(self, what: str, fn, *args, **kw):
        """The user's call, its prints on stderr; what it raises is one line (NotSupported passes)."""
        try:
            with users_code():
                return fn(*args, **kw)
        except (NotSupported, UsageError, RunError, NoDeviceError):
            raise
        except NotImplementedError as e:
            raise NotSupported(f"{what}: {e}" if str(e) else what) from None
        except Exception as e:
            raise RunError(f"{self.name}: {what} raised {type(e).__name__}: {e}") from None

    def info(self) -> dict:
        got = dict(self._call("info()", self.inner.info))
        return {"name": self.name, "parameters": None, "engine": self.ENGINE, **got}

    def encode(self, text: str, source: str = "--prompt") -> list[int]:
        return self._call("encode()", self.inner.encode, text, source)

    def decode(self, ids) -> str:
        return self._call("decode()", self.inner.decode, ids)

    def model(self, dtype: str):
        if dtype not in self.compute_dtypes:
            raise UsageError(f"{self.name}: computes in {', '.join(self.compute_dtypes)}, not {dtype}")
        return self._call(f"model({dtype!r})", self.inner.model, dtype)

    def forward(self, model, ids, head_dtype: str | None = None):
        return self._call("forward()", self.inner.forward, model, ids, head_dtype)

    def session(self, model, stores: KVStores | None = None):
        return self._wrap(self._call("session()", self.inner.session, model, stores))

    def _wrap(self, feed):
        """The user's feed behind one of ours; fork() hands the user's own back to their engine."""
        def ours(ids):
            return self._call("a session's feed()", feed, ids)
        ours.users_feed = feed
        return ours

    def forward_batch(self, model, ids, attention_mask=None, position_ids=None):
        if attention_mask is not None or position_ids is not None:
            if not self.batches:
                raise NotSupported(CAPABILITIES["batches"])
        return self._call("forward_batch()", self.inner.forward_batch, model, ids, attention_mask, position_ids)

    def fork(self, feed):
        if not self.forks:
            raise NotSupported(CAPABILITIES["forks"])
        return self._wrap(self._call("fork()", self.inner.fork, getattr(feed, "users_feed", feed)))

    def capture_layers(self, ids: list[int]) -> dict:
        if not self.captures_layers:
            raise NotSupported(CAPABILITIES["captures_layers"])
        return self._call("capture_layers()", self.inner.capture_layers, ids)

    def bind(self, decode_one, vocab: int) -> None:
        self._call("bind()", self.inner.bind, decode_one, vocab)

    def sites(self, model) -> list:
        try:
            return self._call("sites()", self.inner.sites, model)
        except RunError as e:  # the default finds a Hugging Face-style decoder's modules; say what else works
            raise RunError(f"{e}; --layers watches a Hugging Face-style decoder's modules: name yours so, or "
                           "declare captures_layers and return {module name: output} from capture_layers(ids) "
                           "(docs/your-engine.md)") from None

    def close(self) -> None:
        self._call("close()", self.inner.close)
