#!/bin/bash
# gpu_rope_fused_check.sh: on one H200, the FP8 attention's forward with RoPE inside its quantize
# pass (attn_mode_forward_rope) measured in one call (carry .deps; scripts/gpu_test_all.sh runs
# every test):
#   0. with TESTS=1: test_attention_fp8_gpu, test_model_gpu_fp8 (its timing section skipped) and
#      test_diagnostics_gpu first;
#   1. the attention benchmark (scripts/gpu_fp8_attention_bench.sh, MODES="bf16 fp8_naive fp8_dm
#      fp8_hybrid" ROUNDS=4 unless set), whose "RoPE + forward" table sets rope_forward_gpu + our
#      BF16 forward against fp8_dm with RoPE in its quantize pass, while train_gpt builds;
#   2. paper_569m end to end (scripts/gpu_fp8_linear_e2e.sh, BF16 linears, STEPS=16): bf16
#      attention, fp8_dm with the fused pass, fp8_dm with rope_forward_gpu first
#      (TRAIN_GPT_ATTN_ROPE_FUSE=0);
#   3. the tables last. Logs in $OUT (default /tmp/gpu_rope_fused_out).
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, CJ, build_or_die, run_test, print_summary
gpu_start /tmp/gpu_rope_fused_out
if [ "${TESTS:-0}" = 1 ]; then
  build_or_die build/tests/test_attention_fp8_gpu build/tests/test_model_gpu_fp8 build/tests/test_diagnostics_gpu
  for t in test_attention_fp8_gpu test_model_gpu_fp8 test_diagnostics_gpu; do FP8_SKIP_TIMING=1 TEST_TIMEOUT=200 run_test "$t"; done
  print_summary
fi
timeout 300 make -j8 SETUP=0 $CJ train_gpt >"$OUT/make.log" 2>&1 &
make_pid=$!
OUT="$OUT/bench" MODES="${MODES:-bf16 fp8_naive fp8_dm fp8_hybrid}" ROUNDS=${ROUNDS:-4} BUDGET=230 \
  bash scripts/gpu_fp8_attention_bench.sh >"$OUT/bench.log" 2>&1
echo "bench: exit $? at $(elapsed) s"
wait $make_pid
echo "train_gpt build: exit $? at $(elapsed) s"
OUT="$OUT/e2e" WORK=/tmp/rope_fused_e2e NO_TEST=1 STEPS=${STEPS:-16} BUDGET=280 \
  RUNS="bf16:bf16:bf16:42 attn_dm:bf16:fp8_dm:42 attn_dm_sep:bf16:fp8_dm:42:TRAIN_GPT_ATTN_ROPE_FUSE=0" \
  bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/e2e.log" 2>&1
echo "e2e: exit $? at $(elapsed) s"
sed -n '/^RoPE + forward/,/^$/p' "$OUT/bench/summary.txt" 2>/dev/null
sed -n '/^== summary/,$p' "$OUT/bench/summary.txt" 2>/dev/null || tail -20 "$OUT/bench.log"
cat "$OUT"/e2e/table_*.md 2>/dev/null || tail -12 "$OUT/e2e.log"
