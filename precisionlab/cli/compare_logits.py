"""precisionlab compare logits: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import JsonOpt


def command(
    ref: Annotated[str, typer.Argument(help="The reference logits file (safetensors: 'logits' positions x vocab, "
                                       "'tokens' positions), e.g. from compare model --metrics --save-logits.")],
    yours: Annotated[str, typer.Argument(help="Your engine's logits file, same layout and the same tokens.")],
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write KLD per position and flips by margin to this PNG.")] = None,
    max_kld: Annotated[Optional[float], typer.Option("--max-kld", help="Exit 1 when the mean KLD is above this.")] = None,
    min_top1: Annotated[Optional[float], typer.Option("--min-top1", help="Exit 1 when top-1 agreement (%) is below this.")] = None,
    json_out: JsonOpt = False,
):
    """Next-token distribution statistics between two logits files: KL divergence, agreement, Δp, perplexity.

    Exit 1 when --max-kld or --min-top1 is not met."""
    from precisionlab.report import logits as logits_report
    from precisionlab.report.console import progress
    from precisionlab.report.plots import require_matplotlib
    from precisionlab.experiments import logits as exp

    if plot:
        require_matplotlib()
    cfg = exp.LogitsConfig(ref=ref, yours=yours, plot=plot, max_kld=max_kld, min_top1=min_top1)
    with progress("compare logits", enabled=not json_out) as advance:
        result = exp.compare_files(cfg, advance)
    logits_report.show(result, plot, json_out)
    if result.failures:
        raise typer.Exit(1)
