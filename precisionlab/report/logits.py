"""The report of compare model --metrics and compare logits: distribution
statistics per run, flips by fp32's top-2 margin, the CI verdicts, the plot."""

from __future__ import annotations

import numpy as np
from rich.markup import escape
from rich.table import Table

from precisionlab.report.console import footer, hint, num, sci, stdout
from precisionlab.report.jsondoc import emit_json

# Rows of the main table: (label, key, formatter), one line per statistic.
_PCT = lambda x: "-" if x is None else f"{x:.2f} %"  # noqa: E731
STATS = (
    ("KLD mean", "kld_mean", sci), ("KLD median", "kld_median", sci), ("KLD p90", "kld_p90", sci),
    ("KLD p99", "kld_p99", sci), ("KLD p99.9", "kld_p99_9", sci), ("KLD max", "kld_max", sci),
    ("top-1 agreement", "top1_agree", None),
    ("fp32 top-1 in its top 5", "fp32_top1_in_top5_pct", _PCT),
    ("its top-1 in fp32 top 5", "top1_in_fp32_top5_pct", _PCT),
    ("Δp mean", "dp_mean", sci), ("Δp RMS", "dp_rms", sci),
    ("perplexity", "ppl", lambda x: num(x, 6)), ("ln(PPL / PPL fp32)", "ln_ppl_ratio", sci),
)


def _printable(text: str) -> str:
    """Control characters (from a file name) shown escaped, never sent to the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def show(res, plot: str | None, json_out: bool) -> None:
    if plot:
        draw(res, plot)
    (as_json if json_out else table)(res)
    for f in res.failures:
        hint(f"FAIL {f}")


def table(res) -> None:
    p = res.params
    model = res.command == "compare model --metrics"  # else compare logits
    if model:
        title = (f"{res.model_info['name']}: {p['tokens']} positions of {p['text']}, "
                 f"teacher-forced in windows of {p['window']}")
        if p["noise_sigma"]:
            title += f", logits + N(0, {p['noise_sigma']:g}²)"
    else:
        title = f"compare logits: {p['yours']} ({p['yours_dtype']}) against {p['ref']} ({p['ref_dtype']}), {p['tokens']} positions"
    stdout.print(escape(_printable(title)), highlight=False)
    t = Table(title="next-token distributions" + (" against fp32" if model else " against REF"),
              title_justify="left")
    t.add_column("statistic")
    for r in res.rows:
        t.add_column(escape(r["dtype"]), justify="right")
    for label, key, fmt in STATS:
        if fmt is None:  # agreement: the count, then the percentage
            t.add_row(label, *[f"{r[key]}/{r['positions']} ({r['top1_agree_pct']:.2f} %)" for r in res.rows])
        else:
            t.add_row(label, *[fmt(r[key]) for r in res.rows])
    stdout.print(t)
    ref = res.rows[0]
    name = "fp32" if model else "REF"
    stdout.print(f"{name} perplexity {num(ref['ppl_fp32'], 6)} over {ref['positions']} positions", highlight=False)

    m = Table(title="top-1 flips by fp32's top-1 minus top-2 logit margin", title_justify="left")
    m.add_column("margin", justify="right")
    m.add_column("positions", justify="right")
    for r in res.rows:
        m.add_column(f"{escape(r['dtype'])} flips", justify="right")
    for i, b in enumerate(ref["flips_by_margin"]):
        cells = []
        for r in res.rows:
            c = r["flips_by_margin"][i]
            cells.append("-" if c["flip_rate"] is None else f"{c['flips']} ({100 * c['flip_rate']:.3g} %)")
        m.add_row(f"[{b['margin_lo']:g}, {b['margin_hi']:g})", str(b["positions"]), *cells)
    stdout.print(m)
    stdout.print("KLD: KL(P_fp32 || P_run) per position in nats; percentiles are nearest-rank. Δp: the run's "
                 "probability of the text's next token minus fp32's.", style="dim", highlight=False)
    if "load_s" in res.timing:
        t = res.timing
        stdout.print(f"load {t['load_s']:.2f} s, run {t['run_s']:.2f} s ({t['run_cpu_s']:.2f} s of CPU; torch "
                     f"threads: {t['torch_threads']}), after the torch import", style="dim", highlight=False)
    footer(None, res.takeaways)


def as_json(res) -> None:
    emit_json(res.command, {"params": res.params, "model": res.model_info, "timing": res.timing,
                            "rows": res.rows, "failures": res.failures, "takeaways": res.takeaways})


def draw(res, path: str) -> None:
    """KLD per position (log scale) and flip rate against fp32's top-2 margin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in res.rows:
        kl = res.kl[r["dtype"]]
        floor = np.where(kl > 0, kl, np.nan)  # zeros have no place on a log axis
        a.plot(np.arange(kl.size), floor, lw=0.4, alpha=0.8, label=f"{r['dtype']} (mean {r['kld_mean']:.2e})")
        buckets = [c for c in r["flips_by_margin"] if c["positions"]]
        mids = [np.sqrt(max(c["margin_lo"], 1e-3) * (c["margin_hi"] if np.isfinite(c["margin_hi"]) else 30.0))
                for c in buckets]
        b.plot(mids, [c["flip_rate"] for c in buckets], marker="o", label=r["dtype"])
    a.set_yscale("log")
    a.set_xlabel("position")
    a.set_ylabel("KL(P_fp32 || P_run), nats")
    a.set_title("KLD per position")
    a.legend(fontsize=8)
    b.set_xscale("log")
    b.set_xlabel("fp32 top-1 minus top-2 logit (bucket, geometric middle)")
    b.set_ylabel("top-1 flip rate")
    b.set_title("flips by margin")
    b.legend(fontsize=8)
    fig.tight_layout()
    from pathlib import Path

    from precisionlab.io import outputs

    try:  # format from the path the user named, written atomically like every file this tool writes
        written = outputs.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120,
                                                                     format=Path(path).suffix.lstrip(".").lower()))
    finally:
        plt.close(fig)
    hint(f"plot written to {written}")
