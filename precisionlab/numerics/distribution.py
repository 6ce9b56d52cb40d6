"""How far one next-token distribution moved from another: per-position
statistics between two logit matrices, and their summary over a text.

Everything is float64 and numpy (no torch), so `compare logits` on two files
and `compare model --metrics` on live runs share one code path, row by row:
a statistic at a position depends on that position's two rows only, never on
how the rows were batched, which is what makes the two commands agree exactly.

Conventions, declared once here:
- P is the reference (fp32) distribution, Q the one under test. Both come from
  log-softmax of the logits with a float64 log-sum-exp.
- A -inf logit is a token with zero probability. A row holding a NaN or a +inf
  logit, or only -inf, has no distribution: every statistic at that position is
  NaN (so the means are NaN and said so) and its argmax agrees with nothing.
- KL(P||Q) is +inf where P gives mass to a token Q gives none (a -inf logit).
- Percentiles are nearest-rank: the q-th is the smallest observed KL with at
  least q % of positions at or below it, never an interpolation.
- Sums over positions are math.fsum; sums over the vocabulary are numpy's
  pairwise sums of non-negative terms (log-sum-exp and KL), whose error is a
  few ulps of the result.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from precisionlab.numerics.metrics import exact_mean, exact_sum, exp_or_inf

# Buckets of fp32's top-1 minus top-2 logit, [lo, hi): argmax flips
# concentrate where this margin is below the low precision's logit error.
MARGIN_EDGES = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, math.inf)
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
TOP_K = 5

# Below this |u|, phi(u) = expm1(u) - u comes from its Taylor series (through
# u^14/14!, a relative truncation error below 2*0.25^13/15! ~ 1e-20): the
# subtraction would cancel leading digits, a factor 2/|u| of them. Above it the
# subtraction loses at most a factor ~8, a few ulps.
_SERIES_BELOW = 0.25
_SERIES = tuple(1.0 / math.factorial(k) for k in range(2, 15))  # 1/2!, 1/3!, ..., 1/14!


@dataclass
class PositionStats:
    """One value per position (row) for each statistic."""

    kl: np.ndarray            # KL(P||Q), nats
    top1: np.ndarray          # bool: the two argmaxes agree
    ref_in_top5: np.ndarray   # bool: P's argmax is among Q's top 5
    low_in_top5: np.ndarray   # bool: Q's argmax is among P's top 5
    nll_ref: np.ndarray       # -log P(next token)
    nll_low: np.ndarray       # -log Q(next token)
    dp: np.ndarray            # Q(next) - P(next)
    margin: np.ndarray        # P's top-1 minus top-2 logit (inf for a 1-token vocabulary)
    dnll: np.ndarray | None = None  # nll_low - nll_ref, accurately (-log(Q/P) of the next token)

    @staticmethod
    def concat(parts: list["PositionStats"]) -> "PositionStats":
        return PositionStats(**{k: (None if any(getattr(p, k) is None for p in parts)
                                    else np.concatenate([getattr(p, k) for p in parts]))
                                for k in PositionStats.__dataclass_fields__})


def valid_rows(x: np.ndarray) -> np.ndarray:
    """Rows that define a distribution: no NaN, no +inf, not all -inf."""
    return ~np.isnan(x).any(axis=1) & ~(x == np.inf).any(axis=1) & (x > -np.inf).any(axis=1)


def log_softmax(x: np.ndarray, ok: np.ndarray | None = None) -> np.ndarray:
    """Row-wise log-softmax in float64 through a max-shifted log-sum-exp.
    Invalid rows come out all NaN. ok: valid_rows(x), where the caller has it."""
    x = np.asarray(x, dtype=np.float64)
    ok = valid_rows(x) if ok is None else ok
    m = np.where(ok, np.max(np.where(ok[:, None], x, 0.0), axis=1), 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        z = x - m[:, None]                      # -inf stays -inf; the max row entry becomes exactly 0
        e = np.exp(np.where(ok[:, None], z, 0.0))
        # log(1 + t), t the sum without one max's own 1: log(s) would drop every
        # term below 2^-53 (the top token of [100, 0, 0] has log-probability
        # -1.1e-43, not 0)
        e[np.arange(x.shape[0]), np.argmax(np.where(ok[:, None], z, 0.0), axis=1)] = 0.0
        lse = np.log1p(np.sum(e, axis=1))
        out = z - lse[:, None]
    out[~ok] = np.nan
    return out


def phi(u: np.ndarray) -> np.ndarray:
    """expm1(u) - u, which is >= 0 for every u (+inf at u = -inf), accurate for small |u|."""
    u = np.asarray(u, dtype=np.float64)
    small = np.abs(u) < _SERIES_BELOW
    s = np.where(small, u, 0.0)
    acc = np.full_like(s, _SERIES[-1])
    for c in _SERIES[-2::-1]:  # Horner, from the smallest term up
        acc = c + s * acc
    series = s * s * acc
    with np.errstate(invalid="ignore", over="ignore"):
        direct = np.expm1(u) - u
    return np.where(small, series, direct)


def log_ratio(ref: np.ndarray, low: np.ndarray, lp: np.ndarray, lq: np.ndarray) -> np.ndarray:
    """u = lq - lp, log(Q/P) per entry, accurate to the scale of the difference
    between the rows rather than of the log-probabilities (lq - lp subtracts two
    numbers near -log(vocab), each an ulp off: for logits that differ by 1e-9
    that is 1e-7 of the answer, and for rows that differ by a constant, all of it).

    Pivot on a = P's argmax: zp = ref - ref_a, d = low - ref, delta = d - d_a
    (= zq - zp),
    t = sum_{j != a} exp(zp_j), and the ratio of the two normalisers is
    log1p(tq) - log1p(tp) = log1p(D / (1 + tp)), D = tq - tp =
    sum_{j != a} exp(zp_j) expm1(delta_j), so u = delta - log1p(D / (1 + tp)).
    Rows whose -inf entries differ, or where that overflows, keep lq - lp."""
    with np.errstate(invalid="ignore", over="ignore"):
        u = lq - lp
        fin = np.isfinite(ref) & np.isfinite(low)
        same = (np.isfinite(ref) == np.isfinite(low)).all(axis=1) & ~np.isnan(lp).any(axis=1) \
            & ~np.isnan(lq).any(axis=1)
        if not np.any(same):
            return u
        r, l, f = ref[same], low[same], fin[same]
        idx = np.arange(r.shape[0])
        a = np.argmax(np.where(f, r, -np.inf), axis=1)
        zp = np.where(f, r - r[idx, a][:, None], 0.0)
        d = np.where(f, l - r, 0.0)  # exact where the two logits are within a factor 2 (Sterbenz)
        delta = d - d[idx, a][:, None]
        e = np.where(f, np.exp(zp), 0.0)
        e[idx, a] = 0.0
        tp = np.sum(e, axis=1)
        big_d = np.sum(e * np.expm1(delta), axis=1)
        c = np.log1p(big_d / (1.0 + tp))
        ur = np.where(f, delta - c[:, None], u[same])
        good = np.isfinite(c)
        rows = np.flatnonzero(same)[good]
        u[rows] = ur[good]
    return u


def kl_rows(lp: np.ndarray, lq: np.ndarray, u: np.ndarray | None = None) -> np.ndarray:
    """KL(P||Q) per row from log-probabilities.

    Written as sum_i p_i * phi(lq_i - lp_i) with phi(u) = expm1(u) - u, which
    equals sum_i p_i (lp_i - lq_i) because sum p = sum q = 1 (each term is
    p (lp - lq) + q - p; where p = 0 it is q alone). Every term is
    >= 0, so the sum never cancels, never goes negative, and is exactly 0 when
    the rows are equal. Where Q/P is large (u > 1) the term is q - p - p*u,
    which cannot overflow the way p * expm1(u) would for a tiny p.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(lp)
        if u is None:
            u = lq - lp
        big = u > 1.0
        term = np.where(big, np.exp(lq) - p - p * np.where(big, u, 0.0), p * phi(np.where(big, 0.0, u)))
        term = np.where(lp == -np.inf, np.exp(lq), term)                    # no mass in P: the q - p part alone
        term = np.where((lp > -np.inf) & (lq == -np.inf), np.inf, term)     # mass in P, none in Q
        kl = np.sum(term, axis=1)
    bad = np.isnan(lp).any(axis=1) | np.isnan(lq).any(axis=1)
    kl[bad] = np.nan
    return kl


def _in_top_k(x: np.ndarray, idx: np.ndarray, k: int) -> np.ndarray:
    """x[r, idx[r]] is among row r's top k: fewer than k entries strictly above
    it (ties count in its favour)."""
    v = x[np.arange(x.shape[0]), idx]
    return np.sum(x > v[:, None], axis=1) < k


def _margin(x: np.ndarray) -> np.ndarray:
    if x.shape[1] < 2:
        return np.full(x.shape[0], np.inf)
    top2 = np.partition(x, x.shape[1] - 2, axis=1)[:, -2:]
    with np.errstate(invalid="ignore"):
        return top2[:, 1] - top2[:, 0]


# Rows of a block position_stats works through at once: about this many entries, so that each of its
# float64 temporaries (a dozen, each the block's size) stays in the CPU's cache. Over a whole matrix at a
# real vocabulary (512 x 49,152) every temporary is 200 MB and each pass waits on memory: blocks cost a
# quarter to a third of the CPU time, and every statistic is row by row, so the result is the same bits.
BLOCK_ENTRIES = 1 << 18


def position_stats(ref: np.ndarray, low: np.ndarray, targets: np.ndarray, workers: int = 1) -> PositionStats:
    """Every per-position statistic between two (positions x vocab) logit
    matrices; targets[i] is the token that followed position i. Computed a
    block of rows at a time (BLOCK_ENTRIES), `workers` blocks at once: numpy
    releases the GIL inside each array operation, and a block's statistics
    depend on its rows alone, so the result is the same bits for any count."""
    ref, low, targets = np.asarray(ref), np.asarray(low), np.asarray(targets)  # widened block by block
    k = max(1, BLOCK_ENTRIES // max(1, ref.shape[1]))
    if ref.shape[0] <= k:
        return _block_stats(ref, low, targets)
    starts = range(0, ref.shape[0], k)

    def block(i: int) -> PositionStats:
        return _block_stats(ref[i:i + k], low[i:i + k], targets[i:i + k])

    if workers <= 1:
        return PositionStats.concat([block(i) for i in starts])
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return PositionStats.concat(list(pool.map(block, starts)))  # map keeps the blocks' order


def _block_stats(ref: np.ndarray, low: np.ndarray, targets: np.ndarray) -> PositionStats:
    # widened here, one block at a time: every statistic below is float64 arithmetic on the stored values
    ref, low = ref.astype(np.float64, copy=False), low.astype(np.float64, copy=False)
    ok_ref, ok_low = valid_rows(ref), valid_rows(low)  # each once: three passes over the block apiece
    ok = ok_ref & ok_low
    lp, lq = log_softmax(ref, ok_ref), log_softmax(low, ok_low)
    rows = np.arange(ref.shape[0])
    a_ref = np.argmax(np.where(ok[:, None], ref, 0.0), axis=1)
    a_low = np.argmax(np.where(ok[:, None], low, 0.0), axis=1)
    nll_ref, nll_low = -lp[rows, targets], -lq[rows, targets]
    u = log_ratio(ref, low, lp, lq)
    u_t = u[rows, targets]
    margin = _margin(ref)
    margin[~ok_ref] = np.nan
    with np.errstate(invalid="ignore", over="ignore"):
        p_t = np.exp(-nll_ref)
        # Q(next) - P(next) = P(next) expm1(u): no cancellation of two near-equal probabilities
        dp = np.where(np.isfinite(u_t), p_t * np.expm1(u_t), np.exp(-nll_low) - p_t)
    return PositionStats(
        kl=kl_rows(lp, lq, u),
        top1=ok & (a_ref == a_low),
        ref_in_top5=ok & _in_top_k(low, a_ref, TOP_K),
        low_in_top5=ok & _in_top_k(ref, a_low, TOP_K),
        nll_ref=nll_ref, nll_low=nll_low,
        dp=dp,
        margin=margin,
        dnll=-u_t,
    )




def standard_error(x: np.ndarray) -> float:
    """The standard error of the mean of x: sqrt(sum (x - mean)^2 / (n (n - 1))),
    the sample standard deviation over sqrt(n), as llama.cpp's perplexity tool
    prints beside its means (its sum2/n - mean^2 over n - 1 is the same number,
    computed here in two passes so it does not cancel). NaN below two values or
    where a value is not finite (an inf mean has no spread to speak of)."""
    n = x.size
    if n < 2 or not np.isfinite(x).all():
        return math.nan
    m = math.fsum(x.tolist()) / n
    d = x - m
    return math.sqrt(math.fsum((d * d).tolist()) / (n * (n - 1)))


def share_standard_error(count: int, n: int) -> float:
    """Of a share count/n, in percent: the binomial sqrt(p (1 - p) / (n - 1)),
    which is standard_error of the 0/1 indicators (llama.cpp's "same top p" ±)."""
    if n < 2:
        return math.nan
    p = count / n
    return 100.0 * math.sqrt(p * (1 - p) / (n - 1))



def nearest_rank(q: float, n: int) -> int:
    """The 1-based rank of the q-th percentile of n values: the smallest k with
    k/n >= q/100, in exact rationals (numpy's float arithmetic turns 99.9 % of
    1000 into 999.0000000000001 and so picks the 1000th value)."""
    return max(1, math.ceil(Fraction(repr(q)) * n / 100))


def _pct(count: int, n: int) -> float:
    return 100.0 * count / n


def summarize(s: PositionStats) -> dict:
    """The summary row: KL mean and percentiles, agreement, delta-p, perplexity."""
    n = s.kl.size
    kl = s.kl
    nan_kl = int(np.isnan(kl).sum())
    srt = np.sort(kl)
    pcts = {f"kld_p{q:g}".replace(".", "_"): (math.nan if nan_kl else float(srt[nearest_rank(q, n) - 1]))
            for q in PERCENTILES}
    mean_nll_ref, mean_nll_low = exact_mean(s.nll_ref), exact_mean(s.nll_low)
    # The difference of the two mean NLLs in one exact sum, not two rounded means.
    dnll = s.dnll if s.dnll is not None else s.nll_low - s.nll_ref
    ln_ratio = exact_sum(s.dnll if s.dnll is not None else np.concatenate([s.nll_low, -s.nll_ref])) / n
    top1 = int(s.top1.sum())
    dp_rms = math.sqrt(exact_mean(s.dp * s.dp))
    return {
        "positions": n,
        "kld_mean": exact_mean(kl),
        "kld_mean_se": standard_error(kl),
        "kld_median": pcts.pop("kld_p50"),
        **pcts,
        "kld_max": math.nan if nan_kl else float(np.max(kl)),
        "kld_inf_positions": int(np.isinf(kl).sum()),
        "undefined_positions": nan_kl,
        "top1_agree": top1,
        "top1_agree_pct": _pct(top1, n),
        "top1_agree_pct_se": share_standard_error(top1, n),
        # the reference by its role, fp32 or REF, as ppl_ref (issue 45: one name per quantity)
        "ref_top1_in_top5_pct": _pct(int(s.ref_in_top5.sum()), n),
        "top1_in_ref_top5_pct": _pct(int(s.low_in_top5.sum()), n),
        "dp_mean": exact_mean(s.dp),
        "dp_mean_se": standard_error(s.dp),
        "dp_rms": dp_rms,
        # the delta method on sqrt(mean dp^2), as llama.cpp: d sqrt(m) = dm / (2 sqrt(m))
        "dp_rms_se": standard_error(s.dp * s.dp) / (2 * dp_rms) if dp_rms > 0 else math.nan,
        "ppl_ref": exp_or_inf(mean_nll_ref),  # the reference's, fp32 or REF: one name (issue 45)
        "ppl": exp_or_inf(mean_nll_low),
        "ln_ppl_ratio": ln_ratio,
        # from the per-token differences: the two NLLs move together, so their
        # separate errors would overstate this one by far
        "ln_ppl_ratio_se": standard_error(dnll),
        "flips_by_margin": flips_by_margin(s),
    }


def flips_by_margin(s: PositionStats) -> list[dict]:
    out = []
    for lo, hi in itertools.pairwise(MARGIN_EDGES):
        inside = (s.margin >= lo) & (s.margin < hi)
        if hi == math.inf:
            inside |= s.margin == math.inf
        n = int(inside.sum())
        flips = int((inside & ~s.top1).sum())
        out.append({"margin_lo": lo, "margin_hi": hi, "positions": n, "flips": flips,
                    "flip_share": flips / n if n else None})
    return out


def expected_kl_gaussian_noise(ref: np.ndarray, sigma: float) -> np.ndarray:
    """Small-noise expectation of KL(P||Q) when Q's logits are P's plus iid
    N(0, sigma^2): sigma^2/2 * (1 - sum p^2), per row (second order in sigma)."""
    p = np.exp(log_softmax(ref))
    return sigma * sigma / 2 * (1.0 - np.sum(p * p, axis=1))


def kl_lower_bound_top_k(lp: np.ndarray, top: list[dict[int, float]]) -> np.ndarray:
    """Per row, a lower bound on KL(P||Q) when only Q's top-k log-probabilities
    are known (an endpoint's top_logprobs): the KL between P and Q coarsened
    to the k tokens Q lists plus one bucket for all the others. Merging
    outcomes never increases KL (the data-processing inequality), so this is
    <= the true KL; it is exact when P and Q put the same mass outside the k.
    lp: P's log-probabilities (rows x vocab); top[i]: {token id: log Q}."""
    out = np.empty(lp.shape[0])
    for i, row in enumerate(top):
        ids = np.fromiter(row.keys(), dtype=np.int64, count=len(row))
        lq = np.fromiter(row.values(), dtype=np.float64, count=len(row))
        lpk = lp[i, ids]
        terms = np.exp(lpk) * (lpk - lq)
        p_tail = -np.expm1(np.logaddexp.reduce(lpk)) if len(ids) else 1.0
        q_tail = -np.expm1(np.logaddexp.reduce(lq)) if len(ids) else 1.0
        tail = 0.0
        if p_tail > 0:
            tail = math.inf if q_tail <= 0 else p_tail * math.log(p_tail / q_tail)
        out[i] = math.fsum([*terms.tolist(), tail])
    return out
