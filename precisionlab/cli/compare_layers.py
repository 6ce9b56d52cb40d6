"""precisionlab compare layers: options parsed here; the work is the experiment's, the output the report's.

One model module by module (experiments/layers), or, with --reference SPEC
and/or --engine SPEC, two models on the same tokens (experiments/layers_pair)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.model_options import (DEFAULT_PROMPT, DEFAULT_SPEC, DEFAULT_STEPS, ChatOpt, LowDtypesOpt,
                                            ModelDeviceOpt, PromptOpt, StepsOpt, early_checks, spec_paths)
from precisionlab.cli.options import force_option, plot_option, JsonOpt, ModelOpt, SeedOpt, WideOpt, format_names
from precisionlab.errors import UsageError

DEFAULT_DTYPES = format_names(formats.LOW_COMPUTE, ",")


def command(
    ctx: typer.Context,
    model: ModelOpt = DEFAULT_SPEC,
    steps: StepsOpt = DEFAULT_STEPS,
    prompt: PromptOpt = DEFAULT_PROMPT,
    chat: ChatOpt = False,
    dtypes: LowDtypesOpt = DEFAULT_DTYPES,
    reference: Annotated[Optional[str], typer.Option("--reference", help="A second model's spec, the reference: "
                                                     "both models on the same tokens, every module of both, fp32 "
                                                     "vs fp32 and three-way per --dtypes.")] = None,
    engine: Annotated[Optional[list[str]], typer.Option("--engine", help="YOURS as an engine spec, instead of "
                                                        "--model, against --reference (default: the source its "
                                                        "export recorded).")] = None,
    inject: Annotated[Optional[list[str]], typer.Option("--inject", help="TARGET:KEY=VALUE, repeatable: perturb one "
                                                        "module of the low-precision run: scale=F, eps=F (a norm) or "
                                                        f"rope={format_names(formats.LOW_COMPUTE, '|')} (the RoPE "
                                                        "module; 'rope' in the embedded model). One model only.")] = None,
    dump: Annotated[Optional[str], typer.Option("--dump", help="Write each run's per-module outputs to "
                                                "DIR/fp32.safetensors, DIR/bf16.safetensors, ... (execution order "
                                                "and token ids in the metadata), for compare tensors. One model "
                                                "only.")] = None,
    force: force_option("--dump's files that exist (DIR/bf16.safetensors, ...); DIR's other files are kept") = False,
    heads: Annotated[bool, typer.Option("--heads", help="Inside attention too: each attention's softmax "
                                        "probabilities and per-head outputs (the output projection's input), "
                                        "judged head by head against that head's rounding. Two models only.")]
    = False,
    plot: plot_option("the error along the model") = None,
    device: ModelDeviceOpt = "cpu",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
):
    """Module by module: each module's accumulated and local error against what rounding alone costs there; names
    the first divergence. With --reference SPEC (or --engine SPEC): two models on the same tokens.

    Exit 1 when a module diverges."""
    from precisionlab.report.output import Output

    if force and dump is None:
        raise UsageError("--force goes with --dump: it lets the run replace DIR/<dtype>.safetensors files that exist")
    if engine or reference is not None:
        return _pair(ctx, model, engine, reference, inject, dump, steps, prompt, dtypes, device, seed, plot,
                     json_out, wide, heads, chat)
    if heads:
        raise UsageError("--heads compares two models' attention heads: give --reference SPEC (or --engine SPEC)")
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


def _pair(ctx, model, engine, reference, inject, dump, steps, prompt, dtypes, device, seed, plot, json_out, wide,
          heads, chat):
    """Two models, module by module (experiments/layers_pair)."""
    from precisionlab.engines import registry
    from precisionlab.experiments import layers_pair as pexp
    from precisionlab.io import inputs
    from precisionlab.report import layers_pair as report
    from precisionlab.report.output import Output

    if engine and len(engine) > 1:
        raise UsageError("compare layers --engine takes one engine (YOURS); repeat the run for another")
    engine = engine[0] if engine else None
    if inject or dump is not None:
        raise UsageError(f"{'--inject' if inject else '--dump'} is for one model's layers; with --reference the "
                         "bug is in the second model itself")
    if engine is not None and ctx.get_parameter_source("model").name != "DEFAULT":
        raise UsageError("compare layers: give YOURS as --model or as --engine, not both")
    inputs.check_given(reference, "--reference")
    yours = engine if engine is not None else model
    inputs.check_given(yours, "--engine" if engine is not None else "--model")
    pexp.check_specs(yours, reference, engine is not None)
    paths = [(o, registry.spec_path(s)) for o, s in (("--model", yours), ("--reference", reference)) if s]
    cfg = pexp.PairConfig(model=None if engine is not None else model, engine=engine, reference=reference,
                          steps=steps, prompt=prompt, dtypes=dtypes, device=device, seed=seed, heads=heads,
                          chat=chat)
    res = Output(report, json_out, plot, paths, table_kw={"wide": wide}).run(
        "compare layers", lambda advance: pexp.run(cfg, advance))
    if res.first_divergence is not None:
        raise typer.Exit(1)
