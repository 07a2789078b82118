#!/bin/bash
# gpu_delayed_check.sh: on a GPU machine, validate FP8 attention with delayed scaling on the GPU
# in one call (carry .deps): build with the Makefile; the layer-level test (test_attention_fp8_gpu:
# its "attn delayed" steps against the CPU emulation: histories bit for bit, saturation counts, O
# and gradients), the model-level test (test_model_gpu_fp8 without its timing section: "attn
# fp8_dm delayed" against the CPU model over AdamW steps), then train_gpt on small_125m with
# fp8_dm and delayed scaling for 40 steps (diagnostics at 20 and 40: saturation counts) and a
# resume from its step-20 checkpoint, whose losses must equal the first run's from there on (up to
# the dQ atomics). Prints the failures and a summary last. Logs in $OUT. About 4 minutes.
#   usage: bash scripts/gpu_delayed_check.sh   (CONFIG=... STEPS=40 DEVICE=gpu NO_TEST=1 to change)
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_delayed_out}
WORK=${WORK:-/tmp/gpu_delayed_work}
mkdir -p "$OUT" "$WORK"
. scripts/gpu_lib.sh  # CJ
summary=()
CONFIG=${CONFIG:-configs/small_125m.json} STEPS=${STEPS:-40} DEVICE=${DEVICE:-gpu}
HALF=$((STEPS / 2))
make -j16 SETUP=0 $CJ train_gpt build/tests/test_attention_fp8_gpu build/tests/test_model_gpu_fp8 >"$OUT/make.log" 2>&1 ||
  { tail -20 "$OUT/make.log"; echo "== build FAILED"; exit 1; }
if [ "${NO_TEST:-0}" != 1 ]; then
ATTN_FP8_TEST_SMALL=1 build/tests/test_attention_fp8_gpu >"$OUT/attn.log" 2>&1
summary+=("test_attention_fp8_gpu: $(grep -c '^ok - attn delayed' "$OUT/attn.log") delayed ok, $(grep -c '^FAIL - attn delayed' "$OUT/attn.log") delayed FAIL; $(tail -1 "$OUT/attn.log")")
grep -E "^FAIL|delayed step" "$OUT/attn.log" | head -20
FP8_SKIP_TIMING=1 build/tests/test_model_gpu_fp8 >"$OUT/model.log" 2>&1
summary+=("test_model_gpu_fp8: $(grep -c '^ok - attn fp8_dm delayed' "$OUT/model.log") delayed ok, $(grep -c '^FAIL - attn fp8_dm delayed' "$OUT/model.log") delayed FAIL; $(tail -1 "$OUT/model.log")")
grep -E "^FAIL|fp8_dm delayed: (loss|FP8 effect)" "$OUT/model.log" | head -20
fi
run() {  # run NAME [extra train_gpt args...]
  local name=$1; shift
  ./train_gpt --config "$CONFIG" --device "$DEVICE" --set train.steps="$STEPS" --set train.warmup_steps=5 \
    --set 'precision.attention="fp8_dm"' --set 'precision.attention_scaling="delayed"' \
    --set diagnostics.interval="$HALF" --set eval.interval="$HALF" --set eval.batches=2 --set eval.sample_interval=0 \
    --set checkpoint.interval="$HALF" --set log.interval=1 "$@" >"$OUT/train_$name.log" 2>&1
  echo "train_gpt $name exit $?"
}
run first --set "log.dir=$WORK/first" --set "checkpoint.dir=$WORK/ck"
ck=$(printf '%s/ck/step_%06d.ckpt' "$WORK" "$HALF"); [ -f "$ck" ] || ck=""
[ -n "$ck" ] && run resumed --set "log.dir=$WORK/resumed" --set "checkpoint.dir=$WORK/ck2" --resume "$ck"
python3 - "$OUT/train_first.log" "$OUT/train_resumed.log" "$STEPS" "$HALF" <<'PY' | tee "$OUT/resume.txt"
import re, sys
def losses(p):
    try: return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"step (\d+)/\d+ \| loss ([0-9.]+)", open(p).read())}
    except OSError: return {}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
steps, half = int(sys.argv[3]), int(sys.argv[4])
common = sorted(set(a) & set(b))
print(f"first run: loss {a.get(1, 'n/a')} at step 1, {a.get(steps, 'n/a')} at step {steps}")
if common:
    worst = max(abs(a[s] - b[s]) for s in common)
    print(f"resumed from step {half}: steps {common[0]}..{common[-1]}, max |loss difference| {worst:.4g}")
else:
    print("resumed run: no common steps (see the logs)")
PY
grep -h -A3 "saturated q/k/v" "$OUT/train_first.log" | head -8
echo "== summary"
for l in "${summary[@]}"; do echo "  $l"; done
cat "$OUT/resume.txt" | sed 's/^/  /'
