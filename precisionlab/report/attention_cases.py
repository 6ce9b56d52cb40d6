"""attention-cases' table, JSON and plot."""

from __future__ import annotations

import math

from rich.table import Table

from precisionlab.report.console import stdout, safe_text, sci, footer, num
from precisionlab.report.jsondoc import emit_rows
from precisionlab.report.plots import figure

STATUS_STYLE = {"fail": "red", "pass": "green"}


def _value(x) -> str:
    return "-" if x is None else num(x, 6)


def table(res) -> None:
    p = res.params
    t = Table(title=f"attention edge cases: {safe_text(', '.join(p['variants']))}", title_justify="left")
    several = len(p["variants"]) > 1  # one kernel: named in the title only
    for col in ("variant", "case", "dtype", "status", "worst call", "expected", "observed", "max abs err")[
            0 if several else 1:]:
        t.add_column(col, overflow="fold", justify="right" if col in ("expected", "observed", "max abs err")
                     else "left")
    unsupported: dict = {}
    for r in res.rows:
        if r["status"] == "not supported":  # one line a variant below the table, not a row a case and format
            unsupported.setdefault(r["variant"], {}).setdefault(r["note"], []).append(r["case"])
            continue
        style = STATUS_STYLE.get(r["status"])
        status = f"[{style}]{r['status']}[/{style}]" if style else r["status"]
        call = r["worst_call"] if r["status"] == "fail" or r["note"] is None else r["note"]
        cells = [r["case"], r["dtype"], status, safe_text(call or "-"), _value(r["expected"]), _value(r["observed"]),
                 sci(r["max_abs_error"])]
        t.add_row(*([safe_text(r["variant"])] if several else []), *cells)
    stdout.print(t)
    for variant, why in unsupported.items():
        parts = "; ".join(f"{', '.join(dict.fromkeys(names))} ({reason})" for reason, names in why.items())
        stdout.print(safe_text(f"not supported by {variant}: {parts}"), highlight=False)
    f = Table(title=f"what each format does (computed; bound {p['bound']:g})", title_justify="left")
    for col in ("dtype", "denominator held in it: off from", "phase table: cos off from position",
                "zero-init sink visible"):
        f.add_column(col, justify="right")
    for r in res.flags["facts"]:
        top = p["rope_top"]
        pos = [_count(r["rope_first_position"], top), _count(r["rope_first_position_slow"], top)]
        f.add_row(r["dtype"], _count(r["denominator_first_keys"], p["max_keys"], " keys"), " / ".join(pos),
                  "yes" if r["zero_sink_visible"] else "no")
    stdout.print(f)
    note = ("A case passes when every output is within atol + rtol max |expected| of its exact value (torch.testing's "
            "rtol, atol for the format; sink_zero_init: a quarter of the sink's effect). not supported: the kernel "
            "lacks a keyword the case needs (reported, never failed); invisible: the format cannot show the effect. "
            f"Denominator: held between tiles of 128 keys, up to {p['max_keys']:,} keys; phase table: theta 1 / "
            "theta 10000^(-1/64).")
    footer(None, res.takeaways, note)


def _count(x, top: int, unit: str = "") -> str:
    """A first failing length or position, or '> top' where none up to top failed."""
    return f"> {top:,}{unit}" if x is None else f"{x:,}{unit}"


def as_json(res) -> None:
    emit_rows("attention-cases", res, sweep=res.flags["sweep"], facts=res.flags["facts"])


def plot(res, path: str) -> None:
    with figure(path, "attention: the softmax denominator against the row length", "keys in the row",
                "relative error of the output (V's mean, exactly 1/2)") as ax:
        series: dict = {}
        for pt in res.flags["sweep"]:
            series.setdefault((pt["variant"], pt["dtype"]), []).append(pt)
        for (variant, dtype), pts in series.items():
            ys = [min(max(pt["rel_error"], 1e-9), 1e3) if not math.isnan(pt["rel_error"]) else 1e3 for pt in pts]
            ax.plot([pt["keys"] for pt in pts], ys, marker="o", label=f"{variant} {dtype}")
        ax.axhline(res.params["bound"], color="grey", linestyle="--", label=f"bound {res.params['bound']:g}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
