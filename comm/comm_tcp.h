// comm_tcp.h: comm's TCP side, private to comm.c and comm_tcp.c: the rendezvous at rank 0
// (comm_tcp_broadcast in comm.h is its public face) and the host transport: collectives on host
// memory over the rendezvous' connections, for data parallelism on the CPU backend (and for
// tests of the trainer's multi-process logic on machines without GPUs).
//
// Host transport: a star through rank 0. Rank r > 0 holds one socket to rank 0; rank 0 holds
// one per rank. A collective sends every rank's contribution to rank 0, which combines them in
// rank order 0, 1, 2, ... (so the result is deterministic and the same on every rank, and a sum
// over world 2 of a + b is the float a + b) and sends the result back. Every message carries an
// operation code, a sequence number and its byte count, so ranks that disagree about the
// sequence of collectives fail with a message instead of mixing buffers. Every wait has the
// deadline c->timeout_s: a dead peer (closed socket) fails at once, a hung one after the deadline,
// with a message naming the rank and the operation. After a failure the connections are closed
// (so the other ranks fail at once too) and c->failed is set.
#ifndef COMM_TCP_H
#define COMM_TCP_H

#include <stddef.h>  // size_t
#include <stdint.h>  // uint64_t

#include "comm/comm.h"  // Comm, CommDtype

void comm_sleep_s(double s);

// Rank 0's listening socket for the rendezvous under mpirun, where no MASTER_ADDR names it: on
// port (0: a free one, written to *bound_port) of every interface of host's address family, so
// that ranks on other nodes reach it by rank 0's host name even where that name resolves to a
// loopback address on rank 0's own node. The socket, or -1 with e filled.
int comm_tcp_listen_any(const char *host, int port, int world, int *bound_port, ErrBuf *e);

// The rendezvous keeping its connections for the host transport (c->rank, world, master
// address/port and job token already set). listen_fd: rank 0's socket from comm_tcp_listen_any
// (taken over and closed), or -1: rank 0 listens on master_addr:master_port itself. 0, or -1
// with e filled.
int comm_host_connect(Comm *c, int listen_fd, ErrBuf *e);
// Closes the host transport's sockets (safe when there are none).
void comm_host_close(Comm *c);

// Host collectives (c->host_fds set, world > 1); dtypes F32, F64, I32 (BF16 is refused).
int comm_host_allreduce(Comm *c, void *buf, size_t count, CommDtype t, ErrBuf *e);
int comm_host_reduce_scatter(Comm *c, const void *send, void *recv, size_t recv_count, CommDtype t, ErrBuf *e);
int comm_host_allgather(Comm *c, const void *send, void *recv, size_t send_count, CommDtype t, ErrBuf *e);
int comm_host_broadcast(Comm *c, void *buf, size_t bytes, ErrBuf *e);
int comm_host_max_int(Comm *c, int v, int *out, const char *what, ErrBuf *e);

#endif  // COMM_TCP_H
