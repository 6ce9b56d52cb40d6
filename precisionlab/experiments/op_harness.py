"""compare op's harness: the inputs that find bugs, the contracts engines rely
on, and the tolerance a comparison would need.

- CASES: for each op, named inputs beside the random one: the ones a kernel
  gets wrong (large and shifted logits for a softmax that never subtracts the
  max, masked and non-finite rows, squares that overflow or underflow a
  16-bit accumulator, a long K, sums that cancel, long RoPE positions, fully
  masked attention rows). Each case gets the three comparisons.
- Outputs whose reference is non-finite (a NaN logit, a masked row under the
  nan policy) are checked for the same non-finite pattern, and the finite rest
  is compared as usual: torch.testing's equal_nan, said in the row.
- contracts(): batch invariance (op(x)[i] against op(x[i:i+1]) bit for bit,
  batch sizes 1 ... 1024) and determinism (10 calls, one bit pattern).
- advise(): the smallest atol (at rtol 0) and rtol (at atol 0) under which a
  comparison passes; for matmul the a-priori bound gamma_K |A||B| beside the
  observed error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from precisionlab.errors import UsageError
from precisionlab.runtime.torch_import import import_torch

BATCH_SIZES = (1, 2, 3, 8, 64, 257, 1024)
DETERMINISM_CALLS = 10
VOCAB = 151936
LONG_ROW = 16384  # norms' long_rows: 4x the default row, the length step op_diagnosis' accumulation rule reads


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    build: Callable  # (random_args, shape, seed) -> fp32 args; random_args is op_inputs.make_inputs' tuple


def _with_first(args: tuple, x) -> tuple:
    return (x,) + tuple(args[1:])


def _rows_set(x, rows, value):
    x = x.clone()
    x[rows] = value
    return x


def _logsumexp_cases() -> list[Case]:
    # Not the masked and non-finite rows: there the conventions differ, not
    # the precision (torch gives log 0 = -inf for a masked row and +inf for a
    # row holding +inf; the shifted textbook formula this project's kernels
    # follow gives NaN for both, as the softmax command documents).
    return [c for c in _softmax_cases() if c.name not in ("masked_rows", "non_finite")]


def _softmax_cases() -> list[Case]:
    t = import_torch
    g = lambda seed: t().Generator().manual_seed(seed + 1)

    def vocab(args, shape, seed):
        return ((t().randn(2, VOCAB, generator=g(seed)) * 3).to(args[0].device),)

    def non_finite(args, shape, seed):
        x = args[0].clone()
        r = x.shape[0]
        x[0, 0] = math.nan
        x[min(1, r - 1), -1] = math.inf
        x[min(2, r - 1), 1 % x.shape[1]] = -math.inf
        return (x,)

    def partly(args, shape, seed):
        x = args[0].clone()
        x[:, : max(1, x.shape[1] // 2)] = -math.inf
        return (x,)

    return [
        Case("large", "logits x100 (|x| up to ~400): exp overflows without the max subtracted",
             lambda a, s, seed: _with_first(a, a[0] * (100 / 3))),
        Case("shifted", "logits + 100: every exp overflows unless shifted",
             lambda a, s, seed: _with_first(a, a[0] + 100)),
        Case("very_negative", "logits - 1000: every exp underflows unless shifted",
             lambda a, s, seed: _with_first(a, a[0] - 1000)),
        Case("masked_rows", "rows 0 and the last all -inf (the --masked policy decides)",
             lambda a, s, seed: _with_first(a, _rows_set(a[0], [0, a[0].shape[0] - 1], -math.inf))),
        Case("partly_masked", "the first half of every row -inf", partly),
        Case("non_finite", "a NaN, a +inf and a -inf logit in rows 0, 1, 2", non_finite),
        Case("vocab", f"two rows of {VOCAB} (a Qwen vocabulary)", vocab),
    ]


def _norm_cases() -> list[Case]:
    def zero_row(args, shape, seed):
        return _with_first(args, _rows_set(args[0], [0], 0.0))

    def long_rows(args, shape, seed):
        # the random case's distributions (x ~ N(0.5, 1), weight ~ 1 + 0.1 N, bias ~ 0.1 N) at another length
        gen = import_torch().Generator().manual_seed(seed + 4)
        dev = args[0].device
        rnd = lambda *s: import_torch().randn(*s, generator=gen).to(dev)
        out = (rnd(2, LONG_ROW) + 0.5, 1 + 0.1 * rnd(LONG_ROW))
        return out + ((0.1 * rnd(LONG_ROW),) if len(args) == 4 else ()) + (args[-1],)

    return [
        Case("large_scale", "x * 3000: squares near 1e8 overflow a 16-bit accumulator",
             lambda a, s, seed: _with_first(a, a[0] * 3000)),
        Case("tiny_scale", "x * 1e-4: squares near 1e-8 underflow fp16",
             lambda a, s, seed: _with_first(a, a[0] * 1e-4)),
        Case("zero_row", "row 0 all zeros: eps alone keeps the division finite", zero_row),
        Case("long_rows", f"two rows of {LONG_ROW}: a long sum of squares (an accumulator kept in 16 bits stalls)",
             long_rows),
    ]


def _matmul_cases() -> list[Case]:
    t = import_torch

    def long_k(args, shape, seed):
        gen = t().Generator().manual_seed(seed + 2)
        dev = args[0].device
        return (t().randn(16, 16384, generator=gen).to(dev), t().randn(16384, 16, generator=gen).to(dev))

    def cancelling(args, shape, seed):
        a, b = args
        k2 = max(1, a.shape[1] // 2)
        a = t().cat([a[:, :k2], a[:, :k2]], dim=1)
        gen = t().Generator().manual_seed(seed + 3)
        noise = t().randn(k2, b.shape[1], generator=gen).to(b.device) * 1e-3
        b = t().cat([b[:k2], -b[:k2] + noise], dim=0)
        return (a, b)

    return [
        Case("long_k", "16 x 16384 @ 16384 x 16: a long accumulation", long_k),
        Case("cancelling", "A = [X, X], B = [Y; -Y + 1e-3 noise]: the result cancels to 1e-3 of its terms",
             cancelling),
    ]


def _rope_cases() -> list[Case]:
    t = import_torch

    def positions(lo, hi):
        def build(args, shape, seed):
            pos = t().linspace(lo, hi, args[0].shape[0]).round().to(t().int64).to(args[1].device)
            return (args[0], pos, args[2])
        return build

    return [
        Case("short_positions", "positions 0 ... 63", positions(0, 63)),
        Case("long_positions", "positions 32704 ... 32767: low-precision phases are wrong here",
             positions(32704, 32767)),
    ]


def _attention_cases() -> list[Case]:
    t = import_torch

    def all_masked(args, shape, seed):
        q, k, v, ks = args
        return (q, k, v, t().full_like(ks, k.shape[1]))

    return [
        Case("large_scores", "q x 20: scores in the hundreds, exp overflows unless shifted",
             lambda a, s, seed: (a[0] * 20,) + tuple(a[1:])),
        Case("all_masked", "every key padded: every query sees none (zeros)", all_masked),
    ]


def _swiglu_cases() -> list[Case]:
    return [
        Case("large_gate", "gate x 30: exp(-gate) overflows for gate < -88",
             lambda a, s, seed: (a[0] * 30, a[1])),
        Case("zero_gate", "gate = 0: silu(0) = 0 exactly", lambda a, s, seed: (a[0] * 0, a[1])),
    ]


RANDOM = Case("random", "seeded normal inputs (times --scale)", lambda a, s, seed: a)
# With --from the file's tensors take the random case's place (its role: the
# case the edge cases are built from and measured against).
FILE = Case("file", "the --from file's tensors (an argument it does not hold: seeded normal times --scale, "
            "to fit)", lambda a, s, seed: a)
BASES = (RANDOM, FILE)
BASE_NAMES = frozenset(c.name for c in BASES)


def cases_for(op: str, from_file: bool = False) -> list[Case]:
    extra = {"softmax": _softmax_cases, "logsumexp": _logsumexp_cases, "rmsnorm": _norm_cases,
             "layernorm": _norm_cases, "matmul": _matmul_cases, "rope": _rope_cases,
             "attention": _attention_cases, "swiglu": _swiglu_cases}[op]()
    return [FILE if from_file else RANDOM] + extra


def select(op: str, text: str | None, from_file: bool = False) -> list[Case]:
    """--cases: 'all' (default), or a comma list of names."""
    every = cases_for(op, from_file)
    if text is None or text.strip() == "all":
        return every
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise UsageError("--cases needs 'all' or a comma list of case names")
    by_name = {c.name: c for c in every}
    for n in names:
        if n not in by_name:
            raise UsageError(f"unknown case {n!r} for {op}; choose from {', '.join(by_name)} (or all)")
    return [by_name[n] for n in dict.fromkeys(names)]


# ---------------------------------------------------------------------------
# outputs: contract, and non-finite patterns


def output_problem(got, ref, expect_dtype) -> str | None:
    """Why `got` cannot stand for `ref`: not a tensor, wrong shape, wrong dtype."""
    torch = import_torch()
    if got is None:
        return "returned None"
    if not isinstance(got, torch.Tensor):
        return f"returned a {type(got).__module__}.{type(got).__name__}, not a torch.Tensor"
    if tuple(got.shape) != tuple(ref.shape):
        return f"returned shape {tuple(got.shape)}, the reference's is {tuple(ref.shape)}"
    if got.dtype != expect_dtype:
        return f"returned dtype {got.dtype} where {expect_dtype} is expected"
    if got.device != ref.device:
        return f"returned a tensor on {got.device} for inputs on {ref.device}"
    return None


# ---------------------------------------------------------------------------
# tolerance advisor


def advise(got: np.ndarray, ref: np.ndarray) -> dict:
    """The smallest atol (rtol 0) and rtol (atol 0) under which
    |got - ref| <= atol + rtol |ref| holds elementwise over the finite pairs
    (inf where no rtol can pass: a difference where the reference is 0)."""
    g, r = np.asarray(got, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    both = np.isfinite(g) & np.isfinite(r)
    d, a = np.abs(g[both] - r[both]), np.abs(r[both])
    atol = float(d.max()) if d.size else 0.0
    if d.size == 0 or not d.any():
        rtol = 0.0
    elif np.any((d > 0) & (a == 0)):
        rtol = math.inf
    else:
        nz = d > 0
        rtol = float(np.max(d[nz] / a[nz]))
        # d / a is rounded: nudge up until rtol * a >= d holds in float64 for every element
        while np.any(rtol * a[nz] < d[nz]):
            rtol = float(np.nextafter(rtol, math.inf))
    return {"min_atol": atol, "min_rtol": rtol, "pairs": int(both.sum())}


def passes(got, ref, atol: float, rtol: float) -> bool:
    g, r = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    both = np.isfinite(g) & np.isfinite(r)
    return bool(np.all(np.abs(g[both] - r[both]) <= atol + rtol * np.abs(r[both])))


def matmul_bound(a: np.ndarray, b: np.ndarray, got: np.ndarray, out_unit_roundoff: float) -> dict:
    """Higham's a-priori bound for a fp32-accumulated product of the stored
    inputs: |C_hat - C| <= gamma_K |A||B| + u_out |C| elementwise (gamma_K =
    K u / (1 - K u), u = 2^-24; u_out the output format's rounding)."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    k = a64.shape[1]
    u = 2.0**-24
    gamma = k * u / (1 - k * u)
    exact = a64 @ b64  # float64: the exact product's error is far below fp32's bound
    bound = gamma * (np.abs(a64) @ np.abs(b64)) + out_unit_roundoff * np.abs(exact)
    err = np.abs(np.asarray(got, np.float64) - exact)
    with np.errstate(divide="ignore", invalid="ignore"):
        use = np.where(bound > 0, err / bound, np.where(err > 0, np.inf, 0.0))
    return {"k": k, "gamma_k": gamma, "max_abs_error": float(err.max()), "max_bound": float(bound.max()),
            "max_error_over_bound": float(use.max()), "within_bound": bool(np.all(err <= bound))}


# ---------------------------------------------------------------------------
# contracts: batch invariance and determinism


def shapes_used(op: str, shape: tuple) -> tuple[tuple, tuple]:
    """(the fixed-size cases' shapes besides --shape, the contract's batch
    shape): what the memory estimate made before anything is allocated needs."""
    big = BATCH_SIZES[-1]
    if op == "matmul":
        _, k, n = shape
        return ((16, 16384, 16),), (big, min(k, 1024), min(n, 256))
    if op == "attention":
        return (), (big, 32, 32)
    extra = {"softmax": ((2, VOCAB),), "logsumexp": ((2, VOCAB),), "rmsnorm": ((2, LONG_ROW),),
             "layernorm": ((2, LONG_ROW),)}.get(op, ())
    return extra, (big, min(shape[1], 1024))


def batched_inputs(op: str, shape: tuple, seed: int, device: str, make_inputs) -> tuple[tuple, Callable]:
    """The biggest batch's inputs, and how to take the first B of them (weights
    and positions stay shared)."""
    big = BATCH_SIZES[-1]
    if op == "matmul":
        _, k, n = shape
        args = make_inputs(op, (big, min(k, 1024), min(n, 256)), seed, device)
        return args, lambda a, s: (a[0][s], a[1])
    if op == "attention":
        args = make_inputs(op, (big, 32, 32), seed, device)
        return args, lambda a, s: tuple(x[s] for x in a)
    rows, cols = shape
    args = make_inputs(op, (big, min(cols, 1024)), seed, device)
    if op == "rope":
        return args, lambda a, s: (a[0][s], a[1][s], a[2])
    if op == "swiglu":
        return args, lambda a, s: (a[0][s], a[1][s])
    return args, lambda a, s: (a[0][s],) + tuple(a[1:])


def _bits(t) -> np.ndarray:
    torch = import_torch()
    t = t.detach().contiguous().cpu()
    view = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}.get(t.dtype)
    return (t.view(view) if view is not None else t).numpy()


def contracts(fn, call, args, take, dtype_name: str) -> list[dict]:
    """Batch invariance over BATCH_SIZES and determinism over
    DETERMINISM_CALLS calls, of fn on args already in the tested dtype."""
    torch = import_torch()
    alone: dict[int, np.ndarray] = {}
    first_changed, changed_rows, checked = None, 0, 0
    per_batch = []
    probe = call(fn, take(args, slice(0, 1)))
    if not isinstance(probe, torch.Tensor):
        why = f"not run: the output is a {type(probe).__name__}, not a torch.Tensor"
        return [{"contract": c, "dtype": dtype_name, "passed": False, "first_batch_changed": None, "rows_changed": None,
                 "rows_checked": None, "detail": why} for c in ("batch_invariance", "determinism")]
    for b in BATCH_SIZES:
        y = call(fn, take(args, slice(0, b)))
        rows = sorted({0, b // 2, b - 1})
        diff = []
        for i in rows:
            if i not in alone:
                alone[i] = _bits(call(fn, take(args, slice(i, i + 1)))[0])
            if not np.array_equal(_bits(y[i]), alone[i]):
                diff.append(i)
        checked += len(rows)
        changed_rows += len(diff)
        per_batch.append(f"{b}:{len(diff)}/{len(rows)}")
        if diff and first_changed is None:
            first_changed = b
    mid = take(args, slice(0, 257))
    ref = _bits(call(fn, mid))
    differing = sum(not np.array_equal(_bits(call(fn, mid)), ref) for _ in range(DETERMINISM_CALLS - 1))
    return [
        {"contract": "batch_invariance", "dtype": dtype_name, "passed": first_changed is None,
         "first_batch_changed": first_changed, "rows_changed": changed_rows, "rows_checked": checked,
         "detail": "rows changed / checked per batch size: " + ", ".join(per_batch)},
        {"contract": "determinism", "dtype": dtype_name, "passed": differing == 0, "first_batch_changed": None,
         "rows_changed": None, "rows_checked": None,
         "detail": f"{DETERMINISM_CALLS} calls at batch 257: {differing} differ from the first in some bit"},
    ]
