// comm_tcp.c: comm's TCP side (see comm_tcp.h): the rendezvous at rank 0 that hands out the
// NCCL id, and the host transport that keeps the rendezvous' connections for collectives on host
// memory (the CPU backend's data parallelism).
#include "comm/comm_tcp.h"

#include <arpa/inet.h>     // htonl, ntohl, inet_ntop
#include <errno.h>         // errno codes of sockets
#include <fcntl.h>         // O_NONBLOCK for sockets
#include <netdb.h>         // getaddrinfo
#include <netinet/in.h>    // sockaddr_in(6), IN6_IS_ADDR_LOOPBACK
#include <netinet/tcp.h>   // TCP_NODELAY: collectives are many small round trips
#include <poll.h>          // poll: every socket wait has a deadline
#include <string.h>        // memcpy, strerror
#include <sys/resource.h>  // RLIMIT_NOFILE: rank 0 holds world - 1 sockets
#include <sys/socket.h>    // socket, bind, listen, accept, connect
#include <time.h>          // nanosleep between retries
#include <unistd.h>        // close

void comm_sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
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

// Rank 0's listening socket on port (0: a free one, written to *bound_port when not NULL): on the
// loopback address itself when addr is a loopback address and any_interface is 0 (tests stay off
// the network), else on every interface of addr's family.
static int tcp_listen(const char *addr, int port, int world, int any_interface, int *bound_port, ErrBuf *e) {
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
        if (any_interface) loopback = 0;
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
    if (bound_port) {
        struct sockaddr_storage got;
        socklen_t glen = sizeof got;
        if (getsockname(fd, (struct sockaddr *)&got, &glen)) {
            int err = errno;
            close(fd);
            return errf(e, "rank 0: cannot read the port it listens on: %s", strerror(err));
        }
        *bound_port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                      : ((struct sockaddr_in *)&got)->sin_port);
    }
    return fd;
}

int comm_tcp_listen_any(const char *host, int port, int world, int *bound_port, ErrBuf *e) {
    return tcp_listen(host, port, world, 1, bound_port, e);
}

// Rank 0: waits for world - 1 ranks on the listening socket lfd (closed at the end, whatever
// happens), then sends them buf.
static int tcp_serve(int lfd, const void *buf, size_t n, int world, int port, uint64_t token, double timeout_s,
                     int *keep, ErrBuf *e) {
    double deadline = now_seconds() + timeout_s;
    struct rlimit rl;  // rank 0 holds one socket per rank until everyone has arrived
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < (rlim_t)world + 64) {
        rl.rlim_cur = rl.rlim_max < (rlim_t)world + 64 ? rl.rlim_max : (rlim_t)world + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
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
    for (int r = 1; r < world; r++) {
        if (keep && !rc) keep[r] = peer[r];  // the host transport keeps them
        else if (peer[r] >= 0) close(peer[r]);
    }
    free(peer);
    close(lfd);
    return rc;
}

// Other ranks: connect to rank 0 (retrying while it is not listening yet), say hello, receive.
static int tcp_fetch(void *buf, size_t n, int rank, int world, const char *addr, int port, uint64_t token,
                     double timeout_s, int *keep_fd, ErrBuf *e) {
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
            comm_sleep_s(left < 0.1 ? left : 0.1);
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
    if (keep_fd && !rc) *keep_fd = fd;  // the host transport keeps it
    else close(fd);
    if (rc) return errf(e, "rank %d: receiving the id from rank 0 at %s:%d failed (%s)", rank, addr, port,
                        rc == -2 ? "timed out" : "connection closed");
    return 0;
}

int comm_tcp_broadcast(void *buf, size_t n, int rank, int world, const char *addr, int port,
                       uint64_t job_token, double timeout_s, ErrBuf *e) {
    if (world <= 1) return 0;
    if (rank < 0 || rank >= world) return errf(e, "comm_tcp_broadcast: rank %d out of range for world %d", rank, world);
    if (rank == 0) {
        int lfd = tcp_listen(addr, port, world, 0, NULL, e);
        return lfd < 0 ? -1 : tcp_serve(lfd, buf, n, world, port, job_token, timeout_s, NULL, e);
    }
    return tcp_fetch(buf, n, rank, world, addr, port, job_token, timeout_s, NULL, e);
}

// ---------------------------------------------------------------------------------------------
// The host transport. Each message: a 24-byte header (magic, operation, sequence number, payload
// bytes; native byte order: the ranks of one job run the same binary on the same kind of host),
// then the payload.
#define HOST_MAGIC 0x54474848u  // "TGHH"
enum { OP_ALLREDUCE_SUM = 1, OP_ALLREDUCE_MAX, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST };
static const char *op_name(uint32_t op) {
    switch (op) {
    case OP_ALLREDUCE_SUM: return "all-reduce";
    case OP_ALLREDUCE_MAX: return "agreement (max)";
    case OP_REDUCE_SCATTER: return "reduce-scatter";
    case OP_ALLGATHER: return "all-gather";
    case OP_BROADCAST: return "broadcast";
    default: return "unknown collective";
    }
}

typedef struct { uint32_t magic, op; uint64_t seq, nbytes; } HostHdr;

// What one collective is, for its messages: "all-reduce #12 of 4096 bytes".
typedef struct { uint32_t op; uint64_t seq, nbytes; char what[96]; } HostOp;

static HostOp host_op(Comm *c, uint32_t op, size_t nbytes) {
    HostOp h = {op, ++c->host_seq, nbytes, ""};
    snprintf(h.what, sizeof h.what, "%s #%llu of %zu bytes", op_name(op), (unsigned long long)h.seq, nbytes);
    return h;
}

void comm_host_close(Comm *c) {
    if (!c->host_fds) return;
    for (int r = 0; r < c->world; r++)
        if (c->host_fds[r] >= 0) close(c->host_fds[r]);
    free(c->host_fds);
    c->host_fds = NULL;
    free(c->host_scratch_buf);
    c->host_scratch_buf = NULL;
    c->host_scratch_bytes = 0;
}

// Ends the transport after a failure: closing every socket makes the other ranks fail at once.
static int host_fail(Comm *c, const HostOp *h, const char *cause, ErrBuf *e) {
    comm_host_close(c);
    c->failed = 1;
    return errf(e, "rank %d of %d: %s: %s", c->rank, c->world, h->what, cause);
}

// The peer's side of a failed io_full (rc -1: closed or broken, -2: deadline), as a message.
static int io_fail(Comm *c, const HostOp *h, int rc, int peer, ErrBuf *e) {
    char cause[400];
    if (rc == -2)
        snprintf(cause, sizeof cause, "rank %d sent or took nothing within %g s: it hangs, is far behind, or died "
                                      "without closing its connection (raise train.comm_timeout_s if it is only slow)",
                 peer, c->timeout_s);
    else
        snprintf(cause, sizeof cause, "rank %d closed the connection: it died or stopped after an error (see its "
                                      "messages)", peer);
    return host_fail(c, h, cause, e);
}

static int host_send(Comm *c, const HostOp *h, int peer, const void *buf, size_t n, ErrBuf *e) {
    int fd = c->host_fds[peer];
    HostHdr hd = {HOST_MAGIC, h->op, h->seq, n};
    int rc = io_full(fd, &hd, sizeof hd, 1, now_seconds() + c->timeout_s);
    if (!rc && n) rc = io_full(fd, (void *)buf, n, 1, now_seconds() + c->timeout_s);
    return rc ? io_fail(c, h, rc, peer, e) : 0;
}

// Receives the header of h's message from peer and checks it is that message.
static int host_recv_hdr(Comm *c, const HostOp *h, int peer, size_t n, ErrBuf *e) {
    HostHdr hd;
    int rc = io_full(c->host_fds[peer], &hd, sizeof hd, 0, now_seconds() + c->timeout_s);
    if (rc) return io_fail(c, h, rc, peer, e);
    if (hd.magic != HOST_MAGIC || hd.op != h->op || hd.seq != h->seq || hd.nbytes != n) {
        char cause[400];
        snprintf(cause, sizeof cause, "rank %d is at another collective (%s #%llu of %llu bytes): the ranks disagree "
                                      "about the program (different configs or versions?)",
                 peer, hd.magic == HOST_MAGIC ? op_name(hd.op) : "garbage", (unsigned long long)hd.seq,
                 (unsigned long long)hd.nbytes);
        return host_fail(c, h, cause, e);
    }
    return 0;
}

static int host_recv(Comm *c, const HostOp *h, int peer, void *buf, size_t n, ErrBuf *e) {
    if (host_recv_hdr(c, h, peer, n, e)) return -1;
    int rc = n ? io_full(c->host_fds[peer], buf, n, 0, now_seconds() + c->timeout_s) : 0;
    return rc ? io_fail(c, h, rc, peer, e) : 0;
}

static void *host_scratch(Comm *c, size_t bytes) {
    if (c->host_scratch_bytes < bytes) {
        free(c->host_scratch_buf);
        c->host_scratch_buf = xmalloc(bytes);
        c->host_scratch_bytes = bytes;
    }
    return c->host_scratch_buf;
}

static size_t host_dtype_size(CommDtype t) { return t == COMM_F64 ? 8 : t == COMM_U8 ? 1 : 4; }

// acc[i] = acc[i] (op) in[i] for n values of type t.
static void combine(void *acc, const void *in, size_t n, CommDtype t, uint32_t op) {
    if (t == COMM_F32) {
        float *a = acc;
        const float *b = in;
        if (op == OP_ALLREDUCE_MAX) for (size_t i = 0; i < n; i++) a[i] = a[i] > b[i] ? a[i] : b[i];
        else for (size_t i = 0; i < n; i++) a[i] += b[i];
    } else if (t == COMM_F64) {
        double *a = acc;
        const double *b = in;
        if (op == OP_ALLREDUCE_MAX) for (size_t i = 0; i < n; i++) a[i] = a[i] > b[i] ? a[i] : b[i];
        else for (size_t i = 0; i < n; i++) a[i] += b[i];
    } else {
        int32_t *a = acc;
        const int32_t *b = in;
        if (op == OP_ALLREDUCE_MAX) for (size_t i = 0; i < n; i++) a[i] = a[i] > b[i] ? a[i] : b[i];
        else for (size_t i = 0; i < n; i++) a[i] += b[i];
    }
}

// Rank 0: acc (count values) (op)= every other rank's message, in rank order, a chunk at a time.
static int root_gather_combine(Comm *c, const HostOp *h, void *acc, size_t count, CommDtype t, ErrBuf *e) {
    const size_t es = host_dtype_size(t), chunk = ((size_t)1 << 20) / es;  // 1 MiB pieces
    void *tmp = host_scratch(c, (count < chunk ? count : chunk) * es + 1);
    for (int r = 1; r < c->world; r++) {
        if (host_recv_hdr(c, h, r, count * es, e)) return -1;
        for (size_t i = 0; i < count; i += chunk) {
            size_t k = count - i < chunk ? count - i : chunk;
            int rc = io_full(c->host_fds[r], tmp, k * es, 0, now_seconds() + c->timeout_s);
            if (rc) return io_fail(c, h, rc, r, e);
            combine((char *)acc + i * es, tmp, k, t, h->op);
        }
    }
    return 0;
}

static int host_usable(Comm *c, CommDtype t, const char *what, ErrBuf *e) {
    if (c->failed) return errf(e, "rank %d: %s after an earlier communication failure", c->rank, what);
    if (!c->host_fds) return errf(e, "rank %d: %s: the host transport is not connected", c->rank, what);
    if (t == COMM_BF16) return errf(e, "rank %d: %s: the host transport has no BF16 arithmetic", c->rank, what);
    return 0;
}

static int host_allreduce_op(Comm *c, void *buf, size_t count, CommDtype t, uint32_t op, ErrBuf *e) {
    if (host_usable(c, t, op_name(op), e)) return -1;
    const size_t bytes = count * host_dtype_size(t);
    HostOp h = host_op(c, op, bytes);
    if (c->rank != 0) return host_send(c, &h, 0, buf, bytes, e) || host_recv(c, &h, 0, buf, bytes, e) ? -1 : 0;
    if (root_gather_combine(c, &h, buf, count, t, e)) return -1;
    for (int r = 1; r < c->world; r++)
        if (host_send(c, &h, r, buf, bytes, e)) return -1;
    return 0;
}

int comm_host_allreduce(Comm *c, void *buf, size_t count, CommDtype t, ErrBuf *e) {
    return host_allreduce_op(c, buf, count, t, OP_ALLREDUCE_SUM, e);
}

int comm_host_max_int(Comm *c, int v, int *out, const char *what, ErrBuf *e) {
    int32_t x = v;
    if (host_allreduce_op(c, &x, 1, COMM_I32, OP_ALLREDUCE_MAX, e)) return -1;
    *out = x;
    return 0;
}

int comm_host_reduce_scatter(Comm *c, const void *send, void *recv, size_t recv_count, CommDtype t, ErrBuf *e) {
    if (host_usable(c, t, "reduce-scatter", e)) return -1;
    const size_t es = host_dtype_size(t), part = recv_count * es, full = part * (size_t)c->world;
    HostOp h = host_op(c, OP_REDUCE_SCATTER, full);
    if (c->rank != 0) {
        if (host_send(c, &h, 0, send, full, e)) return -1;
        h.nbytes = part;  // the answer: this rank's part
        return host_recv(c, &h, 0, recv, part, e);
    }
    // The sum needs a buffer of its own (recv may lie inside send); the incoming chunks come after it.
    void *acc = xmalloc(full + 1);
    memcpy(acc, send, full);
    int rc = root_gather_combine(c, &h, acc, recv_count * (size_t)c->world, t, e);
    h.nbytes = part;
    for (int r = 1; r < c->world && !rc; r++) rc = host_send(c, &h, r, (char *)acc + (size_t)r * part, part, e);
    if (!rc) memmove(recv, acc, part);
    free(acc);
    return rc;
}

int comm_host_allgather(Comm *c, const void *send, void *recv, size_t send_count, CommDtype t, ErrBuf *e) {
    if (host_usable(c, t, "all-gather", e)) return -1;
    const size_t part = send_count * host_dtype_size(t), full = part * (size_t)c->world;
    HostOp h = host_op(c, OP_ALLGATHER, part);
    if (c->rank != 0) {
        if (host_send(c, &h, 0, send, part, e)) return -1;
        h.nbytes = full;
        return host_recv(c, &h, 0, recv, full, e);
    }
    memmove(recv, send, part);
    for (int r = 1; r < c->world; r++)
        if (host_recv(c, &h, r, (char *)recv + (size_t)r * part, part, e)) return -1;
    h.nbytes = full;
    for (int r = 1; r < c->world; r++)
        if (host_send(c, &h, r, recv, full, e)) return -1;
    return 0;
}

int comm_host_broadcast(Comm *c, void *buf, size_t bytes, ErrBuf *e) {
    if (host_usable(c, COMM_U8, "broadcast", e)) return -1;
    HostOp h = host_op(c, OP_BROADCAST, bytes);
    if (c->rank != 0) return host_recv(c, &h, 0, buf, bytes, e);
    for (int r = 1; r < c->world; r++)
        if (host_send(c, &h, r, buf, bytes, e)) return -1;
    return 0;
}

int comm_host_connect(Comm *c, int listen_fd, ErrBuf *e) {
    if (c->rank == 0 && listen_fd < 0) {
        listen_fd = tcp_listen(c->master_addr, c->master_port, c->world, 0, NULL, e);
        if (listen_fd < 0) return -1;
    }
    c->host_fds = xmalloc(sizeof(int) * (size_t)c->world);
    for (int r = 0; r < c->world; r++) c->host_fds[r] = -1;
    c->host_seq = 0;
    uint64_t hello = c->job_token;  // the payload: nothing needed, but rank 0 checks its size
    int rc = c->rank == 0 ? tcp_serve(listen_fd, &hello, sizeof hello, c->world, c->master_port, c->job_token,
                                      c->timeout_s, c->host_fds, e)
                          : tcp_fetch(&hello, sizeof hello, c->rank, c->world, c->master_addr, c->master_port,
                                      c->job_token, c->timeout_s, &c->host_fds[0], e);
    if (rc) {
        comm_host_close(c);
        return -1;
    }
    int one = 1;
    for (int r = 0; r < c->world; r++)
        if (c->host_fds[r] >= 0) setsockopt(c->host_fds[r], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
}
