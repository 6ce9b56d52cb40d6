"""Verdicts that hold at small n: the interval a yardstick verdict rests on,
and when a percentile is too few positions to judge by (issue 40, 6).

A three-way `compare logits` sets each statistic of YOURS beside REF_LOW's
(the yardstick) as a ratio of departures from REF. A point ratio alone can
rest on one token: with 256 positions the 99.9th percentile IS the maximum,
and a clean engine scored 3.48x on it. And a paired z on heavy-tailed
per-position KL lets a 242x mean escape, its standard error swollen by the
tail. So:

  ratio of means   the mean's departure (KL, a flip share, |mean dp|, ...) of
                   YOURS over REF_LOW's, with a percentile interval from a
                   seeded circular block bootstrap over positions (paired: both
                   sides resampled at the same positions; numerics/paired's
                   bootstrap and block length). Heavy tails move the interval,
                   not a standard error: only an excess carried by a handful
                   of positions puts its lower end back under 1.
  percentiles      judged only with MIN_TAIL positions on each side of the
                   percentile (n >= MIN_TAIL / (1 - q)): 20 for the median,
                   100 for p90, 1,000 for p99, 10,000 for p99.9; the maximum
                   is one position at every n and never judged. The interval
                   is distribution-free: each side's order statistics at the
                   ranks n q -+ z sqrt(n q (1 - q)) (the binomial count of
                   positions under the true quantile, normal at these n),
                   combined at their far ends.

numpy only.
"""

from __future__ import annotations

import math

import numpy as np

from precisionlab.numerics import paired

CONFIDENCE = 0.99     # the interval a verdict rests on (its lower end past 1: YOURS departs more, beyond doubt)
RESAMPLES = 2000      # bootstrap resamples: the 0.5 % quantile then rests on 10 resamples
SEED = 0              # seeded: the same files give the same verdict
# Positions needed on each side of a percentile before it is a verdict: the
# count under the true quantile is binomial, so with k positions beyond it its
# rank moves by about sqrt(k); at k = 10 that is a third of the tail, at k = 1
# (p99.9 at n = 1000) the percentile is one token.
MIN_TAIL = 10


def min_positions(q: float) -> int:
    """The fewest positions at which the q-quantile (0 < q < 1) is judged."""
    return math.ceil(MIN_TAIL / min(q, 1 - q) - 1e-9)


def _ratios(dy: np.ndarray, dl: np.ndarray) -> np.ndarray:
    """compare.ratio over arrays: dl = 0 gives inf for any departure, 0 for none."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(dl > 0, dy / np.where(dl > 0, dl, 1.0), np.where(dy > 0, math.inf, 0.0))
    return r


def ratio_of_means(y: np.ndarray, low: np.ndarray, departure=abs, confidence: float = CONFIDENCE,
                   resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float, int]:
    """(lo, hi, block): the percentile interval of departure(mean(y)) /
    departure(mean(low)) over paired circular-block-bootstrap resamples of the
    positions. `departure` maps a mean to its distance from REF (abs for a
    signed mean, math.sqrt-like for a mean square), elementwise on arrays.
    NaN bounds where a value is not finite (no interval is claimed)."""
    y, low = np.asarray(y, dtype=np.float64), np.asarray(low, dtype=np.float64)
    if y.size < 2 or not (np.isfinite(y).all() and np.isfinite(low).all()):
        return math.nan, math.nan, 0
    d = y - low
    block = max(paired.block_length(d), -(-d.size // paired.MAX_BLOCKS))
    # the same seed, the same n and block: both draws pick the same block starts (paired)
    my = paired.bootstrap_means(y, block, resamples, np.random.default_rng(seed))
    ml = paired.bootstrap_means(low, block, resamples, np.random.default_rng(seed))
    r = _ratios(departure(my), departure(ml))
    alpha = 1 - confidence
    lo, hi = np.quantile(r, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
    return float(lo), float(hi), block


def quantile_interval(x: np.ndarray, q: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The distribution-free interval of x's q-quantile: the order statistics
    at ranks n q -+ z sqrt(n q (1 - q)), clipped to the sample. Valid where n
    >= min_positions(q) (the binomial is near normal there)."""
    xs = np.sort(np.asarray(x, dtype=np.float64))
    n = xs.size
    half = paired.z(confidence) * math.sqrt(n * q * (1 - q))
    lo_i = min(n - 1, max(0, math.floor(n * q - half) - 1))
    hi_i = min(n - 1, max(0, math.ceil(n * q + half) - 1))
    return float(xs[lo_i]), float(xs[hi_i])


def quantile_ratio_interval(y: np.ndarray, low: np.ndarray, q: float,
                            confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The ratio of two non-negative q-quantiles (YOURS over REF_LOW), its
    interval from each side's at the far ends: (y_lo / low_hi, y_hi / low_lo).
    Each side at sqrt(confidence), so both hold together at `confidence`."""
    each = math.sqrt(confidence)
    ylo, yhi = quantile_interval(y, q, each)
    llo, lhi = quantile_interval(low, q, each)
    lo = _ratios(np.array([ylo]), np.array([lhi]))[0]
    hi = _ratios(np.array([yhi]), np.array([llo]))[0]
    return float(lo), float(hi)
