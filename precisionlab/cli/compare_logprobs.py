"""precisionlab compare logprobs: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import plot_option, JsonOpt

# The diagnoses as --fail-on names them (experiments/logprobs.py's DIAGNOSES; written here so --help imports no
# experiment; tests/test_logprobs_gates.py checks the two lists are the same).
DIAGNOSES_HELP = ("temperature (Δ grows with the log-prob: different temperatures), renormalised (a truncated "
                  "top-p/top-k support renormalised), offset (a one-sided bias), shifted (one position apart), "
                  "nonfinite (NaN or inf log-probs)")


def command(
    a: Annotated[str, typer.Argument(help="A: the trainer's log-probs (.jsonl, OpenAI-style .json, .safetensors or "
                                     ".npz; layouts in docs/compare-logprobs.md).")],
    b: Annotated[str, typer.Argument(help="B: the rollout engine's log-probs of the same tokens, in any of those "
                                     "formats.")],
    clip: Annotated[Optional[str], typer.Option("--clip", help="Comma list of c > 1: the share of ratios outside "
                                                "[1/c, c] for each (default 1.1,1.25,2).")] = None,
    cap: Annotated[float, typer.Option("--cap", help="A truncated-IS cap on the sequence ratio: the share of "
                                       "sequences it would clip.")] = 2.0,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="A Hugging Face tokenizer folder to decode "
                                                     "the worst tokens (offline, trust_remote_code=False); without "
                                                     "it, the files' token strings.")] = None,
    worst: Annotated[int, typer.Option("--worst", help="How many worst sequences and positions to list.")] = 10,
    plot: plot_option("Δ per position and the ratios' histogram") = None,
    fail_on: Annotated[Optional[str], typer.Option("--fail-on", help="Exit 1 when any of these diagnoses is made "
                                                   "(comma list, or any): " + DIAGNOSES_HELP + ".",
                                                   show_default=False)] = None,
    json_out: JsonOpt = False,
):
    """Two per-token log-prob streams of the same tokens (trainer and rollout): Δ, importance ratios, ESS, KL
    estimators, and what made them disagree: a temperature mismatch, a renormalised top-p/top-k rollout, a one-sided
    offset, a one-position shift, NaN/-inf (--fail-on turns any of them into exit 1)."""
    from precisionlab.experiments import logprobs as exp
    from precisionlab.report import logprobs as report
    from precisionlab.report.output import Output

    out = Output(report, json_out, plot, [("A", a), ("B", b), ("--tokenizer", tokenizer)])  # --plot is none of them
    cfg = exp.LogprobsConfig(a=a, b=b, clip=clip, cap=cap, tokenizer=tokenizer, worst=worst, fail_on=fail_on)
    exp.parse_fail_on(fail_on)  # before any file is read: a bad list is exit 2 at once
    res = out.run("compare logprobs", lambda advance: exp.run(cfg, advance))
    if res.failures:
        from precisionlab.report.console import hint

        for f in res.failures:
            hint(f"FAIL {f}")
        raise typer.Exit(1)
