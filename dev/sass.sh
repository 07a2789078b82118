#!/bin/bash
# sass.sh: read the GPU kernels' SASS on the CPU machine, without a GPU (nvdisasm).
#
#   bash dev/sass.sh schedule SRC.cu PATTERN [nvcc flags]
#       for each kernel of SRC whose name contains PATTERN: the order of its wgmmas, wgmma waits
#       and fences, exponentials, barriers and mbarrier waits (runs counted), its local-memory
#       instructions (spills) and registers. ptxas moves wgmma waits and issues (a wait hoisted
#       above the exponentials, wgmmas serialized with WARPGROUP.ARRIVE, C7519); this shows where
#       they ended up before a GPU call is spent on it.
#   bash dev/sass.sh dump DIR [SRC.cu ...]
#       every kernel of the library's .cu files (or of the ones named) into DIR/<mangled name>.sass,
#       addresses stripped: two dumps diff to the kernels whose code changed.
#   bash dev/sass.sh diff DIR_BEFORE DIR_AFTER
#       the kernels added, removed, renamed (the same code under a new name: template parameters
#       dropped), relabelled (the same code, branch labels numbered otherwise) and changed.
# The CUDA 13.0 toolkit here has no disassembler; the first run extracts nvdisasm 12.4 from
# Debian trixie's non-free nvidia-cuda-toolkit package (it decodes sm_90a cubins of CUDA 13) into
# .deps/nvdisasm, without installing it.
set -eu
cd "$(dirname "$0")/.."
usage() { sed -n '3,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
cmd=$1; shift
if [ "$cmd" = diff ]; then
  [ $# -eq 2 ] || usage
  a=$1 b=$2 changed=0
  # nvdisasm numbers branch labels per file, so a kernel's labels move when its file gains or loses
  # kernels: code equal up to those numbers is the same code ("relabelled"). A kernel whose template
  # parameters changed has a new name: the same code under another name is "renamed".
  norm() {
    sed -E "s/$(basename "$1" .sass)//g; s/\.L_x_[0-9]+/.L/g; s/\\\$__internal_[0-9]+_/\$__internal_/g" "$1" |
      md5sum | cut -d' ' -f1
  }
  declare -A gone
  for f in "$a"/*.sass; do
    n=$(basename "$f")
    if [ ! -f "$b/$n" ]; then gone[$(norm "$f")]+="${n%.sass} "
    elif cmp -s "$f" "$b/$n"; then :
    elif [ "$(norm "$f")" = "$(norm "$b/$n")" ]; then echo "relabelled: ${n%.sass} (same code)"
    else echo "changed: ${n%.sass}"; changed=1; fi
  done
  for f in "$b"/*.sass; do
    n=$(basename "$f")
    [ -f "$a/$n" ] && continue
    h=$(norm "$f")
    if [ -n "${gone[$h]:-}" ]; then
      old=${gone[$h]%% *}
      echo "renamed: $old -> ${n%.sass} (same code)"
      gone[$h]=${gone[$h]#* }
      [ -n "${gone[$h]}" ] || unset "gone[$h]"
    else echo "added:   ${n%.sass}"; fi
  done
  for h in "${!gone[@]}"; do for n in ${gone[$h]}; do echo "removed: $n"; done; done | sort
  if [ $changed = 0 ]; then echo "no kernel present in both dumps changed"; fi
  exit 0
fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVDISASM=$(command -v nvdisasm || true)
[ -n "$NVDISASM" ] || [ ! -x "$CUDA_HOME/bin/nvdisasm" ] || NVDISASM=$CUDA_HOME/bin/nvdisasm
if [ -z "$NVDISASM" ]; then
  NVDISASM=.deps/nvdisasm/usr/bin/nvdisasm
  if [ ! -x "$NVDISASM" ]; then
    echo "== fetching nvdisasm (Debian trixie non-free nvidia-cuda-toolkit, extracted into .deps/nvdisasm)" >&2
    tmp=$(mktemp -d)
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > "$tmp/nf.sources"
    apt_opts=(-o Dir::Etc::sourcelist="$tmp/nf.sources" -o Dir::Etc::sourceparts=- -o Dir::State::lists="$tmp/lists"
              -o Dir::Cache="$tmp/cache" -o Debug::NoLocking=1)
    mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
    apt-get "${apt_opts[@]}" update > "$tmp/update.log" 2>&1 || { tail -3 "$tmp/update.log" >&2; exit 1; }
    (cd "$tmp" && apt-get "${apt_opts[@]}" download nvidia-cuda-toolkit > download.log 2>&1) ||
      { tail -3 "$tmp/download.log" >&2; exit 1; }
    mkdir -p .deps/nvdisasm
    dpkg-deb -x "$tmp"/nvidia-cuda-toolkit_*.deb "$tmp/x"
    mkdir -p .deps/nvdisasm/usr/bin
    cp "$tmp/x/usr/bin/nvdisasm" .deps/nvdisasm/usr/bin/
    rm -rf "$tmp"
  fi
fi
NVFLAGS="-std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -Xcompiler -fopenmp"
if [ "$cmd" = dump ]; then
  [ $# -ge 1 ] || usage
  dir=$1; shift
  srcs=("$@")
  [ ${#srcs[@]} -gt 0 ] || srcs=(attention_fp8.cu $(ls core/*.cu cpu/*.cu gpu/*.cu attention/*.cu eval/*.cu 2>/dev/null || true))
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for src in "${srcs[@]}"; do
    b=$(echo "$src" | tr / _)
    "$CUDA_HOME/bin/nvcc" $NVFLAGS -cubin -o "$tmp/$b.cubin" "$src" 2> "$tmp/$b.err" || { cat "$tmp/$b.err" >&2; exit 1; }
    "$NVDISASM" -c "$tmp/$b.cubin" > "$tmp/$b.sass" 2>/dev/null
    n=0
    for fn in $(grep -o '^\.text\.[A-Za-z0-9_]*:' "$tmp/$b.sass" | sed 's/^\.text\.//; s/:$//' | sort -u); do
      awk -v f=".text.$fn:" '$1 == f {on=1; next} on && (/^\/\/---/ || /^[[:space:]]*\.section/) {on=0} on' \
        "$tmp/$b.sass" | grep -v '^[[:space:]]*$' | sed 's@/\*[0-9a-f]*\*/@@' > "$tmp/fn"
      # a kernel of a header may be compiled in several files: the same code, or a note
      if [ -f "$dir/$fn.sass" ] && ! cmp -s "$tmp/fn" "$dir/$fn.sass"; then echo "note: $fn differs in $src" >&2; fi
      cp "$tmp/fn" "$dir/$fn.sass"
      n=$((n + 1))
    done
    echo "$src: $n kernels"
  done
  exit 0
fi
[ "$cmd" = schedule ] || usage
[ $# -ge 2 ] || usage
src=$1 pattern=$2
shift 2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$CUDA_HOME/bin/nvcc" -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -Xptxas -v -cubin "$@" \
  -o "$out/k.cubin" "$src" > "$out/ptxas.txt" 2>&1 || { tail -20 "$out/ptxas.txt"; exit 1; }
"$NVDISASM" -c "$out/k.cubin" > "$out/k.sass" 2>/dev/null
found=0
for fn in $(grep -o '\.text\.[A-Za-z0-9_]*' "$out/k.sass" | sed 's/^\.text\.//' | sort -u); do
  case "$fn" in *"$pattern"*) ;; *) continue ;; esac
  found=1
  awk -v f=".text.$fn" '$0 ~ "^[[:space:]]*//-+ " f " -+" {on=1; next} on && /^[[:space:]]*\/\/-+ \.text\./ {on=0} on' \
    "$out/k.sass" > "$out/fn.sass"
  echo "== $fn"
  grep -A4 "Compiling entry function '$fn'" "$out/ptxas.txt" | grep -E "registers|spill" | sed 's/^ptxas info *: */   /'
  echo "   local memory instructions: $(grep -cE '\b(LDL|STL)\b' "$out/fn.sass" || true)"
  grep -c "C7519.*$fn" "$out/ptxas.txt" | sed 's/^/   warpgroup.arrive injected by ptxas (C7519): /'
  grep -oE '\b(QGMMA|HGMMA)\.[^ ]*|WARPGROUP\.[A-Z]+|MUFU\.EX2|BAR\.SYNC[^ ]*|BAR\.ARV|SYNCS\.PHASECHK[^ ]*' "$out/fn.sass" |
    sed -E 's/^(QGMMA|HGMMA)\..*/\1/' | uniq -c | awk '{printf "%s %s x%d", (NR > 1 ? " |" : "  "), $2, $1} END {print ""}' |
    fold -w 120 -s
done
[ $found = 1 ] || { echo "no kernel in $src matches '$pattern'" >&2; exit 1; }
