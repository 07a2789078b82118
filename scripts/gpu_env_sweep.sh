#!/bin/bash
# gpu_env_sweep.sh: on a GPU machine, time the attention benchmark under several settings of the
# kernels' timing knobs (environment variables such as ATTN_FP8_FWD_GROUP_HEADS, which change the
# schedule, never the results) with one build: scripts/gpu_fp8_attention_bench.sh once per
# setting, the library built by the first run and reused (REUSE_LIB=1), then one table per measure
# with a column per setting (scripts/compare_bench_summaries.py). An empty setting ("") is the
# default. Logs: $OUT/<n>/ per setting, all summaries in $OUT/summaries.txt.
#   usage: [MODES="bf16 fp8_naive"] [ROUNDS=6] bash scripts/gpu_env_sweep.sh "" "ATTN_FP8_FWD_GROUP_HEADS=8" ...
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_env_sweep_out}
BD=${BD:-/tmp/gpu_env_sweep_build}
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu_env_sweep.sh SETTING [SETTING ...] (a setting: \"VAR=v VAR2=w\", or \"\")" >&2; exit 2; }
for setting in "$@"; do
  for kv in $setting; do
    case "$kv" in ATTN_*=*) ;; *) echo "gpu_env_sweep.sh: '$kv' in setting '$setting' is not ATTN_<knob>=<value>" >&2; exit 2;; esac
  done
done
mkdir -p "$OUT"
status=0 i=0 args=()
for setting in "$@"; do
  i=$((i + 1))
  label="s$i${setting:+ $setting}"; label=${label//=/:}  # '=' separates label and path below
  echo "== setting $i: ${setting:-(defaults)}"
  reuse=0; [ $i -gt 1 ] && reuse=1
  env $setting REUSE_LIB=$reuse OUT="$OUT/s$i" BD="$BD" MODES="${MODES:-bf16 fp8_naive}" ROUNDS="${ROUNDS:-6}" \
    bash scripts/gpu_fp8_attention_bench.sh > "$OUT/s$i.log" 2>&1 || { status=1; tail -5 "$OUT/s$i.log"; }
  args+=("$label=$OUT/s$i/summary.txt")
done
python3 scripts/compare_bench_summaries.py "${args[@]}"
for a in "${args[@]}"; do echo "===== ${a%%=*}"; cat "${a#*=}" 2>/dev/null; done > "$OUT/summaries.txt"
exit $status
