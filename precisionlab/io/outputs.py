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
from typing import Callable, Iterable, Optional, Union

from precisionlab.errors import RunError, UsageError

Writer = Union[bytes, Callable[[str], None]]
# What a run reads, as (option, path) pairs (None paths are skipped): an output
# must never be one of them, nor (for a directory input) a file inside it.
Inputs = Iterable[tuple[str, Optional[str]]]

_pending: set[str] = set()  # temporary files being written, for an interrupt to remove
_lock = threading.Lock()


def check_output_path(path: str | None, kinds: tuple[str, ...] | list[str] | None, what: str,
                      inputs: Inputs = ()) -> Path:
    """The path as given, once it is sure to be writable as one of `kinds`
    (extensions with the dot, lower case; None: any name, for data files)
    and is none of the run's `inputs` (else the result would overwrite the
    data it was computed from); else UsageError naming why."""
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
        _not_an_input(p, str(path), what, inputs)
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


def check_output_dir(path: str | None, members: Iterable[str], what: str, inputs: Inputs = (),
                     force: bool = False) -> Path:
    """A directory a run writes `members` into (an existing one, or a new one in
    an existing folder), checked before the run: the directory is not an input,
    does not hold one and is not inside one, and each member's path passes
    check_output_path (a member that is a directory or a link is refused now,
    not after the run). The user named the folder, not its members: one that
    exists is refused unless `force` (check_side_file)."""
    if path is None or not str(path).strip():
        raise UsageError(f"{what}: empty path; name a directory")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{what} {str(path)!r}: exists and is not a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not p.exists() and not parent.is_dir():
        raise UsageError(f"{what} {str(path)!r}: its parent folder {str(parent)!r} does not exist")
    if not os.access(p if p.exists() else parent, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {str(path)!r}: not writable")
    here = os.path.realpath(p)
    for option, given in inputs:
        if given is None or not os.path.exists(given):
            continue
        there = os.path.realpath(given)
        if here == there or _inside(there, here) or (os.path.isdir(there) and _inside(here, there)):
            raise UsageError(f"{what} {str(path)!r} {'is' if here == there else 'overlaps'} {option} {given!r}, "
                             "which the run reads; name a directory of its own")
    if p.exists():
        for m in members:
            check_output_path(str(p / m), None, f"{what} {str(path)!r}: member", inputs)
            check_side_file(str(p / m), f"{what} {str(path)!r}", force)
    return p


def check_extension(path: str, kinds: tuple[str, ...], what: str, label: str) -> None:
    """Refuse a file name whose extension is not one of `kinds` (as --plot does): `--out notes.txt`
    for a GGUF would replace the user's text file with a model."""
    ext = Path(path).suffix.lower()
    if ext not in kinds:
        got = f"extension {ext!r}" if ext else "no extension"
        raise UsageError(f"{what} {path!r}: {got}; {label} is written there, and its name must end in "
                         f"{' or '.join(kinds)}")


def check_side_file(path: str, what: str, force: bool) -> None:
    """A file a run writes under a name the user never gave (a side file beside the one named, a member
    of the folder named): refused where something is already there, unless `force` (and never over a
    folder, link or device)."""
    if not os.path.lexists(path):
        return
    if not force:
        raise UsageError(f"{what}: {path!r} exists, and the run would replace it (a file the run names "
                         "itself, not one you named); move it, or give --force")
    check_output_path(path, None, f"{what}: side file")


def check_folder_to_fill(path: str, what: str, force: bool) -> None:
    """A folder a run fills (atomic_dir): a new or empty one, or with `force` a non-empty one (its
    other files are kept); never a link to a folder (renaming over it fails after the run)."""
    p = Path(path)
    if p.is_symlink():
        raise UsageError(f"{what} {path!r} is a symbolic link; name the folder itself")
    if p.is_dir() and any(p.iterdir()) and not force:
        raise UsageError(f"{what} {path!r}: the folder is not empty and the run did not create it; name a new "
                         "or empty folder, or give --force to write into it (its other files are kept)")


def _inside(child: str, folder: str) -> bool:
    """Whether the resolved path `child` lies under the resolved directory `folder`."""
    return os.path.commonpath([child, folder]) == folder and child != folder


def _not_an_input(p: Path, given: str, what: str, inputs: Inputs) -> None:
    """Refuse an existing output that is an input file, or a file inside an input directory."""
    here = os.path.realpath(p)
    for option, path in inputs:
        if path is None or not os.path.exists(path):
            continue
        if os.path.samefile(p, path):  # hard links and symlinked folders included
            raise UsageError(f"{what} {given!r} is {option} {path!r}, which the run reads: writing it would "
                             "destroy that input; name another file")
        if os.path.isdir(path) and _inside(here, os.path.realpath(path)):
            raise UsageError(f"{what} {given!r} is inside {option} {path!r}, which the run reads; "
                             "name a file elsewhere")


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


def atomic_dir(path: str | os.PathLike, writer: Callable[[str], None], force: bool = False) -> list[str]:
    """A folder's twin of atomic_write: `writer` fills a temporary folder
    beside `path`, which is then renamed to `path` when `path` is new or
    empty. A non-empty folder is the user's: refused, or with `force` filled
    member by member (each renamed over its name), its other files kept;
    nothing the run did not write is deleted. Returns the members written."""
    import shutil

    p = Path(path)
    if p.is_symlink():
        raise UsageError(f"{str(path)!r} is a symbolic link; name the folder itself")
    fill = p.is_dir() and any(p.iterdir())
    if fill and not force:
        raise UsageError(f"{str(path)!r}: the folder is not empty; give --force to write into it")
    parent = p.parent if str(p.parent) else Path(".")
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{p.name}.", suffix=".tmp")
    with _lock:
        _pending.add(tmp)
    try:
        writer(tmp)
        _usual_modes(tmp)
        members = sorted(os.listdir(tmp))
        if fill:
            _fill(p, tmp, members)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            if p.is_dir():
                os.rmdir(p)  # empty: rmdir refuses if a file appeared meanwhile
            os.replace(tmp, p)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        with _lock:
            _pending.discard(tmp)
    return members


def _usual_modes(tmp: str) -> None:
    """The usual modes: mkdtemp makes 0700, and a library writing inside may make 0600 (safetensors does)."""
    os.chmod(tmp, 0o777 & ~_umask())
    for root, dirs, files in os.walk(tmp):
        for d in dirs:
            if not os.path.islink(os.path.join(root, d)):  # chmod would follow it out of the folder
                os.chmod(os.path.join(root, d), 0o777 & ~_umask())
        for f in files:
            if not os.path.islink(os.path.join(root, f)):
                os.chmod(os.path.join(root, f), 0o666 & ~_umask())


def _fill(p: Path, tmp: str, members: list[str]) -> None:
    """Rename each member of `tmp` over its name in `p`, once none of those names is a folder or link
    of the user's (a file of the same name is replaced: --force said so)."""
    for m in members:
        there = p / m
        if os.path.lexists(there) and (there.is_symlink() or there.is_dir() or os.path.isdir(Path(tmp) / m)):
            raise RunError(f"{str(p)!r}: {m!r} is there already as a folder or link; nothing was written")
    for m in members:
        os.replace(Path(tmp) / m, p / m)


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
