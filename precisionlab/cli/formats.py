"""precisionlab formats: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import (plot_option, DeviceOpt, JsonOpt, SeedOpt, accumulator_option,
                                      block_format_names)


FormatsAccumulatorOpt = accumulator_option("The block-scaled matmul under each model, one row each; default: "
                                           "the library's fp32 matmul.")


def command(
    formats: Annotated[Optional[str], typer.Option("--formats", help=f"Block formats, comma list: {block_format_names()} "
                                                   "(default: all).")] = None,
    rules: Annotated[Optional[str], typer.Option("--rules", help="Scale rules, comma list: floor (OCP), rceil (NVIDIA), "
                                                 "ceil, even for the MX formats; nearest (NVFP4's e4m3 scale). "
                                                 "Default: all.")] = None,
    blocks: Annotated[Optional[str], typer.Option("--blocks", help="Block sizes, comma list, 1..1024 (default 16,32).")] = None,
    dists: Annotated[Optional[str], typer.Option("--dists", help="Data, comma list: normal, student_t, outlier_10x, "
                                                 "outlier_30x, outlier_100x (one element per block scaled). "
                                                 "Default: all.")] = None,
    n: Annotated[int, typer.Option("--n", help="Values per distribution for the element statistics.")] = 65536,
    shape: Annotated[str, typer.Option("--shape", help="The matmul, MxKxN; blocks run along K.")] = "64x1024x64",
    baselines: Annotated[bool, typer.Option("--baselines/--no-baselines", help="Also bf16 and per-tensor-scaled fp8 "
                                            "(e4m3, e5m2).")] = True,
    accumulator: FormatsAccumulatorOpt = None,
    plot: plot_option("relative RMSE per configuration") = None,
    device: DeviceOpt = "all",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Block-scaled formats (MXFP8/6/4, NVFP4) by scale rule and block size: error, clipping, flushing, matmul."""
    from precisionlab.experiments import formats as exp
    from precisionlab.report import formats as formats_report
    from precisionlab.report.output import Output

    out = Output(formats_report, json_out, plot)
    cfg = exp.FormatsConfig(formats=formats, rules=rules, blocks=blocks, dists=dists, n=n, shape=shape,
                            baselines=baselines, device=device, seed=seed, accumulators=accumulator)
    out.run("formats", lambda advance: exp.run(cfg, advance))
