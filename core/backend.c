// backend.c: the two backends behind backend.h's calls. Each call is a switch on the kind:
// the CPU branch is exactly what the trainer did before the GPU backend existed (so CPU runs,
// and their bit-exact resumes, are unchanged); the GPU branch calls model_gpu.h.
#include "core/backend.h"

#include <math.h>    // sqrt
#include <string.h>  // memcpy, memset

#include "comm/comm.h"      // collectives for data parallelism
#include "optimizer.h"      // adamw_step, adamw_update_slice, grad_global_norm
#include "gpu/zero1_gpu.h"  // ZeRO-1 and the data-parallel norm on the GPU

// --- device choice ---------------------------------------------------------------------------------

int backend_choose_device(const Config *c, DeviceKind want, int B, int T, const char *activity,
                          GpuInfo *info, char *note, int note_len, ErrBuf *e) {
    GpuInfo g;
    char why[256] = "";
    if (note && note_len > 0) note[0] = '\0';
    if (info) memset(info, 0, sizeof *info);
    if (want == DEVICE_CPU) return DEVICE_CPU;
    gpu_info_query(&g, why, sizeof why);
    if (info) *info = g;
    if (g.count == 0) {
        if (want == DEVICE_GPU)
            return errf(e, "the device is \"gpu\" (train.device or --device) but no usable GPU was found (%s): "
                           "the GPU backend needs a CUDA device; use --device cpu or auto", why);
        if (note) snprintf(note, (size_t)note_len, "note: no GPU (%s): %s on the CPU", why, activity);
        return DEVICE_CPU;
    }
    MemoryPlan mp;
    ErrBuf unsupported;
    if (gpu_model_plan(c, B, T, &mp, &unsupported) != 0) {
        if (want == DEVICE_GPU)
            return errf(e, "the device is \"gpu\" (train.device or --device) but the GPU backend cannot run "
                           "this config: %s", unsupported.msg);
        if (note)
            snprintf(note, (size_t)note_len, "note: GPU found (%s) but the GPU backend cannot run this config (%s): "
                                             "%s on the CPU", g.name, unsupported.msg, activity);
        return DEVICE_CPU;
    }
    return DEVICE_GPU;
}

// --- life cycle -------------------------------------------------------------------------------------

// backend_init with the GPU model sharded for ZeRO-1 when shard_world > 1 (rank shard_rank).
static int init_model(Backend *b, const Config *c, DeviceKind kind, int B, int T, unsigned long long seed,
                      int grad_accum, FILE *plan_out, int shard_rank, int shard_world, ErrBuf *e) {
    memset(b, 0, sizeof *b);
    if (kind != DEVICE_CPU && kind != DEVICE_GPU)
        FATAL("backend_init: device %d is not resolved (call backend_choose_device first)", (int)kind);
    if (grad_accum < 1) FATAL("backend_init: grad_accum %d < 1", grad_accum);
    b->kind = kind;
    b->B = B;
    b->T = T;
    b->grad_accum = grad_accum;
    if (kind == DEVICE_CPU) {
        cpu_model_init(&b->cpu, c, B, T, seed);
        adamw_init(&b->adam, b->cpu.table.total);
        return 0;
    }
    if (gpu_model_init_sharded(&b->gpu, c, B, T, seed, shard_rank, shard_world, plan_out, e) != 0) return -1;
    // The head's gradient is made during the forward, so the scale must be in place before it.
    gpu_model_set_loss_scale(&b->gpu, 1.0f / (float)grad_accum);
    return 0;
}

int backend_init(Backend *b, const Config *c, DeviceKind kind, int B, int T, unsigned long long seed,
                 int grad_accum, FILE *plan_out, ErrBuf *e) {
    return init_model(b, c, kind, B, T, seed, grad_accum, plan_out, 0, 1, e);
}

static int dp_setup(Backend *b, struct Comm *comm, int zero1, ErrBuf *e);

int backend_init_dp(Backend *b, const Config *c, DeviceKind kind, int B, int T, unsigned long long seed,
                    int grad_accum, FILE *plan_out, struct Comm *comm, int zero1, ErrBuf *e) {
    if (!comm || comm->world == 1) return backend_init(b, c, kind, B, T, seed, grad_accum, plan_out, e);
    // ZeRO-1 on the GPU shards the allocation itself (the memory plan is per rank), so the model
    // learns its slice before it allocates; the CPU shards its moments afterwards (dp_setup).
    int sharded = zero1 && kind == DEVICE_GPU;
    if (init_model(b, c, kind, B, T, seed, grad_accum, plan_out, sharded ? comm->rank : 0, sharded ? comm->world : 1,
                   e) != 0)
        return -1;
    return dp_setup(b, comm, zero1, e);
}

void backend_free(Backend *b) {
    free(b->zero1_buf);
    if (b->overlap) gpu_dp_overlap_free(b->overlap);
    free(b->overlap);
    if (b->kind == DEVICE_CPU) {
        adamw_free(&b->adam);
        cpu_model_free(&b->cpu);
    } else if (b->kind == DEVICE_GPU) {
        gpu_model_free(&b->gpu);
    }
    memset(b, 0, sizeof *b);
}

const ParamTable *backend_table(const Backend *b) { return b->kind == DEVICE_GPU ? &b->gpu.table : &b->cpu.table; }
const Config *backend_config(const Backend *b) { return b->kind == DEVICE_GPU ? &b->gpu.cfg : &b->cpu.cfg; }
const char *backend_name(const Backend *b) { return b->kind == DEVICE_GPU ? "gpu" : "cpu"; }

// --- training ---------------------------------------------------------------------------------------

void backend_zero_grad(Backend *b) {
    b->micro = 0;
    if (b->overlap && gpu_dp_overlap_in_flight(b->overlap))
        FATAL("backend_zero_grad: the overlapped gradient reduction of the last backward was not waited for "
              "(call backend_dp_sync_grads after the last micro-step)");
    if (b->kind == DEVICE_GPU) gpu_model_zero_grad(&b->gpu);
    else cpu_model_zero_grad(&b->cpu);
}

float backend_forward_backward(Backend *b, const int32_t *inputs, const int32_t *targets) {
    float scale = 1.0f / (float)b->grad_accum;
    float loss;
    if (b->kind == DEVICE_GPU) {
        if (b->overlap && gpu_dp_overlap_in_flight(b->overlap))  // the forward adds the head's gradient
            FATAL("backend_forward_backward: %d micro-steps per rank and step, but a further one came before "
                  "backend_dp_sync_grads (the gradients are being reduced)", b->micro_per_rank);
        loss = gpu_model_forward(&b->gpu, inputs, targets);
        // The last micro-step's backward hands its finished gradients to NCCL as it goes.
        int last = b->overlap && ++b->micro == b->micro_per_rank;
        if (last) gpu_dp_overlap_arm(b->overlap, 1);
        gpu_model_backward(&b->gpu, scale);
        if (last) gpu_dp_overlap_arm(b->overlap, 0);
    } else {
        loss = cpu_model_forward(&b->cpu, inputs, targets);
        cpu_model_backward(&b->cpu, scale);
    }
    return loss;
}

double backend_grad_norm(Backend *b) {
    if (b->kind == DEVICE_GPU) return gpu_model_grad_norm(&b->gpu);
    return grad_global_norm(b->cpu.grads, b->cpu.table.total);
}

void backend_step(Backend *b, double lr, double clip, const TrainConfig *tc) {
    if (b->kind == DEVICE_GPU) gpu_model_step(&b->gpu, lr, clip, tc);
    else adamw_step(&b->adam, &b->cpu.table, tc, b->cpu.params, b->cpu.grads, lr, clip);
}

float backend_eval_loss(Backend *b, const int32_t *inputs, const int32_t *targets) {
    if (b->kind == DEVICE_GPU) return gpu_model_loss(&b->gpu, inputs, targets);
    return cpu_model_loss(&b->cpu, inputs, targets);
}

float backend_eval_detail(Backend *b, const int32_t *inputs, const int32_t *targets, float *losses, int n_rows,
                          const int *rows, float *row_logits) {
    if (b->kind == DEVICE_GPU) return gpu_model_loss_detail(&b->gpu, inputs, targets, losses, n_rows, rows, row_logits);
    return cpu_model_loss_detail(&b->cpu, inputs, targets, losses, n_rows, rows, row_logits);
}

void backend_next_logits(Backend *b, const int32_t *tokens, int t, float *logits) {
    if (b->kind == DEVICE_GPU) gpu_model_next_logits(&b->gpu, tokens, t, logits);
    else cpu_model_next_logits(&b->cpu, tokens, t, logits);
}

// --- state for checkpoints --------------------------------------------------------------------------

void backend_get_state(Backend *b, float *params, float *adam_m, float *adam_v, long long *step) {
    if (b->kind == DEVICE_GPU) {
        if (b->zero1 && (params || adam_m || adam_v))
            FATAL("backend_get_state: under ZeRO-1 on the GPU the FP32 masters and moments are sharded: use "
                  "backend_dp_get_state");
        if (params) gpu_model_get_params(&b->gpu, params);
        if (adam_m || adam_v) {
            // model_gpu.h copies both moments at once: a skipped one goes through a scratch array.
            size_t n = b->gpu.table.total;
            float *scratch = (!adam_m || !adam_v) ? xmalloc(n * sizeof(float)) : NULL;
            long long s;
            gpu_model_get_opt_state(&b->gpu, adam_m ? adam_m : scratch, adam_v ? adam_v : scratch, &s);
            free(scratch);
        }
        if (step) *step = b->gpu.step;
        return;
    }
    if (b->zero1 && (adam_m || adam_v)) FATAL("backend_get_state: ZeRO-1 moments are sharded: use backend_dp_get_state");
    size_t bytes = b->cpu.table.total * sizeof(float);
    if (params && params != b->cpu.params) memcpy(params, b->cpu.params, bytes);  // equal: in place
    if (adam_m && adam_m != b->adam.m) memcpy(adam_m, b->adam.m, bytes);
    if (adam_v && adam_v != b->adam.v) memcpy(adam_v, b->adam.v, bytes);
    if (step) *step = b->adam.step;
}

int backend_state_in_place(Backend *b, float **params, float **adam_m, float **adam_v) {
    if (b->kind != DEVICE_CPU || b->zero1) return 0;
    *params = b->cpu.params;
    *adam_m = b->adam.m;
    *adam_v = b->adam.v;
    return 1;
}

void backend_set_state(Backend *b, const float *params, const float *adam_m, const float *adam_v,
                       long long step) {
    if ((adam_m == NULL) != (adam_v == NULL)) FATAL("backend_set_state: pass both AdamW moments or neither");
    if (b->kind == DEVICE_GPU) {
        if (params) gpu_model_set_params(&b->gpu, params);
        if (adam_m) gpu_model_set_opt_state(&b->gpu, adam_m, adam_v, step);
        return;
    }
    size_t bytes = b->cpu.table.total * sizeof(float);
    if (params && params != b->cpu.params) memcpy(b->cpu.params, params, bytes);  // equal: in place
    if (adam_m && b->zero1) {  // this rank's slice; the padding past total stays zero
        size_t n = b->shard_end - b->shard_begin;
        memset(b->adam.m, 0, b->shard_len * sizeof(float));
        memset(b->adam.v, 0, b->shard_len * sizeof(float));
        memcpy(b->adam.m, adam_m + b->shard_begin, n * sizeof(float));
        memcpy(b->adam.v, adam_v + b->shard_begin, n * sizeof(float));
        b->adam.step = step;
    } else if (adam_m) {
        if (adam_m != b->adam.m) memcpy(b->adam.m, adam_m, bytes);
        if (adam_v != b->adam.v) memcpy(b->adam.v, adam_v, bytes);
        b->adam.step = step;
    }
}

AttnDelayedState *backend_delayed_state(Backend *b, int *n) {
    if (b->kind == DEVICE_GPU) return gpu_model_delayed_state(&b->gpu, n);
    if (b->cpu.attn_delayed) {
        *n = b->cpu.n_delayed;
        return b->cpu.attn_delayed;
    }
    *n = 0;
    return NULL;
}

AttnKeyCenters *backend_key_centers(Backend *b) {
    return b->kind != DEVICE_GPU && b->cpu.key_centers.center ? &b->cpu.key_centers : NULL;
}

// --- data parallelism -------------------------------------------------------------------------------

static int dp_setup(Backend *b, struct Comm *comm, int zero1, ErrBuf *e) {
    b->comm = comm;
    if (b->kind == DEVICE_GPU) comm->stream = gpu_model_stream(&b->gpu);  // collectives follow the model's work
    const size_t total = backend_table(b)->total, world = (size_t)comm->world;
    b->shard_len = (total + world - 1) / world;
    b->shard_begin = (size_t)comm->rank * b->shard_len;
    if (b->shard_begin > total) b->shard_begin = total;
    b->shard_end = b->shard_begin + b->shard_len < total ? b->shard_begin + b->shard_len : total;
    // train.overlap_comm: the GPU's reduction overlaps the last micro-step's backward (zero1_gpu.h).
    // It needs the micro-steps per rank to find the last one: grad_accum is accumulation x world.
    if (b->kind == DEVICE_GPU && world > 1 && backend_config(b)->train.overlap_comm &&
        b->grad_accum % comm->world == 0) {
        b->micro_per_rank = b->grad_accum / comm->world;
        b->overlap = xcalloc(1, sizeof *b->overlap);
        if (gpu_dp_overlap_init(b->overlap, &b->gpu, comm, zero1, e)) {
            free(b->overlap);
            b->overlap = NULL;
            return -1;
        }
    }
    if (!zero1 || world == 1) return 0;
    b->zero1 = 1;
    if (b->kind == DEVICE_GPU) {  // the model allocated its slice (backend_init_dp); zero1_gpu.h does the rest
        if (total < world)  // zero1_gpu.c's scratch layouts assume at least one value per rank
            return errf(e, "train.zero1: %zu parameters cannot be sharded over %zu GPUs", total, world);
        if (b->gpu.shard_world != comm->world || b->gpu.shard_lo != b->shard_begin || b->gpu.shard_hi != b->shard_end)
            FATAL("backend: the GPU model's ZeRO-1 slice [%zu, %zu) of %d ranks is not the backend's [%zu, %zu) of %d",
                  b->gpu.shard_lo, b->gpu.shard_hi, b->gpu.shard_world, b->shard_begin, b->shard_end, comm->world);
        return 0;
    }
    adamw_free(&b->adam);
    adamw_init(&b->adam, b->shard_len);  // the moments of this rank's slice only
    b->zero1_buf = xcalloc(world * b->shard_len, sizeof(float));
    return 0;
}

// Sum of squares of x[begin, end), sequentially in double: the per-slice part of the norm, in the
// same order whether the slices live on one rank (plain) or on their own ranks (ZeRO-1).
static double sum_squares(const float *x, size_t begin, size_t end) {
    double s = 0.0;
    for (size_t i = begin; i < end; i++) s += (double)x[i] * (double)x[i];
    return s;
}

int backend_dp_sync_grads(Backend *b, double *norm, ErrBuf *e) {
    Comm *c = b->comm;
    const size_t total = backend_table(b)->total, S = b->shard_len;
    if (b->kind == DEVICE_GPU) {  // on the device gradients, on the model's stream
        // Overlapped: the buckets were enqueued by the last backward; wait for them (deadline).
        if (b->overlap && gpu_dp_overlap_finish(b->overlap, e)) return -1;
        if (b->zero1) return zero1_gpu_sync_grads(&b->gpu, c, b->overlap != NULL, norm, e);
        if (!b->overlap && comm_allreduce_sum_f32(c, gpu_model_grads_device(&b->gpu), total, e)) return -1;
        *norm = zero1_gpu_full_norm(&b->gpu, c->world);  // the slices in rank order, as ZeRO-1 adds them
        return 0;
    }
    if (!b->zero1) {
        if (comm_allreduce_sum_f32(c, b->cpu.grads, total, e)) return -1;
        double s = 0.0;  // the slices' sums in rank order, as ZeRO-1 adds them
        for (int r = 0; r < c->world; r++) {
            size_t lo = (size_t)r * S < total ? (size_t)r * S : total, hi = lo + S < total ? lo + S : total;
            s += sum_squares(b->cpu.grads, lo, hi);
        }
        *norm = sqrt(s);
        return 0;
    }
    float *buf = b->zero1_buf;  // (world * S): the gradients, zero-padded, summed into this rank's slice
    memcpy(buf, b->cpu.grads, total * sizeof(float));
    memset(buf + total, 0, ((size_t)c->world * S - total) * sizeof(float));
    if (comm_reduce_scatter(c, buf, buf + (size_t)c->rank * S, S, COMM_F32, e)) return -1;
    double s = sum_squares(buf, b->shard_begin, b->shard_end);
    if (comm_allreduce_sum(c, &s, 1, COMM_F64, e)) return -1;
    *norm = sqrt(s);
    return 0;
}

int backend_dp_step(Backend *b, double lr, double clip, const TrainConfig *tc, ErrBuf *e) {
    if (!b->zero1) {  // every rank holds the same summed gradients: the same full update everywhere
        backend_step(b, lr, clip, tc);
        return 0;
    }
    if (b->kind == DEVICE_GPU) return zero1_gpu_step(&b->gpu, b->comm, lr, clip, tc, e);
    Comm *c = b->comm;
    const size_t total = b->cpu.table.total, S = b->shard_len;
    float *buf = b->zero1_buf;
    adamw_update_slice(&b->cpu.table, tc, b->cpu.params, buf, b->adam.m, b->adam.v, b->shard_begin, b->shard_end,
                       lr, clip, b->adam.step + 1);
    b->adam.step++;
    // All-gather the updated slices through the same buffer (the gradients are no longer needed).
    memcpy(buf + b->shard_begin, b->cpu.params + b->shard_begin, (b->shard_end - b->shard_begin) * sizeof(float));
    memset(buf + total, 0, ((size_t)c->world * S - total) * sizeof(float));
    if (comm_allgather(c, buf + (size_t)c->rank * S, buf, S, COMM_F32, e)) return -1;
    memcpy(b->cpu.params, buf, total * sizeof(float));
    return 0;
}

int backend_dp_get_state(Backend *b, float *params, float *adam_m, float *adam_v, long long *step, ErrBuf *e) {
    if (!b->zero1) {
        backend_get_state(b, params, adam_m, adam_v, step);
        return 0;
    }
    if (b->kind == DEVICE_GPU) {
        if (step) *step = b->gpu.step;
        return zero1_gpu_gather_state(&b->gpu, b->comm, params, adam_m, adam_v, e);
    }
    backend_get_state(b, params, NULL, NULL, step);
    Comm *c = b->comm;
    const size_t total = b->cpu.table.total, S = b->shard_len;
    float *buf = b->zero1_buf, *moments[2] = {b->adam.m, b->adam.v}, *outs[2] = {adam_m, adam_v};
    for (int k = 0; k < 2; k++) {  // every rank takes part; those without an output discard it
        memcpy(buf + (size_t)c->rank * S, moments[k], S * sizeof(float));
        if (comm_allgather(c, buf + (size_t)c->rank * S, buf, S, COMM_F32, e)) return -1;
        if (outs[k]) memcpy(outs[k], buf, total * sizeof(float));
    }
    return 0;
}
