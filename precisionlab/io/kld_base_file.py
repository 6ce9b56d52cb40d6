"""llama.cpp's `--kl-divergence-base` file: a reference run's next-token
log-probabilities, quantised to 16 bits, as `llama-perplexity
--kl-divergence-base FILE` writes it and `--kl-divergence` reads it back.

The layout (little-endian, learned from llama.cpp's tools/perplexity):
- 8 bytes `_logits_`, then int32 n_ctx, int32 n_vocab, int32 n_chunk;
- int32 tokens[n_chunk * n_ctx]: the evaluated text, chunk after chunk. Each
  chunk is a fresh context of n_ctx tokens (llama.cpp puts BOS in place of its
  first token when the model adds one);
- per chunk, the rows of positions first .. n_ctx - 2 (first = n_ctx / 2,
  rounded down): row j gives the distribution of the token after chunk token
  first + j. A row is 2 ((n_vocab + 1) / 2) + 4 uint16: float32 scale and
  float32 min_log_prob, then one uint16 q per token (and one unused when
  n_vocab is odd); ln p = scale q + min_log_prob.

The writer quantises as llama.cpp does: the range is the row's logits from
max - 16 (or the minimum, if higher) to the max, in 65535 steps, and a token
at or below the bottom gets q = 0. Such a token's probability is known only
to be below e^-16 of the top one, so where the range was clipped the reader
gives q = 0 the log-probability -inf (no mass) rather than a made-up one,
except for the row's next token, which keeps the stored floor (llama.cpp
scores it so too); `rows(raw=True)` keeps every stored value, for
llama.cpp's own formulas.

numpy only; the header is checked against the file size before anything is
allocated, and rows are read in slices.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from precisionlab.errors import UsageError
from precisionlab.io import inputs

MAGIC = b"_logits_"
HEADER = struct.Struct("<8siii")
RANGE = 16.0          # nats below the top logit that a row keeps
STEPS = 65535.0
# A row whose range was clipped at RANGE: its scale is 16/65535 in float32
# (anything a few ulps below counts, for files from another compiler).
CLIPPED_SCALE = float(np.float32(RANGE / STEPS)) * (1 - 2.0**-20)
KIND = "llama.cpp kl-divergence-base (uint16 log-probs)"


def row_words(n_vocab: int) -> int:
    """uint16 words per row: two float32 and the values, padded to an even count."""
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_per_chunk(n_ctx: int) -> int:
    return n_ctx - 1 - n_ctx // 2


def looks_like(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


@dataclass
class KldBaseFile:
    path: str
    positions: int
    vocab: int
    n_ctx: int
    n_chunk: int
    tokens: np.ndarray            # int64: the token each row is scored on
    source_positions: np.ndarray  # int64: each row's input token's index in the chunked text
    data_offset: int
    dtype: str = KIND
    metadata: dict = field(default_factory=dict)

    def rows(self, start: int, stop: int, raw: bool = False) -> np.ndarray:
        """Rows [start, stop) as float64 log-probabilities."""
        w = row_words(self.vocab)
        with open(self.path, "rb") as f:
            f.seek(self.data_offset + 2 * w * start)
            q = np.fromfile(f, dtype="<u2", count=(stop - start) * w).reshape(stop - start, w)
        head = np.ascontiguousarray(q[:, :4]).view("<f4").astype(np.float64)  # scale, min_log_prob
        scale, low = head[:, :1], head[:, 1:2]
        vals = q[:, 4:4 + self.vocab]
        lp = scale * vals + low
        if not raw:
            tail = (vals == 0) & (scale >= CLIPPED_SCALE)
            # the next token keeps the stored floor (an upper bound, as llama.cpp
            # scores it), so a surprising token costs a large NLL, not an infinite one
            tail[np.arange(stop - start), self.tokens[start:stop]] = False
            lp[tail] = -np.inf
        return lp


def open_file(path: str, what: str) -> KldBaseFile:
    """Read and check the header and the tokens; the rows stay on disk."""
    p = inputs.check_regular_file(path, what)
    size = p.stat().st_size
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
            if len(head) < HEADER.size or head[:8] != MAGIC:
                raise UsageError(f"{what} {path!r}: not a llama.cpp kl-divergence-base file (it starts with "
                                 f"{head[:8]!r}, not {MAGIC!r})")
            _, n_ctx, n_vocab, n_chunk = HEADER.unpack(head)
            if n_ctx < 3 or n_vocab < 1 or n_chunk < 1:
                raise UsageError(f"{what} {path!r}: header n_ctx={n_ctx}, n_vocab={n_vocab}, n_chunk={n_chunk} "
                                 f"holds no scored position (n_ctx >= 3, n_vocab and n_chunk >= 1)")
            r = scored_per_chunk(n_ctx)
            data_offset = HEADER.size + 4 * n_ctx * n_chunk
            want = data_offset + 2 * row_words(n_vocab) * r * n_chunk  # Python ints: no overflow
            if size != want:
                kind = "truncated" if size < want else "longer than its header says"
                raise UsageError(f"{what} {path!r}: {kind}: n_ctx={n_ctx}, n_vocab={n_vocab}, n_chunk={n_chunk} "
                                 f"make {want} bytes, the file has {size}")
            # the text (int32 and an int64 copy), and one int64 array per row for tokens and positions
            inputs.check_memory(12 * n_ctx * n_chunk + 16 * r * n_chunk, f"{what} {path!r}")
            text = np.fromfile(f, dtype="<i4", count=n_ctx * n_chunk).astype(np.int64)
    except OSError as e:
        raise UsageError(f"{what} {path!r}: cannot read ({e.strerror})") from None
    bad = np.flatnonzero((text < 0) | (text >= n_vocab))
    if bad.size:
        i = int(bad[0])
        raise UsageError(f"{what} {path!r}: token id {int(text[i])} at text position {i} is outside the "
                         f"vocabulary of {n_vocab}")
    first = n_ctx // 2
    src = (np.arange(n_chunk)[:, None] * n_ctx + first + np.arange(r)[None, :]).reshape(-1)
    meta = {"format": KIND, "n_ctx": n_ctx, "n_chunk": n_chunk}
    return KldBaseFile(path, r * n_chunk, n_vocab, n_ctx, n_chunk, text[src + 1], src, data_offset, KIND, meta)


def quantise(logits: np.ndarray) -> np.ndarray:
    """Rows of logits (finite or -inf) as the file's uint16 rows."""
    x = np.asarray(logits, dtype=np.float64)
    n, v = x.shape
    top = np.max(x, axis=1, keepdims=True)
    bottom = np.maximum(np.min(x, axis=1, keepdims=True), top - RANGE)
    with np.errstate(under="ignore"):
        lse = np.log(np.sum(np.exp(x - top), axis=1, keepdims=True))
    scale = ((top - bottom) / STEPS).astype(np.float32)
    out = np.zeros((n, row_words(v)), dtype="<u2")
    out[:, :4] = np.concatenate([scale, (bottom - top - lse).astype(np.float32)], axis=1).view("<u2")
    s = scale.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where((x > bottom) & (s > 0), np.rint((x - bottom) / np.where(s > 0, s, 1.0)), 0.0)
    out[:, 4:4 + v] = np.clip(q, 0, STEPS).astype("<u2")
    return out


def write(path: str, src, n_ctx: int, advance=lambda k=1: None) -> dict:
    """Write logits file `src` (io.logits_file.LogitsFile) as a base file of
    chunks of n_ctx positions: chunk c holds positions c n_ctx .. (c + 1) n_ctx - 1
    of src as its text and its second half's rows. The text is the inputs:
    position k's input is the token position k - 1 was scored on; the first
    input is not in a logits file and is written as 0. A trailing part shorter
    than n_ctx is left out. Returns what was written (for the report)."""
    from precisionlab.io import outputs

    if n_ctx < 3:
        raise UsageError(f"--kld-ctx must be >= 3 (got {n_ctx}): a chunk scores positions n_ctx/2 .. n_ctx - 2")
    n_chunk = src.positions // n_ctx
    if n_chunk < 1:
        raise UsageError(f"--write-kld-base: {src.positions} positions make no chunk of n_ctx={n_ctx}")
    r, first = scored_per_chunk(n_ctx), n_ctx // 2
    inputs.check_memory(n_ctx * src.vocab * 8 * 6, "--write-kld-base")
    text = np.concatenate([[0], src.tokens[:n_chunk * n_ctx - 1]]).astype("<i4")

    def body(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(HEADER.pack(MAGIC, n_ctx, src.vocab, n_chunk))
            f.write(text.tobytes())
            for c in range(n_chunk):
                lo = c * n_ctx + first
                x = src.rows(lo, lo + r)
                if not ((np.isfinite(x) | (x == -np.inf)).all() and (x > -np.inf).any(axis=1).all()):
                    i = lo + int(np.flatnonzero(~(np.isfinite(x) | (x == -np.inf)).all(axis=1)
                                                | ~(x > -np.inf).any(axis=1))[0])
                    raise UsageError(f"--write-kld-base: position {i} has a NaN or +inf logit, or only -inf: "
                                     f"it has no distribution to store")
                f.write(quantise(x).tobytes())
                advance()

    written = outputs.atomic_write(path, body)
    return {"path": str(written), "n_ctx": n_ctx, "n_vocab": src.vocab, "n_chunk": n_chunk, "scored": r * n_chunk,
            "left_out": src.positions - n_chunk * n_ctx, "bytes": os.path.getsize(written)}
