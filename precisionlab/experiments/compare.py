"""compare op: the three-comparison discipline, and compare tensors: two dumps,
tensor by tensor.

For an op and a low-precision dtype L:
  (1) yours fp32 vs trusted fp32   is your implementation right?
  (2) trusted L  vs trusted fp32   what the precision itself costs
  (3) yours L    vs trusted L      should be about as close as (2)
and, as the yardstick for (1), (0) trusted fp32 vs trusted fp64: what fp32 costs.
"Trusted" is torch, with its TF32 switches set off explicitly (and reported).
"""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from precisionlab import devices, formats, metrics, threads
from precisionlab.errors import RunError, UsageError

# (3) more than this many times (2), or (1) more than this many times (0), is
# flagged. A correct kernel and torch make rounding choices of the same size as
# the format itself, so the ratio sits near 1 (0 to ~2 for this project's
# kernels); an accumulator in the low format, or a real bug, lands 10x and
# beyond. 4 leaves room for honest differences in reduction order without
# hiding either.
RATIO_THRESHOLD = 4.0

OPS = ("softmax", "logsumexp", "rmsnorm", "layernorm", "matmul")
DEFAULT_SHAPES = {"softmax": (64, 4096), "logsumexp": (64, 4096), "rmsnorm": (64, 4096), "layernorm": (64, 4096),
                  "matmul": (256, 1024, 256)}
RMS_EPS, LN_EPS = 1e-6, 1e-5


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
    threads: int | None = None  # torch CPU threads; None: sized for the op (precisionlab.threads)


@dataclass
class CompareResult:
    params: dict
    rows: list[dict]
    flags: dict = field(default_factory=dict)
    takeaways: list[str] = field(default_factory=list)
    any_failed: bool = False


def _torch():
    import torch

    return torch


def trusted(op: str):
    torch = _torch()
    F = torch.nn.functional
    return {
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "logsumexp": lambda x: torch.logsumexp(x, dim=-1),
        "rmsnorm": lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
        "layernorm": lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
        "matmul": lambda a, b: a @ b,
    }[op]


def make_inputs(op: str, shape: tuple, seed: int, device: str) -> tuple:
    """fp32 inputs and the op's scalar arguments. Logits get a spread of a few
    units, norm inputs an offset (so the mean matters), weights sit around 1."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g)
    if op == "matmul":
        m, k, n = shape
        return (rnd(m, k).to(device), rnd(k, n).to(device))
    r, c = shape
    if op in ("softmax", "logsumexp"):
        return ((rnd(r, c) * 3).to(device),)
    x = (rnd(r, c) + 0.5).to(device)
    w = (1 + 0.1 * rnd(c)).to(device)
    if op == "rmsnorm":
        return (x, w, RMS_EPS)
    return (x, w, (0.1 * rnd(c)).to(device), LN_EPS)


def _cast(args: tuple, dtype) -> tuple:
    torch = _torch()
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) else a for a in args)


def parse_shape(op: str, text: str | None) -> tuple:
    if text is None:
        return DEFAULT_SHAPES[op]
    try:
        dims = tuple(int(p) for p in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise UsageError(f"--shape must look like 64x4096 (got {text!r})") from None
    want = 3 if op == "matmul" else 2
    if len(dims) != want or any(d <= 0 for d in dims):
        raise UsageError(f"--shape for {op} needs {want} positive sizes ({'MxKxN' if want == 3 else 'ROWSxCOLS'}), "
                         f"got {text!r}")
    return dims


def load_impl(spec: str):
    """'package.module:function' -> the callable; the current directory is importable."""
    if ":" not in spec:
        raise UsageError(f"--impl must be package.module:function (got {spec!r})")
    mod_name, fn_name = spec.rsplit(":", 1)
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # ImportError, or the module's own error while importing
        raise UsageError(f"--impl: cannot import {mod_name} ({type(e).__name__}: {e})") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise UsageError(f"--impl: {mod_name} has no callable {fn_name}")
    return fn


def compare_op(cfg: CompareOpConfig, advance=lambda k=1: None) -> CompareResult:
    threads.check(cfg.threads)
    with threads.torch_scope():
        return _compare_op(cfg, advance)


def op_flops(op: str, shape: tuple) -> float:
    """Floating-point operations of one call of `op` on `shape`, roughly: what sizes its thread count."""
    if op == "matmul":
        m, k, n = shape
        return 2.0 * m * k * n
    rows, cols = shape
    return 10.0 * rows * cols  # a few passes over the row: max, exp, sum, scale


def _compare_op(cfg: CompareOpConfig, advance) -> CompareResult:
    op = cfg.op.lower()
    if op not in OPS:
        raise UsageError(f"unknown op {cfg.op!r}; choose from {', '.join(OPS)}")
    shape = parse_shape(op, cfg.shape)
    lows = [formats.get(d) for d in cfg.dtypes.split(",") if d.strip()]
    for f in lows:
        if f.name not in ("bf16", "fp16"):
            raise UsageError(f"--dtype must be bf16 and/or fp16 (got {f.name})")
    if not lows:
        raise UsageError("empty --dtype")
    plan = devices.resolve(cfg.device)
    torch = _torch()
    threads.fit_torch(cfg.threads, op_flops(op, shape))
    from precisionlab import torch_ops
    from precisionlab.experiments.tf32 import restored_flags, torch_flags

    yours = load_impl(cfg.impl) if cfg.impl else getattr(torch_ops, op)
    ref = trusted(op)
    rows: list[dict] = []
    fp32 = formats.get("fp32")
    with restored_flags():
        torch.backends.cuda.matmul.allow_tf32 = False  # trusted fp32 is IEEE fp32, stated
        torch.backends.cudnn.allow_tf32 = False
        flags = torch_flags()
        for dev in plan.names:
            args = make_inputs(op, shape, cfg.seed, dev)
            t32 = ref(*args)
            t64 = ref(*_cast(args, torch.float64))
            y32 = _call(yours, args, cfg.impl)
            rtol, atol = _tols(fp32, cfg)
            row0 = _row(op, dev, "fp32", 0, "trusted fp32 vs trusted fp64",
                        metrics.error_report(_np(t32), _np(t64), fp32, atol, rtol), shape)
            row0["verdict"] = "the cost of fp32: the yardstick for (1)"
            row1 = _row(op, dev, "fp32", 1, "yours fp32 vs trusted fp32",
                        metrics.error_report(_np(y32), _np(t32), fp32, atol, rtol), shape)
            _judge(row1, row0, "fp32")
            rows += [row0, row1]
            advance()
            for low in lows:
                tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[low.name]
                largs = _cast(args, tdt)
                tl = ref(*largs)
                yl = _call(yours, largs, cfg.impl)
                rtol, atol = _tols(low, cfg)
                r2 = metrics.error_report(_np(tl), _np(t32), low, atol, rtol)
                r3 = metrics.error_report(_np(yl), _np(tl), low, atol, rtol)
                rows.append(_row(op, dev, low.name, 2, "trusted low vs trusted fp32", r2, shape))
                rows.append(_row(op, dev, low.name, 3, "yours low vs trusted low", r3, shape))
                _verdict(row1, rows[-2], rows[-1])
                advance()
    return CompareResult(
        params={"op": op, "shape": list(shape), "dtypes": [f.name for f in lows], "impl": cfg.impl or "precisionlab",
                "device": cfg.device, "seed": cfg.seed, "ratio_threshold": RATIO_THRESHOLD,
                "atol": cfg.atol, "rtol": cfg.rtol, "cuda_unavailable": plan.cuda_unavailable or None},
        rows=rows, flags=flags, takeaways=_takeaways(rows, cfg.impl), any_failed=any(r["flagged"] for r in rows))


def _tols(fmt, cfg) -> tuple[float, float]:
    rtol, atol = metrics.default_tolerances(fmt)
    return (cfg.rtol if cfg.rtol is not None else rtol), (cfg.atol if cfg.atol is not None else atol)


def _call(fn, args, impl):
    try:
        return fn(*args)
    except (UsageError, RunError):
        raise
    except Exception as e:
        who = impl or "precisionlab"
        raise RunError(f"{who} raised {type(e).__name__}: {e}") from None


def _np(t) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def _row(op, dev, dtype, idx, label, rep: metrics.ErrorReport, shape) -> dict:
    return {"op": op, "device": dev, "dtype": dtype, "comparison": idx, "label": label, "shape": list(shape),
            **rep.as_dict(), "ratio": None, "flagged": False, "verdict": ""}


def _ratio(got: dict, base: dict) -> float:
    if not got["finite"]:
        return math.inf
    if base["rel_l2"] > 0:
        return got["rel_l2"] / base["rel_l2"]
    return 0.0 if got["rel_l2"] == 0 else math.inf


def _judge(row: dict, base: dict, dtype: str) -> None:
    """(1) against (0), and (3) against (2): flagged above RATIO_THRESHOLD.

    Elementwise tolerances are reported (outside tol) but do not decide: two
    correct fp32 matmuls at K = 1024 already differ by more than torch's fp32
    atol where the result cancels, because a reduction's error scales with
    sum |terms|, not with |result|."""
    ratio = _ratio(row, base)
    row["ratio"] = ratio
    row["flagged"] = ratio > RATIO_THRESHOLD
    n = 0 if row["comparison"] == 1 else 2
    text = f"({row['comparison']}) is {ratio:.2f}x ({n})"
    if not row["flagged"]:
        row["verdict"] = f"{text}: as close as the precision allows"
    elif row["comparison"] == 1:
        row["verdict"] = (f"{text}: your fp32 path loses more than fp32 itself costs: a bug, or an "
                          "accumulation far less accurate than torch's")
    else:
        row["verdict"] = (f"{text}: above {RATIO_THRESHOLD:g}x, a likely bug or a bad accumulation choice "
                          f"(accumulating in {dtype}?)")


def _verdict(r1: dict, r2: dict, r3: dict) -> None:
    r2["verdict"] = "the cost of the format"
    _judge(r3, r2, r3["dtype"])
    if r1["flagged"]:
        r3["flagged"] = True
        r3["verdict"] += "; (1) already fails: fix the fp32 path first"


def _takeaways(rows, impl) -> list[str]:
    who = impl or "this project's kernels"
    flagged = [r for r in rows if r["flagged"]]
    if not flagged:
        return [f"{who}: every comparison within {RATIO_THRESHOLD:g}x of what the precision itself costs."]
    return [f"{who}: {r['device']} {r['dtype']}: {r['verdict']}" for r in flagged if r["comparison"] in (1, 3)]


# ---------------------------------------------------------------------------
# compare tensors

LOADABLE = (".npy", ".npz", ".pt", ".pth", ".safetensors")


def load_tensors(path: str) -> dict[str, tuple[np.ndarray, str]]:
    """name -> (float64 values, dtype name). A single-tensor file holds one
    tensor named 'tensor'."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such file: {path}")
    if p.is_dir():
        raise UsageError(f"{path} is a directory, not a tensor file")
    ext = p.suffix.lower()
    if ext not in LOADABLE:
        raise UsageError(f"{path}: unsupported extension {ext!r} (use {', '.join(LOADABLE)})")
    try:
        if ext == ".npy":
            return {"tensor": _from_np(np.load(p, allow_pickle=False))}
        if ext == ".npz":
            with np.load(p, allow_pickle=False) as z:
                return {k: _from_np(z[k]) for k in z.files}
        if ext == ".safetensors":
            from safetensors.torch import load_file

            return {k: _from_torch(v) for k, v in load_file(str(p)).items()}
        return _load_pt(p)
    except UsageError:
        raise
    except Exception as e:
        raise UsageError(f"cannot read {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def _load_pt(p: Path) -> dict:
    import warnings

    torch = _torch()
    try:
        with warnings.catch_warnings():  # torch warns about odd pickles before refusing them
            warnings.simplefilter("ignore")
            obj = torch.load(p, map_location="cpu", weights_only=True)  # never unpickle arbitrary objects
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(f"{p}: refused or unreadable .pt (weights_only=True): {msg}") from None
    if isinstance(obj, torch.Tensor):
        return {"tensor": _from_torch(obj)}
    if isinstance(obj, dict) and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return {str(k): _from_torch(v) for k, v in obj.items()}
    raise UsageError(f"{p}: holds a {type(obj).__name__}, not a tensor or a dict of tensors")


def _from_np(a: np.ndarray) -> tuple[np.ndarray, str]:
    if a.dtype.kind not in "biuf" and a.dtype.name not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        raise UsageError(f"non-numeric array of dtype {a.dtype}")
    return a.astype(np.float64), a.dtype.name


def _from_torch(t) -> tuple[np.ndarray, str]:
    if t.is_complex():
        raise UsageError(f"complex tensors are not compared (dtype {t.dtype})")
    return t.detach().to(_torch().float64).cpu().numpy(), str(t.dtype).removeprefix("torch.")


_DTYPE_TO_FORMAT = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
                    "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


@dataclass
class CompareTensorsConfig:
    a: str
    b: str
    only: str | None = None
    atol: float | None = None
    rtol: float | None = None


def compare_tensors(cfg: CompareTensorsConfig) -> CompareResult:
    ta, tb = load_tensors(cfg.a), load_tensors(cfg.b)
    names = list(dict.fromkeys([*ta, *tb]))
    if cfg.only is not None:
        if cfg.only not in names:
            raise UsageError(f"--only {cfg.only!r}: no such tensor in either file")
        names = [cfg.only]
    rows = []
    for name in names:
        row = {"name": name, "status": "", "shape_a": None, "shape_b": None, "dtype_a": None, "dtype_b": None,
               "passed": False}
        if name not in ta or name not in tb:
            row["status"] = f"missing in {'A' if name not in ta else 'B'}"
            rows.append(row)
            continue
        (a, da), (b, db) = ta[name], tb[name]
        row.update(shape_a=list(a.shape), shape_b=list(b.shape), dtype_a=da, dtype_b=db)
        if a.shape != b.shape:
            row["status"] = "shape mismatch"
            rows.append(row)
            continue
        fmt_name = _DTYPE_TO_FORMAT.get(da)
        fmt = formats.get(fmt_name) if fmt_name else None
        rtol, atol = metrics.default_tolerances(fmt) if fmt else (0.0, 0.0)
        rtol = cfg.rtol if cfg.rtol is not None else rtol
        atol = cfg.atol if cfg.atol is not None else atol
        rep = metrics.error_report(a, b, fmt, atol, rtol)
        row.update(rep.as_dict())
        row["status"] = ("ok" if rep.passed else "fail") + ("" if da == db else f" (dtype {da} vs {db})")
        rows.append(row)
    failed = any(not r["passed"] for r in rows)
    n_ok = sum(r["passed"] for r in rows)
    return CompareResult(params={"a": cfg.a, "b": cfg.b, "only": cfg.only, "atol": cfg.atol, "rtol": cfg.rtol},
                         rows=rows, takeaways=[f"{n_ok} of {len(rows)} tensors within tolerance."], any_failed=failed)
