"""GPU tests carry @pytest.mark.gpu and skip cleanly, saying whether the
library or the device is what is missing. With PRECISIONLAB_REQUIRE_GPU=1
(make gpu-test) a missing GPU fails the run instead."""

import os
import sys
from pathlib import Path

import pytest

# torch checks CUBLAS_WORKSPACE_CONFIG at the first cuBLAS call of the process
# and keeps the answer: set it before any test's GPU matmul, or the
# deterministic-mode test of nondeterminism's cuBLAS mm is refused.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/emulate.py

# compare engine keeps the reference's logits between runs (io/reference_cache): the tests' runs keep
# theirs in a folder of their own, never the user's ~/.cache
if not os.environ.get("PRECISIONLAB_REFERENCE_CACHE"):
    import tempfile

    os.environ["PRECISIONLAB_REFERENCE_CACHE"] = tempfile.mkdtemp(prefix="precisionlab-reference-")

# Progress lines (runtime/progress) come once a run has lasted seconds, so on a loaded machine they would
# make a run's stderr depend on the load: the suite's runs are quiet unless a test asks for them
# (tests/test_progress.py sets the quiet period itself).
os.environ.setdefault("PRECISIONLAB_PROGRESS_AFTER", "off")


def _gpu_skip_reason() -> str | None:
    from precisionlab import native

    try:
        status = native.gpu_status()
    except native.RunError as e:
        return f"library missing: {e}"
    if status.count == 0:
        return f"no CUDA device: {status.reason}"
    return None


EMULATED = os.environ.get("PRECISIONLAB_EMULATED_GPU") == "1"  # make emu-test: the kernels on pl_emu


def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if not gpu_items:
        return
    reason = _gpu_skip_reason()
    if reason and os.environ.get("PRECISIONLAB_REQUIRE_GPU") == "1":
        raise pytest.UsageError(f"PRECISIONLAB_REQUIRE_GPU=1, but the GPU tests cannot run: {reason}")
    for item in gpu_items:
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
        elif EMULATED and "torch_cuda" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs torch's CUDA: not under the CPU emulator"))
        elif EMULATED and "emu_slow" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="too slow for the CPU emulator"))
    for item in items:
        if "emulator" in item.keywords and not EMULATED:
            item.add_marker(pytest.mark.skip(reason="runs under make emu-test only"))


@pytest.fixture(autouse=True)
def _no_debug_env(monkeypatch):
    monkeypatch.delenv("PRECISIONLAB_DEBUG", raising=False)
    yield


@pytest.fixture
def run(capsys, monkeypatch):
    """run(*args) -> helpers.StrictRun: precisionlab's main() as the console
    script runs it, in this process (fast; output captured)."""
    from helpers import StrictRun

    from precisionlab import cli as cli_mod

    def _run(*args: str) -> StrictRun:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["precisionlab", *args])
        with pytest.raises(SystemExit) as e:
            cli_mod.main()
        cap = capsys.readouterr()
        code = e.value.code if isinstance(e.value.code, int) else (0 if e.value.code is None else 1)
        return StrictRun(code, cap.out, cap.err)

    return _run
