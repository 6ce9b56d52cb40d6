"""precisionlab attention-cases: options parsed here; the cases are the experiment's, the output the report's.

A verb of its own, not a flag on `attention`: `attention` sweeps FlashAttention's precision knobs over random
inputs and measures errors; this one asks a different question (does a kernel get each edge case right,
pass or fail against an exact value), takes a different input (the user's kernel) and shares none of its
knobs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.options import plot_option, JsonOpt, format_names


def command(
    impl: Annotated[Optional[str], typer.Option("--impl", help="Your attention kernel, package.module:function, "
                                                "called as fn(q, k, v, *, scale, mask=, sink=, softcap=, window=, "
                                                "q_pos=, rope_base=, splits=) on numpy arrays in the case's format "
                                                "(docs/attention-cases.md). Default: the FlashAttention emulator "
                                                "and the library's attention op.")] = None,
    cases: Annotated[Optional[str], typer.Option("--cases", help="The cases to run, a list (default: all).")] = None,
    dtypes: Annotated[str, typer.Option("--dtypes", help=f"The formats q, k, v are given in: "
                                        f"{format_names(formats.COMPUTE)}.")] = ",".join(
        formats.ATTENTION_CASES_DEFAULT),
    max_keys: Annotated[int, typer.Option("--max-keys", help="The denominator case's longest row: 4096, 8192, ... "
                                          "up to this many keys.")] = 1 << 20,
    bound: Annotated[float, typer.Option("--bound", help="The relative error the takeaways name a row length and a "
                                         "RoPE position by.")] = 0.01,
    plot: plot_option("the denominator case's error against the row length") = None,
    json_out: JsonOpt = False,
):
    """The attention edge cases 2026's kernels got wrong (sinks, empty and masked split-KV partitions, soft-capping,
    sliding-window edges, long-row denominators, RoPE phases, verify-shaped chunks), each against an exact value.
    Exit 1 when a case fails (so CI can run it on your kernel)."""
    from precisionlab.experiments import attention_cases as exp
    from precisionlab.io import inputs
    from precisionlab.report import attention_cases as report
    from precisionlab.report.output import Output

    inputs.check_given(impl, "--impl")
    chosen = None
    if cases is not None:
        chosen = tuple(dict.fromkeys(c.strip() for c in cases.split(",") if c.strip()))
        if not chosen:
            from precisionlab.errors import UsageError

            raise UsageError(f"--cases {cases!r}: a list of case names ({', '.join(exp.CASE_NAMES)})")
    cfg = exp.CasesConfig(impl=impl, cases=chosen, dtypes=tuple(formats.parse_list(dtypes, exp.DTYPES, "--dtypes")),
                          max_keys=max_keys, bound=bound)
    result = Output(report, json_out, plot).run("attention-cases", lambda advance: exp.run(cfg, advance))
    if result.any_failed:
        raise typer.Exit(1)
