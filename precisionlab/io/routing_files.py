"""Router inputs from files: router-logit dumps and routed-expert traces.

- Router logits: a ``.npy`` of (tokens, experts) or (layers, tokens, experts),
  any float or integer dtype, every value finite (a NaN logit has no top-k to
  compare).
- Routed-expert traces: the expert ids each token was sent to, per MoE layer,
  as the servers document them: vLLM (`--enable-return-routed-experts`)
  returns ``routed_experts``, a [generated tokens, MoE layers, top_k] array of
  int16 ids per completion (``prompt_routed_experts`` for the prompt); SGLang
  (`return_routed_experts`) puts ``meta_info["routed_experts"]``, a base64
  string of int32 ids flattened in (token, layer, slot) order, with -1 where a
  layer has no routed expert. Read here from a ``.npy`` of (tokens, layers,
  top_k), or a ``.jsonl`` with one record per sequence holding
  ``routed_experts`` (or ``meta_info.routed_experts``) either as nested lists
  or as SGLang's base64 string (then ``--moe-shape LAYERS:TOP_K`` gives its
  shape), the sequences concatenated in order, as the log-prob streams are.
  Ids lie in 0 ... experts - 1, or are -1 (no routed expert); a ragged record
  (layers or top_k varying) is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.io import inputs

TRACE_EXTENSIONS = (".npy", ".jsonl")
JSON_MEMORY_FACTOR = 16  # bytes of parsed Python objects per byte of JSON text, at most (io/logprob_streams.py)


def read_logits(path: str, what: str = "--from") -> np.ndarray:
    """(layers, tokens, experts) float64 router logits."""
    p = inputs.check_regular_file(path, what)
    shape, _ = inputs.npy_header(p)
    if len(shape) not in (2, 3):
        raise UsageError(f"{what}: {path} must be (tokens, experts) or (layers, tokens, experts), got shape {shape}")
    inputs.check_memory(48 * int(np.prod(shape, dtype=np.int64)), f"{what} {path}")  # logits, scores, copies
    try:
        a = np.load(p, allow_pickle=False)
    except Exception as e:  # numpy raises ValueError, OSError, EOFError... for a bad file
        raise UsageError(f"{what}: cannot read {path} as .npy ({type(e).__name__}: {e})") from None
    if a.dtype.kind not in "biuf" and formats.from_numpy(a.dtype) is None:  # bf16 and fp8 dumps come as ml_dtypes
        raise UsageError(f"{what}: {path} does not hold a numeric array ({a.dtype})")
    a = inputs.as_float64(a, f"{what} {path}")
    a = a[None] if a.ndim == 2 else a
    if 0 in a.shape:
        raise UsageError(f"{what}: {path} is empty (shape {a.shape})")
    bad = ~np.isfinite(a)
    if bad.any():
        i = np.unravel_index(int(np.flatnonzero(bad)[0]), a.shape)
        raise UsageError(f"{what}: {path} holds a non-finite router logit ({a[i]} at layer {i[0]}, token {i[1]}, "
                         f"expert {i[2]}): a NaN or infinite logit has no top-k to compare")
    return a


def read_traces(path: str, experts: int, what: str, moe_shape: tuple[int, int] | None = None) -> np.ndarray:
    """(tokens, layers, top_k) int64 routed-expert ids, every id in 0 ... experts - 1."""
    p = inputs.check_regular_file(path, what)
    ext = p.suffix.lower()
    if ext == ".npy":
        shape, _ = inputs.npy_header(p)
        inputs.check_memory(16 * int(np.prod(shape, dtype=np.int64)), f"{what} {path}")
        try:
            a = np.load(p, allow_pickle=False)
        except Exception as e:
            raise UsageError(f"{what}: cannot read {path} as .npy ({type(e).__name__}: {e})") from None
        if a.dtype.kind not in "iu":
            raise UsageError(f"{what}: {path} must hold integer expert ids, got {a.dtype}")
        arrays = [a]
    elif ext == ".jsonl":
        inputs.check_memory(JSON_MEMORY_FACTOR * p.stat().st_size, f"{what} {path}")
        arrays = list(_jsonl_traces(p, what, moe_shape))
    else:
        raise UsageError(f"{what}: {path}: a trace is {' or '.join(TRACE_EXTENSIONS)}")
    if not arrays:
        raise UsageError(f"{what}: {path} holds no traces")
    for a in arrays:
        if a.ndim != 3 or 0 in a.shape:
            raise UsageError(f"{what}: {path}: a trace is (tokens, layers, top_k) with none empty, got shape {a.shape}")
    if len({a.shape[1:] for a in arrays}) > 1:
        raise UsageError(f"{what}: {path} is ragged: (layers, top_k) varies between sequences "
                         f"({', '.join(sorted({str(a.shape[1:]) for a in arrays}))})")
    out = np.concatenate(arrays).astype(np.int64)
    bad = (out < -1) | (out >= experts)
    if bad.any():
        t, layer, j = np.unravel_index(int(np.flatnonzero(bad)[0]), out.shape)
        raise UsageError(f"{what}: {path}: expert id {out[t, layer, j]} at token {t}, layer {layer} is out of range "
                         f"0 ... {experts - 1}")
    return out


def _jsonl_traces(p: Path, what: str, moe_shape):
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            at = f"{what}: {p} line {n}"
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise UsageError(f"{at}: not JSON ({e})") from None
            ids = None
            if isinstance(rec, dict):
                meta = rec.get("meta_info")
                ids = rec.get("routed_experts", meta.get("routed_experts") if isinstance(meta, dict) else None)
            if ids is None:
                raise UsageError(f"{at}: no routed_experts (nor meta_info.routed_experts)")
            if isinstance(ids, str):
                yield _base64_ids(ids, moe_shape, at)
                continue
            try:
                a = np.array(ids)
            except ValueError:  # numpy refuses an inhomogeneous nesting
                raise UsageError(f"{at}: routed_experts is ragged (layers or top_k vary between tokens)") from None
            if a.dtype == object or (a.size and a.dtype.kind not in "iu"):
                raise UsageError(f"{at}: routed_experts must be a (tokens, layers, top_k) list of integer ids")
            yield a


def _base64_ids(text: str, moe_shape, at: str) -> np.ndarray:
    """SGLang's payload: int32 ids, base64, flattened (token, layer, slot)."""
    import base64
    import binascii

    if moe_shape is None:
        raise UsageError(f"{at}: routed_experts is a base64 string (SGLang's); give its shape with "
                         "--moe-shape LAYERS:TOP_K")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise UsageError(f"{at}: routed_experts is not base64 ({e})") from None
    per_token = moe_shape[0] * moe_shape[1]
    if len(raw) % 4 or (len(raw) // 4) % per_token:
        raise UsageError(f"{at}: routed_experts holds {len(raw)} bytes, not whole tokens of {moe_shape[0]} layers x "
                         f"{moe_shape[1]} int32 ids")
    return np.frombuffer(raw, dtype="<i4").reshape(-1, *moe_shape)
