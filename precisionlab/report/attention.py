"""attention's table, JSON and plot."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import stdout, sci, footer, safe_text
from precisionlab.report.jsondoc import emit_rows
from precisionlab.report.plots import figure

KNOBS = ("block_c", "max_offset", "rescale_threshold", "p_dtype", "p_scale", "input_dtype", "splits",
         "pv_accumulator", "promote_tiles", "causal", "arithmetic")


def table(res) -> None:
    p = res.params
    t = Table(title=f"flash attention emulated: {p['rows']} query rows x {p['seq']} keys, d = {p['dim']}, one head",
              title_justify="left")
    for col in ("logit std", "rel L2 vs fp64", "rel L2 vs bf16 path", "bf16 path vs fp64", "min mass kept",
                "P saturated", "P flushed", "jump at key"):
        t.add_column(col, justify="right")
    for r in res.rows:
        t.add_row(f"{r['std']:g}", sci(r["rel_l2"]), sci(r["rel_l2_vs_bf16"]), sci(r["bf16_rel_l2"]),
                  f"{r['min_mass_kept']:.4f}", f"{r['p_saturated']} / {r['p_entries']}", str(r["p_flushed"]),
                  "-" if r["jump_position"] is None else str(r["jump_position"]))
    stdout.print(t)
    stdout.print(safe_text("knobs: " + ", ".join(f"{k}={p[k]}" for k in KNOBS)), style="dim", highlight=False)
    stdout.print("bf16 path: the same tiling, splits and inputs, P in bf16 without offset or scale, eager rescale, "
                 "fp32 accumulation. mass kept: the stored P's share of the row's exact sum. jump: the first tile "
                 "boundary where the running error grows more than 10x.", style="dim", highlight=False)
    footer(None, res.takeaways)


def as_json(res) -> None:
    emit_rows("attention", res)


def plot(res, path: str) -> None:
    with figure(path, "flash attention: running error against position", "key position",
                "rel L2 vs float64 (keys seen so far)") as ax:
        for r in res.rows:
            ax.plot(r["tile_ends"], [max(e, 1e-12) for e in r["running_rel_l2"]], label=f"logit std {r['std']:g}")
        ax.set_yscale("log")
