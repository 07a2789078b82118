#!/bin/sh
# Runs every test program in build/tests and every shell test in test/*.sh, counts the
# "ok - " and "FAIL - " lines they print, and closes with "N passed, M failed".
# A program that exits non-zero without printing a FAIL line (a crash) counts as one failure.
# GPU tests decide for themselves whether a GPU is present and print a "skipped" line if not.
cd "$(dirname "$0")/.." || exit 1
log=$(mktemp)
pass=0; fail=0
run_one() {  # name, command...
  name=$1; shift
  echo "== $name"
  "$@" >"$log" 2>&1
  rc=$?
  cat "$log"
  p=$(grep -c '^ok - ' "$log"); f=$(grep -c '^FAIL - ' "$log")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL - $name exited with status $rc without reporting a failed check"; f=1
  fi
  pass=$((pass + p)); fail=$((fail + f))
}
for t in build/tests/test_*; do
  [ -x "$t" ] && run_one "$(basename "$t")" "$t"
done
for t in test/cli_*.sh; do
  [ -f "$t" ] && run_one "$(basename "$t")" sh "$t"
done
rm -f "$log"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
