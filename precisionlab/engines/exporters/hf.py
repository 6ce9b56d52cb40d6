"""The embedded model as a Hugging Face Qwen3 checkpoint.

engines/charlm.py is Qwen3's architecture at a small size, and every piece
has a Qwen3Config field that says the same thing: pre-norm RMSNorm with the
mean of squares in fp32 and the gain applied after the cast back
(Qwen3RMSNorm), per-head RMSNorm on q and k before RoPE (q_norm/k_norm),
rotate-half RoPE with theta 10000 (rope_type default), SwiGLU (hidden_act
silu), no biases (attention_bias False), a tied head (tie_word_embeddings),
full multi-head attention (num_key_value_heads = num_attention_heads). What
is not bit-identical, only equal to fp32 rounding: transformers builds the
RoPE angles as inv_freq @ positions where charlm takes an outer product of a
theta ** (-i/d) table, and its attention scales q·k by head_dim ** -0.5
inside its own kernel (sdpa). The tokenizer is one token per character: a
tokenizers WordLevel model over each character isolated, decoded by
concatenation, with no unknown token (an unknown character is an error,
never a silent <unk>) and no BOS/EOS (the model was trained without them).
"""

from __future__ import annotations

import json
from pathlib import Path

# charlm parameter name pieces -> transformers Qwen3 names
_RENAME = (("embed.", "model.embed_tokens."), ("layers.", "model.layers."), ("attn_norm.", "input_layernorm."),
           ("mlp_norm.", "post_attention_layernorm."), ("attn.wq.", "self_attn.q_proj."),
           ("attn.wk.", "self_attn.k_proj."), ("attn.wv.", "self_attn.v_proj."), ("attn.wo.", "self_attn.o_proj."),
           ("attn.q_norm.", "self_attn.q_norm."), ("attn.k_norm.", "self_attn.k_norm."),
           ("mlp.gate.", "mlp.gate_proj."), ("mlp.up.", "mlp.up_proj."), ("mlp.down.", "mlp.down_proj."))

CHANGES = ["architecture: charlm written as Qwen3ForCausalLM (same layers; RoPE angles and the attention scale "
           "computed by transformers: equal to fp32 rounding, not bit-identical)",
           "weights: the shipped bf16 values written as float32 (an exact upcast)",
           "head: tied to the embedding (tie_word_embeddings true), as in charlm",
           "tokenizer: one token per character (tokenizers WordLevel, no <unk>, no BOS/EOS)"]


def qwen3_config(cfg, vocab_size: int) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_hidden, "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_heads, "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True,
            "use_sliding_window": False, "sliding_window": None, "torch_dtype": "float32", "dtype": "float32",
            "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "use_cache": True}


def hf_name(name: str) -> str:
    for old, new in _RENAME:
        name = name.replace(old, new, 1) if name.startswith(old) or f".{old}" in name else name
    return name


def char_tokenizer(vocab: list[str]):
    """A transformers PreTrainedTokenizerFast: each character one token, ids in charlm's order."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(vocab)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)


def write_embedded(folder: str) -> list[str]:
    """The shipped model into `folder` as config.json, model.safetensors and the tokenizer files."""
    import torch
    from safetensors.torch import save_file

    from precisionlab.engines import charlm

    model, tok = charlm.load_default(torch.float32, "cpu")
    out = Path(folder)
    (out / "config.json").write_text(json.dumps(qwen3_config(model.cfg, len(tok)), indent=2) + "\n")
    tensors = {hf_name(k): v.detach().float().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    char_tokenizer(tok.vocab).save_pretrained(str(out))
    return list(CHANGES)


def resave(src: str, folder: str) -> list[str]:
    """A Hugging Face folder loaded offline without its own code and saved again in float32."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(src, trust_remote_code=False, local_files_only=True)
    tok = transformers.AutoTokenizer.from_pretrained(src, trust_remote_code=False, local_files_only=True)
    model.float().save_pretrained(folder)
    tok.save_pretrained(folder)
    return ["weights: saved in float32 by transformers' save_pretrained"]


def from_gguf(path: str, folder: str) -> list[str]:
    """A llama.cpp GGUF file as a Hugging Face folder: its weights dequantised
    to float32 and its tokenizer, read by transformers' own GGUF loader
    (it needs accelerate). transformers refuses to save a GGUF-loaded model,
    so the state dict is written as it is (one copy of the weights, the tied
    head once), with the config and the tokenizer beside it."""
    import torch
    import transformers
    from safetensors.torch import save_file

    src = Path(path).resolve()
    kw = {"gguf_file": src.name, "local_files_only": True}
    # a model folder never runs its own code
    tok = transformers.AutoTokenizer.from_pretrained(str(src.parent), trust_remote_code=False, **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(src.parent), trust_remote_code=False,
                                                              dtype=torch.float32, **kw)
    cfg = model.config
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    save_file(state, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
    del model, state
    for key in ("quantization_config", "_name_or_path"):
        if hasattr(cfg, key):
            delattr(cfg, key)
    cfg.dtype = "float32"
    cfg.save_pretrained(folder)
    tok.save_pretrained(folder)
    pre_note = _pre_tokenizer_of(src, Path(folder) / "tokenizer.json")
    from precisionlab.engines.exporters import gguf as gguf_writer

    return [f"weights: {src.name}'s tensors ({gguf_writer.tensor_types(str(src))}) dequantised to float32 by "
            f"transformers {transformers.__version__}'s GGUF loader (the file's values, rows in transformers' order)",
            "head: tied; written once as the embedding" if tied else "head: its own tensor",
            f"tokenizer: rebuilt by transformers from the file's vocabulary and merges ({len(tok)} tokens"
            f"{', with its chat template' if tok.chat_template else ''})", pre_note]


def _pre_tokenizer_of(gguf_path: Path, tokenizer_json: Path) -> str:
    """transformers' GGUF loader rebuilds every byte-level BPE with GPT-2's pre-tokenizer, whatever
    rule the file names (SmolLM's splits digits one by one; GPT-2's does not): the rule the file's
    tokenizer.ggml.pre names is put back, so the folder splits a text as llama.cpp does on the file."""
    from precisionlab.engines.exporters import gguf as gguf_writer
    from precisionlab.engines.exporters import gguf_vocab

    name = gguf_writer.read_string(str(gguf_path), "tokenizer.ggml.pre")
    doc = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    if name not in gguf_vocab.PRE_TOKENIZERS:
        return (f"pre-tokenizer: the file names {name!r}, which this exporter does not know: transformers' "
                f"{gguf_vocab.pre_name(doc.get('pre_tokenizer'))!r} kept (texts may split differently)")
    if gguf_vocab.pre_name(doc.get("pre_tokenizer")) == name:
        return f"pre-tokenizer: {name!r}, as the file names it"
    doc["pre_tokenizer"] = gguf_vocab.PRE_TOKENIZERS[name]
    tokenizer_json.write_text(json.dumps(doc, ensure_ascii=False, indent=2), encoding="utf-8")
    return f"pre-tokenizer: set to the file's {name!r} rule (transformers' GGUF loader writes GPT-2's for every BPE)"
