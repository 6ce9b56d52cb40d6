"""Options of the model-running verbs (compare model, metrics, layers,
contracts, rollout, engine; kvcache), declared once: each verb takes the ones
it reads and no other."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.options import format_names
from precisionlab.engines.registry import DEFAULT_PROMPT, DEFAULT_SPEC, spec_path
from precisionlab.errors import UsageError

__all__ = ["DEFAULT_PROMPT", "DEFAULT_SPEC", "DEFAULT_STEPS", "DEFAULT_LOWS"]

DEFAULT_STEPS = 50
DEFAULT_LOWS = format_names(formats.LOW_COMPUTE, ",")  # --dtypes of the verbs that compare low dtypes to fp32

StepsOpt = Annotated[int, typer.Option("--steps", help="Greedy decoding steps.")]
PromptOpt = Annotated[str, typer.Option("--prompt", help="The text to continue.")]
ChatOpt = Annotated[bool, typer.Option("--chat", help="Apply the model's chat template to --prompt first (one user "
                                       "turn, the assistant's turn opened, as transformers' apply_chat_template); "
                                       "a model without one is refused.")]
LowDtypesOpt = Annotated[str, typer.Option("--dtypes", help="Low precisions against fp32: "
                                           f"{format_names(formats.LOW_COMPUTE)}.")]
ModelDeviceOpt = Annotated[str, typer.Option("--device", help="cpu (the default for a model run, unlike the kernel "
                                             "commands) | cuda | auto (the GPU where present, else the CPU).")]
TextOpt = Annotated[Optional[str], typer.Option("--text", help="A UTF-8 text file, teacher-forced (default: the "
                                                "held-out part of the shipped Shakespeare text).")]
ReferenceOpt = Annotated[Optional[str], typer.Option("--reference", help="REF, the reference model's spec, run in "
                                                   "fp32 (and fp64 where the verb re-runs it; default: the source "
                                                   "the export recorded, else the embedded model).")]
MaxKldOpt = Annotated[Optional[float], typer.Option("--max-kld", help="Exit 1 when a mean KLD is above this.")]
MinTop1Opt = Annotated[Optional[float], typer.Option("--min-top1", help="Exit 1 when a top-1 agreement (%) is "
                                                     "below this.")]


def spec_paths(*specs: tuple[str, str | None]) -> list[tuple[str, str | None]]:
    """(option, the file or folder a model spec reads) for each spec: what an
    output must not be, nor lie inside. A spec that does not parse is left to
    the run's own refusal, which names its option."""
    out = []
    for option, spec in specs:
        try:
            out.append((option, spec_path(spec)))
        except UsageError:
            pass
    return out


def early_checks(model: str | None = None, threads: int | None = None, model_option: str = "--model") -> None:
    """What a model verb refuses before an output path is checked (exit 2,
    torch not imported): --threads in range, the spec's engine known. The
    steps and the prompt are the run's start-up's (experiments/startup.py)."""
    from precisionlab.cli.options import check_model
    from precisionlab.io import inputs
    from precisionlab.runtime import threads as threads_mod

    threads_mod.check(threads)
    if model is not None:
        inputs.check_given(model, model_option)
        check_model(model)
