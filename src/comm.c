// comm.c: the process group: launcher detection from the environment, the exchange of the NCCL
// unique id (MPI or a TCP rendezvous at rank 0), the NCCL communicator in non-blocking mode and
// collectives that wait under a deadline instead of hanging when a peer dies. See comm.h.
#include "comm.h"

#include <arpa/inet.h>     // htonl, ntohl, inet_ntop
#include <errno.h>         // errno codes of sockets and strtol
#include <fcntl.h>         // O_NONBLOCK for sockets
#include <netdb.h>         // getaddrinfo
#include <netinet/in.h>    // sockaddr_in(6), IN6_IS_ADDR_LOOPBACK
#include <poll.h>          // poll: every socket wait has a deadline
#include <string.h>        // memcpy, strerror
#include <sys/resource.h>  // RLIMIT_NOFILE: rank 0 holds world - 1 sockets
#include <sys/socket.h>    // socket, bind, listen, accept, connect
#include <time.h>          // nanosleep between retries
#include <unistd.h>        // close

#include <cuda_runtime.h>  // cudaSetDevice, cudaStreamQuery, scratch memory
#include <nccl.h>          // ncclComm_t, non-blocking communicator, collectives
#ifdef USE_MPI
#include <mpi.h>  // MPI_Init, shared-memory split, MPI_Ibcast of the NCCL id
#endif

#define DEFAULT_TIMEOUT_S 60.0

void comm_options_default(CommOptions *o) {
    o->timeout_s = DEFAULT_TIMEOUT_S;
    o->init_nccl = 1;
    o->job_token = NULL;
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

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
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
// The TCP exchange. Messages are 32 bytes, big-endian:
//   hello (rank r -> rank 0): magic, version, rank, world (u32), job token, payload bytes (u64)
//   reply (rank 0 -> rank r): magic, status, world, ranks arrived (u32), job token, bytes (u64)
// followed, when status is TCP_OK, by the payload.
#define TCP_MAGIC 0x54475043u  // "TGPC"
#define TCP_VERSION 1u
enum { TCP_OK = 0, TCP_WRONG_JOB, TCP_WRONG_WORLD, TCP_WRONG_SIZE, TCP_BAD_RANK, TCP_GAVE_UP };

typedef struct { uint32_t magic, word1, world, rank_or_arrived; uint64_t token, nbytes; } TcpMsg;

static void msg_pack(const TcpMsg *m, unsigned char out[32]) {
    uint32_t w[4] = {htonl(m->magic), htonl(m->word1), htonl(m->world), htonl(m->rank_or_arrived)};
    memcpy(out, w, 16);
    for (int i = 0; i < 8; i++) out[16 + i] = (unsigned char)(m->token >> (56 - 8 * i));
    for (int i = 0; i < 8; i++) out[24 + i] = (unsigned char)(m->nbytes >> (56 - 8 * i));
}

static void msg_unpack(const unsigned char in[32], TcpMsg *m) {
    uint32_t w[4];
    memcpy(w, in, 16);
    m->magic = ntohl(w[0]), m->word1 = ntohl(w[1]), m->world = ntohl(w[2]), m->rank_or_arrived = ntohl(w[3]);
    m->token = m->nbytes = 0;
    for (int i = 0; i < 8; i++) m->token = (m->token << 8) | in[16 + i];
    for (int i = 0; i < 8; i++) m->nbytes = (m->nbytes << 8) | in[24 + i];
}

// Sends or receives all n bytes on a non-blocking socket before the deadline.
// 0 done, -1 error or peer closed (errno; 0 for a clean close), -2 deadline passed.
static int io_full(int fd, void *buf, size_t n, int sending, double deadline) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k > 0) { p += k, n -= (size_t)k; continue; }
        if (k == 0) { errno = 0; return -1; }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        double left = deadline - now_seconds();
        if (left <= 0) return -2;
        struct pollfd pfd = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
        poll(&pfd, 1, (int)(left * 1000) + 1);
    }
    return 0;
}

static int set_nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL, 0);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int send_reply(int fd, uint32_t status, int world, int arrived, uint64_t token, const void *buf,
                      size_t n, double deadline) {
    TcpMsg m = {TCP_MAGIC, status, (uint32_t)world, (uint32_t)arrived, token, n};
    unsigned char raw[32];
    msg_pack(&m, raw);
    if (io_full(fd, raw, 32, 1, deadline)) return -1;
    return status == TCP_OK ? io_full(fd, (void *)buf, n, 1, deadline) : 0;
}

// Rank 0's listening socket on port: on the loopback address itself when addr is a loopback
// address (tests stay off the network), else on every interface of addr's family.
static int tcp_listen(const char *addr, int port, int world, ErrBuf *e) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int family = AF_INET, loopback = 0;
    struct sockaddr_storage sa = {0};
    if (getaddrinfo(addr, NULL, &hints, &ai) == 0 && ai) {
        family = ai->ai_family;
        if (family == AF_INET)
            loopback = (ntohl(((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (family == AF_INET6)
            loopback = IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr);
        if (loopback) memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
    }
    if (ai) freeaddrinfo(ai);
    sa.ss_family = (sa_family_t)family;
    socklen_t len;
    if (family == AF_INET6) {
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)port);
        if (!loopback) ((struct sockaddr_in6 *)&sa)->sin6_addr = in6addr_any;
        len = sizeof(struct sockaddr_in6);
    } else {
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)port);
        if (!loopback) ((struct sockaddr_in *)&sa)->sin_addr.s_addr = htonl(INADDR_ANY);
        len = sizeof(struct sockaddr_in);
    }
    int fd = socket(family, SOCK_STREAM, 0), one = 1;
    if (fd < 0) return errf(e, "rank 0: cannot create a socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, len) || listen(fd, world < 4096 ? world : 4096) || set_nonblocking(fd)) {
        int err = errno;
        close(fd);
        return errf(e, "rank 0 cannot listen on port %d (MASTER_PORT) for %s: %s%s", port, addr, strerror(err),
                    err == EADDRINUSE ? " (another program or job on this node uses the port: choose another MASTER_PORT)" : "");
    }
    return fd;
}

// Rank 0: waits for world - 1 ranks, then sends them buf.
static int tcp_serve(const void *buf, size_t n, int world, const char *addr, int port, uint64_t token,
                     double timeout_s, ErrBuf *e) {
    double deadline = now_seconds() + timeout_s;
    struct rlimit rl;  // rank 0 holds one socket per rank until everyone has arrived
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < (rlim_t)world + 64) {
        rl.rlim_cur = rl.rlim_max < (rlim_t)world + 64 ? rl.rlim_max : (rlim_t)world + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    int lfd = tcp_listen(addr, port, world, e);
    if (lfd < 0) return -1;
    int *peer = xmalloc(sizeof(int) * (size_t)world);
    for (int r = 0; r < world; r++) peer[r] = -1;
    int arrived = 1, turned_away = 0;
    char why[400] = "";
    while (arrived < world) {
        double left = deadline - now_seconds();
        if (left <= 0) break;
        struct pollfd pfd = {lfd, POLLIN, 0};
        if (poll(&pfd, 1, (int)(left * 1000) + 1) <= 0) continue;
        struct sockaddr_storage from;
        socklen_t flen = sizeof from;
        int fd = accept(lfd, (struct sockaddr *)&from, &flen);
        if (fd < 0) continue;
        char host[INET6_ADDRSTRLEN] = "?";
        if (from.ss_family == AF_INET) inet_ntop(AF_INET, &((struct sockaddr_in *)&from)->sin_addr, host, sizeof host);
        if (from.ss_family == AF_INET6) inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&from)->sin6_addr, host, sizeof host);
        set_nonblocking(fd);
        unsigned char raw[32];
        TcpMsg m;
        double hello_deadline = now_seconds() + 5 < deadline ? now_seconds() + 5 : deadline;
        int status = -1;
        if (io_full(fd, raw, 32, 0, hello_deadline) == 0) {
            msg_unpack(raw, &m);
            if (m.magic != TCP_MAGIC || m.word1 != TCP_VERSION) status = -1;
            else if (m.token != token) status = TCP_WRONG_JOB;
            else if (m.world != (uint32_t)world) status = TCP_WRONG_WORLD;
            else if (m.nbytes != n) status = TCP_WRONG_SIZE;
            else if (m.rank_or_arrived == 0 || m.rank_or_arrived >= (uint32_t)world || peer[m.rank_or_arrived] >= 0) status = TCP_BAD_RANK;
            else status = TCP_OK;
        }
        if (status == TCP_OK) {
            peer[m.rank_or_arrived] = fd;
            arrived++;
            continue;
        }
        turned_away++;
        if (status < 0) {
            snprintf(why, sizeof why, "a connection from %s sent no train_gpt hello (another program uses the port?)", host);
        } else {
            snprintf(why, sizeof why, "rank %u from %s was turned away: %s", m.rank_or_arrived, host,
                     status == TCP_WRONG_JOB ? "it belongs to another job (job token differs)"
                     : status == TCP_WRONG_WORLD ? "its world size differs"
                     : status == TCP_WRONG_SIZE ? "it expects another payload size (another train_gpt version?)"
                                                : "its rank is out of range or already taken");
            send_reply(fd, (uint32_t)status, world, arrived, token, NULL, 0, hello_deadline);
        }
        fprintf(stderr, "train_gpt: warning: rank 0 (port %d): %s\n", port, why);
        close(fd);
    }
    int rc = 0;
    if (arrived < world) {
        char missing[200] = "";
        size_t len = 0;
        for (int r = 1, shown = 0; r < world && len + 16 < sizeof missing; r++)
            if (peer[r] < 0) len += (size_t)snprintf(missing + len, sizeof missing - len, shown++ ? ", %d" : "%d", r);
        rc = errf(e, "rank 0: only %d of %d ranks arrived at port %d (MASTER_PORT) within %g s (missing ranks: %s%s)%s%s; "
                     "a rank died, was not started, or uses another MASTER_ADDR/MASTER_PORT",
                  arrived, world, port, timeout_s, missing, len + 16 >= sizeof missing ? ", ..." : "",
                  turned_away ? "; last one turned away: " : "", turned_away ? why : "");
        for (int r = 1; r < world; r++)  // tell those who came why there is nothing to receive
            if (peer[r] >= 0) send_reply(peer[r], TCP_GAVE_UP, world, arrived, token, NULL, 0, now_seconds() + 1);
    } else {
        for (int r = 1; r < world && !rc; r++)
            if (send_reply(peer[r], TCP_OK, world, arrived, token, buf, n, now_seconds() + timeout_s))
                rc = errf(e, "rank 0: sending the id to rank %d failed: %s (did it die?)", r, errno ? strerror(errno) : "connection closed");
    }
    for (int r = 1; r < world; r++)
        if (peer[r] >= 0) close(peer[r]);
    free(peer);
    close(lfd);
    return rc;
}

// Other ranks: connect to rank 0 (retrying while it is not listening yet), say hello, receive.
static int tcp_fetch(void *buf, size_t n, int rank, int world, const char *addr, int port, uint64_t token,
                     double timeout_s, ErrBuf *e) {
    double deadline = now_seconds() + timeout_s;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    int fd = -1, last_err = 0;
    const char *last_what = "no attempt";
    while (fd < 0 && now_seconds() < deadline) {
        struct addrinfo hints = {0}, *ai = NULL;
        hints.ai_socktype = SOCK_STREAM;
        int g = getaddrinfo(addr, port_s, &hints, &ai);
        if (g && g != EAI_AGAIN)
            return errf(e, "rank %d cannot resolve MASTER_ADDR '%s': %s", rank, addr, gai_strerror(g));
        for (struct addrinfo *a = g ? NULL : ai; a && fd < 0; a = a->ai_next) {
            int s = socket(a->ai_family, SOCK_STREAM, 0);
            if (s < 0 || set_nonblocking(s)) { last_err = errno, last_what = "socket"; if (s >= 0) close(s); continue; }
            int err = connect(s, a->ai_addr, a->ai_addrlen) ? errno : 0;
            if (err == EINPROGRESS) {  // wait for the handshake, at most 2 s per attempt
                double left = deadline - now_seconds();
                struct pollfd pfd = {s, POLLOUT, 0};
                err = ETIMEDOUT;
                if (poll(&pfd, 1, (int)((left < 2 ? left : 2) * 1000) + 1) > 0) {
                    socklen_t el = sizeof err;
                    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el);
                }
            }
            if (err) { last_err = err, last_what = "connect"; close(s); continue; }
            fd = s;
        }
        if (ai) freeaddrinfo(ai);
        if (fd < 0) {
            if (g) last_err = EAGAIN, last_what = "resolving MASTER_ADDR";
            double left = deadline - now_seconds();
            sleep_s(left < 0.1 ? left : 0.1);
        }
    }
    if (fd < 0)
        return errf(e, "rank %d could not reach rank 0 at %s:%d (MASTER_ADDR:MASTER_PORT) within %g s: %s: %s "
                       "(is rank 0 running, on that host, with the same MASTER_PORT?)",
                    rank, addr, port, timeout_s, last_what, strerror(last_err));

    TcpMsg m = {TCP_MAGIC, TCP_VERSION, (uint32_t)world, (uint32_t)rank, token, n};
    unsigned char raw[32];
    msg_pack(&m, raw);
    // Rank 0 answers at its own deadline at the latest; a grace second lets its reason arrive.
    double reply_deadline = deadline + 1;
    int rc = io_full(fd, raw, 32, 1, reply_deadline);
    if (!rc) rc = io_full(fd, raw, 32, 0, reply_deadline);
    if (rc) {
        int err = errno;
        close(fd);
        if (rc == -2)
            return errf(e, "rank %d connected to rank 0 at %s:%d but got no answer within %g s: rank 0 is still "
                           "waiting for other ranks (one may have died or not started)", rank, addr, port, timeout_s);
        return errf(e, "rank %d: rank 0 at %s:%d closed the connection (%s): did rank 0 die?", rank, addr, port,
                    err ? strerror(err) : "end of stream");
    }
    msg_unpack(raw, &m);
    if (m.magic != TCP_MAGIC) {
        close(fd);
        return errf(e, "rank %d: the program listening at %s:%d is not train_gpt's rank 0: choose another MASTER_PORT",
                    rank, addr, port);
    }
    if (m.word1 != TCP_OK) {
        close(fd);
        switch (m.word1) {
        case TCP_WRONG_JOB:
            return errf(e, "rank %d: rank 0 at %s:%d belongs to another job (job token differs): two jobs use the "
                           "same MASTER_ADDR:MASTER_PORT, or the ranks were started with different configs", rank, addr, port);
        case TCP_WRONG_WORLD:
            return errf(e, "rank %d: rank 0 at %s:%d has world size %u, this rank has %d: the ranks disagree about "
                           "WORLD_SIZE", rank, addr, port, m.world, world);
        case TCP_GAVE_UP:
            return errf(e, "rank %d: rank 0 at %s:%d gave up: only %u of %d ranks arrived within its timeout",
                        rank, addr, port, m.rank_or_arrived, world);
        default:
            return errf(e, "rank %d: rank 0 at %s:%d turned this rank away (status %u: rank taken twice, or another "
                           "train_gpt version)", rank, addr, port, m.word1);
        }
    }
    rc = m.nbytes == n ? io_full(fd, buf, n, 0, reply_deadline) : -1;
    close(fd);
    if (rc) return errf(e, "rank %d: receiving the id from rank 0 at %s:%d failed (%s)", rank, addr, port,
                        rc == -2 ? "timed out" : "connection closed");
    return 0;
}

int comm_tcp_broadcast(void *buf, size_t n, int rank, int world, const char *addr, int port,
                       uint64_t job_token, double timeout_s, ErrBuf *e) {
    if (world <= 1) return 0;
    if (rank < 0 || rank >= world) return errf(e, "comm_tcp_broadcast: rank %d out of range for world %d", rank, world);
    if (rank == 0) return tcp_serve(buf, n, world, addr, port, job_token, timeout_s, e);
    return tcp_fetch(buf, n, rank, world, addr, port, job_token, timeout_s, e);
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
        sleep_s(1e-3);
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

static int mpi_bcast(Comm *c, void *buf, size_t n, ErrBuf *e) {
    MPI_Request req;
    if (MPI_Ibcast(buf, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
        return errf(e, "rank %d: MPI_Ibcast of the NCCL id failed", c->rank);
    return mpi_wait(&req, c->timeout_s, "broadcast of the NCCL id", c->rank, e);
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

// Waits until NCCL has nothing in progress and, if stream_too, c->stream is idle.
static int comm_wait(Comm *c, int stream_too, const char *what, ErrBuf *e) {
    double deadline = now_seconds() + c->timeout_s;
    for (long polls = 0;; polls++) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError((ncclComm_t)c->nccl, &st);
        if (r != ncclSuccess) st = r;
        if (st != ncclSuccess && st != ncclInProgress)
            return comm_fail(c, e, what, "NCCL error: %s (a peer rank failed or the network broke)",
                             ncclGetLastError((ncclComm_t)c->nccl)[0] ? ncclGetLastError((ncclComm_t)c->nccl) : ncclGetErrorString(st));
        cudaError_t q = stream_too ? cudaStreamQuery((cudaStream_t)c->stream) : cudaSuccess;
        if (q != cudaSuccess && q != cudaErrorNotReady)
            return comm_fail(c, e, what, "CUDA error on the stream: %s", cudaGetErrorString(q));
        if (st == ncclSuccess && q == cudaSuccess) return 0;
        if (now_seconds() > deadline) {
            char t[64];
            snprintf(t, sizeof t, "%g", c->timeout_s);
            return comm_fail(c, e, what, "did not finish within %s s: another rank died, hangs, or is far behind "
                                         "(raise TRAIN_GPT_COMM_TIMEOUT_S if it is only slow)", t);
        }
        if (polls > 100) sleep_s(50e-6);  // spin briefly for short collectives, then poll gently
    }
}

static ncclDataType_t nccl_type(CommDtype t) {
    return t == COMM_BF16 ? ncclBfloat16 : t == COMM_I32 ? ncclInt32 : ncclFloat32;
}
static size_t dtype_size(CommDtype t) { return t == COMM_BF16 ? 2 : 4; }

// The result of a collective's enqueue: success or in progress go on to the wait.
static int enqueued(Comm *c, ncclResult_t r, const char *what, ErrBuf *e) {
    if (r == ncclSuccess || r == ncclInProgress) return comm_wait(c, 1, what, e);
    return comm_fail(c, e, what, "NCCL refused the call: %s", ncclGetErrorString(r));
}

static int usable(Comm *c, const char *what, ErrBuf *e) {
    if (c->failed) return errf(e, "rank %d: %s after an earlier communication failure", c->rank, what);
    if (!c->nccl) return errf(e, "rank %d: %s with world %d but no NCCL communicator (comm_init with init_nccl = 0?)",
                              c->rank, what, c->world);
    return 0;
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
        if (mpi_bcast(c, &id, sizeof id, e)) return -1;
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
    if (c->world == 1 || !o->init_nccl) return 0;
    return nccl_setup(c, e);
}

void comm_destroy(Comm *c) {
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

int comm_allreduce_sum(Comm *c, void *buf, size_t count, CommDtype t, ErrBuf *e) {
    if (c->world == 1) return 0;
    if (usable(c, "all-reduce", e)) return -1;
    char what[96];
    snprintf(what, sizeof what, "all-reduce of %zu values", count);
    return enqueued(c, ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, (ncclComm_t)c->nccl,
                                     (cudaStream_t)c->stream), what, e);
}

// world 1: recv = send (a device copy when they differ).
static int copy_single(Comm *c, const void *send, void *recv, size_t count, CommDtype t, ErrBuf *e) {
    if (send == recv || count == 0) return 0;
    cudaError_t ce = cudaMemcpyAsync(recv, send, count * dtype_size(t), cudaMemcpyDefault, (cudaStream_t)c->stream);
    return ce == cudaSuccess ? 0 : errf(e, "copy of %zu values failed: %s", count, cudaGetErrorString(ce));
}

int comm_reduce_scatter(Comm *c, const void *send, void *recv, size_t recv_count, CommDtype t, ErrBuf *e) {
    if (c->world == 1) return copy_single(c, send, recv, recv_count, t, e);
    if (usable(c, "reduce-scatter", e)) return -1;
    char what[96];
    snprintf(what, sizeof what, "reduce-scatter of %zu values per rank", recv_count);
    return enqueued(c, ncclReduceScatter(send, recv, recv_count, nccl_type(t), ncclSum, (ncclComm_t)c->nccl,
                                         (cudaStream_t)c->stream), what, e);
}

int comm_allgather(Comm *c, const void *send, void *recv, size_t send_count, CommDtype t, ErrBuf *e) {
    if (c->world == 1) return copy_single(c, send, recv, send_count, t, e);
    if (usable(c, "all-gather", e)) return -1;
    char what[96];
    snprintf(what, sizeof what, "all-gather of %zu values per rank", send_count);
    return enqueued(c, ncclAllGather(send, recv, send_count, nccl_type(t), (ncclComm_t)c->nccl,
                                     (cudaStream_t)c->stream), what, e);
}

// Max over ranks of one int, through the scratch buffers; the copies run only on an idle stream
// so no CUDA call can block past the deadline.
static int allreduce_max_int(Comm *c, int v, int *out, const char *what, ErrBuf *e) {
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
