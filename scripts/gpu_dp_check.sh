#!/bin/bash
# gpu_dp_check.sh: data parallelism and ZeRO-1 on a machine with 2 GPUs, in one call (about 4 min):
#   0. build train_gpt, test_zero1_gpu and test_comm; run test_zero1_gpu (ZeRO-1's slice step
#      against the full step, simulated ranks on one GPU) and test_comm (NCCL between 2 GPUs);
#   1. equivalence, tiny config, 20 steps: 1 GPU x micro-batch 4 x 2 accumulation against 2 GPUs x
#      micro-batch 4, plain DP and ZeRO-1: the largest loss difference of each, and ZeRO-1 vs plain;
#   2. resume with ZeRO-1 from the step-10 checkpoints: 2 -> 1 (the ZeRO-1 run's, on 1 GPU) and
#      1 -> 2 (the 1-GPU run's, on 2 GPUs with ZeRO-1): step 11 as in the source run, steps
#      11..20 within the tolerance;
#      The 2-GPU runs reduce the gradients during the backward (train.overlap_comm, the default);
#      the same runs with it off must give the same losses bit for bit: plain DP (1 micro-step
#      per rank, 20 steps) and ZeRO-1 with 2 micro-steps per rank (10 steps of 1024 tokens);
#   3. a killed rank (ZeRO-1, comm timeout 4 s): SIGKILL to rank 1; rank 0 must exit non-zero
#      within 4 + 3 s, naming the collective;
#   4. scaling, configs/paper_569m.json on the Austen shards, 6 steps of 131072 tokens: tokens/s of
#      2 GPUs (plain and ZeRO-1, each with train.overlap_comm on and off) over 1 GPU at the same
#      global batch (median of steps 3..6, target >= 1.9; on vs off in the same table);
#      ZeRO-1's printed per-GPU memory plan equals --dry-run --world-size 2 --zero1's;
#   5. a summary table, last.
# 2-GPU runs start under mpirun (--allow-run-as-root as root, --bind-to none) when train_gpt is
# built with MPI and mpirun exists, else torchrun-style (LAUNCH=mpi|env forces one). The killed
# rank drill is always torchrun-style: under mpirun, mpirun itself ends every rank when one dies.
# Logs: $OUT (default /tmp/gpu_dp_out): build.log, tests.log, runs.log, summary.txt. Run
# directories in $WORK (/dev/shm when it has room for the 569M checkpoints, else /tmp), removed.
#   usage (device tool, kind nvidia-h200-x2, carry [".deps"]): bash scripts/gpu_dp_check.sh
set -u
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0  # NVLink multicast off: mandatory on the lent machines
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
OUT=${OUT:-/tmp/gpu_dp_out}
mkdir -p "$OUT"
shm_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
if [ "${shm_kb:-0}" -gt 30000000 ]; then WORK=${WORK:-/dev/shm/gpu_dp_check}; else WORK=${WORK:-/tmp/gpu_dp_check}; fi
rm -rf "$WORK" && mkdir -p "$WORK"
pids=""
cleanup() {
  for p in $pids; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
. scripts/gpu_lib.sh  # t_start, elapsed, CJ
S=$OUT/summary.txt
: >"$S"
row() { printf '%-52s %s\n' "$1" "$2" >>"$S"; }  # a line of the summary table
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

echo "== 0. build ($(elapsed) s)"
timeout 280 make -j32 SETUP=0 $CJ train_gpt build/tests/test_zero1_gpu build/tests/test_comm >"$OUT/build.log" 2>&1
brc=$?
grep -E "error" "$OUT/build.log" | head -10
echo "build exit $brc after $(elapsed) s"
if [ ! -x ./train_gpt ]; then tail -20 "$OUT/build.log"; echo "no train_gpt: stopping"; exit 1; fi
: >"$OUT/tests.log"
for t in test_zero1_gpu test_comm; do
  if [ -x build/tests/$t ]; then
    timeout 120 build/tests/$t >"$WORK/$t.log" 2>&1
    trc=$?
    cat "$WORK/$t.log" >>"$OUT/tests.log"
    row "$t" "$(grep -c '^ok - ' "$WORK/$t.log") ok, $(grep -c '^FAIL' "$WORK/$t.log") FAIL (exit $trc)"
    grep -E '^FAIL|^skipped|^# (P =|dead)' "$WORK/$t.log" | head -5
  else
    row "$t" "not built"
  fi
done

if [ -z "${LAUNCH:-}" ]; then
  LAUNCH=env
  command -v mpirun >/dev/null && ldd ./train_gpt 2>/dev/null | grep -q libmpi && LAUNCH=mpi
fi
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)  # OpenMPI refuses root without it
echo "2-GPU runs start with the $LAUNCH launcher"

# run1 NAME LIMIT [options...]: one process; log $WORK/NAME.r0, status rc1.
run1() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" ./train_gpt "$@" >"$WORK/$name.r0" 2>&1
  rc1=$?
}
# run2 NAME LIMIT [options...]: 2 ranks; logs $WORK/NAME.r0 and .r1, status rc2 (the worse).
run2() {
  local name=$1 limit=$2
  shift 2
  if [ "$LAUNCH" = mpi ]; then
    timeout "$limit" mpirun -np 2 --bind-to none "${root[@]}" -x NCCL_NVLS_ENABLE -x NCCL_DEBUG \
      sh -c 'exec "$0" "$@" >"'"$WORK/$name"'.r${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" 2>&1' ./train_gpt "$@" \
      >"$WORK/$name.mpirun" 2>&1
    rc2=$?
  else
    local port=$((20000 + RANDOM % 30000)) a b p0 p1
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        timeout "$limit" ./train_gpt "$@" >"$WORK/$name.r$r" 2>&1 &
      eval "p$r=$!"
    done
    wait "$p0"; a=$?
    wait "$p1"; b=$?
    rc2=$((a > b ? a : b))
  fi
}
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1" 2>/dev/null; }
# maxdiff A B: max |loss difference| over the steps both files have
maxdiff() {
  awk 'NR == FNR {a[$1] = $2; next} ($1 in a) {d = a[$1] - $2; if (d < 0) d = -d; if (d > m) m = d; n++}
       END {printf "%.3g", m + 0}' "$1" "$2"
}
lt() { awk -v a="$1" -v b="$2" 'BEGIN {exit !(a < b)}'; }
verdict() { if "$@"; then echo PASS; else echo FAIL; fi; }
TOL=1e-2  # loss tolerance between runs that differ only in FP32 summation order

echo "== 1. equivalence: tiny, 20 steps ($(elapsed) s)"
TINY=(--config configs/tiny.json --device gpu --set train.micro_batch=4 --set train.batch_tokens=512
  --set train.steps=20 --set train.warmup_steps=2 --set eval.interval=10 --set eval.batches=2
  --set eval.sample_interval=0 --set log.interval=5 --set checkpoint.interval=10 --set checkpoint.keep=3
  --set train.comm_timeout_s=30)
run1 one 120 "${TINY[@]}" --set "log.dir=$WORK/one"
echo "1 GPU x 2 accumulation: exit $rc1"
run2 dp 150 "${TINY[@]}" --set "log.dir=$WORK/dp"
echo "2 GPUs plain: exit $rc2"
run2 z1 150 "${TINY[@]}" --zero1 --set "log.dir=$WORK/z1"
echo "2 GPUs ZeRO-1: exit $rc2; $(grep -o 'ZeRO-1 on[^|]*' "$WORK/z1.r0" | head -1)"
grep -h -E "train_gpt: error|FATAL" "$WORK"/one.r0 "$WORK"/dp.r* "$WORK"/z1.r* | head -4
losses "$WORK/one/metrics.jsonl" >"$WORK/l1"
losses "$WORK/dp/metrics.jsonl" >"$WORK/l2"
losses "$WORK/z1/metrics.jsonl" >"$WORK/lz"
n1=$(wc -l <"$WORK/l1"); n2=$(wc -l <"$WORK/l2"); nz=$(wc -l <"$WORK/lz")
d_dp=$(maxdiff "$WORK/l1" "$WORK/l2"); d_z=$(maxdiff "$WORK/l1" "$WORK/lz"); d_zp=$(maxdiff "$WORK/l2" "$WORK/lz")
ok20() { [ "$1" -eq 20 ] && lt "$2" $TOL; }
row "2 GPUs x 4 vs 1 GPU x 4 x 2 accum, plain (20 steps)" \
  "max |dloss| $d_dp over $n2 steps: $(verdict ok20 "$n2" "$d_dp") (tol $TOL)"
row "2 GPUs x 4 vs 1 GPU x 4 x 2 accum, ZeRO-1 (20 steps)" \
  "max |dloss| $d_z over $nz steps: $(verdict ok20 "$nz" "$d_z") (tol $TOL)"
same=no; [ "$n2" -eq 20 ] && cmp -s "$WORK/l2" "$WORK/lz" && same="yes, bit for bit"
row "ZeRO-1 vs plain DP, 2 GPUs" "max |dloss| $d_zp; identical: $same"
sed -n 1,3p "$WORK/l1" | paste -sd' '; sed -n 1,3p "$WORK/lz" | paste -sd' '
grep -h -o 'overlap [^|]*' "$WORK/dp.r0" | head -1
# train.overlap_comm off against on: the same sums, so the same losses bit for bit.
SHORT=(--set train.steps=10 --set checkpoint.interval=0 --set eval.interval=5)
run2 dpo 150 "${TINY[@]}" --set checkpoint.interval=0 --set train.overlap_comm=false --set "log.dir=$WORK/dpo"
losses "$WORK/dpo/metrics.jsonl" >"$WORK/lo"
run2 za 150 "${TINY[@]}" "${SHORT[@]}" --zero1 --set train.batch_tokens=1024 --set "log.dir=$WORK/za"
losses "$WORK/za/metrics.jsonl" >"$WORK/lza"
run2 zao 150 "${TINY[@]}" "${SHORT[@]}" --zero1 --set train.batch_tokens=1024 --set train.overlap_comm=false \
  --set "log.dir=$WORK/zao"
losses "$WORK/zao/metrics.jsonl" >"$WORK/lzao"
grep -h -E "train_gpt: error|FATAL" "$WORK"/dpo.r* "$WORK"/za.r* "$WORK"/zao.r* | head -4
bits_row() {  # label, losses on, losses off, steps
  local n same=no
  n=$(wc -l <"$3")
  [ "$n" -eq "$4" ] && cmp -s "$2" "$3" && same=yes
  row "$1" "max |dloss| $(maxdiff "$2" "$3") over $n steps; bit for bit: $same: $(verdict [ $same = yes ])"
}
bits_row "overlap off vs on, plain, 1 micro-step/rank" "$WORK/l2" "$WORK/lo" 20
bits_row "overlap off vs on, ZeRO-1, 2 micro-steps/rank" "$WORK/lza" "$WORK/lzao" 10

echo "== 2. resume with ZeRO-1 ($(elapsed) s)"
run1 to1 120 "${TINY[@]}" --set "log.dir=$WORK/to1" --resume "$WORK/z1/checkpoints/step_000010.ckpt"
losses "$WORK/to1/metrics.jsonl" >"$WORK/lr1"
run2 to2 150 "${TINY[@]}" --zero1 --set "log.dir=$WORK/to2" --resume "$WORK/one/checkpoints/step_000010.ckpt"
losses "$WORK/to2/metrics.jsonl" >"$WORK/lr2"
grep -h -E "train_gpt: error|FATAL" "$WORK"/to1.r0 "$WORK"/to2.r* | head -4
resume_row() {  # label, resumed losses, source losses, exit status
  local n first want d
  n=$(wc -l <"$2"); first=$(head -1 "$2"); want=$(sed -n 11p "$3"); d=$(maxdiff "$3" "$2")
  local eq=no; [ -n "$first" ] && [ "$first" = "$want" ] && eq=yes
  row "$1" "exit $4, $n steps; step 11 equal: $eq; max |dloss| $d: $(verdict eval "[ $n -eq 10 ] && [ $eq = yes ] && lt $d $TOL")"
}
resume_row "resume 2 (ZeRO-1) -> 1 GPU at step 10" "$WORK/lr1" "$WORK/lz" "$rc1"
resume_row "resume 1 GPU -> 2 (ZeRO-1) at step 10" "$WORK/lr2" "$WORK/l1" "$rc2"

echo "== 3. killed rank, ZeRO-1, timeout 4 s ($(elapsed) s)"
# wait_for PID SECONDS: waits for PID at most SECONDS (then kills it); status in rc (124: timeout).
wait_for() {
  local n=0
  while kill -0 "$1" 2>/dev/null && [ $n -lt $(($2 * 10)) ]; do sleep 0.1; n=$((n + 1)); done
  if kill -0 "$1" 2>/dev/null; then kill -9 "$1" 2>/dev/null; wait "$1" 2>/dev/null; rc=124; return; fi
  wait "$1"; rc=$?
}
port=$((20000 + RANDOM % 30000))
for r in 0 1; do  # no `timeout` wrapper: the pids must be train_gpt's own
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    ./train_gpt "${TINY[@]}" --zero1 --set train.steps=1000000 --set checkpoint.interval=0 --set eval.interval=0 \
    --set train.comm_timeout_s=4 --set "log.dir=$WORK/dead" >"$WORK/dead.r$r" 2>&1 &
  eval "d$r=$!"
  pids="$pids $!"
done
n=0
while [ "$(losses "$WORK/dead/metrics.jsonl" | wc -l)" -lt 5 ] && [ $n -lt 600 ] && kill -0 "$d0" 2>/dev/null; do
  sleep 0.1; n=$((n + 1))
done
before=$(losses "$WORK/dead/metrics.jsonl" | wc -l)  # steps rank 0 took before the kill
disown "$d1"  # no "Killed" line from bash
kill -9 "$d1"
t0=$(date +%s.%N)
wait_for "$d0" 30
dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
msg=$(grep -h "train_gpt: error" "$WORK/dead.r0" | tail -1 | cut -c1-160)
[ -n "$msg" ] || msg=$(grep -h -i "error\|abort" "$WORK/dead.r0" | tail -1 | cut -c1-160)
echo "rank 0: exit $rc after $dt s: $msg"
row "killed rank 1 after step $before (ZeRO-1, timeout 4 s)" \
  "rank 0 exit $rc after $dt s: $(verdict eval "[ $before -ge 5 ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && lt $dt 7")"
row "  rank 0 said" "$(echo "$msg" | sed 's/^train_gpt: error: //' | cut -c1-110)"

echo "== 4. scaling: paper_569m, 6 steps of 131072 tokens ($(elapsed) s)"
SCALE=(--config configs/paper_569m.json --device gpu --set "data.train=data/austen/train_*.bin"
  --set "data.val=data/austen/val_*.bin" --set train.steps=6 --set train.warmup_steps=2 --set train.batch_tokens=131072
  --set eval.interval=0 --set eval.batches=1 --set eval.sample_interval=0 --set log.interval=1
  --set checkpoint.keep=1 --set train.comm_timeout_s=120)
# median tokens/s of steps 3..6 (the first two warm up cuBLASLt and NCCL)
toks() { sed -n 's/^{"step": \([0-9]*\),.*"tokens_per_s": \([0-9.]*\).*/\1 \2/p' "$1" 2>/dev/null |
  awk '$1 >= 3 {print $2}' | sort -g | awk '{a[NR] = $1} END {if (NR) printf "%.0f", (a[int((NR + 1) / 2)] + a[int(NR / 2) + 1]) / 2; else print 0}'; }
run1 s1 200 "${SCALE[@]}" --set "log.dir=$WORK/s1"
t1=$(toks "$WORK/s1/metrics.jsonl"); rm -rf "$WORK/s1/checkpoints"
echo "1 GPU: exit $rc1, $t1 tok/s"
run2 s2 200 "${SCALE[@]}" --set "log.dir=$WORK/s2"
t2=$(toks "$WORK/s2/metrics.jsonl"); rm -rf "$WORK/s2/checkpoints"
echo "2 GPUs plain, overlap on: exit $rc2, $t2 tok/s"
run2 s2o 200 "${SCALE[@]}" --set train.overlap_comm=false --set "log.dir=$WORK/s2o"
t2o=$(toks "$WORK/s2o/metrics.jsonl"); rm -rf "$WORK/s2o/checkpoints"
echo "2 GPUs plain, overlap off: exit $rc2, $t2o tok/s"
run2 sz 200 "${SCALE[@]}" --zero1 --set "log.dir=$WORK/sz"
tz=$(toks "$WORK/sz/metrics.jsonl")
echo "2 GPUs ZeRO-1, overlap on: exit $rc2, $tz tok/s; checkpoint: $(grep -o 'checkpoint [^ ]*' "$WORK/sz.r0" | tail -1)"
rm -rf "$WORK/sz/checkpoints"
run2 szo 200 "${SCALE[@]}" --zero1 --set train.overlap_comm=false --set "log.dir=$WORK/szo"
tzo=$(toks "$WORK/szo/metrics.jsonl"); rm -rf "$WORK/szo/checkpoints"
echo "2 GPUs ZeRO-1, overlap off: exit $rc2, $tzo tok/s"
grep -h -E "train_gpt: error|FATAL" "$WORK"/s1.r0 "$WORK"/s2.r* "$WORK"/s2o.r* "$WORK"/sz.r* "$WORK"/szo.r* | head -4
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.3f", a / b; else print 0}'; }
r2=$(ratio "$t2" "$t1"); rz=$(ratio "$tz" "$t1"); r2o=$(ratio "$t2o" "$t1"); rzo=$(ratio "$tzo" "$t1")
# the 569M losses with overlap on and off (informational: the attention's dQ atomics may differ)
losses "$WORK/s2/metrics.jsonl" >"$WORK/ls2"; losses "$WORK/s2o/metrics.jsonl" >"$WORK/ls2o"
losses "$WORK/sz/metrics.jsonl" >"$WORK/lsz"; losses "$WORK/szo/metrics.jsonl" >"$WORK/lszo"
row "569M tok/s, 131072/step: 1 GPU | 2 plain | 2 ZeRO-1" "$t1 | $t2 | $tz (overlap on; 1/4 of the config's batch)"
row "569M tok/s, overlap off: 2 plain | 2 ZeRO-1" "$t2o | $tzo (on/off: plain $(ratio "$t2" "$t2o"), ZeRO-1 $(ratio "$tz" "$tzo"))"
row "569M scaling 2 GPUs / 1 GPU (target >= 1.9)" \
  "plain $r2: $(verdict lt 1.9 "$r2"); ZeRO-1 $rz: $(verdict lt 1.9 "$rz") (overlap off: $r2o, $rzo)"
row "569M losses overlap on vs off (6 steps)" "max |dloss| plain $(maxdiff "$WORK/ls2" "$WORK/ls2o"), ZeRO-1 $(maxdiff "$WORK/lsz" "$WORK/lszo")"
./train_gpt "${SCALE[@]}" --dry-run --world-size 2 --zero1 >"$WORK/dry.txt" 2>&1
sed -n '/^GPU memory plan/,/^  total/p' "$WORK/sz.r0" | tail -n +2 >"$WORK/plan_run"
sed -n '/^memory plan:/,/^  total/p' "$WORK/dry.txt" | tail -n +2 >"$WORK/plan_dry"
plan_eq=no; [ -s "$WORK/plan_run" ] && cmp -s "$WORK/plan_run" "$WORK/plan_dry" && plan_eq=yes
gib() { sed -n '/^GPU memory plan/,/^  total/p' "$1" | awk '$1 == "total" {print $2}'; }
row "569M ZeRO-1 plan printed == --dry-run --world-size 2" \
  "$plan_eq: $(verdict [ $plan_eq = yes ]); per GPU $(gib "$WORK/s2.r0") GiB plain, $(gib "$WORK/sz.r0") GiB ZeRO-1"
[ $plan_eq = yes ] || diff "$WORK/plan_run" "$WORK/plan_dry" | head -8

# Every run's output, for the record (run directories are removed at exit).
for f in "$WORK"/*.r0 "$WORK"/*.r1 "$WORK"/*.mpirun; do
  [ -s "$f" ] || continue
  echo "===== $(basename "$f")"
  grep -v '^step [0-9]*/[0-9]* | loss' "$f" | head -40
  case $f in *.r0) losses "${f%.r0}/metrics.jsonl" | tail -3 ;; esac
done >"$OUT/runs.log" 2>&1

echo "== 5. summary ($(elapsed) s, launcher $LAUNCH)"
row "elapsed" "$(elapsed) s"
cat "$S"
