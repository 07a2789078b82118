#!/bin/bash
# gpu_fp8_fwd_early_check.sh: on one H200, the FP8 forward's early loop (ATTN_FP8_FWD_LOOP=early:
# S_{j+1} issued before O takes PV_{j-1}, so the O update overlaps the next S) checked and timed
# against the default loop in one call (carry .deps):
#   1. the register / spill report of the early kernels (no C7514: no serialized wgmma);
#   2. test_attention_fp8_gpu (every loop, early included, gives the default loop's O and LSE bit
#      for bit, on the full grid and on 2 CTAs);
#   3. only if the early cases passed: the attention benchmark (gpu_env_sweep.sh, MODES="bf16
#      fp8_naive" unless set: our BF16 forward, the bare FP8 forward) with the default and the
#      early loop, alternated twice so that the call's drift shows;
#   4. the tables last. Logs in $OUT (default /tmp/gpu_fp8_early_out).
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test
gpu_start /tmp/gpu_fp8_early_out
build_or_die build/tests/test_attention_fp8_gpu
$NVCC -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc -Xptxas -v -c src/attention_fwd_fp8.cu \
  -o /tmp/early_ptxas.o 2>&1 | grep -E "C75|ILi(128|64)ELi4E" -A3 | grep -E "C75|spill|registers" | head -6
TEST_TIMEOUT=240 run_test test_attention_fp8_gpu
echo "test: at $(elapsed) s"
if grep -q "^ok .*with the early (S_{j+1} before the O update) loop on 2 persistent CTAs" \
     "$OUT/test_attention_fp8_gpu.log" 2>/dev/null &&
   ! grep -q "^FAIL.*early" "$OUT/test_attention_fp8_gpu.log"; then
  OUT="$OUT/sweep" MODES="${MODES:-bf16 fp8_naive}" ROUNDS=${ROUNDS:-3} timeout -k 5 400 bash scripts/gpu_env_sweep.sh "" \
    "ATTN_FP8_FWD_LOOP=early" "ATTN_FP8_FWD_LOOP=plain" "ATTN_FP8_FWD_LOOP=early" >"$OUT/sweep.log" 2>&1
  echo "sweep: exit $? at $(elapsed) s"
else
  echo "sweep: skipped (the early cases did not all pass)"
fi
grep -hE "^FAIL|early" "$OUT/test_attention_fp8_gpu.log" | head -12 | cut -c1-200
print_summary
tail -40 "$OUT/sweep.log" 2>/dev/null
