"""compare routing's tables and JSON."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import footer, or_dash, safe_text, stdout
from precisionlab.report.jsondoc import emit_rows


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def table(res) -> None:
    p = res.params
    t = Table(title=f"log-prob mismatch by routing: A {safe_text(p['a'])} vs B {safe_text(p['b'])} "
                    f"({p['tokens']} tokens, {p['layers']} MoE layers, top-{p['top_k']})", title_justify="left")
    t.add_column("tokens with", overflow="fold")
    for col in ("tokens", "share", "mean |Δ|", "|Δ| share", "KL k3 share", "excess |Δ| share"):
        t.add_column(col, justify="right")
    for r in res.rows:
        t.add_row(r["group"], str(r["tokens"]), _pct(r["token_share"]), or_dash(r["mean_abs_diff"], ".4g"),
                  _pct(r["abs_diff_share"]), _pct(r["kl_k3_share"]), _pct(r.get("excess_abs_diff_share")))
    stdout.print(t)
    lt = Table(title="routing flips by layer", title_justify="left")
    for col in ("layer", "flip rate", "same experts, other order"):
        lt.add_column(col, justify="right")
    for r in res.layers:
        lt.add_row(str(r["layer"]), f"{100 * r['flip_share']:.2f} %", f"{100 * r['order_only_rate']:.2f} %")
    stdout.print(lt)
    footer(None, res.takeaways, note="Δ = B - A per token (nats); a flip: the two traces choose different expert "
           "sets in a layer; KL k3: r - 1 - log r, r = p_A / p_B, at B's tokens; excess: the flipped tokens' |Δ| "
           "beyond the unflipped tokens' mean.")


def as_json(res) -> None:
    emit_rows("compare routing", res, layers=res.layers)
