#!/bin/bash
# gpu_fp8_quant_sweep.sh: on a GPU machine, bench_fp8_quant under several compile-time settings of
# the FP8 quantization kernels (the -D knobs at the top of gpu/layers_fp8.cu and
# vec128both_kernel's in gpu/linear_fp8_gpu.cu: NORM_TILE_BATCH, SWIGLU_BATCH, SWIGLU_BWD_BATCH,
# LAYERS_FP8_MIN_CTAS, VEC128_BATCH, VEC128_MIN_CTAS, and the per-tensor instances' own
# NORM_TILE_TENSOR_BATCH, SWIGLU_TENSOR_BATCH, SWIGLU_BWD_PAIR_BATCH, ROPE_BWD_BATCH,
# LAYERS_FP8_TENSOR_MIN_CTAS), one library build. Each setting compiles
# the two files with its -D flags (in parallel), links bench_fp8_quant with those objects ahead of
# the library, and runs it; a table of each kernel's ms per setting is printed last.
#   usage (carry .deps): bash scripts/gpu_fp8_quant_sweep.sh "" "SWIGLU_BATCH=4" "LAYERS_FP8_MIN_CTAS=2 ..."
#   ("" = the defaults; ROUNDS=2 runs each setting's benchmark twice, interleaved). A setting may
#   name SRC=<snapshot dir> (scripts/snapshot_refs.sh; carry it too): the two files come from
#   that tree, with its headers, so an older version is timed beside this one in the same call.
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, CJ, NVCC, elapsed
gpu_start /tmp/gpu_fp8_quant_sweep
[ $# -gt 0 ] || set -- ""
timeout 300 make -j16 SETUP=0 $CJ build/libtraingpt.a build/bench/bench_fp8_quant >"$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log"; echo "== build FAILED"; exit 1; }
NVFLAGS=$(make -s -f Makefile print-nvflags SETUP=0 $CJ 2>/dev/null)
[ -n "$NVFLAGS" ] || NVFLAGS="-O3 -lineinfo -std=c++17 -gencode arch=compute_90a,code=sm_90a -I."
LDLIBS=$(make -s -f Makefile print-ldlibs SETUP=0 $CJ 2>/dev/null)
i=0
for setting in "$@"; do
  d="$OUT/v$i"; mkdir -p "$d"; defs=""; src=src
  for kv in $setting; do
    case "$kv" in SRC=*) src="${kv#SRC=}/src" ;; *) defs="$defs -D$kv" ;; esac
  done
  ( $NVCC $NVFLAGS $defs -c "$gpu/layers_fp8.cu" -o "$d/layers_fp8.o" &&
    $NVCC $NVFLAGS $defs -c "$gpu/linear_fp8_gpu.cu" -o "$d/linear_fp8_gpu.o" &&
    $NVCC $NVFLAGS -c dev/bench/bench_fp8_quant.cu -o "$d/bench.o" &&
    ${CC:-cc} "$d/bench.o" "$d/layers_fp8.o" "$d/linear_fp8_gpu.o" build/libtraingpt.a $LDLIBS -lstdc++ -o "$d/bench" ) \
    >"$d/build.log" 2>&1 &
  i=$((i + 1))
done
wait
echo "variants built at $(elapsed) s"
for r in $(seq 1 "${ROUNDS:-1}"); do
  i=0
  for setting in "$@"; do
    d="$OUT/v$i"
    if [ -x "$d/bench" ]; then "$d/bench" >"$d/bench_$r.md" 2>&1; else tail -5 "$d/build.log"; fi
    i=$((i + 1))
  done
done
python3 - "$OUT" "$@" <<'PY'
import glob, os, re, sys
out, settings = sys.argv[1], sys.argv[2:]
rows, names = {}, []
for i, s in enumerate(settings):
    for f in sorted(glob.glob(os.path.join(out, "v%d" % i, "bench_*.md"))):
        for line in open(f):
            m = re.match(r"\|\s*(.+?)\s*\|\s*([0-9.]+)\s*\|", line)
            if not m: continue
            k = m.group(1)
            if k not in names: names.append(k)
            rows.setdefault(k, {}).setdefault(i, []).append(float(m.group(2)))
print("| kernel (ms, best of rounds) | " + " | ".join(s or "defaults" for s in settings) + " |")
print("|---|" + "---|" * len(settings))
for k in names:
    print("| %s | " % k + " | ".join("%.4f" % min(rows[k][i]) if i in rows[k] else "n/a" for i in range(len(settings))) + " |")
PY
