"""compare pair's table and JSON."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import footer, hint, num, safe_text, sci, stdout
from precisionlab.report.jsondoc import emit_json


def show(res, json_out: bool, gate: bool = False) -> None:
    (as_json if json_out else table)(res)
    for f in res.failures if gate else ():
        hint(f"FAIL {f}")


def _pos(v) -> str:
    return "-" if v is None else str(v)


def table(res) -> None:
    p, r = res.params, res.row
    t = Table(title=f"compare pair: A {safe_text(p['a'])} vs B {safe_text(p['b'])}, {p['positions']} positions, "
                    f"{p['dtype']}", title_justify="left")
    for col in ("bit-identical", "max |Δ logprob|", "rounding bound there", "worst / bound", "first diff",
                "first beyond rounding", "fp64 max |Δ|", "verdict"):
        t.add_column(col, justify="left" if col == "verdict" else "right")
    t.add_row(f"{100 * r['bit_identical_share']:.0f}%", sci(r["max_abs_diff"]), sci(r["rounding_bound_at_max"]),
              num(r["worst_bound_ratio"], 3), _pos(r["first_diff_position"]),
              _pos(r["first_beyond_rounding_position"]), sci(r["exact_max_abs_diff"]), r["verdict"])
    stdout.print(t)
    stdout.print(f"Δ logprob: the largest over the vocabulary at a position, in nats; the rounding bound: "
                 f"{p['rounding_depth']} roundings of {p['dtype']} at the position's largest |logit| (at least 1)"
                 + ("; fp64: the same pair computed in fp64 (--exact)" if p["exact_a"] else "") + ".",
                 style="dim", highlight=False)
    footer(None, res.takeaways)


def as_json(res) -> None:
    emit_json("compare pair", {"params": res.params, "rows": [res.row], "failures": res.failures,
                               "timing": res.timing, "takeaways": res.takeaways})
