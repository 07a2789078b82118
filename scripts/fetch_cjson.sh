#!/bin/bash
# fetch_cjson.sh: cJSON's headers and shared library under DEST (default .deps/cjson), taken from
# Debian's packages without installing them, for a machine that has no libcjson-dev and cannot
# reach a package mirror (GPU machines often): run it where Debian's packages are reachable, carry
# DEST along, and build there with `make CJSON_PREFIX=DEST` (the binaries find the library by
# rpath). Needs apt-get and dpkg-deb; the packages are those of this machine's architecture unless
# ARCH names another (the GPU machine's, e.g. ARCH=amd64).
#   usage: bash scripts/fetch_cjson.sh [DEST]      (DEST: default the repository's .deps/cjson)
#   result: DEST/include/cjson/cJSON.h, DEST/lib/libcjson.so -> libcjson.so.1 -> libcjson.so.1.x.y
set -u
DEST=${1:-$(cd "$(dirname "$0")/.." && pwd)/.deps/cjson}
[ $# -le 1 ] || { echo "usage: bash scripts/fetch_cjson.sh [DEST]" >&2; exit 2; }
if [ -f "$DEST/include/cjson/cJSON.h" ] && [ -e "$DEST/lib/libcjson.so" ]; then
  echo "fetch_cjson.sh: cJSON is already in $DEST (remove it to fetch again)"
  exit 0
fi
if [ -e "$DEST" ] && [ -n "$(ls -A "$DEST" 2>/dev/null)" ]; then
  echo "fetch_cjson.sh: $DEST exists and is not an earlier result of this script; not touching it" >&2
  exit 1
fi
for tool in apt-get dpkg-deb; do
  command -v $tool >/dev/null || { echo "fetch_cjson.sh: needs $tool (a Debian or Ubuntu machine)" >&2; exit 1; }
done
arch=${ARCH:-$(dpkg --print-architecture)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# apt-get download writes into the current directory; as root it warns that it cannot drop to
# the _apt user for a private directory, which is harmless
if ! (cd "$tmp" && apt-get download "libcjson1:$arch" "libcjson-dev:$arch") >"$tmp/download.log" 2>&1; then
  echo "fetch_cjson.sh: apt-get download libcjson1 libcjson-dev ($arch) failed:" >&2
  tail -5 "$tmp/download.log" >&2
  echo "(no package mirror reachable? run \`apt-get update\` first, or run this where Debian's packages are)" >&2
  exit 1
fi
for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/x" || exit 1; done
libdir=$(dirname "$(find "$tmp/x" -name 'libcjson.so.1*' -type f | head -1)")
if [ ! -f "$tmp/x/usr/include/cjson/cJSON.h" ] || [ "$libdir" = . ]; then
  echo "fetch_cjson.sh: the packages hold no cjson/cJSON.h or libcjson.so.1 (their contents changed?)" >&2
  exit 1
fi
mkdir -p "$DEST/include/cjson" "$DEST/lib" || exit 1
cp "$tmp/x/usr/include/cjson/cJSON.h" "$DEST/include/cjson/"
cp -P "$libdir"/libcjson.so* "$DEST/lib/"  # the library and its two links
[ -e "$DEST/lib/libcjson.so" ] || ln -s libcjson.so.1 "$DEST/lib/libcjson.so"
echo "cJSON ($(basename "$(ls "$tmp"/libcjson1_*.deb)" .deb)) in $DEST: build with make CJSON_PREFIX=$DEST"
