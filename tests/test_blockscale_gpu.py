"""The block-scaled GPU kernels (both quantize versions, the dequantize) on
the library's own device memory: bit for bit the host reference's output,
which tests/test_blockscale.py checks against the ml_dtypes emulation. Runs on
a GPU and on the CPU emulator (make emu-test)."""

import numpy as np
import pytest

from precisionlab import native

pytestmark = pytest.mark.gpu

CASES = [(f, r) for f in ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]
         for r in ["floor", "rceil", "ceil", "even"]] + [("nvfp4", "nearest")]


def _data(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(3, n) * 2.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    x[: min(n, 40)] = 0.0  # a zero block, a -0 and NaN / inf blocks past it
    if n > 100:
        x[3], x[50], x[70], x[99] = -0.0, np.nan, np.inf, -np.inf
    return x


def _gpu(x: np.ndarray, fmt: str, rule: str, block: int, version: str):
    n = x.size
    nb = -(-n // block)
    dx = native.DeviceArray.from_numpy(x)
    dc, ds = native.DeviceArray((n,), np.uint8), native.DeviceArray((nb,), np.uint8)
    amax = float(np.max(np.abs(x)))
    ts = native.blockscale_quantize_cuda(dx.ptr, n, fmt, rule, dc.ptr, ds.ptr, block=block, tensor_amax=amax,
                                         variant=version)
    dy = native.DeviceArray((n,), np.float32)
    native.blockscale_dequantize_cuda(dc.ptr, ds.ptr, ts, n, fmt, dy.ptr, block=block)
    return dc.numpy(), ds.numpy(), ts, dy.numpy()


@pytest.mark.parametrize("version", [v.name for v in native.variants("blockscale_quantize", "cuda")])
@pytest.mark.parametrize("fmt, rule", CASES)
def test_gpu_quantize_dequantize_match_the_host_bit_for_bit(fmt, rule, version):
    for n, block in [(1, 32), (33, 32), (1001, 16), (517, 17), (300, 1)]:
        x = _data(n, n + len(version))
        q = native.blockscale_quantize_cpu(x, fmt, rule, block)
        codes, scales, ts, y = _gpu(x, fmt, rule, block, version)
        assert np.array_equal(codes, q.codes), (fmt, rule, n, block)
        assert np.array_equal(scales, q.scales), (fmt, rule, n, block)
        assert np.float32(ts) == np.float32(q.tensor_scale)
        assert np.array_equal(y.view(np.uint32), native.blockscale_dequantize_cpu(q).view(np.uint32))


def test_gpu_entry_points_validate_their_arguments():
    d = native.DeviceArray((64,), np.float32)
    c = native.DeviceArray((64,), np.uint8)
    with pytest.raises(native.UsageError, match="variant"):
        native.blockscale_quantize_cuda(d.ptr, 64, "mxfp4", "floor", c.ptr, c.ptr, variant="thread_per_tensor")
    with pytest.raises(native.UsageError, match="not a device pointer"):
        host = np.zeros(64, np.float32)
        native.blockscale_quantize_cuda(host.ctypes.data, 64, "mxfp4", "floor", c.ptr, c.ptr)
    with pytest.raises(native.UsageError, match="block must be"):
        native.blockscale_dequantize_cuda(c.ptr, c.ptr, 1.0, 64, "mxfp4", d.ptr, block=0)


def test_formats_experiment_on_both_devices_agrees_bit_for_bit():
    """--device all quantizes on the host and the GPU and refuses a run whose bits differ."""
    from precisionlab.experiments import formats as exp

    cfg = exp.FormatsConfig(formats="mxfp4,nvfp4", blocks="32,7", dists="outlier_30x", n=999, shape="3x70x2",
                            baselines=False, device="all")
    rows = exp.run(cfg).rows
    assert len(rows) == 2 * 5  # mxfp4 x 4 rules + nvfp4, per block size
