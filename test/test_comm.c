// test_comm.c: the process group without a GPU: launcher detection and validation from the
// environment (torchrun-style, Slurm, mpirun, forced, single), the job token, single-process
// collectives, and the TCP exchange of the NCCL id between forked processes on 127.0.0.1 (all
// ranks get rank 0's bytes; a rank of another job is turned away; a missing rank 0 and a missing
// rank end in errors naming host:port and the count within the timeout), the host transport's
// collectives between 3 forked ranks (CPU data parallelism) and its dead-rank drill, the
// rendezvous on a free port at rank 0's host name (as under mpirun). Where two GPUs are
// present, it also runs NCCL collectives between two forked ranks and a dead-peer drill.
#include <arpa/inet.h>   // htonl, htons for the probe and stray sockets
#include <math.h>        // fabs, fmax: errors of the NCCL sums
#include <netinet/in.h>  // sockaddr_in
#include <signal.h>      // kill of stray children
#include <string.h>      // strstr, memcmp
#include <sys/mman.h>    // MAP_SHARED results written by forked ranks
#include <sys/socket.h>  // socket, bind: port probe, a port kept busy, a stray client
#include <sys/wait.h>    // waitpid
#include <unistd.h>      // fork, _exit, close

#include <cuda_runtime.h>  // the two-GPU section (device buffers)

#include "comm/comm.h"      // the module under test
#include "comm/comm_tcp.h"  // comm_tcp_listen_any, comm_host_connect: the rendezvous under mpirun
#include "test.h"       // CHECK

static const char *comm_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_NODES", "SLURM_NNODES",
    "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "TRAIN_GPT_LAUNCHER", "TRAIN_GPT_COMM_TIMEOUT_S",
    "TRAIN_GPT_JOB_ID", "TORCHELASTIC_RUN_ID", NULL};

static void clear_env(void) {
    for (int i = 0; comm_vars[i]; i++) unsetenv(comm_vars[i]);
}

// Sets NAME=VALUE pairs from a NULL-terminated list after clearing every launcher variable.
static void set_env(const char *const *kv) {
    clear_env();
    for (int i = 0; kv[i]; i += 2) setenv(kv[i], kv[i + 1], 1);
}

// comm_detect with the given environment; returns its status, fills c and e.
static int detect(const char *const *kv, Comm *c, ErrBuf *e) {
    set_env(kv);
    e->msg[0] = '\0';
    return comm_detect(c, NULL, e);
}

#define ENV(...) ((const char *const[]){__VA_ARGS__, NULL})

// An error whose message holds both fragments.
static int err_has(int rc, const ErrBuf *e, const char *a, const char *b) {
    return rc == -1 && strstr(e->msg, a) && (!b || strstr(e->msg, b));
}

static void test_env_launchers(void) {
    Comm c;
    ErrBuf e;
    int rc = detect(ENV("UNRELATED", "1"), &c, &e);
    CHECK(rc == 0 && c.launcher == COMM_SINGLE && c.world == 1 && c.rank == 0 && c.timeout_s == 60,
          "detect: no launcher -> single process, 60 s", "rc %d launcher %s world %d timeout %g (%s)", rc,
          comm_launcher_name(c.launcher), c.world, c.timeout_s, e.msg);

    rc = detect(ENV("RANK", "5", "WORLD_SIZE", "8", "LOCAL_RANK", "1", "LOCAL_WORLD_SIZE", "4", "MASTER_ADDR", "node0",
                    "MASTER_PORT", "29500"), &c, &e);
    CHECK(rc == 0 && c.launcher == COMM_ENV && c.rank == 5 && c.world == 8 && c.local_rank == 1 &&
              c.local_world == 4 && c.node_count == 2 && !strcmp(c.master_addr, "node0") && c.master_port == 29500,
          "detect: torchrun variables", "rc %d %s rank %d/%d local %d/%d nodes %d %s:%d (%s)", rc,
          comm_launcher_name(c.launcher), c.rank, c.world, c.local_rank, c.local_world, c.node_count,
          c.master_addr, c.master_port, e.msg);

    rc = detect(ENV("RANK", "2", "WORLD_SIZE", "3", "MASTER_ADDR", "h", "MASTER_PORT", "1234"), &c, &e);
    CHECK(rc == 0 && c.local_rank == 2 && c.local_world == 3 && c.node_count == 1,
          "detect: LOCAL_RANK defaults to RANK on one node", "rc %d local %d/%d (%s)", rc, c.local_rank, c.local_world, e.msg);

    rc = detect(ENV("RANK", "0", "WORLD_SIZE", "1"), &c, &e);
    CHECK(rc == 0 && c.launcher == COMM_ENV && c.world == 1, "detect: WORLD_SIZE=1 needs no MASTER_ADDR", "rc %d (%s)", rc, e.msg);

    rc = detect(ENV("RANK", "abc", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "1"), &c, &e);
    CHECK(err_has(rc, &e, "RANK='abc'", "not an integer"), "detect: RANK=abc is rejected by name", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("RANK", "1", "WORLD_SIZE", "2x", "MASTER_ADDR", "h", "MASTER_PORT", "1"), &c, &e);
    CHECK(err_has(rc, &e, "WORLD_SIZE='2x'", NULL), "detect: WORLD_SIZE=2x is rejected by name", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("RANK", "3", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "1"), &c, &e);
    CHECK(err_has(rc, &e, "RANK=3", "WORLD_SIZE=2"), "detect: RANK >= WORLD_SIZE names both", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("RANK", "-1", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "1"), &c, &e);
    CHECK(err_has(rc, &e, "RANK=-1", "out of range"), "detect: negative RANK", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("RANK", "1", "WORLD_SIZE", "2", "MASTER_PORT", "29500"), &c, &e);
    CHECK(err_has(rc, &e, "MASTER_ADDR is not set", "WORLD_SIZE=2"), "detect: missing MASTER_ADDR", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "h"), &c, &e);
    CHECK(err_has(rc, &e, "MASTER_PORT is not set", NULL), "detect: missing MASTER_PORT", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "70000"), &c, &e);
    CHECK(err_has(rc, &e, "MASTER_PORT=70000", "1..65535"), "detect: MASTER_PORT out of range", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("RANK", "1"), &c, &e);
    CHECK(err_has(rc, &e, "RANK is set but WORLD_SIZE is not", NULL), "detect: RANK without WORLD_SIZE", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("RANK", "1", "WORLD_SIZE", "4", "LOCAL_RANK", "2", "LOCAL_WORLD_SIZE", "2", "MASTER_ADDR", "h",
                    "MASTER_PORT", "1"), &c, &e);
    CHECK(err_has(rc, &e, "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"), "detect: LOCAL_RANK >= LOCAL_WORLD_SIZE", "rc %d: %s", rc, e.msg);
}

static void test_slurm(void) {
    Comm c;
    ErrBuf e;
    int rc = detect(ENV("SLURM_PROCID", "13", "SLURM_NTASKS", "16", "SLURM_LOCALID", "5", "SLURM_JOB_ID", "123456",
                        "SLURM_STEP_NODELIST", "gpu-[003-004,010],cpu1", "SLURM_NTASKS_PER_NODE", "8",
                        "SLURM_STEP_NUM_NODES", "2"), &c, &e);
    CHECK(rc == 0 && c.launcher == COMM_SLURM && c.rank == 13 && c.world == 16 && c.local_rank == 5 &&
              c.local_world == 8 && c.node_count == 2 && !strcmp(c.master_addr, "gpu-003") && c.master_port == 23456,
          "detect: srun variables, first host of the node list, port from the job id",
          "rc %d %s rank %d/%d local %d/%d nodes %d %s:%d (%s)", rc, comm_launcher_name(c.launcher), c.rank, c.world,
          c.local_rank, c.local_world, c.node_count, c.master_addr, c.master_port, e.msg);

    static const char *lists[][2] = {{"node7", "node7"}, {"n[12-13]", "n12"}, {"a1,b2", "a1"}, {"r[2,5]x,q", "r2x"}};
    for (int i = 0; i < 4; i++) {
        rc = detect(ENV("SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_LOCALID", "0", "SLURM_JOB_ID", "7",
                        "SLURM_JOB_NODELIST", lists[i][0]), &c, &e);
        char name[96];
        snprintf(name, sizeof name, "detect: first host of %s is %s", lists[i][0], lists[i][1]);
        CHECK(rc == 0 && !strcmp(c.master_addr, lists[i][1]) && c.master_port == 20007, name,
              "rc %d got '%s':%d (%s)", rc, c.master_addr, c.master_port, e.msg);
    }

    rc = detect(ENV("SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_LOCALID", "1", "SLURM_JOB_ID", "7",
                    "SLURM_JOB_NODELIST", "n[1-2]", "MASTER_ADDR", "10.0.0.9", "MASTER_PORT", "31000"), &c, &e);
    CHECK(rc == 0 && !strcmp(c.master_addr, "10.0.0.9") && c.master_port == 31000,
          "detect: MASTER_ADDR/MASTER_PORT override Slurm's defaults", "rc %d %s:%d (%s)", rc, c.master_addr, c.master_port, e.msg);

    rc = detect(ENV("SLURM_PROCID", "16", "SLURM_NTASKS", "16", "SLURM_LOCALID", "0"), &c, &e);
    CHECK(err_has(rc, &e, "SLURM_PROCID=16", "SLURM_NTASKS=16"), "detect: SLURM_PROCID out of range", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_LOCALID", "1", "SLURM_JOB_ID", "7"), &c, &e);
    CHECK(err_has(rc, &e, "MASTER_ADDR is not set", NULL), "detect: Slurm without a node list needs MASTER_ADDR", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_LOCALID", "x"), &c, &e);
    CHECK(err_has(rc, &e, "SLURM_LOCALID='x'", NULL), "detect: SLURM_LOCALID=x", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("SLURM_PROCID", "0", "SLURM_NTASKS", "1"), &c, &e);
    CHECK(rc == 0 && c.launcher == COMM_SLURM && c.world == 1, "detect: srun -n 1 is a world of 1", "rc %d (%s)", rc, e.msg);

    rc = detect(ENV("SLURM_PROCID", "0", "SLURM_NTASKS", "4", "SLURM_LOCALID", "0", "RANK", "1", "WORLD_SIZE", "2",
                    "MASTER_ADDR", "h", "MASTER_PORT", "5"), &c, &e);
    CHECK(rc == 0 && c.launcher == COMM_ENV && c.rank == 1 && c.world == 2,
          "detect: explicit RANK/WORLD_SIZE win over Slurm's", "rc %d %s (%s)", rc, comm_launcher_name(c.launcher), e.msg);
}

static void test_mpi_forced_timeout_token(void) {
    Comm c;
    ErrBuf e;
    int rc = detect(ENV("OMPI_COMM_WORLD_SIZE", "4", "OMPI_COMM_WORLD_RANK", "1"), &c, &e);
#ifdef USE_MPI
    CHECK(rc == 0 && c.launcher == COMM_MPI, "detect: mpirun (built with MPI)", "rc %d %s (%s)", rc, comm_launcher_name(c.launcher), e.msg);
#else
    CHECK(err_has(rc, &e, "built without MPI", "OMPI_COMM_WORLD_SIZE"), "detect: mpirun without MPI names the fix", "rc %d: %s", rc, e.msg);
    rc = detect(ENV("OMPI_COMM_WORLD_SIZE", "1"), &c, &e);
    CHECK(rc == 0 && c.launcher == COMM_SINGLE, "detect: mpirun -np 1 without MPI is a single process", "rc %d: %s", rc, e.msg);
#endif
    unsetenv("OMPI_COMM_WORLD_RANK");

    rc = detect(ENV("TRAIN_GPT_LAUNCHER", "pmi"), &c, &e);
    CHECK(err_has(rc, &e, "TRAIN_GPT_LAUNCHER='pmi'", "single, mpi, slurm, env"), "detect: unknown TRAIN_GPT_LAUNCHER", "rc %d: %s", rc, e.msg);
    rc = detect(ENV("TRAIN_GPT_LAUNCHER", "single", "SLURM_PROCID", "3", "SLURM_NTASKS", "8"), &c, &e);
    CHECK(rc == 0 && c.launcher == COMM_SINGLE && c.world == 1, "detect: TRAIN_GPT_LAUNCHER=single ignores Slurm", "rc %d: %s", rc, e.msg);

    rc = detect(ENV("TRAIN_GPT_COMM_TIMEOUT_S", "2.5"), &c, &e);
    CHECK(rc == 0 && c.timeout_s == 2.5, "detect: TRAIN_GPT_COMM_TIMEOUT_S", "rc %d timeout %g", rc, c.timeout_s);
    rc = detect(ENV("TRAIN_GPT_COMM_TIMEOUT_S", "soon"), &c, &e);
    CHECK(err_has(rc, &e, "TRAIN_GPT_COMM_TIMEOUT_S='soon'", NULL), "detect: bad timeout", "rc %d: %s", rc, e.msg);
    set_env(ENV("X", "1"));
    CommOptions o;
    comm_options_default(&o);
    o.timeout_s = 7;
    comm_detect(&c, &o, &e);
    CHECK(c.timeout_s == 7, "detect: timeout from the options", "got %g", c.timeout_s);

    // Job tokens: equal for equal inputs, different when the config digest or the job differ.
    uint64_t t[4];
    const char *digest[4] = {"cfg-a", "cfg-a", "cfg-b", "cfg-a"};
    const char *job[4] = {"11", "11", "11", "12"};
    for (int i = 0; i < 4; i++) {
        set_env(ENV("SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_LOCALID", "0", "SLURM_JOB_NODELIST", "n1",
                    "SLURM_JOB_ID", job[i]));
        o.job_token = digest[i];
        comm_detect(&c, &o, &e);
        t[i] = c.job_token;
    }
    CHECK(t[0] == t[1] && t[0] != t[2] && t[0] != t[3] && t[2] != t[3], "job token: same job same token, else different",
          "%llx %llx %llx %llx", (unsigned long long)t[0], (unsigned long long)t[1], (unsigned long long)t[2],
          (unsigned long long)t[3]);
}

static void test_single_process(void) {
    clear_env();
    Comm c;
    ErrBuf e = {""};
    int rc = comm_init(&c, NULL, &e);
    float host[4] = {1.5f, -2.f, 3.25f, 7.f};  // world 1: no CUDA call may touch these host values
    int any = -1;
    int rc2 = comm_allreduce_sum_f32(&c, host, 4, &e) | comm_barrier(&c, &e) | comm_any(&c, 1, &any, &e) |
              comm_reduce_scatter(&c, host, host, 4, COMM_F32, &e) | comm_allgather(&c, host, host, 4, COMM_F32, &e);
    CHECK(rc == 0 && rc2 == 0 && c.world == 1 && c.nccl == NULL && host[0] == 1.5f && host[3] == 7.f && any == 1,
          "init: a single process needs nothing; collectives are identities", "rc %d %d world %d any %d (%s)", rc, rc2,
          c.world, any, e.msg);
    comm_any(&c, 0, &any, &e);
    CHECK(any == 0, "comm_any: world 1 returns the local flag", "any %d", any);
    comm_destroy(&c);

    set_env(ENV("RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", "29999"));
    CommOptions o;
    comm_options_default(&o);
    o.init_nccl = 0;
    rc = comm_init(&c, &o, &e);
    rc2 = comm_allreduce_sum_f32(&c, host, 4, &e);
    CHECK(rc == 0 && c.rank == 1 && c.world == 2 && rc2 == -1 && strstr(e.msg, "no NCCL communicator"),
          "init: ranks only (init_nccl 0); a collective then says why it cannot run", "rc %d %d: %s", rc, rc2, e.msg);
    comm_destroy(&c);
    clear_env();
}

// ---------------------------------------------------------------------------------------------
// The TCP exchange between forked ranks. Each rank writes its outcome to shared memory.

typedef struct {
    int rc, ran;
    double seconds;
    uint64_t hash;  // FNV-1a of the bytes it ended with
    char msg[1024];
} RankResult;

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static unsigned long long rng_state;
static unsigned next_rand(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (unsigned)(rng_state >> 11);
}

// A port in 20000..59999 that can be bound on 127.0.0.1 now.
static int pick_port(void) {
    for (int tries = 0; tries < 200; tries++) {
        int port = 20000 + (int)(next_rand() % 40000);
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in sa = {0};
        sa.sin_family = AF_INET, sa.sin_port = htons((uint16_t)port), sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        close(fd);
        if (ok) return port;
    }
    return 0;
}

typedef struct {
    int present;     // 0: this rank is never started
    int world;       // the world size it believes in
    uint64_t token;  // its job token
} RankPlan;

// Runs world ranks (those present) of comm_tcp_broadcast; rank 0 sends payload (n bytes), the
// others start from zeros. Returns the shared results (munmap by the caller).
static RankResult *run_exchange(const RankPlan *plan, int world, int port, const unsigned char *payload, size_t n,
                                double timeout_s) {
    RankResult *res = mmap(NULL, sizeof(RankResult) * (size_t)world, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(res, 0, sizeof(RankResult) * (size_t)world);
    pid_t pids[16];
    for (int r = 0; r < world; r++) {
        pids[r] = -1;
        if (!plan[r].present) continue;
        fflush(stdout);
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm((unsigned)(timeout_s * 3 + 5));  // a safety net: no test may hang
            unsigned char *buf = calloc(n, 1);
            if (r == 0) memcpy(buf, payload, n);
            ErrBuf e = {""};
            double t0 = now_seconds();
            res[r].rc = comm_tcp_broadcast(buf, n, r, plan[r].world, "127.0.0.1", port, plan[r].token, timeout_s, &e);
            res[r].seconds = now_seconds() - t0;
            res[r].hash = hash_bytes(buf, n);
            snprintf(res[r].msg, sizeof res[r].msg, "%s", e.msg);
            res[r].ran = 1;
            _exit(0);
        }
    }
    for (int r = 0; r < world; r++)
        if (pids[r] > 0) waitpid(pids[r], NULL, 0);
    return res;
}

static void test_tcp_exchange(void) {
    const uint64_t token = 0x5eed5eed12345678ull;
    char name[128];

    // World 3 and world 5 (with a 300 KB payload, many partial sends): everyone gets rank 0's bytes.
    for (int round = 0; round < 2; round++) {
        int world = round ? 5 : 3;
        size_t n = round ? 300000 : 128;
        unsigned char *payload = malloc(n);
        for (size_t i = 0; i < n; i++) payload[i] = (unsigned char)next_rand();
        RankPlan plan[5];
        for (int r = 0; r < world; r++) plan[r] = (RankPlan){1, world, token};
        int port = pick_port();
        RankResult *res = run_exchange(plan, world, port, payload, n, 5);
        uint64_t want = hash_bytes(payload, n);
        int all = 1;
        double slowest = 0;
        for (int r = 0; r < world; r++) {
            all &= res[r].ran && res[r].rc == 0 && res[r].hash == want;
            if (res[r].seconds > slowest) slowest = res[r].seconds;
        }
        snprintf(name, sizeof name, "tcp: world %d, %zu bytes: every rank gets rank 0's bytes", world, n);
        CHECK(all && slowest < 3, name, "rank 1 rc %d hash %llx want %llx slowest %.2f s: %s / %s", res[1].rc,
              (unsigned long long)res[1].hash, (unsigned long long)want, slowest, res[0].msg, res[1].msg);
        munmap(res, sizeof(RankResult) * (size_t)world);
        free(payload);
    }

    // A stray connection that sends junk is turned away; the exchange still completes.
    {
        unsigned char payload[128];
        for (int i = 0; i < 128; i++) payload[i] = (unsigned char)next_rand();
        int port = pick_port();
        pid_t stray = fork();
        if (stray == 0) {  // connects first (retrying until rank 0 listens), sends 32 zero bytes
            for (int i = 0; i < 200; i++) {
                int fd = socket(AF_INET, SOCK_STREAM, 0);
                struct sockaddr_in sa = {0};
                sa.sin_family = AF_INET, sa.sin_port = htons((uint16_t)port), sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
                    char junk[32] = {0};
                    send(fd, junk, sizeof junk, MSG_NOSIGNAL);
                    usleep(200000);
                    _exit(0);
                }
                close(fd);
                usleep(5000);
            }
            _exit(1);
        }
        usleep(20000);
        RankPlan plan[2] = {{1, 2, token}, {1, 2, token}};
        RankResult *res = run_exchange(plan, 2, port, payload, 128, 5);
        waitpid(stray, NULL, 0);
        CHECK(res[0].rc == 0 && res[1].rc == 0 && res[1].hash == hash_bytes(payload, 128),
              "tcp: a stray connection sending junk does not disturb the exchange", "rc %d %d: %s / %s", res[0].rc,
              res[1].rc, res[0].msg, res[1].msg);
        munmap(res, sizeof(RankResult) * 2);
    }

    unsigned char id[128];
    for (int i = 0; i < 128; i++) id[i] = (unsigned char)next_rand();

    // A rank of another job (token) or with another world size is turned away at once; rank 0
    // keeps waiting for the right rank 2, then gives up naming the count and the reason.
    {
        RankPlan plan[3] = {{1, 3, token}, {1, 3, token}, {1, 3, token ^ 1}};
        int port = pick_port();
        RankResult *res = run_exchange(plan, 3, port, id, 128, 1.5);
        CHECK(res[2].rc == -1 && strstr(res[2].msg, "another job") && res[2].seconds < 1.0,
              "tcp: a rank with another job token is turned away at once", "rc %d after %.2f s: %s", res[2].rc,
              res[2].seconds, res[2].msg);
        CHECK(res[0].rc == -1 && strstr(res[0].msg, "only 2 of 3 ranks") && strstr(res[0].msg, "missing ranks: 2") &&
                  strstr(res[0].msg, "another job"),
              "tcp: rank 0 reports the count, the missing rank and the turned-away one", "rc %d: %s", res[0].rc, res[0].msg);
        munmap(res, sizeof(RankResult) * 3);

        RankPlan plan2[2] = {{1, 2, token}, {1, 3, token}};
        port = pick_port();
        res = run_exchange(plan2, 2, port, id, 128, 1.0);
        CHECK(res[1].rc == -1 && strstr(res[1].msg, "world size 2") && strstr(res[1].msg, "WORLD_SIZE"),
              "tcp: ranks disagreeing about the world size", "rc %d: %s", res[1].rc, res[1].msg);
        munmap(res, sizeof(RankResult) * 2);
    }

    // Rank 0 never starts: the others give up within the timeout, naming host:port.
    {
        RankPlan plan[3] = {{0, 3, token}, {1, 3, token}, {1, 3, token}};
        int port = pick_port();
        RankResult *res = run_exchange(plan, 3, port, id, 128, 2.0);
        char where[64];
        snprintf(where, sizeof where, "127.0.0.1:%d", port);
        int ok = 1;
        for (int r = 1; r < 3; r++)
            ok &= res[r].rc == -1 && strstr(res[r].msg, where) && res[r].seconds >= 1.9 && res[r].seconds < 2.6;
        CHECK(ok, "tcp: no rank 0 -> the others time out in 2 s naming host:port", "rc %d after %.2f s: %s",
              res[1].rc, res[1].seconds, res[1].msg);
        munmap(res, sizeof(RankResult) * 3);
    }

    // Rank 2 never starts: rank 0 gives up in time naming how many arrived; rank 1 is told why.
    {
        RankPlan plan[3] = {{1, 3, token}, {1, 3, token}, {0, 3, token}};
        int port = pick_port();
        RankResult *res = run_exchange(plan, 3, port, id, 128, 1.5);
        CHECK(res[0].rc == -1 && strstr(res[0].msg, "only 2 of 3 ranks") && strstr(res[0].msg, "missing ranks: 2") &&
                  res[0].seconds >= 1.4 && res[0].seconds < 2.1,
              "tcp: a rank that never comes -> rank 0 times out naming the count", "rc %d after %.2f s: %s", res[0].rc,
              res[0].seconds, res[0].msg);
        CHECK(res[1].rc == -1 && strstr(res[1].msg, "gave up") && strstr(res[1].msg, "2 of 3") && res[1].seconds < 2.6,
              "tcp: the ranks that came learn that rank 0 gave up", "rc %d after %.2f s: %s", res[1].rc, res[1].seconds,
              res[1].msg);
        munmap(res, sizeof(RankResult) * 3);
    }

    // The port is taken: rank 0 says so at once, naming MASTER_PORT.
    {
        int port = pick_port();
        int busy = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {0};
        sa.sin_family = AF_INET, sa.sin_port = htons((uint16_t)port), sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int held = bind(busy, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(busy, 1) == 0;
        ErrBuf e = {""};
        double t0 = now_seconds();
        int rc = comm_tcp_broadcast(id, 128, 0, 2, "127.0.0.1", port, token, 2, &e);
        CHECK(held && rc == -1 && strstr(e.msg, "MASTER_PORT") && strstr(e.msg, "in use") && now_seconds() - t0 < 0.5,
              "tcp: a busy port is reported at once", "held %d rc %d: %s", held, rc, e.msg);
        close(busy);
    }
}

// ---------------------------------------------------------------------------------------------
// Two GPUs: NCCL collectives between two forked ranks (env launcher over 127.0.0.1), then a
// dead-peer drill: rank 1 exits, rank 0's next all-reduce must fail within its timeout.

// ---------------------------------------------------------------------------------------------
// The host transport (CPU data parallelism) between 3 forked ranks: every collective against a
// reference computed here in the same rank order (so sums must match bit for bit), then a rank
// that dies: the others fail at their next collective, at once, naming it.

enum { H_ALLREDUCE, H_F64, H_RS, H_AG, H_BCAST, H_ANY, H_DEAD, H_N };
typedef struct {
    int rc[H_N], ok[H_N];
    double dead_seconds;
    char msg[H_N][512];
} HostResult;

#define H_WORLD 3
#define H_COUNT 100003  // per-rank slice of the reduce-scatter; odd, not a multiple of anything

static float host_value(int rank, size_t i, unsigned seed) {  // a fresh pseudo-random value in [-2, 2)
    uint64_t h = ((uint64_t)seed * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)rank << 40) ^ (uint64_t)i;
    h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33;
    return (float)((double)(h >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

static void host_rank(int rank, int port, unsigned seed, HostResult *out) {
    char rs[8], ps[8];
    snprintf(rs, sizeof rs, "%d", rank);
    snprintf(ps, sizeof ps, "%d", port);
    set_env(ENV("RANK", rs, "WORLD_SIZE", "3", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", ps));
    CommOptions o;
    comm_options_default(&o);
    o.init_nccl = 0, o.host_transport = 1, o.timeout_s = 5, o.job_token = "host transport test";
    Comm c;
    ErrBuf e = {""};
    if (comm_init(&c, &o, &e)) {
        for (int i = 0; i < H_N; i++) out->rc[i] = -1, snprintf(out->msg[i], sizeof out->msg[i], "init: %s", e.msg);
        return;
    }
    const size_t full = (size_t)H_WORLD * H_COUNT;
    float *x = malloc(full * sizeof(float)), *want = malloc(full * sizeof(float));
    for (size_t i = 0; i < full; i++) {
        x[i] = host_value(rank, i, seed);
        want[i] = host_value(0, i, seed);
        for (int r = 1; r < H_WORLD; r++) want[i] += host_value(r, i, seed);  // rank order, in float
    }
    // all-reduce in place
    out->rc[H_ALLREDUCE] = comm_allreduce_sum_f32(&c, x, full, &e);
    out->ok[H_ALLREDUCE] = !out->rc[H_ALLREDUCE] && !memcmp(x, want, full * sizeof(float));
    snprintf(out->msg[H_ALLREDUCE], 512, "%s", e.msg);
    // F64: one value
    double d = rank + 0.25, dwant = 0.25 + 1.25 + 2.25;
    out->rc[H_F64] = comm_allreduce_sum(&c, &d, 1, COMM_F64, &e);
    out->ok[H_F64] = !out->rc[H_F64] && d == dwant;
    snprintf(out->msg[H_F64], 512, "%s (got %g)", e.msg, d);
    // reduce-scatter in place: this rank's slice of the sums
    for (size_t i = 0; i < full; i++) x[i] = host_value(rank, i, seed);
    float *mine = x + (size_t)rank * H_COUNT;
    out->rc[H_RS] = comm_reduce_scatter(&c, x, mine, H_COUNT, COMM_F32, &e);
    out->ok[H_RS] = !out->rc[H_RS] && !memcmp(mine, want + (size_t)rank * H_COUNT, H_COUNT * sizeof(float));
    snprintf(out->msg[H_RS], 512, "%s", e.msg);
    // all-gather in place: every rank's slice (after the reduce-scatter: the full sums)
    out->rc[H_AG] = comm_allgather(&c, mine, x, H_COUNT, COMM_F32, &e);
    out->ok[H_AG] = !out->rc[H_AG] && !memcmp(x, want, full * sizeof(float));
    snprintf(out->msg[H_AG], 512, "%s", e.msg);
    // broadcast of rank 0's bytes
    unsigned char b[1000];
    for (int i = 0; i < 1000; i++) b[i] = rank == 0 ? (unsigned char)(i * 7 + seed) : 0;
    out->rc[H_BCAST] = comm_broadcast(&c, b, sizeof b, &e);
    out->ok[H_BCAST] = !out->rc[H_BCAST];
    for (int i = 0; i < 1000; i++) out->ok[H_BCAST] &= b[i] == (unsigned char)(i * 7 + seed);
    snprintf(out->msg[H_BCAST], 512, "%s", e.msg);
    // comm_any: only rank 2 raises its flag; then nobody; a barrier between
    int any1 = -1, any2 = -1;
    out->rc[H_ANY] = comm_any(&c, rank == 2, &any1, &e) | comm_barrier(&c, &e) | comm_any(&c, 0, &any2, &e);
    out->ok[H_ANY] = !out->rc[H_ANY] && any1 == 1 && any2 == 0;
    snprintf(out->msg[H_ANY], 512, "%s (any %d then %d)", e.msg, any1, any2);
    // rank 2 dies without a word; the others' next all-reduce fails at once
    if (rank == 2) _exit(0);
    double t0 = now_seconds();
    out->rc[H_DEAD] = comm_allreduce_sum_f32(&c, x, full, &e);
    out->dead_seconds = now_seconds() - t0;
    snprintf(out->msg[H_DEAD], 512, "%s", e.msg);
    out->ok[H_DEAD] = out->rc[H_DEAD] == -1 && c.failed &&
                      strstr(e.msg, rank == 0 ? "rank 2 closed" : "rank 0 closed the connection") && out->dead_seconds < 2;
    comm_destroy(&c);
    free(x);
    free(want);
}

static void test_host_transport(void) {
    HostResult *res = mmap(NULL, sizeof(HostResult) * H_WORLD, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(res, 0, sizeof(HostResult) * H_WORLD);
    int port = pick_port();
    unsigned seed = next_rand();
    pid_t pids[H_WORLD];
    for (int r = 0; r < H_WORLD; r++) {
        fflush(stdout);
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(20);  // a safety net: no test may hang
            host_rank(r, port, seed, &res[r]);
            _exit(0);
        }
    }
    for (int r = 0; r < H_WORLD; r++) waitpid(pids[r], NULL, 0);
    static const char *names[H_DEAD] = {
        "host: all-reduce of 300009 floats: every rank gets the rank-order float sum, bit for bit",
        "host: all-reduce of a double", "host: reduce-scatter in place: each rank its slice of the sums",
        "host: all-gather in place", "host: broadcast of rank 0's bytes", "host: comm_any and barrier"};
    for (int i = 0; i < H_DEAD; i++) {
        int ok = 1;
        for (int r = 0; r < H_WORLD; r++) ok &= res[r].ok[i];
        CHECK(ok, names[i], "rc %d %d %d: %s / %s / %s", res[0].rc[i], res[1].rc[i], res[2].rc[i], res[0].msg[i],
              res[1].msg[i], res[2].msg[i]);
    }
    CHECK(res[0].ok[H_DEAD], "host: a dead rank: rank 0's next collective fails at once, naming it", "after %.2f s: %s",
          res[0].dead_seconds, res[0].msg[H_DEAD]);
    CHECK(res[1].ok[H_DEAD], "host: a dead rank: the other ranks fail too (rank 0 closed)", "after %.2f s: %s",
          res[1].dead_seconds, res[1].msg[H_DEAD]);
    printf("# dead-rank drill (host transport): rank 0 said after %.3f s: %s\n", res[0].dead_seconds, res[0].msg[H_DEAD]);
    munmap(res, sizeof(HostResult) * H_WORLD);
}

// The rendezvous as the CPU backend runs it under mpirun (comm.c's mpi_host_connect, without MPI
// here): rank 0 listens on a free port of every interface and names its host; rank 1 connects to
// that host name and port; a collective then runs over the connections.
typedef struct { int rc, ok; char msg[512]; } AnyResult;

static void test_host_free_port(void) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    ErrBuf e = {""};
    int port = 0;
    int lfd = comm_tcp_listen_any(host, 0, 2, &port, &e);
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    int any = lfd >= 0 && getsockname(lfd, (struct sockaddr *)&sa, &len) == 0 &&
              ((sa.ss_family == AF_INET && ((struct sockaddr_in *)&sa)->sin_addr.s_addr == htonl(INADDR_ANY)) ||
               (sa.ss_family == AF_INET6 && !memcmp(&((struct sockaddr_in6 *)&sa)->sin6_addr, &in6addr_any, 16)));
    CHECK(lfd >= 0 && port > 0 && any, "host: rank 0 under mpirun listens on a free port of every interface",
          "fd %d port %d any %d (host '%s'): %s", lfd, port, any, host, e.msg);
    if (lfd < 0) return;
    AnyResult *res = mmap(NULL, sizeof(AnyResult) * 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(res, 0, sizeof(AnyResult) * 2);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        fflush(stdout);
        if ((pids[r] = fork()) == 0) {
            alarm(20);  // a safety net: no test may hang
            Comm c;
            memset(&c, 0, sizeof c);
            c.rank = r, c.world = 2, c.timeout_s = 5, c.master_port = port, c.job_token = 0x1234;
            snprintf(c.master_addr, sizeof c.master_addr, "%s", host);
            if (r != 0) close(lfd);
            ErrBuf ce = {""};
            float x[3] = {1.5f + (float)r, -2.0f, 0.25f * (float)r};
            res[r].rc = comm_host_connect(&c, r == 0 ? lfd : -1, &ce) || comm_allreduce_sum_f32(&c, x, 3, &ce);
            res[r].ok = !res[r].rc && x[0] == 4.0f && x[1] == -4.0f && x[2] == 0.25f;
            snprintf(res[r].msg, sizeof res[r].msg, "%s (%g %g %g)", ce.msg, x[0], x[1], x[2]);
            comm_host_close(&c);
            _exit(0);
        }
    }
    close(lfd);
    for (int r = 0; r < 2; r++) waitpid(pids[r], NULL, 0);
    CHECK(res[0].ok && res[1].ok, "host: ranks meet at rank 0's host name and free port; an all-reduce runs",
          "rc %d %d: %s / %s", res[0].rc, res[1].rc, res[0].msg, res[1].msg);
    munmap(res, sizeof(AnyResult) * 2);
}

static int gpu_count_in_child(void) {
    int *shared = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    *shared = 0;
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {  // CUDA must not be initialised in the parent, which forks the ranks later
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        *shared = n;
        _exit(0);
    }
    waitpid(p, NULL, 0);
    int n = *shared;
    munmap(shared, sizeof(int));
    return n;
}

enum { G_INIT, G_ALLREDUCE, G_RS, G_AG, G_AG_HOST, G_ANY, G_DEAD, G_N };
typedef struct {
    int rc[G_N];
    double err[G_N], seconds;
    char msg[G_N][512];
} GpuResult;

static void gpu_rank(int rank, int port, GpuResult *out) {
    char rs[8], ps[8];
    snprintf(rs, sizeof rs, "%d", rank);
    snprintf(ps, sizeof ps, "%d", port);
    set_env(ENV("RANK", rs, "WORLD_SIZE", "2", "LOCAL_RANK", rs, "LOCAL_WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1",
                "MASTER_PORT", ps));
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    CommOptions o;
    comm_options_default(&o);
    o.timeout_s = 20;
    Comm c;
    ErrBuf e = {""};
    for (int i = 0; i < G_N; i++) out->rc[i] = -9;
    out->rc[G_INIT] = comm_init(&c, &o, &e);
    snprintf(out->msg[G_INIT], 512, "%s", e.msg);
    if (out->rc[G_INIT]) return;

    // Every rank knows every rank's inputs (same seed), so each checks the sums itself.
    const size_t n = 1 << 16;  // (2 * n,) floats per rank
    float *in[2], *want = malloc(sizeof(float) * 2 * n), *got = malloc(sizeof(float) * 2 * n);
    for (int r = 0; r < 2; r++) {
        in[r] = malloc(sizeof(float) * 2 * n);
        rng_state = 0x9e3779b97f4a7c15ull + (unsigned long long)r;
        for (size_t i = 0; i < 2 * n; i++) in[r][i] = (float)(next_rand() % 2001) / 1000.0f - 1.0f;
    }
    for (size_t i = 0; i < 2 * n; i++) want[i] = in[0][i] + in[1][i];
    float *d, *d2;
    cudaMalloc((void **)&d, sizeof(float) * 2 * n);
    cudaMalloc((void **)&d2, sizeof(float) * 2 * n);

    cudaMemcpy(d, in[rank], sizeof(float) * 2 * n, cudaMemcpyHostToDevice);
    out->rc[G_ALLREDUCE] = comm_allreduce_sum_f32(&c, d, 2 * n, &e);
    cudaMemcpy(got, d, sizeof(float) * 2 * n, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < 2 * n; i++) out->err[G_ALLREDUCE] = fmax(out->err[G_ALLREDUCE], fabs(got[i] - want[i]));
    snprintf(out->msg[G_ALLREDUCE], 512, "%s", e.msg);

    // Reduce-scatter in place: this rank's half of the sum lands at d + rank * n.
    cudaMemcpy(d, in[rank], sizeof(float) * 2 * n, cudaMemcpyHostToDevice);
    out->rc[G_RS] = comm_reduce_scatter(&c, d, d + rank * n, n, COMM_F32, &e);
    cudaMemcpy(got, d + rank * n, sizeof(float) * n, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++) out->err[G_RS] = fmax(out->err[G_RS], fabs(got[i] - want[rank * n + i]));
    snprintf(out->msg[G_RS], 512, "%s", e.msg);

    // All-gather: every rank's first n inputs, by rank.
    cudaMemcpy(d2, in[rank], sizeof(float) * n, cudaMemcpyHostToDevice);
    out->rc[G_AG] = comm_allgather(&c, d2, d, n, COMM_F32, &e);
    cudaMemcpy(got, d, sizeof(float) * 2 * n, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < 2 * n; i++) out->err[G_AG] = fmax(out->err[G_AG], fabs(got[i] - in[i / n][i % n]));
    snprintf(out->msg[G_AG], 512, "%s", e.msg);

    // All-gather of host doubles, in place (ZeRO-1's slice norms): staged through the device.
    double hd[2] = {-1.0, -1.0};
    hd[rank] = 0.125 + rank;
    out->rc[G_AG_HOST] = comm_allgather(&c, hd + rank, hd, 1, COMM_F64, &e);
    out->err[G_AG_HOST] = fabs(hd[0] - 0.125) + fabs(hd[1] - 1.125);
    snprintf(out->msg[G_AG_HOST], 512, "%s (got %g %g)", e.msg, hd[0], hd[1]);

    int any0 = -1, any1 = -1;
    out->rc[G_ANY] = comm_barrier(&c, &e) | comm_any(&c, rank == 1, &any1, &e) | comm_any(&c, 0, &any0, &e);
    out->err[G_ANY] = (any1 == 1 && any0 == 0) ? 0 : 1;
    snprintf(out->msg[G_ANY], 512, "%s", e.msg);

    // The drill: rank 1 leaves without a word; rank 0's all-reduce must end within 3 s.
    if (rank == 1) _exit(0);
    c.timeout_s = 3;
    double t0 = now_seconds();
    out->rc[G_DEAD] = comm_allreduce_sum_f32(&c, d, 2 * n, &e);
    out->seconds = now_seconds() - t0;
    snprintf(out->msg[G_DEAD], 512, "%s", e.msg);
    comm_destroy(&c);
}

static void test_two_gpus(void) {
    int ngpu = gpu_count_in_child();
    if (ngpu < 2) {
        printf("# skipped: NCCL collectives between two ranks need 2 GPUs (%d here)\n", ngpu);
        return;
    }
    GpuResult *res = mmap(NULL, sizeof(GpuResult) * 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(res, 0, sizeof(GpuResult) * 2);
    int port = pick_port();
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        fflush(stdout);
        if ((pids[r] = fork()) == 0) {
            alarm(90);
            gpu_rank(r, port, &res[r]);
            _exit(0);
        }
    }
    for (int r = 0; r < 2; r++) waitpid(pids[r], NULL, 0);
    static const char *names[G_N] = {"nccl: init over the TCP exchange", "nccl: all-reduce sum matches the host sum",
                                     "nccl: reduce-scatter in place", "nccl: all-gather",
                                     "nccl: all-gather of host doubles in place (staged)", "nccl: barrier and comm_any"};
    for (int i = 0; i < G_DEAD; i++) {
        int ok = res[0].rc[i] == 0 && res[1].rc[i] == 0 && res[0].err[i] < 1e-5 && res[1].err[i] < 1e-5;
        CHECK(ok, names[i], "rc %d %d err %g %g: %s / %s", res[0].rc[i], res[1].rc[i], res[0].err[i], res[1].err[i],
              res[0].msg[i], res[1].msg[i]);
    }
    CHECK(res[0].rc[G_DEAD] == -1 && res[0].seconds < 6 && strstr(res[0].msg[G_DEAD], "all-reduce"),
          "nccl: a dead peer ends the next all-reduce with an error in time", "rc %d after %.2f s: %s", res[0].rc[G_DEAD],
          res[0].seconds, res[0].msg[G_DEAD]);
    printf("# dead-peer drill: rank 0 said after %.2f s: %s\n", res[0].seconds, res[0].msg[G_DEAD]);
    munmap(res, sizeof(GpuResult) * 2);
}

int main(void) {
    rng_state = 0x2545F4914F6CDD1Dull ^ ((unsigned long long)getpid() << 20) ^ (unsigned long long)(now_seconds() * 1e6);
    test_env_launchers();
    test_slurm();
    test_mpi_forced_timeout_token();
    test_single_process();
    test_tcp_exchange();
    test_host_transport();
    test_host_free_port();
    test_two_gpus();
    clear_env();
    return test_summary("test_comm");
}
