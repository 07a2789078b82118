#!/bin/sh
# Runs every test program in build/tests and every shell test in test/cli_*.sh, each under a time
# limit, counts the "ok - ", "FAIL - " and "skipped: " lines they print, and closes with
# "N passed, M failed, K skipped"; the exit status is 0 only when nothing failed.
#   - A test that exits non-zero without printing a FAIL line (a crash) counts as one failure; so
#     does one that prints neither a check nor a skip (it tested nothing), and one that runs past
#     its limit (TEST_TIMEOUT seconds each, default 1200).
#   - The one reason to skip is a machine without a GPU: a GPU test then prints
#     "skipped: <what> (no GPU: <why>)" (test/gpu_test.h decides). Where nvidia-smi lists a GPU,
#     every skip is a failure: the GPU was there and the test did not use it.
# Usage: sh test/run_tests.sh [ROOT]   (ROOT: the tree holding build/tests and test/; default: this
# repository; test/cli_harness.sh points it at a tree of its own). TESTS="NAME ..." runs only those
# programs of build/tests and no shell test (scripts/gpu.sh check kernels: the GPU tests alone).
cd "${1:-$(dirname "$0")/..}" || exit 1
log=$(mktemp)
limit=${TEST_TIMEOUT:-1200}
pass=0; fail=0; skip=0
gpu_listed=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then gpu_listed=1; fi
with_limit=""
command -v timeout >/dev/null 2>&1 && with_limit="timeout -k 10 $limit"
run_one() {  # name, command...
  name=$1; shift
  echo "== $name"
  $with_limit "$@" >"$log" 2>&1
  rc=$?
  cat "$log"
  p=$(grep -c '^ok - ' "$log"); f=$(grep -c '^FAIL - ' "$log"); s=$(grep -c '^skipped: ' "$log")
  if [ -n "$with_limit" ] && { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; }; then
    echo "FAIL - $name timed out after $limit s (TEST_TIMEOUT)"; f=$((f + 1))
  elif [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL - $name exited with status $rc without reporting a failed check"; f=1
  elif [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -eq 0 ]; then
    echo "FAIL - $name reported no check (exit status $rc)"; f=1
  fi
  if [ "$s" -gt 0 ] && [ "$gpu_listed" -eq 1 ]; then
    grep '^skipped: ' "$log" | sed "s/^skipped: /FAIL - $name skipped on a machine where nvidia-smi lists a GPU: /"
    f=$((f + s)); s=0
  fi
  pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
}
if [ -n "${TESTS:-}" ]; then
  for n in $TESTS; do
    if [ -x "build/tests/$n" ]; then run_one "$n" "build/tests/$n"
    else echo "== $n"; echo "FAIL - $n: build/tests/$n is not built"; fail=$((fail + 1)); fi
  done
else
  for t in build/tests/test_*; do
    [ -x "$t" ] && run_one "$(basename "$t")" "$t"
  done
  for t in test/cli_*.sh; do
    [ -f "$t" ] && [ "$t" != test/cli_lib.sh ] && run_one "$(basename "$t")" sh "$t"
  done
fi
rm -f "$log"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
