"""The FlashAttention kernel (cuda/flash_attention.cu, version 1 "tiled") on
the library's own device memory: bit for bit the numpy emulator
(numerics/flash_attention.py) and the host reference at the same knobs, on the
cases of tests/test_flash_attention_native.py (odd sizes, every P format, lazy
rescaling, causal). Runs on a GPU and on the CPU emulator (make emu-test),
where exp2 and log are the host's, as numpy's; on a GPU, CUDA's float64 exp2
and log are within an ulp of float64, which after the rounding to fp32 can
differ only where a result lies within that ulp of a rounding boundary."""

import ctypes

import numpy as np
import pytest

from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.numerics import flash_attention as fa
from test_flash_attention_native import CASES, bits, configs, inputs

pytestmark = pytest.mark.gpu


def run_gpu(q, k, v, cfg, variant: str = "tiled"):
    (rows, d), (keys, dv) = q.shape, v.shape
    dq, dk, dvv = (native.DeviceArray.from_numpy(np.ascontiguousarray(a, np.float32)) for a in (q, k, v))
    out, lse = native.DeviceArray((rows, dv), np.float32), native.DeviceArray((rows,), np.float32)
    native.flash_attention_cuda(dq.ptr, dk.ptr, dvv.ptr, rows, keys, d, dv, cfg, out.ptr, lse.ptr, variant)
    return out.numpy(), lse.numpy()


@pytest.mark.parametrize("variant", [v.name for v in native.variants("flash_attention", "cuda")])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_matches_the_emulator_and_the_host_bit_for_bit(case, variant):
    q, k, v = inputs(CASES[case], case)
    emu_cfg, lib_cfg = configs(CASES[case])
    want = fa.attention(q, k, v, emu_cfg, track=False)
    out, lse = run_gpu(q, k, v, lib_cfg, variant)
    assert np.array_equal(bits(out), bits(want.out))
    assert np.array_equal(bits(lse), bits(want.lse))
    host_out, host_lse = native.flash_attention_cpu(q, k, v, lib_cfg)
    assert np.array_equal(bits(out), bits(host_out)) and np.array_equal(bits(lse), bits(host_lse))


def test_tiles_past_48_kib_of_shared_memory_opt_in():
    """Br = Bc = 64 at d = 128 take 148 KiB of shared memory: the launch opts
    in (the emulator refuses past 48 KiB otherwise, as a GPU does)."""
    case = (70, 130, 128, 64, 64, "fp8_e4m3", 8.0, 4.0, 1.0, True, 1.5)
    emu_cfg, lib_cfg = configs(case)
    assert native.flash_attention_shared_bytes(128, 128, lib_cfg) > 48 * 1024
    q, k, v = inputs(case, 7)
    out, lse = run_gpu(q, k, v, lib_cfg)
    want = fa.attention(q, k, v, emu_cfg, track=False)
    assert np.array_equal(bits(out), bits(want.out)) and np.array_equal(bits(lse), bits(want.lse))


def test_gpu_entry_point_validates_its_arguments():
    d = native.DeviceArray((256,), np.float32)
    cfg = native.flash_config(4, 4, formats.get("bf16").code)
    with pytest.raises(native.UsageError, match="unknown flash_attention variant"):
        native._call("pl_flash_attention_cuda", d.ptr, d.ptr, d.ptr, 2, 2, 4, 4, ctypes.byref(cfg), d.ptr, None, 77)
    with pytest.raises(native.UsageError, match="does not run on the GPU"):
        native.flash_attention_cuda(d.ptr, d.ptr, d.ptr, 2, 2, 4, 4, cfg, d.ptr, None, "reference")
    with pytest.raises(native.UsageError, match="not a device pointer"):
        host = np.zeros(64, np.float32)
        native.flash_attention_cuda(host.ctypes.data, d.ptr, d.ptr, 2, 2, 4, 4, cfg, d.ptr, None)
    big = native.flash_config(1024, 1024, formats.get("bf16").code)
    with pytest.raises(native.UsageError, match="bytes of shared memory"):
        native.flash_attention_cuda(d.ptr, d.ptr, d.ptr, 2, 2, 4, 4, big, d.ptr, None)
    with pytest.raises(native.UsageError, match="p_scale"):
        native.flash_attention_cuda(d.ptr, d.ptr, d.ptr, 2, 2, 4, 4, native.flash_config(4, 4, 3, p_scale=-1.0),
                                    d.ptr, None)


def test_the_gpu_check_script_runs_on_the_emulator():
    """scripts/flash_check.py (the hardware run scripts/gpu_check.sh owes), its
    --quick cases on whatever device the library has: on a GPU, or under make
    emu-test the CPU emulator, every output and lse as the host's and the
    emulator's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, str(root / "scripts" / "flash_check.py"), "--quick"], capture_output=True,
                       text=True, cwd=root, env=dict(os.environ), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "6 cases, 0 outputs or lse values differing from the host or the emulator" in p.stdout, p.stdout
