"""Write docs/compare-pair.md's example files, docs/data/pairs/*.safetensors:
the independent plain-PyTorch Qwen3 of the tests (tests/qwen3_plain.py) on a
random tiny Hugging Face Qwen3 (seed 0), one sequence of 24 positions computed
whole and fed through the KV cache in chunks of 4, in fp32 and fp64; clean,
and with the chunk-boundary mask bug (the previous chunk's last position
hidden). Run from the repository root:

    PYTHONPATH=$PWD .venv/bin/python scripts/make_pair_examples.py
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, "tests")
from helpers import save_tiny_qwen  # noqa: E402
from qwen3_user_engine import engine  # noqa: E402

from precisionlab.io import logits_file  # noqa: E402

OUT = Path("docs/data/pairs")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(save_tiny_qwen(Path(tmp)))
        seq = np.random.default_rng(0).integers(1, 12, size=25).tolist()
        for bug, tag in ((None, "clean"), ("chunk_mask", "chunkbug")):
            e = engine(folder, bug)
            for dtype in ("fp32", "fp64"):
                m = e.model(dtype)
                whole = e.forward(m, torch.tensor([seq]))[0]
                feed = e.session(m)
                chunked = torch.cat([feed(seq[i:i + 4]) for i in range(0, len(seq), 4)])
                np_dt = np.float32 if dtype == "fp32" else np.float64
                for side, rows in (("whole", whole), ("chunked", chunked)):
                    logits_file.write(str(OUT / f"{tag}-{side}-{dtype}.safetensors"),
                                      rows.double().numpy().astype(np_dt)[:-1], np.array(seq[1:]),
                                      {"dtype": dtype, "model": f"plain-qwen3 ({tag})"})


if __name__ == "__main__":
    main()
