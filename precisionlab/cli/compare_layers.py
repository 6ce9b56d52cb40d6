"""precisionlab compare layers: options parsed here; the work is the experiment's, the output the report's.

One model module by module (experiments/layers): its low dtypes against its
own fp32. Two models: compare engine-layers (cli/compare_engine_layers)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.model_options import (DEFAULT_LOWS, DEFAULT_PROMPT, DEFAULT_SPEC, DEFAULT_STEPS, ChatOpt,
                                            LowDtypesOpt, ModelDeviceOpt, PromptOpt, StepsOpt, early_checks, spec_paths)
from precisionlab.cli.options import force_option, plot_option, JsonOpt, ModelOpt, SeedOpt, WideOpt, format_names
from precisionlab.errors import UsageError


def command(
    model: ModelOpt = DEFAULT_SPEC,
    steps: StepsOpt = DEFAULT_STEPS,
    prompt: PromptOpt = DEFAULT_PROMPT,
    chat: ChatOpt = False,
    dtypes: LowDtypesOpt = DEFAULT_LOWS,
    inject: Annotated[Optional[list[str]], typer.Option("--inject", help="TARGET:KEY=VALUE, repeatable: perturb one "
                                                        "module of the low-precision run: scale=F, eps=F (a norm) or "
                                                        f"rope={format_names(formats.LOW_COMPUTE, '|')} (the RoPE "
                                                        "module; 'rope' in the embedded model).")] = None,
    dump: Annotated[Optional[str], typer.Option("--dump", help="Write each run's per-module outputs to "
                                                "DIR/fp32.safetensors, DIR/bf16.safetensors, ... (execution order "
                                                "and token ids in the metadata), for compare tensors.")] = None,
    force: force_option("--dump's files that exist (DIR/bf16.safetensors, ...); DIR's other files are kept") = False,
    plot: plot_option("the error along the model") = None,
    device: ModelDeviceOpt = "cpu",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
):
    """One model, module by module: each module's accumulated and local error in each of --dtypes against what
    rounding alone costs there; names the first divergence (two models: compare engine-layers).

    Exit 1 when a module diverges."""
    from precisionlab.report.output import Output

    if force and dump is None:
        raise UsageError("--force goes with --dump: it lets the run replace DIR/<dtype>.safetensors files that exist")
    from precisionlab.experiments import layers as lexp
    from precisionlab.report import layers as layers_report
    from precisionlab.report.plots import check_plot_path

    early_checks(model=model)
    plot = check_plot_path(plot, spec_paths(("--model", model)))
    cfg = lexp.LayersConfig(model=model, steps=steps, prompt=prompt, dtypes=dtypes, device=device, seed=seed,
                            inject=inject or [], dump=dump, force=force, chat=chat)
    res = Output(layers_report, json_out, plot, table_kw={"wide": wide}).run(
        "compare layers", lambda advance: lexp.run(cfg, advance))
    if res.first_divergence is not None:
        raise typer.Exit(1)

