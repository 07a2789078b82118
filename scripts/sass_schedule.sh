#!/bin/bash
# sass_schedule.sh: read a kernel's schedule on the CPU machine, without a GPU: compile one .cu
# to a cubin with the Makefile's device flags, disassemble it, and print for each kernel whose
# name contains PATTERN the order of its wgmmas, wgmma waits and fences, exponentials, barriers
# and mbarrier waits (runs of the same instruction counted), its local-memory instructions
# (spills) and its registers. What it is for: ptxas moves wgmma waits and issues (a wait hoisted
# above the exponentials, wgmmas gathered or serialized with WARPGROUP.ARRIVE, C7519); this shows
# where they ended up before a GPU call is spent on it (docs/fp8-attention-kernels.md §8.18).
#   usage: bash scripts/sass_schedule.sh SRC.cu PATTERN [nvcc flags, e.g. -DATTN_TIMELINE]
# The CUDA 13.0 toolkit here has no disassembler; the first run extracts nvdisasm 12.4 from
# Debian trixie's non-free nvidia-cuda-toolkit package (it decodes sm_90a cubins of CUDA 13) into
# .deps/nvdisasm, without installing it.
set -eu
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bash scripts/sass_schedule.sh SRC.cu PATTERN [nvcc flags]" >&2; exit 2; }
src=$1 pattern=$2
shift 2
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
