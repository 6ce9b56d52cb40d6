"""The embedded model as an ONNX graph: token ids (batch, tokens) -> logits
(batch, tokens, vocab), every position, no KV cache, exported with
torch.onnx.export's TorchScript path from charlm's own module (plain
matmuls, softmax and a causal mask). fp16 exports the module cast to
float16, so the graph keeps charlm's own casts (RMSNorm's fp32 statistic).

A Hugging Face Qwen3 or Llama folder (write_hf) goes through torch's dynamo
exporter (torch.onnx.export(dynamo=True), which needs onnxscript): the
TorchScript path cannot trace transformers' mask code (aten::diff), and
torch.export captures the model's own Python as it runs, so the graph is the
module transformers runs (eager attention, no KV cache), with the number of
tokens left dynamic. No tokenizer goes in the file: the ONNX engine reads
the reference's token ids (compare engine --reference hf:DIR)."""

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


def write_hf(src: str, out: str, variant: str) -> list[str]:
    """The folder's causal LM as an ONNX graph ids (1, tokens) -> logits (1, tokens, vocab)."""
    import warnings

    import torch
    import transformers

    dtype = torch.float16 if variant == "fp16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(src, trust_remote_code=False,  # no folder's own code
                                                              local_files_only=True, dtype=dtype,
                                                              attn_implementation="eager").eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False).logits

    longest = int(getattr(model.config, "max_position_embeddings", 4096))
    ids = torch.zeros((1, 8), dtype=torch.long)
    tokens = torch.export.Dim("tokens", min=2, max=longest)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits(model), (ids,), out, input_names=["input_ids"], output_names=["logits"],
                          dynamic_shapes={"input_ids": {1: tokens}}, opset_version=18, dynamo=True,
                          external_data=False, verbose=False)
    import onnx

    graph = onnx.load(out)
    graph.metadata_props.add(key="precisionlab.max_seq_len", value=str(longest))
    onnx.save(graph, out)
    return [f"graph: {type(model).__name__} by torch's dynamo exporter (torch.export + onnxscript), eager attention, "
            f"logits for every position, no KV cache, {variant} weights and arithmetic, opset 18",
            f"positions: 2 to {longest} tokens, batch 1",
            "tokenizer: none in the file (the ONNX engine reads the reference's token ids)"]
