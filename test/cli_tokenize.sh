#!/bin/sh
# CLI test of `train_gpt tokenize`: shard format, the train/val split, refusals and errors.
# Runs from the repository root after `make` (TRAIN_GPT=path overrides ./train_gpt).
# Prints "ok - name" / "FAIL - name: detail" lines.
BIN=${TRAIN_GPT:-./train_gpt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

ok() { echo "ok - $1"; }
fail() { echo "FAIL - $1: $2"; fails=$((fails + 1)); }
check() {  # name, detail, command...: ok when the command succeeds
  name=$1; detail=$2; shift 2
  if "$@"; then ok "$name"; else fail "$name" "$detail"; fi
}

# shard FILE: prints "magic version count" then the tokens, one per line; exits 1 when the
# header and the file size disagree (read independently of the C code, with stdlib Python).
shard() {
  python3 - "$1" <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
if len(data) < 1024:
    print("short file"); sys.exit(1)
magic, version, count = struct.unpack_from("<3i", data, 0)
width = {(20240520, 1): 2, (20240801, 7): 4}.get((magic, version))
if width is None or len(data) != 1024 + width * count:
    print("bad header %d %d %d size %d" % (magic, version, count, len(data))); sys.exit(1)
print(magic, version, count)
fmt = "<%d%s" % (count, "H" if width == 2 else "I")
for t in struct.unpack_from(fmt, data, 1024):
    print(t)
EOF
}

if [ ! -x "$BIN" ]; then
  fail "tokenize binary" "$BIN not found (run make first)"
  exit 1
fi

# --- two one-line documents: "Hello world" is [15496, 995] in GPT-2 --------------------------
printf 'Hello world' > "$tmp/a.txt"
printf 'Hello world' > "$tmp/b.txt"
"$BIN" tokenize --out "$tmp/out" --val-fraction 0.5 "$tmp/a.txt" "$tmp/b.txt" > "$tmp/log" 2> "$tmp/err"
rc=$?
check "tokenize two files exits 0" "status $rc: $(cat "$tmp/err")" [ "$rc" -eq 0 ]
check "train and val shards written" "$(ls "$tmp/out" 2>&1)" \
  [ -f "$tmp/out/train_000000.bin" -a -f "$tmp/out/val_000000.bin" ]
for s in train val; do
  if info=$(shard "$tmp/out/${s}_000000.bin"); then
    ok "$s shard header (magic, version, count) matches its size"
    head=$(echo "$info" | head -1)
    toks=$(echo "$info" | tail -n +2 | tr '\n' ' ')
    check "$s shard is llm.c version 1 with 3 tokens" "header '$head'" [ "$head" = "20240520 1 3" ]
    check "$s shard starts with <|endoftext|> 50256" "tokens '$toks'" [ "$(echo "$info" | sed -n 2p)" = 50256 ]
    check "$s shard holds 'Hello world' as GPT-2 ids" "tokens '$toks'" [ "$toks" = "50256 15496 995 " ]
  else
    fail "$s shard header (magic, version, count) matches its size" "$info"
  fi
done
check "summary names documents, tokens and shards" "$(cat "$tmp/log")" \
  grep -q "2 documents (1 train, 1 val), 6 tokens .* 2 shards" "$tmp/log"
check "no progress bar when stderr is not a terminal" "stderr: $(cat "$tmp/err")" \
  sh -c "! grep -q 'MB/s' '$tmp/err'"

# --- never overwrite ---------------------------------------------------------------------------
sum_before=$(cksum "$tmp/out/train_000000.bin")
printf 'Something else entirely' > "$tmp/c.txt"
"$BIN" tokenize --out "$tmp/out" "$tmp/c.txt" > "$tmp/log" 2>&1
rc=$?
check "existing shards: refuses with non-zero exit" "status $rc" [ "$rc" -ne 0 ]
check "existing shards: message names the directory" "$(cat "$tmp/log")" grep -q "$tmp/out.*refusing" "$tmp/log"
check "existing shards: file unchanged" "checksum changed" [ "$(cksum "$tmp/out/train_000000.bin")" = "$sum_before" ]
"$BIN" tokenize --out "$tmp/out" --val-fraction 0 --force "$tmp/c.txt" > "$tmp/log" 2>&1
rc=$?
check "--force replaces shards and removes stale ones" "status $rc, files: $(ls "$tmp/out")" \
  [ "$rc" -eq 0 -a -f "$tmp/out/train_000000.bin" -a ! -f "$tmp/out/val_000000.bin" ]

# --- shard size limit: 3 documents of 3 tokens in shards of 2 ----------------------------------
"$BIN" tokenize --out "$tmp/small" --val-fraction 0 --shard-tokens 2 "$tmp/a.txt" "$tmp/b.txt" "$tmp/a.txt" \
  > "$tmp/log" 2>&1
n=$(ls "$tmp/small" | grep -c '^train_0000[0-9][0-9]\.bin$')
check "--shard-tokens 2 splits 9 tokens into 5 shards" "$n shards: $(cat "$tmp/log")" [ "$n" -eq 5 ]
all=$(for f in "$tmp"/small/train_*.bin; do shard "$f" | tail -n +2; done | tr '\n' ' ')
check "documents continue across shard boundaries" "tokens '$all'" \
  [ "$all" = "50256 15496 995 50256 15496 995 50256 15496 995 " ]

# --- held-out documents: 20 documents, 20% val, no document in both splits -------------------
i=0
while [ $i -lt 20 ]; do printf 'Document number %d is here.' $i > "$tmp/doc$i.txt"; i=$((i + 1)); done
"$BIN" tokenize --out "$tmp/split" --val-fraction 0.2 "$tmp"/doc*.txt > "$tmp/log" 2>&1
nt=$(shard "$tmp/split/train_000000.bin" | tail -n +2 | grep -c '^50256$')
nv=$(shard "$tmp/split/val_000000.bin" | tail -n +2 | grep -c '^50256$')
check "val gets 20% of 20 documents, train the rest" "train $nt val $nv" [ "$nt" -eq 16 -a "$nv" -eq 4 ]
# Each document's tokens (EOT to EOT) as one line per split; no line may appear in both.
docs() { shard "$1" | tail -n +2 | awk '$1==50256{if(d!="")print d; d=""; next}{d=d" "$1}END{print d}' | sort; }
docs "$tmp/split/train_000000.bin" > "$tmp/train.docs"
docs "$tmp/split/val_000000.bin" > "$tmp/val.docs"
shared=$(comm -12 "$tmp/train.docs" "$tmp/val.docs" | wc -l)
check "val shares no document with train" "$shared shared" [ "$shared" -eq 0 ]
"$BIN" tokenize --out "$tmp/split2" --val-fraction 0.2 "$tmp"/doc*.txt > /dev/null 2>&1
check "split is deterministic" "shards differ between two runs" \
  cmp -s "$tmp/split/val_000000.bin" "$tmp/split2/val_000000.bin"

# --- --doc-separator: one file, two documents --------------------------------------------------
printf 'Hello world\n\n\nHello world\n\n\n' > "$tmp/sep.txt"
"$BIN" tokenize --out "$tmp/sep" --val-fraction 0.5 --doc-separator '\n\n\n' "$tmp/sep.txt" > "$tmp/log" 2>&1
rc=$?
check "--doc-separator splits a file into documents" "status $rc: $(cat "$tmp/log")" \
  grep -q "2 documents (1 train, 1 val), 6 tokens" "$tmp/log"

# --- invalid UTF-8 is just bytes: 0xFF alone is GPT-2's byte token 187 ("ÿ") -----------------
printf '\377' > "$tmp/bad_utf8.txt"
"$BIN" tokenize --out "$tmp/utf8" --val-fraction 0 "$tmp/bad_utf8.txt" > "$tmp/log" 2>&1
toks=$(shard "$tmp/utf8/train_000000.bin" 2>&1 | tail -n +2 | tr '\n' ' ')
check "invalid UTF-8 is encoded as byte tokens" "tokens '$toks': $(cat "$tmp/log")" [ "$toks" = "50256 187 " ]

# --- whole documents held out: a warning when the split's share is far from --val-fraction -----
# Two files, one 72 times the other: whichever is held out, val holds ~1% or ~99% of the tokens.
printf 'Hello world' > "$tmp/small.txt"
python3 -c "open('$tmp/big.txt', 'w').write('Hello world. ' * 72)"
"$BIN" tokenize --out "$tmp/uneven" --val-fraction 0.05 "$tmp/small.txt" "$tmp/big.txt" > "$tmp/log" 2> "$tmp/err"
rc=$?
check "two uneven files, --val-fraction 0.05: a warning names the real share" "status $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 0 ] && grep -Eq '^tokenize: warning: the validation split holds [0-9.]+% of the tokens \(1 of 2 documents\), not the 5.0% --val-fraction asks for: documents are held out whole; split the files into more documents with --doc-separator' '$tmp/err'"
python3 -c "open('$tmp/many.txt', 'w').write('|'.join('Hello world number %d.' % (i % 10) for i in range(40)))"
"$BIN" tokenize --out "$tmp/even" --val-fraction 0.05 --doc-separator '|' "$tmp/many.txt" > "$tmp/log" 2> "$tmp/err"
rc=$?
check "40 equal documents, --val-fraction 0.05: no warning" "status $rc: $(cat "$tmp/err")" \
  sh -c "[ $rc -eq 0 ] && ! grep -q warning '$tmp/err' && grep -q '(38 train, 2 val)' '$tmp/log'"

# --- encode and decode --help, as the main help says COMMAND --help works ---------------------------
for cmd in encode decode; do
  "$BIN" $cmd --help > "$tmp/log" 2> "$tmp/err" < /dev/null
  rc=$?
  check "$cmd --help: usage on stdout, exit 0" "status $rc: $(cat "$tmp/err")" \
    sh -c "[ $rc -eq 0 ] && grep -q '^usage: train_gpt $cmd \[--vocab DIR\]' '$tmp/log' && [ ! -s '$tmp/err' ]"
done

# --- errors ------------------------------------------------------------------------------------
"$BIN" tokenize --out "$tmp/missing" "$tmp/a.txt" "$tmp/no_such_file.txt" > "$tmp/log" 2>&1
rc=$?
check "missing input: non-zero exit" "status $rc" [ "$rc" -ne 0 ]
check "missing input: message names the file" "$(cat "$tmp/log")" grep -q "no_such_file.txt" "$tmp/log"
check "missing input: nothing written" "$(ls "$tmp/missing" 2>&1)" [ ! -e "$tmp/missing/train_000000.bin" ]
for v in 1.5 1 -0.1 abc; do
  "$BIN" tokenize --out "$tmp/bad" --val-fraction "$v" "$tmp/a.txt" > "$tmp/log" 2>&1
  rc=$?
  check "--val-fraction $v rejected" "status $rc: $(cat "$tmp/log")" \
    sh -c "[ $rc -ne 0 ] && grep -q -- '--val-fraction' '$tmp/log'"
done
"$BIN" tokenize --out "$tmp/bad" --shard-tokens 0 "$tmp/a.txt" > "$tmp/log" 2>&1
rc=$?
check "--shard-tokens 0 rejected" "status $rc: $(cat "$tmp/log")" sh -c "[ $rc -ne 0 ] && grep -q -- '--shard-tokens' '$tmp/log'"
"$BIN" tokenize --out "$tmp/bad" --no-such-option "$tmp/a.txt" > "$tmp/log" 2>&1
rc=$?
check "unknown option rejected by name" "status $rc: $(cat "$tmp/log")" sh -c "[ $rc -ne 0 ] && grep -q -- '--no-such-option' '$tmp/log'"
"$BIN" tokenize "$tmp/a.txt" > "$tmp/log" 2>&1
rc=$?
check "--out is required" "status $rc: $(cat "$tmp/log")" sh -c "[ $rc -ne 0 ] && grep -q -- '--out' '$tmp/log'"

[ "$fails" -eq 0 ]
