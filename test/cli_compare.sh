#!/bin/sh
# cli_compare.sh: the mode comparison's statistics (test/test_compare_stats.py: t quantiles, paired
# t-intervals and verdicts against hand-computed cases, the summary of synthetic runs), then
# scripts/compare_modes.py --config configs/tiny.json end to end on the CPU with 2 modes x 2 seeds
# (a short schedule): the runs, an unfinished one resumed, complete ones skipped on a rerun, the
# summary (JSON and markdown) and, where matplotlib is present, the plots.
# Runs from the repo root after `make`; TRAIN_GPT overrides the binary.
BIN=${TRAIN_GPT:-./train_gpt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

python3 test/test_compare_stats.py
check "statistics unit tests exit 0" "see the FAIL lines above" [ $? -eq 0 ]

out=$tmp/cmp
set -- --config configs/tiny.json --modes bf16,fp8_dm --seeds 1,2 --out "$out" --binary "$BIN" \
  --set model.n_layer=1 --set train.micro_batch=4 --set train.steps=8 --set train.warmup_steps=1 \
  --set eval.interval=4 --set eval.batches=2 --set eval.sample_interval=0 --set eval.passkey_interval=4 \
  --set eval.passkey_samples=2 --set eval.passkey_min_distance=8 --set data.passkey_fraction=0.1 \
  --set checkpoint.interval=4 --set log.interval=4 --set train.threads=2 --set train.device=cpu
# an unfinished run the comparison must resume: bf16 seed 2 stopped after step 4
"$BIN" --config configs/tiny.json --set precision.attention=bf16 --set "log.dir=$out/bf16/seed_2" --set train.seed=2 \
  --set data.seed=2 --set model.n_layer=1 --set train.micro_batch=4 --set train.steps=8 --set train.warmup_steps=1 \
  --set eval.interval=4 --set eval.batches=2 --set eval.sample_interval=0 --set eval.passkey_interval=4 \
  --set eval.passkey_samples=2 --set eval.passkey_min_distance=8 --set data.passkey_fraction=0.1 \
  --set checkpoint.interval=4 --set log.interval=4 --set train.threads=2 --set train.device=cpu --stop-after 4 \
  >"$tmp/pre.log" 2>&1
python3 scripts/compare_modes.py "$@" >"$tmp/cmp.log" 2>&1; rc=$?
check "compare_modes: 2 modes x 2 seeds end to end" "rc $rc: $(tail -5 "$tmp/cmp.log")" [ "$rc" -eq 0 ]
check "compare_modes resumes the unfinished run" "$(grep 'bf16 seed 2' "$tmp/cmp.log" | head -2)" \
  grep -q '^\[bf16 seed 2\] resuming after step 4: ' "$tmp/cmp.log"
check "summary: per-mode statistics, the paired comparison and its verdicts" "$(head -c 600 "$out/summary.json")" \
  python3 -c "
import json, sys
s = json.load(open('$out/summary.json'))
c = s['comparisons']
ok = s['seeds'] == [1, 2] and set(s['per_mode']) == {'bf16', 'fp8_dm'} and len(c) == 1
ok = ok and (c[0]['a'], c[0]['b']) == ('fp8_dm', 'bf16') and c[0]['metrics']['final_val']['n'] == 2
ok = ok and c[0]['metrics']['final_val']['verdict_code'] in ('gap', 'ruled_out', 'undecided')
ok = ok and len(c[0]['train_diff']['per_seed']) == 2 and len(c[0]['train_diff']['mean']) == 8
ok = ok and all(r['complete'] and r['steps'] == 8 for r in s['runs']) and len(s['runs']) == 4
ok = ok and s['per_mode']['bf16']['final_val']['n'] == 2 and s['per_mode']['bf16']['val_by_position'][0]['end'] == 8
sys.exit(0 if ok else 1)"
check "summary.md: tables and verdicts" "$(head -20 "$out/summary.md")" \
  sh -c "grep -q '^| \`fp8_dm\` − \`bf16\` | final val loss | s1: ' '$out/summary.md' &&
         grep -q '^| \`bf16\` | 1,2 | ' '$out/summary.md' && grep -q 'Passkey accuracy per distance' '$out/summary.md'"
if python3 -c 'import matplotlib' 2>/dev/null; then
  check "plots written" "$(ls "$out")" sh -c "[ -s '$out/curves.png' ] && [ -s '$out/positions.png' ]"
else
  check "no matplotlib: a note, no plots, the summary all the same" "$(grep matplotlib "$tmp/cmp.log")" \
    sh -c "grep -q 'matplotlib is not installed' '$tmp/cmp.log' && [ ! -e '$out/curves.png' ]"
fi
python3 scripts/compare_modes.py "$@" >"$tmp/cmp2.log" 2>&1; rc=$?
check "a rerun skips the complete runs" "rc $rc: $(head -4 "$tmp/cmp2.log")" \
  sh -c "[ $rc -eq 0 ] && [ \$(grep -c ': skipped$' '$tmp/cmp2.log') -eq 4 ]"
python3 scripts/compare_modes.py --config configs/tiny.json --modes bf16,fp8_dm --seeds 1,x --out "$out" \
  >"$tmp/err" 2>&1; rc=$?
check "bad --seeds: an error" "rc $rc: $(cat "$tmp/err")" sh -c "[ $rc -eq 1 ] && grep -q 'not a list of integers' '$tmp/err'"
python3 scripts/compare_modes.py --config configs/tiny.json --set train.seed=3 --out "$out" >"$tmp/err" 2>&1; rc=$?
check "--set train.seed: refused (--seeds sets it)" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'this script sets train.seed itself' '$tmp/err'"
