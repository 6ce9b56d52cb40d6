"""precisionlab compare metrics: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.model_options import (DEFAULT_LOWS, DEFAULT_SPEC, MaxKldOpt, MinTop1Opt, ModelDeviceOpt,
                                            TextOpt, early_checks, spec_paths)
from precisionlab.cli.options import plot_option, JsonOpt, ModelOpt, SeedOpt, format_names

def command(
    model: ModelOpt = DEFAULT_SPEC,
    text: TextOpt = None,
    tokens: Annotated[Optional[int], typer.Option("--tokens", help="Positions scored (default 8192).")] = None,
    dtypes: Annotated[str, typer.Option("--dtypes", help="Precisions against fp32: "
                                        f"{format_names(formats.COMPUTE)}.")] = DEFAULT_LOWS,
    save_logits: Annotated[Optional[list[str]], typer.Option("--save-logits", help="Write a run's logits and token "
                                                             "ids as safetensors: FILE (fp32) or DTYPE=FILE; "
                                                             "repeatable.")] = None,
    max_kld: MaxKldOpt = None,
    min_top1: MinTop1Opt = None,
    inject: Annotated[Optional[list[str]], typer.Option("--inject", help="logits:noise=SIGMA adds seeded Gaussian "
                                                        "noise to the compared runs' logits; repeatable.")] = None,
    plot: plot_option("KLD and flips") = None,
    device: ModelDeviceOpt = "cpu",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Next-token distribution statistics over a text, teacher-forced: KL divergence, top-1/top-5 agreement, Δp,
    perplexity, flips by margin, fp32 against each of --dtypes.

    Exit 1 when --max-kld or --min-top1 fails."""
    from precisionlab.experiments import logits as lexp
    from precisionlab.io import inputs
    from precisionlab.report import logits as logits_report
    from precisionlab.report.console import progress
    from precisionlab.report.plots import check_plot_path

    early_checks(model=model)
    inputs.check_given(text, "--text")
    plot = check_plot_path(plot, [("--text", text), *spec_paths(("--model", model))])
    cfg = lexp.MetricsConfig(model=model, text=text, tokens=lexp.DEFAULT_TOKENS if tokens is None else tokens,
                             dtypes=dtypes, device=device, seed=seed, inject=inject or [],
                             save_logits=save_logits or [], plot=plot, max_kld=max_kld, min_top1=min_top1)
    with progress("compare metrics", enabled=not json_out) as advance:
        res = lexp.run_model(cfg, advance)
    logits_report.show(res, plot, json_out)
    if res.failures:
        raise typer.Exit(1)
