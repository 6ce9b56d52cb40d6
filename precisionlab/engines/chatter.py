"""An engine library's own lines on stderr (llama.cpp's `n_ctx_seq (512) >
n_ctx_train (0)`, its loader's metadata listing while quantizing), captured.

A C library writes to file descriptor 2 directly, past sys.stderr (and
llama-cpp-python's log callback prints to sys.stderr), so one
error became two lines and a clean run printed lines nobody asked for.
captured(what) points fd 2 at a temporary file for one call into the
library: the lines are shown only with PRECISIONLAB_DEBUG=1, or, where the
call fails with one of precisionlab's errors, the library's last line is
added to that one error line (the line it explains). Each window is one
short call (opening a model, quantizing): fd 2 is the process's, so
nothing else should be writing meanwhile; Ctrl-C restores it (an
interrupt.cleanup) before the main thread's one "interrupted" line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from precisionlab.errors import PrecisionLabError
from precisionlab.runtime import interrupt

_SHOWN = 200  # characters of the library's last line added to an error line


@contextlib.contextmanager
def captured(what: str):
    """The library's output during the block, held back (see the module's note): file descriptors 1
    and 2 (C code writes there) and sys.stdout/sys.stderr (llama-cpp-python's log callback prints to
    sys.stderr, whatever object that is: a test's capture, a notebook's stream)."""
    import io

    try:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = (os.dup(1), os.dup(2))
    except (OSError, ValueError, AttributeError):  # no descriptors to redirect (closed): nothing to capture
        yield
        return
    py = io.StringIO()
    streams = sys.stdout, sys.stderr

    def restore() -> None:  # also on Ctrl-C, from the main thread, before its "interrupted" line
        sys.stdout, sys.stderr = streams
        for fd, old in zip((1, 2), saved, strict=True):
            os.dup2(old, fd)

    with tempfile.TemporaryFile() as log, interrupt.cleanup(restore):
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = py
        failed: BaseException | None = None
        try:
            yield
        except BaseException as e:
            failed = e
            raise
        finally:
            restore()
            for old in saved:
                os.close(old)
            log.seek(0)
            _settle(log.read().decode("utf-8", "replace") + py.getvalue(), what, failed)


def _settle(text: str, what: str, failed: BaseException | None) -> None:
    """Show the held lines under PRECISIONLAB_DEBUG=1; add the last to a failure's one line."""
    if os.environ.get("PRECISIONLAB_DEBUG") == "1" and text:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
    last = last_line(text)
    if isinstance(failed, PrecisionLabError) and last and failed.args:
        failed.args = (f"{failed.args[0]} ({what} said: {last[:_SHOWN]})", *failed.args[1:])


def last_line(text: str) -> str:
    """The last non-blank line, stripped."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
