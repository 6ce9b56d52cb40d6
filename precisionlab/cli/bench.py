"""precisionlab bench: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.errors import UsageError
from precisionlab.cli.options import DeviceOpt, SeedOpt, JsonOpt


def command(
    section: Annotated[Optional[str], typer.Argument(help="Sections to run, comma list: accumulate, softmax, matmul, attention "
                                                     "(default: all). Same as --sections.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Smaller sizes and fewer runs (under 2 minutes on an H200).")] = False,
    sections: Annotated[Optional[str], typer.Option("--sections", help="Comma list of sections (default: all): accumulate, softmax, matmul, attention (CPU).")] = None,
    cpu_n: Annotated[Optional[int], typer.Option("--cpu-n", help="Elements for the CPU kernels (default 1e8; 1e7 with --quick).")] = None,
    gpu_n: Annotated[Optional[int], typer.Option("--gpu-n", help="Elements for the GPU sums (default 2^28, --quick too).")] = None,
    device: DeviceOpt = "all",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Benchmark every kernel beside its baseline (numpy.sum, torch, the copy bandwidth)."""
    from precisionlab.io import inputs
    from precisionlab.experiments import bench as exp
    from precisionlab.report import bench
    from precisionlab.report.output import Output

    for name, v in (("--cpu-n", cpu_n), ("--gpu-n", gpu_n)):
        if v is not None:
            inputs.check_n(v, 16, name)
    if section is not None and sections is not None:
        raise UsageError("give the sections once: as an argument or with --sections")
    out = Output(bench, json_out)
    cfg = exp.BenchConfig(quick=quick, device=device, sections=section if section is not None else sections,
                          seed=seed, cpu_n=cpu_n,
                          gpu_n=gpu_n)
    out.run("bench", lambda advance: exp.run(cfg, advance))
