#!/bin/sh
# cli_mpirun.sh: scripts/launch_mpirun_multinode.sh as a user of two nodes runs it, on the CPU
# backend. First its checks of HOSTFILE and HOSTS (status 2 and a message naming the line or the
# variable; DRY_RUN=1 shows the mpirun command). Then, where mpirun exists and train_gpt has MPI,
# real runs from a two-entry hostfile whose nodes are both this machine: `localhost` (started by
# mpirun itself) and `127.0.0.2`, whose OpenMPI daemon comes through a stand-in for ssh
# (OMPI_MCA_plm_rsh_agent) that runs it here, so that the ranks are on two nodes as far as MPI
# knows (one rank per node). Checks: 2 ranks under mpirun give the losses of the same 2 ranks
# started torchrun-style bit for bit (one transport, one order of sums), follow 1 rank x 2
# accumulation (the same loss at step 1), ZeRO-1 equals plain bit for bit; resume 2 -> 2 exact,
# 2 -> 1 and 1 -> 2 at the same place; a killed rank, a stopped rank (the job ends, rank 0 naming
# the collective and the rank), SIGTERM to one rank and to mpirun (every rank stops after the same
# step with one checkpoint, which resumes exactly).
# Without mpirun or an MPI build the runs are not checked and a line says so; with
# TRAIN_GPT_TEST_REQUIRE_MPI=1 (CI) that is a failure. Runs from the repo root after `make`.
BIN=$(pwd)/train_gpt  # the launcher starts ./train_gpt of the repo
CONFIG=$(pwd)/configs/tiny.json
LAUNCH=$(pwd)/scripts/launch_mpirun_multinode.sh
tmp=$(mktemp -d)
pids=""
# ours PATTERN: the pids of the processes whose command line holds PATTERN (this test's mpirun,
# its daemons and ranks all name $tmp), this shell excluded
ours() {
  set +f  # (dp_lib.sh turns globbing off)
  for _d in /proc/[0-9]*; do
    [ "${_d#/proc/}" = $$ ] && continue
    case $( { tr '\0' ' ' <"$_d/cmdline"; } 2>/dev/null) in *"$1"*) echo "${_d#/proc/}" ;; esac
  done
  set -f
}
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null; done  # mpirun ends its job
  for p in $(ours "$tmp"); do kill -9 "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
. test/cli_lib.sh
. test/dp_lib.sh  # the shards, $TINY_OPTS, run1/run2, losses, maxdiff, wait_for, started

# --- the launcher's checks of its input (nothing is started) ---
# dry VAR=VALUE ...: the launcher with DRY_RUN=1 and these variables; output in $tmp/out, rc
dry() {
  env -u HOSTS -u HOSTFILE -u GPUS_PER_NODE "$@" DRY_RUN=1 bash "$LAUNCH" "$CONFIG" >"$tmp/out" 2>&1
  rc=$?
}
refused() {  # NAME GREP-PATTERN: rc 2 and the message
  check "launcher refuses $1" "rc $rc: $(cat "$tmp/out")" sh -c "[ $rc -eq 2 ] && grep -q -- \"\$0\" '$tmp/out'" "$2"
}
hosts() { printf "$1" >"$tmp/hostfile"; }
dry
refused "neither HOSTFILE nor HOSTS" "set HOSTFILE (OpenMPI's hostfile: lines 'NAME slots=N') or HOSTS=node1,node2"
hosts 'a slots=1\n'
dry HOSTFILE="$tmp/hostfile" HOSTS=a,b
refused "HOSTFILE and HOSTS together" "set HOSTFILE or HOSTS, not both"
dry HOSTFILE="$tmp/nosuch"
refused "a missing hostfile" "HOSTFILE '$tmp/nosuch' is not a readable file"
hosts 'localhost slots=1\nlocalhost slots=1\n'
dry HOSTFILE="$tmp/hostfile"
refused "a node listed twice, naming the line" "line 2: node 'localhost' is listed again (OpenMPI merges repeated names"
hosts 'node1 slots=8\nnode2\n'
dry HOSTFILE="$tmp/hostfile"
refused "a line without slots=N" "line 2: 'node2' has no slots=N: write the GPUs to use there, e.g. 'node2 slots=8'"
hosts 'node1 slots=0\n'
dry HOSTFILE="$tmp/hostfile"
refused "slots=0" "line 1: slots=0 is not a whole number >= 1"
hosts 'node1 slots=8 max_slots=8\n'
dry HOSTFILE="$tmp/hostfile"
refused "an unknown key" "line 1: 'max_slots=8' is not understood: expected 'NAME slots=N'"
hosts '# nodes\n\n'
dry HOSTFILE="$tmp/hostfile"
refused "a hostfile without nodes" "lists no node: expected lines 'NAME slots=N'"
hosts 'node1 slots=8\n'
dry HOSTFILE="$tmp/hostfile" GPUS_PER_NODE=8
refused "GPUS_PER_NODE with a hostfile" "GPUS_PER_NODE goes with HOSTS"
dry HOSTS=node1,,node2
refused "an empty name in HOSTS" "HOSTS='node1,,node2': '' is not a node name"
dry HOSTS=node1,node1
refused "a node twice in HOSTS" "node 'node1' is listed twice"
dry HOSTS=node1,node2 GPUS_PER_NODE=eight
refused "GPUS_PER_NODE not a number" "GPUS_PER_NODE='eight' is not a whole number >= 1"
env -u HOSTS HOSTFILE="$tmp/hostfile" DRY_RUN=1 bash "$LAUNCH" "$tmp/nosuch.json" >"$tmp/out" 2>&1
rc=$?
refused "a missing config" "config '$tmp/nosuch.json' not found"
hosts '# two nodes\nnode1   slots=8   # the first runs rank 0\n\n\tnode2 slots=4\n'
dry HOSTFILE="$tmp/hostfile" NCCL_SOCKET_IFNAME=lo NCCL_P2P_DISABLE=1
check "a hostfile with comments, blanks and tabs: 12 ranks on 2 nodes, mpirun --hostfile FILE" "rc $rc: $(cat "$tmp/out")" \
  sh -c "[ $rc -eq 0 ] && grep -q '^12 ranks on 2 node(s): node1:8,node2:4$' '$tmp/out' &&
         grep -q -- 'mpirun -np 12 --hostfile $tmp/hostfile --map-by slot --bind-to none' '$tmp/out'"
check "every NCCL variable that is set goes to the ranks, nothing unset" "$(tail -1 "$tmp/out")" \
  sh -c "grep -q -- '-x NCCL_P2P_DISABLE' '$tmp/out' && grep -q -- '-x NCCL_SOCKET_IFNAME' '$tmp/out' &&
         grep -q -- '-x NCCL_NVLS_ENABLE' '$tmp/out' && ! grep -q -- '-x MASTER_ADDR' '$tmp/out'"
dry HOSTS=node1,node2 GPUS_PER_NODE=4
check "HOSTS: 8 ranks, mpirun -H node1:4,node2:4" "rc $rc: $(cat "$tmp/out")" \
  sh -c "[ $rc -eq 0 ] && grep -q -- 'mpirun -np 8 -H node1:4.\{0,1\},node2:4 --map-by slot' '$tmp/out'"

# --- real runs: two nodes of one rank, both this machine ---
why=""
command -v mpirun >/dev/null || why="mpirun is not installed"
[ -z "$why" ] && ! ldd "$BIN" 2>/dev/null | grep -q libmpi && why="./train_gpt was built without MPI"
if [ -n "$why" ]; then
  if [ "${TRAIN_GPT_TEST_REQUIRE_MPI:-0}" = 1 ]; then
    fail "OpenMPI present (TRAIN_GPT_TEST_REQUIRE_MPI=1)" "$why"
  else
    echo "# cli_mpirun.sh: $why: the runs under mpirun are NOT checked (install openmpi-bin and libopenmpi-dev, rebuild)"
  fi
  exit 0
fi
printf 'localhost slots=1\n127.0.0.2 slots=1\n' >"$tmp/hosts"
# The stand-in for ssh: OpenMPI calls it as `AGENT [options] HOST COMMAND...` to start its daemon.
cat >"$tmp/agent" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
echo "\$1" >>"$tmp/agent.log"
shift
exec sh -c "\$*"
EOF
chmod +x "$tmp/agent"
# mp_start NAME [options...]: the launcher with the two-node hostfile in the background (its pid,
# mpirun's, in lpid; output in $tmp/NAME.out); mp: the same to the end (60 s at most), status rcm
mp_start() {
  _name=$1; shift
  env -u HOSTS -u GPUS_PER_NODE HOSTFILE="$tmp/hosts" OMPI_MCA_plm_rsh_agent="$tmp/agent" MPI_IFACE=lo \
    bash "$LAUNCH" "$CONFIG" $TINY_OPTS --set "log.dir=$tmp/$_name" "$@" >"$tmp/$_name.out" 2>&1 &
  lpid=$!
  pids="$pids $!"
}
mp() { mp_start "$@"; wait_for "$lpid" 60; rcm=$rc; }
# rank_pid NAME RANK: the pid of train_gpt rank RANK of run NAME
rank_pid() {
  for _p in $(ours "$tmp/$1"); do
    [ "$(cat "/proc/$_p/comm" 2>/dev/null)" = train_gpt ] &&
      tr '\0' '\n' <"/proc/$_p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$_p"
  done
}

# (a) 2 ranks on 2 nodes against the same ranks torchrun-style and 1 rank x 2 accumulation.
t0=$(date +%s.%N)
mp mpi
t_mpi=$(seconds_since "$t0")
check "mpirun, 2 nodes x 1 rank: exits 0" "rc $rcm: $(tail -5 "$tmp/mpi.out")" [ "$rcm" -eq 0 ]
check "the launcher reads the hostfile: 2 ranks on 2 nodes" "$(head -2 "$tmp/mpi.out")" \
  grep -q '2 ranks on 2 node(s): localhost:1,127.0.0.2:1' "$tmp/mpi.out"
check "the second node's daemon came through the remote shell" "$(cat "$tmp/agent.log" 2>&1)" grep -qx 127.0.0.2 "$tmp/agent.log"
check "rank 0 sees 2 ranks of the mpi launcher, 1 per node, on the host transport" "$(grep 'data parallel' "$tmp/mpi.out")" \
  grep -q 'data parallel: 2 ranks (mpi launcher, 1 per node) | host transport over TCP' "$tmp/mpi.out"
run2 env --set "log.dir=$tmp/env"
run1 single --set "log.dir=$tmp/single"
losses "$tmp/mpi/metrics.jsonl" >"$tmp/lm"
losses "$tmp/env/metrics.jsonl" >"$tmp/le"
losses "$tmp/single/metrics.jsonl" >"$tmp/l1"
check "20 losses under mpirun, torchrun-style and on 1 rank" "$(wc -l <"$tmp/lm") $(wc -l <"$tmp/le") $(wc -l <"$tmp/l1")" \
  [ "$(wc -l <"$tmp/lm")" -eq 20 -a "$(wc -l <"$tmp/le")" -eq 20 -a "$(wc -l <"$tmp/l1")" -eq 20 ]
check "mpirun's 2 ranks give the torchrun-style ranks' losses bit for bit" "$(diff "$tmp/lm" "$tmp/le" | head -4 | tr '\n' ' ')" \
  cmp -s "$tmp/lm" "$tmp/le"
grep val_loss "$tmp/mpi/metrics.jsonl" >"$tmp/vm"
grep val_loss "$tmp/env/metrics.jsonl" >"$tmp/ve"
check "and their validation losses" "$(diff "$tmp/vm" "$tmp/ve" | head -2)" cmp -s "$tmp/vm" "$tmp/ve"
check "step 1 under mpirun: 1 rank x 2 accumulation's loss" "$(head -1 "$tmp/lm") vs $(head -1 "$tmp/l1")" \
  [ "$(head -1 "$tmp/lm")" = "$(head -1 "$tmp/l1")" ]
d=$(maxdiff "$tmp/l1" "$tmp/lm")
check "mpirun's 2 ranks follow 1 rank x 2 accumulation (within 5e-3)" "max difference $d" lt "$d" 5e-3
mp mpiz --zero1
losses "$tmp/mpiz/metrics.jsonl" >"$tmp/lz"
check "ZeRO-1 under mpirun equals plain bit for bit" "rc $rcm: $(diff "$tmp/lm" "$tmp/lz" | head -4 | tr '\n' ' ')" \
  sh -c "[ $rcm -eq 0 ] && cmp -s '$tmp/lm' '$tmp/lz'"
echo "# mpirun, 2 nodes x 1 rank, 20 steps: $t_mpi s; max |loss difference| against 1 rank x 2 accumulation $d"

# (b) resume: 2 -> 2 under mpirun (ZeRO-1) exact; 2 -> 1 and 1 -> 2 from the step-10 checkpoints.
mp stop --zero1 --stop-after 7
r_stop=$rcm
mp stop --zero1 --resume
losses "$tmp/stop/metrics.jsonl" >"$tmp/lr"
check "ZeRO-1 under mpirun: --stop-after 7, --resume: all 20 losses bit for bit" \
  "rc $r_stop $rcm: $(diff "$tmp/lz" "$tmp/lr" | head -4 | tr '\n' ' ')" sh -c "[ $r_stop$rcm = 00 ] && cmp -s '$tmp/lz' '$tmp/lr'"
# resumed RC METRICS REF WHAT: a run resumed from step 10 of 20 against the uninterrupted REF
# losses: steps 11..20, step 11 exactly as in REF (the checkpoint's state), the rest within 5e-3
resumed() {
  losses "$2" >"$tmp/lr"
  d=$(maxdiff "$3" "$tmp/lr")
  good=0
  [ "$1" -eq 0 ] && [ "$(wc -l <"$tmp/lr")" -eq 10 ] && [ "$(head -1 "$tmp/lr")" = "$(sed -n 11p "$3")" ] &&
    lt "$d" 5e-3 && good=1
  check "resume $4: steps 11..20, step 11 as in the uninterrupted run, the rest within 5e-3" \
    "rc $1, $(wc -l <"$tmp/lr") steps, step 11 $(head -1 "$tmp/lr") vs $(sed -n 11p "$3"), max difference $d" \
    [ $good = 1 ]
  echo "# resume $4 from step 10: max |loss difference| over steps 11-20 $d"
}
run1 to1 --set "log.dir=$tmp/to1" --resume "$tmp/mpiz/checkpoints/step_000010.ckpt"
resumed "$rc1p" "$tmp/to1/metrics.jsonl" "$tmp/lz" "2 (mpirun, ZeRO-1) -> 1"
mp to2 --resume "$tmp/single/checkpoints/step_000010.ckpt"
resumed "$rcm" "$tmp/to2/metrics.jsonl" "$tmp/l1" "1 -> 2 (mpirun)"

# (c) faults, comm timeout 5 s. mpirun ends the job when a rank fails; OpenMPI's teardown of a
# two-node job takes about 3 s of its own.
long="--set train.steps=1000000 --set checkpoint.interval=1000000 --set eval.interval=0 --set train.comm_timeout_s=5"
# fault NAME SIGNAL: run NAME under mpirun until 3 steps, SIGNAL to rank 1; sets t_err (seconds
# until rank 0's error line, "none" if it printed none), t_end (until mpirun ended), rcm
fault() {
  mp_start "$1" $long
  started 3 "$1"
  _victim=$(rank_pid "$1" 1)
  [ -n "$_victim" ] || echo "# $1: rank 1's pid not found"
  kill -"$2" $_victim
  _t0=$(date +%s.%N) t_err=none
  _n=0
  while kill -0 "$lpid" 2>/dev/null && [ $_n -lt 300 ]; do
    [ "$t_err" = none ] && grep -q 'train_gpt: error' "$tmp/$1.out" && t_err=$(seconds_since "$_t0")
    sleep 0.05; _n=$((_n + 1))
  done
  wait_for "$lpid" 1; rcm=$rc
  t_end=$(seconds_since "$_t0")
  [ "$t_err" = none ] && grep -q 'train_gpt: error' "$tmp/$1.out" && t_err="<$t_end"
  err=$(grep -h 'train_gpt: error' "$tmp/$1.out" | head -1)
  echo "# SIG$2 to rank 1 under mpirun: rank 0's error after $t_err s, the job ended after $t_end s (status $rcm): $err"
}
# in_time T LIMIT: T (seconds, or "none") is under LIMIT
in_time() { [ "$1" != none ] && [ "${1#<}" = "$1" ] && lt "$1" "$2"; }
failed() { [ "$rcm" -ne 0 ] && [ "$rcm" -ne 124 ]; }
fault killed KILL
good=0
echo "$err" | grep -q 'rank 0 of 2: .* #[0-9]* of [0-9]* bytes: rank 1 closed the connection' && in_time "$t_err" 1 && good=1
check "SIGKILL to rank 1: rank 0 names the collective and rank 1 at once" "$err (after $t_err s)" [ $good = 1 ]
good=0
failed && in_time "$t_end" 5 && good=1
check "SIGKILL to rank 1: the job ends, non-zero, within the 5 s timeout" "status $rcm after $t_end s" [ $good = 1 ]
fault stopped STOP
good=0
echo "$err" | grep -q 'rank 0 of 2: .* #[0-9]* of [0-9]* bytes: rank 1 sent or took nothing within 5 s' &&
  in_time "$t_err" 6.5 && ! in_time "$t_err" 4.9 && good=1
check "SIGSTOP to rank 1: rank 0 names the collective and rank 1 after the 5 s timeout" "$err (after $t_err s)" [ $good = 1 ]
good=0
failed && in_time "$t_end" 10 && good=1
check "SIGSTOP to rank 1: the job ends, non-zero, within the timeout and OpenMPI's teardown (10 s)" \
  "status $rcm after $t_end s" [ $good = 1 ]

# SIGTERM to rank 1, then to mpirun (as a scheduler's time limit would): every rank stops after the
# same step with one checkpoint, which resumes exactly (against a run straight to 3 steps later).
# The job exits 0 when a rank was signalled; mpirun itself, signalled, exits 1 once its ranks
# have stopped.
for who in rank1 mpirun; do
  mp_start "term-$who" $long
  started 3 "term-$who"
  if [ $who = rank1 ]; then kill -TERM $(rank_pid "term-$who" 1); else kill -TERM "$lpid"; fi
  _t0=$(date +%s.%N)
  wait_for "$lpid" 20
  echo "# SIGTERM to $who: the job ended after $(seconds_since "$_t0") s (status $rc): $(grep -h '^stopped' "$tmp/term-$who.out")"
  want=0
  [ $who = mpirun ] && want=1
  last=$(ls "$tmp/term-$who/checkpoints" 2>/dev/null | sed -n 's/^step_0*\([0-9][0-9]*\)\.ckpt$/\1/p')
  check "SIGTERM to $who: exit $want, one checkpoint, rank 0 says why" \
    "rc $rc, checkpoints '$last': $(grep -h 'stopped' "$tmp/term-$who.out")" \
    sh -c "[ $rc -eq $want ] && [ -n '$last' ] && [ \$(echo '$last' | wc -l) -eq 1 ] && grep -q 'stopped .*after step $last.*checkpoint written' '$tmp/term-$who.out'"
  [ -n "$last" ] || continue
  mp "term-$who" $long --resume --stop-after $((last + 3))
  r_res=$rcm
  mp "straight-$who" $long --stop-after $((last + 3))
  losses "$tmp/term-$who/metrics.jsonl" | tail -3 >"$tmp/lr"
  losses "$tmp/straight-$who/metrics.jsonl" | tail -3 >"$tmp/ls"
  check "SIGTERM to $who: its checkpoint resumes exactly (steps $((last + 1))..$((last + 3)))" \
    "rc $r_res $rcm: $(tr '\n' ' ' <"$tmp/lr") vs $(tr '\n' ' ' <"$tmp/ls")" \
    sh -c "[ $r_res$rcm = 00 ] && [ \"\$(head -1 '$tmp/lr' | cut -d' ' -f1)\" = $((last + 1)) ] && cmp -s '$tmp/lr' '$tmp/ls'"
done
exit 0
