"""What must happen before the process leaves on Ctrl-C.

The CLI answers Ctrl-C from the main thread while the command may still be
inside a kernel on its worker thread (cli.main), so the worker's own
`finally` blocks never run. Code that owns something outside the process
(child processes, a half-written file) registers a cleanup here for as long
as it owns it; cli._interrupted runs every registered cleanup, then exits.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable

_lock = threading.Lock()
_cleanups: list[Callable[[], None]] = []


@contextmanager
def cleanup(fn: Callable[[], None]):
    """Run fn on Ctrl-C while inside this block (and not otherwise)."""
    with _lock:
        _cleanups.append(fn)
    try:
        yield
    finally:
        with _lock:
            if fn in _cleanups:
                _cleanups.remove(fn)


def run_all() -> None:
    """Every registered cleanup, newest first; one that fails does not stop the rest."""
    with _lock:
        fns = list(reversed(_cleanups))
        _cleanups.clear()
    for fn in fns:
        try:
            fn()
        except Exception:  # leaving anyway: the others still deserve their turn
            pass
