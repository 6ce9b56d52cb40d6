"""Tensor files from any engine, read lazily: names, shapes and dtypes first
(from headers, so memory is checked before anything large is read), values one
tensor at a time.

Formats: .npy (one tensor, named 'tensor'), .npz (members in archive order),
.safetensors (execution order from this tool's dumps, else natural order),
.pt/.pth (torch.load with weights_only=True; nested dicts, lists and tuples
flattened to dotted names, in container order). Nothing here unpickles
objects: .npy/.npz with allow_pickle=False, .pt with weights_only=True.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.errors import PrecisionLabError, UsageError

LOADABLE = (".npy", ".npz", ".pt", ".pth", ".safetensors")

# numpy dtype name -> precisionlab format name (formats.py). Integers and bools
# are exact: they have no format and compare with zero tolerance.
# The formats torch and numpy (with ml_dtypes) both hold, by their dtype name
# (the same in both): formats.TWINS, the one dtype map.
DTYPE_TO_FORMAT = {dt.name: name for name, (dt, torch_name, _) in formats.TWINS.items() if torch_name}
_NP_DTYPES = {dt.name: dt for dt, _, _ in formats.TWINS.values()}
# Raw ml_dtypes arrays saved with np.save come back as void bytes ('|V2'): a
# two-byte void is bf16 (fp16 has its own descriptor); one byte needs --X-dtype.
_VOID = {2: "bf16"}  # raw 2-byte values: bf16 (numpy has no dtype of its own for it)
_FP8 = formats.FP8  # raw 1-byte values: as --a-dtype/--b-dtype says

# Metadata keys of the dumps `compare model --dump` writes.
ORDER_KEY, TOKENS_KEY = "precisionlab.order", "precisionlab.token_ids"


@dataclass
class TensorFile:
    path: str
    names: list[str]                       # display order (see `ordered`)
    shapes: dict[str, tuple]
    dtypes: dict[str, str]                 # numpy dtype name of the stored values
    order_recorded: bool                   # the file says in which order its tensors were made
    metadata: dict = field(default_factory=dict)
    _get: Callable[[str], np.ndarray] | None = None
    skipped: list[str] = field(default_factory=list)  # non-tensor leaves of a .pt container

    def get(self, name: str) -> np.ndarray:
        try:
            return self._get(name)
        except PrecisionLabError:  # the library missing, say: its own message, not the data's
            raise
        except Exception as e:
            raise UsageError(f"cannot read {name!r} from {self.path}: {type(e).__name__}: {_first_line(e)}") from None

    def nbytes(self, name: str) -> int:
        return int(np.prod(self.shapes[name], dtype=np.int64)) * np.dtype(_np_dtype(self.dtypes[name])).itemsize


def _first_line(e: Exception) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else ""


def _np_dtype(name: str):
    return _NP_DTYPES.get(name) or np.dtype(name)


def natural_key(name: str):
    """'layers.2' before 'layers.10': digit runs compare as numbers."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p != ""]


def open_tensor_file(path: str, void_dtype: str | None = None) -> TensorFile:
    p = inputs.check_regular_file(path, "tensor file")
    ext = p.suffix.lower()
    if ext not in LOADABLE:
        raise UsageError(f"{path}: unsupported extension {ext!r} (use {', '.join(LOADABLE)})")
    try:
        if ext == ".npy":
            tf = _open_npy(p, void_dtype)
        elif ext == ".npz":
            tf = _open_npz(p, void_dtype)
        elif ext == ".safetensors":
            tf = _open_safetensors(p)
        else:
            tf = _open_pt(p)
    except PrecisionLabError:  # a usage error said already, or the library's own (never "cannot read" the data)
        raise
    except Exception as e:
        raise UsageError(f"cannot read {path}: {type(e).__name__}: {_first_line(e)}") from None
    if not tf.names:  # two empty dumps would otherwise "agree": 0 of 0 compared, exit 0
        raise UsageError(f"{path}: holds no tensors")
    return tf


# --- .npy / .npz: headers first ------------------------------------------------


def _dtype_name(dtype: np.dtype, void_dtype: str | None, where: str) -> str:
    if dtype.kind == "V" and not dtype.names:
        if void_dtype in _FP8 and dtype.itemsize == 1:
            return formats.get(void_dtype).dtype.name
        if dtype.itemsize in _VOID:
            return formats.get(_VOID[dtype.itemsize]).dtype.name
        raise UsageError(f"{where}: raw {dtype.itemsize}-byte values; say which format with "
                         "--a-dtype/--b-dtype fp8_e4m3|fp8_e5m2")
    if dtype.kind not in "biuf" and dtype.name not in DTYPE_TO_FORMAT:
        raise UsageError(f"{where}: non-numeric array of dtype {dtype}")
    return dtype.name


def _as_named(a: np.ndarray, name: str) -> np.ndarray:
    want = _np_dtype(name)
    return a.view(want) if a.dtype != want and a.dtype.kind == "V" else a


def _open_npy(p: Path, void_dtype) -> TensorFile:
    with open(p, "rb") as fp:
        shape, dtype = inputs.npy_header(fp)
    dname = _dtype_name(dtype, void_dtype, str(p))

    def get(_name):
        if dtype == np.dtype("V1"):  # '|V1', or a one-byte float numpy cannot read back: the raw bytes
            with open(p, "rb") as fh:
                return _as_named(inputs.read_raw_npy(fh.read()), dname)
        return _as_named(np.load(p, mmap_mode="r", allow_pickle=False), dname)

    return TensorFile(str(p), ["tensor"], {"tensor": shape}, {"tensor": dname}, False, {}, get)


def _open_npz(p: Path, void_dtype) -> TensorFile:
    """One ZipFile for the file's life: opening the archive reads its whole
    central directory, so opening it again for each member made reading N
    members cost N^2 (10,000 small members: no result in 600 s)."""
    shapes, dtypes, names, raw, members = {}, {}, [], {}, {}
    z = zipfile.ZipFile(p)
    try:
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                continue
            name = info.filename[:-4]
            with z.open(info) as fp:  # reads the header only: the declared size, before decompressing
                shape, dtype = inputs.npy_header(fp)
            names.append(name)
            shapes[name] = shape
            dtypes[name] = _dtype_name(dtype, void_dtype, f"{p}:{name}")
            raw[name] = dtype == np.dtype("V1")
            members[name] = info
    except BaseException:
        z.close()
        raise

    def get(name):
        with z.open(members[name]) as fp:  # by its directory entry: no lookup, no second directory read
            if raw[name]:  # a one-byte float numpy cannot read back: the raw bytes
                return _as_named(inputs.read_raw_npy(fp.read()), dtypes[name])
            return _as_named(np.lib.format.read_array(fp, allow_pickle=False), dtypes[name])

    return TensorFile(str(p), names, shapes, dtypes, True, {}, get)


# --- .safetensors ----------------------------------------------------------------

_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
              "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
              "BOOL": "bool"}


def _open_safetensors(p: Path) -> TensorFile:
    from safetensors import safe_open

    with safe_open(str(p), framework="numpy") as f:
        meta = dict(f.metadata() or {})
        keys = list(f.keys())
        shapes, dtypes = {}, {}
        for k in keys:
            sl = f.get_slice(k)
            st_dtype = sl.get_dtype()
            if st_dtype not in _ST_DTYPES:
                raise UsageError(f"{p}: tensor {k!r} has dtype {st_dtype}, which is not compared")
            shapes[k], dtypes[k] = tuple(sl.get_shape()), _ST_DTYPES[st_dtype]
    names, recorded = sorted(keys, key=natural_key), False
    order = meta.get(ORDER_KEY)
    if order:
        try:
            listed = [n for n in json.loads(order) if n in shapes]
        except (ValueError, TypeError):
            listed = []
        if listed:
            names = listed + [n for n in names if n not in set(listed)]
            recorded = True

    def get(name):
        if dtypes[name] in _ST_RAW:  # safetensors' numpy side has no fp8: its bytes, viewed through ml_dtypes
            return _safetensors_raw(p, name, _NP_DTYPES[dtypes[name]])
        with safe_open(str(p), framework="numpy") as f:
            return f.get_tensor(name)

    return TensorFile(str(p), names, shapes, dtypes, recorded, meta, get)


_ST_RAW = tuple(formats.TWINS[n][0].name for n in formats.FP8)


def _safetensors_raw(p: Path, name: str, dtype: np.dtype) -> np.ndarray:
    """One tensor's bytes from the file (8-byte little-endian header length,
    the JSON header, then the data at its offsets), as `dtype`."""
    with open(p, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        info = json.loads(fh.read(n))[name]
        start, end = info["data_offsets"]
        fh.seek(8 + n + start)
        data = fh.read(end - start)
    return np.frombuffer(data, dtype=dtype).reshape(info["shape"]).copy()


# --- .pt -----------------------------------------------------------------------------


def _open_pt(p: Path) -> TensorFile:
    import warnings

    import torch

    from precisionlab.catalog import formats
    from precisionlab.io import inputs

    # A .pt is read whole: its tensors plus their float64 copies, one at a time, bound the peak.
    inputs.check_memory(p.stat().st_size * 2, f"reading {p}")
    try:
        with warnings.catch_warnings():  # torch warns about odd pickles before refusing them
            warnings.simplefilter("ignore")
            obj = torch.load(p, map_location="cpu", weights_only=True)  # never unpickle arbitrary objects
    except Exception as e:
        raise UsageError(f"{p}: refused or unreadable .pt (weights_only=True): {_first_line(e) or type(e).__name__}") \
            from None
    flat: dict[str, object] = {}
    skipped: list[str] = []
    _flatten(obj, "", flat, skipped)
    if not flat:
        raise UsageError(f"{p}: holds no tensors (a {type(obj).__name__})")
    shapes, dtypes = {}, {}
    for k, t in flat.items():
        if t.is_complex():
            raise UsageError(f"{p}: {k!r} is complex ({t.dtype}); complex tensors are not compared")
        shapes[k] = tuple(t.shape)
        dtypes[k] = str(t.dtype).removeprefix("torch.")
        if dtypes[k] not in DTYPE_TO_FORMAT and t.is_floating_point():
            raise UsageError(f"{p}: {k!r} has dtype {t.dtype}, which is not compared")

    def get(name):
        return formats.torch_to_numpy(flat[name])  # bf16 and fp8: the bits, viewed through ml_dtypes

    return TensorFile(str(p), list(flat), shapes, dtypes, True, {}, get, skipped)


def _flatten(obj, prefix: str, out: dict, skipped: list) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        out[prefix or "tensor"] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out, skipped)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flatten(v, f"{prefix}.{i}" if prefix else str(i), out, skipped)
    else:
        skipped.append(prefix or type(obj).__name__)
