#!/bin/bash
# gpu_ab_refs.sh: on a GPU machine, validate and time several versions of the FP8 attention
# kernels in one call (the snapshots scripts/snapshot_refs.sh made): for each directory, the FP8
# attention tests (scripts/gpu_fp8_attention_check.sh: build, registers and spills, the tests
# against the CPU emulation, compute-sanitizer) and then the benchmark
# (scripts/gpu_fp8_attention_bench.sh), each version in its own build and log folders, one after
# the other on the same GPU. Prints, last, one table per measure with a column per version, so a
# change is judged against the base measured minutes apart on the same machine. A snapshot may be
# named again (A/B/A: .snap_x .snap_main .snap_x): its later runs are benchmark only, labelled
# <name>_2, <name>_3, and the spread of its runs is the GPU's drift within the call. Each run also
# prints the bench's GPU-state line (clocks, power, clock-event reasons while it ran).
# Logs: $OUT/<label>/{check,bench}.log and the bench's summary.txt.
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
seen=() labels=()
for d in "$@"; do
  n0=$(basename "$d"); n0=${n0#.}  # no leading dot: the logs stay visible to globs
  repeat=$(( $(printf '%s\n' "${seen[@]}" | grep -cx -- "$n0") + 1 ))  # the snapshot's how-manieth run
  seen+=("$n0")
  n=$n0; [ $repeat -gt 1 ] && n=${n0}_$repeat
  labels+=("$n")
  mkdir -p "$OUT/$n"
  if [ "${NO_CHECK:-0}" != 1 ] && [ $repeat = 1 ] && { [ "${NO_CHECK_FIRST:-0}" != 1 ] || [ "$d" != "$1" ]; }; then
    echo "== $n: tests"
    OUT="$OUT/$n/check" BD="/tmp/gpu_ab_build/$n/check" bash "$d/scripts/gpu_fp8_attention_check.sh" \
      > "$OUT/$n/check.log" 2>&1 || status=1
    sed -n '/^== summary/,$p' "$OUT/$n/check.log" | tail -n +2
  fi
  echo "== $n: benchmark"
  reuse=0; [ $repeat -gt 1 ] && reuse=1  # a repeated snapshot reuses its first run's build
  OUT="$OUT/$n/bench" BD="/tmp/gpu_ab_build/$n0/bench" REUSE_LIB=$reuse MODES="${MODES:-bf16 fp8_naive fp8_dm}" \
    ROUNDS="${ROUNDS:-10}" bash "$d/scripts/gpu_fp8_attention_bench.sh" > "$OUT/$n/bench.log" 2>&1 || status=1
  grep -E "DIFFER|SUSPECT|NOT timed|FAILED|GPU state" "$OUT/$n/bench.log" | head -5
done

# One table per measure, a column per version, from each bench's summary.txt
args=()
for n in "${labels[@]}"; do args+=("$n=$OUT/$n/bench/summary.txt"); done
python3 scripts/compare_bench_summaries.py "${args[@]}"
# every version's summary in one file (the device tool returns few files)
for n in "${labels[@]}"; do echo "===== $n"; cat "$OUT/$n/bench/summary.txt" 2>/dev/null; done > "$OUT/summaries.txt"
exit $status
