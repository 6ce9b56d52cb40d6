"""compare tensors and compare model --layers: tables on stdout, JSON, progress
on stderr. Uses report.py's consoles and number formats."""

from __future__ import annotations

import math
import os
import re
from contextlib import contextmanager

from rich.markup import escape
from rich.table import Table
from rich.text import Text

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


# --- the compact table (the default; --wide for every column) ---------------------------------

# A longer name is broken after its dots and underscores onto more lines of its cell: 16 characters let
# the compact table fit 80 columns, 28 keep most names whole on one line from 100 on.
NAME_LINE, NAME_LINE_WIDE, WIDE_FROM = 16, 28, 100


def drop_prefix(names: list[str]) -> tuple[str, list[str]]:
    """(prefix, names without it): the names' common prefix up to a '.', '/'
    or '_' (never a whole name, never part of a word)."""
    if len(names) < 2:
        return "", list(names)
    common = os.path.commonprefix(names)
    cut = max(common.rfind(c) for c in "./_") + 1
    if any(len(n) <= cut for n in names):
        cut = 0
    return names[0][:cut], [n[cut:] for n in names]


_BREAK = re.compile(r"(?<=[./])")
_BREAK_WORD = re.compile(r"(?<=_)")


def name_cell(name: str, line: int = NAME_LINE) -> str:
    """A name, escaped, broken after '.' or '/' (after '_' only inside a piece
    longer than a line) onto lines of at most `line` characters where it is
    longer; the lines joined again are the name."""
    if len(name) <= line:
        return safe_text(name)
    pieces = [q for p in _BREAK.split(name) for q in (_BREAK_WORD.split(p) if len(p) > line else [p])]
    lines, cur = [], ""
    for piece in pieces:
        if cur and len(cur) + len(piece) > line:
            lines.append(cur)
            cur = ""
        cur += piece
    lines.append(cur)
    return "\n".join(safe_text(x) for x in lines)


def scale_cell(r, sep: str = " ") -> str:
    """The scale fit YOURS = s x REF_LOW with its z, where one was made."""
    s, z = r.get("scale_fit"), r.get("bias_z")
    if s is None or z is None or (s == 1.0 and z == 0.0):
        return "-"
    return f"{s:.4f}{sep}z={z:.0f}" if math.isfinite(z) else f"{s:.4f}{sep}z=inf"


def rule_cell(r) -> str:
    """The rule that fired with its number (numerics.divergence's text), red; '' where none."""
    if not r.get("flagged"):
        return ""
    return f"[red]{safe_text(r.get('reason') or r['status'])}[/red]"


def compact(title: str, rows: list[dict], name_key: str, numbers) -> tuple[Table, str]:
    """The compact table: name (common prefix dropped), status, the numbers'
    columns (numbers: (header, row -> text) pairs), scale and rule; returns
    it and the dropped prefix. Under WIDE_FROM columns the status is said in
    the rule column (a flagged row's rule, else its status): 80 columns fit."""
    prefix, names = drop_prefix([r[name_key] for r in rows])
    t = Table(title=title, title_justify="left", highlight=False)
    roomy = (stdout.width or 0) >= WIDE_FROM
    line = NAME_LINE_WIDE if roomy else NAME_LINE
    cells = [name_cell(n, line) for n in names]
    t.add_column(name_key)
    if roomy:
        t.add_column("status")
    for head, _ in numbers:
        t.add_column(head, justify="right")
    t.add_column("scale", justify="right")
    t.add_column("rule" if roomy else "status / rule")
    for r, n in zip(rows, cells, strict=True):
        status = r["status"] if r.get("compared", True) else ("missing" if r["status"].startswith("only") else "shape")
        status = f"[red]{safe_text(status)}[/red]" if r["flagged"] else f"[green]{safe_text(status)}[/green]"
        rule = rule_cell(r)
        t.add_row(n, *([status] if roomy else []), *((f(r) if r.get("compared", True) else "") for _, f in numbers),
                  scale_cell(r, " " if roomy else "\n"), rule if roomy or rule else status)
    # Every column but the rule as wide as its longest line, the rule the rest: Rich, left to itself,
    # shrinks a tight table's columns below their longest word and cuts them.
    for col in t.columns:
        lines = [x for c in (col.header, *col.cells) for x in Text.from_markup(str(c)).plain.split("\n")]
        if col is t.columns[-1]:
            col.min_width = max((len(w) for x in lines for w in x.split()), default=1)
        else:
            col.width = max(map(len, lines), default=1)
    return t, prefix


def _compact_tensors(res) -> None:
    p = res.params
    three = p["mode"] == "three-way"
    files = ", ".join(f"{lab}={safe_text(f)}" for lab, f in zip(p["labels"], p["files"], strict=True))
    numbers = [("(2)", lambda r: sci(r["yardstick"])), ("(3)", lambda r: sci(r["rel_l2"])),
               ("ratio", lambda r: times(r["ratio"]))] if three else \
        [("rel L2", lambda r: sci(r["rel_l2"])), ("max abs", lambda r: sci(r["max_abs_error"])),
         ("outside", lambda r: f"{r['n_outside']}/{r['n']}")]
    t, prefix = compact(f"compare tensors ({p['mode']}): {files}", res.rows, "name", numbers)
    stdout.print(t)
    if prefix:
        stdout.print(f"names without their common prefix {safe_text(prefix)!s}", style="dim", highlight=False)
    stdout.print(("(2) REF_LOW vs REF_FP32: what the low precision costs there; (3) YOURS vs REF_LOW (rel L2). "
                  if three else "rel L2 against the higher-precision side; outside: elements outside tolerance. ")
                 + "rule: the rule that flagged the tensor, with its number (numerics.divergence); "
                 "--wide for every column, --json for every field.", style="dim", highlight=False)


def table(res, wide: bool = False) -> None:
    if not wide:
        _compact_tensors(res)
        _footer(res)
        return
    p = res.params
    three = p["mode"] == "three-way"
    files = ", ".join(f"{lab}={safe_text(f)}" for lab, f in zip(p["labels"], p["files"], strict=True))
    t = Table(title=f"compare tensors ({p['mode']}): {files}", title_justify="left", highlight=False)
    t.add_column("name", overflow="fold")
    kinds = {_dtypes(r) for r in res.rows}
    one_dtype = kinds.pop() if len(kinds) == 1 else None   # then said once, below the table
    for col in ("status", "shape") + (() if one_dtype else ("dtype",)):
        t.add_column(col, overflow="fold")
    cols = (("(2) low-fp32", "(3) yours-low", "ratio") if three else ("rel L2",)) + \
        ("max abs", "cosine", "p50 / p99 abs", "max ulps", "worst: " + ("yours, low" if three else "A, B")) + \
        (() if three else ("outside tol",)) + (("scale",) if three else ()) + ("rule",)
    for col in cols:  # everything folds: on a narrow terminal every number stays visible
        t.add_column(col, justify="right", overflow="fold")
    tols = {}
    for r in res.rows:
        head = [safe_text(r["name"]), _status(r), _shape(r)] + ([] if one_dtype else [_dtypes(r)])
        if "rel_l2" not in r:
            t.add_row(*head, *([""] * (len(cols) - 1)), rule_cell(r))
            continue
        tols[r["tolerance_format"] or "exact"] = (r["rtol"], r["atol"])
        errs = [sci(r["yardstick"]), sci(r["rel_l2"]), times(r["ratio"])] if three else \
            [sci(r["rel_l2"]) + (" (ref=0)" if r["reference_all_zero"] and r["rel_l2"] else "")]
        t.add_row(*head, *errs, sci(r["max_abs_error"]), _cos(r), f"{sci(r['p50_abs_error'])} / {sci(r['p99_abs_error'])}",
                  ulps(r.get("max_ulps_off_zero")), escape(_worst(r)),
                  *(() if three else (f"{r['n_outside']}/{r['n']}",)), *((scale_cell(r),) if three else ()),
                  rule_cell(r))
    stdout.print(t)
    if three:
        stdout.print(f"flagged (rule) when (3) YOURS vs REF_LOW exceeds {p['ratio_threshold']:g}x (2) REF_LOW vs "
                     "REF_FP32, what the low precision itself costs at that tensor; when YOURS = s x REF_LOW with s "
                     "far from 1 for rounding (scale, z); at the first tensor to differ after bit-identical ones or "
                     "the first 10x jump in (3) (when (3) >= (2) there); and on an overflow (numerics.divergence). "
                     "Elementwise tolerances are in the JSON, shown, not judged.", style="dim", highlight=False)
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
                 "reference value, over the elements where |reference| > atol (near 0 the spacing is the smallest "
                 "subnormal and ulps mean nothing; '-' where every element is near 0); 1 ulp is one step of that "
                 "format there, so about 0.5 is a single rounding.", style="dim", highlight=False)
    _footer(res)


def _footer(res) -> None:
    p = res.params
    if p["mapped_side"]:
        stdout.print(f"--map renamed {p['mapped_side']}'s tensors.", style="dim", highlight=False)
    for line in layout_lines(res.rows):
        stdout.print(safe_text(line), style="dim", highlight=False)
    first = res.flags["first_divergence"]
    stdout.print("first divergence: " + (f"{safe_text(first)} ({safe_text(res.flags['first_divergence_reason'])})"
                                        if first else "none") + f", among {res.flags['compared']} compared",
                 highlight=False)
    for line in res.takeaways:
        stdout.print(f"• {safe_text(line)}", highlight=False)


def as_json(res) -> None:
    f = res.flags
    emit_json("compare tensors", {"params": res.params, "first_divergence": f["first_divergence"],
                                  "first_divergence_rule": f["first_divergence_rule"],
                                  "first_divergence_reason": f["first_divergence_reason"], "compared": f["compared"],
                                  "missing": f["missing"], "suggested_maps": f["suggested_maps"],
                                  "suggested_transposes": f["suggested_transposes"], "rows": res.rows, "takeaways": res.takeaways})
