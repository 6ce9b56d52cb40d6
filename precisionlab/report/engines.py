"""compare model --engine's table and JSON."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import footer, safe_text, sci, num, stdout
from precisionlab.report.jsondoc import emit_json

_SKIP = ("name", "engine", "version", "vocab", "max_seq_len", "parameters")


def table(res) -> None:
    p = res.params
    stdout.print(f"reference: {safe_text(res.reference['name'])} in fp32 ({safe_text(p['reference_from'])}); {p['tokens']} positions teacher-forced, "
                 f"{p['steps']} greedy steps")
    for r in res.rows:
        settings = ", ".join(f"{k}={v}" for k, v in r["engine"].items() if k not in _SKIP)
        what = " ".join(str(r["engine"][k]) for k in ("engine", "version") if r["engine"].get(k))
        stdout.print(f"{safe_text(r['engine_spec'])}: {safe_text(what or r['engine'].get('name', ''))}; "
                     f"{safe_text(settings)}; tokens {safe_text(r['tokens'])}")
    t = Table(title="compare engine", title_justify="left")
    for col in ("engine", "mean KLD", "KLD p99", "max KLD", "top-1 agree %", "ln PPL ratio",
                "max |Δ logit| (shifted)", "greedy divergence", "ref margin there"):
        t.add_column(col, justify="left" if col == "engine" else "right")
    for r in res.rows:
        if "kld_mean" not in r:  # a top-k stream: a bound, labelled
            t.add_row(safe_text(r["engine_spec"]), f"≥ {sci(r['kld_lower_bound_mean'])} (bound)", "-",
                      f"≥ {sci(r['kld_lower_bound_max'])}", num(r["top1_agree_pct"], 5), "-", "-",
                      _divergence(r), num(r["reference_margin_at_divergence"], 4))
            continue
        t.add_row(safe_text(r["engine_spec"]), sci(r["kld_mean"]), sci(r["kld_p99"]), sci(r["kld_max"]),
                  num(r["top1_agree_pct"], 5), sci(r["ln_ppl_ratio"]), sci(r["max_abs_diff_shifted"]),
                  _divergence(r),
                  num(r["reference_margin_at_divergence"], 4))
    stdout.print(t)
    footer(None, res.takeaways + [f"FAILED: {f}" for f in res.failures])


def _divergence(r: dict) -> str:
    """"-" only where the greedy paths agreed over steps that ran; "not run" where none did."""
    if not r["greedy_steps"]:
        return "not run"
    return "-" if r["greedy_diverged_at"] is None else f"step {r['greedy_diverged_at']}"


def as_json(res) -> None:
    emit_json("compare engine", {"params": res.params, "reference": res.reference, "rows": res.rows,
                                         "failures": res.failures, "takeaways": res.takeaways,
                                         "timing": res.timing})
