#!/bin/bash
# gpu_fp8_tensor_check.sh: on a GPU machine, fp8_tensor with the producers taking the amax
# (layers.h's *_amax_gpu, fp8_quantize_gpu_amax_ready) checked and timed in one call (carry .deps):
#   1. build (make, cJSON from .deps/cjson when present);
#   2. test_layers_gpu (every amax layer against the plain layer and the host's amax),
#      test_linear_fp8_gpu's quantization part (per tensor with the amax given) and
#      test_model_gpu_fp8 without its timing section (counts, fusion on against off);
#   3. paper_569m end to end (scripts/gpu_fp8_linear_e2e.sh): bf16, fp8_tensor with the amax taken
#      by the producers, fp8_tensor with the amax passes (TRAIN_GPT_FP8_FUSE=0), fp8_block and
#      fp8_block with x^T in 128x128 blocks for wgrad (precision.linear_wgrad_blocks), and the
#      seed noise; the table last.
# Logs in $OUT (default /tmp/gpu_fp8_tensor_out). About 3 minutes on one H200.
#   usage (device tool, carry [".deps"]): bash scripts/gpu_fp8_tensor_check.sh   (NO_TEST=1, STEPS=24)
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_fp8_tensor_out
build_or_die train_gpt build/tests/test_layers_gpu build/tests/test_linear_fp8_gpu build/tests/test_model_gpu_fp8
if [ "${NO_TEST:-0}" != 1 ]; then
  for t in test_layers_gpu test_linear_fp8_gpu test_model_gpu_fp8; do
    FP8_TEST_QUANT_ONLY=1 FP8_SKIP_TIMING=1 TEST_TIMEOUT=240 run_test "$t"
  done
  grep -E "^# fusion fp8_tensor" "$OUT/test_model_gpu_fp8.log" | cut -c1-200
fi
OUT="$OUT/e2e" NO_TEST=1 STEPS=${STEPS:-24} BUDGET=${BUDGET:-300} RUNS="bf16:bf16:bf16:42 fp8_tensor:fp8_tensor:bf16:42 \
fp8_tensor_amax_pass:fp8_tensor:bf16:42:TRAIN_GPT_FP8_FUSE=0 fp8_block:fp8_block:bf16:42 \
fp8_block_wg_act:fp8_block:bf16:42:precision.linear_wgrad_blocks=activation bf16_seed43:bf16:bf16:43" \
  bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/e2e.log" 2>&1
echo "e2e exit $? at $(elapsed) s"
grep -E "exit [1-9]|rror" "$OUT/e2e.log" | head -5
echo "== summary ($(elapsed) s)"
print_summary
sed -n '/^| paper_569m run/,$p' "$OUT/e2e.log"
