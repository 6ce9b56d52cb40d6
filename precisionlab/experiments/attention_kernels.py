"""attention-cases' kernels: the calling convention every case uses, and the
implementations that follow it (the user's --impl function, the project's
FlashAttention emulator, the library's attention op).

The convention (what `--impl module:function` must accept):

    fn(q, k, v, *, scale, mask=None, sink=None, softcap=None, window=None,
       q_pos=None, rope_base=None, splits=1) -> out     (rows x dv)

- q (rows x d), k (keys x d), v (keys x dv): numpy arrays in the case's
  format (numpy.float32, numpy.float16, or ml_dtypes.bfloat16); key j sits at
  position j.
- scale: the softmax scale (a power of two in every case).
- mask: bool rows x keys, True where the row sees the key; None: all.
- sink: a logit in the scaled units that joins every row's denominator with
  no value (gpt-oss' attention sinks): out = sum_j e^x_j v_j / (e^sink +
  sum_j e^x_j).
- softcap: x = softcap tanh(scale q.k / softcap) (Gemma's soft-cap).
- window: with q_pos: the row at position p sees keys p - window ... p
  (FlashAttention's window_size = (window, 0)), on top of the mask.
- rope_base: with q_pos: q and k rotated (rotate-half pairs (i, i + d/2),
  theta_i = rope_base^(-2i/d)) at their positions before the product.
- splits: how many split-KV partitions to use, a hint (a kernel without
  split-KV ignores it).

Only the keywords a case needs are passed. A kernel that lacks one (a
TypeError naming an unexpected keyword) or raises NotImplementedError does
not support the case: it is reported as such, never failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from precisionlab.catalog import formats

FEATURES = ("mask", "sink", "softcap", "window", "rope_base")


class NotSupported(Exception):
    """The implementation cannot express what the case needs."""


@dataclass(frozen=True)
class Kernel:
    name: str
    call: Callable  # (q, k, v, **kwargs) with arrays in the case's format -> rows x dv


def as_format(x: np.ndarray, dtype: str) -> np.ndarray:
    """Values exact in `dtype` (every case builds them so), in its numpy twin."""
    return np.asarray(x, dtype=np.float64).astype(formats.get(dtype).dtype)


def _causal_start(mask: np.ndarray | None, rows: int, keys: int) -> tuple[bool, int] | None:
    """(causal, start) when mask is keys >= start, causal bottom-right
    aligned or not (the forms the library's op and the emulator take)."""
    if mask is None:
        return False, 0
    j = np.arange(keys)[None, :]
    i = np.arange(rows)[:, None]
    for causal in (False, True):
        vis = np.ones((rows, keys), bool) if not causal else j <= i + keys - rows
        seen = np.flatnonzero(mask.any(axis=0))
        start = int(seen[0]) if seen.size else keys
        if np.array_equal(mask, vis & (j >= start)):
            return causal, start
    return None


def _lacks(kwargs: dict, allowed: tuple[str, ...]) -> None:
    extra = [f for f in FEATURES if kwargs.get(f) is not None and f not in allowed]
    if extra:
        raise NotSupported(f"no {', '.join(extra)}")


def emulator(q, k, v, *, scale, splits=1, mask=None, **kwargs):
    """numerics/flash_attention.py at its defaults, P and the inputs in the
    case's format, fp32 accumulators; causal bottom-right only, no start."""
    from precisionlab.numerics import flash_attention as fa

    _lacks({"mask": mask, **kwargs}, ("mask",))
    form = _causal_start(mask, q.shape[0], k.shape[0])
    if form is None or form[1] != 0:
        raise NotSupported("only a causal (bottom-right) mask")
    dtype = formats.from_numpy(q.dtype).name
    cfg = fa.FlashConfig(input_dtype=dtype, p_dtype=dtype, out_dtype=dtype, splits=splits, causal=form[0],
                         softmax_scale=scale)
    return fa.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), cfg, track=False).out


def native_op(q, k, v, *, scale, splits=1, mask=None, **kwargs):
    """The library's attention op (pl_attention_cpu): keys from kv_start on,
    causal or not; no split-KV."""
    from precisionlab import native

    _lacks({"mask": mask, **kwargs}, ("mask",))
    form = _causal_start(mask, q.shape[0], k.shape[0])
    if form is None:
        raise NotSupported("only keys from a start, causal or not")
    fmt = formats.from_numpy(q.dtype)
    y = native.attention_cpu(q[None], k[None], v[None], fmt.code, form[0], np.array([form[1]], np.int32), scale)
    return y[0]


BUILTIN = (Kernel("emulator", emulator), Kernel("native", native_op))


def user(spec: str) -> Kernel:
    """The user's function, loaded as compare op --impl loads it (its prints to stderr)."""
    from precisionlab.runtime.user_code import load_impl, users_code

    fn = load_impl(spec)

    def call(q, k, v, **kwargs):
        with users_code():
            try:
                return fn(q, k, v, **kwargs)
            except NotImplementedError as e:
                raise NotSupported(str(e) or "NotImplementedError") from None
            except TypeError as e:
                if "unexpected keyword" in str(e):
                    raise NotSupported(str(e)) from None
                raise

    return Kernel(spec, call)
