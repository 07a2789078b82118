#!/bin/sh
# cli_corpus.sh: the corpus tools and the one-call run script, on the CPU:
# - scripts/corpus/clean_text.py: each rule (plain, dict, info) on documents with known residue;
# - scripts/prepare_corpus.sh --pack / --unpack (scripts/corpus/pack.py): the round trip bit for bit,
#   a size limit met by cutting the training shards (validation whole), a corrupt file and a
#   differing shard refused with nothing written;
# - scripts/run_one_call.sh: --help, the start-up check (dry run, refusal), bad arguments, a whole
#   call on the CPU backend (unpacking the corpus, training to a token budget, the small files), and
#   the watchdog stopping a run that cannot end inside its limit.
# Runs from the repo root after `make`; TRAIN_GPT overrides the binary.
BIN=${TRAIN_GPT:-./train_gpt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

# --- cleaning ---------------------------------------------------------------------------------------
mkdir -p "$tmp/plain" "$tmp/dict" "$tmp/info"
printf '     Indented   text  with   runs.   \n\n\n\n\tTabbed line\nshort\n' > "$tmp/plain/a.txt"
printf 'x\n' > "$tmp/plain/tiny.txt"
printf 'accession (n.)\n      A coming to.\n      [1913 Webster]\n   [PJC] [Webster 1913 Suppl.]\n   2. Increase by something added [sic] here.\n' > "$tmp/dict/a.txt"
{
  printf 'The os module\n*************\n\nUse the *note pty: d2. module.  See *note\n     O_NONBLOCK: b0e, for flags.\n'
  printf 'The descriptor is *note non-inheritable: bd9.  For more.\n\n* Menu:\n\n* Files::\n* Process Management: Process Mgmt.\n\n'
  printf 'Text after the menu.\n* ! (exclamation); in cmd: Cmd Objects.    (line   27)\n* ! (bang); in glob: glob -- Unix style.\n'
  printf '                                                             (line  228)\n---------- Footnotes ----------\n'
  printf '(1) https://example.org\n'
} > "$tmp/info/a.txt"
printf 'Tag Table:\nNode: Top\177355\nRef: contents doc\177559\n' > "$tmp/info/tags.txt"
python3 scripts/corpus/clean_text.py plain "$tmp/plain" --min-bytes 8 >"$tmp/clean.out" 2>&1
check "clean plain: indentation, runs of spaces, blank lines; short documents deleted" "$(cat "$tmp/plain/a.txt" 2>&1)" \
  sh -c "printf 'Indented text with runs.\n\nTabbed line\nshort\n' | cmp -s - '$tmp/plain/a.txt' && [ ! -e '$tmp/plain/tiny.txt' ] &&
         grep -q '1 documents kept, 1 deleted' '$tmp/clean.out'"
python3 scripts/corpus/clean_text.py dict "$tmp/dict" --min-bytes 8 >/dev/null 2>&1
check "clean dict: tag lines dropped, bracketed text inside a line kept" "$(cat "$tmp/dict/a.txt")" \
  sh -c "printf 'accession (n.)\nA coming to.\n2. Increase by something added [sic] here.\n' | cmp -s - '$tmp/dict/a.txt'"
python3 scripts/corpus/clean_text.py info "$tmp/info" --min-bytes 8 >/dev/null 2>&1
check "clean info: index, menus, tag table, rules, footnote bars dropped; references kept as their labels" \
  "$(cat "$tmp/info/a.txt")" sh -c "printf 'The os module\n\nUse the pty module. See O_NONBLOCK, for flags.\nThe descriptor is non-inheritable. For more.\n\nText after the menu.\n(1) https://example.org\n' |
    cmp -s - '$tmp/info/a.txt' && [ ! -e '$tmp/info/tags.txt' ]"

sh scripts/prepare_corpus.sh --help >"$tmp/help" 2>&1; rc=$?
check "prepare_corpus.sh --help" "rc $rc: $(head -3 "$tmp/help")" \
  sh -c "[ $rc -eq 0 ] && grep -q -- '--pack FILE writes every prepared shard' '$tmp/help' && grep -q 'Cleaning' '$tmp/help'"
sh scripts/prepare_corpus.sh --frobnicate >"$tmp/err" 2>&1; rc=$?
check "prepare_corpus.sh: an unknown option is an error" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -ne 0 ] && grep -q \"unknown option '--frobnicate'\" '$tmp/err'"

# --- packing ----------------------------------------------------------------------------------------
c=$tmp/corpus
mkdir -p "$c/alpha" "$c/beta"
pattern_shards "$c/alpha" train_000000.bin:60000:1 val_000000.bin:4000:2
pattern_shards "$c/beta" train_000000.bin:40000:3 train_000001.bin:20000:4 val_000000.bin:3000:5
printf '# Corpus sources\n' > "$c/SOURCES.md"
CORPUS_DIR=$c sh scripts/prepare_corpus.sh --pack "$tmp/full.tar.xz" >"$tmp/pack.out" 2>&1; rc=$?
check "pack exits 0" "rc $rc: $(cat "$tmp/pack.out")" [ "$rc" -eq 0 ]
CORPUS_DIR=$tmp/back sh scripts/prepare_corpus.sh --unpack "$tmp/full.tar.xz" >"$tmp/unpack.out" 2>&1; rc=$?
check "unpack: the round trip is bit for bit" "rc $rc: $(cat "$tmp/unpack.out")" \
  sh -c "[ $rc -eq 0 ] && diff -r '$c' '$tmp/back' >/dev/null && grep -q '5 shards checked, 6 files written' '$tmp/unpack.out'"
CORPUS_DIR=$tmp/back sh scripts/prepare_corpus.sh --unpack "$tmp/full.tar.xz" >"$tmp/unpack2.out" 2>&1; rc=$?
check "unpack again: identical shards are left as they are" "rc $rc: $(cat "$tmp/unpack2.out")" \
  sh -c "[ $rc -eq 0 ] && grep -q '0 files written' '$tmp/unpack2.out'"
# a limit the pattern shards (little to compress) cannot meet whole: the training shards are cut
CORPUS_DIR=$c sh scripts/prepare_corpus.sh --pack "$tmp/small.tar.xz" --max-mib 0.02 >"$tmp/pack2.out" 2>&1; rc=$?
check "pack under a limit: the file fits, the training shards cut to one fraction, validation whole" \
  "rc $rc: $(cat "$tmp/pack2.out")" python3 -c "
import os, struct, sys
sys.path.insert(0, 'scripts/corpus')
import pack
ok = $rc == 0 and os.path.getsize('$tmp/small.tar.xz') <= 0.02 * 2**20
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    pack.unpack('$tmp/small.tar.xz', '$tmp/cut')
count = lambda p: struct.unpack('<3i', open(p, 'rb').read(12))[2]
fa = count('$tmp/cut/alpha/train_000000.bin') / 60000
fb = count('$tmp/cut/beta/train_000001.bin') / 20000
ok = ok and 0.05 < fa < 1 and abs(fa - fb) < 1e-3 and count('$tmp/cut/beta/val_000000.bin') == 3000
a = open('$tmp/cut/alpha/train_000000.bin', 'rb').read()[1024:]
ok = ok and a == open('$c/alpha/train_000000.bin', 'rb').read()[1024:1024 + len(a)]
sys.exit(0 if ok else 1)"
python3 -c "
d = bytearray(open('$tmp/full.tar.xz', 'rb').read()); d[len(d) // 2] ^= 0x55
open('$tmp/bad.tar.xz', 'wb').write(d)"
CORPUS_DIR=$tmp/bad sh scripts/prepare_corpus.sh --unpack "$tmp/bad.tar.xz" >"$tmp/err" 2>&1; rc=$?
check "unpack of a corrupt file: an error, nothing written" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -ne 0 ] && grep -q 'corrupt' '$tmp/err' && [ ! -e '$tmp/bad' ]"
mkdir -p "$tmp/other/alpha"
cp "$c/beta/val_000000.bin" "$tmp/other/alpha/val_000000.bin"
CORPUS_DIR=$tmp/other sh scripts/prepare_corpus.sh --unpack "$tmp/full.tar.xz" >"$tmp/err" 2>&1; rc=$?
check "unpack over a differing shard: refused, nothing written" "rc $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -ne 0 ] && grep -q 'already exists and differs' '$tmp/err' && [ ! -e '$tmp/other/beta' ] &&
         cmp -s '$c/beta/val_000000.bin' '$tmp/other/alpha/val_000000.bin'"

# --- the one-call run script ------------------------------------------------------------------------
R="bash scripts/run_one_call.sh"
$R --help >"$tmp/help" 2>&1; rc=$?
check "run_one_call --help" "rc $rc" sh -c "[ $rc -eq 0 ] && grep -q 'usage: scripts/run_one_call.sh --config FILE' '$tmp/help'"
$R --config configs/reduced_125m_t4k.json --rate 400000 --dry-run fp8_naive:1 fp8_dm:1 >"$tmp/dry" 2>&1; rc=$?
check "dry run of the standard recipe: the plan fits" "rc $rc: $(cat "$tmp/dry")" \
  sh -c "[ $rc -eq 0 ] && grep -q '1100 steps x 131072 tokens = 144179200 tokens per run' '$tmp/dry' && grep -q 'ETA check' '$tmp/dry'"
$R --config configs/reduced_125m_t4k.json --rate 100000 --dry-run fp8_dm:1 >"$tmp/dry" 2>&1; rc=$?
check "a plan that cannot finish is refused at the start" "rc $rc: $(cat "$tmp/dry")" \
  sh -c "[ $rc -eq 3 ] && grep -q 'REFUSED (before the build)' '$tmp/dry' && grep -q 'lower --tokens' '$tmp/dry'"
$R --config configs/reduced_125m_t4k.json --dry-run fp8_fast:1 >"$tmp/err" 2>&1; rc=$?
check "an unknown mode is an error" "rc $rc: $(cat "$tmp/err")" sh -c "[ $rc -eq 2 ] && grep -q \"unknown mode 'fp8_fast'\" '$tmp/err'"
$R --config configs/reduced_125m_t4k.json --dry-run >"$tmp/err" 2>&1; rc=$?
check "no run given is an error" "rc $rc: $(cat "$tmp/err")" sh -c "[ $rc -eq 2 ] && grep -q 'no run given' '$tmp/err'"
$R --config configs/reduced_125m_t4k.json --rate 800000 --per-gpu 2 --dry-run fp8_naive:1 fp8_dm:1 >"$tmp/dry" 2>&1; rc=$?
check "--per-gpu 2: each run plans half the GPU's rate" "rc $rc: $(cat "$tmp/dry")" \
  sh -c "[ $rc -eq 0 ] && grep -q 'planned 400000 tok/s a run (2 a GPU)' '$tmp/dry'"
$R --config configs/reduced_125m_t4k.json --per-gpu 0 --dry-run fp8_dm:1 >"$tmp/err" 2>&1; rc=$?
check "--per-gpu 0 is an error" "rc $rc: $(cat "$tmp/err")" sh -c "[ $rc -eq 2 ] && grep -q 'must be positive' '$tmp/err'"

# A whole call on the CPU: a tiny model on shards that come out of a packed corpus.
mkdir -p "$tmp/src/austen"
cp data/austen/train_000000.bin data/austen/val_000000.bin "$tmp/src/austen/"
python3 scripts/corpus/pack.py pack "$tmp/src" "$tmp/austen.tar.xz" >/dev/null 2>&1
TINY="--set model.n_layer=1 --set train.micro_batch=4 --set train.threads=2 --set eval.interval=4 --set eval.batches=2
  --set eval.sample_interval=0 --set eval.passkey_interval=4 --set eval.passkey_samples=2 --set eval.passkey_min_distance=8
  --set data.passkey_fraction=0.1 --set log.interval=2"
set -f
$R --config configs/tiny.json --device cpu --no-build --tokens 2048 --rate 500 --limit-s 200 --out "$tmp/call" \
  --corpus "$tmp/austen.tar.xz" --corpus-dir "$tmp/unpacked" $TINY \
  --set "data.train=$tmp/unpacked/*/train_*.bin" --set "data.val=$tmp/unpacked/*/val_*.bin" fp8_dm:3 >"$tmp/call.out" 2>&1; rc=$?
check "a whole call on the CPU: unpacked, trained to the budget, small files kept" "rc $rc: $(tail -5 "$tmp/call.out")" \
  python3 -c "
import json, os, sys
d = '$tmp/call/fp8_dm/seed_3'
files = sorted(os.listdir(d))
rows = [json.loads(l) for l in open(d + '/metrics.jsonl')]
cfg = json.load(open(d + '/config.json'))
ok = $rc == 0 and files == ['config.json', 'metrics.jsonl', 'summary.json', 'train.log']
ok = ok and [r['step'] for r in rows if 'loss' in r] == list(range(1, 9)) and any('passkey' in r for r in rows)
ok = ok and cfg['train']['seed'] == 3 and cfg['data']['seed'] == 3 and cfg['precision']['attention'] == 'fp8_dm'
ok = ok and cfg['checkpoint']['at_end'] is False and not os.path.exists(d + '/checkpoints')
ok = ok and os.path.isfile('$tmp/unpacked/austen/train_000000.bin')
sys.exit(0 if ok else 1)"
check "the call's results are what compare_modes.py reads" "$(cat "$tmp/cs.out" 2>/dev/null)" \
  sh -c "python3 scripts/compare_modes.py --config configs/tiny.json --modes fp8_dm --seeds 3 --out '$tmp/call' \
           --summarize-only --no-plot >'$tmp/cs.out' 2>&1 && grep -q '^| \`fp8_dm\` | 3 | ' '$tmp/call/summary.md'"
# --probe: attn-check at T = 4096, d = 128 in both formats, then each run alone and both side by
# side; a table of tokens/s last, nothing trained beyond the probe's steps
$R --config configs/tiny.json --device cpu --no-build --probe 2 --per-gpu 2 --limit-s 300 --out "$tmp/probe" $TINY \
  --set "data.train=$tmp/unpacked/*/train_*.bin" --set "data.val=$tmp/unpacked/*/val_*.bin" bf16:1 fp8_dm:1 \
  >"$tmp/probe.out" 2>&1; rc=$?
check "--probe: attn-check and a tokens/s table, alone and shared" "rc $rc: $(tail -8 "$tmp/probe.out")" \
  sh -c "[ $rc -eq 0 ] && [ \$(grep -cE '^attn-check cpu T 4096 d 128 e(4m3|5m2) +PASS' '$tmp/probe.out') -eq 2 ] &&
         [ \$(grep -cE '^(alone|shared) (bf16|fp8_dm):1 +[0-9]+ tok/s' '$tmp/probe.out') -eq 4 ] &&
         [ ! -e '$tmp/probe/fp8_dm' ]"
# The watchdog: a claimed rate far above the CPU's passes the start, then the run is stopped.
# (2M tokens: minutes at any CPU speed, so the limit always cuts it short)
$R --config configs/tiny.json --device cpu --no-build --tokens 2048000 --rate 1000000000 --limit-s 40 --out "$tmp/stop" \
  $TINY fp8_dm:1 >"$tmp/stop.out" 2>&1; rc=$?
check "the watchdog stops a run that cannot end inside the limit" "rc $rc: $(tail -4 "$tmp/stop.out")" \
  sh -c "[ $rc -eq 4 ] && grep -q 'STOPPED fp8_dm:1: at the measured rate' '$tmp/stop.out' &&
         grep -q STOPPED '$tmp/stop/fp8_dm/seed_1/train.log' && [ -s '$tmp/stop/fp8_dm/seed_1/metrics.jsonl' ]"
set +f
