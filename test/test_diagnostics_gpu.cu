// test_diagnostics_gpu.cu: the FP8-attention diagnostics on the GPU backend (gpu_model_probe in
// model_gpu_probe.c, diagnostics.c's GPU path) against the same events on the CPU backend, on
// test_diagnostics.c's model (2 layers, 2 heads of 64, T = 128, QKV weights scaled by 12 so that
// attention ranges from diffuse to sharp):
//  - fp8_dm: every layer's cancellation-scaled row-sum residual <= 1e-5 on the GPU; fp8_naive far
//    above; the per-layer gradient errors against the BF16 reference have the CPU's size (ratio
//    in [1/3, 3]: the two backends round differently, the FP8 effect must not vanish or double);
//    the bias ratio is a ratio (in (0, 1]);
//  - a probe leaves the training state as it was: the gradients in the buffer, the attention
//    precision, and the next forward's loss are those of a model that never probed.
// Without a GPU: one "skipped" line.
#include <math.h>    // fabs, isfinite
#include <stdint.h>  // int32_t
#include <string.h>  // memcmp
#include <vector>    // buffers

#include "core/config.h"       // Config
#include "eval/diagnostics.h"  // the module under test
#include "gpu_test.h"          // gpu_test_have_gpu
#include "cpu/model_cpu.h"     // CpuModel
#include "gpu/model_gpu.h"     // GpuModel, gpu_model_probe
#include "model_test.h"        // make_config, make_batch
#include "test.h"              // CHECK, test_summary

enum { B = 2, T = 128, N_BIAS = 4 };
static const char *JSON =
    "{\"model\": {\"d_model\": 128, \"n_layer\": 2, \"n_head\": 2, \"ffn_hidden\": 96, \"vocab_size\": 1024,"
    " \"seq_len\": 128}, \"train\": {\"micro_batch\": 2},"
    " \"diagnostics\": {\"interval\": 10, \"bias_probe_batches\": 4, \"reference\": \"bf16\"}}";

// Parameters with the QKV weights scaled up (sharp attention in some rows), the same on both.
static std::vector<float> scaled_params(const Config &c) {
    ParamTable t;
    param_table_build(&t, &c.model);
    std::vector<float> p(t.total);
    params_init(&t, &c.model, 5, p.data());
    for (int l = 0; l < c.model.n_layer; l++) {
        const ParamDesc *d = param_find(&t, P_QKV, l);
        for (size_t j = 0; j < d->numel; j++) p[d->offset + j] *= 12.0f;
    }
    param_table_free(&t);
    return p;
}

struct Events {
    DiagReport cpu, gpu;
    std::vector<DiagLayer> lc, lg;
};

static void run_events(const char *mode, const int32_t *in, const int32_t *tg, Events *ev) {
    const char *ov[] = {mode};
    Config c = make_config(JSON, ov, 1);
    AttnOptions ao;
    attn_options_from_config(&ao, &c.precision);
    attn_mode_block_sizes(&ao, c.model.head_dim, &c.precision.attention_block_q, &c.precision.attention_block_k);
    std::vector<float> p = scaled_params(c);
    CpuModel cm;
    cpu_model_init(&cm, &c, B, T, 5);
    memcpy(cm.params, p.data(), p.size() * sizeof(float));
    GpuModel gm;
    ErrBuf e;
    if (gpu_model_init(&gm, &c, B, T, 5, NULL, &e)) {
        CHECK(0, "diagnostics gpu: gpu_model_init", "%s", e.msg);
        exit(1);
    }
    gpu_model_set_params(&gm, p.data());
    Diagnostics dc, dg;
    diagnostics_init_batches(&dc, &c, B, T, in, tg, N_BIAS);
    diagnostics_init_batches(&dg, &c, B, T, in, tg, N_BIAS);
    ev->cpu = *diagnostics_run(&dc, &cm, NULL, 10, NULL, stdout);
    ev->lc.assign(ev->cpu.layers, ev->cpu.layers + ev->cpu.n_layer);
    ev->gpu = *diagnostics_run(&dg, NULL, &gm, 10, NULL, stdout);
    ev->lg.assign(ev->gpu.layers, ev->gpu.layers + ev->gpu.n_layer);
    ev->cpu.layers = ev->lc.data();
    ev->gpu.layers = ev->lg.data();
    diagnostics_free(&dc);
    diagnostics_free(&dg);
    cpu_model_free(&cm);
    gpu_model_free(&gm);
}

// A probe between steps changes nothing a training step can see.
static void state_untouched(const int32_t *in, const int32_t *tg) {
    const char *ov[] = {"precision.attention=\"fp8_dm\""};
    Config c = make_config(JSON, ov, 1);
    std::vector<float> p = scaled_params(c);
    GpuModel a, b;
    ErrBuf e;
    gpu_model_init(&a, &c, B, T, 5, NULL, &e);
    gpu_model_init(&b, &c, B, T, 5, NULL, &e);
    gpu_model_set_params(&a, p.data());
    gpu_model_set_params(&b, p.data());
    gpu_model_set_loss_scale(&a, 0.5f);
    gpu_model_set_loss_scale(&b, 0.5f);
    // both accumulate one micro-batch; a then probes another batch
    gpu_model_forward(&a, in, tg);
    gpu_model_backward(&a, 0.5f);
    gpu_model_forward(&b, in, tg);
    gpu_model_backward(&b, 0.5f);
    ModelProbe run, ref;
    gpu_probe_alloc(&run, &a, 0);
    gpu_probe_alloc(&ref, &a, 1);
    gpu_model_probe(&a, ATTN_BF16, ATTN_N_PRECISIONS, in + B * T, tg + B * T, NULL, &ref);
    gpu_model_probe(&a, ATTN_FP8_DM, ATTN_BF16, in + B * T, tg + B * T, &ref, &run);
    size_t P = a.table.total;
    std::vector<float> ga(P), gb(P);
    gpu_model_get_grads(&a, ga.data());
    gpu_model_get_grads(&b, gb.data());
    CHECK(!memcmp(ga.data(), gb.data(), P * sizeof(float)), "diagnostics gpu: a probe leaves the gradients as they were",
          "differ");
    CHECK(gpu_model_attention(&a) == ATTN_FP8_DM && a.loss_scale == 0.5f,
          "diagnostics gpu: a probe restores the attention precision and the loss scale", "precision %d scale %g",
          (int)gpu_model_attention(&a), (double)a.loss_scale);
    float la = gpu_model_loss(&a, in, tg), lb = gpu_model_loss(&b, in, tg);
    CHECK(la == lb, "diagnostics gpu: the next forward after a probe gives the same loss", "%.7f vs %.7f", la, lb);
    double num = 0, den = 0;
    for (int l = 0; l < run.n_layer; l++)
        for (int k = 0; k < 6; k += 2) num += run.cmp_sq[6 * l + k], den += run.cmp_sq[6 * l + k + 1];
    CHECK(den > 0 && num > 0 && num < den, "diagnostics gpu: the probe compared its dq, dk, dv with the reference's",
          "sum diff^2 %.3e sum ref^2 %.3e", num, den);
    gpu_probe_free(&run);
    gpu_probe_free(&ref);
    gpu_model_free(&a);
    gpu_model_free(&b);
}

int main(void) {
    if (!gpu_test_have_gpu("test_diagnostics_gpu")) return test_summary("test_diagnostics_gpu");
    std::vector<int32_t> in(N_BIAS * B * T), tg(N_BIAS * B * T);
    make_batch(in.data(), tg.data(), N_BIAS * B, T, 1024);  // ids < 1024
    Events dm, nv;
    run_events("precision.attention=\"fp8_dm\"", in.data(), tg.data(), &dm);
    run_events("precision.attention=\"fp8_naive\"", in.data(), tg.data(), &nv);
    for (int l = 0; l < dm.gpu.n_layer; l++) {
        char name[160];
        snprintf(name, sizeof name, "diagnostics gpu: fp8_dm layer %d rows of dS sum to zero (cancel max <= 1e-5)", l);
        CHECK(dm.lg[l].resid_cancel_max <= 1e-5, name, "%.3e", dm.lg[l].resid_cancel_max);
        snprintf(name, sizeof name, "diagnostics gpu: fp8_naive layer %d does not (cancel max > 1e-3)", l);
        CHECK(nv.lg[l].resid_cancel_max > 1e-3, name, "%.3e", nv.lg[l].resid_cancel_max);
        const Events *evs[2] = {&dm, &nv};
        for (const Events *ev : evs) {
            double rg = ev->lg[l].err_qkv, rc = ev->lc[l].err_qkv, lg = ev->lg[l].local_qkv, lc = ev->lc[l].local_qkv;
            printf("# %s layer %d: err_qkv gpu %.3e cpu %.3e | local gpu %.3e cpu %.3e | cancel max gpu %.3e cpu %.3e\n",
                   attn_precision_name(ev->gpu.mode), l, rg, rc, lg, lc, ev->lg[l].resid_cancel_max,
                   ev->lc[l].resid_cancel_max);
            snprintf(name, sizeof name, "diagnostics gpu: %s layer %d gradient error vs bf16 has the CPU's size",
                     attn_precision_name(ev->gpu.mode), l);
            CHECK(rc > 0 && rg / rc > 1.0 / 3 && rg / rc < 3 && lc > 0 && lg / lc > 1.0 / 3 && lg / lc < 3, name,
                  "end to end gpu %.3e cpu %.3e, local gpu %.3e cpu %.3e", rg, rc, lg, lc);
        }
    }
    CHECK(fabs(dm.gpu.loss_ref - dm.cpu.loss_ref) < 1e-2 * fabs(dm.cpu.loss_ref),
          "diagnostics gpu: the reference probe's loss matches the CPU's", "gpu %.5f cpu %.5f", dm.gpu.loss_ref,
          dm.cpu.loss_ref);
    CHECK(dm.gpu.bias_n == N_BIAS && dm.gpu.bias_ratio > 0 && dm.gpu.bias_ratio <= 1.0 + 1e-9,
          "diagnostics gpu: the bias ratio over the probe batches is a ratio", "n %d ratio %.4f (cpu %.4f)",
          dm.gpu.bias_n, dm.gpu.bias_ratio, dm.cpu.bias_ratio);
    printf("# bias ratio fp8_dm gpu %.3f cpu %.3f | fp8_naive gpu %.3f cpu %.3f (1/sqrt(N) = %.3f)\n", dm.gpu.bias_ratio,
           dm.cpu.bias_ratio, nv.gpu.bias_ratio, nv.cpu.bias_ratio, 1.0 / sqrt((double)N_BIAS));
    state_untouched(in.data(), tg.data());
    return test_summary("test_diagnostics_gpu");
}
