"""torch's precision switches, read, set and restored here and nowhere else.

An fp32 matmul's precision is decided by switches outside the call (TF32 on
the tensor cores, the float32 matmul precision, cuDNN's TF32), and torch's
defaults differ by version and device. Wherever fp32 results are compared the
switches are set explicitly (ieee_fp32), and every setting is undone on the
way out (restored_flags): a command leaves torch as it found it.
tests/test_torch_flags.py checks that no other module sets them.

torch is imported inside each function: a CPU path that needs no torch never
imports it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from precisionlab.runtime.torch_import import import_torch

# The GPU fp32 matmul modes, each named after the switch that selects it (matmul_mode).
FP32_OFF = "fp32 (tf32 off)"
TF32_ALLOW = "tf32 (allow_tf32=True)"
TF32_HIGH = "tf32 (precision='high')"
MEDIUM = "medium (precision='medium')"
TF32_FP32_PRECISION = "tf32 (fp32_precision='tf32')"  # torch >= 2.9 only


def torch_flags() -> dict:
    """Every switch that decides an fp32 matmul's precision, as torch reports it."""
    t = import_torch(optional=True)
    out = {"CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
    if t is None:
        return out
    m = t.backends.cuda.matmul
    out.update({
        "torch.backends.cuda.matmul.allow_tf32": m.allow_tf32,
        "torch.backends.cudnn.allow_tf32": t.backends.cudnn.allow_tf32,
        "torch.get_float32_matmul_precision()": t.get_float32_matmul_precision(),
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
            m.allow_bf16_reduced_precision_reduction,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
            m.allow_fp16_reduced_precision_reduction,
        "torch.are_deterministic_algorithms_enabled()": t.are_deterministic_algorithms_enabled(),
    })
    if hasattr(m, "fp32_precision"):
        out["torch.backends.cuda.matmul.fp32_precision"] = m.fp32_precision
    return out


@contextmanager
def restored_flags():
    """Whatever the body sets, the precision switches are as before afterwards."""
    t = import_torch(optional=True)
    if t is None:
        yield
        return
    m = t.backends.cuda.matmul
    saved = (m.allow_tf32, t.get_float32_matmul_precision(), getattr(m, "fp32_precision", None),
             t.backends.cudnn.allow_tf32)
    try:
        yield
    finally:
        # torch >= 2.9 refuses to *read* the legacy flags once the newer
        # fp32_precision has been set, but lets them be written: write the
        # legacy flags first, then put fp32_precision back as it was.
        # allow_tf32 goes before the precision string: written after, it
        # would turn a saved "medium" into "high".
        m.allow_tf32 = saved[0]
        t.set_float32_matmul_precision(saved[1])
        t.backends.cudnn.allow_tf32 = saved[3]
        if saved[2] is not None:
            m.fp32_precision = saved[2]


def _ieee(t) -> None:
    # The precision string first: allow_tf32 written after it agrees with it.
    t.set_float32_matmul_precision("highest")
    t.backends.cuda.matmul.allow_tf32 = False
    t.backends.cudnn.allow_tf32 = False


@contextmanager
def ieee_fp32():
    """fp32 means IEEE fp32 in the body: no TF32 in matmuls or convolutions,
    whatever torch's defaults; restored afterwards."""
    t = import_torch(optional=True)
    with restored_flags():
        if t is not None:
            _ieee(t)
        yield


def gpu_fp32_modes() -> list[str]:
    """The GPU fp32 matmul modes this torch offers a switch for."""
    t = import_torch(optional=True)
    modes = [FP32_OFF, TF32_ALLOW, TF32_HIGH, MEDIUM]
    if t is not None and hasattr(t.backends.cuda.matmul, "fp32_precision"):
        modes.append(TF32_FP32_PRECISION)
    return modes


@contextmanager
def matmul_mode(name: str):
    """One GPU fp32 matmul mode (gpu_fp32_modes), selected through the switch
    it names, from IEEE fp32; restored afterwards."""
    t = import_torch(optional=True)
    m = t.backends.cuda.matmul
    with restored_flags():
        _ieee(t)
        if name == TF32_ALLOW:
            m.allow_tf32 = True
        elif name == TF32_HIGH:
            t.set_float32_matmul_precision("high")
        elif name == MEDIUM:
            t.set_float32_matmul_precision("medium")
        elif name == TF32_FP32_PRECISION:
            m.fp32_precision = "tf32"
        elif name != FP32_OFF:
            raise ValueError(f"unknown matmul mode {name!r}")
        yield
