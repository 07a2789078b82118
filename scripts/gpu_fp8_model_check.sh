#!/bin/bash
# gpu_fp8_model_check.sh: on a GPU machine, build with the Makefile and run the model-level FP8
# tests: test_model_gpu_fp8 (FP8 linears and FP8 attention in the GPU model against the CPU
# emulation of the same mode, the row-sum invariant inside the model), test_diagnostics_gpu (the
# diagnostics probes on the GPU against the CPU's), test_model_gpu (BF16 regressions). Then, with
# TRAIN=1, a short training run of configs/small_125m.json per attention mode with diagnostics
# on (the loss must fall; the diagnostics table is in each log). Logs in $OUT (or
# /tmp/gpu_fp8_model_out); a summary prints last.
#   usage: [TRAIN=1] [STEPS=60] bash scripts/gpu_fp8_model_check.sh
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, CJ
gpu_start /tmp/gpu_fp8_model_out
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=$(nproc)
summary=()
nvidia-smi --query-gpu=clocks.sm --format=csv,noheader 2>/dev/null  # (gpu_start printed the name)

echo "== build"
t0=$(date +%s)
if ! make -j"$(nproc)" SETUP=0 $CJ tests > "$OUT/make.log" 2>&1; then
  tail -20 "$OUT/make.log"
  echo "build FAILED"
  exit 1
fi
summary+=("build ok ($(( $(date +%s) - t0 )) s)")

for t in test_model_gpu_fp8 test_diagnostics_gpu test_model_gpu; do
  t0=$(date +%s)
  timeout 240 build/tests/$t > "$OUT/$t.log" 2>&1
  rc=$?
  grep -E "^FAIL" "$OUT/$t.log" | head -12
  summary+=("$t: $(tail -1 "$OUT/$t.log" | sed 's/^# //'), exit $rc, $(( $(date +%s) - t0 )) s")
done
# the numbers behind the tolerances
grep -E "^# (attn|fp8|bf16).*(loss cpu|FP8 effect|worst|next_logits)|^# invariant|^# (fp8_dm|fp8_naive) layer|^# bias" \
  "$OUT/test_model_gpu_fp8.log" "$OUT/test_diagnostics_gpu.log" | sed 's/^[^:]*:/  /' | cut -c1-200 | head -70
grep -E "rel L2 .*ratio" "$OUT/test_model_gpu_fp8.log" | awk '{for(i=1;i<=NF;i++) if($i=="ratio") r=$(i+1)+0; if (r>m) m=r} END {print "  worst per-tensor ratio (gpu-vs-cpu error / cpu fp8 effect):", m}'

if [ "${TRAIN:-0}" = 1 ]; then
  STEPS=${STEPS:-60}
  for mode in bf16 fp8_naive fp8_hybrid fp8_dm fp8_dm_approx; do
    t0=$(date +%s)
    timeout 100 ./train_gpt --config configs/small_125m.json --device gpu --set precision.attention=$mode \
      --set train.steps=$STEPS --set train.warmup_steps=10 --set diagnostics.interval=$((STEPS / 2)) \
      --set diagnostics.bias_probe_batches=4 --set log.interval=10 --set eval.interval=$STEPS \
      --set checkpoint.interval=0 --set checkpoint.keep=1 --set "log.dir=$OUT/run_$mode" \
      > "$OUT/train_$mode.log" 2>&1
    rc=$?
    first=$(grep -m1 -oE "loss [0-9.]+" "$OUT/train_$mode.log" | awk '{print $2}')
    last=$(grep -oE "loss [0-9.]+" "$OUT/train_$mode.log" | tail -1 | awk '{print $2}')
    tps=$(grep -oE "[0-9]+ tok/s" "$OUT/train_$mode.log" | tail -1)
    dm=$(grep -A30 "^diagnostics step" "$OUT/train_$mode.log" | grep -E "^ +[0-9]+ " | awk '{print $5}' | sort -g | tail -1)
    bias=$(grep -oE "bias ratio [0-9.]+" "$OUT/train_$mode.log" | tail -1)
    summary+=("train $mode: exit $rc, loss $first -> $last, $tps, max cancel residual $dm, $bias, $(( $(date +%s) - t0 )) s")
  done
  tail -40 "$OUT/train_fp8_dm.log"
fi

echo "== summary"
for s in "${summary[@]}"; do echo "  $s"; done
