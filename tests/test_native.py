"""The native boundary: loading, prototypes, statuses, and argument checks on
the C side (a bad call returns a status; it never crashes)."""

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from helpers import ROOT, cli
from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.errors import NoDeviceError, UsageError

FP32 = formats.get("fp32").code  # format codes by name, never literals

lib = native._load()
buf = (ctypes.c_double * 4)(1.0, 2.0, 3.0, 4.0)
out = ctypes.c_double()


def status_and_message(fn, *args):
    st = getattr(lib, fn)(*args)
    return st, lib.pl_last_error().decode()


def test_abi_and_strings():
    assert lib.pl_abi_version() == native.ABI_VERSION
    for s in range(native.OUT_OF_MEMORY + 1):
        assert lib.pl_error_string(s)
    assert lib.pl_error_string(999) == b"unknown status"
    assert "compiler=" in native.build_info()


@pytest.mark.parametrize("args, status, words", [
    ((None, 4, 2, 0, 0, ctypes.byref(out), None, None, None), native.NULL_POINTER, "x is NULL"),
    ((buf, 4, 2, 0, 0, None, None, None, None), native.NULL_POINTER, "result is NULL"),
    ((buf, 0, 2, 0, 0, ctypes.byref(out), None, None, None), native.INVALID_ARGUMENT, "n must be > 0"),
    ((buf, -3, 2, 0, 0, ctypes.byref(out), None, None, None), native.INVALID_ARGUMENT, "n must be > 0"),
    ((buf, 2**62, 2, 0, 0, ctypes.byref(out), None, None, None), native.SIZE_OVERFLOW, "overflows"),
    ((buf, 4, 17, 0, 0, ctypes.byref(out), None, None, None), native.INVALID_ARGUMENT, "unknown accumulator"),
    ((buf, 4, 2, 9, 0, ctypes.byref(out), None, None, None), native.INVALID_ARGUMENT, "unknown sum variant"),
    ((buf, 4, 2, 2, 0, ctypes.byref(out), None, None, buf), native.UNSUPPORTED, "trace"),
])
def test_accumulate_cpu_validates(args, status, words):
    st, msg = status_and_message("pl_accumulate_cpu", *args)
    assert st == status
    assert msg.startswith("pl_accumulate_cpu:") and words in msg


def test_round_validates():
    assert lib.pl_round(None, 4, 1, buf) == native.NULL_POINTER
    assert lib.pl_round(buf, 4, -1, buf) == native.INVALID_ARGUMENT
    assert lib.pl_round(buf, 2**62, 1, buf) == native.SIZE_OVERFLOW


def test_statuses_become_exceptions_with_the_c_message():
    with pytest.raises(UsageError, match="unknown accumulator format 42"):
        native.accumulate_cpu(np.ones(3), 42, "sequential")


def test_no_gpu_is_an_answer_not_an_error():
    status = native.gpu_status()
    assert status.count >= 0
    if status.count == 0:
        assert status.reason
        with pytest.raises(NoDeviceError):
            native.sum_cuda(np.ones(8), FP32, FP32, "tree")
        with pytest.raises(NoDeviceError):
            native.DeviceArray((8,), np.float32)


# pl_cuda_device_count's lines (cuda/runtime.cu) for the CUDA runtime's answers
INSUFFICIENT = ("no usable CUDA driver or device (cudaErrorInsufficientDriver: CUDA driver version is insufficient "
                "for CUDA runtime version)")
NO_DEVICE = "no usable CUDA driver or device (cudaErrorNoDevice: no CUDA-capable device is detected)"


def test_no_driver_reads_as_no_gpu_not_as_a_broken_install():
    # the static runtime without libcuda: "insufficient driver" although there is no driver at all
    reason = native.no_gpu_reason(INSUFFICIENT, 13000, 0, None)
    assert reason == "no GPU on this machine: no NVIDIA driver is installed"


def test_an_old_driver_is_named_with_both_versions():
    reason = native.no_gpu_reason(INSUFFICIENT, 13000, 12020, None)
    assert "driver supports CUDA up to 12.2" in reason and "runtime 13.0" in reason
    assert "update the driver" in reason and "cudaErrorInsufficientDriver" in reason


@pytest.mark.parametrize("line", [NO_DEVICE, "no CUDA device found"])
def test_no_device_reads_as_no_gpu(line):
    assert native.no_gpu_reason(line, 13000, 13000, None) == "no GPU on this machine: the NVIDIA driver sees no device"
    assert native.no_gpu_reason(line, 13000, 13000, "0") == "no GPU on this machine: the NVIDIA driver sees no device"
    assert "CUDA_VISIBLE_DEVICES=''" in native.no_gpu_reason(line, 13000, 13000, "")


def test_other_cuda_errors_pass_through():
    line = "no usable CUDA driver or device (cudaErrorDevicesUnavailable: CUDA-capable device(s) is/are busy)"
    assert native.no_gpu_reason(line, 13000, 13000, None) == line


def test_device_memory_calls_validate():
    assert lib.pl_device_free(None) == native.OK  # freeing NULL is a no-op, GPU or not
    assert lib.pl_device_alloc(16, None) in (native.NULL_POINTER, native.NO_CUDA)
    assert lib.pl_copy_to_host(None, None, 4) in (native.NULL_POINTER, native.NO_CUDA)


def test_cuda_entry_points_validate_before_touching_the_device():
    # Argument errors come first, with or without a GPU.
    st = lib.pl_sum_cuda(buf, 0, 1, 1, 0, 1, ctypes.byref(out))
    assert st in (native.INVALID_ARGUMENT, native.NO_CUDA)
    st = lib.pl_sum_cuda_device(None, 4, 1, 1, 0, None, 0, None)
    assert st in (native.NULL_POINTER, native.NO_CUDA)


def _run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env})


def test_library_not_found_is_told_apart_from_failed_to_load(tmp_path):
    r = cli("accumulate", "--n", "10", env={"PRECISIONLAB_LIB": str(tmp_path / "nope.so")})
    assert r.code == 1 and "does not exist" in r.err and "Traceback" not in r.err
    junk = tmp_path / "libjunk.so"
    junk.write_text("not a library")
    r = cli("accumulate", "--n", "10", env={"PRECISIONLAB_LIB": str(junk)})
    assert r.code == 1 and "found but failed to load" in r.err and "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) == 1


def test_search_order_env_then_package_then_build():
    paths = native.candidate_paths()
    assert paths[-2].parts[-2:] == ("lib", native.LIB_NAME)
    assert paths[-1].parts[-2:] == ("build", native.LIB_NAME)


def test_device_array_shapes_are_checked_before_any_allocation():
    with pytest.raises(native.UsageError, match="negative"):
        native.DeviceArray((-1, 4), np.float32)
    with pytest.raises(native.UsageError, match="too large"):
        native.DeviceArray((1 << 62, 4), np.float32)  # an int64 product would wrap to 0


# Every entry point of the prototype table, called with each pointer NULL, and
# with each integer argument in turn -1, -2^62, 0 and 99 and each float NaN,
# inf and -1 (the other arguments valid, over 64 KiB buffers: 99 elements of
# anything fit), in a child: a crash is a signal there. The raw device copies
# and frees are left out (their pointers are the caller's contract), as are
# sizes past the buffers (C cannot know a host buffer's length).
FUZZ_CHILD = textwrap.dedent("""
    import ctypes, json
    from precisionlab import native

    lib = native._load()
    INTS = (ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_size_t)
    SKIP = {"pl_device_free", "pl_copy_to_device", "pl_copy_to_host"}
    bufs = [ctypes.create_string_buffer(1 << 16) for _ in range(16)]

    def args_for(argtypes, null=False, override=None):
        out, k = [], 0
        for i, t in enumerate(argtypes):
            if override and i in override:
                out.append(override[i])
            elif t in INTS:
                out.append(1)
            elif t is ctypes.c_float:
                out.append(1.0)
            elif null:
                out.append(None)
            else:
                out.append(ctypes.cast(bufs[k], t))
                k += 1
        return out

    report = {"null_accepted": [], "calls": 0}
    for name, (res, argtypes) in native._PROTOTYPES.items():
        if name in SKIP or not argtypes:
            continue
        f = getattr(lib, name)
        f.restype, f.argtypes = res, argtypes
        if res is ctypes.c_int and any(t not in INTS and t is not ctypes.c_float for t in argtypes):
            report["calls"] += 1
            if f(*args_for(argtypes, null=True)) == 0:
                report["null_accepted"].append(name)
        for i, t in enumerate(argtypes):
            bad = ([-1, -(1 << 62), 0, 99] if t in (ctypes.c_int, ctypes.c_int64) else
                   [float("nan"), float("inf"), -1.0] if t is ctypes.c_float else [])
            for v in bad:
                if t is ctypes.c_int and v < -(1 << 31):
                    continue
                f(*args_for(argtypes, override={i: v}))
                report["calls"] += 1
    print(json.dumps(report))
""")


def test_every_entry_point_survives_hostile_arguments():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", FUZZ_CHILD], capture_output=True, text=True, env=env, timeout=300,
                       cwd=ROOT)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert report["calls"] > 400
    assert report["null_accepted"] == []  # every function refuses a NULL it needs
