"""precisionlab compare builds: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated

import typer

from precisionlab.cli.options import plot_option, JsonOpt, SeedOpt
from precisionlab.errors import UsageError


def command(
    files: Annotated[list[str], typer.Argument(
        help="REF A B: three logits files over the same tokens (as compare logits reads them; REF may be llama.cpp's "
             "--kl-divergence-base file). A is the build you trust, B the one under test.", show_default=False)],
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence of the intervals.")] = 0.95,
    seed: SeedOpt = 0,
    resamples: Annotated[int, typer.Option("--resamples", help="Bootstrap resamples.")] = 2000,
    fail_on_worse: Annotated[bool, typer.Option("--fail-on-worse", help="Exit 1 when B is worse than A on KLD "
                                                "(its interval for B - A lies above 0).")] = False,
    plot: plot_option("the per-position KLD difference") = None,
    json_out: JsonOpt = False,
):
    """Regression or noise? B against A, both against REF: per position the paired difference of KLD, top-1
    agreement, |Δp| and NLL, its mean with a block-bootstrap interval, the smallest effect resolved, the verdict."""
    if len(files) != 3:
        raise UsageError(f"compare builds takes REF A B (got {len(files)} files)")
    from precisionlab.report.plots import check_plot_path

    plot = check_plot_path(plot, [("REF", files[0]), ("A", files[1]), ("B", files[2])])  # before the run
    from precisionlab.experiments import builds as exp
    from precisionlab.report import builds as report
    from precisionlab.report.console import progress

    cfg = exp.BuildsConfig(ref=files[0], a=files[1], b=files[2], confidence=confidence, seed=seed,
                           resamples=resamples, fail_on_worse=fail_on_worse, plot=plot)
    with progress("compare builds", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    report.show(result, json_out)
    if result.failures:
        raise typer.Exit(1)
