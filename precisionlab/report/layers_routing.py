"""compare layers' routing section (both forms: one model's low dtypes vs
fp32, and YOURS vs REF): per MoE layer, the tokens whose top-k set changed,
the routed weight moved and the fp64 call. Shown only where the model has
routers (experiments/layers_routing)."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import note, pct, safe_text, sci, stdout, ulps

NOTE = ("routing: each run's MoE routers, from the logits it computed (fp32 softmax/sigmoid, the model's top-k). "
        "flips: tokens whose top-k expert set changed; order only: the same set in another slot order; mass moved: "
        "sum |w_a - w_b| over experts (mean, p99); fp64 persists: flips still there when both routers run in fp64 on their "
        "own inputs with their fp32 weights (algorithmic), the rest vanish (the router's rounding); routers differ: "
        "of those, where A's router in fp64 on B's input still disagrees with B's (weights, bias or algorithm), the "
        "rest came with the router's input (moved by the modules above); "
        "margin: the first run's k-th minus (k+1)-th logit (choice score where a bias or groups decide) in ulps "
        "of the second's dtype, median over the flips that vanish.")


def section(rows: list[dict], group) -> None:
    """One table per comparison (group(row) names it: "bf16 vs fp32", ...); nothing without rows."""
    for value in dict.fromkeys(group(r) for r in rows):
        t = Table(title=f"routing: {value} at each MoE router, same tokens", title_justify="left", highlight=False)
        for col in ("#", "router", "flips", "order only", "mass moved", "p99", "fp64 persists", "routers differ",
                    "margin ulps", "verdict"):
            t.add_column(col, justify="left" if col in ("router", "verdict") else "right", overflow="fold")
        for r in (r for r in rows if group(r) == value):
            t.add_row(str(r["layer"]), safe_text(r["module"]), f"{r['flips']} ({pct(r['flip_share'])})",
                      pct(r["order_only_rate"]), sci(r["weight_l1_mean"]), sci(r["weight_l1_p99"]),
                      str(r["flips_persisting_fp64"]), str(r["flips_router_differs"]), ulps(r["median_flip_margin_ulps"]),
                      r["verdict"])
        stdout.print(t)
    if rows:
        note(NOTE)
