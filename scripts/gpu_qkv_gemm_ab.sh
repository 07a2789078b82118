#!/bin/bash
# gpu_qkv_gemm_ab.sh: on a GPU machine, the QKV projection GEMM (gpu/qkv_gemm.cu) of several
# versions timed against each other in one call, so that a change of ~1% is judged against its
# base minutes apart on the same GPU rather than across calls (whose GPUs differ by several %):
#   1. bench_qkv_gemm built in each version's directory (a snapshot from scripts/snapshot_refs.sh,
#      or . for the working tree; cJSON from .deps/cjson);
#   2. REPS passes (default 3); each pass runs every version's bench_qkv_gemm once per width
#      (C 2048, then 1536 and 3072 at T 4096, ROUNDS rounds each, default 3), versions alternating;
#   3. per width and GEMM row (cuBLASLt and each form), each version's TFLOP/s over the passes:
#      median and range, and the median of its ratio to cuBLASLt's in the same run.
# Logs in $OUT/<label>_<pass>_<C>.md.
#   usage: bash scripts/gpu_qkv_gemm_ab.sh .snap_main .   [REPS=3 ROUNDS=3 WIDTHS="2048 1536 3072"]
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/gpu_lib.sh  # gpu_start, elapsed, left
gpu_start /tmp/gpu_qkv_gemm_ab_out
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu_qkv_gemm_ab.sh DIR [DIR ...]   (a snapshot or .)" >&2; exit 2; }
labels=()
for d in "$@"; do
  n=$(basename "$(cd "$d" && pwd)"); n=${n#.}; [ "$d" = . ] && n=tree
  labels+=("$n")
  cj=""; [ -d "$d/.deps/cjson" ] && cj="CJSON_PREFIX=$(cd "$d" && pwd)/.deps/cjson"
  (cd "$d" && timeout 300 make -j16 SETUP=0 $cj build/bench/bench_qkv_gemm) >"$OUT/build_$n.log" 2>&1 ||
    { tail -20 "$OUT/build_$n.log"; echo "== build of $d FAILED"; exit 1; }
  rm -f "$OUT/build_$n.log"
  echo "built $n at $(elapsed) s"
done
R=${ROUNDS:-3}
for rep in $(seq 1 "${REPS:-3}"); do
  for w in ${WIDTHS:-2048 1536 3072}; do
    i=0
    for d in "$@"; do
      n=${labels[$i]}; i=$((i + 1))
      shape=$w; [ "$w" != 2048 ] && shape="$w 4096"
      timeout -k 5 "$(left 120)" "$d/build/bench/bench_qkv_gemm" "$R" $shape >"$OUT/${n}_${rep}_${w}.md" 2>&1 ||
        echo "   $n pass $rep C $w: exit $?"
    done
  done
  echo "pass $rep done at $(elapsed) s"
done
# the GEMM tables: row name -> TFLOP/s per version and pass
python3 - "$OUT" "${labels[@]}" <<'EOF'
import glob, os, re, statistics, sys
out, labels = sys.argv[1], sys.argv[2:]
rows = {}  # (C, row) -> label -> [(tflops, ratio to cuBLASLt)]
for path in glob.glob(os.path.join(out, '*_*_*.md')):
    lab, _, c = os.path.basename(path)[:-3].rsplit('_', 2)
    ref = None
    for line in open(path):
        f = [x.strip() for x in line.split('|')]
        if len(f) != 7 or not re.match(r'^[0-9.]+$', f[4]): continue
        if f[1].startswith('cuBLASLt'): ref = float(f[4])
        if ref: rows.setdefault((int(c), f[1]), {}).setdefault(lab, []).append((float(f[4]), float(f[4]) / ref))
for c in sorted({k[0] for k in rows}, key=lambda c: [2048, 1536, 3072].index(c) if c in (2048, 1536, 3072) else c):
    print(f'\n## C {c}: TFLOP/s, median [min-max] over the passes; x: median ratio to cuBLASLt in the same run')
    print('| GEMM | ' + ' | '.join(labels) + ' |\n|---|' + '---|' * len(labels))
    for (cc, name), by in rows.items():
        if cc != c: continue
        cells = []
        for lab in labels:
            v = by.get(lab)
            if not v: cells.append('-'); continue
            t = [x[0] for x in v]
            cells.append(f'{statistics.median(t):.0f} [{min(t):.0f}-{max(t):.0f}] x{statistics.median(x[1] for x in v):.3f}')
        print(f'| {name} | ' + ' | '.join(cells) + ' |')
EOF
echo "== done at $(elapsed) s"
