"""compare engine-layers' table, JSON and plot: per module the
two-way view (YOURS fp32 vs REF fp32) and the three-way view per low dtype,
the rule that fired with its number, and the first divergence."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import footer, hint, safe_text, sci, stdout, times
from precisionlab.report.jsondoc import emit_json
from precisionlab.report.layers_routing import section


def _rule_text(r: dict, view: str) -> str:
    v = r.get("views", {}).get(view, {})
    return f"{v['rule']}: {v['reason']}" if v.get("rule") else ""


def _heads_text(r: dict, views: list[str]) -> list[str]:
    """--heads: which heads depart, per view (experiments/layers_heads)."""
    out = []
    for view in views:
        v = r.get("views", {}).get(view, {})
        if v.get("heads_departing") and not str(v.get("reason") or "").startswith("heads "):  # not said twice
            n = len(r["per_head"][view])
            out.append(f"{view}: heads {','.join(map(str, v['heads_departing']))} of {n} depart")
    return out


def _scale(v: dict) -> str:
    return f"{v['scale_fit']:.5f} ({v['bias_z']:.3g})"


def table(res, wide: bool = False) -> None:
    """The compact table; wide: each view's scale fit (s, z) beside its ratio."""
    p = res.params
    q = p.get("quant_view")
    views = ["fp32", *p["dtypes"], *([q] if q else [])]
    t = Table(title=f"compare engine-layers: YOURS {safe_text(p['model'] or 'embedded')} vs REF "
                    f"{safe_text(p['reference'])} on {p['tokens']} teacher-forced tokens",
              title_justify="left", highlight=False)
    for col in ("#", "module"):
        t.add_column(col, overflow="fold", justify="right" if col == "#" else "left")
    t.add_column("fp32: YOURS vs REF", justify="right")
    t.add_column("fp32 rounding", justify="right")
    if wide:
        t.add_column("fp32 ratio", justify="right")
        t.add_column("fp32 scale (z)", justify="right")
    for d in p["dtypes"]:
        t.add_column(f"{d} (2) REF", justify="right")
        t.add_column(f"{d} (3) YOURS", justify="right")
        t.add_column("ratio", justify="right")
        if wide:
            t.add_column(f"{d} scale (z)", justify="right")
    if q:  # what the quantisation costs REF, and YOURS against REF quantised the same way
        t.add_column(f"{q} (2) REF", justify="right")
        t.add_column(f"{q} (3) YOURS", justify="right")
        t.add_column("ratio", justify="right")
    t.add_column("verdict", overflow="fold")
    for r in res.rows:
        v = r.get("views", {})
        if not v:
            t.add_row(str(r["order"]), safe_text(r["module"]), *["-"] * (len(t.columns) - 3),
                      f"shape {r.get('shape_yours')} vs {r['shape']}: not compared")
            continue
        cells = [sci(v["fp32"]["error"]), sci(v["fp32"]["yardstick"])]
        if wide:
            cells += [times(v["fp32"]["ratio"]), _scale(v["fp32"])]
        for d in p["dtypes"]:
            cells += [sci(v[d]["yardstick"]), sci(v[d]["error"]), times(v[d]["ratio"])]
            if wide:
                cells.append(_scale(v[d]))
        if q:
            cells += [sci(v[q]["yardstick"]), sci(v[q]["error"]), times(v[q]["ratio"])]
        rules = [f"{view}: {_rule_text(r, view)}" for view in views if _rule_text(r, view)] + _heads_text(r, views)
        first = any(res.first_divergence_by_view.get(view) == r["module"] for view in views)
        calm = f"as close as {q} allows" if q else "rounding"
        verdict = ("[bold red]first divergence[/bold red] " if first else "[red]flagged[/red] " if rules else
                   calm) + safe_text("; ".join(rules))
        t.add_row(str(r["order"]), safe_text(r["module"]), *cells, verdict)
    stdout.print(t)
    stdout.print("fp32: YOURS fp32 vs REF fp32 (rel L2), against REF fp32 vs REF fp64 (what fp32 rounding costs "
                 "there). (2): REF in the low dtype vs REF fp32; (3): YOURS low vs REF low; ratio (3)/(2), "
                 f"flagged beyond {p['ratio_threshold']:g}x. Rules (numerics/divergence): overflow, ratio, scale_fit "
                 "(YOURS = s x REF, z), first_differs (after bit-identical modules), first_jump (>10x the module "
                 "before)." + (f" {q}: (2) REF with its weights quantised as YOURS' GGUF holds them vs REF fp32 "
                               f"(what {q} costs there); (3) YOURS vs that; fp32's and the low dtypes' columns are "
                               f"what quantisation costs, not judged." if q else "")
                 + (" --heads: <attn>.probs (softmax probabilities) and <attn>.heads (the output projection's input, "
                    "per query head) are judged head by head against that head's own rounding; 'heads i,j of N "
                    "depart' names them." if p.get("heads") else ""),
                 style="dim", highlight=False)
    section(res.routing, lambda r: f"REF {r['dtype']} vs REF fp32 (what rounding alone moves)"
            if r["view"] == "yardstick" else f"YOURS vs REF in {r['view']}")
    for n in res.notes:
        stdout.print(safe_text(n), style="dim", highlight=False)
    stdout.print(f"load {res.timing['load_s']:.2f} s, run {res.timing['run_s']:.2f} s (after the torch import)",
                 style="dim", highlight=False)
    for view, m in res.first_divergence_by_view.items():
        stdout.print(f"first divergence ({view}): {safe_text(m) if m else 'none'}", highlight=False)
    stdout.print(f"first divergence: {safe_text(res.first_divergence) if res.first_divergence else 'none'} "
                 f"(of {p['compared']} modules compared)", highlight=False)
    footer(None, res.takeaways)


def as_json(res) -> None:
    emit_json("compare engine-layers", {
        "params": res.params, "model": res.model_info, "reference": res.reference_info,
        "first_divergence": res.first_divergence, "first_divergence_by_view": res.first_divergence_by_view,
        "flags": res.flags, "missing": res.missing, "notes": res.notes, "timing": res.timing, "rows": res.rows,
        "routing": res.routing, "takeaways": res.takeaways})


def plot(res, path: str) -> None:
    """Per-module error along the model: the two-way view against fp32 rounding, and each low dtype's (3) against
    its (2); the first divergence marked."""
    from precisionlab.report import plots

    rows = [r for r in res.rows if r.get("views")]
    xs = [r["order"] for r in rows]
    series = [("fp32: YOURS vs REF", [r["views"]["fp32"]["error"] for r in rows], "-"),
              ("fp32 rounding (REF fp32 vs fp64)", [r["views"]["fp32"]["yardstick"] for r in rows], ":")]
    for d in res.params["dtypes"]:
        series += [(f"{d} (3) YOURS vs REF", [r["views"][d]["error"] for r in rows], "-"),
                   (f"{d} (2) REF rounding", [r["views"][d]["yardstick"] for r in rows], ":")]
    first = next((r["order"] for r in rows if r["module"] == res.first_divergence), None)
    plots.along_model(path, "compare engine-layers: per-module rel-L2", xs, series,
                      [r["module"] for r in rows], first)
    hint("the plot's x axis is the execution order (#) of the table")
