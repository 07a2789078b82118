#!/bin/bash
# gpu_attention_check.sh: on a GPU machine, in one go: build the fused attention kernels
# (attention/fwd_bf16.cu, attention/fwd_bf16_mma.cu, attention/bwd_bf16.cu), their test, their
# benchmark binary and a shared library for dev/bench/bench_attention.py with explicit nvcc commands
# (no Makefile, no cJSON); show the register/spill report, the SASS instruction mix and a check that no instruction overwrites
# the registers an in-flight wgmma reads; run test/test_attention_gpu with every forward kernel
# and with each backward kernel (ATTN_GPU_BWD: wgmma, the default, and mma); then the benchmark
# against PyTorch SDPA (cuDNN, FA2), timed interleaved. The table prints last.
# Logs go to $OUT (or /tmp/gpu_attn_out).
#   usage: bash scripts/gpu_attention_check.sh [--no-bench] [--no-test]
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_attn_out}
BD=${BD:-/tmp/gpu_attn_build}
mkdir -p "$OUT" "$BD"
do_test=1; do_bench=1
for a in "$@"; do
  case $a in --no-bench) do_bench=0 ;; --no-test) do_test=0 ;; esac
done
. scripts/gpu_lib.sh  # NVCC, CJ, t_start, elapsed, left
ARCH="-gencode arch=compute_90a,code=sm_90a"
NVF="-std=c++17 -O3 -lineinfo $ARCH -I. -Itest"
IMPLS="wgmma_tma wgmma_pipe mma"  # ATTN_GPU_FWD values (attention/fwd_bf16.cu)
BWD_IMPLS="wgmma mma"              # ATTN_GPU_BWD values (attention/bwd_bf16.cu; the first is the default)
SRCS="attention_fwd attention_fwd_mma attention_bwd"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
echo "== build"
t0=$(date +%s)
gcc -std=c11 -D_GNU_SOURCE -O2 -fPIC -I. -c core/common.c -o "$BD/common.o" || exit 1
pids=""
for f in $SRCS; do
  $NVCC $NVF -Xcompiler -fPIC -Xptxas -v -c src/$f.cu -o "$BD/$f.o" 2> "$BD/ptxas_$f.txt" &
  pids="$pids $!"
done
for p in $pids; do wait $p || { cat "$BD"/ptxas_*.txt; exit 1; }; done
cat "$BD"/ptxas_*.txt > "$OUT/ptxas.txt"
grep -E "C75|arning" "$OUT/ptxas.txt" | head -5
grep -E "Compiling entry|registers|spill" "$OUT/ptxas.txt" | sed -E 's/_Z[0-9]+(attn_[a-z_0-9]+)ILi([0-9]+)E.*/\1<\2>/' |
  paste - - - | awk '{print "  " $0}' | sed -E 's/ptxas info *: //g' | cut -c1-200
OBJS="$(for f in $SRCS; do printf '%s ' "$BD/$f.o"; done)$BD/common.o"
$NVCC $NVF -Xcompiler -fopenmp test/test_attention_gpu.cu $OBJS -o "$BD/test_attention_gpu" &
p1=$!
$NVCC $NVF dev/bench/bench_attention.cu $OBJS -o "$BD/bench_attention" &
p2=$!
$NVCC $ARCH -shared $OBJS -o "$BD/libattn.so" || exit 1
wait $p1 || exit 1
wait $p2 || exit 1
echo "   built in $(( $(date +%s) - t0 )) s"

echo "== SASS: instruction mix per kernel (HGMMA HMMA LDSM LDL STL), in-flight wgmma register check"
CUOBJDUMP=$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")
for f in $SRCS; do "$CUOBJDUMP" -sass "$BD/$f.o"; done > "$OUT/attention.sass" 2>&1
awk '/Function :/ {name=$3} /HGMMA/ {g[name]++} /HMMA/ {m[name]++} /LDSM/ {s[name]++}
     / LDL/ {ll[name]++} / STL/ {sl[name]++} /Function :/ {names[name]=1}
     END {for (n in names) printf "  %-70s %5d %5d %5d %4d %4d\n", substr(n,1,70), g[n], m[n], s[n], ll[n], sl[n]}' \
  "$OUT/attention.sass"
# An HGMMA whose A operand is in registers (R<n>: 4 registers for BF16 k16) reads them until a
# WARPGROUP.DEPBAR.LE gsb0, 0x0 retires it. Flag any instruction in between (in program order)
# that writes one of them. Program order across branches is an approximation; a hit is a lead.
python3 - "$OUT/attention.sass" <<'EOF'
import re, sys
fn, live, hits, rs_count = None, {}, {}, {}
NOWRITE = ("ST", "RED", "BAR", "BRA", "EXIT", "WARPGROUP", "HGMMA", "NOP", "CALL", "RET", "BSYNC",
           "BSSY", "DEPBAR", "MEMBAR", "FENCE", "SYNCS", "ARRIVES", "WARPSYNC", "YIELD", "LDGDEPBAR", "LDGSTS")
for line in open(sys.argv[1]):
    m = re.search(r"Function : (\S+)", line)
    if m:
        fn, live = m.group(1), {}
        hits.setdefault(fn, []); rs_count.setdefault(fn, 0)
        continue
    m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);", line)
    if not m or fn is None:
        continue
    addr, op, args = m.group(1), m.group(3), m.group(4)
    ops = [a.strip() for a in args.split(",")]
    if op.startswith("HGMMA"):
        if len(ops) > 1 and re.fullmatch(r"R\d+", ops[1]):
            r0 = int(ops[1][1:]); rs_count[fn] += 1
            for r in range(r0, r0 + 4): live[r] = addr
        continue
    if op.startswith("WARPGROUP.DEPBAR") and "0x0" in args:
        live = {}
        continue
    if len(ops) > 1 and re.fullmatch(r"U?P(\d+|T)", ops[0]):
        ops = ops[1:]  # predicate result first (SHFL, LOP3 with P out): the register comes next
    if not live or op.startswith(NOWRITE) or not ops or not re.fullmatch(r"R\d+", ops[0]):
        continue
    width = 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op) else 1
    d0 = int(ops[0][1:])
    for r in range(d0, d0 + width):
        if r in live:
            hits[fn].append(f"{addr} {op} {args.strip()[:60]} (HGMMA at {live[r]} reads R{r})")
for f in sorted(hits):
    if rs_count[f]:
        name = re.sub(r"_Z\d+(attn_\w+?)ILi(\d+).*", r"\1<\2>", f)
        print(f"  {name}: {rs_count[f]} HGMMA with A in registers, {len(hits[f])} overwrites in flight"
              + "".join("\n     " + h for h in hits[f][:4]))
EOF

rc=0
passed=""  # forward kernels that passed the test: the only ones benchmarked
if [ $do_test = 1 ]; then
  echo "== test (default forward kernel, then each other one; 60 s limit each)"
  t0=$(date +%s)
  OMP_NUM_THREADS=$(nproc) timeout 60 "$BD/test_attention_gpu" > "$OUT/test.log" 2>&1; rc=$?
  grep -E "^(FAIL|skipped|# forward)" "$OUT/test.log" | head -12
  echo "   default: $(grep -c '^ok - ' "$OUT/test.log") ok, $(grep -c '^FAIL - ' "$OUT/test.log") FAIL, exit $rc, $(( $(date +%s) - t0 )) s"
  default=$(sed -n 's/^# forward kernel: \([a-z_]*\).*/\1/p' "$OUT/test.log")
  if command -v compute-sanitizer >/dev/null; then
    echo "   compute-sanitizer memcheck, default kernel, small cases (log: sanitizer.log)"
    ATTN_TEST_SMALL=1 timeout 40 compute-sanitizer --tool memcheck "$BD/test_attention_gpu" > "$OUT/sanitizer.log" 2>&1
    grep -E "ERROR SUMMARY|Invalid|^FAIL" "$OUT/sanitizer.log" | head -6
    echo "   $(grep -c '^ok - ' "$OUT/sanitizer.log") ok under memcheck"
  fi
  for impl in $IMPLS; do
    [ "$impl" = "$default" ] && continue
    t0=$(date +%s)
    ATTN_GPU_FWD=$impl OMP_NUM_THREADS=$(nproc) timeout 60 "$BD/test_attention_gpu" > "$OUT/test_$impl.log" 2>&1
    r=$?
    grep -E "^FAIL" "$OUT/test_$impl.log" | head -3
    echo "   ATTN_GPU_FWD=$impl: $(grep -c '^ok - ' "$OUT/test_$impl.log") ok, $(grep -c '^FAIL - ' "$OUT/test_$impl.log") FAIL, exit $r, $(( $(date +%s) - t0 )) s"
    [ $r = 0 ] && passed="$passed $impl"
  done
  for bimpl in $BWD_IMPLS; do
    [ "$bimpl" = "${BWD_IMPLS%% *}" ] && continue  # the default ran above
    t0=$(date +%s)
    ATTN_GPU_BWD=$bimpl OMP_NUM_THREADS=$(nproc) timeout 60 "$BD/test_attention_gpu" > "$OUT/test_bwd_$bimpl.log" 2>&1
    r=$?
    grep -E "^FAIL" "$OUT/test_bwd_$bimpl.log" | head -3
    echo "   ATTN_GPU_BWD=$bimpl: $(grep -c '^ok - ' "$OUT/test_bwd_$bimpl.log") ok, $(grep -c '^FAIL - ' "$OUT/test_bwd_$bimpl.log") FAIL, exit $r, $(( $(date +%s) - t0 )) s"
  done
  # the worst errors against each reference, per kernel
  for f in "$OUT"/test*.log; do
    awk -v f="$(basename "$f" .log)" '/^#   / {key=$2" vs "$4; if ($7+0 > worst[key]+0) worst[key]=$7}
      END {s=""; for (k in worst) s=s sprintf("  %s %s", k, worst[k]); printf "   worst rel L2 %-24s%s\n", f, s}' "$f"
  done
else
  passed="$IMPLS"
fi
if [ $do_bench = 1 ]; then
  echo "== bench: standalone binary, default kernel (cross-check of the library path)"
  timeout 30 "$BD/bench_attention" 16384 16 128 4096 | tee "$OUT/bench_binary.txt"
  for bimpl in $BWD_IMPLS; do  # backward kernels side by side (d = 128, then d = 64)
    for d in 128 64; do
      echo "   ATTN_GPU_BWD=$bimpl d=$d: $(ATTN_GPU_BWD=$bimpl timeout 60 "$BD/bench_attention" 16384 16 $d 1024 2048 4096 8192 |
        sed -n 's/.*T=\([0-9]*\).*bwd_tflops=\([0-9.]*\).*/T=\1 \2/p' | tr '\n' ' ')TFLOP/s bwd"
    done
  done | tee "$OUT/bench_bwd_impls.txt"
  echo "== bench: interleaved with PyTorch SDPA"
  status="passed test_attention_gpu"; [ $do_test = 1 ] && [ $rc != 0 ] && status="FAILED test_attention_gpu"
  [ $do_test = 0 ] && status="not tested in this run"
  PYTHONUNBUFFERED=1 timeout 150 python3 dev/bench/bench_attention.py --lib "$BD/libattn.so" --impls $passed \
    --default-status "$status" 2>&1 |
    tee "$OUT/bench.txt"
fi
exit $rc
