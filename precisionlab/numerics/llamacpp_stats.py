"""llama-perplexity's --kl-divergence report, by its own definitions, so a
user can hold this tool's numbers beside the ones llama.cpp printed.

They differ from precisionlab.numerics.distribution's in three places, which
is why they live apart and are shown apart:
- its KL at a position sums p (ln p - ln q) over the base tokens with
  ln p > -16 only, with p the base file's stored (dequantised, not
  renormalised) probabilities: the tokens below were not stored;
- its percentiles interpolate linearly between order statistics (the median
  is the mean of the middle two), where precisionlab's are nearest-rank;
- its Δp subtracts the stored base probability of the next token.
Its ± is the standard error of the mean (distribution.standard_error); the
RMS Δp's comes from the mean of Δp² by the delta method, "same top p"'s is
binomial. Learned from llama.cpp's tools/perplexity/perplexity.cpp; written
here from those definitions.
"""

from __future__ import annotations

import math

import numpy as np

from precisionlab.numerics.distribution import log_softmax, share_standard_error, standard_error
from precisionlab.numerics.metrics import exact_sum, exp_or_inf

KL_FLOOR = -16.0  # base log-probabilities at or below this are left out of the KL sum
# (key, fraction) of the KLD percentiles llama-perplexity prints, top down
KLD_PERCENTILES = (("kld_p99_9", 0.999), ("kld_p99", 0.99), ("kld_p95", 0.95), ("kld_p90", 0.9),
                   ("kld_p10", 0.1), ("kld_p5", 0.05), ("kld_p1", 0.01), ("kld_p0_1", 0.001))


def position_values(base_lp: np.ndarray, yours: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
    """Per position: kl, dp, same_top (bool), nll, nll_base. base_lp: the
    base file's log-probabilities as stored; yours: logits (any shift)."""
    lq = log_softmax(yours)
    rows = np.arange(base_lp.shape[0])
    keep = base_lp > KL_FLOOR
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(keep, np.exp(np.where(keep, base_lp, 0.0)), 0.0)
        kl = np.sum(np.where(keep, p * (base_lp - lq), 0.0), axis=1)
        nll, nll_base = -lq[rows, targets], -base_lp[rows, targets]
        dp = np.exp(-nll) - np.exp(-nll_base)
    same = np.argmax(np.where(np.isnan(yours), -np.inf, yours), axis=1) == np.argmax(base_lp, axis=1)
    return {"kl": kl, "dp": dp, "same_top": same, "nll": nll, "nll_base": nll_base}


def concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def interpolated(sorted_values: np.ndarray, fraction: float) -> float:
    """The value at fraction (n - 1) of the way along the sorted values, linear between neighbours."""
    n = sorted_values.size
    pos = fraction * (n - 1)
    i = min(int(pos), n - 1)
    t = pos - i
    return float((1 - t) * sorted_values[i] + t * sorted_values[min(i + 1, n - 1)])


def _median(s: np.ndarray) -> float:
    n = s.size
    return float(s[n // 2]) if n % 2 else float(0.5 * (s[n // 2 - 1] + s[n // 2]))


def report(v: dict[str, np.ndarray]) -> dict:
    """The numbers of llama-perplexity's closing report (nats; shares in %)."""
    n = v["kl"].size
    kl = np.sort(v["kl"])
    dp2 = v["dp"] * v["dp"]
    rms = math.sqrt(exact_sum(dp2) / n)
    same = int(np.count_nonzero(v["same_top"]))
    d = v["nll"] - v["nll_base"]
    return {
        "positions": n,
        "mean_kld": exact_sum(kl) / n, "mean_kld_se": standard_error(v["kl"]),
        "max_kld": float(kl[-1]),
        **{key: interpolated(kl, f) for key, f in KLD_PERCENTILES[:4]},
        "median_kld": _median(kl),
        **{key: interpolated(kl, f) for key, f in KLD_PERCENTILES[4:]},
        "min_kld": float(kl[0]),
        "mean_dp_pct": 100 * exact_sum(v["dp"]) / n, "mean_dp_pct_se": 100 * standard_error(v["dp"]),
        "rms_dp_pct": 100 * rms, "rms_dp_pct_se": 100 * standard_error(dp2) / (2 * rms) if rms > 0 else math.nan,
        "same_top_p_pct": 100 * same / n, "same_top_p_pct_se": share_standard_error(same, n),
        "mean_ln_ppl_ratio": exact_sum(d) / n, "mean_ln_ppl_ratio_se": standard_error(d),
        "ppl_q": exp_or_inf(exact_sum(v["nll"]) / n), "ppl_base": exp_or_inf(exact_sum(v["nll_base"]) / n),
    }
