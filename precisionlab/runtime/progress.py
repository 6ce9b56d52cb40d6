"""Where a long run is, said on stderr: the one owner of progress.

A command's run is wrapped once (report/console.progress opens a Reporter
here); the code doing the work says which stage it is in (`stage("fp32
greedy", 20, 50)`, `stage("loading weights")`) wherever it is, engines and
experiments alike, without being handed anything: a call with no run open is
a no-op, so the library used from Python stays silent.

What is shown, and when (why: a run of minutes must say where it is, a run
of seconds must leave nothing behind, and stdout and the JSON are never
touched):
- stderr a terminal, without --json: a live line (Rich, transient) from the
  start, gone when the run ends;
- otherwise (a pipe, a log file, --json): plain lines "precisionlab: TITLE:
  STAGE i/n (0:42)", none during the first AFTER_S seconds (a quick run
  prints nothing), then one when the stage changes (at most one a second)
  and one every EVERY_S seconds while it does not (a ticker thread: a
  weight load of minutes is reported while it runs).
PRECISIONLAB_PROGRESS_AFTER=SECONDS sets the quiet period (0: from the
start), `off` silences both forms.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable

AFTER_S = 5.0   # quiet this long: a run of seconds prints nothing
EVERY_S = 10.0  # at most this long between lines while a stage lasts
GAP_S = 1.0     # at least this long between lines (stage changes coming faster wait for the next)
ENV = "PRECISIONLAB_PROGRESS_AFTER"

_lock = threading.Lock()
_active: Reporter | None = None


def quiet_period() -> float:
    """ENV's seconds (AFTER_S when unset; inf for `off` or a value that is not a number >= 0)."""
    raw = os.environ.get(ENV, "").strip().lower()
    if not raw:
        return AFTER_S
    try:
        v = float(raw)
    except ValueError:
        return math.inf  # `off`, or a typo: silence rather than a refusal of the whole run
    return v if v >= 0 else math.inf


def elapsed_text(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Reporter:
    """One run's progress: the stage, its count, the steps advanced; show(text)
    is called with a line whenever one is due (plain lines) or on every change
    (live: the caller's display redraws itself)."""

    def __init__(self, title: str, show: Callable[[str], None], *, live: bool = False,
                 after: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.title, self.show, self.live, self.clock = title, show, live, clock
        self.after = quiet_period() if after is None else after
        self.start = clock()
        self.name: str | None = None
        self.done: int | None = None
        self.total: int | None = None
        self.steps = 0
        self.last: float | None = None  # when the last plain line was shown
        self.pending = False            # a stage change not shown yet (GAP_S)
        self._lock = threading.Lock()

    def where(self) -> str:
        """'TITLE: STAGE i/n' (the steps advanced where no stage was named)."""
        where = self.name or (f"{self.steps} steps" if self.steps else "starting")
        if self.done is not None:
            where += f" {self.done}/{self.total}" if self.total is not None else f" {self.done}"
        return f"{self.title}: {where}"

    def text(self, now: float | None = None) -> str:
        """A plain line: where() and the time since the run began."""
        now = self.clock() if now is None else now
        return f"{self.where()} ({elapsed_text(now - self.start)})"

    def stage(self, name: str, done: int | None = None, total: int | None = None) -> None:
        with self._lock:
            changed = name != self.name
            self.name, self.done, self.total = name, done, total
            self.pending = self.pending or changed
            self._due()

    def advance(self, k: int = 1) -> None:
        with self._lock:
            self.steps += k
            self._due()

    def tick(self) -> None:
        """The ticker's call: a line if one is due though nothing reported (a long load)."""
        with self._lock:
            self._due()

    def _due(self) -> None:
        now = self.clock()
        if self.live:  # the live display shows the time itself
            self.show(self.where())
            return
        if now - self.start < self.after:
            return
        since = math.inf if self.last is None else now - self.last
        if (self.pending and since >= GAP_S) or since >= EVERY_S:
            self.last, self.pending = now, False
            self.show(self.text(now))


def stage(name: str, done: int | None = None, total: int | None = None) -> None:
    """Say which stage the run is in (and how far through its count); a no-op with no run open."""
    r = _active
    if r is not None:
        r.stage(name, done, total)


class run:
    """`with run(reporter):` the reporter is the process's for the block, a
    ticker thread calls tick() every half second (plain lines only), and stage()
    reaches it from any thread (the CLI runs the command on a worker)."""

    def __init__(self, reporter: Reporter | None):
        self.reporter = reporter
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._before: Reporter | None = None

    def __enter__(self) -> Reporter | None:
        global _active
        with _lock:
            self._before, _active = _active, self.reporter
        if self.reporter is not None and not self.reporter.live and math.isfinite(self.reporter.after):
            self._ticker = threading.Thread(target=self._tick, name="precisionlab-progress", daemon=True)
            self._ticker.start()
        return self.reporter

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self.reporter.tick()

    def __exit__(self, *exc) -> None:
        global _active
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with _lock:
            _active = self._before
