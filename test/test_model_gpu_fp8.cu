// test_model_gpu_fp8.cu: FP8 in the GPU model against the CPU backend's emulation of the same mode:
// FP8 linear layers (precision.linear = fp8_tensor | fp8_block, model_gpu.cu's lin_forward /
// lin_dgrad / lin_wgrad, contract in linear_fp8.c) and FP8 attention (precision.attention =
// fp8_naive | fp8_hybrid | fp8_dm | fp8_dm_approx through attention_fp8.h), alone and together.
//
// Everywhere (host code only): model.c's memory_plan (what --dry-run prints) equals
// gpu_model_plan byte for byte in FP8 modes, the FP8 slots (workspace), FP8 weight copies
// (weights) and saved Q(x^T) (activations) / quantized attention operands are the only
// difference from BF16, and the configs the GPU refuses (an fp8_tensor LM head, B*T or widths not
// multiples of 16, fp32 attention) are user errors with messages naming the field. Without a GPU: then one "skipped" line, exit 0.
// With a GPU, on test_model_gpu.cu's tiny config and batches (d 128, 2 layers, 2 heads of 64,
// SwiGLU 352, B 8, T 64):
//   bf16: the numbers of test_model_gpu's "base" case (same batches, same seed), printed in
//   the same format, and no FP8 GEMM runs.
//   each FP8 mode: GPU vs CPU in the same mode (the CPU emulating the GPU kernels' tiles): the
//   loss, EVERY parameter gradient (rel L2 against a bound from the CPU's own FP8 effect on the
//   tensor, printed), the size and direction of the FP8 effect on the GPU against the CPU's
//   (catches an FP8 path that is silently BF16, a wrong format, or an error that is not the
//   emulation's), the number of FP8 GEMMs (12 per FP8 block per step), next-token logits, and
//   10 AdamW steps, after which the persistent FP8 weights were quantized exactly once per FP8
//   linear per step and are not stale (the loss equals a fresh model's given the parameters). keep-first/last options: layer 0 or layer 1 kept BF16 (6 -> 12 FP8 GEMMs),
//   and both kept (all BF16: the same gradients as the BF16 run).
//   The row-sum invariant inside the model: fp8_dm's rows of dS sum to zero in every layer.
//   Fused quantization (fp8_block, layers_fp8.h: 4 producers writing codes per FP8 block per
//   forward + backward, 3 per evaluation forward; fp8_tensor, layers.h's *_amax_gpu: 6 producers
//   taking the amax, 3 per evaluation forward); the fused model against the same model with separate
//   quantization passes (precision.fuse_fp8_producers false), with and without train.recompute: losses
//   and the last block's MLP / attention-projection gradients bit-identical, the rest within the
//   model's run-to-run distance (attention dQ atomics).
//   Timing (information): the 125M config's and paper_569m's shapes (B 4 x T 4096) in bf16,
//   fp8_tensor and fp8_block, steps split into forward / backward / optimizer, and a CUDA-event
//   breakdown of the linears (BF16 GEMMs vs FP8 GEMMs + each quantization), fp8_block with the
//   fusion off ("fp8_block unfused"), and the fused producers against layer + separate
//   quantization ("# fused" lines). FP8_SKIP_TIMING=1 skips it.
#include <cuda_runtime.h>  // cudaGetDeviceCount (via gpu_test.h)
#include <math.h>          // sqrt, isfinite, fabs
#include <stdint.h>        // int32_t
#include <stdio.h>         // printf
#include <stdlib.h>        // exit
#include <string.h>        // memcmp, strstr
#include <vector>          // host buffers
#include <algorithm>       // std::max

#include "attention_fp8.h"       // attn_mode_block_sizes (the CPU emulates those tiles), AttnModeDiag
#include "gpu/cuda_check.h"      // CUDA_CHECK
#include "core/common.h"         // ErrBuf, now_seconds
#include "core/config.h"         // Config, config_parse
#include "gpu_test.h"            // gpu_test_have_gpu
#include "cpu/linear_fp8.h"      // linear_precision_of: which blocks run FP8
#include "gpu/linear_fp8_gpu.h"  // the timing breakdown's quantizations and FP8 GEMMs
#include "gpu/layers.h"          // the timing breakdown's unfused producers
#include "gpu/layers_fp8.h"      // ... and the fused ones
#include "gpu/matmul.h"          // the timing breakdown's BF16 GEMMs
#include "core/model.h"          // memory_plan, model_flops_per_token
#include "cpu/model_cpu.h"       // the reference backend
#include "gpu/model_gpu.h"       // the backend under test
#include "optimizer.h"           // AdamW, grad_global_norm, grad_clip_factor
#include "core/gpu_sizes.h"      // gpu_attn_saved_codes_bytes (the documented cost), GPU_HEAD_CHUNK_TOKENS
#include "model_test.h"          // TINY_JSON, make_config, make_batch, rel_l2
#include "test.h"                // CHECK, test_summary


// --- host-only: plans and user errors --------------------------------------------------------------
static int fp8_layers_of(const Config &c) {
    int n = 0;
    for (int l = 0; l < c.model.n_layer; l++) n += linear_precision_of(&c.precision, c.model.n_layer, l) != LINEAR_BF16;
    return n;
}

static void plan_tests(void) {
    const char *modes[] = {"precision.linear=\"fp8_tensor\"", "precision.linear=\"fp8_block\""};
    const char *big[] = {"model.d_model=768", "model.n_head=6", "model.ffn_hidden=2048", "model.seq_len=1024",
                         "model.n_layer=3", "model.tied_embeddings=true", "train.micro_batch=16"};
    const char *odd[] = {"model.d_model=192", "model.n_head=3", "model.ffn_hidden=528", "train.micro_batch=3"};
    const char *rc_qk[] = {"train.recompute=true", "model.qk_norm=true"};
    const char *keep[] = {"model.n_layer=4", "precision.linear_bf16_first_layers=1",
                          "precision.linear_bf16_last_layers=1"};
    struct { const char *label; const char *const *ov; int n; } shapes[] = {
        {"tiny", NULL, 0}, {"d768 B16 T1024", big, 7}, {"d192 F528 B3 (partial 128-groups)", odd, 4},
        {"tiny recompute qk_norm", rc_qk, 2}, {"4 layers, first and last bf16", keep, 3}};
    // (the third: fp8_tensor with delayed scaling, whose scales' amaxes the plan counts too)
    const char *mode_names[] = {modes[0], modes[1], "precision.linear=\"fp8_tensor\" delayed"};
    for (int mi = 0; mi < 3; mi++)
        for (auto &s : shapes) {
            std::vector<const char *> ov(s.ov, s.ov + s.n);
            ov.push_back(modes[mi % 2]);
            if (mi == 2) ov.push_back("precision.linear_scaling=\"delayed\"");
            Config c = make_config(TINY_JSON, ov.data(), (int)ov.size());
            Config cb = make_config(TINY_JSON, s.ov, s.n);  // the same shape in BF16
            int B = c.train.micro_batch, T = c.model.seq_len;
            MemoryPlan dry, gpu, dry_b, gpu_b;
            ErrBuf e;
            char name[220];
            memory_plan(&c, 1, 0, B, &dry);
            int rc = gpu_model_plan(&c, B, T, &gpu, &e);
            snprintf(name, sizeof name, "plan %s %s: gpu_model_plan accepts it", s.label, mode_names[mi]);
            CHECK(rc == 0, name, "%s", rc ? e.msg : "");
            snprintf(name, sizeof name, "plan %s %s: --dry-run's plan equals the GPU allocation in every category",
                     s.label, mode_names[mi]);
            CHECK(rc == 0 && !memcmp(&dry, &gpu, sizeof dry), name,
                  "dry/gpu: weights %zu/%zu master %zu/%zu opt %zu/%zu grads %zu/%zu act %zu/%zu ws %zu/%zu total "
                  "%zu/%zu",
                  dry.weights, gpu.weights, dry.master, gpu.master, dry.optimizer, gpu.optimizer, dry.grads,
                  gpu.grads, dry.activations, gpu.activations, dry.workspace, gpu.workspace, dry.total, gpu.total);
            memory_plan(&cb, 1, 0, B, &dry_b);
            gpu_model_plan(&cb, B, T, &gpu_b, &e);
            // FP8 adds: workspace, 2 code slots (BT*max(3C,2F) bytes each: Q(x) / Q(dy) and
            // Q(dy^T)) and their scales (the FP8 GEMMs share matmul.cu's cuBLASLt workspace), and
            // with per-tensor weights the dgrad's Q(W^T) of the largest weight (max(3C, 2F)*C);
            // weights, per FP8 block Q(W) and Q(W^T) of its 4 linears (2 bytes a weight; per
            // tensor Q(W) alone, 1 byte: gpu_sizes.h's gpu_fp8_keeps_weight_t);
            // activations, per FP8 block Q(x^T) of the 4 linears' inputs (BT*(3C+F) bytes), and it
            // drops that block's BF16 h1, h2, sw (2*BT*(2C+F) bytes, model.h's
            // gpu_keeps_linear_inputs: its wgrads read Q(x^T); with recompute none were kept).
            size_t BT = (size_t)B * T, C = c.model.d_model, F = c.model.ffn_hidden;
            size_t wide = 3 * C > 2 * F ? 3 * C : 2 * F, nf = (size_t)fp8_layers_of(c);
            const int tensor = c.precision.linear == LINEAR_FP8_TENSOR;
            size_t min_ws = 2 * BT * wide + (tensor ? (3 * C > 2 * F ? 3 * C : 2 * F) * C : 0);
            size_t min_w = nf * (tensor ? 1 : 2) * (4 * C * C + 3 * C * F), min_a = nf * BT * (3 * C + F);
            size_t dropped = c.train.recompute ? 0 : nf * (2 * gpu_align256(2 * BT * C) + gpu_align256(2 * BT * F));
            size_t ex_ws = gpu.workspace - gpu_b.workspace, ex_w = gpu.weights - gpu_b.weights;
            size_t ex_a = gpu.activations + dropped - gpu_b.activations;
            printf("# plan %s %s: FP8 slots %.3f MiB, FP8 weights %.3f MiB, saved Q(x^T) %.3f MiB (codes alone %.3f, "
                   "%.3f, %.3f MiB)\n", s.label, mode_names[mi], ex_ws / 1048576.0, ex_w / 1048576.0, ex_a / 1048576.0,
                   min_ws / 1048576.0, min_w / 1048576.0, min_a / 1048576.0);
            snprintf(name, sizeof name, "plan %s %s: FP8 adds slots (workspace), Q(W) (+ Q(W^T)) (weights), Q(x^T) "
                     "(activations) and drops the BF16 h1, h2, sw, nothing else", s.label, mode_names[mi]);
            auto near = [](size_t ex, size_t lo, size_t n_bufs) {  // codes + scales (<= 1/4) + padding
                return ex >= lo && ex <= lo + lo / 4 + 512 * n_bufs;
            };
            CHECK(gpu.master == gpu_b.master && gpu.optimizer == gpu_b.optimizer && gpu.grads == gpu_b.grads &&
                      gpu.weights >= gpu_b.weights && gpu.activations + dropped >= gpu_b.activations &&
                      gpu.workspace >= gpu_b.workspace && near(ex_ws, min_ws, 6) && near(ex_w, min_w, 16 * nf) &&
                      near(ex_a, min_a, 8 * nf) && !memcmp(&dry_b, &gpu_b, sizeof dry_b),
                  name, "workspace +%zu (>= %zu), weights +%zu (>= %zu), activations +%zu (>= %zu)", ex_ws, min_ws,
                  ex_w, min_w, ex_a, min_a);
        }
    // User errors.
    ErrBuf e;
    MemoryPlan mp;
    const char *ov_head[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_keep_lm_head_bf16=false"};
    const char *ov_tns_head_base[] = {"precision.linear=\"fp8_tensor\""};
    const char *ov_blk_head_base[] = {"precision.linear=\"fp8_block\""};
    Config c = make_config(TINY_JSON, ov_head, 2), c0 = make_config(TINY_JSON, ov_tns_head_base, 1);
    {  // an fp8_tensor LM head (its scales the micro-batch's): per-tensor Q(W), Q(W^T) (weights), Q(hf^T)
        MemoryPlan mp_t, mp_t0, dry_t;
        const size_t Vp = c.model.padded_vocab_size, C = c.model.d_model;
        int rc = gpu_model_plan(&c, c.train.micro_batch, c.model.seq_len, &mp_t, &e);
        const int rc0 = gpu_model_plan(&c0, c.train.micro_batch, c.model.seq_len, &mp_t0, &e);
        memory_plan(&c, 1, 0, c.train.micro_batch, &dry_t);
        CHECK(rc == 0 && rc0 == 0 && !memcmp(&dry_t, &mp_t, sizeof dry_t) &&
                  mp_t.weights >= mp_t0.weights + 2 * Vp * C && mp_t.workspace > mp_t0.workspace,
              "plan: an fp8_tensor LM head is planned and --dry-run's plan equals the GPU allocation",
              "rc %d/%d weights %zu vs %zu (dry %zu), workspace %zu vs %zu (dry %zu)", rc, rc0, mp_t.weights,
              mp_t0.weights, dry_t.weights, mp_t.workspace, mp_t0.workspace, dry_t.workspace);
    }
    int rc;
    const char *ov_bhead[] = {"precision.linear=\"fp8_block\"", "precision.linear_keep_lm_head_bf16=false"};
    Config cb = make_config(TINY_JSON, ov_bhead, 2), cb0 = make_config(TINY_JSON, ov_blk_head_base, 1);
    MemoryPlan mp_h, mp_0, dry_h;
    const int hB = cb.train.micro_batch, hT = cb.model.seq_len;
    rc = gpu_model_plan(&cb, hB, hT, &mp_h, &e);
    int rc0 = gpu_model_plan(&cb0, hB, hT, &mp_0, &e);
    memory_plan(&cb, 1, 0, hB, &dry_h);
    CHECK(rc == 0 && !memcmp(&dry_h, &mp_h, sizeof dry_h), "plan: with an fp8_block LM head --dry-run's plan equals "
          "the GPU allocation", "rc %d: weights %zu/%zu ws %zu/%zu act %zu/%zu", rc, dry_h.weights, mp_h.weights,
          dry_h.workspace, mp_h.workspace, dry_h.activations, mp_h.activations);
    {
        // the head's Q(W) and Q(W^T) (Vp x C codes each, with 128x128 scales) are weights
        const size_t Vp = cb.model.padded_vocab_size, C = cb.model.d_model;
        CHECK(rc == 0 && rc0 == 0 && mp_h.weights >= mp_0.weights + 2 * Vp * C && mp_h.workspace > mp_0.workspace &&
                  mp_h.activations == mp_0.activations,
              "plan: an fp8_block LM head is planned (its weights' codes, its chunk's operands)",
              "rc %d/%d weights %zu vs %zu, workspace %zu vs %zu", rc, rc0, mp_h.weights, mp_0.weights, mp_h.workspace,
              mp_0.workspace);
    }
    {
        // wgrad operands in 128x128 blocks: fewer scales for the saved Q(x^T) (activations) and the
        // head's Q(hf^T) (workspace); the dry run agrees
        const char *ov_wb[] = {"precision.linear=\"fp8_block\"", "precision.linear_keep_lm_head_bf16=false",
                               "precision.linear_wgrad_blocks=\"activation\""};
        Config cw = make_config(TINY_JSON, ov_wb, 3);
        MemoryPlan mp_w, dry_w;
        rc = gpu_model_plan(&cw, hB, hT, &mp_w, &e);
        memory_plan(&cw, 1, 0, hB, &dry_w);
        CHECK(rc == 0 && !memcmp(&dry_w, &mp_w, sizeof dry_w) && mp_w.activations <= mp_h.activations &&
                  mp_w.weights == mp_h.weights,
              "plan: with x^T in 128x128 blocks (linear_wgrad_blocks) --dry-run's plan equals the GPU allocation",
              "rc %d: act %zu/%zu (1x128: %zu) ws %zu/%zu", rc, dry_w.activations, mp_w.activations, mp_h.activations,
              dry_w.workspace, mp_w.workspace);
    }
    const char *ov_blk[] = {"precision.linear=\"fp8_block\""};
    c = make_config(TINY_JSON, ov_blk, 1);
    rc = gpu_model_plan(&c, 1, 63, &mp, &e);
    CHECK(rc == -1 && strstr(e.msg, "multiple of 16") && strstr(e.msg, "63"),
          "plan: fp8 with B*T = 63 tokens is a user error", "rc %d msg %s", rc, rc ? e.msg : "");
    rc = gpu_model_plan(&c, 1, 48, &mp, &e);
    CHECK(rc == 0, "plan: fp8 with B*T = 48 tokens is accepted", "%s", rc ? e.msg : "");
    c.model.ffn_hidden = 344;  // a multiple of 8 (BF16 is fine) but not of 16
    rc = gpu_model_plan(&c, 8, 64, &mp, &e);
    CHECK(rc == -1 && strstr(e.msg, "ffn_hidden") && strstr(e.msg, "344"),
          "plan: fp8 with ffn_hidden 344 is a user error", "rc %d msg %s", rc, rc ? e.msg : "");
    c = make_config(TINY_JSON, NULL, 0);
    c.model.ffn_hidden = 344;
    rc = gpu_model_plan(&c, 8, 64, &mp, &e);
    CHECK(rc == 0, "plan: bf16 with ffn_hidden 344 is still accepted", "%s", rc ? e.msg : "");
    const char *ov_att[] = {"precision.linear=\"fp8_tensor\"", "precision.attention=\"fp8_dm\""};
    c = make_config(TINY_JSON, ov_att, 2);
    rc = gpu_model_plan(&c, 8, 64, &mp, &e);
    CHECK(rc == 0, "plan: FP8 attention with FP8 linears is accepted", "%s", rc ? e.msg : "");
    const char *ov_del[] = {"precision.attention=\"fp8_dm\"", "precision.attention_scaling=\"delayed\""};
    c = make_config(TINY_JSON, ov_del, 2);
    rc = gpu_model_plan(&c, 8, 64, &mp, &e);
    CHECK(rc == 0, "plan: delayed attention scaling is accepted on the GPU", "rc %d msg %s", rc, rc ? e.msg : "");
    const char *ov_f32[] = {"precision.attention=\"fp32\""};
    c = make_config(TINY_JSON, ov_f32, 1);
    rc = gpu_model_plan(&c, 8, 64, &mp, &e);
    CHECK(rc == -1 && strstr(e.msg, "fp32"), "plan: fp32 attention is a user error on the GPU", "rc %d msg %s", rc,
          rc ? e.msg : "");
    // FP8 attention: --dry-run's plan equals the GPU allocation; the workspace grows by the codes
    // and transposed codes of Q, K, V, dO (8 * B*H*Tp*d bytes), their scales and (hybrid) the
    // dequantized Q̂ K̂ V̂ (6 * B*T*C bytes); with precision.attention_keep_codes (the default) the
    // activations by the kept Q, K, V per layer (6 * B*H*Tp*d bytes + scales) less the BF16 qkv
    // that the backward then does not read (6 * B*T*C bytes, model.h's gpu_keeps_qkv), else not at all.
    const char *amodes[] = {"precision.attention=\"fp8_naive\"", "precision.attention=\"fp8_hybrid\"",
                            "precision.attention=\"fp8_dm\"", "precision.attention=\"fp8_dm_approx\""};
    for (int ai = 0; ai < 4; ai++)
        for (int sh = 0; sh < 2; sh++)  // tiny (T 64 pads to 128) and T 1024
            for (int keep = 0; keep < 2; keep++) {
                const char *ov[] = {amodes[ai], keep ? "precision.attention_keep_codes=true"
                                                     : "precision.attention_keep_codes=false", "model.seq_len=1024"};
                const char *ovb[] = {"model.seq_len=1024"};
                Config ca = make_config(TINY_JSON, ov, sh ? 3 : 2), cb = make_config(TINY_JSON, ovb, sh ? 1 : 0);
                int B = ca.train.micro_batch, T = ca.model.seq_len, L = ca.model.n_layer;
                MemoryPlan dry, gpu, gpu_b;
                char name[220];
                memory_plan(&ca, 1, 0, B, &dry);
                rc = gpu_model_plan(&ca, B, T, &gpu, &e);
                gpu_model_plan(&cb, B, T, &gpu_b, &e);
                size_t Tp = (T + 127) / 128 * 128, C = ca.model.d_model, codes = 8 * (size_t)B * Tp * C;
                size_t extra = gpu.workspace - gpu_b.workspace, deq = ai == 1 ? 6 * (size_t)B * T * C : 0;
                size_t kept = keep ? (size_t)L * 6 * B * Tp * C : 0;
                size_t qkv = keep ? (size_t)L * gpu_align256(6 * (size_t)B * T * C) : 0;
                size_t extra_a = gpu.activations + qkv - gpu_b.activations;
                snprintf(name, sizeof name, "plan %s keep_codes %d T %d: --dry-run's plan equals the GPU allocation, "
                         "workspace +codes, activations +%s", amodes[ai], keep, T,
                         keep ? "kept Q, K, V - BF16 qkv" : "nothing");
                CHECK(rc == 0 && !memcmp(&dry, &gpu, sizeof dry) && gpu.activations + qkv >= gpu_b.activations &&
                          extra_a >= kept && extra_a < kept + (keep ? L * 4096 : 1) && extra >= codes + deq &&
                          extra < codes + deq + 64 * 1024,
                      name, "rc %d dry ws %zu gpu ws %zu, extra %zu expected %zu; activations extra %zu expected %zu",
                      rc, dry.workspace, gpu.workspace, extra, codes + deq, extra_a, kept);
                if (keep && sh)
                    printf("# plan %s T %d: kept Q, K, V codes %.3f MiB per layer (6 bytes per q/k/v element + "
                           "scales)\n", amodes[ai], T, extra_a / (double)L / 1048576.0);
            }
    {  // the documented cost at paper_569m's shape: B 4 x T 4096, 12 heads of 128, per layer
        size_t per = gpu_attn_saved_codes_bytes(ATTN_FP8_NAIVE, 4, 12, 4096, 128);
        printf("# paper_569m (B 4, T 4096, H 12, d 128): kept Q, K, V codes %zu bytes = %.3f MiB per layer\n", per,
               per / 1048576.0);
        // 4 * 4096 tokens x 1536 channels x 6 bytes (codes and transposed codes of Q, K, V) = 144 MiB,
        // + 3 x (4 * 12 * 32 blocks) FP32 scales = 18 KiB
        CHECK(per == 6 * (size_t)4 * 4096 * 1536 + 3 * 4 * (4 * 12 * 32), "plan: paper_569m's kept codes are 6 "
              "bytes per (token, channel) + 12 bytes per (b, h, 128-token block): 144 MiB + 18 KiB per layer",
              "%zu bytes", per);
    }
}

// --- GPU vs CPU in one linear precision ----------------------------------------------------------------
#define STEPS 10
#define SEED 1234

struct Batches {
    int B, T, n;
    std::vector<int32_t> tokens, targets;
};

// Reference gradients of batch 0 in BF16 on both backends (filled by the bf16 run).
struct Ref {
    std::vector<float> gpu_bf16, cpu_bf16;
};

static int fp8_layers(const Config &c) {
    int n = 0;
    for (int l = 0; l < c.model.n_layer; l++) n += linear_precision_of(&c.precision, c.model.n_layer, l) != LINEAR_BF16;
    return n;
}

// label: printed prefix; steps: AdamW steps compared (0: gradients only); tol: per-tensor
// gradient rel L2 bound. Fills ref in the BF16 run.
static void run_mode(const char *label, const Config &c_in, const Batches &bt, int steps, double tol, Ref *ref) {
    Config c = c_in;  // the CPU emulates the GPU kernels' attention tiles in this mode
    AttnOptions ao;
    attn_options_from_config(&ao, &c.precision);
    attn_mode_block_sizes(&ao, c.model.head_dim, &c.precision.attention_block_q, &c.precision.attention_block_k);
    const ModelConfig *mc = &c.model;
    int B = bt.B, T = bt.T, BT = B * T, n_fp8 = fp8_layers(c);
    int attn_fp8 = c.precision.attention != ATTN_BF16;
    int is_bf16 = c.precision.linear == LINEAR_BF16 && !attn_fp8, fp8_effect = n_fp8 > 0 || attn_fp8;
    char name[220];
    CpuModel cpu;
    cpu_model_init(&cpu, &c, B, T, SEED);
    GpuModel gpu;
    ErrBuf e;
    int rc = gpu_model_init(&gpu, &c, B, T, SEED, NULL, &e);
    snprintf(name, sizeof name, "%s: gpu_model_init", label);
    CHECK(rc == 0, name, "%s", rc ? e.msg : "");
    if (rc) {
        cpu_model_free(&cpu);
        return;
    }
    size_t P = gpu.table.total;
    std::vector<float> gg(P), cg(P), gp(P);
    printf("# %s: %d of %d blocks' linears in %s (grads %s), LM head %s; attention %s (grads %s, tiles %d x %d)\n",
           label, n_fp8, mc->n_layer, linear_precision_name(c.precision.linear),
           c.precision.linear == LINEAR_FP8_TENSOR && c.precision.linear_grad_format == GRADFMT_E5M2 ? "e5m2" : "e4m3",
           linear_precision_name(linear_precision_of(&c.precision, mc->n_layer, -1)),
           attn_precision_name(c.precision.attention), grad_format_name(c.precision.attention_grad_format),
           c.precision.attention_block_q, c.precision.attention_block_k);

    // Delayed linear scaling: a first forward + backward on both fills the amax histories (its
    // scales are current), so that the step compared below takes its scales from them and the
    // producers write the codes (4 per fp8_tensor block then, not 6 taking amaxes).
    const int lin_delayed = c.precision.linear == LINEAR_FP8_TENSOR && c.precision.linear_scaling == LINEAR_SCALING_DELAYED;
    if (lin_delayed) {
        cpu_model_forward(&cpu, bt.tokens.data(), bt.targets.data());
        cpu_model_backward(&cpu, 1.0f);
        cpu_model_zero_grad(&cpu);
        gpu_model_forward(&gpu, bt.tokens.data(), bt.targets.data());
        gpu_model_backward(&gpu, 1.0f);
        printf("# %s: one forward + backward first (the amax histories now hold it)\n", label);
    }
    const long long gemms0 = gpu_model_fp8_gemm_count(&gpu), fused0 = gpu_model_fp8_fused_count(&gpu);

    // loss and gradients of batch 0
    float lc = cpu_model_forward(&cpu, bt.tokens.data(), bt.targets.data());
    cpu_model_backward(&cpu, 1.0f);
    gpu_model_zero_grad(&gpu);
    float lg = gpu_model_forward(&gpu, bt.tokens.data(), bt.targets.data());
    gpu_model_backward(&gpu, 1.0f);
    gpu_model_get_grads(&gpu, gg.data());
    memcpy(cg.data(), cpu.grads, P * sizeof(float));
    long long n_gemms = gpu_model_fp8_gemm_count(&gpu) - gemms0;
    printf("# %s: loss cpu %.6f gpu %.6f (rel %.2e)\n", label, lc, lg, fabs(lg - lc) / fabs(lc));
    snprintf(name, sizeof name, "%s: loss matches the CPU in the same mode (rel 1e-2)", label);
    CHECK(isfinite(lg) && fabs(lg - lc) <= 1e-2 * fabs(lc), name, "cpu %.6f gpu %.6f", lc, lg);
    // an FP8 LM head (fp8_block, linear_keep_lm_head_bf16 false): 3 GEMMs per chunk of the head
    const int head_fp8 = linear_precision_of(&c.precision, mc->n_layer, -1) != LINEAR_BF16;
    const long long head_gemms = head_fp8 ? 3LL * ((BT + GPU_HEAD_CHUNK_TOKENS - 1) / GPU_HEAD_CHUNK_TOKENS) : 0;
    snprintf(name, sizeof name, "%s: %lld FP8 GEMMs in one forward + backward (12 per FP8 block, 3 per head chunk)",
             label, 12LL * n_fp8 + head_gemms);
    CHECK(n_gemms == 12LL * n_fp8 + head_gemms, name, "ran %lld", n_gemms);
    // fp8_block: the two RMSNorms and SwiGLU write the codes of their linears' x, the SwiGLU
    // backward those of MLP-in's dy (layers_fp8.h); fp8_tensor: the same four and the two RMSNorm
    // backwards whose residual gradient is an output projection's dy take their output's amax.
    const int blk = c.precision.linear == LINEAR_FP8_BLOCK, ten = c.precision.linear == LINEAR_FP8_TENSOR;
    // With delayed scales (the histories filled above) fp8_tensor's four producers write the codes,
    // and so does the RoPE backward (dqkv's) when no QK-norm follows it.
    const int rope_codes = ten && lin_delayed && mc->position == POS_ROPE && !mc->qk_norm &&
                           rope_backward_fp8_supported(mc->n_head, mc->head_dim);
    const long long per_block = blk || (ten && lin_delayed) ? 4 + rope_codes : ten ? 6 : 0;
    const long long fused = gpu_model_fp8_fused_count(&gpu);
    snprintf(name, sizeof name, "%s: %lld fused quantizations in one forward + backward (4 per fp8_block block, 4 or "
             "5 per delayed fp8_tensor block, 6 per fp8_tensor block)", label, per_block * n_fp8);
    CHECK(fused - fused0 == per_block * n_fp8, name, "ran %lld", fused - fused0);
    if (is_bf16) {
        ref->gpu_bf16 = gg;
        ref->cpu_bf16 = cg;
    }
    double worst = 0;
    for (int i = 0; i < gpu.table.n; i++) {
        const ParamDesc *p = &gpu.table.p[i];
        double cosv, r = rel_l2(gg.data() + p->offset, cg.data() + p->offset, p->numel, &cosv);
        if (!(r <= worst)) worst = r;
        if (is_bf16) {  // test_model_gpu's format
            printf("#   %-12s %-32s rel L2 %.3e  cos %.6f\n", "base", p->name, r, cosv);
        } else {
            // the CPU's own FP8 effect on this tensor: a correct GPU is well below it
            double fx = rel_l2(ref->cpu_bf16.data() + p->offset, cg.data() + p->offset, p->numel, NULL);
            printf("#   %-22s %-28s rel L2 %.3e  cos %.6f  (cpu fp8 effect %.3e, ratio %.2f)\n", label, p->name, r,
                   cosv, fx, fx > 0 ? r / fx : 0.0);
        }
        // Bound: tol, or in FP8 modes 1.5x the CPU's own FP8 effect on the tensor. The CPU reference
        // keeps activations in FP32 where the GPU stores BF16, so a few percent of the FP8 codes
        // differ (a BF16 rounding crosses an FP8 rounding boundary) and the GPU-vs-CPU distance
        // reaches the size of the FP8 effect itself (measured on an H200: up to 1.11x for FP8
        // linears, < 1x for FP8 attention). The kernels' codes are checked exactly elsewhere
        // (test_linear_fp8_gpu, test_attention_fp8_gpu); the direction check below catches an FP8
        // path whose error is not the CPU's.
        double fx_t = fp8_effect ? rel_l2(ref->cpu_bf16.data() + p->offset, cg.data() + p->offset, p->numel, NULL)
                                 : 0.0;
        double bound = tol > 1.5 * fx_t ? tol : 1.5 * fx_t;
        snprintf(name, sizeof name, "%s: gradient of %s (rel L2 < max(%.0e, 1.5x the CPU's FP8 effect))", label,
                 p->name, tol);
        CHECK(r < bound, name, "rel L2 %.3e (bound %.3e), cosine %.6f", r, bound, cosv);
    }
    printf("# %s: worst gradient rel L2 %.3e\n", label, worst);
    if (fp8_effect) {
        // Size of the FP8 effect: GPU fp8 vs GPU bf16 against CPU fp8 vs CPU bf16 (whole vector).
        // A GPU that silently ran BF16 has ratio ~0; E5M2 where E4M3 belongs ~2.
        double eg = rel_l2(gg.data(), ref->gpu_bf16.data(), P, NULL);
        double ec = rel_l2(cg.data(), ref->cpu_bf16.data(), P, NULL);
        double same = rel_l2(gg.data(), cg.data(), P, NULL);
        // Direction: cos(g_gpu_fp8 - g_gpu_bf16, g_cpu_fp8 - g_cpu_bf16). Independent errors of the
        // same size give ~0; the shared FP8 codes make it ~0.6 (linears) to ~0.75 (attention).
        double dot = 0, na = 0, nb = 0;
        for (size_t i = 0; i < P; i++) {
            double a = (double)gg[i] - ref->gpu_bf16[i], b = (double)cg[i] - ref->cpu_bf16[i];
            dot += a * b, na += a * a, nb += b * b;
        }
        double dir = na > 0 && nb > 0 ? dot / sqrt(na * nb) : 0.0;
        printf("# %s: FP8 effect on all gradients: gpu %.3e cpu %.3e (ratio %.2f); gpu vs cpu fp8 %.3e; direction "
               "cosine %.3f\n", label, eg, ec, ec > 0 ? eg / ec : 0.0, same, dir);
        snprintf(name, sizeof name, "%s: the FP8 effect on the gradients has the CPU's size (ratio in [0.8, 1.25])",
                 label);
        CHECK(ec > 0 && eg / ec > 0.8 && eg / ec < 1.25, name, "gpu %.3e cpu %.3e", eg, ec);
        snprintf(name, sizeof name, "%s: ... and the CPU's direction (cosine > 0.4)", label);
        CHECK(dir > 0.4, name, "cosine %.3f", dir);
    }
    if (!is_bf16 && !fp8_effect) {  // every block kept BF16: the BF16 run's gradients
        // Not bit for bit: the attention backward adds dQ with atomics (run-to-run order).
        double r = rel_l2(gg.data(), ref->gpu_bf16.data(), P, NULL);
        int identical = !memcmp(gg.data(), ref->gpu_bf16.data(), P * sizeof(float));
        printf("# %s: gradients vs the bf16 GPU run: rel L2 %.3e%s\n", label, r, identical ? " (bit-identical)" : "");
        snprintf(name, sizeof name, "%s: all blocks kept BF16 give the bf16 run's gradients (rel L2 < 5e-3)", label);
        CHECK(r < 5e-3, name, "rel L2 %.3e", r);
        snprintf(name, sizeof name, "%s: on the CPU too, bit for bit", label);
        CHECK(!memcmp(cg.data(), ref->cpu_bf16.data(), P * sizeof(float)), name, "rel L2 %.3e",
              rel_l2(cg.data(), ref->cpu_bf16.data(), P, NULL));
    }

    // evaluation path and next-token logits
    float le = gpu_model_loss(&gpu, bt.tokens.data(), bt.targets.data());
    snprintf(name, sizeof name, "%s: gpu_model_loss equals the forward's loss", label);
    CHECK(fabs(le - lg) <= 1e-6 * fabs(lg), name, "forward %.7f loss %.7f", lg, le);
    const long long eval_gemms = 4LL * n_fp8 + head_gemms / 3;  // 4 per FP8 block, 1 per head chunk
    snprintf(name, sizeof name, "%s: an evaluation forward runs %lld FP8 GEMMs", label, eval_gemms);
    CHECK(gpu_model_fp8_gemm_count(&gpu) - gemms0 - n_gemms == eval_gemms, name, "ran %lld",
          gpu_model_fp8_gemm_count(&gpu) - gemms0 - n_gemms);
    snprintf(name, sizeof name, "%s: ... and %d fused quantizations", label, blk || ten ? 3 * n_fp8 : 0);
    CHECK(gpu_model_fp8_fused_count(&gpu) - fused == (blk || ten ? 3LL * n_fp8 : 0), name, "ran %lld",
          gpu_model_fp8_fused_count(&gpu) - fused);
    {
        int t = T / 2;
        std::vector<float> a(mc->padded_vocab_size), b(mc->padded_vocab_size);
        gpu_model_next_logits(&gpu, bt.tokens.data(), t, a.data());
        cpu_model_next_logits(&cpu, bt.tokens.data(), t, b.data());
        double r = rel_l2(a.data(), b.data(), (size_t)mc->vocab_size, NULL);
        printf("# %s: next_logits (t %d) rel L2 %.3e\n", label, t, r);
        // FP8 linears: the forward's code differences (see the gradient bound) reach the logits;
        // measured 2.2e-2 .. 3.2e-2 on an H200, against 5.9e-3 in BF16. An FP8 LM head (run in FP8
        // here too: the GPU pads the one row to cuBLASLt's 4) adds its own code differences of hf:
        // 5.0e-2 measured (the loss still matches to 2.4e-5).
        double lt = head_fp8 ? 8e-2 : n_fp8 > 0 ? 5e-2 : 2e-2;
        snprintf(name, sizeof name, "%s: next_logits match the CPU (rel L2 < %.0e)", label, lt);
        CHECK(r < lt, name, "rel L2 %.3e", r);
    }

    if (steps > 0) {  // AdamW run: the same batches on both backends
        AdamW opt;
        adamw_init(&opt, P);
        std::vector<float> gl(steps), cl(steps);
        paired_run(label, 22, &cpu, &opt, &gpu, &c, bt.tokens.data(), bt.targets.data(), (size_t)BT, steps, cl.data(),
                   gl.data(), NULL);
        gpu_model_get_params(&gpu, gp.data());
        double r = rel_l2(gp.data(), cpu.params, P, NULL);
        printf("# %s: parameters after %d steps, GPU vs CPU rel L2 %.3e (information)\n", label, steps, r);
        adamw_free(&opt);
        if (lin_delayed) {
            // the GPU's FP8-linear amax histories (after attention's states, if any) follow the
            // CPU's (after its n_layer attention states): as many entries, the first micro-batch's
            // within the BF16 / FP32 distance, later ones within the trajectories' drift
            int ng = 0;
            const AttnDelayedState *gs = gpu_model_delayed_state(&gpu, &ng);
            // (both backends lay the states out alike: delayed_states_new)
            const int L = mc->n_layer, off = LINEAR_DELAYED_FIRST(L);
            const AttnDelayedState *gl_ = gs ? gs + off : NULL, *cl_ = cpu.attn_delayed + off;
            int filled_ok = gs && ng == off + 2 * L && cpu.n_delayed == ng;
            double worst_first = 0, worst = 0;
            int scales_equal = 0, scales_near = 0;  // the scales the histories give the next micro-batch
            for (int j = 0; filled_ok && j < 2 * L; j++) {
                filled_ok = gl_[j].filled == cl_[j].filled && gl_[j].filled == std::min(steps + 2, gl_[j].len);
                for (int t = 0; t < 4; t++) {
                    for (int i = 0; i < gl_[j].filled; i++) {
                        const double a = gl_[j].hist[t][i], b = cl_[j].hist[t][i];
                        const double rel = fabs(a - b) / (fabs(b) > 0 ? fabs(b) : 1.0);
                        if (!(rel <= worst)) worst = rel;
                        if (i == 0 && !(rel <= worst_first)) worst_first = rel;
                    }
                    const Fp8Format f = t % 2 ? (c.precision.linear_grad_format == GRADFMT_E5M2 ? FP8_E5M2 : FP8_E4M3)
                                              : FP8_E4M3;
                    const float sg = fp8_scale_for_amax(f, attn_delayed_amax(&gl_[j], t)),
                                sc = fp8_scale_for_amax(f, attn_delayed_amax(&cl_[j], t));
                    scales_equal += sg == sc;
                    scales_near += sg == sc || sg == 2 * sc || sc == 2 * sg;
                }
            }
            const int n_ops = 8 * L;
            printf("# %s: linear amax histories GPU vs CPU over %d micro-batches: worst rel %.3e, first %.3e; the next "
                   "scales equal for %d of %d operands, within a factor 2 for %d\n", label, steps + 2, worst,
                   worst_first, scales_equal, n_ops, scales_near);
            snprintf(name, sizeof name, "%s: the GPU's first linear amaxes equal the CPU's (same fill, rel < 5e-2)",
                     label);
            CHECK(filled_ok && worst_first < 5e-2, name, "fill %s, worst rel %.3e", filled_ok ? "equal" : "differs",
                  worst_first);
            // Later entries follow two trajectories that drift apart (parameters rel L2 ~7e-2 after 10
            // steps), and an amax is one element's magnitude: measured up to 0.29 on an H200.
            snprintf(name, sizeof name, "%s: the GPU's linear amax histories follow the CPU's (rel < 0.5)", label);
            CHECK(filled_ok && worst < 0.5, name, "worst rel %.3e", worst);
            snprintf(name, sizeof name, "%s: ... and give the same power-of-two scales (>= 3/4 equal, all within 2x)",
                     label);
            CHECK(filled_ok && 4 * scales_equal >= 3 * n_ops && scales_near == n_ops, name, "%d equal, %d within 2x of %d",
                  scales_equal, scales_near, n_ops);
        }
        if (c.precision.attention_scaling == SCALING_DELAYED) {
            // the GPU's per-layer amax histories follow the CPU's: as many entries; the first step's
            // (same parameters on both) within the distance of BF16 (GPU) and FP32 (CPU)
            // activations; later steps' within the drift of the two trajectories (an amax is one
            // element's magnitude, so it moves more than the L2 distances above)
            int ng = 0;
            const AttnDelayedState *gs = gpu_model_delayed_state(&gpu, &ng);
            double worst_first = 0, worst_t[4] = {0, 0, 0, 0};
            int filled_ok = ng >= mc->n_layer && gs;  // (attention's states come first)
            for (int l = 0; filled_ok && l < ng; l++) {
                filled_ok = gs[l].filled == cpu.attn_delayed[l].filled && gs[l].filled > 0;
                for (int t = 0; t < 4; t++)
                    for (int i = 0; i < gs[l].filled; i++) {
                        const double a = gs[l].hist[t][i], b = cpu.attn_delayed[l].hist[t][i];
                        const double rel = fabs(a - b) / (fabs(b) > 0 ? fabs(b) : 1.0);
                        if (!(rel <= worst_t[t])) worst_t[t] = rel;
                        if (i == 0 && !(rel <= worst_first)) worst_first = rel;
                    }
            }
            printf("# %s: amax history GPU vs CPU, worst rel over %d steps: Q %.3e K %.3e V %.3e dO %.3e; first step %.3e\n",
                   label, steps, worst_t[0], worst_t[1], worst_t[2], worst_t[3], worst_first);
            snprintf(name, sizeof name, "%s: the GPU's first-step amaxes equal the CPU's (same fill, rel < 5e-2)", label);
            CHECK(filled_ok && worst_first < 5e-2, name, "fill %s, worst rel %.3e", filled_ok ? "equal" : "differs",
                  worst_first);
            const double worst_h = fmax(fmax(worst_t[0], worst_t[1]), fmax(worst_t[2], worst_t[3]));
            snprintf(name, sizeof name, "%s: the GPU's amax histories follow the CPU's over the steps (rel < 0.25)", label);
            CHECK(filled_ok && worst_h < 0.25, name, "worst rel %.3e", worst_h);
        }
        // The FP8 weight copies follow the optimizer: each FP8 linear's Q(W), Q(W^T) made once by
        // the first forward, then once per step (by the forward after it), never by evaluation
        // forwards or the backward; and the loss after the steps equals that of a fresh model given
        // the same parameters (stale FP8 weights would give the loss of an earlier step).
        long long refreshes = gpu_model_fp8_weight_refreshes(&gpu);
        const int n_w8 = 4 * n_fp8 + head_fp8;  // + an FP8 LM head's weight
        snprintf(name, sizeof name, "%s: FP8 weights quantized once per FP8 linear per step (%d x %d)", label, n_w8,
                 steps);
        CHECK(refreshes == (long long)n_w8 * steps, name, "%lld refreshes", refreshes);
        GpuModel fresh;
        if (gpu_model_init(&fresh, &c, B, T, SEED + 1, NULL, &e) == 0) {
            gpu_model_set_params(&fresh, gp.data());
            float la = gpu_model_loss(&gpu, bt.tokens.data(), bt.targets.data());
            float lb = gpu_model_loss(&fresh, bt.tokens.data(), bt.targets.data());
            printf("# %s: loss after the steps %.7f, fresh model with those parameters %.7f\n", label, la, lb);
            snprintf(name, sizeof name, "%s: after the steps the loss is a fresh model's with the same parameters "
                     "(FP8 weights not stale)", label);
            CHECK(fabs(la - lb) <= 1e-6 * fabs(lb), name, "stepped %.7f fresh %.7f", la, lb);
            gpu_model_free(&fresh);
        } else {
            CHECK(0, "fresh gpu_model_init", "%s", e.msg);
        }
    }
    gpu_model_free(&gpu);
    cpu_model_free(&cpu);
}

// --- the row-sum invariant inside the model ----------------------------------------------------
// The attention diagnostics outputs of every layer (attention_fp8.h): in fp8_dm each row of dS
// sums to zero to FP32 rounding (cancellation-scaled residual <= 1e-5 in every layer); in
// fp8_naive it does not (far above). fp8_dm_approx lies in between.
static double max_residual(const Batches &bt, const char *mode, std::vector<double> *per_layer) {
    const char *ov[] = {mode};
    Config c = make_config(TINY_JSON, ov, 1);
    int B = bt.B, T = bt.T, L = c.model.n_layer, H = c.model.n_head;
    GpuModel g;
    ErrBuf e;
    if (gpu_model_init(&g, &c, B, T, SEED, NULL, &e)) {
        CHECK(0, "invariant: gpu_model_init", "%s", e.msg);
        return NAN;
    }
    size_t n = (size_t)B * H * T;
    float *buf;
    CUDA_CHECK(cudaMalloc(&buf, 2 * n * L * sizeof(float)));
    std::vector<AttnModeDiag> diag(L);
    for (int l = 0; l < L; l++) {
        memset(&diag[l], 0, sizeof diag[l]);
        diag[l].row_ds_sum = buf + 2 * n * l;
        diag[l].row_cancel = buf + 2 * n * l + n;
    }
    gpu_model_set_attn_diag(&g, diag.data());
    gpu_model_forward(&g, bt.tokens.data(), bt.targets.data());
    gpu_model_backward(&g, 1.0f);
    std::vector<float> h(2 * n * L);
    CUDA_CHECK(cudaMemcpy(h.data(), buf, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int l = 0; l < L; l++) {
        double w = 0;
        for (size_t i = 0; i < n; i++) {
            double r = fabs(h[2 * n * l + i]) / (h[2 * n * l + n + i] > 0 ? h[2 * n * l + n + i] : 1e-30);
            if (!(r <= w)) w = r;
        }
        per_layer->push_back(w);
        if (!(w <= worst)) worst = w;
    }
    gpu_model_set_attn_diag(&g, NULL);
    CUDA_CHECK(cudaFree(buf));
    gpu_model_free(&g);
    return worst;
}

static void invariant_check(const Batches &bt) {
    const char *modes[] = {"precision.attention=\"fp8_dm\"", "precision.attention=\"fp8_naive\"",
                           "precision.attention=\"fp8_dm_approx\""};
    double r[3];
    for (int i = 0; i < 3; i++) {
        std::vector<double> pl;
        r[i] = max_residual(bt, modes[i], &pl);
        printf("# invariant %s: max cancellation-scaled row-sum residual of dS per layer:", modes[i]);
        for (double x : pl) printf(" %.3e", x);
        printf("\n");
    }
    CHECK(r[0] <= 1e-5, "invariant: fp8_dm's rows of dS sum to zero in every layer of the model (<= 1e-5)",
          "max %.3e", r[0]);
    CHECK(r[1] > 100 * 1e-5, "invariant: fp8_naive's do not (max > 1e-3)", "max %.3e", r[1]);
    CHECK(r[2] > r[0], "invariant: fp8_dm_approx's residual is above fp8_dm's", "approx %.3e dm %.3e", r[2], r[0]);
}

// --- precision.attention_keep_codes: the same numbers, bit for bit ------------------------------
// Two models of one config and seed, the forward's Q, K, V codes kept for the backward or made
// again by it, on one batch: the loss and every gradient the backward forms before the first dQ
// feeds anything (the last block's MLP, attention projection and norms, the final norm, the LM
// head, and the K and V rows of the last block's qkv weight: dK and dV come from one CTA per key
// block) must be equal bit for bit; the rest carries the FP32 atomics' order of dQ (run to run,
// with or without the option), so it is compared with a third model's run without kept codes:
// within max(4x that run-to-run distance, 2e-3) relative L2. Linears BF16 (an FP8 linear's
// per-tensor gradient scale would spread dQ's noise into every row). Shapes with several 128-token
// blocks, T not a multiple of 128, QK-norm, d 64 and 128, both gradient formats.
struct KeepRun {
    float loss;
    std::vector<float> g;
};
// epilogue: precision.fuse_qkv_epilogue (the QKV projection writing the codes; off for the
// keep_codes checks, whose runs with and without kept codes must then be the same bit for bit)
static KeepRun keep_run(const Config &c0, const std::vector<int32_t> &tok, const std::vector<int32_t> &tgt,
                        int epilogue = 0, long long *epilogue_runs = NULL) {
    KeepRun r = {NAN, {}};
    GpuModel m;
    ErrBuf e;
    Config c = c0;
    c.precision.fuse_qkv_epilogue = epilogue;
    if (gpu_model_init(&m, &c, c.train.micro_batch, c.model.seq_len, SEED, NULL, &e)) {
        CHECK(0, "keep_codes: gpu_model_init", "%s", e.msg);
        return r;
    }
    gpu_model_zero_grad(&m);
    r.loss = gpu_model_forward(&m, tok.data(), tgt.data());
    gpu_model_backward(&m, 1.0f);
    r.g.resize(m.table.total);
    gpu_model_get_grads(&m, r.g.data());
    if (epilogue_runs) *epilogue_runs = gpu_model_qkv_epilogue_count(&m);
    gpu_model_free(&m);
    return r;
}

static void keep_codes_check(void) {
    struct { const char *label; std::vector<const char *> ov; } cases[] = {
        {"fp8_naive tiny", {"precision.attention=\"fp8_naive\""}},
        {"fp8_hybrid T 320 B 2", {"precision.attention=\"fp8_hybrid\"", "model.seq_len=320", "train.micro_batch=2"}},
        {"fp8_dm T 320 B 2 qk_norm", {"precision.attention=\"fp8_dm\"", "model.seq_len=320", "train.micro_batch=2",
                                      "model.qk_norm=true"}},
        {"fp8_dm d128 T 384 e5m2", {"precision.attention=\"fp8_dm\"", "model.d_model=256", "model.seq_len=384",
                                    "train.micro_batch=2", "precision.attention_grad_format=\"e5m2\""}},
        {"fp8_dm_approx d128 T 200", {"precision.attention=\"fp8_dm_approx\"", "model.d_model=256",
                                      "model.seq_len=200", "train.micro_batch=2"}},
    };
    for (auto &cs : cases) {
        std::vector<const char *> on = cs.ov, off = cs.ov;
        on.push_back("precision.attention_keep_codes=true");
        off.push_back("precision.attention_keep_codes=false");
        Config c_on = make_config(TINY_JSON, on.data(), (int)on.size());
        Config c_off = make_config(TINY_JSON, off.data(), (int)off.size());
        const int B = c_on.train.micro_batch, T = c_on.model.seq_len, L = c_on.model.n_layer;
        const size_t C = c_on.model.d_model;
        std::vector<int32_t> tok((size_t)B * T), tgt((size_t)B * T);
        make_batch(tok.data(), tgt.data(), B, T, c_on.model.vocab_size);
        KeepRun a = keep_run(c_on, tok, tgt), b = keep_run(c_off, tok, tgt), b2 = keep_run(c_off, tok, tgt);
        if (a.g.empty() || b.g.empty() || b2.g.empty()) continue;
        ParamTable t;
        param_table_build(&t, &c_on.model);
        // the exact part: a mask over the flat gradient vector
        std::vector<char> exact(t.total, 0);
        const ParamKind last[] = {P_MLP_PROJ, P_MLP_FC, P_MLP_NORM, P_ATTN_PROJ};
        for (ParamKind k : last) {
            const ParamDesc *p = param_find(&t, k, L - 1);
            std::fill(exact.begin() + p->offset, exact.begin() + p->offset + p->numel, 1);
        }
        const ParamDesc *fn = param_find(&t, P_FINAL_NORM, 0), *hd = param_find(&t, P_LM_HEAD, 0);
        std::fill(exact.begin() + fn->offset, exact.begin() + fn->offset + fn->numel, 1);
        if (hd) std::fill(exact.begin() + hd->offset, exact.begin() + hd->offset + hd->numel, 1);
        const ParamDesc *qkv = param_find(&t, P_QKV, L - 1);  // (3C, C): rows C..3C are K and V
        std::fill(exact.begin() + qkv->offset + C * C, exact.begin() + qkv->offset + 3 * C * C, 1);
        size_t n_exact = 0, bad_exact = 0;
        double num = 0, den = 0, noise = 0;
        for (size_t i = 0; i < t.total; i++) {
            if (exact[i]) {
                n_exact++;
                bad_exact += memcmp(&a.g[i], &b.g[i], sizeof(float)) != 0;
            } else {
                num += ((double)a.g[i] - b.g[i]) * ((double)a.g[i] - b.g[i]);
                noise += ((double)b2.g[i] - b.g[i]) * ((double)b2.g[i] - b.g[i]);
                den += (double)b.g[i] * b.g[i];
            }
        }
        param_table_free(&t);
        const double r = sqrt(num / (den > 0 ? den : 1)), rn = sqrt(noise / (den > 0 ? den : 1));
        const double bound = std::max(4 * rn, 2e-3);
        printf("# keep_codes %s: loss %.7f / %.7f; %zu gradients before any dQ: %zu differ; the rest rel L2 %.3e "
               "(two runs without kept codes: %.3e)\n", cs.label, a.loss, b.loss, n_exact, bad_exact, r, rn);
        char name[220];
        snprintf(name, sizeof name, "keep_codes %s: the loss is the same bit for bit", cs.label);
        CHECK(isfinite(a.loss) && memcmp(&a.loss, &b.loss, sizeof(float)) == 0, name, "kept %.9g, made again %.9g",
              a.loss, b.loss);
        snprintf(name, sizeof name, "keep_codes %s: the %zu gradients no dQ reaches are the same bit for bit",
                 cs.label, n_exact);
        CHECK(bad_exact == 0, name, "%zu differ", bad_exact);
        snprintf(name, sizeof name, "keep_codes %s: the others differ by dQ's atomics order only (rel L2 < %.1e)",
                 cs.label, bound);
        CHECK(r < bound, name, "rel L2 %.3e, run-to-run %.3e", r, rn);
    }
}

// --- the QKV projection writing the attention's codes (qkv_gemm.h) --------------------------------
// precision.fuse_qkv_epilogue true (qkv_gemm_quant: our GEMM, RoPE and the codes in its epilogue)
// against false (cuBLASLt's BF16 qkv, then the quantize pass), same seed and batch, heads of 128 and
// kept codes. Not promised bit for bit (cuBLASLt could sum in another order, moving a BF16 qkv value
// by an ulp and a code by a step; on the H200 they agree and so does everything here). Bounds: the
// loss within 1e-3 relative, and the gradients' difference within max(4x the run-to-run distance, a
// third of what FP8 attention itself changes: the same model with bf16 attention). The epilogue ran once per layer (the
// training forward) and not in the evaluation forwards the runs make (which keep no codes); on a
// micro-batch of an odd number of 128-token blocks, which the GEMM does not take, it never ran.
static void qkv_epilogue_check(void) {
    struct { const char *label; std::vector<const char *> ov; int runs; } cases[] = {
        {"fp8_dm d128 T 256 B 2", {"precision.attention=\"fp8_dm\"", "model.d_model=256", "model.seq_len=256",
                                   "train.micro_batch=2"}, 1},
        {"fp8_naive d128 T 384 B 2 recompute", {"precision.attention=\"fp8_naive\"", "model.d_model=256",
                                                "model.seq_len=384", "train.micro_batch=2", "train.recompute=true"}, 1},
        {"fp8_dm_approx d128 T 128 B 4 no positions", {"precision.attention=\"fp8_dm_approx\"", "model.d_model=256",
                                                       "model.seq_len=128", "train.micro_batch=4", "model.position=\"none\""}, 1},
        {"fp8_dm d128 T 128 B 3 (odd blocks: not taken)", {"precision.attention=\"fp8_dm\"", "model.d_model=256",
                                                           "model.seq_len=128", "train.micro_batch=3"}, 0},
    };
    for (auto &cs : cases) {
        std::vector<const char *> ov = cs.ov, ovb = cs.ov;
        ov.push_back("precision.attention_keep_codes=true");
        ovb.push_back("precision.attention=\"bf16\"");
        const Config c = make_config(TINY_JSON, ov.data(), (int)ov.size());
        const Config cb = make_config(TINY_JSON, ovb.data(), (int)ovb.size());
        const int B = c.train.micro_batch, T = c.model.seq_len;
        std::vector<int32_t> tok((size_t)B * T), tgt((size_t)B * T);
        make_batch(tok.data(), tgt.data(), B, T, c.model.vocab_size);
        long long runs_on = 0, runs_off = 0;
        const KeepRun on = keep_run(c, tok, tgt, 1, &runs_on), off = keep_run(c, tok, tgt, 0, &runs_off);
        const KeepRun off2 = keep_run(c, tok, tgt, 0), bf = keep_run(cb, tok, tgt, 0);
        if (on.g.empty() || off.g.empty() || off2.g.empty() || bf.g.empty()) continue;
        const size_t P = on.g.size();
        const double r = rel_l2(on.g.data(), off.g.data(), P, NULL), noise = rel_l2(off2.g.data(), off.g.data(), P, NULL);
        const double fp8 = rel_l2(off.g.data(), bf.g.data(), P, NULL), dl = fabs((double)on.loss - off.loss) / fabs(off.loss);
        const double bound = std::max(4 * noise, fp8 / 3);
        printf("# qkv epilogue %s: loss %.7f / %.7f (rel %.2e); gradients on vs off rel L2 %.3e, run to run %.3e, "
               "fp8 vs bf16 attention %.3e; epilogue runs %lld / %lld\n", cs.label, on.loss, off.loss, dl, r, noise, fp8,
               runs_on, runs_off);
        char name[220];
        snprintf(name, sizeof name, "qkv epilogue %s: ran in each layer's training forward%s, never when off", cs.label,
                 cs.runs ? "" : " (here none)");
        CHECK(runs_on == cs.runs * c.model.n_layer && runs_off == 0, name, "%lld / %lld runs", runs_on, runs_off);
        snprintf(name, sizeof name, "qkv epilogue %s: the loss within 1e-3 of the BF16 GEMM's", cs.label);
        CHECK(isfinite(on.loss) && dl < 1e-3, name, "%.9g vs %.9g", on.loss, off.loss);
        snprintf(name, sizeof name, "qkv epilogue %s: gradients within max(4x run to run, FP8 effect / 3) = %.2e", cs.label,
                 bound);
        CHECK(r < bound, name, "rel L2 %.3e (run to run %.3e, FP8 effect %.3e)", r, noise, fp8);
    }
}

// --- fused quantization against separate passes ---------------------------------------------------
// fp8_block with the producers writing the codes (precision.fuse_fp8_producers true), or fp8_tensor
// with them taking the amaxes, against the same model quantizing in separate passes (false), same seed
// and batch: the codes are the same, so the loss (forward: RMSNorm and SwiGLU fused) is
// bit-identical, and so are the last block's MLP and attention-projection gradients (the SwiGLU
// and RMSNorm backwards fused; nothing nondeterministic before them in the backward). Deeper gradients pass through the attention backward's dQ atomics:
// compared with the run-to-run distance of the unfused model with itself.
// rope 1: the same check for an FP8 precision.attention with RoPE inside its quantize pass
// (precision.fuse_attention_rope true) against rope_forward_gpu first (false): the codes, O and LSE are
// the same, so is everything above.
static void fusion_check(const Batches &bt, const char *label, const char *const *ov, int n_ov, int warm = 0,
                         int rope = 0) {
    Config c = make_config(TINY_JSON, ov, n_ov);
    const int B = bt.B, T = bt.T, L = c.model.n_layer;
    GpuModel g[3];  // fused, unfused, unfused again
    ErrBuf e;
    std::vector<std::vector<float>> gr(3);
    float loss[3], eval[3];
    for (int k = 0; k < 3; k++) {
        Config ck = c;
        if (rope) ck.precision.fuse_attention_rope = k == 0;
        else ck.precision.fuse_fp8_producers = k == 0;
        if (gpu_model_init(&g[k], &ck, B, T, SEED, NULL, &e)) {
            CHECK(0, "fusion: gpu_model_init", "%s", e.msg);
            for (int j = 0; j < k; j++) gpu_model_free(&g[j]);
            return;
        }
        if (warm) {  // delayed scaling: fill the histories first (the same amaxes fused or not)
            gpu_model_forward(&g[k], bt.tokens.data(), bt.targets.data());
            gpu_model_backward(&g[k], 1.0f);
        }
        gpu_model_zero_grad(&g[k]);
        loss[k] = gpu_model_forward(&g[k], bt.tokens.data(), bt.targets.data());
        gpu_model_backward(&g[k], 1.0f);
        gr[k].resize(g[k].table.total);
        gpu_model_get_grads(&g[k], gr[k].data());
        eval[k] = gpu_model_loss(&g[k], bt.tokens.data(), bt.targets.data());
    }
    char name[220];
    auto fused = [&](int k) { return rope ? gpu_model_attn_rope_fused_count(&g[k]) : gpu_model_fp8_fused_count(&g[k]); };
    printf("# fusion %s: loss fused %.7f unfused %.7f; fused %s %lld (unfused model %lld)\n", label, loss[0], loss[1],
           rope ? "RoPE + quantize passes" : "quantizations", fused(0), fused(1));
    snprintf(name, sizeof name, "fusion %s: the forward's and an evaluation's loss are bit-identical to separate passes",
             label);
    CHECK(!memcmp(&loss[0], &loss[1], sizeof(float)) && !memcmp(&eval[0], &eval[1], sizeof(float)), name,
          "forward %.9g vs %.9g, eval %.9g vs %.9g", loss[0], loss[1], eval[0], eval[1]);
    snprintf(name, sizeof name, "fusion %s: the fused model ran fused %s, the unfused none", label,
             rope ? "RoPE + quantize passes" : "quantizations");
    CHECK(fused(0) > 0 && fused(1) == 0, name, "%lld, %lld", fused(0), fused(1));
    const ParamKind last[] = {P_MLP_PROJ, P_MLP_FC, P_MLP_NORM, P_ATTN_PROJ};
    for (ParamKind k : last) {
        const ParamDesc *p = param_find(&g[0].table, k, L - 1);
        snprintf(name, sizeof name, "fusion %s: last block's %s gradient bit-identical to separate passes", label,
                 p ? p->name : "?");
        CHECK(p && !memcmp(gr[0].data() + p->offset, gr[1].data() + p->offset, p->numel * sizeof(float)), name,
              "rel L2 %.3e", p ? rel_l2(gr[0].data() + p->offset, gr[1].data() + p->offset, p->numel, NULL) : -1.0);
    }
    const size_t P = gr[0].size();
    const double r = rel_l2(gr[0].data(), gr[1].data(), P, NULL), noise = rel_l2(gr[2].data(), gr[1].data(), P, NULL);
    const int identical = !memcmp(gr[0].data(), gr[1].data(), P * sizeof(float));
    printf("# fusion %s: all gradients fused vs unfused rel L2 %.3e%s; unfused vs unfused %.3e\n", label, r,
           identical ? " (bit-identical)" : "", noise);
    snprintf(name, sizeof name, "fusion %s: all gradients within the model's run-to-run distance (or 1e-3)", label);
    CHECK(r <= std::max(1e-3, 3 * noise), name, "rel L2 %.3e, run to run %.3e", r, noise);
    for (int k = 0; k < 3; k++) gpu_model_free(&g[k]);
}

// --- timing on the 125M and paper_569m shapes --------------------------------------------------------
// Model shapes for timing: the 125M config (12 layers, d 768, B 16 x T 1024) and
// configs/paper_569m.json's model (15 layers, d 1536, 12 heads of 128, SwiGLU 3968, untied; its
// micro-batch 4 x 4096). Attention BF16 in both.
static const char *S125 =
    "{\"model\": {\"d_model\": 768, \"n_layer\": 12, \"n_head\": 6, \"ffn_hidden\": 2048, \"seq_len\": 1024,"
    " \"tied_embeddings\": true}, \"train\": {\"micro_batch\": 16, \"grad_clip\": 1.0},"
    " \"precision\": {\"attention\": \"bf16\"}}";
static const char *S569 =
    "{\"model\": {\"vocab_size\": 50257, \"d_model\": 1536, \"n_layer\": 15, \"n_head\": 12, \"ffn_hidden\": 3968,"
    " \"seq_len\": 4096, \"position\": \"rope\", \"qk_norm\": false, \"tied_embeddings\": false},"
    " \"train\": {\"micro_batch\": 4, \"grad_clip\": 1.0}, \"precision\": {\"attention\": \"bf16\"}}";

// Whole steps (forward + head, backward, grad norm + AdamW), host-timed per phase (each phase
// ends with a stream synchronisation). Returns tokens/s.
static double timed_run(const char *shape, const char *json, const char *label, const char *const *ov, int n_ov,
                        int fuse = 1) {
    Config c = make_config(json, ov, n_ov);
    c.precision.fuse_fp8_producers = fuse;
    int B = c.train.micro_batch, T = c.model.seq_len, BT = B * T;
    std::vector<int32_t> tokens(BT), targets(BT);
    make_batch(tokens.data(), targets.data(), B, T, c.model.vocab_size);
    GpuModel m;
    ErrBuf e;
    char name[160];
    int rc = gpu_model_init(&m, &c, B, T, 42, NULL, &e);
    snprintf(name, sizeof name, "timing %s %s: gpu_model_init", shape, label);
    CHECK(rc == 0, name, "%s", rc ? e.msg : "");
    if (rc) return 0;
    const int n_steps = 8, warm = 3;
    double tf = 0, tb = 0, ts = 0;
    float first = 0, last = 0;
    int ok = 1;
    for (int k = 0; k < n_steps; k++) {
        double t0 = now_seconds();
        gpu_model_zero_grad(&m);
        float l = gpu_model_forward(&m, tokens.data(), targets.data());
        double t1 = now_seconds();
        gpu_model_backward(&m, 1.0f);
        double t2 = now_seconds();
        double n = gpu_model_grad_norm(&m);
        gpu_model_step(&m, 6e-4, grad_clip_factor(&c.train, n), &c.train);
        double t3 = now_seconds();
        if (!isfinite(l) || !isfinite(n)) ok = 0;
        if (k == 0) first = l;
        last = l;
        if (k >= warm) tf += t1 - t0, tb += t2 - t1, ts += t3 - t2;
    }
    const int nt = n_steps - warm;
    double dt = (tf + tb + ts) / nt;
    double flops = model_flops_per_token(&c.model) * BT;
    printf("# timing: %s L%d T%d B%d %-10s: %.2f ms/step (forward+head %.2f, backward %.2f, norm+AdamW %.2f), "
           "%.0f tokens/s, %.1f TFLOP/s (model FLOPs), %.2f GiB planned, loss %.4f -> %.4f (same batch)\n",
           shape, c.model.n_layer, T, B, label, dt * 1e3, tf / nt * 1e3, tb / nt * 1e3, ts / nt * 1e3, BT / dt,
           flops / dt / 1e12, m.plan.total / 1073741824.0, first, last);
    snprintf(name, sizeof name, "timing %s %s: loss and gradient norm finite", shape, label);
    CHECK(ok, name, "loss %.4f -> %.4f", first, last);
    gpu_model_free(&m);
    return BT / dt;
}

// Where the time of the FP8 linears goes, per kernel, CUDA-event timed on one model's linear
// shapes (N tokens, the 4 linears W (M, K) of a block): the three BF16 GEMMs; the three FP8 GEMMs;
// and the quantizations the model runs per step and block: Q(x) + Q(x^T) (forward), Q(dy) +
// Q(dy^T) (lin_wgrad), Q(W) + Q(W^T) (once per step). Sums over the model's layers.
static void linear_breakdown(const char *shape, const char *json) {
    Config c = make_config(json, NULL, 0);
    const int N = c.train.micro_batch * c.model.seq_len, C = c.model.d_model, F = c.model.ffn_hidden;
    const int L = c.model.n_layer;
    const int mk[4][2] = {{3 * C, C}, {C, C}, {2 * F, C}, {C, F}};
    const char *names[4] = {"qkv", "attn proj", "mlp in", "mlp out"};
    size_t maxMK = 0, maxNK = 0, maxNM = 0;
    for (auto &s : mk) {
        maxMK = std::max(maxMK, (size_t)s[0] * s[1]);
        maxNK = std::max(maxNK, (size_t)N * s[1]);
        maxNM = std::max(maxNM, (size_t)N * s[0]);
    }
    uint16_t *x, *w, *dy, *y, *dx;
    float *dw;
    CUDA_CHECK(cudaMalloc(&x, 2 * maxNK));
    CUDA_CHECK(cudaMalloc(&dx, 2 * maxNK));
    CUDA_CHECK(cudaMalloc(&w, 2 * maxMK));
    CUDA_CHECK(cudaMalloc(&dw, 4 * maxMK));
    CUDA_CHECK(cudaMalloc(&dy, 2 * maxNM));
    CUDA_CHECK(cudaMalloc(&y, 2 * maxNM));
    {  // deterministic values of moderate range (BF16 bits of N(0,1)-ish numbers)
        size_t n = std::max(maxNK, std::max(maxMK, maxNM));
        std::vector<uint16_t> h(n);
        uint32_t st = 12345;
        for (size_t i = 0; i < n; i++) {
            st = st * 1664525u + 1013904223u;
            float v = ((int)(st >> 9) % 2001 - 1000) / 700.0f;
            uint32_t bits;
            memcpy(&bits, &v, 4);
            h[i] = (uint16_t)(bits >> 16);
        }
        CUDA_CHECK(cudaMemcpy(x, h.data(), 2 * maxNK, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(w, h.data(), 2 * maxMK, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dy, h.data(), 2 * maxNM, cudaMemcpyHostToDevice));
    }
    matmul_gpu_init();
    linear_fp8_gpu_init();
    cudaStream_t st = 0;
    const int reps = 10;
    // milliseconds per call of f (after one warm-up call; st is the default stream)
    auto time_ms = [&](auto f) { return gpu_time_ms(f, 1, reps); };
    printf("# breakdown %s: per block, N = %d tokens, ms (CUDA events, %d calls each); FP8 quantizations: x = Q(x) + "
           "Q(x^T), dy = Q(dy) + Q(dy^T), W = Q(W) + Q(W^T)\n", shape, N, reps);
    for (int mode = 0; mode < 2; mode++) {
        const LinearPrecision p = mode ? LINEAR_FP8_BLOCK : LINEAR_FP8_TENSOR;
        const Fp8Grouping ag = mode ? FP8_GROUP_1x128 : FP8_GROUP_TENSOR, wg = mode ? FP8_GROUP_128x128 : FP8_GROUP_TENSOR;
        double sum_b = 0, sum_g = 0, sum_qx = 0, sum_qdy = 0, sum_qw = 0;
        for (int i = 0; i < 4; i++) {
            const int M = mk[i][0], K = mk[i][1];
            Fp8Operand xq, xt, dyq, dyt, wq, wt;
            fp8_operand_alloc(&xq, N, K, ag, FP8_E4M3);
            fp8_operand_alloc(&xt, K, N, ag, FP8_E4M3);
            fp8_operand_alloc(&dyq, N, M, ag, FP8_E4M3);
            fp8_operand_alloc(&dyt, M, N, ag, FP8_E4M3);
            fp8_operand_alloc(&wq, M, K, wg, FP8_E4M3);
            fp8_operand_alloc(&wt, K, M, wg, FP8_E4M3);
            double b = time_ms([&] {
                matmul_forward_gpu(y, x, w, N, M, K, 0, st);
                matmul_dgrad_gpu(dx, dy, w, N, M, K, 0, st);
                matmul_wgrad_gpu(dw, dy, x, N, M, K, st);
            });
            double qx = time_ms([&] { fp8_quantize_gpu(&xq, &xt, x, N, K, NULL, st); });
            double qdy = time_ms([&] { fp8_quantize_gpu(&dyq, &dyt, dy, N, M, NULL, st); });
            double qw = time_ms([&] { fp8_quantize_gpu(&wq, &wt, w, M, K, NULL, st); });
            double gf = time_ms([&] { linear_fp8_forward_gpu(y, &xq, &wq, 0, st); });
            double gd = time_ms([&] { linear_fp8_dgrad_gpu(dx, &dyq, &wt, 0, st); });
            double gw = time_ms([&] { linear_fp8_wgrad_gpu(dw, &dyt, &xt, 1, 0, st); });
            printf("#   %-10s %-8s (M %5d, K %5d): bf16 GEMMs %.3f | fp8 GEMMs fwd %.3f dgrad %.3f wgrad %.3f = %.3f "
                   "(%.2fx) | quantize x %.3f dy %.3f W %.3f | fp8 total %.3f (%.2fx bf16)\n",
                   linear_precision_name(p), names[i], M, K, b, gf, gd, gw, gf + gd + gw, b / (gf + gd + gw), qx, qdy,
                   qw, gf + gd + gw + qx + qdy + qw, b / (gf + gd + gw + qx + qdy + qw));
            sum_b += b, sum_g += gf + gd + gw, sum_qx += qx, sum_qdy += qdy, sum_qw += qw;
            fp8_operand_free(&xq); fp8_operand_free(&xt); fp8_operand_free(&dyq);
            fp8_operand_free(&dyt); fp8_operand_free(&wq); fp8_operand_free(&wt);
        }
        double fp8 = sum_g + sum_qx + sum_qdy + sum_qw;
        printf("# breakdown %s %s: all %d blocks' linears per step: bf16 %.2f ms; fp8 %.2f ms = GEMMs %.2f + quantize "
               "x %.2f + dy %.2f + W %.2f (%.0f%% quantization); saves %.2f ms a step (%.2fx on the linears)\n",
               shape, linear_precision_name(p), L, L * sum_b, L * fp8, L * sum_g, L * sum_qx, L * sum_qdy, L * sum_qw,
               100.0 * (fp8 - sum_g) / fp8, L * (sum_b - fp8), sum_b / fp8);
    }
    CUDA_CHECK(cudaFree(x)); CUDA_CHECK(cudaFree(dx)); CUDA_CHECK(cudaFree(w)); CUDA_CHECK(cudaFree(dw));
    CUDA_CHECK(cudaFree(dy)); CUDA_CHECK(cudaFree(y));
}

// The fused producers (layers_fp8.h) against layer + separate quantization, CUDA-event timed on
// one model's shapes (N tokens, fp8_block, Q(out) and Q(out^T)): the residual RMSNorm (twice per
// block: qkv and MLP-in inputs), SwiGLU (MLP-out input) and its backward (MLP-in dy). The fused
// kernels run without their BF16 output, as the model runs them.
static void fused_breakdown(const char *shape, const char *json) {
    Config c = make_config(json, NULL, 0);
    const int N = c.train.micro_batch * c.model.seq_len, C = c.model.d_model, F = c.model.ffn_hidden;
    const int L = c.model.n_layer;
    const size_t big = (size_t)N * 2 * F;
    uint16_t *a, *b, *o, *res, *g;
    float *rstd;
    CUDA_CHECK(cudaMalloc(&a, 2 * big));
    CUDA_CHECK(cudaMalloc(&b, 2 * big));
    CUDA_CHECK(cudaMalloc(&o, 2 * big));
    CUDA_CHECK(cudaMalloc(&res, 2 * (size_t)N * C));
    CUDA_CHECK(cudaMalloc(&g, 2 * (size_t)C));
    CUDA_CHECK(cudaMalloc(&rstd, 4 * (size_t)N));
    // moderate values, U[-2, 2) (gpu_test.h); gains around 1
    gpu_test_fill_bf16(a, big, 1, 2.0f);
    gpu_test_fill_bf16(b, big, 2, 2.0f);
    gpu_test_fill_bf16(g, C, 3, 0.5f, 1.0f);
    Fp8Operand q, qt;  // room for the widest, (N, 2F) and (2F, N)
    fp8_operand_alloc(&q, N, 2 * F, FP8_GROUP_1x128, FP8_E4M3);
    fp8_operand_alloc(&qt, 2 * F, N, FP8_GROUP_1x128, FP8_E4M3);
    auto shaped = [](Fp8Operand op, int rows, int cols) { op.rows = rows; op.cols = cols; return op; };
    const Fp8Operand qc = shaped(q, N, C), qtc = shaped(qt, C, N), qf = shaped(q, N, F), qtf = shaped(qt, F, N);
    cudaStream_t st = 0;  // gpu_time_ms times the default stream
    const int reps = 10;
    // milliseconds per call of f (after one warm-up call)
    auto time_ms = [&](auto f) { return gpu_time_ms(f, 1, reps); };
    const float eps = 1e-5f;
    double t[3][3];  // [norm, swiglu, swiglu bwd][layer alone, its quantization, fused]
    t[0][0] = time_ms([&] { residual_rmsnorm_forward_gpu(res, o, rstd, a, b, g, N, C, eps, st); });
    t[0][1] = time_ms([&] { fp8_quantize_gpu(&qc, &qtc, o, N, C, NULL, st); });
    t[0][2] = time_ms([&] { rmsnorm_forward_fp8_gpu(res, NULL, rstd, a, b, g, N, C, eps, &qc, &qtc, NULL, st); });
    t[1][0] = time_ms([&] { swiglu_forward_gpu(o, a, N, F, st); });
    t[1][1] = time_ms([&] { fp8_quantize_gpu(&qf, &qtf, o, N, F, NULL, st); });
    t[1][2] = time_ms([&] { swiglu_forward_fp8_gpu(NULL, a, N, F, &qf, &qtf, NULL, st); });
    t[2][0] = time_ms([&] { swiglu_backward_gpu(o, b, a, N, F, st); });
    t[2][1] = time_ms([&] { fp8_quantize_gpu(&q, &qt, o, N, 2 * F, NULL, st); });
    t[2][2] = time_ms([&] { swiglu_backward_fp8_gpu(NULL, b, a, N, F, &q, &qt, NULL, st); });
    const char *names[3] = {"residual rmsnorm (x2 per block)", "swiglu", "swiglu backward"};
    const int per_block[3] = {2, 1, 1};
    double saved = 0;
    for (int k = 0; k < 3; k++) {
        const double un = t[k][0] + t[k][1];
        printf("# fused %s %-32s: layer %.3f + quantize %.3f = %.3f ms | fused %.3f ms (%.2fx, saves %.3f)\n", shape,
               names[k], t[k][0], t[k][1], un, t[k][2], un / t[k][2], un - t[k][2]);
        saved += per_block[k] * (un - t[k][2]);
    }
    printf("# fused %s: all %d blocks, per step: saves %.2f ms (N = %d, fp8_block, Q(out) + Q(out^T))\n", shape, L,
           L * saved, N);
    fp8_operand_free(&q);
    fp8_operand_free(&qt);
    CUDA_CHECK(cudaFree(a)); CUDA_CHECK(cudaFree(b)); CUDA_CHECK(cudaFree(o)); CUDA_CHECK(cudaFree(res));
    CUDA_CHECK(cudaFree(g)); CUDA_CHECK(cudaFree(rstd));
}

static void timing_section(void) {
    const char *ov_tt[] = {"precision.linear=\"fp8_tensor\""};
    const char *ov_b[] = {"precision.linear=\"fp8_block\""};
    const char *shapes[2] = {"125M", "569M"}, *jsons[2] = {S125, S569};
    for (int k = 0; k < 2; k++) {
        double tb = timed_run(shapes[k], jsons[k], "bf16", NULL, 0);
        double tt = timed_run(shapes[k], jsons[k], "fp8_tensor", ov_tt, 1);
        double tk = timed_run(shapes[k], jsons[k], "fp8_block", ov_b, 1);
        double tu = timed_run(shapes[k], jsons[k], "fp8_block unfused", ov_b, 1, 0);
        if (tb > 0)
            printf("# timing: %s tokens/s relative to bf16: fp8_tensor %.2fx, fp8_block %.2fx (unfused %.2fx) (weights "
                   "quantized once per step, Q(x^T) kept from the forward, dy quantized once for dgrad and wgrad; "
                   "fp8_block: RMSNorm, SwiGLU and its backward write the codes)\n",
                   shapes[k], tt / tb, tk / tb, tu / tb);
        linear_breakdown(shapes[k], jsons[k]);
        fused_breakdown(shapes[k], jsons[k]);
    }
}

int main(void) {
    plan_tests();
    if (!gpu_test_have_gpu("test_model_gpu_fp8")) return test_summary("test_model_gpu_fp8");
    double t0 = now_seconds();
    Config base = make_config(TINY_JSON, NULL, 0);
    Batches bt;
    bt.B = base.train.micro_batch;
    bt.T = base.model.seq_len;
    bt.n = STEPS;
    size_t BT = (size_t)bt.B * bt.T;
    bt.tokens.resize(STEPS * BT);
    bt.targets.resize(STEPS * BT);
    for (int k = 0; k < STEPS; k++)  // exactly test_model_gpu's "base" batches
        make_batch(&bt.tokens[k * BT], &bt.targets[k * BT], bt.B, bt.T, base.model.vocab_size);
    Ref ref;
    run_mode("bf16 (= test_model_gpu base)", base, bt, STEPS, 3e-2, &ref);
    if (ref.gpu_bf16.empty()) return test_summary("test_model_gpu_fp8");

    const char *ov_t4[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_grad_format=\"e4m3\""};
    const char *ov_t5[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_grad_format=\"e5m2\""};
    const char *ov_b[] = {"precision.linear=\"fp8_block\""};
    run_mode("fp8_tensor e4m3", make_config(TINY_JSON, ov_t4, 2), bt, STEPS, 3e-2, &ref);
    run_mode("fp8_tensor e5m2", make_config(TINY_JSON, ov_t5, 2), bt, STEPS, 5e-2, &ref);
    // delayed linear scaling: scales from the amax histories (the first micro-batch current)
    // (the default history of 16 holds every micro-batch of the run: entry 0 is the first one's)
    const char *ov_td[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_scaling=\"delayed\"",
                           "precision.linear_grad_format=\"e5m2\""};
    run_mode("fp8_tensor delayed", make_config(TINY_JSON, ov_td, 2), bt, STEPS, 3e-2, &ref);
    run_mode("fp8_tensor delayed e5m2", make_config(TINY_JSON, ov_td, 3), bt, 0, 5e-2, &ref);
    // fast accumulation in every fp8_tensor GEMM (precision.linear_fast_accum; the CPU sums in FP32)
    const char *ov_fa[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_scaling=\"delayed\"",
                           "precision.linear_fast_accum=\"all\""};
    run_mode("fp8_tensor delayed, fast accumulation", make_config(TINY_JSON, ov_fa, 3), bt, STEPS, 3e-2, &ref);
    run_mode("fp8_block", make_config(TINY_JSON, ov_b, 1), bt, STEPS, 3e-2, &ref);
    const char *ov_bh[] = {"precision.linear=\"fp8_block\"", "precision.linear_keep_lm_head_bf16=false"};
    run_mode("fp8_block + FP8 LM head", make_config(TINY_JSON, ov_bh, 2), bt, STEPS, 3e-2, &ref);
    // fp8_tensor's LM head: the micro-batch's scales (hf's amax, dlogits' bound), whatever the chunks
    const char *ov_th[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_keep_lm_head_bf16=false",
                           "precision.linear_grad_format=\"e5m2\""};
    run_mode("fp8_tensor + FP8 LM head e5m2", make_config(TINY_JSON, ov_th, 3), bt, STEPS, 5e-2, &ref);
    run_mode("fp8_tensor + FP8 LM head e4m3", make_config(TINY_JSON, ov_th, 2), bt, 0, 3e-2, &ref);
    const char *ov_thd[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_keep_lm_head_bf16=false",
                            "precision.linear_scaling=\"delayed\"", "precision.linear_fast_accum=\"forward\""};
    run_mode("fp8_tensor delayed + FP8 LM head, fast forward", make_config(TINY_JSON, ov_thd, 4), bt, STEPS, 3e-2,
             &ref);
    // a wgrad operand in 128x128 blocks (precision.linear_wgrad_blocks), the LM head's too
    const char *ov_wx[] = {"precision.linear=\"fp8_block\"", "precision.linear_keep_lm_head_bf16=false",
                           "precision.linear_wgrad_blocks=\"activation\""};
    const char *ov_wd[] = {"precision.linear=\"fp8_block\"", "precision.linear_keep_lm_head_bf16=false",
                           "precision.linear_wgrad_blocks=\"gradient\""};
    run_mode("fp8_block wgrad x^T blocks", make_config(TINY_JSON, ov_wx, 3), bt, STEPS, 3e-2, &ref);
    run_mode("fp8_block wgrad dy^T blocks", make_config(TINY_JSON, ov_wd, 3), bt, 0, 3e-2, &ref);
    const char *ov_first[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_bf16_first_layers=1"};
    const char *ov_last[] = {"precision.linear=\"fp8_block\"", "precision.linear_bf16_last_layers=1"};
    const char *ov_both[] = {"precision.linear=\"fp8_block\"", "precision.linear_bf16_first_layers=1",
                             "precision.linear_bf16_last_layers=1"};
    run_mode("fp8_tensor first=1", make_config(TINY_JSON, ov_first, 2), bt, 0, 3e-2, &ref);
    run_mode("fp8_block last=1", make_config(TINY_JSON, ov_last, 2), bt, 0, 3e-2, &ref);
    run_mode("fp8_block first=last=1", make_config(TINY_JSON, ov_both, 3), bt, 0, 3e-2, &ref);
    // FP8 attention (linears BF16), then both together.
    const char *ov_an[] = {"precision.attention=\"fp8_naive\""};
    const char *ov_ah[] = {"precision.attention=\"fp8_hybrid\""};
    const char *ov_ad[] = {"precision.attention=\"fp8_dm\""};
    const char *ov_aa[] = {"precision.attention=\"fp8_dm_approx\""};
    const char *ov_ad5[] = {"precision.attention=\"fp8_dm\"", "precision.attention_grad_format=\"e5m2\""};
    const char *ov_all[] = {"precision.attention=\"fp8_dm\"", "precision.linear=\"fp8_block\""};
    run_mode("attn fp8_naive", make_config(TINY_JSON, ov_an, 1), bt, STEPS, 3e-2, &ref);
    run_mode("attn fp8_hybrid", make_config(TINY_JSON, ov_ah, 1), bt, STEPS, 3e-2, &ref);
    run_mode("attn fp8_dm", make_config(TINY_JSON, ov_ad, 1), bt, STEPS, 3e-2, &ref);
    run_mode("attn fp8_dm_approx", make_config(TINY_JSON, ov_aa, 1), bt, 0, 3e-2, &ref);
    run_mode("attn fp8_dm e5m2", make_config(TINY_JSON, ov_ad5, 2), bt, 0, 5e-2, &ref);
    // delayed scaling: per-layer amax histories on the host, the steps' scales from them (the
    // first step per head), as the CPU backend keeps them; AdamW steps let the history fill
    const char *ov_dl[] = {"precision.attention=\"fp8_dm\"", "precision.attention_scaling=\"delayed\""};
    run_mode("attn fp8_dm delayed", make_config(TINY_JSON, ov_dl, 2), bt, STEPS, 3e-2, &ref);
    run_mode("attn fp8_dm + fp8_block", make_config(TINY_JSON, ov_all, 2), bt, STEPS, 3e-2, &ref);
    invariant_check(bt);
    keep_codes_check();
    qkv_epilogue_check();
    const char *ov_fb[] = {"precision.linear=\"fp8_block\"", "train.recompute=true"};
    fusion_check(bt, "fp8_block", ov_fb, 1);
    fusion_check(bt, "fp8_block recompute", ov_fb, 2);
    const char *ov_ft[] = {"precision.linear=\"fp8_tensor\"", "train.recompute=true"};
    fusion_check(bt, "fp8_tensor", ov_ft, 1);
    fusion_check(bt, "fp8_tensor recompute", ov_ft, 2);
    const char *ov_fd[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_scaling=\"delayed\"",
                           "train.recompute=true"};
    fusion_check(bt, "fp8_tensor delayed", ov_fd, 2, 1);
    fusion_check(bt, "fp8_tensor delayed recompute", ov_fd, 3, 1);
    // F % 128 == 0: the SwiGLU backward's gate and up tiles from one CTA (layers_fp8.cu's pair kernel)
    const char *ov_fp[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_scaling=\"delayed\"",
                           "model.ffn_hidden=256"};
    fusion_check(bt, "fp8_tensor delayed F256 (pair kernel)", ov_fp, 3, 1);
    // fp8_tensor's FP8 LM head: the cross-entropy writes Q(dlogits), transposed for the wgrad
    const char *ov_fh[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_scaling=\"delayed\"",
                           "precision.linear_keep_lm_head_bf16=false"};
    fusion_check(bt, "fp8_tensor delayed + FP8 LM head (cross-entropy codes)", ov_fh, 3, 1);
    // FP8 attention with RoPE inside its quantize pass (BF16 linears): kept codes (the default)
    // and not, delayed scaling (the first step's per-head scales from the rotated values), fp8_hybrid
    const char *ov_rp[] = {"precision.attention=\"fp8_dm\"", "precision.attention_keep_codes=false"};
    fusion_check(bt, "attention fp8_dm RoPE", ov_rp, 1, 0, 1);
    fusion_check(bt, "attention fp8_dm RoPE without kept codes", ov_rp, 2, 0, 1);
    const char *ov_rd[] = {"precision.attention=\"fp8_dm\"", "precision.attention_scaling=\"delayed\""};
    fusion_check(bt, "attention fp8_dm delayed RoPE (first step)", ov_rd, 2, 0, 1);
    fusion_check(bt, "attention fp8_dm delayed RoPE (later step)", ov_rd, 2, 1, 1);
    const char *ov_rh[] = {"precision.attention=\"fp8_hybrid\""};
    fusion_check(bt, "attention fp8_hybrid RoPE", ov_rh, 1, 0, 1);
    printf("# tiny modes took %.1f s\n", now_seconds() - t0);

    if (!getenv("FP8_SKIP_TIMING")) timing_section();
    return test_summary("test_model_gpu_fp8");
}
