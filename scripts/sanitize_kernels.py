"""Run every GPU kernel once on small odd sizes, for compute-sanitizer
(memcheck, racecheck) under `make sanitize`. Needs no torch. A kernel added to
the project adds its calls here."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from precisionlab import formats, native  # noqa: E402


def main() -> int:
    if native.gpu_status().count == 0:
        print(f"no GPU: {native.gpu_status().reason}", file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    calls = 0
    for n in (1, 33, 1025, 100_003):
        x = rng.standard_normal(n)
        for storage in formats.FORMATS.values():
            xs = storage.round(x)
            for acc in ("fp32", "bf16", "fp64"):
                for method in native.GPU_METHODS:
                    native.sum_cuda(xs, storage.code, formats.get(acc).code, method, runs=2)
                    calls += 1
    for rows, cols in ((1, 1), (3, 33), (2, 1000), (2, 4096), (1, 40000), (1, 151936)):
        x = rng.standard_normal((rows, cols))
        for name in ("fp32", "bf16", "fp16"):
            fmt = formats.get(name)
            xs = np.ascontiguousarray(fmt.round(x).astype(fmt.dtype))
            for method in native.SOFTMAX_METHODS:
                for masked in native.MASKED:
                    native.softmax_cuda(xs, fmt.code, method, masked)
                    calls += 1
    print(f"sanitize: {calls} kernel calls ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
