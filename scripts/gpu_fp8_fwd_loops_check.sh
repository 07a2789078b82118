#!/bin/bash
# gpu_fp8_fwd_loops_check.sh: on one H200, the FP8 forward's block loops checked and timed
# against the default one in one call (carry .deps):
#   1. the register / spill report of the forward kernels (and any C75xx warning: a
#      serialized wgmma);
#   2. test_attention_fp8_gpu (every loop gives the default loop's O and LSE bit for bit, on the
#      full grid and on 2 CTAs; the "signed rows" cases make the integer row max take both paths);
#   3. only if the loop cases passed (the test labels each loop by its ATTN_FP8_FWD_LOOP name): the attention benchmark (gpu_env_sweep.sh, MODES="bf16
#      fp8_naive" unless set: our BF16 forward, the bare FP8 forward) with the default and the loop
#      $CMP (default plain_fmax: the row max by FMNMX), alternated twice so that the drift shows;
#   4. the tables last. Logs in $OUT (default /tmp/gpu_fp8_loops_out).
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, build_or_die, run_test
gpu_start /tmp/gpu_fp8_loops_out
CMP=${CMP:-plain_fmax}
build_or_die build/tests/test_attention_fp8_gpu
$NVCC -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -Xptxas -v -c attention/fwd_fp8.cu \
  -o /tmp/loops_ptxas.o 2>&1 | grep -E "C75|Compiling entry|spill" |
  sed 's/.*attn_fwd_fp8_kernel\(ILi[0-9]*ELi[0-9]E\).*/\1/' | paste - - | head -12
TEST_TIMEOUT=240 run_test test_attention_fp8_gpu
echo "test: at $(elapsed) s"
if grep -q "^ok .*with the $CMP loop on 2 persistent CTAs" \
     "$OUT/test_attention_fp8_gpu.log" 2>/dev/null &&
   ! grep -q "^FAIL" "$OUT/test_attention_fp8_gpu.log"; then
  OUT="$OUT/sweep" MODES="${MODES:-bf16 fp8_naive}" ROUNDS=${ROUNDS:-3} timeout -k 5 400 bash scripts/gpu_env_sweep.sh "" \
    "ATTN_FP8_FWD_LOOP=$CMP" "ATTN_FP8_FWD_LOOP=plain" "ATTN_FP8_FWD_LOOP=$CMP" >"$OUT/sweep.log" 2>&1
  echo "sweep: exit $? at $(elapsed) s"
else
  echo "sweep: skipped (a test failed, or the loop cases did not all run)"
fi
grep -hE "^FAIL|signed rows|^#   fwd" "$OUT/test_attention_fp8_gpu.log" | head -24 | cut -c1-200
print_summary
tail -40 "$OUT/sweep.log" 2>/dev/null
