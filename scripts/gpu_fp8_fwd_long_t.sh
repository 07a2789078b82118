#!/bin/bash
# gpu_fp8_fwd_long_t.sh: on a GPU machine, the FP8 forward against our BF16 forward at T near 8K,
# to tell a cost of 8K itself from one of long sequences: T = 7936, 8192, 8320 (62, 64, 65 key
# blocks) at B = 2, H 16, d 128. Why: the bare FP8 forward's ratio to ours falls from ~1.36 at 4K
# to 1.23-1.33 at 8K, and an ablation (docs/perf.md, stop 32) put the 8K spread between calls in
# its K̂, V̂^T loads. V̂^T is stored (B, H, d, T): each key block's 128 rows lie T bytes apart, a
# power of two at 8192 (where L2 sets or memory channels could alias) and not at 7936 or 8320.
#   1. the attention library (scripts/gpu_fp8_attention_bench.sh BUILD_ONLY=1; with REUSE_LIB=1 the
#      one an earlier run of that script left in $BD);
#   2. dev/bench/bench_attention_fp8.py for each T (modes bf16 and fp8_dm, ROUNDS rounds, default 10);
#   3. each T's summary: the bare FP8 forward's TFLOP/s (the quantize-pass table), ours (the mode
#      table) and the line "the bare FP8 forward / ours".
#   usage: bash scripts/gpu_fp8_fwd_long_t.sh   [T_LIST="7936 8192 8320"] [ROUNDS=10] [REUSE_LIB=1]
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, attn_lib_or_die
gpu_start /tmp/gpu_fp8_fwd_long_t_out
attn_lib_or_die  # sets BD
for T in ${T_LIST:-7936 8192 8320}; do
  timeout -k 5 200 python3 dev/bench/bench_attention_fp8.py --lib "$BD/libattn_fp8.so" --modes bf16 fp8_dm \
    --tokens $((2 * T)) --T "$T" --rounds "${ROUNDS:-10}" --summary-out "$OUT/summary_$T.txt" >"$OUT/bench_$T.txt" 2>&1 ||
    { echo "T $T: exit $?"; tail -5 "$OUT/bench_$T.txt"; }
done
for T in ${T_LIST:-7936 8192 8320}; do echo "== T $T"; cat "$OUT/summary_$T.txt" 2>/dev/null; done
