"""An engine library's own lines on stderr (llama.cpp's `n_ctx_seq (512) >
n_ctx_train (0)`, its loader's metadata listing while quantizing), captured.

A C library writes to file descriptor 2 directly, past sys.stderr (and
llama-cpp-python's log callback prints to sys.stderr), so one
error became two lines and a clean run printed lines nobody asked for.
captured(what) points fd 2 at a temporary file for one call into the
library: the lines are shown only with PRECISIONLAB_DEBUG=1, or, where the
call fails with one of precisionlab's errors, the library's last line is
added to that one error line (the line it explains). onnxruntime and
CTranslate2 log the same way (their C++ loggers write to fd 2: ORT's arena
and session lines, ct2's CPU and model lines under CT2_VERBOSE), so their
sessions and runs are windows too. fd 2 is the process's: another Python
thread writing meanwhile (the progress ticker, Rich's live line, the main
thread) writes past the window to the user's stream (_Split), or a run of
minutes inside engine calls would say nothing of where it is; Ctrl-C
restores it (an interrupt.cleanup) before the main thread's one
"interrupted" line.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import threading

from precisionlab.errors import PrecisionLabError
from precisionlab.runtime import interrupt

_SHOWN = 200  # characters of the library's last line added to an error line
# Lines a library tags as information (onnxruntime's [I:...]/[V:...], CTranslate2's [info]/[debug]/[trace],
# printed under a verbose level the user chose): a failure's explanation is the last line that is not one
_INFO = re.compile(r"\[[IV]:onnxruntime[:,]|\] \[(?:info|debug|trace)\] ")


@contextlib.contextmanager
def captured(what: str):
    """The library's output during the block, held back (see the module's note): file descriptors 1
    and 2 (C code writes there) and sys.stdout/sys.stderr (llama-cpp-python's log callback prints to
    sys.stderr, whatever object that is: a test's capture, a notebook's stream)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = (os.dup(1), os.dup(2))
    except (OSError, ValueError, AttributeError):  # no descriptors to redirect (closed): nothing to capture
        yield
        return
    try:
        with tempfile.TemporaryFile() as log:
            yield from _window(log, saved, what)
    finally:
        for old in saved:
            os.close(old)


def _window(log, saved: tuple[int, int], what: str):
    """captured()'s body once fds 1 and 2 are saved: point them and sys.stdout/sys.stderr at the log
    (another thread's writes pass: _Split), yield, give them back, settle what was held."""
    held = io.StringIO()
    streams = sys.stdout, sys.stderr
    splits = [_Split(held, stream, saved) for stream in streams]

    def restore() -> None:  # also on Ctrl-C, from the main thread, before its "interrupted" line
        sys.stdout, sys.stderr = streams
        for fd, old in zip((1, 2), saved, strict=True):
            os.dup2(old, fd)
        for split in splits:
            split.close()

    with interrupt.cleanup(restore):
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout, sys.stderr = splits
        failed: BaseException | None = None
        try:
            yield
        except BaseException as e:
            failed = e
            raise
        finally:
            restore()
            log.seek(0)
            _settle(log.read().decode("utf-8", "replace") + held.getvalue(), what, failed)


class _Split:
    """sys.stdout or sys.stderr during a window. The opening thread's writes, and a C thread's (a
    library's log callback), are held with the library's fd output; another Python thread's go to the
    user's stream: the stream itself, or where it wrote to fd 1 or 2 (now the log), the saved copy."""

    def __init__(self, held: io.StringIO, stream, saved: tuple[int, int]):
        self._held, self._stream, self._owner = held, stream, threading.current_thread()
        self._lock, self._out = threading.Lock(), stream
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):  # a test's capture, a notebook's stream: no descriptor
            fd = None
        if fd in (1, 2):
            self._out = open(saved[fd - 1], "w", encoding=getattr(stream, "encoding", None) or "utf-8",
                             errors="backslashreplace", closefd=False, buffering=1)

    def _holds(self) -> bool:
        thread = threading.current_thread()
        return thread is self._owner or isinstance(thread, threading._DummyThread)

    def write(self, text: str) -> int:
        if self._holds():
            return self._held.write(text)
        with self._lock:  # not past close(): the saved descriptor is closed after the window
            return self._out.write(text)

    def flush(self) -> None:
        if not self._holds():
            with self._lock:
                self._out.flush()

    def close(self) -> None:
        """The window is over: later writes from a thread that still holds this object go to the stream."""
        with self._lock:
            if self._out is not self._stream:
                self._out.close()  # flushed; closefd=False: the saved descriptor is captured()'s to close
            self._out = self._stream

    def __getattr__(self, name: str):  # isatty, encoding, ...: as the stream the caller's writes go to
        return getattr(self._held if self._holds() else self._out, name)


def _settle(text: str, what: str, failed: BaseException | None) -> None:
    """Show the held lines under PRECISIONLAB_DEBUG=1; add the last to a failure's one line."""
    if os.environ.get("PRECISIONLAB_DEBUG") == "1" and text:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
    last = last_line(text)
    if isinstance(failed, PrecisionLabError) and last and failed.args:
        failed.args = (f"{failed.args[0]} ({what} said: {last[:_SHOWN]})", *failed.args[1:])


def last_line(text: str) -> str:
    """The last non-blank line, stripped, that is not one a library tags as information (_INFO)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not _INFO.search(line)]
    return lines[-1] if lines else ""
