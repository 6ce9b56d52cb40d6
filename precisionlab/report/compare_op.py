"""compare op's tables and JSON."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import stdout, safe_text, sci, footer, ulps
from precisionlab.report.jsondoc import emit_json

def table(res) -> None:
    p = res.params
    t = Table(title=f"compare op {p['op']} {'x'.join(map(str, p['shape']))}: {safe_text(p['impl'])} against torch",
              title_justify="left")
    for col in ("case", "device", "dtype", "comparison"):
        t.add_column(col, overflow="fold")
    for col in ("rel L2", "max abs", "max ulps", "outside tol", "non-finite"):
        t.add_column(col, justify="right")
    t.add_column("verdict", overflow="fold")
    for r in res.rows:
        # a verdict may quote the --impl's own exception text: control characters escaped too
        verdict = f"[red]{safe_text(r['verdict'])}[/red]" if r["flagged"] else safe_text(r["verdict"])
        nonfinite = f"{r['nonfinite_actual']}/{r['nonfinite_reference']}"
        if r.get("reference_nonfinite"):
            nonfinite = f"{r['reference_nonfinite']} matched" if not r.get("nonfinite_pattern_mismatch") else \
                f"{r['nonfinite_pattern_mismatch']} mismatched"
        t.add_row(r.get("case", "random"), r["device"], r["dtype"], f"({r['comparison']}) {r['label']}",
                  sci(r["rel_l2"]), sci(r["max_abs_error"]), ulps(r["max_ulps"]), f"{r['n_outside']}/{r['n']}", nonfinite,
                  verdict)
    stdout.print(t)
    acc = (f" or (5) > {p['ratio_threshold']:g}x (4), the cost of each --accumulator model "
           f"({safe_text(', '.join(p['accumulators']))})" if p.get("accumulators") else "")
    stdout.print(f"flagged when (1) > {p['ratio_threshold']:g}x (0) or (3) > {p['ratio_threshold']:g}x (2){acc}; 'outside tol' "
                 "uses the rtol/atol of each row (torch.testing's for fp32, fp16 and bf16; the format's spacing at 1 "
                 "and 1e-5 for fp8, fp6 and fp4) and is shown, not judged; non-finite reference values must be "
                 "matched (the same NaN or infinity) and the finite rest is measured. Trusted = torch "
                 f"with TF32 off: " + ", ".join(f"{k}={v}" for k, v in res.flags.items() if "tf32" in k.lower()),
                 style="dim", highlight=False)
    for name, what in (p.get("cases") or {}).items():
        stdout.print(safe_text(f"  {name}: {what}"), style="dim", highlight=False)
    _compare_op_contracts(res)
    _compare_op_advice(res)
    footer(p.get("cuda_unavailable"), res.takeaways)


def _compare_op_contracts(res) -> None:
    if not res.contracts:
        return
    t = Table(title="contracts: batch invariance (each row alone vs in batches of "
              + ", ".join(map(str, res.params["batch_sizes"])) + ") and determinism", title_justify="left")
    for col in ("device", "dtype", "contract", "verdict", "first batch that changes a row", "detail"):
        t.add_column(col, overflow="fold")
    for c in res.contracts:
        verdict = "[green]holds[/green]" if c["passed"] else "[red]broken[/red]"
        t.add_row(c["device"], c["dtype"], c["contract"], verdict,
                  "-" if c["first_batch_changed"] is None else str(c["first_batch_changed"]), safe_text(c["detail"]))
    stdout.print(t)


def _compare_op_advice(res) -> None:
    if not res.advice:
        return
    matmul = any("gamma_k" in a for a in res.advice)
    base = "file" if res.params.get("from") else "random"
    t = Table(title=f"tolerance advisor: the smallest tolerance under which (3) passes, on the {base} case",
              title_justify="left")
    for col in ("device", "dtype", "min atol (rtol 0)", "min rtol (atol 0)"):
        t.add_column(col, justify="right")
    if matmul:
        for col in ("K", "gamma_K", "max |err| vs exact", "max bound", "max err / bound"):
            t.add_column(col, justify="right")
    for a in res.advice:
        cells = [a["device"], a["dtype"], sci(a["min_atol"]), sci(a["min_rtol"])]
        if matmul:
            cells += [str(a["k"]), sci(a["gamma_k"]), sci(a["max_abs_error"]), sci(a["max_bound"]),
                      f"{a['max_error_over_bound']:.3g}"]
        t.add_row(*cells)
    stdout.print(t)
    if matmul:
        stdout.print("bound: Higham's gamma_K |A||B| (fp32 accumulation, u = 2^-24) plus the output's rounding, "
                     "elementwise, against the exact product of the stored inputs.", style="dim", highlight=False)


def as_json(res) -> None:
    emit_json("compare op", {"params": res.params, "flags": res.flags, "rows": res.rows, "contracts": res.contracts,
                             "advice": res.advice, "causes": res.causes, "takeaways": res.takeaways})
