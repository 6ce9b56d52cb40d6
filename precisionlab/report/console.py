"""The console toolkit every renderer uses: the two consoles (tables on stdout,
progress and hints on stderr), escaping of strings from outside, number
formats, and the footer every experiment table ends with."""

from __future__ import annotations

import math
import os
import sys
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from precisionlab.io.urls import mask_secrets


# The one escaping rule for strings from outside (a file, a model, a server, a
# rank's output, the command line): a character is shown as itself when
# str.isprintable() says so, as repr() decides; every other one as an escape.
# That covers C0 (ESC, BEL, CR, ...), DEL, C1 (0x80-0x9f, which some terminals
# read as CSI/OSC), the bidirectional overrides and other format characters
# that reorder or hide text, the line and paragraph separators, lone surrogates
# and unassigned code points.
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(s) -> str:
    """str(s) with every character str.isprintable() refuses shown as an
    escape (\\n, \\x1b, \\u202e, \\U000e0001): what a plain-text line (an
    error, a version string) may print of a string from outside. A URL's
    credentials are masked (io.urls): every line and table goes through here."""
    text = mask_secrets(str(s))
    if text.isprintable():  # the common case, in one C call
        return text
    return "".join(c if c.isprintable() else _escape_char(c) for c in text)


def _escape_char(c: str) -> str:
    o = ord(c)
    return _NAMED.get(c) or (f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")


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
            for c, col_cells in zip(columns, cells, strict=True):
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
               for col, w in zip(table.columns, widths, strict=True) for cell in col.cells)



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
# progress and hints (stderr)


@contextmanager
def progress(description: str, enabled: bool):
    """Progress on stderr while the run inside works (runtime/progress owns it:
    the stages the work reports and the steps advance() counts): a live line on
    a terminal where `enabled` (no --json), gone when the run ends; otherwise
    plain lines, only once the run has lasted some seconds. Yields advance().
    Experiments do not know their step count in advance (it depends on the
    devices present), so the bar pulses rather than guess."""
    from precisionlab.runtime import progress as owner

    if not math.isfinite(owner.quiet_period()):
        yield lambda k=1: None
        return
    if not (enabled and stderr.is_terminal):
        reporter = owner.Reporter(description, _progress_line)
        with owner.run(reporter):
            yield reporter.advance
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=stderr,
                  transient=True) as p:
        task = p.add_task(safe_text(description), total=None)
        reporter = owner.Reporter(description, lambda text: p.update(task, description=safe_text(text)), live=True)
        with owner.run(reporter):
            yield reporter.advance


def _progress_line(text: str) -> None:
    """One plain progress line on stderr (stdout and the JSON never see one)."""
    sys.stderr.write(f"precisionlab: {printable(text)}\n")
    sys.stderr.flush()


def hint(text: str) -> None:
    """A line on stderr; text is plain (no markup), control characters escaped."""
    stderr.print(safe_text(text), style="dim", highlight=False)


def or_dash(x, spec: str, suffix: str = "") -> str:
    """x formatted by `spec` (and `suffix`), or "-" where there is no value."""
    return "-" if x is None else f"{x:{spec}}{suffix}"


def show_with_failures(res, json_out: bool, table, as_json) -> None:
    """The table or the JSON, then one FAIL line on stderr per failure
    (compare builds, scores and moved: res.failures)."""
    (as_json if json_out else table)(res)
    for f in res.failures:
        hint(f"FAIL {f}")


def note(text: str) -> None:
    """A table's explanatory note, dim, under it."""
    stdout.print(text, style="dim", highlight=False)


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


def footer(unavailable: str | None, takeaways, note: str | None = None) -> None:
    """What every experiment table ends with: the note that says what its
    columns mean (dim, plain text), why GPU rows are missing, then the computed
    takeaways."""
    if note:
        stdout.print(note, style="dim", highlight=False)
    if unavailable:
        stdout.print(f"GPU rows unavailable: {safe_text(unavailable)}", style="dim", highlight=False)
    for line in takeaways:  # plain text that may quote a file name, a token or an --impl
        stdout.print(f"• {safe_text(line)}", highlight=False)



def ulps(x) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return num(x)
    return f"{x:.3g}" if x < 1e6 else f"{x:.2e}"



def pct(x) -> str:
    """A share as a percentage with two decimals; "-" where there is none."""
    return "-" if x is None else f"{100 * x:.2f} %"


def times(x) -> str:
    """A ratio to its yardstick (numerics.compare.ratio): 1.23x; inf as inf."""
    if x is None:
        return "-"
    return num(x) if not math.isfinite(x) else f"{x:.2f}x"
