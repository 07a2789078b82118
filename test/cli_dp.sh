#!/bin/sh
# cli_dp.sh: data parallelism on the CPU (the host transport of comm.h), as CI can run it: ranks
# are background processes started torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
# MASTER_PORT). Checks: 2 ranks x micro-batch b follow 1 rank x b x 2 accumulation steps (plain
# and ZeRO-1); ZeRO-1 equals plain DP bit for bit; two simulated nodes of two processes (4 ranks,
# LOCAL_RANK 0 1 0 1) follow 1 rank x 4 accumulation; resume 2->2 exact, 2->1 and 1->2 continue
# where the checkpoint was; a killed or hung rank makes the other fail in time, naming it;
# SIGTERM to one rank stops both with one checkpoint; only rank 0 writes; ranks started with
# different configs are refused. Every process is bounded by a timeout and killed at the end.
# Runs from the repo root after `make`; TRAIN_GPT overrides the binary.
BIN=$(cd "$(dirname "${TRAIN_GPT:-./train_gpt}")" && pwd)/$(basename "${TRAIN_GPT:-./train_gpt}")
CONFIG=$(pwd)/configs/tiny.json
tmp=$(mktemp -d)
pids=""
cleanup() {
  for p in $pids; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
. test/cli_lib.sh
. test/dp_lib.sh  # the shards, $TINY, start/run1/run2, losses, maxdiff

# (a), (b): equivalence of the batch over 1 and 2 ranks, plain and ZeRO-1.
run1 single --set "log.dir=$tmp/single"
check "1 rank x 2 accumulation runs" "rc $rc1p: $(tail -2 "$tmp/single.out")" [ "$rc1p" -eq 0 ]
run2 dp --set "log.dir=$tmp/dp"
check "2 ranks (plain DP) run and exit 0" "rc $rc0 $rc1: $(tail -2 "$tmp/dp.r0") / $(tail -2 "$tmp/dp.r1")" \
  [ "$rc0" -eq 0 -a "$rc1" -eq 0 ]
check "rank 0 prints the data-parallel plan" "$(head -6 "$tmp/dp.r0")" \
  grep -q 'data parallel: 2 ranks (env launcher.*host transport over TCP | ZeRO-1 off' "$tmp/dp.r0"
check "the batch line counts the ranks" "$(grep batch: "$tmp/dp.r0")" \
  grep -q 'batch: 2 x 16 tokens x 1 accumulation x 2 ranks = 64 tokens/step' "$tmp/dp.r0"
run2 zero1 --zero1 --set "log.dir=$tmp/zero1"
check "2 ranks (ZeRO-1) run and exit 0" "rc $rc0 $rc1: $(tail -2 "$tmp/zero1.r0") / $(tail -2 "$tmp/zero1.r1")" \
  [ "$rc0" -eq 0 -a "$rc1" -eq 0 ]
losses "$tmp/single/metrics.jsonl" >"$tmp/l1"
losses "$tmp/dp/metrics.jsonl" >"$tmp/l2"
losses "$tmp/zero1/metrics.jsonl" >"$tmp/lz"
check "20 losses each" "$(wc -l <"$tmp/l1") $(wc -l <"$tmp/l2") $(wc -l <"$tmp/lz")" \
  [ "$(wc -l <"$tmp/l1")" -eq 20 -a "$(wc -l <"$tmp/l2")" -eq 20 -a "$(wc -l <"$tmp/lz")" -eq 20 ]
check "step 1: the same loss on 1 and 2 ranks (same data, same start)" "$(head -1 "$tmp/l1") vs $(head -1 "$tmp/l2")" \
  [ "$(head -1 "$tmp/l1")" = "$(head -1 "$tmp/l2")" ]
d_dp=$(maxdiff "$tmp/l1" "$tmp/l2"); d_z=$(maxdiff "$tmp/l1" "$tmp/lz")
echo "# max |loss difference| over 20 steps, 1 rank x 2 accumulation vs 2 ranks: plain $d_dp, ZeRO-1 $d_z"
check "2 ranks follow 1 rank x 2 accumulation (plain DP, within 5e-3)" "max difference $d_dp" lt "$d_dp" 5e-3
check "2 ranks follow 1 rank x 2 accumulation (ZeRO-1, within 5e-3)" "max difference $d_z" lt "$d_z" 5e-3
check "ZeRO-1 equals plain DP bit for bit" "$(diff "$tmp/l2" "$tmp/lz" | head -4 | tr '\n' ' ')" cmp -s "$tmp/l2" "$tmp/lz"
grep val_loss "$tmp/dp/metrics.jsonl" >"$tmp/v2"
grep val_loss "$tmp/zero1/metrics.jsonl" >"$tmp/vz"
check "val losses (averaged over the ranks) agree between ZeRO-1 and plain" "$(diff "$tmp/v2" "$tmp/vz" | head -2)" \
  cmp -s "$tmp/v2" "$tmp/vz"

# (b2) two "nodes" of two processes each, simulated on this machine as torchrun would start them
# on two hosts (RANK 0..3, LOCAL_RANK 0 1 0 1, LOCAL_WORLD_SIZE 2, GROUP_RANK 0 0 1 1): 4 ranks x
# micro-batch 1 make the same 64-token step as 1 rank x 1 x 4 accumulation (the same windows:
# the loader's windows, and their shuffled order, follow the micro-batch).
run1 single4 --set train.micro_batch=1 --set "log.dir=$tmp/single4"
losses "$tmp/single4/metrics.jsonl" >"$tmp/l14"
next_port
for _r in 0 1 2 3; do
  (RANK=$_r WORLD_SIZE=4 LOCAL_RANK=$((_r % 2)) LOCAL_WORLD_SIZE=2 GROUP_RANK=$((_r / 2)) MASTER_ADDR=127.0.0.1     MASTER_PORT=$port exec "$BIN" $TINY --set train.micro_batch=1 --set "log.dir=$tmp/nodes")     >"$tmp/nodes.r$_r" 2>&1 &
  eval "pidn_$_r=$!"
  pids="$pids $!"
done
rcs=""
for _r in 0 1 2 3; do eval "wait_for \$pidn_$_r 40"; rcs="$rcs $rc"; done
check "2 simulated nodes x 2 processes run and exit 0" "rc$rcs: $(tail -2 "$tmp/nodes.r0")" [ "$rcs" = " 0 0 0 0" ]
check "rank 0 sees 4 ranks, 2 per node" "$(grep 'data parallel' "$tmp/nodes.r0")" \
  grep -q 'data parallel: 4 ranks (env launcher, 2 per node)' "$tmp/nodes.r0"
losses "$tmp/nodes/metrics.jsonl" >"$tmp/l4"
d_n=$(maxdiff "$tmp/l14" "$tmp/l4")
echo "# max |loss difference| over 20 steps, 1 rank x 4 accumulation vs 2 nodes x 2 ranks: $d_n"
check "2 nodes x 2 ranks: 20 losses (1 rank x 4 accumulation: $(wc -l <"$tmp/l14"))" "$(wc -l <"$tmp/l4")" \
  [ "$(wc -l <"$tmp/l4")" -eq 20 -a "$(wc -l <"$tmp/l14")" -eq 20 ]
check "2 nodes x 2 ranks follow 1 rank x 4 accumulation (within 5e-3)" "max difference $d_n" lt "$d_n" 5e-3

# (c) resume: 2 -> 2 exact (plain and ZeRO-1), 2 -> 1 and 1 -> 2 from the step-10 checkpoints.
for mode in plain zero1; do
  z=""; ref=$tmp/l2; [ $mode = zero1 ] && z=--zero1 && ref=$tmp/lz
  run2 "stop-$mode" $z --set "log.dir=$tmp/stop-$mode" --stop-after 7
  check "$mode: --stop-after 7 on 2 ranks exits 0" "rc $rc0 $rc1: $(tail -1 "$tmp/stop-$mode.r0")" [ "$rc0" -eq 0 -a "$rc1" -eq 0 ]
  run2 "res-$mode" $z --set "log.dir=$tmp/stop-$mode" --resume
  check "$mode: 2 ranks resume" "rc $rc0 $rc1: $(tail -2 "$tmp/res-$mode.r0") / $(tail -2 "$tmp/res-$mode.r1")" \
    [ "$rc0" -eq 0 -a "$rc1" -eq 0 ]
  losses "$tmp/stop-$mode/metrics.jsonl" >"$tmp/lr"
  check "$mode: resume 2 -> 2 reproduces all 20 losses bit for bit" "$(diff "$ref" "$tmp/lr" | head -4 | tr '\n' ' ')" \
    cmp -s "$ref" "$tmp/lr"
done
run1 to1 --set "log.dir=$tmp/to1" --resume "$tmp/zero1/checkpoints/step_000010.ckpt"
losses "$tmp/to1/metrics.jsonl" >"$tmp/lr"
check "resume 2 (ZeRO-1) -> 1: runs steps 11..20" "rc $rc1p, $(wc -l <"$tmp/lr") steps: $(tail -2 "$tmp/to1.out")" \
  [ "$rc1p" -eq 0 -a "$(wc -l <"$tmp/lr")" -eq 10 ]
check "resume 2 -> 1: step 11 as on 2 ranks (full AdamW state, same data position)" \
  "$(head -1 "$tmp/lr") vs $(sed -n 11p "$tmp/lz")" [ "$(head -1 "$tmp/lr")" = "$(sed -n 11p "$tmp/lz")" ]
d=$(maxdiff "$tmp/lz" "$tmp/lr")
check "resume 2 -> 1: steps 11..20 follow the 2-rank run (within 5e-3)" "max difference $d" lt "$d" 5e-3
run2 to2 --zero1 --set "log.dir=$tmp/to2" --resume "$tmp/single/checkpoints/step_000010.ckpt"
losses "$tmp/to2/metrics.jsonl" >"$tmp/lr"
check "resume 1 -> 2 (ZeRO-1): runs steps 11..20" "rc $rc0 $rc1, $(wc -l <"$tmp/lr") steps: $(tail -2 "$tmp/to2.r0")" \
  [ "$rc0" -eq 0 -a "$rc1" -eq 0 -a "$(wc -l <"$tmp/lr")" -eq 10 ]
check "resume 1 -> 2: step 11 as on 1 rank" "$(head -1 "$tmp/lr") vs $(sed -n 11p "$tmp/l1")" \
  [ "$(head -1 "$tmp/lr")" = "$(sed -n 11p "$tmp/l1")" ]
d=$(maxdiff "$tmp/l1" "$tmp/lr")
check "resume 1 -> 2: steps 11..20 follow the 1-rank run (within 5e-3)" "max difference $d" lt "$d" 5e-3

# (d) a killed rank, a hung rank: the other fails within comm_timeout_s (3 s) + margin.
long="--set train.steps=1000000 --set checkpoint.interval=1000000 --set eval.interval=0 --set train.comm_timeout_s=3"
for how in KILL STOP; do
  next_port
  start "dead-$how" 0 $long --set "log.dir=$tmp/dead-$how"
  start "dead-$how" 1 $long --set "log.dir=$tmp/dead-$how"
  started 3 "dead-$how"
  kill -$how "$pid_1"
  t0=$(date +%s.%N)
  wait_for "$pid_0" 10
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.2f", b - a}')
  kill -9 "$pid_1" 2>/dev/null
  echo "# SIG$how to rank 1: rank 0 exited with $rc after $dt s: $(tail -1 "$tmp/dead-$how.r0")"
  in_time=0; [ "$rc" -ne 0 -a "$rc" -ne 124 ] && lt "$dt" 5 && in_time=1
  check "SIG$how to rank 1: rank 0 fails (non-zero) within 3 s + 2 s" "rc $rc after $dt s" [ $in_time -eq 1 ]
  check "SIG$how to rank 1: rank 0's message names rank 1" "$(tail -1 "$tmp/dead-$how.r0")" \
    grep -q 'rank 0 of 2: .*rank 1 \(closed its connection\|closed the connection\|sent or took nothing within 3 s\)' "$tmp/dead-$how.r0"
done

# (e) SIGTERM to rank 1: both stop after the same step with one checkpoint, exit 0.
next_port
start term 0 $long --set "log.dir=$tmp/term"
start term 1 $long --set "log.dir=$tmp/term"
started 3 term
kill -TERM "$pid_1"
wait_for "$pid_0" 10; rc0=$rc
wait_for "$pid_1" 10; rc1=$rc
check "SIGTERM to rank 1: both ranks exit 0" "rc $rc0 $rc1: $(tail -2 "$tmp/term.r0") / $(tail -2 "$tmp/term.r1")" \
  [ "$rc0" -eq 0 -a "$rc1" -eq 0 ]
check "SIGTERM to rank 1: rank 0 says why it stopped" "$(tail -1 "$tmp/term.r0")" \
  grep -q 'stopped after step [0-9]* (a stop signal reached another rank): checkpoint written' "$tmp/term.r0"
check "SIGTERM to rank 1: one checkpoint" "$(ls "$tmp/term/checkpoints")" [ "$(ls "$tmp/term/checkpoints" | grep -c ckpt)" -eq 1 ]

# (f) only rank 0 writes: each rank in its own working directory, log.dir relative.
mkdir -p "$tmp/cwd0" "$tmp/cwd1"
CWD=$tmp/cwd0; next_port
start files 0 --set log.dir=run --set train.steps=4 --set eval.sample_interval=2
CWD=$tmp/cwd1
start files 1 --set log.dir=run --set train.steps=4 --set eval.sample_interval=2
CWD=
wait_for "$pid_0" 30; rc0=$rc
wait_for "$pid_1" 30; rc1=$rc
check "files: both ranks exit 0" "rc $rc0 $rc1: $(tail -2 "$tmp/files.r0") / $(tail -2 "$tmp/files.r1")" [ "$rc0" -eq 0 -a "$rc1" -eq 0 ]
check "files: rank 0 wrote metrics, config, summary and checkpoints" "$(ls "$tmp/cwd0/run" 2>&1)" \
  [ -f "$tmp/cwd0/run/metrics.jsonl" -a -f "$tmp/cwd0/run/summary.json" -a -f "$tmp/cwd0/run/checkpoints/step_000004.ckpt" ]
check "files: rank 1 wrote nothing" "$(ls -R "$tmp/cwd1")" [ -z "$(ls -A "$tmp/cwd1")" ]
check "files: rank 1 printed nothing on stdout" "$(head -3 "$tmp/files.r1")" [ ! -s "$tmp/files.r1" ]

# (g) ranks started with different configs are refused at the rendezvous.
next_port
start mixed 0 --set "log.dir=$tmp/mixed" --set train.comm_timeout_s=3
start mixed 1 --set "log.dir=$tmp/mixed" --set train.comm_timeout_s=3 --set train.lr=0.001
wait_for "$pid_1" 10; rc1=$rc
wait_for "$pid_0" 10; rc0=$rc
check "different configs: both ranks fail" "rc $rc0 $rc1" [ "$rc0" -ne 0 -a "$rc0" -ne 124 -a "$rc1" -ne 0 -a "$rc1" -ne 124 ]
check "different configs: rank 1 says why" "$(cat "$tmp/mixed.r1")" grep -q 'started with different configs' "$tmp/mixed.r1"
check "different configs: nothing written" "$(ls "$tmp/mixed" 2>&1)" [ ! -e "$tmp/mixed" ]

# Batch arithmetic names the world size.
next_port
start batch 0 --set "log.dir=$tmp/batch" --set train.batch_tokens=96
start batch 1 --set "log.dir=$tmp/batch" --set train.batch_tokens=96
wait_for "$pid_0" 10; rc0=$rc
wait_for "$pid_1" 10; rc1=$rc
check "batch_tokens not divisible by micro x seq x world: an error naming the numbers" "rc $rc0 $rc1: $(cat "$tmp/batch.r0")" \
  grep -q 'train.batch_tokens (96) must be a multiple of micro_batch x seq_len x world size = 2 x 16 x 2 = 64' "$tmp/batch.r0"
