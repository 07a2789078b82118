#!/bin/sh
# Checks what the build needs and prints one line per missing piece, naming what to install.
# As root on Debian/Ubuntu (and unless SETUP=0) it installs the missing Debian packages itself.
# Called by the Makefile; exit status 0 when everything is there.
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
missing_pkgs=""
status=0

have_cjson() {
  if [ -n "$CJSON_PREFIX" ]; then [ -f "$CJSON_PREFIX/include/cjson/cJSON.h" ]; return; fi
  [ -f /usr/include/cjson/cJSON.h ] || [ -f /usr/local/include/cjson/cJSON.h ]
}

if ! command -v gcc >/dev/null 2>&1; then missing_pkgs="$missing_pkgs gcc"; fi
if ! command -v make >/dev/null 2>&1; then missing_pkgs="$missing_pkgs make"; fi
if ! have_cjson; then
  if [ -n "$CJSON_PREFIX" ]; then
    echo "missing: cJSON under CJSON_PREFIX=$CJSON_PREFIX (expected $CJSON_PREFIX/include/cjson/cJSON.h; bash scripts/fetch_cjson.sh $CJSON_PREFIX puts it there, run where Debian's packages are reachable)"
    status=1
  else
    missing_pkgs="$missing_pkgs libcjson-dev"
  fi
fi

if [ -n "$missing_pkgs" ]; then
  cjson_hint=""
  case "$missing_pkgs" in
    *libcjson-dev*) cjson_hint="; without a package mirror: bash scripts/fetch_cjson.sh elsewhere, carry .deps/cjson, make CJSON_PREFIX=.deps/cjson" ;;
  esac
  if [ "${SETUP:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing$missing_pkgs with apt-get"
    (apt-get install -y -q $missing_pkgs >/dev/null 2>&1 ||
     { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $missing_pkgs >/dev/null 2>&1; }) ||
      { echo "missing:$missing_pkgs (apt-get install failed; install them by hand$cjson_hint)"; status=1; }
  else
    echo "missing:$missing_pkgs (install with: sudo apt-get install$missing_pkgs$cjson_hint)"
    status=1
  fi
fi

if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
  echo "missing: the CUDA toolkit at CUDA_HOME=$CUDA_HOME (nvcc, cuBLASLt; install CUDA 12.4+ or set CUDA_HOME)"
  status=1
elif [ ! -e "$CUDA_HOME/include/nccl.h" ] && [ ! -e /usr/include/nccl.h ]; then
  echo "missing: NCCL (nccl.h; install libnccl-dev from NVIDIA's repository)"
  status=1
fi
exit $status
