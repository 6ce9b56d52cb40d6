"""Tensor-parallel nondeterminism (the `tp` section of `nondeterminism`).

A row-parallel linear layer Y = X @ W with W split along K over P ranks: rank r
computes X[:, K_r] @ W[K_r, :], and torch.distributed's all_reduce sums the
partials. Real processes, the gloo backend, on the CPU: one launch of
max(WORLD_SIZES) ranks that makes one gloo group per world size (ranks
0 .. P-1; each group is a gloo context of size P, exactly what gloo sees in a
world of P processes).

What gloo does (read in facebookincubator/gloo, gloo/allreduce.cc; torch's
ProcessGroupGloo calls gloo::allreduce with the default algorithm, which is
ring(); bcube() only when asked for): a reduce-scatter ring then a ring
allgather. The buffer is cut into S = roundup(max(ceil(bytes / 1 MiB), 2P), P)
segments of roundup(ceil(bytes / S), element size) bytes, S/P consecutive
segments per rank: chunk c (elements [c*C, (c+1)*C)) is begun by rank c - 1,
sent to rank c - 2, ..., and finished by rank c, each hop adding the local
partial to the received sum with the dtype's own `+` (bf16: fp32 add, rounded
to bf16). The allgather only copies. So the order of a sum depends on the
chunk an element lands in, i.e. on its position and on the message's length.
The library's pl_allreduce_cpu replays that order (and a binary tree's) with
exact rounding, and the replay is compared with gloo's result bit for bit.

bf16 here means what an engine does: X and W stored in bf16, each rank's
partial product rounded to bf16 by the matmul (one rounding per rank), and
every addition of the all-reduce rounded to bf16 (P - 1 more). fp32 rounds at
the same places, but to 24 bits: fp32 partials carry the fp32 matmul's own
accuracy, and the all-reduce adds only P - 1 roundings to the K - 1 of the
matmul.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.numerics.metrics import exact_mean
from precisionlab.report.console import printable
from precisionlab.runtime import interrupt
from precisionlab.errors import RunError, UsageError

WORLD_SIZES = (1, 2, 4, 8)
DTYPES = formats.TP_DTYPES
TORCH_DTYPES = {d: formats.TWINS[d][1] for d in DTYPES}  # the ranks' torch dtype names
SHAPE = {"m": 64, "k": 4096, "n": 256}  # Y is 64 x 256: 16384 outputs, each a K = 4096 dot product
MAX_RUNS = 10  # all-reduces repeated per world size: min(--runs, this)
GLOO_MAX_SEGMENT_BYTES = 1 << 20  # gloo AllreduceOptions::kMaxSegmentSize
GLOO_RING_STEP = -1  # gloo's ring sends to rank - 1
BIG_ELEMENTS = 3 * (1 << 20) + 4099  # the larger message: 12 MiB in fp32, above 2P segments of 1 MiB for P <= 4
TIMEOUT_S = 120.0
RANK_BYTES = 400 << 20  # one rank: torch (about 220 MB resident) + inputs, shards and the larger buffer


@dataclass
class TpConfig:
    seed: int = 0
    runs: int = 3
    world_sizes: tuple[int, ...] = WORLD_SIZES
    dtypes: tuple[str, ...] = DTYPES
    m: int = SHAPE["m"]
    k: int = SHAPE["k"]
    n: int = SHAPE["n"]
    timeout_s: float = TIMEOUT_S
    fail_rank: int | None = None  # tests: this rank raises once its process group is up
    hang_rank: int | None = None  # tests: this rank sleeps past the timeout


def tp_inputs(seed: int, m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """X (m x k) and W (k x n), fp32, the same in every rank and in the parent."""
    rng = np.random.default_rng(seed + 17)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def big_layout(elements: int) -> tuple[int, int]:
    """The larger buffer's length and where the data sits in it (off-centre, so
    chunk boundaries cut it differently than in its own buffer)."""
    return BIG_ELEMENTS, BIG_ELEMENTS // 2 - elements // 3


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def gloo_ring_layout(elements: int, element_size: int, ranks: int) -> dict:
    """gloo's ring() segmenting (gloo/allreduce.cc): segment count, segment
    bytes, and the chunk each rank finishes, in elements."""
    total = elements * element_size
    max_seg = element_size * max(1, GLOO_MAX_SEGMENT_BYTES // element_size)
    segments = _round_up(max(-(-total // max_seg), 2 * ranks), ranks)
    seg_bytes = _round_up(-(-total // segments), element_size)
    return {"segments": segments, "segment_bytes": seg_bytes,
            "chunk": (segments // ranks) * seg_bytes // element_size}


def gloo_ring_layout_2018(elements: int, element_size: int, ranks: int) -> dict:
    """The same in gloo's first allreduce.cc (2018): segments of
    min(bytes / 2P, 1 MiB), so a large message's last chunk is short. Kept to
    tell from the bits which of the two this torch's gloo runs."""
    total = elements * element_size
    max_seg = element_size * (GLOO_MAX_SEGMENT_BYTES // element_size)
    seg_bytes = _round_up(min(-(-total // (2 * ranks)), max_seg), element_size)
    segments = _round_up(max(-(-total // seg_bytes), 2 * ranks), ranks)
    return {"segments": segments, "segment_bytes": seg_bytes,
            "chunk": (segments // ranks) * seg_bytes // element_size}


# ---------------------------------------------------------------------------
# launching the ranks


def _why_no_gloo() -> str | None:
    try:
        import torch.distributed as dist
    except ImportError as e:
        return f"torch.distributed cannot be imported ({e})"
    if not dist.is_available() or not dist.is_gloo_available():
        return "this torch build has no gloo backend"
    return None


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return ""
    return _shown(lines[-1] if lines else "")


def _shown(line: str) -> str:
    """A line from a rank, shown as text: escaped (report.console's one rule), cut short."""
    return printable(line)[:300]


def _stop(procs: list[subprocess.Popen]) -> None:
    """Kill every rank still running and reap them all: no strays, no zombies."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the rank's own session: it and anything it started
            except (ProcessLookupError, PermissionError):
                p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def launch(cfg: TpConfig, advance=lambda k=1: None) -> dict[int, dict[str, np.ndarray]]:
    """Start max(world_sizes) ranks on 127.0.0.1, wait for them (at most
    cfg.timeout_s), and return each rank's arrays. A failed rank ends the run:
    the others are killed and RunError names the rank."""
    from datetime import timedelta

    import torch.distributed as dist

    world = max(cfg.world_sizes)
    # the parent hosts the rendezvous store on a port the kernel picks: no race
    # for a "free" port, and nothing listens beyond the loopback interface
    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=cfg.timeout_s))
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="precisionlab-tp-") as tmp:
        job = {"port": store.port, "world": world, "world_sizes": list(cfg.world_sizes), "dtypes": list(cfg.dtypes),
               "m": cfg.m, "k": cfg.k, "n": cfg.n, "seed": cfg.seed, "runs": cfg.runs, "dir": tmp,
               "timeout_s": cfg.timeout_s, "parent_pid": os.getpid(), "fail_rank": cfg.fail_rank,
               "hang_rank": cfg.hang_rank}
        job_path = os.path.join(tmp, "job.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(p for p in [_package_root(), os.environ.get("PYTHONPATH")] if p)}
        with interrupt.cleanup(lambda: _stop(procs)):  # Ctrl-C (cli._interrupted) leaves no rank behind
            try:
                for r in range(world):
                    err = open(os.path.join(tmp, f"{r}.err"), "w")
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "precisionlab.experiments.tp_rank", job_path, str(r)],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                        start_new_session=True))  # Ctrl-C reaches the parent only; it stops the ranks
                    err.close()
                _wait(procs, tmp, cfg.timeout_s, advance)
                return {r: _load(os.path.join(tmp, f"{r}.npz"), r) for r in range(world)}
            finally:
                _stop(procs)
                del store


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _wait(procs, tmp: str, timeout_s: float, advance) -> None:
    deadline = time.monotonic() + timeout_s
    done: set[int] = set()
    while len(done) < len(procs):
        for r, p in enumerate(procs):
            if r in done or p.poll() is None:
                continue
            if p.returncode != 0:
                time.sleep(0.5)  # let the ranks it took down report too, then blame the first to fail
                r = _first_failure(procs, tmp)
                why = _failure_line(tmp, r)
                try:
                    procs[r].wait(timeout=5)
                    status = _exit_text(procs[r].returncode)
                except subprocess.TimeoutExpired:
                    status = "reported, still exiting"
                raise RunError(f"tp: rank {r} of {len(procs)} failed ({status})"
                               + (f": {why}" if why else "") + "; the other ranks were stopped")
            done.add(r)
            advance()
        if time.monotonic() > deadline:
            late = [r for r in range(len(procs)) if r not in done]
            raise RunError(f"tp: rank{'s' if len(late) > 1 else ''} {', '.join(map(str, late))} of {len(procs)} "
                           f"did not finish within {timeout_s:g} s; all ranks were stopped")
        time.sleep(0.05)


def _failure_record(tmp: str, r: int) -> tuple[float, str] | None:
    """(when, line) from the rank's own failure report, if it wrote one."""
    try:
        with open(os.path.join(tmp, f"{r}.fail"), errors="replace") as f:
            when, line = f.read().rstrip("\n").split("\t", 1)
        return float(when), _shown(line)
    except (OSError, ValueError):
        return None


def _first_failure(procs, tmp: str) -> int:
    """The rank that failed first: the earliest self-reported failure (a rank
    may report and still be exiting while a peer it took down is already
    gone), else the lowest rank that exited non-zero (killed by a signal, say)."""
    reported = [(rec[0], r) for r in range(len(procs)) if (rec := _failure_record(tmp, r))]
    if reported:
        return min(reported)[1]
    return next(r for r, p in enumerate(procs) if p.poll() is not None and p.returncode != 0)


def _failure_line(tmp: str, r: int) -> str:
    rec = _failure_record(tmp, r)
    return rec[1] if rec else _last_line(os.path.join(tmp, f"{r}.err"))


def _load(path: str, rank: int) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise RunError(f"tp: rank {rank} exited 0 but its results cannot be read ({e})") from None


# ---------------------------------------------------------------------------
# what the ranks saw, against float64 and against the replay


def _same(a, b) -> np.ndarray:
    """Element-wise: the same fp32 bits (bf16 values travel as exact fp32).
    NaN never agrees."""
    a32, b32 = np.asarray(a, np.float32).ravel(), np.asarray(b, np.float32).ravel()
    return (a32.view(np.uint32) == b32.view(np.uint32)) & ~np.isnan(a32)



def _absent_rows(why_gloo: str | None, why_nccl: str, cfg: TpConfig) -> list[dict]:
    rows = []
    for backend, device, why in (("gloo", "cpu", why_gloo), ("nccl", "cuda", why_nccl)):
        if why is None:
            continue
        for dtype in cfg.dtypes:
            rows.append(_row(backend, device, dtype, None, 0, refused=why))
    return rows


def _row(backend, device, dtype, world_size, runs, **kw) -> dict:
    label = f"{backend} {dtype}" + (f", world size {world_size}" if world_size else "")
    # op and variant identify the row (the collective and the backend that ran
    # it, whose algorithm is its own field); label is the text the table shows
    return {"section": "tp", "op": "allreduce", "variant": backend, "label": label, "device": device, "runs": runs,
            "emulated": False,
            "backend": backend, "dtype": dtype, "world_size": world_size, "refused": None,
            "distinct": None, "max_spread_ulps": None, "max_abs_diff": None, "rel_spread": None, **kw}


def why_no_nccl() -> str:
    """Why there are no NCCL rows on this machine."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"NCCL needs 2 or more CUDA GPUs; torch {torch.__version__} sees none"
    count = torch.cuda.device_count()
    if count < 2:
        return f"NCCL needs 2 or more CUDA GPUs; this machine has {count}"
    return f"{count} GPUs present, but the NCCL rows (NCCL_ALGO, NCCL_PROTO per run) are not implemented yet"


def run(cfg: TpConfig, advance=lambda k=1: None) -> list[dict]:
    """The section's rows: gloo per dtype and world size, and NCCL's absence."""
    from precisionlab.io import inputs

    if cfg.seed < 0:
        raise UsageError(f"--seed must be >= 0 (got {cfg.seed})")
    if not 1 <= cfg.runs <= MAX_RUNS:
        raise UsageError(f"tp runs must be in [1, {MAX_RUNS}] (got {cfg.runs})")
    why_nccl = why_no_nccl()
    why_gloo = _why_no_gloo()
    if why_gloo:
        return _absent_rows(why_gloo, why_nccl, cfg)
    inputs.check_memory(max(cfg.world_sizes) * RANK_BYTES, f"{max(cfg.world_sizes)} tensor-parallel ranks")
    ranks = launch(cfg, advance)
    rows = []
    for dtype in cfg.dtypes:
        rows += _analyse(ranks, dtype, cfg)
        advance()
    return rows + _absent_rows(None, why_nccl, cfg)


def _analyse(ranks: dict, dtype: str, cfg: TpConfig) -> list[dict]:
    fmt = formats.get(dtype)
    es = np.dtype(fmt.dtype).itemsize
    x = ranks[0][f"{dtype}/x"].astype(np.float64)
    w = ranks[0][f"{dtype}/w"].astype(np.float64)
    ref = (x @ w).ravel()  # float64 of the stored inputs: products exact, K-term sums ~1e-16 relative
    scale = float(np.max(np.abs(ref)))
    # ulps at the output's scale: an output that cancels to near 0 has a tiny
    # ulp of its own that would inflate the count
    ulp = float(fmt.spacing(scale))
    base = ranks[0][f"{dtype}/{min(cfg.world_sizes)}/out"].ravel()
    base_err = exact_mean(np.abs(base - ref))
    rows = []
    for p in cfg.world_sizes:
        key = f"{dtype}/{p}"
        out = ranks[0][f"{key}/out"].ravel()
        big = ranks[0][f"{key}/big"].ravel()
        parts = np.stack([ranks[r][f"{key}/partial"].ravel().astype(np.float64) for r in range(p)])
        n = out.size
        big_n, offset = big_layout(n)
        lay, big_lay = gloo_ring_layout(n, es, p), gloo_ring_layout(big_n, es, p)
        old_big = gloo_ring_layout_2018(big_n, es, p)
        ring = native.allreduce_cpu(parts, fmt.code, "ring", 0, lay["chunk"], GLOO_RING_STEP)
        ring_big = native.allreduce_cpu(parts, fmt.code, "ring", offset, big_lay["chunk"], GLOO_RING_STEP)
        ring_old = native.allreduce_cpu(parts, fmt.code, "ring", offset, old_big["chunk"], GLOO_RING_STEP)
        tree = native.allreduce_cpu(parts, fmt.code, "tree")
        matches = {"ring": _same(ring, out).all() and _same(ring_big, big).all(), "tree": _same(tree, out).all()}
        err, tree_err = np.abs(out - ref), np.abs(tree - ref)
        spread = float(np.max(ranks[0][f"{key}/hi"] - ranks[0][f"{key}/lo"]))
        distinct = int(ranks[0][f"{key}/distinct"])
        rows.append(_row(
            "gloo", "cpu", dtype, p, cfg.runs,
            shape=f"{cfg.m}x{cfg.k}x{cfg.n}", elements=n, k_per_rank=cfg.k // p,
            distinct=distinct, repeat_identical=distinct == 1, max_abs_diff=spread, rel_spread=spread / scale,
            all_ranks_agree=all(_same(ranks[r][f"{key}/out"], out).all() for r in range(p)),
            differs_from_ws1=float(np.mean(~_same(out, base))),
            max_abs_diff_vs_ws1=float(np.max(np.abs(out - base))),
            max_abs_error=float(np.max(err)), mean_abs_error=exact_mean(err),
            error_ratio_to_ws1=exact_mean(err) / base_err if base_err else math.nan,
            big_elements=big_n, big_offset=offset,
            big_same_bits=bool(_same(big, out).all()), big_differs=float(np.mean(~_same(big, out))),
            algorithm=_algorithm(p, matches),
            replay_matches=bool(_same(ring, out).all()), replay_mismatches=int(np.sum(~_same(ring, out))),
            big_replay_matches=bool(_same(ring_big, big).all()),
            big_replay_2018_matches=bool(_same(ring_old, big).all()),
            # gloo's ring layout; a world of 1 only copies
            segments=lay["segments"] if p > 1 else None, segment_bytes=lay["segment_bytes"] if p > 1 else None,
            chunk_elements=lay["chunk"] if p > 1 else None,
            big_segments=big_lay["segments"] if p > 1 else None,
            big_segment_bytes=big_lay["segment_bytes"] if p > 1 else None,
            big_chunk_elements=big_lay["chunk"] if p > 1 else None,
            tree_differs_from_ring=float(np.mean(~_same(tree, ring))),
            ring_tree_max_abs_diff=float(np.max(np.abs(tree - ring))),
            ring_tree_max_ulps=float(np.max(np.abs(tree - ring)) / ulp),
            tree_max_abs_error=float(np.max(tree_err)), tree_mean_abs_error=exact_mean(tree_err),
        ))
    return rows


def _algorithm(p: int, matches: dict[str, bool]) -> str:
    """The replay(s) that gloo's bits match."""
    if p == 1:
        return "copy (size 1)"
    found = [a for a, ok in matches.items() if ok]
    if len(found) > 1:
        return " = ".join(found)  # 2 ranks: one addition per element, a + b in any order
    return found[0] if found else "unidentified"


def takeaways(rows: list[dict]) -> dict[str, str]:
    tp_rows = [r for r in rows if r["section"] == "tp"]
    if not tp_rows:
        return {}
    done = [r for r in tp_rows if not r["refused"]]
    absent = sorted({f"{r['backend']}: {r['refused']}" for r in tp_rows if r["refused"]})
    parts = []
    if done:
        multi = [r for r in done if r["world_size"] > 1]
        ok = all(r["replay_matches"] and r["big_replay_matches"] for r in multi)
        parts.append(("gloo summed in ring order: the replay matches its result bit for bit at every world size "
                      "and in both buffers" if ok else
                      "gloo's result does NOT match the ring replay everywhere: "
                      + ", ".join(f"{r['label']}: {r['replay_mismatches']} mismatches" for r in multi
                                  if not r["replay_matches"])) + ".")
        for dtype in dict.fromkeys(r["dtype"] for r in done):
            d = {r["world_size"]: r for r in done if r["dtype"] == dtype}
            sizes = sorted(d)
            errs = ", ".join(f"{d[p]['mean_abs_error']:.3g}" for p in sizes)
            changed = ", ".join(f"{100 * d[p]['differs_from_ws1']:.1f}%" for p in sizes[1:])
            ratios = ", ".join(f"{d[p]['error_ratio_to_ws1']:.2f}" for p in sizes[1:])
            parts.append(f"{dtype}: outputs changed vs world size {sizes[0]}: {changed} at world sizes "
                         f"{', '.join(map(str, sizes[1:]))}; mean error vs float64 {errs} at world sizes "
                         f"{', '.join(map(str, sizes))} (ratio to world size {sizes[0]}: {ratios}).")
        same = all(r["repeat_identical"] for r in done)
        parts.append(f"Repeated runs: {'identical bits at every size' if same else 'bits differ between runs'}; "
                     "inside a larger buffer the bits change at world sizes "
                     + (", ".join(sorted({str(r['world_size']) for r in done if not r['big_same_bits']},
                                         key=int)) or "none")
                     + " (chunk boundaries move, so an element's sum starts at another rank; with 2 ranks "
                       "every order is a + b).")
    parts += [f"{a}." for a in absent]
    return {"tp": " ".join(parts)}
