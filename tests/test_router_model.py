"""router --inputs hf:DIR on a tiny Qwen3-MoE built here: the per-layer bf16
flip rates equal an independent numpy recomputation exactly, flips concentrate
at small margins, and the any-layer share is judged against the independence
prediction with a band fixed before the run."""

import math

import ml_dtypes
import numpy as np
import pytest
from helpers import cli, save_tiny_qwen3_moe, strict_json

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TOKENS, SEQ, LAYERS, EXPERTS, TOP_K, HIDDEN = 2048, 64, 3, 16, 4, 32


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    from transformers import Qwen3MoeForCausalLM

    folder = save_tiny_qwen3_moe(tmp_path_factory.mktemp("tiny-qwen3-moe"), LAYERS, EXPERTS, TOP_K, HIDDEN)
    return folder, Qwen3MoeForCausalLM.from_pretrained(folder).float().eval()


def _router_inputs(model, seed):
    """Each router's input, captured here by hooks of our own, for the token ids the command documents:
    torch.randint(0, vocab, (ceil(T / 64), 64)) from torch.Generator().manual_seed(seed), through the decoder."""
    seen = {i: [] for i in range(LAYERS)}
    hooks = [model.model.layers[i].mlp.gate.register_forward_pre_hook(
        lambda m, a, i=i: seen[i].append(a[0].reshape(-1, HIDDEN).double())) for i in range(LAYERS)]
    ids = torch.randint(0, model.config.vocab_size, (-(-TOKENS // SEQ), SEQ), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for i in range(0, ids.shape[0], 16):
            model.model(input_ids=ids[i:i + 16], use_cache=False)
    for h in hooks:
        h.remove()
    return [torch.cat(seen[i])[:TOKENS].numpy() for i in range(LAYERS)]


def _exact_logits(h, w):
    """(T, E) sums of exact products, each sum correctly rounded by math.fsum."""
    return np.array([[math.fsum(h[t] * w[e]) for e in range(w.shape[0])] for t in range(h.shape[0])])


def _topk_sets(logits):
    return np.sort(np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K], axis=1)


def test_bf16_flip_rates_equal_an_independent_recomputation(tiny_moe):
    folder, model = tiny_moe
    r = cli("router", "--inputs", f"hf:{folder}", "--tokens", str(TOKENS), "--gate-dtypes", "bf16",
            "--logit-dtypes", "bf16", "--accumulator", "exact", "--seed", "5", "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert doc["params"]["model"]["moe_layers"] == LAYERS and doc["params"]["top_k"] == TOP_K
    hidden = _router_inputs(model, 5)
    want = []
    for layer in range(LAYERS):
        w = model.model.layers[layer].mlp.gate.weight.detach().double().numpy()
        ref = _topk_sets(_exact_logits(hidden[layer], w))  # softmax is monotone: the top-k of the logits
        bf = lambda a: a.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)  # fp32 values: one rounding
        low32 = _exact_logits(bf(hidden[layer]), bf(w)).astype(np.float32)  # bf16 products are exact in float64
        low = low32.astype(ml_dtypes.bfloat16).astype(np.float64)
        want.append(float(np.mean(np.any(ref != _topk_sets(low), axis=1))))
    got = [r["flip_share"] for r in doc["rows"] if r["layer"] != "all"]
    assert got == want
    assert all(0 < p < 0.5 for p in want)
    shares = [b["flip_share"] for b in doc["buckets"] if b["tokens"]]
    assert shares[0] > 0 and all(x >= y for x, y in zip(shares, shares[1:], strict=False)), shares
    s = [r for r in doc["rows"] if r["layer"] == "all"][0]
    p = 1 - np.prod([1 - q for q in want])
    band = 4 * math.sqrt(p * (1 - p) / TOKENS)  # fixed before the run: 4 binomial standard errors
    assert s["independence_prediction"] == pytest.approx(p, rel=1e-12)
    assert s["correlated"] == (abs(s["any_layer_flip_share"] - p) > band)
    assert s["correlated"] == any("correlated" in t for t in doc["takeaways"])


def test_a_model_that_cannot_fit_is_refused_before_it_loads(tiny_moe, tmp_path):
    """router --inputs hf:DIR goes through the model start-up: the memory estimate from the config before a
    weight is read (a folder whose weights are unreadable still gets the memory refusal), and refusals name
    router's own options, never --model or --steps, which it does not have."""
    folder = tmp_path / "moe"
    folder.mkdir()
    (folder / "config.json").write_bytes((tiny_moe[0] / "config.json").read_bytes())
    (folder / "model.safetensors").write_bytes(b"not weights")  # read only if the estimate let it through
    r = cli("router", "--inputs", f"hf:{folder}", "--tokens", "100000000")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "router --inputs" in r.err and "--tokens 100000000" in r.err and "GiB of memory" in r.err
    for args in ((f"hf:{tmp_path / 'none'}",), (f"hf:{folder}", "--tokens", "100000000")):
        r = cli("router", "--inputs", *args)
        assert "--model" not in r.err and "--steps" not in r.err, r.err
