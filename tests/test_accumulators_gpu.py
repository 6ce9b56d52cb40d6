"""The accumulator models' GPU kernel (cuda/matmul_accumulator.cu) on the
library's own device memory: bit for bit the host reference, which
tests/test_accumulators.py holds to the numpy models and to the fractions
emulation, and here the numpy models directly too. Runs on a GPU and on the
CPU emulator (make emu-test)."""

import ctypes

import ml_dtypes
import numpy as np
import pytest

from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.numerics import accumulators as acc

pytestmark = pytest.mark.gpu

MODELS = ["exact", "fp32", "fp32:order=reverse", "fp32-pairwise", "fp32-pairwise:order=reverse", "hopper-fp8",
          "hopper-fp8:rounding=rne", "hopper-fp8:bits=10:group=4", "hopper-fp8:bits=40:group=31:order=reverse",
          "hopper-fp8:align=value:out=24", "hopper-fp8:bits=26:group=16", "hopper-fp8:out=6:rounding=floor",
          "promote:128", "promote:5:group=4:bits=12", "promote:40:rounding=rne"]
DTYPES = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "bf16": ml_dtypes.bfloat16, "fp32": np.float32}


def _model(a: acc.Accumulator):
    return native.accumulator(a.kind, a.bits, a.group, a.rounding, a.interval or 0, a.order, a.align, a.out_bits)


def _gpu(a: np.ndarray, b: np.ndarray, code: int, model, variant: str) -> np.ndarray:
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    (m, k), n = a.shape, b.shape[1]
    da, db, dc = native.DeviceArray.from_numpy(a), native.DeviceArray.from_numpy(b), native.DeviceArray((m, n), np.float32)
    native.matmul_acc_cuda(da.ptr, db.ptr, m, n, k, code, model, dc.ptr, variant)
    return dc.numpy()


@pytest.mark.parametrize("variant", [v.name for v in native.variants("matmul_acc", "cuda")])
@pytest.mark.parametrize("model", MODELS)
def test_gpu_matches_the_host_and_numpy_bit_for_bit(model, variant):
    m = acc.parse(model)
    rng = np.random.default_rng(MODELS.index(model))
    for k in (1, 3, 33, 129, 1031):
        for name, dtype in DTYPES.items():
            spread = 2.0 if name == "fp8_e4m3" else 30.0  # fp32, bf16: alignment shifts past 48 bits
            if m.kind == "exact":  # numpy's exact extraction takes a pass per ~50 bits of range: keep it short
                spread = min(spread, 6.0)
            a = (rng.standard_normal((3, k)) * np.exp2(rng.uniform(-spread, spread, (3, k)))).astype(dtype)
            b = (rng.standard_normal((k, 5)) * np.exp2(rng.uniform(-spread, spread, (k, 5)))).astype(dtype)
            a, b = a.astype(np.float64), b.astype(np.float64)
            code = formats.get(name).code
            got = _gpu(a, b, code, _model(m), variant)
            host = native.matmul_acc_cpu(a, b, code, _model(m))
            assert np.array_equal(got.view(np.uint32), host.view(np.uint32)), (model, k, name)
            assert np.array_equal(got.view(np.uint32), m.matmul(a, b, dtype=name).view(np.uint32)), (model, k, name)


def test_gpu_and_host_agree_outside_the_models_domain():
    """NaN and inf inputs, which the Python side refuses: NaN under the fused
    and exact models, IEEE's results under the fp32 ones, on both sides (a
    NaN's bits are the hardware's own: only where NaNs are is compared)."""
    a = np.array([[1.0, np.inf, 2.0], [1.0, 2.0, 3.0], [np.nan, 1.0, 1.0]], np.float32)
    b = np.array([[1.0], [1.0], [-np.inf]], np.float32)
    code = formats.get("fp32").code
    for model in MODELS:
        m = acc.parse(model)
        got, host = _gpu(a, b, code, _model(m), "thread_per_output"), native.matmul_acc_cpu(a, b, code, _model(m))
        assert np.isnan(got).tolist() == np.isnan(host).tolist(), model
        assert np.array_equal(got[~np.isnan(got)].view(np.uint32), host[~np.isnan(host)].view(np.uint32)), model
        ieee = m.kind in ("fp32", "fp32-pairwise")  # inf + (-inf) is NaN; 6 - inf is -inf
        assert np.isnan(got[:, 0]).tolist() == ([True, False, True] if ieee else [True, True, True]), model
        if ieee:
            assert got[1, 0] == -np.inf


def test_gpu_entry_point_validates_its_arguments():
    d = native.DeviceArray((64,), np.float32)
    code = formats.get("fp32").code
    with pytest.raises(native.UsageError, match="unknown matmul_acc variant"):
        native._call("pl_matmul_acc_cuda", d.ptr, d.ptr, 2, 2, 2, code, ctypes.byref(native.accumulator("fp32")),
                     d.ptr, 77)
    with pytest.raises(native.UsageError, match="does not run on the GPU"):
        native.matmul_acc_cuda(d.ptr, d.ptr, 2, 2, 2, code, native.accumulator("fp32"), d.ptr, "reference")
    with pytest.raises(native.UsageError, match="not a device pointer"):
        host = np.zeros(64, np.float32)
        native.matmul_acc_cuda(host.ctypes.data, d.ptr, 2, 2, 2, code, native.accumulator("fp32"), d.ptr)
    with pytest.raises(native.UsageError, match="bits must be in"):
        native.matmul_acc_cuda(d.ptr, d.ptr, 2, 2, 2, code, native.accumulator("hopper-fp8", bits=0), d.ptr)
