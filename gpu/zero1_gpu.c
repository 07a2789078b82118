// zero1_gpu.c: ZeRO-1 on the GPU backend (see zero1_gpu.h): NCCL collectives (comm.h) on the
// model's device buffers, copies on the model's stream. Host code: no kernels of its own.
#include "gpu/zero1_gpu.h"

#include <math.h>    // sqrt
#include <stdint.h>  // uint16_t (BF16 bits)
#include <string.h>  // memset

#include <cuda_runtime.h>  // the overlap's stream and events

#include "gpu/cuda_check.h"  // CUDA_CHECK

// W * S > P: the collectives need padding (see zero1_gpu.h).
static int uneven(const GpuModel *m) { return (size_t)m->shard_world * m->shard_len != m->table.total; }

static void check_layout(const GpuModel *m, const Comm *c, const char *what) {
    if (m->shard_world != c->world || m->shard_rank != c->rank)
        FATAL("%s: the model is sharded for rank %d of %d but this is rank %d of %d (hint: gpu_model_init_sharded "
              "with the communicator's rank and world)", what, m->shard_rank, m->shard_world, c->rank, c->world);
    // The uneven path keeps (W * S) BF16 values, or W * floor(P / W) FP32 values, in the (P) FP32
    // gradients: P >= W is enough for both.
    if (m->table.total < (size_t)c->world)
        FATAL("%s: %zu parameters for %d ranks: ZeRO-1 needs at least one per rank", what, m->table.total, c->world);
}

int zero1_gpu_sync_grads(GpuModel *m, Comm *c, int reduced, double *norm, ErrBuf *e) {
    check_layout(m, c, "zero1_gpu_sync_grads");
    const size_t P = m->table.total, S = m->shard_len, W = (size_t)c->world;
    float *g = gpu_model_grads_device(m);  // (P)
    // In place: this rank's summed slice lands at g + rank * S = g + shard_lo.
    int rc = reduced ? 0
             : uneven(m) ? comm_allreduce_sum_f32(c, g, P, e)
                         : comm_reduce_scatter(c, g, g + m->shard_lo, S, COMM_F32, e);
    if (rc) return -1;
    double *sums = (double *)xcalloc(W, sizeof(double));  // (W) every rank's slice sum of squares
    sums[c->rank] = gpu_model_grad_sumsq(m, m->shard_lo, m->shard_hi);
    if (comm_allgather(c, sums + c->rank, sums, 1, COMM_F64, e)) {
        free(sums);
        return -1;
    }
    double s = 0.0;
    for (size_t r = 0; r < W; r++) s += sums[r];  // rank order, as zero1_gpu_full_norm and the CPU add them
    free(sums);
    *norm = sqrt(s);
    return 0;
}

int zero1_gpu_step(GpuModel *m, Comm *c, double lr, double clip, const TrainConfig *tc, ErrBuf *e) {
    check_layout(m, c, "zero1_gpu_step");
    const size_t P = m->table.total, S = m->shard_len, n = m->shard_hi - m->shard_lo, r = (size_t)c->rank;
    gpu_model_step_slice(m, lr, clip, tc);  // masters, moments and BF16 weights of [lo, hi)
    uint16_t *w = gpu_model_weights_device(m);  // (P) BF16
    if (!uneven(m)) return comm_allgather(c, w + m->shard_lo, w, S, COMM_BF16, e);  // in place
    // (W * S) BF16 values in the (P) FP32 gradients, which the step has consumed: 2 W S <= 4 P bytes.
    cudaStream_t s = (cudaStream_t)gpu_model_stream(m);
    uint16_t *buf = (uint16_t *)gpu_model_grads_device(m);
    CUDA_CHECK(cudaMemcpyAsync(buf + r * S, w + m->shard_lo, sizeof(uint16_t) * n, cudaMemcpyDeviceToDevice, s));
    if (S > n) CUDA_CHECK(cudaMemsetAsync(buf + r * S + n, 0, sizeof(uint16_t) * (S - n), s));
    if (comm_allgather(c, buf + r * S, buf, S, COMM_BF16, e)) return -1;
    CUDA_CHECK(cudaMemcpyAsync(w, buf, sizeof(uint16_t) * P, cudaMemcpyDeviceToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return 0;
}

int zero1_gpu_gather_state(GpuModel *m, Comm *c, float *params, float *adam_m, float *adam_v, ErrBuf *e) {
    check_layout(m, c, "zero1_gpu_gather_state");
    const size_t P = m->table.total, S = m->shard_len, W = (size_t)c->world, r = (size_t)c->rank;
    cudaStream_t s = (cudaStream_t)gpu_model_stream(m);
    float *g = gpu_model_grads_device(m);  // (P) scratch
    float *src[3], *out[3] = {params, adam_m, adam_v};
    gpu_model_state_device(m, &src[0], &src[1], &src[2]);  // (S) each
    // Rounds of K values per rank, so that the gathered (W * K) fit in the P floats of g: one
    // round of S when W divides P, else rounds of floor(P / W).
    const size_t K = uneven(m) ? P / W : S;
    for (int b = 0; b < 3; b++) {
        for (size_t off = 0; off < S; off += K) {
            size_t k = S - off < K ? S - off : K;
            CUDA_CHECK(cudaMemcpyAsync(g + r * k, src[b] + off, sizeof(float) * k, cudaMemcpyDeviceToDevice, s));
            if (comm_allgather(c, g + r * k, g, k, COMM_F32, e)) return -1;  // in place: (W, k)
            if (!out[b]) continue;
            for (size_t q = 0; q < W; q++) {  // rank q's values [off, off + k) are the flat q*S + off ...
                size_t lo = q * S + off;
                if (lo >= P) break;  // the padding of the last slices
                size_t len = P - lo < k ? P - lo : k;
                CUDA_CHECK(cudaMemcpyAsync(out[b] + lo, g + q * k, sizeof(float) * len, cudaMemcpyDeviceToHost, s));
            }
            CUDA_CHECK(cudaStreamSynchronize(s));
        }
    }
    return 0;
}

double zero1_gpu_full_norm(GpuModel *m, int world) {
    const size_t P = m->table.total, S = (P + (size_t)world - 1) / (size_t)world;
    double s = 0.0;
    for (size_t r = 0; r < (size_t)world; r++) {
        size_t lo = r * S < P ? r * S : P, hi = lo + S < P ? lo + S : P;
        s += gpu_model_grad_sumsq(m, lo, hi);
    }
    return sqrt(s);
}

// --- overlap of the gradient reduction with the backward (zero1_gpu.h) ---------------------------

int gpu_dp_overlap_init(GpuDpOverlap *o, GpuModel *m, Comm *c, int zero1, ErrBuf *e) {
    memset(o, 0, sizeof *o);
    o->m = m;
    o->c = c;
    o->zero1 = zero1;
    o->bucket_values = DP_BUCKET_BYTES / sizeof(float);
    o->next_hi = o->pend_hi = m->table.total;
    int lo_prio = 0, hi_prio = 0;  // the greatest priority: a bucket's kernels start between the backward's
    cudaStream_t s = NULL;
    cudaEvent_t ready = NULL, done = NULL;
    if (cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio) != cudaSuccess ||
        cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi_prio) != cudaSuccess ||
        cudaEventCreateWithFlags(&ready, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        if (s) cudaStreamDestroy(s);
        if (ready) cudaEventDestroy(ready);
        return errf(e, "rank %d: creating the stream and events of train.overlap_comm failed (set it to false?)",
                    c->rank);
    }
    o->comm_stream = s;
    o->ready = ready;
    o->done = done;
    return 0;
}

void gpu_dp_overlap_free(GpuDpOverlap *o) {
    if (o->m) gpu_model_set_grad_ready_hook(o->m, NULL, NULL);
    if (o->comm_stream) cudaStreamDestroy((cudaStream_t)o->comm_stream);
    if (o->ready) cudaEventDestroy((cudaEvent_t)o->ready);
    if (o->done) cudaEventDestroy((cudaEvent_t)o->done);
    memset(o, 0, sizeof *o);
}

// Hands [pend_lo, pend_hi) over to the communication stream.
static void overlap_flush(GpuDpOverlap *o) {
    const size_t lo = o->pend_lo, hi = o->pend_hi;
    o->pend_hi = lo;
    if (lo == hi || o->failed) return;
    cudaStream_t ms = (cudaStream_t)gpu_model_stream(o->m), cs = (cudaStream_t)o->comm_stream;
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)o->ready, ms));  // the bucket's last gradient kernel
    CUDA_CHECK(cudaStreamWaitEvent(cs, (cudaEvent_t)o->ready, 0));
    float *g = gpu_model_grads_device(o->m);
    o->buckets++;
    int rc = 0;
    if (!o->zero1) {
        rc = comm_allreduce_sum_async(o->c, g + lo, hi - lo, COMM_F32, cs, "gradient buckets", &o->err);
    } else {  // the pieces of [lo, hi) in each rank's slice, to that rank, in rank order
        const size_t S = o->m->shard_len, P = o->m->table.total;
        for (int r = (int)(lo / S); !rc && r < o->c->world; r++) {
            size_t a = (size_t)r * S, b = a + S < P ? a + S : P;
            if (a < lo) a = lo;
            if (b > hi) b = hi;
            if (a >= hi) break;
            if (a < b) rc = comm_reduce_sum_async(o->c, g + a, b - a, COMM_F32, r, cs, "gradient buckets", &o->err);
        }
    }
    if (rc) o->failed = 1;  // the communicator is gone; finish reports err
}

// model_gpu.h's hook: [lo, hi) is final once the model's stream has run what is enqueued.
static void overlap_hook(void *ctx, size_t lo, size_t hi) {
    GpuDpOverlap *o = (GpuDpOverlap *)ctx;
    if (hi != o->next_hi || lo > hi)
        FATAL("train.overlap_comm: the backward reported gradients [%zu, %zu) but [.., %zu) was expected next "
              "(the ranges must come from the top of the flat buffer down, contiguous)", lo, hi, o->next_hi);
    o->next_hi = lo;
    o->pend_lo = lo;
    if (o->pend_hi - o->pend_lo >= o->bucket_values || lo == 0) overlap_flush(o);
}

void gpu_dp_overlap_arm(GpuDpOverlap *o, int arm) {
    if (arm && o->next_hi != o->m->table.total)
        FATAL("train.overlap_comm: a backward started while the previous one's buckets were not waited for "
              "(backend_dp_sync_grads must follow the last micro-step)");
    o->armed = arm;
    gpu_model_set_grad_ready_hook(o->m, arm ? overlap_hook : NULL, arm ? o : NULL);
}

int gpu_dp_overlap_in_flight(const GpuDpOverlap *o) { return o->next_hi != o->m->table.total; }

int gpu_dp_overlap_finish(GpuDpOverlap *o, ErrBuf *e) {
    if (o->next_hi != 0)
        FATAL("train.overlap_comm: the gradients [0, %zu) were never reported final by the last micro-step's "
              "backward (was the hook armed?)", o->next_hi);
    o->next_hi = o->pend_hi = o->m->table.total;  // ready for the next step, whatever happens below
    o->buckets = 0;
    if (o->failed) {
        o->failed = 0;
        return errf(e, "%s", o->err.msg);
    }
    if (comm_wait_async(o->c, e)) return -1;  // the deadline covers every bucket still running
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)o->done, (cudaStream_t)o->comm_stream));
    CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)gpu_model_stream(o->m), (cudaEvent_t)o->done, 0));
    return 0;
}
