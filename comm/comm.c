// comm.c: the process group: launcher detection from the environment, the NCCL communicator in
// non-blocking mode and collectives that wait under a deadline instead of hanging when a peer
// dies; the collectives go to the host transport (comm_tcp.c) when the CPU backend uses it.
// The TCP rendezvous that hands out the NCCL id lives in comm_tcp.c. See comm.h.
#include "comm/comm.h"

#include <errno.h>   // errno of strtol
#include <string.h>  // memset, strcmp
#include <unistd.h>  // gethostname, close (rank 0's address under mpirun)

#include <cuda_runtime.h>  // cudaSetDevice, cudaStreamQuery, scratch memory
#include <nccl.h>          // ncclComm_t, non-blocking communicator, collectives

#include "comm/comm_tcp.h"  // the rendezvous and the host transport
#ifdef USE_MPI
#include <mpi.h>  // MPI_Init, shared-memory split, MPI_Ibcast of the NCCL id
#endif

#define DEFAULT_TIMEOUT_S 60.0

void comm_options_default(CommOptions *o) {
    o->timeout_s = DEFAULT_TIMEOUT_S;
    o->init_nccl = 1;
    o->job_token = NULL;
    o->host_transport = 0;
}

const char *comm_launcher_name(CommLauncher l) {
    switch (l) {
    case COMM_MPI: return "mpi";
    case COMM_SLURM: return "slurm";
    case COMM_ENV: return "env";
    default: return "single";
    }
}

uint64_t comm_hash_str(uint64_t h, const char *s) {
    for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (h ^ 0xff) * 1099511628211ull;  // separator, so ("ab","c") differs from ("a","bc")
}


// ---------------------------------------------------------------------------------------------
// Environment. env_int: 0 absent, 1 read into *out, -1 bad (e names the variable).
static int env_int(const char *name, long lo, long hi, long *out, ErrBuf *e) {
    const char *s = getenv(name);
    if (!s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno)
        return errf(e, "environment variable %s='%s' is not an integer (expected %ld..%ld)", name, s, lo, hi);
    if (v < lo || v > hi)
        return errf(e, "environment variable %s=%ld is out of range (expected %ld..%ld)", name, v, lo, hi);
    *out = v;
    return 1;
}

// First host of a Slurm node list: "gpu-[003-004,010],cpu1" -> "gpu-003". 0 or -1.
static int first_host(const char *list, char *out, size_t cap) {
    size_t o = 0;
    for (const char *p = list; *p && *p != ','; ) {
        if (*p == '[') {  // a range: keep its first number (zero padding included)
            for (p++; *p && *p != '-' && *p != ',' && *p != ']'; p++)
                if (o + 1 < cap) out[o++] = *p;
            while (*p && *p != ']') p++;
            if (!*p) return -1;
            p++;
        } else {
            if (o + 1 < cap) out[o++] = *p;
            p++;
        }
    }
    out[o] = '\0';
    return o ? 0 : -1;
}

// MASTER_ADDR / MASTER_PORT for a TCP exchange. For Slurm they have defaults (the first node of
// the step, a port from the job id); for ENV they must be set.
static int read_master(Comm *c, const char *who, ErrBuf *e) {
    const char *addr = getenv("MASTER_ADDR");
    const char *nodelist = NULL, *nodelist_var = NULL;
    if ((!addr || !*addr) && c->launcher == COMM_SLURM) {
        static const char *vars[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"};
        for (int i = 0; i < 3 && !nodelist; i++)
            if (getenv(vars[i]) && *getenv(vars[i])) nodelist = getenv(vars[i]), nodelist_var = vars[i];
        if (nodelist && first_host(nodelist, c->master_addr, sizeof c->master_addr))
            return errf(e, "cannot read the first host of %s='%s'; export MASTER_ADDR=<host of rank 0> "
                           "(e.g. $(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1))", nodelist_var, nodelist);
    }
    if (addr && *addr) {
        if (strlen(addr) >= sizeof c->master_addr) return errf(e, "MASTER_ADDR='%.60s...' is too long", addr);
        strcpy(c->master_addr, addr);
    } else if (!nodelist) {
        return errf(e, "MASTER_ADDR is not set: with %s=%d every rank needs the host name or address of "
                       "rank 0 (export MASTER_ADDR=<host of rank 0>)", who, c->world);
    }
    long port;
    int got = env_int("MASTER_PORT", 1, 65535, &port, e);
    if (got < 0) return -1;
    if (!got && c->launcher == COMM_SLURM) {
        long job;
        int j = env_int("SLURM_JOB_ID", 0, 0x7fffffffL, &job, e);
        if (j < 0) return -1;
        if (j == 0) return errf(e, "MASTER_PORT is not set and SLURM_JOB_ID is missing: export MASTER_PORT=<free port>");
        port = 20000 + job % 20000;  // distinct for jobs that share a node, most of the time
    } else if (!got) {
        return errf(e, "MASTER_PORT is not set: with %s=%d rank 0 listens on it for the other ranks "
                       "(export MASTER_PORT=<free port, e.g. 29500>)", who, c->world);
    }
    c->master_port = (int)port;
    return 0;
}

static int detect_env(Comm *c, ErrBuf *e) {
    long world, rank, lrank, lworld;
    int has_world = env_int("WORLD_SIZE", 1, 1 << 20, &world, e);
    if (has_world < 0) return -1;
    int has_rank = env_int("RANK", 0, 1 << 20, &rank, e);
    if (has_rank < 0) return -1;
    if (!has_world) return errf(e, "RANK is set but WORLD_SIZE is not: set both (torchrun-style launch)");
    if (!has_rank) return errf(e, "WORLD_SIZE is set but RANK is not: set both (torchrun-style launch)");
    if (rank >= world) return errf(e, "RANK=%ld is out of range for WORLD_SIZE=%ld (expected 0 <= RANK < WORLD_SIZE)", rank, world);
    int has_lworld = env_int("LOCAL_WORLD_SIZE", 1, world, &lworld, e);
    if (has_lworld < 0) return -1;
    int has_lrank = env_int("LOCAL_RANK", 0, world - 1, &lrank, e);
    if (has_lrank < 0) return -1;
    if (!has_lworld) lworld = world;  // unknown: assume one node
    if (!has_lrank) lrank = rank % lworld;
    if (lrank >= lworld)
        return errf(e, "LOCAL_RANK=%ld is out of range for LOCAL_WORLD_SIZE=%ld (expected 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE)", lrank, lworld);
    c->rank = (int)rank, c->world = (int)world, c->local_rank = (int)lrank, c->local_world = (int)lworld;
    c->node_count = (c->world + c->local_world - 1) / c->local_world;
    return c->world > 1 ? read_master(c, "WORLD_SIZE", e) : 0;
}

// Leading integer of a Slurm count like "8(x2)" or "8,8"; 0 if none.
static long leading_int(const char *s) {
    return (s && *s >= '0' && *s <= '9') ? strtol(s, NULL, 10) : 0;
}

static int detect_slurm(Comm *c, ErrBuf *e) {
    long world, rank, lrank = 0;
    const char *wvar = getenv("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    int got = env_int(wvar, 1, 1 << 20, &world, e);
    if (got < 0) return -1;
    if (!got) return errf(e, "SLURM_PROCID is set but SLURM_NTASKS is not: start train_gpt with srun");
    if (env_int("SLURM_PROCID", 0, 1 << 20, &rank, e) < 0) return -1;
    if (rank >= world) return errf(e, "SLURM_PROCID=%ld is out of range for %s=%ld", rank, wvar, world);
    int has_local = env_int("SLURM_LOCALID", 0, world - 1, &lrank, e);
    if (has_local < 0) return -1;
    if (!has_local && world > 1) return errf(e, "SLURM_LOCALID is not set: start train_gpt with srun (one task per GPU)");
    // Tasks on this node: informational (devices come from SLURM_LOCALID), so read leniently.
    long nodes = leading_int(getenv("SLURM_STEP_NUM_NODES"));
    if (!nodes) nodes = leading_int(getenv("SLURM_NNODES"));
    long lworld = leading_int(getenv("SLURM_NTASKS_PER_NODE"));
    if (!lworld) lworld = leading_int(getenv("SLURM_STEP_TASKS_PER_NODE"));
    if (!lworld) lworld = leading_int(getenv("SLURM_TASKS_PER_NODE"));
    if (!lworld) lworld = nodes > 0 ? (world + nodes - 1) / nodes : world;
    if (lworld <= lrank) lworld = lrank + 1;
    if (lworld > world) lworld = world;
    c->rank = (int)rank, c->world = (int)world, c->local_rank = (int)lrank, c->local_world = (int)lworld;
    c->node_count = nodes > 0 ? (int)nodes : (c->world + c->local_world - 1) / c->local_world;
    return c->world > 1 ? read_master(c, wvar, e) : 0;
}

int comm_detect(Comm *c, const CommOptions *o, ErrBuf *e) {
    CommOptions def;
    if (!o) comm_options_default(&def), o = &def;
    memset(c, 0, sizeof *c);
    c->world = c->local_world = c->node_count = 1;
    c->device = -1;
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : DEFAULT_TIMEOUT_S;
    const char *ts = getenv("TRAIN_GPT_COMM_TIMEOUT_S");
    if (ts) {
        char *end;
        double v = strtod(ts, &end);
        if (end == ts || *end || !(v > 0 && v < 1e7))
            return errf(e, "environment variable TRAIN_GPT_COMM_TIMEOUT_S='%s' is not a positive number of seconds", ts);
        c->timeout_s = v;
    }

    // MPI first when this build can use it; without MPI, explicit variables or Slurm's (srun may
    // set PMIX_RANK or PMI_SIZE itself) still work, and only a bare mpirun is an error.
#ifdef USE_MPI
    const int mpi_built = 1;
#else
    const int mpi_built = 0;
#endif
    const char *forced = getenv("TRAIN_GPT_LAUNCHER");
    const char *mpi_var = getenv("OMPI_COMM_WORLD_SIZE") ? "OMPI_COMM_WORLD_SIZE"
                          : getenv("PMI_SIZE")           ? "PMI_SIZE"
                          : getenv("PMIX_RANK")          ? "PMIX_RANK"
                                                         : NULL;
    if (forced) {
        if (!strcmp(forced, "single")) c->launcher = COMM_SINGLE;
        else if (!strcmp(forced, "mpi")) c->launcher = COMM_MPI;
        else if (!strcmp(forced, "slurm")) c->launcher = COMM_SLURM;
        else if (!strcmp(forced, "env")) c->launcher = COMM_ENV;
        else return errf(e, "environment variable TRAIN_GPT_LAUNCHER='%s' is not one of single, mpi, slurm, env", forced);
    } else if (mpi_var && mpi_built) {
        c->launcher = COMM_MPI;
    } else if (getenv("RANK") || getenv("WORLD_SIZE")) {
        c->launcher = COMM_ENV;
    } else if (getenv("SLURM_PROCID")) {
        c->launcher = COMM_SLURM;
    } else if (mpi_var) {
        long n = 0;
        if (env_int(mpi_var, 1, 1 << 20, &n, NULL) == 1 && n == 1 && strcmp(mpi_var, "PMIX_RANK"))
            c->launcher = COMM_SINGLE;  // mpirun -np 1: nothing to exchange
        else
            c->launcher = COMM_MPI;
    }
    if (c->launcher == COMM_MPI && !mpi_built)
        return errf(e, "started by mpirun (%s is set) but this train_gpt was built without MPI: rebuild with MPI "
                       "(make MPI=1, needs mpicc), or launch with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT",
                    mpi_var ? mpi_var : "TRAIN_GPT_LAUNCHER=mpi");
    if (c->launcher == COMM_ENV && detect_env(c, e)) return -1;
    if (c->launcher == COMM_SLURM && detect_slurm(c, e)) return -1;

    // The job token: the same on every rank of one job, different between jobs where possible.
    uint64_t h = comm_hash_str(1469598103934665603ull, "train_gpt comm v1");
    h = comm_hash_str(h, o->job_token);
    h = comm_hash_str(h, getenv("TRAIN_GPT_JOB_ID"));
    h = comm_hash_str(h, getenv("TORCHELASTIC_RUN_ID"));
    if (c->launcher == COMM_SLURM) {
        h = comm_hash_str(h, getenv("SLURM_JOB_ID"));
        h = comm_hash_str(h, getenv("SLURM_STEP_ID"));
    }
    c->job_token = h;
    return 0;
}


// ---------------------------------------------------------------------------------------------
// MPI: ranks from MPI itself; the id by MPI_Ibcast, polled under the deadline.
#ifdef USE_MPI
static int mpi_wait(MPI_Request *req, double timeout_s, const char *what, int rank, ErrBuf *e) {
    double deadline = now_seconds() + timeout_s;
    for (;;) {
        int done = 0;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return errf(e, "rank %d: MPI %s failed", rank, what);
        if (done) return 0;
        if (now_seconds() > deadline)
            return errf(e, "rank %d: MPI %s did not finish within %g s: a rank died or stopped responding", rank, what, timeout_s);
        comm_sleep_s(1e-3);
    }
}

static int mpi_setup(Comm *c, ErrBuf *e) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init(NULL, NULL) != MPI_SUCCESS) return errf(e, "MPI_Init failed (started by mpirun?)");
        c->mpi_initialized = 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->world);
    MPI_Comm node;  // the ranks that share memory with this one: this node
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return errf(e, "rank %d: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed", c->rank);
    MPI_Comm_rank(node, &c->local_rank);
    MPI_Comm_size(node, &c->local_world);
    MPI_Comm_free(&node);
    int leader = c->local_rank == 0;
    MPI_Request req;
    if (MPI_Iallreduce(&leader, &c->node_count, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
        return errf(e, "rank %d: MPI_Iallreduce failed", c->rank);
    return mpi_wait(&req, c->timeout_s, "count of nodes", c->rank, e);
}

// what: names the bytes in messages, e.g. "the NCCL id".
static int mpi_bcast(Comm *c, void *buf, size_t n, const char *what, ErrBuf *e) {
    MPI_Request req;
    char op[96];
    snprintf(op, sizeof op, "broadcast of %s", what);
    if (MPI_Ibcast(buf, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
        return errf(e, "rank %d: MPI_Ibcast of %s failed", c->rank, what);
    return mpi_wait(&req, c->timeout_s, op, c->rank, e);
}

// The CPU backend under mpirun: its collectives run over the host transport's TCP connections
// (comm_tcp.h), like those of torchrun-style ranks, so that both launchers give the same sums.
// Only the meeting point comes from MPI: rank 0 listens on MASTER_PORT, or a free port when it is
// not set, and broadcasts the port and its host (MASTER_ADDR, or its host name: the name the
// hostfile or the scheduler knows the node by) to the other ranks, which connect there.
static int mpi_host_connect(Comm *c, ErrBuf *e) {
    char where[300];  // "PORT HOST"
    memset(where, 0, sizeof where);
    int lfd = -1;
    if (c->rank == 0) {
        const char *addr = getenv("MASTER_ADDR");
        char host[256] = "";
        if (addr && *addr) {
            if (strlen(addr) >= sizeof host) return errf(e, "MASTER_ADDR='%.60s...' is too long", addr);
            strcpy(host, addr);
        } else if (gethostname(host, sizeof host - 1)) {
            return errf(e, "rank 0: cannot read its host name (%s): export MASTER_ADDR=<address of rank 0's node> "
                           "and pass it to the ranks (mpirun -x MASTER_ADDR)", strerror(errno));
        }
        long port = 0;
        if (env_int("MASTER_PORT", 1, 65535, &port, e) < 0) return -1;
        int bound = 0;
        lfd = comm_tcp_listen_any(host, (int)port, c->world, &bound, e);
        if (lfd < 0) return -1;
        snprintf(where, sizeof where, "%d %s", bound, host);
    }
    if (mpi_bcast(c, where, sizeof where, "rank 0's address", e)) {
        if (lfd >= 0) close(lfd);
        return -1;
    }
    char *space = strchr(where, ' ');
    if (!space || sscanf(where, "%d", &c->master_port) != 1)
        return errf(e, "rank %d: rank 0 sent an unreadable address '%.40s'", c->rank, where);
    snprintf(c->master_addr, sizeof c->master_addr, "%s", space + 1);
    if (comm_host_connect(c, lfd, e) == 0) return 0;
    if (c->rank != 0)  // the likely fix, after the rendezvous' own message
        snprintf(e->msg + strlen(e->msg), sizeof e->msg - strlen(e->msg),
                 " [under mpirun rank 0 announced %s:%d; if this node cannot reach it there, export MASTER_ADDR=<an "
                 "address of rank 0's node that every node reaches> and pass it with mpirun -x MASTER_ADDR]",
                 c->master_addr, c->master_port);
    return -1;
}
#endif

// ---------------------------------------------------------------------------------------------
// NCCL, non-blocking: every call may answer ncclInProgress; completion is read from
// ncclCommGetAsyncError (enqueue, init, finalize) and cudaStreamQuery (the collective itself).
// comm_wait polls both against the deadline and aborts the communicator when it passes.

static int comm_fail(Comm *c, ErrBuf *e, const char *what, const char *fmt_cause, const char *detail) {
    char cause[600];
    snprintf(cause, sizeof cause, fmt_cause, detail);
    if (c->nccl) ncclCommAbort((ncclComm_t)c->nccl);  // frees this rank from the collective
    c->nccl = NULL;
    c->failed = 1;
    return errf(e, "rank %d of %d: %s: %s", c->rank, c->world, what, cause);
}

// Waits until NCCL has nothing in progress and, if stream_too, stream is idle.
static int comm_wait_on(Comm *c, int stream_too, void *stream, const char *what, ErrBuf *e) {
    double deadline = now_seconds() + c->timeout_s;
    for (long polls = 0;; polls++) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError((ncclComm_t)c->nccl, &st);
        if (r != ncclSuccess) st = r;
        if (st != ncclSuccess && st != ncclInProgress)
            return comm_fail(c, e, what, "NCCL error: %s (a peer rank failed or the network broke)",
                             ncclGetLastError((ncclComm_t)c->nccl)[0] ? ncclGetLastError((ncclComm_t)c->nccl) : ncclGetErrorString(st));
        cudaError_t q = stream_too ? cudaStreamQuery((cudaStream_t)stream) : cudaSuccess;
        if (q != cudaSuccess && q != cudaErrorNotReady)
            return comm_fail(c, e, what, "CUDA error on the stream: %s", cudaGetErrorString(q));
        if (st == ncclSuccess && q == cudaSuccess) return 0;
        if (now_seconds() > deadline) {
            char t[64];
            snprintf(t, sizeof t, "%g", c->timeout_s);
            return comm_fail(c, e, what, "did not finish within %s s: another rank died, hangs, or is far behind "
                                         "(raise TRAIN_GPT_COMM_TIMEOUT_S if it is only slow)", t);
        }
        if (polls > 100) comm_sleep_s(50e-6);  // spin briefly for short collectives, then poll gently
    }
}

// The same on c->stream, where the synchronous collectives run.
static int comm_wait(Comm *c, int stream_too, const char *what, ErrBuf *e) {
    return comm_wait_on(c, stream_too, c->stream, what, e);
}

static ncclDataType_t nccl_type(CommDtype t) {
    switch (t) {
    case COMM_BF16: return ncclBfloat16;
    case COMM_I32: return ncclInt32;
    case COMM_F64: return ncclFloat64;
    case COMM_U8: return ncclUint8;
    default: return ncclFloat32;
    }
}
static size_t dtype_size(CommDtype t) { return t == COMM_BF16 ? 2 : t == COMM_F64 ? 8 : t == COMM_U8 ? 1 : 4; }

// The result of a collective's enqueue: success or in progress go on to the wait.
static int enqueued(Comm *c, ncclResult_t r, const char *what, ErrBuf *e) {
    if (r == ncclSuccess || r == ncclInProgress) return comm_wait(c, 1, what, e);
    return comm_fail(c, e, what, "NCCL refused the call: %s", ncclGetErrorString(r));
}

static int usable(Comm *c, const char *what, ErrBuf *e) {
    if (c->failed) return errf(e, "rank %d: %s after an earlier communication failure", c->rank, what);
    if (!c->nccl) return errf(e, "rank %d: %s with world %d but no NCCL communicator (comm_init with init_nccl = 0?)",
                              c->rank, what, c->world);
    return c->async_pending ? comm_wait_async(c, e) : 0;  // never two streams of NCCL work at once
}

// --- asynchronous collectives (comm.h) ---

int comm_wait_async(Comm *c, ErrBuf *e) {
    if (!c->async_pending) return 0;
    char what[160];
    snprintf(what, sizeof what, "%s (%d collectives of %zu values in all, overlapped with the backward)",
             c->async_what, c->async_pending, c->async_values);
    c->async_pending = 0;  // waited for now, whatever the outcome
    c->async_values = 0;
    if (c->failed || !c->nccl) return errf(e, "rank %d: %s after an earlier communication failure", c->rank, what);
    return comm_wait_on(c, 1, c->async_stream, what, e);
}

// Checks and bookkeeping before an asynchronous enqueue; 1: nothing to do (world 1).
static int async_begin(Comm *c, size_t count, void *stream, const char *what, const char *op, ErrBuf *e) {
    if (c->world == 1) return 1;
    if (c->host_fds)
        return errf(e, "rank %d: %s: asynchronous collectives need NCCL (the host transport has none)", c->rank, op);
    if (c->failed) return errf(e, "rank %d: %s of %s after an earlier communication failure", c->rank, op, what);
    if (!c->nccl) return errf(e, "rank %d: %s with world %d but no NCCL communicator", c->rank, op, c->world);
    if (c->async_pending && c->async_stream != stream)
        FATAL("comm: asynchronous %s on another stream than the %d pending ones (wait for them first)", op,
              c->async_pending);
    c->async_stream = stream;
    c->async_pending++;
    c->async_values += count;
    snprintf(c->async_what, sizeof c->async_what, "%s of %s", op, what ? what : "buffers");
    return 0;
}

// NCCL's answer to an asynchronous enqueue: waits (under the deadline) only until NCCL has taken
// the call, as non-blocking NCCL requires before the next call on the communicator.
static int async_enqueued(Comm *c, ncclResult_t r, const char *op, size_t count, ErrBuf *e) {
    char what[160];
    snprintf(what, sizeof what, "enqueueing the %s of %zu values (%s)", op, count, c->async_what);
    if (r == ncclSuccess || r == ncclInProgress) return comm_wait(c, 0, what, e);
    return comm_fail(c, e, what, "NCCL refused the call: %s", ncclGetErrorString(r));
}

int comm_allreduce_sum_async(Comm *c, void *buf, size_t count, CommDtype t, void *stream, const char *what,
                             ErrBuf *e) {
    int rc = async_begin(c, count, stream, what, "all-reduce", e);
    if (rc) return rc > 0 ? 0 : -1;
    return async_enqueued(c, ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, (ncclComm_t)c->nccl,
                                           (cudaStream_t)stream), "all-reduce", count, e);
}

int comm_reduce_sum_async(Comm *c, void *buf, size_t count, CommDtype t, int root, void *stream, const char *what,
                          ErrBuf *e) {
    if (root < 0 || root >= c->world) FATAL("comm_reduce_sum_async: root %d outside [0, %d)", root, c->world);
    int rc = async_begin(c, count, stream, what, "reduce", e);
    if (rc) return rc > 0 ? 0 : -1;
    return async_enqueued(c, ncclReduce(buf, buf, count, nccl_type(t), ncclSum, root, (ncclComm_t)c->nccl,
                                        (cudaStream_t)stream), "reduce", count, e);
}

static int nccl_setup(Comm *c, ErrBuf *e) {
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0)
        return errf(e, "rank %d: no usable GPU for NCCL (%s): multi-process runs need one GPU per rank",
                    c->rank, ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    c->device = c->local_rank % ndev;  // ndev == 1 when the launcher binds one GPU per task
    if ((ce = cudaSetDevice(c->device)) != cudaSuccess)
        return errf(e, "rank %d: cudaSetDevice(%d) failed: %s", c->rank, c->device, cudaGetErrorString(ce));
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast off unless the user asked for it

    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r;
    if (c->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess)
        return errf(e, "rank 0: ncclGetUniqueId failed: %s (check NCCL_SOCKET_IFNAME)", ncclGetErrorString(r));
#ifdef USE_MPI
    if (c->launcher == COMM_MPI) {
        if (mpi_bcast(c, &id, sizeof id, "the NCCL id", e)) return -1;
    } else
#endif
    if (comm_tcp_broadcast(&id, sizeof id, c->rank, c->world, c->master_addr, c->master_port, c->job_token,
                           c->timeout_s, e))
        return -1;

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  // calls return at once; comm_wait enforces the deadline
    ncclComm_t comm = NULL;
    r = ncclCommInitRankConfig(&comm, c->world, id, c->rank, &cfg);
    c->nccl = comm;
    if (r != ncclSuccess && r != ncclInProgress)
        return comm_fail(c, e, "NCCL communicator setup", "%s", ncclGetErrorString(r));
    if (comm_wait(c, 0, "NCCL communicator setup", e)) return -1;

    // Scratch for barrier and comm_any: an int on the device and a pinned one on the host.
    if (cudaMalloc(&c->scratch, 2 * sizeof(int32_t)) != cudaSuccess ||
        cudaMallocHost(&c->host_scratch, 2 * sizeof(int32_t)) != cudaSuccess)
        return errf(e, "rank %d: allocating 8 bytes of scratch for collectives failed", c->rank);
    return 0;
}

int comm_init(Comm *c, const CommOptions *o, ErrBuf *e) {
    CommOptions def;
    if (!o) comm_options_default(&def), o = &def;
    if (comm_detect(c, o, e)) return -1;
#ifdef USE_MPI
    if (c->launcher == COMM_MPI && mpi_setup(c, e)) return -1;
#endif
    if (c->world > 1 && o->host_transport) {
#ifdef USE_MPI
        if (c->launcher == COMM_MPI) return mpi_host_connect(c, e);
#endif
        return comm_host_connect(c, -1, e);
    }
    if (c->world == 1 || !o->init_nccl) return 0;
    return nccl_setup(c, e);
}

void comm_destroy(Comm *c) {
    comm_host_close(c);
    if (c->nccl && !c->failed) {
        ErrBuf ignored;
        ncclResult_t r = ncclCommFinalize((ncclComm_t)c->nccl);  // flushes, then waits for peers
        if ((r == ncclSuccess || r == ncclInProgress) && comm_wait(c, 0, "NCCL finalize", &ignored) == 0)
            ncclCommDestroy((ncclComm_t)c->nccl);
        else if (c->nccl)
            ncclCommAbort((ncclComm_t)c->nccl);
    }
    c->nccl = NULL;
    if (c->scratch) cudaFree(c->scratch);
    if (c->host_scratch) cudaFreeHost(c->host_scratch);
    c->scratch = c->host_scratch = NULL;
#ifdef USE_MPI
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (c->mpi_initialized && !finalized) MPI_Finalize();
#endif
    c->mpi_initialized = 0;
}

void comm_abort(Comm *c, int code) {
    comm_host_close(c);
    if (c->nccl) ncclCommAbort((ncclComm_t)c->nccl);
    c->nccl = NULL;
#ifdef USE_MPI
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (c->launcher == COMM_MPI && c->world > 1 && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    exit(code);
}

// ---------------------------------------------------------------------------------------------
// Collectives.

// NCCL works on device memory: a host buffer (a loss, a norm, a resumed state) goes through a
// temporary device copy. 1 if p is ordinary or pinned host memory.
static int is_host_memory(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();  // clear the error: an unknown pointer is host memory
        return 1;
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

// to_device: a new device buffer *dev with a copy of host buf (bytes); else copies *dev back
// into buf and frees it.
static int stage(Comm *c, void *buf, size_t bytes, void **dev, int to_device, ErrBuf *e) {
    cudaStream_t s = (cudaStream_t)c->stream;
    if (to_device) {
        if (cudaMalloc(dev, bytes) != cudaSuccess ||
            cudaMemcpyAsync(*dev, buf, bytes, cudaMemcpyHostToDevice, s) != cudaSuccess)
            return errf(e, "rank %d: staging %zu bytes of host memory for NCCL failed", c->rank, bytes);
        return 0;
    }
    int ok = cudaMemcpyAsync(buf, *dev, bytes, cudaMemcpyDeviceToHost, s) == cudaSuccess &&
             cudaStreamSynchronize(s) == cudaSuccess;
    cudaFree(*dev);
    return ok ? 0 : errf(e, "rank %d: copying %zu bytes back from the device failed", c->rank, bytes);
}

int comm_allreduce_sum(Comm *c, void *buf, size_t count, CommDtype t, ErrBuf *e) {
    if (c->world == 1) return 0;
    if (c->host_fds || c->failed) return comm_host_allreduce(c, buf, count, t, e);
    if (usable(c, "all-reduce", e)) return -1;
    char what[96];
    snprintf(what, sizeof what, "all-reduce of %zu values", count);
    void *dev = buf;
    int host = is_host_memory(buf);
    if (host && stage(c, buf, count * dtype_size(t), &dev, 1, e)) return -1;
    int rc = enqueued(c, ncclAllReduce(dev, dev, count, nccl_type(t), ncclSum, (ncclComm_t)c->nccl,
                                       (cudaStream_t)c->stream), what, e);
    if (host && !rc) return stage(c, buf, count * dtype_size(t), &dev, 0, e);
    if (host) cudaFree(dev);
    return rc;
}

// world 1: recv = send (a device copy when they differ).
static int copy_single(Comm *c, const void *send, void *recv, size_t count, CommDtype t, ErrBuf *e) {
    if (send == recv || count == 0) return 0;
    cudaError_t ce = cudaMemcpyAsync(recv, send, count * dtype_size(t), cudaMemcpyDefault, (cudaStream_t)c->stream);
    return ce == cudaSuccess ? 0 : errf(e, "copy of %zu values failed: %s", count, cudaGetErrorString(ce));
}

int comm_reduce_scatter(Comm *c, const void *send, void *recv, size_t recv_count, CommDtype t, ErrBuf *e) {
    if (c->world == 1) return copy_single(c, send, recv, recv_count, t, e);
    if (c->host_fds || c->failed) return comm_host_reduce_scatter(c, send, recv, recv_count, t, e);
    if (usable(c, "reduce-scatter", e)) return -1;
    char what[96];
    snprintf(what, sizeof what, "reduce-scatter of %zu values per rank", recv_count);
    return enqueued(c, ncclReduceScatter(send, recv, recv_count, nccl_type(t), ncclSum, (ncclComm_t)c->nccl,
                                         (cudaStream_t)c->stream), what, e);
}

int comm_allgather(Comm *c, const void *send, void *recv, size_t send_count, CommDtype t, ErrBuf *e) {
    if (c->world == 1) return copy_single(c, send, recv, send_count, t, e);
    if (c->host_fds || c->failed) return comm_host_allgather(c, send, recv, send_count, t, e);
    if (usable(c, "all-gather", e)) return -1;
    char what[96];
    snprintf(what, sizeof what, "all-gather of %zu values per rank", send_count);
    if (!is_host_memory(recv))
        return enqueued(c, ncclAllGather(send, recv, send_count, nccl_type(t), (ncclComm_t)c->nccl,
                                         (cudaStream_t)c->stream), what, e);
    // Host buffers (a few scalars per rank, e.g. ZeRO-1's slice norms): through a device copy,
    // this rank's part placed where an in-place all-gather expects it.
    size_t part = send_count * dtype_size(t), all = part * (size_t)c->world;
    void *dev = NULL;
    if (cudaMalloc(&dev, all) != cudaSuccess ||
        cudaMemcpyAsync((char *)dev + (size_t)c->rank * part, send, part, cudaMemcpyDefault,
                        (cudaStream_t)c->stream) != cudaSuccess) {
        if (dev) cudaFree(dev);
        return errf(e, "rank %d: staging %zu bytes of host memory for NCCL failed", c->rank, all);
    }
    int rc = enqueued(c, ncclAllGather((char *)dev + (size_t)c->rank * part, dev, send_count, nccl_type(t),
                                       (ncclComm_t)c->nccl, (cudaStream_t)c->stream), what, e);
    if (!rc) return stage(c, recv, all, &dev, 0, e);  // copies back and frees
    cudaFree(dev);
    return rc;
}

// Max over ranks of one int, through the scratch buffers; the copies run only on an idle stream
// so no CUDA call can block past the deadline.
static int allreduce_max_int(Comm *c, int v, int *out, const char *what, ErrBuf *e) {
    if (c->host_fds || c->failed) return comm_host_max_int(c, v, out, what, e);
    if (usable(c, what, e)) return -1;
    cudaStream_t s = (cudaStream_t)c->stream;
    *(int32_t *)c->host_scratch = v;
    if (cudaMemcpyAsync(c->scratch, c->host_scratch, sizeof(int32_t), cudaMemcpyHostToDevice, s) != cudaSuccess)
        return errf(e, "rank %d: %s: copy to the device failed", c->rank, what);
    if (enqueued(c, ncclAllReduce(c->scratch, c->scratch, 1, ncclInt32, ncclMax, (ncclComm_t)c->nccl, s), what, e))
        return -1;
    if (cudaMemcpyAsync(c->host_scratch, c->scratch, sizeof(int32_t), cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess)
        return errf(e, "rank %d: %s: copy from the device failed", c->rank, what);
    *out = *(int32_t *)c->host_scratch;
    return 0;
}

int comm_barrier(Comm *c, ErrBuf *e) {
    int ignored;
    return c->world == 1 ? 0 : allreduce_max_int(c, 0, &ignored, "barrier", e);
}

int comm_any(Comm *c, int local_flag, int *any_out, ErrBuf *e) {
    *any_out = local_flag != 0;
    return c->world == 1 ? 0 : allreduce_max_int(c, local_flag != 0, any_out, "agreement on stopping", e);
}

int comm_broadcast(Comm *c, void *buf, size_t bytes, ErrBuf *e) {
    if (c->world == 1 || bytes == 0) return 0;
    if (c->host_fds || c->failed) return comm_host_broadcast(c, buf, bytes, e);
    if (usable(c, "broadcast", e)) return -1;
    char what[96];
    snprintf(what, sizeof what, "broadcast of %zu bytes", bytes);
    void *dev = buf;
    int host = is_host_memory(buf);
    if (host && stage(c, buf, bytes, &dev, 1, e)) return -1;
    int rc = enqueued(c, ncclBroadcast(dev, dev, bytes, ncclUint8, 0, (ncclComm_t)c->nccl, (cudaStream_t)c->stream),
                      what, e);
    if (host && !rc) return stage(c, buf, bytes, &dev, 0, e);
    if (host) cudaFree(dev);
    return rc;
}

void comm_select_device(Comm *c) {
    int ndev = 0;
    if (c->world > 1 && cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0 && cudaSetDevice(c->local_rank % ndev) == cudaSuccess)
        c->device = c->local_rank % ndev;
}
