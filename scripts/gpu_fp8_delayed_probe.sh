#!/bin/bash
# gpu_fp8_delayed_probe.sh: on one H200, in one call, what delayed scaling could save fp8_tensor
# (carry .deps):
#   1. test_layers_fp8_gpu (the fused layers, 1x128 and per tensor with a given amax) and
#      test_linear_fp8_gpu's quantization part;
#   2. bench_fp8_quant at paper_569m's shapes: the per-tensor fused layers ("delayed: ...")
#      against today's fp8_tensor path ("tensor: ... + amax, quantize") and the BF16 layers;
#   3. bench_fp8_gemm paper_569m (its fp8_tensor columns: promoted and fast accumulation);
#   4. the tables last. Logs in $OUT (default /tmp/gpu_fp8_delayed_probe_out). About 2 minutes.
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_fp8_delayed_probe_out
build_or_die build/tests/test_layers_fp8_gpu build/tests/test_linear_fp8_gpu build/bench/bench_fp8_quant \
  build/bench/bench_fp8_gemm
export FP8_TEST_QUANT_ONLY=1
for t in test_layers_fp8_gpu test_linear_fp8_gpu; do run_test "$t"; done
build/bench/bench_fp8_quant >"$OUT/quant.md" 2>&1
build/bench/bench_fp8_gemm paper_569m 16384 1536 3968 15 >"$OUT/gemm.md" 2>&1
echo "== summary ($(elapsed) s)"
print_summary
cat "$OUT/quant.md"
echo "== GEMMs"; cat "$OUT/gemm.md"
