# dp_lib.sh: what the data-parallel CLI tests share (cli_dp.sh, cli_mpirun.sh): a tiny CPU run
# over pattern shards, ranks started torchrun-style, and loss comparisons. Sourced after
# cli_lib.sh, with BIN (an absolute path), CONFIG and tmp set; background pids go to $pids.

# Shards whose window counts are even (B*T = 32 tokens a window: 640/32 = 20, 448/32 = 14), so
# 2 ranks read exactly the windows 1 rank reads in 2 accumulation steps.
pattern_shards "$tmp" train_000000.bin:641:1 train_000001.bin:449:2 val_000000.bin:641:3

# Tiny run: 20 steps of 64 tokens (1 rank: micro-batch 2 x 2 accumulation; 2 ranks: 2 x 1 each),
# 1 thread per rank. No argument holds a space: $TINY_OPTS is split unquoted, with globbing off
# (set -f) so that its data globs stay globs.
TINY_OPTS="--set model.vocab_size=512 --set model.n_layer=2 --set model.seq_len=16 \
--set model.ffn_hidden=256 --set train.micro_batch=2 --set train.batch_tokens=64 --set train.steps=20 \
--set train.warmup_steps=2 --set data.train=$tmp/train_*.bin --set data.val=$tmp/val_*.bin \
--set eval.interval=10 --set eval.batches=2 --set checkpoint.interval=10 --set log.interval=5 \
--set train.threads=1 --set train.comm_timeout_s=20 --device cpu"
TINY="--config $CONFIG $TINY_OPTS"
set -f

# next_port: a port in 20000..59999 for the next job, different for each job of the script.
port_base=$(awk -v s=$$ 'BEGIN {srand(s); print int(rand() * 40000)}')
port_count=0
next_port() { port_count=$((port_count + 1)); port=$((20000 + (port_base + port_count * 211) % 40000)); }

# losses METRICS: "step loss" lines of a metrics.jsonl
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1" 2>/dev/null; }
# maxdiff A B: max |a - b| over the steps both "step loss" files have
maxdiff() {
  awk 'NR == FNR {a[$1] = $2; next} ($1 in a) {d = a[$1] - $2; if (d < 0) d = -d; if (d > m) m = d}
       END {printf "%.3g", m + 0}' "$1" "$2"
}
lt() { awk -v a="$1" -v b="$2" 'BEGIN {exit !(a < b)}'; }
# seconds_since T0: seconds since the `date +%s.%N` T0, two decimals
seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.2f", b - a}'; }

# wait_for PID SECONDS: waits for PID at most SECONDS (then kills it); sets rc to its status
# (124 on timeout).
wait_for() {
  _n=0
  while kill -0 "$1" 2>/dev/null && [ "$_n" -lt $(($2 * 10)) ]; do sleep 0.1; _n=$((_n + 1)); done
  if kill -0 "$1" 2>/dev/null; then kill -9 "$1" 2>/dev/null; wait "$1" 2>/dev/null; rc=124; return; fi
  wait "$1"; rc=$?
}

# started STEP NAME: waits (10 s at most) until rank 0 of run NAME has logged STEP training steps
started() {
  _n=0
  while [ "$(losses "$tmp/$2/metrics.jsonl" | wc -l)" -lt "$1" ] && [ $_n -lt 100 ]; do sleep 0.1; _n=$((_n + 1)); done
}

# start NAME RANK [options...]: starts rank RANK of 2 torchrun-style in the background, output
# in $tmp/NAME.rRANK, pid in pid_RANK; the port is $port. CWD (if set) is its working directory.
start() {
  _name=$1; _rank=$2; shift 2
  (cd "${CWD:-.}" && RANK=$_rank WORLD_SIZE=2 LOCAL_RANK=$_rank LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port exec "$BIN" $TINY "$@") >"$tmp/$_name.r$_rank" 2>&1 &
  eval "pid_$_rank=$!"
  pids="$pids $!"
}

# run2 NAME [options...]: both ranks to the end (30 s at most), on a random free port (another
# port when rank 0 could not listen); sets rc0 and rc1.
run2() {
  _name=$1; shift
  for _try in 1 2 3; do
    next_port
    start "$_name" 0 "$@"
    start "$_name" 1 "$@"
    wait_for "$pid_0" 30; rc0=$rc
    wait_for "$pid_1" 30; rc1=$rc
    grep -q 'cannot listen on port' "$tmp/$_name.r0" || return 0
  done
}

# run1 NAME [options...]: one process (no launcher variables), status in rc1p.
run1() {
  _name=$1; shift
  "$BIN" $TINY "$@" >"$tmp/$_name.out" 2>&1 &
  _p=$!; pids="$pids $_p"
  wait_for "$_p" 30; rc1p=$rc
}
