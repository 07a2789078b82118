#!/bin/sh
# cli_badinput.sh: every kind of bad input gets a clear message (a keyword checked in stderr),
# a non-zero exit, and leaves every file that existed before untouched (checksums compared)
# and no run directory behind.
# Runs from the repo root after `make`; TRAIN_GPT overrides the binary.
BIN=${TRAIN_GPT:-./train_gpt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. test/cli_lib.sh

python3 - "$tmp" <<'EOF'
import random, struct, sys
def shard(path, toks, count=None, magic=20240520):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *([magic, 1, len(toks) if count is None else count] + [0] * 253)))
        f.write(struct.pack("<%dH" % len(toks), *toks))
r = random.Random(5)
d = sys.argv[1]
shard(d + "/train_000000.bin", [r.randrange(500) for _ in range(2000)])
shard(d + "/val_000000.bin", [r.randrange(500) for _ in range(800)])
shard(d + "/trunc_000000.bin", [r.randrange(500) for _ in range(1000)], count=1500)  # header claims more
shard(d + "/big_000000.bin", [r.randrange(500) for _ in range(999)] + [700])         # id 700 >= 512
EOF

# A tiny config of our own (every section used), and variants of it.
cat >"$tmp/good.json" <<EOF
{
  "model": {"vocab_size": 512, "d_model": 128, "n_layer": 1, "n_head": 2, "ffn_hidden": 256, "seq_len": 16},
  "data": {"train": "$tmp/train_*.bin", "val": "$tmp/val_*.bin"},
  "train": {"device": "cpu", "micro_batch": 2, "steps": 2, "lr": 1e-3, "warmup_steps": 1},
  "eval": {"interval": 0, "batches": 1},
  "checkpoint": {"interval": 1, "keep": 2},
  "log": {"dir": "$tmp/run"}
}
EOF
sed 's/"d_model": 128/"d_modle": 128/' "$tmp/good.json" >"$tmp/unknown_key.json"
sed 's/"n_layer": 1/"n_layer": "one"/' "$tmp/good.json" >"$tmp/wrong_type.json"
head -c 120 "$tmp/good.json" >"$tmp/malformed.json"

# An existing run to protect (and resume from).
"$BIN" --config "$tmp/good.json" >"$tmp/setup.out" 2>&1 || echo "FAIL - setup run: $(tail -3 "$tmp/setup.out")"
mkdir -p "$tmp/corrupt/checkpoints"
cp "$tmp/run/checkpoints/"* "$tmp/run/metrics.jsonl" "$tmp/corrupt/" 2>/dev/null
mv "$tmp/corrupt/step_"* "$tmp/corrupt/latest" "$tmp/corrupt/checkpoints/"
python3 - "$tmp/corrupt/checkpoints/step_000002.ckpt" <<'EOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x40
open(p, "wb").write(b)
EOF

mkdir -p "$tmp/empty"
snapshot() { find "$tmp" -type f ! -name '*.out' ! -name '*.err' ! -name 'sums*' -exec cksum {} + | sort; }
snapshot >"$tmp/sums.before"

# expect NAME KEYWORD EXPECTED_RC(any non-zero if "nz") ARGS...
expect() {
  _name=$1; _key=$2; _rc=$3; shift 3
  "$BIN" "$@" >"$tmp/case.out" 2>"$tmp/case.err"
  rc=$?
  if [ "$rc" -eq 0 ] || { [ "$_rc" != nz ] && [ "$rc" -ne "$_rc" ]; }; then
    fail "$_name" "exit status $rc (expected ${_rc}); stderr: $(head -2 "$tmp/case.err")"
  elif ! grep -qiF -- "$_key" "$tmp/case.err"; then
    fail "$_name" "stderr lacks '$_key': $(head -2 "$tmp/case.err")"
  elif grep -q 'internal error\|Segmentation\|Aborted' "$tmp/case.err"; then
    fail "$_name" "crashed: $(head -2 "$tmp/case.err")"
  else
    ok "$_name"
  fi
  if [ -e "$tmp/new" ]; then fail "$_name: no run dir created" "$tmp/new exists"; rm -rf "$tmp/new"; fi
}
new="--set log.dir=$tmp/new"
expect "unknown config key" "model.d_modle" 1 --config "$tmp/unknown_key.json" $new
expect "wrong type" "model.n_layer" 1 --config "$tmp/wrong_type.json" $new
expect "missing config file" "$tmp/nope.json" 1 --config "$tmp/nope.json" $new
expect "malformed JSON" "malformed.json" 1 --config "$tmp/malformed.json" $new
expect "bad --set (no =)" "section.key=value" 2 --config "$tmp/good.json" --set model.d_model $new
expect "bad --set (unknown key)" "model.widht" 1 --config "$tmp/good.json" --set model.widht=3 $new
expect "bad --set (bad value)" "model.n_head" 1 --config "$tmp/good.json" --set model.n_head=0 $new
expect "missing data files" "$tmp/missing_*.bin" 1 --config "$tmp/good.json" --set "data.train=$tmp/missing_*.bin" $new
expect "truncated shard" "trunc_000000.bin" 1 --config "$tmp/good.json" --set "data.train=$tmp/trunc_*.bin" $new
expect "token id >= vocab_size" "big_000000.bin" 1 --config "$tmp/good.json" --set "data.train=$tmp/big_*.bin" $new
expect "token id message names vocab_size" "vocab_size" 1 --config "$tmp/good.json" --set "data.train=$tmp/big_*.bin" $new
expect "batch_tokens not a multiple" "batch_tokens" 1 --config "$tmp/good.json" --set train.batch_tokens=100 $new
expect "run dir already holds a run" "already holds a run" 1 --config "$tmp/good.json"
expect "refusal says how to proceed" "--resume" 1 --config "$tmp/good.json"
expect "mismatched checkpoint (d_model)" "model.d_model is 128 in the checkpoint but 256" 1 \
  --config "$tmp/good.json" --set model.d_model=256 --set train.steps=4 --resume
expect "corrupt checkpoint" "step_000002.ckpt: corrupt: the checksum" 1 --config "$tmp/good.json" --set "log.dir=$tmp/corrupt" \
  --resume "$tmp/corrupt/checkpoints/step_000002.ckpt"
expect "resume from a directory without checkpoints" "no checkpoint in $tmp/empty" 1 --config "$tmp/good.json" $new \
  --resume "$tmp/empty"
expect "resume from a missing file" "$tmp/none.ckpt" 1 --config "$tmp/good.json" $new --resume "$tmp/none.ckpt"
expect "resume past train.steps" "train.steps" 1 --config "$tmp/good.json" --set train.steps=1 --resume
expect "unknown option" "unknown option '--frobnicate'" 2 --config "$tmp/good.json" --frobnicate
expect "unknown command" "unknown command 'frobnicate'" 2 frobnicate
expect "no --config" "--config" 2
expect "bad --device" "--device" 2 --config "$tmp/good.json" --device tpu
# (fp32 attention: refused by the GPU backend where there is a GPU, and without one the missing GPU is)
expect "--device gpu with a config the GPU backend refuses" "GPU backend" 1 --config "$tmp/good.json" --device gpu \
  $new --set precision.attention=fp32
expect "bad --stop-after" "--stop-after" 2 --config "$tmp/good.json" --stop-after x
expect "--allow-config-change without --resume" "--allow-config-change applies to --resume only" 2 \
  --config "$tmp/good.json" --allow-config-change
expect "sample: missing checkpoint" "$tmp/none.ckpt" 1 sample --checkpoint "$tmp/none.ckpt"
expect "sample: corrupt checkpoint" "corrupt" 1 sample --checkpoint "$tmp/corrupt/checkpoints/step_000002.ckpt"
expect "sample: bad option" "--bogus" 2 sample --checkpoint "$tmp/run" --bogus

snapshot >"$tmp/sums.after"
if cmp -s "$tmp/sums.before" "$tmp/sums.after"; then ok "no existing file changed"
else fail "no existing file changed" "$(diff "$tmp/sums.before" "$tmp/sums.after" | head -6 | tr '\n' ' ')"; fi
exit 0
