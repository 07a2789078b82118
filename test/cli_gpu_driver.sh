#!/bin/sh
# cli_gpu_driver.sh: scripts/gpu.sh's control flow without a GPU: usage errors (status 2, a message
# naming the areas), --list and --dry-run, the refusal without a GPU or with too few for dp, and
# whole calls of `check unit` against stand-ins on PATH (nvidia-smi listing a GPU, make printing a
# test summary): the table printed last and in OUT, the status (0 when every part passed, 1 when one
# failed or was not run), a failed build, a spent BUDGET, bench e2e refusing a malformed RUNS.
# Runs from the repo root; needs bash.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

mkdir -p "$tmp/bin" "$tmp/tmp"
stub_nvidia_smi "$tmp/bin" 1
cat >"$tmp/bin/make" <<'EOF'
#!/bin/sh
echo "make $*"
case " $* " in
  *" test "*)
    echo "ok - a"
    if [ -n "$FAKE_TEST_FAIL" ]; then echo "FAIL - b: broken"; echo "1 passed, 1 failed, 0 skipped"; exit 2; fi
    echo "2 passed, 0 failed, 0 skipped" ;;
  *) if [ -n "$FAKE_BUILD_FAIL" ]; then echo "x.cu(3): error: stand-in"; exit 2; fi ;;
esac
EOF
chmod +x "$tmp/bin/make"

# gpu ARGS...: gpu.sh with the stand-ins first on PATH; output in $tmp/out, status in rc
gpu() { PATH="$tmp/bin:$PATH" TMPDIR="$tmp/tmp" OUT="$tmp/o" bash scripts/gpu.sh "$@" >"$tmp/out" 2>&1; rc=$?; }
has() { grep -q -- "$1" "$tmp/out"; }

# --- usage errors: status 2 and a line saying what is wrong ---
gpu
check "no arguments: usage, status 2" "rc $rc: $(head -2 "$tmp/out")" sh -c "[ $rc -eq 2 ] && grep -q 'gpu.sh check \[AREA' '$tmp/out'"
gpu frobnicate
check "unknown mode" "rc $rc: $(head -1 "$tmp/out")" sh -c "[ $rc -eq 2 ] && grep -q \"unknown mode 'frobnicate'\" '$tmp/out'"
gpu check unitt
check "unknown check area names the areas" "rc $rc: $(head -1 "$tmp/out")" \
  sh -c "[ $rc -eq 2 ] && grep -q \"unknown check area 'unitt' (areas: kernels unit sanitizer torch train dp dp-sockets)\" '$tmp/out'"
gpu bench
check "bench without an area" "rc $rc: $(head -1 "$tmp/out")" sh -c "[ $rc -eq 2 ] && grep -q 'bench needs an area' '$tmp/out'"
gpu bench attention extra
check "a named bench area takes no arguments" "rc $rc: $(head -1 "$tmp/out")" sh -c "[ $rc -eq 2 ] && grep -q 'takes no arguments' '$tmp/out'"
gpu bench attn_bench_shim
check "a shim of dev/bench is not a benchmark" "rc $rc: $(head -1 "$tmp/out")" sh -c "[ $rc -eq 2 ] && grep -q \"unknown bench area 'attn_bench_shim'\" '$tmp/out'"
BUDGET=ten gpu check unit
check "BUDGET not a number" "rc $rc: $(head -1 "$tmp/out")" sh -c "[ $rc -eq 2 ] && grep -q 'BUDGET must be a whole number' '$tmp/out'"

# --- what a call would run ---
gpu --list
check "--list: the three modes and dev/bench's programs, not its shims" "$(cat "$tmp/out")" \
  sh -c "[ $rc -eq 0 ] && grep -q '^check: *kernels unit sanitizer torch train dp' '$tmp/out' && grep -q '^profile:' '$tmp/out' &&
         grep -q 'dev/bench: .*bench_qkv_gemm' '$tmp/out' && ! grep -q 'attn_bench_shim' '$tmp/out'"
gpu --dry-run check
check "--dry-run check on 1 GPU: every area but dp" "rc $rc: $(head -1 "$tmp/out")" \
  sh -c "[ $rc -eq 0 ] && grep -q '^gpu.sh check unit sanitizer torch train (BUDGET 570 s' '$tmp/out' && ! grep -q '^  dp:' '$tmp/out'"
check "--dry-run lists the steps" "$(grep -c '^  ' "$tmp/out") lines" \
  sh -c "grep -q '^  unit: make test' '$tmp/out' && grep -q '^  train: tiny, attention fp8_dm, linear bf16' '$tmp/out'"
check "--dry-run writes nothing" "$(ls "$tmp")" [ ! -e "$tmp/o" ]
FAKE_NGPU=2 gpu --dry-run check
check "--dry-run check on 2 GPUs includes dp" "$(head -1 "$tmp/out")" sh -c "[ $rc -eq 0 ] && grep -q '^  dp: ' '$tmp/out'"
gpu --dry-run bench bench_mufu_qgmma 4000
check "--dry-run of a dev/bench program" "$(cat "$tmp/out")" grep -q 'make build/bench/bench_mufu_qgmma; build/bench/bench_mufu_qgmma 4000' "$tmp/out"

# --- machines it cannot run on: status 2 before anything is built ---
FAKE_NGPU=0 gpu check unit
check "no GPU: status 2, nothing written" "rc $rc: $(head -1 "$tmp/out")" \
  sh -c "[ $rc -eq 2 ] && grep -q 'no GPU: nvidia-smi lists none' '$tmp/out' && [ ! -e '$tmp/o' ] && ! grep -q '^make' '$tmp/out'"
gpu check dp
check "check dp on 1 GPU: status 2" "rc $rc: $(head -1 "$tmp/out")" sh -c "[ $rc -eq 2 ] && grep -q 'dp needs at least 2 GPUs' '$tmp/out'"

# --- whole calls against the stand-ins ---
gpu check unit
check "check unit passing: status 0" "rc $rc: $(tail -3 "$tmp/out")" [ "$rc" -eq 0 ]
check "check unit: the table last, in OUT too" "$(tail -4 "$tmp/out")" \
  sh -c "tail -1 '$tmp/out' | grep -q '^check: 2 passed, 0 failed, 0 not run$' &&
         tail -n \$(wc -l <'$tmp/o/summary.txt') '$tmp/out' | cmp -s - '$tmp/o/summary.txt'"
check "check unit: make test's summary in its row" "$(grep '^unit' "$tmp/out")" \
  grep -Eq '^unit +make test +PASS +2 passed, 0 failed, 0 skipped$' "$tmp/out"
check "check unit: the steps' logs in OUT" "$(ls "$tmp/o")" \
  sh -c "grep -Eq '^make SETUP=0 (CJSON_PREFIX=[^ ]+ )?test' '$tmp/o/check_unit.log' &&
         grep -Eq '^make -j[0-9]+ SETUP=0 (CJSON_PREFIX=[^ ]+ )?train_gpt tests' '$tmp/o/check_build.log'"
check "the temporary folder is removed" "$(ls "$tmp/tmp")" [ -z "$(ls "$tmp/tmp")" ]
# check kernels runs the GPU test programs through test/run_tests.sh: here they find no driver and
# skip, which where nvidia-smi lists a GPU is a failure of each
gpu check kernels
check "check kernels: every GPU test program run, a skip with a GPU listed a failure" "rc $rc: $(tail -4 "$tmp/out")" \
  sh -c "[ $rc -eq 1 ] && grep -Eq '^kernels +the GPU test programs +FAIL +[0-9]+ passed, [1-9][0-9]* failed' '$tmp/out' &&
         for t in $(ls test/test_*gpu*.cu test/test_backend.cu | xargs -n1 basename | sed 's/\.cu$//' | tr '\n' ' '); do
           grep -q \"^FAIL - \$t skipped on a machine where nvidia-smi lists a GPU\" '$tmp/o/check_kernels.log' || exit 1
         done"
FAKE_TEST_FAIL=1 gpu check unit
check "a failing make test: status 1, FAIL with its counts" "rc $rc: $(grep '^unit' "$tmp/out")" \
  sh -c "[ $rc -eq 1 ] && grep -Eq '^unit +make test +FAIL +1 passed, 1 failed, 0 skipped \(exit 2\)$' '$tmp/out' && grep -q 'FAIL - b: broken' '$tmp/out'"
FAKE_BUILD_FAIL=1 gpu check unit torch
check "a failed build: status 1, the areas not run" "rc $rc: $(tail -4 "$tmp/out")" \
  sh -c "[ $rc -eq 1 ] && grep -Eq '^build +build +FAIL .*stand-in' '$tmp/out' && grep -Eq '^torch +torch +SKIP +not run: no build' '$tmp/out' &&
         tail -2 '$tmp/out' | grep -q '0 passed, 1 failed, 2 not run'"
BUDGET=8 gpu check unit
check "a BUDGET too small: nothing started, status 1" "rc $rc: $(tail -3 "$tmp/out")" \
  sh -c "[ $rc -eq 1 ] && grep -Eq '^build +build +SKIP +not run: BUDGET spent' '$tmp/out' && ! grep -q '^make' '$tmp/o/check_build.log'"
RUNS="paper_569m:fp8_dm nosuch:bf16:bf16" gpu bench e2e
check "bench e2e refuses a malformed RUNS before building" "rc $rc: $(grep RUNS "$tmp/out" | head -2)" \
  sh -c "[ $rc -eq 1 ] && grep -q \"run 'paper_569m:fp8_dm' is not CONFIG:ATTENTION:LINEAR\" '$tmp/out' && ! grep -q '^make' '$tmp/o/bench_e2e.log'"
exit 0
