"""accumulate's CPU side: memory that stays flat and rows that use every core.

Memory, in bytes per element n, beside the 8 n of the stored values:
  - while the input is made: the intended values (8 n); the rounding to the
    storage format runs in chunks, so its temporaries are a chunk's;
  - the exact sums stream their values to math.fsum a chunk at a time (the sum
    of |x| too), and the intended values are dropped once theirs is taken;
  - the sequential, pairwise, Kahan, Neumaier and stochastic kernels stream
    over the stored values and hold O(1) (pairwise: O(log n));
  - the permuted orders need a whole array: reverse holds one copy (8 n); sorted
    and sorted_desc a copy and, while it is sorted, one work array (16 n; a radix
    sort in the library, no index array). One order exists at a time; its rows
    run, then it is dropped.
  - --trace keeps the running sum of each sequential-kind row (8 n each).
memory_estimate() adds these up; accumulate refuses (exit 2) before allocating
when the estimate exceeds what the machine has.

Rows are independent, and each kernel call releases the GIL (ctypes), so rows
run on threads.workers() threads, while the main thread takes the exact sums.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from precisionlab import inputs, metrics, native, threads
from precisionlab.formats import Format

# The reordered variants (the catalog's order column) by name: each runs its
# kernel on the input as permuted by _order.
ORDERS = {v.name: v.order for v in native.variants("sum", "cpu") if v.order != "as_given"}
CHUNK = 1 << 18  # values per chunk of rounding / fsum: 2 MiB of float64
# Fixed costs beside the per-element ones: a rounding chunk's temporaries and
# thread stacks; and, unless the input is constant (its sums are products),
# fsum's Python floats for about two chunks (32 bytes each).
FIXED_BYTES = 16 << 20
FSUM_BYTES = 64 * CHUNK


def memory_estimate(n: int, orders: bool, traced_rows: int, constant: bool = False) -> int:
    """Peak bytes accumulate allocates for n values (see the module docstring)."""
    making = 16 * n                                 # intended + stored
    running = 8 * n + (16 * n if orders else 0) + n  # stored + an order and its work + isfinite's mask
    fixed = FIXED_BYTES + (0 if constant else FSUM_BYTES)
    return max(making, running) + 8 * n * traced_rows + fixed


def check_memory(n: int, orders: bool, traced_rows: int, what: str, constant: bool = False) -> None:
    inputs.check_memory(memory_estimate(n, orders, traced_rows, constant), what)


# ---------------------------------------------------------------------------
# the input, in chunks


def round_chunked(storage: Format, intended: np.ndarray) -> np.ndarray:
    """storage.round(intended), a chunk at a time: the same values, without the
    rounding's full-size temporaries."""
    stored = np.empty(intended.size, dtype=np.float64)
    for i in range(0, intended.size, CHUNK):
        stored[i:i + CHUNK] = storage.round(intended[i:i + CHUNK])
    return stored


def exact_sum(x: np.ndarray, constant: bool | None = None) -> float:
    """metrics.exact_sum(x). For n copies of one finite value v it is n * v: a
    float64 product is the correctly rounded exact product, which is what fsum
    of the n copies returns (n < 2^53, exact as a double), and an overflow is
    inf with v's sign, as exact_sum says. (+ 0.0: fsum gives 0.0 for -0.0s.)"""
    if constant is None:
        constant = inputs.is_constant(x)
    if constant and x.size < 2**53:
        with np.errstate(over="ignore"):
            return float(np.float64(x.size) * np.float64(x[0])) + 0.0
    return metrics.exact_sum(x)


def exact_abs_sum(x: np.ndarray, exact: float) -> float:
    """metrics.exact_sum(np.abs(x)) without the full-size |x|: one sign (the usual
    case) is +-exact; mixed signs stream |x| to fsum a chunk at a time."""
    if not np.isnan(exact):
        if bool(np.all(x >= 0)):
            return exact + 0.0  # + 0.0: an all -0.0 input sums to -0.0, its |x| to 0.0
        if bool(np.all(x <= 0)):
            return -exact + 0.0
    if any(bool(np.isnan(x[i:i + CHUNK]).any()) for i in range(0, x.size, CHUNK)):
        return math.nan
    chunks = (np.abs(x[i:i + CHUNK]).tolist() for i in range(0, x.size, CHUNK))
    try:
        return math.fsum(itertools.chain.from_iterable(chunks))
    except OverflowError:  # inf among the terms, or a finite sum beyond the double range
        return math.inf


# ---------------------------------------------------------------------------
# rows on worker threads


def _order(stored: np.ndarray, order: str, out: np.ndarray, work: list) -> np.ndarray:
    """The permutation written into out; work[0] is the sort's work array, made once
    (fresh pages for every order cost seconds of page faults at 10^8)."""
    if order == "reversed":
        np.copyto(out, stored[::-1])
        return out
    if not work:
        work.append(np.empty_like(stored))
    # sorted: increasing |x|, best when the terms share a sign; sorted_desc:
    # decreasing |x|, best under heavy cancellation. Stable, NaN last, as
    # numpy's stable argsort of |x| and of -|x| order them.
    return native.sort_by_magnitude(stored, descending=order == "descending_abs", out=out, work=work[0])


def permuted(stored: np.ndarray, name: str) -> np.ndarray:
    """The reordered variant `name`'s permutation of stored, in a new array."""
    return _order(stored, ORDERS[name], np.empty_like(stored), [])


class CpuRows:
    """Runs the CPU rows [(acc, method), ...] on worker threads, starting at once;
    results() hands each back in the given order, as (CpuSum, seconds)."""

    def __init__(self, stored: np.ndarray, jobs: list[tuple[Format, str]], seed: int, trace: bool,
                 sequential_kind: set[str], workers: int | None = None):
        self._jobs = jobs
        self._results: dict[int, tuple] = {}
        self._done: queue.Queue = queue.Queue()
        self._pool = ThreadPoolExecutor(threads.workers(len(jobs), workers) if jobs else 1)
        self._args = (stored, seed, trace, sequential_kind)
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._feeder.start()

    def _run(self, idx: int, x: np.ndarray, acc: Format, method: str) -> None:
        _, seed, trace, sequential_kind = self._args
        try:
            t0 = time.perf_counter()  # x: already in the variant's order
            r = native.accumulate_cpu(x, acc.code, method, seed=seed, trace=trace and method in sequential_kind)
            self._done.put((idx, (r, time.perf_counter() - t0)))
        except BaseException as e:  # handed to the main thread, which raises it
            self._done.put((idx, e))

    def _feed(self) -> None:
        """Submits the unpermuted rows, then each order's rows once its array is
        made; an order is made only when the previous one's rows are done."""
        stored = self._args[0]
        by_order = {o: [(i, a, m) for i, (a, m) in enumerate(self._jobs) if m == o] for o in ORDERS}
        plain = [(i, a, m) for i, (a, m) in enumerate(self._jobs) if m not in ORDERS]
        waiting = [self._pool.submit(self._run, i, stored, a, m) for i, a, m in plain]
        held = False  # whether the rows in `waiting` read the order buffer
        buf, work = None, []
        for order, jobs in by_order.items():
            if not jobs:
                continue
            if held:
                for f in waiting:
                    f.result()
            try:
                buf = np.empty_like(stored) if buf is None else buf
                x = _order(stored, ORDERS[order], buf, work)
            except BaseException as e:
                for i, _, _ in jobs:
                    self._done.put((i, e))
                continue
            waiting = [self._pool.submit(self._run, i, x, a, m) for i, a, m in jobs]
            held = True
            del x

    def results(self, advance=lambda k=1: None):
        try:
            for _ in self._jobs:
                idx, r = self._done.get()
                self._results[idx] = r
                advance()
        finally:
            self._feeder.join()
            self._pool.shutdown(wait=True)
        for idx, job in enumerate(self._jobs):
            r = self._results[idx]
            if isinstance(r, BaseException):
                raise r
            yield job, r
