"""router --inputs hf:DIR: the routers of a real MoE model, opened through the
engine registry. The model runs once in fp32 on seeded random token ids (the
decoder only: no LM head, whose tokens x vocabulary logits would dwarf the
rest); a forward pre-hook on each router captures the hidden states it is
given. Each layer's routing is then emulated (numerics/routing.py) on those
hidden states and the router's own weight, under every precision path, with
the algorithm the model's config declares:

- Qwen3-MoE / Qwen2-MoE (`*.mlp.gate`): softmax, top num_experts_per_tok,
  norm_topk_prob;
- Mixtral (`*.block_sparse_moe.gate`): softmax, top num_experts_per_tok, the
  weights normalised;
- DeepSeek-V3-style (`*.mlp.gate` with `e_score_correction_bias`): scoring_func
  (sigmoid), n_group / topk_group, norm_topk_prob, the bias.
"""

from __future__ import annotations


from precisionlab.errors import UsageError
from precisionlab.numerics import routing

SEQ_LEN = 64       # positions a sequence; the tokens are split into sequences of this length
BATCH = 16         # sequences a forward
MODEL_FIXED = 160 * 2**20  # torch's and transformers' own state once a model is loaded (runtime/memory.MODEL_FIXED)


# One layer's routing at a time (experiments/router.py), per token and expert: the fp64 reference's
# logits, scores and choices, one path's likewise, and the flip statistics' dense weights: measured
# 71 bytes (1,000-3,000 tokens of a 4,096-expert model, 1 to 9 paths alike: one path at a time).
ROUTED_PER_LOGIT = 80
DEFAULT_EXPERTS = 64  # where the config declares no expert count


def estimate(tokens: int, n_paths: int):
    """ModelShape -> bytes: the fp32 weights (and the load's copy), one batch's
    activations (a few of batch x seq x hidden a layer), every layer's captured
    hidden states in float64 with their rounded copies, one layer's routing
    arrays over the config's experts (ROUTED_PER_LOGIT; with 64 experts
    assumed whatever the config said, --tokens 20000 of a 4,096-expert model
    ran out of memory) and each path's flips and margins of every layer."""
    def need(shape) -> int:
        weights = 2 * 4 * shape.params
        batch = 16 * BATCH * min(SEQ_LEN, tokens) * shape.hidden * shape.layers
        captured = 3 * 8 * tokens * shape.hidden * shape.layers
        routed = ROUTED_PER_LOGIT * tokens * (shape.experts or DEFAULT_EXPERTS)
        kept = 16 * tokens * shape.layers * n_paths
        return weights + batch + captured + routed + kept + MODEL_FIXED
    return need


def algorithm(config, top_k_override: int | None = None) -> routing.Algorithm:
    kind = getattr(config, "model_type", "")
    k = int(getattr(config, "num_experts_per_tok", 0) or 0)
    if kind in ("qwen3_moe", "qwen2_moe"):
        return routing.Algorithm(k, "softmax", 1, 1, bool(getattr(config, "norm_topk_prob", False)))
    if kind == "mixtral":
        return routing.Algorithm(k, "softmax", 1, 1, True)
    if kind in ("deepseek_v3", "glm4_moe"):
        return routing.Algorithm(k, getattr(config, "scoring_func", "sigmoid") or "sigmoid",
                                 int(getattr(config, "n_group", 1) or 1), int(getattr(config, "topk_group", 1) or 1),
                                 bool(getattr(config, "norm_topk_prob", True)))
    raise UsageError(f"--inputs: a {kind or 'model'} has no router this command knows (Qwen3-MoE, Qwen2-MoE, "
                     "Mixtral and DeepSeek-V3-style configs)")


def model_algorithm(engine, model) -> routing.Algorithm:
    """algorithm() of a model's own config (UsageError where it has none this knows: a model without one)."""
    return algorithm(engine.config(model))


def capture(spec: str, tokens: int, seed: int, n_paths: int, advance=lambda k=1: None):
    """(alg, info, layers): each MoE layer's (name, hidden states (T, H) float64, gate weight (E, H) float64,
    correction bias (E,) or None), from one fp32 forward of `tokens` seeded token ids."""
    import torch

    from precisionlab.engines.hooks import ROUTER_SUFFIXES, router_bias

    from precisionlab.experiments import startup

    # Through the one start-up: the estimate from the config before any weight is read, and refusals under
    # the option that named the model (router has no --model or --steps).
    engine = startup.open_engine(spec, "cpu", tokens, "", estimate(tokens, n_paths),
                                 f"router --inputs {spec} --tokens {tokens}", option="--inputs")
    model = engine.model("fp32")
    config = engine.config(model)  # a transformers model's; the embedded decoder has none, nor routers
    if config is None:
        raise UsageError(f"--inputs {spec}: not a Hugging Face MoE model; no routers to measure")
    alg = algorithm(config)
    gates = engine.routers(model)
    if not gates:
        raise UsageError(f"--inputs {spec}: no router modules ({', '.join('*' + s for s in ROUTER_SUFFIXES)}) found")
    seen: dict[str, list] = {n: [] for n, _ in gates}
    hooks = [m.register_forward_pre_hook(lambda mod, args, n=n: seen[n].append(
        args[0].detach().reshape(-1, args[0].shape[-1]).to(torch.float64).cpu())) for n, m in gates]
    vocab = int(config.vocab_size)
    seq = max(1, min(SEQ_LEN, int(getattr(config, "max_position_embeddings", SEQ_LEN) or SEQ_LEN)))
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (-(-tokens // seq), seq), generator=gen)
    decoder = engine.decoder(model)
    try:
        with torch.no_grad():
            for i in range(0, ids.shape[0], BATCH):
                decoder(input_ids=ids[i:i + BATCH], use_cache=False)
                advance()
    finally:
        for h in hooks:
            h.remove()
    layers = []
    for n, m in gates:
        hidden = torch.cat(seen[n])[:tokens].numpy()
        bias = router_bias(m)
        layers.append((n, hidden, m.weight.detach().to(torch.float64).cpu().numpy(),
                       None if bias is None else bias.detach().to(torch.float64).cpu().numpy()))
    info = {"model": spec, "architecture": type(model).__name__, "model_type": getattr(config, "model_type", None),
            "moe_layers": len(layers)}
    return alg, info, layers
