"""Engines by spec string: `--model embedded` (the default), `--model hf:DIR`
(a Hugging Face causal LM folder or cached repo id), a bare `DIR` read as
hf:DIR. ENGINES maps a spec's prefix to its adapter, one line per engine:
a new engine is one module (an engines/protocol.py Engine) and one line here.

No torch is imported here nor by an adapter's module: a spec is checked
(`resolve`) before anything slow starts.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

from precisionlab.catalog import formats
from precisionlab.errors import UsageError

# prefix -> "module:Class" (imported when used) or the class itself (register()).
ENGINES: dict[str, object] = {
    "embedded": "precisionlab.engines.embedded:EmbeddedEngine",
    "hf": "precisionlab.engines.hf:HFEngine",
    "llamacpp": "precisionlab.engines.llamacpp:LlamaCppEngine",
    "ct2": "precisionlab.engines.ct2:CT2Engine",
    "onnx": "precisionlab.engines.onnx:OnnxEngine",
    "openai": "precisionlab.engines.openai:OpenAIEngine",
    "python": "precisionlab.engines.python_spec:PythonEngine",
}
DEFAULT_SPEC = "embedded"
DEFAULT_PROMPT = "ROMEO:\n"  # the embedded model's own text (Shakespeare) begins its speeches so
BARE = "hf"                  # a spec with no known prefix is a Hugging Face folder or repo id


@dataclass
class ModelRun:
    """What every command that runs a model is given: the engine's spec, the
    prompt and the steps after it, the low precisions, device and seed."""
    model: str | None = DEFAULT_SPEC  # None: the embedded model
    steps: int = 50
    prompt: str = DEFAULT_PROMPT
    dtypes: str = ",".join(formats.LOW_COMPUTE)  # as --dtypes spells it
    device: str = "cpu"
    seed: int = 0
    chat: bool = False  # --chat: --prompt under the model's chat template (engines/chat.py)

# What a spec prefix looks like: a lowercase word of two letters or more before the colon
# (one letter would be a Windows drive).
_PREFIX = re.compile(r"[a-z][a-z0-9_]+")


def register(prefix: str, engine) -> None:
    """Add an engine under `prefix` ("module:Class" or the class); a known prefix is not replaced."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"an engine prefix is a lowercase word (got {prefix!r})")
    if prefix in ENGINES:
        raise ValueError(f"engine prefix {prefix!r} is taken")
    ENGINES[prefix] = engine


def unregister(prefix: str) -> None:
    """Remove an engine added by register() (the shipped ones stay)."""
    if prefix in ("embedded", BARE):
        raise ValueError(f"{prefix!r} ships with precisionlab")
    ENGINES.pop(prefix, None)


def spec_help() -> str:
    return (f"Which model, as ENGINE[:ARG]: embedded (default: the shipped char-level model), hf:DIR (a Hugging "
            f"Face causal LM: a local directory or a repo id already in the local cache; offline only, needs "
            f"precisionlab[hf]); a bare DIR means hf:DIR. Engines: {', '.join(ENGINES)}.")


def parse(spec: str | None) -> tuple[str, str | None]:
    """spec -> (prefix, argument); None and "embedded" are the embedded model."""
    if spec is None or spec == DEFAULT_SPEC:
        return DEFAULT_SPEC, None
    head, colon, rest = spec.partition(":")
    if colon and head in ENGINES:
        return head, rest
    if colon and _PREFIX.fullmatch(head) and not Path(spec).exists():
        raise UsageError(f"--model {spec!r}: no engine {head!r}; known: {', '.join(ENGINES)} "
                         f"(e.g. hf:DIR, or a bare DIR)")
    return BARE, spec


def spec_path(spec: str | None) -> str | None:
    """The file or folder a spec reads (hf:DIR -> DIR), None for the embedded
    model: what an output path must never be (io/outputs' inputs)."""
    prefix, arg = parse(spec)
    return None if prefix == DEFAULT_SPEC else arg


def engine_class(prefix: str):
    target = ENGINES[prefix]
    if isinstance(target, str):
        module, _, name = target.partition(":")
        target = getattr(importlib.import_module(module), name)
    return target


def resolve(spec: str | None):
    """(engine class, argument), the argument checked by the engine (exit 2
    when it cannot be opened): cheap, before torch is imported."""
    prefix, arg = parse(spec)
    cls = engine_class(prefix)
    cls.check(arg)
    return cls, arg


def spec_shape(spec: str | None, steps: int, prompt: str):
    """The engine's ModelShape for a run of `steps` after `prompt`, read
    without loading a weight; None where the engine cannot tell."""
    cls, arg = resolve(spec)
    return cls.shape(arg, steps, prompt)


def open_engine(spec: str | None, device: str, *, estimate=None, steps: int = 0, prompt: str = "",
                command: str = "compare model"):
    """The engine for `spec` on `device` ("cpu" | "cuda"). With estimate
    (ModelShape -> bytes), the memory a run of `steps` after `prompt` needs
    is checked first, from the engine's shape, before any weight is read;
    the refusal names `command`."""
    from precisionlab.io import inputs

    if estimate is not None:
        shape = spec_shape(spec, steps, prompt)
        inputs.check_memory(0 if shape is None else estimate(shape),
                            f"{command} --model {spec or DEFAULT_SPEC} --steps {steps}")
    from precisionlab.runtime import progress

    cls, arg = resolve(spec)
    progress.stage(f"loading {spec or DEFAULT_SPEC}")  # the weights' read: minutes for a big model
    return cls(arg, device)


def model_device(choice: str) -> str:
    """--device for a model run: "cuda" where asked for (or auto) and present, else "cpu"."""
    from precisionlab.errors import NoDeviceError
    from precisionlab.runtime import devices

    plan = devices.resolve(choice)
    if plan.cuda and choice != "cpu":
        return "cuda"
    if choice in ("cuda", "all") and not plan.cuda:
        raise NoDeviceError("--device cuda: no CUDA GPU available")
    return "cpu"
