#!/bin/bash
# gpu_fp8_delayed_check.sh: on one H200, in one call, fp8_tensor with delayed scaling
# (precision.linear_scaling = "delayed") checked and measured (carry .deps):
#   1. build;
#   2. test_layers_fp8_gpu (the fused layers, per tensor with a given amax too),
#      test_linear_fp8_gpu's quantization part, test_model_gpu_fp8 without its timing section
#      (delayed: GPU against the CPU emulation with the histories filled, the histories compared,
#      fused against separate passes bit for bit);
#   3. paper_569m end to end, one micro-batch per step (STEPS, default 24): bf16, fp8_tensor
#      current, fp8_tensor delayed, bf16 seed 43 (the noise of the losses);
#   4. the same with the config's own 32 micro-batches per step (ACCUM, 5 steps, speed only);
#   5. the test counts and both tables last. Logs in $OUT (default /tmp/gpu_fp8_delayed_out).
# About 7 minutes.
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_fp8_delayed_out
build_or_die train_gpt build/tests/test_layers_fp8_gpu build/tests/test_linear_fp8_gpu build/tests/test_model_gpu_fp8
export FP8_TEST_QUANT_ONLY=1 FP8_SKIP_TIMING=1
for t in test_layers_fp8_gpu test_linear_fp8_gpu test_model_gpu_fp8; do run_test "$t"; done
unset FP8_TEST_QUANT_ONLY FP8_SKIP_TIMING
grep -E "delayed.*(amax histories|loss cpu|FP8 effect|fusion)|fusion fp8_tensor delayed" "$OUT/test_model_gpu_fp8.log" | head -12
echo "tests done at $(elapsed) s"
RUNS="bf16:bf16:bf16:42 fp8_tensor:fp8_tensor:bf16:42 delayed:fp8_tensor:bf16:42:precision.linear_scaling=delayed"
OUT="$OUT/steps" WORK=/tmp/delayed_steps NO_TEST=1 STEPS=${STEPS:-24} BUDGET=200 \
  RUNS="$RUNS bf16_seed43:bf16:bf16:43" bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/e2e_steps.log" 2>&1
echo "e2e (one micro-batch per step) done at $(elapsed) s"
OUT="$OUT/accum" WORK=/tmp/delayed_accum NO_TEST=1 ACCUM=${ACCUM:-32} STEPS=5 SKIP=2 BUDGET=200 RUNS="$RUNS" \
  bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/e2e_accum.log" 2>&1
echo "== summary ($(elapsed) s)"
print_summary
echo "== paper_569m, one micro-batch per step"; cat "$OUT"/steps/table_*.md 2>/dev/null || tail -15 "$OUT/e2e_steps.log"
echo "== paper_569m, ${ACCUM:-32} micro-batches per step"; cat "$OUT"/accum/table_*.md 2>/dev/null || tail -15 "$OUT/e2e_accum.log"
