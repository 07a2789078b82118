#!/bin/bash
# gpu_train_check.sh: on a GPU machine, in one go, the end-to-end check of GPU training:
#   1. build train_gpt and every test (make, cJSON from .deps/cjson when present);
#   2. train the 125M config (configs/small_125m.json) for 300 steps on the GPU, evaluating every
#      50, and check that its printed GPU memory plan equals `--dry-run`'s byte for byte;
#      sample from its checkpoint on the GPU;
#   3. the tiny config on the GPU: 60 steps straight, and 30 + --resume to 60 (the resumed
#      losses follow the straight run's to FP32 rounding: the attention dQ atomics make GPU runs
#      not bitwise repeatable, see backend.h);
#   4. `make test` (all tests, the GPU ones included), in the time left;
#   5. a short table last: tests, the 125M val loss curve, tokens/s, MFU, plan, resume.
# Run dirs live in $WORK (default /tmp/gpu_train_check); logs and the table go to $OUT (default
# /tmp/gpu_train_out), at most 8 small files.
#   usage: bash scripts/gpu_train_check.sh [STEPS]      (STEPS for the 125M run, default 300)
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_train_out}
WORK=${WORK:-/tmp/gpu_train_check}
STEPS=${1:-300}
BUDGET=${BUDGET:-400}  # seconds for the whole script; the tests get what is left
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK"
. scripts/gpu_lib.sh  # t_start, elapsed, left, CJ
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader

echo "== 1. build ($(elapsed) s)"
timeout 260 make -j16 SETUP=0 $CJ train_gpt tests >"$OUT/build.log" 2>&1
build_rc=$?
grep -E "error|warning" "$OUT/build.log" | grep -v C7519 | head -10
echo "build exit $build_rc in $(elapsed) s"
if [ ! -x ./train_gpt ]; then tail -20 "$OUT/build.log"; echo "no train_gpt: stopping"; exit 1; fi

echo "== 2. 125M on the GPU, $STEPS steps ($(elapsed) s)"
run=$WORK/run125m
set -- --config configs/small_125m.json --device gpu --set train.steps=$STEPS --set eval.interval=50 \
  --set train.warmup_steps=30 --set log.interval=25 --set checkpoint.interval=0 --set checkpoint.keep=1 \
  --set "log.dir=$run"
timeout 150 ./train_gpt "$@" >"$OUT/run125m.log" 2>&1
r125=$?
grep -E "^(note|device|model|batch|GPU memory|step [0-9]+/[0-9]+ \| val|done)|train_gpt: error" "$OUT/run125m.log" | head -30
tail -3 "$OUT/run125m.log"
cp "$run/metrics.jsonl" "$OUT/metrics125m.jsonl" 2>/dev/null
./train_gpt "$@" --dry-run >"$WORK/dry125m.txt" 2>&1
sed -n '/^GPU memory plan/,/^  total/p' "$OUT/run125m.log" | tail -n +2 >"$WORK/plan_run"
sed -n '/^memory plan:/,/^  total/p' "$WORK/dry125m.txt" | tail -n +2 >"$WORK/plan_dry"
if [ -s "$WORK/plan_run" ] && cmp -s "$WORK/plan_run" "$WORK/plan_dry"; then plan="printed plan == --dry-run (byte for byte)"
else plan="MISMATCH: $(diff "$WORK/plan_run" "$WORK/plan_dry" | tr '\n' ' ' | cut -c1-300)"; fi
echo "plan: $plan"; cat "$WORK/plan_run"
timeout 60 ./train_gpt sample --checkpoint "$run" --device gpu --tokens 40 --seed 1 >"$WORK/sample.txt" 2>"$WORK/sample.err"
srv=$?
echo "sample (exit $srv): $(head -c 300 "$WORK/sample.txt" | tr '\n' ' ')"; tail -2 "$WORK/sample.err"

echo "== 3. tiny on the GPU: straight 60 steps vs 30 + --resume ($(elapsed) s)"
tiny() {  # log.dir, extra args...
  d=$1; shift
  timeout 60 ./train_gpt --config configs/tiny.json --device gpu --set train.steps=60 --set eval.interval=30 \
    --set eval.sample_interval=0 --set checkpoint.interval=0 --set log.interval=30 --set "log.dir=$d" "$@"
}
{ tiny "$WORK/tiny_full"; echo "exit $?"; tiny "$WORK/tiny_res" --stop-after 30; echo "exit $?";
  tiny "$WORK/tiny_res" --resume; echo "exit $?"; } >"$OUT/tiny_resume.log" 2>&1
grep -E "^(resuming|stopped|done)|exit [0-9]|error" "$OUT/tiny_resume.log"
resume=$(python3 - "$WORK/tiny_full/metrics.jsonl" "$WORK/tiny_res/metrics.jsonl" <<'EOF'
import json, sys
def losses(p):
    try: rows = [json.loads(l) for l in open(p)]
    except Exception as e: return None
    return {r["step"]: r["loss"] for r in rows if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
if not a or not b or len(b) != 60 or len(a) != 60:
    print("FAILED (missing steps: straight %s, resumed %s)" % (len(a or {}), len(b or {}))); sys.exit()
same = max(abs(a[s] - b[s]) for s in range(1, 31))
after = max(abs(a[s] - b[s]) / a[s] for s in range(31, 61))
print("steps 1-30 max |diff| %.2g, steps 31-60 (resumed) max rel diff %.2g, loss %.3f -> %.3f: %s" %
      (same, after, a[1], a[60], "ok" if after < 2e-2 else "TOO FAR"))
EOF
)
echo "resume: $resume"

left=$(( BUDGET - $(elapsed) ))
[ $left -lt 30 ] && left=30
echo "== 4. make test (limit $left s, at $(elapsed) s)"
set -o pipefail
timeout $left make SETUP=0 $CJ test 2>&1 | tee "$OUT/test.log" | grep -E "^FAIL|^skipped|passed, .* failed$"
test_rc=$?
tests=$(grep -E "^[0-9]+ passed, [0-9]+ failed$" "$OUT/test.log" | tail -1)
[ -z "$tests" ] && tests="incomplete (exit $test_rc): $(grep -c '^ok - ' "$OUT/test.log") ok, $(grep -c '^FAIL - ' "$OUT/test.log") FAIL so far"

python3 - "$OUT/metrics125m.jsonl" "$r125" "$plan" "$resume" "$tests" "$srv" >"$OUT/summary.txt" <<'EOF'
import json, statistics, sys
path, rc, plan, resume, tests, srv = sys.argv[1:7]
try: rows = [json.loads(l) for l in open(path)]
except Exception: rows = []
val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
steps = [r for r in rows if "loss" in r]
warm = [r for r in steps if r["step"] > 10] or steps
tok = statistics.median(r["tokens_per_s"] for r in warm) if warm else float("nan")
mfu = [r["mfu"] for r in warm if r.get("mfu") is not None]
print("== gpu_train_check summary")
print("tests (make test):     %s" % tests)
print("125M run:              exit %s, %d steps" % (rc, len(steps)))
print("125M val loss:         %s" % "  ".join("%d: %.3f" % v for v in val))
if val: print("125M val first/last:   %.3f -> %.3f (%s)" % (val[0][1], val[-1][1], "falling" if val[-1][1] < val[0][1] else "NOT falling"))
if steps: print("125M train loss:       %.3f -> %.3f" % (steps[0]["loss"], steps[-1]["loss"]))
print("125M tokens/s:         %.0f (median of steps > 10)" % tok)
print("125M MFU:              %s" % ("%.1f%% (median, bf16 peak from gpu_info)" % (100 * statistics.median(mfu)) if mfu else "n/a"))
print("memory plan:           %s" % plan)
print("GPU sample:            exit %s" % srv)
print("tiny resume on GPU:    %s" % resume)
EOF
echo "(total $(elapsed) s)"
cat "$OUT/summary.txt"
