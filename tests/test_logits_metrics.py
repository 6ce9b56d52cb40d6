"""compare model --metrics and compare logits: the statistics against an
independent mpmath reference, the small-noise KL law, exact agreement of a
saved pair with the live run, the file layout, and bad input."""

import math

import mpmath
import numpy as np
import pytest
from safetensors.numpy import save_file

from helpers import TINY_WORDS, cli, save_tiny_qwen, strict_json
from precisionlab.numerics import distribution as dist
from precisionlab.engines import embedded
from precisionlab.experiments import logits as exp

mpmath.mp.dps = 50


# ---------------------------------------------------------------------------
# per-position statistics against mpmath at 50 digits


def kl_mp(x, y) -> mpmath.mpf:
    """KL(softmax(x) || softmax(y)) straight from the definition, at 50 digits."""
    x = [mpmath.mpf(float(v)) if np.isfinite(v) else None for v in x]
    y = [mpmath.mpf(float(v)) if np.isfinite(v) else None for v in y]
    zx = mpmath.fsum(mpmath.exp(v) for v in x if v is not None)
    zy = mpmath.fsum(mpmath.exp(v) for v in y if v is not None)
    total = mpmath.mpf(0)
    for a, b in zip(x, y, strict=True):
        if a is None:
            continue
        if b is None:
            return mpmath.inf
        p = mpmath.exp(a) / zx
        total += p * (mpmath.log(p) - (b - mpmath.log(zy)))
    return total


@pytest.mark.parametrize("scale,noise", [(1.0, 1e-6), (3.0, 1e-3), (10.0, 0.3), (30.0, 5.0)])
def test_kl_matches_mpmath(scale, noise):
    rng = np.random.default_rng(int(scale * 100 + noise * 1e6))
    x = rng.standard_normal((12, 37)) * scale
    y = x + noise * rng.standard_normal(x.shape)
    got = dist.kl_rows(dist.log_softmax(x), dist.log_softmax(y))
    for i in range(x.shape[0]):
        ref = float(kl_mp(x[i], y[i]))
        # Inputs exact in float64; the float64 log-sum-exp and the sum over 37
        # non-negative terms leave a few ulps of relative error, plus the
        # normalisation's ~1e-16 absolute (sum p = 1 only to rounding).
        assert got[i] >= 0
        assert abs(got[i] - ref) <= 1e-12 * ref + 1e-15, (i, got[i], ref)


def test_phi_series_and_direct_agree_with_mpmath():
    u = np.array([-3.0, -0.5, -0.25, -0.2499, -1e-2, -1e-5, -1e-12, 0.0, 1e-12, 3e-7, 1e-2, 0.1, 0.2499, 0.25,
                  0.26, 0.7, 5.0, 40.0])
    got = dist.phi(u)
    for ui, g in zip(u, got, strict=True):
        ref = mpmath.expm1(mpmath.mpf(float(ui))) - mpmath.mpf(float(ui))
        # A few ulps everywhere, including just either side of the series' threshold (0.25).
        assert abs(g - float(ref)) <= 2e-15 * abs(float(ref)), (ui, g, ref)


def test_identical_rows_give_exact_zero_and_full_agreement():
    x = np.random.default_rng(1).standard_normal((50, 300)) * 4
    s = dist.position_stats(x, x.copy(), np.arange(50) % 300)
    assert np.all(s.kl == 0.0) and s.top1.all() and s.ref_in_top5.all() and s.low_in_top5.all()
    r = dist.summarize(s)
    assert r["kld_max"] == 0.0 and r["top1_agree_pct"] == 100.0 and r["ln_ppl_ratio"] == 0.0 and r["dp_rms"] == 0.0


def test_zero_probability_and_undefined_rows():
    ref = np.array([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [0.0, -np.inf, 2.0], [0.0, 1.0, 2.0], [np.nan, 1, 2]])
    low = np.array([[0.0, -np.inf, 2.0], [0.0, 1.0, np.inf], [0.0, 5.0, 2.0], [-np.inf] * 3, [0.0, 1, 2]])
    s = dist.position_stats(ref, low, np.array([2, 2, 2, 2, 2]))
    assert s.kl[0] == np.inf                      # fp32 has mass where the run has none
    assert np.isnan(s.kl[1]) and np.isnan(s.kl[3]) and np.isnan(s.kl[4])  # +inf, all -inf, NaN: no distribution
    assert np.isfinite(s.kl[2]) and s.kl[2] > 0   # P's zero is harmless
    assert s.kl[2] == pytest.approx(float(kl_mp(ref[2], low[2])), rel=1e-13)
    assert list(s.top1) == [True, False, False, False, False]  # undefined rows agree with nothing
    r = dist.summarize(s)
    assert r["kld_inf_positions"] == 1 and r["undefined_positions"] == 3 and math.isnan(r["kld_mean"])


def test_top5_membership_ties_and_margin_buckets():
    ref = np.array([[9.0, 8, 7, 6, 5, 4], [1.0, 1, 1, 1, 1, 1], [5.0, 0, 0, 0, 0, 0]])
    low = np.array([[0.0, 8, 7, 6, 5, 9], [2.0, 1, 1, 1, 1, 1], [0.0, 5.0 + 1e-9, 0, 0, 0, 0]])
    s = dist.position_stats(ref, low, np.zeros(3, dtype=np.int64))
    # row 0: fp32's argmax (0) is last in the run's ranking; the run's (5) is 6th in fp32's.
    assert (s.ref_in_top5[0], s.low_in_top5[0], s.top1[0]) == (False, False, False)
    # row 1: fp32 is a six-way tie (first index wins the argmax); ties count as "in the top 5".
    assert (s.ref_in_top5[1], s.low_in_top5[1], s.top1[1]) == (True, True, True)
    assert list(s.margin) == [1.0, 0.0, 5.0]
    buckets = {b["margin_lo"]: b for b in dist.flips_by_margin(s)}
    assert buckets[0.0]["positions"] == 1 and buckets[0.0]["flips"] == 0
    assert buckets[1.0]["flips"] == 1 and buckets[3.0]["flips"] == 1 and buckets[3.0]["flip_share"] == 1.0
    assert sum(b["positions"] for b in buckets.values()) == 3


def test_percentiles_are_nearest_rank():
    kl = np.arange(1, 1001, dtype=np.float64)[::-1] * 1e-6  # 1e-6 .. 1e-3
    s = dist.PositionStats(kl=kl, top1=np.ones(1000, bool), ref_in_top5=np.ones(1000, bool),
                           low_in_top5=np.ones(1000, bool), nll_ref=np.ones(1000), nll_low=np.ones(1000),
                           dp=np.zeros(1000), margin=np.ones(1000))
    r = dist.summarize(s)
    srt = np.sort(kl)  # the k-th smallest of 1000 is the percentile 100 k / 1000
    assert (r["kld_median"], r["kld_p90"], r["kld_p99"], r["kld_p99_9"], r["kld_max"]) == (
        srt[499], srt[899], srt[989], srt[998], srt[999])
    assert r["kld_mean"] == math.fsum(kl.tolist()) / 1000


# ---------------------------------------------------------------------------
# the embedded model


def _softmax64(x):
    z = x - x.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _read(path):
    from safetensors import safe_open

    import ml_dtypes  # noqa: F401

    with safe_open(str(path), framework="np") as f:
        return f.get_tensor("logits"), f.get_tensor("tokens"), f.metadata()


@pytest.fixture(scope="module")
def noise_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("noise")
    out = {}
    for sigma in (0.01, 0.05, 0.2):
        out[sigma] = exp.run_model(exp.MetricsConfig(dtypes="fp32", inject=[f"logits:noise={sigma}"],
                                                     save_logits=[str(d / "ref.safetensors")]))
    return out, _read(d / "ref.safetensors")[0].astype(np.float64)


@pytest.mark.parametrize("sigma", [0.01, 0.05])
def test_gaussian_noise_matches_small_noise_kl(noise_runs, sigma):
    runs, ref = noise_runs
    p = _softmax64(ref)
    expected = math.fsum((sigma ** 2 / 2 * (1 - (p * p).sum(axis=1))).tolist()) / p.shape[0]
    got = runs[sigma].rows[0]["kld_mean"]
    assert got == pytest.approx(expected, rel=0.05)
    assert runs[sigma].rows[0]["noise_kld_expected"] == pytest.approx(expected, rel=1e-12)


def test_top1_agreement_falls_as_noise_grows(noise_runs):
    runs, _ = noise_runs
    agree = [runs[s].rows[0]["top1_agree"] for s in (0.01, 0.05, 0.2)]
    assert 8192 > agree[0] > agree[1] > agree[2]
    kl = [runs[s].rows[0]["kld_mean"] for s in (0.01, 0.05, 0.2)]
    assert kl[0] < kl[1] < kl[2]


def test_fp32_against_fp32_is_exact(tmp_path):
    png = tmp_path / "m.png"
    r = cli("compare", "metrics", "--dtypes", "fp32", "--tokens", "1000", "--json", "--plot", str(png))
    assert r.code == 0, r.err
    assert png.read_bytes()[:4] == b"\x89PNG" and [p.name for p in tmp_path.iterdir()] == ["m.png"]
    row = strict_json(r.out)["rows"][0]
    for k in ("kld_mean", "kld_median", "kld_p90", "kld_p99", "kld_p99_9", "kld_max", "dp_mean", "dp_rms",
              "ln_ppl_ratio"):
        assert row[k] == 0.0, k
    assert row["top1_agree_pct"] == 100.0 and row["top1_agree"] == 1000 and row["ppl"] == row["ppl_ref"]


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    a, b, c = d / "fp32.safetensors", d / "bf16.safetensors", d / "fp16noisy.safetensors"
    res = exp.run_model(exp.MetricsConfig(dtypes="bf16", tokens=3000, save_logits=[str(a), f"bf16={b}"]))
    noisy = exp.run_model(exp.MetricsConfig(dtypes="fp16", tokens=3000, inject=["logits:noise=0.03"], seed=7,
                                            save_logits=[f"fp16={c}"]))
    return d, a, b, c, res, noisy


def test_saved_reference_round_trips_bit_for_bit(saved_pair):
    import torch

    from precisionlab.engines import charlm

    d, a, b, _, _, _ = saved_pair
    logits, tokens, meta = _read(a)
    assert logits.dtype == np.float32 and logits.shape[0] == tokens.shape[0] == 3000 and meta["dtype"] == "fp32"
    # An independent teacher-forced pass: the held-out 5 % of the text, 128-character windows.
    m, tok = charlm.load_default(torch.float32)
    text = charlm.DEFAULT_WEIGHTS.with_name("shakespeare.txt").read_text("utf-8")
    ids = tok.encode(text[int(len(text) * 0.95):][:3001])
    assert tokens.tolist() == ids[1:]
    # Batched as the tool batches (23 full windows together, then the last 56):
    # a matmul's rounding may depend on its row count, which is not this test's subject.
    threads = torch.get_num_threads()
    torch.set_num_threads(embedded.SCORE_THREADS)  # as the tool runs it
    with torch.no_grad():
        full = m(torch.tensor(ids[:2944]).view(23, 128))[0].reshape(2944, -1).numpy()
        rest = m(torch.tensor([ids[2944:3000]]))[0][0].numpy()
    torch.set_num_threads(threads)
    want = np.concatenate([full, rest])
    assert np.array_equal(logits.view(np.uint32), want.view(np.uint32))
    # The bf16 file holds bf16 values; read back and written again, the bytes are the same.
    lb, tb, _ = _read(b)
    assert str(lb.dtype) == "bfloat16"
    from precisionlab.io import logits_file

    logits_file.write(str(d / "again.safetensors"), lb, tb, _read(b)[2])
    la, ta, ma = _read(d / "again.safetensors")
    assert np.array_equal(la.view(np.uint16), lb.view(np.uint16)) and np.array_equal(ta, tb) and ma == _read(b)[2]
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]


def test_compare_logits_reproduces_the_live_run_exactly(saved_pair):
    d, a, b, c, res, noisy = saved_pair
    for live, yours in ((res, b), (noisy, c)):
        r = cli("compare", "logits", str(a), str(yours), "--json")
        assert r.code == 0, r.err
        row = strict_json(r.out)["rows"][0]
        want = strict_json(_json_of(live.rows[0]))
        want.pop("noise_kld_expected", None)
        assert want.pop("dtype") == row.pop("dtype") and row.pop("side") == "YOURS" and row.pop("file") == str(yours)
        # both sides count non-finite logits (--metrics since its overflow gate, compare logits since its own)
        assert row["nonfinite_positions"] == 0 and row["nonfinite_entries"] == 0
        assert row["first_nonfinite_positions"] == []
        # compare logits' own fields (a -inf's mass removed, the two-way verdict) are not compare metrics'
        assert row.pop("mass_removed_positions") == 0 and row.pop("mass_removed_entries") == 0
        for k in ("first_mass_removed_positions", "verdict", "verdict_text", "verdict_bound", "verdict_note"):
            row.pop(k, None)
        assert row == want  # one name per quantity: REF's fields by its role in both commands
    assert _read(c)[0].dtype == np.float64  # the noisy run is saved as what was compared


def _json_of(obj):
    import json

    from precisionlab.report.jsondoc import jsonable

    return json.dumps(jsonable(obj), allow_nan=False)


def test_gates_exit_1_when_worse(saved_pair):
    _, a, b, _, res, _ = saved_pair
    assert cli("compare", "logits", str(a), str(b), "--max-kld", "0", "--min-top1", "0").code == 1
    ok = cli("compare", "logits", str(a), str(b), "--max-kld", repr(res.rows[0]["kld_mean"]),
             "--min-top1", repr(res.rows[0]["top1_agree_pct"]))
    assert ok.code == 0, ok.err
    bad = cli("compare", "logits", str(a), str(b), "--min-top1", "100")
    assert bad.code == 1 and "top-1 agreement" in bad.err


def test_inf_and_nan_in_a_file_are_reported(tmp_path):
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((6, 10)).astype(np.float32)
    low = ref.copy()
    low[1, (np.argmax(ref[1]) + 1) % 10] = -np.inf  # not the argmax: top-1 still agrees there
    low[3, 0] = np.nan
    tok = np.arange(6, dtype=np.int64)
    save_file({"logits": ref, "tokens": tok}, str(tmp_path / "r.st"))
    save_file({"logits": low, "tokens": tok}, str(tmp_path / "y.st"))
    r = cli("compare", "logits", str(tmp_path / "r.st"), str(tmp_path / "y.st"), "--json", "--max-kld", "1")
    assert r.code == 1  # a NaN mean KLD is not <= 1
    row = strict_json(r.out)["rows"][0]
    assert row["kld_inf_positions"] == 1 and row["undefined_positions"] == 1 and row["kld_mean"] == "nan"
    assert row["top1_agree"] == 5


def test_hugging_face_model_runs_metrics(tmp_path):
    pytest.importorskip("transformers")
    save_tiny_qwen(tmp_path / "m")
    text = tmp_path / "t.txt"
    text.write_text(" ".join(np.random.default_rng(0).choice(TINY_WORDS[1:], 400)))
    r = cli("compare", "metrics", "--model", str(tmp_path / "m"), "--text", str(text), "--tokens", "300",
            "--dtypes", "fp32,bf16", "--json")
    assert r.code == 0, r.err
    d = strict_json(r.out)
    by = {x["dtype"]: x for x in d["rows"]}
    assert by["fp32"]["kld_max"] == 0.0 and by["bf16"]["kld_mean"] > 0 and d["params"]["window"] == 64


# ---------------------------------------------------------------------------
# bad input: one line, exit 2, before anything runs


def _file(tmp_path, name, **tensors):
    save_file(tensors, str(tmp_path / name))
    return str(tmp_path / name)


def test_compare_logits_usage_errors(tmp_path):
    x = np.zeros((4, 5), np.float32)
    ref = _file(tmp_path, "ref.st", logits=x, tokens=np.array([1, 2, 3, 4]))
    cases = {
        "differ first at position 2": _file(tmp_path, "t.st", logits=x, tokens=np.array([1, 2, 0, 4])),
        "vocabulary sizes differ": _file(tmp_path, "v.st", logits=np.zeros((4, 6), np.float32), tokens=np.array([1, 2, 3, 4])),
        "differ first at position 3": _file(tmp_path, "n.st", logits=x[:3], tokens=np.array([1, 2, 3])),
        "no 'tokens'": _file(tmp_path, "m.st", logits=x),
        "must be 2-D": _file(tmp_path, "d.st", logits=np.zeros(4, np.float32), tokens=np.array([1, 2, 3, 4])),
        "outside the vocabulary": _file(tmp_path, "o.st", logits=x, tokens=np.array([1, 2, 3, 5])),
        "1-D integer": _file(tmp_path, "f.st", logits=x, tokens=np.array([1.0, 2, 3, 4])),
        "not a readable safetensors": str(tmp_path / "junk.st"),
        "no such file": str(tmp_path / "missing.st"),
    }
    (tmp_path / "junk.st").write_bytes(b"\xff" * 40)
    for needle, path in cases.items():
        r = cli("compare", "logits", ref, path)
        assert r.code == 2 and needle in r.err and len(r.err.strip().splitlines()) == 1, (needle, r.err)
    for extra in (["--max-kld", "-1"], ["--min-top1", "101"], ["--max-kld", "nan"], ["--plot", str(tmp_path / "no/x.png")]):
        r = cli("compare", "logits", ref, ref, *extra)
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1, (extra, r.err)


@pytest.mark.parametrize("args,needle", [
    (["--tokens", "0"], "--tokens must be > 0"),
    (["--tokens", "100000000"], "needs"),
    (["--dtypes", "fp8"], "--dtypes: unknown format"),
    (["--inject", "logits:scale=2"], "not applied here"),
    (["--inject", "layers.0:noise=0.1"], "target 'logits' only"),
    (["--inject", "logits:noise=-1"], "out of range"),
    (["--save-logits", "/nonexistent-dir/x.st"], "does not exist"),
    (["--save-logits", "fp16=x.st"], "not among --dtypes"),
    (["--plot", "/nonexistent-dir/x.png"], "does not exist"),
    (["--max-kld", "-0.5"], "--max-kld"),
    (["--seed", "-1"], "--seed"),
])
def test_compare_model_metrics_usage_errors(args, needle):
    r = cli("compare", "metrics", "--dtypes", "bf16", *args)
    assert r.code == 2 and needle in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_metrics_options_need_metrics(tmp_path):
    r = cli("compare", "model", "--tokens", "10")
    assert r.code == 2 and "No such option: --tokens" in r.err
    bad = tmp_path / "t.txt"
    bad.write_text("héllo wörld ✓" * 100)
    r = cli("compare", "metrics", "--text", str(bad), "--tokens", "50")
    assert r.code == 2 and "does not know" in r.err
    bad.write_bytes(b"\xff\xfe" * 100)
    r = cli("compare", "metrics", "--text", str(bad), "--tokens", "50")
    assert r.code == 2 and "not UTF-8" in r.err


def test_compare_logits_needs_no_torch(tmp_path):
    from helpers import cli_in_process

    x = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    a = _file(tmp_path, "a.st", logits=x, tokens=np.arange(8) % 5)
    b = _file(tmp_path, "b.st", logits=x + np.float32(0.01), tokens=np.arange(8) % 5)
    p = cli_in_process("compare", "logits", str(a), str(b), "--json")
    assert "TORCH=False" in p.stderr and '"kld_mean"' in p.stdout
