"""softmax's tables and JSON."""

from __future__ import annotations

from rich.table import Table
from rich.markup import escape

from precisionlab.report.console import stdout, num, sci, footer
from precisionlab.report.jsondoc import emit_rows

def _probs(r) -> str:
    if r["output"] is None:
        return escape(f"[{r['shape'][0]}x{r['shape'][1]}]")
    return escape("[" + ", ".join(num(v, 7) for v in r["output"]) + "]")


def _verdict(r) -> str:
    if r["passed"]:
        return "[green]ok[/green]"
    return "[red]non-finite[/red]" if not r["finite"] else f"[red]{r['n_outside']} off[/red]"


def table(res) -> None:
    t = Table(title=f"softmax vs float64 (masked rows: {res.params['masked']})", title_justify="left")
    for col in ("case", "dtype", "device", "variant", "probabilities"):
        t.add_column(col, overflow="fold")
    for col in ("max abs", "rel L2", "row-sum err", "log-sum-exp", "verdict"):
        t.add_column(col, justify="right", overflow="fold")
    for r in (r for r in res.rows if r["kind"] == "variant"):
        t.add_row(r["case"], r["dtype"], r["device"], r["variant"], _probs(r), sci(r["max_abs_error"]), sci(r["rel_l2"]),
                  sci(r["row_sum_error"]), num(r["lse"], 8), _verdict(r))
    stdout.print(t)
    bugs = [r for r in res.rows if r["kind"] in ("bug", "bug-reference")]
    if bugs:
        b = Table(title="the classic bugs, beside the correct (stable) kernel", title_justify="left")
        for col in ("bug", "case", "dtype", "device", "stable", "buggy", "buggy max abs", "verdict"):
            b.add_column(col, overflow="fold")
        for ref, bug in zip(bugs[0::2], bugs[1::2], strict=True):
            b.add_row(bug["bug"], bug["case"], bug["dtype"], bug["device"], _probs(ref), _probs(bug),
                      sci(bug["max_abs_error"]), _verdict(bug))
        stdout.print(b)
    tol = ", ".join(f"{k} {v['rtol']:g}" for k, v in res.tolerances.items())
    stdout.print(f"verdict: every element within rtol ({tol}) of a float64 softmax of the stored inputs "
                 "with atol = max(rtol / cols, smallest subnormal); a non-finite output never passes.", style="dim", highlight=False)
    footer(res.devices.get("cuda_unavailable"), res.takeaways)


def as_json(res) -> None:
    emit_rows("softmax", res, devices=res.devices, tolerances=res.tolerances)
