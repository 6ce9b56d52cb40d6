"""precisionlab softmax: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.options import DeviceOpt, SeedOpt, JsonOpt, variant_names, catalog_help, format_names


def command(
    dtype: Annotated[str, typer.Option("--dtypes", help=f"Input formats, comma list: {format_names(formats.COMPUTE)}. "
                                       "Arithmetic is fp32.")] = "fp32",
    methods: Annotated[Optional[str], typer.Option("--variants", "--methods", help=catalog_help(
        lambda: f"Comma list of softmax variants: {variant_names('softmax', 'cpu', ('algorithm',))} (CPU and GPU); "
                f"{variant_names('softmax', 'cuda', ('kernel',))} (GPU); the named bugs {variant_names('softmax', kinds=('bug',))}. "
                f"Default: {variant_names('softmax', default=True)}, with the bugs in their own table.",
        "softmax variants"))] = None,
    masked: Annotated[str, typer.Option("--masked", help="A row of all -inf gives: nan (textbook) | zero.")] = "nan",
    values: Annotated[Optional[str], typer.Option("--values", help="Logits, comma-separated; rows separated by ';'.")] = None,
    rows: Annotated[Optional[int], typer.Option("--rows", help="Random matrix rows.")] = None,
    cols: Annotated[Optional[int], typer.Option("--cols", help="Random matrix columns.")] = None,
    dist: Annotated[Optional[str], typer.Option("--dist", help="Random logits (--rows/--cols): normal (default) | "
                                                "uniform.")] = None,
    scale: Annotated[Optional[float], typer.Option("--scale", help="Multiply random logits (--rows/--cols) by this "
                                                   "(default 1).")] = None,
    from_file: Annotated[Optional[str], typer.Option("--from", help="Logits from a 2-D .npy file.")] = None,
    device: DeviceOpt = "all",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Naive vs stable vs online softmax and log-sum-exp: the edge cases, the classic bugs, the errors."""
    from precisionlab.experiments import softmax as exp
    from precisionlab.report import softmax
    from precisionlab.report.output import Output

    out = Output(softmax, json_out)
    cfg = exp.SoftmaxConfig(dtype=dtype, methods=methods, masked=masked, values=values, rows=rows, cols=cols,
                            dist=dist, scale=scale, from_file=from_file, device=device, seed=seed)
    out.run("softmax", lambda advance: exp.run(cfg, advance))
