"""The embedded model as an ONNX graph: token ids (batch, tokens) -> logits
(batch, tokens, vocab), every position, no KV cache, exported with
torch.onnx.export's TorchScript path from charlm's own module (plain
matmuls, softmax and a causal mask). A transformers model is not offered:
its mask code (aten::diff) does not trace to ONNX on that path, and the
dynamo path needs onnxscript. fp16 exports the module cast to float16, so
the graph keeps charlm's own casts (RMSNorm's fp32 statistic)."""

from __future__ import annotations

from precisionlab.catalog import formats

VARIANTS = formats.ONNX_EXPORT


def write_embedded(out: str, variant: str) -> list[str]:
    import warnings

    import torch

    from precisionlab.engines import charlm

    model, tok = charlm.load_default(torch.float16 if variant == "fp16" else torch.float32, "cpu")

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids)[0]

    ids = torch.zeros((1, 8), dtype=torch.long)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits(model.eval()), (ids,), out, input_names=["input_ids"], output_names=["logits"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "tokens"}, "logits": {0: "batch", 1: "tokens"}},
                          opset_version=17, dynamo=False, verbose=False)
    import json

    import onnx

    graph = onnx.load(out)
    for key, value in (("precisionlab.vocab", json.dumps(tok.vocab)),
                       ("precisionlab.max_seq_len", str(model.cfg.max_seq_len))):
        graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, out)
    return [f"graph: logits for every position, no KV cache, {variant} weights and arithmetic, opset 17",
            f"positions: the RoPE table is a constant of {model.cfg.max_seq_len} rows",
            "tokenizer: the character vocabulary in the file's metadata (precisionlab.vocab)"]
