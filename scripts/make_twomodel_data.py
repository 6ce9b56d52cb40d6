"""docs/data/twomodel: the two models of docs/compare-model.md's two-model
session, built offline and seeded: `ref`, a random tiny Qwen3 (3 layers x 32,
a 12-word vocabulary), and `bug`, the same folder with one planted bug: the
MLP of layer 1 scaled by 1.005 (its down_proj weight), a bug that hides inside
bf16's own rounding.

    .venv/bin/python scripts/make_twomodel_data.py
"""

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "data" / "twomodel"
WORDS = ["[UNK]", "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "it"]
BUG = {"model.layers.1.mlp.down_proj.weight": 1.005}


def main() -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    ref, bug = OUT / "ref", OUT / "bug"
    shutil.rmtree(OUT, ignore_errors=True)
    Qwen3ForCausalLM(cfg).save_pretrained(ref)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(ref)
    shutil.copytree(ref, bug)
    tensors = load_file(bug / "model.safetensors")
    for name, factor in BUG.items():
        tensors[name] = tensors[name] * factor
    save_file(tensors, bug / "model.safetensors", metadata={"format": "pt"})
    print(f"wrote {ref} and {bug}")


if __name__ == "__main__":
    main()
