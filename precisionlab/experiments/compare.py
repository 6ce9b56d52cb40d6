"""compare op: the three-comparison discipline (compare tensors lives in
experiments/tensors.py; both judge by numerics/compare.py's rules).

For an op and a low-precision dtype L:
  (1) yours fp32 vs trusted fp32   is your implementation right?
  (2) trusted L  vs trusted fp32   what the precision itself costs
  (3) yours L    vs trusted L      should be about as close as (2)
and, as the yardstick for (1), (0) trusted fp32 vs trusted fp64: what fp32 costs.
"Trusted" is torch, with its TF32 switches set off explicitly (and reported).

This module runs the comparisons; its helpers hold the rest: op_inputs.py
(ops, shapes, inputs, --from files), op_trusted.py (the references, --masked),
op_impl.py (running yours), op_rows.py (each row measured, judged, in words),
op_harness.py (the cases and contracts), op_accumulator.py (--accumulator),
op_diagnosis.py (the causes).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from precisionlab.report.output import Rows
from precisionlab.runtime import devices, memory, threads, torch_flags
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.numerics import compare as comparison
from precisionlab.errors import UsageError
from precisionlab.experiments import op_accumulator, op_diagnosis, op_harness, op_impl, op_rows, op_trusted
from precisionlab.experiments.op_inputs import (LOW_DTYPES, OPS, OUT_DTYPES, cast, inputs_from_file, low_args,
                                                make_inputs, open_inputs_file, parse_shape, shape_of)
from precisionlab.runtime.torch_import import import_torch


@dataclass
class CompareOpConfig:
    op: str
    shape: str | None = None
    dtypes: str = ",".join(formats.LOW_COMPUTE)  # as --dtypes spells it
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


@dataclass
class _Run:
    """What every case of one run shares, checked and resolved before the first is computed."""

    op: str
    shape: tuple
    held: object  # op_inputs.InputsFile or None
    models: list
    lows: list
    out_dtype: object  # a formats.Format or None
    cases: list
    plan: object  # devices.resolve's
    yours: object
    ref: object
    rows: list = field(default_factory=list)
    contract_rows: list = field(default_factory=list)
    advice: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # cases whose inputs the accumulator models cannot take
    feats: dict = field(default_factory=dict)  # case -> what op_diagnosis reads of its inputs (the same on every device)


def _prepare(cfg: CompareOpConfig) -> _Run:
    """Every option checked, the memory estimated, yours and the trusted reference ready."""
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
    lows = [formats.get(d) for d in formats.parse_list(cfg.dtypes, LOW_DTYPES, "--dtypes")]  # no repeated rows
    if cfg.masked not in ("nan", "zero"):
        raise UsageError(f"--masked must be nan or zero (got {cfg.masked!r})")
    if not (math.isfinite(cfg.scale) and cfg.scale != 0):
        raise UsageError(f"--scale must be finite and non-zero (got {cfg.scale})")
    out_dtype = formats.get(formats.parse_one(cfg.out_dtype, OUT_DTYPES, "--out-dtype")) if cfg.out_dtype else None
    cases = op_harness.select(op, cfg.cases, from_file=held is not None)
    plan = devices.resolve(cfg.device)
    threads.fit_torch(cfg.threads, op_flops(op, shape))
    from precisionlab.numerics import torch_ops

    yours = op_impl.load_impl(cfg.impl) if cfg.impl else getattr(torch_ops, op)
    if not cfg.impl and op in ("softmax", "logsumexp"):  # the project's kernels follow --masked; yours say theirs
        yours = functools.partial(yours, masked=cfg.masked)
    ref = op_trusted.masked_policy(op_trusted.trusted(op), op, cfg.masked)
    return _Run(op, shape, held, models, lows, out_dtype, cases, plan, yours, ref)


def _case_rows(run: _Run, cfg: CompareOpConfig, dev: str, case, base: tuple, advance) -> None:
    """Comparisons (0) and (1), then (2) and (3) for each low format, of one case on one device."""
    torch = import_torch()
    op, ref, yours, out_dtype = run.op, run.ref, run.yours, run.out_dtype
    args = case.build(base, run.shape, cfg.seed)
    cshape = shape_of(op, args)
    run.feats.setdefault(case.name, op_diagnosis.features(op, args))
    t32 = ref(*args)
    t64 = ref(*cast(args, torch.float64))
    y32 = op_impl.call_case(yours, args, cfg.impl, case)
    fp32 = formats.get("fp32")
    rtol, atol = op_rows.tols(fp32, cfg)
    row0 = op_rows.compare_row(op, dev, case, fp32, 0, "trusted fp32 vs trusted fp64", t32, t64, atol, rtol, cshape)
    row0["verdict"] = "the cost of fp32: the yardstick for (1)"
    row1 = op_rows.compare_row(op, dev, case, fp32, 1, "yours fp32 vs trusted fp32", y32, t32, atol, rtol, cshape,
                               expect=(out_dtype or fp32).torch_dtype if out_dtype else torch.float32)
    if not row1["flagged"]:
        op_rows.judge(row1, row0, "fp32")
    run.rows += [row0, row1]
    run.rows += op_rows.model_rows(run.models, op, dev, case, fp32, args, y32, row1, t32.dtype, cshape, cfg,
                                   run.skipped)
    advance()
    for low in run.lows:
        largs = low_args(args, low)
        tl = ref(*largs)
        yl = op_impl.call_case(yours, largs, cfg.impl, case)
        rtol, atol = op_rows.tols(low, cfg)
        r2 = op_rows.compare_row(op, dev, case, low, 2, "trusted low vs trusted fp32", tl, t32, atol, rtol, cshape)
        r3 = op_rows.compare_row(op, dev, case, low, 3, "yours low vs trusted low", yl, tl, atol, rtol, cshape,
                                 expect=out_dtype.torch_dtype if out_dtype else tl.dtype)
        run.rows += [r2, r3]
        run.rows += op_rows.model_rows(run.models, op, dev, case, low, largs, yl, r3, tl.dtype, cshape, cfg,
                                       run.skipped)
        r2["verdict"] = "the cost of the format"
        if not r3["flagged"]:
            op_rows.verdict(row1, r2, r3)
        if case in op_harness.BASES and not r3["flagged"]:
            run.advice.append(op_rows.advice(op, dev, low, args, largs, yl, tl))
        advance()


def _contracts(run: _Run, cfg: CompareOpConfig, dev: str, advance) -> None:
    """Batch invariance and determinism of yours, in fp32 and each low format, on one device."""
    for name in ["fp32"] + [f.name for f in run.lows]:
        big, take = op_harness.batched_inputs(run.op, run.shape, cfg.seed, dev, make_inputs)
        for c in op_harness.contracts(run.yours, lambda f, a: op_impl.call(f, a, cfg.impl),
                                      low_args(big, formats.get(name)), take, name):
            c["device"] = dev
            c["flagged"] = not c["passed"]
            run.contract_rows.append(c)
        advance()


def _compare_op(cfg: CompareOpConfig, advance) -> CompareResult:
    run = _prepare(cfg)
    op, shape = run.op, run.shape
    with torch_flags.ieee_fp32():  # trusted fp32 is IEEE fp32, stated
        flags = torch_flags.torch_flags()
        for dev in run.plan.names:
            base = make_inputs(op, shape, cfg.seed, dev, scale=cfg.scale)
            if run.held is not None:
                base = inputs_from_file(op, run.held, base, dev)
            for case in run.cases:
                _case_rows(run, cfg, dev, case, base, advance)
            _contracts(run, cfg, dev, advance)
    rows, contract_rows = run.rows, run.contract_rows
    any_failed = any(r["flagged"] for r in rows) or any(c["flagged"] for c in contract_rows)
    causes = op_diagnosis.diagnose(op, rows, run.feats, cfg.impl or "this project's kernels")
    broken = next((r for r in rows if r["verdict"].startswith("output contract: ")), None)
    return CompareResult(
        params={"op": op, "shape": list(shape), "dtypes": [f.name for f in run.lows],
                "impl": cfg.impl or "precisionlab", "device": cfg.device, "seed": cfg.seed,
                "ratio_threshold": comparison.RATIO_THRESHOLD, "atol": cfg.atol, "rtol": cfg.rtol,
                "masked": cfg.masked, "scale": cfg.scale, "out_dtype": run.out_dtype.name if run.out_dtype else None,
                "from": cfg.from_file, "cases": {c.name: c.what for c in run.cases},
                "batch_sizes": list(op_harness.BATCH_SIZES), "cuda_unavailable": run.plan.cuda_unavailable or None,
                "accumulators": [m.name for m in run.models] or None},
        rows=rows, flags=flags, takeaways=op_rows.takeaways(rows, causes, cfg.impl)
        + op_rows.contract_takeaways(contract_rows) + op_accumulator.takeaways(rows, run.skipped),
        any_failed=any_failed, contracts=contract_rows, advice=run.advice, causes=causes,
        contract_violation=None if broken is None else
        f"{cfg.impl or 'precisionlab'} {broken['verdict'].removeprefix('output contract: ')} "
        f"(case {broken['case']}, {broken['dtype']})")
