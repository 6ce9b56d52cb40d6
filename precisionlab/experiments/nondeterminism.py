"""nondeterminism: run-to-run and batch-size variation, and how to remove it.

Sections
  atomics     one fp32 sum, N times: atomicAdd of block partials vs a two-pass
              tree. The CPU emulates atomics by adding the same block partials
              in a seeded random arrival order each run.
  splitk      a matmul with K split in slices: slices combined by atomics vs in
              slice order vs not split at all.
  batch       row 0's result alone and inside batches of 1 ... 1024 rows:
              torch's matmul, and this project's softmax and RMSNorm with a
              batch-dependent launch vs the batch-invariant one.
  torch_ops   torch's index_add_ and scatter_add_ (atomics), and a cuBLAS mm,
              then the same under torch.use_deterministic_algorithms(True),
              which needs CUBLAS_WORKSPACE_CONFIG for the mm.
  threads     a CPU sum chunked by thread count, for 1, 2, 4 and 8 threads.
  tp          a row-parallel linear layer over 1, 2, 4 and 8 real processes,
              summed by torch.distributed's gloo all_reduce (experiments/tp.py).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from precisionlab import native
from precisionlab.runtime import devices, memory, torch_flags
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.numerics import metrics
from precisionlab.errors import UsageError

FP32 = formats.get("fp32").code  # the kernels' format code for fp32

SECTIONS = ("atomics", "splitk", "batch", "torch_ops", "threads", "tp")
BATCH_SIZES = [1, 2, 17, 33, 128, 257, 1024]
H200_SMS = 132  # the CPU emulation's stand-in for the GPU's SM count
EMULATED_BLOCKS = H200_SMS * 4  # the accumulate tree's grid on an H200: 4 blocks per SM
SPLITK = dict(m=128, n=128, k=8192, splits=8)
BATCH_COLS = 4096
CHECK_ROWS = 64  # rows compared with themselves computed alone, in every batch section row
CUBLAS_DETERMINISTIC = ":4096:8"


@dataclass
class NondetConfig:
    runs: int = 100
    n: int = 1 << 24
    device: str = "auto"
    seed: int = 0
    sections: str | None = None
    keep_samples: bool = False  # the atomic results, for the plot


@dataclass
class NondetResult:
    params: dict
    rows: list[dict]
    takeaways: dict[str, str]
    devices: dict
    samples: dict[str, np.ndarray] = field(default_factory=dict)
    exact: float = math.nan


def run(cfg: NondetConfig, advance=lambda k=1: None) -> NondetResult:
    if cfg.runs < 2:
        raise UsageError(f"--runs must be at least 2 to compare runs (got {cfg.runs})")
    if cfg.runs > 100_000:
        raise UsageError(f"--runs {cfg.runs} is absurd here (at most 100000)")
    if cfg.n <= 0:
        raise UsageError(f"--n must be > 0, got {cfg.n}")
    sections = inputs.parse_choices(cfg.sections, SECTIONS, "section")
    if cfg.keep_samples and "atomics" not in sections:  # the plot would be an empty histogram
        raise UsageError("--plot draws the atomics section's histogram; add atomics to --sections")
    inputs.check_memory(memory.nondeterminism(cfg.n, sections, cfg.runs),
                        f"nondeterminism --n {cfg.n} --runs {cfg.runs}")
    plan = devices.resolve(cfg.device)
    cublas_config = "from the environment" if "CUBLAS_WORKSPACE_CONFIG" in os.environ else None
    if plan.cuda and cublas_config is None and "torch_ops" in sections:
        # cuBLAS reads it when torch makes its handle and workspace, so it is
        # in force only if no GPU matmul has run in this process yet
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC
        t = sys.modules.get("torch")
        cublas_config = ("set by this run after CUDA started: too late if a GPU matmul ran before, and torch "
                         "then refuses deterministic cuBLAS calls"
                         if t is not None and t.cuda.is_initialized() else "set by this run before CUDA started")
    rng = np.random.default_rng(cfg.seed)
    x = rng.standard_normal(cfg.n).astype(np.float32).astype(np.float64)
    exact = metrics.exact_sum(x)
    rows: list[dict] = []
    samples: dict[str, np.ndarray] = {}
    if "atomics" in sections:
        if plan.cpu:
            r, s = _atomics_cpu(x, exact, cfg)
            rows += r
            samples.update(s)
            advance()
        if plan.cuda:
            r, s = _atomics_gpu(x, exact, cfg)
            rows += r
            samples.update(s)
            advance()
    per_device = {
        "splitk": lambda dev: _splitk(dev, cfg),
        "batch": lambda dev: _batch_torch(dev, cfg.seed) + _batch_kernels(dev, cfg.seed),
        "torch_ops": lambda dev: _torch_ops(dev, cfg),
    }
    for section, fn in per_device.items():
        if section in sections:
            for dev in plan.names:
                rows += fn(dev)
                advance()
    if "threads" in sections and plan.cpu:
        rows += _threads(x, exact)
    if "tp" in sections:
        from precisionlab.experiments import tp

        rows += tp.run(tp.TpConfig(seed=cfg.seed, runs=min(cfg.runs, tp.MAX_RUNS)), advance)
    return NondetResult(
        params={"runs": cfg.runs, "n": cfg.n, "device": cfg.device, "seed": cfg.seed, "sections": sections,
                "batch_sizes": BATCH_SIZES, "batch_check_rows": CHECK_ROWS,
                "splitk": SPLITK, "emulated_blocks": emulated_blocks(cfg.n),
                "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                "CUBLAS_WORKSPACE_CONFIG_source": cublas_config},
        rows=rows, takeaways=takeaways(rows), samples=samples if cfg.keep_samples else {}, exact=exact,
        devices=plan.describe(),
    )


# ---------------------------------------------------------------------------
# measures


def _bits(values) -> list[bytes]:
    return [np.ascontiguousarray(v).tobytes() for v in values]


def spread(results: np.ndarray, exact: float, fmt_name: str = "fp32") -> dict:
    """distinct bit patterns, and how far apart the results lie."""
    r = np.asarray(results, dtype=np.float64)
    distinct = len(set(_bits(r)))
    ulp = float(formats.get(fmt_name).spacing(exact)) if math.isfinite(exact) else math.nan
    diff = float(r.max() - r.min())
    return {"distinct": distinct, "max_abs_diff": diff, "max_spread_ulps": diff / ulp if ulp else math.nan,
            "rel_spread": diff / abs(exact) if exact else math.nan}


def _row(section, label, device, runs, emulated=False, *, op, variant, **kw) -> dict:
    """One row: op and variant identify it (catalog names for this project's
    kernels, "torch" for torch's); label is the text the table shows."""
    return {"section": section, "op": op, "variant": variant, "label": label, "device": device, "runs": runs,
            "emulated": emulated, "distinct": None, "max_spread_ulps": None, "max_abs_diff": None,
            "rel_spread": None, **kw}


# ---------------------------------------------------------------------------
# atomics vs tree


def emulated_blocks(n: int) -> int:
    """The emulated grid: EMULATED_BLOCKS, or one value per block when n is
    smaller (the kernel's grid never has empty blocks either)."""
    return min(EMULATED_BLOCKS, n)


def block_partials(x: np.ndarray, blocks: int) -> np.ndarray:
    """fp32 sums of `blocks` contiguous slices, each a pairwise sum in the
    library's exact fp32 emulation."""
    fp32 = FP32
    return np.array([native.accumulate_cpu(part, fp32, "pairwise").result for part in np.array_split(x, blocks)])


def _atomics_cpu(x, exact, cfg):
    fp32 = FP32
    parts = block_partials(x, emulated_blocks(x.size))
    rng = np.random.default_rng(cfg.seed)
    atomic = np.array([native.accumulate_cpu(parts[rng.permutation(parts.size)], fp32, "sequential").result
                       for _ in range(cfg.runs)])
    tree = np.array([native.accumulate_cpu(parts, fp32, "pairwise").result for _ in range(cfg.runs)])
    rows = [_row("atomics", "atomic (emulated arrival order)", "cpu", cfg.runs, True, op="sum", variant="atomic",
                 **spread(atomic, exact), mean_error=float(np.mean(atomic) - exact)),
            _row("atomics", "two-pass tree", "cpu", cfg.runs, True, op="sum", variant="tree",
                 **spread(tree, exact), mean_error=float(tree[0] - exact))]
    return rows, {"cpu atomic (emulated)": atomic}


def _atomics_gpu(x, exact, cfg):
    fp32 = FP32
    rows, samples = [], {}
    for method, label in (("atomic", "atomic (atomicAdd per block)"), ("tree", "two-pass tree")):
        r = native.sum_cuda(x, fp32, fp32, method, runs=cfg.runs)
        rows.append(_row("atomics", label, "cuda", cfg.runs, op="sum", variant=method, **spread(r, exact),
                         mean_error=float(np.mean(r) - exact)))
        if method == "atomic":
            samples["cuda atomic"] = r
    return rows, samples


# ---------------------------------------------------------------------------
# split-K


def _splitk(device: str, cfg: NondetConfig) -> list[dict]:
    m, n, k, s = SPLITK["m"], SPLITK["n"], SPLITK["k"], SPLITK["splits"]
    rng = np.random.default_rng(cfg.seed + 1)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    if device == "cpu":
        slices = np.array_split(np.arange(k), s)
        parts = [a[:, sl] @ b[sl, :] for sl in slices]
        unsplit = _fp32_sum([a @ b])
        order = np.random.default_rng(cfg.seed)
        atomic = [_fp32_sum([parts[i] for i in order.permutation(s)]) for _ in range(cfg.runs)]
        ordered = [_fp32_sum(parts) for _ in range(cfg.runs)]
        emulated = True
    else:
        atomic, ordered, unsplit = _splitk_gpu(a, b, s, cfg.runs)
        emulated = False
    rows = []
    for variant, label, results in (("splitk_atomic", "split-K, atomics", atomic),
                                    ("splitk_ordered", "split-K, fixed order", ordered)):
        distinct = len(set(_bits(results)))
        diff_runs = max(float(np.max(np.abs(r.astype(np.float64) - results[0]))) for r in results)
        diff_unsplit = float(np.max(np.abs(results[0].astype(np.float64) - unsplit)))
        rel = float(np.linalg.norm(results[0] - ref) / np.linalg.norm(ref))
        rows.append(_row("splitk", label, device, cfg.runs, emulated, op="matmul", variant=variant,
                         distinct=distinct, max_abs_diff=diff_runs,
                         max_spread_ulps=None, rel_spread=diff_runs / float(np.max(np.abs(ref))),
                         max_abs_diff_vs_unsplit=diff_unsplit, rel_l2_vs_fp64=rel,
                         shape=[m, k, n], splits=s))
    return rows


def _fp32_sum(mats) -> np.ndarray:
    out = np.zeros_like(mats[0], dtype=np.float32)
    for p in mats:
        out = (out + p).astype(np.float32)  # one fp32 rounding per add, in this order
    return out


def _splitk_gpu(a, b, s, runs):
    m, k = a.shape
    n = b.shape[1]
    da, db = native.DeviceArray.from_numpy(a), native.DeviceArray.from_numpy(b)
    c = native.DeviceArray((m, n), np.float32)

    def run_version(version, splits):
        work = native.DeviceArray((max(native.matmul_workspace_bytes(m, n, version, splits), 4),), np.uint8)
        native.matmul_cuda(da.ptr, db.ptr, m, n, k, FP32, c.ptr, variant=version, splits=splits, work_ptr=work.ptr,
                           work_bytes=work.nbytes)
        return c.numpy()

    unsplit = run_version("tiled", 1)
    atomic = [run_version("splitk_atomic", s) for _ in range(runs)]
    ordered = [run_version("splitk_ordered", s) for _ in range(runs)]
    return atomic, ordered, unsplit


# ---------------------------------------------------------------------------
# batch invariance

# (op, launch chosen from the batch size?) -> the catalog's variant. The CPU
# rows replay the same variants' reduction orders (pl_*_cpu_lanes).
BATCH_VARIANTS = {("softmax", True): ("softmax", "stable_adaptive"), ("softmax", False): ("softmax", "stable"),
                  ("rmsnorm", True): ("rmsnorm", "adaptive"), ("rmsnorm", False): ("rmsnorm", "block")}
INVARIANT_BATCH_VARIANTS = {v for (_, a), (_, v) in BATCH_VARIANTS.items() if not a}


def _batch_label(name: str, adaptive: bool) -> str:
    return f"{name}: {'batch-dependent launch' if adaptive else 'batch-invariant'}"


def _batch_inputs(seed: int, cols: int):
    rng = np.random.default_rng(seed + 2)
    big = rng.standard_normal((max(BATCH_SIZES), cols)).astype(np.float32)
    return big


def _torch_lacks(device: str) -> str | None:
    """Why torch cannot run on `device` (a CPU build on a GPU machine), or None.
    This project's kernels do not need it; torch's own sections do."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return f"torch {torch.__version__} has no CUDA"
    return None


def _batch_torch(device: str, seed: int) -> list[dict]:
    import torch

    if why := _torch_lacks(device):
        return [_row("batch", "torch matmul", device, 0, op="matmul", variant="torch", refused=why, differs_at=[])]

    big = torch.from_numpy(_batch_inputs(seed, 1024)).to(device)
    w = torch.from_numpy(np.random.default_rng(seed + 3).standard_normal((1024, 1024)).astype(np.float32)).to(device)
    rows = []
    with torch_flags.ieee_fp32():
        for dtype, name in ((torch.float32, "fp32, TF32 off"), (torch.bfloat16, "bf16")):
            fmt = "fp32" if dtype == torch.float32 else "bf16"
            a, b = big.to(dtype), w.to(dtype)
            alone = np.stack([(a[i:i + 1] @ b)[0].float().cpu().numpy() for i in range(CHECK_ROWS)])
            batched = {bs: (a[:bs] @ b)[:CHECK_ROWS].float().cpu().numpy() for bs in BATCH_SIZES}
            rows.append(_kernel_row(("matmul", "torch"), device, f"torch matmul: {name}", alone, batched,
                                    dtype=fmt))
    return rows


def _kernel_row(op_variant: tuple[str, str], device, label, alone: np.ndarray, batched: dict[int, np.ndarray],
                emulated=False, **kw):
    """Each of the first CHECK_ROWS rows computed alone vs inside each batch
    that holds it (batch size bs holds rows 0 .. bs-1). Every count covers the
    same (row, batch) pairs:
      rows_changed / rows_compared        rows whose result in some batch differs
                                          in any bit from the row computed alone
      pairs_changed / pairs_compared      (row, batch size) pairs that differ
      distinct_per_row_max                most distinct bit patterns one row took,
                                          alone and in every batch (1: invariant)
      differs_at                          batch sizes where some row differs
      max_abs_diff                        largest |batched - alone| element"""
    pairs = [(i, bs) for bs in batched for i in range(min(bs, CHECK_ROWS))]
    changed_pairs = [(i, bs) for i, bs in pairs if not np.array_equal(batched[bs][i], alone[i])]
    per_row = {i: {alone[i].tobytes()} for i in range(min(CHECK_ROWS, max(batched)))}
    for i, bs in pairs:
        per_row[i].add(np.ascontiguousarray(batched[bs][i]).tobytes())
    diff = max(float(np.max(np.abs(out[:min(bs, CHECK_ROWS)].astype(np.float64) - alone[:min(bs, CHECK_ROWS)])))
               for bs, out in batched.items())
    op, variant = op_variant
    return _row("batch", label, device, len(batched), emulated, op=op, variant=variant,
                distinct=None, distinct_per_row_max=max(len(v) for v in per_row.values()), max_abs_diff=diff,
                rel_spread=diff / float(np.max(np.abs(alone))),
                differs_at=sorted({bs for _, bs in changed_pairs}),
                rows_changed=len({i for i, _ in changed_pairs}), rows_compared=len(per_row),
                pairs_changed=len(changed_pairs), pairs_compared=len(pairs),
                batch_sizes=list(batched), **kw)


def _batch_kernels(device: str, seed: int) -> list[dict]:
    """softmax and RMSNorm: each row alone vs inside batches, with the launch
    chosen from the batch size (adaptive) or from the row length alone."""
    big = _batch_inputs(seed, BATCH_COLS)
    w = np.ones(BATCH_COLS, dtype=np.float32)
    rows = []
    if device == "cpu":
        for name, fn in (("softmax", lambda x, lanes: native.softmax_cpu_lanes(x, FP32, lanes)),
                         ("rmsnorm", lambda x, lanes: native.rmsnorm_cpu_lanes(x, FP32, w, 1e-6, lanes))):
            for adaptive, lanes_of in ((True, lambda bs: native.adaptive_lanes(bs, BATCH_COLS, H200_SMS)),
                                       (False, lambda bs: native.softmax_lanes(BATCH_COLS))):
                alone = np.stack([fn(big[i:i + 1], lanes_of(1))[0] for i in range(CHECK_ROWS)])
                batched = {bs: fn(big[:bs], lanes_of(bs)) for bs in BATCH_SIZES}
                rows.append(_kernel_row(BATCH_VARIANTS[name, adaptive], "cpu", _batch_label(name, adaptive), alone,
                                        batched, emulated=True, lanes=[lanes_of(bs) for bs in BATCH_SIZES]))
        return rows
    x, tw = native.DeviceArray.from_numpy(big), native.DeviceArray.from_numpy(w)
    y = native.DeviceArray(big.shape, big.dtype)
    def call_of(op: str, variant: str):
        if op == "softmax":
            return lambda xp, yp, bs: native.softmax_cuda_device(xp, bs, BATCH_COLS, FP32, variant, yp)
        return lambda xp, yp, bs: native.rmsnorm_cuda(xp, bs, BATCH_COLS, FP32, tw.ptr, 1e-6, yp, variant)

    row_bytes = BATCH_COLS * 4
    for (name, adaptive), op_variant in BATCH_VARIANTS.items():
        call = call_of(*op_variant)
        alone = []
        for i in range(CHECK_ROWS):
            call(x.ptr + i * row_bytes, y.ptr, 1)
            alone.append(y.numpy(rows=1)[0])
        batched = {}
        for bs in BATCH_SIZES:
            call(x.ptr, y.ptr, bs)
            batched[bs] = y.numpy(rows=min(bs, CHECK_ROWS))
        rows.append(_kernel_row(op_variant, "cuda", _batch_label(name, adaptive), np.stack(alone), batched))
    return rows


# ---------------------------------------------------------------------------
# torch's own nondeterministic ops


def _torch_ops(device: str, cfg: NondetConfig) -> list[dict]:
    import torch

    if why := _torch_lacks(device):
        return [_row("torch_ops", "torch ops", device, 0, op=None, variant="torch", refused=why)]
    g = torch.Generator().manual_seed(cfg.seed)
    n = 1 << 20
    src = torch.randn(n, generator=g).to(device)
    index = torch.randint(0, 16, (n,), generator=g).to(device)
    a = torch.randn(16, 1 << 16, generator=g)
    b = torch.randn(1 << 16, 16, generator=g)
    bins = np.array([metrics.exact_sum(src.cpu().double().numpy()[index.cpu().numpy() == i]) for i in range(16)])
    a, b = a.to(device), b.to(device)
    ops = {  # op: (label, op, float64 reference for the ulp scale)
        "index_add_": ("index_add_ (16 bins)", lambda: torch.zeros(16, device=device).index_add_(0, index, src), bins),
        "scatter_add_": ("scatter_add_ (16 bins)", lambda: torch.zeros(16, device=device).scatter_add_(0, index, src),
                         bins),
        "mm": ("mm 16x65536 @ 65536x16", lambda: a @ b, (a.cpu().double() @ b.cpu().double()).numpy()),
    }
    with torch_flags.ieee_fp32():  # fp32 results are compared: no TF32
        return _torch_ops_runs(torch, ops, device, cfg)


def _torch_ops_runs(torch, ops, device, cfg) -> list[dict]:
    rows = []
    was = torch.are_deterministic_algorithms_enabled()
    try:
        for mode in (False, True):
            torch.use_deterministic_algorithms(mode)
            for name, (text, op, exact) in ops.items():
                label = f"{text}, deterministic={'on' if mode else 'off'}"
                ident = {"op": name, "variant": "torch", "deterministic": mode}
                try:
                    results = [op().cpu().numpy() for _ in range(cfg.runs)]
                except RuntimeError as e:
                    rows.append(_row("torch_ops", label, device, cfg.runs, **ident, refused=str(e).splitlines()[0]))
                    continue
                distinct = len(set(_bits(results)))
                diff = max(float(np.max(np.abs(r.astype(np.float64) - results[0]))) for r in results)
                # ulps at the output's scale: an mm entry that cancels to near 0
                # has a tiny ulp of its own that would inflate the count
                ulps = diff / float(formats.get("fp32").spacing(np.max(np.abs(exact))))
                rows.append(_row("torch_ops", label, device, cfg.runs, **ident, distinct=distinct, max_abs_diff=diff,
                                 max_spread_ulps=ulps, rel_spread=diff / float(np.max(np.abs(exact))), refused=None))
    finally:
        torch.use_deterministic_algorithms(was)
    return rows


# ---------------------------------------------------------------------------
# CPU threads


def _threads(x, exact) -> list[dict]:
    results = {t: native.sum_cpu_threads(x, t) for t in (1, 2, 4, 8)}
    rows = []
    for t, r in results.items():
        same = [u for u, v in results.items() if v == r and u != t]
        rows.append(_row("threads", f"{t} thread{'s' if t > 1 else ''}", "cpu", 1, op="sum_cpu_threads", variant="chunked",
                         threads=t, result=r, matches=same,
                         abs_error=abs(r - exact), distinct=1, max_abs_diff=abs(r - results[1])))
    return rows


# ---------------------------------------------------------------------------


def takeaways(rows: list[dict]) -> dict[str, str]:
    out = {}
    at = {(r["device"], r["variant"]): r for r in rows if r["section"] == "atomics"}
    for dev in ("cuda", "cpu"):
        a, t = at.get((dev, "atomic")), at.get((dev, "tree"))
        if a and t:
            out["atomics"] = (f"{dev}: atomics gave {a['distinct']} distinct sums in {a['runs']} runs "
                              f"(spread {a['max_spread_ulps']:.1f} ulps), the tree {t['distinct']}: fp32 addition "
                              "is not associative, so the order the blocks land in decides the last bits.")
            break
    sk = [r for r in rows if r["section"] == "splitk"]
    if sk:
        atom = next(r for r in sk if r["variant"] == "splitk_atomic")
        fixed = next(r for r in sk if r["variant"] == "splitk_ordered")
        out["splitk"] = (f"{atom['device']}: split-K by atomics gave {atom['distinct']} distinct results in "
                         f"{atom['runs']} runs; in fixed order {fixed['distinct']}, yet {fixed['max_abs_diff_vs_unsplit']:.2e} "
                         "away from the unsplit matmul: determinism is not batch or split invariance.")
    ba = [r for r in rows if r["section"] == "batch"]
    if ba:
        ba = [r for r in ba if not r.get("refused")]
        var = [r for r in ba if r["max_abs_diff"] > 0]
        inv = [r for r in ba if r["variant"] in INVARIANT_BATCH_VARIANTS]
        out["batch"] = (f"{len(var)} of {len(ba)} computations change rows with the batch size "
                        + (f"(e.g. {var[0]['label']} on {var[0]['device']}, up to {var[0]['max_abs_diff']:.2e})"
                           if var else "")
                        + f"; the batch-invariant kernels (one reduction order per row, whatever the batch) give "
                          f"{'0' if all(r['max_abs_diff'] == 0 for r in inv) else 'nonzero'} difference.")
    ops = [r for r in rows if r["section"] == "torch_ops" and r["op"] is not None]
    not_run = [f"{r['device']}: not run, {r['refused']}." for r in rows
               if r["section"] == "torch_ops" and r["op"] is None]  # torch could not run there at all
    if not_run:
        out["torch_ops"] = " ".join(not_run)
    if ops:
        off = [r for r in ops if not r["deterministic"] and r.get("distinct")]
        on = [r for r in ops if r["deterministic"]]
        refused = [r["label"] for r in on if r.get("refused")]
        out["torch_ops"] = ("; ".join(f"{r['device']} {r['op']}: {r['distinct']} distinct" for r in off)
                            + "; with deterministic algorithms: "
                            + "; ".join(f"{r['device']} {r['op']}: "
                                        + (f"{r['distinct']} distinct" if r.get("distinct") else "refused")
                                        for r in on)
                            + (f" (refused: {', '.join(refused)})" if refused else "") + "."
                            + "".join(" " + t for t in not_run))
    th = [r for r in rows if r["section"] == "threads"]
    if th:
        vals = {r["threads"]: r["result"] for r in th}
        out["threads"] = (f"{len(set(vals.values()))} different sums from {len(vals)} thread counts: the chunking "
                          "follows the thread count, and so does the order of the additions.")
    from precisionlab.experiments import tp

    out.update(tp.takeaways(rows))
    return out
