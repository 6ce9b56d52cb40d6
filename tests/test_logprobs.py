"""compare logprobs: every statistic against an independent float64 reference
written here from its published formula (math.fsum, statistics, mpmath;
never the code under test), on random streams with known perturbations, the
diagnoses (renormalised rollout, one-position shift, non-finite values), the
readers of every format, and the bad files (one line, exit 2)."""

import json
import math
import statistics
import zipfile
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from helpers import ROOT, cli, json_glossary_problems, one_line, strict_json, temperature_streams

from precisionlab.errors import UsageError
from precisionlab.experiments import logprobs as exp
from precisionlab.io import logprob_streams as ls
from precisionlab.numerics import logprobs as L

DATA = ROOT / "docs" / "data" / "logprobs"
# Tolerance chosen before looking: both sides compute in float64 with correctly
# rounded sums; elementwise exp/expm1 differ by an ulp or so, and a ratio of
# sums keeps that: 1e-12 relative leaves a thousand ulps of room and no more.
RTOL = 1e-12


# ---------------------------------------------------------------------------
# the independent reference


def nearest_rank(sorted_values, q):
    n = len(sorted_values)
    k = max(1, math.ceil(Fraction(q) * n / 100))  # the smallest k with k/n >= q/100
    return sorted_values[k - 1]


def reference(a, b, offsets, clips=(1.1, 1.25, 2.0), cap=2.0):
    a, b = [float(x) for x in a], [float(x) for x in b]
    ok = [math.isfinite(x) and math.isfinite(y) for x, y in zip(a, b, strict=True)]
    d = [x - y for x, y, o in zip(a, b, ok, strict=True) if o]
    fa = [x for x, o in zip(a, ok, strict=True) if o]
    fb = [y for y, o in zip(b, ok, strict=True) if o]
    n = len(d)
    r = [math.exp(x) for x in d]
    ad = sorted(abs(x) for x in d)
    out = {
        "n": n,
        "mean_diff": math.fsum(d) / n,
        "mean_abs_diff": math.fsum(ad) / n,
        "rms_diff": math.sqrt(math.fsum(x * x for x in d) / n),
        "p50_abs_diff": nearest_rank(ad, 50),
        "p99_abs_diff": nearest_rank(ad, 99),
        "max_abs_diff": ad[-1],
        "prob_pearson": statistics.correlation([math.exp(x) for x in fa], [math.exp(y) for y in fb]),
        "mean_ratio": math.fsum(r) / n,
        "std_ratio": statistics.pstdev(r),
        "min_ratio": min(r), "max_ratio": max(r),
        "ess": math.fsum(r) ** 2 / math.fsum(x * x for x in r),
        # Schulman's estimators of KL(rollout || trainer) for x ~ rollout, log r = logp_trainer - logp_rollout
        "kl_k1": math.fsum(-x for x in d) / n,
        "kl_k2": math.fsum(x * x / 2 for x in d) / n,
        "kl_k3": math.fsum(float(mpmath.expm1(mpmath.mpf(x)) - x) for x in d) / n,
        "chi2": math.fsum(float(mpmath.expm1(mpmath.mpf(x))) ** 2 for x in d) / n,
        "ln_ppl_ratio": math.log(math.exp(-math.fsum(fa) / n) / math.exp(-math.fsum(fb) / n)),
    }
    out["ess_frac"] = out["ess"] / n
    out["outside"] = [sum(1 for x in r if x < 1 / c or x > c) for c in clips]
    logs = []
    for s in range(len(offsets) - 1):
        lo, hi = offsets[s], offsets[s + 1]
        if hi > lo and all(ok[lo:hi]):
            logs.append(math.fsum(a[i] - b[i] for i in range(lo, hi)))
    R = [math.exp(x) for x in logs]
    out.update({"seq_n": len(logs), "mean_seq_log_ratio": math.fsum(logs) / len(logs),
                "std_seq_log_ratio": statistics.pstdev(logs), "min_seq_log_ratio": min(logs),
                "max_seq_log_ratio": max(logs), "seq_frac_above_cap": sum(x > cap for x in R) / len(R),
                "seq_frac_below_inv_cap": sum(x < 1 / cap for x in R) / len(R),
                "seq_ess": math.fsum(R) ** 2 / math.fsum(x * x for x in R)})
    return out


def random_streams(seed, sequences=40, mean_len=60, sigma=0.05):
    """Trainer log-probs of sampled tokens (-Exponential(1): a spread like real text's)
    and a rollout that differs by N(0, sigma^2) noise; sequences of random lengths."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * mean_len, sequences)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    a = -rng.exponential(1.0, offsets[-1])
    b = a + rng.normal(0.0, sigma, a.size)
    return a, b, offsets


def close(x, y, rtol=RTOL, atol=0.0):
    return math.isclose(x, y, rel_tol=rtol, abs_tol=atol)


# ---------------------------------------------------------------------------
# the statistics


@pytest.mark.parametrize("seed,sigma", [(0, 0.05), (1, 0.3), (2, 1e-4)])
def test_every_statistic_matches_the_reference(seed, sigma):
    a, b, offsets = random_streams(seed, sigma=sigma)
    got = L.compare(a, b, offsets).row
    want = reference(a, b, offsets.tolist())
    for k, v in want.items():
        if k == "outside":
            assert [c["n_outside"] for c in got["outside_clip"]] == v
            continue
        # a correlation near 1 loses digits to the centring in either implementation: 1e-10 there
        tol = 1e-10 if k == "prob_pearson" else RTOL
        # the reference's ln(PPL_A / PPL_B) subtracts two log-perplexities of about 1: its own rounding
        # is a few ulps of 1, whatever the (small) difference
        atol = 1e-15 if k == "ln_ppl_ratio" else 1e-300
        assert close(got[k], v, tol, atol=atol), (k, got[k], v)
    assert got["ln_ppl_ratio"] == got["kl_k1"]  # the same quantity over the same tokens


def test_identical_streams_give_zero_exactly():
    a, _, offsets = random_streams(3)
    c = L.compare(a, a.copy(), offsets)
    r = c.row
    assert r["max_abs_diff"] == 0 and r["mean_diff"] == 0 and r["rms_diff"] == 0
    assert r["min_ratio"] == r["max_ratio"] == r["mean_ratio"] == 1.0 and r["std_ratio"] == 0
    assert r["kl_k1"] == 0 and r["kl_k2"] == 0 and r["kl_k3"] == 0 and r["chi2"] == 0
    assert r["ess"] == r["n"] and r["seq_ess"] == r["seq_n"]
    assert all(x["n_outside"] == 0 for x in r["outside_clip"])
    assert r["max_seq_log_ratio"] == 0 and r["min_seq_log_ratio"] == 0
    assert [d["kind"] for d in c.diagnoses] == ["identical"]


def test_gaussian_noise_gives_the_analytic_moments():
    """Delta ~ N(0, sigma^2) gives E[r] = exp(sigma^2/2) (the lognormal mean).
    sigma = 0.5, N = 200 000: r's relative standard deviation is
    sqrt(exp(sigma^2) - 1) = 0.53, so the mean's relative sampling error is
    0.53 / sqrt(N) = 0.12 %, and 2 % is 17 standard errors: a failure is the
    code, not the draw. The other moments have analytic values too."""
    sigma, n = 0.5, 200_000
    rng = np.random.default_rng(7)
    a = -rng.exponential(1.0, n)
    b = a + rng.normal(0.0, sigma, n)
    offsets = np.arange(0, n + 1, 100)
    c = L.compare(a, b, offsets, clips=(1.1, 2.0))
    r = c.row
    assert abs(r["mean_ratio"] / math.exp(sigma**2 / 2) - 1) < 0.02
    assert abs(r["kl_k2"] / (sigma**2 / 2) - 1) < 0.02           # E[d^2]/2; d^2's relative SE sqrt(2/N) = 0.3 %
    assert abs(r["kl_k3"] / math.expm1(sigma**2 / 2) - 1) < 0.02  # E[r] - 1 - E[d]
    chi2 = math.exp(2 * sigma**2) - 2 * math.exp(sigma**2 / 2) + 1
    assert abs(r["chi2"] / chi2 - 1) < 0.05                      # E[r^2] - 2E[r] + 1; heavier tail: 5 %
    for clip in r["outside_clip"]:  # P(|d| > log c) = erfc(log c / (sigma sqrt 2)); binomial SE < 0.0012
        p = math.erfc(math.log(clip["clip"]) / (sigma * math.sqrt(2)))
        assert abs(clip["frac_outside"] - p) < 0.006
    assert abs(r["ess_frac"] - math.exp(-sigma**2)) < 0.02        # (E r)^2 / E r^2
    assert abs(r["std_seq_log_ratio"] / (sigma * 10) - 1) < 0.1   # 100 tokens a sequence: sigma sqrt(100); 2000 sequences
    assert c.diagnoses == []


# ---------------------------------------------------------------------------
# diagnoses


def top_p_streams(seed, n=3000, vocab=40, p=0.9, k=8, noise=0.0, sequences=30):
    """A trainer scoring every token of its full distribution, and a rollout
    that samples from its top-p support and reports the renormalised log-probs
    (-inf outside the support): logp_B = logp_A - log S, S the kept mass."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, vocab)) * 2.5
    m = logits.max(axis=1, keepdims=True)
    lp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    order = np.argsort(-lp, axis=1)
    probs = np.take_along_axis(np.exp(lp), order, axis=1)
    cut = (np.cumsum(probs, axis=1) < p).sum(axis=1) + 1  # the smallest prefix with mass >= p
    kept = np.zeros_like(lp, dtype=bool)
    for i in range(n):
        kept[i, order[i, :cut[i]]] = True
    S = np.array([math.fsum(np.exp(lp[i, kept[i]]).tolist()) for i in range(n)])
    lpb = np.where(kept, lp - np.log(S)[:, None], -np.inf)
    if noise:
        lp_a = lp + rng.normal(0.0, noise, lp.shape)
    else:
        lp_a = lp
    chosen = np.array([rng.choice(np.flatnonzero(kept[i])) for i in range(n)])
    rows = np.arange(n)
    top_a = np.argsort(-lp_a, axis=1)[:, :k]
    top_b = np.argsort(-lpb, axis=1)[:, :k]
    offsets = np.linspace(0, n, sequences + 1).astype(np.int64)
    A = ls.from_arrays(chosen, lp_a[rows, chosen], offsets, top_a, np.take_along_axis(lp_a, top_a, 1), "A")
    B = ls.from_arrays(chosen, lpb[rows, chosen], offsets, top_b, np.take_along_axis(lpb, top_b, 1), "B")
    return A, B, S


def test_a_top_p_rollout_is_found_and_its_kept_mass_recovered():
    A, B, S = top_p_streams(11)
    res = exp.compare_streams(A, B)
    ren = [d for d in res.diagnoses if d["kind"] == "renormalised"]
    assert len(ren) == 1 and ren[0]["side"] == "b" and ren[0]["evidence"] == "top_logprobs"
    c = L.compare(A.logprobs, B.logprobs, A.offsets, top_a=L.Top(A.top_ids, A.top_logprobs),
                  top_b=L.Top(B.top_ids, B.top_logprobs))
    assert np.max(np.abs(c.kept_mass - S)) < 1e-6
    assert abs(ren[0]["offset_mean"] - math.fsum(np.log(S).tolist()) / S.size) < 1e-6
    assert abs(ren[0]["kept_mass"] - math.exp(math.fsum(np.log(S).tolist()) / S.size)) < 1e-6
    assert abs(ren[0]["kept_mass_min"] - S.min()) < 1e-6
    assert ren[0]["offset_mean"] <= 0  # log S <= 0: the rollout gives each kept token more than the trainer
    assert any("renormalised" in t for t in res.takeaways)


def test_a_constant_kept_mass_is_recovered_from_the_chosen_tokens_alone():
    a, _, offsets = random_streams(5, sigma=0.0)
    S = 0.8
    c = L.compare(a, a - math.log(S), offsets)
    ren = [d for d in c.diagnoses if d["kind"] == "renormalised"]
    assert ren and ren[0]["evidence"] == "chosen tokens" and ren[0]["side"] == "b"
    assert abs(ren[0]["kept_mass"] - S) < 1e-6 and abs(ren[0]["offset_mean"] - math.log(S)) < 1e-6
    swapped = L.compare(a - math.log(S), a, offsets)  # the trainer's side renormalised: Delta = -log S >= 0
    ren = [d for d in swapped.diagnoses if d["kind"] == "renormalised"]
    assert ren and ren[0]["side"] == "a" and abs(ren[0]["kept_mass"] - S) < 1e-6


def test_renormalisation_under_precision_noise_and_the_residual():
    A, B, S = top_p_streams(12, noise=0.003)
    res = exp.compare_streams(A, B)
    ren = [d for d in res.diagnoses if d["kind"] == "renormalised"]
    assert ren and ren[0]["evidence"] == "top_logprobs"
    # the offset removed, what is left is the trainer's noise (the offsets themselves carry sigma/sqrt(k))
    assert 0.5 * 0.003 < ren[0]["residual_rms_diff"] < 1.2 * 0.003


def test_a_temperature_is_not_taken_for_a_renormalisation():
    A, B = temperature_streams(3000, 30)
    diagnoses = exp.compare_streams(A, B).diagnoses
    assert "renormalised" not in [d["kind"] for d in diagnoses]
    # logp_B = logp_A / 0.7 + c exactly at each position: the slope names the temperature ratio
    temp = [d for d in diagnoses if d["kind"] == "temperature"]
    assert temp and abs(temp[0]["temperature_ratio"] - 0.7) < 1e-9


def test_a_shift_by_one_position_is_found_either_way():
    a, b, offsets = random_streams(21, sigma=0.01)
    ahead, behind = b.copy(), b.copy()
    for s in range(offsets.size - 1):
        lo, hi = offsets[s], offsets[s + 1]
        ahead[lo:hi - 1] = b[lo + 1:hi]   # B's value at t is the token at t+1's
        behind[lo + 1:hi] = b[lo:hi - 1]  # B's value at t+1 is the token at t's
    for stream, lag in ((ahead, 1), (behind, -1)):
        sh = [d for d in L.compare(a, stream, offsets).diagnoses if d["kind"] == "shifted"]
        assert len(sh) == 1 and sh[0]["lag"] == lag and sh[0]["corr_lag"] > 0.9 > sh[0]["corr_aligned"] + 0.5
    assert not [d for d in L.compare(a, b, offsets).diagnoses if d["kind"] == "shifted"]


def test_nan_and_inf_are_counted_named_and_never_averaged():
    a, b, offsets = random_streams(31)
    a, b = a.copy(), b.copy()
    i = offsets[1] + 3   # sequence 1, position 3
    j = offsets[2]       # sequence 2, position 0
    a[i], b[j], b[j + 1] = np.nan, -np.inf, np.inf
    c = L.compare(a, b, offsets)
    assert c.nonfinite["a"]["nan"] == 1 and c.nonfinite["b"]["neg_inf"] == 1 and c.nonfinite["b"]["pos_inf"] == 1
    assert c.nonfinite["a"]["first"][0]["sequence"] == 1 and c.nonfinite["a"]["first"][0]["position"] == 3
    assert [(f["sequence"], f["position"]) for f in c.nonfinite["b"]["first"]] == [(2, 0), (2, 1)]
    assert c.row["excluded"] == 3 and c.row["seq_excluded"] == 2
    want = reference(a, b, offsets.tolist())  # computed on the finite tokens and the sequences without a bad one
    for k in ("mean_abs_diff", "mean_ratio", "kl_k3", "mean_seq_log_ratio", "seq_ess"):
        assert close(c.row[k], want[k]), k
    assert all(math.isfinite(c.row[k]) for k in ("mean_diff", "rms_diff", "mean_ratio", "chi2"))
    kinds = {(d["kind"], d.get("side")) for d in c.diagnoses}
    assert ("nonfinite", "a") in kinds and ("nonfinite", "b") in kinds


# ---------------------------------------------------------------------------
# the readers: one stream in every format gives the same statistics


def write_jsonl(path, ids, lps, offsets, tokens=None, tops=None):
    with open(path, "w") as f:
        for s in range(len(offsets) - 1):
            lo, hi = offsets[s], offsets[s + 1]
            rec = {"token_ids": [int(x) for x in ids[lo:hi]], "logprobs": [float(x) for x in lps[lo:hi]]}
            if tokens is not None:
                rec["tokens"] = tokens[lo:hi]
            if tops is not None:
                rec["top_logprobs"] = tops[lo:hi]
            f.write(json.dumps(rec) + "\n")


@pytest.fixture(scope="module")
def stream_files(tmp_path_factory):
    """The same two streams in every format the reader takes."""
    tmp = tmp_path_factory.mktemp("streams")
    a, b, offsets = random_streams(41, sequences=6, mean_len=10)
    rng = np.random.default_rng(41)
    ids = rng.integers(0, 1000, a.size)
    write_jsonl(tmp / "a.jsonl", ids, a, offsets)
    write_jsonl(tmp / "b.jsonl", ids, b, offsets)
    from safetensors.numpy import save_file

    lengths = np.diff(offsets)
    T = int(lengths.max())
    ids2 = np.full((lengths.size, T), -7, dtype=np.int64)  # padding: any value, ignored
    lp2 = np.full((lengths.size, T), np.nan, dtype=np.float64)
    for s in range(lengths.size):
        ids2[s, :lengths[s]] = ids[offsets[s]:offsets[s + 1]]
        lp2[s, :lengths[s]] = b[offsets[s]:offsets[s + 1]]
    save_file({"token_ids": ids2, "logprobs": lp2, "lengths": lengths.astype(np.int32)}, str(tmp / "b2d.safetensors"))
    np.savez(tmp / "b1d.npz", token_ids=ids, logprobs=b, offsets=offsets)
    np.savez(tmp / "b1d_lengths.npz", token_ids=ids, logprobs=b, lengths=lengths)
    completions = {"choices": [{"index": s, "logprobs": {
        "tokens": [f"token_id:{int(x)}" for x in ids[offsets[s]:offsets[s + 1]]],
        "token_logprobs": [float(x) for x in b[offsets[s]:offsets[s + 1]]],
        "top_logprobs": None}} for s in reversed(range(lengths.size))]}  # out of order: index decides
    (tmp / "b_completions.json").write_text(json.dumps(completions))
    chat = [{"choices": [{"index": 0, "logprobs": {"content": [
        {"token": f"token_id:{int(ids[i])}", "logprob": float(b[i]), "top_logprobs": []}
        for i in range(offsets[s], offsets[s + 1])]}}]} for s in range(lengths.size)]
    (tmp / "b_chat.json").write_text(json.dumps(chat))
    with open(tmp / "b_chat.jsonl", "w") as f:  # saved responses, one a line
        for doc in chat:
            f.write(json.dumps(doc) + "\n")
    return tmp, a, b, offsets


@pytest.mark.parametrize("name", ["b.jsonl", "b2d.safetensors", "b1d.npz", "b1d_lengths.npz", "b_completions.json",
                                  "b_chat.json", "b_chat.jsonl"])
def test_every_format_reads_the_same_stream(stream_files, name):
    tmp, a, b, offsets = stream_files
    st = ls.read(str(tmp / name), "B")
    assert st.offsets.tolist() == offsets.tolist()
    assert np.array_equal(st.logprobs, b)
    A = ls.read(str(tmp / "a.jsonl"), "A")
    res = exp.compare_streams(A, st)
    want = reference(a, b, offsets.tolist())
    assert close(res.rows[0]["kl_k3"], want["kl_k3"]) and res.params["compared_by"] == "ids"


def test_openai_token_strings_are_compared_when_there_are_no_ids(tmp_path):
    toks = ["Hello", ",", " world", "!"]
    doc = {"choices": [{"index": 0, "logprobs": {"tokens": toks, "token_logprobs": [None, -0.5, -1.0, -0.1],
                                                 "top_logprobs": [None, {",": -0.5, ".": -1.2}, {" world": -1.0},
                                                                  {"!": -0.1, "?": -2.5}]}}]}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    doc["choices"][0]["logprobs"]["token_logprobs"] = [None, -0.6, -1.0, -0.1]
    (tmp_path / "b.json").write_text(json.dumps(doc))
    res = exp.run(exp.LogprobsConfig(str(tmp_path / "a.json"), str(tmp_path / "b.json")))
    # the echo's null first log-prob is no value (issue 41): left out of both streams, not counted as a NaN
    assert res.params["compared_by"] == "tokens" and res.rows[0]["n"] == 3 and res.nonfinite["a"]["nan"] == 0
    assert res.params["unscored_first_tokens"] == 1 and res.rows[0]["seq_n"] == 1
    assert res.worst_positions[0]["token"] == "," and res.worst_positions[0]["position"] == 1
    doc["choices"][0]["logprobs"]["tokens"] = ["Hello", ";", " world", "!"]
    (tmp_path / "c.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError, match=r"tokens differ first at sequence 0, position 1: A ',', B ';'"):
        exp.run(exp.LogprobsConfig(str(tmp_path / "a.json"), str(tmp_path / "c.json")))


# ---------------------------------------------------------------------------
# bad files: one line, exit 2


def bad_cases(tmp):
    good = tmp / "good.jsonl"
    good.write_text(json.dumps({"token_ids": [1, 2, 3], "logprobs": [-1.0, -2.0, -0.5]}) + "\n")
    cases = {}

    def case(name, text, pattern):
        p = tmp / name
        if isinstance(text, bytes):
            p.write_bytes(text)
        elif text is not None:
            p.write_text(text)
        cases[name] = (p, pattern)

    case("missing.jsonl", None, "no such file")
    case("malformed.jsonl", json.dumps({"token_ids": [1], "logprobs": [-1.0]}) + "\n{oops\n", r"line 2: not JSON")
    case("lengths.jsonl", json.dumps({"token_ids": [1, 2], "logprobs": [-1.0]}) + "\n", r"line 1: 2 token_ids but 1 logprobs")
    case("nonnumeric.jsonl", json.dumps({"token_ids": [1, 2, 3], "logprobs": [-1.0, "abc", -0.5]}) + "\n",
         r"line 1: logprobs\[1\]: not a number")
    case("badid.jsonl", json.dumps({"token_ids": [1, -2, 3], "logprobs": [-1.0, -2.0, -0.5]}) + "\n",
         r"token_ids\[1\]: not a token id")
    case("empty.jsonl", "", "holds no records")
    case("notutf8.jsonl", b"\xff\xfe{}\n", "line 1: not UTF-8")
    case("other.jsonl", json.dumps({"token_ids": [1, 9, 3], "logprobs": [-1.0, -2.0, -0.5]}) + "\n",
         r"token ids differ first at sequence 0, position 1: A 2, B 9")
    case("short.jsonl", json.dumps({"token_ids": [1, 2], "logprobs": [-1.0, -2.0]}) + "\n",
         r"sequence 0 has 3 tokens in A, 2 in B")
    case("two.jsonl", (json.dumps({"token_ids": [1, 2, 3], "logprobs": [-1.0, -2.0, -0.5]}) + "\n") * 2,
         "A has 1 sequences, B 2")
    case("nochoices.json", json.dumps({"token_ids": [1]}), "not an OpenAI-style response")
    case("nologprobs.json", json.dumps({"choices": [{"index": 0, "text": "x"}]}), "has no logprobs")
    case("data.txt", "x", "unsupported extension")
    np.savez(tmp / "pickle.npz", token_ids=np.array([1, 2, 3]), logprobs=np.array([{"a": 1}, 2, 3], dtype=object))
    cases["pickle.npz"] = (tmp / "pickle.npz", "pickle")
    np.savez(tmp / "layout.npz", ids=np.array([1, 2, 3]), logprobs=np.array([-1.0, -2.0, -0.5]))
    cases["layout.npz"] = (tmp / "layout.npz", "no 'token_ids' array")
    np.savez(tmp / "offsets.npz", token_ids=np.array([1, 2, 3]), logprobs=np.array([-1.0, -2.0, -0.5]),
             offsets=np.array([0, 2]))
    cases["offsets.npz"] = (tmp / "offsets.npz", "'offsets' must run from 0 to 3")
    (tmp / "zip.npz").write_bytes(b"PK\x03\x04 not a zip")
    cases["zip.npz"] = (tmp / "zip.npz", "cannot read")
    return good, cases


def test_bad_files_are_usage_errors_naming_the_cause(tmp_path):
    good, cases = bad_cases(tmp_path)
    for path, pattern in cases.values():
        with pytest.raises(UsageError, match=pattern):
            exp.run(exp.LogprobsConfig(str(good), str(path)))


def test_bad_files_exit_2_with_one_line(tmp_path):
    good, cases = bad_cases(tmp_path)
    for name in ("malformed.jsonl", "pickle.npz", "other.jsonl"):
        r = cli("compare", "logprobs", str(good), str(cases[name][0]))
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, (name, r.err)
    r = cli("compare", "logprobs", str(good), str(good), "--clip", "0.9")
    assert r.code == 2 and "--clip" in r.err


def test_a_pickle_is_never_loaded(tmp_path, monkeypatch):
    np.savez(tmp_path / "p.npz", token_ids=np.array([1]), logprobs=np.array([object()], dtype=object))
    with zipfile.ZipFile(tmp_path / "p.npz") as z:
        assert "logprobs.npy" in z.namelist()
    calls = []
    monkeypatch.setattr(np, "load", lambda *a, **k: calls.append(k))
    with pytest.raises(UsageError, match="pickle"):
        ls.read(str(tmp_path / "p.npz"), "B")
    assert calls == []  # refused from the header, before numpy was asked to load anything


def test_memory_is_checked_from_the_header_before_reading(tmp_path, monkeypatch):
    from safetensors.numpy import save_file

    save_file({"token_ids": np.zeros((4, 8), dtype=np.int64), "logprobs": np.zeros((4, 8), dtype=np.float32)},
              str(tmp_path / "x.safetensors"))
    from precisionlab.io import inputs

    monkeypatch.setattr(inputs, "memory_limit", lambda: 100)  # bytes: less than the arrays declare
    with pytest.raises(UsageError, match="needs about"):
        ls.read(str(tmp_path / "x.safetensors"), "A")


# ---------------------------------------------------------------------------
# the command


def test_the_docs_streams_show_the_renormalised_rollout_in_json():
    r = cli("compare", "logprobs", str(DATA / "trainer.safetensors"), str(DATA / "rollout-top-p.jsonl"), "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert doc["command"] == "compare logprobs" and json_glossary_problems(doc) == []
    kinds = [d["kind"] for d in doc["diagnoses"]]
    assert "renormalised" in kinds
    raw = cli("compare", "logprobs", str(DATA / "trainer.safetensors"), str(DATA / "rollout.jsonl"), "--json")
    assert [d["kind"] for d in strict_json(raw.out)["diagnoses"]] == []  # fp32 against bf16 alone: noise


def test_tokenizer_decodes_the_worst_tokens_and_clip_and_cap_are_the_users(tmp_path):
    """--tokenizer names the worst positions' tokens; --clip and --cap set the
    intervals and the cap counted (against the reference's counts)."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "the", "cat", "sat", "on", "a", "mat"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    a, b, offsets = random_streams(51, sequences=5, mean_len=12, sigma=0.3)
    ids = np.random.default_rng(51).integers(1, len(words), a.size)
    write_jsonl(tmp_path / "a.jsonl", ids, a, offsets)
    write_jsonl(tmp_path / "b.jsonl", ids, b, offsets)
    r = cli("compare", "logprobs", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--tokenizer",
            str(tmp_path / "tok"), "--clip", "1.05,3", "--cap", "1.5", "--worst", "3", "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    worst = doc["worst_positions"]
    assert len(worst) == 3 and all(w["token"] == words[w["token_id"]] for w in worst)
    want = reference(a, b, offsets.tolist(), clips=(1.05, 3.0), cap=1.5)
    row = doc["rows"][0]
    assert [(c["clip"], c["n_outside"]) for c in row["outside_clip"]] == list(zip((1.05, 3.0), want["outside"], strict=True))
    assert row["seq_frac_above_cap"] == want["seq_frac_above_cap"] and doc["params"]["cap"] == 1.5


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "lp.png"
    r = cli("compare", "logprobs", str(DATA / "trainer.safetensors"), str(DATA / "rollout.jsonl"), "--plot", str(out))
    assert r.code == 0, r.err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_never_imports_torch():
    import subprocess
    import sys

    code = ("import sys; from precisionlab.experiments import logprobs as e; from precisionlab.report import logprobs; "
            f"e.run(e.LogprobsConfig({str(DATA / 'trainer.safetensors')!r}, {str(DATA / 'rollout.jsonl')!r})); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


# ---------------------------------------------------------------------------
# extremes: the statistics of finite log-probs are finite where their exact values are


def _stream(tmp_path, name, lps):
    p = tmp_path / name
    p.write_text(json.dumps({"token_ids": list(range(len(lps))), "logprobs": lps}) + "\n")
    return str(p)


def test_means_and_rms_of_huge_finite_deltas_are_their_exact_values(tmp_path, run):
    """Delta near the double's largest value: its sum and its square overflow a
    float64, its mean and RMS do not. The oracle: the exact differences in
    rationals, the mean rounded once, the RMS a 60-digit mpmath root."""
    a, b = [-0.5, -1.0, 3e307], [-1e308, -1.7e308, -1.5e308]
    r = run("compare", "logprobs", _stream(tmp_path, "a.jsonl", a), _stream(tmp_path, "b.jsonl", b), "--json")
    row = strict_json(r.out)["rows"][0]
    d = [Fraction(x) - Fraction(y) for x, y in zip(a, b, strict=True)]
    assert row["mean_diff"] == float(sum(d) / 3) and row["kl_k1"] == -row["mean_diff"]
    assert row["mean_abs_diff"] == float(sum(abs(x) for x in d) / 3)
    with mpmath.workdps(60):
        ms = sum(x * x for x in d) / 3
        rms = mpmath.sqrt(mpmath.mpf(ms.numerator) / ms.denominator)
    assert row["rms_diff"] == float(rms)
    assert row["kl_k2"] == "inf"  # mean(Delta^2) / 2 ~ 1e616 is past the range: inf is its double


def test_extreme_ratios_are_the_worst_positions_ratios(tmp_path, run):
    a, b = [-1.0, -2.0, -0.3], [-0.95, -2.5, -0.3]
    r = run("compare", "logprobs", _stream(tmp_path, "a.jsonl", a), _stream(tmp_path, "b.jsonl", b), "--json")
    d = strict_json(r.out)
    ratios = {w["diff"]: w["ratio"] for w in d["worst_positions"]}
    assert d["rows"][0]["min_ratio"] == ratios[min(ratios)] == math.exp(min(ratios))
    assert d["rows"][0]["max_ratio"] == ratios[max(ratios)] == math.exp(max(ratios))


@pytest.mark.parametrize("digits", [400, 5000])
def test_an_integer_literal_past_the_double_range_is_a_number_past_it(tmp_path, run, digits):
    """A 400-digit log-prob is -inf as the float literal -1e400 is (a non-finite
    log-prob, left out and said); 5000 digits, past Python's limit on int
    conversion, the same: never an internal error."""
    good = _stream(tmp_path, "a.jsonl", [-0.5, -1.0])
    big = tmp_path / "b.jsonl"
    big.write_text('{"token_ids": [0, 1], "logprobs": [-0.5, -1' + "0" * digits + "]}\n")
    r = run("compare", "logprobs", good, str(big), "--json")
    assert r.code == 0, r.err
    d = strict_json(r.out)
    assert d["rows"][0]["n"] == 1 and d["nonfinite"]["b"]["neg_inf"] == 1
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"token_ids": [0, 1' + "0" * 45 + '], "logprobs": [-0.5, -1.0]}\n')
    one_line(run("compare", "logprobs", good, str(ids)), 2, "token id")
