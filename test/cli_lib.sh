# cli_lib.sh: what the command-line tests share (sourced, after BIN and tmp are set).
# Each check prints "ok - <name>" or "FAIL - <name>: <detail>", which test/run_tests.sh counts.
ok() { echo "ok - $1"; }
fail() { echo "FAIL - $1: $2"; }
check() {  # name, detail, command...: ok when the command succeeds
  _name=$1; _detail=$2; shift 2
  if "$@"; then ok "$_name"; else fail "$_name" "$_detail"; fi
}

# pattern_shards DIR NAME:TOKENS:SEED ...: llm.c shards (256 x int32 header, uint16 tokens) of
# a learnable pattern in [0, 500): mostly t -> (7t + 3) mod 500, with random jumps.
pattern_shards() {
  python3 - "$@" <<'PYEOF'
import random, struct, sys
d = sys.argv[1]
for spec in sys.argv[2:]:
    name, n, seed = spec.split(":")
    n, r = int(n), random.Random(int(seed))
    toks = [r.randrange(500)]
    for _ in range(n - 1):
        toks.append((toks[-1] * 7 + 3) % 500 if r.random() < 0.8 else r.randrange(500))
    with open(d + "/" + name, "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
        f.write(struct.pack("<%dH" % n, *toks))
PYEOF
}

# stub_nvidia_smi DIR DEFAULT_NGPU: an nvidia-smi in DIR that lists FAKE_NGPU (default DEFAULT_NGPU)
# H200s and answers --query-gpu, for tests of the GPU scripts on a machine without one.
stub_nvidia_smi() {
  cat >"$1/nvidia-smi" <<EOF
#!/bin/sh
case "\$*" in
  -L*) i=0
       while [ "\$i" -lt "\${FAKE_NGPU:-$2}" ]; do
         echo "GPU \$i: NVIDIA H200 (UUID: GPU-stand-in-\$i)"; i=\$((i + 1))
       done ;;
  *--query-gpu*) echo "NVIDIA H200, 580.00, 143771 MiB, 1980 MHz" ;;
esac
EOF
  chmod +x "$1/nvidia-smi"
}
