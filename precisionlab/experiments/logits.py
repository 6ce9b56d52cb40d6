"""compare model --metrics and compare logits: how far a low-precision run's
next-token distributions move from fp32's over a text.

Teacher-forced: every run reads the same tokens, in windows of the model's
training context, batched, and each position's two logit rows give the
statistics in precisionlab.numerics.distribution. `compare logits` computes the same
from two logits files (precisionlab.io.logits_file), through the same
per-position code, so a saved pair reproduces a live run exactly.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from precisionlab.catalog import formats
from precisionlab.engines.registry import DEFAULT_SPEC, spec_path
from precisionlab.experiments import startup
from precisionlab.numerics import compare as comparison, distribution, divergence
from precisionlab.numerics.metrics import exact_mean
from precisionlab.io import inputs, logits_file, outputs
from precisionlab.runtime import memory, progress
from precisionlab.errors import UsageError

DTYPES = formats.COMPUTE  # fp32 may be compared too; the index seeds each run's noise
DEFAULT_TOKENS = 8192
# The held-out part of the shipped text: scripts/train_model.py trains on the
# first 95 % of its (character) tokens and validates on the rest.
HELD_OUT_FROM = 0.95
# Positions processed together: bounds the float64 working set for a large
# vocabulary (about ten (positions x vocab) float64 arrays live at once).
WORKING_BYTES = 256 << 20
# What compare logits holds for every position to the end, for each side compared
# with REF: its statistics (distribution.PositionStats, float64 and bool arrays,
# twice while the parts are joined), the overflow counts, the summaries' sorted
# copies. Measured (vocab 4, 2M to 4M positions, peak RSS): 221 B a position for
# REF YOURS, 392 for REF REF_LOW YOURS. A 512M-position file was refused only
# while its tokens alone did not fit; past that, the run was killed for memory.
RESULT_BYTES_PER_POSITION = 224


@dataclass
class MetricsConfig:
    model: str | None = DEFAULT_SPEC  # an engine spec (engines/registry.py); None: the embedded model
    text: str | None = None
    tokens: int = DEFAULT_TOKENS
    dtypes: str = ",".join(formats.LOW_COMPUTE)
    device: str = "cpu"
    seed: int = 0
    inject: list[str] = field(default_factory=list)
    save_logits: list[str] = field(default_factory=list)
    plot: str | None = None
    max_kld: float | None = None
    min_top1: float | None = None


@dataclass
class LogitsResult:
    command: str
    params: dict
    model_info: dict
    rows: list[dict]                 # one summary per compared run
    kl: dict[str, np.ndarray]        # per-position KL, for the plot
    failures: list[str]              # --max-kld / --min-top1 verdicts that failed
    takeaways: list[str]
    timing: dict
    yardstick: list[dict] = field(default_factory=list)  # compare logits with REF_LOW: one row per statistic
    worst: dict | None = None                             # the yardstick row that departs most
    llamacpp: dict = field(default_factory=dict)          # per side, llama-perplexity's report (a base-file REF)


# ---------------------------------------------------------------------------
# option checks, made before anything runs


def check_output_path(path: str, option: str, inputs_: outputs.Inputs = ()) -> None:
    """outputs.check_output_path: a --plot with an extension matplotlib writes,
    a logits file under any name; neither may be one of the run's inputs."""
    kinds = None
    if option == "--plot":
        from precisionlab.report.plots import plot_kinds, require_matplotlib

        require_matplotlib()
        kinds = plot_kinds()
    outputs.check_output_path(path, kinds, option, inputs_)


def check_gates(max_kld: float | None, min_top1: float | None) -> None:
    if max_kld is not None and not (math.isfinite(max_kld) and max_kld >= 0):
        raise UsageError(f"--max-kld must be a finite number >= 0 (got {max_kld})")
    if min_top1 is not None and not (0 <= min_top1 <= 100):
        raise UsageError(f"--min-top1 is a percentage in [0, 100] (got {min_top1})")


def parse_save(specs: list[str], lows: list[str], inputs_: outputs.Inputs = ()) -> dict[str, str]:
    """--save-logits FILE (the fp32 run) or DTYPE=FILE (DTYPE: a name or alias of DTYPES), repeatable."""
    out: dict[str, str] = {}
    for spec in specs:
        head, eq, rest = spec.partition("=")
        named = formats.find(head) if eq else None
        dtype, path = (named, rest) if named in DTYPES else ("fp32", spec)
        if dtype != "fp32" and dtype not in lows:
            raise UsageError(f"--save-logits {spec!r}: {dtype} is not among --dtypes ({','.join(lows)})")
        if dtype in out:
            raise UsageError(f"--save-logits: {dtype} given twice")
        check_output_path(path, "--save-logits", inputs_)
        out[dtype] = path
    paths = [os.path.realpath(p) for p in out.values()]
    if len(set(paths)) != len(paths):
        raise UsageError("--save-logits: two runs would be written to the same file")
    return out


def gate_failures(rows: list[dict], max_kld: float | None, min_top1: float | None) -> list[str]:
    """The CI verdicts; a NaN statistic fails (it is not <= anything)."""
    out = []
    for r in rows:
        if max_kld is not None and not r["kld_mean"] <= max_kld:
            out.append(f"{r['dtype']}: mean KLD {r['kld_mean']!r} > --max-kld {max_kld!r}")
        if min_top1 is not None and not r["top1_agree_pct"] >= min_top1:
            out.append(f"{r['dtype']}: top-1 agreement {r['top1_agree_pct']!r} % < --min-top1 {min_top1!r}")
    return out


# ---------------------------------------------------------------------------
# the text


def default_text() -> str:
    from precisionlab.engines import charlm

    text = (charlm.DEFAULT_WEIGHTS.parent / "shakespeare.txt").read_text("utf-8")
    return text[int(len(text) * HELD_OUT_FROM):]  # one character is one token there


def read_text(path: str) -> str:
    p = inputs.check_regular_file(path, "--text")
    inputs.check_memory(4 * p.stat().st_size, f"--text {path!r}")  # the bytes and the decoded str
    try:
        return p.read_text("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"--text {path!r}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise UsageError(f"--text {path!r}: cannot read ({e.strerror})") from None


def token_ids(engine, text: str, need: int, source: str) -> list[int]:
    ids = engine.prefix_ids(text, need, source)  # a long file need not be tokenised whole
    if len(ids) < need:
        raise UsageError(f"{source} gives {len(ids)} tokens; --tokens {need - 1} needs {need} "
                         f"(one more than the positions scored)")
    return ids[:need]


# ---------------------------------------------------------------------------
# compare model --metrics


def to_numpy(t) -> np.ndarray:
    """A CPU tensor's values in its own dtype (bf16 through ml_dtypes, exactly)."""
    from precisionlab.catalog import formats

    return formats.torch_to_numpy(t.cpu())


def _batches(n: int, window: int, per_batch: int):
    """(start, windows, length): full windows grouped by per_batch, then the remainder window."""
    full = n // window
    for s in range(0, full, per_batch):
        k = min(per_batch, full - s)
        yield s * window, k, window
    if n % window:
        yield full * window, 1, n % window


@contextmanager
def _torch_threads(torch, n: int | None):
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def estimate(shape, tokens: int, lows: list[str], saves: dict, sigma: float) -> int:
    """compare metrics' peak (runtime/memory.compare_metrics) from the model's
    shape, before a weight is read: the window the engine will score in (the
    embedded model's, or a Hugging Face model's, capped at its positions)."""
    from precisionlab.engines import embedded, hf

    window = embedded.WINDOW if shape.kind == "embedded" else max(1, min(hf.WINDOW, shape.positions or hf.WINDOW))
    save_bytes = sum(tokens * shape.vocab * (8 if (d != "fp32" and sigma) else 4) for d in saves)
    return memory.compare_metrics(shape, tokens, lows, window, WORKING_BYTES, save_bytes)


class Scoring:
    """One batch of windows scored against its fp32 logits (ref32), a chunk of
    positions at a time (runtime/memory.metrics_chunk): only a chunk's rows
    are ever in float64, whatever the vocabulary. Rows are independent, and
    each dtype's noise is drawn from its own generator in row order, so the
    chunks give the numbers one pass over the batch gave."""

    def __init__(self, start, targets, ref32, sigma, saves, saved, n):
        self.start, self.targets, self.ref32, self.sigma = start, targets, ref32, sigma
        self.saves, self.saved, self.n = saves, saved, n
        self.chunk = memory.metrics_chunk(ref32.shape[1], WORKING_BYTES)

    def spans(self):
        return ((a, min(a + self.chunk, len(self.ref32))) for a in range(0, len(self.ref32), self.chunk))

    def expected(self) -> list:
        return [distribution.expected_kl_gaussian_noise(self.ref32[a:b].astype(np.float64), self.sigma)
                for a, b in self.spans()]

    def side(self, d: str, out, rng, parts: list, over: list) -> None:
        for a, b in self.spans():
            ref, low = self.ref32[a:b].astype(np.float64), out[a:b].astype(np.float64)
            over.append(_overflow(ref, low))
            if self.sigma:
                low = low + self.sigma * rng.standard_normal(low.shape)
            parts.append(distribution.position_stats(ref, low, self.targets[a:b]))
            if d in self.saves and d != "fp32":
                self.save(d, low if self.sigma else out[a:b], a)  # what was compared is what is saved

    def save(self, d: str, rows, at: int = 0) -> None:
        if self.saved[d] is None:
            self.saved[d] = np.empty((self.n, rows.shape[1]), dtype=rows.dtype)
        self.saved[d][self.start + at:self.start + at + len(rows)] = rows


def _check_options(cfg: MetricsConfig) -> tuple[list[str], float, dict]:
    """Every option refused before anything loads (exit 2): (the low dtypes, the noise sigma, the saves)."""
    from precisionlab.engines import inject

    lows = startup.parse_dtypes(cfg.dtypes, DTYPES)
    if cfg.tokens <= 0:
        raise UsageError(f"--tokens must be > 0 (got {cfg.tokens})")
    if cfg.seed < 0:
        raise UsageError(f"--seed must be >= 0 (got {cfg.seed})")
    sigma = 0.0
    injections = inject.parse_all(cfg.inject, {"noise"})
    if len(injections) > 1:
        raise UsageError("--inject logits:noise=SIGMA: give it once")
    for inj in injections:
        if inj.target != "logits":
            raise UsageError(f"--inject {inj}: noise applies to the target 'logits' only")
        sigma = inj.params["noise"]
    check_gates(cfg.max_kld, cfg.min_top1)
    read = [("--text", cfg.text), ("--model", spec_path(cfg.model))]  # what the run reads: never overwritten
    saves = parse_save(cfg.save_logits, lows, read)
    if cfg.plot:
        check_output_path(cfg.plot, "--plot", read)
        if os.path.realpath(cfg.plot) in {os.path.realpath(p) for p in saves.values()}:
            raise UsageError("--plot and --save-logits name the same file")
    return lows, sigma, saves


def run_model(cfg: MetricsConfig, advance=lambda k=1: None) -> LogitsResult:
    lows, sigma, saves = _check_options(cfg)
    text = read_text(cfg.text) if cfg.text else default_text()
    source = f"--text {cfg.text!r}" if cfg.text else "the held-out Shakespeare text"

    device = startup.device(cfg.device)
    import torch

    t0 = time.perf_counter()
    n = cfg.tokens
    engine = startup.open_engine(cfg.model, device, 0, "", lambda s: estimate(s, n, lows, saves, sigma),
                                 f"compare metrics --model {cfg.model or DEFAULT_SPEC} --tokens {n}")
    window = engine.window
    ids = token_ids(engine, text, cfg.tokens + 1, source)
    vocab = engine.info()["vocab"]
    per_batch = memory.metrics_per_batch(n, window, vocab, WORKING_BYTES)
    # Every dtype's copy held together: each window's fp32 logits are the reference its rows are scored
    # against, so scoring the dtypes one after another would hold fp32's logits for every position instead
    models = {d: engine.model(d) for d in dict.fromkeys(["fp32", *lows])}
    t_load = time.perf_counter() - t0

    targets_all = np.asarray(ids[1:], dtype=np.int64)
    rngs = {d: np.random.default_rng([cfg.seed, DTYPES.index(d)]) for d in lows}
    parts: dict[str, list] = {d: [] for d in lows}
    over: dict[str, list] = {d: [] for d in lows}  # per position: logits non-finite where fp32's are finite
    expected: list[np.ndarray] = []  # sigma^2/2 (1 - sum p^2) per position, the small-noise KL
    saved: dict[str, np.ndarray | None] = {d: None for d in saves}
    t1, c1 = time.perf_counter(), time.process_time()
    # fp32 means IEEE fp32 here
    with _torch_threads(torch, engine.score_threads), startup.numerics(), torch.no_grad():
        used_threads = torch.get_num_threads()
        batches = list(_batches(n, window, per_batch))
        for i, (start, k, length) in enumerate(batches):
            progress.stage(f"{','.join(models)} windows", i, len(batches))
            x = torch.tensor(ids[start:start + k * length], device=device).view(k, length)
            ref32 = to_numpy(engine.forward(models["fp32"], x).reshape(k * length, -1))
            score = Scoring(start, targets_all[start:start + k * length], ref32, sigma, saves, saved, n)
            if sigma:
                expected += score.expected()
            for d in lows:  # one dtype's logits beside fp32's at a time, scored a chunk of positions at a time
                out = ref32 if d == "fp32" else to_numpy(engine.forward(models[d], x).reshape(k * length, -1))
                score.side(d, out, rngs.get(d), parts[d], over[d])
                del out
            if "fp32" in saves:  # --save-logits fp32 is always the clean reference
                score.save("fp32", ref32)
            advance()
    # CPU seconds beside wall seconds: on a shared machine the wall clock
    # measures the neighbours as much as this run.
    t_run, c_run = time.perf_counter() - t1, time.process_time() - c1
    for d, path in saves.items():
        meta = {"dtype": d, "model": cfg.model or DEFAULT_SPEC, "text": cfg.text or "held-out Shakespeare",
                "window": window, "noise_sigma": sigma if d != "fp32" else 0.0}
        logits_file.write(path, saved[d], targets_all, meta)
    stats = {d: distribution.PositionStats.concat(parts[d]) for d in lows}
    rows = [{"dtype": d, **distribution.summarize(stats[d]), **_overflow_fields(np.concatenate(over[d]))}
            for d in lows]
    if sigma:
        e = np.concatenate(expected)
        for r in rows:
            r["noise_kld_expected"] = math.fsum(e.tolist()) / e.size
    params = {"model": cfg.model or DEFAULT_SPEC, "text": cfg.text or "held-out Shakespeare (last 5 %)",
              "tokens": n, "window": window, "dtypes": lows, "device": device, "seed": cfg.seed,
              "inject": [str(s) for s in cfg.inject], "noise_sigma": sigma, "saved": saves}
    failures = gate_failures(rows, cfg.max_kld, cfg.min_top1)
    failures += [overflow_failure(r["dtype"], r, "fp32") for r in rows if r["nonfinite_positions"]]
    return LogitsResult("compare metrics", params, engine.info(), rows, {d: stats[d].kl for d in lows}, failures,
                        takeaways(rows), {"load_s": t_load, "run_s": t_run, "run_cpu_s": c_run,
                                                 "torch_threads": used_threads})


# ---------------------------------------------------------------------------
# compare logits


@dataclass
class LogitsConfig:
    ref: str
    yours: str | None
    ref_low: str | None = None
    plot: str | None = None
    max_kld: float | None = None
    min_top1: float | None = None
    write_kld_base: str | None = None
    kld_ctx: int | None = None


_SHOWN_POSITIONS = 5  # non-finite positions named in a message
_SHARES = ("top1_agree_pct", "ref_top1_in_top5_pct", "top1_in_ref_top5_pct")  # percentages where 100 is REF itself


def _departure(key: str, r: dict) -> float:
    """How far from REF a row's statistic puts its side (>= 0; 0 is REF itself)."""
    if key in _SHARES:
        return 100.0 - r[key]
    return abs(r[key])


# Statistics set beside the yardstick: (key, the per-position values whose
# paired difference gives the difference's standard error; None for the
# percentiles, the maximum and the RMS, which have no such ±).
YARDSTICK = (("kld_mean", "kl"), ("kld_median", None), ("kld_p90", None), ("kld_p99", None),
             ("kld_p99_9", None), ("kld_max", None), ("top1_agree_pct", "flip"), ("ref_top1_in_top5_pct", "miss5"),
             ("top1_in_ref_top5_pct", "miss5r"),
             ("dp_mean", "dp"), ("dp_rms", None), ("ln_ppl_ratio", "dnll"))
# The percentiles' q, judged only at small_n.min_positions(q) positions and more.
QUANTILES = {"kld_median": 0.5, "kld_p90": 0.9, "kld_p99": 0.99, "kld_p99_9": 0.999}
# z is still reported beside a mean (how many paired standard errors the
# difference is), but no verdict rests on it: heavy-tailed per-position KL
# swells the standard error (a 242x mean KL sat at z < 3). The verdict is the
# ratio beyond RATIO_THRESHOLD with its interval (numerics/small_n, at
# small_n.CONFIDENCE) wholly past 1: YOURS further from REF than the
# yardstick however the positions are resampled. A ratio that one or a few
# positions carry reaches back under 1 when a resample leaves them out (no
# verdict); a heavy tail over many positions cannot hide (its interval stays
# far past 1). The bar is 1, not the 4x line, because a signed mean's
# yardstick (REF_LOW's mean dp, say) sits near 0 and its resamples swing the
# ratio's lower end down by its own noise (the docs' 1 % norm: 7.11x, interval
# 2.7x to 686x). Where no interval can be had (a non-finite per-position
# value) z past Z_BEYOND stands in for it.
Z_BEYOND = 3.0


def _paired(stats: distribution.PositionStats) -> dict[str, np.ndarray]:
    return {"kl": stats.kl, "flip": (~stats.top1).astype(np.float64) * 100, "miss5": (~stats.ref_in_top5) * 100.0,
            "miss5r": (~stats.low_in_top5) * 100.0,
            "dp": stats.dp, "dnll": stats.dnll, "dp2": stats.dp * stats.dp}


def _interval(key: str, per: str | None, py: dict, pl: dict) -> dict:
    """The interval a statistic's verdict rests on, or why it is not judged:
    `ratio_lo`, `ratio_hi` (numerics/small_n), `judged`, `min_positions`
    (the percentiles') and `not_judged` (the reason, or None)."""
    from precisionlab.numerics import small_n

    n = py["kl"].size
    out = {"ratio_lo": None, "ratio_hi": None, "judged": True, "min_positions": None, "not_judged": None}
    if key == "kld_max":
        out.update(judged=False, not_judged="the maximum is one position at any n: shown, never a verdict")
    elif key in QUANTILES:
        q, need = QUANTILES[key], small_n.min_positions(QUANTILES[key])
        out["min_positions"] = need
        if n < need:
            out.update(judged=False, not_judged=f"{n} positions: a verdict on this percentile needs at least {need} "
                                                f"({small_n.MIN_TAIL} beyond it)")
        elif np.isfinite(py["kl"]).all() and np.isfinite(pl["kl"]).all():
            out["ratio_lo"], out["ratio_hi"] = small_n.quantile_ratio_interval(py["kl"], pl["kl"], q)
    else:
        values, dep = ("dp2", np.sqrt) if key == "dp_rms" else (per, np.abs)
        lo, hi, _ = small_n.ratio_of_means(py[values], pl[values], departure=dep)
        if math.isfinite(lo):
            out["ratio_lo"], out["ratio_hi"] = lo, hi
    return out


def yardstick(yours: dict, low: dict, ps_y: distribution.PositionStats, ps_l: distribution.PositionStats) -> list[dict]:
    """Each statistic of YOURS beside REF_LOW's, with the ratio of their
    departures from REF, the interval its verdict rests on (or why it is not
    judged at this n) and, for a mean or a share, the paired difference with
    its standard error (the same positions on both sides)."""
    from precisionlab.numerics import compare

    py, pl = _paired(ps_y), _paired(ps_l)
    out = []
    for key, per in YARDSTICK:
        dy, dl = _departure(key, yours), _departure(key, low)
        r = compare.ratio(dy, dl)
        row = {"statistic": key, "yours": yours[key], "ref_low": low[key], "ratio": r, "diff": None, "diff_se": None,
               "z": None, **_interval(key, per, py, pl)}
        if per is not None:
            with np.errstate(invalid="ignore"):
                d = py[per] - pl[per]
            diff, se = exact_mean(d), distribution.standard_error(d)
            # z > 0: YOURS further from REF than the yardstick (a share's departure is its complement)
            sign = 1.0 if key in (*_SHARES, "kld_mean") else math.copysign(1.0, yours[key]) if yours[key] else 1.0
            z = sign * diff / se if se and math.isfinite(se) and se > 0 else (math.inf if diff else 0.0)
            row.update(diff=diff, diff_se=se, z=z)
        beyond = (row["ratio_lo"] > 1 if row["ratio_lo"] is not None
                  else row["z"] is None or row["z"] > Z_BEYOND)
        row["flagged"] = bool(row["judged"] and compare.flagged(r) and beyond)
        out.append(row)
    return out


def _overflow(ref: np.ndarray, side: np.ndarray) -> np.ndarray:
    """Per row, the entries the side has non-finite where REF is finite (numerics.divergence's overflow rule)."""
    return divergence.overflow_count(ref, side, axis=1)


def _overflow_in_file(ref: np.ndarray, side: np.ndarray) -> np.ndarray:
    """Per row, the entries a file has +inf or NaN where REF is finite: an
    overflow (docs/compare-model.md's rule). A -inf there is a token the
    engine masked, its probability removed (_removed_fields), not an overflow."""
    return np.count_nonzero(np.isfinite(ref) & (np.isnan(side) | np.isposinf(side)), axis=1)


def _removed_fields(removed: np.ndarray) -> dict:
    """A side's -inf logits where REF is finite: probability mass removed (a masked token)."""
    where = np.flatnonzero(removed)
    return {"mass_removed_positions": int(where.size), "mass_removed_entries": int(removed.sum()),
            "first_mass_removed_positions": [int(i) for i in where[:_SHOWN_POSITIONS]]}


def two_way_verdict(ref_dtype: str | None, yours_dtype: str | None, diff: np.ndarray, scale: np.ndarray) -> dict:
    """compare logits REF YOURS (no REF_LOW): a verdict where one can be made
    from the two files alone, else one line saying why not. Two runs in one
    precision (both files' metadata `dtype`) are judged as compare pair
    judges a contract: beyond that precision's rounding (numerics.compare's
    rounding_bound) is not rounding. The three-way rules (with REF_LOW) are
    the yardstick's, elsewhere."""
    if ref_dtype is None or yours_dtype is None or ref_dtype != yours_dtype or ref_dtype not in formats.COMPUTE:
        said = f"REF {ref_dtype or 'unknown'}, YOURS {yours_dtype or 'unknown'}"
        return {"verdict": None, "verdict_note": f"No verdict from two files of different or unknown precisions "
                f"({said}, from their metadata dtype): give REF_LOW (the reference run in YOURS' precision) as "
                "the yardstick."}
    ratio = diff / comparison.rounding_bound(ref_dtype, scale)
    worst = float(np.max(ratio)) if ratio.size else 0.0
    if worst > 1.0:
        first = int(np.argmax(ratio > 1.0))
        return {"verdict": "beyond rounding", "verdict_note": f"Verdict: REF and YOURS are both {ref_dtype} and differ "
                f"beyond {ref_dtype} rounding ({worst:.3g}x its bound at worst, first at position {first}): not "
                "rounding, an algorithmic difference (compare pair judges such a pair, with its fp64 pair too)."}
    return {"verdict": "rounding", "verdict_note": f"Verdict: REF and YOURS are both {ref_dtype} and differ within "
            f"{ref_dtype} rounding ({worst:.2g}x its bound at worst)."}


def _overflow_fields(overflow: np.ndarray) -> dict:
    """A row's overflow fields from the per-position counts (_overflow)."""
    where = np.flatnonzero(overflow)
    return {"nonfinite_positions": int(where.size), "nonfinite_entries": int(overflow.sum()),
            "first_nonfinite_positions": [int(i) for i in where[:_SHOWN_POSITIONS]]}


def overflow_failure(side: str, r: dict, ref: str = "REF") -> str:
    """The failure an overflow is (compare logits and --metrics): exit 1, named as one."""
    return (f"{side} is non-finite where {ref} is finite at {r['nonfinite_positions']} positions "
            f"({r['nonfinite_entries']} logits; first at {_positions(r)}): an overflow, not rounding")


def _side_row(side: str, path: str, f, stats, overflow: np.ndarray) -> dict:
    label = f.metadata.get("dtype")
    row = {"side": side, "file": path, "dtype": label if label in DTYPES else None}
    row.update(distribution.summarize(stats))
    row.update(_overflow_fields(overflow))
    return row


def _check_files_options(cfg: LogitsConfig) -> list[tuple[str, str]]:
    """compare logits' options checked before a file is read (exit 2); the (role, path) of each file given."""
    check_gates(cfg.max_kld, cfg.min_top1)
    named = [("REF", cfg.ref)] + [(s, p) for s, p in (("REF_LOW", cfg.ref_low), ("YOURS", cfg.yours)) if p]
    if cfg.plot is not None:  # "" too: refused as an empty path, never taken for "no plot"
        check_output_path(cfg.plot, "--plot", named)
    if cfg.write_kld_base is not None:
        check_output_path(cfg.write_kld_base, "--write-kld-base", named + ([("--plot", cfg.plot)] if cfg.plot else []))
    elif cfg.kld_ctx is not None:
        raise UsageError("--kld-ctx sets the chunk length of --write-kld-base; give that too")
    if cfg.yours is None and cfg.write_kld_base is None:
        raise UsageError("compare logits needs REF and YOURS (or REF REF_LOW YOURS), or REF with --write-kld-base")
    if cfg.yours is None and (cfg.plot is not None or cfg.max_kld is not None or cfg.min_top1 is not None):
        raise UsageError("--plot, --max-kld and --min-top1 judge YOURS: give REF YOURS")
    return named


def compare_files(cfg: LogitsConfig, advance=lambda k=1: None) -> LogitsResult:
    from precisionlab.io import kld_base_file
    from precisionlab.numerics import llamacpp_stats
    from precisionlab.report.logits import say_departure

    named = _check_files_options(cfg)
    per_position = RESULT_BYTES_PER_POSITION * (len(named) - 1)
    ref = logits_file.open_file(cfg.ref, "REF", per_position)
    written = None
    if cfg.write_kld_base is not None:
        if isinstance(ref, kld_base_file.KldBaseFile):
            raise UsageError(f"--write-kld-base: REF {cfg.ref!r} is already a kl-divergence-base file")
        n_ctx = cfg.kld_ctx if cfg.kld_ctx is not None else _window(ref)
        written = kld_base_file.write(cfg.write_kld_base, ref, n_ctx, advance)
    for s, p in named[1:]:  # llama.cpp's base file holds REF's logits only, no run to judge
        if kld_base_file.looks_like(p):
            raise UsageError(f"{s} {p!r} is a KLD base file (llama-perplexity --kl-divergence-base): a KLD base "
                             "file is a reference; give it as REF (the first file)")
    sides = [(s, p, logits_file.open_file(p, s)) for s, p in named[1:]]
    sides = [(s, p, logits_file.align(ref, f, s)) for s, p, f in sides]
    for s, _, f in sides:
        logits_file.check_pair(ref, f, s)
    n, vocab = ref.positions, ref.vocab
    base = isinstance(ref, kld_base_file.KldBaseFile)  # llama.cpp's base file: its own report too
    step = max(1, WORKING_BYTES // (12 * 8 * vocab))
    inputs.check_memory(step * vocab * 8 * (10 + 2 * len(sides)) + n * RESULT_BYTES_PER_POSITION * len(sides),
                        f"compare logits ({n} positions)")
    t0 = time.perf_counter()
    parts = {s: [] for s, _, _ in sides}
    over = {s: [] for s, _, _ in sides}
    removed = {s: [] for s, _, _ in sides}
    pair = {s: [] for s, _, _ in sides}
    llama = {s: [] for s, _, _ in sides}
    for a in range(0, n if sides else 0, step):
        e = min(n, a + step)
        r = ref.rows(a, e)
        raw = ref.rows(a, e, raw=True) if base else None
        for s, _, f in sides:
            y = f.rows(a, e)
            parts[s].append(distribution.position_stats(r, y, ref.tokens[a:e]))
            over[s].append(_overflow_in_file(r, y))
            removed[s].append(np.count_nonzero(np.isfinite(r) & np.isneginf(y), axis=1))
            pair[s].append(comparison.logprob_diff_rows(r, y))
            if base:
                llama[s].append(llamacpp_stats.position_values(raw, y, ref.tokens[a:e]))
        advance()
    stats = {s: distribution.PositionStats.concat(parts[s]) for s in parts}
    rows = [_side_row(s, p, f, stats[s], np.concatenate(over[s])) | _removed_fields(np.concatenate(removed[s]))
            for s, p, f in sides]
    by = {r["side"]: r for r in rows}
    rows.sort(key=lambda r: r["side"] != "YOURS")  # YOURS first, its yardstick beside it
    params = {"ref": cfg.ref, "ref_low": cfg.ref_low, "yours": cfg.yours, "tokens": n, "vocab": vocab,
              "ref_dtype": ref.dtype, "ref_low_dtype": sides[0][2].dtype if cfg.ref_low else None,
              "yours_dtype": next((f.dtype for s, _, f in sides if s == "YOURS"), None),
              "written": written}
    if base:
        params["ref_base"] = {"n_ctx": ref.n_ctx, "n_chunk": ref.n_chunk}
    info = {"name": f"{cfg.yours} against {cfg.ref}", "vocab": vocab}
    failures = gate_failures([{**r, "dtype": r["side"]} for r in rows if r["side"] == "YOURS"], cfg.max_kld, cfg.min_top1)
    y = by.get("YOURS")
    if y and y["nonfinite_positions"]:
        failures.append(overflow_failure("YOURS", y))
    ys = yardstick(y, by["REF_LOW"], stats["YOURS"], stats["REF_LOW"]) if y and "REF_LOW" in by else []
    worst = _worst(ys)
    if worst and worst["flagged"]:
        failures.append(f"YOURS departs from the yardstick REF_LOW: {say_departure(worst)}")
    if y and "REF_LOW" not in by:
        d, scale = (np.concatenate(v) for v in zip(*pair["YOURS"], strict=True))
        y |= two_way_verdict(ref.metadata.get("dtype"), sides[-1][2].metadata.get("dtype"), d, scale)
    return LogitsResult("compare logits", params, info, rows, {r["side"]: stats[r["side"]].kl for r in rows},
                        failures, _file_takeaways(rows, written) + takeaways(rows)
                        + ([y["verdict_note"]] if y and y.get("verdict_note") else []),
                        {"run_s": time.perf_counter() - t0}, ys, worst,
                        {r["side"]: llamacpp_stats.report(llamacpp_stats.concat(llama[r["side"]]))
                         for r in rows if llama[r["side"]]})


def _window(ref) -> int:
    """The chunk length for --write-kld-base: the window REF's run used (its metadata, from this tool)."""
    w = ref.metadata.get("window", "")
    if isinstance(w, str) and w.isdigit() and 3 <= int(w) <= ref.positions:
        return int(w)
    raise UsageError("--write-kld-base: REF's metadata names no window its run restarted at; give --kld-ctx N "
                     "(the context length llama-perplexity will use, -c N)")


def _positions(r: dict) -> str:
    shown = ", ".join(str(i) for i in r["first_nonfinite_positions"])
    return shown + (", ..." if r["nonfinite_positions"] > len(r["first_nonfinite_positions"]) else "")


def _worst(ys: list[dict]) -> dict | None:
    """The statistic that departs most from the yardstick: flagged ones first, then those judged at this n,
    then by ratio."""
    if not ys:
        return None
    return max(ys, key=lambda r: (r["flagged"], r.get("judged", True), r["ratio"]))


def _file_takeaways(rows: list[dict], written: dict | None) -> list[str]:
    lines = []
    if written:
        lines.append(f"wrote {written['path']}: {written['n_chunk']} chunks of n_ctx={written['n_ctx']} "
                     f"({written['scored']} scored positions; {written['left_out']} trailing positions left out); "
                     f"the first input token is not in a logits file and is written as 0.")
    for r in rows:
        if r["nonfinite_positions"]:
            lines.append(f"{r['side']}: non-finite where REF is finite at {r['nonfinite_positions']} positions "
                         f"({r['nonfinite_entries']} logits), first at {_positions(r)}: an overflow.")
        if r.get("mass_removed_positions"):
            shown = ", ".join(str(i) for i in r["first_mass_removed_positions"])
            lines.append(f"{r['side']}: -inf where REF is finite at {r['mass_removed_positions']} positions "
                         f"({r['mass_removed_entries']} logits; first at {shown}): probability mass removed (tokens "
                         "masked), not an overflow; KL is inf there.")
    return lines


# ---------------------------------------------------------------------------


def takeaways(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        d = r.get("side") or r["dtype"]
        ref = "REF" if "side" in r else "fp32"
        if r["undefined_positions"]:
            lines.append(f"{d}: {r['undefined_positions']} positions have no distribution (NaN or +inf logits, "
                         f"or all -inf), so the KL statistics are NaN.")
            continue
        if r["kld_inf_positions"]:
            lines.append(f"{d}: KL is inf at {r['kld_inf_positions']} positions: {ref} gives probability to tokens "
                         f"this run gives none (a -inf logit).")
        if "noise_kld_expected" in r:
            lines.append(f"{d}: with the injected noise, small-noise theory expects a mean KLD of "
                         f"sigma^2/2 (1 - sum p^2) = {r['noise_kld_expected']:.3g}; measured {r['kld_mean']:.3g}.")
        if r["kld_max"] == 0:
            lines.append(f"{d}: the same distributions as {ref} at every position (KL exactly 0).")
            continue
        flips = [b for b in r["flips_by_margin"] if b["flips"]]
        where = ""
        if flips:
            top = max(b["margin_hi"] for b in flips)
            where = f"; every flip sits where {ref}'s top-2 margin is below {top:g}"
        lines.append(f"{d}: mean KLD {r['kld_mean']:.3g} nats, top-1 agreement {r['top1_agree_pct']:.2f} %, "
                     f"perplexity {r['ppl']:.4g} against {r['ppl_ref']:.4g} "
                     f"(ln ratio {r['ln_ppl_ratio']:+.2e})"
                     f"{where}.")
    return lines
