#!/bin/sh
# cli_rundir.sh: a run directory has one writer and keeps what it holds.
#  - the lock: two runs started together into one directory (one is refused, the metrics stay
#    valid JSON); a second run or a --resume while a run is going is refused naming its process;
#    a killed run's stale lock is reclaimed with a note; another host's lock is refused;
#  - a run killed before its first checkpoint: a restart says what to do, --resume starts it
#    from step 0;
#  - temporary files of killed writers are removed at start and resume with a note; a write past
#    `ulimit -f` fails with a message and leaves no temporary file.
# Runs from the repo root after `make`; TRAIN_GPT overrides the binary.
BIN=${TRAIN_GPT:-./train_gpt}
tmp=$(mktemp -d)
pids=""
trap 'for p in $pids; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
. test/cli_lib.sh

pattern_shards "$tmp" train_000000.bin:3000:1 train_000001.bin:2000:2
set -- --config configs/tiny.json --set model.vocab_size=512 --set model.n_layer=1 --set model.seq_len=16 \
  --set model.ffn_hidden=256 --set train.micro_batch=2 --set train.warmup_steps=1 \
  --set "data.train=$tmp/train_*.bin" --set data.val= --set eval.sample_interval=0 --set train.threads=1 --device cpu
long="--set train.steps=1000000 --set checkpoint.interval=0 --set log.interval=1000000"
host=$(hostname)

# waits until $1 has at least $2 lines (10 s at most)
wait_lines() {
  _i=0
  while [ "$_i" -lt 100 ] && [ "$(cat "$1" 2>/dev/null | wc -l)" -lt "$2" ]; do sleep 0.1; _i=$((_i + 1)); done
}
is_json_lines() { python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$1')]
steps = [r['step'] for r in rows if 'loss' in r]
sys.exit(0 if steps == list(range(1, len(steps) + 1)) and len(steps) >= $2 else 1)"; }

# --- two runs started together -------------------------------------------------------------------
both=$tmp/both
"$BIN" "$@" --set train.steps=40 --set checkpoint.interval=20 --set "log.dir=$both" >"$tmp/a.out" 2>"$tmp/a.err" &
pa=$!
"$BIN" "$@" --set train.steps=40 --set checkpoint.interval=20 --set "log.dir=$both" >"$tmp/b.out" 2>"$tmp/b.err" &
pb=$!
pids="$pa $pb"
wait "$pa"; ra=$?
wait "$pb"; rb=$?
check "two runs started together: exactly one runs" "rc $ra and $rb: $(cat "$tmp/a.err" "$tmp/b.err")" \
  sh -c "[ \$(( ($ra == 0) + ($rb == 0) )) -eq 1 ] && [ \$(( ($ra == 1) + ($rb == 1) )) -eq 1 ]"
check "two runs started together: the other is told why" "$(cat "$tmp/a.err" "$tmp/b.err")" \
  sh -c "cat '$tmp/a.err' '$tmp/b.err' | grep -Eq 'run dir $both (is in use by process [0-9]+ on host|already holds a run)'"
check "two runs started together: metrics.jsonl is one run's valid JSON" "$(head -c 300 "$both/metrics.jsonl")" \
  is_json_lines "$both/metrics.jsonl" 40
check "two runs started together: the lock is gone after it" "$(ls "$both")" [ ! -e "$both/train_gpt.lock" ]

# --- a run going: another start and a --resume are refused, naming it -----------------------------
live=$tmp/live
"$BIN" "$@" $long --set "log.dir=$live" >"$tmp/live.out" 2>&1 &
plive=$!
pids="$pids $plive"
wait_lines "$live/metrics.jsonl" 3
check "the lock file names the running process" "$(cat "$live/train_gpt.lock" 2>&1)" \
  grep -q "^pid $plive on host $host since " "$live/train_gpt.lock"
snap() { find "$1" -type f ! -name metrics.jsonl -exec cksum {} + | sort; }
snap "$live" >"$tmp/live.before"
"$BIN" "$@" $long --set "log.dir=$live" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "a second run into a directory in use: exit 1, naming the holder" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'run dir $live is in use by process $plive on host $host (since .*): wait for that run to end or stop it' '$tmp/err'"
"$BIN" "$@" $long --set "log.dir=$live" --resume >"$tmp/out" 2>"$tmp/err"
rc=$?
check "--resume while the run is going: refused, naming the holder" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'is in use by process $plive on host $host' '$tmp/err'"
snap "$live" >"$tmp/live.after"
check "the refused runs wrote nothing there" "$(diff "$tmp/live.before" "$tmp/live.after" | head -3 | tr '\n' ' ')" \
  cmp -s "$tmp/live.before" "$tmp/live.after"
# The run is killed before its first checkpoint (kill -9: no cleanup at all).
kill -9 "$plive"
wait "$plive" 2>/dev/null
check "a killed run leaves its lock behind" "$(ls "$live")" grep -q "^pid $plive " "$live/train_gpt.lock"
cp "$live/metrics.jsonl" "$tmp/live.metrics"
"$BIN" "$@" $long --set "log.dir=$live" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "restart of a run with no checkpoint: refused, saying what to do" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'already holds a run .*: pass --resume to continue it (from its newest checkpoint, or from step 0 if it has none), choose another log.dir via --set log.dir=..., or remove $live to start over' '$tmp/err'"
check "the killed run's stale lock: reclaimed with a note" "$(head -3 "$tmp/out")" \
  grep -q "^note: reclaimed the stale lock $live/train_gpt.lock of process $plive on host $host (since .*): that process no longer runs" "$tmp/out"
check "the refused restart leaves the metrics as they were" "metrics changed" cmp -s "$tmp/live.metrics" "$live/metrics.jsonl"
"$BIN" "$@" $long --set "log.dir=$live" --resume --stop-after 4 >"$tmp/out" 2>"$tmp/err"
rc=$?
check "--resume of a run with no checkpoint: starts from step 0, saying so" "rc $rc: $(head -4 "$tmp/out") $(tail -2 "$tmp/err")" \
  sh -c "[ $rc -eq 0 ] && grep -q '^note: --resume: no checkpoint in $live/checkpoints: the run starts from step 0' '$tmp/out' && \
         grep -q '^note: dropped [0-9]* metrics lines of the session that wrote no checkpoint' '$tmp/out' && grep -q '^stopped after step 4' '$tmp/out'"
check "--resume from step 0: the metrics are the new session's" "$(cat "$live/metrics.jsonl" | head -c 300)" is_json_lines "$live/metrics.jsonl" 4
check "--resume from step 0: a checkpoint of step 4" "$(ls "$live/checkpoints")" [ -f "$live/checkpoints/step_000004.ckpt" ]

# --- a run refused after taking the lock leaves no directory it made --------------------------------
"$BIN" "$@" --set train.steps=2 --set "log.dir=$tmp/nest/a/b" --resume "$tmp/none.ckpt" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "a refused run into new nested directories removes what it made" "rc $rc: $(cat "$tmp/err"); $(ls -R "$tmp/nest" 2>&1 | head -3)" \
  sh -c "[ $rc -eq 1 ] && grep -q 'none.ckpt: no such checkpoint file or directory' '$tmp/err' && [ ! -e '$tmp/nest' ]"

# --- a lock of another host: refused (only the user knows whether that run is gone) --------------
other=$tmp/other
mkdir -p "$other"
echo "pid 1 on host some-other-node since 2030-01-01T00:00:00" >"$other/train_gpt.lock"
"$BIN" "$@" --set train.steps=2 --set "log.dir=$other" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "another host's lock: refused with the file to delete" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'holds the lock of process 1 on host some-other-node (since 2030-01-01T00:00:00), which cannot be checked from $host .*delete $other/train_gpt.lock' '$tmp/err'"
check "another host's lock: left as it was, nothing written" "$(ls "$other")" \
  sh -c "[ \"\$(ls '$other')\" = train_gpt.lock ] && grep -q some-other-node '$other/train_gpt.lock'"

# --- temporary files of killed writers -------------------------------------------------------------
dead=$(sh -c 'echo $$')  # a PID that has exited
tf=$tmp/tmpfiles
"$BIN" "$@" --set train.steps=6 --set checkpoint.interval=2 --set "log.dir=$tf" --stop-after 4 >"$tmp/out" 2>&1 ||
  echo "FAIL - temp files: setup run: $(tail -2 "$tmp/out")"
head -c 300000 /dev/zero >"$tf/checkpoints/step_000006.ckpt.tmp.$dead"
echo '{"partial' >"$tf/config.json.tmp.$dead"
echo "step_000006.ckpt" >"$tf/checkpoints/latest.tmp.$dead"
ck4=$(cksum <"$tf/checkpoints/step_000004.ckpt")
"$BIN" "$@" --set train.steps=6 --set checkpoint.interval=2 --set "log.dir=$tf" --resume >"$tmp/out" 2>"$tmp/err"
rc=$?
check "resume: leftover temporary files removed with one note per directory" "rc $rc: $(grep note "$tmp/out")" \
  sh -c "[ $rc -eq 0 ] && grep -q '^note: removed 1 temporary file of interrupted writes from $tf (10 bytes): config.json.tmp.$dead' '$tmp/out' && \
         grep -q '^note: removed 2 temporary files of interrupted writes from $tf/checkpoints (300017 bytes): ' '$tmp/out'"
check "resume: no temporary file left" "$(ls "$tf" "$tf/checkpoints" | tr '\n' ' ')" \
  sh -c "! ls '$tf' '$tf/checkpoints' | grep -q '\.tmp\.'"
check "resume: the run's checkpoints kept (step 4 as it was, 6 new)" "$(ls "$tf/checkpoints" | tr '\n' ' ')" \
  sh -c "[ \"\$(cksum <'$tf/checkpoints/step_000004.ckpt')\" = '$ck4' ] && [ -f '$tf/checkpoints/step_000006.ckpt' ]"

# --- a write past the file size limit --------------------------------------------------------------
fz=$tmp/fsize
sh -c "ulimit -f 1000; exec \"\$0\" \"\$@\"" "$BIN" "$@" --set train.steps=4 --set checkpoint.interval=2 \
  --set "log.dir=$fz" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "ulimit -f: exit 1 with a message (not killed by SIGXFSZ)" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'step_000002.ckpt.tmp.[0-9]*: write failed: File too large (the file size limit, ulimit -f, is too low for it)' '$tmp/err'"
check "ulimit -f: no temporary file left" "$(ls "$fz/checkpoints" | tr '\n' ' ')" [ -z "$(ls "$fz/checkpoints")" ]
check "ulimit -f: the metrics up to the failed checkpoint kept" "$(cat "$fz/metrics.jsonl")" is_json_lines "$fz/metrics.jsonl" 2
exit 0
