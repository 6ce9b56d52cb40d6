"""The report of `precisionlab kvcache`: the cache table, the next-token
distribution table (compare model --metrics' statistics), strict JSON."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import or_dash, footer, safe_text, sci, stdout
from precisionlab.report.jsondoc import emit_rows


def table(res) -> None:
    p = res.params
    t = Table(title=f"kvcache: {safe_text(str(res.model_info.get('name', '')))}, {p['steps']} greedy steps, K and V x "
                    f"{p['activation_scale']:g} in the cache", title_justify="left")
    for col in ("device", "cache", "scale"):
        t.add_column(col)
    for col in ("logit rel L2 (mean)", "max", "vs bf16 cache", "saturated entries", "first divergence", "flag"):
        t.add_column(col, justify="right")
    for r in res.rows:
        t.add_row(r["device"], r["cache"], r["scale"] or "-", sci(r["mean_rel_l2"]), sci(r["max_rel_l2"]),
                  or_dash(r["vs_bf16"], ".3g", "x"), f"{r['saturated']} / {r['entries']}",
                  "-" if r["first_divergence"] is None else f"step {r['first_divergence']}", r["flag"] or "-")
    stdout.print(t)
    d = Table(title="next-token distributions, teacher-forced, against the fp32 cache (as compare metrics)",
              title_justify="left")
    for col in ("device", "cache", "scale"):
        d.add_column(col)
    for col in ("KLD mean", "KLD p90", "KLD max", "vs bf16 cache", "top-1 agreement", "fp32 top-1 in top 5",
                "Δp RMS", "KL(bf16 cache ‖ this)"):
        d.add_column(col, justify="right")
    for r in res.rows:
        s, b = r["distribution"], r["distribution_vs_bf16_cache"]
        d.add_row(r["device"], r["cache"], r["scale"] or "-", sci(s["kld_mean"]), sci(s["kld_p90"]),
                  sci(s["kld_max"]), or_dash(r["kld_vs_bf16"], ".3g", "x"), f"{s['top1_agree']}/{s['positions']}",
                  f"{s['ref_top1_in_top5_pct']:.1f} %", sci(s["dp_rms"]), sci(b["kld_mean"]))
    stdout.print(d)
    footer(None, res.takeaways, note=_note(p))


def as_json(res) -> None:
    emit_rows("kvcache", res, model=res.model_info)


def _note(p: dict) -> str:
    """What the two tables' columns mean."""
    where = (f"the first {p['calibration_chars']} characters of the training text" if p["model"] == "embedded" else
             f"the first {p['calibration_chars']} characters of the embedded model's training text "
             f"({p['calibration_tokens']} tokens)")
    return (
        "logit rel L2: teacher-forced along the fp32 cache's greedy path, against it. saturated: entries whose scaled "
        "value lay past max + half a spacing and were clamped to +-max. calibrated: one scale per layer for K and for "
        f"V from {where}. dynamic: one scale per (key/value) head and token. KLD: KL(P_fp32 cache || P_cache) per "
        "position in nats, percentiles nearest-rank; vs bf16 cache: the ratio of mean KLDs; the last column: the mean "
        "KLD with the bf16 cache as P. Δp: this cache's probability of the fp32 cache's greedy token minus the fp32 "
        "cache's.")
