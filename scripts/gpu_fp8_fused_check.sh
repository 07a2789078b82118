#!/bin/bash
# gpu_fp8_fused_check.sh: on a GPU machine, the fused FP8 quantization (layers_fp8.h: RMSNorm,
# SwiGLU and its backward writing the codes of the next linear's operands) in one go:
#   1. build (make -j16 SETUP=0, cJSON from .deps/cjson when present);
#   2. test_layers_fp8_gpu: the fused kernels against layer + fp8_quantize_gpu and fp8_quantize,
#      code for code; test_linear_fp8_gpu's quantization part (the shared vec128_emit moved out
#      of vec128both_kernel); test_layers_gpu (layers.cu now takes its arithmetic from
#      layers_math.cuh);
#   3. test_model_gpu_fp8: the model against the CPU emulation (fusion on), fused against
#      separate passes, and its timing section (tokens/s of bf16, fp8_tensor, fp8_block fused and
#      unfused; the "# fused" per-kernel lines);
#   4. scripts/gpu_fp8_linear_e2e.sh NO_TEST=1 UNFUSED=1 NO_NOISE=1 (paper_569m, STEPS steps);
#   5. a summary last.
# Logs go to $OUT (default /tmp/gpu_fp8_fused_out). Under 6 minutes on one H200.
#   usage (device tool, carry [".deps"]): bash scripts/gpu_fp8_fused_check.sh   (STEPS=20 to change)
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, t_start, elapsed, CJ
gpu_start /tmp/gpu_fp8_fused_out
summary=()

echo "== 1. build"
timeout 200 make -j16 SETUP=0 $CJ train_gpt build/tests/test_layers_fp8_gpu build/tests/test_linear_fp8_gpu \
  build/tests/test_layers_gpu build/tests/test_model_gpu_fp8 >"$OUT/build.log" 2>&1; r=$?
grep -E "error|warning" "$OUT/build.log" | grep -v C7519 | head -10
summary+=("build: exit $r at $(elapsed) s")
if [ $r -ne 0 ]; then tail -20 "$OUT/build.log"; printf '%s\n' "== summary" "${summary[@]}"; exit 1; fi

# test NAME TIMEOUT [ENV=VALUE...]: runs build/tests/NAME, prints its FAILs, adds a summary line
test_one() {
  local name=$1 to=$2; shift 2
  env "$@" timeout -k 5 "$to" "build/tests/$name" >"$OUT/$name.log" 2>&1; local r=$?
  grep -E "^(FAIL|skipped)" "$OUT/$name.log" | head -20 | cut -c1-260
  local ok fail
  ok=$(grep -c '^ok - ' "$OUT/$name.log"); fail=$(grep -c '^FAIL - ' "$OUT/$name.log")
  [ $r -ne 0 ] && [ "$fail" -eq 0 ] && { tail -5 "$OUT/$name.log"; fail=1; }
  summary+=("$name: $ok ok, $fail FAIL, exit $r$([ $r -eq 124 ] && echo " (timeout $to s)") at $(elapsed) s")
}
echo "== 2. kernel tests ($(elapsed) s)"
test_one test_layers_fp8_gpu 60
test_one test_linear_fp8_gpu 60 FP8_TEST_QUANT_ONLY=1
test_one test_layers_gpu 60

echo "== 3. test_model_gpu_fp8 ($(elapsed) s)"
test_one test_model_gpu_fp8 150
grep -E "^# (fusion|fused|timing)" "$OUT/test_model_gpu_fp8.log" | cut -c1-260

echo "== 4. paper_569m end to end ($(elapsed) s)"
e2e_budget=$(( 340 - $(elapsed) )); [ $e2e_budget -lt 60 ] && e2e_budget=60
OUT="$OUT/e2e" NO_TEST=1 UNFUSED=1 NO_NOISE=1 STEPS=${STEPS:-20} BUDGET=$e2e_budget \
  bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/e2e.log" 2>&1
summary+=("gpu_fp8_linear_e2e: exit $? at $(elapsed) s")

echo "== 5. summary ($(elapsed) s)"
printf '%s\n' "${summary[@]}"
grep -E "^# timing: (569M|125M) tokens/s relative" "$OUT/test_model_gpu_fp8.log" | cut -c1-200
grep -E "^# fused .*(all|saves)" "$OUT/test_model_gpu_fp8.log" | cut -c1-200
grep -E "^# fusion .*(all gradients|loss)" "$OUT/test_model_gpu_fp8.log" | cut -c1-200
cat "$OUT/e2e/table.md" 2>/dev/null
