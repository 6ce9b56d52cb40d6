"""precisionlab compare scores: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import JsonOpt
from precisionlab.errors import UsageError


def command(
    files: Annotated[list[str], typer.Argument(
        help="A B: per-question correctness of two builds on the same questions, each lm-evaluation-harness's "
             "samples_<task>_*.jsonl (--log_samples) or a CSV (question id, correct 0/1).", show_default=False)],
    metric: Annotated[Optional[str], typer.Option("--metric", help="The 0/1 field to pair (default: acc, "
                                                  "exact_match or correct, whichever the file has).")] = None,
    filter_: Annotated[Optional[str], typer.Option("--filter", help="lm-eval's filter to read where a file scores "
                                                   "each question under several (e.g. strict-match).")] = None,
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence of the test and interval.")] = 0.95,
    drop: Annotated[Optional[float], typer.Option("--drop", help="Also say how many questions resolve a drop of "
                                                  "this many accuracy points.")] = None,
    fail_on_worse: Annotated[bool, typer.Option("--fail-on-worse", help="Exit 1 when B is worse than A "
                                                "(McNemar's exact test).")] = False,
    json_out: JsonOpt = False,
):
    """Task scores, paired: McNemar's exact test and the interval for B's accuracy minus A's, the verdict, and
    the questions needed to resolve a drop."""
    if len(files) != 2:
        raise UsageError(f"compare scores takes A B (got {len(files)} files)")
    from precisionlab.experiments import scores as exp
    from precisionlab.report import scores as report

    result = exp.run(exp.ScoresConfig(a=files[0], b=files[1], metric=metric, filter=filter_,
                                      confidence=confidence, drop=drop, fail_on_worse=fail_on_worse))
    report.show(result, json_out)
    if result.failures:
        raise typer.Exit(1)
