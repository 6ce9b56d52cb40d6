"""A tiny Qwen3-style character-level language model, shipped trained.

It exists so precision experiments can run a *real* (if small) transformer in
fp32, bf16 or fp16 and compare logits, without downloading anything. The
architecture mirrors what modern inference engines run -- RMSNorm, RoPE,
q/k-norm, SwiGLU, tied embeddings, a KV cache -- so the places where rounding
enters are the same ones, just at a size that runs in milliseconds on a CPU.

All arithmetic happens in the dtype of the parameters; the only deliberate
exceptions are the RMSNorm statistic and the RoPE tables (see the comments
there), which are the same exceptions Hugging Face / vLLM-style engines make.

The shipped weights are stored rounded to bf16, so loading them for fp32 is an
exact upcast: an fp32 and a bf16 run hold bit-identical weights and differ
only in the arithmetic.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

DEFAULT_WEIGHTS = Path(__file__).with_name("data") / "charlm.safetensors"

# A KV cache is one (keys, values) pair per layer, each (batch, heads, seq, head_dim).
KVCache = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class CharLMConfig:
    vocab_size: int
    d_model: int = 128
    n_layers: int = 5
    n_heads: int = 4
    mlp_hidden: int = 352
    max_seq_len: int = 1024  # only bounds the RoPE table; training used 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class CharTokenizer:
    """Maps each character to its index in a sorted vocabulary."""

    def __init__(self, vocab: list[str]):
        self.vocab = list(vocab)
        self.index = {c: i for i, c in enumerate(self.vocab)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        # A KeyError here is the useful failure: silently dropping unknown
        # characters would shift every later position of a comparison.
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.vocab[int(i)] for i in ids)

    def __len__(self) -> int:
        return len(self.vocab)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean of squares is taken in fp32 and the normalised activations
        # are cast back before the gain is applied, as Qwen3/Llama reference
        # code and most engines do: a bf16 sum of squares over d_model terms
        # would lose far more than the rest of the layer, and no real engine
        # ships that. Everything downstream stays in the model's dtype.
        # At least fp32: an fp64 run (the contracts' re-run) keeps its precision here.
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(cfg: CharLMConfig) -> tuple[torch.Tensor, torch.Tensor]:
    # Built once in fp32 (then cast to the model dtype when used), as engines
    # do: computing angles like pos * theta^(-i/d) directly in bf16 would give
    # wrong rotations at large positions, which is a bug, not a precision effect.
    inv_freq = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # "rotate-half" layout, as in Qwen/Llama
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: CharLMConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        # Per-head q/k norm as in Qwen3: keeps attention logits bounded, which
        # also keeps them in a range where bf16 softmax inputs behave.
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        # Optional (k, v) -> (k, v) for the new tokens: what the KV cache stores
        # and attention reads back (precisionlab/kvcache.py: fp8 caches).
        self.kv_store = None

    def forward(self, x, cos, sin, past, start_pos, key_mask=None):
        b, t, _ = x.shape
        split = lambda y: y.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(self.q_norm(split(self.wq(x))), cos, sin)
        k = apply_rope(self.k_norm(split(self.wk(x))), cos, sin)
        v = split(self.wv(x))
        if self.kv_store is not None:
            k, v = self.kv_store(k, v)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)

        # Written out rather than via scaled_dot_product_attention so every
        # step runs in the model dtype with no fused kernel choosing its own
        # accumulation precision behind our back.
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        q_pos = torch.arange(start_pos, start_pos + t, device=x.device)
        k_pos = torch.arange(k.shape[2], device=x.device)
        hidden = k_pos[None, :] > q_pos[:, None]
        if key_mask is not None:
            # (batch, keys) False at padding: no query attends to a pad, except
            # a pad to itself, so a pad's own row stays finite (it is never read).
            hidden = hidden | (~key_mask[:, None, None, :] & (k_pos[None, :] != q_pos[:, None]))
        scores = scores.masked_fill(hidden, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, t, -1)), (k, v)


class SwiGLU(nn.Module):
    def __init__(self, cfg: CharLMConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: CharLMConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin, past, start_pos, key_mask=None):
        a, kv = self.attn(self.attn_norm(x), cos, sin, past, start_pos, key_mask)
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), kv


class CharLM(nn.Module):
    def __init__(self, cfg: CharLMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        # Plain attributes rather than buffers: they are derived from the
        # config (so stay out of the weights file) and must stay fp32 through
        # model.to(dtype); forward slices and casts them per call.
        self.rope_cos, self.rope_sin = rope_tables(cfg)
        self.reset_parameters()

    def reset_parameters(self):
        # GPT-2 style: small normal init, residual-output projections shrunk
        # by depth so the residual stream starts near unit scale.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith(("wo.weight", "down.weight")):
                    std /= math.sqrt(2 * self.cfg.n_layers)
                nn.init.normal_(p, std=std)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None, start_pos: int = 0,
                key_mask: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                head_dtype: torch.dtype | None = None):
        """Logits for tokens idx (batch, seq) at positions start_pos.. .

        With a cache from a previous call, only the new tokens are passed and
        start_pos is the number already cached. Returns (logits, new_cache).
        A left-padded batch (no cache) passes key_mask (batch, seq; False at
        padding) and positions (batch, seq; each token's RoPE position).
        head_dtype: the LM head (its input, the final norm's output, and the
        tied weights) computed in this dtype instead of the model's; the
        layers and the final norm stay in the model's (None: all of it).
        """
        t = idx.shape[1]
        if start_pos + t > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {start_pos + t} exceeds max_seq_len {self.cfg.max_seq_len}")
        if positions is None:
            cos = self.rope_cos[start_pos : start_pos + t].to(idx.device, self.dtype)
            sin = self.rope_sin[start_pos : start_pos + t].to(idx.device, self.dtype)
        else:  # (batch, 1, seq, head_dim): one row of the table a token, broadcast over the heads
            cos = self.rope_cos.to(idx.device)[positions][:, None].to(self.dtype)
            sin = self.rope_sin.to(idx.device)[positions][:, None].to(self.dtype)
        x = self.embed(idx)
        new_cache: KVCache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, None if cache is None else cache[i], start_pos, key_mask)
            new_cache.append(kv)
        # Tied head: reuse the embedding matrix, as small Qwen3 models do.
        h, w = self.norm(x), self.embed.weight
        if head_dtype is not None:  # bf16 -> fp32 casts are exact: only the product's arithmetic changes
            h, w = h.to(head_dtype), w.to(head_dtype)
        return h @ w.T, new_cache


def save(model: CharLM, tokenizer: CharTokenizer, path: str | Path) -> None:
    """Write weights rounded to bf16, with config and vocab in the metadata."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    meta = {"config": json.dumps(asdict(model.cfg)), "vocab": json.dumps(tokenizer.vocab)}
    from precisionlab.io import outputs

    outputs.atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def load(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Load (model, tokenizer) from a file written by save()."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    cfg = CharLMConfig(**json.loads(meta["config"]))
    tokenizer = CharTokenizer(json.loads(meta["vocab"]))
    model = CharLM(cfg).to(device=device, dtype=dtype)
    # copy_ converts on the fly: bf16 -> fp32 is exact; bf16 -> fp16 is exact
    # except for magnitudes outside fp16's normal range.
    model.load_state_dict(tensors)
    return model.eval(), tokenizer


def load_default(dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """The shipped trained model (see data/ATTRIBUTION.md for its text)."""
    return load(DEFAULT_WEIGHTS, dtype, device)
