"""compare op matmul --accumulator: your matmul against accumulator models
(numerics/accumulators.py, the one model type tf32, formats and the attention
emulator use), beside the comparisons (0)-(3) of experiments/compare.py.

For each input case, each dtype compare op runs (fp32 and every --dtype) and
each model M, on the very inputs your matmul received (fp32, the low dtype's
values, or a storage format's values held in fp32):
  (4) M vs fp64     the model's result, rounded to the output's dtype as a
                    kernel storing its fp32 accumulator would, against the
                    float64 product of those inputs: what the accumulator
                    itself costs, the yardstick for (5)
  (5) yours vs M    your output against the model's: flagged above the 4x
                    rule (numerics/compare.py) of (4), i.e. when yours loses
                    more than the model does; `identical_share` says how many
                    outputs are the model's bit for bit (1.0: yours is M)
Each row carries the model's every field (Accumulator.fields). Inputs with a
NaN or an infinity (from --from) are outside the models' domain: no rows for
that case, one takeaway says so."""

from __future__ import annotations

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.experiments import op_harness
from precisionlab.numerics import accumulators, compare as comparison

LABEL_COST = "accumulator vs fp64"
LABEL_YOURS = "yours vs accumulator"


def plan(op: str, text: str | None, bits: int | None, rounding: str | None) -> list[accumulators.Accumulator]:
    """The models (none without --accumulator), refused (exit 2) before any work."""
    if text is None:
        if bits is not None or rounding is not None:
            raise UsageError("--acc-bits and --acc-rounding go with --accumulator")
        return []
    if op != "matmul":
        raise UsageError(f"--accumulator: compare op {op} has no accumulator models (matmul has)")
    return accumulators.parse_option(text, bits, rounding)


def peak_bytes(models, shapes) -> int:
    """The models' own arrays at their peak, on the numpy backend (the
    library's needs none beyond its output)."""
    if not models or accumulators.default_backend() == "native":
        return 0
    return max(m.peak_bytes(s[0], s[2], s[1]) for m in models for s in shapes)


def _np64(t) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def rows(models, args, yours, out_dtype, compare_row, tols, in_format: str = "fp32") -> tuple[list[dict], bool]:
    """Rows (4) and (5) for every model on one case and dtype. `args` the
    matmul's inputs as yours got them (values of `in_format`, the row's
    dtype, where they are), `yours` its output (None: yours broke
    its output contract, (5) is left out), `out_dtype` the torch dtype the
    output is stored in, `compare_row(idx, label, got, want, atol, rtol)`
    compare.py's row builder bound to the case, `tols` (rtol, atol).
    Returns (rows, inputs_finite)."""
    import torch

    a, b = _np64(args[0]), _np64(args[1])
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return [], False
    out_fmt = formats.from_torch(out_dtype)
    exact = torch.from_numpy(a @ b)  # float64 of exact products: the yardstick's reference
    rtol, atol = tols
    out = []
    # the row's format where the inputs hold its values (a subnormal fp8 factor aligns at its format's emin under
    # align=product); fp32 holds every other input's values
    held = formats.get(in_format) if in_format in accumulators.library_formats() else None
    dtype = held.name if held is not None and all(np.array_equal(held.round(x), x) for x in (a, b)) else "fp32"
    backend = accumulators.default_backend(dtype)
    for m in models:
        c = m.matmul(a, b, backend=backend, dtype=dtype).astype(np.float64)
        if out_fmt is not None and out_fmt.name != "fp32":
            c = out_fmt.round(c)  # the fp32 accumulator stored in the output's dtype, one rounding
        model_t = torch.from_numpy(c)
        cost = compare_row(4, f"{LABEL_COST} ({m.name})", model_t, exact, atol, rtol)
        cost.update(**m.fields(), identical_share=None, verdict="the cost of the accumulator: the yardstick "
                    "for (5)")
        out.append(cost)
        if yours is None:
            continue
        got = compare_row(5, f"{LABEL_YOURS} ({m.name})", yours, model_t, atol, rtol)
        got.update(**m.fields(), identical_share=_identical(_np64(yours), c))
        if not got["flagged"]:
            ratio, got["flagged"] = comparison.judge(got["rel_l2"], cost["rel_l2"])
            got["ratio"] = ratio
            got["verdict"] = (f"(5) is {ratio:.2f}x (4): " + (
                f"yours loses more than {m.name} does" if got["flagged"] else
                f"as close as {m.name} allows") + f"; {got['identical_share']:.1%} of the outputs are its bits")
        out.append(got)
    return out, True


def _identical(yours: np.ndarray, model: np.ndarray) -> float:
    """The share of outputs equal to the model's bit for bit (both held as
    float32: every output dtype here is an fp32 subset)."""
    if yours.shape != model.shape or yours.size == 0:
        return 0.0
    same = yours.astype(np.float32).view(np.uint32) == model.astype(np.float32).view(np.uint32)
    return float(np.count_nonzero(same)) / same.size


def takeaways(rows: list[dict], skipped: list[str]) -> list[str]:
    lines = []
    for r in rows:
        if r["comparison"] == 5 and r["ratio"] is not None:
            cost = next(c for c in rows if c["comparison"] == 4 and c["device"] == r["device"]
                        and c["case"] == r["case"] and c["dtype"] == r["dtype"] and c["accumulator"] == r["accumulator"])
            if r["case"] in op_harness.BASE_NAMES or r["flagged"]:
                lines.append(f"{r['device']} {r['dtype']} {r['case']}: {r['accumulator']} costs rel L2 "
                             f"{cost['rel_l2']:.2e} against float64; yours is {r['rel_l2']:.2e} from it "
                             f"({r['ratio']:.2f}x), {r['identical_share']:.1%} of its outputs bit for bit.")
    if skipped:
        lines.append(f"--accumulator: no model rows for {', '.join(dict.fromkeys(skipped))}: the inputs hold a "
                     "NaN or an infinity, outside the models' domain.")
    return lines
