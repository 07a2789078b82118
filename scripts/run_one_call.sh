#!/bin/bash
# run_one_call.sh: (mode, seed) training runs end to end inside one GPU-machine call of at most
# ~9 minutes, side by side (one a GPU, or --per-gpu K sharing each): build, unpack the corpus,
# check that the plan can finish, train to a token budget, and keep only small files.
#
#   usage: scripts/run_one_call.sh --config FILE [options] MODE:SEED [MODE:SEED ...]
#     e.g. scripts/run_one_call.sh --config configs/reduced_125m_t8k_amplified.json fp8_naive:1 fp8_dm:1
#          scripts/run_one_call.sh --config ... --per-gpu 4 --probe 40 bf16:1 fp8_naive:1 fp8_dm:1 fp8_hybrid:1
#
#   --tokens N       training tokens per run (default: the config's train.steps x batch tokens);
#                    train.steps = N / train.batch_tokens, the same for every run of a recipe
#   --rate R         planned tokens/s of one GPU (default 380000; the plan's, see
#                    docs/results.md): the start-up check and the default use it
#   --limit-s S      the whole call's limit in seconds, this script's start to its end (default 540)
#   --out DIR        where the small files go (default $OUT, else /tmp/run_one_call)
#   --corpus FILE    packed corpus (scripts/prepare_corpus.sh --pack) unpacked into --corpus-dir when
#                    the config's training shards are missing (default data/corpus.tar.xz)
#   --corpus-dir D   where it is unpacked (default data/corpus, where the plan's configs look)
#   --checkpoint     keep a checkpoint of the last step (default: none; a 125M run's is ~1.5 GB)
#   --set KEY=VALUE  another config override for every run (repeatable)
#   --per-gpu K      runs that share one GPU, side by side (default 1): run i goes to GPU i / K;
#                    the plan then gives each run RATE / K tokens/s (check it with --probe)
#   --probe N        check the backend and measure, train nothing: attn-check --device gpu at
#                    T = 4096, d = 128, E4M3 and E5M2; then N steps of each run alone, then of all
#                    runs side by side as --per-gpu places them; a table of tokens/s, last
#   --device D       gpu (default) or cpu (the CPU backend: tests of this script)
#   --no-build       use ./train_gpt as it is (default: make it, cJSON from .deps/cjson)
#   --dry-run        print the plan and the start-up check, build and train nothing
#
# Each run R = MODE:SEED trains with precision.attention = MODE and train.seed = data.seed = SEED
# (scripts/compare_modes.py's convention) on GPU number i / K (the i-th run), into /tmp, and leaves in
# OUT/MODE/seed_SEED/ its metrics.jsonl, config.json, summary.json and train.log (the last 300
# lines of its output): what scripts/compare_modes.py --summarize-only reads, 4 files a run.
#
# Time: the start-up check refuses (exit 3, nothing trained) when the time spent so far (build,
# unpack) + the planned training (tokens / rate) + the evaluations (at 2.5 x the training rate) +
# 15 s of margin exceed --limit-s. During the run a watchdog reads metrics.jsonl: once 5 steps
# have told the real rate, a run that cannot end inside the limit is stopped (exit 4, its files
# kept and marked "stopped" in train.log). Every process ends before the limit.
set -u
cd "$(dirname "$0")/.." || exit 1
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start )); }
die() { echo "run_one_call: error: $*" >&2; exit 2; }

CONFIG="" TOKENS="" RATE=380000 LIMIT=540 OUTDIR=${OUT:-/tmp/run_one_call} CORPUS=data/corpus.tar.xz CORPUS_DIR=data/corpus
KEEP_CKPT=0 DEVICE=gpu BUILD=1 DRY=0 PER_GPU=1 PROBE=0
SETS=() RUNS=()
while [ $# -gt 0 ]; do
  case $1 in
    --config) CONFIG=${2:?--config needs a file}; shift 2 ;;
    --tokens) TOKENS=${2:?--tokens needs a number}; shift 2 ;;
    --rate) RATE=${2:?--rate needs tokens/s}; shift 2 ;;
    --limit-s) LIMIT=${2:?--limit-s needs seconds}; shift 2 ;;
    --out) OUTDIR=${2:?--out needs a directory}; shift 2 ;;
    --corpus) CORPUS=${2:?--corpus needs a file}; shift 2 ;;
    --corpus-dir) CORPUS_DIR=${2:?--corpus-dir needs a directory}; shift 2 ;;
    --checkpoint) KEEP_CKPT=1; shift ;;
    --per-gpu) PER_GPU=${2:?--per-gpu needs a number}; shift 2 ;;
    --probe) PROBE=${2:?--probe needs a number of steps}; shift 2 ;;
    --set) SETS+=(--set "${2:?--set needs KEY=VALUE}"); shift 2 ;;
    --device) DEVICE=${2:?--device needs gpu or cpu}; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *:*) RUNS+=("$1"); shift ;;
    *) die "'$1': expected MODE:SEED, e.g. fp8_dm:1" ;;
  esac
done
[ -n "$CONFIG" ] || die "--config is required"
[ -f "$CONFIG" ] || die "--config $CONFIG: no such file"
[ ${#RUNS[@]} -ge 1 ] || die "no run given: name one or more MODE:SEED, e.g. fp8_dm:1"
case $DEVICE in gpu|cpu) ;; *) die "--device '$DEVICE': expected gpu or cpu" ;; esac
for n in "$RATE" "$LIMIT" "$PER_GPU" ${TOKENS:+"$TOKENS"}; do
  case $n in ''|*[!0-9]*) die "'$n': --tokens, --rate, --limit-s and --per-gpu take positive integers" ;; esac
  [ "$n" -gt 0 ] || die "--tokens, --rate, --limit-s and --per-gpu must be positive"
done
case $PROBE in ''|*[!0-9]*) die "--probe '$PROBE': expected a number of steps" ;; esac
for r in "${RUNS[@]}"; do
  m=${r%%:*} s=${r#*:}
  case $m in
    bf16|fp8_naive|fp8_hybrid|fp8_dm|fp8_dm_approx|fp8_hybrid_dm|fp32) ;;
    *) die "'$r': unknown mode '$m'" ;;
  esac
  case $s in ''|*[!0-9]*) die "'$r': the seed must be a non-negative integer" ;; esac
done
NGPU=0
if [ "$DEVICE" = gpu ] && [ "$DRY" = 0 ]; then
  NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
  [ "$NGPU" -ge 1 ] || die "no GPU found (nvidia-smi); --device cpu runs the CPU backend"
  [ ${#RUNS[@]} -le $(( NGPU * PER_GPU )) ] ||
    die "${#RUNS[@]} runs but $NGPU GPU(s) x --per-gpu $PER_GPU: raise --per-gpu or run fewer"
  export NCCL_NVLS_ENABLE=0
fi

# The plan from the config: batch tokens, steps for the budget, evaluations and their tokens.
plan() {
  python3 - "$CONFIG" "${TOKENS:-0}" "$RATE" "${SETS[@]}" <<'PYEOF'
import json, sys
cfg = json.load(open(sys.argv[1]))
tokens, rate = int(sys.argv[2]), float(sys.argv[3])
for i, a in enumerate(sys.argv[4:]):  # --set overrides of the plan's keys
    if a == "--set":
        continue
    key, _, val = a.partition("=")
    sec, _, k = key.partition(".")
    try:
        val = json.loads(val)
    except ValueError:
        pass
    cfg.setdefault(sec, {})[k] = val
m, t, e = cfg["model"], cfg.get("train", {}), cfg.get("eval", {})
T, B = m["seq_len"], t.get("micro_batch", 8)
bt = t.get("batch_tokens", 0) or B * T
tokens = tokens or t.get("steps", 1000) * bt
steps = max(1, tokens // bt)
ev, pk = e.get("interval", 100), e.get("passkey_interval", 0)
n_val = (steps // ev if ev > 0 else 0) + 2  # step 0, every interval, the end
n_pk = (steps // pk if pk > 0 else 0) + 2 if pk > 0 else 0
val_tokens = e.get("batches", 10) * B * T
pk_tokens = 4 * e.get("passkey_samples", 32) * T  # about four distances
eval_s = (n_val * val_tokens + n_pk * pk_tokens) / (2.5 * rate)
train_s = steps * bt / rate
print(steps, bt, steps * bt, int(train_s + 0.999), int(eval_s + 0.999), min(t.get("warmup_steps", 0), steps))
PYEOF
}
RATE=$(( RATE / PER_GPU ))  # each run's share of its GPU
read -r STEPS BATCH TOK TRAIN_S EVAL_S WARMUP < <(plan) || die "cannot read the plan from $CONFIG"
[ -n "${STEPS:-}" ] || die "cannot read the plan from $CONFIG"
echo "run_one_call: ${RUNS[*]} | $CONFIG | $STEPS steps x $BATCH tokens = $TOK tokens per run |" \
     "planned $RATE tok/s a run ($PER_GPU a GPU): training ${TRAIN_S} s + evaluations ~${EVAL_S} s | limit ${LIMIT} s | device $DEVICE"

# check_eta WHAT: refuses (exit 3) when what is left of the limit cannot hold the plan.
check_eta() {
  [ "$PROBE" -gt 0 ] && return 0  # a probe trains only its few steps
  local need=$(( $(elapsed) + TRAIN_S + EVAL_S + 15 ))
  if [ "$need" -gt "$LIMIT" ]; then
    echo "run_one_call: REFUSED ($1): $(elapsed) s spent + ${TRAIN_S} s training + ~${EVAL_S} s evaluation + 15 s" \
         "margin = $need s > limit $LIMIT s; lower --tokens (at most about" \
         "$(( (LIMIT - $(elapsed) - EVAL_S - 15) * RATE / BATCH * BATCH )) tokens) or raise --limit-s"
    exit 3
  fi
  echo "run_one_call: ETA check ($1): $need s of $LIMIT s"
}
check_eta "before the build"
[ "$DRY" = 1 ] && { echo "run_one_call: dry run: nothing built or trained"; exit 0; }

if [ "$BUILD" = 1 ]; then
  CJ=""; [ -d .deps/cjson ] && CJ="CJSON_PREFIX=.deps/cjson"
  mkdir -p "$OUTDIR"
  timeout $(( LIMIT - $(elapsed) )) make -j"$(nproc)" SETUP=0 $CJ train_gpt > /tmp/run_one_call_build.log 2>&1 ||
    { tail -20 /tmp/run_one_call_build.log; die "build failed"; }
  echo "run_one_call: built at $(elapsed) s"
fi
[ -x ./train_gpt ] || die "./train_gpt missing (build it, or drop --no-build)"

# The data: the config's shards, else the packed corpus unpacked into $CORPUS_DIR.
pattern=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("data", {}).get("train", ""))' "$CONFIG")
for s in "${SETS[@]}"; do case $s in data.train=*) pattern=${s#data.train=} ;; esac; done
if ! ls $pattern > /dev/null 2>&1; then
  [ -f "$CORPUS" ] || die "no shards match '$pattern' and no packed corpus $CORPUS (scripts/prepare_corpus.sh --pack)"
  python3 scripts/corpus/pack.py unpack "$CORPUS" "$CORPUS_DIR" || die "unpacking $CORPUS failed"
  echo "run_one_call: corpus unpacked at $(elapsed) s"
fi
check_eta "after the build and the data"

# run_opts MODE SEED STEPS WARMUP DIR [KEY=VALUE ...]: train_gpt's options for one run into OPTS,
# the extra overrides before --set's own (which win)
run_opts() {
  local m=$1 s=$2 steps=$3 warmup=$4 dir=$5 kv
  shift 5
  OPTS=(--config "$CONFIG" --set "train.device=$DEVICE" --set "precision.attention=$m" --set "train.seed=$s"
        --set "data.seed=$s" --set "train.steps=$steps" --set "train.warmup_steps=$warmup" --set "log.dir=$dir/run"
        --set checkpoint.interval=0)
  for kv in "$@"; do OPTS+=(--set "$kv"); done
  OPTS+=("${SETS[@]}")
}

# --probe N: is the backend right, and how fast are the runs? Trains nothing.
if [ "$PROBE" -gt 0 ]; then
  mkdir -p "$OUTDIR"
  table=()
  for g in e4m3 e5m2; do
    log=/tmp/run_one_call_attn_check_$g.log
    timeout 120 ./train_gpt attn-check --device "$DEVICE" --T 4096 --d 128 --grad-format $g > "$log" 2>&1
    rc=$?
    cp "$log" "$OUTDIR/" 2> /dev/null
    res=PASS; [ $rc -eq 0 ] || res="FAIL (exit $rc)"
    table+=("$(printf '%-34s %s' "attn-check $DEVICE T 4096 d 128 $g" "$res")")
  done
  # probe_runs LABEL RUN...: N steps of each RUN at once, placed as --per-gpu says; tokens/s each
  probe_runs() {
    local label=$1 r m s dir k=0 pids=() names=()
    shift
    for r in "$@"; do
      m=${r%%:*} s=${r#*:}
      dir=/tmp/run_one_call_probe/$label/${m}_seed$s
      rm -rf "$dir"; mkdir -p "$dir"
      run_opts "$m" "$s" "$PROBE" $(( WARMUP < PROBE ? WARMUP : PROBE )) "$dir" eval.interval=0 \
        eval.passkey_interval=0 checkpoint.at_end=false log.interval=1
      CUDA_VISIBLE_DEVICES=$(( k / PER_GPU )) timeout -s KILL $(( LIMIT - $(elapsed) - 5 )) \
        ./train_gpt "${OPTS[@]}" > "$dir/train.log" 2>&1 &
      pids+=($!) names+=("$r")
      k=$((k + 1))
    done
    for k in "${!pids[@]}"; do
      wait "${pids[$k]}"; rc=$?
      r=${names[$k]} m=${r%%:*} s=${r#*:}
      dir=/tmp/run_one_call_probe/$label/${m}_seed$s
      tail -40 "$dir/train.log" > "$OUTDIR/probe_${label}_${m}_$s.log"
      tok=$(python3 - "$dir/run/metrics.jsonl" <<'PYEOF'
import json, statistics, sys
try: rows = [json.loads(l) for l in open(sys.argv[1])]
except Exception: rows = []
rows = [r for r in rows if "tokens_per_s" in r]
tail = rows[len(rows) // 4:]  # past the start-up steps
print("%.0f tok/s, loss %.3f -> %.3f" % (statistics.median(r["tokens_per_s"] for r in tail), rows[0]["loss"],
                                        rows[-1]["loss"])
      if tail else "no steps")
PYEOF
)
      table+=("$(printf '%-34s %s' "$label $r" "$([ $rc -eq 0 ] && echo "$tok" || echo "FAIL (exit $rc): $tok")")")
    done
  }
  for r in "${RUNS[@]}"; do probe_runs alone "$r"; done
  [ ${#RUNS[@]} -gt 1 ] && [ "$PER_GPU" -gt 1 ] && probe_runs shared "${RUNS[@]}"
  echo "run_one_call: probe done at $(elapsed) s: $PROBE steps of $BATCH tokens"
  printf '%s\n' "${table[@]}"
  case "${table[*]}" in *FAIL*) exit 1 ;; esac
  exit 0
fi

# Start every run, then watch them.
pids=() dirs=() outs=()
i=0
for r in "${RUNS[@]}"; do
  m=${r%%:*} s=${r#*:}
  dir=/tmp/run_one_call_runs/${m}_seed$s
  rm -rf "$dir"
  mkdir -p "$dir"
  run_opts "$m" "$s" "$STEPS" "$WARMUP" "$dir" "checkpoint.at_end=$([ $KEEP_CKPT = 1 ] && echo true || echo false)"
  left=$(( LIMIT - $(elapsed) - 5 ))
  if [ "$DEVICE" = gpu ]; then
    CUDA_VISIBLE_DEVICES=$(( i / PER_GPU )) timeout -s KILL "$left" ./train_gpt "${OPTS[@]}" > "$dir/train.log" 2>&1 &
  else
    timeout -s KILL "$left" ./train_gpt "${OPTS[@]}" > "$dir/train.log" 2>&1 &
  fi
  pids+=($!) dirs+=("$dir") outs+=("$OUTDIR/$m/seed_$s")
  i=$((i + 1))
done
echo "run_one_call: ${#pids[@]} run(s) started at $(elapsed) s"

# The watchdog: each run's rate from its metrics once 5 steps are in; stop what cannot finish.
stopped=0
declare -A done_pid
while :; do
  alive=0
  for k in "${!pids[@]}"; do
    p=${pids[$k]}
    [ -n "${done_pid[$p]:-}" ] && continue
    if ! kill -0 "$p" 2> /dev/null; then done_pid[$p]=1; continue; fi
    alive=1
    verdict=$(python3 - "${dirs[$k]}/run/metrics.jsonl" "$STEPS" "$(elapsed)" "$LIMIT" "$EVAL_S" <<'PYEOF'
import json, sys
path, steps, now, limit, eval_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
try:
    rows = [json.loads(l) for l in open(path) if '"loss"' in l]
except (OSError, ValueError):
    rows = []
rows = [r for r in rows if "elapsed_s" in r]
if len(rows) < 6:
    print("wait")
    sys.exit()
per_step = (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / (len(rows) - 1)
end = now + per_step * (steps - rows[-1]["step"]) + eval_s
print("stop %.0f" % end if end > limit - 5 else "ok %.0f" % end)
PYEOF
)
    case $verdict in
      stop*) echo "run_one_call: STOPPED ${RUNS[$k]}: at the measured rate it would end at ${verdict#stop } s," \
                  "past the limit of $LIMIT s" | tee -a "${dirs[$k]}/train.log"
             pkill -KILL -P "$p" 2> /dev/null; kill "$p" 2> /dev/null; stopped=1; done_pid[$p]=1 ;;
    esac
  done
  [ "$alive" = 0 ] && break
  sleep 5
done

# Bring back the small files; the status is the worst run's.
status=0
for k in "${!pids[@]}"; do
  wait "${pids[$k]}"; rc=$?
  d=${dirs[$k]} o=${outs[$k]}
  mkdir -p "$o"
  for f in metrics.jsonl config.json summary.json; do [ -f "$d/run/$f" ] && cp "$d/run/$f" "$o/"; done
  tail -300 "$d/train.log" > "$o/train.log"
  last=$(grep -E '^done:|val loss|REFUSED|STOPPED|error' "$d/train.log" | tail -1)
  echo "run_one_call: ${RUNS[$k]}: exit $rc | $last"
  [ "$rc" -ne 0 ] && status=1
done
[ "$stopped" = 1 ] && status=4
echo "run_one_call: done at $(elapsed) s of $LIMIT (files in $OUTDIR)"
exit $status
