#!/bin/bash
# gpu_attn_keep_codes_check.sh: on a GPU machine, validate precision.attention_keep_codes (the
# forward's quantized Q, K, V kept for the attention backward, attention_fp8.cu) and the
# rewritten quantize kernel (attention/quant_fp8.cu: transposed codes built in registers, stored
# to a swizzled shared tile in 4- or 8-byte units), in one go, in under 5 minutes on an H200:
#   1. build with the Makefile (make -j16 SETUP=0 [CJSON_PREFIX=.deps/cjson]);
#   2. test_attention_fp8_gpu: the quantize kernel's codes, transposed codes, scales, dequantized
#      copies and saturation counts against the CPU emulation (unchanged checks), the FP8 forward
#      and backward, and the layer API with kept codes against without (O, LSE, dK, dV bit for
#      bit, dQ up to its atomics' order, the kept buffer = attn_gpu_quantize's outputs);
#      compute-sanitizer memcheck and racecheck on its small cases when available;
#   3. test_model_gpu_fp8 (FP8_SKIP_TIMING=1 unless TIMING=1): plans with and without kept codes
#      (--dry-run's plan = the GPU allocation), every FP8 attention mode in the model (kept codes
#      now the default) against the CPU, and keep on vs off: loss and the gradients no dQ reaches
#      bit for bit, the rest within dQ's run-to-run atomics noise;
#   4. scripts/gpu_fp8_attention_bench.sh: every mode through the API with and without kept codes
#      (checked equal before timing), the quantize passes alone (forward 3 vs 6 layouts,
#      backward 4 tensors vs dO alone), with whatever time is left of the budget.
# Prints a summary last. Logs in $OUT (or /tmp/gpu_attn_keep_out).
#   usage: [TIMING=1] [BUDGET=290] [ROUNDS=20] bash scripts/gpu_attn_keep_codes_check.sh
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_attn_keep_out}
mkdir -p "$OUT"
BUDGET=${BUDGET:-290}
. scripts/gpu_lib.sh  # t_start, elapsed, left, CJ
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>/dev/null

echo "== build (Makefile, log make.log)"
T_ATT=build/tests/test_attention_fp8_gpu
T_MOD=build/tests/test_model_gpu_fp8
if make -j16 SETUP=0 $CJ train_gpt $T_ATT $T_MOD > "$OUT/make.log" 2>&1; then
  summary+=("build: ok ($(elapsed) s)")
else
  tail -20 "$OUT/make.log"
  echo "== build FAILED"
  exit 1
fi
$NVCC -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -Xptxas -v -c attention/quant_fp8.cu \
  -o "$OUT/ptxas_quant.o" > "$OUT/ptxas_quant.txt" 2>&1
summary+=("quantize kernel (ptxas, D=128 then D=64): $(grep -E 'registers' "$OUT/ptxas_quant.txt" | head -2 |
  sed -E 's/.*Used ([0-9]+) registers.*/\1 regs/' | paste -sd, -), $(grep -E 'spill' "$OUT/ptxas_quant.txt" | head -2 |
  sed -E 's/.*, ([0-9]+) bytes spill stores.*/\1 B spilled/' | paste -sd, -)")

# test_name binary timeout [env...]: runs it, records "<name>: N ok, M FAIL, exit rc, s"
run_test() {
  local name=$1 bin=$2 lim=$3; shift 3
  local t0=$(date +%s)
  env "$@" OMP_NUM_THREADS=$(nproc) timeout "$lim" "$bin" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -E "^FAIL" "$OUT/$name.log" | head -20
  summary+=("$name: $(grep -c '^ok - ' "$OUT/$name.log") ok, $(grep -c '^FAIL - ' "$OUT/$name.log") FAIL, exit $rc$([ $rc = 124 ] && echo ' (timed out)'), $(( $(date +%s) - t0 )) s")
  return $rc
}

echo "== test_attention_fp8_gpu (log test_attention_fp8_gpu.log)"
run_test test_attention_fp8_gpu $T_ATT 150
grep -E "^#   keep_codes|^# quantize Q,K,V" "$OUT/test_attention_fp8_gpu.log" | head -24
if command -v compute-sanitizer >/dev/null && [ "$(left $BUDGET)" -gt 195 ]; then
  for tool in memcheck racecheck; do
    ATTN_FP8_TEST_SMALL=1 timeout 40 compute-sanitizer --tool $tool $T_ATT > "$OUT/sanitizer_$tool.log" 2>&1
    summary+=("compute-sanitizer $tool (small cases): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1), $(grep -c '^FAIL - ' "$OUT/sanitizer_$tool.log") FAIL")
  done
fi

echo "== test_model_gpu_fp8 (log test_model_gpu_fp8.log)"
# (the timing section, TIMING=1, adds minutes: the benchmark may then not fit the budget)
if [ "${TIMING:-0}" = 1 ]; then run_test test_model_gpu_fp8 $T_MOD 240 -u FP8_SKIP_TIMING
else run_test test_model_gpu_fp8 $T_MOD 150 FP8_SKIP_TIMING=1; fi
grep -E "^# keep_codes|kept Q, K, V codes" "$OUT/test_model_gpu_fp8.log" | head -16

echo "== FP8 attention benchmark (scripts/gpu_fp8_attention_bench.sh, logs in $OUT/bench)"
bl=$(left $BUDGET)  # what the budget leaves, less 5 s
if [ $bl -ge 90 ]; then
  OUT="$OUT/bench" BUDGET=$bl ROUNDS=${ROUNDS:-20} bash scripts/gpu_fp8_attention_bench.sh > "$OUT/bench.log" 2>&1
  rc=$?
  grep -E "with kept codes vs without|vs bf16, rel L2" "$OUT/bench.log" | head -24
  summary+=("benchmark: exit $rc$(grep -q 'DIFFER' "$OUT/bench.log" && echo ', kept codes DIFFER somewhere (see bench.log)')")
else
  summary+=("benchmark: not run ($bl s left of BUDGET=$BUDGET)")
fi

echo "== summary ($(elapsed) s)"
for s in "${summary[@]}"; do echo "  $s"; done
if [ -s "$OUT/bench/summary.txt" ]; then
  echo "  benchmark tables ($OUT/bench/summary.txt):"
  sed 's/^/    /' "$OUT/bench/summary.txt"
fi
