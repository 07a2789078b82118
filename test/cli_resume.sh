#!/bin/sh
# cli_resume.sh: exact resume. A run stopped after step 6 (--stop-after, as a preemption would)
# and resumed must reproduce the uninterrupted run's losses bit for bit (the metrics print them
# with %.9g, which identifies a float exactly); also with FP8 attention and delayed scaling, with
# centred keys' delayed c (kept in the checkpoint), and
# with fp8_tensor linears in delayed scaling, whose amax histories are part of the state. SIGTERM stops a run cleanly with a checkpoint.
# Runs from the repo root after `make`; TRAIN_GPT overrides the binary.
BIN=${TRAIN_GPT:-./train_gpt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

# small shards: 12 steps cross shard and epoch bounds
pattern_shards "$tmp" train_000000.bin:700:1 train_000001.bin:500:2 val_000000.bin:600:3

# "step loss" of every training step of a metrics file.
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1"; }

# One comparison: name, extra --set options...
compare() {
  name=$1; shift
  full=$tmp/$name-full; part=$tmp/$name-part
  set -- --config configs/tiny.json --set model.vocab_size=512 --set model.n_layer=2 \
    --set model.seq_len=16 --set model.ffn_hidden=256 --set train.micro_batch=2 \
    --set train.batch_tokens=64 --set train.steps=12 --set train.warmup_steps=2 \
    --set "data.train=$tmp/train_*.bin" --set "data.val=$tmp/val_*.bin" --set eval.interval=4 \
    --set eval.batches=2 --set checkpoint.interval=6 --set log.interval=6 --device cpu "$@"
  "$BIN" "$@" --set "log.dir=$full" >"$tmp/out" 2>&1
  check "$name: uninterrupted run" "$(tail -3 "$tmp/out")" [ $? -eq 0 ]
  "$BIN" "$@" --set "log.dir=$part" --stop-after 6 >"$tmp/out" 2>&1
  rc=$?
  check "$name: --stop-after 6 exits 0" "rc $rc: $(tail -3 "$tmp/out")" [ "$rc" -eq 0 ]
  check "$name: stopped with a message" "$(tail -2 "$tmp/out")" grep -q 'stopped after step 6' "$tmp/out"
  check "$name: checkpoint of step 6" "$(ls "$part/checkpoints")" [ -f "$part/checkpoints/step_000006.ckpt" ]
  check "$name: stopped run has 6 steps" "$(losses "$part/metrics.jsonl" | wc -l)" \
    [ "$(losses "$part/metrics.jsonl" | wc -l)" -eq 6 ]
  "$BIN" "$@" --set "log.dir=$part" --resume >"$tmp/out" 2>&1
  rc=$?
  check "$name: --resume exits 0" "rc $rc: $(tail -3 "$tmp/out")" [ "$rc" -eq 0 ]
  check "$name: resume says where from" "$(head -3 "$tmp/out")" grep -q 'resuming from .*step_000006.ckpt (step 6 of 12)' "$tmp/out"
  losses "$full/metrics.jsonl" >"$tmp/a"
  losses "$part/metrics.jsonl" >"$tmp/b"
  check "$name: 12 steps each" "$(wc -l <"$tmp/a") and $(wc -l <"$tmp/b")" [ "$(wc -l <"$tmp/a")" -eq 12 -a "$(wc -l <"$tmp/b")" -eq 12 ]
  check "$name: steps 7..12 bit-identical" "$(diff "$tmp/a" "$tmp/b" | head -4 | tr '\n' ' ')" cmp -s "$tmp/a" "$tmp/b"
  grep val_loss "$full/metrics.jsonl" >"$tmp/a"
  grep val_loss "$part/metrics.jsonl" >"$tmp/b"
  check "$name: val losses bit-identical" "$(diff "$tmp/a" "$tmp/b" | head -4 | tr '\n' ' ')" cmp -s "$tmp/a" "$tmp/b"
  # The final parameters agree too: greedy samples from both final checkpoints are the same.
  "$BIN" sample --checkpoint "$full" --tokens 16 --temperature 0 >"$tmp/a" 2>/dev/null
  "$BIN" sample --checkpoint "$part" --tokens 16 --temperature 0 >"$tmp/b" 2>/dev/null
  check "$name: final models sample alike" "$(cat "$tmp/a") vs $(cat "$tmp/b")" cmp -s "$tmp/a" "$tmp/b"
}
compare bf16
compare fp8-delayed --set precision.attention=fp8_dm --set precision.attention_scaling=delayed
compare fp8-center-keys --set precision.attention=fp8_dm --set precision.attention_center_keys=delayed \
  --set precision.attention_rowsum_correction=true
compare fp8-linear-delayed --set precision.linear=fp8_tensor --set precision.linear_scaling=delayed \
  --set precision.linear_amax_history=3

# --resume PATH: an explicit checkpoint (here the step-6 one of a finished run, into a new dir).
mkdir -p "$tmp/explicit"
"$BIN" --config configs/tiny.json --set model.vocab_size=512 --set model.n_layer=2 \
  --set model.seq_len=16 --set model.ffn_hidden=256 --set train.micro_batch=2 \
  --set train.batch_tokens=64 --set train.steps=12 --set train.warmup_steps=2 \
  --set "data.train=$tmp/train_*.bin" --set "data.val=$tmp/val_*.bin" --set eval.interval=4 \
  --set eval.batches=2 --set checkpoint.interval=6 --set log.interval=6 --device cpu \
  --set "log.dir=$tmp/explicit" --resume "$tmp/bf16-part/checkpoints/step_000006.ckpt" >"$tmp/out" 2>&1
rc=$?
check "--resume PATH continues from that checkpoint" "rc $rc: $(tail -3 "$tmp/out")" [ "$rc" -eq 0 ]
losses "$tmp/explicit/metrics.jsonl" >"$tmp/b"
losses "$tmp/bf16-full/metrics.jsonl" | sed -n '7,12p' >"$tmp/a"
check "--resume PATH reproduces steps 7..12" "$(diff "$tmp/a" "$tmp/b" | head -4 | tr '\n' ' ')" cmp -s "$tmp/a" "$tmp/b"

# Resuming on a machine with another thread count: the CPU kernels do not depend on it.
thr=$tmp/threads
for t in 1 3; do
  extra="--stop-after 6"; [ "$t" = 3 ] && extra=--resume
  "$BIN" --config configs/tiny.json --set model.vocab_size=512 --set model.n_layer=2 \
    --set model.seq_len=16 --set model.ffn_hidden=256 --set train.micro_batch=2 \
    --set train.batch_tokens=64 --set train.steps=12 --set train.warmup_steps=2 \
    --set "data.train=$tmp/train_*.bin" --set "data.val=$tmp/val_*.bin" --set eval.interval=4 \
    --set eval.batches=2 --set checkpoint.interval=6 --set log.interval=6 --device cpu \
    --set "log.dir=$thr" --set train.threads=$t $extra >"$tmp/out" 2>&1 || echo "FAIL - threads $t run: $(tail -2 "$tmp/out")"
done
losses "$tmp/bf16-full/metrics.jsonl" >"$tmp/a"
losses "$thr/metrics.jsonl" >"$tmp/b"
check "1 thread, resumed with 3 threads: bit-identical" "$(diff "$tmp/a" "$tmp/b" | head -4 | tr '\n' ' ')" cmp -s "$tmp/a" "$tmp/b"

# A crash after the last checkpoint: metrics run past it. Simulated by deleting the newest
# checkpoint of a finished run (steps 1..12 logged, checkpoint 6 left): --resume drops the
# metrics lines after step 6 and the rerun steps 7..12 match the originals.
crash=$tmp/crash
cp -r "$tmp/bf16-full" "$crash"
rm -f "$crash/checkpoints/step_000012.ckpt" "$crash/checkpoints/latest"
"$BIN" --config configs/tiny.json --set model.vocab_size=512 --set model.n_layer=2 \
  --set model.seq_len=16 --set model.ffn_hidden=256 --set train.micro_batch=2 \
  --set train.batch_tokens=64 --set train.steps=12 --set train.warmup_steps=2 \
  --set "data.train=$tmp/train_*.bin" --set "data.val=$tmp/val_*.bin" --set eval.interval=4 \
  --set eval.batches=2 --set checkpoint.interval=6 --set log.interval=6 --device cpu \
  --set "log.dir=$crash" --resume >"$tmp/out" 2>&1
rc=$?
check "after a crash: resume from the older checkpoint" "rc $rc: $(tail -3 "$tmp/out")" grep -q 'resuming from .*step_000006.ckpt' "$tmp/out"
check "after a crash: later metrics lines dropped" "$(grep dropped "$tmp/out")" grep -q 'dropped 8 metrics lines' "$tmp/out"
losses "$tmp/bf16-full/metrics.jsonl" >"$tmp/a"
losses "$crash/metrics.jsonl" >"$tmp/b"
check "after a crash: the metrics read as one run" "$(diff "$tmp/a" "$tmp/b" | head -4 | tr '\n' ' ')" cmp -s "$tmp/a" "$tmp/b"
# (evaluations at steps 0, 4, 8 and 12: the run evaluates once before its first step)
check "after a crash: val lines not duplicated" "$(grep -c val_loss "$crash/metrics.jsonl")" [ "$(grep -c val_loss "$crash/metrics.jsonl")" -eq 4 ]

# SIGTERM: finish the step, write a checkpoint, exit 0.
sig=$tmp/sig
"$BIN" --config configs/tiny.json --set model.vocab_size=512 --set model.n_layer=1 \
  --set model.seq_len=16 --set model.ffn_hidden=256 --set train.micro_batch=2 \
  --set train.steps=1000000 --set "data.train=$tmp/train_*.bin" --set data.val= \
  --set checkpoint.interval=0 --set log.interval=1000 --device cpu --set "log.dir=$sig" >"$tmp/out" 2>&1 &
pid=$!
i=0
while [ "$i" -lt 100 ] && [ "$(cat "$sig/metrics.jsonl" 2>/dev/null | grep -c loss)" -lt 3 ]; do
  sleep 0.1; i=$((i + 1))
done
kill -TERM "$pid"
wait "$pid"
rc=$?
check "SIGTERM: exit 0" "rc $rc: $(tail -3 "$tmp/out")" [ "$rc" -eq 0 ]
check "SIGTERM: says so" "$(tail -2 "$tmp/out")" grep -q 'stopped by signal' "$tmp/out"
last=$(losses "$sig/metrics.jsonl" | tail -1 | cut -d' ' -f1)
want=$(printf 'step_%06d.ckpt' "${last:-0}")
check "SIGTERM: checkpoint of the last finished step" "last step $last; $(ls "$sig/checkpoints" | tr '\n' ' ')" \
  [ "$(cat "$sig/checkpoints/latest" 2>/dev/null)" = "$want" -a -f "$sig/checkpoints/$want" ]
exit 0
