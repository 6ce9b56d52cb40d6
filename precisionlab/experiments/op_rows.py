"""compare op's rows: each comparison measured (numerics/compare.py's rules),
judged against its yardstick and put in words, the accumulator models' rows,
the advice and the takeaways."""

from __future__ import annotations

import math

import numpy as np

from precisionlab.experiments import op_accumulator, op_harness
from precisionlab.experiments.op_impl import Raised
from precisionlab.numerics import compare as comparison, metrics


def compare_row(op, dev, case, fmt, idx, label, got, want, atol, rtol, shape, expect=None) -> dict:
    """One comparison of `got` against `want`. When `expect` (the dtype the
    output must have) is given, a result that is not a tensor of want's shape
    and that dtype is a flagged row with the reason, not an error. Non-finite
    reference values must be matched (the same NaN or infinity: torch's
    equal_nan, numerics.compare's rule); the finite rest is measured as usual."""
    problem = op_harness.output_problem(got, want, expect) if expect is not None else None
    if isinstance(got, Raised):
        problem = got.message
    if problem is not None:
        row = _row(op, dev, fmt.name, idx, label, metrics.error_report(np.zeros(0), np.zeros(0), fmt, atol, rtol), shape)
        row.update(case=case.name, flagged=True, ratio=math.inf, verdict=f"output contract: {problem}",
                   rel_l2=math.nan, max_abs_error=math.nan, nonfinite_pattern_mismatch=None)
        return row
    g, w = to_numpy(got), to_numpy(want)
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


def model_rows(models, op, dev, case, fmt, args, yours, yours_row, out_dtype, cshape, cfg, skipped) -> list[dict]:
    """Rows (4) and (5) of each --accumulator model (experiments/op_accumulator.py)."""
    if not models:
        return []
    broken = yours_row["verdict"].startswith("output contract: ")  # flagged already; nothing to compare

    def row(idx, label, got, want, atol, rtol):
        return compare_row(op, dev, case, fmt, idx, label, got, want, atol, rtol, cshape)

    out, finite = op_accumulator.rows(models, args, None if broken else yours, out_dtype, row, tols(fmt, cfg),
                                      fmt.name)
    if not finite:
        skipped.append(case.name)
    return out


def advice(op, dev, low, args, largs, yl, tl) -> dict:
    g, w = to_numpy(yl), to_numpy(tl)
    out = {"device": dev, "dtype": low.name, "comparison": 3, **op_harness.advise(g, w)}
    if op == "matmul":
        out.update(op_harness.matmul_bound(to_numpy(largs[0]), to_numpy(largs[1]), g, low.unit_roundoff))
    return out


def contract_takeaways(contract_rows) -> list[str]:
    out = []
    for c in contract_rows:
        if c["flagged"] and c["contract"] == "batch_invariance":
            out.append(f"{c['device']} {c['dtype']}: not batch-invariant: a row's bits change first at batch size "
                       f"{c['first_batch_changed']} ({c['detail']})")
        elif c["flagged"]:
            out.append(f"{c['device']} {c['dtype']}: not deterministic: {c['detail']}")
    return out


def tols(fmt, cfg) -> tuple[float, float]:
    return comparison.resolve(fmt.name, cfg.rtol, cfg.atol)


def to_numpy(t) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def _row(op, dev, dtype, idx, label, rep: metrics.ErrorReport, shape) -> dict:
    return {"op": op, "device": dev, "dtype": dtype, "comparison": idx, "label": label, "shape": list(shape),
            **rep.as_dict(), "ratio": None, "flagged": False, "verdict": ""}


def judge(row: dict, base: dict, dtype: str) -> None:
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


def verdict(r1: dict, r2: dict, r3: dict) -> None:
    r2["verdict"] = "the cost of the format"
    judge(r3, r2, r3["dtype"])
    if r1["flagged"]:
        r3["flagged"] = True
        r3["verdict"] += "; (1) already fails: fix the fp32 path first"


def takeaways(rows, causes, impl) -> list[str]:
    """One line a cause (op_diagnosis), naming its cases; the all-clear when nothing is flagged."""
    who = impl or "this project's kernels"
    if not any(r["flagged"] for r in rows):
        return [f"{who}: every comparison within {comparison.RATIO_THRESHOLD:g}x of what the precision itself costs."]
    return [c["text"] for c in causes]
