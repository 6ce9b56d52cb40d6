"""precisionlab tf32: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import DeviceOpt, SeedOpt, JsonOpt, ThreadsOpt


def command(
    m: Annotated[int, typer.Option("--m", help="Rows of A.")] = 4096,
    n: Annotated[int, typer.Option("--n", help="Columns of B.")] = 4096,
    k: Annotated[int, typer.Option("--k", help="Inner dimension.")] = 4096,
    sweep_mn: Annotated[int, typer.Option("--sweep-mn", help="m = n for the error-against-K sweep.")] = 256,
    no_sweep: Annotated[bool, typer.Option("--no-sweep", help="Skip the K sweep (256 ... 16384).")] = False,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write error against K to this file (.png, .svg, .pdf, ...).")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = None,
):
    """TF32, bf16 and fp16 matmuls against float64: error, speed, integer exactness, error against K."""
    from precisionlab.experiments import tf32 as exp
    from precisionlab.report import tf32
    from precisionlab.report.output import Output

    out = Output(tf32, json_out, plot)
    cfg = exp.Tf32Config(m=m, n=n, k=k, sweep_mn=sweep_mn, sweep=not no_sweep, device=device, seed=seed,
                         threads=threads)
    out.run("tf32", lambda advance: exp.run(cfg, advance))
