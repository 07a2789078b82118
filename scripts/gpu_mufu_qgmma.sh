#!/bin/bash
# gpu_mufu_qgmma.sh: on a GPU machine (~30 s): build and run dev/bench/bench_mufu_qgmma.cu: whether the
# exponentials (MUFU) and the FP8 wgmmas (QGMMA) run at the same time on an SM, and the FP8
# forward's own step in each loop form (dev/bench/bench_fwd_fp8_loops.cuh), with traces and the wgmma
# issue's cost. Table last, then the traces. Then dev/bench/bench_fwd_fp8_wg.cu: the step with three
# consumer warpgroups instead of two, and with S's Q̂ from registers (its own short table).
#   usage: [ITERS=4000] [OUT=dir] bash scripts/gpu_mufu_qgmma.sh
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_mufu_qgmma_out}
mkdir -p "$OUT"
. scripts/gpu_lib.sh  # NVCC
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>/dev/null
$NVCC -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -Xptxas -v dev/bench/bench_mufu_qgmma.cu core/common.c \
  -o "$OUT/bench_mufu_qgmma" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; echo "== build FAILED"; exit 1; }
grep -E "spill|C75" "$OUT/build.log" | grep -v " 0 bytes spill" | head -5
command -v cuobjdump >/dev/null && cuobjdump -sass "$OUT/bench_mufu_qgmma" | grep -cE "QGMMA" | sed 's/^/QGMMA instructions in the SASS (all forms): /'
"$OUT/bench_mufu_qgmma" "${ITERS:-4000}" | tee "$OUT/result.txt"
$NVCC -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -Xptxas -v dev/bench/bench_fwd_fp8_wg.cu core/common.c \
  -o "$OUT/bench_fwd_fp8_wg" > "$OUT/build_wg.log" 2>&1 || { tail -20 "$OUT/build_wg.log"; echo "== build FAILED"; exit 1; }
grep -E "spill|C75" "$OUT/build_wg.log" | grep -v " 0 bytes spill" | head -5
"$OUT/bench_fwd_fp8_wg" "${ITERS:-4000}" | tee "$OUT/result_wg.txt"
