"""compare logits on small synthetic numpy logits: the sides by role, REF_LOW
as the yardstick, standard errors against an independent computation, an
overflow that exits 1, and llama.cpp's kl-divergence-base file (read from a
file this test builds byte by byte from the layout, written, and scored by
llama-perplexity's formulas, restated here from their definitions)."""

import math
import statistics
import struct

import numpy as np
import pytest

from helpers import cli, reference_logits, strict_json, write_logits_file

N, V = 600, 41  # an odd vocabulary: llama.cpp pads each row to an even count


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    rng, ref, tok = reference_logits(11, N, V)
    low = ref + np.float32(0.02) * rng.standard_normal(ref.shape).astype(np.float32)     # the rounding's cost
    clean = ref + np.float32(0.02) * rng.standard_normal(ref.shape).astype(np.float32)   # another correct engine
    bug = ref.copy()                                                                    # the text's token 2 % less likely
    bug[np.arange(N), tok] -= np.float32(0.02)
    over = clean.copy()
    over[[3, 9, 40], 5] = np.inf
    files = {name: write_logits_file(d / f"{name}.safetensors", x, tok, window=100)
             for name, x in (("ref", ref), ("low", low), ("clean", clean), ("bug", bug), ("over", over))}
    return d, files, {"ref": ref, "low": low, "clean": clean, "bug": bug, "tok": tok}


def _json(*args):
    r = cli("compare", "logits", *args, "--json")
    return r, strict_json(r.out) if r.out.strip() else None


def test_sides_are_named_by_role_and_file(runs):
    _, f, _ = runs
    r = cli("compare", "logits", f["ref"], f["low"], f["clean"])
    assert r.code == 0, r.err
    assert "fp32" not in r.out and "REF_LOW" in r.out and "YOURS" in r.out and "clean.safetensors" in r.out
    r, d = _json(f["ref"], f["low"], f["clean"])
    assert [(x["side"], x["file"]) for x in d["rows"]] == [("YOURS", f["clean"]), ("REF_LOW", f["low"])]
    assert not [k for x in d["rows"] for k in x if "fp32" in k]


def test_standard_errors_match_an_independent_computation(runs):
    _, f, a = runs
    _, d = _json(f["ref"], f["bug"])
    row = d["rows"][0]
    lp, lq = _log_softmax(a["ref"]), _log_softmax(a["bug"])
    i = np.arange(N)
    dnll = (-lq[i, a["tok"]]) - (-lp[i, a["tok"]])
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    # statistics.stdev works in exact rationals: an independent sample standard deviation
    want_ln = statistics.stdev(dnll.tolist()) / math.sqrt(N)
    want_kl = statistics.stdev(kl.tolist()) / math.sqrt(N)
    # float64 log-softmax two ways: ~1e-15 absolute on per-token values near 1e-2
    assert row["ln_ppl_ratio_se"] == pytest.approx(want_ln, rel=1e-9)
    assert row["kld_mean_se"] == pytest.approx(want_kl, rel=1e-6)
    # the per-token differences, not the two NLLs' own errors added: those are ~100x larger here
    sep = math.hypot(statistics.stdev((-lq[i, a["tok"]]).tolist()), statistics.stdev((-lp[i, a["tok"]]).tolist()))
    assert want_ln < sep / math.sqrt(N) / 10
    p = row["top1_agree"] / N
    assert row["top1_agree_pct_se"] == pytest.approx(100 * math.sqrt(p * (1 - p) / (N - 1)), rel=1e-12)


def test_a_systematic_bug_below_the_rounding_kld_is_called_out(runs):
    _, f, _ = runs
    r, d = _json(f["ref"], f["low"], f["bug"])
    ys = {y["statistic"]: y for y in d["yardstick"]}
    assert d["rows"][0]["kld_mean"] < d["rows"][1]["kld_mean"]  # the KLD alone would pass it
    assert d["worst"]["statistic"] in ("ln_ppl_ratio", "dp_mean") and d["worst"]["flagged"]
    assert ys["ln_ppl_ratio"]["z"] > 10 and ys["ln_ppl_ratio"]["ratio"] > 4
    assert r.code == 1 and "departs from the yardstick" in r.err
    t = cli("compare", "logits", f["ref"], f["low"], f["bug"])
    assert "departs most from the yardstick: " + d["worst"]["statistic"] in t.out


def test_a_clean_engine_stays_within_the_yardstick(runs):
    _, f, _ = runs
    r, d = _json(f["ref"], f["low"], f["clean"])
    assert r.code == 0 and d["worst"] is not None and not any(y["flagged"] for y in d["yardstick"])


def test_overflow_where_ref_is_finite_exits_1_and_is_named(runs):
    _, f, _ = runs
    r, d = _json(f["ref"], f["over"])
    assert r.code == 1
    row = d["rows"][0]
    assert row["nonfinite_positions"] == 3 and row["first_nonfinite_positions"] == [3, 9, 40]
    assert "non-finite where REF is finite at 3 positions" in r.err and "3, 9, 40" in r.err


# ---------------------------------------------------------------------------
# llama.cpp's kl-divergence-base file


def _quantise_by_hand(row):
    """The layout's rule, restated: the range [max(min, max - 16), max] in 65535 steps."""
    x = row.astype(np.float64)
    top, bottom = x.max(), max(x.min(), x.max() - 16)
    lse = math.log(math.fsum(np.exp(x - top).tolist()))
    scale = np.float32((top - bottom) / 65535)
    q = [int(round((v - bottom) / float(scale))) if v > bottom else 0 for v in x]
    return scale, np.float32(bottom - top - lse), q


def _base_file_by_hand(path, logits, text, n_ctx):
    """Bytes of a base file, from the layout (not from the tool's writer)."""
    n_chunk = len(text) // n_ctx
    first = n_ctx // 2
    out = [b"_logits_", struct.pack("<iii", n_ctx, V, n_chunk), struct.pack(f"<{n_chunk * n_ctx}i", *text)]
    for c in range(n_chunk):
        for j in range(n_ctx - 1 - first):
            scale, low, q = _quantise_by_hand(logits[c * n_ctx + first + j])
            out.append(struct.pack("<ff", scale, low) + struct.pack(f"<{V}H", *q) + b"\0\0" * (V % 2))
    path.write_bytes(b"".join(out))
    return str(path)


def _llama_report(path, yours):
    """llama-perplexity's closing KL numbers from their definitions: KL over the
    base tokens with ln p > -16, mean ± sqrt((sum2/n - mean^2)/(n - 1)), linear
    percentiles, RMS Δp with ± by the delta method, same top p ± binomial."""
    raw = open(path, "rb").read()
    n_ctx, n_vocab, n_chunk = struct.unpack("<iii", raw[8:20])
    text = np.frombuffer(raw, "<i4", n_ctx * n_chunk, 20)
    nv = 2 * ((n_vocab + 1) // 2) + 4
    rows = np.frombuffer(raw, "<u2", offset=20 + 4 * n_ctx * n_chunk).reshape(-1, nv)
    first, per = n_ctx // 2, n_ctx - 1 - n_ctx // 2
    kl, dp, same = [], [], 0
    for k, w in enumerate(rows):
        c, j = divmod(k, per)
        scale, low = np.frombuffer(w[:4].tobytes(), "<f4")
        base = float(scale) * w[4:4 + n_vocab].astype(np.float64) + float(low)
        y = _log_softmax(yours[c * n_ctx + first + j][None])[0]
        t = text[c * n_ctx + first + j + 1]
        kl.append(math.fsum(math.exp(b) * (b - q) for b, q in zip(base, y, strict=True) if b > -16))
        dp.append(math.exp(y[t]) - math.exp(base[t]))
        same += int(np.argmax(yours[c * n_ctx + first + j]) == np.argmax(base))
    n = len(kl)

    def mu(v):
        m = math.fsum(v) / n
        return m, math.sqrt((math.fsum(x * x for x in v) / n - m * m) / (n - 1))

    rms2 = mu([x * x for x in dp])
    ps = same / n
    return {"mean_kld": mu(kl)[0], "mean_kld_se": mu(kl)[1],
            **{k: float(np.percentile(kl, q, method="linear")) for k, q in
               (("kld_p99_9", 99.9), ("kld_p99", 99), ("kld_p95", 95), ("kld_p90", 90), ("median_kld", 50),
                ("kld_p10", 10), ("kld_p1", 1))},
            "max_kld": max(kl), "rms_dp_pct": 100 * math.sqrt(rms2[0]),
            "rms_dp_pct_se": 100 * 0.5 / math.sqrt(rms2[0]) * rms2[1],
            "same_top_p_pct": 100 * ps, "same_top_p_pct_se": 100 * math.sqrt(ps * (1 - ps) / (n - 1))}


def test_a_base_file_built_from_the_layout_is_read_and_scored_as_llama_perplexity_does(runs):
    d, f, a = runs
    base = _base_file_by_hand(d / "hand.kld", a["ref"], [0, *a["tok"][:N - 1].tolist()], 100)
    r, doc = _json(base, f["clean"])
    assert r.code == 0, r.err
    got, want = doc["llamacpp"]["YOURS"], _llama_report(base, a["clean"])
    assert got["positions"] == 6 * 49
    for k, v in want.items():
        # llama.cpp works in float32 where these are float64: 4 significant digits
        assert got[k] == pytest.approx(v, rel=5e-5, abs=1e-12), k
    # this tool's own statistics from the same file stay near the unquantised REF's
    # (the 16-bit log-probs move each by at most half a step, 16/65535/2)
    _, full = _json(f["ref"], f["clean"])
    assert doc["rows"][0]["kld_mean"] == pytest.approx(full["rows"][0]["kld_mean"], rel=0.05)


def test_written_base_file_round_trips_and_matches_the_layout(runs):
    d, f, a = runs
    out = d / "written.kld"
    r = cli("compare", "logits", f["ref"], "--write-kld-base", str(out))
    assert r.code == 0, r.err
    hand = _base_file_by_hand(d / "hand2.kld", a["ref"], [0, *a["tok"][:N - 1].tolist()], 100)
    got, want = out.read_bytes(), open(hand, "rb").read()
    assert len(got) == len(want) and got[:20 + 4 * N] == want[:20 + 4 * N]
    q_got = np.frombuffer(got, "<u2", offset=20 + 4 * N).reshape(-1, 2 * ((V + 1) // 2) + 4).astype(np.int64)
    q_want = np.frombuffer(want, "<u2", offset=20 + 4 * N).reshape(q_got.shape).astype(np.int64)
    assert np.array_equal(q_got[:, :4], q_want[:, :4])
    assert np.abs(q_got[:, 4:] - q_want[:, 4:]).max() <= 1  # a half-step tie may round either way
    r, doc = _json(str(out), f["bug"])
    assert r.code == 0 and doc["rows"][0]["positions"] == 6 * 49


@pytest.mark.parametrize("case,needle", [
    ("magic", "not a llama.cpp kl-divergence-base file"),
    ("truncated", "truncated"),
    ("huge", "truncated"),
    ("empty", "holds no scored position"),
    ("token", "outside the vocabulary"),
])
def test_hostile_base_files_are_one_line_exit_2(runs, case, needle):
    d, f, a = runs
    good = open(_base_file_by_hand(d / "ok.kld", a["ref"][:300], [0, *a["tok"][:299].tolist()], 100), "rb").read()
    bad = {"magic": b"_LOGITS_" + good[8:], "truncated": good[:-3],
           "huge": b"_logits_" + struct.pack("<iii", 100, 2**31 - 1, 2**30) + good[20:200],
           "empty": b"_logits_" + struct.pack("<iii", 2, V, 1) + good[20:28],
           "token": good[:20] + struct.pack("<i", V) + good[24:]}[case]
    p = d / f"{case}.kld"
    p.write_bytes(bad)
    r = cli("compare", "logits", str(p), f["clean"])
    assert r.code == 2 and needle in r.err and len(r.err.strip().splitlines()) == 1, r.err
