"""bench: the CPU accumulate kernels per element, beside numpy.sum (issue 19's targets)."""

from __future__ import annotations

from rich.table import Table

# Targets on the 2-core development machine, ns per element per run.
TARGET_NS = {"sequential": 2.0, "reverse": 2.0, "sorted": 2.0, "sorted_desc": 2.0, "pairwise": 4.0, "kahan": 4.0,
             "neumaier": 4.0, "stochastic": 6.0}


def per_element_table(res, console) -> None:
    rows = [r for r in res.rows if r.get("ns_per_element") is not None]
    if not rows:
        return
    t = Table(title="CPU accumulate, per element (least of 3 runs, thread CPU time)", title_justify="left")
    for col in ("variant", "dtype", "accum", "n"):
        t.add_column(col)
    for col in ("ns/element", "x numpy.sum", "target ns"):
        t.add_column(col, justify="right")
    for r in rows:
        ratio = "-" if r.get("x_numpy_sum") is None else f"{r['x_numpy_sum']:.2f}"
        target = TARGET_NS.get(r["variant"])
        t.add_row(r["variant"], r["dtype"], r["accumulator"] or "-", str(r["n"]), f"{r['ns_per_element']:.3f}", ratio,
                  "-" if target is None else f"{target:g}")
    console.print(t)
    console.print("x numpy.sum: kernel time / numpy.sum time over the same values (float32 for numpy, the same values "
                  "as float64 for the kernels). Every kernel is exact to the bit in its accumulator format.",
                  style="dim", highlight=False)
