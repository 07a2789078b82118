#!/bin/bash
# gpu_layers_bench.sh: on a GPU machine, the BF16 row kernels that every precision runs (the LM
# head's cross-entropy, the RMSNorm backward) checked and timed in one call (carry .deps):
#   1. build (make: test_layers_gpu and dev/bench/bench_layers; cJSON from .deps/cjson when present);
#   2. test_layers_gpu (every layer kernel against its host reference, the cross-entropy on its
#      row-in-registers paths and the scalar one) unless NO_TEST=1;
#   3. bench_layers at paper_569m's shapes with the default kernels, then with CE_SCALAR=1 (the
#      scalar cross-entropy), the RMSNorm backward at C 2048 and 3072 too, and PyTorch's F.cross_entropy forward + backward on the same logits
#      (dev/bench/bench_layers_torch.py) as the peer; the tables last.
# Logs in $OUT (default /tmp/gpu_layers_bench_out). About a minute on one H200 after the build.
#   usage: bash scripts/gpu_layers_bench.sh
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, CJ
gpu_start /tmp/gpu_layers_bench_out
timeout 300 make -j16 SETUP=0 $CJ build/tests/test_layers_gpu build/bench/bench_layers >"$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log"; echo "== build FAILED"; exit 1; }
echo "build done at $(elapsed) s"
summary=()
if [ "${NO_TEST:-0}" != 1 ]; then
  timeout -k 5 120 build/tests/test_layers_gpu >"$OUT/test_layers_gpu.log" 2>&1; r=$?
  grep -E "^FAIL" "$OUT/test_layers_gpu.log" | head -10 | cut -c1-240
  summary+=("test_layers_gpu: exit $r, $(grep -c '^ok' "$OUT/test_layers_gpu.log") ok, $(grep -c '^FAIL' "$OUT/test_layers_gpu.log") FAIL")
fi
build/bench/bench_layers >"$OUT/bench.md" 2>&1
CE_SCALAR=1 build/bench/bench_layers 2>&1 | grep -E "^# bench|cross-entropy" >>"$OUT/bench.md"
for c in 2048 3072; do  # paper_1p67b's and paper_5p29b's width (the RMSNorm backward at 1 block per SM)
  build/bench/bench_layers 16384 $c 2>&1 | grep -E "^# bench|rmsnorm" >>"$OUT/bench.md"
done
python3 dev/bench/bench_layers_torch.py >>"$OUT/bench.md" 2>&1
echo "== summary ($(elapsed) s)"
for l in "${summary[@]}"; do echo "  $l"; done
cat "$OUT/bench.md"
