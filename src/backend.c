// backend.c: the two backends behind backend.h's calls. Each call is a switch on the kind:
// the CPU branch is exactly what the trainer did before the GPU backend existed (so CPU runs,
// and their bit-exact resumes, are unchanged); the GPU branch calls model_gpu.h.
#include "backend.h"

#include <string.h>  // memcpy, memset

#include "optimizer.h"  // adamw_step, grad_global_norm

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

int backend_init(Backend *b, const Config *c, DeviceKind kind, int B, int T, unsigned long long seed,
                 int grad_accum, FILE *plan_out, ErrBuf *e) {
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
    if (gpu_model_init(&b->gpu, c, B, T, seed, plan_out, e) != 0) return -1;
    // The head's gradient is made during the forward, so the scale must be in place before it.
    gpu_model_set_loss_scale(&b->gpu, 1.0f / (float)grad_accum);
    return 0;
}

void backend_free(Backend *b) {
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
    if (b->kind == DEVICE_GPU) gpu_model_zero_grad(&b->gpu);
    else cpu_model_zero_grad(&b->cpu);
}

float backend_forward_backward(Backend *b, const int32_t *inputs, const int32_t *targets) {
    float scale = 1.0f / (float)b->grad_accum;
    float loss;
    if (b->kind == DEVICE_GPU) {
        loss = gpu_model_forward(&b->gpu, inputs, targets);
        gpu_model_backward(&b->gpu, scale);
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

void backend_next_logits(Backend *b, const int32_t *tokens, int t, float *logits) {
    if (b->kind == DEVICE_GPU) gpu_model_next_logits(&b->gpu, tokens, t, logits);
    else cpu_model_next_logits(&b->cpu, tokens, t, logits);
}

// --- state for checkpoints --------------------------------------------------------------------------

void backend_get_state(Backend *b, float *params, float *adam_m, float *adam_v, long long *step) {
    if (b->kind == DEVICE_GPU) {
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
    size_t bytes = b->cpu.table.total * sizeof(float);
    if (params) memcpy(params, b->cpu.params, bytes);
    if (adam_m) memcpy(adam_m, b->adam.m, bytes);
    if (adam_v) memcpy(adam_v, b->adam.v, bytes);
    if (step) *step = b->adam.step;
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
    if (params) memcpy(b->cpu.params, params, bytes);
    if (adam_m) {
        memcpy(b->adam.m, adam_m, bytes);
        memcpy(b->adam.v, adam_v, bytes);
        b->adam.step = step;
    }
}

AttnDelayedState *backend_delayed_state(Backend *b, int *n) {
    if (b->kind == DEVICE_CPU && b->cpu.attn_delayed) {
        *n = b->cpu.cfg.model.n_layer;
        return b->cpu.attn_delayed;
    }
    *n = 0;
    return NULL;
}
