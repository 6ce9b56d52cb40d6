"""The only place that prints: Rich tables on stdout, strict JSON on stdout,
progress and hints on stderr, and plots to files."""

from __future__ import annotations

import json
import math
import os
import platform
import re
import sys
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from precisionlab import __version__

# Control characters a string from outside must not carry to the terminal: C0
# (ESC, BEL, CR, ...), DEL, C1 (0x80-0x9f, which some terminals read as CSI/OSC)
# and the bidirectional overrides that reorder a line as it is shown.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(s) -> str:
    """str(s) with every control character shown as an escape (\\x1b, \\n,
    \\u202e): what a plain-text line (an error) may print of a string from outside."""
    return _CONTROL.sub(_escape_char, str(s))


def _escape_char(m) -> str:
    c = m.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or (
        f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def safe_text(s) -> str:
    """A string from a file, a model or the command line (tensor name, path,
    model name, prompt, decoded token) for a Rich table or line: control
    characters escaped and Rich markup escaped, so it shows exactly as written.
    A trailing backslash is shown as \\x5c: raw, it would escape whatever tag
    follows the string, and Rich's own escape doubles it where none follows."""
    text = printable(s)
    if text.endswith("\\"):
        text = text[:-1] + "\\x5c"
    return escape(text)


# Glyphs this module prints, and what they become where the output encoding
# cannot carry them (PYTHONIOENCODING=ascii, a C locale without UTF-8).
_ASCII = str.maketrans({"•": "*", "│": "|", "⏎": "~", "…": "...", "—": "-", "–": "-", "≥": ">=", "≤": "<=",
                        "×": "x", "±": "+/-", "→": "->", "≈": "~="})


class _Console(Console):
    """Rich's console made to degrade instead of failing: a table that cannot
    fit the width even folded is printed one row per block (every number kept
    whole where the width allows, folded where not, never blanked), and the
    glyphs above become ASCII where the encoding lacks them."""

    def print(self, *objects, **kwargs):
        ascii_only = not self.encoding.lower().startswith("utf")
        out = []
        for o in objects:
            if isinstance(o, Table):
                o = self._fit(o)
            if ascii_only and isinstance(o, str):
                o = o.translate(_ASCII)
            out.append(o)
        super().print(*out, **kwargs)

    def _fit(self, table: Table):
        from rich.console import Group
        from rich.text import Text

        ascii_only = not self.encoding.lower().startswith("utf")

        def text(cell) -> Text:
            t = self.render_str(cell) if isinstance(cell, str) else cell
            t = t.copy() if isinstance(t, Text) else Text(str(t))
            if ascii_only:
                t.plain = t.plain.translate(_ASCII)
            return t

        if _words_fit(self, table, text):
            return table

        columns = table.columns
        n_rows = max((len(list(c.cells)) for c in columns), default=0)
        cells = [list(c.cells) for c in columns]
        parts = [text(table.title)] if table.title else []
        for i in range(n_rows):
            parts.append(Text(f"-- row {i + 1} of {n_rows} --", style="dim"))
            for c, col_cells in zip(columns, cells):
                line = Text("  ") + text(c.header) + Text(": ") + text(col_cells[i] if i < len(col_cells) else "")
                line.overflow = "fold"
                parts.append(line)
        return Group(*parts)


def _longest_word(t) -> int:
    from rich.cells import cell_len

    return max((cell_len(w) for w in t.plain.split()), default=0)


def _words_fit(console, table: Table, text) -> bool:
    """Whether every word of every cell (a number is one word) fits the width
    Rich gives its column: then Rich wraps at spaces and cuts nothing.
    Otherwise a number would be folded, cut to an ellipsis or blanked."""
    from rich.measure import Measurement

    if Measurement.get(console, console.options.update_width(1 << 20), table).minimum > console.width:
        return False
    try:
        widths = table._calculate_column_widths(console, console.options)  # what Rich will give each column
    except Exception:  # a Rich without this helper: the minimum width above decides alone
        return True
    pad = table.padding[1] + table.padding[3] if len(table.padding) == 4 else 2
    return all(_longest_word(text(cell)) <= w - pad
               for col, w in zip(table.columns, widths) for cell in col.cells)



def _width() -> int | None:
    """COLUMNS when the user set it (a narrow terminal, or a script asking for
    one), else the terminal's width, else 160 for a pipe: numbers are never cut."""
    try:
        cols = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        cols = 0
    if cols > 0:
        return cols
    return None if sys.stdout.isatty() else 160


def tolerate_unencodable() -> None:
    """Characters the output encoding cannot carry (a decoded token in an ASCII
    terminal) are written as backslash escapes rather than ending the run."""
    for stream in (sys.stdout, sys.stderr):
        enc = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if enc != "utf8" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream that cannot be reconfigured keeps its errors
                pass


# Numbers are never cut: a pipe gets a wide console, a narrow terminal folds.
# emoji=False: ":smile:" in a tensor name is text, not a picture.
stdout = _Console(soft_wrap=False, width=_width(), emoji=False)
stderr = _Console(stderr=True, emoji=False)


# ---------------------------------------------------------------------------
# JSON


def jsonable(obj):
    """Plain JSON types; non-finite floats become "nan", "inf", "-inf"."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    return obj


def versions() -> dict:
    """Versions that decide the numbers. torch's comes from its metadata, so
    asking does not import it."""
    out = {"precisionlab": __version__, "python": platform.python_version()}
    for pkg in ("numpy", "ml_dtypes", "torch"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Every --json document's "schema_version": bumped when a field is renamed,
# removed or changes meaning (adding a field keeps it), so scripts can check.
SCHEMA_VERSION = 3  # 2: one name per quantity (docs/json.md); 3: "method" / "kernel" became "variant"


def emit_json(command: str, doc: dict) -> None:
    from precisionlab import native

    head = {"schema_version": SCHEMA_VERSION, "command": command, "versions": versions(), "cpu_name": cpu_name()}
    try:
        head["library"] = {"path": native.library_path(), "abi": native.ABI_VERSION}
    except Exception:  # the JSON of a command that never needed the library
        head["library"] = None
    text = json.dumps(jsonable({**head, **doc}), allow_nan=False, indent=2)
    sys.stdout.write(text + "\n")


# ---------------------------------------------------------------------------
# progress and hints (stderr)


@contextmanager
def progress(description: str, enabled: bool):
    """A Rich progress indicator on stderr: steps done and time elapsed, or a
    no-op when disabled (under --json, or when stderr is not a terminal).
    Yields advance(). Experiments do not know their step count in advance
    (it depends on the devices present), so the bar pulses rather than guess."""
    if not enabled or not stderr.is_terminal:
        yield lambda k=1: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed} steps"),
                  TimeElapsedColumn(), console=stderr, transient=True) as p:
        task = p.add_task(description, total=None)
        yield lambda k=1: p.advance(task, k)


def hint(text: str) -> None:
    """A line on stderr; text is plain (no markup), control characters escaped."""
    stderr.print(safe_text(text), style="dim", highlight=False)


def error_line(text: str) -> None:
    """One line on stderr, no markup interpretation."""
    sys.stderr.write(f"precisionlab: {printable(' '.join(str(text).split()))}\n")


# ---------------------------------------------------------------------------
# number formatting: enough digits to be exact where it matters


def num(x, digits: int = 17) -> str:
    if x is None:
        return "-"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x) if digits >= 17 else f"{x:.{digits}g}"


def sci(x) -> str:
    if x is None:
        return "-"
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return num(x)
    return "0" if x == 0 else f"{x:.2e}"


def _footer(unavailable: str | None, takeaways) -> None:
    """What every experiment table ends with: why GPU rows are missing, then
    the computed takeaways."""
    if unavailable:
        stdout.print(f"GPU rows unavailable: {safe_text(unavailable)}", style="dim", highlight=False)
    for line in takeaways:  # plain text that may quote a file name, a token or an --impl
        stdout.print(f"• {safe_text(line)}", highlight=False)


# ---------------------------------------------------------------------------
# accumulate


def accumulate_table(res) -> None:
    t = Table(title=f"accumulate: {safe_text(res.input_desc)}, stored as {res.storage}, n = {res.n}",
              title_justify="left")
    for col in ("device", "accum", "variant"):
        t.add_column(col, overflow="fold")
    for col in ("result", "abs err", "rel err", "ulps", "bound", "absorbed at (step)", "predicted stall"):
        t.add_column(col, justify="right", overflow="fold")
    for r in res.rows:
        if not r["available"]:
            continue
        bound = sci(r["bound"]) if r["bound_kind"] == "rigorous" else (
            r["bound_kind"] if r["bound_kind"] in ("vacuous", "overflow") else f"~{sci(r['bound'])}")
        if r["bound_kind"] == "rigorous" and not r["within_bound"]:
            bound = f"[red]{bound} EXCEEDED[/red]"
        stall = "-" if r["stall_step"] is None else f"{num(r['stall_value'])} ({r['stall_step']})"
        t.add_row(r["device"], r["accumulator"], r["variant"], num(r["result"]), sci(r["abs_error"]),
                  sci(r["rel_error"]), _ulps(r["ulps"]), bound, stall, num(r["predicted_stall"]))
    stdout.print(t)
    rep = res.exact_stored - res.exact_intended if math.isfinite(res.exact_stored - res.exact_intended) else math.nan
    stdout.print(f"exact sum of stored values (fsum): {num(res.exact_stored)}    "
                 f"of intended values: {num(res.exact_intended)}    representation error: {num(rep)}",
                 highlight=False)
    stdout.print("bound: Higham's a-priori bound on |abs err|, each rounding also allowed half the smallest "
                 "subnormal spacing (underflow); vacuous once (n-1)u >= 1; ~ marks a first-order estimate "
                 "(compensated methods, only while n u < 1), not a rigorous bound; overflow: a partial sum passed "
                 "the accumulator's largest value.\n"
                 "absorbed at: the sum before the first addition (1-based step) that left it unchanged; "
                 "for a constant input that is where it stalls for good. predicted: the first power of two "
                 "whose spacing is >= 2|value|.", style="dim", highlight=False)
    missing = sorted({r["variant"] for r in res.rows if not r["available"]})
    _footer(f"({', '.join(missing)}) {res.devices['cuda_unavailable']}" if missing else None, res.takeaways)


def _ulps(x) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return num(x)
    return f"{x:.3g}" if x < 1e6 else f"{x:.2e}"


def accumulate_json(res) -> None:
    emit_json("accumulate", {
        "params": res.params, "devices": res.devices,
        "exact_stored": res.exact_stored, "exact_intended": res.exact_intended, "abs_sum": res.abs_sum,
        "rows": res.rows, "takeaways": res.takeaways,
    })


def require_matplotlib() -> None:
    from precisionlab.errors import UsageError

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'precisionlab[plot]'") from None


@contextmanager
def _figure(path: str, title: str, xlabel: str, ylabel: str):
    """One matplotlib figure: yields the axes, then labels, saves and closes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from precisionlab import outputs

    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        yield ax
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        # format= from the path the user named: matplotlib then never appends an extension of its own
        fmt = Path(path).suffix.lower().lstrip(".")
        written = outputs.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format=fmt))
    finally:
        plt.close(fig)
    hint(f"plot written to {written}")


def plot_kinds() -> tuple[str, ...]:
    """The extensions --plot accepts: the ones matplotlib can write here."""
    from matplotlib.backend_bases import FigureCanvasBase

    first = (".png", ".svg", ".pdf")
    kinds = {f".{k}" for k in FigureCanvasBase.get_supported_filetypes()}
    return tuple(k for k in first if k in kinds) + tuple(sorted(kinds - set(first)))


def check_plot_path(path: str | None) -> str | None:
    """--plot's path, checked before the run (exit 2 for a path no plot can be written to)."""
    if path is None:
        return None
    from precisionlab import outputs

    require_matplotlib()
    return str(outputs.check_output_path(path, plot_kinds(), "--plot"))


def accumulate_plot(res, path: str) -> None:
    """Running sum against step for the sequential methods, beside the exact line."""
    with _figure(path, f"accumulate: {res.input_desc}, stored as {res.storage}", "step", "running sum") as ax:
        for label, trace in res.traces.items():
            step = max(1, trace.size // 4000)  # a few thousand points draw the same picture
            idx = np.arange(0, trace.size, step)
            ax.plot(idx + 1, trace[idx], label=label.removeprefix("cpu "), lw=1.2)
        ax.axhline(res.exact_stored, color="k", ls="--", lw=0.8, label="exact (stored values)")


# ---------------------------------------------------------------------------
# bench


def bench_table(res) -> None:
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
    from precisionlab.report_bench_cpu import per_element_table

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


def bench_json(res) -> None:
    emit_json("bench", {"params": res.params, "rows": res.rows, "notes": res.notes})


# ---------------------------------------------------------------------------
# softmax


def _probs(r) -> str:
    if r["output"] is None:
        return escape(f"[{r['shape'][0]}x{r['shape'][1]}]")
    return escape("[" + ", ".join(num(v, 7) for v in r["output"]) + "]")


def _verdict(r) -> str:
    if r["passed"]:
        return "[green]ok[/green]"
    return "[red]non-finite[/red]" if not r["finite"] else f"[red]{r['n_outside']} off[/red]"


def softmax_table(res) -> None:
    t = Table(title=f"softmax vs float64 (masked rows: {res.params['masked']})", title_justify="left")
    for col in ("case", "dtype", "device", "variant", "probabilities"):
        t.add_column(col, overflow="fold")
    for col in ("max abs", "rel L2", "row-sum err", "log-sum-exp", "verdict"):
        t.add_column(col, justify="right", overflow="fold")
    for r in (r for r in res.rows if r["kind"] == "variant"):
        t.add_row(r["case"], r["dtype"], r["device"], r["variant"], _probs(r), sci(r["max_abs_error"]), sci(r["rel_l2"]),
                  sci(r["row_sum_error"]), num(r["lse"], 8), _verdict(r))
    stdout.print(t)
    bugs = [r for r in res.rows if r["kind"] in ("bug", "bug-reference")]
    if bugs:
        b = Table(title="the classic bugs, beside the correct (stable) kernel", title_justify="left")
        for col in ("bug", "case", "dtype", "device", "stable", "buggy", "buggy max abs", "verdict"):
            b.add_column(col, overflow="fold")
        for ref, bug in zip(bugs[0::2], bugs[1::2], strict=True):
            b.add_row(bug["bug"], bug["case"], bug["dtype"], bug["device"], _probs(ref), _probs(bug),
                      sci(bug["max_abs_error"]), _verdict(bug))
        stdout.print(b)
    tol = ", ".join(f"{k} {v['rtol']:g}" for k, v in res.tolerances.items())
    stdout.print(f"verdict: every element within rtol ({tol}) of a float64 softmax of the stored inputs "
                 "with atol = max(rtol / cols, smallest subnormal); a non-finite output never passes.", style="dim", highlight=False)
    _footer(res.devices.get("cuda_unavailable"), res.takeaways)


def softmax_json(res) -> None:
    emit_json("softmax", {"params": res.params, "devices": res.devices, "tolerances": res.tolerances,
                          "rows": res.rows, "takeaways": res.takeaways})


# ---------------------------------------------------------------------------
# tf32


def tf32_table(res) -> None:
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
    _footer(res.devices.get("cuda_unavailable"), res.takeaways)


def tf32_json(res) -> None:
    emit_json("tf32", {"params": res.params, "devices": res.devices, "flags_before": res.flags_before,
                       "rows": res.rows, "takeaways": res.takeaways})


def tf32_plot(res, path: str) -> None:
    sweep = [r for r in res.rows if r["section"] == "k_sweep"]
    with _figure(path, "matmul error against K", "K", "relative L2 error vs float64") as ax:
        for dev, mode in dict.fromkeys((r["device"], r["mode"]) for r in sweep):
            s = sorted((r for r in sweep if r["device"] == dev and r["mode"] == mode), key=lambda r: r["k"])
            ax.plot([r["k"] for r in s], [r["rel_l2"] for r in s], marker="o",
                    label=f"{dev} {mode}" + (" (emulated)" if s[0]["emulated"] else ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")


# ---------------------------------------------------------------------------
# info


def info_table(d: dict) -> None:
    t = Table(title="precisionlab info", title_justify="left", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", overflow="fold")
    for k, v in d["versions"].items():
        t.add_row(k, str(v))
    t.add_row("CPU", f"{d['cpu']['model']} ({d['cpu']['threads']} threads, {d['cpu']['affinity']} usable)")
    lib = d["library"]
    if "error" in lib:
        t.add_row("library", escape(lib["error"]))
    else:
        t.add_row("library", lib["path"])
        t.add_row("library ABI", str(lib["abi"]))
        t.add_row("library build", escape(lib["build"]))
    c = d["cuda"]
    t.add_row("CUDA runtime (library)", str(c["runtime"]))
    t.add_row("CUDA driver", str(c["driver"]) if c["driver"] else "none")
    if d["gpus"]:
        for i, g in enumerate(d["gpus"]):
            t.add_row(f"GPU {i}", f"{g['name']}, {g['sm_count']} SMs, compute {g['compute_capability']}, "
                                  f"{g['total_mem_bytes'] / 2**30:.1f} GiB")
    else:
        t.add_row("GPU", f"none: {escape(c['unavailable'] or '')}")
    if d.get("torch_cuda"):
        tc = d["torch_cuda"]
        t.add_row("torch CUDA", f"{tc['version']} (available: {tc['available']}, cuDNN {tc['cudnn']})")
    for k, v in d["flags"].items():
        t.add_row(k, str(v))
    stdout.print(t)
    if "catalog" in d:
        _catalog_tables(d["catalog"])


def _catalog_tables(c: dict) -> None:
    yes = lambda b: "-" if b is None else ("yes" if b else "no")
    t = Table(title="kernel variants (the library's catalog)", title_justify="left")
    for col in ("op", "variant", "kind", "devices", "batch-invariant", "deterministic", "default", "what it does"):
        t.add_column(col, overflow="fold")
    for v in c["variants"]:
        t.add_row(v["op"], v["name"], v["kind"], ", ".join(v["devices"]), yes(v["batch_invariant"]),
                  yes(v["deterministic"]), yes(v["default"]), escape(v["summary"]))
    stdout.print(t)
    t = Table(title="formats", title_justify="left")
    for col in ("format", "bits", "p", "emin", "emax", "max", "inf", "NaN", "pl_format code"):
        t.add_column(col, justify="right" if col in ("bits", "p", "emin", "emax", "max") else "left")
    for f in c["formats"]:
        t.add_row(f["name"], str(f["bits"]), str(f["precision"]), str(f["emin"]), str(f["emax"]), f"{f['max']:g}",
                  yes(f["has_inf"]), yes(f["has_nan"]), "storage only" if f["code"] is None else str(f["code"]))
    stdout.print(t)
    t = Table(title="block-scaled formats", title_justify="left")
    for col in ("format", "element", "block", "scale", "tensor scale", "bits/element"):
        t.add_column(col)
    for b in c["block_formats"]:
        t.add_row(b["name"], b["element"], str(b["block"]), b["scale"],
                  f"fp{b['tensor_scale_bits']}" if b["tensor_scale_bits"] else "-", f"{b['bits_per_element']:g}")
    stdout.print(t)


def info_json(d: dict) -> None:
    emit_json("info", {**d, "rows": [{"key": k, "value": v} for k, v in _flatten(d)]})


def _flatten(d, prefix=""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, key + ".")
        elif isinstance(v, list):
            for i, item in enumerate(v):
                yield from _flatten(item, f"{key}.{i}.") if isinstance(item, dict) else [(f"{key}.{i}", item)]
        else:
            yield key, v


# ---------------------------------------------------------------------------
# compare


def compare_op_table(res) -> None:
    p = res.params
    t = Table(title=f"compare op {p['op']} {'x'.join(map(str, p['shape']))}: {safe_text(p['impl'])} against torch",
              title_justify="left")
    for col in ("case", "device", "dtype", "comparison"):
        t.add_column(col, overflow="fold")
    for col in ("rel L2", "max abs", "max ulps", "outside tol", "non-finite"):
        t.add_column(col, justify="right")
    t.add_column("verdict", overflow="fold")
    for r in res.rows:
        verdict = f"[red]{escape(r['verdict'])}[/red]" if r["flagged"] else escape(r["verdict"])
        nonfinite = f"{r['nonfinite_actual']}/{r['nonfinite_reference']}"
        if r.get("reference_nonfinite"):
            nonfinite = f"{r['reference_nonfinite']} matched" if not r.get("nonfinite_pattern_mismatch") else \
                f"{r['nonfinite_pattern_mismatch']} mismatched"
        t.add_row(r.get("case", "random"), r["device"], r["dtype"], f"({r['comparison']}) {r['label']}",
                  sci(r["rel_l2"]), sci(r["max_abs_error"]), _ulps(r["max_ulps"]), f"{r['n_outside']}/{r['n']}", nonfinite,
                  verdict)
    stdout.print(t)
    stdout.print(f"flagged when (1) > {p['ratio_threshold']:g}x (0) or (3) > {p['ratio_threshold']:g}x (2); 'outside tol' "
                 "uses torch.testing's tolerances and is shown, not judged; non-finite reference values must be "
                 "matched (the same NaN or infinity) and the finite rest is measured. Trusted = torch "
                 f"with TF32 off: " + ", ".join(f"{k}={v}" for k, v in res.flags.items() if "tf32" in k.lower()),
                 style="dim", highlight=False)
    for name, what in (p.get("cases") or {}).items():
        stdout.print(safe_text(f"  {name}: {what}"), style="dim", highlight=False)
    _compare_op_contracts(res)
    _compare_op_advice(res)
    _footer(p.get("cuda_unavailable"), res.takeaways)


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
                  "-" if c["first_batch_changed"] is None else str(c["first_batch_changed"]), escape(c["detail"]))
    stdout.print(t)


def _compare_op_advice(res) -> None:
    if not res.advice:
        return
    matmul = any("gamma_k" in a for a in res.advice)
    t = Table(title="tolerance advisor: the smallest tolerance under which (3) passes, on the random case",
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


def compare_op_json(res) -> None:
    emit_json("compare op", {"params": res.params, "flags": res.flags, "rows": res.rows, "contracts": res.contracts,
                             "advice": res.advice, "takeaways": res.takeaways})


# ---------------------------------------------------------------------------
# nondeterminism

_NONDET_TITLES = {
    "atomics": "atomics vs tree: one fp32 sum, run after run",
    "splitk": "split-K matmul",
    "batch": "batch invariance: the first 64 rows, each alone vs inside every batch (1 ... 1024) that holds it",
    "torch_ops": "torch's nondeterministic ops",
    "threads": "CPU threads: chunking follows the thread count",
}


def nondeterminism_table(res) -> None:
    for section in res.params["sections"]:
        rows = [r for r in res.rows if r["section"] == section]
        if not rows:
            continue
        if section == "tp":
            from precisionlab.report_tp import tp_table

            tp_table(rows, res.takeaways.get("tp"))
            continue
        t = Table(title=_NONDET_TITLES[section], title_justify="left")
        t.add_column("device")
        t.add_column("variant", overflow="fold")
        if section == "threads":
            for col in ("result", "error vs fsum", "same bits as"):
                t.add_column(col, justify="right")
            for r in rows:
                t.add_row(r["device"], escape(r["label"]), num(r["result"]), sci(r["abs_error"]),
                          ", ".join(map(str, r["matches"])) or "-")
        elif section == "batch":
            _nondeterminism_batch_rows(t, rows)
        else:
            for col in ("runs", "distinct", "spread (ulps)", "max diff", "relative", "note"):
                t.add_column(col, justify="right" if col != "note" else "left", overflow="fold")
            for r in rows:
                note = ""
                if r.get("refused"):
                    note = escape(f"refused: {r['refused']}")
                elif section == "splitk":
                    note = f"{sci(r['max_abs_diff_vs_unsplit'])} from unsplit; rel L2 vs fp64 {sci(r['rel_l2_vs_fp64'])}"
                elif section == "batch":
                    note = ("differs at batch " + ", ".join(map(str, r["differs_at"]))) if r["differs_at"] else \
                        "identical at every batch size"
                    if r.get("rows_changed") is not None:
                        note += f"; rows changed {r['rows_changed']} of {r['rows_compared']}"
                label = r["label"] + (" [emulated]" if r["emulated"] else "")
                t.add_row(r["device"], escape(label), str(r["runs"]),
                          "-" if r["distinct"] is None else f"{r['distinct']} of {r['runs']}",
                          "-" if r["max_spread_ulps"] is None else _ulps(r["max_spread_ulps"]),
                          sci(r["max_abs_diff"]), sci(r["rel_spread"]), note)
        stdout.print(t)
        if section == "batch":
            stdout.print("rows changed: of the first 64 rows, those whose result in some batch differs from the row "
                         "computed alone; pairs changed: (row, batch size) pairs that differ; most distinct: the most "
                         "different results one row took, alone and in every batch (1: invariant); max diff and "
                         "relative: over the same pairs.", style="dim", highlight=False)
        if section in res.takeaways:
            stdout.print(f"• {safe_text(res.takeaways[section])}", highlight=False)
    _footer(res.devices.get("cuda_unavailable"), [])


def _nondeterminism_batch_rows(t: Table, rows) -> None:
    """Batch invariance: every count covers the same rows (the first 64, each
    alone vs in every batch that holds it), and each header says what it counts."""
    for col in ("batch sizes", "rows changed", "pairs changed", "most distinct", "max diff", "relative", "note"):
        t.add_column(col, justify="right" if col != "note" else "left", overflow="fold")
    for r in rows:
        label = r["label"] + (" [emulated]" if r["emulated"] else "")
        if r.get("refused"):
            t.add_row(r["device"], escape(label), "-", "-", "-", "-", "-", "-", escape(f"refused: {r['refused']}"))
            continue
        note = ("differs at batch " + ", ".join(map(str, r["differs_at"]))) if r["differs_at"] else \
            "identical at every batch size"
        t.add_row(r["device"], escape(label), str(len(r["batch_sizes"])),
                  f"{r['rows_changed']} of {r['rows_compared']}", f"{r['pairs_changed']} of {r['pairs_compared']}",
                  str(r["distinct_per_row_max"]), sci(r["max_abs_diff"]), sci(r["rel_spread"]), note)


def nondeterminism_json(res) -> None:
    emit_json("nondeterminism", {"params": res.params, "devices": res.devices, "exact": res.exact,
                                 "rows": res.rows, "takeaways": res.takeaways})


def nondeterminism_plot(res, path: str) -> None:
    from precisionlab import formats

    ulp = float(formats.get("fp32").spacing(res.exact))
    with _figure(path, f"atomic sums of the same {res.params['n']} values",
                 "result - fsum (fp32 ulps at the exact sum)", "runs") as ax:
        for label, s in res.samples.items():
            ax.hist((s - res.exact) / ulp, bins=40, alpha=0.6, label=label)
        ax.axvline(0, color="k", lw=0.8)


# ---------------------------------------------------------------------------
# compare model


def _marked(text: str, at: int | None) -> str:
    """The text with everything from the divergence on in red; split before
    escaping, so the mark stays at the character where the texts part."""
    if at is None:
        return safe_text(text)
    return safe_text(text[:at]) + "[bold red]" + safe_text(text[at:]) + "[/bold red]"


def model_table(res) -> None:
    info = res.model_info
    p = res.params
    t = Table(title=f"compare model: {safe_text(info['name'])} ({info['parameters']:,} parameters), {p['steps']} greedy steps "
                    f"on {p['device']}", title_justify="left")
    for col in ("dtype", "tokens agree", "first divergence", "fp32 top-2 margin there", "teacher-forced rel L2 (mean)",
                "max rel L2", "max abs", "argmax flips (teacher-forced)"):
        t.add_column(col, justify="right" if col != "dtype" else "left")
    for s in res.summary:
        t.add_row(s["dtype"], "yes" if s["agree"] else "no",
                  "-" if s["diverged_at"] is None else f"step {s['diverged_at']}",
                  num(s["fp32_margin_at_divergence"], 4), sci(s["mean_rel_l2"]), sci(s["max_rel_l2"]),
                  sci(s["max_abs_error"]), str(s["teacher_forced_argmax_flips"]))
    stdout.print(t)
    steps = Table(title="teacher-forced logit error per step (every dtype reads the fp32 path)", title_justify="left")
    steps.add_column("step", justify="right")
    for s in res.summary:
        steps.add_column(f"{s['dtype']} rel L2", justify="right")
        steps.add_column(f"{s['dtype']} max abs", justify="right")
    by = {(r["dtype"], r["step"]): r for r in res.rows}
    for i in range(p["steps"]):
        cells = []
        for s in res.summary:
            r = by[(s["dtype"], i)]
            mark = "*" if s["diverged_at"] == i else ""
            cells += [sci(r["rel_l2"]) + mark, sci(r["max_abs_error"])]
        steps.add_row(str(i), *cells)
    stdout.print(steps)
    stdout.print("* the step where that dtype's free-running tokens first leave fp32's.", style="dim", highlight=False)
    stdout.print(f"prompt: {safe_text(repr(p['prompt']))}", highlight=False)
    for s in [{"dtype": "fp32", "divergence_char": None}, *res.summary]:
        text = res.texts[s["dtype"]].replace("\n", "⏎")  # one character for one, so the mark stays in place
        stdout.print(f"[bold]{s['dtype']:>5}[/bold] │ " + _marked(text, s["divergence_char"]), highlight=False)
    stdout.print(f"load {res.timing['load_s']:.2f} s, run {res.timing['run_s']:.2f} s (after the torch import)",
                 style="dim", highlight=False)
    _footer(None, res.takeaways)


def model_json(res) -> None:
    emit_json("compare model", {"params": res.params, "model": res.model_info, "summary": res.summary,
                                "texts": res.texts, "timing": res.timing, "rows": res.rows,
                                "takeaways": res.takeaways})


def model_plot(res, path: str) -> None:
    with _figure(path, f"{res.model_info['name']}: low precision against fp32", "step",
                 "logit relative L2 vs fp32 (teacher-forced)") as ax:
        for s in res.summary:
            r = sorted((x for x in res.rows if x["dtype"] == s["dtype"]), key=lambda x: x["step"])
            line, = ax.plot([x["step"] for x in r], [x["rel_l2"] for x in r], marker=".", label=s["dtype"])
            if s["diverged_at"] is not None:
                ax.axvline(s["diverged_at"], color=line.get_color(), ls="--", lw=1,
                           label=f"{s['dtype']} diverges (step {s['diverged_at']})")
        ax.set_yscale("log")
