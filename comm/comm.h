// comm.h: the process group. One process per GPU; the launcher (mpirun, Slurm's srun, torchrun-
// style environment variables, or nothing) tells each process its rank; the ranks then agree on
// an NCCL unique id (MPI_Bcast, or a small TCP exchange through rank 0) and build one NCCL
// communicator. A single process (world 1) makes no MPI and no NCCL calls.
//
// Which launcher (first match wins; TRAIN_GPT_LAUNCHER=single|mpi|slurm|env forces one):
//   MPI    built with -DUSE_MPI and OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK is set
//          (mpirun of OpenMPI or MPICH): rank/world from MPI, local rank from a shared-memory
//          split communicator, the NCCL id (or, on the CPU, rank 0's TCP address) broadcast with
//          MPI_Bcast.
//   ENV    RANK and WORLD_SIZE are set (torchrun style; also LOCAL_RANK, LOCAL_WORLD_SIZE,
//          MASTER_ADDR, MASTER_PORT): the id travels over TCP from rank 0 (comm_tcp_broadcast).
//   SLURM  SLURM_PROCID and SLURM_NTASKS are set (srun without MPI): SLURM_LOCALID is the local
//          rank; MASTER_ADDR defaults to the first host of SLURM_STEP_NODELIST (or
//          SLURM_JOB_NODELIST), MASTER_PORT to 20000 + SLURM_JOB_ID % 20000; TCP exchange.
//   SINGLE none of the above, or a world of 1. (mpirun of more than one process with a binary
//          built without MPI, and no RANK/WORLD_SIZE/SLURM_PROCID, is an error naming the fix.)
// ENV is checked before SLURM because explicit RANK/WORLD_SIZE (e.g. torchrun started by srun,
// one per node) describe the processes better than the Slurm task ids.
//
// Failure behaviour: every wait (the TCP exchange, NCCL init, each collective) has a deadline
// of timeout_s (default 60 s). NCCL runs non-blocking; a collective that does not finish in
// time aborts the communicator and returns -1 with a message naming the operation, the rank and
// the likely cause (a peer died or stopped responding), never a silent hang. Collectives are
// synchronous for the host: they return once the stream has finished them.
#ifndef COMM_H
#define COMM_H

#include <stddef.h>  // size_t
#include <stdint.h>  // uint64_t job token

#include "core/common.h"  // ErrBuf

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { COMM_SINGLE = 0, COMM_MPI, COMM_SLURM, COMM_ENV } CommLauncher;

typedef enum { COMM_F32 = 0, COMM_BF16, COMM_I32, COMM_F64, COMM_U8 } CommDtype;

typedef struct {
    double timeout_s;       // every wait's deadline in seconds; <= 0: 60
    int init_nccl;          // 1: cudaSetDevice(local_rank % devices) and build the NCCL
                            // communicator when world > 1; 0: ranks only (CPU, tests)
    const char *job_token;  // optional text every rank of one job shares (e.g. a digest of the
                            // resolved config); mixed into the TCP exchange's job token so a
                            // rank of another job, or with another config, is turned away
    int host_transport;     // 1 (with init_nccl 0): keep the TCP connections of the rendezvous and
                            // run the collectives on HOST memory over them (comm_tcp.h): data
                            // parallelism of the CPU backend. Under MPI, rank 0 announces where
                            // it listens with MPI_Bcast (its host name, or MASTER_ADDR; a free
                            // port, or MASTER_PORT); the collectives themselves stay on TCP.
} CommOptions;

typedef struct Comm {
    int rank, world;              // global rank in [0, world)
    int local_rank, local_world;  // rank and process count on this node
    int node_count;               // nodes in the job (world / local_world when uniform)
    CommLauncher launcher;
    double timeout_s;             // deadline of each wait; may be raised around long phases
    int device;                   // CUDA device of this rank (-1: none selected)
    char master_addr[256];        // TCP exchange: rank 0's host ("" for SINGLE and MPI)
    int master_port;              // TCP exchange: rank 0's port (0 for SINGLE and MPI)
    uint64_t job_token;           // TCP exchange: must match on every rank
    int mpi_initialized;          // this module called MPI_Init (and will MPI_Finalize)
    void *nccl;                   // ncclComm_t; NULL when world == 1 or init_nccl == 0
    void *stream;                 // cudaStream_t the collectives run on; NULL (default): the
                                  // legacy default stream, ordered after the trainer's kernels
                                  // there. Set it to the trainer's stream if it uses another.
    void *scratch;                // device int32[2] for barrier and comm_any
    void *host_scratch;           // pinned host int32[2], the same
    int failed;                   // a collective timed out or failed: the communicator is gone
    int *host_fds;                // host transport (comm_tcp.h): rank 0: socket of rank r at [r];
                                  // other ranks: [0] to rank 0; NULL when not in use
    uint64_t host_seq;            // host transport: collectives so far (checked in every message)
    void *host_scratch_buf;       // host transport: rank 0's receive buffer
    size_t host_scratch_bytes;
    // Asynchronous collectives (comm_*_async) enqueued and not yet waited for: their stream, how
    // many, how many values in all, and what they are (for the message of comm_wait_async).
    void *async_stream;
    int async_pending;
    size_t async_values;
    char async_what[64];
} Comm;

void comm_options_default(CommOptions *o);
const char *comm_launcher_name(CommLauncher l);  // "single", "mpi", "slurm", "env"

// Reads the launcher's environment into c (rank, world, local rank, master address/port, job
// token) and validates it; no MPI, no sockets, no CUDA. For MPI the ranks are filled by
// comm_init (they come from MPI itself); comm_detect only sets launcher = COMM_MPI.
// Bad variables (not an integer, rank >= world, MASTER_ADDR missing for world > 1, ...) return
// -1 with a message naming the variable. o may be NULL (defaults).
int comm_detect(Comm *c, const CommOptions *o, ErrBuf *e);

// comm_detect, then MPI_Init / the TCP exchange of the NCCL id, then the NCCL communicator
// (if o->init_nccl and world > 1; it selects the GPU, so call it before other CUDA work). Sets
// NCCL_NVLS_ENABLE=0 unless the user set it (NVLink multicast can take shared machines' GPUs out
// of service). Returns 0, or -1 with e filled: print it and call comm_abort(c, 1).
int comm_init(Comm *c, const CommOptions *o, ErrBuf *e);

// Frees the communicator (with a deadline: a stuck one is aborted) and finalizes MPI if
// comm_init started it. Safe on a failed or zeroed Comm.
void comm_destroy(Comm *c);

// For fatal paths on any rank: aborts NCCL, and under MPI calls MPI_Abort so that mpirun ends
// the other ranks at once; otherwise exits with code.
void comm_abort(Comm *c, int code) __attribute__((noreturn));

// Collectives, summing: on device memory (NCCL; all-reduce, all-gather and broadcast also take
// host buffers, staged through the device: meant for a few scalars), or on host memory with the
// host transport (comm_tcp.h). They
// return 0, or -1 with e naming the operation and the cause, after which the communicator is
// unusable (c->failed). With world == 1 they make no
// NCCL call: all-reduce is a no-op; reduce-scatter/all-gather copy send to recv if they differ.
// buf: (count,) in place on every rank.
int comm_allreduce_sum(Comm *c, void *buf, size_t count, CommDtype t, ErrBuf *e);
static inline int comm_allreduce_sum_f32(Comm *c, float *buf, size_t count, ErrBuf *e) {
    return comm_allreduce_sum(c, buf, count, COMM_F32, e);
}
// send: (world * recv_count,), recv: (recv_count,) = sum over ranks of this rank's chunk.
// In place when recv == send + rank * recv_count (elements).
int comm_reduce_scatter(Comm *c, const void *send, void *recv, size_t recv_count, CommDtype t,
                        ErrBuf *e);
// send: (send_count,), recv: (world * send_count,) = every rank's send, by rank.
// In place when send == recv + rank * send_count (elements).
int comm_allgather(Comm *c, const void *send, void *recv, size_t send_count, CommDtype t,
                   ErrBuf *e);
// Asynchronous collectives (NCCL, device memory only; the overlap of the gradient reduction with
// the backward, zero1_gpu.h): enqueued on `stream` (a cudaStream_t other than c->stream), they
// return once NCCL has accepted the call (under the deadline), without waiting for the stream.
// comm_wait_async waits until that stream is idle, under the deadline of timeout_s counted from
// the wait (and aborts the communicator when it passes, as every collective does); every
// synchronous collective above calls it first, so NCCL calls never run on two streams at once.
// what: names them in messages (e.g. "gradient buckets"); all pending ones must share a stream.
// With world == 1 they do nothing; the host transport (CPU backend) refuses them (-1).
// buf: (count,) summed in place on every rank.
int comm_allreduce_sum_async(Comm *c, void *buf, size_t count, CommDtype t, void *stream, const char *what,
                             ErrBuf *e);
// buf: (count,) summed into root's buf in place; the other ranks' buf is left as it was.
int comm_reduce_sum_async(Comm *c, void *buf, size_t count, CommDtype t, int root, void *stream, const char *what,
                          ErrBuf *e);
// Waits for the pending asynchronous collectives (0 at once when there are none). 0, or -1 with
// e naming them, how many, the rank and the likely cause.
int comm_wait_async(Comm *c, ErrBuf *e);

// bytes of buf from rank 0 to every rank (device memory under NCCL, host with the host transport).
int comm_broadcast(Comm *c, void *buf, size_t bytes, ErrBuf *e);
// Returns once every rank has reached it (or -1 after timeout_s).
int comm_barrier(Comm *c, ErrBuf *e);
// *any_out = 1 if local_flag is non-zero on any rank. The trainer calls it once per step with
// its stop-signal flag, so a SIGTERM on one rank stops every rank after the same step.
int comm_any(Comm *c, int local_flag, int *any_out, ErrBuf *e);

// The TCP exchange, on raw bytes (no NCCL): rank 0 listens on port, waits for world - 1 ranks
// to connect and say hello (magic, world, rank, job token), then sends them its n bytes; the
// other ranks connect to addr:port (retrying until the deadline) and receive the bytes into
// buf. A rank with another world size or job token is turned away (and told why) without
// disturbing the rest. Errors name host:port, the rank, and how many ranks had arrived.
int comm_tcp_broadcast(void *buf, size_t n, int rank, int world, const char *addr, int port,
                       uint64_t job_token, double timeout_s, ErrBuf *e);

// Selects the GPU of this rank (local_rank % devices) before anything else touches CUDA, so that
// device queries do not open contexts on GPU 0 from every rank. No-op for world 1 or no GPU.
void comm_select_device(Comm *c);

// FNV-1a of s mixed into h (job tokens).
uint64_t comm_hash_str(uint64_t h, const char *s);

#ifdef __cplusplus
}
#endif
#endif  // COMM_H
