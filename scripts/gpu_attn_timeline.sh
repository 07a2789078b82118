#!/bin/bash
# gpu_attn_timeline.sh: on a GPU machine (~2.5 minutes on an H200): build the attention library
# with per-CTA timestamps (-DATTN_TIMELINE, attention/cta_timeline.cuh) in its own directory, then run
# dev/bench/attn_timeline.py: how the forward and main backward kernels (ours in BF16, the FP8 ones
# under fp8_naive and fp8_dm) spend the SMs' time: prologue, first block, loop, epilogue, gaps
# between CTAs or tiles, idle SMs at the start and end, and the SM clock they ran at. Tables last.
#   usage: [T="2048 8192"] [MODES="bf16 fp8_naive fp8_dm"] [DIRS="fwd bwd"] [SASS=0 (no SASS dump)] [OUT=dir]
#          [EPI=1: the FP8 forward's epilogue split into its parts instead of its phase table]
#          bash scripts/gpu_attn_timeline.sh
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_attn_timeline_out}
BD=${BD:-/tmp/gpu_tl_build}
mkdir -p "$OUT"
EPI=${EPI:-0}
NVF_TL="-DATTN_TIMELINE"; [ "$EPI" = 1 ] && NVF_TL="$NVF_TL -DATTN_TIMELINE_EPI"
EXTRA_NVF="$NVF_TL" BD=$BD OUT=$OUT BUILD_ONLY=1 bash scripts/gpu_fp8_attention_bench.sh || exit 1
args=(--lib "$BD/libattn_fp8.so" --T ${T:-2048 8192} --modes ${MODES:-bf16 fp8_naive fp8_dm} --dirs ${DIRS:-fwd bwd})
[ "$EPI" = 1 ] && args+=(--epi)
PYTHONUNBUFFERED=1 timeout -k 5 300 python3 dev/bench/attn_timeline.py "${args[@]}" 2>&1 | tee "$OUT/timeline.txt"
# the kernels' SASS, for reading the loops offline (this build's: the timeline marks add a few
# instructions per CTA or tile, outside the loops' steady path)
if command -v cuobjdump >/dev/null && [ "${SASS:-1}" = 1 ]; then
  for f in attention_bwd_fp8 attention_bwd attention_fwd_fp8; do
    cuobjdump -sass "$BD/$f.o" 2>/dev/null | gzip -9 > "$OUT/$f.sass.gz"
  done
  echo "SASS in $OUT/*.sass.gz"
fi
