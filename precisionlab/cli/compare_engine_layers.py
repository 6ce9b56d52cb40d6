"""precisionlab compare engine-layers: options parsed here; the work is the experiment's, the output the report's.

Two models on the same tokens, module by module (experiments/layers_pair): YOURS
(--engine, any spec) against REF (--reference). The pair's other verb,
`compare engine`, compares the same two at their logits."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.model_options import (DEFAULT_LOWS, DEFAULT_PROMPT, DEFAULT_STEPS, ChatOpt, LowDtypesOpt,
                                            ModelDeviceOpt, PromptOpt, ReferenceOpt, StepsOpt)
from precisionlab.cli.options import plot_option, JsonOpt, SeedOpt, WideOpt
from precisionlab.errors import UsageError


def command(
    engine: Annotated[Optional[list[str]], typer.Option("--engine", help="YOURS, any engine spec whose modules or "
                                                  "per-layer tensors can be read: hf:DIR, python:FILE:FN, "
                                                  "llamacpp:FILE.gguf (with ,kv=f32), embedded.",
                                                  show_default=False)] = None,
    reference: ReferenceOpt = None,
    steps: StepsOpt = DEFAULT_STEPS,
    prompt: PromptOpt = DEFAULT_PROMPT,
    chat: ChatOpt = False,
    dtypes: LowDtypesOpt = DEFAULT_LOWS,
    heads: Annotated[bool, typer.Option("--heads", help="Inside attention too: each attention's softmax "
                                        "probabilities and per-head outputs (the output projection's input), "
                                        "judged head by head against that head's rounding.")] = False,
    plot: plot_option("the error along the model") = None,
    device: ModelDeviceOpt = "cpu",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
):
    """Two models on the same tokens, module by module: YOURS (--engine SPEC) against REF (--reference SPEC),
    fp32 vs fp32 and three-way per --dtypes, each module's error against what rounding costs there; names the
    first module where YOURS departs.

    Exit 1 when a module diverges."""
    from precisionlab.engines import registry
    from precisionlab.experiments import layers_pair as pexp
    from precisionlab.io import inputs
    from precisionlab.report import layers_pair as report
    from precisionlab.report.output import Output

    if not engine:
        raise UsageError("compare engine-layers needs --engine SPEC (YOURS: hf:DIR, python:FILE:FN, "
                         "llamacpp:FILE.gguf, ...)")
    if len(engine) > 1:
        raise UsageError("compare engine-layers takes one --engine (YOURS); repeat the run for another")
    engine = engine[0]
    inputs.check_given(engine, "--engine")
    inputs.check_given(reference, "--reference")
    pexp.check_specs(engine, reference)
    paths = [(o, registry.spec_path(s)) for o, s in (("--engine", engine), ("--reference", reference)) if s]
    cfg = pexp.PairConfig(engine=engine, reference=reference, steps=steps, prompt=prompt, dtypes=dtypes,
                          device=device, seed=seed, heads=heads, chat=chat)
    res = Output(report, json_out, plot, paths, table_kw={"wide": wide}).run(
        "compare engine-layers", lambda advance: pexp.run(cfg, advance))
    if res.first_divergence is not None:
        raise typer.Exit(1)
