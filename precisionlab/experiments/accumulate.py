"""accumulate: sum n stored values with each method and accumulator format.

Each row separates the two errors a low-precision sum makes:
  representation error  exact sum of the intended values vs. of the stored ones
                        (the top-level exact_intended vs exact_stored), and
  accumulation error    a method's result vs. the exact sum of the stored values.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from precisionlab import native
from precisionlab.runtime import devices
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.numerics import metrics
from precisionlab.errors import UsageError
from precisionlab.experiments import accumulate_cpu
from precisionlab.catalog.formats import Format

# The variants are the library's catalog (op "sum"); the reordered ones run the
# sequential kernel on a permutation of the input (accumulate_cpu.CpuRows).
CPU_METHODS = [v.name for v in native.variants("sum", "cpu")]
GPU_METHODS = [v.name for v in native.variants("sum", "cuda")]
ALL_METHODS = CPU_METHODS + GPU_METHODS
ORDERS = {v.name for v in native.variants("sum") if v.order != "as_given"}
STORAGE_DTYPES = formats.ALL  # --dtype: any format, storage-only ones included
ACCUMULATORS = formats.ACCUMULATORS  # --accumulators: those the kernels add in
DEFAULT_ACCUMULATORS = formats.DEFAULT_ACCUMULATORS
GPU_ACCUMULATORS = formats.GPU_ACCUMULATORS
STOCHASTIC_ACCUMULATORS = formats.STOCHASTIC_ACCUMULATORS  # the default; others only when asked
# Rows whose kernel keeps a running sum (a trace, a stall): sequential and stochastic, in any order.
SEQUENTIAL_KIND = {v.name for v in native.variants("sum", "cpu")
                   if v.id in (native.variant("sum", "sequential").id, native.variant("sum", "stochastic").id)}

# Bytes per element while the input is made: the intended values, rounded where
# they lie. The whole run's peak is accumulate_cpu.memory_estimate, checked in run().
BYTES_PER_ELEMENT = 8


@dataclass
class AccumulateConfig:
    dtype: str = "bf16"
    n: int = 10_000
    value: float = 0.1
    dist: str | None = None
    values: str | None = None
    from_file: str | None = None
    methods: str | None = None
    accumulators: str | None = None
    device: str = "auto"
    seed: int = 0
    trace: bool = False  # keep running sums for the plot
    workers: int | None = None  # threads for the CPU rows; None: one per core


@dataclass
class AccumulateResult:
    params: dict
    storage: str
    n: int
    input_desc: str
    exact_stored: float
    exact_intended: float
    abs_sum: float  # sum of |stored values|: the scale every bound multiplies
    representation_error: float  # exact sum of the stored values minus that of the intended ones, rounded once
    rows: list[dict]
    takeaways: list[str]
    devices: dict
    traces: dict[str, np.ndarray] = field(default_factory=dict)  # "cpu sequential bf16" -> running sum


def run(cfg: AccumulateConfig, advance=lambda k=1: None) -> AccumulateResult:
    storage, accumulators = parse_formats(cfg)
    methods = _parse_methods(cfg.methods)
    plan = devices.resolve(cfg.device)
    _check_methods_run_there(methods, cfg)
    if cfg.values is None and cfg.from_file is None:  # the size is known: check before allocating
        _check_memory(cfg, cfg.n, methods, accumulators, plan, storage)
    intended, desc = _intended_values(cfg)
    if cfg.from_file is not None:  # known once the file is read: check before the rest
        _check_memory(cfg, intended.size, methods, accumulators, plan, storage)
    exact_intended = accumulate_cpu.exact_sum(intended)
    intended_q = accumulate_cpu.exact_sum_fraction(intended)
    stored = accumulate_cpu.round_in_place(storage, intended)  # memory stays flat: see accumulate_cpu
    del intended
    constant = inputs.is_constant(stored)

    cpu_jobs = [(acc, m) for acc in accumulators
                for m in _cpu_methods_for(methods, acc, constant, explicit=cfg.methods is not None)] if plan.cpu else []
    cpu_rows = accumulate_cpu.CpuRows(stored, cpu_jobs, cfg.seed, cfg.trace, SEQUENTIAL_KIND, cfg.workers,
                                      narrow=_narrow(storage))
    # the exact sums run here while the rows run on the worker threads
    exact_stored = accumulate_cpu.exact_sum(stored, constant)
    abs_sum = accumulate_cpu.exact_abs_sum(stored, exact_stored)
    # errors are measured against the exact sum itself, not its double
    exact_q = accumulate_cpu.exact_sum_fraction(stored, constant)
    rows: list[dict] = []
    traces: dict[str, np.ndarray] = {}

    for (acc, m), (r, elapsed) in cpu_rows.results(advance):
        rows.append(_cpu_row(r, elapsed, storage, acc, m, exact_stored, abs_sum, stored.size, exact_q))
        if r.trace is not None:
            traces[f"cpu {m} {acc.name}"] = r.trace
    gpu_methods = [m for m in methods if m in GPU_METHODS]
    gpu_accs = [a for a in accumulators if a.name in GPU_ACCUMULATORS]
    if plan.cuda:
        if gpu_methods and gpu_accs:  # context start-up and module load stay out of the first row's time
            native.sum_cuda(stored[:1], _device_code(storage), gpu_accs[0].code, gpu_methods[0], runs=1)
        for acc in gpu_accs:
            for m in gpu_methods:
                rows.append(_run_gpu(stored, storage, acc, m, exact_stored, abs_sum, exact_q))
                advance()
    elif plan.cuda_unavailable and gpu_methods:
        for acc in gpu_accs:
            for m in gpu_methods:
                rows.append(_unavailable_row(storage, acc, m, plan.cuda_unavailable))

    # NaN propagates through min and max, and an infinity is one of them: no copy.
    finite_inputs = bool(np.isfinite(stored.min()) and np.isfinite(stored.max()))
    for row in rows:
        if row["available"] and finite_inputs and not math.isfinite(row["result"]):
            # A partial sum passed the accumulator's largest value: no rounding
            # bound covers that, and the row says so rather than EXCEEDED.
            # The exact sum of finite values is finite, so an infinite result
            # is infinitely wrong (even where the exact sum's double is inf).
            err = math.inf if math.isinf(row["result"]) else math.nan
            row.update(bound=None, bound_kind="overflow", within_bound=None, abs_error=err, rel_error=err, ulps=err)
        row["predicted_stall"] = (
            _predicted_stall(float(stored[0]), formats.get(row["accumulator"]))
            if constant and row["variant"] in SEQUENTIAL_KIND - {"stochastic"} else None
        )
    rep_error = _representation_error(exact_stored, exact_intended, exact_q, intended_q)
    return AccumulateResult(
        params={"dtype": storage.name, "n": int(stored.size), "input": desc, "variants": methods,
                "acc_dtypes": [a.name for a in accumulators], "device": cfg.device, "seed": cfg.seed},
        storage=storage.name,
        n=int(stored.size),
        input_desc=desc,
        exact_stored=exact_stored,
        exact_intended=exact_intended,
        abs_sum=abs_sum,
        representation_error=rep_error,
        rows=rows,
        takeaways=takeaways(rows, storage, exact_stored, exact_intended, stored, desc, rep_error),
        devices=plan.describe(),
        traces=traces,
    )


# ---------------------------------------------------------------------------
# inputs


def _intended_values(cfg: AccumulateConfig) -> tuple[np.ndarray, str]:
    given = [x for x in (cfg.values, cfg.from_file, cfg.dist) if x is not None]
    if len(given) > 1:
        raise UsageError("choose one of --values, --from and --dist")
    if cfg.values is not None:
        v = inputs.parse_values(cfg.values)
        return v, f"values {cfg.values}"
    if cfg.from_file is not None:
        v = inputs.load_npy(cfg.from_file)
        inputs.check_n(v.size, BYTES_PER_ELEMENT, "--from")
        return v, f"file {cfg.from_file}"
    inputs.check_n(cfg.n, BYTES_PER_ELEMENT)
    if cfg.dist is not None:
        return inputs.generate(cfg.n, cfg.dist, cfg.seed), f"{cfg.dist} (seed {cfg.seed})"
    return np.full(cfg.n, cfg.value, dtype=np.float64), f"{cfg.value!r} x {cfg.n}"


def _parse_methods(text: str | None) -> list[str]:
    if text is None:
        return list(ALL_METHODS)
    out = []
    for m in (p.strip().lower() for p in text.split(",")):
        if m and m not in out:
            if m not in ALL_METHODS:
                raise UsageError(f"unknown sum variant {m!r}; choose from {', '.join(ALL_METHODS)}")
            out.append(m)
    if not out:
        raise UsageError("empty --variants")
    return out


def parse_formats(cfg: AccumulateConfig) -> tuple[Format, list[Format]]:
    """--dtype (any catalog format) and --accumulators (those with a pl_format
    code; fp4/fp6 are storage only), aliases taken."""
    storage = formats.get(formats.parse_one(cfg.dtype, STORAGE_DTYPES, "--dtype"))
    names = formats.parse_list(cfg.accumulators, ACCUMULATORS, "--acc-dtypes", DEFAULT_ACCUMULATORS)
    return storage, [formats.get(n) for n in names]


def _check_methods_run_there(methods: list[str], cfg: AccumulateConfig) -> None:
    """Methods named for a device that cannot run them: a usage error, not an empty table."""
    if cfg.methods is None:
        return
    device = cfg.device.lower()
    gpu_only = [m for m in methods if m in GPU_METHODS]
    cpu_only = [m for m in methods if m not in GPU_METHODS]
    if device == "cpu" and gpu_only:
        raise UsageError(f"--variants {', '.join(gpu_only)}: runs only on the GPU (--device cuda, or auto where "
                         f"one is present); the CPU variants are {', '.join(CPU_METHODS)}")
    if device == "cuda" and cpu_only:
        raise UsageError(f"--variants {', '.join(cpu_only)}: runs only on the CPU (--device cpu or auto); "
                         f"the GPU variants are {', '.join(GPU_METHODS)}")


def _cpu_methods_for(methods: list[str], acc: Format, constant: bool, explicit: bool) -> list[str]:
    """The CPU methods that apply: orders only change a non-constant input, and
    stochastic rounding is a bf16/fp16 technique unless asked for by name."""
    out = []
    for m in methods:
        if m not in CPU_METHODS:
            continue
        if not explicit and m in ORDERS and constant:
            continue
        if not explicit and m == "stochastic" and acc.name not in STOCHASTIC_ACCUMULATORS:
            continue
        out.append(m)
    return out


# ---------------------------------------------------------------------------
# running


def _check_memory(cfg: AccumulateConfig, n: int, methods, accumulators, plan, storage: Format) -> None:
    """The run's estimated peak against the machine, before it is allocated."""
    if n <= 0:
        return  # _intended_values says what is wrong with it
    explicit = cfg.methods is not None
    # The --value input is constant (unless it rounds to inf or NaN), and then
    # the orders are skipped unless asked for by name.
    constant = (cfg.dist is None and cfg.values is None and cfg.from_file is None
                and bool(np.isfinite(storage.round(np.array([cfg.value]))[0])))
    orders = plan.cpu and any(m in ORDERS for m in methods) and (explicit or not constant)
    traced = (sum(1 for a in accumulators for m in _cpu_methods_for(methods, a, constant, explicit)
                  if m in SEQUENTIAL_KIND) if cfg.trace and plan.cpu else 0)
    what = "--from" if cfg.from_file is not None else f"--n {n}"
    accumulate_cpu.check_memory(n, orders, traced, what, narrow=_narrow(storage))


def _narrow(storage: Format) -> bool:
    """Whether every stored value is a float32 value: every format but fp64."""
    return storage.name != "fp64"


def _cpu_row(r: native.CpuSum, elapsed: float, storage: Format, acc: Format, method: str, exact: float,
             abs_sum: float, n: int, exact_q=None) -> dict:
    row = _row("cpu", method, storage, acc, r.result, exact, abs_sum, n, elapsed,
               _bound(method, n, acc, storage, abs_sum, exact), exact_q)
    # 1-based: the k-th addition was the first absorbed. A sum at inf "absorbs"
    # every addend by overflow, not by rounding: no spacing explains it.
    if r.stall_step >= 0 and math.isfinite(r.stall_value):
        row["stall_step"] = r.stall_step + 1
        row["stall_value"] = r.stall_value
    return row


def _run_gpu(stored, storage: Format, acc: Format, method: str, exact: float, abs_sum: float, exact_q=None) -> dict:
    t0 = time.perf_counter()
    result = float(native.sum_cuda(stored, _device_code(storage), acc.code, method, runs=1)[0])
    elapsed = time.perf_counter() - t0
    return _row("cuda", method, storage, acc, result, exact, abs_sum, stored.size, elapsed,
                _bound(method, stored.size, acc, storage, abs_sum, exact, gpu=True), exact_q)


def _device_code(storage: Format) -> int:
    """The pl_format the GPU holds the stored values in: fp4/fp6 values sit in
    fp32 exactly (the library's sums take no sub-byte storage), so the sum is
    the one of the fp4/fp6 values."""
    return formats.get("fp32").code if storage.storage_only else storage.code


def _row(device, method, storage, acc, result, exact, abs_sum, n, elapsed, bound, exact_q=None) -> dict:
    """exact_q: the exact sum as a rational (None where it is not finite); the
    errors are |result - exact sum|, correctly rounded, not |result - exact|."""
    abs_err = metrics.abs_error(result, exact, exact_q)
    value, kind = bound
    return {
        "device": device, "available": True, "variant": method, "dtype": storage.name,
        "accumulator": acc.name, "result": result,
        "abs_error": abs_err, "rel_error": metrics.rel_error(result, exact, exact_q),
        "ulps": metrics.ulp_error(result, exact, acc, exact_q),
        "bound": value, "bound_kind": kind,
        "within_bound": bool(abs_err <= value) if not math.isnan(abs_err) else False,
        "stall_step": None, "stall_value": None, "time_s": elapsed,
    }


def _unavailable_row(storage: Format, acc: Format, method: str, reason: str) -> dict:
    return {"device": "cuda", "available": False, "variant": method, "dtype": storage.name,
            "accumulator": acc.name, "result": None, "abs_error": None, "rel_error": None, "ulps": None,
            "bound": None, "bound_kind": None, "within_bound": None, "stall_step": None, "stall_value": None,
            "time_s": None, "note": reason}


# ---------------------------------------------------------------------------
# bounds (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., ch. 4)


def gamma(k: int, u: float) -> float:
    """gamma_k = k u / (1 - k u); inf (vacuous) once k u >= 1."""
    return k * u / (1 - k * u) if k * u < 1 else math.inf


def underflow_error(fmt: Format) -> float:
    """The absolute error one round-to-nearest may add on top of u|x|: half the
    smallest subnormal spacing, 2^(emin - p). Where the result lands among the
    subnormals the relative error is unbounded, and this term is what holds."""
    return math.ldexp(1.0, fmt.emin - fmt.precision)


def _bound(method: str, n: int, acc: Format, storage: Format, abs_sum: float, exact: float,
           gpu: bool = False) -> tuple[float, str]:
    """A-priori bound on |result - exact| and its kind: 'rigorous', 'first-order'
    (the O(n u^2) term dropped; meaningful only while n u << 1), 'vacuous'
    (k u >= 1, or a non-finite input: no finite bound).

    Every rounding obeys fl(x) = x (1 + d) + e with |d| <= u and |e| <= eta,
    eta = underflow_error(acc) (Higham, 2nd ed., eq. 2.8 with gradual
    underflow). Treating each e as one more addend carried through the later
    roundings of its path (at most k of them) gives
        |E| <= gamma_k sum|x| + (number of roundings) eta (1 + gamma_k).
    The bound assumes no partial sum overflows; run() labels a row whose
    finite inputs gave a non-finite result 'overflow' instead."""
    if not math.isfinite(abs_sum):
        return math.inf, "vacuous"
    u = acc.unit_roundoff
    eta = underflow_error(acc)
    if gpu and acc.name == "bf16":
        # fp32 add, then bf16 rounding: two roundings per operation.
        fp32 = formats.get("fp32")
        u = u + fp32.unit_roundoff * (1 + u)
        eta = eta + underflow_error(fp32) * (1 + u)
    # When the stored values are wider than the accumulator, the first use of
    # each value rounds too: one more rounding along every path.
    extra = 1 if storage.precision > acc.precision else 0
    roundings = n + n * extra  # n - 1 additions (n with the first 0 + x), n conversions
    if method == "stochastic":
        # Each stochastic rounding errs by less than one spacing: 2u relative,
        # and below the normals less than one subnormal spacing, 2 eta.
        k, u, eta = n - 1 + extra, 2 * u, 2 * eta
    elif method == "pairwise":
        k = math.ceil(math.log2(n)) + extra if n > 1 else extra
    elif method in ("kahan", "neumaier") and not gpu:
        # Kahan: |E| <= (2u + O(n u^2)) sum|x| (Higham eq. 4.8); Neumaier:
        # |E| <= u |S| + O(n u^2) sum|x|. Only the first-order term is known in
        # closed form here, so it is reported as such; once n u >= 1 the
        # dropped term dominates and there is no estimate at all.
        if n * u >= 1:
            return math.inf, "vacuous"
        first = 2 * u * abs_sum if method == "kahan" else u * abs(exact)
        return _round_up(first + 4 * roundings * eta), "first-order"
    else:
        # sequential and its orders; the GPU's trees and atomics are some other
        # summation order, and every order is covered by gamma_{n-1}.
        k = n - 1 + extra
    g = gamma(k, u)
    if g == math.inf:
        return math.inf, "vacuous"
    return _round_up(g * abs_sum + roundings * eta * (1 + g)), "rigorous"


def _round_up(b: float) -> float:
    """The bound's own few double operations each round by at most 2^-53
    relative: widen past them so a computed bound is never below the true one."""
    return math.nextafter(b * (1 + 2.0**-48), math.inf) if math.isfinite(b) else b


# ---------------------------------------------------------------------------
# stagnation


def _predicted_stall(v: float, acc: Format) -> float | None:
    """Where a sum of a constant v stops growing: the first power of two whose
    spacing is at least 2|v|, so that |v| is at most half a spacing there and
    rounds away (ties go to the even value, which 2^e is). When even the
    smallest spacing (the subnormals') is at least 2|v|, the first addition
    already rounds to 0 and the sum never leaves it. None when the sum would
    overflow before stalling."""
    if v == 0 or not math.isfinite(v):
        return None
    m, x = math.frexp(abs(v))  # |v| = m 2^x, 0.5 <= m < 1: log2(2|v|) = x + log2(2m)
    e = (x if m == 0.5 else x + 1) + acc.precision - 1
    if e <= acc.emin:  # spacing 2^(emin - p + 1) >= 2|v|
        return 0.0
    if e > math.frexp(acc.max)[1] - 1:  # 2^e is past the largest finite value
        return None
    return math.copysign(math.ldexp(1.0, e), v)


# ---------------------------------------------------------------------------
# takeaways


def _representation_error(exact_stored: float, exact_intended: float, stored_q, intended_q) -> float:
    """stored - intended: from the exact sums where both are finite, rounded once;
    otherwise IEEE's difference of the two (a finite input stored as inf moved
    the sum by +inf; inf against the same inf is no number)."""
    if stored_q is not None and intended_q is not None:
        return metrics.q_to_float(stored_q - intended_q)
    return exact_stored - exact_intended


def takeaways(rows, storage: Format, exact_stored, exact_intended, stored, desc, rep_error: float) -> list[str]:
    over = [r for r in rows if r["bound_kind"] == "overflow"]
    over_line = [] if not over else [
        f"Overflow in {', '.join(dict.fromkeys(r['accumulator'] for r in over))} "
        f"({len(over)} row{'s' if len(over) > 1 else ''}): a partial sum passed the accumulator's largest value "
        f"({', '.join(dict.fromkeys(_g(formats.get(r['accumulator']).max) for r in over))}), so the result is "
        f"{', '.join(dict.fromkeys(str(r['result']) for r in over))} although every input is finite "
        f"(exact sum {_g(exact_stored)})."]
    done = [r for r in rows if r["available"] and r["abs_error"] is not None and not math.isnan(r["abs_error"])
            and r["bound_kind"] != "overflow"]
    if not done:
        return over_line or ["Every result is NaN: a NaN, or +inf beside -inf, in the input propagates through any sum."]
    rep = abs(rep_error)
    worst = max(done, key=lambda r: r["abs_error"])
    best = min(done, key=lambda r: r["abs_error"])
    label = lambda r: f"{r['accumulator']} {r['variant']}" + (" (GPU)" if r["device"] == "cuda" else "")
    n_acc = sum(1 for r in done if r["abs_error"] > rep)
    lines = [
        f"Storing the inputs as {storage.name} moved the exact sum by {_g(rep)}; accumulation errors run from "
        f"{_g(best['abs_error'])} ({label(best)}) to {_g(worst['abs_error'])} ({label(worst)}), so accumulation "
        f"dominates in {n_acc} of {len(done)} rows." if rep == rep else
        f"The exact sums of the intended values ({_g(exact_intended)}) and of the stored ones "
        f"({_g(exact_stored)}) differ by no number, so the representation error is undefined."
    ]
    for acc_name in dict.fromkeys(r["accumulator"] for r in done):
        orders = [r for r in done if r["accumulator"] == acc_name and r["device"] == "cpu"
                  and r["variant"] in ORDERS | {"sequential", "pairwise"}]
        results = {r["result"] for r in orders}
        if len(results) > 1:
            parts = ", ".join(f"{r['variant']} {_g(r['result'])}" for r in orders)
            lines.append(f"Order matters in {acc_name}: the same values summed in different orders give {parts}.")
            break
    lines += over_line
    stalled = [r for r in done if r.get("stall_step") is not None]
    if stalled:
        r = max(stalled, key=lambda r: r["abs_error"])
        acc = formats.get(r["accumulator"])
        s = r["stall_value"]
        spacing = float(acc.spacing(s))
        addend = float(stored[r["stall_step"] - 1]) if r["variant"] == "sequential" else None
        what = f"an addend of {_g(addend)}" if addend is not None else "the next addend"
        pred = r.get("predicted_stall")
        verb = "stalled for good at" if inputs.is_constant(stored) else "first absorbed an addend at"
        lines.append(
            f"{label(r)} {verb} {_g(s)} (step {r['stall_step']}): the {acc.name} spacing there is {_g(spacing)}, "
            f"and {what} is at most half of it, so the sum rounds back to itself"
            + (f"; the spacing predicts {_g(pred)}." if pred is not None else ".")
        )
    else:
        comp = [r for r in done if r["variant"] in ("kahan", "neumaier", "pairwise") and r["accumulator"] == worst["accumulator"]]
        if comp and worst["abs_error"] > 0:
            c = min(comp, key=lambda r: r["abs_error"])
            lines.append(
                f"In the same {worst['accumulator']} accumulator, {c['variant']} cuts the error from "
                f"{_g(worst['abs_error'])} to {_g(c['abs_error'])}: the order and compensation of the additions "
                f"matter as much as the format."
            )
    return lines


def _g(x) -> str:
    if x is None:
        return "-"
    return repr(float(x)) if abs(x) >= 1e-4 or x == 0 else f"{x:.3e}"
