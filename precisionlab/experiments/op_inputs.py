"""compare op's inputs: the ops and their shapes, the generated fp32 inputs,
their low-precision copies, and the tensors a --from file gives instead."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.io import inputs
from precisionlab.runtime.torch_import import import_torch

OPS = ("softmax", "logsumexp", "rmsnorm", "layernorm", "matmul", "rope", "attention", "swiglu")
DEFAULT_SHAPES = {"softmax": (64, 4096), "logsumexp": (64, 4096), "rmsnorm": (64, 4096), "layernorm": (64, 4096),
                  "matmul": (256, 1024, 256), "rope": (64, 128), "attention": (4, 128, 64), "swiglu": (64, 4096)}
SHAPE_FORMS = {"matmul": "MxKxN", "attention": "BHxTxD"}  # the rest: ROWSxCOLS
RMS_EPS, LN_EPS = 1e-6, 1e-5
ROPE_BASE, ROPE_MAX_POS = 10000.0, 32767  # positions up to 32767: where low-precision phases go wrong


def make_inputs(op: str, shape: tuple, seed: int, device: str, scale: float = 1.0) -> tuple:
    """fp32 inputs and the op's scalar arguments. Logits get a spread of a few
    units, norm inputs an offset (so the mean matters), weights sit around 1.
    `scale` multiplies the first (data) argument."""
    torch = import_torch()
    g = torch.Generator().manual_seed(seed)
    first = [True]

    def rnd(*s):
        t = torch.randn(*s, generator=g)
        if first[0]:
            first[0] = False
            return t * scale
        return t
    if op == "matmul":
        m, k, n = shape
        return (rnd(m, k).to(device), rnd(k, n).to(device))
    if op == "attention":
        bh, t, d = shape
        # left padding 0, 0, 5, 40, ...: the padded queries see no key at all
        kv_start = torch.tensor([0 if b < 2 else min(t - 1, 5 * 8 ** (b - 2)) for b in range(bh)], dtype=torch.int32)
        return (rnd(bh, t, d).to(device), rnd(bh, t, d).to(device), rnd(bh, t, d).to(device), kv_start.to(device))
    r, c = shape
    if op == "rope":
        pos = torch.linspace(0, ROPE_MAX_POS, r).round().to(torch.int64)
        return (rnd(r, c).to(device), pos.to(device), ROPE_BASE)
    if op == "swiglu":
        return ((rnd(r, c) * 3).to(device), rnd(r, c).to(device))
    if op in ("softmax", "logsumexp"):
        return ((rnd(r, c) * 3).to(device),)
    x = (rnd(r, c) + 0.5).to(device)
    w = (1 + 0.1 * rnd(c)).to(device)
    if op == "rmsnorm":
        return (x, w, RMS_EPS)
    return (x, w, (0.1 * rnd(c)).to(device), LN_EPS)


def cast(args: tuple, dtype) -> tuple:
    """Floating tensors to dtype; positions and padding offsets stay integers."""
    torch = import_torch()
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


# Formats compare op takes as storage only: inputs rounded to them (numpy side,
# Format.round), the op computed in fp32 on the rounded values; rows (2) and
# (3) then measure what storing the inputs costs, and whether yours adds to it.
# The others of --dtype (LOW_DTYPES) are computed in.
STORAGE_DTYPES = formats.STORAGE
LOW_DTYPES = formats.OP_LOW
OUT_DTYPES = formats.COMPUTE  # what --out-dtype can declare


def _stored(args: tuple, fmt) -> tuple:
    torch = import_torch()
    return tuple(torch.from_numpy(fmt.round(a.detach().double().cpu().numpy())).to(torch.float32).to(a.device)
                 if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def low_args(args: tuple, low) -> tuple:
    """The inputs in a low dtype (bf16, fp16), or rounded to a storage format and kept in fp32."""
    return _stored(args, low) if low.name in STORAGE_DTYPES else cast(args, low.torch_dtype)


def parse_shape(op: str, text: str | None) -> tuple:
    if text is None:
        return DEFAULT_SHAPES[op]
    try:
        dims = tuple(inputs.integers(text.lower().replace(",", "x"), "x", "--shape"))
    except ValueError:
        raise UsageError(f"--shape must look like 64x4096 (got {text!r})") from None
    form = SHAPE_FORMS.get(op, "ROWSxCOLS")
    want = form.count("x") + 1
    if len(dims) != want or any(d <= 0 for d in dims):
        raise UsageError(f"--shape for {op} needs {want} positive sizes ({form}), got {text!r}")
    if op == "rope" and dims[1] % 2:
        raise UsageError(f"--shape for rope needs an even head dimension, got {dims[1]}")
    return dims


def shape_of(op: str, args: tuple) -> tuple:
    if op == "matmul":
        return (args[0].shape[0], args[0].shape[1], args[1].shape[1])
    return tuple(args[0].shape)


# The names --from files may give each argument (one unnamed tensor is the first).
ARG_NAMES = {"softmax": ("x",), "logsumexp": ("x",), "rmsnorm": ("x", "weight"), "layernorm": ("x", "weight", "bias"),
             "matmul": ("a", "b"), "rope": ("x", "positions"), "attention": ("q", "k", "v", "kv_start"),
             "swiglu": ("gate", "up")}
_INTEGER_ARGS = {"positions", "kv_start"}


@dataclass(frozen=True)
class InputsFile:
    """A --from file, its header read: the tensors it gives the op and the shape they set."""

    path: str
    file: object  # io.tensorfiles.TensorFile
    picked: dict  # argument name -> the file's tensor name
    shape: tuple  # the op's shape (matmul: M, K, N)
    nbytes_f64: int  # the picked tensors read as float64


def open_inputs_file(op: str, path: str) -> InputsFile:
    """Tensors named after the arguments (ARG_NAMES), or one tensor standing
    for the first, checked from the header before any is read: the shape the
    run states is the file's."""
    from precisionlab.io import tensorfiles

    tf = tensorfiles.open_tensor_file(path)
    names = ARG_NAMES[op]
    picked = {names[0]: tf.names[0]} if len(tf.names) == 1 else {n: n for n in names if n in tf.names}
    if names[0] not in picked:
        raise UsageError(f"--from {path}: name the tensors {', '.join(names)} (or give one tensor); "
                         f"found {', '.join(tf.names[:8])}")
    first = tuple(tf.shapes[picked[names[0]]])
    want = SHAPE_FORMS.get(op, "ROWSxCOLS").count("x") + (0 if op == "matmul" else 1)
    if len(first) != want or math.prod(first) == 0:
        raise UsageError(f"--from {path}: {names[0]} must be a non-empty {want}-D tensor for {op}, got shape {first}")
    shape = first
    if op == "matmul":
        b = tuple(tf.shapes[picked["b"]]) if "b" in picked else None
        shape = (first[0], first[1], b[1] if b is not None and len(b) == 2 else DEFAULT_SHAPES[op][2])
    nbytes = sum(8 * math.prod(tf.shapes[t]) for t in picked.values())
    return InputsFile(path, tf, picked, shape, nbytes)


def inputs_from_file(op: str, held: InputsFile, base: tuple, device: str) -> tuple:
    """The op's inputs: the file's tensors in place of the generated ones of
    the same shape (base: make_inputs at the file's shape); each must fit."""
    torch = import_torch()
    path, args = held.path, list(base)
    for i, n in enumerate(ARG_NAMES[op]):
        if n in held.picked:
            v = held.file.get(held.picked[n]).astype(np.float64)
            if n in _INTEGER_ARGS:
                _check_integers(path, n, v)
            dt = torch.int32 if n == "kv_start" else torch.int64 if n in _INTEGER_ARGS else torch.float32
            t = torch.from_numpy(np.ascontiguousarray(v)).to(dt).to(device)
            if tuple(t.shape) != tuple(args[i].shape):
                raise UsageError(f"--from {path}: {n} has shape {tuple(t.shape)}, {op} needs {tuple(args[i].shape)} here")
            args[i] = t
    return tuple(args)


def _check_integers(path: str, name: str, v: np.ndarray) -> None:
    """positions and kv_start are integers (kv_start an int32): a NaN, 1.5 or
    1e30 from a float file was cast to whatever integer the cast gave."""
    lim = 2**31 if name == "kv_start" else 2**63
    if not np.all(np.isfinite(v)) or not np.all(v == np.floor(v)) or (v.size and (v.min() < -lim or v.max() >= lim)):
        raise UsageError(f"--from {path}: {name} must hold integers in [-2^{lim.bit_length() - 1}, "
                         f"2^{lim.bit_length() - 1}), got values such as {v.ravel()[:4].tolist()}")
