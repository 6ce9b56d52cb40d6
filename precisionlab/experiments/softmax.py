"""softmax: naive vs stable vs online, the edge cases, and the classic bugs.

Every output is compared with a float64 softmax of the *stored* inputs (the
values after rounding to --dtype), so the error is the kernel's alone; where
storage itself changed the logits, a takeaway says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from precisionlab import native
from precisionlab.numerics import ddexp, metrics
from precisionlab.runtime import devices, memory
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.errors import UsageError
from precisionlab.catalog.formats import Format

DTYPES = formats.COMPUTE  # the kernels read these; the arithmetic is fp32
# The variants are the library's catalog (op "softmax"): the defaults run in the
# main table, the deliberate bugs beside the stable variant in their own.
METHODS = [v.name for v in native.variants("softmax")]
BUGS = [v.name for v in native.variants("softmax", kind="bug")]
DEFAULT_METHODS = [v.name for v in native.variants("softmax") if v.default]
CPU_METHODS = [v.name for v in native.variants("softmax", "cpu")]
VOCAB = 151_936  # Qwen's vocabulary width

# Tolerances against the float64 reference, chosen from the formats before any
# run. rtol: the output is rounded to the input format (relative error up to
# u: 6e-8 fp32, 4.9e-4 fp16, 3.9e-3 bf16) after fp32 exp and a log2(cols)-deep
# sum; so fp32 1e-6, fp16 1e-3 (2u), bf16 1e-2 (2.5u).
# atol = max(rtol / cols, the format's smallest subnormal): probabilities
# average 1/cols, so an absolute error of rtol/cols matters as much as rtol on
# an average element, while a fixed atol of 1e-2 would pass every probability
# of a vocabulary-wide row whatever its value. Far below the max, fp32's own
# rounding of x - max (u |x - max|, amplified by exp) exceeds rtol, but only on
# probabilities thousands of times below 1/cols. The subnormal floor is the
# finest step an output can take (fp16: 2^-24).
RTOL = {"fp32": 1e-6, "bf16": 1e-2, "fp16": 1e-3}


def atol_for(fmt: Format, cols: int) -> float:
    return max(RTOL[fmt.name] / cols, float(fmt.finfo.smallest_subnormal))


TOLERANCES = {k: {"rtol": v, "atol": "max(rtol / cols, smallest subnormal)"} for k, v in RTOL.items()}


def named_cases(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "ordinary": np.array([[1.0, 2.0, 3.0]]),
        "equal": np.array([[0.0, 0.0, 0.0]]),
        "shifted": np.array([[101.0, 102.0, 103.0]]),
        "large": np.array([[1000.0, 1001.0, 1002.0]]),
        "very_negative": np.array([[-1000.0, -1001.0, -1002.0]]),
        "masked": np.full((1, 3), -np.inf),
        "nan": np.array([[1.0, np.nan, 3.0]]),
        "vocab": rng.standard_normal((1, VOCAB)) * 3.0,
    }


# Where each bug shows, and one case where it hides.
BUG_CASES = {
    "bug_zero_identity": ["very_negative", "very_negative_1024"],
    "bug_zero_start": ["very_negative", "ordinary"],
    "bug_no_rescale": ["ordinary", "equal"],
    "lowp_accum": ["equal_512", "vocab"],
}
BUG_EXTRA_CASES = {
    "very_negative_1024": lambda rng: -1000.0 - rng.random((1, 1024)) * 4.0,  # fills every lane of the block
    "equal_512": lambda rng: np.zeros((1, 512)),
}
BUG_DTYPE = {"lowp_accum": "bf16"}


@dataclass
class SoftmaxConfig:
    dtype: str = "fp32"
    methods: str | None = None
    masked: str = "nan"
    values: str | None = None
    rows: int | None = None
    cols: int | None = None
    dist: str | None = None    # random logits (--rows/--cols) only; None: normal
    scale: float | None = None  # random logits only; None: 1
    from_file: str | None = None
    device: str = "auto"
    seed: int = 0


@dataclass
class SoftmaxResult:
    params: dict
    rows: list[dict]
    takeaways: list[str]
    devices: dict
    tolerances: dict = field(default_factory=lambda: dict(TOLERANCES))


def run(cfg: SoftmaxConfig, advance=lambda k=1: None) -> SoftmaxResult:
    dtypes = [formats.get(d) for d in formats.parse_list(cfg.dtype, DTYPES, "--dtypes")]  # 'fp32,fp32' is one row
    if cfg.masked not in native.MASKED:
        raise UsageError(f"--masked must be nan or zero (got {cfg.masked!r})")
    methods = _parse_methods(cfg.methods)
    plan = devices.resolve(cfg.device)
    gpu_only = [m for m in methods if m not in CPU_METHODS] if cfg.methods is not None else []
    if gpu_only and (cfg.device.lower() == "cpu" or (not plan.cuda and len(gpu_only) == len(methods))):
        where = "--device cpu" if cfg.device.lower() == "cpu" else f"no GPU here ({plan.cuda_unavailable})"
        raise UsageError(f"--variants {', '.join(gpu_only)}: runs only on the GPU, and {where}; "
                         f"on the CPU: {', '.join(CPU_METHODS)}")
    cases = _cases(cfg)
    out: list[dict] = []
    for name, x in cases.items():
        for fmt in dtypes:
            refs = references(x, fmt, cfg.masked)  # one reference for every variant and device
            for dev in plan.names:
                for m in methods:
                    if dev == "cpu" and m not in CPU_METHODS:
                        continue
                    out.append(evaluate(name, x, fmt, m, dev, cfg.masked, kind="variant", refs=refs))
                    advance()
            del refs
    if cfg.methods is None and cfg.values is None and cfg.rows is None and cfg.cols is None and cfg.from_file is None:
        rng = np.random.default_rng(cfg.seed)
        extra = {k: f(rng) for k, f in BUG_EXTRA_CASES.items()}
        for bug, case_names in BUG_CASES.items():
            fmt = formats.get(BUG_DTYPE.get(bug, dtypes[0].name))
            for case in case_names:
                x = cases[case] if case in cases else extra[case]
                refs = references(x, fmt, cfg.masked)
                for dev in plan.names:
                    out.append(evaluate(case, x, fmt, "stable", dev, cfg.masked, kind="bug-reference", bug=bug,
                                        refs=refs))
                    out.append(evaluate(case, x, fmt, bug, dev, cfg.masked, kind="bug", bug=bug, refs=refs))
    return SoftmaxResult(
        params={"dtypes": [d.name for d in dtypes], "variants": methods, "masked": cfg.masked, "device": cfg.device,
                "seed": cfg.seed, "cases": list(cases), "rows": cfg.rows, "cols": cfg.cols, "dist": cfg.dist or "normal",
                "scale": 1.0 if cfg.scale is None else cfg.scale},
        rows=out,
        takeaways=takeaways(out, cases, dtypes, cfg.masked),
        devices=plan.describe(),
    )


# ---------------------------------------------------------------------------


def _parse_methods(text: str | None) -> list[str]:
    if text is None:
        return list(DEFAULT_METHODS)
    out = [m.strip().lower() for m in text.split(",") if m.strip()]
    for m in out:
        if m not in METHODS:
            raise UsageError(f"unknown softmax variant {m!r}; choose from {', '.join(METHODS)}")
    if not out:
        raise UsageError("empty --variants")
    return list(dict.fromkeys(out))


def _cases(cfg: SoftmaxConfig) -> dict[str, np.ndarray]:
    matrix = cfg.rows is not None or cfg.cols is not None
    if [cfg.values is not None, matrix, cfg.from_file is not None].count(True) > 1:
        raise UsageError("choose one of --values, --rows/--cols and --from")
    shaping = [o for o, v in (("--dist", cfg.dist), ("--scale", cfg.scale)) if v is not None]
    if shaping and not matrix:  # they would be ignored: say so rather than run something else
        raise UsageError(f"{' and '.join(shaping)} shape random logits: they need --rows/--cols")
    dist, scale = cfg.dist or "normal", 1.0 if cfg.scale is None else cfg.scale
    if cfg.values is not None:
        rows = [inputs.parse_values(r) for r in cfg.values.split(";")]
        if len({r.size for r in rows}) != 1:
            raise UsageError(f"--values rows have different lengths: {[r.size for r in rows]}")
        return {"values": np.stack(rows)}
    if cfg.rows is not None or cfg.cols is not None:
        if cfg.rows is None or cfg.cols is None:
            raise UsageError("--rows and --cols go together: a random ROWS x COLS matrix (e.g. --rows 4 --cols 1024)")
        r, c = cfg.rows, cfg.cols
        if r <= 0 or c <= 0:
            raise UsageError(f"--rows and --cols must be > 0 (got {r} x {c})")
        if not math.isfinite(scale):  # nan (or inf) times every logit: no random matrix left to study
            raise UsageError(f"--scale must be finite (got {scale})")
        inputs.check_memory(memory.softmax(r, c), f"softmax --rows {r} --cols {c}")
        if dist not in ("normal", "uniform"):
            raise UsageError(f"--dist must be normal or uniform (got {dist!r})")
        rng = np.random.default_rng(cfg.seed)
        x = rng.standard_normal((r, c)) if dist == "normal" else rng.random((r, c))
        return {f"random {r}x{c}": x * scale}
    if cfg.from_file is not None:
        shape, _ = inputs.npy_header(inputs.check_regular_file(cfg.from_file, "--from"))
        if len(shape) == 2:  # the whole estimate from the header (a long row's reference included), before loading
            inputs.check_memory(memory.softmax(*shape), f"softmax --from {cfg.from_file}")
        x = inputs.load_npy(cfg.from_file, ndim=2, bytes_per_value=memory.SOFTMAX_PER_ELEMENT)
        return {"file": x}
    return named_cases(cfg.seed)


def reference(x: np.ndarray, masked: str) -> tuple[np.ndarray, np.ndarray]:
    """float64 softmax and log-sum-exp of each row of x (stored values)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(x, axis=1, keepdims=True)
        e = np.exp(x - m)
        s = np.sum(e, axis=1, keepdims=True)
        p = e / s
        # m + log(s) loses the rest of s beside the max's own 1 (s = 1 + t,
        # log(1 + 6.8e-46) is 0.0): m + log1p(t), t the sum without one max.
        first_max = np.arange(x.shape[1])[None, :] == np.argmax(x, axis=1)[:, None]
        t = np.sum(np.where(first_max, 0.0, e), axis=1, keepdims=True)
        lse = np.where(np.isfinite(s), m + np.log1p(t), m + np.log(s))[:, 0]
    full_mask = np.all(np.isneginf(x), axis=1)
    if masked == "zero":
        p[full_mask] = 0.0
        lse[full_mask] = -np.inf
    return p, lse


DD_CHUNK = memory.SOFTMAX_DD_CHUNK  # elements of double-double reference at a time (at least one row)


def reference_dd(x: np.ndarray, ref: np.ndarray, ref_lse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The low halves of a double-double softmax and log-sum-exp (ref and
    ref_lse, from reference(), are overwritten with the high halves) for the
    rows that have a distribution (no NaN or +inf, not all -inf); 0 elsewhere.
    float64 alone is no reference for an fp32 output within 2^-53 of the truth:
    [0, -40] has probabilities 1 - 4.2e-18 and 4.2e-18, and fp32's 1.0 would
    show error 0."""
    lo, lse_lo = np.zeros_like(ref), np.zeros_like(ref_lse)
    ok = ~np.isnan(x).any(axis=1) & ~(x == np.inf).any(axis=1) & (x > -np.inf).any(axis=1)
    rows = np.flatnonzero(ok)
    step = max(1, DD_CHUNK // max(x.shape[1], 1))
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        for i in range(0, rows.size, step):
            r = rows[i:i + step]
            ph, pl, lh, ll = ddexp.softmax_dd(x[r])
            ref[r], lo[r], ref_lse[r], lse_lo[r] = ph, pl, lh, ll
    return lo, lse_lo


def references(x: np.ndarray, fmt: Format, masked: str) -> tuple:
    """(stored inputs, float64 softmax and log-sum-exp, their double-double low
    parts): what every variant of x stored in fmt is measured against."""
    stored = fmt.round(x)
    ref, ref_lse = reference(stored, masked)
    ref_lo, lse_lo = reference_dd(stored, ref, ref_lse)
    return stored, ref, ref_lse, ref_lo, lse_lo


def evaluate(case: str, x: np.ndarray, fmt: Format, method: str, device: str, masked: str, kind: str,
             bug: str | None = None, refs: tuple | None = None) -> dict:
    stored, ref, ref_lse, ref_lo, lse_lo = references(x, fmt, masked) if refs is None else refs
    xs = np.ascontiguousarray(stored.astype(fmt.dtype))
    fn = native.softmax_cpu if device == "cpu" else native.softmax_cuda
    y, lse = fn(xs, fmt.code, method, masked)
    y64 = y.astype(np.float64)
    rep = metrics.error_report(y64, ref, fmt, atol_for(fmt, x.shape[1]), RTOL[fmt.name], reference_lo=ref_lo)
    target = np.where(np.all(np.isneginf(stored), axis=1) & (masked == "zero"), 0.0, 1.0)
    # exact row sums a chunk of Python floats at a time (y64.tolist() would hold
    # 32 bytes of float objects per element at once)
    # row_sum_error: |sum - target| rounded once (fsum of the row and -target),
    # not the sum's double minus target (1 - 4e-18 would round to 1.0 first)
    sum_err = np.array([abs(metrics.exact_sum(np.append(r, -t))) if np.all(np.isfinite(r)) else math.nan
                        for r, t in zip(y64, target, strict=True)])
    with np.errstate(invalid="ignore"):
        lse_err = np.abs((lse - ref_lse) - lse_lo)  # lse - ref_lse is exact near the reference (Sterbenz)
    lse_err[(lse == ref_lse) & np.isinf(ref_lse)] = 0.0  # the same infinity (a masked row under 'zero') agrees
    return {
        "case": case, "kind": kind, "bug": bug, "variant": method, "device": device, "dtype": fmt.name,
        "masked": masked, "shape": list(x.shape),
        "output": y64[0, :4].tolist() if y64.shape[1] <= 4 and y64.shape[0] == 1 else None,
        "finite": bool(np.all(np.isfinite(y64))),
        # non-finite outputs where the float64 reference of the same stored logits is finite:
        # the variant's own doing (a NaN logit or a masked row is the input's)
        "unexpected_nonfinite": int(np.count_nonzero(~np.isfinite(y64) & np.isfinite(ref))),
        "max_abs_error": rep.max_abs_error, "rel_l2": rep.rel_l2, "max_ulps": rep.max_ulps,
        "n_outside": rep.n_outside, "passed": rep.passed, "rtol": rep.rtol, "atol": rep.atol,
        "row_sum_error": float(np.max(sum_err)) if sum_err.size else 0.0,
        "in_range": bool(np.all((y64 >= 0) & (y64 <= 1))),
        "lse": float(lse[0]) if lse.size == 1 else None,
        "lse_max_abs_error": float(np.nanmax(lse_err)) if np.any(~np.isnan(lse_err)) else math.nan,
        "lse_finite": bool(np.all(np.isfinite(lse))),
        "inputs_rounded": bool(np.any((stored != x) & ~np.isnan(x))),
    }


# ---------------------------------------------------------------------------


def takeaways(rows: list[dict], cases: dict, dtypes: list[Format], masked: str) -> list[str]:
    lines = []
    main = [r for r in rows if r["kind"] == "variant"]
    broke = {}
    for r in main:
        if r["unexpected_nonfinite"]:
            broke.setdefault(r["variant"], set()).add(r["case"])
    for m, cs in broke.items():
        lines.append(f"{m} gives non-finite probabilities on {', '.join(sorted(cs))}: exp of a large logit "
                     f"overflows fp32 (past ~88.7) and exp of a very negative one underflows to 0, so 0/0 or inf/inf.")
    good = [r for r in main if r["variant"] not in broke and r["finite"]]
    if good:
        worst = max(good, key=lambda r: r["max_abs_error"])
        lines.append(f"Where finite, the worst error against float64 is {worst['max_abs_error']:.2e} "
                     f"({worst['variant']}, {worst['dtype']}, {worst['case']}, {worst['device']}); "
                     f"{sum(r['passed'] for r in good)} of {len(good)} finite rows are within tolerance.")
    changed = sorted({(r["case"], r["dtype"]) for r in main if r["inputs_rounded"] and r["dtype"] != "fp32"})
    if changed:
        c, d = changed[0]
        lines.append(f"Storage alone moves the logits in {len(changed)} case/dtype pairs (e.g. {c} in {d}: "
                     f"{_short(cases[c])} becomes {_short(formats.get(d).round(cases[c]))}); errors above are "
                     f"measured against the stored values.")
    if "masked" in cases:
        lines.append(f"Masked rows (all -inf): policy '{masked}' is in force: "
                     + ("the textbook formula's NaN (-inf minus -inf)." if masked == "nan"
                        else "zeros, and a log-sum-exp of -inf."))
    for bug in BUG_CASES:
        b = [r for r in rows if r["kind"] == "bug" and r["bug"] == bug]
        if b:
            shown = [r["case"] for r in b if not r["passed"]]
            hidden = [r["case"] for r in b if r["passed"]]
            lines.append(f"{bug}: wrong on {', '.join(dict.fromkeys(shown)) or 'nothing here'}"
                         + (f"; right on {', '.join(dict.fromkeys(hidden))}" if hidden else "") + ".")
    return lines


def _short(x: np.ndarray) -> str:
    v = x[0, :3].tolist()
    return "[" + ", ".join(f"{a:g}" for a in v) + (", ...]" if x.shape[1] > 3 else "]")
