"""precisionlab compare pair: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import JsonOpt
from precisionlab.errors import UsageError


def command(
    files: Annotated[list[str], typer.Argument(
        help="A B: two logits files of one engine at one precision that should agree (prefill vs decode, chunked "
             "vs whole, alone vs batched, ...); safetensors 'logits' (positions x vocab) and 'tokens'.",
        show_default=False)],
    exact: Annotated[Optional[list[str]], typer.Option("--exact", help="The same pair computed in fp64: give it "
                                                       "twice, A64 then B64. The verdict is then whether the "
                                                       "difference persists in fp64.", show_default=False)] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="The precision A and B were computed in "
                                                 "(default: the files' metadata dtype, else their stored type).",
                                                 show_default=False)] = None,
    chunk: Annotated[Optional[int], typer.Option("--chunk", help="B was fed in chunks of N positions: say "
                                                 "whether the breaks begin at chunk starts.",
                                                 show_default=False)] = None,
    fail_on_break: Annotated[bool, typer.Option("--fail-on-break", help="Exit 1 when the pair breaks beyond "
                                                "rounding (algorithmic): a CI gate.")] = False,
    json_out: JsonOpt = False,
):
    """Two runs of one engine and precision judged as a contract: rounding, or algorithmic (with --exact: persists
    in fp64), the first position that differs and, with --chunk, whether the breaks sit at chunk starts.

    With --fail-on-break, exit 1 when the pair breaks beyond rounding (algorithmic)."""
    if len(files) != 2:
        raise UsageError(f"compare pair takes A B (got {len(files)} files)")
    if exact is not None and len(exact) != 2:
        raise UsageError(f"--exact takes the fp64 pair: give it twice, A64 then B64 (got {len(exact)})")
    from precisionlab.experiments import pair as exp
    from precisionlab.report import pair as pair_report
    from precisionlab.report.console import progress

    cfg = exp.PairConfig(a=files[0], b=files[1], exact_a=exact[0] if exact else None,
                         exact_b=exact[1] if exact else None, dtype=dtype, chunk=chunk)
    with progress("compare pair", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    pair_report.show(result, json_out, fail_on_break)
    if fail_on_break and result.failures:
        raise typer.Exit(1)
