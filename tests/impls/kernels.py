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
