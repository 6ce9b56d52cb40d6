"""GPU timing shared by the benchmarks: CUDA events, warm-up, p10 / median /
p90 of at least 20 samples, rotating input buffers so the 50 MB L2 of an H200 does not flatter small
shapes, and the device copy bandwidth that every GB/s figure is set beside."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from precisionlab.runtime.torch_import import import_torch

L2_FLUSH_BYTES = 256 << 20  # several times any current L2
# A spin kernel of ~1 ms (at ~2 GHz) ahead of each timed sample: the host
# queues every launch of the sample while it runs, so a kernel shorter than
# one launch through Python and ctypes (~5-10 us) is timed, not the host.
SPIN_CYCLES = 2_000_000


def rotating_buffers(n: int, dtype, seed: int, min_total: int = L2_FLUSH_BYTES) -> list:
    """Enough copies of an n-element random tensor that cycling through them
    never hits in L2 (at least two)."""
    t = import_torch()
    g = t.Generator(device="cuda").manual_seed(seed)
    one = t.randn(n, device="cuda", dtype=t.float32, generator=g).to(dtype)
    k = max(2, math.ceil(min_total / max(1, one.numel() * one.element_size())))
    return [one] + [one.clone() for _ in range(k - 1)]


MIN_SAMPLES = 20  # p10 and p90 need at least this many to mean anything


@dataclass(frozen=True)
class Timing:
    """Per-call milliseconds over `samples` samples: p10, median, p90."""

    p10: float
    median: float
    p90: float
    samples: int

    def fields(self) -> dict:
        """The JSON row's fields, in seconds like every time in the JSON (docs/json.md)."""
        return {"time_s": self.median * 1e-3, "p10_s": self.p10 * 1e-3, "p90_s": self.p90 * 1e-3,
                "samples": self.samples}


def _quantile(sorted_times: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    pos = q * (len(sorted_times) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_times) - 1)
    return sorted_times[lo] + (sorted_times[hi] - sorted_times[lo]) * (pos - lo)


def time_ms(fn, iters: int, warmup: int = 5, reps: int = 10) -> Timing:
    """Per-call time of fn(i) over max(iters, MIN_SAMPLES) samples. Each sample
    times `reps` back-to-back calls between two CUDA events, queued behind a
    spin kernel so that none of them waits for the host."""
    t = import_torch()
    iters = max(iters, MIN_SAMPLES)
    for i in range(warmup):
        fn(i)
    t.cuda.synchronize()
    spin = getattr(t.cuda, "_sleep", None)
    times = []
    k = 0
    for _ in range(iters):
        start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        if spin is not None:
            spin(SPIN_CYCLES)
        start.record()
        for _ in range(reps):
            fn(k)
            k += 1
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    times.sort()
    return Timing(_quantile(times, 0.1), statistics.median(times), _quantile(times, 0.9), len(times))


@dataclass(frozen=True)
class Copy:
    ms: float
    gbps: float  # read + write bytes over time


def copy_bandwidth(nbytes: int, iters: int) -> Copy:
    t = import_torch()
    n = nbytes // 4
    srcs = rotating_buffers(n, t.float32, 0)
    dsts = [t.empty_like(s) for s in srcs]
    ms = time_ms(lambda i: dsts[i % len(dsts)].copy_(srcs[i % len(srcs)]), iters).median
    return Copy(ms, 2 * n * 4 / (ms * 1e-3) / 1e9)
