"""precisionlab compare moved: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated

import typer

from precisionlab.cli.options import JsonOpt
from precisionlab.errors import UsageError


def command(
    files: Annotated[list[str], typer.Argument(
        help="REF A B: per-layer dumps of one input (.safetensors, .npz, .pt, as compare tensors reads them), "
             "e.g. from compare layers --dump. A is the build you trust, B the one under test.", show_default=False)],
    json_out: JsonOpt = False,
):
    """Where did B move? The first module where B's error against REF exceeds A's beyond the yardstick, with
    the rule and its number.

    Exit 1 when B moved (a rule fired), 0 when B stays within A's distance from REF everywhere."""
    if len(files) != 3:
        raise UsageError(f"compare moved takes REF A B (got {len(files)} files)")
    from precisionlab.experiments import moved as exp
    from precisionlab.report import moved as report

    result = exp.run(exp.MovedConfig(ref=files[0], a=files[1], b=files[2]))
    report.show(result, json_out)
    if result.failures:
        raise typer.Exit(1)
