"""The user's own code, run because the user named it (compare op's --impl,
the python: engine spec): finding the callable they named, and keeping what
their code prints off stdout.

Only the module the user names is imported, from a package on the path (the
current directory included) or from the file they give; nothing is searched
for or imported on its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from precisionlab.errors import UsageError


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


def is_file_spec(module: str) -> bool:
    """A module part naming a file (a path ending .py) rather than a dotted module name."""
    return module.endswith(".py") or os.sep in module or "/" in module


def _import_file(path: str, option: str):
    """The module in the file the user named, under a name of its own (its
    path's hash: two files of one name do not replace each other)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"{option}: no such file {str(p)!r}")
    name = "precisionlab_user_" + hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise UsageError(f"{option}: {str(p)!r} is not a Python module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling look a module up by name while it runs
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def load_callable(spec: str, option: str = "--impl", what: str = "function"):
    """'package.module:NAME' or '/path/file.py:NAME' -> the callable NAME; the
    current directory is importable. Anything wrong is one UsageError line
    naming `option`."""
    if ":" not in spec:
        raise UsageError(f"{option} must be package.module:{what} or path/file.py:{what} (got {spec!r})")
    mod_name, fn_name = spec.rsplit(":", 1)
    if not mod_name or not fn_name:
        raise UsageError(f"{option} must be package.module:{what} or path/file.py:{what} (got {spec!r})")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        with users_code():
            mod = _import_file(mod_name, option) if is_file_spec(mod_name) else importlib.import_module(mod_name)
    except UsageError:
        raise
    except Exception as e:  # ImportError, or the module's own error while importing
        raise UsageError(f"{option}: cannot import {mod_name} ({type(e).__name__}: {e})") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise UsageError(f"{option}: {mod_name} has no callable {fn_name}")
    return fn


def load_impl(spec: str):
    """--impl 'package.module:function' (or 'path/file.py:function') -> the callable (compare op,
    attention-cases, router); the current directory is importable."""
    return load_callable(spec, "--impl", "function")
