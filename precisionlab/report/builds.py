"""The report of compare builds: one row a statistic (B - A against REF, its
interval, the smallest effect resolved, the verdict), the JSON, the plot."""

from __future__ import annotations

import numpy as np
from rich.markup import escape
from rich.table import Table

from precisionlab.report.console import show_with_failures, footer, hint, safe_text, stdout
from precisionlab.report.jsondoc import emit_json

LABELS = {"kld": "KLD", "top1_agree_pct": "top-1 agreement (%)", "abs_dp": "|Δp|", "nll": "NLL"}


def _g(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def show(res, json_out: bool) -> None:
    if res.params.get("plot"):
        draw(res, res.params["plot"])
    show_with_failures(res, json_out, table, as_json)


def table(res) -> None:
    p = res.params
    stdout.print(f"B {safe_text(p['b'])} against A {safe_text(p['a'])}, both against REF {safe_text(p['ref'])}: "
                 f"{p['tokens']} positions, vocabulary {p['vocab']}", highlight=False)
    t = Table(title=f"B - A per position, mean and {p['confidence'] * 100:g} % interval", title_justify="left")
    for c in ("statistic", "A", "B", "B - A", "interval", "± half", "MDE 80 %", "block", "verdict"):
        t.add_column(c, justify="left" if c in ("statistic", "verdict") else "right")
    for r in res.rows:
        t.add_row(LABELS[r["statistic"]], _g(r["a"]), _g(r["b"]), _g(r["diff"]),
                  escape(f"[{_g(r['ci_lo'])}, {_g(r['ci_hi'])}]"), _g(r["ci_half_width"]), _g(r["mde"]),
                  str(r["block"]), r["verdict"])
    stdout.print(t)
    stdout.print(f"verdict ({p['primary']}): {res.verdict}", highlight=False)
    footer(None, res.takeaways,
           note=f"{p['resampling']}, {p['resamples']} resamples, seed {p['seed']}. MDE: the true difference this "
                f"run would call worse with 80 % power, (z + z_0.8) x the bootstrap standard error. "
                f"Higher is worse except top-1 agreement.")


def as_json(res) -> None:
    emit_json("compare builds", {"params": res.params, "verdict": res.verdict, "timing": res.timing,
                                 "rows": res.rows, "failures": res.failures, "takeaways": res.takeaways})


def draw(res, path: str) -> None:
    """The per-position KLD difference B - A and its running mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from precisionlab.report.plots import save

    d = res.diffs["kld"]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(np.arange(d.size), d, lw=0.4, alpha=0.6, label="KLD(B) - KLD(A) per position")
    ax.plot(np.arange(d.size), np.cumsum(d) / np.arange(1, d.size + 1), lw=1.2, label="running mean")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("position")
    ax.set_ylabel("nats")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        written = save(fig, path)
    finally:
        plt.close(fig)
    hint(f"plot written to {written}")
