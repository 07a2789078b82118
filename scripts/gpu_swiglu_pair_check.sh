#!/bin/bash
# gpu_swiglu_pair_check.sh: on one H200, the per-tensor SwiGLU backward pair kernel (layers_fp8.cu,
# delayed scaling with F % 128 == 0) checked and measured in one call (carry .deps):
#   1. build; test_layers_fp8_gpu (codes against the unfused path and the host contract) and
#      test_model_gpu_fp8 without its timing section (fused against separate passes, F 256);
#   2. bench_fp8_quant with SWIGLU_BWD_PAIR=0 (the one-tile kernel) and with the pair, twice each;
#   3. paper_569m end to end with its own 32 micro-batches per step: bf16, delayed fp8_tensor;
#   4. the counts and the tables last. Logs in $OUT (default /tmp/gpu_swiglu_pair_out).
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_swiglu_pair_out
build_or_die train_gpt build/tests/test_layers_fp8_gpu build/tests/test_model_gpu_fp8 build/bench/bench_fp8_quant
FP8_SKIP_TIMING=1 run_test test_layers_fp8_gpu
FP8_SKIP_TIMING=1 run_test test_model_gpu_fp8
grep -E "^# fusion fp8_tensor delayed" "$OUT/test_model_gpu_fp8.log" | cut -c1-200
for r in 1 2; do
  SWIGLU_BWD_PAIR=0 build/bench/bench_fp8_quant >"$OUT/one_$r.md" 2>&1
  build/bench/bench_fp8_quant >"$OUT/pair_$r.md" 2>&1
done
OUT="$OUT/e2e" WORK=/tmp/swiglu_pair_e2e NO_TEST=1 ACCUM=32 STEPS=5 SKIP=2 BUDGET=150 \
  RUNS="bf16:bf16:bf16:42 delayed:fp8_tensor:bf16:42:precision.linear_scaling=delayed" \
  bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/e2e.log" 2>&1
echo "== summary ($(elapsed) s)"
print_summary
for r in 1 2; do
  for k in one pair; do echo "$k $r: $(grep -E 'delayed: swiglu bwd fused|swiglu bwd bf16' "$OUT/${k}_$r.md" | tr -s ' ' | tr '\n' ' ')"; done
done
cat "$OUT"/e2e/table_*.md 2>/dev/null || tail -12 "$OUT/e2e.log"
