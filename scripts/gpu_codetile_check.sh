#!/bin/bash
# gpu_codetile_check.sh: on one H200, the per-tensor tile kernels that make Q(x^T) by transposing
# Q(x)'s codes (fp8_quant.cuh's tensor_tile, CodeTile) checked and timed against a snapshot of the
# previous version in one call (carry .deps and the snapshot, made by
#   bash scripts/snapshot_refs.sh <base ref>   ->  .snap_<base ref>):
#   1. build; test_layers_fp8_gpu, test_linear_fp8_gpu (codes against the host contract) and
#      test_model_gpu_fp8 without its timing section (fused against separate passes, the CPU
#      emulation);
#   2. bench_fp8_quant for this tree, the base (SRC=<snapshot>) and the settings in $VARIANTS
#      (gpu_fp8_quant_sweep.sh, ROUNDS=2 interleaved); its table last.
#   usage: BASE=.snap_main [VARIANTS="LAYERS_FP8_MIN_CTAS=4"] bash scripts/gpu_codetile_check.sh
set -u
cd "$(dirname "$0")/.." || exit 1
BASE=${BASE:-.snap_main}
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_codetile_out
build_or_die build/tests/test_layers_fp8_gpu build/tests/test_linear_fp8_gpu build/tests/test_model_gpu_fp8
for t in test_layers_fp8_gpu test_linear_fp8_gpu test_model_gpu_fp8; do FP8_SKIP_TIMING=1 run_test "$t"; done
settings=("" "SRC=$BASE")
for v in ${VARIANTS:-}; do settings+=("${v//,/ }"); done  # (a variant's -D's joined by commas)
OUT="$OUT/sweep" ROUNDS=${ROUNDS:-2} bash scripts/gpu_fp8_quant_sweep.sh "${settings[@]}" >"$OUT/sweep.md" 2>&1
echo "== summary ($(elapsed) s)"
print_summary
grep -E "^\| (kernel|---|tensor|delayed|rope|swiglu bwd bf16|rmsnorm\+res bf16|swiglu fwd bf16|copy)" "$OUT/sweep.md" ||
  tail -20 "$OUT/sweep.md"
