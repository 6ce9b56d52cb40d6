"""The only place that prints: Rich tables on stdout, strict JSON on stdout,
progress and hints on stderr, and plots to files."""

from __future__ import annotations

import json
import math
import platform
import sys
from contextlib import contextmanager
from importlib import metadata

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from precisionlab import __version__

# Numbers are never cut: a pipe gets a wide console, a narrow terminal folds.
stdout = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)
stderr = Console(stderr=True)


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


def emit_json(command: str, doc: dict) -> None:
    from precisionlab import native

    head = {"command": command, "versions": versions(), "cpu_name": cpu_name()}
    try:
        head["library"] = {"path": native.library_path(), "abi": native.ABI_VERSION}
    except Exception:  # the JSON of a command that never needed the library
        head["library"] = None
    text = json.dumps(jsonable({**head, **doc}), allow_nan=False, indent=2)
    sys.stdout.write(text + "\n")


# ---------------------------------------------------------------------------
# progress and hints (stderr)


@contextmanager
def progress(total: int, description: str, enabled: bool):
    """A Rich progress bar on stderr, or a no-op when disabled (under --json,
    or when stderr is not a terminal). Yields advance()."""
    if not enabled or not stderr.is_terminal:
        yield lambda k=1: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=stderr, transient=True) as p:
        task = p.add_task(description, total=total)
        yield lambda k=1: p.advance(task, k)


def hint(text: str) -> None:
    stderr.print(f"[dim]{text}[/dim]", highlight=False)


def error_line(text: str) -> None:
    """One line on stderr, no markup interpretation."""
    sys.stderr.write(f"precisionlab: {' '.join(str(text).split())}\n")


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


# ---------------------------------------------------------------------------
# accumulate


def accumulate_table(res) -> None:
    t = Table(title=f"accumulate: {res.input_desc}, stored as {res.storage}, n = {res.n}", title_justify="left")
    for col in ("device", "accum", "method"):
        t.add_column(col, overflow="fold")
    for col in ("result", "abs err", "rel err", "ulps", "bound", "absorbed at (step)", "predicted stall"):
        t.add_column(col, justify="right", overflow="fold")
    for r in res.rows:
        if not r["available"]:
            continue
        bound = sci(r["bound"]) if r["bound_kind"] == "rigorous" else (
            "vacuous" if r["bound_kind"] == "vacuous" else f"~{sci(r['bound'])}")
        if r["bound_kind"] == "rigorous" and not r["within_bound"]:
            bound = f"[red]{bound} EXCEEDED[/red]"
        stall = "-" if r["stall_step"] is None else f"{num(r['stall_value'])} ({r['stall_step']})"
        t.add_row(r["device"], r["accumulator"], r["method"], num(r["result"]), sci(r["abs_error"]),
                  sci(r["rel_error"]), _ulps(r["ulps"]), bound, stall, num(r["predicted_stall"]))
    stdout.print(t)
    rep = res.exact_stored - res.exact_intended if math.isfinite(res.exact_stored - res.exact_intended) else math.nan
    stdout.print(f"exact sum of stored values (fsum): {num(res.exact_stored)}    "
                 f"of intended values: {num(res.exact_intended)}    representation error: {num(rep)}",
                 highlight=False)
    stdout.print("bound: Higham's a-priori bound on |abs err|; vacuous once (n-1)u >= 1; "
                 "~ marks a first-order estimate (compensated methods), not a rigorous bound.\n"
                 "absorbed at: the sum before the first addition (1-based step) that left it unchanged; "
                 "for a constant input that is where it stalls for good. predicted: the first power of two "
                 "whose spacing is >= 2|value|.", style="dim", highlight=False)
    if res.devices.get("cuda_unavailable") and any(not r["available"] for r in res.rows):
        stdout.print(f"GPU rows ({', '.join(sorted({r['method'] for r in res.rows if not r['available']}))}) "
                     f"unavailable: {res.devices['cuda_unavailable']}", style="dim", highlight=False)
    for line in res.takeaways:
        stdout.print(f"• {line}", highlight=False)


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


def accumulate_plot(res, path: str) -> None:
    """Running sum against step for the sequential methods, beside the exact line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for label, trace in res.traces.items():
        step = max(1, trace.size // 4000)  # a few thousand points draw the same picture
        idx = np.arange(0, trace.size, step)
        ax.plot(idx + 1, trace[idx], label=label.removeprefix("cpu "), lw=1.2)
    ax.axhline(res.exact_stored, color="k", ls="--", lw=0.8, label="exact (stored values)")
    ax.set_xlabel("step")
    ax.set_ylabel("running sum")
    ax.set_title(f"accumulate: {res.input_desc}, stored as {res.storage}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    hint(f"plot written to {path}")


# ---------------------------------------------------------------------------
# bench


def bench_table(res) -> None:
    t = Table(title="bench" + (" (quick)" if res.params["quick"] else ""), title_justify="left")
    for col in ("section", "device", "kernel", "dtype", "accum", "size"):
        t.add_column(col, overflow="fold")
    for col in ("time (ms)", "GB/s", "vs baseline", "% of copy"):
        t.add_column(col, justify="right")
    for r in res.rows:
        vs = "-" if r["vs_baseline"] is None else f"{r['vs_baseline']:.3f}x {r['baseline']}"
        pct = r.get("pct_of_copy")
        size = "x".join(map(str, r["shape"])) if r.get("shape") else str(r["n"])
        t.add_row(r["section"], r["device"], r["kernel"], r["dtype"], r["accumulator"] or "-", size,
                  f"{r['time_ms']:.3f}", f"{r['gbps']:.1f}", vs, "-" if pct is None else f"{pct:.1f}")
    stdout.print(t)
    stdout.print("vs baseline: baseline time / kernel time (above 1 is faster). GPU: CUDA events, median of "
                 "batched runs over rotating buffers. GB/s: bytes read (sums), read + written (softmax, copy).", style="dim", highlight=False)
    for note in res.notes:
        stdout.print(note, style="dim", highlight=False)


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
    for col in ("case", "dtype", "device", "method", "probabilities"):
        t.add_column(col, overflow="fold")
    for col in ("max abs", "rel L2", "row-sum err", "log-sum-exp", "verdict"):
        t.add_column(col, justify="right", overflow="fold")
    for r in (r for r in res.rows if r["kind"] == "method"):
        t.add_row(r["case"], r["dtype"], r["device"], r["method"], _probs(r), sci(r["max_abs"]), sci(r["rel_l2"]),
                  sci(r["row_sum_error"]), num(r["lse"], 8), _verdict(r))
    stdout.print(t)
    bugs = [r for r in res.rows if r["kind"] in ("bug", "bug-reference")]
    if bugs:
        b = Table(title="the classic bugs, beside the correct (stable) kernel", title_justify="left")
        for col in ("bug", "case", "dtype", "device", "stable", "buggy", "buggy max abs", "verdict"):
            b.add_column(col, overflow="fold")
        for ref, bug in zip(bugs[0::2], bugs[1::2], strict=True):
            b.add_row(bug["bug"], bug["case"], bug["dtype"], bug["device"], _probs(ref), _probs(bug),
                      sci(bug["max_abs"]), _verdict(bug))
        stdout.print(b)
    tol = ", ".join(f"{k} {v['rtol']:g}" for k, v in res.tolerances.items())
    stdout.print(f"verdict: every element within rtol ({tol}) of a float64 softmax of the stored inputs "
                 "with atol = max(rtol / cols, smallest subnormal); a non-finite output never passes.", style="dim", highlight=False)
    if res.devices.get("cuda_unavailable"):
        stdout.print(f"GPU rows unavailable: {res.devices['cuda_unavailable']}", style="dim", highlight=False)
    for line in res.takeaways:
        stdout.print(f"• {line}", highlight=False)


def softmax_json(res) -> None:
    emit_json("softmax", {"params": res.params, "devices": res.devices, "tolerances": res.tolerances,
                          "rows": res.rows, "takeaways": res.takeaways})
