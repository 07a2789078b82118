#!/bin/bash
# ab_refs.sh: A/B measurements of several versions of the code in one GPU call, so that a change of
# a few % is judged against its base measured minutes apart on the same GPU rather than across calls
# (whose GPUs differ by several %).
#
#   bash dev/ab_refs.sh snapshot REF [REF ...]
#       here: each git ref (branch, tag, commit) exported as a plain tree into .snap_<ref>/ (ignored
#       by git; existing snapshots of the same names replaced, nothing else touched), with .deps/cjson
#       copied in when there is one. Carry the snapshots to the GPU machine by name.
#   bash dev/ab_refs.sh run AREA DIR [DIR ...]
#       on the GPU machine: `bash scripts/gpu.sh bench AREA` of each version in turn (DIR: a snapshot,
#       or . for the working tree; a DIR named again runs again, A/B/A, and the spread of its runs is
#       the GPU's drift within the call; its build is reused), each with an equal share of what is left
#       of BUDGET; then every table's numbers side by side with their ratios to the first version
#       (dev/compare_tables.py), printed last. Each version's logs in $OUT/<label>/.
# Variables: OUT (default /tmp/ab_out), BUDGET (seconds for the whole run, default 570).
set -u
cd "$(dirname "$0")/.." || exit 1
usage() { sed -n '2,/^set -u/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1
shift

if [ "$cmd" = snapshot ]; then
  for ref in "$@"; do
    git rev-parse --verify --quiet "$ref^{commit}" >/dev/null ||
      { echo "ab_refs.sh: $ref: not a branch, tag or commit of this repository" >&2; exit 1; }
  done
  [ -d .deps/cjson ] || echo "ab_refs.sh: note: no .deps/cjson here (bash scripts/fetch_cjson.sh makes it)" >&2
  for ref in "$@"; do
    dir=".snap_$(printf '%s' "$ref" | tr -c 'A-Za-z0-9._-' '-')"
    rm -rf "$dir" && mkdir "$dir" || exit 1
    git archive "$ref" | tar xf - -C "$dir" || { echo "ab_refs.sh: git archive $ref failed" >&2; exit 1; }
    [ -d .deps/cjson ] && mkdir -p "$dir/.deps" && cp -r .deps/cjson "$dir/.deps/"
    [ -f "$dir/scripts/gpu.sh" ] || echo "ab_refs.sh: note: $ref has no scripts/gpu.sh: \`run\` cannot measure it" >&2
    echo "$dir  $(git rev-parse --short "$ref")  $(du -sh "$dir" | cut -f1)"
  done
  exit 0
fi
[ "$cmd" = run ] || usage
[ $# -ge 2 ] || usage
area=$1
shift
OUT=${OUT:-/tmp/ab_out}
BUDGET=${BUDGET:-570}
case $BUDGET in '' | *[!0-9]*) echo "ab_refs.sh: BUDGET must be a whole number of seconds" >&2; exit 2 ;; esac
for d in "$@"; do
  [ -f "$d/scripts/gpu.sh" ] || { echo "ab_refs.sh: $d has no scripts/gpu.sh (not a snapshot of this repository, or one older than it)" >&2; exit 1; }
done
mkdir -p "$OUT" || exit 1
t_start=$(date +%s)
labels=() args=() status=0 i=0
for d in "$@"; do
  n=$(basename "$(cd "$d" && pwd)")
  n=${n#.snap_}
  [ "$d" = . ] && n=tree
  label=$n k=1
  while printf '%s\n' "${labels[@]}" | grep -qx -- "$label"; do k=$((k + 1)); label=${n}_$k; done  # run again: <name>_2
  labels+=("$label")
  left=$(( BUDGET - ($(date +%s) - t_start) - 10 ))
  share=$(( left / ($# - i) ))
  i=$((i + 1))
  echo "== $label ($d): bench $area, BUDGET $share s"
  OUT="$OUT/$label" BUDGET=$share bash "$d/scripts/gpu.sh" bench "$area" >"$OUT/$label.console" 2>&1 || status=1
  grep -E '^(bench: |   FAIL)' "$OUT/$label.console" | sed 's/^/   /'
  rm -f "$OUT/$label.console"  # gpu.sh wrote the same into $OUT/<label>/
  args+=("$label=$OUT/$label/summary.txt")
done
python3 dev/compare_tables.py "${args[@]}" | tee "$OUT/compare.txt"
exit $status
