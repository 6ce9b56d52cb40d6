"""The native boundary: loading, prototypes, statuses, and argument checks on
the C side (a bad call returns a status; it never crashes)."""

import ctypes
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT, cli
from precisionlab import native
from precisionlab.errors import NoDeviceError, UsageError

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
            native.sum_cuda(np.ones(8), 1, 1, "tree")
        with pytest.raises(NoDeviceError):
            native.DeviceArray((8,), np.float32)


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
