#!/bin/sh
# cli_passkey.sh: passkey retrieval and the evaluation from the command line, on the CPU:
# `passkey generate` (sizes, layout, determinism), a short run with passkey mixing and periodic
# passkey evaluation (metrics lines; validation loss per position bucket and per source that add
# up to the overall loss), `passkey eval` from its checkpoint (table and JSON), an exact resume
# with mixing on, the errors of configs that cannot hold a passkey, and the reduced-scale plan's
# configs through --dry-run.
# Runs from the repo root after `make`; TRAIN_GPT overrides the binary.
BIN=${TRAIN_GPT:-./train_gpt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

"$BIN" passkey --help >"$tmp/help" 2>&1
check "passkey --help" "$(head -3 "$tmp/help")" grep -q "passkey generate --data GLOB" "$tmp/help"

# generate: 3 distances x 4 sequences of 128 tokens from the Austen validation text
gen() { "$BIN" passkey generate --data 'data/austen/val_*.bin' --seq-len 128 --samples 4 --min-distance 24 \
          --seed "$1" --out "$2" >"$tmp/gen.out" 2>&1; }
gen 5 "$tmp/pk.bin"; rc=$?
check "generate exits 0" "rc $rc: $(cat "$tmp/gen.out")" [ "$rc" -eq 0 ]
check "generate: a shard of n x T tokens and its index" "$(ls -l "$tmp")" python3 -c "
import json, os, struct, sys
d = '$tmp'
idx = json.load(open(d + '/pk.json'))
seqs = idx['sequences']
size = os.path.getsize(d + '/pk.bin')
head = struct.unpack('<3i', open(d + '/pk.bin', 'rb').read(12))
ok = idx['seq_len'] == 128 and len(seqs) == 12 and size == 1024 + 12 * 128 * 2 and head[2] == 12 * 128
ok = ok and [s['distance'] for s in seqs] == [24] * 4 + [48] * 4 + [seqs[-1]['distance']] * 4 and seqs[-1]['distance'] > 48
ok = ok and all(s['answer_pos'] == 128 - len(s['digits']) and 5 <= len(s['digits']) <= 7 for s in seqs)
sys.exit(0 if ok else 1)"
gen 5 "$tmp/pk2.bin"
check "generate: the same seed gives the same file" "files differ" cmp -s "$tmp/pk.bin" "$tmp/pk2.bin"
gen 6 "$tmp/pk3.bin"
check "generate: another seed another file" "files equal" sh -c "! cmp -s '$tmp/pk.bin' '$tmp/pk3.bin'"
"$BIN" passkey generate --data 'data/austen/val_*.bin' --seq-len 30 --out "$tmp/x.bin" >"$tmp/err" 2>&1; rc=$?
check "generate: a sequence too short is refused" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -ne 0 ] && grep -q 'does not fit a passkey sequence of 30 tokens' '$tmp/err' && [ ! -e '$tmp/x.bin' ]"

# A short run: T = 64, 5% ... 20% passkey rows, passkey evaluation every 3 steps.
run=$tmp/run
set -- --config configs/tiny.json --set model.n_layer=1 --set train.steps=6 --set train.warmup_steps=1 \
  --set eval.interval=3 --set eval.batches=4 --set eval.sample_interval=0 --set eval.passkey_interval=3 \
  --set eval.passkey_samples=4 --set eval.passkey_min_distance=8 --set data.passkey_fraction=0.2 \
  --set checkpoint.interval=3 --set log.interval=3 --set train.threads=2 --device cpu
"$BIN" "$@" --set "log.dir=$run" >"$tmp/out" 2>&1; rc=$?
check "run with passkey mixing and evaluation exits 0" "rc $rc: $(tail -3 "$tmp/out")" [ "$rc" -eq 0 ]
check "plan names the order and the passkey share" "$(grep -E '^data order|^evaluation' "$tmp/out")" \
  sh -c "grep -q '^data order: mixed (rows of 65 tokens from 1 source(s) in one seeded permutation) | passkey sequences: 20.0% of the rows' '$tmp/out' &&
         grep -q '^evaluation: 2048 validation tokens from 1 source(s) | passkey: 12 sequences at distances 8..' '$tmp/out'"
check "passkey accuracy printed" "$(grep passkey "$tmp/out" | head -3)" grep -q '^step 6/6 | passkey accuracy 8: ' "$tmp/out"
m=$run/metrics.jsonl
check "metrics: passkey at steps 0, 3, 6; validation per position and source" "$(grep -c passkey "$m") passkey lines" \
  python3 -c "
import json, math, sys
rows = [json.loads(l) for l in open('$m')]
pk = [r for r in rows if 'passkey' in r]
val = [r for r in rows if 'val_loss' in r]
ok = [r['step'] for r in pk] == [0, 3, 6] and [r['step'] for r in val] == [0, 3, 6]
for r in pk:
    p = r['passkey']
    ok = ok and p['distance'][0] == 8 and len(p['distance']) == len(p['accuracy']) == len(p['p_answer']) == len(p['chance'])
    ok = ok and all(0 <= a <= 1 for a in p['accuracy']) and all(n == 4 for n in p['n'])
for r in val:
    vp, vs = r['val_pos'], r['val_source']
    pos = sum(m * t for m, t in zip(vp['mean'], vp['tokens'])) / sum(vp['tokens'])
    src = sum(v['mean'] * v['tokens'] for v in vs.values()) / sum(v['tokens'] for v in vs.values())
    ok = ok and vp['start'] == [0, 8, 16, 32] and vp['end'] == [8, 16, 32, 64] and r['val_tokens'] == 2048
    ok = ok and abs(pos - r['val_loss']) < 1e-6 and abs(src - r['val_loss']) < 1e-6 and list(vs) == ['austen']
sys.exit(0 if ok else 1)"
check "summary.json has the final passkey accuracy" "$(cat "$run/summary.json")" grep -q '"final_passkey_accuracy": ' "$run/summary.json"

# passkey eval from the run's checkpoint
"$BIN" passkey eval --checkpoint "$run" --samples 3 --min-distance 8 --batch 2 --device cpu --json "$tmp/pk_eval.json" \
  >"$tmp/eval.out" 2>&1; rc=$?
check "passkey eval exits 0 and prints a row per distance" "rc $rc: $(cat "$tmp/eval.out")" \
  sh -c "[ $rc -eq 0 ] && grep -q 'step_000006.ckpt (step 6, bf16 attention, cpu), 9 sequences of 64 tokens' '$tmp/eval.out' &&
         [ \$(grep -cE '^ +(8|16|2[0-9]) +3 ' '$tmp/eval.out') -eq 3 ]"
check "passkey eval --json" "$(cat "$tmp/pk_eval.json")" python3 -c "
import json, sys
j = json.load(open('$tmp/pk_eval.json'))
sys.exit(0 if j['step'] == 6 and j['passkey']['n'] == [3, 3, 3] else 1)"
# without --min-distance a model too short for 512 starts at the largest power of two that fits
"$BIN" passkey eval --checkpoint "$run" --samples 2 --batch 2 --device cpu >"$tmp/eval_default.out" 2>&1; rc=$?
check "passkey eval's default distances fit a T = 64 model" "rc $rc: $(cat "$tmp/eval_default.out")" \
  sh -c "[ $rc -eq 0 ] && [ \$(grep -cE '^ +(16|2[0-9]) +2 ' '$tmp/eval_default.out') -eq 2 ]"
"$BIN" passkey eval --checkpoint "$tmp/nowhere" >"$tmp/err" 2>&1; rc=$?
check "passkey eval of a missing checkpoint: an error" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -ne 0 ] && grep -q 'nowhere' '$tmp/err'"

# Exact resume with passkey mixing: 3 steps, stop, resume to 6 = the uninterrupted run.
"$BIN" "$@" --set "log.dir=$tmp/split" --stop-after 3 >"$tmp/s1" 2>&1
"$BIN" "$@" --set "log.dir=$tmp/split" --resume >"$tmp/s2" 2>&1; rc=$?
losses() { grep '"loss"' "$1" | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
check "resume with passkey mixing reproduces the losses bit for bit" "rc $rc: $(losses "$m" | tr '\n' ' ') vs $(losses "$tmp/split/metrics.jsonl" | tr '\n' ' ')" \
  sh -c "[ $rc -eq 0 ] && [ \"\$(grep '\"loss\"' '$m' | sed 's/, \"tokens_per_s.*//')\" = \"\$(grep '\"loss\"' '$tmp/split/metrics.jsonl' | sed 's/, \"tokens_per_s.*//')\" ]"

# Configs that cannot hold a passkey, and the shards order with mixing.
"$BIN" --config configs/tiny.json --set model.seq_len=16 --set eval.passkey_interval=2 --set eval.passkey_min_distance=4 \
  --set "log.dir=$tmp/bad1" --device cpu >"$tmp/err" 2>&1; rc=$?
check "passkey evaluation on a too-short model is refused" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'eval.passkey_min_distance: 4 does not fit a passkey sequence of model.seq_len = 16' '$tmp/err' && [ ! -e '$tmp/bad1' ]"
"$BIN" --config configs/tiny.json --set model.seq_len=16 --set data.passkey_fraction=0.1 \
  --set "log.dir=$tmp/bad2" --device cpu >"$tmp/err" 2>&1; rc=$?
check "passkey mixing into too-short rows is refused" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'data.passkey_fraction: a passkey sequence takes' '$tmp/err' && [ ! -e '$tmp/bad2' ]"
pattern_shards "$tmp" small_train.bin:3000:1 small_val.bin:1000:2
"$BIN" --config configs/tiny.json --set model.vocab_size=512 --set eval.passkey_interval=2 --set eval.passkey_min_distance=8 \
  --set "data.train=$tmp/small_train.bin" --set "data.val=$tmp/small_val.bin" \
  --set "log.dir=$tmp/bad3" --device cpu >"$tmp/err" 2>&1; rc=$?
check "passkey with a vocabulary other than GPT-2's is refused" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'GPT-2 vocabulary' '$tmp/err' && [ ! -e '$tmp/bad3' ]"
"$BIN" --config configs/tiny.json --set data.order=shards --set data.passkey_fraction=0.1 --dry-run >"$tmp/err" 2>&1; rc=$?
check "passkey mixing in the shards order is refused" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'needs data.order = \"mixed\"' '$tmp/err'"

# The reduced-scale plan's configs (docs/results.md) are valid and plan what the plan says.
for cfg in configs/reduced_125m_t4k.json configs/reduced_125m_t8k_amplified.json; do
  "$BIN" --config "$cfg" --dry-run >"$tmp/dry" 2>&1; rc=$?
  check "$cfg: --dry-run (124M parameters, fits one H200)" "rc $rc: $(tail -3 "$tmp/dry")" \
    sh -c "[ $rc -eq 0 ] && grep -q 'total parameters: 123587328' '$tmp/dry' &&
           awk '/^  total/ { exit !(\$2 < 100) }' '$tmp/dry'"
done
