"""router: flips under each precision path, checked against independent numpy
recomputations (ml_dtypes rounding, float64 top-k), the GLM bias case, and
your --impl against the adversarial cases."""

import ml_dtypes
import numpy as np
import pytest
from helpers import cli, json_glossary_problems, one_line, strict_json

GLM_LO, GLM_HI = 6.817, 7.063


def _doc(*args, code=0):
    r = cli("router", *args, "--json")
    assert r.code == code, r.err
    return strict_json(r.out)


def _summary(doc, **match):
    return [r for r in doc["rows"] if r["layer"] == "all" and all(r[k] == v for k, v in match.items())]


def test_glm_biases_collapse_to_at_most_9_bf16_values():
    # 238 fp32 biases evenly spread over GLM-5.2's range; bf16's spacing there is 2^-5 = 0.03125,
    # so a range of 0.246 holds at most 9 of its values
    b32 = np.linspace(GLM_LO, GLM_HI, 238).astype(np.float32)
    assert np.unique(b32).size == 238
    n_bf16 = np.unique(b32.astype(ml_dtypes.bfloat16)).size
    assert n_bf16 <= 9
    doc = _doc("--inputs", "logits", "--scoring", "sigmoid", "--bias", "glm", "--experts", "238",
               "--bias-dtypes", "fp32,bf16", "--logit-dtypes", "fp32", "--layers", "1", "--tokens", "2048")
    assert doc["params"]["bias_distinct_values"] == {"bf16": n_bf16, "fp32": 238}
    bf16 = _summary(doc, bias_dtype="bf16")[0]
    fp32 = _summary(doc, bias_dtype="fp32")[0]
    # the bf16 bias sends a large share of tokens to another top-8 set; the fp32 bias none
    assert bf16["flip_share"] > 0.2
    assert fp32["flip_share"] == 0.0
    layer = [r for r in doc["rows"] if r["layer"] == 0 and r["bias_dtype"] == "bf16"][0]
    assert layer["verdict"].startswith("vanishes in fp64") and layer["median_flip_margin_ulps"] < 1


def test_flip_rates_on_a_dump_equal_an_independent_bf16_recomputation(tmp_path):
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((3, 1000, 64)).astype(np.float32)
    path = tmp_path / "logits.npy"
    np.save(path, logits)
    doc = _doc("--inputs", str(path), "--logit-dtypes", "bf16", "--top-k", "8")
    # independent: softmax is monotone, so the top-8 set is the 8 largest logits (exact ties: the lowest
    # index, a stable sort); bf16 by ml_dtypes from fp32 (one rounding), against the fp32 values themselves
    low = logits.astype(ml_dtypes.bfloat16).astype(np.float64)
    ref = logits.astype(np.float64)
    for layer in range(3):
        a = np.sort(np.argsort(-ref[layer], axis=1, kind="stable")[:, :8], axis=1)
        b = np.sort(np.argsort(-low[layer], axis=1, kind="stable")[:, :8], axis=1)
        want = np.mean(np.any(a != b, axis=1))
        row = [r for r in doc["rows"] if r["layer"] == layer][0]
        assert row["flip_share"] == want, layer
        assert want > 0
    # flips concentrate at small margins: the flip share never rises with the margin bucket
    shares = [b["flip_share"] for b in doc["buckets"] if b["tokens"]]
    assert shares[0] > 0 and all(x >= y for x, y in zip(shares, shares[1:], strict=False))


def test_any_layer_share_beside_the_independence_prediction():
    doc = _doc("--tokens", "2048", "--layers", "4", "--experts", "64", "--gate-dtypes", "bf16", "--logit-dtypes",
               "bf16")
    s = _summary(doc)[0]
    per_layer = [r["flip_share"] for r in doc["rows"] if r["layer"] != "all"]
    assert s["independence_prediction"] == pytest.approx(1 - np.prod([1 - p for p in per_layer]), rel=1e-12)
    # independent draws per layer: band chosen before running, 4 binomial standard errors of the prediction
    p = s["independence_prediction"]
    assert abs(s["any_layer_flip_share"] - p) <= 4 * np.sqrt(p * (1 - p) / 2048)
    assert all(r["verdict"] == "vanishes in fp64: rounding" for r in doc["rows"] if r["layer"] != "all")


def test_fp32_path_alone_has_no_flips_and_the_json_follows_the_glossary():
    doc = _doc("--tokens", "512", "--layers", "2", "--experts", "32", "--gate-dtypes", "fp32", "--logit-dtypes",
               "fp32")
    assert json_glossary_problems(doc) == []
    assert all(r["flip_share"] == 0 for r in doc["rows"])


def test_planted_all_negative_router_is_flagged_persisting_in_fp64():
    doc = _doc("--impl", "tests.impls.router_kernels:fused_max_from_zero", "--experts", "64", code=1)
    rows = {r["case"]: r for r in doc["rows"]}
    assert not rows["all_negative"]["passed"]
    assert rows["all_negative"]["verdict"] == "persists in fp64: algorithmic"
    assert "expected experts" in rows["all_negative"]["first_difference"]
    assert rows["random"]["passed"]


@pytest.mark.parametrize("extra", [[], ["--scoring", "sigmoid", "--bias", "0:0.5", "--groups", "8:4"]])
def test_a_correct_router_passes_every_case(extra):
    doc = _doc("--impl", "tests.impls.router_kernels:correct", "--experts", "64", "--threshold", "100", *extra)
    names = [r["case"] for r in doc["rows"]]
    assert {"all_negative", "exact_ties", "near_ties", "threshold_below", "threshold_above"} <= set(names)
    assert ("equal_group_maxima" in names) == bool(extra) and ("dominating_bias" in names) == bool(extra)
    assert all(r["passed"] for r in doc["rows"]), [(r["case"], r["first_difference"]) for r in doc["rows"]]


def test_weights_from_the_biased_scores_are_caught():
    doc = _doc("--impl", "tests.impls.router_kernels:weights_with_bias", "--experts", "64", "--scoring",
               "sigmoid", "--bias", "0:0.5", code=1)
    rows = {r["case"]: r for r in doc["rows"]}
    assert rows["dominating_bias"]["verdict"] == "persists in fp64: algorithmic"
    assert rows["dominating_bias"]["flips"] == 0  # the right experts, the wrong weights


def test_hostile_inputs_are_refused_in_one_line(tmp_path):
    nan = tmp_path / "nan.npy"
    x = np.zeros((4, 16))
    x[2, 5] = np.nan
    np.save(nan, x)
    one_line(cli("router", "--inputs", str(nan)), 2, "non-finite router logit", "token 2")
    empty = tmp_path / "empty.npy"
    np.save(empty, np.zeros((0, 16)))
    one_line(cli("router", "--inputs", str(empty)), 2, "empty")
    one_line(cli("router", "--groups", "3:1", "--experts", "64"), 2, "--groups")
    one_line(cli("router", "--top-k", "64", "--experts", "64"), 2, "--top-k")
    one_line(cli("router", "--threshold", "10"), 2, "--impl")
    one_line(cli("router", "--gate-dtypes", "fp8"), 2, "--gate-dtypes")
    one_line(cli("router", "--bias", "7:6"), 2, "--bias")
    one_line(cli("router", "--bias-dtypes", "bf16"), 2, "--bias")


def test_agreement_between_two_runs_of_a_router():
    from precisionlab.numerics import routing

    ids_a = np.array([[0, 1], [2, 3], [4, 5], [6, 7]])
    ids_b = np.array([[1, 0], [2, 3], [4, 6], [6, 7]])  # token 0: other order; token 2: another expert
    w_a = np.array([[0.75, 0.25], [0.5, 0.5], [0.5, 0.5], [0.875, 0.125]])
    w_b = np.array([[0.25, 0.75], [0.5, 0.5], [0.5, 0.5], [0.75, 0.25]])
    got = routing.agreement(ids_a, w_a, ids_b, w_b, 8)
    assert got["topk_agreement"] == 0.75 and got["order_only_share"] == 0.25
    # |Δw| per token by hand: 0, 0, 0.5 + 0.5 (expert 5 out, 6 in), 0.125 + 0.125
    assert got["weight_l1_mean"] == (0 + 0 + 1.0 + 0.25) / 4 and got["weight_l1_max"] == 1.0


def test_plot_of_flips_by_margin(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "flips.png"
    r = cli("router", "--tokens", "512", "--layers", "1", "--experts", "32", "--hidden", "64", "--plot", str(out))
    assert r.code == 0, r.err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("fn,words", [("raises", "ValueError: router exploded"), ("exits", "sys.exit(3)"),
                                      ("wrong_shape", "expected (256, 8)")])
def test_a_broken_kernel_fails_its_cases_and_exits_1(fn, words):
    doc = _doc("--impl", f"tests.impls.router_kernels:{fn}", "--experts", "64", code=1)
    assert all(r["verdict"] == "error" and words in r["first_difference"] for r in doc["rows"])


def test_a_margin_distribution_as_the_input():
    """--inputs margins: each token's top-k margin is an exponential draw of the mean asked for (the sample
    mean of 4096 draws within 5 %, three standard errors; fp32 storage moves a margin by ulps of ~1e-7), the
    top-k order kept; and the flip rate follows the margin: bf16 logits (spacing 2^-7 to 2^-6 at these
    logits) flip most tokens at a mean margin of 1e-3 and few at 1."""
    from precisionlab.experiments.router import with_margins

    for mean in (1e-3, 0.05, 1.0):
        x = with_margins(np.random.default_rng(7), 4096, 64, 8, 1.0, mean)
        s = -np.sort(-x, axis=1)
        m = s[:, 7] - s[:, 8]
        assert abs(m.mean() / mean - 1) < 0.05 and (m > 0).all(), (mean, m.mean())

    def share(mean):
        r = cli("router", "--inputs", "margins", "--scales", f"1,{mean}", "--experts", "64", "--layers", "1",
                "--tokens", "2048", "--gate-dtypes", "fp32", "--logit-dtypes", "bf16", "--json")
        assert r.code == 0, r.err
        d = strict_json(r.out)
        assert d["params"]["source"] == "synthetic margins"
        return d["rows"][0]["flip_share"]
    assert share(1e-3) > 0.2 and share(1.0) < 0.05
