"""How far two per-token log-probability streams of the same tokens disagree:
a trainer's and a rollout engine's, or any two engines'. float64 numpy only.

Conventions, declared once here:
- A is the trainer (the policy being updated), B the rollout (the engine the
  tokens were sampled from). Delta = logp_A - logp_B = log r, where
  r = p_A(x) / p_B(x) is the importance ratio a policy-gradient update
  multiplies by, for x ~ B.
- KL of the rollout from the trainer over the sampled tokens, KL(B || A) =
  E_B[log p_B - log p_A] = E_B[-log r], by Schulman's estimators
  (http://joschu.net/blog/kl-approx.html, with his p = A, q = B):
  k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r; each reported as its
  mean over the tokens. chi2 = E_B[(r - 1)^2], the chi-square divergence of A
  from B. ln(PPL_A / PPL_B) = mean(-logp_A) - mean(-logp_B) = -mean(Delta):
  over the same tokens it is k1, by definition.
- A token whose log-prob is NaN or +-inf on either side is counted and named,
  and left out of every statistic (never averaged); a sequence holding one
  has no product ratio and is left out of the sequence statistics.
- Sums over tokens are metrics.exact_sum (correctly rounded); percentiles are
  nearest-rank (distribution.nearest_rank); standard deviations are the
  population's (divided by n).

The renormalisation a rollout engine applies when it reports the log-probs of
its top-p / top-k sampling distribution: p_B(x) = p(x) / S over the kept
support, S <= 1 the kept mass, so Delta = log p(x) - (log p(x) - log S) =
log S <= 0 at every kept token of a position (r = S <= 1): the same offset for
every token listed at that position, and one-sided. (A renormalised A gives
Delta = -log S >= 0.) Noise is neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from precisionlab.numerics.distribution import nearest_rank, phi
from precisionlab.numerics.metrics import (exact_mean, exact_mean_abs_difference, exact_mean_difference,
                                          exact_mean_square_difference, exact_sum, exp_or_inf, q_to_float,
                                          sqrt_to_float)

DEFAULT_CLIPS = (1.1, 1.25, 2.0)
DEFAULT_CAP = 2.0
PERCENTILES = (50.0, 99.0)
NAMED = 5  # locations named for each kind of non-finite value

# A one-sided offset: |mean Delta| above this many times the noise scale seen
# on the other side of zero, with at least this share of tokens on its side.
# Symmetric noise of any size has |mean| ~ sigma / sqrt(n) against a scale of
# sigma, so it never comes near 3.
ONE_SIDED_FACTOR = 3.0
ONE_SIDED_SHARE = 2 / 3
# Constant within a position: z = sqrt(mean_i(k_i o_i^2)) / w above this, o_i
# a position's mean Delta over its k_i shared listed tokens and w the pooled
# RMS about those means. For independent noise of sigma on the listed tokens,
# o_i sqrt(k_i) / sigma is standard normal and w ~ sigma, so z ~ 1; the fp32
# against bf16 rollout of docs/compare-logprobs.md gives 1.8 (a position's
# log-sum-exp error is common to its tokens), its top-p rollout 7.7.
CONSTANT_Z = 3.0
# Flat within a position: the pooled within-position slope of Delta on A's
# log-prob at most this (or within 3 standard errors of 0). A renormalisation
# shifts every token of a position alike (slope 0); a temperature makes
# logp_B = logp_A / tau + c, a slope of 1 - 1/tau (-0.43 for tau = 0.7). Both
# docs/compare-logprobs.md streams give slopes below 0.002.
SLOPE_MAX = 0.01
# A log-prob within this of 0 is a probability of 1 (a support of one token).
CERTAIN = 1e-6
# A shift by one position: the lag-1 cross-correlation of the log-probs at
# least this high and above the aligned one.
SHIFT_MIN_CORR = 0.5


@dataclass
class Top:
    """The top-k listed alternatives at each token: keys (token ids, or codes
    shared by both streams for token strings; -1 an empty slot) and their
    log-probs (NaN in an empty slot), each (tokens, k)."""

    keys: np.ndarray
    logprobs: np.ndarray


@dataclass
class Comparison:
    row: dict                  # the token- and sequence-level summary
    nonfinite: dict            # {"a": ..., "b": ...}: counts and the first locations
    diagnoses: list[dict]
    diff: np.ndarray           # Delta per token, NaN where left out
    sequence: np.ndarray       # each token's sequence
    position: np.ndarray       # each token's position in it
    seq_log_ratio: np.ndarray  # sum of Delta per sequence, NaN where left out
    seq_lengths: np.ndarray
    kept_mass: np.ndarray | None = None  # S per token where a renormalisation was found
    worst_positions: list[int] = field(default_factory=list)   # token indices, largest |Delta| first
    worst_sequences: list[int] = field(default_factory=list)   # sequence indices, largest |sum Delta| first


def locate(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sequence, position in it) of every token, for offsets [0, ..., n]."""
    lengths = np.diff(offsets)
    seq = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    pos = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][seq]
    return seq, pos




def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's correlation, centred on exact means; NaN when either side is constant."""
    if x.size < 2:
        return math.nan
    dx, dy = x - exact_mean(x), y - exact_mean(y)
    den = math.sqrt(exact_sum(dx * dx)) * math.sqrt(exact_sum(dy * dy))
    return exact_sum(dx * dy) / den if den > 0 else math.nan


def ess(log_w: np.ndarray) -> float:
    """Kish's effective sample size (sum w)^2 / sum w^2 of weights w = exp(log_w),
    from w / max w (in (0, 1]: nothing overflows; identical weights give n exactly)."""
    if log_w.size == 0:
        return math.nan
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.exp(log_w - np.max(log_w))
    s, s2 = exact_sum(w), exact_sum(w * w)
    return s * s / s2 if s2 > 0 else math.nan


def nonfinite_summary(x: np.ndarray, seq: np.ndarray, pos: np.ndarray) -> dict:
    """Counts of NaN, -inf and +inf log-probs, and where the first ones are."""
    above = (x > 0) & np.isfinite(x)
    out = {"nan": int(np.isnan(x).sum()), "neg_inf": int(np.isneginf(x).sum()), "pos_inf": int(np.isposinf(x).sum()),
           "positive": int(above.sum()), "max_positive": float(np.max(x[above])) if above.any() else None,
           "first": []}
    for i in np.flatnonzero(~np.isfinite(x))[:NAMED]:
        out["first"].append({"sequence": int(seq[i]), "position": int(pos[i]), "value": float(x[i])})
    return out


def token_stats(a: np.ndarray, b: np.ndarray, clips=DEFAULT_CLIPS) -> dict:
    """The token-level statistics of finite log-prob pairs a (trainer), b (rollout)."""
    n = a.size
    d = a - b
    ad = np.abs(d)
    srt = np.sort(ad)
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.exp(d)
        em1 = np.expm1(d)
    mean_r = exact_mean(r)
    pct = {f"p{q:g}_abs_diff": (float(srt[nearest_rank(q, n) - 1]) if n else math.nan) for q in PERCENTILES}
    # the means of Delta, |Delta| and Delta^2 are of the exact differences a - b,
    # summed exactly: Delta^2 (or a sum of Delta) past the double range is no inf
    ms = exact_mean_square_difference(a, b) if n else None
    row = {
        "n": n,
        "mean_diff": exact_mean_difference(a, b),
        "mean_abs_diff": exact_mean_abs_difference(a, b),
        "rms_diff": sqrt_to_float(ms) if n else math.nan,
        **pct,
        "max_abs_diff": float(srt[-1]) if n else math.nan,
        "prob_pearson": _pearson(np.exp(a), np.exp(b)),
        "mean_ratio": mean_r,
        "std_ratio": ratio_spread(em1),
        # exp is monotonic: the extreme ratios are exp of the extreme Deltas, by the
        # one exp the worst positions' ratios use (np.exp may differ by an ulp)
        "min_ratio": exp_or_inf(float(np.min(d))) if n else math.nan,
        "max_ratio": exp_or_inf(float(np.max(d))) if n else math.nan,
        "outside_clip": [],
        "ess": ess(d),
    }
    for c in clips:
        k = int(((r < 1.0 / c) | (r > c)).sum())
        row["outside_clip"].append({"clip": c, "n_outside": k, "frac_outside": k / n if n else math.nan})
    row["ess_frac"] = row["ess"] / n if n else math.nan
    row["kl_k1"] = -row["mean_diff"] if n else math.nan
    row["kl_k2"] = q_to_float(ms / 2) if n else math.nan
    row["kl_k3"] = exact_mean(phi(d))  # expm1(d) - d, accurate where d is small
    with np.errstate(over="ignore", invalid="ignore"):
        row["chi2"] = exact_mean(em1 * em1)
    row["ln_ppl_ratio"] = row["kl_k1"]
    row["ppl_a"] = exp_or_inf(-exact_mean(a))
    row["ppl_b"] = exp_or_inf(-exact_mean(b))
    return row


def ratio_spread(em1: np.ndarray) -> float:
    """The population standard deviation of the ratios r = 1 + em1, from em1 = expm1(Delta): r - mean(r)
    near r = 1 kept only the digits past 1 (about 10 of them at r = 1 +- 1e-7), em1 keeps them all.
    +inf where a ratio is past float64 (r - mean(r) was inf - inf, NaN), and the deviations scaled by
    the largest before squaring (a square past float64 is no inf here)."""
    if em1.size == 0:
        return math.nan
    if np.isposinf(em1).any():
        return math.inf
    mean = exact_mean(em1)  # exact_sum: correctly rounded, no overflow inside the sum
    with np.errstate(over="ignore", invalid="ignore"):
        dev = em1 - mean
    if not np.isfinite(dev).all():
        return math.inf
    top = float(np.max(np.abs(dev)))
    if top == 0.0:
        return 0.0
    return top * math.sqrt(exact_mean((dev / top) ** 2))


def sequence_stats(log_ratio: np.ndarray, cap: float = DEFAULT_CAP) -> dict:
    """The sequence-level statistics of the product ratios exp(log_ratio) of the
    sequences that have one: their spread, the share a truncated-IS cap clips
    (R > cap), the share below 1/cap, and their effective sample size."""
    m = log_ratio.size
    with np.errstate(over="ignore"):
        big = np.exp(log_ratio)
    mean = exact_mean(log_ratio)
    out = {
        "seq_n": m,
        "mean_seq_log_ratio": mean,
        "std_seq_log_ratio": sqrt_to_float(exact_mean_square_difference(log_ratio, np.full(m, mean)))
        if m and math.isfinite(mean) else math.nan,
        "min_seq_log_ratio": float(np.min(log_ratio)) if m else math.nan,
        "max_seq_log_ratio": float(np.max(log_ratio)) if m else math.nan,
        "cap": cap,
        "seq_frac_above_cap": int((big > cap).sum()) / m if m else math.nan,
        "seq_frac_below_inv_cap": int((big < 1.0 / cap).sum()) / m if m else math.nan,
        "seq_ess": ess(log_ratio),
    }
    out["seq_ess_frac"] = out["seq_ess"] / m if m else math.nan
    return out


def one_sided(d: np.ndarray) -> dict:
    """Whether d sits on one side of zero beyond the noise: the mean, the noise
    scale estimated from the values on the other side (sqrt(2 mean(d^2 there)),
    which is sigma for symmetric noise), and the share on the mean's side."""
    n = d.size
    mean = exact_mean(d)
    if not n or mean == 0 or not math.isfinite(mean):
        return {"mean": mean, "other_side_scale": math.nan, "share": math.nan, "one_sided": False}
    sign = math.copysign(1.0, mean)
    other = d[np.sign(d) == -sign]
    scale = math.sqrt(2 * exact_sum(other * other) / n)
    share = int((np.sign(d) == sign).sum()) / n
    return {"mean": mean, "other_side_scale": scale, "share": share,
            "one_sided": abs(mean) > ONE_SIDED_FACTOR * scale and share >= ONE_SIDED_SHARE}


def top_offsets(top_a: Top, top_b: Top) -> dict:
    """Per position, the tokens both streams list with finite log-probs: their
    mean Delta (the position's offset), how many, the pooled within-position
    RMS about the offsets, and the positions where one side lists -inf for a
    token the other gives a finite log-prob (a truncated support)."""
    n, kb = top_b.keys.shape
    lpa = np.full((n, kb), np.nan)  # A's log-prob of each token B lists
    for j in range(kb):
        key = top_b.keys[:, j:j + 1]
        eq = (top_a.keys == key) & (key >= 0)
        found = eq.any(axis=1)
        lpa[:, j] = np.where(found, top_a.logprobs[np.arange(n), np.argmax(eq, axis=1)], np.nan)
    lpb = top_b.logprobs
    shared = np.isfinite(lpa) & np.isfinite(lpb)
    k = shared.sum(axis=1)
    with np.errstate(invalid="ignore"):
        d = np.where(shared, lpa - lpb, 0.0)
        offset = np.where(k > 0, d.sum(axis=1) / np.maximum(k, 1), np.nan)  # a few terms: numpy's sum is enough
        resid = np.where(shared, d - offset[:, None], 0.0)
    multi = k >= 2
    dof = int((k[multi] - 1).sum())
    within = math.sqrt(exact_sum((resid[multi] ** 2).ravel()) / dof) if dof else math.nan
    offsets = offset[multi]
    kz = k[multi]
    # the pooled within-position least-squares slope of Delta on logp_A, and its standard error
    with np.errstate(invalid="ignore"):
        x = np.where(shared, lpa, 0.0)
        dx = np.where(shared, x - (x.sum(axis=1) / np.maximum(k, 1))[:, None], 0.0)[multi].ravel()
    rr = resid[multi].ravel()
    sxx = exact_sum(dx * dx)
    slope = exact_sum(dx * rr) / sxx if sxx > 0 else math.nan
    dof2 = int((kz - 2).sum())
    slope_se = (math.sqrt(exact_sum((rr - slope * dx) ** 2) / dof2 / sxx) if sxx > 0 and dof2 > 0 else math.nan)
    return {"offset": offset, "shared": k, "positions": int(multi.sum()), "within_rms": within,
            "slope": slope, "slope_se": slope_se,
            "offset_rms": math.sqrt(exact_mean(offsets * offsets)) if offsets.size else math.nan,
            "offset_z": (math.sqrt(exact_mean(kz * offsets * offsets)) / within if within > 0 else
                         (math.inf if offsets.size and np.any(offsets != 0) else math.nan)),
            "b_truncated": int((np.isfinite(lpa) & np.isneginf(lpb)).any(axis=1).sum()),
            "a_truncated": int((np.isneginf(lpa) & np.isfinite(lpb)).any(axis=1).sum())}


def renormalisation(d: np.ndarray, a: np.ndarray, b: np.ndarray, tops: dict | None) -> dict | None:
    """A renormalised stream (see the module's docstring; kind "renormalised"),
    a temperature (the listed tokens' Delta grows with their log-prob inside a
    position: kind "temperature", tau = T_B / T_A from the slope 1 - 1/tau), a
    one-sided offset the listed tokens show is neither (kind "offset"), or None. d, a, b: the
    finite tokens; tops: top_offsets() on those tokens, where both files list
    alternatives. With them the offset must also be the same for every listed
    token of a position; without, a one-sided Delta is reported as consistent
    with a renormalisation (a temperature or a bias is one-sided too)."""
    side = one_sided(d)
    evidence = "chosen tokens"
    per_position = d
    if tops is not None and tops["positions"] >= 1:
        o = tops["offset"][tops["shared"] >= 2]
        w = tops["within_rms"]
        constant = tops["offset_z"] > CONSTANT_Z  # NaN (no offsets, no spread) is not
        slope, se = tops["slope"], tops["slope_se"]
        flat = not abs(slope) > max(SLOPE_MAX, 3 * se if se == se else 0.0)  # NaN: too few tokens to tell
        if not flat:  # Delta grows with the log-prob inside a position: logp_B = logp_A / tau + c
            return {"kind": "temperature", "slope": slope, "slope_se": se,
                    "temperature_ratio": 1 / (1 - slope) if slope < 1 else None,
                    "positions_with_top": tops["positions"], "offset_mean": side["mean"]}
        if not (constant and one_sided(o)["one_sided"]):
            if side["one_sided"]:  # one-sided, but not one offset per position: a bias
                return {"kind": "offset", "offset_mean": side["mean"], "share_on_side": side["share"],
                        "other_side_scale": side["other_side_scale"], "positions_with_top": tops["positions"],
                        "within_position_rms": w, "offset_rms": tops["offset_rms"], "offset_z": tops["offset_z"],
                        "slope": slope}
            return None
        evidence = "top_logprobs"
        # the position's offset where it lists tokens both sides share, else the chosen token's Delta
        per_position = np.where(tops["shared"] >= 1, tops["offset"], d)
        side = one_sided(per_position)
        if not side["one_sided"]:
            return None
    elif not side["one_sided"]:
        return None
    renorm = "b" if side["mean"] < 0 else "a"
    log_s = per_position if renorm == "b" else -per_position  # log S <= 0
    kept = np.exp(np.minimum(log_s, 0.0))
    ren, other = (b, a) if renorm == "b" else (a, b)
    out = {"kind": "renormalised", "side": renorm, "evidence": evidence,
           "offset_mean": exact_mean(per_position), "kept_mass": exp_or_inf(exact_mean(log_s)),
           "kept_mass_mean": exact_mean(kept), "kept_mass_min": float(np.min(kept)),
           "share_on_side": side["share"], "other_side_scale": side["other_side_scale"],
           # a support of one token: the renormalised side says probability 1
           "one_token_support": int(((np.abs(ren) <= CERTAIN) & (other < -CERTAIN)).sum()),
           "residual_rms_diff": math.sqrt(exact_mean((d - per_position) ** 2)) if evidence == "top_logprobs" else None,
           "_log_s": log_s}
    if tops is not None:
        out.update({"positions_with_top": tops["positions"], "within_position_rms": tops["within_rms"],
                    "offset_rms": tops["offset_rms"], "offset_z": tops["offset_z"], "slope": tops["slope"],
                    "truncated_support": tops[f"{renorm}_truncated"]})
    return out


def lag_correlations(a: np.ndarray, b: np.ndarray, seq: np.ndarray, ok: np.ndarray) -> dict:
    """Pearson correlations of the log-probs, within sequences: aligned
    (a[t], b[t]), b one ahead (a[t+1], b[t]) and b one behind (a[t], b[t+1])."""
    same = (seq[1:] == seq[:-1]) & ok[1:] & ok[:-1]
    return {"aligned": _pearson(a[ok], b[ok]),
            "b_ahead": _pearson(a[1:][same], b[:-1][same]),
            "b_behind": _pearson(a[:-1][same], b[1:][same])}


def shift(a: np.ndarray, b: np.ndarray, seq: np.ndarray, ok: np.ndarray) -> dict | None:
    c = lag_correlations(a, b, seq, ok)
    lag, best = max((("b_ahead", c["b_ahead"]), ("b_behind", c["b_behind"])),
                    key=lambda t: -math.inf if math.isnan(t[1]) else t[1])
    aligned = c["aligned"] if not math.isnan(c["aligned"]) else -math.inf
    if math.isnan(best) or best < SHIFT_MIN_CORR or best <= aligned:
        return None
    return {"kind": "shifted", "lag": 1 if lag == "b_ahead" else -1, "corr_aligned": c["aligned"],
            "corr_lag": best}


def compare(a: np.ndarray, b: np.ndarray, offsets: np.ndarray, clips=DEFAULT_CLIPS, cap: float = DEFAULT_CAP,
            top_a: Top | None = None, top_b: Top | None = None, worst: int = 10) -> Comparison:
    """Everything `compare logprobs` reports, from two aligned streams: a, b the
    log-probs (float64, n tokens), offsets (S + 1) the sequences' boundaries."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    seq, pos = locate(offsets)
    ok = np.isfinite(a) & np.isfinite(b)
    diff = np.where(ok, a - np.where(ok, b, 0.0), np.nan)
    fa, fb, d = a[ok], b[ok], diff[ok]
    row = token_stats(fa, fb, clips)
    row["excluded"] = int((~ok).sum())
    lengths = np.diff(offsets)
    bad_seq = np.zeros(lengths.size, dtype=bool)
    np.logical_or.at(bad_seq, seq[~ok], True)
    has = (lengths > 0) & ~bad_seq
    seq_lr = np.full(lengths.size, np.nan)
    for s in np.flatnonzero(has):
        seq_lr[s] = exact_sum(diff[offsets[s]:offsets[s + 1]])
    row.update(sequence_stats(seq_lr[has], cap))
    row["sequences"] = int(lengths.size)
    row["seq_excluded"] = int(bad_seq.sum())
    nonfinite = {"a": nonfinite_summary(a, seq, pos), "b": nonfinite_summary(b, seq, pos)}

    diagnoses: list[dict] = []
    kept = None
    if d.size and np.all(d == 0):
        diagnoses.append({"kind": "identical"})
    else:
        tops = None
        if top_a is not None and top_b is not None:
            tops = top_offsets(Top(top_a.keys[ok], top_a.logprobs[ok]), Top(top_b.keys[ok], top_b.logprobs[ok]))
        ren = renormalisation(d, fa, fb, tops)
        if ren is not None and ren["kind"] == "renormalised":
            kept = np.full(a.size, np.nan)
            kept[ok] = np.exp(np.minimum(ren.pop("_log_s"), 0.0))
        if ren is not None:
            diagnoses.append(ren)
        sh = shift(a, b, seq, ok)
        if sh is not None:
            diagnoses.append(sh)
    for side in ("a", "b"):
        nf = nonfinite[side]
        if nf["nan"] + nf["neg_inf"] + nf["pos_inf"]:
            diagnoses.append({"kind": "nonfinite", "side": side, "nan": nf["nan"], "neg_inf": nf["neg_inf"],
                              "pos_inf": nf["pos_inf"], "first": nf["first"]})
    idx = np.flatnonzero(ok)
    order = idx[np.argsort(-np.abs(d), kind="stable")][:worst]
    sidx = np.flatnonzero(has)
    sorder = sidx[np.argsort(-np.abs(seq_lr[has]), kind="stable")][:worst]
    return Comparison(row, nonfinite, diagnoses, diff, seq, pos, seq_lr, lengths, kept,
                      [int(i) for i in order], [int(s) for s in sorder])
