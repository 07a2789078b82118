#!/bin/bash
# gpu_qkv_gemm_profile.sh: on a GPU machine with hardware counters, one Nsight Compute profile of
# the QKV GEMM (gpu/qkv_gemm.cu) in each variant of VARIANTS, and of cuBLASLt's GEMM of the same
# shape, to see where the quantizing GEMM loses against cuBLASLt (docs/perf.md, stops 37-38): the
# share of the consumer warps' stall samples in the epilogue's lines against the mainloop's, the
# tensor pipe's utilization, the issue activity.
#   1. build bench_qkv_gemm (cJSON from .deps/cjson);
#   2. per variant: `bench_qkv_gemm profile VARIANT C` launches that GEMM twice; ncu --set full
#      profiles the second launch (clocks left alone: --clock-control none, METHOD.md);
#   3. per variant, ncu_summary.py's lines (all in $OUT/summaries.txt, printed last; CSV pages in
#      $OUT/pages.tgz): headline metrics, pipes, the stall breakdown by region
#      (runs of SASS lines executed equally often: the mainloop, the epilogue, the producer) and the
#      most-stalled lines.
#   usage: bash scripts/gpu_qkv_gemm_profile.sh   (VARIANTS="wide2 cublas", C=1536)
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, left, build_or_die, ncu_pages
gpu_start /tmp/gpu_qkv_gemm_profile_out
VARIANTS=${VARIANTS:-"cublas wide2 wide2_norope pingpong pingpong_bf16"}
C=${C:-2048}
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
if [ -z "$NCU" ] || [ ! -x "$NCU" ]; then echo "no ncu found (set NCU=path)"; exit 1; fi
build_or_die build/bench/bench_qkv_gemm
for v in $VARIANTS; do
  k="regex:qkv_gemm_kernel"
  [ "$v" = cublas ] && k="regex:nvjet|xmma|gemm|cutlass"
  echo "== $v (C $C, M 16384, N $((3 * C)))"
  timeout -k 5 "$(left 150)" "$NCU" --clock-control none --set full --import-source no -k "$k" --launch-skip 1 -c 1 \
    -f -o "$OUT/$v" build/bench/bench_qkv_gemm profile "$v" "$C" >"$OUT/ncu_$v.log" 2>&1
  rc=$?
  if [ $rc != 0 ] || [ ! -f "$OUT/$v.ncu-rep" ]; then
    echo "   ncu exit $rc"; grep -E "==PROF==|==ERROR==|==WARNING==|bench_qkv" "$OUT/ncu_$v.log" | head -5; continue
  fi
  { grep -m1 "==PROF== Profiling" "$OUT/ncu_$v.log" | cut -c1-160; ncu_pages "$NCU" "$OUT" "$v"; } >"$OUT/summary_$v.txt"
  rm -f "$OUT/$v.ncu-rep"
done
# few files come back from a device call: the CSV pages in one archive, the summaries in one file
tar czf "$OUT/pages.tgz" -C "$OUT" $(cd "$OUT" && ls *.csv 2>/dev/null) 2>/dev/null && rm -f "$OUT"/*.csv
for v in $VARIANTS; do echo "== $v"; cat "$OUT/summary_$v.txt" 2>/dev/null; done >"$OUT/summaries.txt"
rm -f "$OUT"/summary_*.txt "$OUT"/ncu_*.log
echo "== done at $(elapsed) s ($OUT/summaries.txt, $OUT/pages.tgz)"
cat "$OUT/summaries.txt"
