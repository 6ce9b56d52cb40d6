"""One start-up for every model run (compare model, metrics, layers,
contracts, rollout, engine; kvcache): what each of them did on its own before
issue 38, with the copies disagreeing, written once.

In order, before anything slow: the steps and the prompt checked, the
formats parsed against their catalog subset, the device resolved; then every
engine the run needs opened under ONE memory estimate, made from the
engines' shapes before any weight is read (exit 2 when it does not fit);
then the work runs with IEEE fp32 set explicitly and torch's threads sized
for it (`numerics`).

And for a run of two models: which reference it opens (default_reference)
and whether both read the same tokens (token_check).

Not one of the commands: experiments/ imports it as a helper of them all
(the "commands stand alone" contract lists the commands only).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Sequence

from precisionlab.catalog import formats
from precisionlab.engines import registry
from precisionlab.errors import RunError, UsageError
from precisionlab.io import inputs

GREEDY = "greedy decoding needs at least one token to start from"


def check_steps(steps: int, zero_ok: bool = False) -> int:
    """--steps: > 0, or >= 0 where a run has a part without steps (compare engine's greedy part is optional)."""
    if steps <= 0 and not zero_ok:
        raise UsageError(f"--steps must be > 0 (got {steps})")
    if steps < 0:
        raise UsageError(f"--steps must be >= 0 (got {steps})")
    return steps


def check_prompt(prompt: str, purpose: str = GREEDY) -> str:
    """--prompt: the user's UTF-8 text (inputs.check_text), not empty."""
    inputs.check_text(prompt, "--prompt")
    if not prompt:
        raise UsageError(f"--prompt is empty: {purpose}")
    return prompt


def check_run(steps: int | None = None, prompt: str | None = None, purpose: str = GREEDY,
              zero_steps_ok: bool = False) -> None:
    """The steps and the prompt of a model run (None: the run has none)."""
    if steps is not None:
        check_steps(steps, zero_steps_ok)
    if prompt is not None:
        check_prompt(prompt, purpose)


def check_chat(spec: str | None, chat: bool, option: str = "--model") -> None:
    """--chat, before anything loads: the model's engine applies chat
    templates (the `chats` capability) and its files hold one (read without
    a weight; a cached repo id is checked once its tokenizer loads)."""
    if not chat:
        return
    from precisionlab.engines import protocol

    cls, arg = registry.resolve(spec)
    name = spec or registry.DEFAULT_SPEC
    if not cls.chats:
        raise protocol.no_chat_template(f"{option} {name}", "its engine reads none: the chats capability, "
                                        "a Hugging Face folder's or a GGUF's template")
    if cls.has_chat_template(arg) is False:
        raise protocol.no_chat_template(f"{option} {name}", "none in its files")


def parse_dtypes(text: str | None, subset: formats.Subset, option: str = "--dtypes",
                 default: formats.Subset | None = None) -> list[str]:
    """An option's formats, canonical and without repeats, against their catalog subset."""
    return formats.parse_list(text, subset, option, default)


def device(choice: str) -> str:
    """--device of a model run: "cuda" or "cpu" (registry.model_device: auto is the GPU where present)."""
    return registry.model_device(choice)


def resolve(spec: str | None, option: str):
    """registry.resolve (the engine class and its argument, checked: exit 2)
    under the option's own name: the engines' messages say --model."""
    if spec is not None:
        inputs.check_given(spec, option)
    try:
        return registry.resolve(spec)
    except UsageError as e:
        raise _named(e, option) from None


def _named(e: UsageError, option: str) -> UsageError:
    """An engine's refusal (which says --model) under the option that gave the spec."""
    if option == "--model":
        return e
    msg = str(e)
    return UsageError(msg.replace("--model", option, 1) if msg.startswith("--model") else f"{option}: {msg}")


@dataclass(frozen=True)
class Load:
    """One engine a run opens: its spec, the device, and the steps after the
    prompt its shape is read for (the positions the run reaches)."""
    spec: str | None
    device: str
    steps: int = 0
    prompt: str = ""
    option: str = "--model"  # the option that gave the spec, named where the engine refuses it


def shapes(loads: Sequence[Load]) -> list:
    """Each load's ModelShape, read without loading a weight (None where the engine cannot tell)."""
    out = []
    for x in loads:
        try:
            out.append(registry.spec_shape(x.spec, x.steps, x.prompt))
        except UsageError as e:
            raise _named(e, x.option) from None
    return out


def check_memory(loads: Sequence[Load], estimate: Callable[[list], int], what: str) -> None:
    """estimate(shapes) (bytes, from the shapes of every engine the run will
    open; a None shape is the estimate's to count as it can) must fit
    (inputs.check_memory: exit 2 naming `what`), before any weight is read. A
    run that opens its engines one after another (compare engine) calls this
    first, then registry.open_engine for each."""
    inputs.check_memory(estimate(shapes(loads)), what)


def open_engines(loads: Sequence[Load], estimate: Callable[[list], int], what: str) -> list:
    """Every engine of the run, opened only after check_memory. One spec on
    one device is opened once."""
    check_memory(loads, estimate, what)
    opened: dict[tuple, object] = {}
    out = []
    for x in loads:
        key = (x.spec, x.device)
        if key not in opened:
            try:
                opened[key] = registry.open_engine(x.spec, x.device)
            except UsageError as e:
                raise _named(e, x.option) from None
        out.append(opened[key])
    return out


def open_engine(spec: str | None, device: str, steps: int, prompt: str, estimate: Callable, what: str,
                option: str = "--model"):
    """One engine under estimate(shape): its shape's bytes (a None shape: 0, the engine cannot tell)."""
    return open_engines([Load(spec, device, steps, prompt, option)],
                        lambda s: 0 if s[0] is None else estimate(s[0]), what)[0]


def token_check(ref_ids: list[int], eng_ids: list[int] | None, name: str) -> str:
    """'identical', 'bos shift (...)' or 'none (...)'; a mismatch is a RunError
    naming where. eng_ids may run longer than ref_ids (a prefix was asked for)."""
    n = len(ref_ids)
    if eng_ids is None:
        return "none (the engine has no tokenizer; it reads the reference's ids)"
    if eng_ids[:n] == ref_ids:
        return "identical"
    if eng_ids[1:n + 1] == ref_ids and (not ref_ids or eng_ids[0] != ref_ids[0]):
        return f"bos shift (the engine prepends id {eng_ids[0]}; left out so both read the same tokens)"
    at = next((i for i, (a, b) in enumerate(zip(ref_ids, eng_ids, strict=False)) if a != b), min(n, len(eng_ids)))
    raise RunError(f"{name}: its tokenizer differs from the reference's at token {at} "
                   f"(reference {ref_ids[at:at + 4]}, engine {eng_ids[at:at + 4]}); the two models do not read "
                   "the same text")


def default_reference(given: str | None, engines: list[str]) -> tuple[str, str]:
    """(REF's spec, where it came from): --reference as given; else the source
    the engines' export recorded (engines/export.recorded_source; engines
    recording different sources need --reference); else the embedded model."""
    from precisionlab.engines.export import recorded_source

    if given is not None:
        return given, "given"
    found = {}
    for spec in engines:
        src = recorded_source(spec)
        if src is not None:
            found.setdefault(src, spec)
    if len(found) > 1:
        raise UsageError("the engines were exported from different models ("
                         + "; ".join(f"{e!r} from {s!r}" for s, e in found.items()) + "); give --reference")
    if found:
        return next(iter(found)), "recorded in the export"
    return registry.DEFAULT_SPEC, "the default (the embedded model)"


@contextmanager
def numerics(threads: int | None = None, flops: float | None = None, device: str = "cpu"):
    """The run's arithmetic: IEEE fp32 set explicitly (runtime/torch_flags;
    TF32 off), and, on the CPU with `flops` (the work of one torch call),
    torch's threads sized for it or to --threads (runtime/threads), restored
    after. Yields the thread count (None where not sized)."""
    from precisionlab.runtime import threads as threads_mod
    from precisionlab.runtime import torch_flags

    with threads_mod.torch_scope(), torch_flags.ieee_fp32():
        n = threads_mod.fit_torch(threads, flops) if flops is not None and device == "cpu" else None
        yield n
