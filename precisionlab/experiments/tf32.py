"""tf32: the same fp32 matmul through each precision mode, against float64.

On the GPU every mode is a real torch matmul, selected through the switch torch
offers for it. A CPU has no TF32, so the CPU rows emulate each mode: inputs
rounded to the mode's format (TF32: 10 stored mantissa bits, nearest-even, by
the library's exact rounding), then an fp32 matmul, and for bf16/fp16 the
output rounded to that format. Every torch precision flag is recorded before
and restored after.
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

from fractions import Fraction

import numpy as np

from precisionlab import native
from precisionlab.runtime import devices, memory, threads, torch_flags
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.numerics import accumulators, metrics
from precisionlab.errors import UsageError
from precisionlab.runtime.torch_import import import_torch

K_SWEEP = [256, 512, 1024, 2048, 4096, 8192, 16384]
CPU_MODES = ["fp32", "tf32", "bf16", "fp16"]
MAX_DIM = 1 << 16
# the accumulator section: m = n = ACC_MN outputs (the library's models, or
# numpy's where it is missing: the same bits), standard normal inputs rounded
# to the dtype, against float64
ACC_MN = 64
ACC_K = (256, 1024, 4096, 16384)
# K's ceiling: the models run every product of a 64 x K x 64 matmul one at a time on the CPU, about 20 s for
# each model and dtype at K = 2^17 on a 2-core machine (2^20 took minutes: a run nobody waits for)
ACC_MAX_K = 1 << 17
ACC_DTYPES = formats.MODEL_INPUTS  # --dtypes: the inputs are rounded to any of them (Format.round)


@dataclass
class Tf32Config:
    m: int = 4096
    n: int = 4096
    k: int = 4096
    sweep_mn: int = 256
    sweep: bool = True
    device: str = "auto"
    seed: int = 0
    threads: int | None = None  # torch CPU threads; None: sized per matmul (precisionlab.runtime.threads)
    # --accumulator: the accumulator-model section, run instead of the others
    accumulators: list[str] | None = None
    acc_dtypes: tuple[str, ...] = ("fp8_e4m3",)
    acc_k: tuple[int, ...] = ACC_K
    acc_bits: int | None = None       # --acc-bits: B of the limited models that do not spell it
    acc_rounding: str | None = None   # --acc-rounding: trunc | rne | floor, likewise


@dataclass
class Tf32Result:
    params: dict
    rows: list[dict]
    flags_before: dict
    takeaways: list[str]
    devices: dict


def run(cfg: Tf32Config, advance=lambda k=1: None) -> Tf32Result:
    if cfg.accumulators is not None:  # numpy only: torch is never imported
        return _run_accumulators(cfg, advance)
    return threads.scoped(cfg.threads, _run, cfg, advance)


def _run(cfg: Tf32Config, advance) -> Tf32Result:
    for name, v in (("--m", cfg.m), ("--n", cfg.n), ("--k", cfg.k), ("--sweep-mn", cfg.sweep_mn)):
        if v <= 0:
            raise UsageError(f"{name} must be > 0 (got {v})")
        if v > MAX_DIM:
            raise UsageError(f"{name} {v} is absurd here (at most {MAX_DIM})")
    what = f"tf32 --m {cfg.m} --n {cfg.n} --k {cfg.k}" + (f" --sweep-mn {cfg.sweep_mn}" if cfg.sweep else "")
    inputs.check_memory(memory.tf32(cfg.m, cfg.n, cfg.k, cfg.sweep_mn if cfg.sweep else None), what)
    plan = devices.resolve(cfg.device)
    flags = torch_flags.torch_flags()
    rows: list[dict] = []
    rng = np.random.default_rng(cfg.seed)
    a = rng.standard_normal((cfg.m, cfg.k)).astype(np.float32)
    b = rng.standard_normal((cfg.k, cfg.n)).astype(np.float32)
    with torch_flags.restored_flags():
        if plan.cpu:
            threads.fit_torch(cfg.threads, 2.0 * cfg.m * cfg.n * cfg.k)
            rows += _modes_cpu(a, b, advance)
            rows += _integer_cpu()
            if cfg.sweep:
                threads.fit_torch(cfg.threads, 2.0 * cfg.sweep_mn**2 * max(K_SWEEP))
                rows += _sweep(cfg, "cpu", advance)
        if plan.cuda:
            rows += _modes_gpu(a, b, advance)
            rows += _integer_gpu()
            if cfg.sweep:
                rows += _sweep(cfg, "cuda", advance)
    refused = refused_gpu_modes() if plan.cuda else {}
    return Tf32Result(
        params={"m": cfg.m, "n": cfg.n, "k": cfg.k, "sweep_mn": cfg.sweep_mn, "k_sweep": K_SWEEP if cfg.sweep else [],
                "device": cfg.device, "seed": cfg.seed,
                "refused_gpu_modes": refused},
        rows=rows, flags_before=flags,
        takeaways=takeaways(rows) + [f"torch refused the mode {m} at the matmul: {why}"
                                     for m, why in refused.items()],
        devices=plan.describe(),
    )


# ---------------------------------------------------------------------------
# torch's flags (precisionlab.runtime.torch_flags sets and restores them)


def gpu_modes() -> list[str]:
    return [m for m in torch_flags.gpu_fp32_modes() if m not in refused_gpu_modes()] + list(formats.LOW_COMPUTE)


@functools.cache
def refused_gpu_modes() -> dict[str, str]:
    """Switches torch accepts but then refuses at the matmul, with its reason.
    torch >= 2.9 checks that the legacy flags and the newer fp32_precision
    agree when cuBLAS asks whether TF32 is allowed, and raises if they do not;
    setting fp32_precision alone, as its docs advise, can leave them apart."""
    t = import_torch(optional=True)
    refused = {}
    if t is None or not t.cuda.is_available() or not hasattr(t.backends.cuda.matmul, "fp32_precision"):
        return refused
    mode = torch_flags.TF32_FP32_PRECISION
    x = t.ones(16, 16, device="cuda")
    try:
        with torch_flags.matmul_mode(mode):
            x @ x
        t.cuda.synchronize()
    except RuntimeError as e:
        refused[mode] = str(e).splitlines()[0][:200]
    return refused


# ---------------------------------------------------------------------------
# CPU emulation


def emulate_inputs(x: np.ndarray, mode: str) -> np.ndarray:
    """fp32 inputs as the mode's tensor cores would read them."""
    if mode == "fp32":
        return x
    if mode == "tf32":
        return native.round_to(x.astype(np.float64), native.TF32).astype(np.float32)
    return formats.get(mode).round(x.astype(np.float64)).astype(np.float32)


def matmul_emulated(a: np.ndarray, b: np.ndarray, mode: str) -> np.ndarray:
    c = emulate_inputs(a, mode) @ emulate_inputs(b, mode)  # fp32 accumulate (BLAS sgemm)
    if mode in formats.LOW_COMPUTE:
        c = formats.get(mode).round(c.astype(np.float64)).astype(np.float32)
    return c


def _report(c: np.ndarray, ref: np.ndarray) -> dict:
    rep = metrics.error_report(c, ref, None, 0.0, 0.0)
    return {"rel_l2": rep.rel_l2, "max_abs_error": rep.max_abs_error, "finite": rep.finite}


def _modes_cpu(a, b, advance) -> list[dict]:
    ref = a.astype(np.float64) @ b.astype(np.float64)
    advance()
    m, k = a.shape
    n = b.shape[1]
    rows = []
    for mode in CPU_MODES:
        t0 = time.perf_counter()
        c = matmul_emulated(a, b, mode)
        dt = time.perf_counter() - t0
        advance()
        rows.append({"section": "modes", "device": "cpu", "mode": mode, "emulated": mode != "fp32",
                     "m": m, "n": n, "k": k, **_report(c, ref), "time_s": dt,
                     "tflops": 2 * m * n * k / dt / 1e12})
    return rows


def integer_problem(m: int = 64, k: int = 256, n: int = 256):
    """A holds the integers 2048, 2049, ...; B is a permutation (one-hot columns).
    A @ B only moves entries, so any fp32 matmul must return them exactly."""
    a = (2048 + np.arange(m * k, dtype=np.float64)).reshape(m, k).astype(np.float32)
    perm = np.random.default_rng(0).permutation(k)[:n] if n <= k else np.arange(n) % k
    b = np.zeros((k, n), dtype=np.float32)
    b[perm, np.arange(n)] = 1.0
    return a, b, a[:, perm]


def _integer_cpu() -> list[dict]:
    a, b, want = integer_problem()
    rows = []
    for mode in CPU_MODES:
        c = matmul_emulated(a, b, mode)
        rows.append({"section": "integer", "device": "cpu", "mode": mode, "emulated": mode != "fp32",
                     "wrong": int(np.count_nonzero(c != want)), "entries": int(want.size),
                     "max_abs_error": float(np.max(np.abs(c.astype(np.float64) - want)))})
    return rows


# ---------------------------------------------------------------------------
# GPU


def _gpu_matmul(ta, tb, mode: str):
    t = import_torch(optional=True)
    if mode == "bf16":
        return ta.to(t.bfloat16) @ tb.to(t.bfloat16)
    if mode == "fp16":
        return ta.to(t.float16) @ tb.to(t.float16)
    with torch_flags.matmul_mode(mode):
        return ta @ tb


def _modes_gpu(a, b, advance) -> list[dict]:
    from precisionlab.runtime import cuda_timing as ct

    t = import_torch(optional=True)
    ta, tb = t.from_numpy(a).cuda(), t.from_numpy(b).cuda()
    ref = (ta.double() @ tb.double()).cpu().numpy()
    m, k = a.shape
    n = b.shape[1]
    rows = []
    for mode in gpu_modes():
        c = _gpu_matmul(ta, tb, mode).float().cpu().numpy()
        with torch_flags.matmul_mode(mode) if mode not in formats.LOW_COMPUTE else _null():
            if mode in formats.LOW_COMPUTE:
                xa, xb = (ta.to(t.bfloat16), tb.to(t.bfloat16)) if mode == "bf16" else (ta.half(), tb.half())
                ms = ct.time_ms(lambda i: xa @ xb, 10, reps=3).median
            else:
                ms = ct.time_ms(lambda i: ta @ tb, 10, reps=3).median
        advance()
        rows.append({"section": "modes", "device": "cuda", "mode": mode, "emulated": False, "m": m, "n": n, "k": k,
                     **_report(c, ref), "time_s": ms * 1e-3, "tflops": 2 * m * n * k / (ms * 1e-3) / 1e12})
    return rows


@contextmanager
def _null():
    yield


def _integer_gpu() -> list[dict]:
    t = import_torch(optional=True)
    # big enough that cuBLAS takes a tensor-core kernel when TF32 is allowed
    # (a small product may run on the fp32 pipes and hide the lesson)
    a, b, want = integer_problem(512, 1024, 1024)
    ta, tb = t.from_numpy(a).cuda(), t.from_numpy(b).cuda()
    rows = []
    for mode in gpu_modes():
        c = _gpu_matmul(ta, tb, mode).float().cpu().numpy()
        rows.append({"section": "integer", "device": "cuda", "mode": mode, "emulated": False,
                     "wrong": int(np.count_nonzero(c != want)), "entries": int(want.size),
                     "max_abs_error": float(np.max(np.abs(c.astype(np.float64) - want)))})
    return rows


# ---------------------------------------------------------------------------
# error against K


def _sweep(cfg: Tf32Config, device: str, advance) -> list[dict]:
    rng = np.random.default_rng(cfg.seed + 1)
    mn = cfg.sweep_mn
    rows = []
    for k in K_SWEEP:
        a = rng.standard_normal((mn, k)).astype(np.float32)
        b = rng.standard_normal((k, mn)).astype(np.float32)
        if device == "cpu":
            ref = a.astype(np.float64) @ b.astype(np.float64)
            results = {mode: matmul_emulated(a, b, mode) for mode in CPU_MODES}
        else:
            t = import_torch(optional=True)
            ta, tb = t.from_numpy(a).cuda(), t.from_numpy(b).cuda()
            ref = (ta.double() @ tb.double()).cpu().numpy()
            results = {mode: _gpu_matmul(ta, tb, mode).float().cpu().numpy() for mode in gpu_modes()}
        for mode, c in results.items():
            rows.append({"section": "k_sweep", "device": device, "mode": mode, "emulated": device == "cpu" and
                         mode != "fp32", "m": mn, "n": mn, "k": k, **_report(c, ref)})
        advance(len(results))
    return rows


# ---------------------------------------------------------------------------
# accumulator models (numerics.accumulators), emulated on the CPU


def accumulator_rows_plan(cfg: Tf32Config) -> tuple[list, list[str], list[int]]:
    """The parsed models, dtypes and K list, refused (exit 2) before any work."""
    models = accumulators.parse_option(",".join(cfg.accumulators), cfg.acc_bits, cfg.acc_rounding)
    dtypes = formats.parse_list(",".join(cfg.acc_dtypes), ACC_DTYPES, "--dtypes")
    ks = list(dict.fromkeys(cfg.acc_k))
    for k in ks:
        if k <= 0 or k > ACC_MAX_K:
            raise UsageError(f"--k {k}: between 1 and {ACC_MAX_K} for the accumulator section")
    return models, dtypes, ks


def _run_accumulators(cfg: Tf32Config, advance) -> Tf32Result:
    models, dtypes, ks = accumulator_rows_plan(cfg)
    # the models are CPU emulations whatever --device says; but --device cuda/all without a GPU is still exit 3
    devices.resolve(cfg.device)
    mn = ACC_MN
    inputs.check_memory(memory.accumulator_models(mn, mn, max(ks), [m.peak_bytes(mn, mn, max(ks)) for m in models]),
                        f"tf32 --accumulator with --k {max(ks)}")
    rows = []
    for dtype in dtypes:
        fmt = formats.get(dtype)
        for k in ks:
            rng = np.random.default_rng([cfg.seed, k])
            a = fmt.round(rng.standard_normal((mn, k)))
            b = fmt.round(rng.standard_normal((k, mn)))
            # the exact products' sums (hi + lo): the errors' last digits are the exact values'
            ref, ref_lo = metrics.exact_matmul_dd(a, b)
            top = np.unravel_index(int(np.argmax(np.abs(ref))), ref.shape)
            scale_q = abs(metrics.exact_dot(a[top[0]], b[:, top[1]]))  # max |exact|, itself exact
            for model in models:
                t0 = time.perf_counter()
                # the library's C++ where it takes the format (the same bits, faster); fp64 and the
                # storage-only fp6/fp4 values stay on numpy's, in their own format (its emin aligns a subnormal)
                c = model.matmul(a, b, backend=accumulators.default_backend(dtype), dtype=dtype).astype(np.float64)
                dt = time.perf_counter() - t0
                rep = metrics.error_report(c, ref, None, 0.0, 0.0, reference_lo=ref_lo)
                # the worst entry's error and its ratio to max |exact|, each rounded once from rationals
                i, j = rep.worst_index
                err_q = abs(Fraction(float(c[i, j])) - metrics.exact_dot(a[i], b[:, j]))
                rows.append({"section": "accumulator", "device": "cpu", **model.fields(), "dtype": dtype,
                             "emulated": True, "m": mn, "n": mn, "k": k,
                             "max_rel_error": metrics.q_to_float(err_q / scale_q) if scale_q else 0.0,
                             "rel_l2": rep.rel_l2, "max_abs_error": metrics.q_to_float(err_q), "time_s": dt})
                advance()
    return Tf32Result(
        params={"accumulators": [m.name for m in models], "dtypes": dtypes, "k": ks, "m": mn, "n": mn,
                "seed": cfg.seed, "device": "cpu"},
        rows=rows, flags_before={}, takeaways=accumulator_takeaways(rows),
        devices={"cpu": True, "cuda": False, "cuda_unavailable": None},
    )


def accumulator_takeaways(rows: list[dict]) -> list[str]:
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        by = {(r["accumulator"], r["k"]): r["max_rel_error"] for r in rows if r["dtype"] == dtype}
        ks = sorted({k for _, k in by})
        for name in (a for a in dict.fromkeys(a for a, _ in by) if a.startswith(("hopper-fp8", "promote:"))):
            lo, hi = by[(name, ks[0])], by[(name, ks[-1])]
            if len(ks) > 1 and lo > 0:
                lines.append(f"{dtype}, {name}: max relative error {lo:.2e} at K={ks[0]}, {hi:.2e} at K={ks[-1]} "
                             f"({hi / lo:.1f}x).")
        for (a, k), v in by.items():
            if not a.startswith("promote:") or k != ks[-1] or v <= 0:
                continue
            m = accumulators.parse(a)  # its unpromoted twin: the same B, group, rounding and order
            twin = replace(m, kind="hopper-fp8", interval=None).name
            if not by.get((twin, k)):
                continue
            ratio = by[(twin, k)] / v
            said = f"cuts {twin}'s error {ratio:.0f}x" if ratio >= 1.5 else f"leaves {twin}'s error at {1 / ratio:.2f}x"
            lines.append(f"{dtype} at K={k}: {a} {said} ({by[(twin, k)]:.2e} to {v:.2e}): each chunk starts from "
                         f"zero, so its {m.bits} bits are spent at the chunk's size, and fp32 carries the total.")
    return lines


# ---------------------------------------------------------------------------


def takeaways(rows: list[dict]) -> list[str]:
    lines = []
    for dev in ("cuda", "cpu"):
        modes = {r["mode"]: r for r in rows if r["section"] == "modes" and r["device"] == dev}
        fp32 = modes.get("fp32 (tf32 off)") or modes.get("fp32")
        tf32 = modes.get("tf32 (allow_tf32=True)") or modes.get("tf32")
        if fp32 and tf32 and fp32["rel_l2"] > 0:
            what = "emulated" if dev == "cpu" else "measured"
            speed = (f", at {tf32['tflops']:.0f} vs {fp32['tflops']:.0f} TFLOP/s" if dev == "cuda" else "")
            lines.append(f"TF32 ({what} on {dev}) costs {tf32['rel_l2'] / fp32['rel_l2']:.0f}x the fp32 error "
                         f"(rel L2 {tf32['rel_l2']:.2e} vs {fp32['rel_l2']:.2e}){speed}: 10 mantissa bits instead "
                         f"of 23, so each product carries about 2^-11 relative error.")
        ints = {r["mode"]: r for r in rows if r["section"] == "integer" and r["device"] == dev}
        t = ints.get("tf32 (allow_tf32=True)") or ints.get("tf32")
        f = ints.get("fp32 (tf32 off)") or ints.get("fp32")
        if t and f:
            lines.append(f"Integer exactness on {dev}: fp32 gets {f['wrong']} of {f['entries']} wrong, TF32 "
                         f"{t['wrong']}: an 11-bit significand holds integers exactly only up to 2048.")
    sweep = [r for r in rows if r["section"] == "k_sweep"]
    if sweep:
        dev = "cuda" if any(r["device"] == "cuda" for r in sweep) else "cpu"
        for mode in ("tf32", "tf32 (allow_tf32=True)", "fp32", "fp32 (tf32 off)"):
            s = sorted((r for r in sweep if r["device"] == dev and r["mode"] == mode), key=lambda r: r["k"])
            if len(s) >= 2 and s[0]["rel_l2"] > 0:
                lines.append(f"{mode} on {dev}: relative error {s[0]['rel_l2']:.2e} at K={s[0]['k']}, "
                             f"{s[-1]['rel_l2']:.2e} at K={s[-1]['k']} ({s[-1]['rel_l2'] / s[0]['rel_l2']:.2f}x). "
                             "Input rounding adds K independent errors and the dot product grows like sqrt(K) "
                             "too, so its share stays flat; what grows is the accumulation's.")
    return lines
