"""The CPU emulator's own checks (tests/cuda_emu/selftest.cu): thread-block
clusters, distributed shared memory, cluster barriers and each block's own
shared memory while a cluster's blocks run together. Built here with g++
against the toolkit's headers, as make emu-test builds the library."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EMU = ROOT / "tests" / "cuda_emu"
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


@pytest.mark.skipif(not shutil.which("g++") or not (CUDA_HOME / "include" / "cuda_runtime.h").is_file(),
                    reason="needs g++ and the CUDA toolkit's headers")
def test_cluster_selftest(tmp_path):
    subprocess.run([sys.executable, str(EMU / "translate.py"), str(EMU), str(tmp_path)], check=True)
    exe = tmp_path / "selftest"
    subprocess.run(["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-U_FORTIFY_SOURCE", "-DPL_EMU",
                    f"-I{CUDA_HOME / 'include'}", f"-I{tmp_path}", "-include", str(EMU / "pl_emu.h"), "-o", str(exe),
                    str(tmp_path / "selftest.cpp"), str(EMU / "pl_emu.cpp"), "-lpthread"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("selftest: ok"), out.stdout + out.stderr
