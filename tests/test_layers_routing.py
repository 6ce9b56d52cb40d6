"""compare layers' routing section (issue 42, bullet 3) on a tiny Qwen3-MoE
built here: the per-layer bf16 flip rates equal an independent numpy
recomputation from router logits captured by hooks of our own, exactly, and
so do the flips that persist in fp64; a gate planted in YOURS is found at its
layer by compare layers --reference, its flips persisting in fp64; a dense
model shows no routing section."""

import numpy as np
import pytest
from helpers import cli, save_tiny_qwen3_moe, strict_json

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

LAYERS, EXPERTS, TOP_K, HIDDEN = 3, 16, 4, 32
PROMPT = " ".join(f"w{(7 * i) % 63}" for i in range(40))
STEPS = 80  # 40 prompt tokens + 80 - 1 teacher-forced: 119 tokens a run


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return save_tiny_qwen3_moe(tmp_path_factory.mktemp("moe"), LAYERS, EXPERTS, TOP_K, HIDDEN)


def _topk_sets(logits):
    """Each row's top-k expert set: softmax is monotone, so the k largest logits (ties to the lower index)."""
    return np.sort(np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K], axis=1)


def _layers_watching(folder, router: str, take):
    """compare layers (bf16) on hf:folder, with a hook of the test's own on every module of class `router`:
    (the result, take(module, args, out) of each of its calls, in call order)."""
    from torch.nn.modules.module import register_module_forward_hook

    from precisionlab.experiments import layers as lexp

    seen = []

    def hook(m, args, out):
        if type(m).__name__ == router:
            seen.append(take(m, args, out))

    handle = register_module_forward_hook(hook)
    try:
        return lexp.run(lexp.LayersConfig(model=f"hf:{folder}", steps=STEPS, prompt=PROMPT, dtypes="bf16")), seen
    finally:
        handle.remove()


def test_bf16_flip_rates_equal_an_independent_recomputation(moe):
    # every router call in the run: (dtype, input, logits), in call order
    res, seen = _layers_watching(moe, "Qwen3MoeTopKRouter", lambda m, args, out: (
        out[0].dtype, args[0].detach().double().numpy(), out[0].detach().double().numpy()))
    t = res.params["tokens"]
    # the first full-length call of each router in each dtype is the captured run's (later bf16 ones re-run a
    # module for its local error; the greedy decode's calls are shorter)
    first = {d: [(h, lg) for dt, h, lg in seen if dt == d and lg.shape[0] == t][:LAYERS]
             for d in (torch.float32, torch.bfloat16)}
    rows = res.routing
    assert [r["layer"] for r in rows] == list(range(LAYERS)) and {r["dtype"] for r in rows} == {"bf16"}
    from transformers import Qwen3MoeForCausalLM

    ref = Qwen3MoeForCausalLM.from_pretrained(moe).double()
    for layer, row in enumerate(rows):
        (h32, l32), (h16, l16) = first[torch.float32][layer], first[torch.bfloat16][layer]
        flipped = np.any(_topk_sets(l32) != _topk_sets(l16), axis=1)
        assert row["flip_share"] == float(np.mean(flipped)) and row["flips"] == int(flipped.sum())
        w = ref.model.layers[layer].mlp.gate.weight.detach().numpy()  # the fp32 weights, exactly, in float64
        persists = flipped & np.any(_topk_sets(h32 @ w.T) != _topk_sets(h16 @ w.T), axis=1)
        assert row["flips_persisting_fp64"] == int(persists.sum())
        assert row["flips_router_differs"] == 0  # one model: the same router on both sides
    assert sum(r["flips"] for r in rows) > 0  # the check above compared something
    assert res.params["routing"]["moe_layers"] == LAYERS and res.params["routing"]["top_k"] == TOP_K


def test_cli_shows_the_routing_section_and_documented_json(moe):
    r = cli("compare", "layers", "--model", f"hf:{moe}", "--steps", "20", "--prompt", PROMPT, "--dtypes", "bf16")
    assert r.code == 0, r.err
    assert "routing: bf16 vs fp32 at each MoE router" in r.out and "model.layers.2.mlp.gate" in r.out
    r = cli("compare", "layers", "--model", f"hf:{moe}", "--steps", "20", "--prompt", PROMPT, "--dtypes", "bf16",
            "--json")
    doc = strict_json(r.out)
    assert len(doc["routing"]) == LAYERS
    docs = (__import__("pathlib").Path(__file__).parents[1] / "docs" / "json.md").read_text()
    for field in doc["routing"][0]:
        assert f"`{field}`" in docs, field


def _swap_experts(layer: int):
    def edit(model):
        with torch.no_grad():  # the router's rows for experts 0 and 1 exchanged: a wrong gate, not rounding
            w = model.model.layers[layer].mlp.gate.weight
            w[[0, 1]] = w[[1, 0]].clone()
    return edit


def test_a_planted_gate_in_yours_is_found_at_its_layer_and_persists_in_fp64(moe, tmp_path):
    yours = save_tiny_qwen3_moe(tmp_path / "yours", LAYERS, EXPERTS, TOP_K, HIDDEN, edit=_swap_experts(1))
    r = cli("compare", "engine-layers", "--engine", f"hf:{yours}", "--reference", f"hf:{moe}", "--steps", "20",
            "--prompt", PROMPT, "--dtypes", "bf16", "--json")
    doc = strict_json(r.out)
    fp32 = {row["layer"]: row for row in doc["routing"] if row["view"] == "fp32"}
    assert fp32[0]["flips"] == 0  # upstream of the planted gate both models route alike
    assert fp32[1]["flips"] > 0 and fp32[1]["flips_persisting_fp64"] == fp32[1]["flips"]
    assert fp32[1]["flips_router_differs"] == fp32[1]["flips"]  # its input is REF's: the router itself differs
    assert fp32[1]["verdict"] == "persists in fp64: the routers differ"
    assert all(row["flips_router_differs"] == 0 for row in doc["routing"] if row["layer"] != 1)
    yard = [row for row in doc["routing"] if row["view"] == "yardstick"]
    assert [row["layer"] for row in yard] == list(range(LAYERS)) and {row["dtype"] for row in yard} == {"bf16"}


def test_a_dense_model_shows_no_routing_section():
    r = cli("compare", "layers", "--steps", "4", "--dtypes", "bf16")
    assert r.code == 0, r.err
    assert "routing" not in r.out  # the embedded model's SwiGLU `mlp.gate` is no router
    r = cli("compare", "layers", "--steps", "4", "--dtypes", "bf16", "--json")
    doc = strict_json(r.out)
    assert doc["routing"] == [] and doc["params"]["routing"] is None


def test_routing_is_exposed_where_the_modules_are():
    """A torch model's routers can be hooked; an engine's graph (llama.cpp, ONNX, CTranslate2, an endpoint)
    exposes no routing, so compare layers notes it instead of comparing."""
    from precisionlab.engines import registry

    declared = {"embedded": True, "hf": True, "llamacpp": False, "ct2": False, "onnx": False, "openai": False}
    assert {p: registry.engine_class(p).exposes_routing for p in declared} == declared


def test_deepseek_bias_rounded_in_bf16_flips_routes_and_vanishes_in_fp64(tmp_path):
    """A DeepSeek-V3-style router (sigmoid, 4 groups keep 2, a correction bias in GLM's range [6.817, 7.063],
    where bf16's spacing is 1/32): the bf16 copy holds the bias rounded, so tokens change their top-k; those
    flips are the router's rounding (they vanish in fp64), and compare layers' flips are those transformers'
    own routers make, to within one token a layer (fp32 sigmoid's last bit at a near-tie; fixed beforehand)."""
    import transformers as tf


    folder = save_tiny_qwen3_moe(tmp_path / "tok", 1)  # for its tokenizer files
    torch.manual_seed(0)
    model = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=128, num_experts_per_tok=4, num_key_value_heads=4, moe_intermediate_size=16,
        n_routed_experts=16, n_group=4, topk_group=2, first_k_dense_replace=0, q_lora_rank=None, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_shared_experts=1))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.linspace(6.817, 7.063, 16)[torch.randperm(16)])
    model.save_pretrained(folder)
    res, seen = _layers_watching(folder, "DeepseekV3TopkRouter", lambda m, args, out: (
        m.weight.dtype, out[-1].numpy().copy()))
    t = res.params["tokens"]
    first = {d: [ids for dt, ids in seen if dt == d and ids.shape[0] == t][:2] for d in (torch.float32, torch.bfloat16)}
    assert res.params["routing"]["n_group"] == 4 and res.params["routing"]["scoring"] == "sigmoid"
    for layer, row in enumerate(res.routing):
        a, b = (np.sort(first[d][layer], axis=1) for d in (torch.float32, torch.bfloat16))
        theirs = int(np.any(a != b, axis=1).sum())
        assert abs(row["flips"] - theirs) <= 1, (layer, row["flips"], theirs)
    row0 = res.routing[0]
    assert row0["flips"] > 0 and row0["flips_persisting_fp64"] < row0["flips"]
