#!/usr/bin/env bash
# One device call: build, GPU tests, sanitizers, benchmark, and the GPU runs the
# issue notes quote. For the device tool:
#   run(command="bash scripts/gpu_check.sh", timeout_s=590)
# Results land in $OUT (or ./gpu_out): *.log and *.json.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
pl() { python3 -m precisionlab "$@"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
rm -f build/libprecisionlab.so precisionlab/lib/libprecisionlab.so
make lib PYTHON=python3 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "== gpu-test"; timeout 200 make gpu-test PYTHON=python3 > "$OUT/gpu-test.log" 2>&1; tail -15 "$OUT/gpu-test.log"
echo "== bench"; timeout 120 pl bench --quick --device cuda --json > "$OUT/bench.json" 2> "$OUT/bench.err"
python3 - "$OUT/bench.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    shape = "x".join(map(str, r.get("shape") or [r["n"]]))
    print(f"{r['section']:>10} {r['kernel']:>26} {r['dtype']:>5} {str(r['accumulator']):>5} {shape:>16} "
          f"{r['gbps']:8.1f} GB/s {r.get('tflops') or 0:7.1f} TF  vs={r['vs_baseline'] or 0:.3f} copy%={r.get('pct_of_copy') or 0:.1f}")
PY
echo "== runs"
timeout 40 pl accumulate --dtype bf16 --n 10000 --device cuda --json > "$OUT/accumulate.json" 2>&1
timeout 60 pl nondeterminism --device cuda --json > "$OUT/nondeterminism.json" 2>&1
timeout 60 pl tf32 --m 2048 --n 4096 --k 4096 --device cuda --json > "$OUT/tf32.json" 2>&1
for op in softmax rmsnorm matmul; do timeout 30 pl compare op $op --device cuda; done > "$OUT/compare.log" 2>&1
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for name in ("nondeterminism", "tf32"):
    try:
        d = json.load(open(f"{out}/{name}.json"))
    except Exception as e:
        print(name, "failed:", e); continue
    for r in d["rows"]:
        if r["device"] == "cuda" and r.get("section") not in ("k_sweep",):
            print(name, {k: r.get(k) for k in ("section", "variant", "mode", "distinct", "max_abs_diff", "rel_l2", "wrong", "tflops") if r.get(k) is not None})
PY
echo "== sanitize"; timeout 150 make sanitize PYTHON=python3 > "$OUT/sanitize.log" 2>&1; grep -E "ERROR SUMMARY|sanitize:" "$OUT/sanitize.log"
