"""The `tp` section of `nondeterminism`: two tables (what changed with the world
size; the order gloo summed in) and the section's takeaway. Uses report.py's
console and number formats."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from precisionlab.report.console import num, sci, stdout


def _yes(flag) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


def _pct(share) -> str:
    return "-" if share is None else f"{100 * share:.2f}%"


def _layout(r: dict, prefix: str) -> str:
    if r[f"{prefix}segments"] is None:
        return "-"
    return f"{r[f'{prefix}segments']}x{r[f'{prefix}segment_bytes']}B->{r[f'{prefix}chunk_elements']}"


def tp_table(rows: list[dict], takeaway: str | None) -> None:
    done = [r for r in rows if not r["refused"]]
    if done:
        r0 = done[0]
        t = Table(title=f"tensor parallel: row-parallel linear {r0['shape']} (MxKxN), W split along K, "
                        "summed by torch.distributed all_reduce (gloo, real processes)", title_justify="left")
        for col in ("dtype", "P", "differs from P=1", "max err vs fp64", "mean err vs fp64", "mean err / P=1",
                    "same bits run to run", "ranks agree", "same bits in larger buffer"):
            t.add_column(col, justify="left" if col == "dtype" else "right")
        for r in done:
            t.add_row(r["dtype"], str(r["world_size"]), _pct(r["differs_from_ws1"]), sci(r["max_abs_error"]),
                      sci(r["mean_abs_error"]), num(r["error_ratio_to_ws1"], 3),
                      f"{_yes(r['repeat_identical'])} ({r['distinct']} of {r['runs']})", _yes(r["all_ranks_agree"]),
                      "yes" if r["big_same_bits"] else f"no ({_pct(r['big_differs'])} differ)")
        stdout.print(t)
        o = Table(title="the order: gloo's result = the library's ring replay (pl_allreduce_cpu)? for "
                        f"{r0['elements']} elements alone / inside a buffer of {r0['big_elements']}; chunking: "
                        "segments x bytes -> elements a rank finishes; ulps at the output's scale",
                  title_justify="left")
        for col in ("dtype", "P", "algorithm", "= replay", "chunking", "larger buffer", "tree differs",
                    "ring-tree ulps", "tree mean err"):
            o.add_column(col, justify="left" if col in ("dtype", "algorithm") else "right")
        for r in done:
            o.add_row(r["dtype"], str(r["world_size"]), escape(r["algorithm"]),
                      f"{_yes(r['replay_matches'])}/{_yes(r['big_replay_matches'])}", _layout(r, ""),
                      _layout(r, "big_"), _pct(r["tree_differs_from_ring"]), num(r["ring_tree_max_ulps"], 3),
                      sci(r["tree_mean_abs_error"]))
        stdout.print(o)
    for r in rows:
        if r["refused"]:
            stdout.print(escape(f"{r['label']} on {r['device']}: absent: {r['refused']}"), style="dim",
                         highlight=False)
    if takeaway:
        stdout.print(f"• {escape(takeaway)}", highlight=False)
