#!/bin/bash
# gpu_fp8_quant_bench.sh: on a GPU machine, the fp8_block quantization kernels checked and timed
# in one call (carry .deps):
#   1. build (make, cJSON from .deps/cjson when present);
#   2. test_layers_fp8_gpu (the fused RMSNorm / SwiGLU / SwiGLU-backward kernels against layer +
#      fp8_quantize_gpu and fp8_quantize, code for code) and test_linear_fp8_gpu's quantization
#      part (every quantize kernel against the CPU emulation);
#   3. bench_fp8_quant at paper_569m's shapes (and at small_125m's with SMALL=1): each
#      quantization pass and fused kernel against the BF16 kernel it replaces or follows;
#   4. the tests' counts and the benchmark table last.
# Logs in $OUT (default /tmp/gpu_fp8_quant_out). About a minute on one H200 after the build.
#   usage: bash scripts/gpu_fp8_quant_bench.sh   (NO_TEST=1 to time only)
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_fp8_quant_out
build_or_die build/tests/test_layers_fp8_gpu build/tests/test_linear_fp8_gpu build/bench/bench_fp8_quant
if [ "${NO_TEST:-0}" != 1 ]; then
  for t in test_layers_fp8_gpu test_linear_fp8_gpu; do FP8_TEST_QUANT_ONLY=1 TEST_TIMEOUT=240 run_test "$t"; done
fi
build/bench/bench_fp8_quant >"$OUT/bench.md" 2>&1
[ "${SMALL:-0}" = 1 ] && build/bench/bench_fp8_quant 16384 768 2048 >>"$OUT/bench.md" 2>&1
echo "== summary ($(elapsed) s)"
print_summary
cat "$OUT/bench.md"
