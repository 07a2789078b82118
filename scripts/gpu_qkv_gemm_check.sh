#!/bin/bash
# gpu_qkv_gemm_check.sh: on a GPU machine, the QKV projection with its quantizing epilogue
# (gpu/qkv_gemm.cu) checked and timed in one call (carry .deps):
#   1. build (make, cJSON from .deps/cjson when present);
#   2. test_qkv_gemm_gpu (the GEMM against the CPU and cuBLASLt, its codes against
#      attn_gpu_quantize's, the FP8 forward and backward on them), and the same under
#      compute-sanitizer (SANITIZE=0 skips it);
#   3. bench_qkv_gemm: the GEMM alone in every form against cuBLASLt, then the attention block's
#      forward up to O as bf16 / fp8 with the quantize pass / fp8 with the epilogue, at H 16 for
#      T = 1K..8K (the attention benchmark's shape) and at the paper models' widths (C 1536, 3072) at
#      T = 4096; ROUNDS rounds (default 5);
#   4. the tests' counts and the benchmark tables last.
# Logs in $OUT (default /tmp/gpu_qkv_gemm_out).
#   usage: bash scripts/gpu_qkv_gemm_check.sh   (NO_TEST=1 to time only)
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_qkv_gemm_out
build_or_die build/tests/test_qkv_gemm_gpu build/bench/bench_qkv_gemm
if [ "${NO_TEST:-0}" != 1 ]; then
  TEST_TIMEOUT=120 run_test test_qkv_gemm_gpu
  if [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    timeout 150 compute-sanitizer --tool memcheck build/tests/test_qkv_gemm_gpu >"$OUT/sanitizer.log" 2>&1
    summary+=("compute-sanitizer memcheck: exit $?, $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)")
  fi
fi
R=${ROUNDS:-5}
: >"$OUT/bench.md"
for shape in "2048" "1536 4096" "3072 4096"; do
  echo "## C $shape" >>"$OUT/bench.md"
  timeout -k 5 "$(left 200)" build/bench/bench_qkv_gemm "$R" $shape >>"$OUT/bench.md" 2>&1
done
echo "== summary ($(elapsed) s)"
print_summary
cat "$OUT/bench.md"
