#!/bin/sh
# cli_corpus.sh: the corpus tools, on the CPU:
# - scripts/corpus/clean_text.py: each rule (plain, dict, info) on documents with known residue;
# - scripts/prepare_corpus.sh --pack / --unpack (scripts/corpus/pack.py): the round trip bit for bit,
#   a size limit met by cutting the training shards (validation whole), a corrupt file and a
#   differing shard refused with nothing written.
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
