"""The one way precisionlab writes a file: exactly the path the user named,
checked before the run starts, and written atomically.

check_output_path() runs before the experiment, so a bad path (a directory,
a device, a missing or unwritable folder, an extension nothing can write) is a
usage error (exit 2) and no result is lost. atomic_write() writes a temporary
file in the same folder and renames it over the path: readers and concurrent
runs see the old file or the new one, never a mix, and an interrupted run
leaves no partial file (remove_pending() clears what an interrupt cut short).
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from pathlib import Path
from typing import Callable, Union

from precisionlab.errors import UsageError

Writer = Union[bytes, Callable[[str], None]]

_pending: set[str] = set()  # temporary files being written, for an interrupt to remove
_lock = threading.Lock()


def check_output_path(path: str | None, kinds: tuple[str, ...] | list[str] | None, what: str) -> Path:
    """The path as given, once it is sure to be writable as one of `kinds`
    (extensions with the dot, lower case; None: any name, for data files);
    else UsageError naming why."""
    if path is None or not str(path).strip():
        raise UsageError(f"{what}: empty path; name the file to write (e.g. out{kinds[0] if kinds else ''})")
    p = Path(path)
    ext = p.suffix.lower()
    if kinds is not None and ext not in kinds:
        got = f"extension {ext!r}" if ext else "no extension"
        raise UsageError(f"{what} {path!r}: {got}; the file must end in one of {', '.join(kinds)}")
    if os.path.lexists(p):
        st = os.lstat(p)
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{what} {path!r} is a directory; name a file inside it")
        if stat.S_ISLNK(st.st_mode):
            raise UsageError(f"{what} {path!r} is a symbolic link; name the file itself")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} {path!r} exists and is not a regular file (a device, FIFO or socket)")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{what} {path!r}: the folder {str(parent)!r} does not exist")
    try:  # the only test that tells: permissions, read-only mounts, quotas, root squashing
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{p.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{what} {path!r}: cannot write in {str(parent)!r} ({e.strerror or e})") from None
    return p


def atomic_write(path: str | os.PathLike, writer: Writer) -> Path:
    """Write `writer` (bytes, or a function that writes the file at the path it
    is given) to a temporary file beside `path`, then rename it over `path`.
    The temporary name keeps the extension, for writers that read it."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{p.name}.", suffix=f".tmp{p.suffix}")
    with _lock:
        _pending.add(tmp)
    try:
        if isinstance(writer, (bytes, bytearray, memoryview)):
            with os.fdopen(fd, "wb") as f:
                f.write(writer)
                f.flush()
                os.fsync(f.fileno())
        else:
            os.close(fd)
            writer(tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a written file gets the usual mode
        os.replace(tmp, p)
    except BaseException:
        _remove(tmp)
        raise
    finally:
        with _lock:
            _pending.discard(tmp)
    return p


def atomic_dir(path: str | os.PathLike, writer: Callable[[str], None]) -> Path:
    """A folder's twin of atomic_write: `writer` fills a temporary folder
    beside `path`, which is then renamed to `path` (an existing folder at
    `path` is replaced only once the new one is complete)."""
    import shutil

    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{p.name}.", suffix=".tmp")
    with _lock:
        _pending.add(tmp)
    try:
        writer(tmp)
        os.chmod(tmp, 0o777 & ~_umask())
        if p.is_dir() and not p.is_symlink():
            old = tempfile.mkdtemp(dir=parent, prefix=f".{p.name}.", suffix=".old")
            os.replace(p, Path(old) / "x")
            os.replace(tmp, p)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, p)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        with _lock:
            _pending.discard(tmp)
    return p


def remove_pending() -> None:
    """Remove temporary files whose write was cut short (called on Ctrl-C)."""
    with _lock:
        for tmp in list(_pending):
            _remove(tmp)
        _pending.clear()


def _remove(tmp: str) -> None:
    try:
        if os.path.isdir(tmp) and not os.path.islink(tmp):  # an atomic_dir() cut short
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            return
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    except OSError:
        pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
