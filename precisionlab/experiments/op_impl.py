"""Running the implementation compare op judges (--impl package.module:function,
or this project's kernels): loading it, keeping what it prints off stdout,
and turning what it raises into one line or a flagged row."""

from __future__ import annotations

from dataclasses import dataclass

from precisionlab.errors import RunError, UsageError
from precisionlab.experiments import op_harness
from precisionlab.runtime.user_code import load_impl, users_code

__all__ = ["Raised", "call", "call_case", "load_impl", "users_code"]


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
