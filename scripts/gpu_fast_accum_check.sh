#!/bin/bash
# gpu_fast_accum_check.sh: on one H200, precision.linear_fast_accum checked and measured in one
# call (carry .deps):
#   1. build; test_linear_fp8_gpu (the fast-accumulation GEMM against the CPU emulation) and
#      test_model_gpu_fp8 without its timing section (the model with fast accumulation in every
#      fp8_tensor GEMM against the CPU emulation);
#   2. bench_fp8_gemm paper_569m (fp8_tensor promoted / fast accumulation, TFLOP/s);
#   3. paper_569m end to end with its own 32 micro-batches per step: bf16, delayed fp8_tensor,
#      delayed fp8_tensor with fast forward GEMMs (Transformer Engine's default), and with all
#      three GEMMs fast;
#   4. the tables last. Logs in $OUT (default /tmp/gpu_fast_accum_out).
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_fast_accum_out
build_or_die train_gpt build/tests/test_linear_fp8_gpu build/tests/test_model_gpu_fp8 build/bench/bench_fp8_gemm
for t in test_linear_fp8_gpu test_model_gpu_fp8; do FP8_SKIP_TIMING=1 run_test "$t"; done
grep -E "fast accumulation" "$OUT/test_linear_fp8_gpu.log" | head -6 | cut -c1-160
build/bench/bench_fp8_gemm paper_569m 16384 1536 3968 15 >"$OUT/gemm.md" 2>&1
D=precision.linear_scaling=delayed
OUT="$OUT/e2e" WORK=/tmp/fast_accum_e2e NO_TEST=1 ACCUM=32 STEPS=5 SKIP=2 BUDGET=${BUDGET:-330} \
  RUNS="bf16:bf16:bf16:42 delayed:fp8_tensor:bf16:42:$D delayed_fast_fwd:fp8_tensor:bf16:42:$D,precision.linear_fast_accum=forward delayed_fast_all:fp8_tensor:bf16:42:$D,precision.linear_fast_accum=all" \
  bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/e2e.log" 2>&1
echo "== summary ($(elapsed) s)"
print_summary
grep -E "^\| (paper_569m linear|qkv|attn proj|mlp|lm head|\*\*all)" "$OUT/gemm.md" | head -17
cat "$OUT"/e2e/table_*.md 2>/dev/null || tail -12 "$OUT/e2e.log"
