"""torch._scaled_mm against the accumulator models, bit for bit (H200 / Hopper).

256 random FP8 e4m3 problems of 64 x K x 64 (64 for each K below, standard
normal inputs, unit scales, fp32 output) run on the GPU with
use_fast_accum=True and False. Each output is compared with the CPU models of
precisionlab/numerics/accumulators.py: fast accumulation against hopper-fp8
(B, the group size, the cut's direction, the alignment and the output width swept), the slow path against
promote:N (N, B and the cut's direction swept). Prints, per candidate, the
share of bit-identical fp32 outputs, and the candidate that fits best; before
that, crafted probes (PROBES) that read the cut's direction, B, the group
size, the alignment and the output's width off single outputs, and the candidates that give every probe's output;
also the share of fast outputs whose fp32 mantissa ends in 23 - (B - 1) zero
bits (an accumulator that also cuts its output to B bits would leave them all
zero). Without CUDA: one line, exit 0.

    python scripts/scaled_mm_check.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KS = (128, 512, 2048, 4096)
PER_K = 64
SEARCH_PER_K = 8  # problems per K for the candidate sweep (the CPU models take ~0.1 s at K = 4096)
# The default hopper-fp8 is MMA-Sim's Hopper model (arXiv 2511.10909: products aligned on their factors'
# exponents, 13 fractional bits cut toward zero, each step's result cut to 14 bits); the candidates around it
# vary one field each: B, the group, the cut's direction (toward -inf, rounding=floor: a reading of
# DeepSeek-V3's "sign-fill right shifting"; to nearest), the alignment exponent (align=value: the exact
# product's) and the output's width (out=24: a plain fp32 result; with align=value, this project's model
# before MMA-Sim at B = 14). On random inputs these part at a share of the outputs large enough to rank them.
FAST = ["hopper-fp8"] + [f"hopper-fp8:bits={b}" for b in (12, 13, 15, 16, 22, 25)] + \
       [f"hopper-fp8:group={g}" for g in (4, 8, 16, 64)] + ["hopper-fp8:rounding=rne"] + \
       [f"hopper-fp8:{f}rounding=floor" for f in ("", "bits=13:", "bits=15:", "group=16:")] + \
       ["hopper-fp8:align=value", "hopper-fp8:out=24", "hopper-fp8:align=value:out=24", "exact", "fp32"]
SLOW = [f"promote:{n}" for n in (32, 64, 128, 256, 512)] + ["promote:128:bits=13", "promote:128:bits=15",
                                                             "promote:128:group=16", "promote:128:rounding=floor",
                                                             "promote:128:rounding=rne", "promote:128:out=24",
                                                             "promote:128:align=value:out=24", "fp32", "exact"]


def _problem(k: int, i: int):
    import ml_dtypes

    rng = np.random.default_rng([k, i])
    a = rng.standard_normal((64, k)).astype(ml_dtypes.float8_e4m3fn)
    b = rng.standard_normal((k, 64)).astype(ml_dtypes.float8_e4m3fn)
    return a, b


def _model_bits(args):
    model, k, i = args
    from precisionlab.numerics import accumulators

    a, b = _problem(k, i)
    return accumulators.parse(model).matmul(a.astype(np.float64), b.astype(np.float64),
                                            dtype="fp8_e4m3").view(np.uint32)


# Probes: crafted outputs that each read one parameter off the hardware
# directly, where the random problems only rank the candidates. Probe p is the
# output (p, p) of A (16 x 64) @ B (64 x 16): row p of A and column p of B hold
# its terms (a_k, b_k; b_k = 1 unless given), the rest zero, so each output is
# a sum of exactly representable e4m3 products. With the large term 256 = 2^8
# setting the group's exponent, B = 14 keeps multiples of u = 2^(8 - 13) = 2^-5:
#   direction: 256 - 2^-7 (-u/4): trunc and rne keep 256, floor gives 256 - u;
#              256 - 7 * 2^-6 (-3.5u): trunc 256 - 3u, rne and floor 256 - 4u;
#   bits:      256 + 2^-j survives iff 2^-j >= u, i.e. B >= 12 + (j - 3);
#   group:     +256, -256 at k = 0, 1 and 2^-7 at k = j: the small term is cut
#              away (aligned to 256) iff k = j lies in the first group (j < g),
#              and kept whole iff it starts a later group from c = 0;
#   align:     24 x 24 = 576 aligns at 2^(4 + 4) = 2^8 on its factors'
#              exponents (align=product), at 2^9 on its value's; with
#              20 x -16 = -320 and 2^-5 beside it the sum 256 + 2^-5 keeps its
#              last bit only when aligned at 2^8;
#   out:       448 + 128 + 2^-5 carries into 2^9, where a 14-bit result ends at
#              2^-4: the 2^-5 survives only in a full fp32 result (out=24), and
#              only in the last group (toward zero with O >= B, the next group
#              would cut c to B bits itself):
#              the terms sit at k = 61-63.
PROBE_K = 64
PROBES = ([("direction -u/4", {0: 256.0, 1: -2.0**-7}), ("direction -3.5u", {0: 256.0, 1: -7 * 2.0**-6})]
          + [(f"bits 2^-{j}", {0: 256.0, 1: 2.0**-j}) for j in (3, 4, 5, 6)]
          + [(f"group k={j}", {0: 256.0, 1: -256.0, j: 2.0**-7}) for j in (4, 8, 16, 32, 48)]
          + [("align 24x24", {0: (24.0, 24.0), 1: (20.0, -16.0), 2: 2.0**-5}),
             ("out carry", {61: 448.0, 62: 128.0, 63: 2.0**-5})])


def _terms(terms: dict) -> dict:
    """{k: (a_k, b_k)} of a probe's terms (a bare value: b_k = 1)."""
    return {k: v if isinstance(v, tuple) else (v, 1.0) for k, v in terms.items()}


def _probe_problem():
    import ml_dtypes

    assert len(PROBES) <= 16
    a, b = np.zeros((16, PROBE_K)), np.zeros((PROBE_K, 16))
    for p, (_, terms) in enumerate(PROBES):
        for k, (x, y) in _terms(terms).items():
            a[p, k], b[k, p] = x, y
    e4m3 = ml_dtypes.float8_e4m3fn
    for x in (a, b):
        assert np.array_equal(x.astype(e4m3).astype(np.float64), x)  # every probe value exact in e4m3
    return a.astype(e4m3), b.astype(e4m3)


def _probe_outputs(c_bits: np.ndarray) -> np.ndarray:
    """Each probe's output bits, (p, p), from a 16 x 16 product's."""
    return np.diagonal(c_bits)[:len(PROBES)].copy()


def _probe_model_bits(model: str) -> np.ndarray:
    from precisionlab.numerics import accumulators

    a, b = _probe_problem()
    return accumulators.parse(model).matmul(a.astype(np.float64), b.astype(np.float64),
                                            dtype="fp8_e4m3").view(np.uint32)


def _gpu_probe(torch, fast: bool) -> np.ndarray:
    return _gpu_product(torch, *_probe_problem(), fast)


def _probes(gpu_out: np.ndarray, fast: bool, models: list[str]) -> dict:
    """Each probe's GPU output (gpu_out: _gpu_probe's) beside its exact value, and the candidates that give it."""
    got = _probe_outputs(gpu_out)
    predicted = {m: _probe_outputs(_probe_model_bits(m)) for m in models}
    out = {}
    for row, (name, terms) in enumerate(PROBES):
        match = [m for m in models if predicted[m][row] == got[row]]
        value = float(got[row:row + 1].view(np.float32)[0])
        out[name] = {"exact": math.fsum(x * y for x, y in _terms(terms).values()), "gpu": value, "matches": match}
        print(f"  probe use_fast_accum={fast!s:5} {name:16} exact {out[name]['exact']:<12.9g} gpu {value:<12.9g} "
              f"matches: {_few(match) or 'none of the candidates'}", flush=True)
    every = [m for m in models if all(m in v["matches"] for v in out.values())]
    print(f"  probes for use_fast_accum={fast}: every probe's output from {', '.join(every) or 'no candidate'}")
    return {"probes": out, "fit": every}


def _few(names: list[str], most: int = 5) -> str:  # the log's line; the JSON keeps every name
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _gpu(torch, k: int, i: int, fast: bool) -> np.ndarray:
    return _gpu_product(torch, *_problem(k, i), fast)


def _gpu_product(torch, a: np.ndarray, b: np.ndarray, fast: bool) -> np.ndarray:
    ta = torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn).cuda()
    # _scaled_mm wants B column-major: the transpose of a row-major (N, K)
    tb = torch.from_numpy(np.ascontiguousarray(b.T).view(np.uint8)).view(torch.float8_e4m3fn).cuda().t()
    one = torch.ones((), dtype=torch.float32, device="cuda")
    c = torch._scaled_mm(ta, tb, scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
    return c.cpu().numpy().view(np.uint32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one K (512), 16 problems")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("scaled_mm_check: skipped, torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("scaled_mm_check: skipped, no CUDA device")
        return 0
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        print(f"scaled_mm_check: skipped, torch {torch.__version__} has no _scaled_mm / float8_e4m3fn")
        return 0
    ks, per_k, search = ((512,), 16, 4) if args.quick else (KS, PER_K, SEARCH_PER_K)
    t0 = time.perf_counter()
    gpu = {}
    try:
        for k in ks:
            for i in range(per_k):
                for fast in (True, False):
                    gpu[(k, i, fast)] = _gpu(torch, k, i, fast)
        probe_gpu = {fast: _gpu_probe(torch, fast) for fast in (True, False)}
        torch.cuda.synchronize()
    except RuntimeError as e:  # an FP8 GEMM this device or build refuses
        print(f"scaled_mm_check: skipped, torch._scaled_mm failed: {str(e).splitlines()[0][:200]}")
        return 0
    print(f"scaled_mm_check: {len(gpu)} GPU products in {time.perf_counter() - t0:.1f} s on "
          f"{torch.cuda.get_device_name()}")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ks": list(ks), "fast": {},
              "slow": {}}
    for label, fast, models in (("fast", True, FAST), ("slow", False, SLOW)):
        result[label + "_probes"] = _probes(probe_gpu[fast], fast, models)
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        for label, fast, models in (("fast", True, FAST), ("slow", False, SLOW)):
            # the default model on every problem, the other candidates on the first `search` of each K
            for model in models:
                n = per_k if model in ("hopper-fp8", "promote:128") else search
                tasks = [(model, k, i) for k in ks for i in range(n)]
                same = total = 0
                per_k_share = {}
                for (_m, k, i), bits in zip(tasks, pool.map(_model_bits, tasks), strict=True):
                    eq = int(np.count_nonzero(bits == gpu[(k, i, fast)]))
                    same += eq
                    total += bits.size
                    s, t = per_k_share.get(k, (0, 0))
                    per_k_share[k] = (s + eq, t + bits.size)
                share = same / total
                result[label][model] = {"share_identical": share,
                                        "by_k": {k: s / t for k, (s, t) in per_k_share.items()}}
                print(f"  use_fast_accum={fast!s:5} {model:24} identical {share:7.2%}  by K: "
                      + " ".join(f"{k}:{s / t:.0%}" for k, (s, t) in per_k_share.items()), flush=True)
            best = max(result[label], key=lambda m: result[label][m]["share_identical"])
            result[label + "_best"] = best
            print(f"  best for use_fast_accum={fast}: {best} ({result[label][best]['share_identical']:.2%} identical)")
    fast_bits = np.concatenate([gpu[(k, i, True)].ravel() for k in ks for i in range(per_k)])
    for b in (13, 14, 15):
        low = (1 << (24 - b)) - 1  # the fp32 mantissa bits below the top b significant ones
        share = float(np.mean((fast_bits & low) == 0))
        result[f"fast_outputs_within_{b}_bits"] = share
        print(f"  fast outputs with at most {b} significant bits: {share:.1%}")
    print(f"scaled_mm_check: done in {time.perf_counter() - t0:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
