#!/bin/sh
# cli_train.sh: a short training run of a tiny model on generated shards (device auto: the CPU,
# or the GPU where there is one, then with MFU lines and its memory plan checked against
# --dry-run): progress lines, metrics, the resolved config, checkpoints with checkpoint.keep,
# sampling from the result; the --dry-run parameter count of the paper's 1.67B config and the
# tiny config's plan summing up.
# Runs from the repo root after `make`; TRAIN_GPT overrides the binary.
BIN=${TRAIN_GPT:-./train_gpt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

pattern_shards "$tmp" train_000000.bin:3000:1 train_000001.bin:2000:2 val_000000.bin:1500:3

run=$tmp/run
set -- --config configs/tiny.json --set model.vocab_size=512 --set model.n_layer=1 \
  --set model.seq_len=16 --set model.ffn_hidden=256 --set train.micro_batch=2 \
  --set train.batch_tokens=64 --set train.steps=12 --set train.warmup_steps=2 \
  --set "data.train=$tmp/train_*.bin" --set "data.val=$tmp/val_*.bin" \
  --set eval.interval=6 --set eval.batches=2 --set checkpoint.interval=4 --set checkpoint.keep=2 \
  --set log.interval=3 --set "log.dir=$run" --set train.device=auto
"$BIN" "$@" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "train exits 0" "rc $rc: $(tail -3 "$tmp/err")" [ "$rc" -eq 0 ]
if grep -q '^device: gpu' "$tmp/out"; then  # a machine with a GPU: auto took it
  ok "device note (GPU machine: auto took the GPU)"
  n_prog=$(grep -c '^step [0-9]*/12 | loss' "$tmp/out"); n_mfu=$(grep -Ec '^step [0-9]*/12 \| loss .*\| MFU ([0-9.]+%|n/a \(unknown GPU peak\))$' "$tmp/out")
  check "MFU on every GPU progress line, never negative" "$n_mfu of $n_prog lines" [ "$n_prog" -gt 0 -a "$n_mfu" -eq "$n_prog" ]
  # The plan the GPU backend printed is --dry-run's, byte for byte.
  "$BIN" "$@" --dry-run >"$tmp/dry_gpu" 2>&1
  sed -n '/^GPU memory plan/,/^  total/p' "$tmp/out" | tail -n +2 >"$tmp/plan_run"
  sed -n '/^memory plan:/,/^  total/p' "$tmp/dry_gpu" | tail -n +2 >"$tmp/plan_dry"
  check "GPU memory plan equals --dry-run's" "$(diff "$tmp/plan_run" "$tmp/plan_dry" | head -4 | tr '\n' ' ')" \
    sh -c "[ -s '$tmp/plan_run' ] && cmp -s '$tmp/plan_run' '$tmp/plan_dry'"
else
  check "device note" "$(head -2 "$tmp/out")" grep -q "training on the CPU" "$tmp/out"
  if [ ! -e /proc/driver/nvidia ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    check "device note: no NVIDIA driver here, and it says so" "$(head -1 "$tmp/out")" \
      grep -q '^note: no GPU (no NVIDIA driver found): training on the CPU$' "$tmp/out"
  fi
  check "MFU n/a printed once" "$(grep -c 'MFU n/a' "$tmp/out") times" [ "$(grep -c 'MFU n/a' "$tmp/out")" -eq 1 ]
fi
check "progress lines" "$(cat "$tmp/out")" grep -Eq '^step 12/12 \| loss [0-9.]+ \| lr [0-9.e+-]+ \| norm [0-9.]+ \| [0-9]+ tok/s \| ETA ' "$tmp/out"
check "the first progress line's ETA waits for a measured step" "$(grep '^step 1/12 |' "$tmp/out")" \
  grep -Eq '^step 1/12 \| .* \| ETA pending( |$)' "$tmp/out"
check "later progress lines have an ETA" "$(grep '^step 3/12 |' "$tmp/out")" \
  grep -Eq '^step 3/12 \| .* \| ETA [0-9]+(s|m[0-9]{2}s|h[0-9]{2}m)( |$)' "$tmp/out"
check "progress every log.interval" "$(grep -c '^step [0-9]*/12 | loss' "$tmp/out") lines" \
  [ "$(grep -c '^step [0-9]*/12 | loss' "$tmp/out")" -eq 5 ]  # steps 1, 3, 6, 9, 12
check "val loss printed" "$(cat "$tmp/out")" grep -q '^step 12/12 | val loss' "$tmp/out"
check "summary printed" "$(tail -2 "$tmp/out")" grep -q '^done: 12 steps | final train loss' "$tmp/out"
m=$run/metrics.jsonl
n_steps=$(grep -c '"loss"' "$m" 2>/dev/null)
check "metrics has 12 steps" "$n_steps lines" [ "$n_steps" = 12 ]
check "metrics has 3 evals (steps 0, 6, 12)" "$(grep -c val_loss "$m")" [ "$(grep -c '"val_loss"' "$m")" = 3 ]
check "metrics is JSON" "a line failed to parse" python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$m')]
keys = {'step', 'loss', 'lr', 'grad_norm', 'tokens_per_s', 'elapsed_s'}
sys.exit(0 if all(keys <= set(r) for r in rows if 'loss' in r) and [r['step'] for r in rows if 'loss' in r] == list(range(1, 13)) else 1)"
check "loss decreases" "first/last $(head -1 "$m" | cut -c1-60) / $(grep '"loss"' "$m" | tail -1 | cut -c1-60)" python3 -c "
import json
rows = [json.loads(l) for l in open('$m') if '\"loss\"' in l]
exit(0 if rows[-1]['loss'] < rows[0]['loss'] else 1)"
check "resolved config written" "missing $run/config.json" [ -f "$run/config.json" ]
"$BIN" --config "$run/config.json" --dry-run >"$tmp/dry" 2>&1
rc=$?
check "resolved config reloads (--dry-run)" "rc $rc: $(tail -3 "$tmp/dry")" [ "$rc" -eq 0 ]
ck=$run/checkpoints
n_ck=$(ls "$ck" | grep -c '^step_.*\.ckpt$')
check "checkpoint.keep respected" "$(ls "$ck" | tr '\n' ' ')" [ "$n_ck" -eq 2 ] 
check "newest checkpoints kept" "$(ls "$ck" | tr '\n' ' ')" [ -f "$ck/step_000008.ckpt" -a -f "$ck/step_000012.ckpt" ]
check "latest points at step 12" "$(cat "$ck/latest")" [ "$(cat "$ck/latest")" = step_000012.ckpt ]
check "no temp files left" "$(ls "$ck" "$run" | tr '\n' ' ')" [ -z "$(ls "$ck" "$run" | grep '\.tmp\.')" ]

# A finished run refuses to be overwritten and resuming it has nothing left to do.
"$BIN" "$@" >"$tmp/out2" 2>"$tmp/err2"
rc=$?
check "rerun into the same run dir refused" "rc $rc: $(cat "$tmp/err2")" grep -q 'already holds a run' "$tmp/err2"
check "the refusal says what to do: resume, another log.dir, or remove it" "$(cat "$tmp/err2")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'pass --resume to continue it .*, choose another log.dir via --set log.dir=..., or remove $run to start over' '$tmp/err2'"
"$BIN" "$@" --resume >"$tmp/out2" 2>"$tmp/err2"
check "resume of a finished run: nothing to do" "$(cat "$tmp/out2" "$tmp/err2")" grep -q 'nothing to do' "$tmp/out2"

# checkpoint.at_end=false (throughput runs): no checkpoint at all with interval 0, the summary still.
run2=$tmp/run_noend
"$BIN" "$@" --set train.steps=3 --set checkpoint.interval=0 --set checkpoint.at_end=false \
  --set "log.dir=$run2" >"$tmp/out3" 2>"$tmp/err3"
rc=$?
check "checkpoint.at_end=false run exits 0" "rc $rc: $(tail -3 "$tmp/err3")" [ "$rc" -eq 0 ]
check "checkpoint.at_end=false writes no checkpoint" "$(ls -R "$run2" | tr '\n' ' ')" \
  sh -c "! ls '$run2/checkpoints' 2>/dev/null | grep -q 'ckpt'"
check "checkpoint.at_end=false still writes summary.json" "$(ls "$run2" | tr '\n' ' ')" [ -s "$run2/summary.json" ]

# Sampling needs only the checkpoint (its config is stored inside).
"$BIN" sample --checkpoint "$run" --tokens 8 --seed 7 >"$tmp/s1" 2>"$tmp/serr"
rc=$?
check "sample exits 0" "rc $rc: $(cat "$tmp/serr")" [ "$rc" -eq 0 ]
check "sample prints something" "empty output" [ -s "$tmp/s1" ]
"$BIN" sample --checkpoint "$ck/step_000012.ckpt" --tokens 8 --seed 7 >"$tmp/s2" 2>/dev/null
check "sample is deterministic for a seed" "$(cat "$tmp/s1") vs $(cat "$tmp/s2")" cmp -s "$tmp/s1" "$tmp/s2"
"$BIN" sample --checkpoint "$ck/step_000012.ckpt" --tokens 8 --temperature 0 >"$tmp/s3" 2>/dev/null
rc=$?
check "greedy sample runs" "rc $rc" [ "$rc" -eq 0 -a -s "$tmp/s3" ]

# --dry-run of the paper's 1.67B config: the count is within 1% of 1.67e9.
before=$(ls -d runs/paper_1p67b 2>/dev/null)
"$BIN" --config configs/paper_1p67b.json --dry-run >"$tmp/dry" 2>&1
rc=$?
total=$(sed -n 's/^total parameters: \([0-9]*\).*/\1/p' "$tmp/dry")
check "dry-run 1.67B exits 0" "rc $rc: $(tail -2 "$tmp/dry")" [ "$rc" -eq 0 ]
check "dry-run 1.67B count within 1%" "total '$total'" python3 -c "exit(0 if abs(int('${total:-0}') / 1.67e9 - 1) < 0.01 else 1)"
check "dry-run prints a memory plan" "$(tail -3 "$tmp/dry")" grep -q 'memory plan' "$tmp/dry"
# The tiny config's plan (bytes column): every category > 0 and the total is their sum.
"$BIN" --config configs/tiny.json --dry-run >"$tmp/dry_tiny" 2>&1
check "dry-run plan: categories > 0, total is their sum" "$(tail -8 "$tmp/dry_tiny" | tr '\n' '|')" python3 -c "
import re, sys
rows = [l for l in open('$tmp/dry_tiny') if re.match(r'  \S.* +[0-9.]+ +[0-9]+$', l)]
b = [int(l.split()[-1]) for l in rows]
sys.exit(0 if len(b) == 7 and all(x > 0 for x in b) and sum(b[:6]) == b[6] else 1)"
"$BIN" --config configs/paper_1p67b.json --dry-run --world-size 8 --zero1 --micro-batch 1 >"$tmp/dry8" 2>&1
check "dry-run with world size and zero1" "$(tail -2 "$tmp/dry8")" grep -q 'world_size 8, zero1 on, micro_batch 1' "$tmp/dry8"
check "dry-run wrote nothing" "runs/paper_1p67b appeared" [ -n "$before" -o ! -e runs/paper_1p67b ]
exit 0
