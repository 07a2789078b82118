#!/bin/bash
# gpu_fp8_quant_quick.sh: on a GPU machine, the quickest check of the linear layers' FP8
# quantization kernels (under a minute): test_layers_fp8_gpu and test_linear_fp8_gpu's
# quantization part (FP8_TEST_QUANT_ONLY=1), each compiled straight from the few sources it needs
# (in parallel, no library build), then their FAIL lines and counts. For the whole suite use
# scripts/gpu_test_all.sh. Carry .deps (cJSON). Logs in $OUT (default /tmp/gpu_fp8_quant_quick).
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, NVCC, elapsed
gpu_start /tmp/gpu_fp8_quant_quick
CJ_INC="" CJ_LIB=""
[ -d .deps/cjson ] && CJ_INC="-I.deps/cjson/include" CJ_LIB="-L.deps/cjson/lib -Xlinker -rpath -Xlinker $PWD/.deps/cjson/lib"
FLAGS="-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I. -Itest $CJ_INC"
COMMON="gpu/linear_fp8_gpu.cu cpu/linear_fp8.c gpu/matmul.cu cpu/matmul_cpu.c core/common.c core/config.c core/config_validate.c"
LIBS="-lcublasLt -lcjson $CJ_LIB -Xcompiler -fopenmp"
$NVCC $FLAGS test/test_linear_fp8_gpu.cu $COMMON -o "$OUT/test_linear_fp8_gpu" $LIBS >"$OUT/build_linear.log" 2>&1 &
$NVCC $FLAGS test/test_layers_fp8_gpu.cu gpu/layers.cu gpu/layers_fp8.cu $COMMON -o "$OUT/test_layers_fp8_gpu" $LIBS \
  >"$OUT/build_layers.log" 2>&1 &
wait
echo "built at $(elapsed) s"
for t in test_linear_fp8_gpu test_layers_fp8_gpu; do
  if [ ! -x "$OUT/$t" ]; then echo "$t: build FAILED"; grep -E "error" "$OUT"/build_*.log | head -5; continue; fi
  FP8_TEST_QUANT_ONLY=1 timeout -k 5 120 "$OUT/$t" >"$OUT/$t.log" 2>&1
  echo "$t: exit $?"
  grep -E "^FAIL" "$OUT/$t.log" | head -10 | cut -c1-240
  tail -1 "$OUT/$t.log"
done
