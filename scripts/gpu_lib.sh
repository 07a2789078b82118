# gpu_lib.sh: what the GPU check and benchmark scripts share; source it from the repo root.
#   t_start, elapsed   seconds since the script began
#   left N             seconds a step may take: at most N, and what $BUDGET leaves (at least 10)
#   CJ                 the make option for cJSON from .deps/cjson (../shared/device/README.md)
#   NVCC               the compiler: $NVCC if set, else nvcc from PATH, else $CUDA_HOME's (/usr/local/cuda)
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start )); }
left() {
  local l=$(( ${BUDGET:-600} - $(elapsed) - 5 )); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 10 ] && l=10; echo "$l"
}
CJ=""; [ -d .deps/cjson ] && CJ="CJSON_PREFIX=.deps/cjson"
#   gpu_start DIR      a script's start: OUT defaults to DIR and is made; the GPU's name and driver
gpu_start() {
  OUT=${OUT:-$1}
  mkdir -p "$OUT"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  return 0
}
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null || NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
#   build_or_die T...  make targets T into $OUT/build.log (cJSON from .deps); on failure its tail, exit 1
#   run_test T         build/tests/T (with the caller's environment) into $OUT/T.log; prints its FAIL
#                      lines and appends "T: exit rc, its last line" to the summary array
#   print_summary      the summary array, one line each
build_or_die() {
  timeout 300 make -j16 SETUP=0 $CJ "$@" >"$OUT/build.log" 2>&1 ||
    { tail -20 "$OUT/build.log"; echo "== build FAILED"; exit 1; }
  echo "build done at $(elapsed) s"
}
#   attn_lib_or_die    the attention benchmark library $BD/libattn_fp8.so (BD defaults to
#                      /tmp/gpu_fp8_bench_build), as scripts/gpu_fp8_attention_bench.sh builds it (BUILD_ONLY=1;
#                      with REUSE_LIB=1 an earlier one), into $OUT/build.log; on failure its tail, exit 1
attn_lib_or_die() {
  BD=${BD:-/tmp/gpu_fp8_bench_build}
  OUT=$OUT BD=$BD BUILD_ONLY=1 bash scripts/gpu_fp8_attention_bench.sh >"$OUT/build.log" 2>&1 ||
    { tail -20 "$OUT/build.log"; echo "== build FAILED"; exit 1; }
}
summary=()
run_test() {
  timeout -k 5 "${TEST_TIMEOUT:-300}" "build/tests/$1" >"$OUT/$1.log" 2>&1
  local r=$?
  grep -E "^FAIL" "$OUT/$1.log" | head -10 | cut -c1-300
  summary+=("$1: exit $r, $(tail -1 "$OUT/$1.log")")
}
print_summary() { local l; for l in "${summary[@]}"; do echo "  $l"; done; }
#   ncu_pages NCU DIR NAME   an Nsight Compute report DIR/NAME.ncu-rep exported as the three CSV pages
#                      scripts/ncu_summary.py reads (DIR/NAME_details.csv, _raw.csv, _sass.csv),
#                      then that summary printed
ncu_pages() {
  local ncu=$1 dir=$2 name=$3
  "$ncu" --import "$dir/$name.ncu-rep" --page details --csv >"$dir/${name}_details.csv" 2>/dev/null
  "$ncu" --import "$dir/$name.ncu-rep" --page raw --csv >"$dir/${name}_raw.csv" 2>/dev/null
  "$ncu" --import "$dir/$name.ncu-rep" --page source --csv --print-source sass >"$dir/${name}_sass.csv" 2>/dev/null
  python3 scripts/ncu_summary.py "$dir/${name}_details.csv" "$dir/${name}_raw.csv" "$dir/${name}_sass.csv"
}
