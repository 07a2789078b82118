#!/bin/bash
# gpu_patch_ab.sh: on a GPU machine, time a change that has no runtime switch: the attention
# benchmark (scripts/gpu_fp8_attention_bench.sh) on the tree as it is (A, which contains PATCH),
# on the tree with PATCH reversed (B), and on A again (A/B/A: the GPU's drift within the call shows
# as the difference of the two A runs), then the bare FP8 kernels' and the API's key columns of
# each run. CHECK=1 first runs the FP8 attention tests on A (scripts/gpu_fp8_attention_check.sh).
# The tree is left as it was. Logs: $OUT/{a1,b,a2}.log.
#   usage: [CHECK=1] [MODES="bf16 fp8_dm"] [ROUNDS=3] bash scripts/gpu_patch_ab.sh PATCH
set -u
cd "$(dirname "$0")/.." || exit 1
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: bash scripts/gpu_patch_ab.sh PATCH (a diff the tree contains)" >&2; exit 2; }
patch=$1 OUT=${OUT:-/tmp/gpu_patch_ab_out}
mkdir -p "$OUT"
git apply --check -R "$patch" || { echo "gpu_patch_ab.sh: $patch does not reverse cleanly on this tree" >&2; exit 2; }
if [ "${CHECK:-0}" = 1 ]; then
  OUT="$OUT/check" bash scripts/gpu_fp8_attention_check.sh > "$OUT/check.log" 2>&1; echo "== tests (A): rc $?"
  grep -E "ok, .* FAIL|ERROR SUMMARY" "$OUT/check.log" | tail -4
fi
run() {  # label, build dir, reuse the library
  OUT="$OUT/$1" BD=$2 REUSE_LIB=$3 MODES="${MODES:-bf16 fp8_dm}" ROUNDS="${ROUNDS:-3}" \
    bash scripts/gpu_fp8_attention_bench.sh > "$OUT/$1.log" 2>&1 || echo "== $1: the benchmark failed (see $OUT/$1.log)"
}
run a1 /tmp/gpu_patch_ab_a 0
git apply -R "$patch" || { echo "gpu_patch_ab.sh: could not reverse $patch" >&2; exit 1; }
run b /tmp/gpu_patch_ab_b 0
git apply "$patch" || { echo "gpu_patch_ab.sh: could not apply $patch again: the tree is B now" >&2; exit 1; }
run a2 /tmp/gpu_patch_ab_a 1
for s in a1 b a2; do
  echo "== $s (a: with $patch, b: without)"
  sed -n '/^| T | quant fwd/,/^$/p' "$OUT/$s.log" | grep "^| [0-9]" |
    awk -F'|' '{printf "%s FP8 fwd bare %s | dm bwd bare %s | delta kernel ms %s\n", $2, $4, $8, $11}'
  sed -n '/^| T | ours f | cuDNN/,/^$/p' "$OUT/$s.log" | grep "^| [0-9]" |
    awk -F'|' '{printf "%s ours f %s | dm f / ours f %s | dm f+b / ours f+b %s\n", $2, $3, $11, $12}'
  grep -h -e "bare FP8 forward / ours" -e "GPU state" "$OUT/$s.log"
done
