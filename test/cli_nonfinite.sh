#!/bin/sh
# cli_nonfinite.sh: a diverging run (train.lr = 1e3: the loss is NaN from step 5 of this tiny
# model) loses nothing. Steps with a non-finite loss or gradient norm are not applied (the
# parameters, AdamW moments and step and the delayed-scaling histories stay as they were; the
# data moves on) and are logged with their data position; train.max_bad_steps of them in a row
# end the run with a message and exit 1, writing no checkpoint; the newest finite checkpoint is
# never pruned; `sample` and `--resume` refuse a non-finite checkpoint (a file written by a
# diverged run) and, given a directory, fall back to the newest finite one.
# Runs from the repo root after `make`; TRAIN_GPT overrides the binary.
BIN=${TRAIN_GPT:-./train_gpt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

pattern_shards "$tmp" train_000000.bin:3000:1 train_000001.bin:2000:2 val_000000.bin:1500:3

# FP8 attention with delayed scaling, so that the amax histories are part of what must not change.
# The shards order, whose windows name one shard each (the mixed order's position is checked last).
set -- --config configs/tiny.json --set data.order=shards --set model.vocab_size=512 --set model.n_layer=1 --set model.seq_len=16 \
  --set model.ffn_hidden=256 --set train.micro_batch=2 --set train.steps=20 --set train.warmup_steps=1 \
  --set "data.train=$tmp/train_*.bin" --set "data.val=$tmp/val_*.bin" --set eval.interval=0 --set eval.batches=1 \
  --set eval.sample_interval=0 --set log.interval=100 --set train.threads=1 --device cpu --set train.lr=1e3 \
  --set precision.attention=fp8_dm --set precision.attention_scaling=delayed

# (1) keep = 2, checkpoints every 2 steps, max_bad_steps 5: the run stops, the last finite
# checkpoints stay.
run=$tmp/div
"$BIN" "$@" --set checkpoint.interval=2 --set checkpoint.keep=2 --set "log.dir=$run" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "divergence: exit 1" "rc $rc: $(tail -2 "$tmp/err")" [ "$rc" -eq 1 ]
check "divergence: the message says the run diverged and names the rule" "$(cat "$tmp/err")" \
  grep -q "5 steps in a row (5..9) had a non-finite loss or gradient norm and were not applied (train.max_bad_steps = 5): the run diverged; no checkpoint written" "$tmp/err"
check "divergence: the message names the newest checkpoint and how to go on" "$(cat "$tmp/err")" \
  grep -q "newest checkpoint is $run/checkpoints/step_000004.ckpt: resume from it with a lower train.lr" "$tmp/err"
check "divergence: each bad step is a warning with its data position" "$(grep -c 'not applied' "$tmp/out")" \
  sh -c "[ \$(grep -c '^warning: step [5-9] not applied: the loss is .*(data: epoch 0, shard position 0 = .*train_000000.bin, window [4-8])' '$tmp/out') -eq 5 ]"
check "divergence: metrics mark the 5 steps skipped, with their data position" "$(grep skipped "$run/metrics.jsonl" | head -1)" python3 -c "
import json
rows = [json.loads(l) for l in open('$run/metrics.jsonl')]
bad = [r for r in rows if r.get('skipped')]
ok = [r['step'] for r in bad] == [5, 6, 7, 8, 9] and [r['data']['window_pos'] for r in bad] == [4, 5, 6, 7, 8]
ok = ok and all(r['loss'] is None and r['data']['file'].endswith('train_000000.bin') for r in bad)
exit(0 if ok and [r['step'] for r in rows] == list(range(1, 10)) else 1)"
check "divergence: no checkpoint after the divergence, the last finite ones kept" "$(ls "$run/checkpoints" | tr '\n' ' ')" \
  [ "$(ls "$run/checkpoints" | tr '\n' ' ')" = "latest step_000002.ckpt step_000004.ckpt " ]
"$BIN" sample --checkpoint "$run" --tokens 4 --device cpu >"$tmp/s" 2>"$tmp/serr"
rc=$?
check "divergence: sample from the run dir uses the newest finite checkpoint" "rc $rc: $(cat "$tmp/serr")" \
  sh -c "[ $rc -eq 0 ] && grep -q 'from $run/checkpoints/step_000004.ckpt (step 4' '$tmp/serr'"

# A checkpoint a diverged run wrote: step 4's with a NaN parameter and a valid checksum.
nan_ckpt() {  # src dst: copies src with params[0] = NaN, the checksum recomputed
  python3 - "$1" "$2" <<'PYEOF'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n_tensors = struct.unpack_from("<q", b, 16 + 8 * 10)[0]
cfg_len = struct.unpack_from("<Q", b, 16 + 8 * 12)[0]
params = 16 + 8 * 12 + 8 + cfg_len + n_tensors * 80
struct.pack_into("<f", b, params, float("nan"))
h = 0xcbf29ce484222325
for x in b[:-8]:
    h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
struct.pack_into("<Q", b, len(b) - 8, h)
open(sys.argv[2], "wb").write(b)
PYEOF
}
nanrun=$tmp/nanrun
cp -r "$run" "$nanrun"
nan_ckpt "$run/checkpoints/step_000004.ckpt" "$nanrun/checkpoints/step_000004.ckpt"
snapshot() { find "$nanrun" -type f -exec cksum {} + | sort; }
snapshot >"$tmp/sums.before"
"$BIN" sample --checkpoint "$nanrun/checkpoints/step_000004.ckpt" --tokens 4 --device cpu >"$tmp/s" 2>"$tmp/serr"
rc=$?
check "sample refuses a non-finite checkpoint file" "rc $rc: $(cat "$tmp/serr")" sh -c "[ $rc -eq 1 ] && grep -q \
  'step_000004.ckpt: not finite (parameter [a-z_.0-9]*\[0\] is nan): it was written by a diverged run; use an earlier checkpoint' '$tmp/serr'"
check "sample prints nothing from it" "$(head -c 80 "$tmp/s")" [ ! -s "$tmp/s" ]
"$BIN" sample --checkpoint "$nanrun/checkpoints/latest" --tokens 4 --device cpu >"$tmp/s" 2>"$tmp/serr"
rc=$?
check "sample of the run's latest: skips the non-finite one, says why, samples step 2" "rc $rc: $(cat "$tmp/serr")" \
  sh -c "[ $rc -eq 0 ] && grep -q 'note: skipping .*step_000004.ckpt: .*not finite' '$tmp/serr' && grep -q 'step_000002.ckpt (step 2' '$tmp/serr'"
"$BIN" "$@" --set checkpoint.interval=2 --set checkpoint.keep=2 --set "log.dir=$nanrun" \
  --resume "$nanrun/checkpoints/step_000004.ckpt" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "--resume refuses a non-finite checkpoint file" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'step_000004.ckpt: not finite (parameter' '$tmp/err'"
snapshot >"$tmp/sums.after"
check "refusals leave the run directory as it was" "$(diff "$tmp/sums.before" "$tmp/sums.after" | head -4 | tr '\n' ' ')" \
  cmp -s "$tmp/sums.before" "$tmp/sums.after"
"$BIN" "$@" --set train.lr=1e-3 --set checkpoint.interval=2 --set checkpoint.keep=2 --set "log.dir=$nanrun" \
  --resume --allow-config-change >"$tmp/out" 2>"$tmp/err"
rc=$?
check "--resume of the run falls back past the non-finite checkpoint" "rc $rc: $(tail -3 "$tmp/err") $(head -3 "$tmp/out")" \
  sh -c "[ $rc -eq 0 ] && grep -q 'note: not resuming from .*step_000004.ckpt: .*not finite' '$tmp/out' && \
         grep -q 'resuming from .*step_000002.ckpt (step 2 of 20)' '$tmp/out'"
check "the resumed run with a lower lr finishes finite" "$(tail -2 "$tmp/out")" \
  sh -c "grep -q '^done: 20 steps' '$tmp/out' && ! grep -q skipped '$nanrun/metrics.jsonl'"

# (2) The state a step not applied leaves: stopped (--stop-after) at step 6, the second bad step
# (max_bad_steps 3 lets it run), its checkpoint equals step 4's (the last applied) in parameters,
# AdamW moments and step, sampling RNG and delayed-scaling state; only the step and the data
# position moved on (by the two windows steps 5 and 6 read).
st=$tmp/state
"$BIN" "$@" --set checkpoint.interval=1 --set checkpoint.keep=100 --set train.max_bad_steps=3 \
  --set "log.dir=$st" --stop-after 6 >"$tmp/out" 2>"$tmp/err"
rc=$?
check "two bad steps, --stop-after 6: exit 0 with a checkpoint of step 6" "rc $rc: $(tail -2 "$tmp/err")" \
  sh -c "[ $rc -eq 0 ] && [ -f '$st/checkpoints/step_000006.ckpt' ] && [ ! -f '$st/checkpoints/step_000005.ckpt' ]"
check "a step not applied writes no periodic checkpoint" "$(grep 'no checkpoint' "$tmp/out")" \
  grep -q 'note: step 5: no checkpoint: the step was not applied' "$tmp/out"
python3 - "$st/checkpoints/step_000004.ckpt" "$st/checkpoints/step_000006.ckpt" >"$tmp/cmp" 2>&1 <<'PYEOF'
import struct, sys
def parts(path):
    b = open(path, "rb").read()
    f = struct.unpack_from("<12q", b, 16)
    n_tensors, total = f[10], f[11]
    cfg_len = struct.unpack_from("<Q", b, 112)[0]
    p = 120 + cfg_len + n_tensors * 80
    state = b[p:p + 12 * total]
    p += 12 * total
    adam_step, train_step, elapsed, rng, seed, epoch, shard, window = struct.unpack_from("<qqdQQqqq", b, p)
    delayed = b[p + 64:-8]
    return state, adam_step, train_step, rng, (seed, epoch, shard, window), delayed
a, b = parts(sys.argv[1]), parts(sys.argv[2])
print("params+moments equal:", a[0] == b[0], "| adam step", a[1], b[1], "| train step", a[2], b[2],
      "| rng equal:", a[3] == b[3], "| data", a[4], b[4], "| delayed equal:", a[5] == b[5], len(a[5]))
ok = a[0] == b[0] and a[1] == b[1] == 4 and (a[2], b[2]) == (4, 6) and a[3] == b[3] and a[5] == b[5] and len(a[5]) > 0
ok = ok and a[4][:3] == b[4][:3] and b[4][3] == a[4][3] + 2
sys.exit(0 if ok else 1)
PYEOF
rc=$?
check "steps not applied leave the optimizer and delayed-scaling state as step 4 left it" "$(cat "$tmp/cmp")" \
  [ "$rc" -eq 0 ]
# The mixed order (the default) logs a step not applied by its micro-batch and its first row's shard.
run=$tmp/div_mixed
"$BIN" "$@" --set data.order=mixed --set checkpoint.interval=0 --set "log.dir=$run" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "mixed order: a diverging run exits 1" "rc $rc" [ "$rc" -eq 1 ]
check "mixed order: each bad step is a warning with its micro-batch and shard" "$(grep 'not applied' "$tmp/out" | head -2)" \
  sh -c "[ \$(grep -c '^warning: step [5-9] not applied: the loss is .*(data: epoch 0, micro-batch [4-8], first row from .*train_00000[01].bin)' '$tmp/out') -eq 5 ]"
exit 0
