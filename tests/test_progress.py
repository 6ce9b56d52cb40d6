"""Progress of a long run (issue 39): one owner (runtime/progress), on stderr
only, silent while a run is quick, a line per stage and one every ~10 s
after that; stdout and the JSON unchanged by it."""

from __future__ import annotations

import re

from helpers import cli

from precisionlab.runtime import progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_quiet_while_quick_then_a_line_per_stage_and_every_ten_seconds(monkeypatch):
    clock, lines = Clock(), []
    r = progress.Reporter("compare model", lines.append, after=5.0, clock=clock)
    # the reporter made the process's without run()'s ticker thread: the test's own tick() calls are the
    # ticker's, at the clock's times
    monkeypatch.setattr(progress, "_active", r)
    clock.t = 1.0
    progress.stage("loading hf:m")
    clock.t = 4.9
    r.advance()
    progress.stage("fp32 greedy", 3, 50)
    assert lines == []  # the first 5 s: nothing, whatever is reported
    clock.t = 6.0
    progress.stage("fp32 greedy", 4, 50)  # no new stage, but the first line once the quiet period is over
    assert lines == ["compare model: fp32 greedy 4/50 (0:06)"]
    clock.t = 6.5
    progress.stage("fp32 teacher-forced")  # a new stage within a second of the last line: held
    assert len(lines) == 1
    clock.t = 7.0
    r.tick()
    assert lines[-1] == "compare model: fp32 teacher-forced (0:07)"
    clock.t = 16.9
    progress.stage("bf16 greedy")
    clock.t = 17.0
    progress.stage("bf16 greedy", 20, 50)  # the same stage: 10 s after the last line at the earliest
    r.tick()
    assert lines[-1] == "compare model: bf16 greedy (0:16)"
    clock.t = 26.8
    r.tick()
    assert len(lines) == 3
    clock.t = 26.9
    r.tick()  # a weight load that reports nothing still gets its line every 10 s
    assert lines[-1] == "compare model: bf16 greedy 20/50 (0:26)"
    monkeypatch.setattr(progress, "_active", None)
    progress.stage("after the run")  # no run open: a no-op (the library used from Python stays silent)
    assert len(lines) == 4


def test_run_opens_and_closes_the_reporter():
    r = progress.Reporter("t", lambda text: None, after=float("inf"))
    with progress.run(r) as opened:
        assert opened is r and progress._active is r
    assert progress._active is None


def test_quiet_period_from_the_environment(monkeypatch):
    monkeypatch.setenv(progress.ENV, "0")
    assert progress.quiet_period() == 0.0
    for off in ("off", "-1", "soon"):
        monkeypatch.setenv(progress.ENV, off)
        assert progress.quiet_period() == float("inf")
    monkeypatch.delenv(progress.ENV)
    assert progress.quiet_period() == progress.AFTER_S
    assert progress.elapsed_text(3725.0) == "1:02:05" and progress.elapsed_text(65.9) == "1:05"


def _without_times(doc):
    if isinstance(doc, dict):
        return {k: _without_times(v) for k, v in doc.items() if k != "timing" and not k.endswith("_s")}
    if isinstance(doc, list):
        return [_without_times(v) for v in doc]
    return doc


def test_forced_progress_goes_to_stderr_and_leaves_stdout_alone():
    argv = ("compare", "model", "--steps", "4", "--dtypes", "bf16", "--json")
    loud = cli(*argv, env={progress.ENV: "0"})
    quiet = cli(*argv, env={progress.ENV: "off"})
    assert loud.code == quiet.code == 0, (loud.err, quiet.err)
    assert quiet.err == ""
    lines = loud.err.splitlines()
    # at least the first report (a stage, or the ticker's), shown at once with a quiet period of 0; which
    # stages follow depends on how fast they come (at most a line a second), so they are not named here
    assert lines and all(re.fullmatch(r"precisionlab: compare model: .+ \(\d+:\d\d\)", x) for x in lines), loud.err
    assert _without_times(loud.json()) == _without_times(quiet.json())  # stdout is the JSON alone, the same
