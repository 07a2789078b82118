#!/bin/sh
# cli_resume.sh: exact resume. A run stopped after step 6 (--stop-after, as a preemption would)
# and resumed must reproduce the uninterrupted run's losses bit for bit (the metrics print them
# with %.9g, which identifies a float exactly); also with FP8 attention and delayed scaling, with
# centred keys' delayed c (kept in the checkpoint), and
# with fp8_tensor linears in delayed scaling, whose amax histories are part of the state. SIGTERM stops a run cleanly with a checkpoint.
# What a resume may change: keys that change the trajectory are refused (listed) unless
# --allow-config-change, which is recorded; the others are noted and recorded. A corrupt newest
# checkpoint: the resume falls back to the newest valid one, saying which and why. --resume and
# `sample --checkpoint` take a run directory, a checkpoint file or the `latest` pointer.
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
  rc=$?
  check "$name: uninterrupted run" "rc $rc: $(tail -3 "$tmp/out")" [ "$rc" -eq 0 ]
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

# --- what a resume may change ----------------------------------------------------------------------
# (train.threads=1 in these runs: a change of the thread count is noted, and the CPU kernels do
# not depend on it, as checked above)
base() {
  "$BIN" --config configs/tiny.json --set model.vocab_size=512 --set model.n_layer=2 \
    --set model.seq_len=16 --set model.ffn_hidden=256 --set train.micro_batch=2 \
    --set train.batch_tokens=64 --set train.steps=12 --set train.warmup_steps=2 \
    --set "data.train=$tmp/train_*.bin" --set "data.val=$tmp/val_*.bin" --set eval.interval=4 \
    --set eval.batches=2 --set checkpoint.interval=6 --set log.interval=6 --device cpu --set train.threads=1 "$@"
}
snapshot() { find "$1" -type f -exec cksum {} + | sort; }
cc=$tmp/changed
base --set "log.dir=$cc" --stop-after 6 >"$tmp/out" 2>&1 || echo "FAIL - config changes: setup run: $(tail -2 "$tmp/out")"
cp -r "$cc" "$tmp/changed_allowed"
snapshot "$cc" >"$tmp/cc.before"
base --set "log.dir=$cc" --resume --set precision.attention=fp8_dm --set train.lr=0.002 --set data.seed=7 \
  --set log.interval=3 >"$tmp/out" 2>"$tmp/err"
rc=$?
check "resume with changed precision.attention, train.lr, data.seed: refused, exit 1" "rc $rc: $(head -3 "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q \"^train_gpt: error: --resume: the config differs from the one $cc/checkpoints/step_000006.ckpt was made with in 3 keys that change the run's trajectory:\" '$tmp/err'"
check "the refusal lists each key with both values" "$(cat "$tmp/err")" \
  sh -c "grep -q '^  data.seed: 1337 -> 7\$' '$tmp/err' && grep -q '^  train.lr: 0.003 -> 0.002\$' '$tmp/err' && \
         grep -q '^  precision.attention: \"bf16\" -> \"fp8_dm\"\$' '$tmp/err' && ! grep -q log.interval '$tmp/err'"
check "the refusal says how to go on" "$(tail -1 "$tmp/err")" grep -q 'add --allow-config-change (the change is recorded in' "$tmp/err"
snapshot "$cc" >"$tmp/cc.after"
check "the refused resume changed nothing (config.json, checkpoints, metrics)" \
  "$(diff "$tmp/cc.before" "$tmp/cc.after" | head -4 | tr '\n' ' ')" cmp -s "$tmp/cc.before" "$tmp/cc.after"
base --set "log.dir=$cc" --resume --set log.interval=3 --set eval.batches=1 >"$tmp/out" 2>"$tmp/err"
rc=$?
check "resume with log.interval and eval.batches changed: runs, noting each change" "rc $rc: $(grep note "$tmp/out")" \
  sh -c "[ $rc -eq 0 ] && grep -q '^note: resume changes log.interval: 6 -> 3\$' '$tmp/out' && grep -q '^note: resume changes eval.batches: 2 -> 1\$' '$tmp/out'"
check "the noted changes are recorded in config_changes.jsonl" "$(cat "$cc/config_changes.jsonl" 2>&1)" python3 -c "
import json
rows = [json.loads(l) for l in open('$cc/config_changes.jsonl')]
ch = {c['key']: c for c in rows[0]['changes']}
ok = len(rows) == 1 and rows[0]['resumed_at_step'] == 6 and rows[0]['from'].endswith('step_000006.ckpt')
ok = ok and ch['log.interval']['before'] == 6 and ch['log.interval']['after'] == 3 and not ch['log.interval']['changes_trajectory']
exit(0 if ok and not any(c['changes_trajectory'] for c in ch.values()) else 1)"
losses "$tmp/bf16-full/metrics.jsonl" >"$tmp/a"
losses "$cc/metrics.jsonl" >"$tmp/b"
check "a change that leaves the trajectory: steps 7..12 bit-identical" "$(diff "$tmp/a" "$tmp/b" | head -4 | tr '\n' ' ')" \
  cmp -s "$tmp/a" "$tmp/b"
ca=$tmp/changed_allowed
base --set "log.dir=$ca" --resume --allow-config-change --set train.lr=0.002 >"$tmp/out" 2>"$tmp/err"
rc=$?
check "--allow-config-change: the resume runs with the new train.lr, saying so" "rc $rc: $(grep note "$tmp/out") $(tail -2 "$tmp/err")" \
  sh -c "[ $rc -eq 0 ] && grep -q \"^note: resume changes train.lr: 0.003 -> 0.002 (changes the run's trajectory: allowed by --allow-config-change)\" '$tmp/out'"
check "--allow-config-change: the change recorded, config.json holds the new value" "$(cat "$ca/config_changes.jsonl" 2>&1)" python3 -c "
import json
rows = [json.loads(l) for l in open('$ca/config_changes.jsonl')]
ch = {c['key']: c for c in rows[-1]['changes']}
lr = json.load(open('$ca/config.json'))['train']['lr']
exit(0 if ch['train.lr']['before'] == 0.003 and ch['train.lr']['after'] == 0.002 and ch['train.lr']['changes_trajectory'] and lr == 0.002 else 1)"
losses "$ca/metrics.jsonl" >"$tmp/b"
# (step 7's loss is measured before its update, the first one with the new lr)
check "--allow-config-change: steps 1..7 kept, step 8 on the new trajectory" "$(sed -n 8p "$tmp/a") vs $(sed -n 8p "$tmp/b")" \
  sh -c "[ \"\$(head -7 '$tmp/a')\" = \"\$(head -7 '$tmp/b')\" ] && [ \"\$(sed -n 8p '$tmp/a')\" != \"\$(sed -n 8p '$tmp/b')\" ] && [ \$(wc -l <'$tmp/b') -eq 12 ]"

# --- a corrupt newest checkpoint: the resume falls back to the newest valid one -------------------
fb=$tmp/fallback
cp -r "$tmp/bf16-full" "$fb"
python3 - "$fb/checkpoints/step_000012.ckpt" <<'PYEOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x40
open(p, "wb").write(b)
PYEOF
base --set "log.dir=$fb" --resume >"$tmp/out" 2>"$tmp/err"
rc=$?
check "corrupt newest checkpoint: resume falls back, saying which and why" "rc $rc: $(head -3 "$tmp/out") $(tail -2 "$tmp/err")" \
  sh -c "[ $rc -eq 0 ] && grep -q '^note: not resuming from $fb/checkpoints/step_000012.ckpt: checkpoint $fb/checkpoints/step_000012.ckpt: corrupt: the checksum does not match its contents' '$tmp/out' && \
         grep -q '^resuming from $fb/checkpoints/step_000006.ckpt (step 6 of 12)' '$tmp/out'"
losses "$fb/metrics.jsonl" >"$tmp/b"
check "corrupt newest checkpoint: steps 7..12 redone bit for bit" "$(diff "$tmp/a" "$tmp/b" | head -4 | tr '\n' ' ')" \
  cmp -s "$tmp/a" "$tmp/b"
"$BIN" sample --checkpoint "$fb" --tokens 16 --temperature 0 >"$tmp/s1" 2>/dev/null
"$BIN" sample --checkpoint "$tmp/bf16-full" --tokens 16 --temperature 0 >"$tmp/s2" 2>/dev/null
check "corrupt newest checkpoint: the step-12 checkpoint rewritten, the same model" "$(cat "$tmp/s1") vs $(cat "$tmp/s2")" \
  sh -c "[ -s '$tmp/s1' ] && cmp -s '$tmp/s1' '$tmp/s2'"

# --- --resume and sample --checkpoint: a run directory, a file, or `latest` ------------------------
for what in latest dir; do
  from=$tmp/bf16-full/checkpoints/latest; [ $what = dir ] && from=$tmp/bf16-part
  rm -rf "$tmp/from_$what"
  base --set "log.dir=$tmp/from_$what" --resume "$from" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  check "--resume $what: from the newest checkpoint there" "rc $rc: $(head -2 "$tmp/out") $(tail -2 "$tmp/err")" \
    sh -c "[ $rc -eq 0 ] && grep -q '^resuming from .*/checkpoints/step_000012.ckpt (step 12 of 12)' '$tmp/out'"
done
"$BIN" sample --checkpoint "$tmp/bf16-full/checkpoints/latest" --tokens 16 --temperature 0 >"$tmp/s1" 2>"$tmp/serr"
rc=$?
check "sample --checkpoint RUN/checkpoints/latest (the README's example)" "rc $rc: $(cat "$tmp/serr")" \
  sh -c "[ $rc -eq 0 ] && cmp -s '$tmp/s1' '$tmp/s2' && grep -q 'step_000012.ckpt (step 12' '$tmp/serr'"

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
