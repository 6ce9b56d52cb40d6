"""--map suggestions that allow a local swap (issue 40, 8): io/tensor_layout.suggest_maps."""


def test_suggested_maps_allow_a_local_swap():
    """issue 40, 8: an engine that builds its RoPE phases before the embedding lookup dumps them first; the
    pairing by order and shape pairs both and shifts nothing after them."""
    from precisionlab.io import tensor_layout

    ref = [("model.embed_tokens", (1, 4, 8)), ("model.rotary_emb", (1, 4, 2)), ("model.layers.0.mlp", (1, 4, 8)),
           ("model.layers.1.mlp", (1, 4, 8)), ("lm_head", (1, 4, 20))]
    yours = [("rope", (4, 2)), ("tok", (4, 8)), ("blk.0.ffn", (4, 8)), ("blk.1.ffn", (4, 8)), ("out", (4, 20))]
    maps, _ = tensor_layout.suggest_maps(ref, yours)
    assert maps == [r"^rope$=model.rotary_emb", r"^tok$=model.embed_tokens",
                    r"^blk\.(\d+)\.ffn$=model.layers.\1.mlp", r"^out$=lm_head"], maps
