#!/bin/bash
# gpu_model_check.sh: on a GPU machine, in one go: build the GPU backend's test with the
# Makefile, run test_model_gpu (GPU vs CPU backend: loss, every gradient, 10 AdamW steps, a
# d768 smoke test with its timing line) writing dumps, then test/torch_parity.py on the dumps
# (PyTorch FP32 and BF16 autocast against our GPU numbers). A short summary prints last.
# Logs go to $OUT (or /tmp/gpu_model_out); the dumps (~240 MB) to $DUMP (not copied back).
#   usage (device tool, carry [".deps"]): bash scripts/gpu_model_check.sh [--no-torch]
#   cJSON: .deps/cjson, as fetched by shared/device/fetch-cjson.sh, or the system's.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_model_out}
DUMP=${DUMP:-/tmp/gpu_model_dump}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
do_torch=1
for a in "$@"; do
  case $a in --no-torch) do_torch=0 ;; *) echo "unknown option $a"; exit 2 ;; esac
done
. scripts/gpu_lib.sh  # CJ
summary=()
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== build"
t0=$(date +%s)
make -j16 SETUP=0 $CJ build/tests/test_model_gpu > "$OUT/make.log" 2>&1; r=$?
grep -E "error|warning" "$OUT/make.log" | grep -v C7519 | head -10
summary+=("build: exit $r in $(( $(date +%s) - t0 )) s")
if [ $r -ne 0 ]; then tail -20 "$OUT/make.log"; printf '%s\n' "== summary" "${summary[@]}"; exit 1; fi

echo "== test_model_gpu --dump $DUMP"
t0=$(date +%s)
build/tests/test_model_gpu --dump "$DUMP" > "$OUT/test_model_gpu.log" 2>&1; r=$?
grep -E "^(FAIL|skipped)|^# (plan|timing|base|qk_tied|nope|tiny|accumulation)|worst|GPU allocation" "$OUT/test_model_gpu.log" | cut -c1-150
n_ok=$(grep -c '^ok - ' "$OUT/test_model_gpu.log"); n_fail=$(grep -c '^FAIL - ' "$OUT/test_model_gpu.log")
[ $r -ne 0 ] && [ "$n_fail" -eq 0 ] && { tail -5 "$OUT/test_model_gpu.log"; n_fail=1; }
summary+=("test_model_gpu: $n_ok ok, $n_fail FAIL, exit $r, $(( $(date +%s) - t0 )) s")
summary+=("$(grep '^# timing' "$OUT/test_model_gpu.log" | cut -c3-)")

if [ $do_torch = 1 ] && [ -f "${DUMP}_base.bin" ]; then
  echo "== torch_parity.py"
  t0=$(date +%s)
  dumps="${DUMP}_base.bin"; [ -f "${DUMP}_qk_tied.bin" ] && dumps="$dumps ${DUMP}_qk_tied.bin"
  PYTHONUNBUFFERED=1 timeout 200 python3 test/torch_parity.py $dumps > "$OUT/torch_parity.log" 2>&1; r=$?
  grep -vE "^ +[0-9]+ |^(layers|wte|final|lm_head)" "$OUT/torch_parity.log" | tail -12
  summary+=("torch_parity: exit $r, $(grep -E '^torch_parity:' "$OUT/torch_parity.log"), $(( $(date +%s) - t0 )) s")
  for v in $(grep -E '^(PASS|FAIL):' "$OUT/torch_parity.log" | cut -c1-150 | tr ' ' '~'); do summary+=("  ${v//\~/ }"); done
fi
printf '%s\n' "== summary" "${summary[@]}"
