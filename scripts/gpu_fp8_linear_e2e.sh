#!/bin/bash
# gpu_fp8_linear_e2e.sh: on a GPU machine, issue 6's end-to-end measurement of FP8 linears:
#   1. build train_gpt, test_linear_fp8_gpu and test_model_gpu_fp8 (make, cJSON from .deps/cjson
#      when present);
#   2. (unless NO_TEST=1) test_linear_fp8_gpu's quantization part (FP8_TEST_QUANT_ONLY=1: every
#      quantize kernel code for code against the CPU emulation), then test_model_gpu_fp8: the FP8
#      GPU model against the CPU emulation, then
#      its timing section: 125M and paper_569m shapes in bf16 / fp8_tensor / fp8_block, steps
#      split into forward / backward / optimizer, and a CUDA-event breakdown of the linears
#      (BF16 GEMMs vs FP8 GEMMs + each quantization pass);
#   3. train_gpt on $CONFIG (default configs/paper_569m.json; micro-batch MB x seq_len, no accumulation
#      unless ACCUM=n: n micro-batches per optimizer step, as the config's own batch_tokens does (paper_569m:
#      32), so that AdamW and the FP8 weight refresh are paid once per n micro-batches; attention
#      bf16), STEPS steps on data/austen per linear mode: bf16 (seed 42), bf16 (seed 43, data
#      order unchanged: the seed-to-seed noise of the final losses), fp8_tensor, fp8_block (seed
#      42); the final train and val loss (val: eval.batches batches at the last step) and tokens/s
#      (median of metrics.jsonl over the steps after SKIP, default 5);
#   4. a table last: mode, tok/s, ratio to bf16, final train / val loss, val loss - bf16's, and
#      the seed noise.
# TORCH=1 also times the PyTorch BF16 baseline of $CONFIG at MB x seq_len (dev/bench/bench_e2e.py) after
# the build and adds it to the table (its ratio to the first run in the last column).
# Logs go to $OUT (default /tmp/gpu_fp8_e2e_out), runs to $WORK. About 5 minutes on one H200.
#   usage (device tool, carry [".deps"]): bash scripts/gpu_fp8_linear_e2e.sh
#   (STEPS=40 MB=4 NO_TEST=1 NO_NOISE=1 BUDGET=320 to change; UNFUSED=1 adds fp8_block with
#   TRAIN_GPT_FP8_FUSE=0: the quantizations in separate passes, as before the fused producers;
#   RUNS="name:linear:attention:seed[:VAR=value] ..." replaces the list of runs (linear "fp8_block+head":
#   the LM head in FP8 too; the optional
#   fifth field is an environment variable for that run, or a config setting when its name has a
#   dot, e.g. precision.linear_wgrad_blocks=activation, or several joined by commas; strings are quoted
#   for --set), e.g. FP8 attention too:
#   RUNS="bf16:bf16:bf16:42 attn_dm:bf16:fp8_dm:42 all_fp8:fp8_tensor:fp8_dm:42 bf16_seed43:bf16:bf16:43";
#   the first run is the baseline of the ratios, a run named bf16_seed43 gives the seed noise)
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_fp8_e2e_out}
WORK=${WORK:-/tmp/gpu_fp8_e2e}
MB=${MB:-4}
STEPS=${STEPS:-40}
CONFIG=${CONFIG:-configs/paper_569m.json}
CNAME=$(basename "$CONFIG" .json)
BUDGET=${BUDGET:-320}  # seconds for the whole script
ACCUM=${ACCUM:-1}      # micro-batches per optimizer step
SKIP=${SKIP:-5}        # steps left out of the tokens/s median (warm-up)
SEQ=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"]["seq_len"])' "$CONFIG") || exit 1
BATCH_TOKENS=0         # 0: one micro-batch per step
[ "$ACCUM" -gt 1 ] && BATCH_TOKENS=$((ACCUM * MB * SEQ))
mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK"
. scripts/gpu_lib.sh  # t_start, elapsed, left, CJ
date -u +"%Y-%m-%d %H:%M UTC"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader

echo "== 1. build ($(elapsed) s)"
timeout 240 make -j16 SETUP=0 $CJ train_gpt build/tests/test_linear_fp8_gpu build/tests/test_model_gpu_fp8 \
  >"$OUT/build.log" 2>&1
echo "build exit $? at $(elapsed) s"
grep -E "error" "$OUT/build.log" | head -10
[ -x ./train_gpt ] || { tail -20 "$OUT/build.log"; echo "no train_gpt"; exit 1; }

if [ "${NO_TEST:-0}" != 1 ]; then
  echo "== 2. test_linear_fp8_gpu (quantization only) and test_model_gpu_fp8 ($(elapsed) s)"
  FP8_TEST_QUANT_ONLY=1 timeout -k 5 60 build/tests/test_linear_fp8_gpu >"$OUT/test_linear_fp8_gpu.log" 2>&1
  echo "test_linear_fp8_gpu exit $? at $(elapsed) s"
  grep -E "^(FAIL|skipped)" "$OUT/test_linear_fp8_gpu.log" | head -10 | cut -c1-240
  grep -E "^# test_linear_fp8_gpu" "$OUT/test_linear_fp8_gpu.log"
  timeout -k 5 "$(left 150)" build/tests/test_model_gpu_fp8 >"$OUT/test_model_gpu_fp8.log" 2>&1
  echo "test_model_gpu_fp8 exit $? at $(elapsed) s"
  grep -E "^(FAIL|skipped)" "$OUT/test_model_gpu_fp8.log" | head -20 | cut -c1-240
  grep -E "FP8 effect on all|loss cpu .* gpu .*\(rel|after the steps|^# timing|^# breakdown|^#   fp8_(tensor|block) " \
    "$OUT/test_model_gpu_fp8.log" | grep -v "step " | cut -c1-260
  grep -E "^# test_model_gpu_fp8" "$OUT/test_model_gpu_fp8.log"
fi

# run NAME LINEAR SEED [ATTENTION [KEY=VALUE]]: STEPS steps of paper_569m on data/austen, log to $OUT/run_NAME.log
# (LINEAR "fp8_block+head": fp8_block with the LM head in FP8 too, linear_keep_lm_head_bf16 = false)
run() {
  local name=$1 lin=$2 seed=$3 attn=${4:-bf16} dir=$WORK/run_$1 head=true extra=()
  case "$lin" in *+head) lin=${lin%+head}; head=false;; esac
  local kv key val
  for kv in ${5:+${5//,/ }}; do  # config settings: numbers and booleans as they are, anything else a JSON string
    key=${kv%%=*} val=${kv#*=}
    [[ "$val" =~ ^(true|false|-?[0-9.]+)$ ]] || val="\"$val\""
    extra+=(--set "$key=$val")
  done
  set -- --config "$CONFIG" --device gpu --set train.micro_batch="$MB" --set train.batch_tokens="$BATCH_TOKENS" \
    --set train.steps="$STEPS" --set train.warmup_steps=5 --set train.recompute=false --set train.seed="$seed" \
    --set "precision.linear=\"$lin\"" --set "precision.linear_keep_lm_head_bf16=$head" \
    --set "precision.attention=\"$attn\"" \
    --set "data.train=data/austen/train_*.bin" --set "data.val=data/austen/val_*.bin" \
    --set eval.interval=0 --set eval.batches=3 --set eval.sample_interval=0 \
    --set checkpoint.interval=0 --set checkpoint.at_end=false --set log.interval=5 --set "log.dir=$dir" \
    "${extra[@]}"
  [ "$name" = bf16 ] && ./train_gpt "$@" --dry-run 2>&1 | grep -E "^(memory plan|  total|training FLOPs)"
  timeout -k 5 "$(left 75)" ./train_gpt "$@" >"$OUT/run_$name.log" 2>&1
  echo "train_gpt $name exit $? at $(elapsed) s"
  grep -E "^(step [0-9]+/|done:|train_gpt: error)|rror" "$OUT/run_$name.log" | tail -4 | cut -c1-200
  cp "$dir/metrics.jsonl" "$OUT/metrics_$name.jsonl" 2>/dev/null
  cp "$dir/summary.json" "$OUT/summary_$name.json" 2>/dev/null
  rm -rf "$dir/checkpoints"  # only a stop (timeout's SIGTERM) writes one: ~7 GB at paper_569m
}
if [ "${TORCH:-0}" = 1 ]; then
  echo "== 3a. PyTorch BF16 baseline of $CNAME, micro-batch $MB ($(elapsed) s)"
  PYTHONUNBUFFERED=1 timeout -k 5 "$(left 200)" python3 dev/bench/bench_e2e.py --config "$CONFIG" --micro-batch "$MB" \
    --warmup 5 --steps 20 >"$OUT/torch_$CNAME.log" 2>&1
  echo "bench_e2e exit $? at $(elapsed) s"
  grep -E "^torch-e2e " "$OUT/torch_$CNAME.log" | cut -c1-200
fi
echo "== 3. train_gpt $CNAME, $STEPS steps of $ACCUM x $MB x $SEQ tokens per mode ($(elapsed) s)"
if [ -z "${RUNS:-}" ]; then
  RUNS="bf16:bf16:bf16:42 fp8_tensor:fp8_tensor:bf16:42 fp8_block:fp8_block:bf16:42"
  [ "${UNFUSED:-0}" = 1 ] && RUNS="$RUNS fp8_block_unfused:fp8_block:bf16:42:TRAIN_GPT_FP8_FUSE=0"
  [ "${NO_NOISE:-0}" != 1 ] && RUNS="$RUNS bf16_seed43:bf16:bf16:43"
fi
names=""
for r in $RUNS; do
  IFS=: read -r name lin attn seed var <<<"$r"
  if [[ "${var%%=*}" == *.* ]]; then run "$name" "$lin" "$seed" "$attn" "$var"
  else ( [ -n "$var" ] && export "$var"; run "$name" "$lin" "$seed" "$attn" ); fi
  names="$names $name:$lin:$attn"
done

echo "== 4. table ($(elapsed) s)"
python3 - "$OUT" "$CNAME" "$SKIP" $names <<'EOF' | tee "$OUT/table_$CNAME.md"
import json, os, statistics, sys
out, cname, skip = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = [a.split(":") for a in sys.argv[4:]]  # name, linear, attention
def load(name):
    r = {"name": name}
    try:
        rows = [json.loads(l) for l in open(os.path.join(out, "metrics_%s.jsonl" % name))]
        steps = [x for x in rows if "tokens_per_s" in x and x["step"] > skip]
        if steps: r["tok"] = statistics.median(x["tokens_per_s"] for x in steps)
    except Exception: pass
    try:
        s = json.load(open(os.path.join(out, "summary_%s.json" % name)))
        r["train"], r["val"] = s.get("final_train_loss"), s.get("final_val_loss")
    except Exception: pass
    return r
rows = [dict(load(n), lin=l, attn=a) for n, l, a in runs]
base = rows[0]
seed = [r for r in rows if r["name"] == "bf16_seed43"]
noise = abs(seed[0]["val"] - base["val"]) if seed and seed[0].get("val") is not None and base.get("val") is not None else None
f = lambda v, fmt: (fmt % v) if v is not None else "n/a"
torch = None  # TORCH=1: bench_e2e.py's JSON line for this config
try:
    for line in open(os.path.join(out, "torch_%s.log" % cname), errors="replace"):
        if line.startswith("torch-e2e-json "): torch = json.loads(line[len("torch-e2e-json "):])
except OSError: pass
print("| %s run | linears | attention | tok/s | vs %s | final train loss | final val loss | val - %s | vs PyTorch BF16 |"
      % (cname, base["name"], base["name"]))
print("|---|---|---|---|---|---|---|---|---|")
t_tok = torch.get("tokens_per_s") if torch else None
for r in rows:
    if "tok" not in r and "val" not in r: continue
    ratio = r["tok"] / base["tok"] if r.get("tok") and base.get("tok") else None
    dv = r["val"] - base["val"] if r.get("val") is not None and base.get("val") is not None else None
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (r["name"], r["lin"], r["attn"], f(r.get("tok"), "%.0f"),
          f(ratio, "**%.2fx**"), f(r.get("train"), "%.4f"), f(r.get("val"), "%.4f"), f(dv, "%+.4f"),
          f(r["tok"] / t_tok if r.get("tok") and t_tok else None, "%.2fx")))
if torch:
    print("| PyTorch BF16 (bench_e2e.py) | bf16 | %s | %.0f | %s | | | | 1.00x |" % (
          torch.get("sdpa", "sdpa"), t_tok, f(t_tok / base["tok"] if base.get("tok") else None, "%.2fx")))
print("seed noise of the val loss (|bf16 seed 43 - seed 42|): %s; tok/s: median of metrics.jsonl steps > %d"
      % (f(noise, "%.4f"), skip))
EOF
echo "(total $(elapsed) s)"
