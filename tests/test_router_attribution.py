"""compare routing: a log-prob mismatch built half from routing flips and half
from noise is split within 10 % of that truth; hostile traces are refused."""

import base64
import json

import numpy as np
import pytest
from helpers import cli, json_glossary_problems, one_line, strict_json

T, LAYERS, K, EXPERTS = 20000, 6, 4, 32
FLIP_SHARE = 0.1
SIGMA_NOISE = 0.01


def _traces(rng, flipped):
    """A's ids, and B's: equal, but for each flipped token one expert changed in one random layer."""
    a = np.stack([np.stack([rng.choice(EXPERTS, K, replace=False) for _ in range(LAYERS)]) for _ in range(T)])
    b = a.copy()
    for t in np.flatnonzero(flipped):
        layer = rng.integers(LAYERS)
        unused = np.setdiff1d(np.arange(EXPERTS), a[t, layer])
        b[t, layer, rng.integers(K)] = rng.choice(unused)
    return a, b


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Noise n ~ N(0, s^2) on every token, a routing term r ~ N(0, (s / f)^2) on the share f of flipped
    tokens: E sum |r| = E sum |n|, so half of the mismatch is routing by construction."""
    tmp = tmp_path_factory.mktemp("routing")
    rng = np.random.default_rng(3)
    flipped = rng.random(T) < FLIP_SHARE
    lp_a = -rng.exponential(1.0, T)
    noise = rng.normal(0, SIGMA_NOISE, T)
    routing = np.where(flipped, rng.normal(0, SIGMA_NOISE / FLIP_SHARE, T), 0.0)
    lp_b = lp_a + noise + routing
    ids = rng.integers(0, 1000, T)
    np.savez(tmp / "a.npz", token_ids=ids, logprobs=lp_a)
    np.savez(tmp / "b.npz", token_ids=ids, logprobs=lp_b)
    ta, tb = _traces(rng, flipped)
    np.save(tmp / "ta.npy", ta)
    np.save(tmp / "tb.npy", tb)
    truth = np.abs(routing).sum() / (np.abs(routing).sum() + np.abs(noise).sum())
    return tmp, flipped, truth


def _run(tmp, *extra, a="ta.npy", b="tb.npy"):
    return cli("compare", "routing", str(tmp / "a.npz"), str(tmp / "b.npz"), "--a-experts", str(tmp / a),
               "--b-experts", str(tmp / b), "--experts", str(EXPERTS), *extra)


def test_half_routing_half_noise_is_split_within_10_percent(built):
    tmp, flipped, truth = built
    assert abs(truth - 0.5) < 0.02  # the construction holds in the sample
    r = _run(tmp, "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert json_glossary_problems(doc) == []
    flip = doc["rows"][0]
    assert flip["tokens"] == int(flipped.sum())
    for key in ("abs_diff_share", "excess_abs_diff_share"):
        assert abs(flip[key] - truth) <= 0.1 * truth, (key, flip[key], truth)
    # a flip is in one layer, chosen uniformly: each layer's rate near f / LAYERS (4 binomial standard errors)
    for row in doc["layers"]:
        p = FLIP_SHARE / LAYERS
        assert abs(row["flip_share"] - p) <= 4 * np.sqrt(p * (1 - p) / T)


def test_sglang_base64_traces_read_as_the_npy(built):
    tmp, flipped, _ = built
    for side in ("ta", "tb"):
        arr = np.load(tmp / f"{side}.npy").astype("<i4")
        half = T // 2  # two sequences, as two responses
        with open(tmp / f"{side}.jsonl", "w") as f:
            for part in (arr[:half], arr[half:]):
                f.write(json.dumps({"meta_info": {"routed_experts": base64.b64encode(part.tobytes()).decode()}}) + "\n")
    one_line(_run(tmp, a="ta.jsonl", b="tb.jsonl"), 2, "--moe-shape")
    r = _run(tmp, "--moe-shape", f"{LAYERS}:{K}", "--json", a="ta.jsonl", b="tb.jsonl")
    assert r.code == 0, r.err
    assert strict_json(r.out)["rows"][0]["tokens"] == int(flipped.sum())


def test_hostile_traces_are_refused_in_one_line(built):
    tmp = built[0]
    np.save(tmp / "empty.npy", np.zeros((0, LAYERS, K), dtype=np.int64))
    one_line(_run(tmp, a="empty.npy"), 2, "empty")
    bad = np.load(tmp / "ta.npy")
    bad[5, 2, 1] = EXPERTS
    np.save(tmp / "range.npy", bad)
    one_line(_run(tmp, a="range.npy"), 2, "out of range", "token 5")
    np.save(tmp / "short.npy", np.load(tmp / "ta.npy")[:-1])
    one_line(_run(tmp, a="short.npy"), 2, "tokens")
    with open(tmp / "ragged.jsonl", "w") as f:
        f.write(json.dumps({"routed_experts": [[[0, 1], [2, 3]], [[0, 1], [2]]]}) + "\n")
    one_line(_run(tmp, a="ragged.jsonl"), 2, "ragged")
    with open(tmp / "ragged2.jsonl", "w") as f:
        f.write(json.dumps({"routed_experts": [[[0, 1], [2, 3]]]}) + "\n")
        f.write(json.dumps({"routed_experts": [[[0, 1, 2], [2, 3, 4]]]}) + "\n")
    one_line(_run(tmp, a="ragged2.jsonl"), 2, "ragged")
    one_line(_run(tmp, "--moe-shape", "0:4"), 2, "--moe-shape")


def test_vllm_nested_lists_read_as_the_npy_and_minus_one_is_no_expert(built):
    tmp, flipped, _ = built
    for side in ("ta", "tb"):
        arr = np.load(tmp / f"{side}.npy")
        arr[:, -1, :] = -1  # SGLang's placeholder: a layer without routed experts, on both sides
        np.save(tmp / f"{side}-1.npy", arr)
        with open(tmp / f"{side}.nested.jsonl", "w") as f:
            for part in (arr[:7], arr[7:]):  # two completions, vLLM's [tokens, layers, top_k] each
                f.write(json.dumps({"routed_experts": part.tolist()}) + "\n")
    npy = _run(tmp, "--json", a="ta-1.npy", b="tb-1.npy")
    nested = _run(tmp, "--json", a="ta.nested.jsonl", b="tb.nested.jsonl")
    assert npy.code == 0 and nested.code == 0, (npy.err, nested.err)
    a, b = strict_json(npy.out), strict_json(nested.out)
    assert a["rows"] == b["rows"] and a["layers"] == b["layers"]
    assert a["layers"][-1]["flip_share"] == 0.0  # the placeholder layer agrees on both sides
    assert a["rows"][0]["tokens"] < int(flipped.sum())  # the flips planted in the last layer are gone
