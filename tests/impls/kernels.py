"""Implementations a user might pass to `compare op --impl`: two correct, two
with the classic mistakes the verdict must catch."""

import torch


def rmsnorm_correct(x, weight, eps):
    ms = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(ms + eps) * weight.float()).to(x.dtype)


def rmsnorm_accumulates_in_input_dtype(x, weight, eps):
    # the mistake: the sum of squares kept in x's own format, column by column
    acc = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for j in range(x.shape[-1]):
        acc = acc + x[..., j] * x[..., j]
    inv = torch.rsqrt(acc.float() / x.shape[-1] + eps)
    return (x.float() * inv[..., None] * weight.float()).to(x.dtype)


def matmul_correct(a, b):
    return a @ b


def matmul_accumulates_in_input_dtype(a, b):
    c = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    for p in range(a.shape[1]):
        c = c + a[:, p:p + 1] * b[p:p + 1, :]
    return c


def matmul_transposed_weight(a, b):
    return a @ b.t()


def raises(a, b):
    raise RuntimeError("kernel exploded")


def rope_bf16_phases(x, positions, base):
    # the pitfall of a model cast wholesale to bf16: inv_freq, the angles and
    # cos/sin all in x's dtype, so at position 32767 a bf16 angle is a
    # multiple of 256 radians
    dt = x.dtype
    h = x.shape[-1] // 2
    inv = (1.0 / (base ** (torch.arange(0, x.shape[-1], 2, dtype=torch.float32) / x.shape[-1]))).to(dt)
    ang = positions.to(dt)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * emb.cos() + rot * emb.sin()


def swiglu_correct(gate, up):
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(gate.dtype)


def attention_without_the_padding_mask(q, k, v, kv_start):
    # the mistake: the causal mask alone, so padded keys take part
    t = q.shape[1]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=q.shape[-1] ** -0.5)


def softmax_without_max_subtraction(x):
    # the textbook formula: fine for small logits, inf / inf = NaN past exp's range
    e = torch.exp(x.float())
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def rmsnorm_returns_fp32(x, weight, eps):
    ms = x.float().pow(2).mean(-1, keepdim=True)
    return x.float() * torch.rsqrt(ms + eps) * weight.float()  # forgot .to(x.dtype)


def softmax_returns_numpy(x):
    return torch.softmax(x, -1).float().numpy()


def softmax_wrong_shape(x):
    return torch.softmax(x, -1)[:, :-1]


def softmax_batch_variant(x):
    # a split reduction chosen from the batch size, as launch heuristics do:
    # past 64 rows the sum runs over two halves, so a row's bits depend on
    # how many rows came with it
    xf = x.float()
    e = torch.exp(xf - xf.amax(-1, keepdim=True))
    if x.shape[0] > 64 and e.shape[-1] % 2 == 0:
        h = e.shape[-1] // 2
        s = e[:, :h].sum(-1, keepdim=True) + e[:, h:].sum(-1, keepdim=True)
    else:
        s = e.sum(-1, keepdim=True)
    return (e / s).to(x.dtype)


def rmsnorm_fixed_eps(x, weight, eps):
    # the mistake: eps hard-coded (a Llama's 1e-5) where the model says 1e-6
    ms = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(ms + 1e-5) * weight.float()).to(x.dtype)


def layernorm_fixed_eps(x, weight, bias, eps):
    # the same mistake in a LayerNorm: 1e-6 where the model says 1e-5
    return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), 1e-6).to(x.dtype)
