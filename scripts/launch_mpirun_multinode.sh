#!/bin/bash
# launch_mpirun_multinode.sh: train on several nodes, one process per GPU, started by mpirun -H.
#
#   usage: HOSTS=node1,node2 GPUS_PER_NODE=8 scripts/launch_mpirun_multinode.sh CONFIG [options...]
#
# Requirements: train_gpt built with MPI at the same path on every node (a shared file system,
# which also holds the data and the run directory), passwordless ssh from this node to the
# others, and the same OpenMPI everywhere. Rank 0 runs on the first host.
# All ranks train one model (data parallel, NCCL all-reduce of the gradients); rank 0 alone
# writes the run directory (log.dir must be on the shared file system for --resume).
#
# NCCL variables that matter across nodes (set them before calling; each is passed when set):
#   NCCL_SOCKET_IFNAME  the interface NCCL bootstraps over and uses for TCP traffic, e.g. eth0 or
#                       ib0; "^lo,docker" excludes. Wrong or unset on hosts with many interfaces
#                       is the most common cause of a hang at init.
#   NCCL_IB_HCA         the InfiniBand/RoCE adapters to use, e.g. mlx5_0,mlx5_1 ("=mlx5_0:1"
#                       for an exact device:port).
#   NCCL_IB_DISABLE     1 forces TCP sockets (no InfiniBand): slow, but a useful bisection step.
#   NCCL_IB_GID_INDEX   RoCE only: the GID index of the RoCE v2 address (often 3).
#   NCCL_NET_GDR_LEVEL  how far apart GPU and NIC may be for GPUDirect RDMA (e.g. PHB).
#   NCCL_DEBUG          INFO prints the topology and transports picked; WARN (default) errors only.
#   NCCL_NVLS_ENABLE    0 unless you set it (NVLink multicast off; required on shared machines).
#   TRAIN_GPT_COMM_TIMEOUT_S  seconds a rank waits for the others before failing (default 60).
# MPI's own traffic (only the start-up and the id broadcast) follows MPI_IFACE, e.g. eth0.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:?usage: HOSTS=h1,h2 GPUS_PER_NODE=8 $0 CONFIG [train_gpt options...]}
shift
HOSTS=${HOSTS:?set HOSTS=host1,host2,...}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}

IFS=, read -r -a hosts <<< "$HOSTS"
hostspec=""
for h in "${hosts[@]}"; do hostspec+="${hostspec:+,}$h:$GPUS_PER_NODE"; done
np=$(( ${#hosts[@]} * GPUS_PER_NODE ))

export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
pass=()
for v in NCCL_NVLS_ENABLE NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_IB_DISABLE \
         NCCL_IB_GID_INDEX NCCL_NET_GDR_LEVEL OMP_NUM_THREADS TRAIN_GPT_COMM_TIMEOUT_S LD_LIBRARY_PATH PATH; do
  [ -n "${!v+x}" ] && pass+=(-x "$v")
done
mca=()
if [ -n "${MPI_IFACE:-}" ]; then
  mca=(--mca btl_tcp_if_include "$MPI_IFACE" --mca oob_tcp_if_include "$MPI_IFACE")
fi
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)

# --map-by ppr:N:node puts N ranks on each host in host order, so ranks 0..N-1 share the first
# node; --bind-to none leaves each rank's OpenMP threads free to use the node's cores.
set -x
exec mpirun -np "$np" -H "$hostspec" --map-by "ppr:$GPUS_PER_NODE:node" --bind-to none \
  "${root[@]}" "${mca[@]}" "${pass[@]}" \
  ./train_gpt --config "$CONFIG" "$@"
