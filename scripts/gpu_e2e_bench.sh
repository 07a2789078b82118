#!/bin/bash
# gpu_e2e_bench.sh: on a GPU machine, in one go, the end-to-end speed of train_gpt against the
# PyTorch baseline of the same architecture (dev/bench/bench_e2e.py: torch.compile, BF16 autocast,
# the fastest SDPA backend, fused AdamW) on the same GPU, for configs/small_125m.json (16 x 1024)
# and configs/paper_569m.json (MB569 x 4096, default 4), gradient accumulation 1 for both:
#   1. build train_gpt in the background (make, cJSON from .deps/cjson when present);
#   2. meanwhile the PyTorch baseline compiles and warms up; it times its steps only once the
#      build is done (--wait-for), so no compiler shares the CPU with timed steps;
#   3. our trainer, STEPS steps of each config on data/austen, tokens/s and MFU = the median of
#      metrics.jsonl over the steps after 5 (the same FLOP count and peak as bench_e2e.py);
#   4. a table last: config, ours tok/s and MFU, torch tok/s and MFU, ratio ours / torch.
# Logs and the table go to $OUT (default /tmp/gpu_e2e_out), at most 8 files; runs to $WORK.
#   usage: bash scripts/gpu_e2e_bench.sh            (MB569=8 STEPS=40 BUDGET=400 to change)
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_e2e_out}
WORK=${WORK:-/tmp/gpu_e2e}
MB569=${MB569:-4}
STEPS=${STEPS:-30}
BUDGET=${BUDGET:-400}  # seconds for the whole script (train_gpt gets the last 80)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK"
. scripts/gpu_lib.sh  # t_start, elapsed, left, CJ
date -u +"%Y-%m-%d %H:%M UTC"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader

echo "== 1. build train_gpt in the background ($(elapsed) s)"
( timeout 300 make -j16 SETUP=0 $CJ train_gpt >"$OUT/build.log" 2>&1; echo $? >"$WORK/build.rc"
  echo "build exit $(cat "$WORK/build.rc") at $(elapsed) s"; touch "$WORK/build.done" ) &
build_pid=$!

echo "== 2. PyTorch baseline (timing waits for the build) ($(elapsed) s)"
timeout -k 5 "$(left $(( BUDGET - 80 )))" python3 dev/bench/bench_e2e.py --config configs/small_125m.json --micro-batch 16 \
  --config configs/paper_569m.json --micro-batch "$MB569" --warmup 5 --steps 20 --profile \
  --wait-for "$WORK/build.done" --wait-max 200 >"$OUT/torch.log" 2>&1
echo "bench_e2e exit $? at $(elapsed) s"
grep -E "^(torch |==|  sdpa|torch-e2e |  compiling)" "$OUT/torch.log"
grep -A12 "profile of one step" "$OUT/torch.log" | head -30
wait "$build_pid"
grep -E "error" "$OUT/build.log" | head -10
if [ ! -x ./train_gpt ]; then tail -20 "$OUT/build.log"; echo "no train_gpt"; fi

# ours NAME CONFIG MICRO_BATCH LIMIT: STEPS steps on data/austen, log to $OUT/ours_NAME.log
ours() {
  local name=$1 config=$2 mb=$3 lim=$4 run=$WORK/ours_$1
  [ -x ./train_gpt ] || return 1
  set -- --config "$config" --device gpu --set train.micro_batch="$mb" --set train.batch_tokens=0 \
    --set train.steps="$STEPS" --set train.warmup_steps=5 --set train.recompute=false \
    --set "data.train=data/austen/train_*.bin" --set "data.val=data/austen/val_*.bin" \
    --set eval.interval=0 --set eval.batches=1 --set eval.sample_interval=0 \
    --set checkpoint.interval=0 --set checkpoint.at_end=false --set log.interval=5 --set "log.dir=$run"
  ./train_gpt "$@" --dry-run 2>&1 | grep -E "^(memory plan|  total|training FLOPs)"
  timeout -k 5 "$(left "$lim")" ./train_gpt "$@" >"$OUT/ours_$name.log" 2>&1
  echo "train_gpt $name exit $? at $(elapsed) s"
  grep -E "^(device|batch|step [0-9]+/|train_gpt: error)|rror" "$OUT/ours_$name.log" | head -12
  cp "$run/metrics.jsonl" "$OUT/metrics_$name.jsonl" 2>/dev/null
}
echo "== 3. train_gpt ($(elapsed) s)"
ours small_125m configs/small_125m.json 16 30
ours paper_569m configs/paper_569m.json "$MB569" 60

echo "== 4. table ($(elapsed) s)"
python3 - "$OUT" "$MB569" >"$OUT/summary.txt" <<'EOF'
import json, os, statistics, sys
out, mb569 = sys.argv[1], sys.argv[2]
torch_rows = {}
for line in open(os.path.join(out, "torch.log"), errors="replace"):
    if line.startswith("torch-e2e-json "):
        r = json.loads(line[len("torch-e2e-json "):])
        torch_rows[r["config"]] = r
def ours(name):
    try: rows = [json.loads(l) for l in open(os.path.join(out, "metrics_%s.jsonl" % name))]
    except Exception: return None, None, 0
    steps = [r for r in rows if "tokens_per_s" in r and r["step"] > 5]
    if not steps: return None, None, 0
    mfu = [r["mfu"] for r in steps if r.get("mfu") is not None]
    return statistics.median(r["tokens_per_s"] for r in steps), (statistics.median(mfu) if mfu else None), len(steps)
f = lambda v, fmt: (fmt % v) if v is not None else "n/a"
print("| config | B x T | ours tok/s | ours MFU | torch tok/s | torch MFU | ours / torch | torch SDPA |")
print("|---|---|---|---|---|---|---|---|")
for name, bt in (("small_125m", "16 x 1024"), ("paper_569m", "%s x 4096" % mb569)):
    o_tok, o_mfu, n = ours(name)
    t = torch_rows.get(name, {})
    t_tok, t_mfu = t.get("tokens_per_s"), t.get("mfu")
    ratio = o_tok / t_tok if o_tok and t_tok else None
    print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
        name, bt, f(o_tok, "%.0f"), f(o_mfu and 100 * o_mfu, "%.1f%%"), f(t_tok, "%.0f"),
        f(t_mfu and 100 * t_mfu, "%.1f%%"), f(ratio, "**%.2f**"), t.get("sdpa", "n/a")))
print("ours: median of metrics.jsonl steps > 5; torch: median of 20 timed steps after 5 warm-up; "
      "MFU = tok/s x (6 x matmul params + 6 L C T) / 989 TFLOP/s")
EOF
echo "(total $(elapsed) s)"
cat "$OUT/summary.txt"
