// test_zero1_gpu.cu: ZeRO-1 on the GPU backend, the parts one process can check (the NCCL
// collectives around them run in `bash scripts/gpu.sh check dp` on two GPUs).
//
// Everywhere (host code): the GPU allocation of one ZeRO-1 rank (gpu_model_plan_sharded) equals
// model.c's memory_plan(c, world, zero1, B), i.e. what --dry-run --world-size N --zero1 prints,
// byte for byte in every category, for several configs and world sizes (even and uneven
// divisions of P), and the masters and moments shrink to ceil(P / world) values.
// With a GPU: W = 3 sharded models (one per simulated rank) next to one unsharded model A, on one
// GPU. They start from the same parameters (each rank's masters are A's slice, zeros past it; the
// BF16 weights are all of A's). Each step A computes the gradients, the ranks get a copy (what an
// in-place reduce-scatter leaves in their slice), A takes gpu_model_step and each rank
// gpu_model_step_slice: every rank's masters, moments and BF16 weights of its slice equal A's
// bit for bit (slices cut tensors in the middle; weight decay follows each tensor), and the
// slices' sums of squares add up to A's squared norm. Then set_params / set_opt_state of full host
// arrays keep each rank's slice.
#include <math.h>    // fabs, sqrt
#include <stdint.h>  // int32_t, uint16_t
#include <stdio.h>   // printf
#include <string.h>  // memcmp

#include <vector>  // host copies

#include "gpu_test.h"       // CU, gpu_test_have_gpu
#include "core/model.h"     // memory_plan
#include "gpu/model_gpu.h"  // gpu_model_init_sharded, gpu_model_step_slice, gpu_model_plan_sharded
#include "model_test.h"     // TINY_JSON, make_config, make_batch
#include "optimizer.h"      // grad_clip_factor
#include "test.h"           // CHECK, test_summary
#include "gpu/zero1_gpu.h"  // zero1_gpu_full_norm

// --- host: the per-rank plan ---------------------------------------------------------------------
static void plan_tests(void) {
    const char *ov_rc[] = {"train.recompute=true"};
    const char *ov_qk[] = {"model.qk_norm=true", "model.tied_embeddings=true"};
    // The 569M config's shapes (configs/paper_569m.json): the scaling run of `scripts/gpu.sh bench dp`.
    const char *ov_569m[] = {"model.d_model=1536", "model.n_layer=15", "model.n_head=12", "model.ffn_hidden=3968",
                             "model.seq_len=4096", "model.vocab_size=50257", "train.micro_batch=4"};
    struct { const char *label; const char *const *ov; int n; } cases[] = {
        {"tiny", NULL, 0}, {"tiny recompute", ov_rc, 1}, {"tiny qk_norm tied", ov_qk, 2}, {"569M", ov_569m, 7}};
    const int worlds[] = {2, 3, 4, 7, 8};
    for (auto &k : cases) {
        Config c = make_config(TINY_JSON, k.ov, k.n);
        int B = c.train.micro_batch, T = c.model.seq_len;
        ParamTable t;
        param_table_build(&t, &c.model);
        const size_t P = t.total;
        param_table_free(&t);
        MemoryPlan one;
        ErrBuf e;
        gpu_model_plan(&c, B, T, &one, &e);
        int same = 1, shrinks = 1;
        char why[400] = "", name[200];
        for (int w : worlds) {
            for (int z = 0; z <= 1; z++) {
                MemoryPlan dry, gpu;
                memory_plan(&c, w, z, B, &dry);
                int rc = gpu_model_plan_sharded(&c, B, T, w, z, &gpu, &e);
                if (same && (rc || memcmp(&dry, &gpu, sizeof dry))) {
                    same = 0;
                    snprintf(why, sizeof why, "world %d zero1 %d rc %d; dry/gpu: weights %zu/%zu master %zu/%zu "
                             "opt %zu/%zu grads %zu/%zu act %zu/%zu ws %zu/%zu total %zu/%zu", w, z, rc, dry.weights,
                             gpu.weights, dry.master, gpu.master, dry.optimizer, gpu.optimizer, dry.grads, gpu.grads,
                             dry.activations, gpu.activations, dry.workspace, gpu.workspace, dry.total, gpu.total);
                }
                size_t S = z ? (P + w - 1) / w : P, want = (4 * S + 255) / 256 * 256;
                if (shrinks && !(gpu.master == want && gpu.optimizer == 2 * want && gpu.weights == one.weights &&
                                 gpu.grads == one.grads && gpu.activations == one.activations)) {
                    shrinks = 0;
                    snprintf(why, sizeof why, "world %d zero1 %d: P %zu S %zu: master %zu (want %zu), optimizer %zu",
                             w, z, P, S, gpu.master, want, gpu.optimizer);
                }
            }
        }
        snprintf(name, sizeof name, "plan %s, worlds 2 3 4 7 8, ZeRO-1 on and off: the GPU allocation of a rank "
                 "equals --dry-run's plan byte for byte", k.label);
        CHECK(same, name, "%s", why);
        snprintf(name, sizeof name, "plan %s: with ZeRO-1 the masters and each moment hold ceil(P / world) values, "
                 "the rest is unchanged", k.label);
        CHECK(shrinks, name, "%s", why);
    }
}

// --- GPU: W simulated ranks against one unsharded model ------------------------------------------
#define W_RANKS 3

template <class T> static std::vector<T> from_device(const T *d, size_t n) {
    std::vector<T> h(n);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// Rank r's masters (or moments) against ref[lo, hi) bit for bit, zeros past the slice.
static bool slice_equal(const float *dev_slice, const GpuModel *g, const std::vector<float> &ref) {
    std::vector<float> s = from_device(dev_slice, g->shard_len);
    size_t n = g->shard_hi - g->shard_lo;
    if (memcmp(s.data(), ref.data() + g->shard_lo, n * sizeof(float))) return false;
    for (size_t i = n; i < g->shard_len; i++)
        if (s[i] != 0.0f) return false;
    return true;
}

static void simulated_ranks(void) {
    Config c = make_config(TINY_JSON, NULL, 0);
    const int B = 4, T = c.model.seq_len, V = c.model.vocab_size;
    GpuModel a, r[W_RANKS];
    ErrBuf e;
    if (gpu_model_init(&a, &c, B, T, 7, NULL, &e)) {
        CHECK(0, "zero1: init of the unsharded model", "%s", e.msg);
        return;
    }
    const size_t P = a.table.total;
    int ok_init = 1;
    for (int k = 0; k < W_RANKS; k++) ok_init &= gpu_model_init_sharded(&r[k], &c, B, T, 7, k, W_RANKS, NULL, &e) == 0;
    CHECK(ok_init, "zero1: init of 3 sharded models", "%s", e.msg);
    if (!ok_init) return;
    printf("# P = %zu, W = %d: S = %zu, P %% W = %zu\n", P, W_RANKS, r[0].shard_len, P % W_RANKS);

    // The slices tile [0, P); each model's plan is its rank's.
    int tiles = r[0].shard_lo == 0 && r[W_RANKS - 1].shard_hi == P, plans = 1;
    for (int k = 0; k < W_RANKS; k++) {
        if (k > 0) tiles &= r[k].shard_lo == r[k - 1].shard_hi;
        tiles &= r[k].shard_len == (P + W_RANKS - 1) / W_RANKS && r[k].shard_lo == k * r[k].shard_len;
        MemoryPlan want;
        gpu_model_plan_sharded(&c, B, T, W_RANKS, 1, &want, &e);
        plans &= !memcmp(&want, &r[k].plan, sizeof want);
    }
    CHECK(tiles, "zero1: the ranks' slices [r*S, (r+1)*S) tile the parameters", "lo %zu %zu %zu hi %zu %zu %zu",
          r[0].shard_lo, r[1].shard_lo, r[2].shard_lo, r[0].shard_hi, r[1].shard_hi, r[2].shard_hi);
    CHECK(plans, "zero1: each sharded model allocated gpu_model_plan_sharded's plan", "master %zu", r[0].plan.master);

    // Initial state: masters are A's slices, BF16 weights all of A's, moments zero.
    std::vector<float> pa(P), ma(P), va(P);
    long long step;
    gpu_model_get_params(&a, pa.data());
    std::vector<uint16_t> wa = from_device(gpu_model_weights_device(&a), P);
    std::vector<float> zeros(P, 0.0f);
    int init_ok = 1;
    for (int k = 0; k < W_RANKS; k++) {
        float *mp, *mm, *mv;
        gpu_model_state_device(&r[k], &mp, &mm, &mv);
        std::vector<uint16_t> wr = from_device(gpu_model_weights_device(&r[k]), P);
        init_ok &= slice_equal(mp, &r[k], pa) && slice_equal(mm, &r[k], zeros) && slice_equal(mv, &r[k], zeros) &&
                   !memcmp(wr.data(), wa.data(), P * sizeof(uint16_t));
    }
    CHECK(init_ok, "zero1: at init each rank holds its slice of the masters, zero moments, all BF16 weights", "differ");

    std::vector<int32_t> tok((size_t)B * T), tgt((size_t)B * T);
    int steps_ok = 1, norm_ok = 1;
    double worst_norm = 0.0;
    for (int s = 0; s < 3; s++) {
        make_batch(tok.data(), tgt.data(), B, T, V);
        gpu_model_zero_grad(&a);
        gpu_model_forward(&a, tok.data(), tgt.data());
        gpu_model_backward(&a, 1.0f);
        double norm = gpu_model_grad_norm(&a), sliced = 0.0;
        for (int k = 0; k < W_RANKS; k++) {  // what the reduce-scatter would leave: the summed gradients
            CU(cudaMemcpy(gpu_model_grads_device(&r[k]), gpu_model_grads_device(&a), P * sizeof(float),
                          cudaMemcpyDeviceToDevice));
            sliced += gpu_model_grad_sumsq(&r[k], r[k].shard_lo, r[k].shard_hi);
        }
        double full = zero1_gpu_full_norm(&a, W_RANKS);
        double d = fmax(fabs(sqrt(sliced) - norm), fabs(full - norm)) / norm;
        if (d > worst_norm) worst_norm = d;
        norm_ok &= d < 1e-12 && full == sqrt(sliced);
        double clip = grad_clip_factor(&c.train, norm), lr = 2e-3 * (s + 1);
        gpu_model_step(&a, lr, clip, &c.train);
        for (int k = 0; k < W_RANKS; k++) gpu_model_step_slice(&r[k], lr, clip, &c.train);
        gpu_model_get_params(&a, pa.data());
        gpu_model_get_opt_state(&a, ma.data(), va.data(), &step);
        wa = from_device(gpu_model_weights_device(&a), P);
        for (int k = 0; k < W_RANKS; k++) {
            float *mp, *mm, *mv;
            gpu_model_state_device(&r[k], &mp, &mm, &mv);
            std::vector<uint16_t> wr = from_device(gpu_model_weights_device(&r[k]), P);
            size_t lo = r[k].shard_lo, n = r[k].shard_hi - lo;
            steps_ok &= slice_equal(mp, &r[k], pa) && slice_equal(mm, &r[k], ma) && slice_equal(mv, &r[k], va) &&
                        !memcmp(wr.data() + lo, wa.data() + lo, n * sizeof(uint16_t)) && r[k].step == a.step;
            // The all-gather, by hand: the other ranks' BF16 slices (the next step needs none).
            CU(cudaMemcpy(gpu_model_weights_device(&r[k]), wa.data(), P * sizeof(uint16_t), cudaMemcpyHostToDevice));
        }
    }
    CHECK(norm_ok, "zero1: the slices' sums of squares, in rank order, give the norm (and plain DP's the same bits)",
          "worst relative difference %.3g", worst_norm);
    CHECK(steps_ok, "zero1: 3 AdamW steps on the slices equal the full step bit for bit (masters, m, v, BF16)",
          "a slice differs");

    // set_params / set_opt_state of full host arrays: each rank keeps its slice.
    for (size_t i = 0; i < P; i++) pa[i] = 0.5f * pa[i] + 1e-3f, ma[i] = -ma[i], va[i] = 2.0f * va[i];
    gpu_model_set_params(&a, pa.data());
    wa = from_device(gpu_model_weights_device(&a), P);
    int set_ok = 1;
    for (int k = 0; k < W_RANKS; k++) {
        gpu_model_set_params(&r[k], pa.data());
        gpu_model_set_opt_state(&r[k], ma.data(), va.data(), 17);
        float *mp, *mm, *mv;
        gpu_model_state_device(&r[k], &mp, &mm, &mv);
        std::vector<uint16_t> wr = from_device(gpu_model_weights_device(&r[k]), P);
        set_ok &= slice_equal(mp, &r[k], pa) && slice_equal(mm, &r[k], ma) && slice_equal(mv, &r[k], va) &&
                  !memcmp(wr.data(), wa.data(), P * sizeof(uint16_t)) && r[k].step == 17;
    }
    CHECK(set_ok, "zero1: set_params / set_opt_state keep each rank's slice, all BF16 weights", "differ");

    for (int k = 0; k < W_RANKS; k++) gpu_model_free(&r[k]);
    gpu_model_free(&a);
}

int main(void) {
    plan_tests();
    if (!gpu_test_have_gpu("test_zero1_gpu (simulated ranks)")) return test_summary("test_zero1_gpu");
    simulated_ranks();
    return test_summary("test_zero1_gpu");
}
