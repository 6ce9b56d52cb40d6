"""precisionlab tf32: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.io import inputs
from precisionlab.cli.options import (plot_option, DeviceOpt, JsonOpt, SeedOpt, ThreadsOpt,
                                      accumulator_option)


Tf32AccumulatorOpt = accumulator_option("Instead of the modes: each model emulated on the CPU at 64 x K x 64, "
                                        "error against float64 for each --dtypes and --k.")


def command(
    m: Annotated[int, typer.Option("--m", help="Rows of A.")] = 4096,
    n: Annotated[int, typer.Option("--n", help="Columns of B.")] = 4096,
    k: Annotated[Optional[str], typer.Option("--k", help="Inner dimension (default 4096); with --accumulator, "
                                            "a list K[,K...] to sweep (default 256,1024,4096,16384).")] = None,
    sweep_mn: Annotated[int, typer.Option("--sweep-mn", help="m = n for the error-against-K sweep.")] = 256,
    no_sweep: Annotated[bool, typer.Option("--no-sweep", help="Skip the K sweep (256 ... 16384).")] = False,
    plot: plot_option("error against K") = None,
    device: DeviceOpt = "all",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = None,
    accumulator: Tf32AccumulatorOpt = None,
    dtypes: Annotated[str, typer.Option("--dtypes", help="With --accumulator: the input formats.")] = "fp8_e4m3",
):
    """TF32, bf16 and fp16 matmuls against float64: error, speed, integer exactness, error against K."""
    from precisionlab.experiments import tf32 as exp
    from precisionlab.report import tf32
    from precisionlab.report.output import Output

    from precisionlab.errors import UsageError

    out = Output(tf32, json_out, plot)
    try:
        ks = inputs.integers("4096" if k is None else k, ",", "--k")
    except ValueError:
        raise UsageError(f"--k {k!r}: an integer, or with --accumulator a list K[,K...]") from None
    if accumulator is None and len(ks) != 1:
        raise UsageError("--k takes one value unless --accumulator is given")
    cfg = exp.Tf32Config(m=m, n=n, k=ks[0], sweep_mn=sweep_mn, sweep=not no_sweep, device=device, seed=seed,
                         threads=threads)
    if accumulator is not None:
        cfg.accumulators = [accumulator]
        cfg.acc_dtypes = tuple(s.strip() for s in dtypes.split(",") if s.strip())
        cfg.acc_k = exp.ACC_K if k is None else tuple(ks)
    out.run("tf32", lambda advance: exp.run(cfg, advance))
