"""precisionlab accumulate: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.options import plot_option, DeviceOpt, SeedOpt, JsonOpt, variant_names, catalog_help, format_names


def command(
    dtype: Annotated[str, typer.Option("--dtype", help=f"Storage format the values are rounded to: {format_names(formats.ALL)} "
                                       "(aliases: float32, bfloat16, fp4, ...).")] = "bf16",
    n: Annotated[int, typer.Option("--n", help="Number of values.")] = 10_000,
    value: Annotated[float, typer.Option("--value", help="The value repeated n times.")] = 0.1,
    dist: Annotated[Optional[str], typer.Option("--dist", help="Seeded random values instead: uniform | normal | lognormal.")] = None,
    values: Annotated[Optional[str], typer.Option("--values", help="Explicit values, comma-separated (e.g. 1e8,1,-1e8).")] = None,
    from_file: Annotated[Optional[str], typer.Option("--from", help="Values from a numeric .npy file (flattened).")] = None,
    methods: Annotated[Optional[str], typer.Option("--variants", "--methods", help=catalog_help(
        lambda: f"Comma list of sum variants: {variant_names('sum', 'cpu')} (CPU); {variant_names('sum', 'cuda')} (GPU). "
                "Default: all that apply.", "sum variants"))] = None,
    accumulators: Annotated[Optional[str], typer.Option("--acc-dtypes", help="Accumulator formats, comma list. "
                                                        f"Default: {format_names(formats.DEFAULT_ACCUMULATORS, ',')} "
                                                        f"(GPU: {format_names(formats.GPU_ACCUMULATORS)}).")] = None,
    plot: plot_option("the running sum against the step") = None,
    device: DeviceOpt = "all",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Sum n values in each accumulator format and method; separate storage from accumulation error."""
    from precisionlab.experiments import accumulate as exp
    from precisionlab.report import accumulate
    from precisionlab.report.output import Output

    out = Output(accumulate, json_out, plot, [("--from", from_file)])
    cfg = exp.AccumulateConfig(dtype=dtype, n=n, value=value, dist=dist, values=values, from_file=from_file,
                               methods=methods, accumulators=accumulators, device=device, seed=seed,
                               trace=plot is not None)
    out.run("accumulate", lambda advance: exp.run(cfg, advance))
