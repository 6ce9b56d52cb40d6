"""compare contracts' table and JSON."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import footer, num, safe_text, sci, stdout, ulps
from precisionlab.report.jsondoc import emit_json


def _share(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def table(res) -> None:
    info, p = res.model_info, res.params
    t = Table(title=f"compare contracts: {safe_text(info['name'])}, {p['positions']} positions "
                    f"({p['prompt_tokens']} prompt + {p['steps']} greedy fp32 tokens) on {p['device']}",
              title_justify="left")
    for col in ("dtype", "contract", "positions", "bit-identical", "max |Δ logprob|", "ulps", "first diff",
                "top-2 margin there", "greedy flips", "fp64 max |Δ|", "verdict"):
        t.add_column(col, justify="left" if col in ("dtype", "contract", "verdict") else "right")
    for r in res.rows:
        if not r["supported"]:
            t.add_row(r["dtype"], safe_text(r["label"]), "-", "-", "-", "-", "-", "-", "-", "-",
                      "not supported by this engine")
            continue
        t.add_row(r["dtype"], safe_text(r["label"]), str(r["positions"]), _share(r["bit_identical_share"]),
                  sci(r["max_abs_diff"]), ulps(r["max_abs_diff_ulps"]),
                  "-" if r["first_diff_position"] is None else str(r["first_diff_position"]),
                  num(r["margin_at_first_diff"], 3), str(r["greedy_flips"]), sci(r["exact_max_abs_diff"]),
                  r["verdict"])
    stdout.print(t)
    stdout.print("Δ logprob over every vocabulary entry at each compared position, in nats and in ulps of the "
                 "run's dtype at that log-prob; greedy flips: positions whose argmax changes; a broken contract "
                 f"is re-run in {p['exact_dtype']}.", style="dim", highlight=False)
    stdout.print(f"load {res.timing['load_s']:.2f} s, run {res.timing['run_s']:.2f} s", style="dim", highlight=False)
    footer(None, res.takeaways)


def as_json(res) -> None:
    emit_json("compare contracts", {"params": res.params, "model": res.model_info, "flags": res.flags,
                                            "timing": res.timing, "rows": res.rows, "takeaways": res.takeaways})
