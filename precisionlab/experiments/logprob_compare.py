"""Two log-prob streams compared in memory (a the trainer's, b the rollout's):
the statistics, the worst places and the takeaways. compare logprobs feeds it
from two files, compare rollout from two engines; it lives here, below both,
so that each command stands alone."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from precisionlab.errors import UsageError
from precisionlab.io import inputs, logprob_streams
from precisionlab.io.logprob_streams import Stream
from precisionlab.numerics import logprobs as lpstats
from precisionlab.numerics.metrics import exact_mean, exp_or_inf

# Bytes per token the statistics hold at once (about twenty float64 arrays),
# and per listed alternative (both lists, their matches and differences).
STAT_BYTES_PER_TOKEN = 20 * 8
STAT_BYTES_PER_TOP = 8 * 8


@dataclass
class LogprobsResult:
    command: str
    params: dict
    inputs: dict                 # per side: path, format, dtype, sequences, n, top_k
    rows: list[dict]             # one summary row: token- and sequence-level statistics
    nonfinite: dict
    diagnoses: list[dict]
    worst_sequences: list[dict]
    worst_positions: list[dict]
    takeaways: list[str]
    timing: dict
    failures: list[str] = field(default_factory=list)       # the --fail-on diagnoses made
    diff: np.ndarray = field(repr=False, default=None)      # Delta per token (NaN where left out), for --plot
    position: np.ndarray = field(repr=False, default=None)  # each token's position in its sequence


# Every diagnosis compare logprobs can make, as --fail-on names it (and its --help lists it).
DIAGNOSES = {
    "temperature": "Δ grows with the log-prob inside a position: the sides sample at different temperatures",
    "renormalised": "one side renormalised over a truncated support (top-p / top-k): its log-probs sit higher",
    "offset": "a one-sided bias that is not one offset per position",
    "shifted": "the streams are one position apart",
    "nonfinite": "NaN or -inf/+inf log-probs on a side",
}


def parse_fail_on(text: str | None) -> tuple[str, ...]:
    """--fail-on: a comma list of DIAGNOSES' names, or "any" for all of them."""
    if text is None:
        return ()
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["any"]:
        return tuple(DIAGNOSES)
    bad = [n for n in names if n not in DIAGNOSES]
    if bad or not names:
        raise UsageError(f"--fail-on {text!r}: a comma list of {', '.join(DIAGNOSES)}, or any")
    return tuple(dict.fromkeys(names))


def gate_failures(diagnoses: list[dict], fail_on: tuple[str, ...]) -> list[str]:
    """The diagnoses --fail-on names, each a failure line (exit 1)."""
    return [f"diagnosis {d['kind']}{' (side ' + d['side'] + ')' if d.get('side') else ''}: {DIAGNOSES[d['kind']]}"
            for d in diagnoses if d["kind"] in fail_on]


def compare_streams(a: Stream, b: Stream, clips=lpstats.DEFAULT_CLIPS, cap: float = lpstats.DEFAULT_CAP,
                    worst: int = 10, decode: Callable[[int], str] | None = None,
                    params: dict | None = None, fail_on: tuple[str, ...] = ()) -> LogprobsResult:
    """The whole comparison of two streams in memory: a the trainer's, b the rollout's."""
    t0 = time.perf_counter()
    by = logprob_streams.check_pair(a, b)
    a, b, shift = logprob_streams.drop_unscored(a, b)  # an echo's null first log-prob: no value to compare
    unscored = int(shift.sum())
    keys = logprob_streams.top_keys(a, b)
    inputs.check_memory(a.n * STAT_BYTES_PER_TOKEN + (0 if keys is None else a.n * (a.top_k + b.top_k)
                                                       * STAT_BYTES_PER_TOP), "compare logprobs")
    top_a = top_b = None
    if keys is not None:
        top_a = lpstats.Top(keys[0], a.top_logprobs)
        top_b = lpstats.Top(keys[1], b.top_logprobs)
    c = lpstats.compare(a.logprobs, b.logprobs, a.offsets, clips, cap, top_a, top_b, worst)
    ids = a.token_ids if a.token_ids is not None else b.token_ids
    strings = a.tokens if a.tokens is not None else b.tokens

    def token(i: int) -> str | None:
        if decode is not None and ids is not None:
            return decode(int(ids[i]))
        return strings[i] if strings is not None else None

    positions = []
    for i in c.worst_positions:
        positions.append({"sequence": int(c.sequence[i]), "position": int(c.position[i] + shift[c.sequence[i]]),
                          "token_id": None if ids is None else int(ids[i]), "token": token(i),
                          "logprob_a": float(a.logprobs[i]), "logprob_b": float(b.logprobs[i]),
                          "diff": float(c.diff[i]), "ratio": exp_or_inf(float(c.diff[i]))})
    sequences = []
    for s in c.worst_sequences:
        lo, hi = int(a.offsets[s]), int(a.offsets[s + 1])
        ad = np.abs(c.diff[lo:hi])
        w = int(np.argmax(ad))
        sequences.append({"sequence": s, "n": hi - lo, "log_ratio": float(c.seq_log_ratio[s]),
                          "ratio": exp_or_inf(float(c.seq_log_ratio[s])),
                          "mean_abs_diff": exact_mean(ad), "max_abs_diff": float(ad[w]),
                          "worst_position": w + int(shift[s])})
    row = {"label": "A - B", **c.row}
    params = {**(params or {}), "clips": list(clips), "cap": cap, "worst": worst, "compared_by": by,
              "unscored_first_tokens": unscored}
    info = {side: {"path": st.name, "format": st.kind, "dtype": st.dtype, "sequences": st.sequences, "n": st.n,
                   "top_k": st.top_k} for side, st in (("a", a), ("b", b))}
    return LogprobsResult("compare logprobs", params, info, [row], c.nonfinite, c.diagnoses, sequences, positions,
                          _unscored_line(unscored) + takeaways(row, c.diagnoses, c.nonfinite, cap),
                          {"run_s": time.perf_counter() - t0}, gate_failures(c.diagnoses, fail_on),
                          c.diff, c.position + shift[c.sequence] if unscored else c.position)


def _unscored_line(n: int) -> list[str]:
    if not n:
        return []
    return [f"{n} sequence(s) begin with a null log-prob (an echo's first token, predicted from nothing): that "
            "position is left out of both streams; the rest of each sequence is compared."]


def _where(first: list[dict]) -> str:
    return ", ".join(f"sequence {f['sequence']} position {f['position']} ({f['value']})" for f in first)


def takeaways(row: dict, diagnoses: list[dict], nonfinite: dict, cap: float) -> list[str]:
    lines = []
    kinds = {d["kind"]: d for d in diagnoses}
    for d in diagnoses:
        if d["kind"] != "nonfinite":
            continue
        side = d["side"].upper()
        parts = [f"{d[k]} {name}" for k, name in (("nan", "NaN"), ("neg_inf", "-inf"), ("pos_inf", "+inf")) if d[k]]
        lines.append(f"{side} has {', '.join(parts)} log-probs (first at {_where(d['first'])}): left out of every "
                     f"statistic, and their {row['seq_excluded']} sequence(s) out of the sequence statistics.")
    for side in ("a", "b"):
        if nonfinite[side]["positive"]:
            nf = nonfinite[side]
            why = ("a near-certain token's rounding" if nf["max_positive"] <= 1e-4
                   else "more than rounding: a log-softmax that does not normalise")
            lines.append(f"{side.upper()} has {nf['positive']} log-probs above 0, at most {nf['max_positive']:.2g} "
                         f"(a probability above 1): {why}.")
    if "identical" in kinds:
        lines.append(f"A and B agree at every one of the {row['n']} tokens: Δ = 0, every ratio r = 1, KL = 0.")
        return lines
    if not row["n"]:
        lines.append("No token has a finite log-prob on both sides: nothing to compare.")
        return lines
    ren = kinds.get("renormalised")
    if ren:
        who, other = ren["side"].upper(), ("A" if ren["side"] == "b" else "B")
        sign = "≤ 0" if ren["side"] == "b" else "≥ 0"
        how = (f"at each of the {ren['positions_with_top']} positions whose top_logprobs share tokens, the offset is "
               f"the same for every listed token (offsets of RMS {ren['offset_rms']:.2g}, {ren['offset_z']:.3g} "
               f"times what the within-position spread of {ren['within_position_rms']:.2g} gives noise)" if ren["evidence"] == "top_logprobs" else
               "from the chosen tokens alone, which a temperature or a bias could also explain: top_logprobs on "
               "both sides would tell (a renormalisation shifts every token of a position by the same log S)")
        lines.append(f"{who} is renormalised over a top-p/top-k support: Δ = logp_A - logp_B = "
                     f"{'' if ren['side'] == 'b' else '-'}log S {sign} at {100 * ren['share_on_side']:.1f} % of "
                     f"tokens, mean offset {ren['offset_mean']:.4g} nats (kept mass S: geometric mean "
                     f"{ren['kept_mass']:.4g}, min {ren['kept_mass_min']:.3g}); {how}. This is the sampler's "
                     f"renormalisation, not precision noise: score {who}'s raw log-probs, or divide its "
                     f"probabilities by S.")
        if ren.get("residual_rms_diff") is not None:
            lines.append(f"With each position's offset removed, Δ has RMS {ren['residual_rms_diff']:.3g} nats: the "
                         f"difference between {who}'s and {other}'s arithmetic.")
        if ren["one_token_support"]:
            lines.append(f"{ren['one_token_support']} tokens had a support of one token: {who} gives them "
                         f"probability 1 (log-prob 0), {other} less.")
    off = kinds.get("offset")
    if off:
        lines.append(f"Δ is one-sided (mean {off['offset_mean']:.4g} nats, {100 * off['share_on_side']:.1f} % of "
                     f"tokens on that side), but the listed tokens of a position do not share one offset: not a "
                     f"renormalisation; a systematic bias.")
    temp = kinds.get("temperature")
    if temp:
        tau = temp["temperature_ratio"]
        lines.append(f"Inside a position, Δ grows with logp_A at a slope of {temp['slope']:.3g} (± {temp['slope_se']:.1g}) "
                     f"over the listed tokens: logp_B = logp_A / τ + c" + (f" with τ = T_B / T_A = {tau:.4g}" if tau
                                                                             else "") +
                     ": the two sides sample at different temperatures (or scale their logits differently).")
    sh = kinds.get("shifted")
    if sh:
        pair = "logp_A[t+1], logp_B[t]" if sh["lag"] == 1 else "logp_A[t], logp_B[t+1]"
        what = ("B's log-prob at t belongs to the token at t+1" if sh["lag"] == 1
                else "B's log-prob at t+1 belongs to the token at t")
        lines.append(f"B is shifted by one position: corr({pair}) = {sh['corr_lag']:.3f} against "
                     f"{sh['corr_aligned']:.3f} aligned; {what} (an off-by-one where log-probs are gathered).")
    c1 = row["outside_clip"][0] if row["outside_clip"] else None
    band = f", {100 * c1['frac_outside']:.2f} % of ratios outside [1/{c1['clip']:g}, {c1['clip']:g}]" if c1 else ""
    lines.append(f"Over {row['n']} tokens: RMS Δ {row['rms_diff']:.3g} nats{band}, ESS {100 * row['ess_frac']:.1f} % "
                 f"of n, KL(B||A) k3 {row['kl_k3']:.3g}.")
    if row["seq_n"]:
        lines.append(f"Over {row['seq_n']} sequences: log of the product ratio spreads {row['std_seq_log_ratio']:.3g} "
                     f"(from {row['min_seq_log_ratio']:.3g} to {row['max_seq_log_ratio']:.3g}); "
                     f"{100 * row['seq_frac_above_cap']:.1f} % would be clipped by a truncated-IS cap of {cap:g}.")
    return lines
