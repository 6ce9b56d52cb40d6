"""router's tables, JSON and plot."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import stdout, num, sci, ulps, footer, safe_text, pct as _pct
from precisionlab.report.jsondoc import emit_rows


def table(res) -> None:
    if res.cases:
        _cases(res)
        return
    p = res.params
    t = Table(title=f"router top-{p['top_k']} of {p['experts']} ({p['scoring']}, groups {p['n_group']}:"
                    f"{p['topk_group']}, {p['source']}) vs the fp64 path", title_justify="left")
    for col in ("path", "layer"):
        t.add_column(col, overflow="fold")
    for col in ("flips", "mass moved mean", "p99", "margin (ulps)", "verdict"):
        t.add_column(col, justify="right", overflow="fold")
    for r in (r for r in res.rows if r["layer"] != "all"):
        t.add_row(safe_text(r["path"]), str(r["layer"]), _pct(r["flip_share"]), sci(r["weight_l1_mean"]),
                  sci(r["weight_l1_p99"]), ulps(r["median_flip_margin_ulps"]), r["verdict"])
    stdout.print(t)
    s = Table(title="any layer flipped, per token", title_justify="left")
    for col in ("path", "mean per layer", "any layer", "independence predicts"):
        s.add_column(col, justify="right" if col != "path" else "left", overflow="fold")
    for r in (r for r in res.rows if r["layer"] == "all"):
        s.add_row(safe_text(r["path"]), _pct(r["flip_share"]), _pct(r["any_layer_flip_share"]),
                  _pct(r["independence_prediction"]))
    stdout.print(s)
    _buckets(res)
    footer(None, res.takeaways, note="flips: tokens whose top-k set differs from the fp64 path; mass moved: "
           "sum |w - w_fp64| over experts; margin: the fp64 path's k-th minus (k+1)-th logit (choice score "
           "where a bias or groups decide) in ulps of the path's narrowest format there (median over the flips).")


def _buckets(res) -> None:
    b = Table(title=f"flips by top-k margin of the {res.params['margin_scale']} (ulps of the path's narrowest "
                    "format)", title_justify="left")
    b.add_column("path", overflow="fold")
    for col in ("margin", "tokens", "flips", "flip share"):
        b.add_column(col, justify="right")
    for r in res.buckets:
        if r["tokens"]:
            b.add_row(safe_text(r["path"]), f"[{num(r['margin_lo_ulps'], 4)}, {num(r['margin_hi_ulps'], 4)})",
                      str(r["tokens"]), str(r["flips"]), _pct(r["flip_share"]))
    stdout.print(b)


def _cases(res) -> None:
    t = Table(title=f"your router {safe_text(res.params['impl'])} vs the emulated fp64 router", title_justify="left")
    for col in ("case", "tokens", "flips", "weights max abs", "verdict", "first difference"):
        t.add_column(col, overflow="fold", justify="left" if col in ("case", "verdict", "first difference")
                     else "right")
    for r in res.cases:
        t.add_row(r["case"], str(r["tokens"]), str(r["flips"]), sci(r["weights_max_abs_error"]), r["verdict"],
                  safe_text(r["first_difference"] or "-"))
    stdout.print(t)
    footer(None, res.takeaways, note="flips: tokens whose expert set differs from the reference's; verdict: "
           "your kernel re-run on the same case in fp64 either keeps the difference (algorithmic) or loses it "
           "(rounding).")


def as_json(res) -> None:
    emit_rows("router", res, buckets=res.buckets, cases=res.cases)


def plot(res, path: str) -> None:
    from precisionlab.report.plots import figure

    with figure(path, "router flips by top-k margin", "margin bucket (ulps, lower edge)", "flip share") as ax:
        for label in dict.fromkeys(r["path"] for r in res.buckets):
            pts = [(r["margin_lo_ulps"], r["flip_share"]) for r in res.buckets
                   if r["path"] == label and r["flip_share"] is not None]
            if pts:
                ax.plot(range(len(pts)), [y for _, y in pts], marker="o", label=label)
                ax.set_xticks(range(len(pts)), [num(x, 4) for x, _ in pts])
