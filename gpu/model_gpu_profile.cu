// model_gpu_profile.cu: where a GPU training step spends its time, phase by phase
// (gpu_model_profile / gpu_model_profile_report in model_gpu.h; `TRAIN_GPT_PROFILE=N` makes the
// trainer turn it on after N steps and print the table at the end).
//
// The model code calls prof_mark(d, phase) after each piece of work it enqueues: an event is
// recorded on the model stream and the time between it and the previous mark is charged to that
// phase. Everything runs on one stream, so the intervals tile the stream's timeline: their sum
// is the wall time the stream spent from the first mark to the last, idle gaps included (they are
// charged to the phase whose mark ends them, and to PH_HOST at the start of each pass). Events
// are resolved in batches (a pool of 4096), never in the middle of a step unless the pool fills.
#include "gpu/model_gpu_internal.h"

#include <stdio.h>   // FILE, fprintf
#include <stdlib.h>  // free

#include "gpu/cuda_check.h"  // CUDA_CHECK

#define PROF_POOL 4096

struct ProfState {
    cudaEvent_t ev[PROF_POOL];
    unsigned char phase[PROF_POOL];  // phase charged with the interval ending at ev[i]
    int used;                        // events recorded since the last resolve (ev[0] = the base)
    double ms[PH_N];
    long long marks[PH_N];
    double host_ms[PH_N];  // host time between marks: enqueueing the phase's work (and any wait in it)
    double host_last;      // now_seconds() at the previous mark (after its bookkeeping)
    int paused;            // gpu_model_profile_pause: marks are ignored
};

static const char *const phase_names[PH_N] = {
    "host / gaps between passes", "fwd linears (GEMMs + FP8 quantize)", "fwd attention", "fwd embedding, norms, residual",
    "fwd RoPE, QK-norm", "fwd SwiGLU", "LM head + cross-entropy (fwd, dgrad, wgrad)",
    "bwd linears (dgrad + wgrad)", "bwd attention", "bwd RMSNorm", "bwd embedding", "bwd RoPE, QK-norm", "bwd SwiGLU",
    "recompute (train.recompute, QK-norm)", "grad reduction + norm", "AdamW"};

// Adds the intervals ev[i-1] -> ev[i] to their phases; keeps the last event as the new base.
static void resolve(ProfState *p) {
    if (p->used < 2) return;
    CUDA_CHECK(cudaEventSynchronize(p->ev[p->used - 1]));
    for (int i = 1; i < p->used; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]));
        p->ms[p->phase[i]] += ms;
        p->marks[p->phase[i]]++;
    }
    cudaEvent_t last = p->ev[p->used - 1];
    p->ev[p->used - 1] = p->ev[0];
    p->ev[0] = last;
    p->used = 1;
}

void prof_mark(Dev *d, ProfPhase ph) {
    ProfState *p = d->prof;
    if (!p || p->paused) return;
    const double t = now_seconds();
    if (p->host_last > 0) p->host_ms[ph] += 1e3 * (t - p->host_last);
    if (p->used == PROF_POOL) resolve(p);
    CUDA_CHECK(cudaEventRecord(p->ev[p->used], d->stream));
    p->phase[p->used] = (unsigned char)ph;
    p->used++;
    p->host_last = now_seconds();  // the resolve above is the profiler's, not the phase's
}

void prof_free(Dev *d) {
    ProfState *p = d->prof;
    if (!p) return;
    for (int i = 0; i < PROF_POOL; i++) CUDA_CHECK(cudaEventDestroy(p->ev[i]));
    free(p);
    d->prof = NULL;
}

void gpu_model_profile(GpuModel *m, int on) {
    Dev *d = dev_of(m);
    prof_free(d);
    if (!on) return;
    ProfState *p = (ProfState *)xcalloc(1, sizeof *p);
    for (int i = 0; i < PROF_POOL; i++) CUDA_CHECK(cudaEventCreate(&p->ev[i]));
    d->prof = p;
    prof_mark(d, PH_HOST);  // the base of the first interval
}

void gpu_model_profile_pause(GpuModel *m, int paused) {
    ProfState *p = dev_of(m)->prof;
    if (!p || p->paused == !!paused) return;
    if (paused) {  // the last event stays the base of the next interval until the resume moves it
        p->paused = 1;
        return;
    }
    // resume: charge what was marked before the pause, then start the next interval here, so the
    // stream's work while paused (an evaluation, say) is charged to no phase
    resolve(p);
    CUDA_CHECK(cudaEventRecord(p->ev[0], dev_of(m)->stream));
    p->host_last = now_seconds();
    p->paused = 0;
}

void gpu_model_profile_report(GpuModel *m, FILE *f, long long steps) {
    Dev *d = dev_of(m);
    ProfState *p = d->prof;
    if (!p) {
        fprintf(f, "profile: off (gpu_model_profile)\n");
        return;
    }
    resolve(p);
    double total = 0.0;
    for (int i = 0; i < PH_N; i++) total += p->ms[i];
    fprintf(f, "profile of the GPU stream over %lld steps (%.1f ms in all, %.2f ms per step)\n", steps, total,
            steps > 0 ? total / steps : 0.0);
    // host ms: the host's time between the marks that close the phase's intervals, i.e. what
    // enqueueing its work cost (launches, cuBLASLt calls, any wait). A phase whose host time comes
    // near its GPU time leaves the GPU waiting for launches, and its GPU time then includes those gaps.
    // The first phase's host time also holds the waits at the passes' ends (the stream syncs).
    fprintf(f, "  %-46s %12s %8s %12s %7s\n", "phase", "ms per step", "share", "host ms/step", "marks");
    double host_total = 0.0;
    for (int i = 0; i < PH_N; i++) {
        if (p->marks[i] == 0) continue;
        const double div = steps > 0 ? (double)steps : 1.0;
        fprintf(f, "  %-46s %12.3f %7.1f%% %12.3f %7lld\n", phase_names[i], p->ms[i] / div,
                total > 0 ? 100.0 * p->ms[i] / total : 0.0, p->host_ms[i] / div, p->marks[i]);
        host_total += p->host_ms[i] / div;
    }
    fprintf(f, "  %-46s %12s %8s %12.3f\n", "host time in the marked phases", "", "", host_total);
    fflush(f);
}
