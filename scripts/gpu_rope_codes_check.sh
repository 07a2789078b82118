#!/bin/bash
# gpu_rope_codes_check.sh: on one H200, the RoPE backward writing dqkv's per-tensor codes
# (layers_fp8.cu's rope_bwd_fp8_kernel, delayed fp8_tensor) checked and measured in one call
# (carry .deps):
#   1. build; test_layers_fp8_gpu (against rope_backward_gpu + fp8_quantize_gpu_delayed, code for
#      code), test_layers_gpu (the RoPE kernels now share lm_rope_lo / lm_rope_hi) and
#      test_model_gpu_fp8 without its timing section (5 fused producers per delayed block; fused
#      against separate passes bit for bit);
#   2. bench_fp8_quant's rope rows;
#   3. paper_569m end to end with its own 32 micro-batches per step: bf16, delayed fp8_tensor;
#   4. the counts and the tables last. Logs in $OUT (default /tmp/gpu_rope_codes_out).
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_rope_codes_out
build_or_die train_gpt build/tests/test_layers_fp8_gpu build/tests/test_layers_gpu build/tests/test_model_gpu_fp8 \
  build/bench/bench_fp8_quant
for t in test_layers_fp8_gpu test_layers_gpu test_model_gpu_fp8; do FP8_SKIP_TIMING=1 run_test "$t"; done
grep -E "^# fusion fp8_tensor delayed" "$OUT/test_model_gpu_fp8.log" | cut -c1-200
build/bench/bench_fp8_quant >"$OUT/quant.md" 2>&1
OUT="$OUT/e2e" WORK=/tmp/rope_codes_e2e NO_TEST=1 ACCUM=32 STEPS=5 SKIP=2 BUDGET=150 \
  RUNS="bf16:bf16:bf16:42 delayed:fp8_tensor:bf16:42:precision.linear_scaling=delayed" \
  bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/e2e.log" 2>&1
echo "== summary ($(elapsed) s)"
print_summary
grep -E "rope|delayed:" "$OUT/quant.md"
cat "$OUT"/e2e/table_*.md 2>/dev/null || tail -12 "$OUT/e2e.log"
