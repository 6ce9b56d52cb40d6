"""nondeterminism's tables, JSON and plot."""

from __future__ import annotations

from rich.table import Table
from rich.markup import escape

from precisionlab.report.console import stdout, safe_text, num, sci, footer, ulps
from precisionlab.report.jsondoc import emit_json
from precisionlab.report.plots import figure

_NONDET_TITLES = {
    "atomics": "atomics vs tree: one fp32 sum, run after run",
    "splitk": "split-K matmul",
    "batch": "batch invariance: the first 64 rows, each alone vs inside every batch (1 ... 1024) that holds it",
    "torch_ops": "torch's nondeterministic ops",
    "threads": "CPU threads: chunking follows the thread count",
}


def table(res) -> None:
    for section in res.params["sections"]:
        rows = [r for r in res.rows if r["section"] == section]
        if not rows:
            continue
        if section == "tp":
            from precisionlab.report.tp import tp_table

            tp_table(rows, res.takeaways.get("tp"))
            continue
        t = Table(title=_NONDET_TITLES[section], title_justify="left")
        t.add_column("device")
        t.add_column("variant", overflow="fold")
        if section == "threads":
            for col in ("result", "error vs fsum", "same bits as"):
                t.add_column(col, justify="right")
            for r in rows:
                t.add_row(r["device"], escape(r["label"]), num(r["result"]), sci(r["abs_error"]),
                          ", ".join(map(str, r["matches"])) or "-")
        elif section == "batch":
            _nondeterminism_batch_rows(t, rows)
        else:
            for col in ("runs", "distinct", "spread (ulps)", "max diff", "relative", "note"):
                t.add_column(col, justify="right" if col != "note" else "left", overflow="fold")
            for r in rows:
                note = ""
                if r.get("refused"):
                    note = escape(f"refused: {r['refused']}")
                elif section == "splitk":
                    note = f"{sci(r['max_abs_diff_vs_unsplit'])} from unsplit; rel L2 vs fp64 {sci(r['rel_l2_vs_fp64'])}"
                elif section == "batch":
                    note = ("differs at batch " + ", ".join(map(str, r["differs_at"]))) if r["differs_at"] else \
                        "identical at every batch size"
                    if r.get("rows_changed") is not None:
                        note += f"; rows changed {r['rows_changed']} of {r['rows_compared']}"
                label = r["label"] + (" [emulated]" if r["emulated"] else "")
                t.add_row(r["device"], escape(label), str(r["runs"]),
                          "-" if r["distinct"] is None else f"{r['distinct']} of {r['runs']}",
                          "-" if r["max_spread_ulps"] is None else ulps(r["max_spread_ulps"]),
                          sci(r["max_abs_diff"]), sci(r["rel_spread"]), note)
        stdout.print(t)
        if section == "batch":
            stdout.print("rows changed: of the first 64 rows, those whose result in some batch differs from the row "
                         "computed alone; pairs changed: (row, batch size) pairs that differ; most distinct: the most "
                         "different results one row took, alone and in every batch (1: invariant); max diff and "
                         "relative: over the same pairs.", style="dim", highlight=False)
        if section in res.takeaways:
            stdout.print(f"• {safe_text(res.takeaways[section])}", highlight=False)
    footer(res.devices.get("cuda_unavailable"), [])


def _nondeterminism_batch_rows(t: Table, rows) -> None:
    """Batch invariance: every count covers the same rows (the first 64, each
    alone vs in every batch that holds it), and each header says what it counts."""
    for col in ("batch sizes", "rows changed", "pairs changed", "most distinct", "max diff", "relative", "note"):
        t.add_column(col, justify="right" if col != "note" else "left", overflow="fold")
    for r in rows:
        label = r["label"] + (" [emulated]" if r["emulated"] else "")
        if r.get("refused"):
            t.add_row(r["device"], escape(label), "-", "-", "-", "-", "-", "-", escape(f"refused: {r['refused']}"))
            continue
        note = ("differs at batch " + ", ".join(map(str, r["differs_at"]))) if r["differs_at"] else \
            "identical at every batch size"
        t.add_row(r["device"], escape(label), str(len(r["batch_sizes"])),
                  f"{r['rows_changed']} of {r['rows_compared']}", f"{r['pairs_changed']} of {r['pairs_compared']}",
                  str(r["distinct_per_row_max"]), sci(r["max_abs_diff"]), sci(r["rel_spread"]), note)


def as_json(res) -> None:
    emit_json("nondeterminism", {"params": res.params, "devices": res.devices, "exact": res.exact,
                                 "rows": res.rows, "takeaways": res.takeaways})


def plot(res, path: str) -> None:
    from precisionlab.catalog import formats

    ulp = float(formats.get("fp32").spacing(res.exact))
    with figure(path, f"atomic sums of the same {res.params['n']} values",
                 "result - fsum (fp32 ulps at the exact sum)", "runs") as ax:
        for label, s in res.samples.items():
            ax.hist((s - res.exact) / ulp, bins=40, alpha=0.6, label=label)
        ax.axvline(0, color="k", lw=0.8)
