"""The report of compare moved: per tensor A's and B's error against REF, the
ratio, the rule that fired, and the first place B moved."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import show_with_failures, footer, safe_text, sci, stdout
from precisionlab.report.jsondoc import emit_json


def show(res, json_out: bool) -> None:
    show_with_failures(res, json_out, table, as_json)


def table(res) -> None:
    p = res.params
    stdout.print(f"B {safe_text(p['b'])} and A {safe_text(p['a'])} against REF {safe_text(p['ref'])}: "
                 f"{p['compared']} tensors compared", highlight=False)
    t = Table(title="per tensor, in REF's execution order", title_justify="left")
    for c in ("tensor", "A vs REF", "B vs REF", "B vs A", "ratio", "flag"):
        t.add_column(c, justify="left" if c in ("tensor", "flag") else "right")
    first = res.first_divergence["name"] if res.first_divergence else None
    for r in res.rows:
        mark = " ◀ first" if r["name"] == first else ""
        t.add_row(safe_text(r["name"]), sci(r["error_a"]), sci(r["error_b"]), sci(r["diff_ba"]),
                  f"{r['ratio']:.3g}x",
                  safe_text((r["reason"] or "") + mark))
    stdout.print(t)
    footer(None, res.takeaways, note="rel-L2. ratio: (B vs A) / (A vs REF), A's error the yardstick. Rules: "
                                     "numerics/divergence.py in compare tensors' three-way roles (REF_FP32 = REF, "
                                     "REF_LOW = A, YOURS = B).")


def as_json(res) -> None:
    emit_json("compare moved", {"params": res.params, "first_divergence": res.first_divergence,
                                "missing": res.missing, "timing": res.timing, "rows": res.rows,
                                "failures": res.failures, "takeaways": res.takeaways})
