"""The report of compare scores: the 2x2 table of right/wrong, the accuracy
difference with its interval, McNemar's exact p, the verdict."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from precisionlab.report.console import show_with_failures, footer, safe_text, stdout
from precisionlab.report.jsondoc import emit_json


def show(res, json_out: bool) -> None:
    show_with_failures(res, json_out, table, as_json)


def table(res) -> None:
    p, r = res.params, res.rows[0]
    flt = f", filter {safe_text(p['filter'])}" if p["filter"] else ""
    stdout.print(f"B {safe_text(p['b'])} against A {safe_text(p['a'])}: {r['questions']} questions, metric "
                 f"{safe_text(p['metric'])}{flt}", highlight=False)
    t = Table(title="per question", title_justify="left")
    t.add_column("")
    t.add_column("B right", justify="right")
    t.add_column("B wrong", justify="right")
    t.add_row("A right", str(r["both_right"]), str(r["a_only"]))
    t.add_row("A wrong", str(r["b_only"]), str(r["both_wrong"]))
    stdout.print(t)
    s = Table(title=f"accuracy, {p['confidence'] * 100:g} % interval for B - A", title_justify="left")
    for c in ("A", "B", "B - A", "interval", "McNemar p", "MDE 80 %", "verdict"):
        s.add_column(c, justify="left" if c == "verdict" else "right")
    s.add_row(f"{r['acc_a_pct']:.2f} %", f"{r['acc_b_pct']:.2f} %", f"{r['diff_pct']:+.2f}",
              escape(f"[{r['ci_lo']:+.2f}, {r['ci_hi']:+.2f}]"), f"{r['p_value']:.3g}", f"{r['mde']:.2f}", r["verdict"])
    stdout.print(s)
    footer(None, res.takeaways,
           note=f"points of accuracy. {p['test']}; {p['interval']}; the verdict is the test's. MDE: the smallest "
                f"drop these questions resolve with 80 % power at the observed discordance (Connor 1987).")


def as_json(res) -> None:
    emit_json("compare scores", {"params": res.params, "verdict": res.verdict, "rows": res.rows,
                                 "failures": res.failures, "takeaways": res.takeaways})
