#!/bin/bash
# paper_scale.sh: the paper-scale measurements on the GPUs of one node: for each config
# (paper_569m, paper_1p67b, paper_5p29b) and each precision recipe (precision.recipe: bf16, the
# baseline; fp8, fp8_dm attention with FP8 linears and LM head, docs/config.md), on 1, 2 and 8
# GPUs (those the node has), plain data parallelism and ZeRO-1: tokens/s, MFU, the per-GPU
# memory plan and the peak memory nvidia-smi saw, and the scaling efficiency against one GPU.
# Then a costed plan for the full reproduction (scripts/paper_scale_plan.py): tokens per model
# (20 per parameter), GPU-hours and wall time on 8 and 64 GPUs per precision.
#
#   usage: bash scripts/paper_scale.sh                       (everything the node allows)
#          CONFIGS="paper_569m" GPUS="1 2" MODES="bf16" STEPS=12 bash scripts/paper_scale.sh
#          LONG=300 CONFIGS=paper_569m GPUS=8 bash scripts/paper_scale.sh   (+ a 300-step loss run)
# Each throughput run is STEPS optimizer steps of ACCUM (default 4) micro-batches per GPU (the
# config's micro-batch and sequence length; the full runs accumulate to 524288 tokens, so their
# communication weighs less than here: these ratios are conservative), on the
# corpus the config names (data/corpus, scripts/prepare_corpus.sh) or data/austen when it is
# missing; tokens/s and MFU are the medians of metrics.jsonl after the first 3 steps. A run that
# does not fit (plan larger than the GPU) is reported as such and skipped. Results: $OUT/runs.tsv
# (one line per run), $OUT/paper_scale.md (tables), the plan last; with LONG, each long run's
# metrics.jsonl beside them (scripts/plot_runs.py plots them). NCCL_NVLS_ENABLE=0 is kept.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/paper_scale_out}
WORK=${WORK:-/tmp/paper_scale_runs}
CONFIGS=${CONFIGS:-"paper_569m paper_1p67b paper_5p29b"}
MODES=${MODES:-"bf16 fp8"}
STEPS=${STEPS:-10}
ACCUM=${ACCUM:-4}
LONG=${LONG:-0}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK"
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if [ "$NGPU" -lt 1 ]; then echo "paper_scale.sh: no GPU found (nvidia-smi)"; exit 2; fi
GPUS=${GPUS:-$(for g in 1 2 8; do [ "$g" -le "$NGPU" ] && printf "%s " "$g"; done)}
CJ=""; [ -d .deps/cjson ] && CJ="CJSON_PREFIX=.deps/cjson"  # cJSON carried in (scripts/fetch_cjson.sh)
make -j"$(nproc)" SETUP=0 $CJ train_gpt > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1
DATA=()
ls data/corpus/*/train_*.bin >/dev/null 2>&1 || DATA=(--set "data.train=data/austen/train_*.bin" --set "data.val=data/austen/val_*.bin")

mode_sets() {  # the --set options of a precision: its recipe
  echo "--set precision.recipe=$1"
}

# run NAME NGPUS ZERO1 STEPS CONFIG MODE: one training run; prints its line of runs.tsv
run() {
  local name=$1 g=$2 z=$3 steps=$4 cfg=$5 mode=$6 dir=$WORK/$1
  local mbt
  mbt=$(python3 -c "import json; c = json.load(open('configs/$cfg.json')); print(c['train']['micro_batch'] * c['model']['seq_len'])")
  local common=(--config "configs/$cfg.json" $(mode_sets "$mode") "${DATA[@]}" --set "train.steps=$steps"
                --set "train.batch_tokens=$(( mbt * g * ACCUM ))"
                --set train.warmup_steps=2 --set eval.interval=0 --set eval.sample_interval=0
                --set checkpoint.interval=0 --set checkpoint.at_end=false --set log.interval=1 --set "log.dir=$dir" --set "train.zero1=$z")
  # the per-GPU plan first: a config that cannot fit is a result, not a crash
  local plan
  plan=$(./train_gpt "${common[@]}" --dry-run --world-size "$g" $([ "$z" = true ] && echo --zero1) 2>&1 |
         awk '/^  total/ {print $2}')
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$dir.smi" 2>/dev/null &
  local smi=$!
  local t0=$(date +%s) rc
  if [ "$g" = 1 ]; then
    timeout 900 ./train_gpt "${common[@]}" > "$dir.log" 2>&1; rc=$?
  else
    timeout 900 mpirun -np "$g" --bind-to none --allow-run-as-root -x NCCL_NVLS_ENABLE \
      ./train_gpt "${common[@]}" > "$dir.log" 2>&1; rc=$?
  fi
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  # checkpoint.at_end=false above writes none; this removes any a stop left (paper_1p67b:
  # ~20 GB each; a 1.67B fp8 run after a bf16 one exited 1 on a 64 GB disk, most likely so)
  rm -rf "$dir/checkpoints"
  [ "$rc" != 0 ] && { echo "  $name: exit $rc; the end of $dir.log:"; tail -5 "$dir.log" | sed 's/^/    /'; } >&2
  local peak
  peak=$(sort -n "$dir.smi" 2>/dev/null | tail -1)
  python3 - "$dir/metrics.jsonl" "$name" "$cfg" "$mode" "$g" "$z" "$rc" "$plan" "${peak:-0}" "$(( $(date +%s) - t0 ))" <<'EOF'
import json, statistics, sys
path, name, cfg, mode, g, z, rc, plan, peak, secs = sys.argv[1:]
tps, mfu, loss = [], [], []
try:
    for line in open(path):
        r = json.loads(line)
        if "tokens_per_s" in r and r.get("step", 0) > 3:
            tps.append(r["tokens_per_s"]); mfu.append(r.get("mfu", float("nan")))
        if "loss" in r: loss.append(r["loss"])
except OSError:
    pass
med = lambda x: statistics.median(x) if x else float("nan")
print("\t".join([name, cfg, mode, g, z, rc, "%.0f" % med(tps), "%.4f" % med(mfu), plan, peak,
                 "%.4f" % (loss[0] if loss else float("nan")), "%.4f" % (loss[-1] if loss else float("nan")), secs]))
EOF
}

printf "name\tconfig\tmode\tgpus\tzero1\texit\ttok_s\tmfu\tplan_gib\tpeak_mib\tloss_first\tloss_last\tseconds\n" > "$OUT/runs.tsv"
for cfg in $CONFIGS; do
  for mode in $MODES; do
    for g in $GPUS; do
      for z in false true; do
        [ "$g" = 1 ] && [ "$z" = true ] && continue  # ZeRO-1 on one GPU is plain
        run "${cfg}_${mode}_${g}g_z${z}" "$g" "$z" "$STEPS" "$cfg" "$mode" | tee -a "$OUT/runs.tsv"
      done
    done
    if [ "$LONG" -gt 0 ]; then  # the loss falling over a few hundred steps, on the most GPUs
      g=$(echo $GPUS | awk '{print $NF}')
      run "${cfg}_${mode}_${g}g_long$LONG" "$g" true "$LONG" "$cfg" "$mode" | tee -a "$OUT/runs.tsv"
      # the curve comes back with $OUT (scripts/plot_runs.py draws it)
      cp "$WORK/${cfg}_${mode}_${g}g_long$LONG/metrics.jsonl" "$OUT/${cfg}_${mode}_${g}g_long$LONG.metrics.jsonl" 2>/dev/null
    fi
  done
done
python3 scripts/paper_scale_plan.py "$OUT/runs.tsv" | tee "$OUT/paper_scale.md"
