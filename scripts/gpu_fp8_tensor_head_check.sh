#!/bin/bash
# gpu_fp8_tensor_head_check.sh: on one H200, fp8_tensor's FP8 LM head (linear_keep_lm_head_bf16
# false; its scales the micro-batch's: linear_fp8.c's contract) checked and measured in one call
# (carry .deps):
#   1. build; test_layers_fp8_gpu (the cross-entropy writing Q(dlogits), the codes' transpose),
#      test_linear_fp8_gpu's quantization part and test_model_gpu_fp8 without its timing section
#      (the FP8-head models against the CPU emulation, fused against separate passes, the plan);
#   2. paper_569m end to end with its own 32 micro-batches per step: bf16, delayed fp8_tensor,
#      the same with the FP8 head (E5M2 gradients), and with fast forward GEMMs too;
#   3. 150 steps of one micro-batch for the losses: bf16, delayed, delayed + FP8 head (E5M2 and
#      E4M3 gradients), bf16 with seed 43 (the noise);
#   4. the tables last. Logs in $OUT (default /tmp/gpu_fp8_tensor_head_out).
# SKIP_TESTS=1 leaves out step 1's tests (after a gpu_test_all.sh run of the same tree).
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_fp8_tensor_head_out
build_or_die train_gpt build/tests/test_layers_fp8_gpu build/tests/test_linear_fp8_gpu build/tests/test_model_gpu_fp8
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test test_layers_fp8_gpu
  FP8_TEST_QUANT_ONLY=1 run_test test_linear_fp8_gpu
  FP8_SKIP_TIMING=1 run_test test_model_gpu_fp8
  grep -E "FP8 LM head.*(loss|next_logits)|fusion .*LM head" "$OUT/test_model_gpu_fp8.log" | head -10 | cut -c1-160
fi
D=precision.linear_scaling=delayed
G=precision.linear_grad_format=e5m2
OUT="$OUT/e2e" WORK=/tmp/fp8_head_e2e NO_TEST=1 ACCUM=32 STEPS=5 SKIP=2 BUDGET=${BUDGET_E2E:-200} \
  RUNS="bf16:bf16:bf16:42 delayed:fp8_tensor:bf16:42:$D head:fp8_tensor+head:bf16:42:$D,$G head_fast:fp8_tensor+head:bf16:42:$D,$G,precision.linear_fast_accum=forward" \
  bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/e2e.log" 2>&1
OUT="$OUT/loss" WORK=/tmp/fp8_head_loss NO_TEST=1 STEPS=150 SKIP=10 BUDGET=${BUDGET_LOSS:-240} \
  RUNS="bf16:bf16:bf16:42 delayed:fp8_tensor:bf16:42:$D head_e5m2:fp8_tensor+head:bf16:42:$D,$G head_e4m3:fp8_tensor+head:bf16:42:$D bf16_seed43:bf16:bf16:43" \
  bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/loss.log" 2>&1
echo "== summary ($(elapsed) s)"
print_summary
cat "$OUT"/e2e/table_*.md 2>/dev/null || tail -8 "$OUT/e2e.log"
cat "$OUT"/loss/table_*.md 2>/dev/null || tail -8 "$OUT/loss.log"
