"""bench: every kernel of the project measured side by side in one run.

GPU figures are GB/s from CUDA events (warm-up, then the median of many runs,
with rotating input buffers), beside torch and beside the device copy
bandwidth measured in the same run. CPU figures are one core's time (the
least of three runs on the thread's CPU clock) beside numpy.sum over the same
values, and per element.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from precisionlab import native
from precisionlab.runtime import devices, memory, torch_flags
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.errors import UsageError
from precisionlab.runtime.torch_import import import_torch

SECTIONS = ("accumulate", "softmax", "matmul", "attention")
SOFTMAX_SHAPES = [(4096, 1024), (4096, 4096), (4096, 16384), (1024, 32768), (512, 151936), (64, 262144)]
# What bench times comes from the library's catalog: every GPU variant that is
# not a deliberate bug and gives a row the same bits in any batch.
SOFTMAX_KERNELS = [v.name for v in native.variants("softmax", "cuda") if v.kind != "bug" and v.batch_invariant]
SUM_KERNELS = [v.name for v in native.variants("sum", "cuda")]
GPU_N = 1 << 28  # the tree sum's target size: 1 GiB of fp32, far past any L2


@dataclass
class BenchConfig:
    quick: bool = False
    device: str = "auto"
    sections: str | None = None
    seed: int = 0
    cpu_n: int | None = None   # default 10^8 (10^7 with --quick)
    gpu_n: int | None = None   # default GPU_N, --quick too: the size the sum targets are set at


@dataclass
class BenchResult:
    params: dict
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run(cfg: BenchConfig, advance=lambda k=1: None) -> BenchResult:
    sections = inputs.parse_choices(cfg.sections, SECTIONS, "bench section")
    plan = devices.resolve(cfg.device)
    gpu_only = [s for s in sections if s in GPU_ONLY_SECTIONS]
    if cfg.sections is not None and gpu_only and cfg.device.lower() == "cpu":
        raise UsageError(f"bench {', '.join(gpu_only)} runs only on the GPU (--device cuda or auto); "
                         f"on the CPU only accumulate and attention are benchmarked")
    cpu_n = cfg.cpu_n or (10**7 if cfg.quick else 10**8)
    gpu_n = cfg.gpu_n or GPU_N
    res = BenchResult(params={"quick": cfg.quick, "device": cfg.device, "sections": sections, "seed": cfg.seed,
                              "cpu_n": cpu_n, "gpu_n": gpu_n})
    if "accumulate" in sections and plan.cpu:
        inputs.check_memory(memory.bench_cpu(cpu_n), f"bench accumulate --cpu-n {cpu_n}")
    if "accumulate" in sections:
        if plan.cpu:
            res.rows += accumulate_cpu(cpu_n, cfg.seed, advance)
            res.rows += accumulate_cpu_orders(cpu_n, cfg.seed, res.rows, advance)
            per_element(res.rows)
        if plan.cuda:
            res.rows += accumulate_gpu(gpu_n, cfg.seed, cfg.quick, advance)
    if "attention" in sections and plan.cpu:
        res.rows += attention_cpu(cfg.seed, cfg.quick, advance)
    if "softmax" in sections and plan.cuda:
        res.rows += softmax_gpu(cfg.seed, cfg.quick, advance)
    if "matmul" in sections and plan.cuda:
        res.rows += matmul_gpu(cfg.seed, cfg.quick, advance)
    if plan.cuda_unavailable:
        res.notes.append(f"GPU benchmarks skipped: {plan.cuda_unavailable}")
    return res


GPU_ONLY_SECTIONS = ("softmax", "matmul")  # this project's CPU kernels there are references, not benchmarks

# vs_baseline is always baseline time / kernel time: above 1 is faster.

# ---------------------------------------------------------------------------
# accumulate, CPU

ACCUMULATE_CPU_METHODS = [v.name for v in native.variants("sum", "cpu") if v.order == "as_given"]
ACCUMULATE_CPU_ACCS = formats.DEFAULT_ACCUMULATORS  # accumulate's own default rows
# The reordered variants run their kernel on the permuted data; their rows
# time that kernel (making the permutation is not in the time).
# the reordered variants by name, with the input order each runs on (the catalog's order column)
ACCUMULATE_CPU_ORDERS = {v.name: v.order for v in native.variants("sum", "cpu") if v.order != "as_given"}


def accumulate_cpu(n: int, seed: int, advance) -> list[dict]:
    """Each CPU kernel once over n fp32-stored normal values, beside numpy.sum
    of the same float32 array (median of 5). GB/s counts the bytes each one
    reads: numpy.sum the float32 array (4 bytes a value), the kernels the
    float64 array they take (8 bytes a value)."""
    x32 = np.random.default_rng(seed).standard_normal(n, dtype=np.float32)
    x64 = x32.astype(np.float64)
    t_np = statistics.median(_wall(lambda: np.sum(x32)) for _ in range(5))
    advance()
    rows = [{"section": "accumulate", "device": "cpu", "variant": "numpy.sum", "dtype": "fp32", "accumulator": "fp32",
             "n": n, "time_s": t_np, "bytes_read": x32.nbytes, "gbps": x32.nbytes / t_np / 1e9,
             "vs_baseline": 1.0, "baseline": "numpy.sum"}]
    for acc in ACCUMULATE_CPU_ACCS:
        code = formats.get(acc).code
        for m in ACCUMULATE_CPU_METHODS:
            t = _wall(lambda: native.accumulate_cpu(x64, code, m))
            advance()
            rows.append({"section": "accumulate", "device": "cpu", "variant": m, "dtype": "fp32", "accumulator": acc,
                         "n": n, "time_s": t, "bytes_read": x64.nbytes, "gbps": x64.nbytes / t / 1e9,
                         "vs_baseline": t_np / t,
                         "baseline": "numpy.sum"})
    return rows


def accumulate_cpu_orders(n: int, seed: int, rows: list[dict], advance) -> list[dict]:
    """Each reordered variant's kernel over its permutation of the fp32 values,
    beside the numpy.sum row accumulate_cpu measured on the same values."""
    base = next(r for r in rows if r["device"] == "cpu" and r["variant"] == "numpy.sum")
    t_np = base["time_s"]
    x64 = np.random.default_rng(seed).standard_normal(n, dtype=np.float32).astype(np.float64)
    out = []
    for order, arrangement in ACCUMULATE_CPU_ORDERS.items():
        x = native.arranged(x64, arrangement)
        for acc in ACCUMULATE_CPU_ACCS:
            code = formats.get(acc).code
            t = _wall(lambda: native.accumulate_cpu(x, code, order))
            advance()
            out.append({"section": "accumulate", "device": "cpu", "variant": order, "dtype": "fp32", "accumulator": acc,
                        "n": n, "time_s": t, "gbps": base["gbps"] * t_np / t, "vs_baseline": t_np / t,
                        "baseline": "numpy.sum"})
        x = None  # freed before the next order's permutation is built
    return out


def per_element(rows: list[dict]) -> None:
    """Adds ns_per_element and x_numpy_sum (kernel time / numpy.sum time, one run
    each, same values) to the CPU accumulate rows: what the speed targets are in."""
    cpu = [r for r in rows if r["section"] == "accumulate" and r["device"] == "cpu"]
    base = next((r for r in cpu if r["variant"] == "numpy.sum"), None)
    for r in cpu:
        r["ns_per_element"] = r["time_s"] * 1e9 / r["n"]
        r["x_numpy_sum"] = r["time_s"] / base["time_s"] if base else None


def _wall(fn, reps: int = 3) -> float:
    """Seconds fn takes on one core: the least of `reps` runs, each timed by the
    calling thread's CPU clock. Every CPU figure here is single-threaded, and on a
    shared machine the wall clock also counts other processes' time slices (the
    least of three wall times still did: 1.3 to 9 ns for one kernel)."""
    best = math.inf
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


# ---------------------------------------------------------------------------
# attention, CPU: the FlashAttention emulator (experiments/attention.py)

ATTENTION_SHAPE = (8192, 8192, 128)  # keys, query rows (one head of self-attention), d


def attention_cpu(seed: int, quick: bool, advance) -> list[dict]:
    """One emulated head at attention's default knobs (P bf16, fp32
    accumulation), untracked, thread CPU time, once; --quick: 1024 query rows.
    A time, never a test: the emulator is a model, not a kernel."""
    from precisionlab.numerics import flash_attention as fa

    seq, rows, dim = ATTENTION_SHAPE
    rows = 1024 if quick else rows
    flash = fa.FlashConfig()
    peak = max((m.peak_bytes(min(rows, fa.CHUNK_ROWS), dim, min(flash.block_c, seq))
                for m in (fa.model(flash.pv_accumulator), fa.model(flash.qk_accumulator)) if m is not None), default=0)
    inputs.check_memory(memory.attention(rows, seq, dim, flash.block_c, fa.CHUNK_ROWS, peak),
                        f"bench attention ({rows} rows, {seq} keys, d {dim})")
    rng = np.random.default_rng([seed, 0])  # attention's draw of its first --std (1.0)
    k, v = rng.standard_normal((seq, dim)), rng.standard_normal((seq, dim))
    q = rng.standard_normal((rows, dim))
    t0 = time.thread_time()
    fa.attention(q, k, v, flash, track=False)
    got = {"rows": rows, "time_s": time.thread_time() - t0}
    advance()
    n = got["rows"] * seq
    return [{"section": "attention", "device": "cpu", "variant": "flash_emulator", "dtype": "bf16",
             "accumulator": "fp32", "n": n, "shape": [got["rows"], seq, dim], "time_s": got["time_s"],
             "gbps": 0.0, "ns_per_score": got["time_s"] * 1e9 / n, "vs_baseline": None, "baseline": None}]


# ---------------------------------------------------------------------------
# accumulate, GPU


def accumulate_gpu(n: int, seed: int, quick: bool, advance) -> list[dict]:
    from precisionlab.runtime import cuda_timing as ct

    torch = import_torch()
    iters = 20 if quick else 50
    rows = []
    copy = ct.copy_bandwidth(n * 4, iters)
    advance()
    rows.append({"section": "accumulate", "device": "cuda", "variant": "copy", "dtype": "fp32",
                 "accumulator": None, "n": n, "time_s": copy.ms * 1e-3, "gbps": copy.gbps, "vs_baseline": None,
                 "baseline": None, "pct_of_copy": 100.0})
    for storage, tdtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        bufs = ct.rotating_buffers(n, tdtype, seed)
        nbytes = n * bufs[0].element_size()
        # outputs rotate for torch as for the project's kernels
        outs = [torch.empty((), dtype=torch.float32, device="cuda") for _ in bufs]
        t_torch = ct.time_ms(lambda i: torch.sum(bufs[i % len(bufs)], 0, dtype=torch.float32, out=outs[i % len(outs)]),
                             iters)
        advance()
        rows.append(_gpu_row("torch.sum", storage, "fp32", n, t_torch, nbytes, t_torch.median, copy.gbps))
        code = formats.get(storage).code
        work = torch.empty(native.sum_workspace_bytes(n, code, "tree"), dtype=torch.uint8, device="cuda")
        dsts = [torch.empty(1, dtype=torch.float64, device="cuda") for _ in bufs]
        for acc in formats.TIMED_ACCUMULATORS:
            for method in SUM_KERNELS:
                acode = formats.get(acc).code
                t = ct.time_ms(lambda i: native.sum_cuda_device(bufs[i % len(bufs)].data_ptr(), n, code, acode,
                                                                method, work.data_ptr(), work.numel(),
                                                                dsts[i % len(dsts)].data_ptr()), iters)
                advance()
                rows.append(_gpu_row(method, storage, acc, n, t, nbytes, t_torch.median, copy.gbps))
    return rows


def _gpu_row(kernel, storage, acc, n, t, nbytes, torch_ms, copy_gbps) -> dict:
    gbps = nbytes / (t.median * 1e-3) / 1e9
    return {"section": "accumulate", "device": "cuda", "variant": kernel, "dtype": storage, "accumulator": acc,
            "n": n, **t.fields(), "gbps": gbps, "vs_baseline": torch_ms / t.median, "baseline": "torch.sum",
            "pct_of_copy": 100.0 * gbps / copy_gbps}


# ---------------------------------------------------------------------------
# softmax, GPU: effective bandwidth = 2 x tensor bytes (one read, one write) / time


def softmax_gpu(seed: int, quick: bool, advance) -> list[dict]:
    from precisionlab.runtime import cuda_timing as ct

    torch = import_torch()
    iters = 20 if quick else 30
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    rows = []
    for r, c in SOFTMAX_SHAPES:
        for storage, tdtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            bufs = ct.rotating_buffers(r * c, tdtype, seed)
            bufs = [b.view(r, c) for b in bufs]
            ys = [torch.empty_like(b) for b in bufs]  # outputs rotate too: a written tensor can sit in L2
            nbytes = 2 * bufs[0].numel() * bufs[0].element_size()
            copy = ct.copy_bandwidth(nbytes // 2, iters)
            advance()
            # torch writes into the same rotating outputs (aten::_softmax.out), so
            # neither side gets an output that is still in L2
            t_torch = ct.time_ms(lambda i: torch.ops.aten._softmax.out(bufs[i % len(bufs)], -1, False,
                                                                        out=ys[i % len(ys)]), iters)
            advance()
            base = {"section": "softmax", "device": "cuda", "dtype": storage, "accumulator": "fp32",
                    "n": r * c, "shape": [r, c], "baseline": "torch.softmax"}
            rows.append({**base, "variant": "copy", "time_s": copy.ms * 1e-3, "gbps": copy.gbps,
                         "vs_baseline": None, "baseline": None, "pct_of_copy": 100.0})
            rows.append({**base, "variant": "torch.softmax", **t_torch.fields(),
                         "gbps": nbytes / (t_torch.median * 1e-3) / 1e9, "vs_baseline": 1.0,
                         "pct_of_copy": 100.0 * nbytes / (t_torch.median * 1e-3) / 1e9 / copy.gbps})
            code = formats.get(storage).code
            for k in SOFTMAX_KERNELS:
                t = ct.time_ms(lambda i: native.softmax_cuda_device(bufs[i % len(bufs)].data_ptr(), r, c, code, k,
                                                                    ys[i % len(ys)].data_ptr()), iters)
                advance()
                gbps = nbytes / (t.median * 1e-3) / 1e9
                plan = native.softmax_cuda_plan(r, c, code, k, sms)  # the launch actually run
                rows.append({**base, "variant": k, **t.fields(), "gbps": gbps, "vs_baseline": t_torch.median / t.median,
                             "pct_of_copy": 100.0 * gbps / copy.gbps,
                             **{f"plan_{f}": v for f, v in plan.items()}})
    return rows


# ---------------------------------------------------------------------------
# matmul modes, GPU: TFLOP/s through torch, with the precision flags set per mode


def matmul_gpu(seed: int, quick: bool, advance) -> list[dict]:
    from precisionlab.runtime import cuda_timing as ct

    torch = import_torch()
    n = 4096 if quick else 8192
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(n, n, device="cuda", generator=g)
    b = torch.randn(n, n, device="cuda", generator=g)
    rows = []
    base_ms = None
    for mode in (torch_flags.FP32_OFF, torch_flags.TF32_ALLOW, "bf16", "fp16"):
        xa, xb = ((a.to(torch.bfloat16), b.to(torch.bfloat16)) if mode == "bf16" else
                  (a.half(), b.half()) if mode == "fp16" else (a, b))
        with torch_flags.matmul_mode(mode) if mode not in formats.LOW_COMPUTE else torch_flags.restored_flags():
            t = ct.time_ms(lambda i: xa @ xb, 20, reps=3)
            ms = t.median
        advance()
        base_ms = base_ms or ms
        rows.append({"section": "matmul", "device": "cuda", "variant": "torch.matmul", "mode": mode, "dtype": mode.split()[0],
                     "accumulator": "fp32", "n": n, "shape": [n, n, n], **t.fields(),
                     "gbps": 3 * n * n * xa.element_size() / (ms * 1e-3) / 1e9, "tflops": 2 * n**3 / (ms * 1e-3) / 1e12,
                     "vs_baseline": base_ms / ms, "baseline": "fp32 (tf32 off)"})
    return rows + splitk_gpu(seed, quick, advance)


# The cost of determinism for split-K: a skinny output with a long K, where
# splitting K is what fills the GPU.
SPLITK_SHAPE = (512, 16384, 512)
SPLITK_SPLITS = 8


def splitk_gpu(seed: int, quick: bool, advance) -> list[dict]:
    from precisionlab.runtime import cuda_timing as ct

    torch = import_torch()
    m, k, n = SPLITK_SHAPE
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g)
    b = torch.randn(k, n, device="cuda", generator=g)
    c = torch.empty(m, n, device="cuda")
    work = torch.empty(native.matmul_workspace_bytes(m, n, "splitk_ordered", SPLITK_SPLITS), dtype=torch.uint8,
                       device="cuda")
    rows, base = [], None
    for version, splits in (("splitk_atomic", SPLITK_SPLITS), ("splitk_ordered", SPLITK_SPLITS), ("tiled", 1)):
        t = ct.time_ms(lambda i: native.matmul_cuda(a.data_ptr(), b.data_ptr(), m, n, k, formats.get("fp32").code, c.data_ptr(),
                                                    variant=version, splits=splits, work_ptr=work.data_ptr(),
                                                    work_bytes=work.numel()), 20, reps=3)
        ms = t.median
        advance()
        base = base or ms
        rows.append({"section": "matmul", "device": "cuda", "variant": version, "splits": splits, "dtype": "fp32",
                     "accumulator": "fp32", "n": m * n, "shape": [m, k, n], **t.fields(),
                     "gbps": (m * k + k * n + m * n) * 4 / (ms * 1e-3) / 1e9,
                     "tflops": 2 * m * n * k / (ms * 1e-3) / 1e12, "vs_baseline": base / ms,
                     "baseline": "splitk_atomic"})
    return rows
