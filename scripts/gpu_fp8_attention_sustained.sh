#!/bin/bash
# gpu_fp8_attention_sustained.sh: on a GPU machine, the bare FP8 forward, our BF16 forward and
# cuDNN's under the two clock regimes a GPU runs in (dev/bench/bench_attention_sustained.py): "cool"
# (a short burst after 1 s idle: every kernel at a cool board's clock) and "sustained" (after 1 s
# of the kernel's own launches: the board at its 700 W cap, each kernel at the clock the cap leaves
# it). Why: the interleaved rounds of scripts/gpu_fp8_attention_bench.sh run in and out of the
# power cap, and at 8K the FP8 forward's median there moved between boards (docs/perf.md, stop 40).
# With SERIES=1 also dev/bench/fwd_fp8_series.py at T = 8K: single launches in series (back to back,
# static order, alternating with ours, after a spin) and 4000 launches of each kernel back to back
# in tenths, with the clock, power and clock-event reasons nvidia-smi sampled meanwhile.
#   1. the attention library (scripts/gpu_fp8_attention_bench.sh BUILD_ONLY=1; REUSE_LIB=1: the one
#      an earlier run left in $BD);
#   2. the two regimes at T_LIST (default 1K..8K), ~20 s per T; the table last.
#   usage: bash scripts/gpu_fp8_attention_sustained.sh   [T_LIST="1024 2048 4096 8192"] [SERIES=1] [REUSE_LIB=1]
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, attn_lib_or_die
gpu_start /tmp/gpu_fp8_sustained_out
attn_lib_or_die  # sets BD
if [ "${SERIES:-0}" = 1 ]; then
  timeout -k 5 120 python3 dev/bench/fwd_fp8_series.py --lib "$BD/libattn_fp8.so" --T 8192 --n 60 --n-long 4000 \
    >"$OUT/series.txt" 2>&1 || echo "series: exit $?"
  tail -30 "$OUT/series.txt"
fi
# shellcheck disable=SC2086
timeout -k 5 300 python3 dev/bench/bench_attention_sustained.py --lib "$BD/libattn_fp8.so" --T ${T_LIST:-1024 2048 4096 8192} \
  >"$OUT/sustained.txt" 2>&1 || { echo "sustained: exit $?"; tail -5 "$OUT/sustained.txt"; }
sed -n "/^forwards under two clock regimes/,\$p" "$OUT/sustained.txt"
