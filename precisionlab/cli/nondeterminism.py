"""precisionlab nondeterminism: options parsed here; the work is the experiment's, the output the report's.

A group whose own run (no verb) is the sections, with one verb, `endpoint URL`,
for a server's unique completions (cli/nondeterminism_endpoint.py): each has
only its own options, and `nondeterminism --runs 5` keeps working as before."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import plot_option, DeviceOpt, SeedOpt, JsonOpt
from precisionlab.errors import UsageError


def command(
    ctx: typer.Context,
    runs: Annotated[int, typer.Option("--runs", help="Repetitions of each computation (at least 2).")] = 100,
    n: Annotated[int, typer.Option("--n", help="Values in the summed array.")] = 1 << 24,
    sections: Annotated[Optional[str], typer.Option("--sections", help="Comma list: atomics, splitk, batch, torch_ops, threads, tp.")] = None,
    plot: plot_option("a histogram of the atomic results (ulps around fsum)") = None,
    device: DeviceOpt = "all",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Run-to-run and batch-size variation: atomics, split-K, batch invariance, torch ops, threads, tensor parallel.
    `nondeterminism endpoint URL`: a server's unique completions of one prompt."""
    if ctx.invoked_subcommand is not None:
        given = [p.opts[0] for p in ctx.command.params
                 if getattr(ctx.get_parameter_source(p.name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")]
        if given:
            raise UsageError(f"{', '.join(given)} are the sections' options; "
                             f"nondeterminism {ctx.invoked_subcommand} takes its own after its name")
        return
    from precisionlab.experiments import nondeterminism as exp
    from precisionlab.report import nondeterminism
    from precisionlab.report.output import Output

    out = Output(nondeterminism, json_out, plot)
    cfg = exp.NondetConfig(runs=runs, n=n, device=device, seed=seed, sections=sections, keep_samples=plot is not None)
    out.run("nondeterminism", lambda advance: exp.run(cfg, advance))
