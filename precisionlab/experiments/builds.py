"""compare builds REF A B: is build B's distance from REF different from build
A's, beyond the noise of a text this long?

All three are logits files over the same tokens (precisionlab.io.logits_file:
this tool's, or llama.cpp's kl-divergence-base file for REF). Each position
gives A's and B's statistics against REF through the per-position code
compare logits uses (numerics.distribution.position_stats); their paired
difference B - A per position goes through numerics.paired: the mean, a seeded
circular-block-bootstrap interval over positions, the verdict and the
smallest effect the run resolves.

Why positions and not sequences: a logits file is one stream of positions with
no sequence boundaries in its layout (a run's windows restart the context, but
the file does not say where, and a single long text has one sequence), so the
resampling unit is a block of consecutive positions, long enough (Politis and
White's rule) to carry the dependence between neighbours.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from precisionlab.errors import UsageError
from precisionlab.io import inputs, logits_file, outputs
from precisionlab.numerics import distribution, paired

# The statistics compared, per position, each side against REF:
# (name, unit, higher is worse, the per-position value from PositionStats).
STATISTICS = (
    ("kld", "nats", True, lambda s: s.kl),
    ("top1_agree_pct", "points", False, lambda s: s.top1.astype(np.float64) * 100.0),
    ("abs_dp", "probability", True, lambda s: np.abs(s.dp)),
    ("nll", "nats", True, lambda s: s.dnll),  # nll_side - nll_ref: B - A is nll_B - nll_A
)
PRIMARY = "kld"          # the verdict the command gives and --fail-on-worse gates on: the least noisy signal
MIN_POSITIONS = 10       # below this no block length or interval means anything
WORKING_BYTES = 256 << 20
BYTES_PER_POSITION = 8 * 2 * (len(STATISTICS) + 4)  # both sides' statistics and PositionStats' arrays


@dataclass
class BuildsConfig:
    ref: str
    a: str
    b: str
    confidence: float = 0.95
    seed: int = 0
    resamples: int = 2000
    fail_on_worse: bool = False
    plot: str | None = None


@dataclass
class BuildsResult:
    params: dict
    rows: list[dict]                     # one per statistic
    verdict: str                         # the primary statistic's
    failures: list[str]
    takeaways: list[str]
    timing: dict
    diffs: dict[str, np.ndarray] = field(default_factory=dict)  # per statistic, per position (the plot)


def check_options(cfg: BuildsConfig) -> None:
    if not 0.5 <= cfg.confidence < 1:
        raise UsageError(f"--confidence must be in [0.5, 1) (got {cfg.confidence})")
    if not 100 <= cfg.resamples <= 1_000_000:
        raise UsageError(f"--resamples must be in 100 ... 1000000 (got {cfg.resamples})")
    if cfg.seed < 0:
        raise UsageError(f"--seed must be >= 0 (got {cfg.seed})")
    if cfg.plot:
        from precisionlab.report.plots import plot_kinds, require_matplotlib

        require_matplotlib()
        outputs.check_output_path(cfg.plot, plot_kinds(), "--plot",
                                  [("REF", cfg.ref), ("A", cfg.a), ("B", cfg.b)])


def _open(cfg: BuildsConfig):
    ref = logits_file.open_file(cfg.ref, "REF", BYTES_PER_POSITION)
    sides = {}
    for name, path in (("A", cfg.a), ("B", cfg.b)):
        f = logits_file.align(ref, logits_file.open_file(path, name), name)
        logits_file.check_pair(ref, f, name)
        sides[name] = f
    if ref.positions < MIN_POSITIONS:
        raise UsageError(f"REF {cfg.ref!r} has {ref.positions} positions; a paired interval needs at least "
                         f"{MIN_POSITIONS}")
    return ref, sides


def _check_defined(rows: np.ndarray, what: str, path: str, start: int) -> None:
    """A paired difference needs a distribution at every position: a NaN or
    +inf logit (or a row of -inf) is refused, naming the first."""
    bad = np.flatnonzero(~distribution.valid_rows(rows))
    if bad.size:
        i = start + int(bad[0])
        raise UsageError(f"{what} {path!r}: NaN or +inf logits (no distribution) at position {i}; a paired "
                         f"comparison needs every position defined")


def per_position(cfg: BuildsConfig, advance=lambda k=1: None):
    """Every position's statistics of A and of B against REF."""
    ref, sides = _open(cfg)
    n, vocab = ref.positions, ref.vocab
    step = max(1, WORKING_BYTES // (12 * 8 * vocab))
    inputs.check_memory(step * vocab * 8 * 14 + n * BYTES_PER_POSITION, f"compare builds ({n} positions)")
    parts = {s: [] for s in sides}
    for a in range(0, n, step):
        e = min(n, a + step)
        r = ref.rows(a, e)
        _check_defined(r, "REF", cfg.ref, a)
        for s, f in sides.items():
            y = f.rows(a, e)
            _check_defined(y, s, f.path, a)
            parts[s].append(distribution.position_stats(r, y, ref.tokens[a:e]))
        advance()
    stats = {s: distribution.PositionStats.concat(p) for s, p in parts.items()}
    return ref, sides, stats


def _row(name: str, unit: str, worse_high: bool, va: np.ndarray, vb: np.ndarray, cfg: BuildsConfig,
         seed: list[int]) -> tuple[dict, np.ndarray]:
    """One statistic: the paired interval for B - A (the verdict's), and each
    side's own interval beside it (whether the two overlap is what a reader
    of two separate reports would look at; the paired one is the sharper
    test, since the positions' shared difficulty cancels in B - A)."""
    with np.errstate(invalid="ignore"):
        d = vb - va
    iv = paired.mean_interval(d, cfg.confidence, cfg.resamples, np.random.default_rng([*seed, 0]))
    ia = paired.mean_interval(va, cfg.confidence, cfg.resamples, np.random.default_rng([*seed, 1]))
    ib = paired.mean_interval(vb, cfg.confidence, cfg.resamples, np.random.default_rng([*seed, 2]))
    identical = bool(np.all(d == 0))
    row = {"statistic": name, "unit": unit, "worse_when": "higher" if worse_high else "lower",
           "a": ia.mean, "a_ci_lo": ia.lo, "a_ci_hi": ia.hi, "b": ib.mean, "b_ci_lo": ib.lo, "b_ci_hi": ib.hi,
           "sides_overlap": not (ia.hi < ib.lo or ib.hi < ia.lo), "diff": iv.mean, "ci_lo": iv.lo, "ci_hi": iv.hi,
           "diff_se": iv.se, "ci_half_width": iv.half_width, "mde": iv.mde, "block": iv.block,
           "positions_differing": int(np.count_nonzero(d)),
           "verdict": paired.verdict(iv.lo, iv.hi, worse_high, identical)}
    return row, d


def run(cfg: BuildsConfig, advance=lambda k=1: None) -> BuildsResult:
    check_options(cfg)
    t0 = time.perf_counter()
    ref, sides, stats = per_position(cfg, advance)
    t1 = time.perf_counter()
    rows, diffs = [], {}
    for i, (name, unit, worse_high, get) in enumerate(STATISTICS):
        # one stream per statistic and interval: adding one changes no other
        row, d = _row(name, unit, worse_high, get(stats["A"]), get(stats["B"]), cfg, [cfg.seed, i])
        rows.append(row)
        diffs[name] = d
    primary = next(r for r in rows if r["statistic"] == PRIMARY)
    failures = []
    if cfg.fail_on_worse and primary["verdict"] == paired.WORSE:
        failures.append(f"B is worse than A on {PRIMARY}: mean difference {primary['diff']:.3g} "
                        f"[{primary['ci_lo']:.3g}, {primary['ci_hi']:.3g}] at {cfg.confidence:g} confidence")
    params = {"ref": cfg.ref, "a": cfg.a, "b": cfg.b, "tokens": ref.positions, "vocab": ref.vocab,
              "ref_dtype": ref.dtype, "a_dtype": sides["A"].dtype, "b_dtype": sides["B"].dtype,
              "confidence": cfg.confidence, "seed": cfg.seed, "resamples": cfg.resamples,
              "resampling": "circular block bootstrap over positions (Politis-White block length)",
              "primary": PRIMARY, "power": paired.POWER, "fail_on_worse": cfg.fail_on_worse, "plot": cfg.plot}
    return BuildsResult(params, rows, primary["verdict"], failures, takeaways(rows, cfg.confidence),
                        {"read_s": t1 - t0, "run_s": time.perf_counter() - t1}, diffs)


def takeaways(rows: list[dict], confidence: float) -> list[str]:
    lines = []
    pct = f"{confidence * 100:g} %"
    for r in rows:
        s = r["statistic"]
        if r["verdict"] == paired.SAME:
            lines.append(f"{s}: A and B give the same value at every position (bit for bit against REF).")
        elif r["verdict"] == "undefined":
            lines.append(f"{s}: not finite at some position (KL is inf where a side gives a token REF "
                         f"expects no probability), so no interval.")
        elif r["verdict"] == paired.NOISE:
            lines.append(f"{s}: within noise: B - A = {r['diff']:.3g} {r['unit']}, {pct} interval "
                         f"[{r['ci_lo']:.3g}, {r['ci_hi']:.3g}]; a true difference below {r['mde']:.3g} "
                         f"{r['unit']} could still hide in this many positions (80 % power).")
        else:
            lines.append(f"{s}: {r['verdict']}: B - A = {r['diff']:.3g} {r['unit']}, {pct} interval "
                         f"[{r['ci_lo']:.3g}, {r['ci_hi']:.3g}] excludes 0 (blocks of {r['block']}).")
        if s == PRIMARY and r["verdict"] not in (paired.SAME, "undefined"):
            lines.append(f"{s} of each side alone: A {r['a']:.3g} [{r['a_ci_lo']:.3g}, {r['a_ci_hi']:.3g}], "
                         f"B {r['b']:.3g} [{r['b_ci_lo']:.3g}, {r['b_ci_hi']:.3g}]: the {pct} intervals "
                         f"{'overlap' if r['sides_overlap'] else 'do not overlap'} (the paired interval of B - A "
                         f"is the sharper test).")
    return lines
