#!/bin/bash
# gpu_dp_check.sh: data parallelism on a machine with 2 GPUs, in one call: the tiny config on the
# GPU, 2 ranks x micro-batch 4 (NCCL, started torchrun-style) against 1 rank x micro-batch 4 x 2
# accumulation steps, 20 steps each; prints the largest loss difference. Then the single-GPU
# command-line test (test/cli_train.sh takes the GPU path where there is one).
#   usage (device tool, kind nvidia-h200-x2, carry [".deps"]): bash scripts/gpu_dp_check.sh
set -u
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/gpu_dp_out}
mkdir -p "$OUT"
CJ=""; [ -d .deps/cjson ] && CJ="CJSON_PREFIX=.deps/cjson"
make -j32 SETUP=0 $CJ train_gpt > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
tmp=$(mktemp -d)
set -- --config configs/tiny.json --set train.micro_batch=4 --set train.batch_tokens=512 \
  --set train.steps=20 --set train.warmup_steps=2 --set eval.interval=10 --set eval.batches=2 \
  --set log.interval=5 --set train.comm_timeout_s=30 --device gpu
timeout 120 ./train_gpt "$@" --set log.dir="$tmp/one" > "$OUT/one.log" 2>&1
echo "1 GPU, 2 accumulation steps: exit $?"
port=$((20000 + RANDOM % 30000))
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 120 ./train_gpt "$@" --set log.dir="$tmp/two" > "$OUT/two.r$r.log" 2>&1 &
done
wait
grep -E "error|device" "$OUT/two.r0.log" "$OUT/two.r1.log" | head -5
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1"; }
losses "$tmp/one/metrics.jsonl" > "$tmp/a"; losses "$tmp/two/metrics.jsonl" > "$tmp/b"
echo "steps: 1 GPU $(wc -l < "$tmp/a"), 2 GPUs $(wc -l < "$tmp/b")"
paste "$tmp/a" "$tmp/b" | awk '{d = $2 - $4; if (d < 0) d = -d; if (d > m) m = d}
  END {printf "2 GPUs vs 1 GPU x 2 accumulation: largest loss difference over %d steps %.3g\n", NR, m}'
grep -E "tok/s" "$OUT/one.log" | tail -1; grep -E "tok/s" "$OUT/two.r0.log" | tail -1
echo "== cli_train.sh (single GPU)"
TRAIN_GPT=./train_gpt timeout 100 sh test/cli_train.sh > "$OUT/cli_train.log" 2>&1
echo "cli_train: $(grep -c '^ok - ' "$OUT/cli_train.log") ok, $(grep -c '^FAIL' "$OUT/cli_train.log") FAIL"
grep '^FAIL' "$OUT/cli_train.log" | head -5
