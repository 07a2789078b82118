#!/bin/bash
# gpu_fp8_attention_check.sh: on a GPU machine, build and run the FP8 attention tests
# (test/test_attention_fp8_gpu.cu: the quantize kernels of attention/quant_fp8.cu against the CPU
# emulation, code for code; attention/fwd_fp8.cu's forward, fp8_hybrid's backward and
# attention/bwd_fp8.cu's FP8 backward; ATTN_FP8_TEST_BWD_ONLY=1 runs only the latter), show
# the register/spill report and the SASS instruction mix of the FP8 kernels (QGMMA = FP8 wgmma),
# and print a summary last. Builds with the Makefile (build/); if that fails (e.g. another
# module of the tree does not compile), falls back to explicit nvcc commands for just the files
# the test needs ($BD). Logs go to $OUT (or /tmp/gpu_fp8_attn_out). Takes < 3 minutes.
#   usage: bash scripts/gpu_fp8_attention_check.sh
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_fp8_attn_out}
BD=${BD:-/tmp/gpu_fp8_attn_build}
mkdir -p "$OUT" "$BD"
. scripts/gpu_lib.sh  # NVCC, CJ, t_start, elapsed, left
CUOBJDUMP=$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")
NVF="-std=c++17 -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a -I. -Xcompiler -fopenmp"  # the Makefile's NVFLAGS
CU_SRCS="attention_quant"
[ -f attention/fwd_fp8.cu ] && CU_SRCS="$CU_SRCS attention_fwd_fp8"
[ -f attention/bwd_fp8.cu ] && CU_SRCS="$CU_SRCS attention_bwd_fp8"
[ -f attention/delta_fp8.cu ] && CU_SRCS="$CU_SRCS attention_delta_fp8"
BF16_SRCS="attention_fwd attention_bwd"  # the BF16 kernels (fp8_hybrid's backward runs on them)
[ -f attention/fwd_bf16_mma.cu ] && BF16_SRCS="$BF16_SRCS attention_fwd_mma"
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>/dev/null

echo "== build (Makefile)"
t0=$(date +%s)
TEST=build/tests/test_attention_fp8_gpu
TEST_DELTA=""  # the delta pass's bit-identity test, where the tree has it
[ -f test/test_attention_delta_fp8_gpu.cu ] && TEST_DELTA=build/tests/test_attention_delta_fp8_gpu
if make -j16 SETUP=0 $CJ $TEST $TEST_DELTA > "$OUT/make.log" 2>&1; then
  summary+=("build: Makefile ok ($(( $(date +%s) - t0 )) s)")
  OBJDIR=build/obj; OBJSUF=.cu.o
else
  tail -5 "$OUT/make.log"
  echo "== Makefile build failed (log: make.log); explicit nvcc build of the FP8 files only"
  ok=1
  objs=""
  for f in common attention_cpu attention_ref; do  # the CPU emulation and the FP64 reference
    gcc -std=c11 -D_GNU_SOURCE -O2 -fopenmp -I. -I"${CUDA_HOME:-/usr/local/cuda}/include" -c src/$f.c -o "$BD/$f.o" || ok=0
    objs="$objs $BD/$f.o"
  done
  # + the BF16 kernels (fp8_hybrid's backward runs on them)
  for f in $CU_SRCS $BF16_SRCS; do $NVCC $NVF -c src/$f.cu -o "$BD/$f.cu.o" || ok=0; objs="$objs $BD/$f.cu.o"; done
  $NVCC $NVF -Itest test/test_attention_fp8_gpu.cu $objs -o "$BD/test_attention_fp8_gpu" || ok=0
  TEST=$BD/test_attention_fp8_gpu; OBJDIR=$BD; OBJSUF=.cu.o
  if [ -n "$TEST_DELTA" ]; then
    $NVCC $NVF -Itest test/test_attention_delta_fp8_gpu.cu -o "$BD/test_attention_delta_fp8_gpu" || ok=0
    TEST_DELTA=$BD/test_attention_delta_fp8_gpu
  fi
  summary+=("build: Makefile FAILED, explicit build $([ $ok = 1 ] && echo ok || echo FAILED)")
fi

echo "== registers / spills (ptxas -v, CI flags)"
for f in $CU_SRCS; do
  $NVCC $NVF -Xptxas -v -c src/$f.cu -o "$BD/ptxas_$f.o" > "$OUT/ptxas_$f.txt" 2>&1
  grep -E "Compiling entry|registers|spill" "$OUT/ptxas_$f.txt" | sed -E 's/ptxas info *: //' |
    sed -E "s/Compiling entry function '_Z[0-9]+([a-z_0-9]+)(ILi([0-9]+)E)?.*/\1<\3>/" | paste - - - | cut -c1-160
  grep -E "C75|arning" "$OUT/ptxas_$f.txt" | head -3
done

echo "== SASS instruction mix per kernel: QGMMA HGMMA HMMA LDSM LDL STL"
for f in $CU_SRCS; do
  [ -f "$OBJDIR/$f$OBJSUF" ] && "$CUOBJDUMP" -sass "$OBJDIR/$f$OBJSUF"
done > "$OUT/fp8_attention.sass" 2>&1
awk '/Function :/ {name=$3; names[name]=1} /QGMMA/ {q[name]++} /HGMMA/ {g[name]++} / HMMA/ {m[name]++}
     /LDSM/ {s[name]++} / LDL/ {ll[name]++} / STL/ {sl[name]++}
     END {for (n in names) printf "  %-60s %5d %5d %5d %5d %4d %4d\n", substr(n,1,60), q[n], g[n], m[n], s[n], ll[n], sl[n]}' \
  "$OUT/fp8_attention.sass" | tee "$OUT/sass_mix.txt"
nq=$(grep -c QGMMA "$OUT/fp8_attention.sass")
summary+=("SASS: $nq QGMMA in $CU_SRCS; local memory: $(grep -cE ' (LDL|STL)' "$OUT/fp8_attention.sass") LDL/STL")
# the FP8 backward's kernels one by one (expected QGMMA: main 16 for d=128 / 12 for d=64, delta
# pass 8 / 4; the d=128 main kernel spilled ~84 bytes at the first compile)
if [ -f "$OBJDIR/attention_bwd_fp8$OBJSUF" ]; then
  bwd_mix=$(grep -E 'attn_bwd_fp8_(kernel|delta_kernel)|attn_fp8_delta_kernel' "$OUT/sass_mix.txt" | awk '{printf "%s:%d QGMMA %d LDL %d STL; ", $1, $2, $6, $7}')
  summary+=("FP8 backward SASS: ${bwd_mix:-no kernels found}")
fi

echo "== test (120 s limit)"
t0=$(date +%s)
OMP_NUM_THREADS=$(nproc) timeout 120 "$TEST" > "$OUT/test.log" 2>&1
rc=$?
grep -E "^(FAIL|skipped|#)" "$OUT/test.log" | head -40
summary+=("test_attention_fp8_gpu: $(grep -c '^ok - ' "$OUT/test.log") ok, $(grep -c '^FAIL - ' "$OUT/test.log") FAIL, exit $rc, $(( $(date +%s) - t0 )) s")
if [ -n "$TEST_DELTA" ]; then
  timeout 60 "$TEST_DELTA" > "$OUT/test_delta.log" 2>&1
  rd=$?
  [ $rd -ne 0 ] && rc=$rd
  grep -E "^(FAIL|skipped|#)" "$OUT/test_delta.log" | head -20
  summary+=("test_attention_delta_fp8_gpu: $(grep -c '^ok - ' "$OUT/test_delta.log") ok, $(grep -c '^FAIL - ' "$OUT/test_delta.log") FAIL, exit $rd")
fi
if command -v compute-sanitizer >/dev/null; then
  ATTN_FP8_TEST_SMALL=1 timeout 40 compute-sanitizer --tool memcheck "$TEST" > "$OUT/sanitizer.log" 2>&1
  summary+=("compute-sanitizer (small cases): $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1), $(grep -c '^ok - ' "$OUT/sanitizer.log") ok, $(grep -c '^FAIL - ' "$OUT/sanitizer.log") FAIL")
fi

echo "== summary"
for s in "${summary[@]}"; do echo "  $s"; done
exit $rc
