// test_eval_gpu.cu: the GPU's evaluation outputs against the CPU's (gpu_model_loss_detail,
// cpu_model_loss_detail): per-token losses that average to gpu_model_loss, agree with the CPU's
// per token, and zero where a target is ignored; answer-row logits that give the row's loss and
// match the CPU's; in BF16 and in each FP8 attention mode, and with an FP8 LM head. Skipped
// without a GPU.
#include <math.h>    // fabs, exp, log
#include <string.h>  // memcpy

#include <vector>  // host buffers

#include "attention/kernels_bf16.h"  // attn_gpu_block_sizes: the kernels' block sizes
#include "gpu_test.h"    // gpu_test_have_gpu
#include "model_test.h"  // TINY_JSON, make_config, make_batch, rel_l2

static double log_softmax_at(const float *row, int V, int target) {
    double mx = row[0], sum = 0;
    for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
    for (int j = 0; j < V; j++) sum += exp(row[j] - mx);
    return row[target] - mx - log(sum);
}

// logits_tol: the rows' logits against the CPU's. FP8 code differences between the backends
// (an input a rounding apart lands on the next code) reach the logits: measured on an H200, worst
// of the four rows, below 2e-2 in BF16, 2.3e-2 with FP8 attention, 6.6e-2 with the FP8 LM head too
// (test_model_gpu_fp8's next-logit bounds, for the same reason).
static void check_mode(const char *label, const char *const *sets, int n_sets, double logits_tol) {
    Config c = make_config(TINY_JSON, sets, n_sets);
    attn_gpu_block_sizes(c.model.head_dim, &c.precision.attention_block_q, &c.precision.attention_block_k);
    const int B = c.train.micro_batch, T = c.model.seq_len, BT = B * T, V = c.model.vocab_size,
              Vp = c.model.padded_vocab_size;
    std::vector<int32_t> tokens(BT), targets(BT);
    make_batch(tokens.data(), targets.data(), B, T, V);
    CpuModel cpu;
    cpu_model_init(&cpu, &c, B, T, 77);
    GpuModel gpu;
    ErrBuf e;
    char name[200];
    int rc = gpu_model_init(&gpu, &c, B, T, 77, NULL, &e);
    snprintf(name, sizeof name, "%s: gpu_model_init", label);
    CHECK(rc == 0, name, "%s", e.msg);
    if (rc) { cpu_model_free(&cpu); return; }
    const int rows[4] = {0, T - 1, T + 5, BT - 2};
    std::vector<float> gl(BT), cl(BT), glog(4 * (size_t)Vp), clog(4 * (size_t)Vp);
    float g = gpu_model_loss_detail(&gpu, tokens.data(), targets.data(), gl.data(), 4, rows, glog.data());
    float c_ = cpu_model_loss_detail(&cpu, tokens.data(), targets.data(), cl.data(), 4, rows, clog.data());
    float plain = gpu_model_loss(&gpu, tokens.data(), targets.data());
    double sum = 0;
    int counted = 0, zeros = 1;
    for (int i = 0; i < BT; i++) {
        if (targets[i] >= 0) sum += gl[i], counted++;
        else zeros &= gl[i] == 0.0f;
    }
    snprintf(name, sizeof name, "%s: per-token losses average to gpu_model_loss, 0 where ignored", label);
    CHECK(fabs(g - plain) <= 1e-6 * fabs(plain) && fabs(sum / counted - plain) < 1e-4 * fabs(plain) && zeros, name,
          "detail %.7f plain %.7f mean %.7f zeros %d", g, plain, sum / counted, zeros);
    double worst = 0;
    for (int i = 0; i < BT; i++) worst = fmax(worst, fabs(gl[i] - cl[i]));
    snprintf(name, sizeof name, "%s: per-token losses match the CPU's (|d| < 0.05)", label);
    CHECK(worst < 0.05, name, "max |d| %.4f (loss cpu %.5f gpu %.5f)", worst, c_, g);
    double self = 0, vs_cpu = 0;
    for (int r = 0; r < 4; r++) {
        if (targets[rows[r]] >= 0)
            self = fmax(self, fabs(-log_softmax_at(&glog[(size_t)r * Vp], V, targets[rows[r]]) - gl[rows[r]]));
        vs_cpu = fmax(vs_cpu, rel_l2(&glog[(size_t)r * Vp], &clog[(size_t)r * Vp], (size_t)V, NULL));
    }
    snprintf(name, sizeof name, "%s: row logits give the row's loss (|d| < 2e-2)", label);
    CHECK(self < 2e-2, name, "max |d| %.4f", self);
    snprintf(name, sizeof name, "%s: row logits match the CPU's (rel L2 < %.0e)", label, logits_tol);
    CHECK(vs_cpu < logits_tol, name, "rel L2 %.3e", vs_cpu);
    gpu_model_free(&gpu);
    cpu_model_free(&cpu);
}

int main(void) {
    if (!gpu_test_have_gpu("test_eval_gpu")) return 0;
    const char *bf16[] = {"precision.attention=bf16"};
    const char *naive[] = {"precision.attention=fp8_naive"};
    const char *hybrid[] = {"precision.attention=fp8_hybrid"};
    const char *dm[] = {"precision.attention=fp8_dm"};
    const char *fp8_head[] = {"precision.attention=fp8_dm", "precision.linear=fp8_tensor",
                              "precision.linear_keep_lm_head_bf16=false", "precision.linear_grad_format=e5m2"};
    check_mode("bf16", bf16, 1, 2e-2);
    check_mode("fp8_naive", naive, 1, 5e-2);
    check_mode("fp8_hybrid", hybrid, 1, 5e-2);
    check_mode("fp8_dm", dm, 1, 5e-2);
    check_mode("fp8_dm + fp8_tensor head", fp8_head, 4, 1e-1);
    return test_summary("test_eval_gpu");
}
