"""A Hugging Face Qwen3 or Llama folder as a llama.cpp GGUF file, written
with the `gguf` package (llama.cpp's own Python writer; its converter script
is not shipped in any wheel).

Tensor names are llama.cpp's (blk.N.attn_q, ...). 1-D tensors (the norm
gains) stay F32 whatever the type, as llama.cpp's converter keeps them; every
2-D tensor takes the requested type. A tied head is written once, as
token_embd (llama.cpp reuses it for the output when no output.weight exists).
The tokenizer is translated by gguf_vocab.py (byte-level BPE with its merges
and llama.cpp's pre-tokenizer name, or a character vocabulary), read from
tokenizer.json and checked before any weight is loaded. Llama folders have
their q and k rows permuted from transformers' rotate-half order to the
interleaved pairs llama.cpp's LLAMA rope type rotates (qwen3 is NEOX style in
llama.cpp, the same rotate-half order as transformers: kept as it is).

q4_k_m is llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize)
run on an F32 file written here: the gguf package can only dequantize
K-quants. K-quants pack rows in super-blocks of 256, so a tensor whose rows
are not a multiple of 256 wide gets llama.cpp's fallback type; the changes
list counts the types the file ends up with.

SOURCE_KEY records the model the file was exported from (`embedded` or
`hf:/abs/dir`): compare model --engine's default reference.
"""

from __future__ import annotations

import json
from pathlib import Path

from precisionlab.engines.exporters import gguf_vocab
from precisionlab.errors import UsageError

VARIANTS = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m")
SOURCE_KEY = "precisionlab.source"
# llama.cpp's quantizer: variant -> llama_ftype (llama.h: LLAMA_FTYPE_MOSTLY_Q4_K_M)
_LLAMA_QUANTIZED = {"q4_k_m": 15}

_ARCH = {"qwen3": "qwen3", "llama": "llama"}
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(name: str) -> str | None:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        key = ".".join(parts[3:-1])
        if key in _LAYER:
            return f"blk.{parts[2]}.{_LAYER[key]}.{parts[-1]}"
    return None


def write(src: str, out: str, variant: str, source: str | None = None) -> list[str]:
    """The GGUF of the Hugging Face folder src at out; source: the spec recorded as SOURCE_KEY."""
    if variant in _LLAMA_QUANTIZED:
        return _quantized(src, out, variant, source)
    import gguf

    cfg, arch, vocab = _read_config(src)
    model = _load(src)
    qtype = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
             "q4_0": gguf.GGMLQuantizationType.Q4_0}[variant]
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[variant]
    w = gguf.GGUFWriter(out, arch)
    changes = _write_metadata(w, cfg, arch, ftype, source)
    changes += gguf_vocab.write(w, src, vocab)
    changes += _write_tensors(w, model, cfg, arch, variant, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return changes


def _read_config(src: str):
    """(config, llama.cpp architecture, vocabulary) of the folder, from its json files alone: refused
    where this writer cannot translate it, before a weight is read."""
    try:
        cfg = json.loads((Path(src) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--to gguf: {src}/config.json unreadable ({type(e).__name__})") from None
    arch = _ARCH.get(cfg.get("model_type"))
    if arch is None:
        raise UsageError(f"--to gguf: model_type {cfg.get('model_type')!r} is not written by this exporter "
                         f"(it writes {', '.join(_ARCH)})")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise UsageError(f"--to gguf: rope_type {rope.get('rope_type', rope.get('type'))!r} is not written by "
                         "this exporter (plain RoPE only)")
    vocab = gguf_vocab.read(src, int(cfg["vocab_size"]))
    return cfg, arch, vocab


def _load(src: str):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(src, trust_remote_code=False, local_files_only=True,
                                                             dtype=torch.float32)


def _permute(w, n_head: int):
    """transformers' rotate-half rows (per head: the first halves, then the second halves) as llama.cpp's
    interleaved pairs (per head: row i of the first half, then row i of the second)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_metadata(w, cfg: dict, arch: str, ftype, source: str | None) -> list[str]:
    """The model's sizes and RoPE as llama.cpp reads them; what was changed on the way."""
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    theta = float((cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_name("precisionlab export")
    if source is not None:
        w.add_string(SOURCE_KEY, source)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_block_count(int(cfg["num_hidden_layers"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_head_count_kv(int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_file_type(ftype)
    w.add_vocab_size(int(cfg["vocab_size"]))
    style = ("NEOX (rotate-half) style, as transformers" if arch == "qwen3" else
             "NORM (interleaved pairs) style: q/k rows permuted from transformers' rotate-half order")
    return [f"context length: {int(cfg['max_position_embeddings'])} (max_position_embeddings)",
            f"rope: {style}, freq_base {theta:g}, {head_dim} dimensions (llama.cpp's {arch} layout)"]


def _write_tensors(w, model, cfg: dict, arch: str, variant: str, qtype) -> list[str]:
    """Every tensor under its llama.cpp name, 2-D ones in `variant`; what was changed on the way."""
    import gguf
    import numpy as np

    changes = []
    tied = bool(cfg.get("tie_word_embeddings")) or "lm_head.weight" not in dict(model.named_parameters())
    if tied:
        changes.append("head: tied; written once as token_embd (llama.cpp reuses it for the output)")
    state = model.state_dict()
    heads = {"q_proj": int(cfg["num_attention_heads"]),
             "k_proj": int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])}
    for name, t in state.items():
        if name == "lm_head.weight" and tied:
            continue
        g = gguf_name(name)
        if g is None:
            raise UsageError(f"--to gguf: no llama.cpp name for tensor {name!r}")
        data = t.detach().float().numpy()
        proj = name.split(".")[-2]
        if arch == "llama" and proj in heads and name.endswith(".weight"):
            data = _permute(data, heads[proj])
        if data.ndim == 1 or variant == "f32":
            w.add_tensor(g, np.ascontiguousarray(data, dtype=np.float32))
        elif variant == "f16":
            w.add_tensor(g, data.astype(np.float16))
        else:
            q = gguf.quants.quantize(data, qtype)
            w.add_tensor(g, q, raw_shape=q.shape, raw_dtype=qtype)
    if variant != "f32":
        changes.append(f"weights: every 2-D tensor as {variant.upper()} (round to nearest), the norm gains F32")
    return changes


def _quantized(src: str, out: str, variant: str, source: str | None) -> list[str]:
    """An F32 GGUF written here, then llama.cpp's own quantizer to `variant`."""
    import ctypes
    import tempfile

    from precisionlab.engines.external import need_package

    need_package("llama_cpp", "engines", "--to gguf:" + variant)
    import llama_cpp

    with tempfile.TemporaryDirectory(prefix="precisionlab-gguf-") as work:
        f32 = str(Path(work) / "f32.gguf")
        changes = write(src, f32, "f32", source)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = _LLAMA_QUANTIZED[variant]
        params.nthread = 1
        from precisionlab.engines.chatter import captured
        from precisionlab.errors import RunError

        with captured("llama.cpp"):  # its loader lists the metadata: shown under an error, or with PRECISIONLAB_DEBUG
            status = llama_cpp.llama_model_quantize(f32.encode(), str(out).encode(), ctypes.byref(params))
            if status != 0:
                raise RunError(f"--to gguf:{variant}: llama.cpp's quantizer failed (status {status})")
    types = tensor_types(out)
    changes.append(f"weights: quantized to {variant.upper()} by llama.cpp's own quantizer (llama-cpp-python "
                   f"{getattr(llama_cpp, '__version__', '?')}) from an F32 file; tensor types now: {types}")
    if "Q4_K" not in types:
        changes.append("K-quants pack rows in super-blocks of 256: no 2-D tensor here has rows that are a multiple "
                       "of 256 wide, so llama.cpp gave every one its fallback type and none took Q4_K")
    return changes


def tensor_types(path: str) -> str:
    """'Q4_K x 20, Q5_0 x 10, F32 x 11': how many tensors of each type a GGUF holds."""
    import collections

    import gguf

    counts = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)
    return ", ".join(f"{k} x {n}" for k, n in counts.most_common())


def read_source(path: str) -> str | None:
    """The SOURCE_KEY string a GGUF records (None: none, or not a GGUF the gguf package reads)."""
    return read_string(path, SOURCE_KEY)


def read_string(path: str, key: str) -> str | None:
    """A string metadata value of a GGUF (None: absent, or not a GGUF the gguf package reads)."""
    try:
        import gguf

        field = gguf.GGUFReader(path).fields.get(key)
        if field is None:
            return None
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    except Exception:  # a stranger's file: no record is the answer, never a crash
        return None
