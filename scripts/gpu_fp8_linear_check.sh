#!/bin/bash
# gpu_fp8_linear_check.sh: on a GPU machine, build test_linear_fp8_gpu with the Makefile and run
# it: the FP8 quantization kernels against the CPU emulation code for code, the cuBLASLt FP8
# GEMMs (fp8_tensor, fp8_block) against the CPU emulation's products, and 8192^3 timings against
# BF16. Then the quantization part once more under compute-sanitizer memcheck (when present).
# A short summary prints last (< 3 minutes in all). Logs go to $OUT (or /tmp/gpu_fp8_linear_out).
#   usage (device tool, carry [".deps"]): bash scripts/gpu_fp8_linear_check.sh [--no-sanitize]
#   cJSON: .deps/cjson, as fetched by shared/device/fetch-cjson.sh, or the system's.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_fp8_linear_out}
mkdir -p "$OUT"
sanitize=1
for a in "$@"; do
  case $a in --no-sanitize) sanitize=0 ;; *) echo "unknown option $a"; exit 2 ;; esac
done
. scripts/gpu_lib.sh  # CJ
T=build/tests/test_linear_fp8_gpu
summary=()
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader

echo "== build"
t0=$(date +%s)
make -j16 SETUP=0 $CJ $T > "$OUT/make.log" 2>&1; r=$?
grep -E "error|warning" "$OUT/make.log" | grep -v C7519 | head -10
summary+=("build: exit $r in $(( $(date +%s) - t0 )) s")
if [ $r -ne 0 ]; then tail -20 "$OUT/make.log"; printf '%s\n' "== summary" "${summary[@]}"; exit 1; fi

echo "== test_linear_fp8_gpu"
t0=$(date +%s)
timeout 120 $T > "$OUT/test_linear_fp8_gpu.log" 2>&1; r=$?
grep -E "^(FAIL|skipped)" "$OUT/test_linear_fp8_gpu.log" | head -30 | cut -c1-220
grep -E "^#   " "$OUT/test_linear_fp8_gpu.log" | sed -E 's/^#   //' | cut -c1-130
grep -E "^# timing" "$OUT/test_linear_fp8_gpu.log" | cut -c1-200
n_ok=$(grep -c '^ok - ' "$OUT/test_linear_fp8_gpu.log"); n_fail=$(grep -c '^FAIL - ' "$OUT/test_linear_fp8_gpu.log")
[ $r -ne 0 ] && [ "$n_fail" -eq 0 ] && { tail -5 "$OUT/test_linear_fp8_gpu.log"; n_fail=1; }
n_qfail=$(grep -c '^FAIL - quantize' "$OUT/test_linear_fp8_gpu.log")
summary+=("test_linear_fp8_gpu: $n_ok ok, $n_fail FAIL ($n_qfail in quantization), exit $r$([ $r -eq 124 ] && echo ' (timeout 120 s)'), $(( $(date +%s) - t0 )) s")
rc=$r

if [ $sanitize = 1 ] && command -v compute-sanitizer > /dev/null; then
  echo "== compute-sanitizer memcheck (quantization part)"
  t0=$(date +%s)
  FP8_TEST_QUANT_ONLY=1 timeout 60 compute-sanitizer --tool memcheck --print-limit 10 $T > "$OUT/sanitize.log" 2>&1; r=$?
  grep -E "ERROR SUMMARY|Invalid|out of bounds" "$OUT/sanitize.log" | head -8
  summary+=("compute-sanitizer memcheck: exit $r$([ $r -eq 124 ] && echo ' (timeout 60 s)'), $(grep -E 'ERROR SUMMARY' "$OUT/sanitize.log" | tail -1), $(( $(date +%s) - t0 )) s")
fi
summary+=("$(grep -E '^# timing (bf16 +forward|fp8_tensor +forward|fp8_block +forward)' "$OUT/test_linear_fp8_gpu.log" | sed -E 's/^# timing +//; s/ +/ /g' | tr '\n' ';')")
printf '%s\n' "== summary" "${summary[@]}"
exit $rc
