#!/bin/bash
# gpu_fp8_quant_profile.sh: on a GPU machine, Nsight Compute on the fp8_block quantization
# kernels as bench_fp8_quant runs them (paper_569m shapes): one launch of each kernel in KERNELS
# (default: vec128both_kernel, swiglu_fp8_kernel, swiglu_bwd_fp8_kernel, rmsnorm_tile_fp8_kernel),
# --set full, then scripts/ncu_summary.py on each (headline metrics, pipe utilization, stalls).
# Reports and CSVs in $OUT (default /tmp/gpu_fp8_quant_prof). About a minute after the build.
# KERNELS are regular expressions on the demangled name with its template arguments, e.g.
# "swiglu_bwd_fp8_kernel.*true" for the per-tensor (delayed scaling) instance.
#   usage (device tool, carry .deps): bash scripts/gpu_fp8_quant_profile.sh   (KERNELS="..." to change)
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, CJ
gpu_start /tmp/gpu_fp8_quant_prof
KERNELS=${KERNELS:-"vec128both_kernel swiglu_fp8_kernel swiglu_bwd_fp8_kernel rmsnorm_tile_fp8_kernel"}
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
if [ -z "$NCU" ] || [ ! -x "$NCU" ]; then echo "no ncu found (set NCU=path)"; exit 1; fi
timeout 300 make -j16 SETUP=0 $CJ build/bench/bench_fp8_quant >"$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log"; echo "== build FAILED"; exit 1; }
for re in $KERNELS; do
  echo "== $re"
  k=$(printf '%s' "$re" | tr -c 'A-Za-z0-9_' '_')  # a file name
  # skip the first launches (the warm-up) of the kernel; profile one
  timeout -k 5 120 "$NCU" --clock-control none --set full --kernel-name-base demangled -k "regex:${re}" -s 3 -c 1 \
    -f -o "$OUT/$k" build/bench/bench_fp8_quant >"$OUT/ncu_$k.log" 2>&1
  if [ ! -f "$OUT/$k.ncu-rep" ]; then grep -E "==PROF==|==ERROR==|==WARNING==" "$OUT/ncu_$k.log" | head -5; continue; fi
  "$NCU" --import "$OUT/$k.ncu-rep" --page details --csv >"$OUT/${k}_details.csv" 2>/dev/null
  "$NCU" --import "$OUT/$k.ncu-rep" --page raw --csv >"$OUT/${k}_raw.csv" 2>/dev/null
  "$NCU" --import "$OUT/$k.ncu-rep" --page source --csv --print-source sass >"$OUT/${k}_sass.csv" 2>/dev/null
  python3 scripts/ncu_summary.py "$OUT/${k}_details.csv" "$OUT/${k}_raw.csv" "$OUT/${k}_sass.csv"
done
