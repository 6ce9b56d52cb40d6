"""scripts/scaled_mm_check.py (issue 27's H200 check of torch._scaled_mm
against the accumulator models), checked on the CPU where it can be: without
CUDA it says so in one line and exits 0; with the GPU product replaced by a
planted model (hopper-fp8 for use_fast_accum=True, promote:128 for False) its
bookkeeping must find exactly those, 100 % identical, as the best fits. What
the H200 itself answers stays owed to scripts/gpu_check.sh."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "scaled_mm_check.py"


def load():
    spec = importlib.util.spec_from_file_location("scaled_mm_check_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_without_cuda_one_line_exit_0():
    p = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("scaled_mm_check: skipped") and len(p.stdout.splitlines()) == 1


class _InProcess:
    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, items):
        return map(fn, items)


def test_planted_models_are_found_bit_for_bit(monkeypatch, tmp_path):
    import torch

    mod = load()
    planted = {True: "hopper-fp8", False: "promote:128"}
    monkeypatch.setattr(mod, "_gpu", lambda torch_, k, i, fast: mod._model_bits((planted[fast], k, i)))
    monkeypatch.setattr(mod, "_gpu_probe", lambda torch_, fast: mod._probe_model_bits(planted[fast]))
    monkeypatch.setattr(mod, "ProcessPoolExecutor", _InProcess)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "planted models")
    out = tmp_path / "scaled_mm.json"
    monkeypatch.setattr(sys, "argv", ["scaled_mm_check.py", "--quick", "--json", str(out)])
    assert mod.main() == 0
    res = json.loads(out.read_text())
    assert res["fast_best"] == "hopper-fp8" and res["slow_best"] == "promote:128"
    assert res["fast_probes"]["fit"] == ["hopper-fp8"] and "promote:128" in res["slow_probes"]["fit"]
    probe = res["fast_probes"]["probes"]["direction -u/4"]
    assert (probe["exact"], probe["gpu"]) == (256 - 2.0**-7, 256.0)
    assert "hopper-fp8:rounding=floor" not in probe["matches"]
    assert res["fast"]["hopper-fp8"]["share_identical"] == 1.0 and res["slow"]["promote:128"]["share_identical"] == 1.0
    # every other candidate differs somewhere: the sweep can tell B, g, the rounding and N apart
    others = [v["share_identical"] for side in ("fast", "slow") for m, v in res[side].items()
              if m != planted[side == "fast"]]
    assert others and max(others) < 1.0, others


def test_probes_read_each_parameter_off_one_output():
    """The crafted probes, on the CPU models themselves: each separates what its name says, and together they
    leave only the planted model among the fast candidates that differ in direction, B (up to 15), the group,
    the alignment or the output's width."""
    mod = load()
    out = {m: dict(zip((n for n, _ in mod.PROBES), mod._probe_outputs(mod._probe_model_bits(m)).view(np.float32), strict=True))
           for m in mod.FAST}
    u = 2.0**-5  # 256's unit at B = 14
    assert out["hopper-fp8"]["direction -u/4"] == 256 and out["hopper-fp8:rounding=floor"]["direction -u/4"] == 256 - u
    assert out["hopper-fp8:rounding=rne"]["direction -u/4"] == 256
    assert out["hopper-fp8"]["direction -3.5u"] == 256 - 3 * u
    assert out["hopper-fp8:rounding=rne"]["direction -3.5u"] == out["hopper-fp8:rounding=floor"]["direction -3.5u"] \
        == 256 - 4 * u
    kept = {b: [n for n in ("bits 2^-3", "bits 2^-4", "bits 2^-5", "bits 2^-6") if out[m][n] != 256]
            for b, m in ((12, "hopper-fp8:bits=12"), (13, "hopper-fp8:bits=13"), (14, "hopper-fp8"),
                         (15, "hopper-fp8:bits=15"))}
    assert kept == {12: ["bits 2^-3"], 13: ["bits 2^-3", "bits 2^-4"], 14: ["bits 2^-3", "bits 2^-4", "bits 2^-5"],
                    15: ["bits 2^-3", "bits 2^-4", "bits 2^-5", "bits 2^-6"]}, kept
    js = (4, 8, 16, 32, 48)
    for g, m in ((4, "hopper-fp8:group=4"), (16, "hopper-fp8:group=16"), (32, "hopper-fp8"),
                 (64, "hopper-fp8:group=64")):
        assert [j for j in js if out[m][f"group k={j}"] == 2.0**-7] == [j for j in js if j >= g], m
    for m, align, carry in (("hopper-fp8", 256 + u, 576), ("hopper-fp8:align=value", 256, 576),
                            ("hopper-fp8:out=24", 256 + u, 576 + u), ("hopper-fp8:align=value:out=24", 256, 576 + u)):
        assert (out[m]["align 24x24"], out[m]["out carry"]) == (align, carry), m
    res = mod._probes(mod._probe_model_bits("hopper-fp8"), True, mod.FAST)
    assert res["fit"] == ["hopper-fp8"], res["fit"]
