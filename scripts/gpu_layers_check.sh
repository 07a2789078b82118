#!/bin/bash
# gpu_layers_check.sh: build and run the GPU layer, GEMM and AdamW tests with explicit nvcc
# commands (no Makefile, no cJSON), then print a summary last. Logs go to $OUT (or
# /tmp/gpu_layers_out), binaries to $BD (or /tmp/gpu_layers_build).
#   usage: bash scripts/gpu_layers_check.sh [--compile-only] [--sanitize] [--timing]
#     --compile-only  only check that gpu/layers.cu, embedding.cu, matmul.cu, adamw_gpu.cu compile with the
#                     Makefile's CI flags and that the tests build (works without a GPU)
#     --sanitize      also run the layer test under compute-sanitizer memcheck
#     --timing        also time every kernel and GEMM at training sizes (GPU_LAYERS_TIMING=1)
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_layers_out}
BD=${BD:-/tmp/gpu_layers_build}
mkdir -p "$OUT" "$BD"
compile_only=0; sanitize=0; timing=0
for a in "$@"; do
  case $a in --compile-only) compile_only=1 ;; --sanitize) sanitize=1 ;; --timing) timing=1 ;; *) echo "unknown option $a"; exit 2 ;; esac
done
. scripts/gpu_lib.sh  # NVCC, CJ, t_start, elapsed, left
ARCH="-gencode arch=compute_90a,code=sm_90a"
CI_NVF="-std=c++17 -O3 -lineinfo $ARCH -I. -Xcompiler -fopenmp"   # the Makefile's NVFLAGS
CFL="-std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Wno-unused-parameter -fopenmp -I."
summary=()

echo "== build"
t0=$(date +%s)
build_ok=1
gcc $CFL -c core/common.c -o "$BD/common.o" && gcc $CFL -c optimizer.c -o "$BD/optimizer.o" || build_ok=0
pids=()
for f in layers embedding matmul adamw_gpu; do  # CI flags, in parallel; ptxas report for the record
  ( $NVCC $CI_NVF -Xptxas -v -c src/$f.cu -o "$BD/$f.o" > "$OUT/build_$f.txt" 2>&1 ) & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || build_ok=0; done
for f in layers embedding matmul adamw_gpu; do
  if grep -qiE "error|warning" "$OUT/build_$f.txt"; then grep -iE "error|warning" "$OUT/build_$f.txt" | head -20; fi
  grep -E "spill" "$OUT/build_$f.txt" | grep -v " 0 bytes spill stores, 0 bytes spill loads" | head -5
done
if [ $build_ok = 1 ]; then
  $NVCC $CI_NVF -Itest test/test_layers_gpu.cu "$BD/layers.o" "$BD/embedding.o" "$BD/adamw_gpu.o" "$BD/common.o" "$BD/optimizer.o" \
    -lcublasLt -o "$BD/test_layers_gpu" > "$OUT/build_tests.txt" 2>&1 &&
  $NVCC $CI_NVF -Itest test/test_matmul_gpu.cu "$BD/matmul.o" "$BD/common.o" -lcublasLt \
    -o "$BD/test_matmul_gpu" >> "$OUT/build_tests.txt" 2>&1 || build_ok=0
  grep -iE "error|warning" "$OUT/build_tests.txt" | head -20
fi
summary+=("build: $([ $build_ok = 1 ] && echo ok || echo FAILED) in $(( $(date +%s) - t0 )) s")
if [ $build_ok = 0 ] || [ $compile_only = 1 ]; then
  printf '%s\n' "== summary" "${summary[@]}"
  [ $build_ok = 1 ]; exit $?
fi

command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
rc=0
for t in test_layers_gpu test_matmul_gpu; do
  echo "== $t"
  t0=$(date +%s)
  GPU_LAYERS_TIMING=$timing "$BD/$t" > "$OUT/$t.log" 2>&1; r=$?
  grep -E "^(FAIL|skipped)" "$OUT/$t.log"
  grep -E "^#   " "$OUT/$t.log" | sed -E 's/^#   //' | cut -c1-110
  grep -E "^# timing" "$OUT/$t.log"
  n_ok=$(grep -c '^ok - ' "$OUT/$t.log"); n_fail=$(grep -c '^FAIL - ' "$OUT/$t.log")
  [ $r -ne 0 ] && [ "$n_fail" -eq 0 ] && { tail -5 "$OUT/$t.log"; n_fail=1; }
  [ $r -ne 0 ] && rc=1
  summary+=("$t: $n_ok ok, $n_fail FAIL, exit $r, $(( $(date +%s) - t0 )) s")
done
if [ $sanitize = 1 ] && command -v compute-sanitizer > /dev/null; then
  for tool in memcheck; do  # racecheck sees shared memory only; memcheck finds bad addresses
    echo "== compute-sanitizer $tool test_layers_gpu"
    timeout 100 compute-sanitizer --tool $tool --print-limit 10 "$BD/test_layers_gpu" > "$OUT/sanitize_$tool.log" 2>&1; r=$?
    grep -E "ERROR SUMMARY|Error|RACECHECK SUMMARY|Race" "$OUT/sanitize_$tool.log" | head -8
    summary+=("compute-sanitizer $tool: exit $r, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)")
  done
fi
printf '%s\n' "== summary" "${summary[@]}"
exit $rc
