"""tf32's tables, JSON and plot."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import note, stdout, num, sci, footer, safe_text
from precisionlab.report.jsondoc import emit_rows
from precisionlab.report.plots import figure

def _accumulator_table(res) -> None:
    rows = [r for r in res.rows if r["section"] == "accumulator"]
    ks = sorted({r["k"] for r in rows})
    keys = list(dict.fromkeys((r["dtype"], r["accumulator"]) for r in rows))
    for field, what in (("max_rel_error", "max |C - ref| / max |ref|"), ("rel_l2", "relative L2 error")):
        t = Table(title=f"accumulator models, {res.params['m']} x K x {res.params['n']}, standard normal inputs "
                        f"in the dtype: {what} against float64", title_justify="left")
        t.add_column("dtype")
        t.add_column("accumulator", overflow="fold")
        for k in ks:
            t.add_column(f"K={k}", justify="right")
        for dtype, acc in keys:
            by_k = {r["k"]: r[field] for r in rows if r["dtype"] == dtype and r["accumulator"] == acc}
            t.add_row(dtype, safe_text(acc), *(sci(by_k.get(k)) for k in ks))
        stdout.print(t)
    note("Emulated on the CPU, bit for bit as numerics/accumulators.py defines each model (hopper-fp8: "
         "MMA-Sim's Hopper fused dot-add: each group of products aligned to the largest exponent, the "
         "accumulator included, cut to 14 bits and the sum again to 14 unless the model names its own, "
         "toward zero unless it names rne or floor; promote:N: fp32 addition of N-element chunks).")
    footer(None, res.takeaways)


def table(res) -> None:
    if "accumulators" in res.params:
        _accumulator_table(res)
        return
    modes = [r for r in res.rows if r["section"] == "modes"]
    if modes:
        p = res.params
        t = Table(title=f"matmul {p['m']}x{p['k']} @ {p['k']}x{p['n']} against float64", title_justify="left")
        for col in ("device", "mode", "emulated"):
            t.add_column(col, overflow="fold")
        for col in ("rel L2", "max abs", "time (ms)", "TFLOP/s"):
            t.add_column(col, justify="right")
        for r in modes:
            t.add_row(r["device"], r["mode"], "yes" if r["emulated"] else "no", sci(r["rel_l2"]), sci(r["max_abs_error"]),
                      f"{r['time_s'] * 1e3:.2f}", f"{r['tflops']:.2f}")
        stdout.print(t)
    ints = [r for r in res.rows if r["section"] == "integer"]
    if ints:
        t = Table(title="integer exactness: A holds 2048, 2049, ...; B is a permutation, so C must be exact",
                  title_justify="left")
        for col in ("device", "mode", "wrong entries", "max abs"):
            t.add_column(col, justify="right" if col != "mode" else "left")
        for r in ints:
            t.add_row(r["device"], r["mode"], f"{r['wrong']} / {r['entries']}", num(r["max_abs_error"], 6))
        stdout.print(t)
    sweep = [r for r in res.rows if r["section"] == "k_sweep"]
    if sweep:
        t = Table(title=f"relative L2 error against K (m = n = {res.params['sweep_mn']})", title_justify="left")
        keys = list(dict.fromkeys((r["device"], r["mode"]) for r in sweep))
        ks = sorted({r["k"] for r in sweep})
        t.add_column("device")
        t.add_column("mode")
        for k in ks:
            t.add_column(f"K={k}", justify="right")
        for dev, mode in keys:
            by_k = {r["k"]: r["rel_l2"] for r in sweep if r["device"] == dev and r["mode"] == mode}
            t.add_row(dev, mode, *(sci(by_k.get(k)) for k in ks))
        stdout.print(t)
    stdout.print("CPU rows other than fp32 are emulation: inputs rounded to the mode's format (TF32: 10 mantissa "
                 "bits, nearest-even), fp32 matmul, bf16/fp16 outputs rounded. Flags were restored after the run.",
                 style="dim", highlight=False)
    stdout.print("flags before the run: " + ", ".join(f"{k}={v}" for k, v in res.flags_before.items()),
                 style="dim", highlight=False)
    footer(res.devices.get("cuda_unavailable"), res.takeaways)


def as_json(res) -> None:
    emit_rows("tf32", res, devices=res.devices, flags_before=res.flags_before)


def plot(res, path: str) -> None:
    if "accumulators" in res.params:
        rows = [r for r in res.rows if r["section"] == "accumulator"]
        with figure(path, "accumulator models: error against K", "K", "max |C - ref| / max |ref|") as ax:
            for dtype, acc in dict.fromkeys((r["dtype"], r["accumulator"]) for r in rows):
                s = sorted((r for r in rows if r["dtype"] == dtype and r["accumulator"] == acc), key=lambda r: r["k"])
                ax.plot([r["k"] for r in s], [max(r["max_rel_error"], 1e-12) for r in s], marker="o",
                        label=f"{dtype} {acc}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
        return
    sweep = [r for r in res.rows if r["section"] == "k_sweep"]
    with figure(path, "matmul error against K", "K", "relative L2 error vs float64") as ax:
        for dev, mode in dict.fromkeys((r["device"], r["mode"]) for r in sweep):
            s = sorted((r for r in sweep if r["device"] == dev and r["mode"] == mode), key=lambda r: r["k"])
            ax.plot([r["k"] for r in s], [r["rel_l2"] for r in s], marker="o",
                    label=f"{dev} {mode}" + (" (emulated)" if s[0]["emulated"] else ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
