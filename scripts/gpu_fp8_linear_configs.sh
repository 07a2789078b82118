#!/bin/bash
# gpu_fp8_linear_configs.sh: on one H200, in one call, issue 6's measurements for both paper
# configs it names (carry .deps):
#   1. bench_fp8_gemm: every linear's forward / dgrad / wgrad GEMM at the training shapes of
#      paper_569m and paper_1p67b (4 x 4096 tokens) in bf16, fp8_tensor and fp8_block, TFLOP/s;
#   2. for each config, scripts/gpu_fp8_linear_e2e.sh with TORCH=1: the PyTorch BF16 baseline of the
#      same architecture, then train_gpt with precision.linear = bf16 / fp8_tensor / fp8_block /
#      fp8_block + FP8 LM head (attention BF16), STEPS steps each, tokens/s and losses;
#   3. all the tables last (also in $OUT/summary.md).
# About 6 minutes. Logs in $OUT (default /tmp/gpu_fp8_configs_out).
#   usage: bash scripts/gpu_fp8_linear_configs.sh     (STEPS=16 MB=4 to change)
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, CJ, elapsed
gpu_start /tmp/gpu_fp8_configs_out
export STEPS=${STEPS:-16} MB=${MB:-4} NCCL_NVLS_ENABLE=0
timeout 300 make -j16 SETUP=0 $CJ train_gpt build/bench/bench_fp8_gemm >"$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log"; echo "== build FAILED"; exit 1; }
echo "== 1. GEMM shapes ($(elapsed) s)"
build/bench/bench_fp8_gemm paper_569m $((MB * 4096)) 1536 3968 15 >"$OUT/gemm.md" 2>&1
build/bench/bench_fp8_gemm paper_1p67b $((MB * 4096)) 2048 5504 29 >>"$OUT/gemm.md" 2>&1
RUNS="bf16:bf16:bf16:42 fp8_tensor:fp8_tensor:bf16:42 fp8_block:fp8_block:bf16:42 fp8_block_head:fp8_block+head:bf16:42"
for c in paper_569m paper_1p67b; do
  echo "== 2. $c end to end ($(elapsed) s)"
  OUT="$OUT/$c" CONFIG="configs/$c.json" TORCH=1 NO_TEST=1 RUNS="$RUNS" BUDGET=330 \
    bash scripts/gpu_fp8_linear_e2e.sh >"$OUT/e2e_$c.log" 2>&1
  grep -E "exit|rror" "$OUT/e2e_$c.log" | head -12
done
echo "== 3. tables ($(elapsed) s)"
{ cat "$OUT/gemm.md"; for c in paper_569m paper_1p67b; do echo; cat "$OUT/$c/table_$c.md" 2>/dev/null; done; } \
  | tee "$OUT/summary.md"
