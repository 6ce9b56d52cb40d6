"""precisionlab compare logits: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.model_options import MaxKldOpt, MinTop1Opt
from precisionlab.cli.options import plot_option, JsonOpt
from precisionlab.errors import UsageError


def command(
    files: Annotated[list[str], typer.Argument(
        help="REF YOURS, or REF REF_LOW YOURS (REF_LOW: the reference run in the low precision, the yardstick), "
             "or REF alone with --write-kld-base. Each a logits file (safetensors: 'logits' positions x vocab, "
             "'tokens' positions, e.g. from compare metrics --save-logits) or, for REF, llama.cpp's "
             "--kl-divergence-base file.", show_default=False)],
    plot: plot_option("KLD per position and flips by margin") = None,
    max_kld: MaxKldOpt = None,
    min_top1: MinTop1Opt = None,
    write_kld_base: Annotated[Optional[str], typer.Option("--write-kld-base", help="Write REF as llama.cpp's "
                                                          "--kl-divergence-base file (uint16 log-probs).")] = None,
    kld_ctx: Annotated[Optional[int], typer.Option("--kld-ctx", help="Its chunk length n_ctx (default: the window "
                                                   "REF's run restarted at, from its metadata).")] = None,
    json_out: JsonOpt = False,
):
    """Next-token distribution statistics between logits files: KL divergence, agreement, Δp, perplexity, with ±.

    With REF_LOW, every statistic of YOURS stands beside the yardstick's. Exit 1 when --max-kld or --min-top1 is
    not met, when YOURS is non-finite where REF is finite, or when YOURS departs from the yardstick (beyond 4x
    and 3 standard errors)."""
    if not 1 <= len(files) <= 3:
        raise UsageError(f"compare logits takes REF YOURS or REF REF_LOW YOURS (got {len(files)} files)")
    from precisionlab.report import logits as logits_report
    from precisionlab.report.console import progress
    from precisionlab.report.plots import require_matplotlib
    from precisionlab.experiments import logits as exp

    if plot:
        require_matplotlib()
    ref, *rest = files
    low, yours = (rest[0], rest[1]) if len(rest) == 2 else (None, rest[0] if rest else None)
    cfg = exp.LogitsConfig(ref=ref, yours=yours, ref_low=low, plot=plot, max_kld=max_kld, min_top1=min_top1,
                           write_kld_base=write_kld_base, kld_ctx=kld_ctx)
    with progress("compare logits", enabled=not json_out) as advance:
        result = exp.compare_files(cfg, advance)
    logits_report.show(result, plot, json_out)
    if result.failures:
        raise typer.Exit(1)
