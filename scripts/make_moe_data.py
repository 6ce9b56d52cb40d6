"""docs/data/moe: the two MoE models of docs/compare-model.md's routing
session, built offline and seeded: `ref`, a random tiny Qwen3-MoE (3 layers x
32, 8 routed experts, top 2, a 12-word vocabulary), and `bug`, the same folder
with one planted bug: layer 1's router with the rows of experts 0 and 1
exchanged (a token meant for expert 0 goes to expert 1), a wrong gate rather
than rounding.

    .venv/bin/python scripts/make_moe_data.py
"""

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "data" / "moe"
WORDS = ["[UNK]", "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "it"]
BUG = "model.layers.1.mlp.gate.weight"


def main() -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=64)
    ref, bug = OUT / "ref", OUT / "bug"
    shutil.rmtree(OUT, ignore_errors=True)
    Qwen3MoeForCausalLM(cfg).save_pretrained(ref)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(ref)
    shutil.copytree(ref, bug)
    tensors = load_file(bug / "model.safetensors")
    tensors[BUG] = tensors[BUG][[1, 0, *range(2, cfg.num_experts)]].contiguous()
    save_file(tensors, bug / "model.safetensors", metadata={"format": "pt"})
    print(f"wrote {ref} and {bug}")


if __name__ == "__main__":
    main()
