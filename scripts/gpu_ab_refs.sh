#!/bin/bash
# gpu_ab_refs.sh: on a GPU machine, validate and time several versions of the FP8 attention
# kernels in one call (the snapshots scripts/snapshot_refs.sh made): for each directory, the FP8
# attention tests (scripts/gpu_fp8_attention_check.sh: build, registers and spills, the tests
# against the CPU emulation, compute-sanitizer) and then the benchmark
# (scripts/gpu_fp8_attention_bench.sh), each version in its own build and log folders, one after
# the other on the same GPU. Prints, last, one table per measure with a column per version, so a
# change is judged against the base measured minutes apart on the same machine.
# Logs: $OUT/<dir>/{check,bench}.log and the bench's summary.txt.
#   usage: [MODES="bf16 fp8_naive fp8_dm"] [ROUNDS=10] [NO_CHECK=1 | NO_CHECK_FIRST=1] bash scripts/gpu_ab_refs.sh .snap_main .snap_x ...
#   (NO_CHECK_FIRST=1 skips the tests of the first version only: the base, already validated)
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_ab_out}
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu_ab_refs.sh SNAPSHOT_DIR [SNAPSHOT_DIR ...]" >&2; exit 2; }
for d in "$@"; do
  [ -f "$d/scripts/gpu_fp8_attention_bench.sh" ] ||
    { echo "gpu_ab_refs.sh: $d: not a snapshot of this repository (no scripts/gpu_fp8_attention_bench.sh)" >&2; exit 1; }
done
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>/dev/null
status=0
for d in "$@"; do
  n=$(basename "$d"); n=${n#.}  # no leading dot: the logs stay visible to globs
  mkdir -p "$OUT/$n"
  if [ "${NO_CHECK:-0}" != 1 ] && { [ "${NO_CHECK_FIRST:-0}" != 1 ] || [ "$d" != "$1" ]; }; then
    echo "== $n: tests"
    OUT="$OUT/$n/check" BD="/tmp/gpu_ab_build/$n/check" bash "$d/scripts/gpu_fp8_attention_check.sh" \
      > "$OUT/$n/check.log" 2>&1 || status=1
    sed -n '/^== summary/,$p' "$OUT/$n/check.log" | tail -n +2
  fi
  echo "== $n: benchmark"
  OUT="$OUT/$n/bench" BD="/tmp/gpu_ab_build/$n/bench" MODES="${MODES:-bf16 fp8_naive fp8_dm}" \
    ROUNDS="${ROUNDS:-10}" bash "$d/scripts/gpu_fp8_attention_bench.sh" > "$OUT/$n/bench.log" 2>&1 || status=1
  grep -E "DIFFER|SUSPECT|NOT timed|FAILED" "$OUT/$n/bench.log" | head -5
done

# One table per measure, a column per version, from each bench's summary.txt: the bare-kernel
# table ("| T | quant fwd ms ...") and the loops table when a version has it.
python3 - "$OUT" "$@" <<'EOF'
import os, sys
out, dirs = sys.argv[1], [os.path.basename(d).lstrip(".") for d in sys.argv[2:]]

def table(lines, head):
    """The rows of the markdown table whose header starts with head: [{column: cell}]."""
    for i, l in enumerate(lines):
        if l.startswith(head):
            cols = [c.strip() for c in l.strip().strip("|").split("|")]
            rows = []
            for r in lines[i + 2:]:
                if not r.startswith("|"):
                    break
                rows.append(dict(zip(cols, [c.strip() for c in r.strip().strip("|").split("|")])))
            return rows
    return []

def cell(rows, T, prefix):
    """The cell of row T in the first column whose name starts with prefix (its first word)."""
    for r in rows:
        if r["T"] == T:
            for k, v in r.items():
                if k.startswith(prefix):
                    return v.split(" ")[0]
    return "n/a"

bare, api, loops = {}, {}, {}
for d in dirs:
    try:
        lines = open(os.path.join(out, d, "bench", "summary.txt")).read().splitlines()
    except OSError:
        lines = []
    bare[d] = table(lines, "| T | quant fwd ms")
    api[d] = table(lines, "| T | ours f")
    i = next((i for i, l in enumerate(lines) if l.startswith("| T | default")), None)  # the loops table
    n = 0 if i is None else next((k for k, l in enumerate(lines[i:]) if not l.startswith("|")), len(lines) - i)
    loops[d] = [] if i is None else lines[i:i + n]
measures = [(bare, "FP8 fwd bare TFLOP/s"), (bare, "naive bwd bare"), (bare, "dm bwd bare"),
            (bare, "dm bwd API"), (bare, "delta kernel ms"), (api, "dm f / ours f"),
            (api, "dm f+b / ours f+b time")]
Ts = [r["T"] for r in next((v for v in bare.values() if v), [])]
if not Ts:
    print("no bench summary to compare (see the bench logs)")
    sys.exit(0)
print()
print("same GPU, one call, the versions one after the other (TFLOP/s; delta kernel: ms; ratios: "
      "fp8_dm through the API against our BF16)")
for src, m in measures:
    print(f"\n{m}\n| T | " + " | ".join(dirs) + " |\n|---|" + "---|" * len(dirs))
    for T in Ts:
        print(f"| {T} | " + " | ".join(cell(src[d], T, m) for d in dirs) + " |")
for d in dirs:
    if loops[d]:
        print(f"\n{d}: the FP8 forward's block loops, bare TFLOP/s")
        print("\n".join(loops[d]))
EOF
exit $status
