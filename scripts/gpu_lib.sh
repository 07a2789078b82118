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
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null || NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
