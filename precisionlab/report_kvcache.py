"""The report of `precisionlab kvcache`: one table, strict JSON."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report import _footer, emit_json, sci, stdout


def kvcache_table(res) -> None:
    p = res.params
    t = Table(title=f"kvcache: {res.model_info.get('name', '')}, {p['steps']} greedy steps, K and V x "
                    f"{p['activation_scale']:g} in the cache", title_justify="left")
    for col in ("device", "cache", "scale"):
        t.add_column(col)
    for col in ("logit rel L2 (mean)", "max", "vs bf16 cache", "saturated entries", "first divergence", "flag"):
        t.add_column(col, justify="right")
    for r in res.rows:
        t.add_row(r["device"], r["cache"], r["scale"] or "-", sci(r["mean_rel_l2"]), sci(r["max_rel_l2"]),
                  "-" if r["vs_bf16"] is None else f"{r['vs_bf16']:.3g}x", f"{r['saturated']} / {r['entries']}",
                  "-" if r["first_divergence"] is None else f"step {r['first_divergence']}", r["flag"] or "-")
    stdout.print(t)
    stdout.print("logit rel L2: teacher-forced along the fp32 cache's greedy path, against it. saturated: entries "
                 "whose scaled value lay past max + half a spacing and were clamped to +-max. calibrated: one scale "
                 f"per layer for K and for V from the first {p['calibration_chars']} characters of the training text. "
                 "dynamic: one scale per head and token.", style="dim", highlight=False)
    _footer(None, res.takeaways)


def kvcache_json(res) -> None:
    emit_json("kvcache", {"params": res.params, "model": res.model_info, "rows": res.rows,
                          "takeaways": res.takeaways})
