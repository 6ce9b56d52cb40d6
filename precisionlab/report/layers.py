"""compare layers' tables and JSON: each module's error beside what
rounding alone costs there, and the first divergence."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import footer, hint, safe_text, sci, stdout, times
from precisionlab.report.jsondoc import emit_json
from precisionlab.report.layers_routing import section
from precisionlab.report.tensors import compact, rule_cell, scale_cell


def _compact(res, inj: str) -> None:
    p, info = res.params, res.model_info
    numbers = [("(2)", lambda r: sci(r["yardstick"])), ("(3)", lambda r: sci(r["yours_vs_trusted"])),
               ("ratio", lambda r: times(r["ratio"]))]
    for dtype in p["dtypes"]:
        t, prefix = compact(f"compare layers: {safe_text(info['name'])}, {dtype} vs fp32 on {p['tokens']} "
                            f"teacher-forced tokens{inj}", [r for r in res.rows if r["dtype"] == dtype], "module",
                            numbers)
        stdout.print(t)
        if prefix:
            stdout.print(f"modules without their common prefix {safe_text(prefix)}", style="dim", highlight=False)
    stdout.print("(2): the module clean in the low dtype on fp32's input rounded to it, vs fp32's output: what "
                 "rounding alone costs there. (3): the module as the low run has it vs clean, same input. scale: "
                 "the fit (3)'s module = s x clean with its z. rule: the rule that flagged the module, with its "
                 "number (numerics.divergence); --wide for every column, --json for every field.", style="dim",
                 highlight=False)


def table(res, wide: bool = False) -> None:
    p, info = res.params, res.model_info
    inj = f", injected {safe_text('; '.join(p['inject']))}" if p["inject"] else ""
    if not wide:
        _compact(res, inj)
        _footer(res)
        return
    for dtype in p["dtypes"]:
        t = Table(title=f"compare layers: {safe_text(info['name'])}, {dtype} vs fp32 on {p['tokens']} "
                        f"teacher-forced tokens{inj}", title_justify="left", highlight=False)
        for col in ("#", "module", "kind", "shape"):
            t.add_column(col, overflow="fold", justify="right" if col == "#" else "left")
        for col in ("accumulated", "local", "(2) yardstick", "(3) yours vs clean", "ratio"):
            t.add_column(col, justify="right")
        t.add_column("scale", justify="right")
        t.add_column("verdict", overflow="fold")
        t.add_column("rule")
        first = res.first_divergence_by_dtype.get(dtype)
        for r in (r for r in res.rows if r["dtype"] == dtype):
            if r["flagged"]:
                verdict = "[bold red]first divergence[/bold red]" if r["module"] == first else "[red]flagged[/red]"
            else:
                verdict = "rounding"
            t.add_row(str(r["order"]), safe_text(r["module"]), r["kind"], "x".join(map(str, r["shape"])),
                      sci(r["accumulated"]), sci(r["local"]), sci(r["yardstick"]), sci(r["yours_vs_trusted"]),
                      times(r["ratio"]), scale_cell(r), verdict, rule_cell(r))
        stdout.print(t)
    stdout.print(f"accumulated: the {'/'.join(p['dtypes'])} run's output vs fp32's (rel L2). local: the module as the "
                 "low run has it, on fp32's input rounded to the low dtype, vs fp32's output. (2): the same module "
                 "clean in the same dtype (RoPE: fp32's phases rounded once): what rounding alone costs there. "
                 f"Flagged (rule) when (3) > {p['ratio_threshold']:g}x (2), when yours = s x clean with s far "
                 "from 1 for rounding (scale, z), at the first module to differ or the first 10x jump in (3) (where "
                 "(3) >= (2)), and where the low run overflows (numerics.divergence).", style="dim", highlight=False)
    _footer(res)


def _footer(res) -> None:
    section(res.routing, lambda r: f"{r['dtype']} vs fp32")
    stdout.print(f"load {res.timing['load_s']:.2f} s, run {res.timing['run_s']:.2f} s (after the torch import)",
                 style="dim", highlight=False)
    for path in res.dumped:
        hint(f"dump written to {path}")
    first = res.first_divergence
    reason = next((d["text"] for d in res.divergence_by_dtype.values() if d and d["name"] == first), None)
    stdout.print(f"first divergence: {safe_text(first) if first else 'none'}"
                 + (f" ({safe_text(reason)})" if reason else ""), highlight=False)
    footer(None, res.takeaways)


def as_json(res) -> None:
    emit_json("compare layers", {
        "params": res.params, "model": res.model_info, "first_divergence": res.first_divergence,
        "first_divergence_by_dtype": res.first_divergence_by_dtype, "divergence_by_dtype": res.divergence_by_dtype,
        "pitfalls": res.pitfalls,
        "dumped": res.dumped, "timing": res.timing, "rows": res.rows, "routing": res.routing,
        "takeaways": res.takeaways})


def plot(res, path: str) -> None:
    """Per-module error along the model, each low dtype: accumulated, local and the yardstick (2)."""
    from precisionlab.report import plots

    series, xs, names = [], [], []
    for dtype in res.params["dtypes"]:
        rows = [r for r in res.rows if r["dtype"] == dtype]
        xs, names = [r["order"] for r in rows], [r["module"] for r in rows]
        series += [(f"{dtype} accumulated", [r["accumulated"] for r in rows], "-"),
                   (f"{dtype} local", [r["local"] for r in rows], "--"),
                   (f"{dtype} (2) rounding", [r["yardstick"] for r in rows], ":")]
    first = next((r["order"] for r in res.rows if r["module"] == res.first_divergence), None)
    plots.along_model(path, "compare layers: per-module rel-L2 against fp32", xs, series, names, first)
