#!/bin/bash
# launch_mpirun_node.sh: train on one node with N GPUs, one process per GPU, started by mpirun.
#
#   usage: scripts/launch_mpirun_node.sh NGPUS CONFIG [train_gpt options...]
#   e.g.   scripts/launch_mpirun_node.sh 8 configs/small_125m.json --set train.steps=2000
#
# Needs train_gpt built with MPI (`make` does this when mpicc is on the PATH; `make MPI=0` does
# not). Each rank learns its rank from MPI, its GPU from its rank on the node, and gets the NCCL
# id through MPI_Bcast. Without MPI, use torchrun-style variables instead (docs/multi-gpu.md).
# The N ranks train one model (data parallel: each reads its own share of the data, gradients
# are all-reduced with NCCL); rank 0 alone prints and writes the run directory. The global batch
# is train.batch_tokens = micro_batch x seq_len x accumulation x N. Options after CONFIG go to
# every rank unchanged (they must be the same everywhere: ranks with different configs are
# refused), e.g. --resume or --zero1 (AdamW state and FP32 masters sharded across the ranks).
#
# Variables passed to every rank when set (see docs/multi-gpu.md):
#   NCCL_NVLS_ENABLE          0 unless you set it: NVLink multicast stays off (required on shared
#                             machines, where it can take the host's GPUs out of service)
#   NCCL_DEBUG                WARN (default here) or INFO to see the transports NCCL picked
#   TRAIN_GPT_COMM_TIMEOUT_S  seconds a rank waits for the others before failing (default 60)
#   OMP_NUM_THREADS           host threads per rank (default: cores / NGPUS)
#   CUDA_VISIBLE_DEVICES      restrict the GPUs (rank i uses the i-th visible GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
NGPUS=${1:?usage: $0 NGPUS CONFIG [train_gpt options...]}
CONFIG=${2:?usage: $0 NGPUS CONFIG [train_gpt options...]}
shift 2

export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / NGPUS > 0 ? $(nproc) / NGPUS : 1 ))}

# Export only the variables that are set (-x of an unset variable is an error in some versions).
pass=()
for v in NCCL_NVLS_ENABLE NCCL_DEBUG NCCL_DEBUG_SUBSYS OMP_NUM_THREADS TRAIN_GPT_COMM_TIMEOUT_S \
         CUDA_VISIBLE_DEVICES LD_LIBRARY_PATH; do
  [ -n "${!v+x}" ] && pass+=(-x "$v")
done
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)  # OpenMPI refuses root without it

# --bind-to none: OpenMPI would otherwise pin each rank to one core, starving its OpenMP threads.
set -x
exec mpirun -np "$NGPUS" --bind-to none "${root[@]}" "${pass[@]}" \
  ./train_gpt --config "$CONFIG" "$@"
