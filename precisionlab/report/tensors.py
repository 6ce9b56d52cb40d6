"""compare tensors and compare model --layers: tables on stdout, JSON, progress
on stderr. Uses report.py's consoles and number formats."""

from __future__ import annotations

from contextlib import contextmanager

from rich.markup import escape
from rich.table import Table

from precisionlab.report.console import num, safe_text, sci, stderr, stdout, times, ulps
from precisionlab.report.jsondoc import emit_json


@contextmanager
def bar(description: str, total: int, enabled: bool):
    """A progress bar with a known total on stderr (tensors compared); no-op
    under --json or when stderr is not a terminal."""
    if not enabled or not stderr.is_terminal:
        yield lambda k=1: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=stderr, transient=True) as p:
        task = p.add_task(description, total=total)
        yield lambda k=1: p.advance(task, k)


def _shape(r) -> str:
    shapes = [s for s in r["shapes"] if s is not None]
    if shapes and all(s == shapes[0] for s in shapes):
        return "x".join(map(str, shapes[0])) or "scalar"
    return " vs ".join("-" if s is None else "x".join(map(str, s)) or "scalar" for s in r["shapes"])


def _dtypes(r) -> str:
    from precisionlab.io.tensorfiles import DTYPE_TO_FORMAT

    ds = [DTYPE_TO_FORMAT.get(d, d) if d else "-" for d in r["dtypes"]]
    return ds[0] if len(set(ds)) == 1 else "/".join(ds)


def _worst(r) -> str:
    if r.get("worst_index") is None or (r["max_abs_error"] == 0 and not r.get("nonfinite_mismatch")):
        return "-"
    return f"[{','.join(map(str, r['worst_index']))}] {num(r['worst_a'], 6)}, {num(r['worst_b'], 6)}"


def _cos(r) -> str:
    return "undefined" if r.get("cosine") is None else f"{r['cosine']:.6f}"


def _status(r) -> str:
    text = safe_text(r["status"])
    return f"[red]{text}[/red]" if r["flagged"] else f"[green]{text}[/green]"


def layout_lines(rows) -> list[str]:
    """What was done to each tensor's layout before it was compared (io/tensor_layout),
    one line per change, naming the tensors it was done to."""
    by_note: dict[str, list[str]] = {}
    for r in rows:
        for note in r.get("layout") or []:
            by_note.setdefault(note, []).append(r["name"])
    out = []
    for note, names in by_note.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        out.append(f"layout: {note} ({shown})")
    return out


def table(res) -> None:
    p = res.params
    three = p["mode"] == "three-way"
    files = ", ".join(f"{lab}={safe_text(f)}" for lab, f in zip(p["labels"], p["files"]))
    t = Table(title=f"compare tensors ({p['mode']}): {files}", title_justify="left", highlight=False)
    t.add_column("name", overflow="fold")
    kinds = {_dtypes(r) for r in res.rows}
    one_dtype = kinds.pop() if len(kinds) == 1 else None   # then said once, below the table
    for col in ("status", "shape") + (() if one_dtype else ("dtype",)):
        t.add_column(col, overflow="fold")
    cols = (("(2) low-fp32", "(3) yours-low", "ratio") if three else ("rel L2",)) + \
        ("max abs", "cosine", "p50 / p99 abs", "max ulps", "worst: " + ("yours, low" if three else "A, B")) + \
        (() if three else ("outside tol",))
    for col in cols:  # everything folds: on a narrow terminal every number stays visible
        t.add_column(col, justify="right", overflow="fold")
    tols = {}
    for r in res.rows:
        head = [safe_text(r["name"]), _status(r), _shape(r)] + ([] if one_dtype else [_dtypes(r)])
        if "rel_l2" not in r:
            t.add_row(*head, *([""] * len(cols)))
            continue
        tols[r["tolerance_format"] or "exact"] = (r["rtol"], r["atol"])
        errs = [sci(r["yardstick"]), sci(r["rel_l2"]), times(r["ratio"])] if three else \
            [sci(r["rel_l2"]) + (" (ref=0)" if r["reference_all_zero"] and r["rel_l2"] else "")]
        t.add_row(*head, *errs, sci(r["max_abs_error"]), _cos(r), f"{sci(r['p50_abs_error'])} / {sci(r['p99_abs_error'])}",
                  ulps(r["max_ulps"]), escape(_worst(r)),
                  *(() if three else (f"{r['n_outside']}/{r['n']}",)))
    stdout.print(t)
    if three:
        stdout.print(f"flagged when (3) YOURS vs REF_LOW exceeds {p['ratio_threshold']:g}x (2) REF_LOW vs REF_FP32, "
                     "what the low precision itself costs at that tensor (compare op's rule); elementwise "
                     "tolerances are in the JSON, shown, not judged.", style="dim", highlight=False)
    else:
        stdout.print("a tensor passes when every |a-b| <= atol + rtol*max(|a|,|b|), tolerances from the "
                     "lower-precision side (torch.testing's defaults), so swapping A and B changes nothing; "
                     "identical infinities agree, NaN never does" + (" (--equal-nan: NaN agrees with NaN)"
                                                                    if p["equal_nan"] else "")
                     + ". rel L2 is against the higher-precision side (B on a tie); inf against an all-zero one.",
                     style="dim", highlight=False)
    if one_dtype:
        stdout.print(f"dtypes ({'/'.join(p['labels'])}): {one_dtype}", style="dim", highlight=False)
    if tols:
        stdout.print("tolerances used: " + ", ".join(f"{k} rtol {v[0]:g} atol {v[1]:g}" for k, v in tols.items()),
                     style="dim", highlight=False)
    stdout.print("max ulps: the largest |difference| in units of the lower-precision format's spacing at the "
                 "reference value; 1 ulp is one step of that format there, so about 0.5 is a single rounding (huge where the "
                 "reference is 0: the spacing there is the smallest subnormal).",
                 style="dim", highlight=False)
    if p["mapped_side"]:
        stdout.print(f"--map renamed {p['mapped_side']}'s tensors.", style="dim", highlight=False)
    for line in layout_lines(res.rows):
        stdout.print(safe_text(line), style="dim", highlight=False)
    for line in res.takeaways:
        stdout.print(f"• {safe_text(line)}", highlight=False)


def as_json(res) -> None:
    emit_json("compare tensors", {"params": res.params, "first_divergence": res.flags["first_divergence"],
                                  "rows": res.rows, "takeaways": res.takeaways})
