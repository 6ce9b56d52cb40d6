"""accumulate's table, JSON and plot."""

from __future__ import annotations

import numpy as np
from rich.table import Table

from precisionlab.report.console import stdout, safe_text, num, sci, footer, ulps
from precisionlab.report.jsondoc import emit_json
from precisionlab.report.plots import figure

def table(res) -> None:
    t = Table(title=f"accumulate: {safe_text(res.input_desc)}, stored as {res.storage}, n = {res.n}",
              title_justify="left")
    for col in ("device", "accum", "variant"):
        t.add_column(col, overflow="fold")
    for col in ("result", "abs err", "rel err", "ulps", "bound", "absorbed at (step)", "predicted stall"):
        t.add_column(col, justify="right", overflow="fold")
    for r in res.rows:
        if not r["available"]:
            continue
        bound = sci(r["bound"]) if r["bound_kind"] == "rigorous" else (
            r["bound_kind"] if r["bound_kind"] in ("vacuous", "overflow") else f"~{sci(r['bound'])}")
        if r["bound_kind"] == "rigorous" and not r["within_bound"]:
            bound = f"[red]{bound} EXCEEDED[/red]"
        stall = "-" if r["stall_step"] is None else f"{num(r['stall_value'])} ({r['stall_step']})"
        t.add_row(r["device"], r["accumulator"], r["variant"], num(r["result"]), sci(r["abs_error"]),
                  sci(r["rel_error"]), ulps(r["ulps"]), bound, stall, num(r["predicted_stall"]))
    stdout.print(t)
    stdout.print(f"exact sum of stored values (fsum): {num(res.exact_stored)}    "
                 f"of intended values: {num(res.exact_intended)}    "
                 f"representation error: {num(res.representation_error)}",
                 highlight=False)
    stdout.print("bound: Higham's a-priori bound on |abs err|, each rounding also allowed half the smallest "
                 "subnormal spacing (underflow); vacuous once (n-1)u >= 1; ~ marks a first-order estimate "
                 "(compensated methods, only while n u < 1), not a rigorous bound; overflow: a partial sum passed "
                 "the accumulator's largest value.\n"
                 "absorbed at: the sum before the first addition (1-based step) that left it unchanged; "
                 "for a constant input that is where it stalls for good. predicted: the first power of two "
                 "whose spacing is >= 2|value|.", style="dim", highlight=False)
    missing = sorted({r["variant"] for r in res.rows if not r["available"]})
    footer(f"({', '.join(missing)}) {res.devices['cuda_unavailable']}" if missing else None, res.takeaways)



def as_json(res) -> None:
    emit_json("accumulate", {
        "params": res.params, "devices": res.devices,
        "exact_stored": res.exact_stored, "exact_intended": res.exact_intended, "abs_sum": res.abs_sum,
        "representation_error": res.representation_error,
        "rows": res.rows, "takeaways": res.takeaways,
    })



def plot(res, path: str) -> None:
    """Running sum against step for the sequential methods, beside the exact line."""
    with figure(path, f"accumulate: {res.input_desc}, stored as {res.storage}", "step", "running sum") as ax:
        for label, trace in res.traces.items():
            step = max(1, trace.size // 4000)  # a few thousand points draw the same picture
            idx = np.arange(0, trace.size, step)
            ax.plot(idx + 1, trace[idx], label=label.removeprefix("cpu "), lw=1.2)
        ax.axhline(res.exact_stored, color="k", ls="--", lw=0.8, label="exact (stored values)")
