"""The logits files docs/compare-builds.md compares: one text teacher-forced
through the embedded model's exports in llama.cpp (llama-cpp-python), written
as compare logits' files.

  ref.safetensors      the Hugging Face export in fp32 (torch): the reference
  f16.safetensors      gguf:f16 in llama.cpp, 2 threads       (build A)
  f16-t1.safetensors   gguf:f16 in llama.cpp, 1 thread        (the same build, run again)
  f16-fa.safetensors   gguf:f16 in llama.cpp, flash attention (the same weights, another attention kernel)
  q8_0.safetensors     gguf:q8_0 in llama.cpp, 2 threads      (build B)

Run: python scripts/builds_example.py [--tokens 512] [--out docs/data/builds]
(needs the engines: llama-cpp-python, gguf, transformers). Seedless: the
text, the exports and the forwards are deterministic.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--out", default="docs/data/builds")
    args = ap.parse_args()
    import torch

    from precisionlab.engines.registry import open_engine
    from precisionlab.experiments import logits as lexp
    from precisionlab.io import logits_file
    from precisionlab.runtime import torch_flags

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        hf = f"{tmp}/hf"
        run = [sys.executable, "-m", "precisionlab", "export"]
        subprocess.run([*run, "embedded", "--to", "hf", "--out", hf], check=True)
        for q in ("f16", "q8_0"):
            subprocess.run([*run, f"hf:{hf}", "--to", f"gguf:{q}", "--out", f"{tmp}/m-{q}.gguf"], check=True)
        specs = {"ref": f"hf:{hf}", "f16": f"llamacpp:{tmp}/m-f16.gguf,threads=2",
                 "f16-t1": f"llamacpp:{tmp}/m-f16.gguf,threads=1",
                 "f16-fa": f"llamacpp:{tmp}/m-f16.gguf,threads=2,flash=1","q8_0": f"llamacpp:{tmp}/m-q8_0.gguf,threads=2"}
        ref = open_engine(specs["ref"], "cpu")
        ids = lexp.token_ids(ref, lexp.default_text(), args.tokens + 1, "the held-out Shakespeare text")
        targets = np.asarray(ids[1:], dtype=np.int64)
        with torch_flags.ieee_fp32(), torch.no_grad():
            for name, spec in specs.items():
                eng = ref if name == "ref" else open_engine(spec, "cpu")
                model = eng.model("fp32")
                window = min(ref.window, eng.window)
                parts = [lexp.to_numpy(eng.forward(model, torch.tensor([ids[s:min(args.tokens, s + window)]]))[0])
                         for s in range(0, args.tokens, window)]
                logits = np.concatenate(parts).astype(np.float32)
                logits_file.write(str(out / f"{name}.safetensors"), logits, targets,
                                  {"model": spec.split(":", 1)[0] + " export of embedded", "window": window})
                print(name, spec, logits.shape, file=sys.stderr)


if __name__ == "__main__":
    main()
