#!/bin/bash
# gpu_test_all.sh: on a GPU machine, build everything with the Makefile and run `make test`'s
# runner (test/run_tests.sh: every CPU and GPU test and the CLI tests), then print the failures
# and the runner's "N passed, M failed" last. Logs go to $OUT (default /tmp/gpu_test_all_out).
#   usage: bash scripts/gpu_test_all.sh          (BUDGET=420 seconds for the tests by default)
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_test_all_out}
BUDGET=${BUDGET:-420}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
. scripts/gpu_lib.sh  # t_start, elapsed, left, CJ
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
make -j16 SETUP=0 $CJ tests >"$OUT/make.log" 2>&1
rc=$?
echo "build: exit $rc at $(elapsed) s"
if [ $rc -ne 0 ]; then grep -E "error" "$OUT/make.log" | head -20; exit 1; fi
timeout -k 5 "$(left "$BUDGET")" sh test/run_tests.sh >"$OUT/tests.log" 2>&1
rc=$?
echo "tests: exit $rc at $(elapsed) s"
grep -E "^(== |# test_.*passed|FAIL|skipped)" "$OUT/tests.log" | grep -vE "^== " | head -40
tail -1 "$OUT/tests.log"
exit $rc
