"""compare op: the three-comparison discipline (compare tensors lives in
experiments/tensors.py; both judge by numerics/compare.py's rules).

For an op and a low-precision dtype L:
  (1) yours fp32 vs trusted fp32   is your implementation right?
  (2) trusted L  vs trusted fp32   what the precision itself costs
  (3) yours L    vs trusted L      should be about as close as (2)
and, as the yardstick for (1), (0) trusted fp32 vs trusted fp64: what fp32 costs.
"Trusted" is torch, with its TF32 switches set off explicitly (and reported).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from precisionlab.report.output import Rows
from precisionlab.runtime import devices, memory, threads, torch_flags
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.numerics import compare as comparison, metrics
from precisionlab.errors import RunError, UsageError
from precisionlab.experiments import op_accumulator, op_diagnosis, op_harness
from precisionlab.runtime.torch_import import import_torch

OPS = ("softmax", "logsumexp", "rmsnorm", "layernorm", "matmul", "rope", "attention", "swiglu")
DEFAULT_SHAPES = {"softmax": (64, 4096), "logsumexp": (64, 4096), "rmsnorm": (64, 4096), "layernorm": (64, 4096),
                  "matmul": (256, 1024, 256), "rope": (64, 128), "attention": (4, 128, 64), "swiglu": (64, 4096)}
SHAPE_FORMS = {"matmul": "MxKxN", "attention": "BHxTxD"}  # the rest: ROWSxCOLS
RMS_EPS, LN_EPS = 1e-6, 1e-5
ROPE_BASE, ROPE_MAX_POS = 10000.0, 32767  # positions up to 32767: where low-precision phases go wrong


@dataclass
class CompareOpConfig:
    op: str
    shape: str | None = None
    dtypes: str = "bf16,fp16"
    impl: str | None = None
    device: str = "auto"
    seed: int = 0
    atol: float | None = None
    rtol: float | None = None
    cases: str | None = None      # 'all' (default) or a comma list: op_harness.cases_for(op)
    masked: str = "nan"           # softmax/logsumexp: what a row of all -inf gives
    scale: float = 1.0            # multiplies the random inputs
    out_dtype: str | None = None  # the dtype your low-precision output is declared to have
    from_file: str | None = None  # inputs from a .npy / .pt / .safetensors file
    threads: int | None = None  # torch CPU threads; None: sized for the op (precisionlab.runtime.threads)
    accumulators: str | None = None  # matmul: MODEL[,MODEL...], rows (4) and (5) (experiments/op_accumulator.py)
    acc_bits: int | None = None      # --acc-bits, --acc-rounding: accumulators.parse_option
    acc_rounding: str | None = None


@dataclass
class CompareResult(Rows):
    contracts: list[dict] = field(default_factory=list)
    advice: list[dict] = field(default_factory=list)
    causes: list[dict] = field(default_factory=list)  # op_diagnosis: one a cause, with its cases
    contract_violation: str | None = None  # the first output-contract row, as one line


def trusted(op: str):
    torch = import_torch()
    F = torch.nn.functional
    return {
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "logsumexp": lambda x: torch.logsumexp(x, dim=-1),
        "rmsnorm": lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
        "layernorm": lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
        "matmul": lambda a, b: a @ b,
        "rope": _trusted_rope,
        "attention": _trusted_attention,
        "swiglu": lambda gate, up: F.silu(gate) * up,
    }[op]


def _trusted_rope(x, pos, base):
    """Hugging Face's Llama RoPE: fp32 (fp64 for an fp64 x) inv_freq and
    angles, cos/sin cast to x's dtype, rotate-half in x's dtype."""
    torch = import_torch()
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.shape[-1] // 2
    inv = 1.0 / (base ** (torch.arange(0, x.shape[-1], 2, dtype=wide, device=x.device) / x.shape[-1]))
    ang = pos.to(wide)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


def attention_mask(tq: int, tk: int, kv_start, device):
    """bh x tq x tk visibility: causal (queries are the last tq positions) and
    key j >= kv_start[b] (left padding)."""
    torch = import_torch()
    i = torch.arange(tq, device=device)[:, None]
    j = torch.arange(tk, device=device)[None, :]
    causal = j <= i + (tk - tq)
    return causal[None] & (j[None] >= kv_start.to(device).long()[:, None, None])


def _trusted_attention(q, k, v, kv_start):
    """torch's scaled_dot_product_attention with the same mask; a query that
    sees no key gets zeros (SDPA gives NaN there), as engines write."""
    torch = import_torch()
    mask = attention_mask(q.shape[1], k.shape[1], kv_start, q.device)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=q.shape[-1] ** -0.5)
    return torch.where(mask.any(-1, keepdim=True), out, torch.zeros((), dtype=out.dtype, device=out.device))


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


def _cast(args: tuple, dtype) -> tuple:
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


def _low_args(args: tuple, low) -> tuple:
    """The inputs in a low dtype (bf16, fp16), or rounded to a storage format and kept in fp32."""
    return _stored(args, low) if low.name in STORAGE_DTYPES else _cast(args, low.torch_dtype)


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


@contextlib.contextmanager
def _users_code():
    """What the user's module prints goes to stderr: stdout is the table or,
    under --json, the JSON document alone (a print() there broke it). File
    descriptor 1 too, for what bypasses sys.stdout (a C extension's printf,
    os.write(1, ...), a child process): it points at stderr meanwhile, and C's
    buffered output is flushed before it is put back."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # fd 1 closed: nothing to keep clean
        saved = None
    try:
        if saved is not None:
            os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            _flush_c_stdio()
            os.dup2(saved, 1)
            os.close(saved)


def _flush_c_stdio() -> None:
    """fflush(NULL): what C code buffered for fd 1 is written while it still points at stderr."""
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to ask: nothing of its is buffered
        pass


def load_impl(spec: str):
    """'package.module:function' -> the callable; the current directory is importable."""
    if ":" not in spec:
        raise UsageError(f"--impl must be package.module:function (got {spec!r})")
    mod_name, fn_name = spec.rsplit(":", 1)
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        with _users_code():
            mod = importlib.import_module(mod_name)
    except Exception as e:  # ImportError, or the module's own error while importing
        raise UsageError(f"--impl: cannot import {mod_name} ({type(e).__name__}: {e})") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise UsageError(f"--impl: {mod_name} has no callable {fn_name}")
    return fn


def compare_op(cfg: CompareOpConfig, advance=lambda k=1: None) -> CompareResult:
    comparison.check_override(cfg.rtol, cfg.atol)
    return threads.scoped(cfg.threads, _compare_op, cfg, advance)


def op_flops(op: str, shape: tuple) -> float:
    """Floating-point operations of one call of `op` on `shape`, roughly: what sizes its thread count."""
    if op == "matmul":
        m, k, n = shape
        return 2.0 * m * k * n
    if op == "attention":
        bh, t, d = shape
        return 4.0 * bh * t * t * d
    rows, cols = shape
    return 10.0 * rows * cols  # a few passes over the row: max, exp, sum, scale


def _compare_op(cfg: CompareOpConfig, advance) -> CompareResult:
    op = cfg.op.lower()
    if op not in OPS:
        raise UsageError(f"unknown op {cfg.op!r}; choose from {', '.join(OPS)}")
    if cfg.shape is not None and cfg.from_file:  # the file's tensors give the shape
        raise UsageError("--shape and --from: the file's tensors give the shape; give one")
    held = open_inputs_file(op, cfg.from_file) if cfg.from_file else None
    shape = parse_shape(op, cfg.shape if held is None else "x".join(map(str, held.shape)))
    models = op_accumulator.plan(op, cfg.accumulators, cfg.acc_bits, cfg.acc_rounding)
    case_shapes, contract_shape = op_harness.shapes_used(op, shape)
    inputs.check_memory(memory.compare_op(op, shape, case_shapes, contract_shape)
                        + op_accumulator.peak_bytes(models, (shape, *case_shapes))
                        + (0 if held is None else held.nbytes_f64),
                        f"compare op {op} {'--shape' if held is None else '--from, shape'} {'x'.join(map(str, shape))}")
    lows = [formats.get(d) for d in formats.parse_list(cfg.dtypes, LOW_DTYPES, "--dtype")]  # no repeated rows
    if cfg.masked not in ("nan", "zero"):
        raise UsageError(f"--masked must be nan or zero (got {cfg.masked!r})")
    if not (math.isfinite(cfg.scale) and cfg.scale != 0):
        raise UsageError(f"--scale must be finite and non-zero (got {cfg.scale})")
    out_dtype = formats.get(formats.parse_one(cfg.out_dtype, OUT_DTYPES, "--out-dtype")) if cfg.out_dtype else None
    cases = op_harness.select(op, cfg.cases, from_file=held is not None)
    plan = devices.resolve(cfg.device)
    torch = import_torch()
    threads.fit_torch(cfg.threads, op_flops(op, shape))
    from precisionlab.numerics import torch_ops

    yours = load_impl(cfg.impl) if cfg.impl else getattr(torch_ops, op)
    if not cfg.impl and op in ("softmax", "logsumexp"):  # the project's kernels follow --masked; yours say theirs
        yours = functools.partial(yours, masked=cfg.masked)
    ref = _policy(trusted(op), op, cfg.masked)
    rows: list[dict] = []
    contract_rows: list[dict] = []
    advice: list[dict] = []
    fp32 = formats.get("fp32")
    skipped: list[str] = []  # cases whose inputs the accumulator models cannot take
    feats: dict = {}  # case -> what op_diagnosis reads of its inputs (the same on every device)
    with torch_flags.ieee_fp32():  # trusted fp32 is IEEE fp32, stated
        flags = torch_flags.torch_flags()
        for dev in plan.names:
            base = make_inputs(op, shape, cfg.seed, dev, scale=cfg.scale)
            if held is not None:
                base = inputs_from_file(op, held, base, dev)
            for case in cases:
                args = case.build(base, shape, cfg.seed)
                cshape = _shape_of(op, args)
                feats.setdefault(case.name, op_diagnosis.features(op, args))
                t32 = ref(*args)
                t64 = ref(*_cast(args, torch.float64))
                y32 = _call_case(yours, args, cfg.impl, case)
                rtol, atol = _tols(fp32, cfg)
                row0 = _compare_row(op, dev, case, fp32, 0, "trusted fp32 vs trusted fp64", t32, t64, atol, rtol, cshape)
                row0["verdict"] = "the cost of fp32: the yardstick for (1)"
                row1 = _compare_row(op, dev, case, fp32, 1, "yours fp32 vs trusted fp32", y32, t32, atol, rtol, cshape,
                                    expect=(out_dtype or fp32).torch_dtype if out_dtype else torch.float32)
                if not row1["flagged"]:
                    _judge(row1, row0, "fp32")
                rows += [row0, row1]
                rows += _model_rows(models, op, dev, case, fp32, args, y32, row1, t32.dtype, cshape, cfg, skipped)
                advance()
                for low in lows:
                    largs = _low_args(args, low)
                    tl = ref(*largs)
                    yl = _call_case(yours, largs, cfg.impl, case)
                    rtol, atol = _tols(low, cfg)
                    r2 = _compare_row(op, dev, case, low, 2, "trusted low vs trusted fp32", tl, t32, atol, rtol, cshape)
                    r3 = _compare_row(op, dev, case, low, 3, "yours low vs trusted low", yl, tl, atol, rtol, cshape,
                                      expect=out_dtype.torch_dtype if out_dtype else tl.dtype)
                    rows += [r2, r3]
                    rows += _model_rows(models, op, dev, case, low, largs, yl, r3, tl.dtype, cshape, cfg, skipped)
                    r2["verdict"] = "the cost of the format"
                    if not r3["flagged"]:
                        _verdict(row1, r2, r3)
                    if case in op_harness.BASES and not r3["flagged"]:
                        advice.append(_advice(op, dev, low, args, largs, yl, tl))
                    advance()
            for name in ["fp32"] + [f.name for f in lows]:
                big, take = op_harness.batched_inputs(op, shape, cfg.seed, dev, make_inputs)
                for c in op_harness.contracts(yours, lambda f, a: _call(f, a, cfg.impl),
                                              _low_args(big, formats.get(name)), take, name):
                    c["device"] = dev
                    c["flagged"] = not c["passed"]
                    contract_rows.append(c)
                advance()
    any_failed = any(r["flagged"] for r in rows) or any(c["flagged"] for c in contract_rows)
    causes = op_diagnosis.diagnose(op, rows, feats, cfg.impl or "this project's kernels")
    broken = next((r for r in rows if r["verdict"].startswith("output contract: ")), None)
    return CompareResult(
        params={"op": op, "shape": list(shape), "dtypes": [f.name for f in lows], "impl": cfg.impl or "precisionlab",
                "device": cfg.device, "seed": cfg.seed, "ratio_threshold": comparison.RATIO_THRESHOLD,
                "atol": cfg.atol, "rtol": cfg.rtol, "masked": cfg.masked, "scale": cfg.scale,
                "out_dtype": out_dtype.name if out_dtype else None, "from": cfg.from_file,
                "cases": {c.name: c.what for c in cases}, "batch_sizes": list(op_harness.BATCH_SIZES),
                "cuda_unavailable": plan.cuda_unavailable or None,
                "accumulators": [m.name for m in models] or None},
        rows=rows, flags=flags, takeaways=_takeaways(rows, causes, cfg.impl) + _contract_takeaways(contract_rows)
        + op_accumulator.takeaways(rows, skipped),
        any_failed=any_failed, contracts=contract_rows, advice=advice, causes=causes,
        contract_violation=None if broken is None else
        f"{cfg.impl or 'precisionlab'} {broken['verdict'].removeprefix('output contract: ')} "
        f"(case {broken['case']}, {broken['dtype']})")


def _model_rows(models, op, dev, case, fmt, args, yours, yours_row, out_dtype, cshape, cfg, skipped) -> list[dict]:
    """Rows (4) and (5) of each --accumulator model (experiments/op_accumulator.py)."""
    if not models:
        return []
    broken = yours_row["verdict"].startswith("output contract: ")  # flagged already; nothing to compare

    def row(idx, label, got, want, atol, rtol):
        return _compare_row(op, dev, case, fmt, idx, label, got, want, atol, rtol, cshape)

    out, finite = op_accumulator.rows(models, args, None if broken else yours, out_dtype, row, _tols(fmt, cfg),
                                      fmt.name)
    if not finite:
        skipped.append(case.name)
    return out


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


@dataclass(frozen=True)
class _Raised:
    """What a call of yours raised on an edge case: a flagged row, not an abort."""

    message: str


def _call_case(fn, args, impl, case):
    """On the random case a kernel that raises ends the run (exit 1, one line);
    on an edge case the exception is that case's flagged row."""
    if case in op_harness.BASES:
        return _call(fn, args, impl)
    try:
        return _call(fn, args, impl)
    except RunError as e:
        return _Raised(str(e))


def _policy(fn, op: str, masked: str):
    """softmax and logsumexp under --masked zero: a row of all -inf gives
    zeros (log-sum-exp -inf) instead of the textbook NaN."""
    if masked == "nan" or op not in ("softmax", "logsumexp"):
        return fn

    def wrapped(x):
        torch = import_torch()
        y = fn(x)
        dead = torch.isneginf(x).all(-1)
        if op == "softmax":
            return torch.where(dead[..., None], torch.zeros((), dtype=y.dtype, device=y.device), y)
        return torch.where(dead, torch.full((), -math.inf, dtype=y.dtype, device=y.device), y)
    return wrapped


def _shape_of(op: str, args: tuple) -> tuple:
    if op == "matmul":
        return (args[0].shape[0], args[0].shape[1], args[1].shape[1])
    return tuple(args[0].shape)


def _compare_row(op, dev, case, fmt, idx, label, got, want, atol, rtol, shape, expect=None) -> dict:
    """One comparison of `got` against `want`. When `expect` (the dtype the
    output must have) is given, a result that is not a tensor of want's shape
    and that dtype is a flagged row with the reason, not an error. Non-finite
    reference values must be matched (the same NaN or infinity: torch's
    equal_nan, numerics.compare's rule); the finite rest is measured as usual."""
    problem = op_harness.output_problem(got, want, expect) if expect is not None else None
    if isinstance(got, _Raised):
        problem = got.message
    if problem is not None:
        row = _row(op, dev, fmt.name, idx, label, metrics.error_report(np.zeros(0), np.zeros(0), fmt, atol, rtol), shape)
        row.update(case=case.name, flagged=True, ratio=math.inf, verdict=f"output contract: {problem}",
                   rel_l2=math.nan, max_abs_error=math.nan, nonfinite_pattern_mismatch=None)
        return row
    g, w = _np(got), _np(want)
    m = comparison.Measured(g, w, fmt, rtol, atol, equal_nan=True)
    rep, keep, mismatch = m.report, m.kept, m.mismatch
    row = _row(op, dev, fmt.name, idx, label, rep, shape)
    row["rel_l2"] = m.rel_l2
    if rep.worst_index is not None:  # an index into the kept elements, flattened: back to the output's own
        flat = int(np.flatnonzero(keep.ravel())[rep.worst_index[0]])
        row["worst_index"] = [int(i) for i in np.unravel_index(flat, g.shape)]
    row.update(case=case.name, reference_nonfinite=m.reference_nonfinite, nonfinite_pattern_mismatch=mismatch)
    if mismatch and idx in (1, 3):
        row.update(flagged=True, ratio=math.inf,
                   verdict=f"{mismatch} element(s) non-finite where the reference is not, or finite where it is not")
    return row


def _advice(op, dev, low, args, largs, yl, tl) -> dict:
    g, w = _np(yl), _np(tl)
    out = {"device": dev, "dtype": low.name, "comparison": 3, **op_harness.advise(g, w)}
    if op == "matmul":
        out.update(op_harness.matmul_bound(_np(largs[0]), _np(largs[1]), g, low.unit_roundoff))
    return out


def _contract_takeaways(contract_rows) -> list[str]:
    out = []
    for c in contract_rows:
        if c["flagged"] and c["contract"] == "batch_invariance":
            out.append(f"{c['device']} {c['dtype']}: not batch-invariant: a row's bits change first at batch size "
                       f"{c['first_batch_changed']} ({c['detail']})")
        elif c["flagged"]:
            out.append(f"{c['device']} {c['dtype']}: not deterministic: {c['detail']}")
    return out


def _tols(fmt, cfg) -> tuple[float, float]:
    return comparison.resolve(fmt.name, cfg.rtol, cfg.atol)


def _call(fn, args, impl):
    try:
        with _users_code():
            return fn(*args)
    except (UsageError, RunError):
        raise
    except SystemExit as e:  # an implementation may not end the run for us
        raise RunError(f"{impl or 'precisionlab'} called sys.exit({e.code!r})") from None
    except Exception as e:
        who = impl or "precisionlab"
        raise RunError(f"{who} raised {type(e).__name__}: {e}") from None


def _np(t) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def _row(op, dev, dtype, idx, label, rep: metrics.ErrorReport, shape) -> dict:
    return {"op": op, "device": dev, "dtype": dtype, "comparison": idx, "label": label, "shape": list(shape),
            **rep.as_dict(), "ratio": None, "flagged": False, "verdict": ""}


def _judge(row: dict, base: dict, dtype: str) -> None:
    """(1) against (0), and (3) against (2): numerics.compare's verdict, in words.

    Elementwise tolerances are reported (outside tol) but do not decide: two
    correct fp32 matmuls at K = 1024 already differ by more than torch's fp32
    atol where the result cancels, because a reduction's error scales with
    sum |terms|, not with |result|."""
    ratio, row["flagged"] = comparison.judge(row["rel_l2"], base["rel_l2"])
    row["ratio"] = ratio
    n = 0 if row["comparison"] == 1 else 2
    text = f"({row['comparison']}) is {ratio:.2f}x ({n})"
    if not row["flagged"]:
        row["verdict"] = f"{text}: as close as the precision allows"
    elif row["comparison"] == 1:
        row["verdict"] = (f"{text}: your fp32 path loses more than fp32 itself costs: a bug, or an "
                          "accumulation far less accurate than torch's")
    else:
        row["verdict"] = (f"{text}: above {comparison.RATIO_THRESHOLD:g}x what {dtype} itself costs (the cause, "
                          "read across the cases, is below the table)")


def _verdict(r1: dict, r2: dict, r3: dict) -> None:
    r2["verdict"] = "the cost of the format"
    _judge(r3, r2, r3["dtype"])
    if r1["flagged"]:
        r3["flagged"] = True
        r3["verdict"] += "; (1) already fails: fix the fp32 path first"


def _takeaways(rows, causes, impl) -> list[str]:
    """One line a cause (op_diagnosis), naming its cases; the all-clear when nothing is flagged."""
    who = impl or "this project's kernels"
    if not any(r["flagged"] for r in rows):
        return [f"{who}: every comparison within {comparison.RATIO_THRESHOLD:g}x of what the precision itself costs."]
    return [c["text"] for c in causes]
