"""precisionlab kvcache: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.model_options import ChatOpt
from precisionlab.cli.options import ModelOpt, SeedOpt, JsonOpt, check_model, format_names
from precisionlab.engines.registry import DEFAULT_PROMPT, DEFAULT_SPEC


def command(
    dtypes: Annotated[Optional[str], typer.Option("--dtypes", help="fp8 cache formats, comma list: "
                                                  f"{format_names(formats.FP8)} (default: both). fp32 and bf16 "
                                                  "caches are always shown.")] = None,
    scales: Annotated[Optional[str], typer.Option("--scales", help="KV scales, comma list: unit, calibrated (per "
                                                  "layer, from a calibration text), dynamic (per head and token). "
                                                  "Default: all.")] = None,
    activation_scale: Annotated[float, typer.Option("--activation-scale", help="Multiply K and V by this before they "
                                                    "are cached and divide after: the same model with large "
                                                    "activations (try 1000).")] = 1.0,
    steps: Annotated[int, typer.Option("--steps", help="Greedy steps.")] = 50,
    prompt: Annotated[str, typer.Option("--prompt", help="Prompt text.")] = DEFAULT_PROMPT,
    chat: ChatOpt = False,
    model: ModelOpt = DEFAULT_SPEC,
    text: Annotated[Optional[str], typer.Option("--text", help="A UTF-8 text file whose first 512 characters "
                                                "calibrate the scales (default: the shipped Shakespeare's).")]
    = None,
    device: Annotated[str, typer.Option("--device", help="cpu (the default for a model run, unlike the kernel "
                                        "commands) | cuda | all (the CPU, plus the GPU where present: a table "
                                        "each). auto, the old spelling of all here, still works this release.")] = "cpu",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """A model (the embedded one, or --model hf:DIR) with its KV cache in fp8 (unit, calibrated or dynamic scales)
    against fp32 and bf16 caches."""
    from precisionlab.experiments import kvcache as exp
    from precisionlab.report import kvcache
    from precisionlab.report.output import Output

    from precisionlab.io import inputs

    inputs.check_given(text, "--text")
    check_model(model)  # the steps and the prompt: the run's start-up (experiments/startup.py)
    out = Output(kvcache, json_out)
    cfg = exp.KVCacheConfig(dtypes=dtypes, scales=scales, activation_scale=activation_scale, steps=steps,
                            prompt=prompt, device=device, seed=seed, model=model, text=text, chat=chat)
    out.run("kvcache", lambda advance: exp.run(cfg, advance))
