#!/usr/bin/env bash
# One device call: build, GPU tests, benchmark, the GPU runs the issue notes
# quote, and the sanitizers, most important first. For the device tool:
#   run(command="bash scripts/gpu_check.sh", timeout_s=590)
# Every step gets what is left of a 560 s budget at most, so the call returns
# with whatever finished. Results land in $OUT (or ./gpu_out): *.log, *.json,
# *.err, and steps.txt with each step's exit status and seconds.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
PL="python3 -m precisionlab"   # a variable, not a function: timeout runs programs only
T0=$SECONDS BUDGET=${BUDGET:-560}

# step NAME MAX_S CMD...: run CMD under a timeout of min(MAX_S, time left)
step() {
    local name=$1 max=$2; shift 2
    local left=$((BUDGET - (SECONDS - T0)))
    if ((left < 5)); then echo "$name: skipped, out of time" | tee -a "$OUT/steps.txt"; return 0; fi
    ((left < max)) && max=$left
    local t=$SECONDS
    timeout "$max" "$@"
    local rc=$?
    echo "$name: rc=$rc in $((SECONDS - t)) s (limit $max)" | tee -a "$OUT/steps.txt" >&2
    return $rc
}

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
command -v nvcc > /dev/null || export PATH=$PATH:/usr/local/cuda/bin
rm -f build/libprecisionlab.so precisionlab/lib/libprecisionlab.so
step build 240 make lib PYTHON=python3 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
grep -q "host-only" "$OUT/build.log" && { echo "built host-only: no nvcc"; exit 1; }
$PL info --json > "$OUT/info.json" 2> "$OUT/info.err"

echo "== gpu-test"
step gpu-test 200 make gpu-test PYTHON=python3 > "$OUT/gpu-test.log" 2>&1
tail -15 "$OUT/gpu-test.log"

echo "== bench"
step bench 120 $PL bench --quick --device cuda --json > "$OUT/bench.json" 2> "$OUT/bench.err"
python3 - "$OUT/bench.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as e:
    sys.exit(f"bench.json unreadable: {e}")
for r in rows:
    shape = "x".join(map(str, r.get("shape") or [r["n"]]))
    print(f"{r['section']:>10} {r['kernel']:>26} {r['dtype']:>5} {str(r['accumulator']):>5} {shape:>16} "
          f"{r['gbps']:8.1f} GB/s {r.get('tflops') or 0:7.1f} TF  vs={r['vs_baseline'] or 0:.3f} copy%={r.get('pct_of_copy') or 0:.1f}")
PY

echo "== runs"
step accumulate 40 $PL accumulate --dtype bf16 --n 10000 --device cuda --json > "$OUT/accumulate.json" 2> "$OUT/accumulate.err"
step nondeterminism 60 $PL nondeterminism --device cuda --json > "$OUT/nondeterminism.json" 2> "$OUT/nondeterminism.err"
step tf32 60 $PL tf32 --m 2048 --n 4096 --k 4096 --device cuda --json > "$OUT/tf32.json" 2> "$OUT/tf32.err"
step softmax 30 $PL softmax --device cuda --json > "$OUT/softmax.json" 2> "$OUT/softmax.err"
for op in softmax rmsnorm matmul; do step "compare-$op" 30 $PL compare op $op --device cuda; done > "$OUT/compare.log" 2>&1
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
            print(name, {k: r.get(k) for k in ("section", "variant", "mode", "distinct", "max_abs_diff", "rel_l2", "wrong", "tflops", "refused") if r.get(k) is not None})
PY

echo "== sanitize"
step sanitize 150 make sanitize PYTHON=python3 > "$OUT/sanitize.log" 2>&1
grep -E "ERROR SUMMARY|sanitize:" "$OUT/sanitize.log"
cat "$OUT/steps.txt"
