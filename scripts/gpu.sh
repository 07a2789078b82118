#!/bin/bash
# gpu.sh: the GPU suite: correctness checks, benchmarks and Nsight Compute profiles on a machine
# with a GPU. One call fits BUDGET seconds (every step gets at most what is left of it), writes its
# logs under OUT and prints a short table last. docs/gpu.md says how to run it.
#
#   bash scripts/gpu.sh check [AREA ...]   correctness, PASS or FAIL per part (default: every area
#                                          the machine can run but kernels; one call per area fits
#                                          10 minutes)
#       kernels    test/run_tests.sh on the GPU test programs alone (build/tests/test_*gpu*,
#                  test_backend): the quick first check of a fresh machine (unit runs them too,
#                  with every CPU test)
#       unit       make test with the GPU present (a GPU test that skips there fails)
#       sanitizer  compute-sanitizer memcheck and racecheck over the kernel tests' small cases
#       torch      test_model_gpu --dump, then test/torch_parity.py: the GPU model against PyTorch
#       train      train_gpt on configs/tiny.json per attention and linear precision on the CPU and
#                  the GPU (the GPU's losses follow the CPU's), a GPU resume with delayed scaling,
#                  small_125m: the loss falls, the plan is --dry-run's, diagnostics, sampling
#       dp         data parallelism and ZeRO-1 on 2 GPUs against 1 GPU, resume across them, a
#                  killed rank (needs 2 GPUs)
#       dp-sockets the 2 GPUs as two nodes: launch_mpirun_multinode.sh with a two-entry hostfile,
#                  NCCL over sockets; against 1 GPU and NVLink, resume, faults (needs 2 GPUs)
#   bash scripts/gpu.sh bench AREA [ARGS]  one benchmark; its table is printed last
#       attention            every attention precision, forward and backward, against our BF16
#                            kernels and cuDNN at its best call (and FlashAttention-2), T = 1K..8K;
#                            the judging table (ours BF16, fp8_dm, cuDNN BF16: fwd, bwd, fwd+bwd),
#                            cuDNN at NVIDIA's published shape against the published H200 figures
#       attention-sustained  the forwards under two clock regimes (cool, at the power cap); T near 8K
#       qkv-gemm             the QKV projection GEMM with its FP8 epilogue against cuBLASLt
#       layers               the cross-entropy and RMSNorm backward against a copy and PyTorch
#       linear-fp8           the FP8 quantization kernels; the FP8 GEMMs against BF16 cuBLASLt
#       e2e                  train_gpt's tokens/s, MFU and peak memory per precision against PyTorch
#                            (torch.compile) at the same micro-batch and accumulation (ACCUM, default
#                            8 a step; "config": the config's batch_tokens); default: the bf16 and
#                            fp8 recipes on paper_569m and paper_1p67b;
#                            RUNS="CONFIG:ATTENTION:LINEAR[:KEY=VALUE,...] ..."
#       dp                   tokens/s of paper_569m on 1 GPU against 2 and all GPUs, plain and ZeRO-1
#       dp-sockets           tokens/s on 1 GPU, 2 over NVLink, 2 over sockets as two nodes, overlap on
#                            and off, ZeRO-1 over sockets; DP_CONFIG (paper_569m, paper_1p67b),
#                            DP_ACCUM ("own small")
#       NAME [ARGS]          dev/bench/NAME.cu (a kernel lab benchmark) built and run with ARGS
#   bash scripts/gpu.sh profile AREA       Nsight Compute: per kernel, pipes, stalls, hot SASS lines
#       attention  the FP8 forward, backward and delta kernels at T 4096
#       qkv-gemm   the QKV GEMM against cuBLASLt's      fp8-quant  the linears' quantization kernels
#   bash scripts/gpu.sh --list | --dry-run MODE [AREA ...] | --help
# Variables: OUT (the logs: MODE_AREA.log, summary.txt; default /tmp/gpu_out), BUDGET (seconds,
# default 570). cJSON comes from .deps/cjson when it is there (scripts/fetch_cjson.sh).
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_out}
BUDGET=${BUDGET:-570}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1  # NVLink multicast off (docs/gpu.md)

CHECK_AREAS="kernels unit sanitizer torch train dp dp-sockets"
BENCH_AREAS="attention attention-sustained qkv-gemm layers linear-fp8 e2e dp dp-sockets"
PROFILE_AREAS="attention qkv-gemm fp8-quant"
# check sanitizer: test, tool, the test's own switches for its small cases
SANITIZED=("test_attention_gpu memcheck ATTN_TEST_SMALL=1" "test_attention_fp8_gpu memcheck ATTN_FP8_TEST_SMALL=1"
  "test_attention_fp8_gpu racecheck ATTN_FP8_TEST_SMALL=1" "test_attention_delta_fp8_gpu memcheck"
  "test_qkv_gemm_gpu memcheck" "test_layers_gpu memcheck" "test_layers_fp8_gpu memcheck"
  "test_linear_fp8_gpu memcheck FP8_TEST_QUANT_ONLY=1")
# check train: tiny on the CPU and the GPU, "ATTENTION LINEAR [KEY=VALUE ...]" per run; the GPU's
# loss must be within TOL_FIRST of the CPU's at step 1 and within TOL_CURVE at every step
TRAIN_RUNS=("bf16 bf16" "fp8_naive bf16" "fp8_hybrid bf16" "fp8_dm bf16" "fp8_dm_approx bf16"
  "bf16 fp8_tensor precision.linear_scaling=\"delayed\"" "fp8_dm fp8_block")
TOL_FIRST=1e-2 TOL_CURVE=3e-2
# bench e2e: ours BF16 and the fp8 recipe on the two paper configs;
# ACCUM micro-batches a step for train_gpt and PyTorch alike, E2E_STEPS steps of train_gpt
E2E_RUNS="paper_569m:bf16:bf16 paper_569m:fp8_dm:fp8_tensor:precision.recipe=fp8 \
paper_1p67b:bf16:bf16 paper_1p67b:fp8_dm:fp8_tensor:precision.recipe=fp8"
ACCUM=${ACCUM:-8} E2E_STEPS=${E2E_STEPS:-10}
. scripts/lib/dp_sockets.sh  # the dp-sockets areas

usage() { sed -n '2,/^set -u/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }
die_usage() { echo "gpu.sh: $*" >&2; echo "(bash scripts/gpu.sh --help for the areas)" >&2; exit 2; }
gpu_test_binaries() {  # the tests that need a GPU, by their sources' names
  local f
  for f in test/test_*gpu*.cu test/test_backend.cu; do [ -f "$f" ] && basename "$f" .cu; done
}
bench_files() {  # the programs among dev/bench/*.cu (not the libraries' shims)
  local f
  for f in dev/bench/*.cu; do grep -q 'int main' "$f" 2>/dev/null && basename "$f" .cu; done
}

# --- the command line ------------------------------------------------------------------------
dry=0
case ${1:-} in
  -h | --help) usage; exit 0 ;;
  --list)
    echo "check:   $CHECK_AREAS"; echo "bench:   $BENCH_AREAS"
    echo "         dev/bench: $(bench_files | tr '\n' ' ')"; echo "profile: $PROFILE_AREAS"; exit 0 ;;
  --dry-run) dry=1; shift ;;
  "") usage >&2; exit 2 ;;
esac
MODE=${1:-}
[ $# -gt 0 ] && shift
case $MODE in
  check) known=$CHECK_AREAS ;;
  bench) known=$BENCH_AREAS ;;
  profile) known=$PROFILE_AREAS ;;
  *) die_usage "unknown mode '$MODE': expected check, bench or profile" ;;
esac
case $BUDGET in '' | *[!0-9]*) die_usage "BUDGET must be a whole number of seconds, got '$BUDGET'" ;; esac
case $ACCUM in config) ;; '' | *[!0-9]* | 0*) die_usage "ACCUM must be a whole number >= 1 or 'config', got '$ACCUM'" ;; esac
case $E2E_STEPS in '' | *[!0-9]* | 0* | [1-4]) die_usage "E2E_STEPS must be a whole number >= 5, got '$E2E_STEPS'" ;; esac
[ "$BUDGET" -ge 1 ] || die_usage "BUDGET must be at least 1 second"
ngpu=0
command -v nvidia-smi >/dev/null && ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
AREAS=() ARGS=()
if [ "$MODE" = check ]; then
  AREAS=("$@")
  if [ ${#AREAS[@]} -eq 0 ]; then  # every area this machine can run
    for a in $CHECK_AREAS; do  # (kernels: unit runs its binaries too)
      [ "$a" != kernels ] && { [ "${a%-sockets}" != dp ] || [ "$ngpu" -ge 2 ]; } && AREAS+=("$a")
    done
  fi
  for a in "${AREAS[@]}"; do
    case " $known " in *" $a "*) ;; *) die_usage "unknown check area '$a' (areas: $known)" ;; esac
  done
else
  labs=""
  [ "$MODE" = bench ] && labs="; or a program of dev/bench: $(bench_files | tr '\n' ' ')"
  [ $# -ge 1 ] || die_usage "$MODE needs an area (areas: $known$labs)"
  AREAS=("$1"); shift; ARGS=("$@")
  case " $known " in
    *" ${AREAS[0]} "*) [ ${#ARGS[@]} -eq 0 ] || die_usage "$MODE ${AREAS[0]} takes no arguments (one area per call)" ;;
    *)
      lab=$(basename "${AREAS[0]}" .cu)
      if [ "$MODE" = bench ] && bench_files | grep -qx -- "$lab"; then AREAS=("lab:$lab")
      else die_usage "unknown $MODE area '${AREAS[0]}' (areas: $known$labs)"; fi ;;
  esac
fi
if [ "$MODE" = bench ] && [ "${AREAS[0]}" = dp-sockets ]; then dpn_bench_runs || die_usage "$DPN_ERR"; fi
for a in "${AREAS[@]}"; do
  if [ "${a%-sockets}" = dp ] && [ "$dry" = 0 ] && [ "$ngpu" -lt 2 ]; then
    echo "gpu.sh: $MODE $a needs at least 2 GPUs; nvidia-smi lists $ngpu" >&2; exit 2
  fi
done

# --- the plan (--dry-run) ----------------------------------------------------------------------
plan() {  # AREA: what it runs, one line a step
  case $MODE:$1 in
    check:kernels) echo "TESTS=\"$(gpu_test_binaries | tr '\n' ' ')\" sh test/run_tests.sh" ;;
    check:unit) echo "make test (every test binary and CLI test; its status passed through)" ;;
    check:sanitizer)
      for s in "${SANITIZED[@]}"; do
        read -ra w <<<"$s"
        echo "compute-sanitizer --tool ${w[1]} build/tests/${w[0]} ${w[*]:2}"
      done ;;
    check:torch) echo "build/tests/test_model_gpu --dump DIR/dump; python3 test/torch_parity.py DIR/dump_*.bin" ;;
    check:train)
      for r in "${TRAIN_RUNS[@]}"; do
        read -ra w <<<"$r"
        echo "tiny, attention ${w[0]}, linear ${w[*]:1}: 20 steps on the CPU and on the GPU, losses compared"
      done
      echo "tiny on the GPU, fp8_dm and fp8_tensor with delayed scaling: 40 steps against 20 + --resume"
      echo "small_125m on the GPU, fp8_dm, 300 steps: val loss falls, plan = --dry-run's, diagnostics, sample" ;;
    check:dp) echo "test_zero1_gpu, test_comm; tiny on 1 GPU x 2 accumulation vs 2 GPUs (plain, ZeRO-1, overlap on/off);"
      echo "resume 2 -> 1 and 1 -> 2 GPUs; a killed rank; the ZeRO-1 plan = --dry-run --world-size 2 --zero1" ;;
    bench:attention) echo "the attention library (build/gpu_sh/attn); dev/bench/bench_attention_fp8.py (with the judging table);"
      echo "dev/bench/bench_attention.py; dev/bench/bench_attention.py --nvidia-shape" ;;
    bench:attention-sustained) echo "the attention library; dev/bench/bench_attention_sustained.py at T 1K..8K;"
      echo "dev/bench/bench_attention_fp8.py at T 7936, 8192, 8320" ;;
    bench:qkv-gemm) echo "build/bench/bench_qkv_gemm at C 2048 (T 1K..8K), C 1536 and 3072 (T 4096)" ;;
    bench:layers) echo "build/bench/bench_layers at paper_569m's shapes, C 2048 and 3072; dev/bench/bench_layers_torch.py;"
      echo "test_layers_gpu and test_matmul_gpu with GPU_LAYERS_TIMING=1" ;;
    bench:linear-fp8) echo "build/bench/bench_fp8_quant (paper_569m, small_125m shapes)"
      echo "build/bench/bench_fp8_gemm (paper_569m, paper_1p67b shapes)" ;;
    bench:e2e) echo "dev/bench/bench_e2e.py per config while train_gpt builds, then train_gpt $E2E_STEPS steps of $ACCUM" \
        "micro-batches per run (nvidia-smi's peak memory), dev/bench/e2e_table.py:"
      for r in ${RUNS:-$E2E_RUNS}; do echo "  $r"; done ;;
    bench:dp) echo "train_gpt paper_569m, 6 steps of 131072 tokens: 1 GPU, 2 and all GPUs plain and ZeRO-1, overlap on/off" ;;
    check:dp-sockets) dpn_plan check ;;
    bench:dp-sockets) dpn_plan bench ;;
    bench:lab:*) echo "make build/bench/${1#lab:}; build/bench/${1#lab:} ${ARGS[*]}" ;;
    profile:attention) echo "the attention library; ncu --set full on one launch of attn_fwd_fp8_kernel,"
      echo "attn_bwd_fp8_kernel and attn_fp8_delta_kernel at T 4096" ;;
    profile:qkv-gemm) echo "ncu --set full on build/bench/bench_qkv_gemm profile cublas|default 2048" ;;
    profile:fp8-quant) echo "ncu --set full on build/bench/bench_fp8_quant's quantization kernels" ;;
  esac
}
if [ "$dry" = 1 ]; then
  echo "gpu.sh $MODE ${AREAS[*]//lab:/}${ARGS[*]:+ ${ARGS[*]}} (BUDGET $BUDGET s, OUT $OUT, $ngpu GPU(s) listed here)"
  [ "$MODE" = check ] && echo "  build: make -j$(nproc) SETUP=0 [CJSON_PREFIX=.deps/cjson] train_gpt tests"
  for a in "${AREAS[@]}"; do plan "$a" | sed "s/^/  ${a#lab:}: /"; done
  exit 0
fi
if [ "$ngpu" -lt 1 ]; then
  why="lists none"
  command -v nvidia-smi >/dev/null || why="is not installed"
  echo "gpu.sh: no GPU: nvidia-smi $why (the GPU suite needs one)" >&2
  exit 2
fi

# --- steps, parts and the summary --------------------------------------------------------------
mkdir -p "$OUT" || exit 1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_sh.XXXXXX") || exit 1
bg_pids=""
cleanup() { for p in $bg_pids; do kill "$p" 2>/dev/null; done; rm -rf "$WORK"; }
reaped() { local p; for p in "$@"; do bg_pids=${bg_pids// $p/}; done; }  # pids waited for: never killed later
trap cleanup EXIT
trap 'exit 130' INT TERM
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start )); }
# limit CAP: the seconds a step may take: CAP, or what BUDGET leaves after 5 s for the summary;
# 0 (the step is not started) when that is under 10 s
limit() {
  local l=$(( BUDGET - $(elapsed) - 5 ))
  [ "$l" -gt "$1" ] && l=$1
  [ "$l" -lt 10 ] && l=0
  echo "$l"
}
NOT_RUN=250
n_step=0
# step NAME CAP CMD...: CMD with its output in $LOG_DIR/NN_NAME.log ($log), stopped after `limit CAP`
# seconds; rc = its status (124: stopped at the limit, NOT_RUN: not started), took = its seconds
step() {
  local name=$1 cap=$2 t0
  shift 2
  n_step=$((n_step + 1))
  log=$LOG_DIR/$(printf %02d $n_step)_$name.log
  lim=$(limit "$cap")
  if [ "$lim" -eq 0 ]; then rc=$NOT_RUN took=0; echo "not started: BUDGET spent" >"$log"; return; fi
  t0=$(date +%s)
  timeout -k 10 "$lim" "$@" >"$log" 2>&1
  rc=$?
  [ $rc -eq 137 ] && rc=124
  took=$(( $(date +%s) - t0 ))
}
note() {  # a status in words
  case $1 in
    0) echo "ok" ;; 124) echo "stopped at its limit of $lim s" ;; "$NOT_RUN") echo "not run: BUDGET spent" ;;
    *) echo "exit $1" ;;
  esac
}
rows=()    # area, part, result, detail (tab-separated)
tables=()  # files printed after the parts table (a benchmark's own tables)
part() {   # PART RESULT DETAIL: one row of the summary (RESULT PASS, FAIL or SKIP)
  rows+=("${AREA#lab:}"$'\t'"$1"$'\t'"$2"$'\t'"$3")
  printf '   %-4s %s: %s\n' "$2" "$1" "$3"
}
verdict() { if [ "$1" -eq 0 ]; then echo PASS; elif [ "$1" -eq $NOT_RUN ]; then echo SKIP; else echo FAIL; fi; }
counts() { echo "$(grep -c '^ok - ' "$1") ok, $(grep -c '^FAIL - ' "$1") FAIL"; }  # a test log's
fails() { grep -E '^FAIL' "$1" | head -"${2:-10}" | cut -c1-220 | sed 's/^/     /'; }
# begin AREA / finish: an area's logs are collected into $OUT/MODE_AREA.log, and what it put in
# $KEEP (reports, CSV pages) into $OUT/MODE_AREA.tgz
begin() {
  AREA=$1 LOG_DIR=$WORK/${1//:/_} KEEP=$WORK/${1//:/_}/keep
  mkdir -p "$KEEP"
  echo "== $MODE ${AREA#lab:} ($(elapsed) s)"
}
finish() {
  local name=${MODE}_${AREA//:/_} f
  for f in "$LOG_DIR"/*.log; do [ -f "$f" ] && { echo "===== $(basename "$f" .log)"; cat "$f"; }; done >"$OUT/$name.log"
  if [ -n "$(ls -A "$KEEP")" ]; then
    tar czf "$OUT/$name.tgz" -C "$KEEP" . 2>/dev/null
    if [ "$(stat -c %s "$OUT/$name.tgz")" -gt 15000000 ]; then  # the reports left out: the pages stay
      rm -f "$KEEP"/*.ncu-rep
      tar czf "$OUT/$name.tgz" -C "$KEEP" . 2>/dev/null
    fi
  fi
}
summary() {
  local r n_pass=0 n_fail=0 n_skip=0 a p res d f
  {
    echo
    echo "== summary: $MODE ${AREAS[*]//lab:/} ($(elapsed) s of BUDGET $BUDGET s; logs in $OUT)"
    printf '%-10s %-62s %-6s %s\n' area part result detail
    for r in "${rows[@]}"; do
      IFS=$'\t' read -r a p res d <<<"$r"
      printf '%-10s %-62s %-6s %s\n' "$a" "$p" "$res" "$d"
      case $res in PASS) n_pass=$((n_pass + 1)) ;; FAIL) n_fail=$((n_fail + 1)) ;; *) n_skip=$((n_skip + 1)) ;; esac
    done
    echo "$MODE: $n_pass passed, $n_fail failed, $n_skip not run"
    [ $n_skip -gt 0 ] && echo "(parts not run: the BUDGET was spent or what they need failed; run their area alone)"
    for f in "${tables[@]}"; do echo; cat "$f"; done
  } >"$OUT/summary.txt"
  cat "$OUT/summary.txt"
  [ $n_fail -eq 0 ] && [ $n_skip -eq 0 ]
}

JOBS=$(nproc)
CJ=()
[ -d .deps/cjson ] && CJ=(CJSON_PREFIX=.deps/cjson)
NVCC=$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
echo "gpu.sh $MODE ${AREAS[*]//lab:/}${ARGS[*]:+ ${ARGS[*]}} (BUDGET $BUDGET s, OUT $OUT, cJSON ${CJ[*]:-from the system})"

# build CAP TARGETS...: make them; part "build"; status 0 when they were made
build() {
  local cap=$1
  shift
  step build "$cap" make -j"$JOBS" SETUP=0 "${CJ[@]}" "$@"
  if [ $rc -eq 0 ]; then part build PASS "$took s: make $*"; return 0; fi
  grep -E 'error|Error' "$log" | head -10 | cut -c1-220 | sed 's/^/     /'
  local first
  first=$(grep -m1 -E 'error' "$log" | cut -c1-80)
  part build "$(verdict $rc)" "$(note $rc): make $*${first:+ ($first)}"
  return 1
}
# attn_lib DIR [NVCC FLAGS]: DIR/libattn_fp8.so, the library the attention benchmarks load through
# ctypes: the attention kernels, the mode dispatcher, the RoPE layer and dev/bench's shims, built
# position-independent with the Makefile's flags; kept while no source is newer and the flags match
attn_lib() {
  local dir=$1
  shift
  local flags cu=(attention_fp8.cu attention/*.cu gpu/layers.cu dev/bench/attn_bench_shim*.cu) c=(core/common.c) f o t0
  read -ra flags <<<"$(make -s print-nvflags SETUP=0 "${CJ[@]}" 2>/dev/null ||
    echo "-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I.") -Xcompiler -fPIC $*"
  [ -f gpu/test_hooks.c ] && c+=(gpu/test_hooks.c)
  LIB=$dir/libattn_fp8.so
  if [ -f "$LIB" ] && [ "$(cat "$dir/flags" 2>/dev/null)" = "${flags[*]}" ] &&
     [ -z "$(find . \( -path ./build -o -path './.*' \) -prune -o \
        \( -name '*.c' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) -newer "$LIB" -print | head -1)" ]; then
    part "attention library" PASS "$LIB, built earlier from these sources"
    return 0
  fi
  lim=$(limit 400)
  [ "$lim" -gt 0 ] || { part "attention library" SKIP "not run: BUDGET spent"; return 1; }
  rm -rf "$dir" && mkdir -p "$dir" || return 1
  t0=$(date +%s)
  local pids=() objs=()
  for f in "${cu[@]}" "${c[@]}"; do
    o=$dir/$(echo "$f" | tr / _).o
    objs+=("$o")
    case $f in
      *.cu) timeout "$lim" "$NVCC" "${flags[@]}" -c "$f" -o "$o" >"$o.log" 2>&1 & ;;
      *) timeout "$lim" gcc -std=c11 -D_GNU_SOURCE -O2 -fPIC -fopenmp -I. -c "$f" -o "$o" >"$o.log" 2>&1 & ;;
    esac
    pids+=($!)
  done
  rc=0
  for f in "${pids[@]}"; do wait "$f" || rc=1; done
  [ $rc -eq 0 ] && { "$NVCC" "${flags[@]}" -shared "${objs[@]}" -o "$LIB" >"$dir/link.log" 2>&1 || rc=1; }
  # ctypes loads with RTLD_NOW: a symbol the set above lacks shows here, not in the benchmark
  [ $rc -eq 0 ] && { python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$LIB" >>"$dir/link.log" 2>&1 || rc=1; }
  cat "$dir"/*.log >"$LOG_DIR/attention_library.log"
  if [ $rc -ne 0 ]; then
    grep -E 'error|undefined' "$LOG_DIR/attention_library.log" | head -10 | cut -c1-220 | sed 's/^/     /'
    part "attention library" FAIL "$(grep -m1 -E 'error|undefined' "$LOG_DIR/attention_library.log" | cut -c1-100)"
    return 1
  fi
  echo "${flags[*]}" >"$dir/flags"
  part "attention library" PASS "$(( $(date +%s) - t0 )) s: ${#objs[@]} objects -> $LIB"
}
find_ncu() {
  local c
  NCU=$(command -v ncu)
  for c in "$CUDA_HOME"/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do [ -z "$NCU" ] && [ -x "$c" ] && NCU=$c; done
  [ -n "$NCU" ] && return 0
  part ncu FAIL "Nsight Compute (ncu) not found in PATH, $CUDA_HOME/bin or /opt/nvidia/nsight-compute"
  return 1
}
# ncu_run NAME CAP KERNEL-FILTER... -- CMD...: one launch profiled (--set full, clocks left alone),
# its three CSV pages summarised by dev/ncu_summary.py into a table
ncu_run() {
  local name=$1 cap=$2 filt=()
  shift 2
  while [ "$1" != -- ]; do filt+=("$1"); shift; done
  shift
  step "ncu_$name" "$cap" "$NCU" --clock-control none --set full "${filt[@]}" -f -o "$KEEP/$name" "$@"
  if [ ! -f "$KEEP/$name.ncu-rep" ]; then
    grep -E '==PROF==|==ERROR==|==WARNING==' "$log" | head -3 | sed 's/^/     /'
    part "ncu $name" FAIL "$(note $rc), no report"
    return
  fi
  local page
  local page k=$KEEP/$name
  for page in details raw; do "$NCU" --import "$k.ncu-rep" --page $page --csv >"${k}_$page.csv" 2>/dev/null; done
  "$NCU" --import "$k.ncu-rep" --page source --csv --print-source sass >"${k}_sass.csv" 2>/dev/null
  { echo "== $name"; python3 dev/ncu_summary.py "${k}_details.csv" "${k}_raw.csv" "${k}_sass.csv"; } \
    >"$LOG_DIR/summary_$name.log" 2>&1
  tables+=("$LOG_DIR/summary_$name.log")
  part "ncu $name" PASS "$took s"
}
# losses METRICS: "step loss" lines of a metrics.jsonl
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1" 2>/dev/null; }
# median_tok METRICS SKIP: the median tokens/s (and MFU) over the steps after SKIP
median_tok() {
  python3 - "$1" "$2" <<'EOF'
import json, statistics, sys
try: rows = [json.loads(l) for l in open(sys.argv[1])]
except Exception: rows = []
steps = [r for r in rows if "tokens_per_s" in r and r["step"] > int(sys.argv[2])]
mfu = [r["mfu"] for r in steps if r.get("mfu") is not None]
print("%.0f %s" % (statistics.median(r["tokens_per_s"] for r in steps) if steps else 0,
                   "%.1f%%" % (100 * statistics.median(mfu)) if mfu else "n/a"))
EOF
}

# --- check areas ---------------------------------------------------------------------------------
# tests_row STEP PART CMD...: a run of the test harness (test/run_tests.sh, or make test) as one row:
# its "N passed, M failed, K skipped" line, its status passed through; the failures listed under it
tests_row() {
  local name=$1 what=$2 line
  shift 2
  step "$name" 3600 "$@"
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
  fails "$log" 20
  grep -E '^skipped' "$log" | head -10 | cut -c1-200 | sed 's/^/     /'
  part "$what" "$(verdict $rc)" "${line:-no summary line}$([ $rc -ne 0 ] && echo " ($(note $rc))")"
}
check_kernels() {
  tests_row kernel_tests "the GPU test programs" env TESTS="$(gpu_test_binaries | tr '\n' ' ')" sh test/run_tests.sh
}
check_unit() { tests_row make_test "make test" make SETUP=0 "${CJ[@]}" test; }

check_sanitizer() {
  local cs entry t tool res sum w envs
  cs=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
  [ -x "$cs" ] || { part compute-sanitizer FAIL "not found in PATH or $CUDA_HOME/bin"; return; }
  for entry in "${SANITIZED[@]}"; do
    read -ra w <<<"$entry"
    t=${w[0]} tool=${w[1]} envs=("${w[@]:2}")
    [ -f "test/$t.cu" ] || continue  # a test the tree no longer has
    step "${t}_$tool" 180 env "${envs[@]}" "$cs" --tool "$tool" --error-exitcode 99 --print-limit 20 "build/tests/$t"
    sum=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
    res=$(verdict $rc)
    [ $rc -eq 0 ] && { [ "$(grep -c '^FAIL - ' "$log")" -eq 0 ] && echo "$sum" | grep -qE ': 0 (errors|hazards)'; } || res=FAIL
    [ $rc -eq $NOT_RUN ] && res=SKIP
    [ "$res" = FAIL ] && { fails "$log" 5; grep -E '^(=========|Invalid)' "$log" | head -6 | cut -c1-200 | sed 's/^/     /'; }
    part "$t, $tool${envs[*]:+ (${envs[*]})}" "$res" "${sum:-no summary line}; $(counts "$log"); $(note $rc), $took s"
  done
}

check_torch() {
  step torch_import 120 python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())'
  if [ $rc -ne 0 ] || ! grep -q ' True$' "$log"; then
    part "PyTorch with CUDA" "$( [ $rc -eq $NOT_RUN ] && echo SKIP || echo FAIL)" "$(tail -1 "$log" | cut -c1-120)"
    return
  fi
  part "PyTorch with CUDA" PASS "torch $(cut -d' ' -f1 "$log")"
  step test_model_gpu_dump 300 build/tests/test_model_gpu --dump "$WORK/dump"
  fails "$log"
  part "test_model_gpu --dump" "$(verdict $rc)" "$(counts "$log"), $(note $rc), $took s"
  local dumps=("$WORK"/dump_*.bin)
  [ -f "${dumps[0]}" ] || { part "torch_parity.py" FAIL "no dump written"; return; }
  step torch_parity 300 python3 test/torch_parity.py "${dumps[@]}"
  grep -E '^(PASS|FAIL):' "$log" | cut -c1-200 | sed 's/^/     /'
  part "torch_parity.py" "$(verdict $rc)" "$(grep -E '^torch_parity:' "$log" | tail -1 | cut -c1-100) ($(note $rc), $took s)"
  rm -f "${dumps[@]}"
}

# follow CPU_METRICS GPU_METRICS STEPS: compares two runs' losses; status 0 when both ran STEPS
# steps, the GPU is within TOL_FIRST of the CPU at step 1 and within TOL_CURVE at every step, and
# the loss fell
follow() {
  python3 - "$@" "$TOL_FIRST" "$TOL_CURVE" <<'EOF'
import json, sys
def losses(p):
    try: return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
    except Exception: return {}
a, b, n, t1, tc = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
if len(a) != n or len(b) != n:
    print("steps: CPU %d, GPU %d of %d" % (len(a), len(b), n)); sys.exit(1)
rel = [abs(b[s] - a[s]) / abs(a[s]) for s in range(1, n + 1)]
print("step 1 rel %.1e, max rel %.1e over %d steps, GPU loss %.3f -> %.3f" % (rel[0], max(rel), n, b[1], b[n]))
sys.exit(0 if rel[0] <= t1 and max(rel) <= tc and b[n] < b[1] else 1)
EOF
}
check_train() {
  local r attn lin name steps=20 sets w extra
  local tiny=(--config configs/tiny.json --set model.ffn_hidden=384 --set train.warmup_steps=5 --set eval.interval=0
    --set eval.sample_interval=0 --set checkpoint.interval=0 --set checkpoint.at_end=false --set log.interval=5)
  for r in "${TRAIN_RUNS[@]}"; do
    read -ra w <<<"$r"
    attn=${w[0]} lin=${w[1]} extra=${w[*]:2}
    name=${attn}_$lin
    sets=()
    for kv in "${w[@]:2}"; do sets+=(--set "$kv"); done
    for dev in cpu gpu; do
      step "tiny_${name}_$dev" 120 ./train_gpt "${tiny[@]}" --device $dev --set train.steps=$steps \
        --set "precision.attention=\"$attn\"" --set "precision.linear=\"$lin\"" "${sets[@]}" --set "log.dir=$WORK/$name.$dev"
      [ $rc -eq 0 ] || break
    done
    if [ "$rc" -ne 0 ]; then
      grep -E 'error|FATAL' "$log" | head -3 | cut -c1-200 | sed 's/^/     /'
      part "tiny: attention $attn, linear $lin${extra:+ $extra}" "$(verdict "$rc")" "$dev run: $(note "$rc")"
      continue
    fi
    d=$(follow "$WORK/$name.cpu/metrics.jsonl" "$WORK/$name.gpu/metrics.jsonl" $steps)
    rc=$?
    part "tiny: attention $attn, linear $lin${extra:+ $extra}: GPU follows the CPU" "$(verdict $rc)" "$d"
  done

  # a stop and a resume on the GPU, with the amax histories of delayed scaling in the checkpoint
  local resume=(--device gpu --set train.steps=40 --set 'precision.attention="fp8_dm"'
    --set 'precision.attention_scaling="delayed"' --set 'precision.linear="fp8_tensor"'
    --set 'precision.linear_scaling="delayed"')
  step resume_straight 120 ./train_gpt "${tiny[@]}" "${resume[@]}" --set "log.dir=$WORK/straight"
  local r1=$rc
  step resume_first 120 ./train_gpt "${tiny[@]}" "${resume[@]}" --set "log.dir=$WORK/resumed" --stop-after 20
  local r2=$rc
  step resume_rest 120 ./train_gpt "${tiny[@]}" "${resume[@]}" --set "log.dir=$WORK/resumed" --resume
  d=$(python3 - "$WORK/straight/metrics.jsonl" "$WORK/resumed/metrics.jsonl" "$TOL_CURVE" <<'EOF'
import json, sys
def losses(p):
    try: return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
    except Exception: return {}
a, b, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
if len(a) != 40 or len(b) != 40:
    print("steps: straight %d, stopped and resumed %d of 40" % (len(a), len(b))); sys.exit(1)
rel = max(abs(b[s] - a[s]) / abs(a[s]) for s in range(21, 41))
print("steps 21-40 max rel %.1e against the straight run (the dQ atomics: not bit for bit)" % rel)
sys.exit(0 if rel <= tol else 1)
EOF
  )
  local rr=$? res=PASS
  [ $rr -ne 0 ] && res=FAIL
  [ $r1$r2$rc = 000 ] || { d="exits $r1, $r2, $rc; $d"; res=FAIL; }
  case " $r1 $r2 $rc " in *" $NOT_RUN "*) res=SKIP ;; esac
  part "tiny GPU, delayed scaling: stop at 20, --resume to 40" "$res" "$d"

  # small_125m: a real model on the GPU
  local s125=(--config configs/small_125m.json --device gpu --set train.steps=300 --set train.warmup_steps=30
    --set eval.interval=100 --set eval.sample_interval=0 --set 'precision.attention="fp8_dm"' --set diagnostics.interval=150
    --set checkpoint.interval=0 --set checkpoint.keep=1 --set log.interval=50 --set "log.dir=$WORK/s125")
  step small_125m 240 ./train_gpt "${s125[@]}"
  local run_log=$log v0 v1 tok
  res=FAIL
  v0=$(sed -n 's/.*"val_loss": \([0-9.]*\).*/\1/p' "$WORK/s125/metrics.jsonl" 2>/dev/null | head -1)
  v1=$(sed -n 's/.*"val_loss": \([0-9.]*\).*/\1/p' "$WORK/s125/metrics.jsonl" 2>/dev/null | tail -1)
  tok=$(median_tok "$WORK/s125/metrics.jsonl" 10)
  if [ $rc -ne 0 ]; then res=$(verdict $rc); elif [ -n "$v0" ] && lt "$v1" "$v0"; then res=PASS; fi
  part "small_125m fp8_dm, 300 steps: val loss falls" "$res" \
    "val ${v0:-?} -> ${v1:-?}, ${tok% *} tok/s, MFU ${tok#* } ($(note $rc), $took s)"
  [ $rc -eq 0 ] || return
  ./train_gpt "${s125[@]}" --dry-run >"$LOG_DIR/dry_run.log" 2>&1
  sed -n '/^GPU memory plan/,/^  total/p' "$run_log" | tail -n +2 >"$WORK/plan_run"
  sed -n '/^memory plan:/,/^  total/p' "$LOG_DIR/dry_run.log" | tail -n +2 >"$WORK/plan_dry"
  if [ -s "$WORK/plan_run" ] && cmp -s "$WORK/plan_run" "$WORK/plan_dry"; then
    part "small_125m: the printed GPU memory plan is --dry-run's" PASS \
      "byte for byte, $(awk '$1 == "total" {print $2, $3}' "$WORK/plan_run")"
  else
    part "small_125m: the printed GPU memory plan is --dry-run's" FAIL \
      "$(diff "$WORK/plan_run" "$WORK/plan_dry" | head -3 | tr '\n' ' ' | cut -c1-120)"
  fi
  local n_diag
  n_diag=$(grep -c '^diagnostics step' "$run_log")
  part "small_125m: diagnostics at steps 150 and 300" "$( [ "$n_diag" -eq 2 ] && echo PASS || echo FAIL)" \
    "$n_diag tables; $(grep -m1 -o 'bias ratio [0-9.e+-]*' "$run_log" || echo 'no bias ratio line')"
  step sample 60 ./train_gpt sample --checkpoint "$WORK/s125" --device gpu --tokens 40 --seed 1
  res=$(verdict $rc)
  [ "$res" = PASS ] && [ ! -s "$log" ] && res=FAIL
  part "sample from its checkpoint on the GPU" "$res" \
    "$(tail -c 100 "$log" | tr '\n' ' ')"
}

# run1 NAME LIMIT [train_gpt options...]: one process, log $WORK/NAME.r0, status rc
run1() {
  local name=$1 lim=$2
  shift 2
  [ "$lim" -gt 0 ] || { rc=$NOT_RUN; return; }
  timeout -k 10 "$lim" ./train_gpt "$@" >"$WORK/$name.r0" 2>&1
  rc=$?
}
# runN NAME RANKS LIMIT [train_gpt options...]: RANKS processes (mpirun when train_gpt has MPI and
# mpirun exists, else torchrun-style variables); logs $WORK/NAME.r<rank>; rc = the worst status
runN() {
  local name=$1 n=$2 lim=$3 r p pids=()
  shift 3
  [ "$lim" -gt 0 ] || { rc=$NOT_RUN; return; }  # (timeout 0 would mean no limit)
  if [ "$LAUNCH" = mpi ]; then
    # shellcheck disable=SC2016 # $0, $@ and the rank variable are the inner shell's
    timeout -k 10 "$lim" mpirun -np "$n" --bind-to none "${ROOTFLAG[@]}" -x NCCL_NVLS_ENABLE -x NCCL_DEBUG \
      sh -c 'exec "$0" "$@" >"'"$WORK/$name"'.r${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" 2>&1' ./train_gpt "$@" \
      >"$WORK/$name.mpirun" 2>&1
    rc=$?
    return
  fi
  local port=$((20000 + RANDOM % 30000))
  for r in $(seq 0 $((n - 1))); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout -k 10 "$lim" ./train_gpt "$@" >"$WORK/$name.r$r" 2>&1 &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || { r=$?; [ $r -gt $rc ] && rc=$r; }; done
}
dp_launcher() {
  LAUNCH=env ROOTFLAG=()
  command -v mpirun >/dev/null && ldd ./train_gpt 2>/dev/null | grep -q libmpi && LAUNCH=mpi
  [ "$(id -u)" = 0 ] && ROOTFLAG=(--allow-run-as-root)  # OpenMPI refuses root without it
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
}
maxdiff() {  # A B: the largest |loss difference| over the steps both "step loss" files have
  awk 'NR == FNR {a[$1] = $2; next} ($1 in a) {d = a[$1] - $2; if (d < 0) d = -d; if (d > m) m = d}
       END {printf "%.3g", m + 0}' "$1" "$2"
}
lt() { awk -v a="$1" -v b="$2" 'BEGIN {exit !(a < b)}'; }
check_dp() {
  local t n tol=1e-2 lim
  for t in test_zero1_gpu test_comm; do
    step "$t" 120 "build/tests/$t"
    fails "$log" 5
    part "$t" "$(verdict $rc)" "$(counts "$log"), $(note $rc)"
  done
  dp_launcher
  echo "   2-rank runs start with the $LAUNCH launcher"
  local TINY=(--config configs/tiny.json --device gpu --set train.micro_batch=4 --set train.batch_tokens=512
    --set train.steps=20 --set train.warmup_steps=2 --set eval.interval=10 --set eval.batches=2
    --set eval.sample_interval=0 --set log.interval=5 --set checkpoint.interval=10 --set checkpoint.keep=3
    --set train.comm_timeout_s=30)
  # 1 GPU x micro-batch 4 x 2 accumulation against 2 GPUs x 4: the same sums in another order
  run1 one "$(limit 150)" "${TINY[@]}" --set "log.dir=$WORK/one"
  local r_one=$rc
  runN dp 2 "$(limit 150)" "${TINY[@]}" --set "log.dir=$WORK/dp"
  local r_dp=$rc
  runN z1 2 "$(limit 150)" "${TINY[@]}" --zero1 --set "log.dir=$WORK/z1"
  local r_z1=$rc
  losses "$WORK/one/metrics.jsonl" >"$WORK/l1"
  losses "$WORK/dp/metrics.jsonl" >"$WORK/l2"
  losses "$WORK/z1/metrics.jsonl" >"$WORK/lz"
  local d_dp d_z n2 nz
  n2=$(wc -l <"$WORK/l2") nz=$(wc -l <"$WORK/lz")
  d_dp=$(maxdiff "$WORK/l1" "$WORK/l2") d_z=$(maxdiff "$WORK/l1" "$WORK/lz")
  part "2 GPUs x 4 vs 1 GPU x 4 x 2 accumulation, plain" \
    "$( [ $r_one$r_dp = 00 ] && [ "$n2" -eq 20 ] && lt "$d_dp" $tol && echo PASS || echo FAIL)" \
    "max |dloss| $d_dp over $n2 of 20 steps (tol $tol; exits $r_one, $r_dp)"
  part "2 GPUs x 4 vs 1 GPU x 4 x 2 accumulation, ZeRO-1" \
    "$( [ $r_z1 = 0 ] && [ "$nz" -eq 20 ] && lt "$d_z" $tol && echo PASS || echo FAIL)" \
    "max |dloss| $d_z over $nz of 20 steps (tol $tol; exit $r_z1)"
  # the gradients reduced during the backward (train.overlap_comm, the default) or after it: the
  # same sums, so the same losses bit for bit
  local SHORT=(--set train.steps=10 --set checkpoint.interval=0 --set eval.interval=5)
  runN dpo 2 "$(limit 150)" "${TINY[@]}" --set checkpoint.interval=0 --set train.overlap_comm=false --set "log.dir=$WORK/dpo"
  losses "$WORK/dpo/metrics.jsonl" >"$WORK/lo"
  runN za 2 "$(limit 150)" "${TINY[@]}" "${SHORT[@]}" --zero1 --set train.batch_tokens=1024 --set "log.dir=$WORK/za"
  losses "$WORK/za/metrics.jsonl" >"$WORK/lza"
  runN zao 2 "$(limit 150)" "${TINY[@]}" "${SHORT[@]}" --zero1 --set train.batch_tokens=1024 --set train.overlap_comm=false \
    --set "log.dir=$WORK/zao"
  losses "$WORK/zao/metrics.jsonl" >"$WORK/lzao"
  for t in "plain, 1 micro-step per rank:l2:lo:20" "ZeRO-1, 2 micro-steps per rank:lza:lzao:10"; do
    IFS=: read -r name a b n <<<"$t"
    part "overlap_comm off vs on, $name: bit for bit" \
      "$( [ "$(wc -l <"$WORK/$b")" -eq "$n" ] && cmp -s "$WORK/$a" "$WORK/$b" && echo PASS || echo FAIL)" \
      "max |dloss| $(maxdiff "$WORK/$a" "$WORK/$b") over $(wc -l <"$WORK/$b") of $n steps"
  done
  # ZeRO-1's printed per-GPU plan is --dry-run --world-size 2 --zero1's
  ./train_gpt "${TINY[@]}" --dry-run --world-size 2 --zero1 >"$WORK/dry.txt" 2>&1
  sed -n '/^GPU memory plan/,/^  total/p' "$WORK/z1.r0" | tail -n +2 >"$WORK/plan_run"
  sed -n '/^memory plan:/,/^  total/p' "$WORK/dry.txt" | tail -n +2 >"$WORK/plan_dry"
  part "ZeRO-1's printed plan is --dry-run --world-size 2 --zero1's" \
    "$( [ -s "$WORK/plan_run" ] && cmp -s "$WORK/plan_run" "$WORK/plan_dry" && echo PASS || echo FAIL)" \
    "$(awk '$1 == "total" {print "total", $2, $3}' "$WORK/plan_run")"
  # resume from the step-10 checkpoints: ZeRO-1 on 2 GPUs -> 1 GPU, 1 GPU -> 2 with ZeRO-1
  run1 to1 "$(limit 150)" "${TINY[@]}" --set "log.dir=$WORK/to1" --resume "$WORK/z1/checkpoints/step_000010.ckpt"
  local r_to1=$rc
  runN to2 2 "$(limit 150)" "${TINY[@]}" --zero1 --set "log.dir=$WORK/to2" --resume "$WORK/one/checkpoints/step_000010.ckpt"
  local r_to2=$rc
  losses "$WORK/to1/metrics.jsonl" >"$WORK/lr1"
  losses "$WORK/to2/metrics.jsonl" >"$WORK/lr2"
  for t in "2 GPUs (ZeRO-1) -> 1 GPU:lr1:lz:$r_to1" "1 GPU -> 2 GPUs (ZeRO-1):lr2:l1:$r_to2"; do
    IFS=: read -r name a b r <<<"$t"
    n=$(wc -l <"$WORK/$a")
    local eq=no d
    [ -n "$(head -1 "$WORK/$a")" ] && [ "$(head -1 "$WORK/$a")" = "$(sed -n 11p "$WORK/$b")" ] && eq=yes
    d=$(maxdiff "$WORK/$b" "$WORK/$a")
    part "resume at step 10, $name" \
      "$( [ "$r" = 0 ] && [ "$n" -eq 10 ] && [ $eq = yes ] && lt "$d" $tol && echo PASS || echo FAIL)" \
      "exit $r, $n of 10 steps, step 11 as in the source run: $eq, max |dloss| $d"
  done
  # a killed rank: rank 0 must stop within the comm timeout (4 s) + 3 s, naming the collective.
  # torchrun-style always: under mpirun, mpirun itself ends every rank when one dies
  local port=$((20000 + RANDOM % 30000)) d0 d1 before t0 dt msg
  for r in 0 1; do  # no `timeout` around them: the pids must be train_gpt's own
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      ./train_gpt "${TINY[@]}" --zero1 --set train.steps=1000000 --set checkpoint.interval=0 --set eval.interval=0 \
      --set train.comm_timeout_s=4 --set "log.dir=$WORK/dead" >"$WORK/dead.r$r" 2>&1 &
    eval "d$r=$!"
    bg_pids="$bg_pids $!"
  done
  n=0
  while [ "$(losses "$WORK/dead/metrics.jsonl" | wc -l)" -lt 5 ] && [ $n -lt 600 ] && kill -0 "$d0" 2>/dev/null; do
    sleep 0.1; n=$((n + 1))
  done
  before=$(losses "$WORK/dead/metrics.jsonl" | wc -l)
  kill -9 "$d1" 2>/dev/null
  wait "$d1" 2>/dev/null
  t0=$(date +%s.%N)
  n=0
  while kill -0 "$d0" 2>/dev/null && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
  if kill -0 "$d0" 2>/dev/null; then kill -9 "$d0"; wait "$d0" 2>/dev/null; rc=124; else wait "$d0"; rc=$?; fi
  reaped "$d0" "$d1"
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  msg=$(grep -h "train_gpt: error" "$WORK/dead.r0" | tail -1 | sed 's/^train_gpt: error: //' | cut -c1-90)
  part "killed rank 1 after step $before (ZeRO-1, comm timeout 4 s)" \
    "$( [ "$before" -ge 5 ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && lt "$dt" 7 && echo PASS || echo FAIL)" \
    "rank 0 exit $rc after $dt s: ${msg:-no error line}"
  for f in "$WORK"/*.r0 "$WORK"/*.r1 "$WORK"/*.mpirun; do  # every run's output, for the log
    [ -s "$f" ] && { echo "===== $(basename "$f")"; grep -v '^step [0-9]*/[0-9]* | loss' "$f" | head -30; }
  done >"$LOG_DIR/runs.log" 2>&1
}

# --- bench areas ---------------------------------------------------------------------------------
# gpu_state FILE: nvidia-smi samples the clocks, power and clock-event reasons every 0.5 s into
# FILE until gpu_state_end, which prints their summary over the busy samples: the same code runs
# some % slower on a board at its power cap, and this tells such runs apart
gpu_state() {
  local q=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu=$q --format=csv,noheader >/dev/null 2>&1 || q=${q/clocks_event/clocks_throttle}
  nvidia-smi -i 0 --query-gpu="$q" --format=csv,noheader,nounits -lms 500 >"$1" 2>/dev/null &
  state_pid=$! state_file=$1
  bg_pids="$bg_pids $state_pid"
}
gpu_state_end() {
  kill "$state_pid" 2>/dev/null
  wait "$state_pid" 2>/dev/null
  reaped "$state_pid"
  python3 - "$state_file" <<'EOF'
import sys
rows = [[f.strip() for f in l.split(",")] for l in open(sys.argv[1]) if l.count(",") >= 4]
num = lambda x: float(x) if x.replace(".", "", 1).isdigit() else 0.0
busy = [r for r in rows if num(r[0]) > 1000]
if not busy:
    print("GPU state: no busy samples")
else:
    sm = sorted(num(r[0]) for r in busy)
    print("GPU state while busy (%d samples): SM clock median %.0f MHz, memory %.0f-%.0f MHz, power max %.0f W, "
          "temperature max %.0f C, clock-event reasons %s" % (len(busy), sm[len(sm) // 2], min(num(r[1]) for r in busy),
          max(num(r[1]) for r in busy), max(num(r[2]) for r in busy), max(num(r[3]) for r in busy),
          " ".join(sorted(set(r[4] for r in busy)))))
EOF
}
bench_attention() {
  attn_lib build/gpu_sh/attn || return
  gpu_state "$WORK/state.csv"
  step bench_attention_fp8 360 python3 dev/bench/bench_attention_fp8.py --lib "$LIB" --rounds 20 \
    --summary-out "$LOG_DIR/table_fp8.log"
  gpu_state_end | tee "$LOG_DIR/gpu_state.log" | sed 's/^/   /'
  [ $rc -eq 0 ] || tail -15 "$log" | cut -c1-200 | sed 's/^/     /'
  grep -E 'DIFFER|SUSPECT|NOT timed' "$log" | head -5 | sed 's/^/     /'
  part "bench_attention_fp8.py: every mode, forward and backward" "$(verdict $rc)" "$(note $rc), $took s"
  [ -s "$LOG_DIR/table_fp8.log" ] && tables+=("$LOG_DIR/table_fp8.log" "$LOG_DIR/gpu_state.log")
  # our BF16 kernels against SDPA's cuDNN (its best call) and FlashAttention-2 backends, interleaved
  step bench_attention 200 python3 dev/bench/bench_attention.py --lib "$LIB"
  [ $rc -eq 0 ] || tail -5 "$log" | cut -c1-200 | sed 's/^/     /'
  part "bench_attention.py: BF16 against cuDNN and FlashAttention-2" "$(verdict $rc)" "$(note $rc), $took s"
  [ $rc -eq 0 ] && { grep -E '^\||^cuDNN = |^   T=' "$log" >"$LOG_DIR/table_bf16.log"; tables+=("$LOG_DIR/table_bf16.log"); }
  # cuDNN BF16 at cudnn-frontend's published shape: how close the same-run peer comes to NVIDIA's figures
  step bench_attention_nvidia_shape 120 python3 dev/bench/bench_attention.py --lib "$LIB" --nvidia-shape
  [ $rc -eq 0 ] || tail -5 "$log" | cut -c1-200 | sed 's/^/     /'
  part "bench_attention.py --nvidia-shape: cuDNN BF16 at B 1, H 64" "$(verdict $rc)" "$(note $rc), $took s"
  [ $rc -eq 0 ] && { grep -vE '^#' "$log" >"$LOG_DIR/table_nvidia_shape.log"; tables+=("$LOG_DIR/table_nvidia_shape.log"); }
}
bench_attention_sustained() {
  attn_lib build/gpu_sh/attn || return
  step sustained 300 python3 dev/bench/bench_attention_sustained.py --lib "$LIB" --T 1024 2048 4096 8192
  part "two clock regimes, T 1K..8K" "$(verdict $rc)" "$(note $rc), $took s"
  sed -n '/^forwards under two clock regimes/,$p' "$log" >"$LOG_DIR/table_sustained.log"
  tables+=("$LOG_DIR/table_sustained.log")
  # T near 8K (62, 64, 65 key blocks): a cost of 8192 itself (rows T bytes apart in V^T) or of long T
  local T
  for T in 7936 8192 8320; do
    step "long_t_$T" 120 python3 dev/bench/bench_attention_fp8.py --lib "$LIB" --modes bf16 fp8_dm --tokens $((2 * T)) \
      --T $T --rounds 10 --summary-out "$LOG_DIR/table_T$T.log"
    part "bf16 and fp8_dm at T $T" "$(verdict $rc)" "$(note $rc), $took s"
    [ -s "$LOG_DIR/table_T$T.log" ] && { echo "== T $T"; cat "$LOG_DIR/table_T$T.log"; } >"$LOG_DIR/table_near8k_$T.log" &&
      tables+=("$LOG_DIR/table_near8k_$T.log")
  done
}
bench_qkv_gemm() {
  build 420 build/bench/bench_qkv_gemm || return
  local shape w
  for shape in "2048" "1536 4096" "3072 4096"; do
    read -ra w <<<"$shape"
    step "bench_qkv_gemm_C${w[0]}" 200 build/bench/bench_qkv_gemm 5 "${w[@]}"
    part "bench_qkv_gemm, C $shape" "$(verdict $rc)" "$(note $rc), $took s"
    { echo "== C $shape"; cat "$log"; } >"$LOG_DIR/table_C${w[0]}.log"
    tables+=("$LOG_DIR/table_C${w[0]}.log")
  done
}
bench_layers() {
  build 420 build/bench/bench_layers build/tests/test_layers_gpu build/tests/test_matmul_gpu || return
  step bench_layers 120 build/bench/bench_layers
  part "bench_layers, paper_569m's shapes" "$(verdict $rc)" "$(note $rc), $took s"
  cp "$log" "$LOG_DIR/table_layers.log"
  local c
  for c in 2048 3072; do  # paper_1p67b's and paper_5p29b's width: the RMSNorm backward
    step "bench_layers_C$c" 120 build/bench/bench_layers 16384 $c
    part "bench_layers, C $c" "$(verdict $rc)" "$(note $rc)"
    grep -E '^# bench|rmsnorm' "$log" >>"$LOG_DIR/table_layers.log"
  done
  step bench_layers_torch 120 python3 dev/bench/bench_layers_torch.py
  part "bench_layers_torch.py: PyTorch's cross-entropy" "$(verdict $rc)" "$(note $rc)"
  cat "$log" >>"$LOG_DIR/table_layers.log"
  tables+=("$LOG_DIR/table_layers.log")
  # every layer kernel and the BF16 GEMMs at training sizes (the tests' timing sections)
  local t
  for t in test_layers_gpu test_matmul_gpu; do
    step "${t}_timing" 180 env GPU_LAYERS_TIMING=1 "build/tests/$t"
    part "$t with GPU_LAYERS_TIMING=1" "$(verdict $rc)" "$(counts "$log"), $(note $rc)"
    grep '^# timing' "$log" >"$LOG_DIR/table_$t.log"
    tables+=("$LOG_DIR/table_$t.log")
  done
}
bench_linear_fp8() {
  build 420 build/bench/bench_fp8_quant build/bench/bench_fp8_gemm || return
  local name args r w
  for r in "quant_569m:bench_fp8_quant" "quant_125m:bench_fp8_quant 16384 768 2048" \
    "gemm_569m:bench_fp8_gemm paper_569m 16384 1536 3968 15" \
    "gemm_1p67b:bench_fp8_gemm paper_1p67b 16384 2048 5504 29"; do
    name=${r%%:*} args=${r#*:}
    read -ra w <<<"$args"
    step "$name" 150 "build/bench/${w[0]}" "${w[@]:1}"
    part "$args" "$(verdict $rc)" "$(note $rc), $took s"
    { echo "== $args"; cat "$log"; } >"$LOG_DIR/table_$name.log"
    tables+=("$LOG_DIR/table_$name.log")
  done
}
bench_e2e() {
  local runs=${RUNS:-$E2E_RUNS} r cfg attn lin extra configs=() mbs=() c n_runs=0 kv
  for r in $runs; do  # CONFIG:ATTENTION:LINEAR[:KEY=VALUE,...]
    IFS=: read -r cfg attn lin extra <<<"$r"
    if [ ! -f "configs/$cfg.json" ] || [ -z "$lin" ]; then
      echo "gpu.sh: bench e2e: run '$r' is not CONFIG:ATTENTION:LINEAR[:KEY=VALUE,...] with configs/CONFIG.json" >&2
      part "RUNS" FAIL "'$r' is not CONFIG:ATTENTION:LINEAR[:KEY=VALUE,...]"
      return
    fi
    case " ${configs[*]} " in *" $cfg "*) ;; *) configs+=("$cfg") ;; esac
    n_runs=$((n_runs + 1))
  done
  # train_gpt builds in the background while PyTorch compiles; PyTorch times its steps only once
  # the build is done (--wait-for), so no compiler shares the CPU with timed steps
  lim=$(limit 420)
  [ "$lim" -gt 0 ] || { part build SKIP "not run: BUDGET spent"; return; }
  (timeout -k 10 "$lim" make -j"$JOBS" SETUP=0 "${CJ[@]}" train_gpt >"$LOG_DIR/build.log" 2>&1
   echo $? >"$WORK/build.rc"; touch "$WORK/build.done") &
  local build_pid=$!
  bg_pids="$bg_pids $build_pid"
  local targs=() accs=() shape
  for c in "${configs[@]}"; do  # micro-batch and micro-batches a step (ACCUM, or the config's batch_tokens)
    shape=$(python3 -c 'import json, sys
t = json.load(open(sys.argv[1]))["train"]; m = json.load(open(sys.argv[1]))["model"]
mb = t.get("micro_batch", 8); per = mb * m["seq_len"]
print(mb, max(1, t.get("batch_tokens", 0) // per) if sys.argv[2] == "config" else sys.argv[2])' "configs/$c.json" "$ACCUM")
    mbs+=("${shape% *}") accs+=("${shape#* }")
    targs+=(--config "configs/$c.json" --micro-batch "${mbs[-1]}" --accum "${accs[-1]}")
  done
  # PyTorch gets what the budget leaves after ~40 s per train_gpt run
  step torch_baseline $(( BUDGET - $(elapsed) - 5 - 40 * n_runs )) python3 dev/bench/bench_e2e.py "${targs[@]}" \
    --warmup 3 --steps 8 --profile --wait-for "$WORK/build.done" --wait-max 400
  grep -E '^torch-e2e ' "$log" | cut -c1-200 | sed 's/^/     /'
  part "PyTorch baseline (dev/bench/bench_e2e.py)" "$(verdict $rc)" "$(note $rc), $took s"
  cp "$log" "$WORK/torch.log"
  wait "$build_pid"
  reaped "$build_pid"
  if [ "$(cat "$WORK/build.rc" 2>/dev/null)" != 0 ]; then
    grep -E 'error' "$LOG_DIR/build.log" | head -5 | sed 's/^/     /'
    part build FAIL "make train_gpt: exit $(cat "$WORK/build.rc" 2>/dev/null)"
    return
  fi
  part build PASS "make train_gpt"
  local i=0 sets tok ci acc mb seq peak plan smi_pid
  : >"$WORK/ours.tsv"
  for r in $runs; do
    IFS=: read -r cfg attn lin extra <<<"$r"
    i=$((i + 1))
    sets=()
    for kv in ${extra//,/ }; do  # numbers and booleans as they are, anything else a JSON string
      case ${kv#*=} in
        true | false | [0-9]* | -[0-9]*) sets+=(--set "$kv") ;;
        *) sets+=(--set "${kv%%=*}=\"${kv#*=}\"") ;;
      esac
    done
    for ci in "${!configs[@]}"; do [ "${configs[$ci]}" = "$cfg" ] && mb=${mbs[$ci]} acc=${accs[$ci]}; done
    seq=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["model"]["seq_len"])' "configs/$cfg.json")
    # nvidia-smi's memory.used while it runs: the peak memory of the run
    nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$WORK/run$i.smi" 2>/dev/null &
    smi_pid=$!
    bg_pids="$bg_pids $smi_pid"
    step "run$i" 150 ./train_gpt --config "configs/$cfg.json" --device gpu --set train.batch_tokens=$((acc * mb * seq)) \
      --set train.steps="$E2E_STEPS" --set train.warmup_steps=2 --set train.recompute=false \
      --set "precision.attention=\"$attn\"" --set "precision.linear=\"$lin\"" "${sets[@]}" \
      --set "data.train=data/austen/train_*.bin" --set "data.val=data/austen/val_*.bin" --set eval.interval=0 \
      --set eval.batches=1 --set eval.sample_interval=0 --set checkpoint.interval=0 --set checkpoint.at_end=false \
      --set log.interval=1 --set "log.dir=$WORK/run$i"
    kill "$smi_pid" 2>/dev/null
    wait "$smi_pid" 2>/dev/null
    reaped "$smi_pid"
    peak=$(sort -n "$WORK/run$i.smi" 2>/dev/null | tail -1)
    plan=$(awk '/^GPU memory plan/ {p = 1} p && /^  total/ {print $2; exit}' "$log")
    tok=$(median_tok "$WORK/run$i/metrics.jsonl" 3)
    part "$cfg, attention $attn, linear $lin${extra:+, $extra}" "$(verdict $rc)" \
      "${tok% *} tok/s, peak ${peak:-?} MiB ($(note $rc), $took s)"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$cfg" "$attn" "$lin" "${extra:--}" "${tok% *}" "${tok#* }" \
      "$(sed -n 's/.*"final_train_loss": \([0-9.]*\).*/\1/p' "$WORK/run$i/summary.json" 2>/dev/null)" "${peak:-0}" \
      "${plan:-n/a}" "$acc" >>"$WORK/ours.tsv"
    rm -rf "$WORK/run$i/checkpoints"  # only a stop writes one: gigabytes at paper scale
  done
  python3 dev/bench/e2e_table.py "$WORK/ours.tsv" "$WORK/torch.log" >"$LOG_DIR/table_e2e.log" 2>&1
  tables+=("$LOG_DIR/table_e2e.log")
}
bench_dp() {
  build 420 train_gpt || return
  dp_launcher
  local SCALE=(--config configs/paper_569m.json --device gpu --set "data.train=data/austen/train_*.bin"
    --set "data.val=data/austen/val_*.bin" --set train.steps=6 --set train.warmup_steps=2 --set train.batch_tokens=131072
    --set eval.interval=0 --set eval.batches=1 --set eval.sample_interval=0 --set log.interval=1
    --set checkpoint.interval=0 --set checkpoint.at_end=false --set train.comm_timeout_s=120)
  local g z o name tok t1="" gl=1
  [ "$ngpu" -gt 2 ] && gl="1 2"
  : >"$WORK/dp.tsv"
  for g in $gl $ngpu; do
    for z in false true; do
      for o in true false; do
        [ "$g" = 1 ] && { [ $z = true ] || [ $o = false ]; } && continue
        [ "$g" != "$ngpu" ] && [ $o = false ] && continue
        name=g${g}_z${z}_o$o
        if [ "$g" = 1 ]; then
          step "$name" 200 ./train_gpt "${SCALE[@]}" --set "log.dir=$WORK/$name"
        else
          runN "$name" "$g" "$(limit 200)" "${SCALE[@]}" --set train.zero1=$z --set train.overlap_comm=$o \
            --set "log.dir=$WORK/$name"
          cp "$WORK/$name.r0" "$LOG_DIR/$name.log" 2>/dev/null
        fi
        tok=$(median_tok "$WORK/$name/metrics.jsonl" 2)
        tok=${tok% *}
        [ "$g" = 1 ] && t1=$tok
        part "paper_569m, $g GPU(s), $([ $z = true ] && echo ZeRO-1 || echo plain), overlap_comm $o" "$(verdict $rc)" \
          "$tok tok/s ($(note $rc))"
        printf '%s\t%s\t%s\t%s\n' "$g" "$z" "$o" "$tok" >>"$WORK/dp.tsv"
      done
    done
  done
  awk -F'\t' -v t1="${t1:-0}" '
    BEGIN {print "| GPUs | optimizer | overlap_comm | tok/s | vs 1 GPU | per GPU |"; print "|---|---|---|---|---|---|"}
    {s = (t1 > 0) ? $4 / t1 : 0
     printf "| %s | %s | %s | %s | %.3f | %.3f |\n", $1, ($2 == "true" ? "ZeRO-1" : "plain"), $3, $4, s, s / $1}
    END {print "paper_569m on data/austen, 131072 tokens per step (1 GPU: 8 micro-batches of 4 x 4096), " \
               "median tok/s of steps 3-6"}' \
    "$WORK/dp.tsv" >"$LOG_DIR/table_dp.log"
  tables+=("$LOG_DIR/table_dp.log")
}
bench_lab() {  # NAME: dev/bench/NAME.cu, built by the Makefile's rule for GPU benchmarks, run with ARGS
  build 420 "build/bench/$1" || return
  step "$1" 480 "build/bench/$1" "${ARGS[@]}"
  part "build/bench/$1 ${ARGS[*]}" "$(verdict $rc)" "$(note $rc), $took s"
  tail -60 "$log" >"$LOG_DIR/table_$1.log"
  tables+=("$LOG_DIR/table_$1.log")
}

# --- profile areas -------------------------------------------------------------------------------
profile_attention() {
  find_ncu || return
  attn_lib build/gpu_sh/attn || return
  local k mode
  for k in attn_fwd_fp8_kernel attn_bwd_fp8_kernel attn_fp8_delta_kernel; do
    mode=fp8_naive
    [ $k = attn_fp8_delta_kernel ] && mode=fp8_dm  # fp8_dm runs the delta pass
    ncu_run "$k" 150 -k "regex:^$k" -c 1 -- \
      python3 dev/bench/bench_attention_fp8.py --lib "$LIB" --modes $mode --T 4096 --rounds 1
  done
}
profile_qkv_gemm() {
  find_ncu || return
  build 420 build/bench/bench_qkv_gemm || return
  ncu_run qkv_gemm_cublas 150 -k "regex:nvjet|xmma|gemm|cutlass" --launch-skip 1 -c 1 -- \
    build/bench/bench_qkv_gemm profile cublas 2048
  ncu_run qkv_gemm_ours 150 -k "regex:qkv_gemm_kernel" --launch-skip 1 -c 1 -- build/bench/bench_qkv_gemm profile default 2048
}
profile_fp8_quant() {
  find_ncu || return
  build 420 build/bench/bench_fp8_quant || return
  local re
  for re in vec128both_kernel swiglu_fp8_kernel swiglu_bwd_fp8_kernel rmsnorm_tile_fp8_kernel; do
    # past the warm-up launches: the fourth launch of each kernel
    ncu_run "$re" 120 --kernel-name-base demangled -k "regex:$re" -s 3 -c 1 -- build/bench/bench_fp8_quant
  done
}

# --- run ---------------------------------------------------------------------------------------------
if [ "$MODE" = check ]; then
  begin build
  build 480 train_gpt tests
  built=$?
  finish
  for a in "${AREAS[@]}"; do
    begin "$a"
    if [ $built -ne 0 ]; then part "$a" SKIP "not run: no build"; else "check_${a//-/_}"; fi
    finish
  done
else
  begin "${AREAS[0]}"
  case ${AREAS[0]} in
    lab:*) bench_lab "${AREAS[0]#lab:}" ;;
    *) "${MODE}_${AREAS[0]//-/_}" ;;
  esac
  finish
fi
summary
