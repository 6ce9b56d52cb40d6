#!/usr/bin/env bash
# One device call: build, GPU tests, sanitizers, benchmark. For the device tool:
#   run(command="bash scripts/gpu_check.sh", timeout_s=540)
# Output lands in $OUT (or ./gpu_out): build.log, gpu-test.log, sanitize.log, bench.json.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
rm -f build/libprecisionlab.so precisionlab/lib/libprecisionlab.so
make lib PYTHON=python3 2>&1 | tee "$OUT/build.log" || exit 1
timeout 200 make gpu-test PYTHON=python3 2>&1 | tee "$OUT/gpu-test.log" | tail -25
timeout 120 make sanitize PYTHON=python3 2>&1 | tee "$OUT/sanitize.log" | tail -8
timeout 150 python3 -m precisionlab bench --quick --json > "$OUT/bench.json" 2> "$OUT/bench.err"
python3 - "$OUT/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r["device"] == "cuda":
        print(f"{r['kernel']:>24} {r['dtype']:>5} {str(r['accumulator']):>5} {r['gbps']:9.1f} GB/s "
              f"vs={r['vs_baseline']} copy%={r.get('pct_of_copy')}")
PY
