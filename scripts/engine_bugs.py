"""A tiny Qwen3 reference and copies of it carrying planted bugs, each dumped
by "an engine" under its own names and in its own layout: the inputs of the
engine-dump session in docs/dumps-from-your-engine.md and of
tests/test_verdicts.py.

    python scripts/engine_bugs.py OUT_DIR [BUG ...]     # default: every bug and the clean copy

writes OUT_DIR/fp32.safetensors and OUT_DIR/bf16.safetensors (the reference,
module names as transformers has them, through scripts/dump_hooks.py) and
OUT_DIR/engine-BUG.safetensors for each BUG in BUGS. The engine names its
tensors `eng.blk.N.ffn_out` and so on, drops the batch dimension, stores q/k
heads first ([heads, T, head_dim]) and the logits as [vocab, T]; ENGINE_OPTIONS
are the compare tensors options that bring them to the reference's names and
layout. Needs torch, transformers and safetensors; seeded, so the files are
the same on every run of the same versions.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dump_hooks import ORDER_KEY, DumpHooks  # noqa: E402

HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB = 64, 2, 4, 2, 12
TOKENS = [1, 2, 3, 4, 5, 6, 7, 1, 8, 9, 10, 5, 6, 11, 3, 4]
START = 1000  # the positions run 1000 ... 1015: deep in a context, where RoPE's phases are what they cost
INCLUDE = ["model.embed_tokens", "model.rotary_emb", "model.layers.?", "model.layers.?.input_layernorm",
           "model.layers.?.self_attn", "model.layers.?.self_attn.q_norm", "model.layers.?.self_attn.k_norm",
           "model.layers.?.post_attention_layernorm", "model.layers.?.mlp", "model.norm", "lm_head"]

# What each bug is, and the module it is planted in (the tensor a comparison must name).
BUGS = {
    "clean": (None, "an honest copy: bf16, RoPE phases from fp32 inverse frequencies, as transformers loads it"),
    "scale": ("model.layers.1.mlp", "the layer-1 MLP's output scaled by 1.005 (0.5 %)"),
    "eps": ("model.layers.1.input_layernorm", "the layer-1 input RMSNorm with eps 1e-3 instead of 1e-6"),
    "rope_bf16": ("model.rotary_emb", "RoPE inverse frequencies rounded to bf16 (model.to(bf16) without "
                                      "keeping them in fp32)"),
    "skip_qk_norm": ("model.layers.1.self_attn.q_norm", "layer 1's q and k RMSNorms skipped"),
}

# The engine's names: (its name, the reference's), as --map rules reverse them.
_NAMES = [(r"model\.embed_tokens", "eng.tok_embd"), (r"model\.rotary_emb", "eng.rope"),
          (r"model\.layers\.(\d+)\.input_layernorm", r"eng.blk.\1.attn_norm"),
          (r"model\.layers\.(\d+)\.self_attn\.q_norm", r"eng.blk.\1.q"),
          (r"model\.layers\.(\d+)\.self_attn\.k_norm", r"eng.blk.\1.k"),
          (r"model\.layers\.(\d+)\.self_attn", r"eng.blk.\1.attn_out"),
          (r"model\.layers\.(\d+)\.post_attention_layernorm", r"eng.blk.\1.ffn_norm"),
          (r"model\.layers\.(\d+)\.mlp", r"eng.blk.\1.ffn_out"), (r"model\.layers\.(\d+)", r"eng.blk.\1"),
          (r"model\.norm", "eng.out_norm"), (r"lm_head", "eng.output")]

ENGINE_OPTIONS = [
    "--map", r"^eng\.tok_embd$=model.embed_tokens", "--map", r"^eng\.rope$=model.rotary_emb",
    "--map", r"^eng\.blk\.(\d+)\.attn_norm$=model.layers.\1.input_layernorm",
    "--map", r"^eng\.blk\.(\d+)\.q$=model.layers.\1.self_attn.q_norm",
    "--map", r"^eng\.blk\.(\d+)\.k$=model.layers.\1.self_attn.k_norm",
    "--map", r"^eng\.blk\.(\d+)\.attn_out$=model.layers.\1.self_attn",
    "--map", r"^eng\.blk\.(\d+)\.ffn_norm$=model.layers.\1.post_attention_layernorm",
    "--map", r"^eng\.blk\.(\d+)\.ffn_out$=model.layers.\1.mlp", "--map", r"^eng\.blk\.(\d+)$=model.layers.\1",
    "--map", r"^eng\.out_norm$=model.norm", "--map", r"^eng\.output$=lm_head",
    "--layout", "model.layers.*.self_attn.?_norm=1,0,2", "--transpose", "lm_head",
]


def reference() -> torch.nn.Module:
    """The fp32 reference: a random tiny Qwen3 (seed 0)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HIDDEN // HEADS,
                      max_position_embeddings=2048, rms_norm_eps=1e-6)
    return Qwen3ForCausalLM(cfg).eval()


def low_copy(model: torch.nn.Module, dtype=torch.bfloat16, keep_rope_fp32: bool = True) -> torch.nn.Module:
    """A copy in `dtype`, its RoPE inverse frequencies kept in fp32 as
    transformers' loader keeps them (unless keep_rope_fp32 is False: the bug)."""
    low = copy.deepcopy(model).to(dtype)
    if keep_rope_fp32:
        for name, buf in model.named_buffers():
            if name.rsplit(".", 1)[-1].startswith(("inv_freq", "original_inv_freq")):
                owner, attr = name.rsplit(".", 1)
                setattr(low.get_submodule(owner), attr, buf.clone())
    return low


def with_bug(model: torch.nn.Module, bug: str) -> torch.nn.Module:
    """The bf16 copy of `model` carrying BUGS[bug]."""
    low = low_copy(model, keep_rope_fp32=bug != "rope_bf16")
    if bug == "scale":
        low.get_submodule("model.layers.1.mlp").register_forward_hook(lambda _m, _a, y: y * 1.005)
    elif bug == "eps":
        low.get_submodule("model.layers.1.input_layernorm").variance_epsilon = 1e-3
    elif bug == "skip_qk_norm":
        attn = low.get_submodule("model.layers.1.self_attn")
        attn.q_norm, attn.k_norm = torch.nn.Identity(), torch.nn.Identity()
    elif bug not in ("clean", "rope_bf16"):
        raise ValueError(f"unknown bug {bug!r}: {', '.join(BUGS)}")
    return low


def dump(model: torch.nn.Module) -> DumpHooks:
    torch.set_num_threads(1)  # one reduction order for every copy
    with torch.no_grad(), DumpHooks(model, INCLUDE) as d:
        model(torch.tensor([TOKENS]), position_ids=torch.arange(START, START + len(TOKENS))[None])
    return d


def engine_tensors(d: DumpHooks) -> tuple[dict, list]:
    """The engine's file: its names, no batch dimension, q/k heads first, logits [vocab, T]."""
    out, order = {}, []
    for name in d.order:
        t = d.tensors[name]
        new = next(re.sub(f"^{pat}$", rep, name) for pat, rep in _NAMES if re.fullmatch(pat, name))
        if name.endswith(("q_norm", "k_norm")):
            t = t[0].permute(1, 0, 2)      # [1, T, heads, D] -> [heads, T, D]
        elif name == "lm_head":
            t = t[0].T                     # [1, T, vocab] -> [vocab, T]
        elif name == "model.rotary_emb":
            t = t[:, 0]                    # [2, 1, T, D] -> [2, T, D]
        else:
            t = t[0]
        out[new] = t.contiguous().clone()
        order.append(new)
    return out, order


def write(out_dir: Path, bugs=tuple(BUGS)) -> dict[str, Path]:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    ref = reference()
    paths = {}
    for label, m in (("fp32", ref), ("bf16", low_copy(ref))):
        paths[label] = out_dir / f"{label}.safetensors"
        dump(m).save(paths[label])
    for bug in bugs:
        tensors, order = engine_tensors(dump(with_bug(ref, bug)))
        paths[bug] = out_dir / f"engine-{bug}.safetensors"
        save_file(tensors, str(paths[bug]), metadata={ORDER_KEY: json.dumps(order)})  # as dump_hooks records it
    return paths


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python scripts/engine_bugs.py OUT_DIR [BUG ...]")
    unknown = [b for b in sys.argv[2:] if b not in BUGS]
    if unknown:
        sys.exit(f"unknown bug {unknown[0]!r}: {', '.join(BUGS)}")
    for p in write(Path(sys.argv[1]), sys.argv[2:] or tuple(BUGS)).values():
        print(p)
