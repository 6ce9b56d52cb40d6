"""The FlashAttention kernel (cuda/flash_attention.cu, version "tiled") on the
GPU against the library's host reference and the numpy emulator
(numerics/flash_attention.py), bit for bit (issue 27's hardware run).

The cases of tests/test_flash_attention_native.py (odd sizes, every P format,
lazy rescaling, causal) and, unless --quick, FP8 attention's published shape:
256 rows, S = 8192 keys, d = 128, Br = Bc = 64, e4m3 P with max_offset 8 and
the lazy-rescale threshold 4, logits of standard deviation 1.5 (saturating),
and the same with bf16 P. Prints per case the outputs (and lse values) that
differ from the host and from the emulator, and the largest distance in fp32
ulps; exit 1 if any differs. CUDA's float64 exp2 and log are within an ulp of
float64's, so a difference, if any, is a result within an ulp of an fp32
rounding boundary: the count says how often. Without a GPU (and without the
CPU emulator's library, PRECISIONLAB_EMULATED_GPU=1): one line, exit 0.

    python scripts/flash_check.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

# rows, keys, d, Br, Bc, P, max_offset, threshold, p_scale, causal, logit scale (tests' tuple layout)
LARGE = [(256, 8192, 128, 64, 64, "fp8_e4m3", 8.0, 4.0, 1.0, False, 1.5 ** 0.5),
         (256, 8192, 128, 64, 64, "bf16", 0.0, 0.0, 1.0, True, 1.5 ** 0.5)]


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance in fp32 ulps (ordered bit patterns) between a and b."""
    def key(x):
        i = np.asarray(x, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return int(np.max(np.abs(key(a) - key(b)))) if a.size else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the tests' small cases only")
    ap.add_argument("--json", help="write the rows here as well")
    args = ap.parse_args()
    from precisionlab import native
    from precisionlab.numerics import flash_attention as fa
    from test_flash_attention_gpu import run_gpu
    from test_flash_attention_native import CASES, configs, inputs

    if native.gpu_status().count == 0:
        print(f"flash_check: no GPU ({native.gpu_status().reason}): nothing to check")
        return 0
    rows, bad = [], 0
    cases = CASES + ([] if args.quick else LARGE)
    for i, case in enumerate(cases):
        q, k, v = inputs(case, i)
        emu_cfg, lib_cfg = configs(case)
        t = time.perf_counter()
        out, lse = run_gpu(q, k, v, lib_cfg)
        t_gpu = time.perf_counter() - t
        host_out, host_lse = native.flash_attention_cpu(q, k, v, lib_cfg)
        want = fa.attention(q, k, v, emu_cfg, track=False)
        emu_out, emu_lse = want.out.astype(np.float32), want.lse.astype(np.float32)
        row = {"rows": case[0], "keys": case[1], "d": case[2], "block_r": case[3], "block_c": case[4],
               "p_dtype": case[5], "max_offset": case[6], "rescale_threshold": case[7], "p_scale": case[8],
               "causal": case[9], "p_saturated": want.p_saturated, "lazy_skips": want.lazy_skips,
               "differ_host": int(np.count_nonzero(out.view(np.uint32) != host_out.view(np.uint32))),
               "differ_emulator": int(np.count_nonzero(out.view(np.uint32) != emu_out.view(np.uint32))),
               "lse_differ_host": int(np.count_nonzero(lse.view(np.uint32) != host_lse.view(np.uint32))),
               "lse_differ_emulator": int(np.count_nonzero(lse.view(np.uint32) != emu_lse.view(np.uint32))),
               "max_ulps_host": ulps(out, host_out), "max_ulps_emulator": ulps(out, emu_out),
               "outputs": int(out.size), "gpu_s": round(t_gpu, 4)}
        bad += row["differ_host"] + row["differ_emulator"] + row["lse_differ_host"] + row["lse_differ_emulator"]
        rows.append(row)
        print(" ".join(f"{key}={value}" for key, value in row.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"emulated": os.environ.get("PRECISIONLAB_EMULATED_GPU") == "1",
                                               "rows": rows}, indent=1))
    print(f"flash_check: {len(rows)} cases, {bad} outputs or lse values differing from the host or the emulator")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
