"""One rank of the tensor-parallel experiment (started by experiments/tp.py).

Run as `python -m precisionlab.experiments.tp_rank JOB.json RANK`. The job file
is written by the parent, never by a user. The rank joins the parent's
TCPStore on 127.0.0.1, makes one gloo group per world size (ranks 0 .. P-1,
each a gloo context of size P), computes its shard of the row-parallel linear
layer X[:, K_r] @ W[K_r, :] and all-reduces it, `runs` times, then once more
inside a larger buffer. It writes what it saw to RANK.npz in the job's folder
and exits; any failure is one line on stderr and exit status 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time


def _die_with_parent() -> None:
    """SIGKILL this rank when the process that started it dies (Linux), so a
    killed parent leaves no rank behind."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _work(job: dict, rank: int) -> None:
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist

    from precisionlab.experiments.tp import TORCH_DTYPES, big_layout, tp_inputs

    torch.set_num_threads(1)
    timeout = timedelta(seconds=job["timeout_s"])
    store = dist.TCPStore("127.0.0.1", job["port"], is_master=False, timeout=timeout)
    world = job["world"]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    groups = {p: dist.new_group(list(range(p))) for p in job["world_sizes"]}  # every rank takes part in each
    if job.get("fail_rank") == rank:  # tests: its peers then fail in their next all_reduce
        raise RuntimeError("injected failure (test)")
    m, k, n = job["m"], job["k"], job["n"]
    x32, w32 = tp_inputs(job["seed"], m, k, n)
    out: dict[str, np.ndarray] = {}
    for dtype in job["dtypes"]:
        td = getattr(torch, TORCH_DTYPES[dtype])
        x, w = torch.from_numpy(x32).to(td), torch.from_numpy(w32).to(td)
        if rank == 0:  # the stored inputs, for the parent's float64 reference
            out[f"{dtype}/x"], out[f"{dtype}/w"] = x.float().numpy(), w.float().numpy()
        for p in job["world_sizes"]:
            if rank >= p:
                continue
            lo, hi = rank * k // p, (rank + 1) * k // p
            xs, ws = x[:, lo:hi].contiguous(), w[lo:hi].contiguous()  # this rank's shard, as an engine holds it
            digests, first, first_part, lo_v, hi_v = [], None, None, None, None
            for _ in range(job["runs"]):
                part = xs @ ws
                buf = part.clone()
                dist.all_reduce(buf, group=groups[p])
                v = buf.float()  # exact for bf16: the bits compare as well as the bf16 bits
                digests.append(hashlib.sha256(v.numpy().tobytes()).digest())
                if first is None:
                    first, first_part, lo_v, hi_v = v, part, v, v
                lo_v, hi_v = torch.minimum(lo_v, v), torch.maximum(hi_v, v)
            big_n, offset = big_layout(m * n)
            big = torch.zeros(big_n, dtype=td)
            big[offset:offset + m * n] = first_part.flatten()
            dist.all_reduce(big, group=groups[p])
            key = f"{dtype}/{p}"
            out[f"{key}/partial"] = first_part.float().numpy()
            out[f"{key}/out"] = first.numpy()
            out[f"{key}/lo"], out[f"{key}/hi"] = lo_v.numpy(), hi_v.numpy()
            out[f"{key}/distinct"] = np.array(len(set(digests)))
            out[f"{key}/big"] = big[offset:offset + m * n].float().numpy().reshape(m, n)
    dist.destroy_process_group()
    path = os.path.join(job["dir"], f"{rank}.npz")
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        np.savez(f, **out)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    _die_with_parent()
    job_path, rank = argv[0], int(argv[1])
    with open(job_path) as f:
        job = json.load(f)
    if os.getppid() != job["parent_pid"]:  # the parent died before prctl took effect
        return 1
    try:
        if job.get("hang_rank") == rank:
            time.sleep(3600)
        _work(job, rank)
    except Exception as e:  # one line for the parent to show, with when it happened
        line = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        print(line, file=sys.stderr, flush=True)
        try:
            with open(os.path.join(job["dir"], f"{rank}.fail"), "w") as f:
                f.write(f"{time.time()!r}\t{line}\n")
        except OSError:
            pass
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
