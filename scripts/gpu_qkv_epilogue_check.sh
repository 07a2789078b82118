#!/bin/bash
# gpu_qkv_epilogue_check.sh: on one H200, the QKV projection's quantizing epilogue inside the
# trainer, in one call (carry .deps):
#   1. scripts/gpu_qkv_gemm_check.sh (the kernel's tests, compute-sanitizer, its benchmark) unless
#      NO_GEMM=1;
#   2. the tests TESTS (default test_model_gpu_fp8, its timing section skipped, whose
#      qkv_epilogue_check sets the model with the epilogue against cuBLASLt + the quantize pass,
#      and test_diagnostics_gpu: the probes, which take the BF16 GEMM);
#   3. with E2E=1: paper_569m end to end (scripts/gpu_fp8_linear_e2e.sh, BF16 linears, STEPS=16):
#      bf16 attention, fp8_dm with the epilogue, fp8_dm without it (TRAIN_GPT_QKV_EPILOGUE=0).
# Logs in $OUT (default /tmp/gpu_qkv_epilogue_out).
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, CJ, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_qkv_epilogue_out
if [ "${NO_GEMM:-0}" != 1 ]; then
  OUT="$OUT/gemm" bash scripts/gpu_qkv_gemm_check.sh >"$OUT/gemm.log" 2>&1
  echo "qkv gemm check: exit $? at $(elapsed) s"
fi
TESTS=${TESTS:-test_model_gpu_fp8 test_diagnostics_gpu}
targets=""; for t in $TESTS; do targets="$targets build/tests/$t"; done
build_or_die $targets train_gpt
for t in $TESTS; do FP8_SKIP_TIMING=1 TEST_TIMEOUT=240 run_test "$t"; done
grep -hE "^# qkv epilogue" "$OUT"/*.log
if [ "${E2E:-0}" = 1 ]; then
  OUT="$OUT/e2e" WORK=/tmp/qkv_epilogue_e2e NO_TEST=1 STEPS=${STEPS:-16} BUDGET=${E2E_BUDGET:-280} \
    RUNS="bf16:bf16:bf16:42 attn_dm:bf16:fp8_dm:42 attn_dm_pass:bf16:fp8_dm:42:TRAIN_GPT_QKV_EPILOGUE=0" \
    bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/e2e.log" 2>&1
  echo "e2e: exit $? at $(elapsed) s"
fi
echo "== summary ($(elapsed) s)"
sed -n '/^== summary/,$p' "$OUT/gemm.log" 2>/dev/null
print_summary
[ "${E2E:-0}" = 1 ] && { cat "$OUT"/e2e/table_*.md 2>/dev/null || tail -12 "$OUT/e2e.log"; }
exit 0
