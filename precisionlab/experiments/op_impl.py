"""Running the implementation compare op judges (--impl package.module:function,
or this project's kernels): loading it, keeping what it prints off stdout,
and turning what it raises into one line or a flagged row."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from precisionlab.errors import RunError, UsageError
from precisionlab.experiments import op_harness


@contextlib.contextmanager
def users_code():
    """What the user's module prints goes to stderr: stdout is the table or,
    under --json, the JSON document alone (a print() there broke it). File
    descriptor 1 too, for what bypasses sys.stdout (a C extension's printf,
    os.write(1, ...), a child process): it points at stderr meanwhile, and C's
    buffered output is flushed before it is put back."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # fd 1 closed: nothing to keep clean
        saved = None
    try:
        if saved is not None:
            os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            _flush_c_stdio()
            os.dup2(saved, 1)
            os.close(saved)


def _flush_c_stdio() -> None:
    """fflush(NULL): what C code buffered for fd 1 is written while it still points at stderr."""
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to ask: nothing of its is buffered
        pass


def load_impl(spec: str):
    """'package.module:function' -> the callable; the current directory is importable."""
    if ":" not in spec:
        raise UsageError(f"--impl must be package.module:function (got {spec!r})")
    mod_name, fn_name = spec.rsplit(":", 1)
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        with users_code():
            mod = importlib.import_module(mod_name)
    except Exception as e:  # ImportError, or the module's own error while importing
        raise UsageError(f"--impl: cannot import {mod_name} ({type(e).__name__}: {e})") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise UsageError(f"--impl: {mod_name} has no callable {fn_name}")
    return fn


@dataclass(frozen=True)
class Raised:
    """What a call of yours raised on an edge case: a flagged row, not an abort."""

    message: str


def call_case(fn, args, impl, case):
    """On the random case a kernel that raises ends the run (exit 1, one line);
    on an edge case the exception is that case's flagged row."""
    if case in op_harness.BASES:
        return call(fn, args, impl)
    try:
        return call(fn, args, impl)
    except RunError as e:
        return Raised(str(e))


def call(fn, args, impl):
    try:
        with users_code():
            return fn(*args)
    except (UsageError, RunError):
        raise
    except SystemExit as e:  # an implementation may not end the run for us
        raise RunError(f"{impl or 'precisionlab'} called sys.exit({e.code!r})") from None
    except Exception as e:
        who = impl or "precisionlab"
        raise RunError(f"{who} raised {type(e).__name__}: {e}") from None
