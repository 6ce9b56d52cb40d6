"""--plot, handled one way: the path checked before the run, one figure
written atomically, matplotlib asked only when a plot is wanted."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from precisionlab.report.console import hint


def require_matplotlib() -> None:
    from precisionlab.errors import UsageError

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'precisionlab[plot]'") from None


@contextmanager
def figure(path: str, title: str, xlabel: str, ylabel: str):
    """One matplotlib figure: yields the axes, then labels, saves and closes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        yield ax
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        written = save(fig, path)
    finally:
        plt.close(fig)
    hint(f"plot written to {written}")


def save(fig, path: str) -> Path:
    """Every --plot is written here: atomically, in the format of path's extension (format=, so matplotlib
    never appends an extension of its own), and with every text of the figure (title, labels, legend)
    through io.urls: a model's name is in some titles, and a plot is shared like the JSON."""
    from matplotlib.text import Text

    from precisionlab.io import outputs
    from precisionlab.io.urls import mask_secrets

    for text in fig.findobj(Text):
        text.set_text(mask_secrets(text.get_text()))
    fmt = Path(path).suffix.lower().lstrip(".")
    return outputs.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format=fmt))


def plot_kinds() -> tuple[str, ...]:
    """The extensions --plot accepts: the ones matplotlib can write here."""
    from matplotlib.backend_bases import FigureCanvasBase

    first = (".png", ".svg", ".pdf")
    kinds = {f".{k}" for k in FigureCanvasBase.get_supported_filetypes()}
    return tuple(k for k in first if k in kinds) + tuple(sorted(kinds - set(first)))


def check_plot_path(path: str | None, inputs=()) -> str | None:
    """--plot's path, checked before the run (exit 2 for a path no plot can be
    written to, or that is one of the run's `inputs`: outputs.Inputs)."""
    if path is None:
        return None
    from precisionlab.io import outputs

    require_matplotlib()
    return str(outputs.check_output_path(path, plot_kinds(), "--plot", inputs))


def along_model(path: str, title: str, xs: list[int], series, names: list[str], first: int | None) -> None:
    """Per-module errors along a model (compare model --layers): one line a
    (label, values, linestyle); zeros and non-finite values left out of the log
    scale; the first divergence marked; module names on the x axis when few."""
    import math

    with figure(path, title, "module (execution order)", "rel-L2") as ax:
        for label, values, style in series:
            pts = [(x, v) for x, v in zip(xs, values, strict=True) if v is not None and math.isfinite(v) and v > 0]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=".", label=label)
        if any(line.get_ydata().size for line in ax.get_lines()):
            ax.set_yscale("log")
        if first is not None:
            ax.axvline(first, color="red", linestyle="--", label="first divergence")
        if len(xs) <= 40:
            ax.set_xticks(xs)
            ax.set_xticklabels(names, rotation=90, fontsize=6)
