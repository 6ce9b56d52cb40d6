"""compare op's trusted references: torch's own ops (with the mask engines
use for attention, Hugging Face's RoPE) and the --masked policy for a row of
all -inf. experiments/compare.py runs them beside yours."""

from __future__ import annotations

import math

from precisionlab.runtime.torch_import import import_torch


def trusted(op: str):
    torch = import_torch()
    F = torch.nn.functional
    return {
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "logsumexp": lambda x: torch.logsumexp(x, dim=-1),
        "rmsnorm": lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
        "layernorm": lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
        "matmul": lambda a, b: a @ b,
        "rope": _trusted_rope,
        "attention": _trusted_attention,
        "swiglu": lambda gate, up: F.silu(gate) * up,
    }[op]


def _trusted_rope(x, pos, base):
    """Hugging Face's Llama RoPE: fp32 (fp64 for an fp64 x) inv_freq and
    angles, cos/sin cast to x's dtype, rotate-half in x's dtype."""
    torch = import_torch()
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.shape[-1] // 2
    inv = 1.0 / (base ** (torch.arange(0, x.shape[-1], 2, dtype=wide, device=x.device) / x.shape[-1]))
    ang = pos.to(wide)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


def attention_mask(tq: int, tk: int, kv_start, device):
    """bh x tq x tk visibility: causal (queries are the last tq positions) and
    key j >= kv_start[b] (left padding)."""
    torch = import_torch()
    i = torch.arange(tq, device=device)[:, None]
    j = torch.arange(tk, device=device)[None, :]
    causal = j <= i + (tk - tq)
    return causal[None] & (j[None] >= kv_start.to(device).long()[:, None, None])


def _trusted_attention(q, k, v, kv_start):
    """torch's scaled_dot_product_attention with the same mask; a query that
    sees no key gets zeros (SDPA gives NaN there), as engines write."""
    torch = import_torch()
    mask = attention_mask(q.shape[1], k.shape[1], kv_start, q.device)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=q.shape[-1] ** -0.5)
    return torch.where(mask.any(-1, keepdim=True), out, torch.zeros((), dtype=out.dtype, device=out.device))


def masked_policy(fn, op: str, masked: str):
    """softmax and logsumexp under --masked zero: a row of all -inf gives
    zeros (log-sum-exp -inf) instead of the textbook NaN."""
    if masked == "nan" or op not in ("softmax", "logsumexp"):
        return fn

    def wrapped(x):
        torch = import_torch()
        y = fn(x)
        dead = torch.isneginf(x).all(-1)
        if op == "softmax":
            return torch.where(dead[..., None], torch.zeros((), dtype=y.dtype, device=y.device), y)
        return torch.where(dead, torch.full((), -math.inf, dtype=y.dtype, device=y.device), y)
    return wrapped
