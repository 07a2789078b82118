# dp_sockets.sh: scripts/gpu.sh's areas `check dp-sockets` and `bench dp-sockets` (sourced by
# gpu.sh, whose step/part/run1/losses helpers and WORK, LOG_DIR, tables it uses).
#
# Two GPUs of one host made to talk as two nodes would: scripts/launch_mpirun_multinode.sh with a
# two-entry hostfile (`localhost slots=1`, `127.0.0.2 slots=1`: OpenMPI starts the second node's
# daemon through a stand-in for ssh that runs it here and gives it GPU 1), and NCCL's network
# transport: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo. For
# comparison, the same 2 GPUs over NVLink (scripts/launch_mpirun_node.sh 2) and 1 GPU. Where
# mpirun or an MPI build is missing, the ranks start torchrun-style instead (each its own "node":
# LOCAL_RANK 0, CUDA_VISIBLE_DEVICES its GPU), with the same NCCL settings.
#
# check dp-sockets: configs/tiny.json, 20 steps: the transport NCCL chose (NCCL_DEBUG=INFO);
#   2 GPUs over sockets against 1 GPU x 2 accumulation (plain, ZeRO-1), against NVLink and with
#   the overlap off, bit for bit; resume 2 -> 1 and 1 -> 2; SIGKILL of rank 1 under the launcher
#   and torchrun-style (the deadline, the collective named); SIGTERM to rank 1 (one checkpoint,
#   which resumes).
# bench dp-sockets: tokens/s of DP_CONFIG (paper_569m; or paper_1p67b, any configs/NAME) on 1 GPU,
#   2 GPUs over NVLink and 2 over sockets, train.overlap_comm on and off, ZeRO-1 over sockets
#   (overlap on), at DP_ACCUM's accumulations ("own small": the config's own batch_tokens; 2
#   micro-batches in all, one per GPU on 2). The table: scaling against 1 GPU, each setup's time
#   per step over the ideal (half of 1 GPU's), what the overlap recovers of it, the reduction's
#   bandwidth with the overlap off.

# DP_SOCKETS_DEVICE=cpu runs the same steps on the CPU backend (the host transport stands in for
# NCCL): test/cli_gpu_dp_sockets.sh drives the areas' control flow that way on machines without
# GPUs.
SOCKETS_ENV=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo)
DPN_DEVICE=${DP_SOCKETS_DEVICE:-gpu}

# The runs' options. check: DPN_TINY (configs/tiny.json, 20 steps; 1 GPU: micro-batch 4 x 2
# accumulation, 2 GPUs: 4 x 1) and DPN_LONG (added for the faults: runs until stopped, timeout 8 s).
dpn_check_args() {
  DPN_TINY=(--device "$DPN_DEVICE" --set train.micro_batch=4 --set train.batch_tokens=512 --set train.steps=20
    --set train.warmup_steps=2 --set eval.interval=10 --set eval.batches=2 --set eval.sample_interval=0
    --set log.interval=5 --set checkpoint.interval=10 --set checkpoint.keep=3 --set train.comm_timeout_s=60)
  [ "$DPN_DEVICE" = cpu ] && DPN_TINY+=(--set train.threads=1)  # two ranks share the host's cores
  DPN_LONG=(--set train.steps=1000000 --set checkpoint.interval=0 --set eval.interval=0 --set log.interval=1
    --set train.comm_timeout_s=8)
}
# bench: one line per run in DPN_RUNS, "NAME GPUS HOW OVERLAP ACCUM SKIP OPTIMIZER" (HOW: - nvlink
# sockets; OPTIMIZER plain or zero1),
# its options (%q-quoted, log.dir aside) in DPN_ARGS; DPN_CONFIG the config file
dpn_bench_runs() {
  local cfg=${DP_CONFIG:-paper_569m} a how o steps skip micro seq args
  DPN_CONFIG=configs/$cfg.json DPN_RUNS=() DPN_ARGS=() DPN_ERR=""
  [ -f "$DPN_CONFIG" ] || { DPN_ERR="DP_CONFIG=$cfg: no $DPN_CONFIG"; return 1; }
  read -r micro seq < <(python3 -c "
import json, sys; c = json.load(open(sys.argv[1]))
print(c.get('train', {}).get('micro_batch', 1), c['model']['seq_len'])" "$DPN_CONFIG") || {
    DPN_ERR="$DPN_CONFIG: cannot read train.micro_batch and model.seq_len"; return 1; }
  for a in ${DP_ACCUM:-own small}; do
    local set=(--device "$DPN_DEVICE" --set "data.train=data/austen/train_*.bin" --set "data.val=data/austen/val_*.bin"
      --set eval.interval=0 --set eval.batches=1 --set eval.sample_interval=0 --set log.interval=1
      --set checkpoint.interval=0 --set checkpoint.at_end=false --set train.warmup_steps=2 --set train.comm_timeout_s=300)
    case $a in  # own: the config's batch_tokens; small: 2 micro-batches in all
      own) steps=4 skip=2 ;;
      small) steps=10 skip=4 set+=(--set train.batch_tokens=$((2 * micro * seq))) ;;
      *) DPN_ERR="DP_ACCUM: '$a' is not own or small"; return 1 ;;
    esac
    set+=(--set train.steps=$steps)
    [ "$DPN_DEVICE" = cpu ] && set+=(--set train.threads=1)
    DPN_RUNS+=("${a}_1gpu 1 - - $a $skip plain") DPN_ARGS+=("$(printf '%q ' "${set[@]}")")
    for how in nvlink sockets; do
      for o in true false; do
        DPN_RUNS+=("${a}_${how}_o$o 2 $how $o $a $skip plain")
        DPN_ARGS+=("$(printf '%q ' "${set[@]}" --set train.overlap_comm=$o)")
      done
    done
    # ZeRO-1 sends less over a slow link: for 2 ranks half the FP32 gradients (the reductions to
    # their owners, overlapped) and, after the step, half the BF16 weights
    DPN_RUNS+=("${a}_sockets_zero1 2 sockets true $a $skip zero1")
    DPN_ARGS+=("$(printf '%q ' "${set[@]}" --set train.overlap_comm=true --set train.zero1=true)")
  done
}
# dpn_plan AREA: the --dry-run lines, every training command in full
dpn_plan() {
  local i w
  if [ "$1" = check ]; then
    dpn_check_args
    echo "tiny, 20 steps: 1 GPU x 2 accumulation; 2 GPUs over sockets (launch_mpirun_multinode.sh, a two-entry"
    echo "hostfile, ${SOCKETS_ENV[*]}; NCCL_DEBUG=INFO: the transport) plain, ZeRO-1, overlap off; over NVLink"
    echo "(launch_mpirun_node.sh 2); resume 2 -> 1 and 1 -> 2 from step 10; SIGKILL of rank 1 (the launcher, and"
    echo "torchrun-style), SIGTERM to rank 1 and its checkpoint resumed; the runs:"
    echo "./train_gpt --config configs/tiny.json $(printf '%q ' "${DPN_TINY[@]}")"
    echo "./train_gpt --config configs/tiny.json $(printf '%q ' "${DPN_TINY[@]}" "${DPN_LONG[@]}")"
    return
  fi
  dpn_bench_runs || return
  for i in "${!DPN_RUNS[@]}"; do
    read -ra w <<<"${DPN_RUNS[$i]}"
    echo "${w[0]} ($([ "${w[1]}" = 1 ] && echo "1 GPU" || echo "2 GPUs over ${w[2]}, ${w[6]}")): ./train_gpt --config $DPN_CONFIG ${DPN_ARGS[$i]}"
  done
  echo "then the table: tok/s, scaling against 1 GPU, time over the ideal step, what the overlap recovers"
}

# dpn_setup: the hostfile, the stand-in for ssh, and how ranks start here (DPN_LAUNCH mpi or env)
dpn_setup() {
  printf 'localhost slots=1\n127.0.0.2 slots=1\n' >"$WORK/hosts"
  cat >"$WORK/agent" <<'EOF'
#!/bin/sh
# OpenMPI calls this as `AGENT [options] HOST COMMAND...` to start a node's daemon: HOST's GPU
# is 1 (the node mpirun runs on, localhost, keeps GPU 0), the daemon runs here.
while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done
[ "$1" = 127.0.0.2 ] && export CUDA_VISIBLE_DEVICES=1
shift
exec sh -c "$*"
EOF
  chmod +x "$WORK/agent"
  DPN_LAUNCH=env
  command -v mpirun >/dev/null && ldd ./train_gpt 2>/dev/null | grep -q libmpi && DPN_LAUNCH=mpi
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
  echo "   2-rank runs start with the $DPN_LAUNCH launcher$([ $DPN_LAUNCH = mpi ] && echo ': launch_mpirun_multinode.sh (sockets), launch_mpirun_node.sh (NVLink)')"
}

# dpn_env HOW LIMIT CONFIG [options...]: both ranks torchrun-style, to the end; the worst status
dpn_env() {
  local how=$1 lim=$2 config=$3 r p worst=0 pids=() port=$((20000 + RANDOM % 30000))
  shift 3
  for r in 0 1; do
    if [ "$how" = sockets ]; then  # two "nodes": each rank alone on its node, with its own GPU
      env "${SOCKETS_ENV[@]}" RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 CUDA_VISIBLE_DEVICES=$r \
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout -k 10 "$lim" ./train_gpt --config "$config" "$@" &
    else
      env -u CUDA_VISIBLE_DEVICES RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=$port timeout -k 10 "$lim" ./train_gpt --config "$config" "$@" &
    fi
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { r=$?; [ $r -gt $worst ] && worst=$r; }; done
  return $worst
}

# dpn_run NAME HOW LIMIT CONFIG [options...]: 2 ranks, HOW sockets or nvlink, output in
# $WORK/NAME.out; to the end (status rc), or with BG=1 in the background (its pid in dpn_pid)
dpn_run() {
  local name=$1 how=$2 lim=$3 config=$4
  shift 4
  [ "$lim" -gt 0 ] || { rc=$NOT_RUN; return; }
  local cmd=(dpn_env "$how" "$lim" "$config" "$@")
  if [ "$DPN_LAUNCH" = mpi ] && [ "$how" = sockets ]; then
    cmd=(timeout -k 10 "$lim" env -u HOSTS -u GPUS_PER_NODE "${SOCKETS_ENV[@]}" CUDA_VISIBLE_DEVICES=0
      HOSTFILE="$WORK/hosts" OMPI_MCA_plm_rsh_agent="$WORK/agent" MPI_IFACE=lo
      bash scripts/launch_mpirun_multinode.sh "$config" "$@")
  elif [ "$DPN_LAUNCH" = mpi ]; then
    cmd=(timeout -k 10 "$lim" env -u CUDA_VISIBLE_DEVICES bash scripts/launch_mpirun_node.sh 2 "$config" "$@")
  fi
  echo "2 ranks ($how, $DPN_LAUNCH launcher): $(printf '%q ' "${cmd[@]}")" >>"$LOG_DIR/commands.log"
  if [ "${BG:-0}" = 1 ]; then
    "${cmd[@]}" >"$WORK/$name.out" 2>&1 &
    dpn_pid=$!
    bg_pids="$bg_pids $dpn_pid"
    return
  fi
  "${cmd[@]}" >"$WORK/$name.out" 2>&1
  rc=$?
}

# rank1_pid NAME: the pid of train_gpt's rank 1 in run NAME (log.dir $WORK/NAME), either launcher
rank1_pid() {
  local d p
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$(cat "$d/comm" 2>/dev/null)" = train_gpt ] || continue
    tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -q "log.dir=$WORK/$1 " || continue
    tr '\0' '\n' <"$d/environ" 2>/dev/null | grep -qxE 'OMPI_COMM_WORLD_RANK=1|RANK=1' && { echo "$p"; return; }
  done
}

# dpn_wait_steps NAME N: waits (120 s at most) until run NAME has logged N steps
dpn_wait_steps() {
  local n=0
  while [ "$(losses "$WORK/$1/metrics.jsonl" | wc -l)" -lt "$2" ] && [ $n -lt 1200 ] && kill -0 "$dpn_pid" 2>/dev/null; do
    sleep 0.1; n=$((n + 1))
  done
}

# dpn_end LIMIT: waits for the background run at most LIMIT seconds (then kills it); rc, t_end
# (seconds since t0), t_err (until the first "train_gpt: error" line of $out, or "none")
dpn_end() {
  local n=0
  t_err=none
  while kill -0 "$dpn_pid" 2>/dev/null && [ $n -lt $(($1 * 20)) ]; do
    [ "$t_err" = none ] && grep -q 'train_gpt: error' "$out" 2>/dev/null &&
      t_err=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    sleep 0.05; n=$((n + 1))
  done
  if kill -0 "$dpn_pid" 2>/dev/null; then  # its children first: `timeout` ends mpirun's job, or a rank
    pkill -TERM -P "$dpn_pid"
    kill "$dpn_pid"
    wait "$dpn_pid" 2>/dev/null
    rc=124
  else
    wait "$dpn_pid"
    rc=$?
  fi
  reaped "$dpn_pid"
  t_end=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  [ "$t_err" = none ] && grep -q 'train_gpt: error' "$out" 2>/dev/null && t_err="<$t_end"
}

# dpn_one NAME LIMIT [options...]: gpu.sh's run1 (1 GPU, log $WORK/NAME.r0), the command logged
dpn_one() {
  echo "1 rank: ./train_gpt $(printf '%q ' "${@:3}")" >>"$LOG_DIR/commands.log"
  run1 "$@"
}

check_dp_sockets() {
  dpn_setup
  dpn_check_args
  local C=configs/tiny.json tol=1e-2 TINY=("${DPN_TINY[@]}")
  # the transports: NCCL's own account of its connections
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET dpn_run sock sockets "$(limit 150)" $C "${TINY[@]}" --set "log.dir=$WORK/sock"
  local r_sock=$rc
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET dpn_run nvl nvlink "$(limit 150)" $C "${TINY[@]}" --set "log.dir=$WORK/nvl"
  local r_nvl=$rc
  local via_s via_n
  via_s=$(grep -o 'via [A-Za-z0-9/]*' "$WORK/sock.out" | sort | uniq -c | sort -rn | head -3 | tr -s ' ' | tr '\n' ';')
  via_n=$(grep -o 'via [A-Za-z0-9/]*' "$WORK/nvl.out" | sort | uniq -c | sort -rn | head -3 | tr -s ' ' | tr '\n' ';')
  part "sockets: NCCL connects the ranks via NET/Socket only" \
    "$( [ $r_sock = 0 ] && grep -q 'via NET/Socket' "$WORK/sock.out" && ! grep -qE 'via (P2P|SHM)' "$WORK/sock.out" && echo PASS || echo FAIL)" \
    "exit $r_sock; NCCL_DEBUG=INFO: ${via_s:-no 'via' lines}"
  part "NVLink: NCCL connects the ranks via P2P" \
    "$( [ $r_nvl = 0 ] && grep -q 'via P2P' "$WORK/nvl.out" && echo PASS || echo FAIL)" "exit $r_nvl; ${via_n:-no 'via' lines}"
  # 1 GPU x 4 x 2 accumulation against 2 GPUs x 4 over sockets, plain and ZeRO-1, overlap off
  dpn_one one "$(limit 150)" --config $C "${TINY[@]}" --set "log.dir=$WORK/one"
  local r_one=$rc
  dpn_run sockz sockets "$(limit 150)" $C "${TINY[@]}" --zero1 --set "log.dir=$WORK/sockz"
  local r_z=$rc
  dpn_run socko sockets "$(limit 150)" $C "${TINY[@]}" --set train.overlap_comm=false --set "log.dir=$WORK/socko"
  local name a b r d n bits f t
  for f in one sock sockz socko nvl; do losses "$WORK/$f/metrics.jsonl" >"$WORK/l_$f"; done
  for t in "plain:l_sock:$r_sock" "ZeRO-1:l_sockz:$r_z"; do
    IFS=: read -r name a r <<<"$t"
    n=$(wc -l <"$WORK/$a") d=$(maxdiff "$WORK/l_one" "$WORK/$a") bits=no
    cmp -s "$WORK/l_one" "$WORK/$a" && bits=yes
    part "sockets: 2 GPUs x 4 vs 1 GPU x 4 x 2 accumulation, $name" \
      "$( [ "$r_one$r" = 00 ] && [ "$n" -eq 20 ] && lt "$d" $tol && echo PASS || echo FAIL)" \
      "bit for bit: $bits; max |dloss| $d over $n of 20 steps (tol $tol; exits $r_one, $r)"
  done
  for t in "sockets vs NVLink, plain:l_sock:l_nvl" "sockets, overlap_comm off vs on:l_sock:l_socko" \
           "sockets, ZeRO-1 vs plain:l_sock:l_sockz"; do
    IFS=: read -r name a b <<<"$t"
    part "$name: bit for bit" "$( [ "$(wc -l <"$WORK/$b")" -eq 20 ] && cmp -s "$WORK/$a" "$WORK/$b" && echo PASS || echo FAIL)" \
      "max |dloss| $(maxdiff "$WORK/$a" "$WORK/$b") over $(wc -l <"$WORK/$b") of 20 steps"
  done
  # resume from the step-10 checkpoints: sockets (ZeRO-1) -> 1 GPU, 1 GPU -> sockets (ZeRO-1)
  dpn_one to1 "$(limit 150)" --config $C "${TINY[@]}" --set "log.dir=$WORK/to1" --resume "$WORK/sockz/checkpoints/step_000010.ckpt"
  local r_to1=$rc
  dpn_run to2 sockets "$(limit 150)" $C "${TINY[@]}" --zero1 --set "log.dir=$WORK/to2" \
    --resume "$WORK/one/checkpoints/step_000010.ckpt"
  local r_to2=$rc eq
  losses "$WORK/to1/metrics.jsonl" >"$WORK/lr1"
  losses "$WORK/to2/metrics.jsonl" >"$WORK/lr2"
  for t in "2 GPUs over sockets (ZeRO-1) -> 1 GPU:lr1:l_sockz:$r_to1" "1 GPU -> 2 GPUs over sockets (ZeRO-1):lr2:l_one:$r_to2"; do
    IFS=: read -r name a b r <<<"$t"
    n=$(wc -l <"$WORK/$a") d=$(maxdiff "$WORK/$b" "$WORK/$a") bits=no eq=no
    [ -n "$(head -1 "$WORK/$a")" ] && [ "$(head -1 "$WORK/$a")" = "$(sed -n 11p "$WORK/$b")" ] && eq=yes
    [ "$n" -eq 10 ] && [ "$(cat "$WORK/$a")" = "$(sed -n '11,20p' "$WORK/$b")" ] && bits=yes
    part "resume at step 10, $name" \
      "$( [ "$r" = 0 ] && [ "$n" -eq 10 ] && [ $eq = yes ] && lt "$d" $tol && echo PASS || echo FAIL)" \
      "exit $r, $n of 10 steps, step 11 as in the source run: $eq, steps 11-20 bit for bit: $bits, max |dloss| $d"
  done
  # faults, comm timeout 8 s. SIGKILL of rank 1: the job must end within the timeout (under
  # mpirun: plus OpenMPI's teardown, ~3 s), non-zero; torchrun-style, rank 0 itself must stop
  # in time and name the collective. SIGTERM to rank 1: one checkpoint, resumed.
  local LONG=("${TINY[@]}" "${DPN_LONG[@]}") how victim last err first launchers=("$DPN_LAUNCH")
  [ "$DPN_LAUNCH" = mpi ] && launchers+=(env)
  for how in "${launchers[@]}"; do
    name=kill_$how
    DPN_LAUNCH=$how BG=1 dpn_run $name sockets "$(limit 120)" $C "${LONG[@]}" --set "log.dir=$WORK/$name"
    out=$WORK/$name.out
    dpn_wait_steps $name 5
    n=$(losses "$WORK/$name/metrics.jsonl" | wc -l)
    victim=$(rank1_pid $name)
    [ -n "$victim" ] && kill -9 "$victim"
    t0=$(date +%s.%N)
    dpn_end 40
    err=$(grep -h 'train_gpt: error' "$out" | head -1 | sed 's/^train_gpt: error: //' | cut -c1-120)
    part "SIGKILL of rank 1 after step $n ($how launcher, sockets, timeout 8 s)" \
      "$( [ -n "$victim" ] && [ "$n" -ge 5 ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && lt "$t_end" $([ $how = mpi ] && echo 12 || echo 10) &&
          { [ $how = mpi ] || [ -n "$err" ]; } && echo PASS || echo FAIL)" \
      "job ended after $t_end s, status $rc; rank 0's error after $t_err s: ${err:-none}"
  done
  # (Not SIGTERM to mpirun itself: OpenMPI kills the ranks 1 s after it, enough to write the tiny
  # model's checkpoint or not; test/cli_mpirun.sh shows it on a smaller model.)
  name=term
  BG=1 dpn_run $name sockets "$(limit 120)" $C "${LONG[@]}" --set "log.dir=$WORK/$name"
  out=$WORK/$name.out
  dpn_wait_steps $name 5
  victim=$(rank1_pid $name)
  [ -n "$victim" ] && kill -TERM "$victim"
  t0=$(date +%s.%N)
  dpn_end 60
  last=$(ls "$WORK/$name/checkpoints" 2>/dev/null | sed -n 's/^step_0*\([0-9][0-9]*\)\.ckpt$/\1/p')
  part "SIGTERM to rank 1 (sockets): every rank stops after the same step, one checkpoint, exit 0" \
    "$( [ -n "$victim" ] && [ $rc -eq 0 ] && [ "$(echo "$last" | grep -c .)" -eq 1 ] && grep -q 'checkpoint written' "$out" && echo PASS || echo FAIL)" \
    "status $rc after $t_end s, checkpoint of step ${last:-none}; $(grep -h '^stopped' "$out" | head -1 | cut -c1-90)"
  if [ -n "$last" ]; then
    dpn_run resumed sockets "$(limit 120)" $C "${LONG[@]}" --set "log.dir=$WORK/$name" --resume --stop-after $((last + 3))
    first=$(losses "$WORK/$name/metrics.jsonl" | awk -v l="$last" '$1 > l {print $1; exit}')
    part "its checkpoint resumes over sockets (steps $((last + 1))..$((last + 3)))" \
      "$( [ $rc -eq 0 ] && [ "$first" = $((last + 1)) ] && echo PASS || echo FAIL)" "exit $rc, first step after it: ${first:-none}"
  fi
  for f in "$WORK"/*.out "$WORK"/*.r0; do  # every run's output, for the log
    [ -s "$f" ] && { echo "===== $(basename "$f")"; grep -v '^step [0-9]*/[0-9]* | loss' "$f" | head -60; }
  done >"$LOG_DIR/runs.log" 2>&1
}

bench_dp_sockets() {
  dpn_bench_runs || { part "the runs" FAIL "$DPN_ERR"; return; }
  build 420 train_gpt || return
  dpn_setup
  local i name gpus how o a skip opt tok bt m params="" args
  : >"$WORK/dpn.tsv"
  for i in "${!DPN_RUNS[@]}"; do
    read -r name gpus how o a skip opt <<<"${DPN_RUNS[$i]}"
    eval "args=(${DPN_ARGS[$i]})"
    if [ "$gpus" = 1 ]; then
      dpn_one "$name" "$(limit 300)" --config "$DPN_CONFIG" "${args[@]}" --set "log.dir=$WORK/$name"
      cp "$WORK/$name.r0" "$WORK/$name.out" 2>/dev/null
    else
      dpn_run "$name" "$how" "$(limit 300)" "$DPN_CONFIG" "${args[@]}" --set "log.dir=$WORK/$name"
    fi
    cp "$WORK/$name.out" "$LOG_DIR/$name.log" 2>/dev/null
    [ -n "$params" ] || params=$(grep -o 'model: [0-9.]*M parameters' "$WORK/$name.out" | grep -o '[0-9.]*' | head -1)
    bt=$(grep -o '= [0-9]* tokens/step' "$WORK/$name.out" | grep -o '[0-9]*' | head -1)
    m=$(grep -o 'x [0-9]* accumulation' "$WORK/$name.out" | grep -o '[0-9]*' | head -1)
    tok=$(median_tok "$WORK/$name/metrics.jsonl" "$skip")
    tok=${tok% *}
    part "$(basename "$DPN_CONFIG" .json), $a accumulation (${m:-?} per GPU), $([ "$gpus" = 1 ] && echo "1 GPU" ||
      echo "2 GPUs over $how, $opt, overlap_comm $o")" \
      "$(verdict $rc)" "$tok tok/s ($(note $rc))"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$a" "${m:-0}" "$gpus" "$how" "$o" "${tok:-0}" "${bt:-0}" "$opt" >>"$WORK/dpn.tsv"
  done
  python3 - "$WORK/dpn.tsv" "$(basename "$DPN_CONFIG" .json)" "${params:-0}" "$DPN_LAUNCH" >"$LOG_DIR/table_dp_sockets.log" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
cfg, params, launch = sys.argv[2], float(sys.argv[3] or 0) * 1e6, sys.argv[4]
one = {r[0]: float(r[5]) for r in rows if r[2] == "1" and float(r[5]) > 0}  # 1 GPU's tok/s per accumulation
over = {}
print("| config | accumulation | micro-batches per GPU | GPUs | transport | optimizer | overlap | tok/s | vs 1 GPU | s/step | over ideal |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for a, m, g, how, o, tok, bt, opt in rows:
    tok, bt, t1 = float(tok), float(bt), one.get(a)
    s = bt / tok if tok > 0 and bt > 0 else None
    vs = "%.3fx" % (tok / t1) if t1 and tok > 0 else "n/a"
    extra = ""
    if g == "2" and s and t1:
        over[(a, how, o, opt)] = s - bt / t1 / 2  # the ideal: half of 1 GPU's time for the same tokens
        extra = "%.0f ms" % (1000 * over[(a, how, o, opt)])
    print("| %s | %s | %s | %s | %s | %s | %s | %.0f | %s | %s | %s |" % (cfg, a, m, g, how, opt if g == "2" else "-",
          o, tok, vs, "%.3f" % s if s else "n/a", extra))
print()
for a in dict.fromkeys(r[0] for r in rows):
    for how in ("nvlink", "sockets"):
        on, off = over.get((a, how, "true", "plain")), over.get((a, how, "false", "plain"))
        if on is None or off is None:
            continue
        bw = ("; the reduction alone (overlap off) moves the %.2f GB of FP32 gradients at %.1f GB/s" %
              (4 * params / 1e9, 4 * params / off / 1e9)) if params and off > 0 else ""
        print("%s accumulation over %s: %.0f ms over the ideal step with the overlap off, %.0f ms with it on: "
              "the overlap recovers %.0f ms (%.0f%%)%s" % (a, how, 1000 * off, 1000 * on, 1000 * (off - on),
              100 * (off - on) / off if off > 0 else 0, bw))
    z, on = over.get((a, "sockets", "true", "zero1")), over.get((a, "sockets", "true", "plain"))
    if z is not None and on is not None:
        print("%s accumulation over sockets, overlap on: ZeRO-1 %.0f ms over the ideal step, plain %.0f ms"
              % (a, 1000 * z, 1000 * on))
print("%s (%.0fM parameters) on data/austen; ideal step: half of 1 GPU's time for the same tokens; median tok/s "
      "after the first steps (own: 4 steps, median of 3-4; small: 10 steps, median of 5-10); sockets: "
      "launch_mpirun_multinode.sh with a two-entry hostfile, NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "
      "NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo (%s launcher)" % (cfg, params / 1e6, launch))
EOF
  tables+=("$LOG_DIR/table_dp_sockets.log")
}
