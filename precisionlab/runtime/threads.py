"""How many CPU threads a piece of work gets: sized for the work, not the machine.

torch's intra-op pool defaults to one thread per core, and its OpenMP workers
spin while they wait for the next parallel region. On the small matrices of the
embedded model that buys nothing and, beside other busy processes, costs
everything: `compare model --steps 50` took 0.7 s idle, 3.1 s beside two
busy-looping processes and a minute beside another torch job, and 0.9 s with
one thread in every case (issue 19). So every command that runs torch on the CPU
asks here for a count fitted to its largest operation, and `--threads N`
overrides. Independent CPU rows (accumulate) use `workers()` threads.

Never imports torch at module level: `--help` and the CPU paths stay torch-free.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from precisionlab.errors import UsageError
from precisionlab.runtime.torch_import import import_torch

# One more thread per this many floating-point operations in the largest
# operation: ~2-5 ms of one core's fp32 work, well above the cost of waking a
# thread pool for a parallel region (tens of microseconds) and of the spinning
# that follows it.
FLOPS_PER_THREAD = 1e8


def cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def for_work(flops: float) -> int:
    """Threads for an operation of `flops` floating-point operations: 1 below
    FLOPS_PER_THREAD, one more per FLOPS_PER_THREAD after, at most the cores."""
    if not flops > 0:
        return 1
    return int(max(1, min(cores(), flops // FLOPS_PER_THREAD)))


# --threads above this many per core buys nothing and, far above it, ends the
# process: torch's OpenMP pool fails to create its threads (`libgomp: Thread
# creation failed`, exit 1 at 20000 on a 2-core machine) or segfaults (100000).
MAX_PER_CORE = 4


def max_threads() -> int:
    return MAX_PER_CORE * cores()


def check(threads: int | None) -> int | None:
    """A --threads value: None (choose by size), or 1 ... max_threads()."""
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be at least 1 (got {threads})")
    if threads is not None and threads > max_threads():
        raise UsageError(f"--threads must be at most {max_threads()} ({MAX_PER_CORE} per core, {cores()} "
                         f"cores here; got {threads})")
    return threads


def choose(threads: int | None, flops: float) -> int:
    """--threads when given, else the count for the work's size."""
    return check(threads) or for_work(flops)


def workers(tasks: int, threads: int | None = None) -> int:
    """Threads for `tasks` independent CPU tasks (each a single-threaded kernel)."""
    return max(1, min(tasks, check(threads) or cores()))


@contextmanager
def torch_scope():
    """Restores torch's intra-op thread count on exit; inside, `fit_torch` sets it."""
    torch = import_torch(optional=True)
    before = torch.get_num_threads() if torch else None
    try:
        yield
    finally:
        if torch:
            torch.set_num_threads(before)


def scoped(threads: int | None, work, *args):
    """work(*args) with --threads checked and torch's thread count restored
    after: how every command that sizes torch's threads runs."""
    check(threads)
    with torch_scope():
        return work(*args)


def fit_torch(threads: int | None, flops: float) -> int:
    """Set torch's intra-op threads for work of `flops` (or to --threads); the count."""
    n = choose(threads, flops)
    torch = import_torch(optional=True)
    if torch and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
