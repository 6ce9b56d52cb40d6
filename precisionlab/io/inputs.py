"""Input values for the experiments: parsing, seeded distributions, .npy files,
and the memory check that runs before anything large is allocated."""

from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import UsageError

DISTS = ("uniform", "normal", "lognormal")
# The ml_dtypes formats a .npy may hold besides numpy's own kinds (bf16, fp8): the catalog's twins
_LOW_PRECISION = {formats.TWINS[n][0].name for n in ("bf16", *formats.FP8)}


# A log-probability read from a server or a file may sit above 0 by a near-certain token's rounding
# (log_softmax in fp32 of a logit near 100 is off by a few ulp, ~1e-5); up to this slack it is taken
# as 0 (a probability of 1), beyond it the value claims a probability above 1 and is refused.
# compare logprobs calls the same range "a near-certain token's rounding".
LOGPROB_SLACK = 1e-4


def logprob(v, where: str, error: type[Exception] = UsageError) -> float:
    """A log-probability from outside (a server's answer, a file) as a float: a number, not a bool,
    finite or -inf (probability 0), at most LOGPROB_SLACK above 0 (then 0.0); else `error` naming
    `where` and the value (a NaN or +50 gave a KLD of nan or inf with exit 0)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise error(f"{where}: the log-probability {str(v)[:40]!r} is not a number")
    x = float(v)
    if math.isnan(x) or x == math.inf:
        raise error(f"{where}: the log-probability is {x}, not a number a probability has")
    if x > LOGPROB_SLACK:
        raise error(f"{where}: the log-probability {x:.6g} is above 0 (a probability above 1; up to "
                    f"{LOGPROB_SLACK:g} is taken as a near-certain token's rounding)")
    return min(x, 0.0)


_INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII digits: int() also takes '١٠', '1_000' and '²'-free lookalikes


def integers(text: str, sep: str, what: str) -> list[int]:
    """'64,128' (sep ',') or '8x16x8' (sep 'x') -> the integers, every piece
    one, in ASCII decimal; ValueError naming the piece otherwise (the caller
    says which option, and what shape it wants)."""
    out = []
    for piece in text.split(sep):
        piece = piece.strip()
        if not _INTEGER.fullmatch(piece):
            raise ValueError(f"{what}: {piece!r} is not an integer")
        out.append(int(piece))
    return out


def parse_values(text: str) -> np.ndarray:
    """'1e8,1,-1e8' -> float64 array. nan/inf are accepted and kept."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or not all(parts):
        raise UsageError(f"--values needs comma-separated numbers, got {text!r}")
    try:
        return np.array([float(p) for p in parts], dtype=np.float64)
    except ValueError:
        raise UsageError(f"--values: not a number in {text!r}") from None


def check_regular_file(path: str, what: str) -> Path:
    """The path, once it names a regular file (a symlink to one is fine) that this
    user may read. A FIFO, device or socket is refused before anything opens it:
    opening a FIFO blocks until a writer comes, and /dev/zero never ends. Every
    reader of a user's file comes here first, so an unreadable one is a usage
    error naming it (exit 2), never an internal error from deep in a reader."""
    if not str(path).strip():  # Path("") is ".", a directory: say what is wrong instead
        raise UsageError(f"{what}: empty path; name a file")
    p = Path(path)
    try:
        st = os.stat(p)  # stat, not open: it never blocks
    except FileNotFoundError:
        raise UsageError(f"{what}: no such file: {path}") from None
    except OSError as e:
        raise UsageError(f"{what}: cannot read {path} ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what}: {path} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise UsageError(f"{what}: {path} is {kind}, not a regular file; give a regular file")
    try:  # readable by this user: opened (a regular file: it never blocks) and closed at once
        os.close(os.open(p, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as e:  # EACCES, EPERM (an LSM), EIO...: what the reader would meet, said now
        raise UsageError(f"{what}: cannot read {path} ({e.strerror or e})") from None
    return p


def check_text(value: str, what: str) -> str:
    """A text option (a prompt) as the user's UTF-8: bytes that are not UTF-8
    reach Python as lone surrogates, which no tokenizer, model file or JSON
    request can take; refused by position, not passed on."""
    bad = next((i for i, c in enumerate(value) if "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        byte = ord(value[bad]) - 0xDC00 if "\udc80" <= value[bad] <= "\udcff" else None
        raise UsageError(f"{what}: not UTF-8 text (" + (f"byte 0x{byte:02x}" if byte is not None else "a lone surrogate")
                         + f" at character {bad})")
    return value


def check_given(value: str | None, what: str) -> str | None:
    """An option that names something (a file, a model, a function, a format):
    None when left out; an empty string is refused, never taken for the default
    (`--impl "$IMPL"` with IMPL unset must not quietly test the built-in kernels)."""
    if value is not None and not value.strip():
        raise UsageError(f"{what} is empty; name one or leave the option out")
    return value


def load_npy(path: str, ndim: int | None = None, bytes_per_value: int = 0) -> np.ndarray:
    """A numeric .npy file as float64; ndim=None flattens, else the shape must match.

    Memory is checked from the header before anything is read: the file's
    array and its float64 copy, or bytes_per_value for each value (what the
    command then holds per value) if that is more."""
    p = check_regular_file(path, "--from")
    dtype, count = _npy_header(path)
    check_memory(max((dtype.itemsize + 8) * count, bytes_per_value * count), f"--from {path}")
    try:
        a = np.load(p, allow_pickle=False)
    except Exception as e:  # numpy raises ValueError, OSError, EOFError... for a bad file
        raise UsageError(f"--from: cannot read {path} as .npy ({type(e).__name__}: {e})") from None
    if not isinstance(a, np.ndarray) or (a.dtype.kind not in "biuf" and a.dtype.name not in _LOW_PRECISION):
        raise UsageError(f"--from: {path} does not hold a numeric array")
    if ndim is not None and a.ndim != ndim:
        raise UsageError(f"--from: {path} must be {ndim}-D, got shape {a.shape}")
    if a.size == 0:
        raise UsageError(f"--from: {path} is empty")
    a = as_float64(a, f"--from {path}")
    return a if ndim is not None else a.ravel()


def as_float64(a: np.ndarray, where: str) -> np.ndarray:
    """A numeric array as float64, refused (one line) where a value is not
    exactly a double: an int64 or uint64 past 2^53 with more than 53
    significant bits, or a long double with more bits or range. Everything
    measured downstream is measured against the values read, so a value
    rounded on the way in would be an error nobody sees."""
    a = np.asarray(a)
    f = a.astype(np.float64)
    if a.dtype.kind in "iu" and a.dtype.itemsize > 4:
        u = np.abs(a).astype(np.uint64) if a.dtype.kind == "i" else a  # |INT64_MIN| wraps to 2^63 as uint64
        low = u & (~u + np.uint64(1))  # the lowest set bit
        bad = (u > np.uint64(1 << 53)) & (u // np.maximum(low, np.uint64(1)) >= np.uint64(1 << 53))
    elif a.dtype.kind == "f" and a.dtype.itemsize > 8:
        with np.errstate(over="ignore"):
            bad = (f.astype(a.dtype) != a) & ~np.isnan(a)
    else:
        return f
    if bad.any():
        i = int(np.flatnonzero(bad.ravel())[0])
        raise UsageError(f"{where}: {a.dtype} value {a.ravel()[i]} (element {i}) is not exactly a double, "
                         f"and every result here is measured against the values as read; store them as float64 "
                         f"(or as integers within 2^53)")
    return f


def generate(n: int, dist: str, seed: int) -> np.ndarray:
    """n seeded draws: uniform [0, 1), standard normal, or lognormal(0, 1)."""
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        return rng.random(n)
    if dist == "normal":
        return rng.standard_normal(n)
    if dist == "lognormal":
        return rng.lognormal(0.0, 1.0, n)
    raise UsageError(f"unknown --dist {dist!r}; choose from {', '.join(DISTS)}")


def available_memory() -> int:
    """Bytes the OS says a new allocation can take (MemAvailable), else physical RAM."""
    kib = _proc_kib("/proc/meminfo", "MemAvailable:")
    return kib * 1024 if kib is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_limit() -> int:
    """What a run may allocate: the smaller of available RAM and the address-space limit (ulimit -v)."""
    import resource

    have = available_memory()
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        # the limit counts the address space already mapped (Python, numpy,
        # the library, torch where imported): only the rest is left to allocate
        have = min(have, max(soft - _address_space_used(), 0))
    return have


def _address_space_used() -> int:
    """This process's mapped address space (VmSize), 0 where /proc is missing."""
    kib = _proc_kib("/proc/self/status", "VmSize:")
    return 0 if kib is None else kib * 1024


def _proc_kib(path: str, key: str) -> int | None:
    """The kB figure of a /proc file's `key` line; None where /proc lacks it."""
    try:
        with open(path) as f:
            return next((int(line.split()[1]) for line in f if line.startswith(key)), None)
    except (OSError, ValueError, IndexError):
        return None


def check_memory(need: int, what: str) -> None:
    """Refuse (exit 2) before allocating when the estimated peak `need` (bytes) exceeds memory_limit()."""
    have = memory_limit()
    if need > have:
        raise UsageError(f"{what} needs about {_gib(need)} of memory, {_gib(have)} is available")


def check_n(n: int, bytes_per_element: int, what: str = "--n") -> None:
    """n must be positive and its arrays must fit in memory: checked before allocating."""
    if n <= 0:
        raise UsageError(f"{what} must be > 0, got {n}")
    check_memory(n * bytes_per_element, f"{what} {n}")


def gib(b: float) -> str:
    """Bytes as the memory messages show them: GiB to one decimal, or MiB."""
    return f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"


_gib = gib


def is_constant(x: np.ndarray) -> bool:
    """Whether the 1-D x is n copies of one finite value. A chunk at a time: no
    full-size mask, and an input that varies says so in its first chunk."""
    if x.size == 0 or not math.isfinite(x[0]):
        return False
    step = 1 << 18
    return all(bool(np.all(x[i:i + step] == x[0])) for i in range(0, x.size, step))


def parse_choices(text: str | None, allowed: tuple[str, ...], what: str) -> list[str]:
    """'a,b' -> ['a', 'b'], each one of `allowed`; None -> all of them. A list
    with no names in it ('', ',,') is a usage error, not a silent no-op."""
    if text is None:
        return list(allowed)
    out = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if not out:
        raise UsageError(f"empty {what} list {text!r}; choose from {', '.join(allowed)}")
    for s in out:
        if s not in allowed:
            raise UsageError(f"unknown {what} {s!r}; choose from {', '.join(allowed)}")
    return out


# ---------------------------------------------------------------------------
# declared sizes, read from headers before anything is loaded or decompressed


def _npy_header(f) -> tuple[np.dtype, int]:
    """(dtype, element count) from a .npy header (see npy_header)."""
    shape, dtype = npy_header(f)
    return dtype, math.prod(shape)


# ml_dtypes' one-byte floats that np.save writes with a descriptor numpy cannot
# read back (float8_e5m2's dtype.str is '<f1'): raw bytes, viewed as '|V1',
# whose format --a-dtype/--b-dtype names, as for float8_e4m3fn's '|V1'.
ONE_BYTE_FLOAT_DESCRS = ("<f1", "|f1", ">f1")


def raw_npy_header(f) -> tuple[tuple, bool, np.dtype, int]:
    """(shape, fortran_order, dtype, bytes before the data) of an open .npy
    stream at its start, read as numpy does, except that a one-byte float
    descriptor (ONE_BYTE_FLOAT_DESCRS) gives the raw dtype '|V1'."""
    import ast
    import io

    from numpy.lib import format as npy_format

    magic = f.read(8)
    version = npy_format.read_magic(io.BytesIO(magic))
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise ValueError(f"unknown .npy version {version}")
    size_bytes = f.read(2 if version == (1, 0) else 4)
    header = f.read(int.from_bytes(size_bytes, "little"))
    offset = len(magic) + len(size_bytes) + len(header)
    stream = io.BytesIO(magic + size_bytes + header)
    npy_format.read_magic(stream)
    try:
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
        else:
            shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
    except ValueError:
        d = ast.literal_eval(header.decode("latin1" if version != (3, 0) else "utf8").strip())
        if not (isinstance(d, dict) and d.get("descr") in ONE_BYTE_FLOAT_DESCRS):
            raise
        shape, fortran, dtype = tuple(d["shape"]), bool(d["fortran_order"]), np.dtype("V1")
    return shape, fortran, dtype, offset


def read_raw_npy(data: bytes) -> np.ndarray:
    """A whole .npy file's bytes as an array, a one-byte float descriptor as '|V1'."""
    import io

    shape, fortran, dtype, offset = raw_npy_header(io.BytesIO(data))
    a = np.frombuffer(data, dtype=dtype, offset=offset, count=int(np.prod(shape, dtype=np.int64)))
    return a.reshape(shape, order="F" if fortran else "C")


def npy_header(f) -> tuple[tuple, np.dtype]:
    """(shape, dtype) from a .npy header, without reading the array; f is a
    path or an open binary stream positioned at the start of the array (an
    .npz member: only its header is decompressed). Pickled (object) arrays
    are refused: they are never loaded."""
    if isinstance(f, (str, os.PathLike)):
        try:
            fh = open(f, "rb")
        except OSError as e:  # checked before (check_regular_file); a file whose mode changed since
            raise UsageError(f"{f}: cannot read ({e.strerror or e})") from None
        with fh:
            return npy_header(fh)
    name = getattr(f, "name", "the array")
    try:
        shape, _, dtype, offset = raw_npy_header(f)
    except Exception as e:  # ValueError, EOFError, OSError from a file that is not .npy
        raise UsageError(f"{name}: not a readable .npy header ({type(e).__name__}: {e})") from None
    if dtype.hasobject:
        raise UsageError(f"{name}: holds Python objects (a pickle), which are never loaded")
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise UsageError(f"{name}: its header declares shape {shape}, with a negative size")
    try:  # a file on disk: the data it declares must be there (an .npz member's stream has no size to ask)
        held = os.fstat(f.fileno()).st_size - offset
    except (AttributeError, OSError, ValueError):
        held = None
    declared = math.prod(shape) * dtype.itemsize
    if held is not None and declared > held:
        raise UsageError(f"{name}: its header declares {declared} bytes of data ({shape} of {dtype}), the file "
                         f"holds {max(held, 0)}")
    return shape, dtype


def npy_declared_bytes(path) -> int:
    """The bytes a .npy file's array takes once loaded, from its header alone
    (path: a file name or an open binary stream at the array's start)."""
    dtype, count = _npy_header(path)
    return dtype.itemsize * count


def npz_declared_bytes(path) -> int:
    """The bytes every array of a .npz takes once loaded, summed from each
    member's header before anything is decompressed: a small archive that
    expands to gigabytes is measured by what it declares, not by its size."""
    import zipfile

    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise UsageError(f"{path}: not a readable .npz ({type(e).__name__}: {e})") from None
    total = 0
    with zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            with zf.open(info) as member:  # decompresses only the header's bytes
                total += npy_declared_bytes(member)
    return total
