#!/usr/bin/env bash
# One device call: a one-second preflight, then build, the softmax and sum
# benchmark table, the FlashAttention kernel against its emulator, GPU tests, the GPU runs the issue notes quote,
# torch._scaled_mm against the accumulator models, and the sanitizers, most valuable first. For the device tool:
#   run(command="bash scripts/gpu_check.sh", timeout_s=480)
# Every step gets what is left of a 420 s budget at most (machine start-up
# and a rerun must fit in a 15-minute lease), so the call returns with
# whatever finished. The device tool brings back at most 8 files, so the
# logs, JSON and stderr of every step go into one archive, $OUT/gpu_check.tgz,
# refreshed after each step (a killed call still returns what was done);
# $OUT/steps.txt has each step's exit status and seconds. Without $OUT the
# results stay in ./gpu_out.
set -uo pipefail
OUT=${OUT:-gpu_out}
R=$(mktemp -d)   # the step outputs, archived into $OUT
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
PL="python3 -m precisionlab"   # a variable, not a function: timeout runs programs only
T0=$SECONDS BUDGET=${BUDGET:-420}
for tool in nvcc compute-sanitizer; do command -v $tool > /dev/null || export PATH=$PATH:/usr/local/cuda/bin; done

archive() { tar czf "$OUT/gpu_check.tgz" -C "$R" . 2> /dev/null; }

# step NAME MAX_S CMD...: run CMD under a timeout of min(MAX_S, time left)
step() {
    local name=$1 max=$2; shift 2
    local left=$((BUDGET - (SECONDS - T0)))
    if ((left < 5)); then echo "$name: skipped, out of time" | tee -a "$OUT/steps.txt" >&2; return 0; fi
    ((left < max)) && max=$left
    local t=$SECONDS
    timeout -k 10 "$max" "$@"
    local rc=$?
    echo "$name: rc=$rc in $((SECONDS - t)) s (limit $max)" | tee -a "$OUT/steps.txt" >&2
    archive
    return $rc
}

# preflight: every tool the steps need, in about a second
for tool in make tar timeout nvidia-smi nvcc python3; do
    command -v $tool > /dev/null || { echo "preflight: $tool missing" | tee -a "$OUT/steps.txt"; exit 1; }
done
python3 -c "import torch, numpy, typer, rich, ml_dtypes; assert torch.cuda.is_available(), 'torch sees no GPU'" \
    || { echo "preflight: python packages or torch CUDA missing" | tee -a "$OUT/steps.txt"; exit 1; }
echo "preflight: ok in $((SECONDS - T0)) s" | tee -a "$OUT/steps.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$R/gpu.txt"

rm -f build/libprecisionlab.so precisionlab/lib/libprecisionlab.so
step build 200 make lib PYTHON=python3 > "$R/build.log" 2>&1 || { tail -30 "$R/build.log"; exit 1; }
grep -q "host-only" "$R/build.log" && { echo "built host-only: no nvcc"; exit 1; }
step info 20 $PL info --json > "$R/info.json" 2> "$R/info.err"

echo "== bench (softmax and sum, beside torch and copy)"
step bench 120 $PL bench softmax,accumulate --quick --device cuda --json > "$R/bench.json" 2> "$R/bench.err"
python3 - "$R/bench.json" <<'PY' | tee "$R/bench.txt"
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as e:
    sys.exit(f"bench.json unreadable: {e}")
for r in rows:
    shape = "x".join(map(str, r.get("shape") or [r["n"]]))
    plan = (f" v{r['plan_kernel']} vpt{r['plan_vpt']} t{r['plan_threads']} rpb{r['plan_rows_per_block']} "
            f"cl{r['plan_cluster']} ran={r['plan_variant']}") if r.get("plan_kernel") is not None else ""
    spread = f" p10-p90 ms {r['p10_s'] * 1e3:.4f}-{r['p90_s'] * 1e3:.4f}" if r.get("p10_s") is not None else ""
    label = r["variant"] + (" " + r["mode"] if r.get("mode") else "") + (" s%d" % r["splits"] if r.get("splits") else "")
    print(f"{r['section']:>10} {label:>24} {r['dtype']:>5} {str(r['accumulator']):>5} {shape:>12} "
          f"{r['gbps']:8.1f} GB/s vs={r['vs_baseline'] or 0:.3f} copy%={r.get('pct_of_copy') or 0:.1f}{spread}{plan}")
PY

echo "== flash"   # the FlashAttention kernel bit for bit against the host and the numpy emulator (issue 27)
step flash 60 python3 scripts/flash_check.py --json "$R/flash.json" > "$R/flash.txt" 2>&1
tail -3 "$R/flash.txt"

echo "== gpu-test"
step gpu-test 150 make gpu-test PYTHON=python3 > "$R/gpu-test.log" 2>&1
tail -15 "$R/gpu-test.log"

echo "== runs"
step accumulate 30 $PL accumulate --dtype bf16 --n 10000 --device cuda --json > "$R/accumulate.json" 2> "$R/accumulate.err"
step nondeterminism 40 $PL nondeterminism --device cuda --sections atomics,splitk,batch,torch_ops --json > "$R/nondeterminism.json" 2> "$R/nondeterminism.err"
step tf32 40 $PL tf32 --m 2048 --n 4096 --k 4096 --device cuda --json > "$R/tf32.json" 2> "$R/tf32.err"
step softmax 20 $PL softmax --device cuda --json > "$R/softmax.json" 2> "$R/softmax.err"
for op in softmax rmsnorm matmul; do step "compare-$op" 20 $PL compare op $op --device cuda; done > "$R/compare.log" 2>&1
python3 - "$R" <<'PY' | tee "$R/runs.txt"
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

echo "== scaled_mm"   # torch._scaled_mm fast/slow accumulation against the CPU accumulator models (issue 27)
step scaled_mm 100 python3 scripts/scaled_mm_check.py --json "$R/scaled_mm.json" > "$R/scaled_mm.txt" 2>&1
tail -64 "$R/scaled_mm.txt"

echo "== sanitize"   # compute-sanitizer refuses the device on gVisor machines: see sanitize.log
step sanitize 150 make sanitize PYTHON=python3 > "$R/sanitize.log" 2>&1
grep -E "ERROR SUMMARY|sanitize:|not supported" "$R/sanitize.log"
archive
cat "$OUT/steps.txt"
