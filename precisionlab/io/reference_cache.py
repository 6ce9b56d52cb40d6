"""The reference's logits kept between runs: compare engine pays the fp32
reference once per model, text and settings, then reads it from here.

An entry lives in $PRECISIONLAB_REFERENCE_CACHE, else under $PRECISIONLAB_CACHE
(default ~/.cache/precisionlab)/reference/, as <sha256>.npz, named by the hash of its key. The key is what
decides the numbers before the reference is loaded: the model's identity
(its spec and, for every file the spec names, path, size and modification
time: the tokenizer and the weights are files of the folder), the text's
sha256 and the positions asked, the prompt, --chat and the steps (for the
greedy part's entry only: the teacher-forced logits do not read them), the
dtype, the device, torch's version and threads. The token ids are not in the key
because computing them needs the reference's tokenizer, which a hit is meant
not to load; they are in the entry, and follow from text and model files.
Entries are numpy archives read with allow_pickle=False (never code), written
atomically (io/outputs.py); a file that cannot be read is a miss.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

SCHEMA = 1


def cache_dir() -> Path:
    """The folder of the entries: $PRECISIONLAB_REFERENCE_CACHE where set (the tests' own folder), else
    reference/ under the llama tools' cache root, as scripts/build_llama_tools.sh finds it."""
    if os.environ.get("PRECISIONLAB_REFERENCE_CACHE"):
        return Path(os.environ["PRECISIONLAB_REFERENCE_CACHE"])
    root = os.environ.get("PRECISIONLAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "precisionlab")
    return Path(root) / "reference"


def _files_of(path: Path) -> list[list]:
    """[relative name, size, mtime_ns] of path, or of every file under it (sorted)."""
    if path.is_file():
        st = path.stat()
        return [[str(path), st.st_size, st.st_mtime_ns]]
    out = []
    for p in sorted(path.rglob("*")):
        if p.is_file():
            st = p.stat()
            out.append([str(p.relative_to(path)), st.st_size, st.st_mtime_ns])
    return out


def model_identity(spec: str, own_files: list[Path] = ()) -> dict:
    """The spec and the files it names (PREFIX:PATH[,k=v]): a rewritten weight or tokenizer file misses.
    A spec naming no file (the embedded model) is identified by `own_files`, the files that make it
    (the caller's: this room knows no engine)."""
    _prefix, colon, rest = spec.partition(":")
    path = Path(rest.split(",")[0]) if colon else None
    if path is not None and rest and path.exists():
        return {"spec": spec, "files": _files_of(path.resolve())}
    return {"spec": spec, "files": [f for p in own_files for f in _files_of(Path(p).resolve())]}


def key(identity: dict, **settings) -> str:
    """sha256 of the identity and the settings (text digest, tokens, prompt, steps, dtype, device, ...)."""
    blob = json.dumps({"schema": SCHEMA, "model": identity, **settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load(k: str) -> tuple[dict, dict] | None:
    """(meta, arrays) of entry k, or None (absent, unreadable, or written under another key)."""
    import numpy as np

    path = cache_dir() / f"{k}.npz"
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except (OSError, ValueError, KeyError, EOFError):
        return None
    try:
        meta = json.loads(bytes(arrays.pop("_meta")).decode("utf-8"))
    except (KeyError, ValueError):
        return None
    return (meta, arrays) if meta.get("key") == k else None


def store(k: str, meta: dict, arrays: dict) -> Path | None:
    """Write entry k; None where the cache folder cannot be written (the run goes on without it). The
    meta (the reference's info: its name) with a URL's secrets masked, as every file the tool writes."""
    import numpy as np

    from precisionlab.io.outputs import atomic_write
    from precisionlab.io.urls import masked

    buf = io.BytesIO()
    blob = json.dumps(masked({**meta, "key": k}), default=str).encode("utf-8")
    np.savez(buf, _meta=np.frombuffer(blob, dtype=np.uint8), **arrays)
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        return atomic_write(cache_dir() / f"{k}.npz", buf.getvalue())
    except OSError:
        return None


def compact(rows):
    """float64 rows as float32 where that is exact (an fp32 reference's are), else as they are."""
    import numpy as np

    rows = np.asarray(rows)
    narrow = rows.astype(np.float32)
    return narrow if np.array_equal(narrow.astype(rows.dtype), rows, equal_nan=True) else rows
