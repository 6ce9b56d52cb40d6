"""scripts/build_llama_tools.sh (make llama-tools) without compiling: a cache
that already holds both binaries is a no-op (no pip, no cmake), and the
version comes from llama-cpp-python's pin in pyproject.toml."""

import os
import subprocess

from helpers import ROOT

SCRIPT = ROOT / "scripts" / "build_llama_tools.sh"


def _run(tmp_path, **env):
    e = {**os.environ, "PRECISIONLAB_CACHE": str(tmp_path), "PYTHON": "/nonexistent/python", **env}
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=e, timeout=60)


def test_an_existing_build_is_a_no_op(tmp_path):
    import re

    pin = re.search(r'"llama-cpp-python==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    bin_dir = tmp_path / f"llama.cpp-{pin}" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("llama-server", "llama-perplexity"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    p = _run(tmp_path)  # PYTHON points nowhere: any pip call would fail
    assert p.returncode == 0 and "already built" in p.stdout, p.stderr
    assert sorted(os.listdir(tmp_path)) == [f"llama.cpp-{pin}"]  # no work folder, no lock left behind


def test_a_half_cache_is_not_taken_for_a_build(tmp_path):
    """Only llama-server there: the script goes on to build (and here fails at
    pip, PYTHON pointing nowhere), never says it is built."""
    bin_dir = tmp_path / "llama.cpp-9.9.9" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "llama-server").write_text("#!/bin/sh\n")
    (bin_dir / "llama-server").chmod(0o755)
    p = _run(tmp_path, LLAMA_CPP_PYTHON_VERSION="9.9.9")
    assert p.returncode != 0 and "already built" not in p.stdout
    assert not (tmp_path / "llama.cpp-9.9.9" / "bin" / "llama-perplexity").exists()
