"""bench's table and JSON."""

from __future__ import annotations

from rich.table import Table
from rich.markup import escape

from precisionlab.report.console import stdout, safe_text
from precisionlab.report.jsondoc import emit_json

def table(res) -> None:
    t = Table(title="bench" + (" (quick)" if res.params["quick"] else ""), title_justify="left")
    for col in ("section", "device", "variant", "dtype", "accum", "size"):
        t.add_column(col, overflow="fold")
    for col in ("time (ms)", "GB/s", "TFLOP/s", "vs baseline", "% of copy"):
        t.add_column(col, justify="right")
    for r in res.rows:
        vs = "-" if r["vs_baseline"] is None else f"{r['vs_baseline']:.3f}x {r['baseline']}"
        pct = r.get("pct_of_copy")
        size = "x".join(map(str, r["shape"])) if r.get("shape") else str(r["n"])
        t.add_row(r["section"], r["device"], _bench_kernel(r), r["dtype"], r["accumulator"] or "-", size,
                  _bench_time(r), f"{r['gbps']:.1f}", f"{r['tflops']:.1f}" if r.get("tflops") else "-", vs,
                  "-" if pct is None else f"{pct:.1f}")
    stdout.print(t)
    stdout.print("vs baseline: baseline time / kernel time (above 1 is faster). GPU: CUDA events, median (p10-p90) of "
                 "at least 20 batched samples over rotating input and output buffers; the launch actually run in "
                 "brackets (v: version, vpt: vectors a thread, t: threads, rpb: rows a block, cl: cluster). "
                 "GB/s: bytes read (sums), read + written (softmax, copy).", style="dim", highlight=False)
    for note in res.notes:
        stdout.print(safe_text(note), style="dim", highlight=False)
    from precisionlab.report.bench_cpu import per_element_table

    per_element_table(res, stdout)


def _bench_time(r) -> str:
    if r.get("p10_s") is None:
        return f"{r['time_s'] * 1e3:.3f}"
    return f"{r['time_s'] * 1e3:.3f} ({r['p10_s'] * 1e3:.3f}-{r['p90_s'] * 1e3:.3f})"


def _bench_kernel(r) -> str:
    """The row's variant as shown: with the launch a GPU softmax got, the split
    count of a split-K matmul, or torch's matmul mode."""
    if r.get("mode"):
        return escape(f"{r['variant']} {r['mode']}")
    if r.get("splits") is not None:
        return escape(f"{r['variant']} (splits {r['splits']})")
    if r.get("plan_kernel") is None:
        return escape(r["variant"])
    ran = r["plan_variant"] if r["plan_variant"] != r["variant"] else ""
    return escape(f"{r['variant']} [{ran + ' ' if ran else ''}v{r['plan_kernel']} vpt {r['plan_vpt']} "
                  f"t {r['plan_threads']} rpb {r['plan_rows_per_block']} cl {r['plan_cluster']}]")


def as_json(res) -> None:
    emit_json("bench", {"params": res.params, "rows": res.rows, "notes": res.notes})
