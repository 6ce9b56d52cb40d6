"""The user's token ids for a model run (compare contracts --token-ids): a
dump's `precisionlab.token_ids` (compare layers --dump writes it), a .npy of
integers, or a text file of integers (JSON list, or separated by spaces,
commas or newlines). Read as data only: no pickle is ever loaded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from precisionlab.errors import UsageError
from precisionlab.io import inputs
from precisionlab.io.tensorfiles import TOKENS_KEY

MAX_BYTES = 64 << 20  # a text file of token ids larger than this is not one


def read(path: str, option: str = "--token-ids") -> list[int]:
    p = inputs.check_regular_file(path, option)
    suffix = p.suffix.lower()
    if suffix in (".safetensors", ".npz", ".pt", ".pth"):
        ids = _from_dump(path, option)
    elif suffix == ".npy":
        if p.stat().st_size > MAX_BYTES:
            raise UsageError(f"{option} {path}: larger than {MAX_BYTES >> 20} MiB; not an array of token ids")
        try:
            a = np.load(p, allow_pickle=False)
        except Exception as e:  # numpy raises ValueError, OSError, EOFError... for a bad file
            raise UsageError(f"{option}: cannot read {path} as .npy ({type(e).__name__}: {e})") from None
        if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu" or a.ndim != 1:
            raise UsageError(f"{option} {path}: a .npy of token ids is 1-d integers (got {a.dtype} {a.shape})")
        ids = [int(v) for v in a]
    else:
        ids = _from_text(p, option)
    if not ids:
        raise UsageError(f"{option} {path}: holds no token ids")
    if min(ids) < 0:
        raise UsageError(f"{option} {path}: a token id is negative ({min(ids)})")
    return ids


def _from_dump(path: str, option: str) -> list[int]:
    from precisionlab.io.tensorfiles import open_tensor_file

    meta = open_tensor_file(path).metadata or {}
    if TOKENS_KEY not in meta:
        raise UsageError(f"{option} {path}: no {TOKENS_KEY} in its metadata (compare layers --dump writes it)")
    try:
        ids = json.loads(meta[TOKENS_KEY])
    except (ValueError, TypeError):
        ids = None
    if not isinstance(ids, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in ids):
        raise UsageError(f"{option} {path}: its {TOKENS_KEY} is not a JSON list of integers")
    return ids


def _from_text(p: Path, option: str) -> list[int]:
    if p.stat().st_size > MAX_BYTES:
        raise UsageError(f"{option} {p}: larger than {MAX_BYTES >> 20} MiB; not a file of token ids")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{option} {p}: not UTF-8 text (give integers, a .npy or a dump)") from None
    pieces = [s for s in re.split(r"[\s,\[\]]+", text) if s]
    try:
        return [int(s) for s in pieces if re.fullmatch(r"[0-9]+", s) or _bad(s)]
    except ValueError as e:
        raise UsageError(f"{option} {p}: {e}") from None


def _bad(piece: str) -> bool:
    raise ValueError(f"{piece[:20]!r} is not a token id (a non-negative integer)")
