"""The emulated router (numerics/routing.py, with the algorithm router_model
reads from a config) chooses what transformers' own routers choose, on tiny
Qwen3-MoE, Mixtral and DeepSeek-V3 models built here; and router --inputs
hf:DIR runs on each."""

import numpy as np
import pytest
from helpers import cli, strict_json

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TOKENS = 1024
AGREE = 0.99  # chosen before running: the fp32 paths differ only in the GEMM's summation order


def _build(kind: str, folder):
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]"] + [f"w{i}" for i in range(63)]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    common = dict(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=128, num_experts_per_tok=4)
    torch.manual_seed(0)
    if kind == "qwen3_moe":
        model = tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**common, num_key_value_heads=2, head_dim=8, num_experts=16,
                                                         moe_intermediate_size=16, norm_topk_prob=True))
    elif kind == "mixtral":
        model = tf.MixtralForCausalLM(tf.MixtralConfig(**common, num_key_value_heads=2, head_dim=8,
                                                       num_local_experts=16))
    else:
        model = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
            **common, num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=16, n_group=4, topk_group=2,
            first_k_dense_replace=0, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=8, n_shared_experts=1))
        with torch.no_grad():  # a trained model's bias is not zero: one that moves choices
            for layer in model.model.layers:
                layer.mlp.gate.e_score_correction_bias.copy_(torch.rand(16) * 0.2)
    model.save_pretrained(folder)
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return model.float().eval()


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral", "deepseek_v3"])
def arch(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, _build(request.param, folder)


def test_the_emulation_chooses_what_transformers_chooses(arch):
    from precisionlab.experiments import router_model
    from precisionlab.numerics import routing

    kind, _, model = arch
    alg = router_model.algorithm(model.config)
    seen = []
    gates = [l.mlp.gate for l in model.model.layers]
    hooks = [g.register_forward_hook(lambda m, a, out: seen.append((m, a[0].reshape(-1, a[0].shape[-1]), out)))
             for g in gates]
    ids = torch.randint(0, model.config.vocab_size, (TOKENS // 64, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    fp32 = routing.Precision()
    scale = float(getattr(model.config, "routed_scaling_factor", 1.0) or 1.0) if kind == "deepseek_v3" else 1.0
    for gate, x, (_, weights, indices) in seen:
        bias = getattr(gate, "e_score_correction_bias", None)
        bias = None if bias is None else bias.detach().double().numpy()
        got = routing.route(routing.gate_logits(x.double().numpy(), gate.weight.detach().double().numpy(), fp32), bias,
                            alg, fp32)
        hf_ids = indices.numpy()
        same = routing.same_set(got.ids, hf_ids)
        assert same.mean() >= AGREE, (kind, same.mean())
        dense_hf = np.zeros((hf_ids.shape[0], 16))
        np.put_along_axis(dense_hf, hf_ids, weights.double().numpy() / scale, axis=1)
        np.testing.assert_allclose(routing.dense_weights(got, 16)[same], dense_hf[same], rtol=1e-5, atol=1e-6)


def test_router_runs_on_each_architecture(arch):
    kind, folder, model = arch
    r = cli("router", "--inputs", f"hf:{folder}", "--tokens", "256", "--gate-dtypes", "bf16", "--logit-dtypes",
            "fp32", "--json")
    assert r.code == 0, r.err
    p = strict_json(r.out)["params"]
    assert p["model"]["model_type"] == kind and p["top_k"] == 4 and p["experts"] == 16
    assert (p["scoring"], p["n_group"], p["topk_group"]) == (
        ("sigmoid", 4, 2) if kind == "deepseek_v3" else ("softmax", 1, 1))
    assert p["margin_scale"] == ("choice scores" if kind == "deepseek_v3" else "logits")
