"""MMA-Sim (microsoft/MMA-Sim, PyPI `mmasim` 2.1.1: a bit-accurate simulator of
NVIDIA's and AMD's matrix instructions, validated on the hardware) as an
outside oracle for the accumulator models precisionlab names after a hardware
path, bit for bit:

- ``hopper-fp8``: Hopper's FP8 ``wgmma`` (k = 32; e4m3 and e5m2 in each mix);
- ``hopper-fp8:bits=26:group=16``: Hopper's bf16 and fp16 ``wgmma`` (k = 16);
- ``hopper-fp8:bits=26:group=8``: Hopper's tf32 ``wgmma`` (k = 8, on tf32 values).

One instruction and K = 4096 chains (MMA-Sim's ``dpa`` walks K instruction by
instruction, carrying c, as the model's groups do), on random values and on
the edge classes: zeros (whole instructions of zero products, the sign of
zero), each format's largest and subnormal values, exact cancellation, and a
tiny c under an all-zero instruction (the class where the two once disagreed:
MMA-Sim's zero exponent is -133). Skipped where mmasim is not installed
(`make setup` installs it with the dev extra).
"""

from __future__ import annotations

import numpy as np
import pytest

from precisionlab.numerics import accumulators as acc

torch = pytest.importorskip("torch")
sim = pytest.importorskip("mmasim.nv_ptx.sim")

# (precisionlab model, MMA-Sim shape and type, A's format, B's format); each format's torch dtype below.
CONFIGS = [
    ("hopper-fp8", "m64n8k32.f32.e4m3.e4m3", "fp8_e4m3", "fp8_e4m3"),
    ("hopper-fp8", "m64n8k32.f32.e4m3.e5m2", "fp8_e4m3", "fp8_e5m2"),
    ("hopper-fp8", "m64n8k32.f32.e5m2.e4m3", "fp8_e5m2", "fp8_e4m3"),
    ("hopper-fp8", "m64n8k32.f32.e5m2.e5m2", "fp8_e5m2", "fp8_e5m2"),
    ("hopper-fp8:bits=26:group=16", "m64n8k16.f32.bf16.bf16", "bf16", "bf16"),
    ("hopper-fp8:bits=26:group=16", "m64n8k16.f32.f16.f16", "fp16", "fp16"),
    ("hopper-fp8:bits=26:group=8", "m64n8k8.f32.tf32.tf32", "tf32", "tf32"),
]
TORCH = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "bf16": "bfloat16", "fp16": "float16",
         "tf32": "float32"}
# Written from each format's definition, not read from precisionlab's catalog.
LARGEST = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0, "bf16": 2.0**40, "fp16": 65504.0, "tf32": 2.0**40}
SMALLEST = {"fp8_e4m3": 2.0**-9, "fp8_e5m2": 2.0**-16, "bf16": 2.0**-133, "fp16": 2.0**-24, "tf32": 2.0**-136}
M = N = 8
# tf32 values are fp32 values with 10 fractional bits (the same emin, -126): the models take them as fp32.
OURS = {"tf32": "fp32"}


def _values(fmt: str, x: np.ndarray) -> torch.Tensor:
    """x rounded into fmt by torch (tf32: fp32 values cut to 10 fractional bits, as MMA-Sim's
    input truncation leaves them unchanged), as a torch tensor of fmt's storage dtype."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if fmt == "tf32":
        return (t.view(torch.int32) >> 13 << 13).view(torch.float32)
    return t.to(getattr(torch, TORCH[fmt]))


def _draw(kind: str, fmt: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal((rows, k))
    if kind == "positive":
        return rng.uniform(0.0, 1.0, (rows, k))
    if kind == "edges":  # zeros, the largest and smallest (subnormal) values, and values between
        pool = np.array([0.0, -0.0, LARGEST[fmt], -LARGEST[fmt], SMALLEST[fmt], -SMALLEST[fmt],
                         3 * SMALLEST[fmt], 1.0, -1.5, 2.0**-7])
        return rng.choice(pool, (rows, k))
    if kind == "zero_blocks":  # whole instructions of zero products beside ordinary ones
        x = rng.standard_normal((rows, k))
        x[:, : k // 2] = 0.0
        return x
    raise ValueError(kind)


def _mmasim(shape: str, a: torch.Tensor, b: torch.Tensor, c: np.ndarray) -> np.ndarray:
    """c + A @ B by MMA-Sim's dot-add, row i of A with column j of B, K walked instruction by instruction."""
    op = sim.WGMMA("Hopper", shape)
    av = a[:, None, :].expand(-1, b.shape[1], -1)
    bv = b.T[None, :, :].expand(a.shape[0], -1, -1)
    return op.dpa(av, bv, torch.from_numpy(c.astype(np.float32))).numpy()


def _ours(model: str, fa: str, fb: str, a: torch.Tensor, b: torch.Tensor, c: np.ndarray, backend: str):
    fa, fb = (OURS.get(f, f) for f in (fa, fb))
    a64 = a.to(torch.float64).numpy()
    b64 = b.to(torch.float64).numpy()
    m = acc.parse(model)
    if backend == "native":  # the library's C++ model: from +0, one format for both operands
        assert not c.any() and fa == fb
        return m.matmul(a64, b64, backend="native", dtype=fa)
    return m.accumulate(c.astype(np.float32), a64, b64, fa, fb)


def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("k", [32, 4096])
@pytest.mark.parametrize("kind", ["normal", "positive", "edges", "zero_blocks"])
@pytest.mark.parametrize("model, shape, fa, fb", CONFIGS)
def test_bit_for_bit_against_mmasim(model, shape, fa, fb, kind, k):
    rng = np.random.default_rng(abs(hash((shape, kind, k))) % 2**32)
    a = _values(fa, _draw(kind, fa, M, k, rng))
    b = _values(fb, _draw(kind, fb, k, N, rng).reshape(k, N))
    zero = np.zeros((M, N), np.float32)
    want = _bits(_mmasim(shape, a, b, zero))
    backends = ["numpy", "native"] if fa == fb else ["numpy"]
    for backend in backends:
        got = _bits(_ours(model, fa, fb, a, b, zero, backend))
        bad = np.argwhere(got != want)
        assert bad.size == 0, (f"{backend}: {len(bad)} of {want.size} outputs differ; first at {tuple(bad[0])}: "
                               f"MMA-Sim {want[tuple(bad[0])]:#010x}, precisionlab {got[tuple(bad[0])]:#010x}")


@pytest.mark.parametrize("model, shape, fa, fb", CONFIGS)
def test_cancellation_and_running_c_against_mmasim(model, shape, fa, fb):
    """Onto a non-zero c (normal, tiny and subnormal fp32 values): exact cancellation (x, -x pairs),
    and an all-zero instruction under a tiny c, which keeps c whole (MMA-Sim's zero exponent -133)."""
    rng = np.random.default_rng(7)
    k = 4 * acc.parse(model).group
    x = rng.standard_normal((M, k // 2))
    a = _values(fa, np.concatenate([x, x], axis=1))
    bx = rng.standard_normal((k // 2, N))
    b = _values(fb, np.concatenate([bx, -bx], axis=0))
    c = np.concatenate([rng.standard_normal((M // 2, N)), rng.standard_normal((M // 2, N)) * 2.0**-122],
                       axis=0).astype(np.float32)
    c[0, :4] = np.array([0x02FD9C00, 0x00000001, 0x00400000, 0x80012345], np.uint32).view(np.float32)
    assert (_bits(_ours(model, fa, fb, a, b, c, "numpy")) == _bits(_mmasim(shape, a, b, c))).all()
    zeros = _values(fa, np.zeros((M, k)))
    big = _values(fb, np.full((k, N), LARGEST[fb]))
    assert (_bits(_ours(model, fa, fb, zeros, big, c, "numpy")) == _bits(_mmasim(shape, zeros, big, c))).all()
