"""An independent plain-PyTorch Qwen3, written from the architecture (not
transformers' class, not the project's model): the user's own engine of
issue 40's tests, wrapped as a python: engine spec by tests/qwen3_user_engine.py.

It reads a Hugging Face Qwen3 folder's config.json and model.safetensors (the
weights only, no code) and computes prefill, KV-cache decode, chunked prefill
and left-padded batches. BUGS plants one serving-path bug at a time; None is
the clean engine, which must match transformers first.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

BUGS = ("kv_bf16_decode", "chunk_mask", "unmasked_padding", "decode_position", "batch_order")
# Inside attention (compare layers --heads): a softmax scale 5 % off (every head), and GQA's query heads
# mapped to KV heads tiled (h % kv) instead of interleaved (h // group): only the heads whose KV head differs.
ATTENTION_BUGS = ("attn_scale", "gqa_tiled")


def _rms(x, weight, eps):
    # in the wider of the model's dtype and fp32 (fp64 stays fp64), as Qwen3 normalises
    wide = torch.promote_types(x.dtype, torch.float32)
    h = x.to(wide)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


class PlainQwen3(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or h // self.nh
        self.eps, self.theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
        self.embed = nn.Embedding(v, h)
        self.blocks = nn.ModuleList()
        for _ in range(cfg["num_hidden_layers"]):
            b = nn.Module()
            b.ln1, b.ln2 = nn.Parameter(torch.ones(h)), nn.Parameter(torch.ones(h))
            b.q = nn.Linear(h, self.nh * self.hd, bias=False)
            b.k = nn.Linear(h, self.nkv * self.hd, bias=False)
            b.v = nn.Linear(h, self.nkv * self.hd, bias=False)
            b.o = nn.Linear(self.nh * self.hd, h, bias=False)
            b.qn, b.kn = nn.Parameter(torch.ones(self.hd)), nn.Parameter(torch.ones(self.hd))
            b.gate = nn.Linear(h, inter, bias=False)
            b.up = nn.Linear(h, inter, bias=False)
            b.down = nn.Linear(inter, h, bias=False)
            self.blocks.append(b)
        self.norm = nn.Parameter(torch.ones(h))
        self.head = nn.Linear(h, v, bias=False)

    def rope(self, positions):
        """(batch, tokens) positions -> cos, sin of (batch, 1, tokens, head_dim), in the model's dtype."""
        dt = self.head.weight.dtype
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
        ang = positions.to(torch.float64)[..., None] * inv
        ang = torch.cat((ang, ang), dim=-1)[:, None]
        return ang.cos().to(dt), ang.sin().to(dt)

    def run(self, ids, positions, mask, cache=None, bug=None, decoding=False, record=None):
        """ids (B, T); positions (B, T); mask (B, T_total, ) keys allowed per query as (B, T, T_total) bool;
        cache: list of [k, v] per layer (extended in place); record: a dict that receives the per-layer
        tensors under transformers' module names (and <attn>.probs, <attn>.heads). -> logits (B, T, vocab)."""
        rec = record if record is not None else {}
        x = self.embed(ids)
        cos, sin = self.rope(positions)
        rep = self.nh // self.nkv
        for i, b in enumerate(self.blocks):
            a = _rms(x, b.ln1, self.eps)
            B, T, _ = a.shape
            q = b.q(a).view(B, T, self.nh, self.hd).transpose(1, 2)
            k = b.k(a).view(B, T, self.nkv, self.hd).transpose(1, 2)
            v = b.v(a).view(B, T, self.nkv, self.hd).transpose(1, 2)
            q, k = _rotate(_rms(q, b.qn, self.eps), cos, sin), _rotate(_rms(k, b.kn, self.eps), cos, sin)
            if cache is not None:
                if bug == "kv_bf16_decode" and decoding:  # the cache stores decode's keys/values in bf16
                    k, v = k.to(torch.bfloat16).to(k.dtype), v.to(torch.bfloat16).to(v.dtype)
                if len(cache) <= i:
                    cache.append([k, v])
                else:
                    cache[i] = [torch.cat((cache[i][0], k), 2), torch.cat((cache[i][1], v), 2)]
                k, v = cache[i]
            if bug == "gqa_tiled":
                k, v = k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1)
            else:
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            s = (q @ k.transpose(-1, -2)) * (self.hd ** -0.5 * (1.05 if bug == "attn_scale" else 1.0))
            s = s.masked_fill(~mask[:, None], float("-inf"))
            probs = torch.softmax(s, dim=-1)
            heads = (probs @ v).transpose(1, 2)
            o = b.o(heads.reshape(B, T, self.nh * self.hd))
            x = x + o
            m = _rms(x, b.ln2, self.eps)
            mlp = b.down(nn.functional.silu(b.gate(m)) * b.up(m))
            x = x + mlp
            p = f"model.layers.{i}"
            rec.update({f"{p}.input_layernorm": a, f"{p}.self_attn.probs": probs, f"{p}.self_attn.heads": heads,
                        f"{p}.self_attn": o, f"{p}.post_attention_layernorm": m, f"{p}.mlp": mlp, p: x})
        h = _rms(x, self.norm, self.eps)
        rec["model.norm"] = h
        if bug == "batch_order" and h.shape[0] > 1:  # the head reduces in two halves once batched
            half = h.shape[-1] // 2
            w = self.head.weight
            return h[..., :half] @ w[:, :half].T + h[..., half:] @ w[:, half:].T
        return self.head(h)


NAMES = {"input_layernorm.weight": "ln1", "post_attention_layernorm.weight": "ln2",
         "self_attn.q_proj.weight": "q.weight", "self_attn.k_proj.weight": "k.weight",
         "self_attn.v_proj.weight": "v.weight", "self_attn.o_proj.weight": "o.weight",
         "self_attn.q_norm.weight": "qn", "self_attn.k_norm.weight": "kn", "mlp.gate_proj.weight": "gate.weight",
         "mlp.up_proj.weight": "up.weight", "mlp.down_proj.weight": "down.weight"}


def load(folder: str) -> PlainQwen3:
    """The folder's weights (safetensors: tensors only) in a PlainQwen3, fp32."""
    from safetensors.torch import load_file

    cfg = json.loads((Path(folder) / "config.json").read_text())
    model = PlainQwen3(cfg)
    state = load_file(str(Path(folder) / "model.safetensors"))
    mine = {"embed.weight": state["model.embed_tokens.weight"], "norm": state["model.norm.weight"],
            "head.weight": state.get("lm_head.weight", state["model.embed_tokens.weight"])}
    for key, t in state.items():
        if key.startswith("model.layers."):
            i, rest = key[len("model.layers."):].split(".", 1)
            mine[f"blocks.{i}.{NAMES[rest]}"] = t
    model.load_state_dict(mine, strict=True)
    return model.float().eval()
