"""accumulate's CPU side: memory that stays flat and rows that use every core.

Memory, in bytes per element n, beside the 8 n of the stored values:
  - the input: the intended values' exact sum is taken first, then they are
    rounded to the storage format where they lie, a chunk at a time: the
    stored values are the intended values' array, and the rounding's
    temporaries are a chunk's;
  - the exact sums (of |x| too) run through the library's superaccumulator
    (pl_exact_sum_terms: 17 KiB), which hands math.fsum at most a few thousand
    doubles with the same exact sum; a sign test on the stored values holds a
    mask (n);
  - the sequential, pairwise, Kahan, Neumaier and stochastic kernels stream
    over the stored values and hold O(1) (pairwise: O(log n));
  - the permuted orders need whole arrays: one, 8 n, for stored values that
    are float32 values (every storage format but fp64): the library's radix
    sort runs in that array's bytes (32-bit values in its two halves, then
    widened in place), sorted_desc is made from sorted in place once sorted's
    rows are done (one pass), and reverse, a copy, follows in the same array.
    fp64 storage adds the sort's work array (16 n): sorted_desc is made in it,
    and its rows run beside sorted's. No index array either way.
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
from fractions import Fraction

import numpy as np

from precisionlab import native
from precisionlab.io import inputs
from precisionlab.numerics import metrics
from precisionlab.runtime import threads
from precisionlab.errors import UsageError
from precisionlab.catalog.formats import Format

# The reordered variants (the catalog's order column) by name: each runs its
# kernel on the input as CpuRows permutes it (native.arranged for one array alone).
ORDERS = {v.name: v.order for v in native.variants("sum", "cpu") if v.order != "as_given"}
CHUNK = 1 << 18  # values per chunk of rounding: 2 MiB of float64
# Fixed costs beside the per-element ones: a rounding chunk's temporaries and
# the threads' stacks (3 to 9 MiB measured at 2-8 million values).
FIXED_BYTES = 8 << 20


def memory_estimate(n: int, orders: bool, traced_rows: int, narrow: bool = True) -> int:
    """Peak bytes accumulate allocates for n values (see the module docstring);
    narrow: the stored values are float32 values (storage other than fp64)."""
    order_bytes = (8 if narrow else 16) * n if orders else 0
    running = 8 * n + order_bytes + n  # stored + the orders' arrays + a sign test's mask
    return running + 8 * n * traced_rows + FIXED_BYTES


def check_memory(n: int, orders: bool, traced_rows: int, what: str, narrow: bool = True) -> None:
    inputs.check_memory(memory_estimate(n, orders, traced_rows, narrow), what)


# ---------------------------------------------------------------------------
# the input, in chunks


def round_in_place(storage: Format, x: np.ndarray) -> np.ndarray:
    """storage.round(x), written over x (a writable float64 array) a chunk at a
    time, and returned: the same values, without a second full-size array or
    the rounding's full-size temporaries (or the first touch of fresh pages,
    a second or so a GiB on a virtual machine)."""
    if storage.name == "fp64":
        return x  # round is a copy
    for i in range(0, x.size, CHUNK):
        x[i:i + CHUNK] = storage.round(x[i:i + CHUNK])
    return x


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
    terms, special = native.exact_sum_terms(x)
    # The terms' exact sum is x's, so their fsum is x's, bit for bit, as is the
    # wide path's answer where fsum overflows. special: NaN, inf, or a sum near
    # the double range: x itself, as before.
    return metrics.exact_sum(np.array(terms) if special == 0 else x)


def exact_sum_fraction(x: np.ndarray, constant: bool | None = None) -> Fraction | None:
    """The exact sum of x as a rational (None when x holds a NaN or an
    infinity): what errors are measured against, since the double exact_sum
    returns is that value rounded, and |result - double| is not |result - sum|
    (1 + 1e-30 summed in fp64 is 1.0, the sum's double, 1e-30 away from it).
    Through the library's exact terms, a chunk at a time; a chunk whose sum
    nears the double range adds its values one by one."""
    if constant is None:
        constant = inputs.is_constant(x)
    if x.size == 0:
        return Fraction(0)
    if constant:
        v = float(x[0])
        return Fraction(x.size) * Fraction(v) if math.isfinite(v) else None
    acc = metrics.ExactSum()
    for i in range(0, x.size, CHUNK):
        if not acc.add(x[i:i + CHUNK]):
            break
    return acc.total()


def exact_abs_sum(x: np.ndarray, exact: float) -> float:
    """metrics.exact_sum(np.abs(x)) without the full-size |x|: one sign (the usual
    case) is +-exact; mixed signs go through the library's exact terms (or,
    near the double range, stream |x| to fsum a chunk at a time)."""
    if not np.isnan(exact):
        if bool(np.all(x >= 0)):
            return exact + 0.0  # + 0.0: an all -0.0 input sums to -0.0, its |x| to 0.0
        if bool(np.all(x <= 0)):
            return -exact + 0.0
    terms, special = native.exact_sum_terms(x, absolute=True)
    if special == 0:  # the terms' exact sum is sum|x|: their fsum is that of |x|
        return metrics.exact_sum(np.array(terms))
    if any(bool(np.isnan(x[i:i + CHUNK]).any()) for i in range(0, x.size, CHUNK)):
        return math.nan
    if special == 1:  # an infinity, and no NaN
        return math.inf
    chunks = (np.abs(x[i:i + CHUNK]).tolist() for i in range(0, x.size, CHUNK))
    try:
        return math.fsum(itertools.chain.from_iterable(chunks))
    except OverflowError:  # inf among the terms, or a finite sum beyond the double range
        return math.inf


# ---------------------------------------------------------------------------
# rows on worker threads


class CpuRows:
    """Runs the CPU rows [(acc, method), ...] on worker threads, starting at once;
    results() hands each back in the given order, as (CpuSum, seconds)."""

    def __init__(self, stored: np.ndarray, jobs: list[tuple[Format, str]], seed: int, trace: bool,
                 sequential_kind: set[str], workers: int | None = None, narrow: bool = False):
        self._jobs = jobs
        self._narrow = narrow  # every stored value is a float32 value: the sort needs no work array
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
        """Submits the unpermuted rows; sorts while they run (the order's pages
        are touched off the rows' path); submits the sorted rows, then
        sorted_desc's (made from sorted: beside it in the work array of a wide
        sort, in place once sorted's rows are done after a narrow one), then,
        once those are done, reverse's in the same array. Sorted: increasing
        |x|, best when the terms share a sign; sorted_desc: decreasing |x|, best
        under heavy cancellation. Stable, NaN last, as numpy's stable argsort
        of |x| and of -|x| order them."""
        stored = self._args[0]
        by_order = {kind: [(i, a, m) for i, (a, m) in enumerate(self._jobs) if ORDERS.get(m) == kind]
                    for kind in ("ascending_abs", "descending_abs", "reversed")}
        plain = [(i, a, m) for i, (a, m) in enumerate(self._jobs) if m not in ORDERS]
        for i, a, m in plain:
            self._pool.submit(self._run, i, stored, a, m)
        submit = lambda x, jobs: [self._pool.submit(self._run, i, x, a, m) for i, a, m in jobs]
        fail = lambda jobs, e: [self._done.put((i, e)) for i, _, _ in jobs]
        wait = lambda futures: [f.result() for f in futures]
        buf, waiting = None, []
        if by_order["ascending_abs"] or by_order["descending_abs"]:
            work = None
            try:
                buf = np.empty_like(stored)
                done = False
                if self._narrow:
                    try:
                        done = native.sort_float32_by_magnitude(stored, out=buf) is buf
                    except UsageError:  # a value that is not a float32 value after all
                        pass
                if not done:
                    work = np.empty_like(stored)
                    native.sort_by_magnitude(stored, out=buf, work=work)
                waiting += submit(buf, by_order["ascending_abs"])
            except BaseException as e:
                fail(by_order["ascending_abs"] + by_order["descending_abs"], e)
            else:
                if by_order["descending_abs"]:
                    try:
                        if work is None:
                            wait(waiting)  # sorted's rows read buf
                        desc = native.reverse_magnitude_order(buf, out=buf if work is None else work)
                        waiting += submit(desc, by_order["descending_abs"])
                    except BaseException as e:
                        fail(by_order["descending_abs"], e)
            del work  # sorted_desc's rows hold it while they run
        if by_order["reversed"]:
            wait(waiting)  # they read buf
            try:
                buf = np.empty_like(stored) if buf is None else buf
                np.copyto(buf, stored[::-1])
                submit(buf, by_order["reversed"])
            except BaseException as e:
                fail(by_order["reversed"], e)

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
