#!/bin/sh
# cli_harness.sh: test/run_tests.sh itself, on a tree of stand-in tests: passes, failures, skips
# and the summary "N passed, M failed, K skipped"; a crash, a test that reports no check and one
# past its time limit each count as a failure; a skip is a failure where nvidia-smi lists a GPU.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

root=$tmp/root
mkdir -p "$root/build/tests" "$root/test" "$tmp/nogpu" "$tmp/gpu"
stand_in() {  # name, script body: an executable test in build/tests
  printf '#!/bin/sh\n%s\n' "$2" >"$root/build/tests/$1"
  chmod +x "$root/build/tests/$1"
}
stand_in test_good 'echo "ok - a"; echo "ok - b"'
stand_in test_skip 'echo "skipped: test_skip (no GPU: no NVIDIA driver found)"'
printf 'echo "ok - c"\necho "FAIL - d: detail"\n' >"$root/test/cli_mixed.sh"
printf '# shared helpers, not a test\nhelper() { :; }\n' >"$root/test/cli_lib.sh"
# a PATH without nvidia-smi, and one whose nvidia-smi lists a GPU
for t in sh grep sed cat mktemp rm basename dirname timeout sleep; do
  p=$(command -v $t) && ln -s "$p" "$tmp/nogpu/$t" && ln -s "$p" "$tmp/gpu/$t"
done
printf '#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n' >"$tmp/gpu/nvidia-smi"
chmod +x "$tmp/gpu/nvidia-smi"
harness() {  # PATH-dir: runs the harness on the tree; the log in $tmp/log, status in rc
  PATH=$1 TEST_TIMEOUT=3 sh test/run_tests.sh "$root" >"$tmp/log" 2>&1
  rc=$?
}

harness "$tmp/nogpu"
check "summary counts passes, failures and skips" "$(tail -1 "$tmp/log")" [ "$(tail -1 "$tmp/log")" = "3 passed, 1 failed, 1 skipped" ]
check "a failure makes the status non-zero" "rc $rc" [ "$rc" -ne 0 ]
check "cli_lib.sh is not run as a test" "$(grep '^== ' "$tmp/log" | tr '\n' ' ')" sh -c "! grep -q '^== cli_lib.sh' '$tmp/log'"
printf 'echo "ok - c"\n' >"$root/test/cli_mixed.sh"
harness "$tmp/nogpu"
check "all passing: status 0" "rc $rc: $(tail -1 "$tmp/log")" sh -c "[ $rc -eq 0 ] && [ \"\$(tail -1 '$tmp/log')\" = '3 passed, 0 failed, 1 skipped' ]"
harness "$tmp/gpu"
check "where nvidia-smi lists a GPU, a skip is a failure" "rc $rc: $(grep FAIL "$tmp/log")" \
  sh -c "[ $rc -ne 0 ] && [ \"\$(tail -1 '$tmp/log')\" = '3 passed, 1 failed, 0 skipped' ] && \
         grep -q '^FAIL - test_skip skipped on a machine where nvidia-smi lists a GPU: test_skip (no GPU' '$tmp/log'"
rm "$root/build/tests/test_skip"
stand_in test_silent 'exit 0'
harness "$tmp/nogpu"
check "a test that reports no check fails" "$(grep test_silent "$tmp/log")" \
  sh -c "[ $rc -ne 0 ] && grep -q '^FAIL - test_silent reported no check (exit status 0)' '$tmp/log' && [ \"\$(tail -1 '$tmp/log')\" = '3 passed, 1 failed, 0 skipped' ]"
rm "$root/build/tests/test_silent"
stand_in test_crash 'echo "ok - before the crash"; kill -SEGV $$'
harness "$tmp/nogpu"
check "a crash after passing checks fails" "$(grep test_crash "$tmp/log")" \
  sh -c "[ $rc -ne 0 ] && grep -q '^FAIL - test_crash exited with status [0-9]* without reporting a failed check' '$tmp/log'"
rm "$root/build/tests/test_crash"
stand_in test_hang 'echo "ok - started"; sleep 30'
start=$(date +%s)
harness "$tmp/nogpu"
took=$(( $(date +%s) - start ))
check "a test past TEST_TIMEOUT is stopped and fails" "took $took s: $(grep test_hang "$tmp/log")" \
  sh -c "[ $rc -ne 0 ] && [ $took -lt 20 ] && grep -q '^FAIL - test_hang timed out after 3 s (TEST_TIMEOUT)' '$tmp/log'"
rm "$root/build/tests/test_hang"
# TESTS names the programs to run: only those, no shell test; one not built is a failure
PATH=$tmp/nogpu TESTS="test_good test_absent" sh test/run_tests.sh "$root" >"$tmp/log" 2>&1
rc=$?
check "TESTS: only the named programs, no shell test; an unbuilt one fails" "rc $rc: $(tr '\n' ' ' <"$tmp/log")" \
  sh -c "[ $rc -ne 0 ] && [ \"\$(grep '^== ' '$tmp/log' | tr '\n' ' ')\" = '== test_good == test_absent ' ] &&
         grep -q '^FAIL - test_absent: build/tests/test_absent is not built' '$tmp/log' &&
         [ \"\$(tail -1 '$tmp/log')\" = '2 passed, 1 failed, 0 skipped' ]"
exit 0
