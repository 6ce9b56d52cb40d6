"""One command's output, decided in one place: progress on stderr while it
runs, then its plot (the path checked before the run), then its table on
stdout or its JSON document. A renderer is a module of this package with
table(result), as_json(result) and, where the command draws, plot(result, path)."""

from __future__ import annotations

from dataclasses import dataclass, field

from precisionlab.report.console import progress
from precisionlab.report.plots import check_plot_path


class Output:
    def __init__(self, renderer, json_out: bool, plot: str | None = None, inputs=(), table_kw: dict | None = None):
        self.renderer = renderer
        self.json_out = json_out
        self.table_kw = table_kw or {}  # the table's own switches (--wide), for renderers that take them
        # before the run: a bad path, or one the run reads (inputs: (option, path) pairs), must not cost the result
        self.plot = check_plot_path(plot, inputs)

    def run(self, title: str, work):
        """work(advance) under a progress indicator, then the result shown."""
        with progress(title, enabled=not self.json_out) as advance:
            result = work(advance)
        self.show(result)
        return result

    def show(self, result) -> None:
        if self.plot:
            self.renderer.plot(result, self.plot)
        if self.json_out:
            self.renderer.as_json(result)
        else:
            self.renderer.table(result, **self.table_kw)


@dataclass
class Rows:
    """A result that is a table of rows: what the row renderers read (compare op
    adds its contracts and advice to it)."""
    params: dict
    rows: list[dict]
    flags: dict = field(default_factory=dict)
    takeaways: list[str] = field(default_factory=list)
    any_failed: bool = False
