#!/bin/sh
# cli_attn_check.sh: `train_gpt attn-check` (spec §4's table): on the CPU, exit 0 and the fp8_dm
# invariant line; bad options refused before any device is touched; --device gpu: where there is
# a GPU, exit 0, the invariant line for fp8_dm from the GPU's own row sums, every GPU mode next to
# its CPU emulation; without one, a single "no CUDA device found" line and exit 2 (and a
# "skipped:" line for the GPU table).
# Runs from the repo root after `make`; TRAIN_GPT overrides the binary.
BIN=${TRAIN_GPT:-./train_gpt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

# runs attn-check with the given options into $tmp/out, $tmp/err; rc in $rc
run() { "$BIN" attn-check "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; }
rows() { grep -cE "^ +[123]  $1 " "$tmp/out"; }  # table rows whose mode column matches $1
invariant_ok() { grep -q '^invariant fp8_dm: max residual [0-9.e+-]* <= 1e-05: OK' "$tmp/out"; }

# --- the CPU emulation ---
run --T 256
check "cpu: exits 0" "rc $rc: $(tail -2 "$tmp/err")" [ "$rc" -eq 0 ]
check "cpu: fp8_dm invariant OK" "$(grep '^invariant' "$tmp/out")" invariant_ok
check "cpu: 6 modes x 3 sharpnesses" "$(rows '[a-z0-9_]+') rows" [ "$(rows '[a-z0-9_]+')" -eq 18 ]

# --- bad options: status 1, before any device is looked for ---
run --device tpu
check "bad --device" "rc $rc: $(head -1 "$tmp/err")" sh -c "[ $rc -eq 1 ] && grep -q -- '--device expects cpu or gpu' '$tmp/err'"
run --device gpu --d 0
check "bad --d with --device gpu" "rc $rc: $(head -1 "$tmp/err")" sh -c "[ $rc -eq 1 ] && grep -q -- '--d expects' '$tmp/err'"
run --device gpu --d 32
check "--device gpu refuses d 32" "rc $rc: $(head -1 "$tmp/err")" sh -c "[ $rc -eq 1 ] && grep -q 'head_dim 64 or 128' '$tmp/err'"

# --- the GPU kernels ---
listed=0  # what the driver says, to catch a binary that misses a GPU
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then listed=1; fi
run --device gpu --T 512
if grep -q 'no CUDA device found' "$tmp/err"; then
  check "gpu: no GPU found, and nvidia-smi lists none" "$(head -1 "$tmp/err")" [ "$listed" -eq 0 ]
  check "gpu: without a GPU, exit 2" "rc $rc" [ "$rc" -eq 2 ]
  check "gpu: without a GPU, one line naming --device gpu" "$(cat "$tmp/err")" \
    sh -c "[ \$(wc -l <'$tmp/err') -eq 1 ] && grep -q '^attn-check: --device gpu: no CUDA device found' '$tmp/err'"
  check "gpu: without a GPU, nothing on stdout" "$(head -2 "$tmp/out")" [ ! -s "$tmp/out" ]
  echo "skipped: attn-check --device gpu table (no GPU: $(sed 's/.*no CUDA device found (\(.*\))$/\1/' "$tmp/err"))"
else
  check "gpu: exits 0" "rc $rc: $(tail -3 "$tmp/err")" [ "$rc" -eq 0 ]
  check "gpu: fp8_dm invariant OK (GPU row sums)" "$(grep '^invariant' "$tmp/out")" invariant_ok
  check "gpu: fp8_naive far above the bound" "$(grep '^fp8_naive' "$tmp/out")" grep -q '^fp8_naive .*far above' "$tmp/out"
  check "gpu: outputs finite" "$(grep '^GPU outputs' "$tmp/out")" grep -q '^GPU outputs finite in every mode: OK' "$tmp/out"
  check "gpu: 5 modes x 3 sharpnesses, gpu and emu rows" "$(rows '[a-z0-9_]+') rows" [ "$(rows '[a-z0-9_]+')" -eq 30 ]
  check "gpu: no fp32 row" "$(rows fp32) rows" [ "$(rows fp32)" -eq 0 ]
  check "gpu: residual reported for fp8_dm, not for bf16" "$(grep -E '^ +1  (bf16|fp8_dm) +gpu' "$tmp/out")" \
    sh -c "grep -Eq '^ +1  fp8_dm +gpu +[0-9x]+ +[0-9]' '$tmp/out' && grep -Eq '^ +1  bf16 +gpu +[0-9x]+ +- +- ' '$tmp/out'"
  # d = 128, T not a multiple of 128, E5M2 gradients
  run --device gpu --T 320 --d 128 --grad-format e5m2
  check "gpu: d 128, T 320, e5m2: exits 0 with the invariant OK" "rc $rc: $(grep '^invariant' "$tmp/out") $(tail -2 "$tmp/err")" \
    sh -c "[ $rc -eq 0 ] && grep -q '^invariant fp8_dm: .*: OK' '$tmp/out'"
fi
exit 0
