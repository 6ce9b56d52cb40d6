"""Logits files: one run's next-token logits over a text, from this tool or any
engine, in the plain safetensors layout `compare logits` reads.

Layout (two tensors; any others are ignored):
- `logits`: 2-D, (positions, vocab), F64, F32, F16 or BF16. Row i is the
  model's logits after reading the text's tokens up to and including input i.
- `tokens`: 1-D integer (any signed or unsigned width), length = positions.
  tokens[i] is the token that followed input i: the one row i is scored on.

Metadata (optional, strings): `precisionlab` writes `dtype` (the run's),
`model`, `text`, `window` and `noise_sigma`; nothing reads it back for maths.

numpy + ml_dtypes only (no torch), so reading a file from another engine
needs nothing heavy. Rows are read in slices, so a long run with a large
vocabulary never has to fit in memory at once in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, which safetensors' numpy side needs)
import numpy as np

from precisionlab.errors import UsageError
from precisionlab.io import inputs, urls

LOGITS, TOKENS = "logits", "tokens"
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
INT_DTYPES = ("I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64")


def write(path: str, logits: np.ndarray, tokens: np.ndarray, metadata: dict[str, str]) -> None:
    """Write atomically: a temporary file in the same folder, then os.replace,
    so a reader never sees half a file and a failure leaves the old one. The metadata (a model's
    spec, a text's path) as io.urls.recorded writes it: a URL's secrets masked."""
    from safetensors.numpy import save_file

    from precisionlab.io import outputs

    arrays = {LOGITS: np.ascontiguousarray(logits), TOKENS: np.ascontiguousarray(tokens, dtype=np.int64)}
    outputs.atomic_write(path, lambda tmp: save_file(arrays, tmp, metadata=urls.recorded(metadata)))


@dataclass
class LogitsFile:
    path: str
    positions: int
    vocab: int
    dtype: str           # safetensors' name: F32, BF16, ...
    tokens: np.ndarray   # int64, validated against vocab
    metadata: dict

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as float64 (exact for every accepted dtype)."""
        from safetensors import safe_open

        with safe_open(self.path, framework="np") as f:
            return np.asarray(f.get_slice(LOGITS)[start:stop], dtype=np.float64)


def open_file(path: str, what: str, run_bytes_per_position: int = 0):
    """Read and check a file's layout; a bad file is a usage error naming it.
    run_bytes_per_position: what the run will hold for each position besides
    the tokens, counted in the check made from the header.
    A llama.cpp kl-divergence-base file (its magic, or a .kld name) is read by
    io.kld_base_file, with the same attributes and rows()."""
    from safetensors import safe_open

    from precisionlab.io import kld_base_file

    inputs.check_regular_file(path, what)
    if kld_base_file.looks_like(path) or path.lower().endswith(".kld"):
        return kld_base_file.open_file(path, what)
    try:
        with safe_open(path, framework="np") as f:
            keys = set(f.keys())
            meta = dict(f.metadata() or {})
            missing = [k for k in (LOGITS, TOKENS) if k not in keys]
            if missing:
                raise UsageError(f"{what} {path!r}: no {' or '.join(repr(m) for m in missing)} tensor "
                                 f"(a logits file holds 'logits' (positions x vocab) and 'tokens' (positions))")
            ls, ts = f.get_slice(LOGITS), f.get_slice(TOKENS)
            lshape, ldtype = list(ls.get_shape()), ls.get_dtype()
            tshape, tdtype = list(ts.get_shape()), ts.get_dtype()
            if len(lshape) != 2 or ldtype not in FLOAT_DTYPES:
                raise UsageError(f"{what} {path!r}: 'logits' must be 2-D {'/'.join(FLOAT_DTYPES)}, "
                                 f"got {ldtype} of shape {lshape}")
            if len(tshape) != 1 or tdtype not in INT_DTYPES:
                raise UsageError(f"{what} {path!r}: 'tokens' must be 1-D integer, got {tdtype} of shape {tshape}")
            if tshape[0] != lshape[0]:
                raise UsageError(f"{what} {path!r}: {lshape[0]} logit rows but {tshape[0]} tokens")
            if lshape[0] == 0 or lshape[1] == 0:
                raise UsageError(f"{what} {path!r}: 'logits' is empty (shape {lshape})")
            # from the header, before the tokens are read: the array, its int64
            # copy and the range check's masks (a header may declare 512M positions),
            # and what the caller's run holds per position
            width = int(tdtype[1:]) // 8 if tdtype[0] in "IU" else 8
            inputs.check_memory(tshape[0] * (width + 8 + 3 + run_bytes_per_position),
                                f"{what} {path!r} ({tshape[0]} positions)")
            tokens = f.get_tensor(TOKENS)
    except UsageError:
        raise
    except Exception as e:  # SafetensorError, OSError, a header that is not JSON...
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"{what} {path!r}: not a readable safetensors file ({msg})") from None
    bad = np.flatnonzero((tokens < 0) | (tokens >= lshape[1]))
    if bad.size:
        i = int(bad[0])
        raise UsageError(f"{what} {path!r}: token id {int(tokens[i])} at position {i} is outside the "
                         f"vocabulary of {lshape[1]}")
    return LogitsFile(path, lshape[0], lshape[1], ldtype, tokens.astype(np.int64), meta)


@dataclass
class Selected:
    """Some positions of a logits file, in the order given: a full run seen
    through a kl-divergence-base file's chunks (the rows it scores)."""

    inner: LogitsFile
    index: np.ndarray

    def __post_init__(self):
        self.path, self.vocab, self.dtype, self.metadata = (self.inner.path, self.inner.vocab, self.inner.dtype,
                                                            self.inner.metadata)
        self.positions = self.index.size
        self.tokens = self.inner.tokens[self.index]

    def rows(self, start: int, stop: int) -> np.ndarray:
        lo, hi = int(self.index[start]), int(self.index[stop - 1]) + 1  # increasing: one read, then picked
        return self.inner.rows(lo, hi)[self.index[start:stop] - lo]


def align(ref, other, what: str):
    """`other` as rows of ref's positions: itself, or where REF is a base file
    and `other` a whole run (as many positions as the chunks' text or more),
    the rows the base file scores."""
    src = getattr(ref, "source_positions", None)
    if src is None or other.positions == ref.positions or hasattr(other, "source_positions"):
        return other
    if other.positions <= int(src[-1]):
        raise UsageError(f"{what} {other.path!r} has {other.positions} positions; REF's {ref.n_chunk} chunks of "
                         f"n_ctx={ref.n_ctx} score positions up to {int(src[-1])} (or give exactly its "
                         f"{ref.positions} scored rows)")
    return Selected(other, src)


def check_pair(ref, yours, what: str = "YOURS") -> None:
    """The two files must score the same tokens over the same vocabulary."""
    if ref.vocab != yours.vocab:
        raise UsageError(f"vocabulary sizes differ: REF has {ref.vocab} logits per position, {what} {yours.vocab} "
                         f"(first at position 0)")
    n = min(ref.positions, yours.positions)
    diff = np.flatnonzero(ref.tokens[:n] != yours.tokens[:n])
    if diff.size:
        i = int(diff[0])
        raise UsageError(f"token ids differ first at position {i}: REF {int(ref.tokens[i])}, "
                         f"{what} {int(yours.tokens[i])}")
    if ref.positions != yours.positions:
        raise UsageError(f"REF has {ref.positions} positions, {what} {yours.positions}: they differ first at "
                         f"position {n}")
