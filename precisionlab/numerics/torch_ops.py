"""This project's kernels behind torch-tensor signatures, so that they and a
user's implementation (compare op --impl) are called the same way.

CPU tensors go through the C++ kernels, CUDA tensors through the CUDA kernels
on their device pointers. Signatures (the ones --impl must follow):

    softmax(x)                      -> y        (over the last dim)
    logsumexp(x)                    -> lse      (shape x.shape[:-1])
    rmsnorm(x, weight, eps)         -> y
    layernorm(x, weight, bias, eps) -> y
    matmul(a, b)                    -> a @ b
    rope(x, positions, base)        -> y        (rotate-half; x rows x dim, one int64 position a row)
    attention(q, k, v, kv_start)    -> y        (bh x t x d; causal, keys before kv_start[b] masked,
                                                 scale 1/sqrt(d); a query that sees no key gives zeros)
    swiglu(gate, up)                -> silu(gate) * up
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.errors import UsageError

KERNEL_DTYPES = formats.COMPUTE  # what the op kernels take


def _code(t: torch.Tensor) -> int:
    fmt = formats.from_torch(t.dtype)
    if fmt is None or fmt.name not in KERNEL_DTYPES:
        raise UsageError(f"this project's kernels take fp32, bf16 or fp16, not {t.dtype}")
    return fmt.code


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as numpy in the same storage format (bf16 via ml_dtypes: formats.torch_to_numpy)."""
    return formats.torch_to_numpy(t)


def from_numpy(a: np.ndarray) -> torch.Tensor:
    return formats.numpy_to_torch(a)


@contextmanager
def _library_launch(t: torch.Tensor):
    """The library launches on the legacy default stream of the current
    device. Make that t's device, and when torch works on a side stream,
    order the launch after its pending work and its later work after the
    launch, so neither reads the other's tensors half written."""
    with torch.cuda.device(t.device):
        side, default = torch.cuda.current_stream(), torch.cuda.default_stream()
        if side == default:
            yield
            return
        default.wait_stream(side)
        yield
        side.wait_stream(default)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(-1, x.shape[-1])


def softmax(x: torch.Tensor, masked: str = "nan") -> torch.Tensor:
    """masked: what a row of all -inf gives, nan (textbook) or zero."""
    x2 = _rows(x)
    if x.is_cuda:
        y = torch.empty_like(x2)
        with _library_launch(x):
            native.softmax_cuda_device(x2.data_ptr(), x2.shape[0], x2.shape[1], _code(x), "single_pass", y.data_ptr(),
                                       masked=masked)
        return y.view(x.shape)
    y, _ = native.softmax_cpu(to_numpy(x2), _code(x), "stable", masked)
    return from_numpy(y).view(x.shape)


def logsumexp(x: torch.Tensor, masked: str = "nan") -> torch.Tensor:
    x2 = _rows(x)
    if x.is_cuda:
        y = torch.empty_like(x2)
        lse = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
        with _library_launch(x):
            native.softmax_cuda_device(x2.data_ptr(), x2.shape[0], x2.shape[1], _code(x), "stable", y.data_ptr(),
                                       masked=masked, lse_ptr=lse.data_ptr())
        return lse.to(x.dtype).view(x.shape[:-1])
    _, lse = native.softmax_cpu(to_numpy(x2), _code(x), "stable", masked)
    return torch.from_numpy(lse).to(x.dtype).view(x.shape[:-1])


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    x2 = _rows(x)
    w = None if weight is None else weight.to(x.dtype).contiguous()
    if x.is_cuda:
        y = torch.empty_like(x2)
        with _library_launch(x):
            native.rmsnorm_cuda(x2.data_ptr(), x2.shape[0], x2.shape[1], _code(x),
                                None if w is None else w.data_ptr(), eps, y.data_ptr())
        return y.view(x.shape)
    y = native.rmsnorm_cpu(to_numpy(x2), _code(x), None if w is None else to_numpy(w), eps)
    return from_numpy(y).view(x.shape)


def layernorm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    x2 = _rows(x)
    w = None if weight is None else weight.to(x.dtype).contiguous()
    b = None if bias is None else bias.to(x.dtype).contiguous()
    if x.is_cuda:
        y = torch.empty_like(x2)
        with _library_launch(x):
            native.layernorm_cuda(x2.data_ptr(), x2.shape[0], x2.shape[1], _code(x),
                                  None if w is None else w.data_ptr(), None if b is None else b.data_ptr(), eps,
                                  y.data_ptr())
        return y.view(x.shape)
    y = native.layernorm_cpu(to_numpy(x2), _code(x), None if w is None else to_numpy(w),
                             None if b is None else to_numpy(b), eps)
    return from_numpy(y).view(x.shape)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise UsageError(f"matmul needs (m, k) @ (k, n), got {tuple(a.shape)} @ {tuple(b.shape)}")
    a, b = a.contiguous(), b.to(a.dtype).contiguous()
    if a.is_cuda:
        c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        with _library_launch(a):
            native.matmul_cuda(a.data_ptr(), b.data_ptr(), a.shape[0], b.shape[1], a.shape[1], _code(a),
                               c.data_ptr(), variant="tiled")
        return c
    return from_numpy(native.matmul_cpu(to_numpy(a), to_numpy(b), _code(a)))


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    x2 = _rows(x)
    pos = positions.to(torch.int64).contiguous()
    if pos.numel() != x2.shape[0]:
        raise UsageError(f"rope needs one position a row: {pos.numel()} positions for {x2.shape[0]} rows")
    if x.is_cuda:
        y = torch.empty_like(x2)
        pos = pos.to(x.device)
        with _library_launch(x):
            native.rope_cuda(x2.data_ptr(), x2.shape[0], x2.shape[1], _code(x), pos.data_ptr(), base, formats.get("fp32").code,
                             y.data_ptr())
        return y.view(x.shape)
    y = native.rope_cpu(to_numpy(x2), _code(x), pos.cpu().numpy(), base, formats.get("fp32").code)
    return from_numpy(y).view(x.shape)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_start: torch.Tensor) -> torch.Tensor:
    if q.dim() != 3 or k.shape != v.shape[:2] + k.shape[2:] or k.dim() != 3:
        raise UsageError(f"attention needs bh x t x d tensors, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    q, k, v = q.contiguous(), k.to(q.dtype).contiguous(), v.to(q.dtype).contiguous()
    ks = kv_start.to(torch.int32).contiguous()
    scale = q.shape[-1] ** -0.5
    if q.is_cuda:
        y = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
        ks = ks.to(q.device)
        with _library_launch(q):
            native.attention_cuda(q.data_ptr(), k.data_ptr(), v.data_ptr(), q.shape[0], q.shape[1], k.shape[1],
                                  q.shape[2], v.shape[2], _code(q), True, ks.data_ptr(), scale, y.data_ptr())
        return y
    y = native.attention_cpu(to_numpy(q), to_numpy(k), to_numpy(v), _code(q), True, ks.cpu().numpy(), scale)
    return from_numpy(y)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g, u = gate.contiguous(), up.to(gate.dtype).contiguous()
    if g.shape != u.shape:
        raise UsageError(f"swiglu needs gate and up of one shape, got {tuple(g.shape)} and {tuple(u.shape)}")
    if g.is_cuda:
        y = torch.empty_like(g)
        with _library_launch(g):
            native.swiglu_cuda(g.data_ptr(), u.data_ptr(), g.numel(), _code(g), y.data_ptr())
        return y
    return from_numpy(native.swiglu_cpu(to_numpy(g), to_numpy(u), _code(g))).view(g.shape)
