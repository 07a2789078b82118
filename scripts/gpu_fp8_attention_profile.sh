#!/bin/bash
# gpu_fp8_attention_profile.sh: on a GPU machine with hardware counters (Firecracker runtime:
# /work/.library/device/H200.md), one Nsight Compute profile of each FP8 attention kernel at
# T = 4096 (H 16, d 128, B*T 16384), to explain where the kernels lose against their static bounds
# (docs/fp8-attention-kernels.md §4-5: the forward runs ~2x slower than any static count says):
#   1. build the benchmark library with scripts/gpu_fp8_attention_bench.sh (MODES=fp8_naive, few
#      rounds: it also prints the bare kernels' TFLOP/s of this tree, the baseline of the profile);
#   2. ncu --set full, one launch of each kernel in KERNELS (default: the forward, the backward's
#      main kernel, the fp8_dm delta kernel), clocks left alone (--clock-control none: METHOD.md);
#   3. per kernel, the details page and the per-SASS-line source page as CSV into $OUT, and the
#      lines that answer the analysis' questions printed: tensor and XU pipe utilisation, issue
#      activity, the warp-stall breakdown, and the SASS lines that collect the most stall samples.
# Logs and reports go to $OUT (default /tmp/gpu_fp8_profile_out). About 3-4 minutes on one H200.
#   usage: bash scripts/gpu_fp8_attention_profile.sh      (KERNELS="attn_fwd_fp8" to narrow it;
#          REUSE_LIB=1 skips step 1 when the benchmark script just built $BD/libattn_fp8.so)
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # ncu_pages
OUT=${OUT:-/tmp/gpu_fp8_profile_out}
BD=${BD:-/tmp/gpu_fp8_bench_build}
KERNELS=${KERNELS:-"attn_fwd_fp8_kernel attn_bwd_fp8_kernel attn_fp8_delta_kernel"}
mkdir -p "$OUT"
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
if [ -z "$NCU" ] || [ ! -x "$NCU" ]; then echo "no ncu found (set NCU=path)"; exit 1; fi
echo "== ncu: $NCU"

if [ "${REUSE_LIB:-0}" = 1 ] && [ -f "$BD/libattn_fp8.so" ]; then
  echo "== 1. reusing $BD/libattn_fp8.so (REUSE_LIB=1: built by gpu_fp8_attention_bench.sh of this tree)"
else
  echo "== 1. build + baseline (scripts/gpu_fp8_attention_bench.sh, fp8_naive, 5 rounds)"
  OUT="$OUT/bench" BD="$BD" MODES="fp8_naive" ROUNDS=5 BUDGET=150 bash scripts/gpu_fp8_attention_bench.sh \
    > "$OUT/bench.log" 2>&1 || { tail -20 "$OUT/bench.log"; echo "== build/bench FAILED"; exit 1; }
  grep -A6 "^quantize passes and the bare FP8 kernels" "$OUT/bench.log"
fi

# fp8_dm runs the delta kernel too; fp8_naive has the forward and the main backward kernel
for k in $KERNELS; do
  mode=fp8_naive
  [ "$k" = attn_fp8_delta_kernel ] && mode=fp8_dm
  echo "== 2. $k ($mode, T 4096)"
  timeout -k 5 150 "$NCU" --clock-control none --set full -k "regex:^${k}" -c 1 -f -o "$OUT/$k" \
    python3 dev/bench/bench_attention_fp8.py --lib "$BD/libattn_fp8.so" --modes "$mode" --T 4096 --rounds 1 \
    > "$OUT/ncu_$k.log" 2>&1
  rc=$?
  if [ $rc != 0 ] || [ ! -f "$OUT/$k.ncu-rep" ]; then
    echo "   ncu exit $rc"; grep -E "==PROF==|==ERROR==|==WARNING==" "$OUT/ncu_$k.log" | head -5; continue
  fi
  ncu_pages "$NCU" "$OUT" "$k"
done
echo "== reports: $OUT/*.ncu-rep (open with ncu-ui), CSV pages alongside"
