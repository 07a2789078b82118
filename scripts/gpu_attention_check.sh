#!/bin/bash
# gpu_attention_check.sh: on a GPU machine, in one go: build the fused attention kernels, their
# test and their benchmark with explicit nvcc commands (no Makefile, no cJSON), show the
# register/spill report and the SASS instruction mix, run test/test_attention_gpu, then
# bench/bench_attention.py (ours vs PyTorch SDPA cuDNN and FA2). The table prints last.
# Logs go to $OUT (or /tmp/gpu_attn_out).
#   usage: bash scripts/gpu_attention_check.sh [--no-bench] [--no-test]
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_attn_out}
BD=${BD:-/tmp/gpu_attn_build}
mkdir -p "$OUT" "$BD"
do_test=1; do_bench=1
for a in "$@"; do
  case $a in --no-bench) do_bench=0 ;; --no-test) do_test=0 ;; esac
done
NVCC=${NVCC:-nvcc}
ARCH="-gencode arch=compute_90a,code=sm_90a"
NVF="-std=c++17 -O3 -lineinfo $ARCH -Isrc -Itest"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
echo "== build"
t0=$(date +%s)
gcc -std=c11 -D_GNU_SOURCE -O2 -Isrc -c src/common.c -o "$BD/common.o" || exit 1
$NVCC $NVF -Xptxas -v -c src/attention_fp8.cu -o "$BD/attention_fp8.o" 2> "$BD/ptxas.txt" ||
  { cat "$BD/ptxas.txt"; exit 1; }
grep -E "Compiling entry|registers|spill" "$BD/ptxas.txt" | grep -v C75 | sed -E 's/_Z[0-9]+(attn_[a-z_0-9]+)ILi([0-9]+)E.*/\1<\2>/' |
  paste - - - | awk '{print "  " $0}' | sed -E 's/ptxas info *: //g' | cut -c1-200
$NVCC $NVF -Xcompiler -fopenmp test/test_attention_gpu.cu "$BD/attention_fp8.o" "$BD/common.o" \
  -o "$BD/test_attention_gpu" || exit 1
$NVCC $NVF bench/bench_attention.cu "$BD/attention_fp8.o" "$BD/common.o" -o "$BD/bench_attention" || exit 1
echo "   built in $(( $(date +%s) - t0 )) s"

echo "== SASS instruction mix (per kernel: HGMMA HMMA LDSM LDL STL)"
CUOBJDUMP=$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")
"$CUOBJDUMP" -sass "$BD/attention_fp8.o" > "$OUT/attention.sass" 2>&1
awk '/Function :/ {name=$3} /HGMMA/ {g[name]++} /HMMA/ {m[name]++} /LDSM/ {s[name]++}
     / LDL/ {ll[name]++} / STL/ {sl[name]++} /Function :/ {names[name]=1}
     END {for (n in names) printf "  %-70s %5d %5d %5d %4d %4d\n", substr(n,1,70), g[n], m[n], s[n], ll[n], sl[n]}' \
  "$OUT/attention.sass"

rc=0
if [ $do_test = 1 ]; then
  echo "== test"
  t0=$(date +%s)
  OMP_NUM_THREADS=$(nproc) "$BD/test_attention_gpu" > "$OUT/test.log" 2>&1; rc=$?
  grep -E "^(FAIL|skipped)" "$OUT/test.log" | head -12
  echo "   $(grep -c '^ok - ' "$OUT/test.log") ok, $(grep -c '^FAIL - ' "$OUT/test.log") FAIL, exit $rc, $(( $(date +%s) - t0 )) s"
  rc2=0
  for impl in mma; do  # the other forward kernel (default: wgmma; wgmma_pipe is experimental)
    ATTN_GPU_FWD=$impl OMP_NUM_THREADS=$(nproc) "$BD/test_attention_gpu" > "$OUT/test_$impl.log" 2>&1 || rc2=1
    grep -E "^FAIL" "$OUT/test_$impl.log" | head -3
    echo "   ATTN_GPU_FWD=$impl: $(grep -c '^ok - ' "$OUT/test_$impl.log") ok, $(grep -c '^FAIL - ' "$OUT/test_$impl.log") FAIL"
  done
  [ $rc2 != 0 ] && rc=$rc2
  if [ $rc != 0 ] && command -v compute-sanitizer >/dev/null; then
    echo "   test failed: compute-sanitizer memcheck on the small cases (log: sanitizer.log)"
    ATTN_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck "$BD/test_attention_gpu" > "$OUT/sanitizer.log" 2>&1
    grep -E "ERROR SUMMARY|Invalid|FAIL" "$OUT/sanitizer.log" | head -8
  fi
  # the worst errors against each reference
  awk '/^#   / {key=$2" vs "$4; if ($7+0 > worst[key]+0) worst[key]=$7} END {for (k in worst) printf "   worst rel L2 %-14s %s\n", k, worst[k]}' \
    "$OUT/test.log" | sort
fi
if [ $do_bench = 1 ]; then
  for impl in mma; do
    echo "== bench (ours with ATTN_GPU_FWD=$impl, for comparison)"
    ATTN_GPU_FWD=$impl "$BD/bench_attention" | tee "$OUT/bench_$impl.txt"
  done
  echo "== bench"
  PYTHONUNBUFFERED=1 python3 bench/bench_attention.py --ours "$BD/bench_attention" 2>&1 | tee "$OUT/bench.txt"
fi
exit $rc
