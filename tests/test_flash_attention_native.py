"""The library's FlashAttention forward pass (cuda/flash_attention.cu, its host
reference here; tests/test_flash_attention_gpu.py the kernel) bit for bit
against the numpy emulator (numerics/flash_attention.py) at the same knobs,
on random inputs of odd sizes (S not a multiple of Bc, rows not a multiple of
Br, d = 40 and 64), and its argument checks."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np
import pytest

from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.numerics import flash_attention as fa

# (rows, keys, d, block_r, block_c, p_dtype, max_offset, threshold, p_scale, causal, logit scale):
# every P format; lazy rescaling (threshold > 0) and eager; FP8's offset 8 with
# wide logits (saturation); a p_scale; causal with rows < keys; tiles of one key.
CASES = [
    (37, 101, 40, 16, 32, "bf16", 0.0, 0.0, 1.0, False, 2.0),
    (50, 77, 64, 8, 16, "fp8_e4m3", 8.0, 4.0, 1.0, False, 3.0),
    (33, 90, 40, 16, 8, "fp32", 0.0, 2.0, 1.0, True, 2.0),
    (20, 70, 64, 4, 32, "fp8_e5m2", 4.0, 0.0, 2.0, True, 1.0),
    (21, 45, 40, 64, 7, "fp16", 2.0, 3.0, 0.5, False, 2.0),
    (9, 9, 64, 3, 1, "bf16", 0.0, 1.0, 1.0, True, 4.0),
]


def inputs(case: tuple, seed: int):
    rows, keys, d, *_, spread = case
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((rows, d)) * spread).astype(np.float32)
    k = (rng.standard_normal((keys, d)) * spread).astype(np.float32)
    v = rng.standard_normal((keys, d)).astype(np.float32)
    return q, k, v


def configs(case: tuple):
    """(numpy emulator's FlashConfig, the library's pl_flash_config) of one case."""
    _, _, _, br, bc, p, offset, threshold, p_scale, causal, _ = case
    emu = fa.FlashConfig(block_r=br, block_c=bc, p_dtype=p, max_offset=offset, rescale_threshold=threshold,
                         p_scale=p_scale, causal=causal)
    lib = native.flash_config(br, bc, formats.get(p).code, causal, offset, threshold, p_scale)
    return emu, lib


def bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_host_reference_matches_the_emulator_bit_for_bit(case):
    q, k, v = inputs(CASES[case], case)
    emu_cfg, lib_cfg = configs(CASES[case])
    want = fa.attention(q, k, v, emu_cfg, track=False)
    out, lse = native.flash_attention_cpu(q, k, v, lib_cfg)
    assert np.array_equal(bits(out), bits(want.out))
    assert np.array_equal(bits(lse), bits(want.lse))


def test_the_cases_exercise_the_knobs():
    """The bit-for-bit cases would catch a knob the library ignores: each
    changes the emulator's result, lazy rescaling skips some rescales, and
    FP8 with offset 8 saturates."""
    q, k, v = inputs(CASES[1], 1)
    emu_cfg, _ = configs(CASES[1])
    run = fa.attention(q, k, v, emu_cfg, track=False)
    assert run.p_saturated > 0 and run.lazy_skips > 0
    for change in ({"max_offset": 4.0}, {"rescale_threshold": 0.0}, {"p_dtype": "bf16"}, {"block_c": 32},
                   {"p_scale": 0.5}, {"causal": True}):
        other = fa.attention(q, k, v, replace(emu_cfg, **change), track=False).out
        assert not np.array_equal(bits(other), bits(run.out)), change


def test_softmax_scale_is_passed_through():
    q, k, v = inputs(CASES[0], 0)
    emu_cfg, _ = configs(CASES[0])
    want = fa.attention(q, k, v, replace(emu_cfg, softmax_scale=0.3), track=False).out
    lib = native.flash_config(16, 32, formats.get("bf16").code, softmax_scale=0.3)
    assert np.array_equal(bits(native.flash_attention_cpu(q, k, v, lib)[0]), bits(want))


def _call(*args):
    native._call("pl_flash_attention_cpu", *args)


def test_host_entry_point_validates_its_arguments():
    x = np.zeros(64, np.float32)
    p = x.ctypes.data
    good = native.flash_config(4, 4, formats.get("bf16").code)
    cfg = ctypes.byref(good)
    with pytest.raises(native.UsageError, match="k is NULL"):
        _call(p, None, p, 2, 2, 4, 4, cfg, p, None)
    with pytest.raises(native.UsageError, match="cfg is NULL"):
        _call(p, p, p, 2, 2, 4, 4, None, p, None)
    with pytest.raises(native.UsageError, match="must be > 0"):
        _call(p, p, p, 2, 0, 4, 4, cfg, p, None)
    with pytest.raises(native.UsageError, match="S \\* d overflows"):
        _call(p, p, p, 2, 2**40, 2**30, 4, cfg, p, None)
    for field, value, message in (("block_c", 0, "block_r and block_c"), ("block_r", 5000, "block_r and block_c"),
                                  ("p_format", formats.get("fp64").code, "p_format fp64"), ("p_format", 99, "unknown"),
                                  ("max_offset", -1.0, "max_offset"), ("rescale_threshold", float("nan"), "threshold"),
                                  ("p_scale", 0.0, "p_scale"), ("softmax_scale", float("inf"), "softmax_scale"),
                                  ("causal", 2, "causal must be")):
        bad = native.flash_config(4, 4, formats.get("bf16").code)
        setattr(bad, field, value)
        with pytest.raises(native.UsageError, match=message):
            _call(p, p, p, 2, 2, 4, 4, ctypes.byref(bad), p, None)
    causal = native.flash_config(4, 4, formats.get("bf16").code, causal=True)
    with pytest.raises(native.UsageError, match="rows <= keys"):
        _call(p, p, p, 3, 2, 4, 4, ctypes.byref(causal), p, None)
    _call(p, p, p, 2, 2, 4, 4, cfg, p, None)  # lse may be NULL


def test_shared_bytes_count_the_tiles():
    cfg = native.flash_config(16, 32, formats.get("bf16").code)
    # Q block, K and V tiles, the scores, the O block, three per-row values; fp32 each
    assert native.flash_attention_shared_bytes(40, 64, cfg) == 4 * (16 * 40 + 32 * (40 + 64) + 16 * 32 + 16 * 64 + 48)
