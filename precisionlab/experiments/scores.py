"""compare scores A B: per-question correctness of two builds on the same
questions, paired.

The test is McNemar's exact test: only the questions the builds answer
differently carry information about which is better (b: A right and B
wrong; c: A wrong and B right), and under "no difference" each goes either
way with probability 1/2. The verdict is the test's at alpha = 1 -
confidence, its direction the sign of c - b; beside it Newcombe's paired
score interval for the accuracy difference (method 10), which can disagree
with the exact test at the margin (they are different procedures; the
verdict is the test's), and the drops the run resolves.
"""

from __future__ import annotations

from dataclasses import dataclass

from precisionlab.errors import UsageError
from precisionlab.io import task_scores
from precisionlab.numerics import paired


@dataclass
class ScoresConfig:
    a: str
    b: str
    metric: str | None = None
    filter: str | None = None
    confidence: float = 0.95
    drop: float | None = None        # points
    fail_on_worse: bool = False


@dataclass
class ScoresResult:
    params: dict
    rows: list[dict]
    verdict: str
    failures: list[str]
    takeaways: list[str]


def check_options(cfg: ScoresConfig) -> None:
    if not 0.5 <= cfg.confidence < 1:
        raise UsageError(f"--confidence must be in [0.5, 1) (got {cfg.confidence})")
    if cfg.drop is not None and not 0 < cfg.drop <= 100:
        raise UsageError(f"--drop is in accuracy points, in (0, 100] (got {cfg.drop})")


def run(cfg: ScoresConfig) -> ScoresResult:
    check_options(cfg)
    a = task_scores.read(cfg.a, "A", cfg.metric, cfg.filter)
    b = task_scores.read(cfg.b, "B", cfg.metric or a.metric, cfg.filter)
    pairs = task_scores.pair(a, b)
    n = len(pairs)
    n11 = sum(1 for x, y in pairs if x and y)
    n10 = sum(1 for x, y in pairs if x and not y)
    n01 = sum(1 for x, y in pairs if not x and y)
    n00 = n - n11 - n10 - n01
    p = paired.mcnemar_exact_p(n10, n01)
    lo, hi = paired.newcombe_paired(n11, n10, n01, n00, cfg.confidence)
    alpha = 1 - cfg.confidence
    verdict = paired.NOISE
    if n10 == n01 == 0:
        verdict = paired.SAME
    elif p < alpha:
        verdict = paired.WORSE if n10 > n01 else paired.BETTER
    psi = (n10 + n01) / n
    mde = paired.detectable_drop(n, psi, cfg.confidence)
    row = {"questions": n, "a_correct": n11 + n10, "b_correct": n11 + n01,
           "acc_a_pct": 100 * (n11 + n10) / n, "acc_b_pct": 100 * (n11 + n01) / n,
           "diff_pct": 100 * (n01 - n10) / n, "ci_lo": 100 * lo, "ci_hi": 100 * hi,
           "both_right": n11, "a_only": n10, "b_only": n01, "both_wrong": n00,
           "discordant_share": psi, "p_value": p, "mde": 100 * mde,
           "drop": cfg.drop, "questions_needed": None, "verdict": verdict}
    if cfg.drop is not None:
        row["questions_needed"] = _ceil(paired.questions_needed(cfg.drop / 100, psi, cfg.confidence))
    failures = []
    if cfg.fail_on_worse and verdict == paired.WORSE:
        failures.append(f"B is worse than A: {row['diff_pct']:+.2f} points, McNemar exact p = {p:.3g} < {alpha:.3g}")
    params = {"a": cfg.a, "b": cfg.b, "format_a": a.kind, "format_b": b.kind, "metric": a.metric,
              "filter": a.filter, "confidence": cfg.confidence, "drop": cfg.drop, "power": paired.POWER,
              "test": "McNemar exact (two-sided binomial on discordant pairs)",
              "interval": "Newcombe paired score interval (method 10)", "fail_on_worse": cfg.fail_on_worse}
    return ScoresResult(params, [row], verdict, failures, takeaways(row, cfg.confidence))


def _ceil(x: float):
    import math

    return math.ceil(x) if math.isfinite(x) else None


def takeaways(r: dict, confidence: float) -> list[str]:
    pct = f"{confidence * 100:g} %"
    head = (f"B - A = {r['diff_pct']:+.2f} points on {r['questions']} questions ({r['a_only']} only A got right, "
            f"{r['b_only']} only B), McNemar exact p = {r['p_value']:.3g}, {pct} interval "
            f"[{r['ci_lo']:+.2f}, {r['ci_hi']:+.2f}] points")
    lines = [f"{r['verdict']}: {head}."]
    if r["verdict"] == paired.NOISE:
        lines.append(f"with this many questions and {100 * r['discordant_share']:.1f} % of them answered "
                     f"differently, a drop below {r['mde']:.2f} points could still hide (80 % power).")
    if r["drop"] is not None:
        need = r["questions_needed"]
        lines.append(f"resolving a drop of {r['drop']:g} points (80 % power, {pct}) needs about "
                     f"{need if need is not None else 'unboundedly many'} questions at this discordance.")
    return lines
