#!/bin/bash
# launch_mpirun_multinode.sh: train on several nodes, one process per GPU, started by mpirun.
#
#   usage: HOSTFILE=hosts.txt scripts/launch_mpirun_multinode.sh CONFIG [train_gpt options...]
#          HOSTS=node1,node2 GPUS_PER_NODE=8 scripts/launch_mpirun_multinode.sh CONFIG [options...]
#
# HOSTFILE is OpenMPI's hostfile: one node per line, its name and the processes (GPUs) to start
# there; `#` starts a comment, blank lines are skipped:
#     node1 slots=8
#     node2 slots=8
# Every line needs slots=N, and each node appears once (OpenMPI would merge repeated names into
# one node). HOSTS is the same as a comma-separated list, GPUS_PER_NODE (default 8) on each; give
# one of the two. Ranks fill the nodes in the order given: ranks 0..N-1 on the first node (which
# runs rank 0), and so on. Each rank uses GPU local_rank of its node.
#
# Requirements: train_gpt built with MPI at the same path on every node (a shared file system,
# which also holds the data and the run directory), passwordless ssh from this node to the
# others, and the same OpenMPI everywhere. All ranks train one model (data parallel, NCCL
# all-reduce of the gradients; with --device cpu, the host transport over TCP); rank 0 alone
# writes the run directory (log.dir must be on the shared file system for --resume).
#
# Variables passed to every rank when set (docs/multi-gpu.md, "Two nodes"):
#   NCCL_*              every NCCL variable that is set, among them:
#     NCCL_SOCKET_IFNAME  the interface NCCL bootstraps over and uses for TCP traffic, e.g. eth0 or
#                         ib0; "^lo,docker" excludes. Wrong or unset on hosts with many interfaces
#                         is the most common cause of a hang at init.
#     NCCL_IB_HCA         the InfiniBand/RoCE adapters to use, e.g. mlx5_0,mlx5_1 ("=mlx5_0:1"
#                         for an exact device:port).
#     NCCL_IB_DISABLE     1 forces TCP sockets (no InfiniBand): slow, but a useful bisection step.
#     NCCL_IB_GID_INDEX   RoCE only: the GID index of the RoCE v2 address (often 3).
#     NCCL_NET_GDR_LEVEL  how far apart GPU and NIC may be for GPUDirect RDMA (e.g. PHB).
#     NCCL_DEBUG          INFO prints the topology and transports picked; WARN (default) errors only.
#     NCCL_NVLS_ENABLE    0 unless you set it (NVLink multicast off; required on shared machines).
#   TRAIN_GPT_COMM_TIMEOUT_S  seconds a rank waits for the others before failing (overrides
#                       train.comm_timeout_s, default 60).
#   MASTER_ADDR, MASTER_PORT  CPU backend only: where rank 0 listens for the others (default: its
#                       host name and a free port, announced through MPI).
#   OMP_NUM_THREADS, TRAIN_GPT_JOB_ID, LD_LIBRARY_PATH, PATH.
# MPI's own traffic (the start-up and one broadcast) follows MPI_IFACE, e.g. eth0. Other mpirun
# settings go through OpenMPI's variables, e.g. OMPI_MCA_plm_rsh_agent for another remote shell.
# DRY_RUN=1 prints the mpirun command instead of running it.
#
# Stopping: SIGTERM to any one train_gpt process (e.g. rank 0's, on the first node) stops every
# rank after the same step with one checkpoint; all exit 0, and so does mpirun. SIGTERM to mpirun
# reaches every rank too, but OpenMPI sends SIGKILL one second later (odls_base_sigkill_timeout;
# raised to 10 s it left rank 0 unresponsive until the SIGKILL), enough for small checkpoints only. A rank that dies ends the job: mpirun kills the others (~3 s).
set -euo pipefail
usage="usage: HOSTFILE=FILE $0 CONFIG [train_gpt options...]  or  HOSTS=h1,h2 GPUS_PER_NODE=8 $0 CONFIG [...]"
die() { echo "launch_mpirun_multinode.sh: $*" >&2; exit 2; }
[ $# -ge 1 ] && [ -n "$1" ] || die "$usage"
CONFIG=$1
shift
# Paths given relative to the caller's directory still work after the cd below.
[ -f "$CONFIG" ] && CONFIG=$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")
[ -n "${HOSTFILE:-}" ] && [ -f "$HOSTFILE" ] && HOSTFILE=$(cd "$(dirname "$HOSTFILE")" && pwd)/$(basename "$HOSTFILE")
cd "$(dirname "$0")/.."
[ -f "$CONFIG" ] || die "config '$CONFIG' not found (give a path to a JSON config, e.g. configs/paper_569m.json)"

positive() { case $1 in '' | *[!0-9]* | 0*) return 1 ;; esac; }  # a whole number >= 1
hosts=() slots=()
if [ -n "${HOSTFILE:-}" ] && [ -n "${HOSTS:-}" ]; then
  die "set HOSTFILE or HOSTS, not both (HOSTFILE=$HOSTFILE, HOSTS=$HOSTS)"
elif [ -n "${HOSTFILE:-}" ]; then
  [ -z "${GPUS_PER_NODE:-}" ] ||
    die "GPUS_PER_NODE goes with HOSTS; with HOSTFILE each line gives its node's count (e.g. 'node1 slots=8')"
  [ -f "$HOSTFILE" ] && [ -r "$HOSTFILE" ] || die "HOSTFILE '$HOSTFILE' is not a readable file"
  n=0
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line=${line%%#*}
    read -r -a words <<<"$line" || true
    [ ${#words[@]} -eq 0 ] && continue
    host=${words[0]} count=""
    case $host in *=*) die "HOSTFILE $HOSTFILE line $n: '$host' is not a node name: expected 'NAME slots=N'" ;; esac
    for w in "${words[@]:1}"; do
      case $w in
        slots=*) count=${w#slots=} ;;
        *) die "HOSTFILE $HOSTFILE line $n: '$w' is not understood: expected 'NAME slots=N' (N: the GPUs to use on NAME)" ;;
      esac
    done
    [ -n "$count" ] || die "HOSTFILE $HOSTFILE line $n: '$host' has no slots=N: write the GPUs to use there, e.g. '$host slots=8'"
    positive "$count" || die "HOSTFILE $HOSTFILE line $n: slots=$count is not a whole number >= 1"
    for i in "${!hosts[@]}"; do
      [ "${hosts[$i]}" != "$host" ] ||
        die "HOSTFILE $HOSTFILE line $n: node '$host' is listed again (OpenMPI merges repeated names into one node): list each node once with all its slots"
    done
    hosts+=("$host") slots+=("$count")
  done <"$HOSTFILE"
  [ ${#hosts[@]} -gt 0 ] || die "HOSTFILE $HOSTFILE lists no node: expected lines 'NAME slots=N'"
elif [ -n "${HOSTS:-}" ]; then
  GPUS_PER_NODE=${GPUS_PER_NODE:-8}
  positive "$GPUS_PER_NODE" || die "GPUS_PER_NODE='$GPUS_PER_NODE' is not a whole number >= 1"
  IFS=, read -r -a words <<<"$HOSTS"
  for host in "${words[@]}"; do
    case $host in
      '' | *[[:space:]]* | *:* | *=*)
        die "HOSTS='$HOSTS': '$host' is not a node name (expected HOSTS=node1,node2,...; per-node counts go in a HOSTFILE)" ;;
    esac
    for h in "${hosts[@]}"; do [ "$h" != "$host" ] || die "HOSTS='$HOSTS': node '$host' is listed twice"; done
    hosts+=("$host") slots+=("$GPUS_PER_NODE")
  done
  case $HOSTS in *,) die "HOSTS='$HOSTS' ends with a comma" ;; esac
else
  die "set HOSTFILE (OpenMPI's hostfile: lines 'NAME slots=N') or HOSTS=node1,node2 with GPUS_PER_NODE; $usage"
fi
np=0 hostspec=""
for i in "${!hosts[@]}"; do
  np=$((np + slots[i]))
  hostspec+="${hostspec:+,}${hosts[$i]}:${slots[$i]}"
done

export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
pass=()  # -x of an unset variable is an error in some versions: only those that are set
for v in $(compgen -e | grep '^NCCL_') TRAIN_GPT_COMM_TIMEOUT_S TRAIN_GPT_JOB_ID MASTER_ADDR MASTER_PORT \
         OMP_NUM_THREADS LD_LIBRARY_PATH PATH; do
  [ -n "${!v+x}" ] && pass+=(-x "$v")
done
mca=()
if [ -n "${MPI_IFACE:-}" ]; then
  mca=(--mca btl_tcp_if_include "$MPI_IFACE" --mca oob_tcp_if_include "$MPI_IFACE")
fi
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)  # OpenMPI refuses root without it
where=(-H "$hostspec")
[ -n "${HOSTFILE:-}" ] && where=(--hostfile "$HOSTFILE")

# --map-by slot fills each node's slots in the order given, so rank 0 and its neighbours share
# the first node; --bind-to none leaves each rank's OpenMP threads free to use the node's cores.
cmd=(mpirun -np "$np" "${where[@]}" --map-by slot --bind-to none "${root[@]}" "${mca[@]}" "${pass[@]}"
  ./train_gpt --config "$CONFIG" "$@")
if [ "${DRY_RUN:-0}" = 1 ]; then
  echo "$np ranks on ${#hosts[@]} node(s): $hostspec"
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
command -v mpirun >/dev/null || die "mpirun not found: install OpenMPI (Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev) and rebuild train_gpt"
[ -x ./train_gpt ] || die "./train_gpt is not built: run make (with mpicc on the PATH, so that it has MPI)"
libs=$(ldd ./train_gpt 2>/dev/null || true)  # (grep -q on the pipe would kill ldd under pipefail)
if command -v ldd >/dev/null && [[ $libs != *libmpi* ]]; then
  die "./train_gpt was built without MPI: rebuild with MPI (make clean && make, with mpicc on the PATH)"
fi
echo "launch_mpirun_multinode.sh: $np ranks on ${#hosts[@]} node(s): $hostspec" >&2
set -x
exec "${cmd[@]}"
