"""precisionlab nondeterminism: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import DeviceOpt, SeedOpt, JsonOpt


def command(
    runs: Annotated[int, typer.Option("--runs", help="Repetitions of each computation (at least 2).")] = 100,
    n: Annotated[int, typer.Option("--n", help="Values in the summed array.")] = 1 << 24,
    sections: Annotated[Optional[str], typer.Option("--sections", help="Comma list: atomics, splitk, batch, torch_ops, threads, tp.")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Histogram of the atomic results, in ulps around fsum, to this file (.png, .svg, .pdf, ...).")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Run-to-run and batch-size variation: atomics, split-K, batch invariance, torch ops, threads, tensor parallel."""
    from precisionlab.experiments import nondeterminism as exp
    from precisionlab.report import nondeterminism
    from precisionlab.report.output import Output

    out = Output(nondeterminism, json_out, plot)
    cfg = exp.NondetConfig(runs=runs, n=n, device=device, seed=seed, sections=sections, keep_samples=plot is not None)
    out.run("nondeterminism", lambda advance: exp.run(cfg, advance))
