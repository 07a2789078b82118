#!/bin/sh
# cli_attn_check.sh: `train_gpt attn-check` (spec §4's table): on the CPU, exit 0 and the fp8_dm
# invariant line; shaped inputs, centred keys, the correction and --from-checkpoint (spec §6);
# bad options refused before any device is touched; --device gpu: where there is
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
invariant_ok() { grep -q '^invariant fp8_dm: max residual [0-9.e+-]* <= [0-9.e+-]*: OK' "$tmp/out"; }

# --- the CPU emulation ---
run --T 256
check "cpu: exits 0" "rc $rc: $(tail -2 "$tmp/err")" [ "$rc" -eq 0 ]
check "cpu: fp8_dm invariant OK" "$(grep '^invariant' "$tmp/out")" invariant_ok
check "cpu: 7 modes x 3 sharpnesses" "$(rows '[a-z0-9_]+') rows" [ "$(rows '[a-z0-9_]+')" -eq 21 ]
check "cpu: fp8_hybrid_dm invariant OK" "$(grep '^invariant fp8_hybrid_dm' "$tmp/out")" \
  grep -q '^invariant fp8_hybrid_dm: max residual [0-9.e+-]* <= [0-9.e+-]*: OK' "$tmp/out"

# --- shaped inputs, centred keys and the correction: each FP8 mode once per combination ---
run --T 256 --sharpness 2 --key-offset 3 --query-offset 1 --outliers 4 --center-keys off,mean,delayed --rowsum-correction off,on
check "cpu variants: exits 0 with the invariants OK" "rc $rc: $(grep '^invariant' "$tmp/out" | tr '\n' ' ') $(tail -2 "$tmp/err")" \
  sh -c "[ $rc -eq 0 ] && [ \$(grep -c '^invariant fp8.*: OK' '$tmp/out') -eq 2 ]"
check "cpu variants: fp32, bf16 and 5 FP8 modes x 3 centres x 2 = 32 rows, sharpness 2 only" "$(grep -cE '^ +[0-9]+  ' "$tmp/out") rows" \
  sh -c "[ \$(grep -cE '^ +2  [a-z0-9_]+ ' '$tmp/out') -eq 32 ] && [ \$(grep -cE '^ +[13]  ' '$tmp/out') -eq 0 ]"
check "cpu variants: fp8_dm with mean keys and the correction has a row" "$(grep -E '^ +2  fp8_dm ' "$tmp/out" | head -2)" \
  grep -Eq '^ +2  fp8_dm +mean +on +[0-9]' "$tmp/out"
run --T 64 --center-keys median
check "bad --center-keys" "rc $rc: $(head -1 "$tmp/err")" sh -c "[ $rc -eq 1 ] && grep -q -- '--center-keys expects a comma-separated list of off, mean, delayed' '$tmp/err'"
run --T 64 --key-offset -1
check "bad --key-offset" "rc $rc: $(head -1 "$tmp/err")" sh -c "[ $rc -eq 1 ] && grep -q -- '--key-offset expects a number' '$tmp/err'"
run --T 64 --layer 1
check "--layer without --from-checkpoint" "rc $rc: $(head -1 "$tmp/err")" sh -c "[ $rc -eq 1 ] && grep -q -- 'go with --from-checkpoint' '$tmp/err'"
run --device gpu --center-keys mean
check "--center-keys is CPU-only" "rc $rc: $(head -1 "$tmp/err")" sh -c "[ $rc -eq 1 ] && grep -q -- 'CPU emulation only' '$tmp/err'"
run --from-checkpoint "$tmp/nothing-here.ckpt"
check "--from-checkpoint of a missing file" "rc $rc: $(head -1 "$tmp/err")" sh -c "[ $rc -eq 1 ] && grep -q 'nothing-here.ckpt' '$tmp/err'"

# --- --from-checkpoint: a tiny model trained for two steps, layer 1 head 1 on its validation data ---
pattern_shards "$tmp" train_000000.bin:2000:1 val_000000.bin:600:2
"$BIN" --config configs/tiny.json --set model.vocab_size=512 --set model.seq_len=64 --set train.micro_batch=2 \
  --set train.steps=2 --set train.warmup_steps=1 --set "data.train=$tmp/train_*.bin" --set "data.val=$tmp/val_*.bin" \
  --set eval.interval=0 --set eval.sample_interval=0 --set "log.dir=$tmp/run" --device cpu >"$tmp/train" 2>&1
check "a tiny model to take inputs from" "$(tail -2 "$tmp/train")" [ -f "$tmp/run/checkpoints/step_000002.ckpt" ]
run --from-checkpoint "$tmp/run" --layer 1 --head 1 --window 2 --T 64 --grad-format e5m2 --center-keys off,mean
check "--from-checkpoint: exits 0 with the invariants OK" "rc $rc: $(tail -2 "$tmp/err")" \
  sh -c "[ $rc -eq 0 ] && [ \$(grep -c '^invariant fp8.*: OK' '$tmp/out') -eq 2 ]"
check "--from-checkpoint: 12 rows of real inputs, named in the legend" "$(grep -c '^ real  ' "$tmp/out") rows" \
  sh -c "[ \$(grep -c '^ real  ' '$tmp/out') -eq 12 ] && grep -q 'layer 1 head 1 of .* on validation window 2' '$tmp/out'"
run --from-checkpoint "$tmp/run" --layer 2 --T 64
check "--from-checkpoint: a layer past the model" "rc $rc: $(head -1 "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q -- '--layer 2 --head 0, but the model has 2 layers of 2 heads' '$tmp/err'"
run --from-checkpoint "$tmp/run" --window 20 --T 64
check "--from-checkpoint: a window past the data" "rc $rc: $(head -1 "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q -- '--window 20 needs 22' '$tmp/err'"

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
