// model_gpu.cu: the GPU backend (see model_gpu.h): the GPT of model.h in BF16 with FP32
// accumulation, FP32 master weights and gradients, AdamW on the device.
//
// Data flow of one block (BT = B*T rows; the residual stream x is BF16):
//   h1 = RMSNorm(x_in)                       (fused with the previous residual add)
//   qkv = h1 @ Wqkv^T                        (BT, 3C) = [q | k | v], heads (H, hd) inside each
//   [QK-norm into buf1]; RoPE in place;      attention reads q, k, v as strided views (FP8
//                                            attention without QK-norm: RoPE inside its quantize
//                                            pass, AttnCall.rope)
//   o = attention(q, k, v), lse              (BT, C), (B, H, T)
//   x_mid = x_in + o @ Wo^T; h2 = RMSNorm(x_mid)       (one fused kernel)
//   fc = h2 @ Wfc^T (BT, 2F); sw = silu(gate) * up (BT, F)
//   x_out = x_mid + sw @ Wp^T; next block's h1 = RMSNorm(x_out)   (fused)
// Saved per layer: x_in, x_mid, fc, lse, rstd1, rstd2 (+ QK-norm rstd) (+ with an FP8
// precision.attention and precision.attention_keep_codes, the attention's quantized Q, K, V: the
// forward's quantize pass writes every layout the backward reads, which then quantizes dO alone),
// and where the backward reads them (model.h's gpu_keeps_*, model.c says why): h1, h2, sw (BF16
// linears without train.recompute), qkv (raw, before QK-norm, when qk_norm; else after RoPE, but
// for FP8 attention with kept codes and no diagnostics, whose backward reads no q, k: there q, k
// stay unrotated, the rotated values living on only as the codes; that case keeps no qkv unless
// diagnostics are on), o (not with fp8_dm attention and FP8 linears): exactly model.c's
// memory_plan per layer.
// With qk_norm the backward re-derives the normalised, rotated q, k from the saved raw qkv
// (two cheap kernels) instead of keeping a second (BT, 3C) copy. With train.recompute, BF16
// linears' h1, h2 and sw are recomputed in the backward from x_in, x_mid and fc.
//
// Scratch shared by all layers (sizes from the plan): buf1, buf2 (BT, max(3C, 2F)) BF16 and
// two (BT, C) BF16 buffers: dres (the residual-stream gradient) and dhf (the head's input
// gradient from the forward, then backward scratch). Forward: buf1 = QK-normed qkv, buf2 = the
// GEMM outputs added to the residual, and what a layer does not keep lives in scratch from its
// producer to its last reader: h1 -> dhf (until the QKV GEMM), qkv -> buf1 (until the attention
// forward), o -> dres (until the projection GEMM), h2 -> dres (until the MLP-in GEMM), sw -> buf1
// (until the MLP-out GEMM), in that order within a block (carve points them there).
// Backward of a block: buf1 = sw (recompute) then dfc, then dqkv; buf2 = dsw then dh, then the
// re-derived q, k, v, then h1 (recompute); dhf = h2 (recompute), datt, dh.
//
// Linear layers (precision.linear, in model_gpu_linear.cu; the state both files share is in
// model_gpu_internal.h): every GEMM of the qkv, attention-projection, MLP-in and
// MLP-out linears goes through lin_forward / lin_dgrad / lin_wgrad, which run the BF16 cuBLASLt
// GEMM of matmul.h, or, for the blocks linear_precision_of() puts in fp8_tensor / fp8_block,
// quantize both operands with linear_fp8_gpu.h's kernels exactly as linear_fp8.c's contract
// says and multiply the codes with its FP8 GEMMs. Each operand is quantized once per value it
// takes (the codes are the contract's; only when they are made changes):
//   weights: persistent Q(W) and Q(W^T) of every FP8 linear (one pass each, from the BF16
//     working copy), refreshed lazily by the first forward after anything that wrote the BF16
//     weights (gpu_model_step / _step_slice, gpu_model_set_params, gpu_model_weights_device:
//     under ZeRO-1 the all-gather writes them after the step), so once per optimizer step; per
//     tensor (fp8_tensor) only Q(W) is kept, and each dgrad transposes its codes into a scratch
//     Q(W^T) (the same codes: one scale), one weight's worth of memory instead of all of them;
//   activations x: one call in the forward writes Q(x) (scratch slot 0) for the forward GEMM and
//     Q(x^T) (groups along tokens) into a per-layer buffer kept until wgrad (activations);
//   output gradients dy: one call in lin_wgrad writes Q(dy^T) (slot 1) and Q(dy) (slot 0), and
//     the lin_dgrad that follows on the same dy reuses slot 0;
//   fp8_block, fused (model_gpu_linear.cu's norm_for_linear / swiglu_for_linear /
//     swiglu_backward_for_linear, kernels in layers_fp8.h): the RMSNorms that make h1 and h2 and
//     SwiGLU (sw) write Q(x) and Q(x^T) from 128x128 tiles of their own output, and the SwiGLU
//     backward writes Q(dfc) and Q(dfc^T), so those four operands are never re-read; the BF16
//     h1, h2, sw, dfc are then not written (nothing else reads them with FP8 linears). The qkv
//     gradient dqkv, the attention output o and the residual gradient dres are still quantized
//     in separate passes;
//   fp8_tensor (its one scale needs the whole tensor's amax before any code): the same producers
//     and the RMSNorm backwards (dres) take their output's amax as they write it (layers.h's
//     *_amax_gpu, norm_backward_for_linear), and the quantization pass skips its amax pass; o and
//     dqkv still take theirs.
// The LM head stays BF16 unless linear_keep_lm_head_bf16 is false: then its three GEMMs per chunk
// run in FP8 (head_fp8_begin once per micro-batch, head_fp8_forward / head_fp8_backward per chunk,
// the operands quantized in separate passes) with codes that do not depend on the chunking
// (linear_fp8.c's contract: fp8_block's 1x128 slices; fp8_tensor's scales of the micro-batch, hf's
// amax taken before the first chunk and dlogits' bound, the cross-entropy's factor).
#include "gpu/model_gpu.h"
#include "gpu/model_gpu_internal.h"  // Dev, LayerBufs, Carver, accessors, the linear layers

#include <cuda_runtime.h>  // cudaMalloc, streams, copies
#include <math.h>          // sqrt for the norm
#include <stdlib.h>        // free
#include <string.h>        // memset, memcpy

#include "gpu/adamw_gpu.h"          // adamw_update_gpu
#include "attention_fp8.h"          // attn_forward/attn_backward: attention in precision.attention
#include "attention/kernels_fp8.h"  // attn_fp8_release_stream (gpu_model_free)
#include "core/common.h"            // FATAL, errf, xcalloc
#include "gpu/cuda_check.h"         // CUDA_CHECK
#include "gpu/layers.h"             // norms, RoPE, SwiGLU, cross-entropy, embedding, casts, grad norm
#include "core/precision.h"         // linear_precision_of, Fp8Grouping
#include "gpu/linear_fp8_gpu.h"     // fp8_quantize_gpu, linear_fp8_forward/dgrad/wgrad_gpu
#include "gpu/matmul.h"             // MATMUL_WORKSPACE_BYTES
#include "gpu/qkv_gemm.h"           // qkv_gemm_quant: the QKV projection writing FP8 attention's codes

static int check_supported(const Config *c, int B, int T, ErrBuf *e) {
    const ModelConfig *mc = &c->model;
    if (mc->head_dim != 64 && mc->head_dim != 128)
        return errf(e, "model.d_model / model.n_head = head_dim %d: the GPU attention supports head_dim 64 or 128",
                    mc->head_dim);
    AttnOptions ao;
    const char *why;
    attn_options_from_config(&ao, &c->precision);
    if (attn_mode_supported(&ao, mc->head_dim, &why))
        return errf(e, "precision.attention \"%s\" (attention_scaling \"%s\") cannot run on the GPU backend: %s; "
                       "use train.device \"cpu\" for it", attn_precision_name(ao.precision),
                    scaling_name(ao.scaling), why);
    if (mc->d_model % 8 || mc->ffn_hidden % 8)
        return errf(e, "model.d_model %d and model.ffn_hidden %d must be multiples of 8 on the GPU (16-byte rows)",
                    mc->d_model, mc->ffn_hidden);
    if (B < 1 || T < 1 || T > mc->seq_len)
        return errf(e, "micro-batch %d x %d tokens does not fit model.seq_len %d", B, T, mc->seq_len);
    if (c->precision.linear != LINEAR_BF16) {
        const char *lp = linear_precision_name(c->precision.linear);
        if (mc->d_model % 16 || mc->ffn_hidden % 16)
            return errf(e, "precision.linear \"%s\" on the GPU needs model.d_model (%d) and model.ffn_hidden (%d) to "
                           "be multiples of 16 (cuBLASLt's FP8 GEMMs reduce over them)", lp, mc->d_model, mc->ffn_hidden);
        if (((long)B * T) % 16)
            return errf(e, "precision.linear \"%s\" on the GPU needs micro-batch x tokens (%d x %d = %ld) to be a "
                           "multiple of 16 (the FP8 weight-gradient GEMM reduces over the tokens)", lp, B, T, (long)B * T);
    }
    return 0;
}

// shards: 1, or the world size under ZeRO-1 (masters and moments of S = ceil(P / shards) only,
// as memory_plan sizes them).
static void carve(const Config *c, int B, int T, int shards, char *base, Dev *d, MemoryPlan *plan) {
    const ModelConfig *mc = &c->model;
    ParamTable t;
    param_table_build(&t, mc);
    size_t P = t.total, S = (P + (size_t)shards - 1) / (size_t)shards;
    param_table_free(&t);
    size_t BT = (size_t)B * T, C = mc->d_model, F = mc->ffn_hidden, H = mc->n_head;
    size_t hd = mc->head_dim, Vp = mc->padded_vocab_size, wide = 3 * C > 2 * F ? 3 * C : 2 * F;
    memset(plan, 0, sizeof *plan);
    Carver cv = {base, 0, plan};
    Dev dummy;
    if (!d) d = &dummy;
    d->arena = base;
    // parameters and optimizer
    d->w = (bf16 *)take(&cv, 2 * P, &plan->weights);
    d->p = (float *)take(&cv, 4 * S, &plan->master);
    d->m = (float *)take(&cv, 4 * S, &plan->optimizer);
    d->v = (float *)take(&cv, 4 * S, &plan->optimizer);
    d->g = (float *)take(&cv, 4 * P, &plan->grads);
    // activations saved for backward
    size_t *A = &plan->activations;
    AttnOptions ao;
    attn_options_from_config(&ao, &c->precision);
    size_t attn_codes = c->precision.attention_keep_codes ? attn_saved_codes_bytes(&ao, B, (int)H, T, (int)hd) : 0;
    // h1, h2, sw, qkv, o only where the backward reads them (model.h's gpu_keeps_*, model.c says
    // why); the others are pointed into the scratch below
    const int own_qkv = gpu_keeps_qkv(c);
    for (int l = 0; l < mc->n_layer; l++) {
        LayerBufs lb;
        memset(&lb, 0, sizeof lb);
        lb.own_inputs = gpu_keeps_linear_inputs(c, l);
        lb.own_qkv = own_qkv;
        lb.own_o = gpu_keeps_attn_out(c, l);
        lb.x_in = (bf16 *)take(&cv, 2 * BT * C, A);
        if (lb.own_inputs) lb.h1 = (bf16 *)take(&cv, 2 * BT * C, A);
        if (lb.own_qkv) lb.qkv = (bf16 *)take(&cv, 2 * BT * 3 * C, A);
        if (lb.own_o) lb.o = (bf16 *)take(&cv, 2 * BT * C, A);
        lb.lse = (float *)take(&cv, 4 * BT * H, A);
        lb.x_mid = (bf16 *)take(&cv, 2 * BT * C, A);
        if (lb.own_inputs) lb.h2 = (bf16 *)take(&cv, 2 * BT * C, A);
        lb.fc = (bf16 *)take(&cv, 2 * BT * 2 * F, A);
        if (lb.own_inputs) lb.sw = (bf16 *)take(&cv, 2 * BT * F, A);
        lb.rstd1 = (float *)take(&cv, 4 * BT, A);
        lb.rstd2 = (float *)take(&cv, 4 * BT, A);
        if (mc->qk_norm) lb.rstd_qk = (float *)take(&cv, 4 * 2 * BT * H, A);
        if (attn_codes) {
            lb.attn_codes.buf = take(&cv, attn_codes, A);
            lb.attn_codes.bytes = attn_codes;
        }
        if (base) d->L[l] = lb;
    }
    d->x_final = (bf16 *)take(&cv, 2 * BT * C, A);
    d->hf = (bf16 *)take(&cv, 2 * BT * C, A);
    d->rstd_f = (float *)take(&cv, 4 * BT, A);
    d->head_chunk = (int)gpu_head_chunk(BT);  // (gpu_sizes.h: model.c's plan takes the same)
    d->logits = (bf16 *)take(&cv, 2 * (size_t)d->head_chunk * Vp, A);
    d->buf1 = (bf16 *)take(&cv, 2 * BT * wide, A);
    d->buf2 = (bf16 *)take(&cv, 2 * BT * wide, A);
    d->dres = (bf16 *)take(&cv, 2 * BT * C, A);
    d->dhf = (bf16 *)take(&cv, 2 * BT * C, A);
    d->tokens = (int32_t *)take(&cv, 4 * BT, A);   // the batch and its losses: 12 bytes a
    d->targets = (int32_t *)take(&cv, 4 * BT, A);  // token that model.c's plan leaves out
    d->losses = (float *)take(&cv, 4 * BT, A);
    if (base)  // what a layer does not keep, the forward writes into scratch free from its producer
        for (int l = 0; l < mc->n_layer; l++) {  // to its last reader (see the file comment)
            LayerBufs *lb = &d->L[l];
            if (!lb->own_inputs) lb->h1 = d->dhf, lb->h2 = d->dres, lb->sw = d->buf1;
            if (!lb->own_qkv) lb->qkv = d->buf1;
            if (!lb->own_o) lb->o = d->dres;
        }
    // workspace
    size_t *W = &plan->workspace;
    d->rope = (float *)take(&cv, 4 * (size_t)T * hd, W);
    d->attn_ws_bytes = attn_mode_workspace_bytes(&ao, B, (int)H, T, (int)hd);
    d->attn_ws = take(&cv, d->attn_ws_bytes, W);
    size_t ns = rmsnorm_backward_scratch_bytes((int)BT, (int)C);
    if (mc->qk_norm) {
        size_t q = qk_rmsnorm_backward_scratch_bytes((int)BT, (int)H, (int)hd);
        if (q > ns) ns = q;
    }
    d->norm_scratch = take(&cv, ns, W);
    d->emb_scratch = take(&cv, embedding_backward_scratch_bytes((int)BT, (int)C), W);
    d->norm_partials = (double *)take(&cv, sizeof(double) * GRAD_NORM_PARTIALS, W);
    d->sumsq = (double *)take(&cv, sizeof(double), W);
    if (c->precision.attention_scaling == SCALING_DELAYED)  // per layer: 4 scales, 4 amaxes
        d->dl_dev = (float *)take(&cv, sizeof(float) * 8 * (size_t)mc->n_layer, W);
    plan->workspace += MATMUL_WORKSPACE_BYTES;  // allocated by matmul.cu, not in the arena
    if (c->precision.linear != LINEAR_BF16) {  // FP8 operand slots (the GEMMs share matmul's workspace)
        d->prod_amax = (unsigned *)take(&cv, gpu_fp8_prod_amax_bytes((size_t)mc->n_layer), W);  // fp8_tensor's
        if (linear_delayed_on(&c->precision))
            d->lin_amax_dev = (float *)take(&cv, gpu_fp8_delayed_amax_bytes((size_t)mc->n_layer), W);
        for (int slot = 0; slot < 2; slot++) {
            size_t nc;
            long ns;
            fp8_slot_size(c, slot, (long)BT, &nc, &ns);
            d->q8_codes[slot] = (uint8_t *)take(&cv, nc, W);
            d->q8_scales[slot] = (float *)take(&cv, sizeof(float) * (size_t)ns, W);
            d->q8_codes_cap[slot] = nc;
            d->q8_scales_cap[slot] = ns;
        }
        LinearPrecision lp = c->precision.linear;
        const int keep_wt = gpu_fp8_keeps_weight_t(lp);
        if (!keep_wt) {  // per-tensor weights: the dgrad's Q(W^T), transposed from Q(W) (lin_dgrad)
            const size_t n = gpu_fp8_weight_t_scratch_codes(C, F);
            d->wt_scratch = take_operand(&cv, 1, (int)n, FP8_GROUP_TENSOR, FP8_E4M3, W);
            d->wt_scratch_cap = n;
        }
        // per FP8 block: Q(W), Q(W^T) (but per tensor) (weights) and the saved Q(x^T) (activations)
        // of its linears
        for (int l = 0; l < mc->n_layer; l++) {
            if (linear_precision_of(&c->precision, mc->n_layer, l) == LINEAR_BF16) continue;
            for (int i = 0; i < 4; i++) {
                int M, K;
                fp8_lin_shape(i, (int)C, (int)F, &M, &K);
                Fp8Operand w = take_operand(&cv, M, K, linear_weight_grouping(lp), FP8_E4M3, &plan->weights);
                Fp8Operand wt;  // (codes NULL: made by each dgrad)
                memset(&wt, 0, sizeof wt);
                if (keep_wt) wt = take_operand(&cv, K, M, linear_weight_grouping(lp), FP8_E4M3, &plan->weights);
                Fp8Operand xt = take_operand(&cv, K, (int)BT, linear_xt_grouping(lp, c->precision.linear_wgrad_blocks),
                                             FP8_E4M3, A);
                if (base) {
                    d->w8[4 * l + i] = w;
                    d->wt8[4 * l + i] = wt;
                    d->xt8[4 * l + i] = xt;
                }
            }
        }
        // an FP8 LM head: Q(W), Q(W^T) (weights) and one chunk's Q(hf^T) (workspace)
        const long hc = fp8_head_chunk(c, (long)BT);
        if (hc > 0) {
            const LinearPrecision hp = linear_precision_of(&c->precision, mc->n_layer, -1);
            Fp8Operand w = take_operand(&cv, (int)Vp, (int)C, linear_weight_grouping(hp), FP8_E4M3, &plan->weights);
            Fp8Operand wt = take_operand(&cv, (int)C, (int)Vp, linear_weight_grouping(hp), FP8_E4M3, &plan->weights);
            const Fp8Grouping xg = linear_xt_grouping(hp, c->precision.linear_wgrad_blocks);
            Fp8Operand xt = take_operand(&cv, (int)C, (int)hc, xg, FP8_E4M3, W);
            if (base) {
                d->head_w8 = w;
                d->head_wt8 = wt;
                d->head_xt = xt;
            }
        }
    }
    plan->total = plan->weights + plan->master + plan->optimizer + plan->grads +
                  plan->activations + plan->workspace;
}

int gpu_model_plan(const Config *c, int B, int T, MemoryPlan *out, ErrBuf *e) {
    return gpu_model_plan_sharded(c, B, T, 1, 0, out, e);
}

int gpu_model_plan_sharded(const Config *c, int B, int T, int world, int zero1, MemoryPlan *out, ErrBuf *e) {
    if (check_supported(c, B, T, e)) return -1;
    carve(c, B, T, zero1 && world > 1 ? world : 1, NULL, NULL, out);
    return 0;
}

void gpu_model_plan_compare(FILE *f, const Config *c, int B, int T) {
    MemoryPlan mine, ref;
    ErrBuf e;
    if (gpu_model_plan(c, B, T, &mine, &e)) {
        fprintf(f, "  (no GPU plan: %s)\n", e.msg);
        return;
    }
    Config cc = *c;  // model.c's plan sizes activations with micro_batch x seq_len
    cc.model.seq_len = T;
    memory_plan(&cc, 1, 0, B, &ref);
    const double MiB = 1024.0 * 1024.0;
    const char *names[] = {"weights (bf16)", "master weights (fp32)", "AdamW m, v (fp32)",
                           "gradients (fp32)", "activations", "workspace", "total"};
    size_t a[] = {mine.weights, mine.master, mine.optimizer, mine.grads, mine.activations,
                  mine.workspace, mine.total};
    size_t b[] = {ref.weights, ref.master, ref.optimizer, ref.grads, ref.activations,
                  ref.workspace, ref.total};
    fprintf(f, "  %-24s %12s %12s %12s\n", "GPU allocation (MiB)", "allocated", "memory_plan", "difference");
    for (int i = 0; i < 7; i++)
        fprintf(f, "  %-24s %12.3f %12.3f %+12.3f\n", names[i], a[i] / MiB, b[i] / MiB,
                ((double)a[i] - (double)b[i]) / MiB);
}

// --- init / free ----------------------------------------------------------------------------------

static ParamKind head_kind(const GpuModel *m) { return m->cfg.model.tied_embeddings ? P_WTE : P_LM_HEAD; }

// The host-side arrays of d, then d itself (unset ones are NULL).
static void dev_free_host(Dev *d) {
    free(d->L);
    free(d->w8);
    free(d->wt8);
    free(d->xt8);
    free(d->xt8_n);
    free(d->host_losses);
    free(d->host_logits);
    free(d->delayed);
    free(d->dl_host);
    free(d->lin_amax_host);
    free(d->lin_words_host);
    free(d);
}

// Whether this config's attention, at micro-batch B x T, can take its Q, K, V codes from the QKV
// projection's epilogue (qkv_gemm.h): a mode whose forward and backward read only those codes
// (attn_mode_codes_upstream), kept codes, RoPE or no positions but no QK-norm, and the GEMM's
// shapes (else *why, when given, says which shape the GEMM refuses). Per layer and forward the model
// also needs a BF16 linear, a training forward and no probe.
static int qkv_epilogue_fits(const Config *c, const AttnOptions *attn, int B, int T, const char **why) {
    const ModelConfig *mc = &c->model;
    if (why) *why = NULL;
    return c->precision.attention_keep_codes && !mc->qk_norm && (mc->position == POS_ROPE || mc->position == POS_NONE) &&
           attn_mode_codes_upstream(attn, mc->head_dim, T) &&
           qkv_gemm_quant_supported(B * T, T, mc->d_model, mc->head_dim, why) == 0;
}

int gpu_model_init(GpuModel *m, const Config *c, int B, int T, unsigned long long seed,
                   FILE *plan_out, ErrBuf *e) {
    return gpu_model_init_sharded(m, c, B, T, seed, 0, 1, plan_out, e);
}

int gpu_model_init_sharded(GpuModel *m, const Config *c, int B, int T, unsigned long long seed, int rank,
                           int world, FILE *plan_out, ErrBuf *e) {
    memset(m, 0, sizeof *m);
    if (world < 1 || rank < 0 || rank >= world) FATAL("gpu_model_init_sharded: rank %d of %d", rank, world);
    if (check_supported(c, B, T, e)) return -1;
    m->cfg = *c;
    m->B = B;
    m->T = T;
    m->loss_scale = 1.0f;
    param_table_build(&m->table, &c->model);
    // This rank's slice, as backend.c's CPU ZeRO-1 cuts it (both ends clipped to P).
    const size_t P = m->table.total;
    m->shard_rank = rank;
    m->shard_world = world;
    m->shard_len = (P + (size_t)world - 1) / (size_t)world;
    m->shard_lo = (size_t)rank * m->shard_len < P ? (size_t)rank * m->shard_len : P;
    m->shard_hi = m->shard_lo + m->shard_len < P ? m->shard_lo + m->shard_len : P;
    Dev *d = (Dev *)xcalloc(1, sizeof(Dev));
    d->L = (LayerBufs *)xcalloc((size_t)c->model.n_layer, sizeof(LayerBufs));
    {  // delayed scaling's histories: attention's (whatever the precision: probes may switch it; or as
       // the place the linears' follow, in the CPU's layout), the linears'
        const int L = c->model.n_layer, attn = c->precision.attention_scaling == SCALING_DELAYED;
        const int lin = linear_delayed_on(&c->precision);
        d->delayed = delayed_states_new(&c->precision, L, attn, &d->n_delayed);
        if (attn) {
            d->attn_delayed = d->delayed;
            d->dl_host = (float *)xcalloc(8 * (size_t)L, sizeof(float));
        }
        if (lin) {
            d->lin_delayed = d->delayed + LINEAR_DELAYED_FIRST(L);
            d->lin_amax_host = (float *)xcalloc(8 * (size_t)L, sizeof(float));
            d->lin_words_host = (float *)xcalloc(8 * (size_t)L, sizeof(float));
        }
    }
    if (c->precision.linear != LINEAR_BF16) {  // FP8 linears: per-layer quantized weights and Q(x^T)
        d->w8 = (Fp8Operand *)xcalloc(4 * (size_t)c->model.n_layer, sizeof(Fp8Operand));
        d->wt8 = (Fp8Operand *)xcalloc(4 * (size_t)c->model.n_layer, sizeof(Fp8Operand));
        d->xt8 = (Fp8Operand *)xcalloc(4 * (size_t)c->model.n_layer, sizeof(Fp8Operand));
        d->xt8_n = (int *)xcalloc(4 * (size_t)c->model.n_layer, sizeof(int));
    }
    carve(c, B, T, world, NULL, NULL, &m->plan);
    if (plan_out) {
        fprintf(plan_out, "GPU memory plan: micro-batch %d x %d tokens%s", B, T,
                c->train.recompute ? ", recompute norms and SwiGLU" : "");
        if (world > 1) fprintf(plan_out, ", ZeRO-1: masters and AdamW state 1/%d (%zu of %zu values)", world, m->shard_len, P);
        fprintf(plan_out, "\n");
        memory_plan_print(plan_out, &m->plan);
    }
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (m->plan.total > free_b) {
        param_table_free(&m->table);
        dev_free_host(d);
        return errf(e, "the GPU memory plan needs %.2f GiB but the GPU has %.2f GiB free (of %.2f): "
                       "lower train.micro_batch, set train.recompute, or use a smaller model",
                    m->plan.total / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0);
    }
    size_t arena_bytes = m->plan.total - MATMUL_WORKSPACE_BYTES;
    char *arena = NULL;
    CUDA_CHECK(cudaMalloc((void **)&arena, arena_bytes));
    MemoryPlan again;
    carve(c, B, T, world, arena, d, &again);
    if (memcmp(&again, &m->plan, sizeof again)) FATAL("model_gpu: the plan changed between sizing and carving");
    CUDA_CHECK(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    d->w8_dirty = 1;
    d->fp8_fuse = c->precision.fuse_fp8_producers;
    d->attn_rope_fuse = c->precision.fuse_attention_rope;
    d->qkv_epilogue = c->precision.fuse_qkv_epilogue;
    matmul_gpu_init();
    if (c->precision.linear != LINEAR_BF16) linear_fp8_gpu_init();
    d->host_losses = (float *)xcalloc((size_t)B * T, sizeof(float));
    d->host_logits = (bf16 *)xcalloc((size_t)c->model.padded_vocab_size, sizeof(bf16));
    attn_options_from_config(&d->attn, &c->precision);
    m->priv = d;
    if (plan_out && d->qkv_epilogue) {
        const char *why;
        if (qkv_epilogue_fits(c, &d->attn, B, T, &why))
            fprintf(plan_out, "FP8 attention: Q, K, V codes from the QKV projection's epilogue (qkv_gemm.h) in layers "
                              "with BF16 linears; precision.fuse_qkv_epilogue=false for cuBLASLt and the quantize pass\n");
        else if (why)
            fprintf(plan_out, "FP8 attention: cuBLASLt's QKV projection and the quantize pass (%s)\n", why);
    }

    // parameters: host init (the same values as the CPU backend), then FP32 masters + BF16 copy
    float *host = (float *)xmalloc(sizeof(float) * P);
    params_init(&m->table, &c->model, seed, host);
    gpu_model_set_params(m, host);
    free(host);
    CUDA_CHECK(cudaMemsetAsync(d->g, 0, sizeof(float) * P, d->stream));
    CUDA_CHECK(cudaMemsetAsync(d->m, 0, sizeof(float) * m->shard_len, d->stream));
    CUDA_CHECK(cudaMemsetAsync(d->v, 0, sizeof(float) * m->shard_len, d->stream));
    if (c->model.position == POS_ROPE)
        rope_table_gpu(d->rope, T, c->model.head_dim, c->model.rope_theta, d->stream);
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
    return 0;
}

void gpu_model_free(GpuModel *m) {
    Dev *d = (Dev *)m->priv;
    if (d) {
        CUDA_CHECK(cudaStreamSynchronize(d->stream));
        prof_free(d);
        CUDA_CHECK(cudaFree(d->arena));
        attn_fp8_release_stream(d->stream);  // the FP8 attention kernels' tile counter of this stream
        CUDA_CHECK(cudaStreamDestroy(d->stream));
        dev_free_host(d);
    }
    param_table_free(&m->table);
    memset(m, 0, sizeof *m);
}

void gpu_model_set_loss_scale(GpuModel *m, float loss_scale) { m->loss_scale = loss_scale; }

// --- forward --------------------------------------------------------------------------------------

// Checks the ids on the host (as the CPU backend does) and uploads them.
static int upload_batch(GpuModel *m, const int32_t *tokens, const int32_t *targets, int BT) {
    Dev *d = dev_of(m);
    int V = m->cfg.model.vocab_size, counted = 0;
    for (int i = 0; i < BT; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            FATAL("model_gpu: token id %d at position %d outside [0, %d) (hint: the data shard does not match the vocabulary)",
                  tokens[i], i, V);
    CUDA_CHECK(cudaMemcpyAsync(d->tokens, tokens, sizeof(int32_t) * BT, cudaMemcpyHostToDevice, d->stream));
    if (targets) {
        for (int i = 0; i < BT; i++) {
            if (targets[i] >= V)
                FATAL("model_gpu: target id %d at position %d outside [0, %d) (hint: the data shard does not match the vocabulary)",
                      targets[i], i, V);
            counted += targets[i] >= 0;
        }
        CUDA_CHECK(cudaMemcpyAsync(d->targets, targets, sizeof(int32_t) * BT, cudaMemcpyHostToDevice, d->stream));
    }
    return counted;
}

static const AttnModeDiag *attn_diag(Dev *d, int l) { return d->attn_diag ? &d->attn_diag[l] : NULL; }

// Delayed scaling: what layer l's attention needs this step (attention_fp8.h's AttnDelayedGpu),
// from the device copy delayed_upload made; count: whether its amaxes go into this step's.
static AttnDelayedGpu attn_delayed_of(Dev *d, int l, int count) {
    AttnDelayedGpu g;
    memset(&g, 0, sizeof g);
    if (!d->attn_delayed) return g;
    g.first_step = d->attn_delayed[l].filled == 0;
    g.scale = d->dl_dev + 8 * (size_t)l;
    g.cur_amax = count ? d->dl_dev + 8 * (size_t)l + 4 : NULL;
    return g;
}

// Layer l's attention call at micro-batch (B, T): options, shape, workspace, diagnostics, o and lse
// and, for a backward, dO (d->dhf) and dq, dk, dv into d->buf1 (BT, 3C); the caller sets the
// inputs (q, k, v or codes_ready), the kept codes and the delayed-scaling state.
static AttnCall attn_call(GpuModel *m, int l, int B, int T) {
    Dev *d = dev_of(m);
    const ModelConfig *mc = &m->cfg.model;
    const int C = mc->d_model;
    AttnCall c;
    memset(&c, 0, sizeof c);
    c.opt = &d->attn;
    c.B = B, c.H = mc->n_head, c.T = T, c.d = mc->head_dim;
    c.qkv_stride = 3 * C;
    c.o = d->L[l].o, c.o_stride = C, c.lse = d->L[l].lse;
    c.dout = d->dhf;
    c.dq = d->buf1, c.dk = d->buf1 + C, c.dv = d->buf1 + 2 * C, c.dqkv_stride = 3 * C;
    c.workspace = d->attn_ws;
    c.diag = attn_diag(d, l);
    c.stream = d->stream;
    return c;
}
// Before a forward: every layer's scales from its host history (first step: none, the kernels
// take per-head scales) and its amax so far, to the device. The host state is the only state
// between steps, so checkpoint restores and the trainer's restores around evaluation need nothing
// else.
static void delayed_upload(GpuModel *m) {
    Dev *d = dev_of(m);
    if (!d->attn_delayed) return;
    const int L = m->cfg.model.n_layer;
    for (int l = 0; l < L; l++) {
        const AttnDelayedState *s = &d->attn_delayed[l];
        float *h = d->dl_host + 8 * (size_t)l;
        if (s->filled > 0) attn_delayed_scales(s, d->attn.grad_format, h);
        else h[0] = h[1] = h[2] = h[3] = 1.0f;  // unused: first_step
        for (int t = 0; t < 4; t++) h[4 + t] = s->cur_amax[t];
    }
    CUDA_CHECK(cudaMemcpyAsync(d->dl_dev, d->dl_host, sizeof(float) * 8 * (size_t)L, cudaMemcpyHostToDevice,
                               d->stream));
}
// At the end of a backward: the step's amaxes home (enqueued before the backward's final stream
// synchronization), then, once it has passed, into every layer's history, as cpu_model_backward
// commits them.
static void delayed_download(GpuModel *m) {
    Dev *d = dev_of(m);
    if (!d->attn_delayed) return;
    CUDA_CHECK(cudaMemcpyAsync(d->dl_host, d->dl_dev, sizeof(float) * 8 * (size_t)m->cfg.model.n_layer,
                               cudaMemcpyDeviceToHost, d->stream));
}
static void delayed_commit(GpuModel *m) {
    Dev *d = dev_of(m);
    if (!d->attn_delayed) return;
    const int L = m->cfg.model.n_layer;
    for (int l = 0; l < L; l++) {
        for (int t = 0; t < 4; t++) d->attn_delayed[l].cur_amax[t] = d->dl_host[8 * (size_t)l + 4 + t];
        attn_delayed_commit(&d->attn_delayed[l]);
    }
}

AttnDelayedState *gpu_model_delayed_state(GpuModel *m, int *n) {
    Dev *d = dev_of(m);
    *n = d->n_delayed;
    return d->delayed;
}

// Delayed linear scaling, before a forward: whether this micro-batch scales from the histories
// (they fill together: empty only before the first backward), and if so, every operand's
// history maximum to the device.
static void lin_delayed_upload(GpuModel *m) {
    Dev *d = dev_of(m);
    if (!d->lin_delayed) return;
    const int n = 8 * m->cfg.model.n_layer;
    d->lin_ready = d->lin_delayed[0].filled > 0;
    if (!d->lin_ready) return;
    for (int w = 0; w < n; w++) d->lin_amax_host[w] = attn_delayed_amax(&d->lin_delayed[w / 4], w % 4);
    CUDA_CHECK(cudaMemcpyAsync(d->lin_amax_dev, d->lin_amax_host, sizeof(float) * n, cudaMemcpyHostToDevice,
                               d->stream));
}
// At the end of a backward: the micro-batch's amaxes (prod_amax) home, enqueued before the
// backward's final synchronization; then, once it has passed, into the histories (word w is
// tensor w % 4 of linear state w / 4: linear_delayed_slot), as the CPU's backward commits them.
static void lin_delayed_download(GpuModel *m) {
    Dev *d = dev_of(m);
    if (!d->lin_delayed) return;
    CUDA_CHECK(cudaMemcpyAsync(d->lin_words_host, d->prod_amax, gpu_fp8_prod_amax_bytes((size_t)m->cfg.model.n_layer),
                               cudaMemcpyDeviceToHost, d->stream));
}
static void lin_delayed_commit(GpuModel *m) {
    Dev *d = dev_of(m);
    if (!d->lin_delayed) return;
    for (int w = 0; w < 8 * m->cfg.model.n_layer; w++) d->lin_delayed[w / 4].cur_amax[w % 4] = d->lin_words_host[w];
    for (int j = 0; j < 2 * m->cfg.model.n_layer; j++) attn_delayed_commit(&d->lin_delayed[j]);
}

// The normalised, rotated q, k, v of layer l for attention: the saved qkv itself, or (qk_norm)
// QK-norm of the saved raw qkv into dst, then RoPE there.
static const bf16 *attention_inputs(GpuModel *m, int l, bf16 *dst, int B, int T) {
    Dev *d = dev_of(m);
    const ModelConfig *mc = &m->cfg.model;
    LayerBufs *lb = &d->L[l];
    if (!mc->qk_norm) return lb->qkv;  // RoPE was applied in place by the forward
    qk_rmsnorm_forward_gpu(dst, lb->rstd_qk, lb->qkv, W(m, P_Q_NORM, l), W(m, P_K_NORM, l), B * T,
                           mc->n_head, mc->head_dim, (float)mc->norm_eps, d->stream);
    if (mc->position == POS_ROPE) rope_forward_gpu(dst, d->rope, B, T, mc->n_head, mc->head_dim, d->stream);
    return dst;
}

// Layer l's attention forward on the BF16 qkv its projection wrote (RoPE / QK-norm first, or RoPE
// inside an FP8 mode's quantize pass when fused_rope): o, lse and, in a training forward with kept
// codes, the Q, K, V codes for the backward.
static void attention_forward(GpuModel *m, int l, int B, int T, int fused_rope) {
    Dev *d = dev_of(m);
    const ModelConfig *mc = &m->cfg.model;
    const int C = mc->d_model, H = mc->n_head, hd = mc->head_dim;
    cudaStream_t s = d->stream;
    LayerBufs *lb = &d->L[l];
    const bf16 *qkv = lb->qkv;
    if (mc->qk_norm) qkv = attention_inputs(m, l, d->buf1, B, T);
    else if (mc->position == POS_ROPE && !fused_rope) rope_forward_gpu(lb->qkv, d->rope, B, T, H, hd, s);
    prof_mark(d, PH_FWD_ROPE);
    // Q, K, V codes kept for the backward when one follows (an evaluation forward leaves them)
    AttnSavedCodes *keep = d->save_xt && lb->attn_codes.buf ? &lb->attn_codes : NULL;
    if (!keep) lb->attn_codes.valid = 0;
    const AttnDelayedGpu dl = attn_delayed_of(d, l, d->save_xt);  // a training forward counts its amaxes
    AttnCall c = attn_call(m, l, B, T);
    c.q = qkv, c.k = qkv + C, c.v = qkv + 2 * C;
    c.saved = keep;
    c.delayed = d->attn_delayed ? &dl : NULL;
    if (fused_rope) {
        // RoPE inside the FP8 quantize pass. The rotated BF16 q, k are written back only for a
        // backward that reads them: one without kept codes, or with the diagnostics' local
        // reference; otherwise lb->qkv keeps the unrotated q, k, which nothing reads again.
        c.rope = d->rope;
        c.rotate_in_place = d->save_xt && (!keep || attn_diag(d, l) != NULL);
        d->attn_rope_fused++;
    }
    attn_forward(&c);
}

// Embedding and every block for the uploaded tokens (B, T); leaves x_final and hf = final norm.
static void forward_blocks(GpuModel *m, int B, int T) {
    Dev *d = dev_of(m);
    const ModelConfig *mc = &m->cfg.model;
    int BT = B * T, C = mc->d_model, F = mc->ffn_hidden, H = mc->n_head, hd = mc->head_dim;
    int L = mc->n_layer, Vp = mc->padded_vocab_size;
    float eps = (float)mc->norm_eps;
    cudaStream_t s = d->stream;
    d->fwd_B = B;
    d->fwd_T = T;
    prof_mark(d, PH_HOST);
    fp8_refresh_weights(m);  // Q(W), Q(W^T) if the weights changed (FP8 linears only)
    if (d->prod_amax)        // fp8_tensor's producer amaxes, for this forward and its backward
        CUDA_CHECK(cudaMemsetAsync(d->prod_amax, 0, gpu_fp8_prod_amax_bytes((size_t)mc->n_layer), s));
    delayed_upload(m);       // attention delayed scaling: this step's scales and amaxes
    lin_delayed_upload(m);   // linear delayed scaling: the amaxes this micro-batch's scales come from
    prof_mark(d, PH_FWD_LINEAR);
    // h1, h2, sw, qkv, o that a layer does not keep live in scratch (see the file comment).
    embedding_forward_gpu(d->L[0].x_in, d->tokens, W(m, P_WTE, 0), BT, C, Vp, s);
    norm_for_linear(m, P_QKV, 0, NULL, d->L[0].h1, d->L[0].rstd1, d->L[0].x_in, NULL,
                    W(m, P_ATTN_NORM, 0), BT, C, eps);
    prof_mark(d, PH_FWD_NORM);
    // FP8 attention after RoPE (no QK-norm): the quantize pass is the RoPE pass too
    // (AttnCall.rope), one read of q, k, v instead of two
    const int fused_rope = d->attn_rope_fuse && !mc->qk_norm && mc->position == POS_ROPE &&
                           attn_precision_is_fp8(d->attn.precision);
    // FP8 attention on codes from the QKV projection's epilogue (qkv_gemm.h; layers below also need
    // kept codes, BF16 linears and no probe this forward)
    const int epi_shape = d->qkv_epilogue && d->save_xt && qkv_epilogue_fits(&m->cfg, &d->attn, B, T, NULL);
    for (int l = 0; l < L; l++) {
        LayerBufs *lb = &d->L[l];
        bf16 *h1 = lb->h1, *h2 = lb->h2, *sw = lb->sw;
        if (epi_shape && lb->attn_codes.buf && !attn_diag(d, l) &&
            linear_precision_of(&m->cfg.precision, L, l) == LINEAR_BF16) {
            // q, k, v exist only as the codes in lb->attn_codes (lb->qkv is not written: with kept
            // codes and no probe the backward reads no q, k, v)
            QkvQuantOut qo;
            attn_saved_codes_parts(&d->attn, &lb->attn_codes, B, H, T, hd, qo.codes, qo.codes_t, qo.scales);
            qo.rope = mc->position == POS_ROPE ? d->rope : NULL;
            qkv_gemm_quant(&qo, h1, W(m, P_QKV, l), BT, T, C, s);                  // (BT, 3C) -> codes
            prof_mark(d, PH_FWD_LINEAR);
            AttnCall c = attn_call(m, l, B, T);
            c.codes_ready = 1;
            c.saved = &lb->attn_codes;
            attn_forward(&c);
            d->qkv_epilogue_runs++;
        } else {
            lin_forward(m, P_QKV, l, lb->qkv, h1, BT, 3 * C, C);                   // (BT, 3C)
            prof_mark(d, PH_FWD_LINEAR);
            attention_forward(m, l, B, T, fused_rope);
        }
        prof_mark(d, PH_FWD_ATTN);
        lin_forward(m, P_ATTN_PROJ, l, d->buf2, lb->o, BT, C, C);                  // (BT, C)
        prof_mark(d, PH_FWD_LINEAR);
        norm_for_linear(m, P_MLP_FC, l, lb->x_mid, h2, lb->rstd2, lb->x_in, d->buf2, W(m, P_MLP_NORM, l), BT, C,
                        eps);
        prof_mark(d, PH_FWD_NORM);
        lin_forward(m, P_MLP_FC, l, lb->fc, h2, BT, 2 * F, C);                     // (BT, 2F)
        prof_mark(d, PH_FWD_LINEAR);
        swiglu_for_linear(m, P_MLP_PROJ, l, sw, lb->fc, BT, F);                    // (BT, F)
        prof_mark(d, PH_FWD_SWIGLU);
        lin_forward(m, P_MLP_PROJ, l, d->buf2, sw, BT, C, F);                      // (BT, C)
        prof_mark(d, PH_FWD_LINEAR);
        if (l + 1 < L) {
            LayerBufs *nb = &d->L[l + 1];
            norm_for_linear(m, P_QKV, l + 1, nb->x_in, nb->h1, nb->rstd1, lb->x_mid, d->buf2,
                            W(m, P_ATTN_NORM, l + 1), BT, C, eps);
        } else {
            residual_rmsnorm_forward_gpu(d->x_final, d->hf, d->rstd_f, lb->x_mid, d->buf2,
                                         W(m, P_FINAL_NORM, 0), BT, C, eps, s);
        }
        prof_mark(d, PH_FWD_NORM);
    }
}

// Fused LM head + cross-entropy, chunk by chunk (see model_gpu.h). With want_grad: dhf (BT, C)
// = d(loss * loss_scale)/d(hf) and the head's weight gradient added into the gradients.
// host_rows (n_rows, Vp), if not NULL, receives the BF16 logits of the listed rows (indices into
// BT) as the cross-entropy read them.
static float head_and_loss_rows(GpuModel *m, int counted, int want_grad, int n_rows, const int *rows, bf16 *host_rows) {
    Dev *d = dev_of(m);
    const ModelConfig *mc = &m->cfg.model;
    int BT = d->fwd_B * d->fwd_T, C = mc->d_model, V = mc->vocab_size, Vp = mc->padded_vocab_size;
    cudaStream_t s = d->stream;
    const bf16 *w = W(m, head_kind(m), 0);                                          // (Vp, C)
    float *gw = G(m, head_kind(m), 0);
    float grad_scale = want_grad && counted ? m->loss_scale / (float)counted : 0.0f;
    if (want_grad && grad_scale == 0.0f) CUDA_CHECK(cudaMemsetAsync(d->dhf, 0, sizeof(bf16) * (size_t)BT * C, s));
    const int fp8_head = d->head_w8.codes != NULL;  // linear_keep_lm_head_bf16 false
    if (fp8_head) head_fp8_begin(m, d->hf, BT);
    for (int c0 = 0; c0 < BT; c0 += d->head_chunk) {
        int n = BT - c0 < d->head_chunk ? BT - c0 : d->head_chunk;
        const bf16 *hf = d->hf + (size_t)c0 * C;
        if (fp8_head) head_fp8_forward(m, d->logits, hf, n, grad_scale != 0.0f);          // (n, Vp)
        else matmul_forward_gpu(d->logits, hf, w, n, Vp, C, 0, s);                       // (n, Vp)
        for (int r = 0; r < n_rows && host_rows; r++)
            if (rows[r] >= c0 && rows[r] < c0 + n)
                CUDA_CHECK(cudaMemcpyAsync(host_rows + (size_t)r * Vp, d->logits + (size_t)(rows[r] - c0) * Vp,
                                           sizeof(bf16) * (size_t)Vp, cudaMemcpyDeviceToHost, s));
        int codes_ready = 0;  // an fp8_tensor head's cross-entropy may write Q(dlogits) instead
        if (fp8_head) codes_ready = head_fp8_cross_entropy(m, d->logits, d->losses + c0, d->targets + c0, n, grad_scale);
        else cross_entropy_gpu(d->logits, d->losses + c0, d->targets + c0, n, V, Vp, grad_scale, s);
        if (grad_scale != 0.0f) {  // the chunk now holds dlogits (or their codes)
            if (fp8_head) {
                head_fp8_backward(m, d->dhf + (size_t)c0 * C, gw, d->logits, n, grad_scale, codes_ready);
            } else {
                matmul_dgrad_gpu(d->dhf + (size_t)c0 * C, d->logits, w, n, Vp, C, 0, s);  // (n, C)
                matmul_wgrad_gpu(gw, d->logits, hf, n, Vp, C, s);                         // (Vp, C)
            }
        }
    }
    prof_mark(d, PH_HEAD);
    d->grad_ready = want_grad;
    d->fwd_loss_scale = m->loss_scale;
    CUDA_CHECK(cudaMemcpyAsync(d->host_losses, d->losses, sizeof(float) * BT, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    double sum = 0.0;  // fixed order, as on the CPU
    for (int i = 0; i < BT; i++) sum += d->host_losses[i];
    return counted ? (float)(sum / counted) : 0.0f;
}

static float head_and_loss(GpuModel *m, int counted, int want_grad) {
    return head_and_loss_rows(m, counted, want_grad, 0, NULL, NULL);
}

float gpu_model_forward(GpuModel *m, const int32_t *tokens, const int32_t *targets) {
    int counted = upload_batch(m, tokens, targets, m->B * m->T);
    dev_of(m)->save_xt = 1;  // a backward follows: keep Q(x^T) for wgrad
    forward_blocks(m, m->B, m->T);
    dev_of(m)->save_xt = 0;
    return head_and_loss(m, counted, 1);
}

float gpu_model_loss(GpuModel *m, const int32_t *tokens, const int32_t *targets) {
    int counted = upload_batch(m, tokens, targets, m->B * m->T);
    forward_blocks(m, m->B, m->T);
    return head_and_loss(m, counted, 0);
}

float gpu_model_loss_detail(GpuModel *m, const int32_t *tokens, const int32_t *targets, float *losses, int n_rows,
                            const int *rows, float *row_logits) {
    const int BT = m->B * m->T, Vp = m->cfg.model.padded_vocab_size;
    for (int r = 0; r < n_rows; r++)
        if (rows[r] < 0 || rows[r] >= BT) FATAL("gpu_model_loss_detail: row %d outside [0, %d)", rows[r], BT);
    int counted = upload_batch(m, tokens, targets, BT);
    forward_blocks(m, m->B, m->T);
    bf16 *host = n_rows > 0 && row_logits ? (bf16 *)xmalloc(sizeof(bf16) * (size_t)n_rows * Vp) : NULL;
    float loss = head_and_loss_rows(m, counted, 0, n_rows, rows, host);  // synchronizes the stream
    if (losses) memcpy(losses, dev_of(m)->host_losses, sizeof(float) * (size_t)BT);
    for (size_t i = 0; host && i < (size_t)n_rows * Vp; i++) {
        uint32_t bits = (uint32_t)host[i] << 16;
        memcpy(&row_logits[i], &bits, sizeof bits);
    }
    free(host);
    return loss;
}

void gpu_model_next_logits(GpuModel *m, const int32_t *tokens, int t, float *logits) {
    Dev *d = dev_of(m);
    const ModelConfig *mc = &m->cfg.model;
    if (t < 1 || t > m->T) FATAL("gpu_model_next_logits: %d tokens, expected 1..%d", t, m->T);
    upload_batch(m, tokens, NULL, t);
    forward_blocks(m, 1, t);
    d->grad_ready = 0;
    int C = mc->d_model, Vp = mc->padded_vocab_size;
    if (d->head_w8.codes) {
        // an FP8 LM head, as the CPU runs it: the row padded to the 4 rows a 1x128-scaled operand
        // needs (cuBLASLt's VEC128 layout), with zero rows (1x128 scales are per row, a tensor's
        // amax is the row's: row 0's codes do not depend on them); logits row 0 is the token's
        CUDA_CHECK(cudaMemsetAsync(d->buf1, 0, sizeof(bf16) * 4 * (size_t)C, d->stream));
        CUDA_CHECK(cudaMemcpyAsync(d->buf1, d->hf + (size_t)(t - 1) * C, sizeof(bf16) * (size_t)C,
                                   cudaMemcpyDeviceToDevice, d->stream));
        head_fp8_begin(m, d->buf1, 4);
        head_fp8_forward(m, d->logits, d->buf1, 4, 0);
    } else {
        matmul_forward_gpu(d->logits, d->hf + (size_t)(t - 1) * C, W(m, head_kind(m), 0), 1, Vp, C, 0, d->stream);
    }
    CUDA_CHECK(cudaMemcpyAsync(d->host_logits, d->logits, sizeof(bf16) * Vp, cudaMemcpyDeviceToHost, d->stream));
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
    for (int i = 0; i < Vp; i++) {
        uint32_t bits = (uint32_t)d->host_logits[i] << 16;
        memcpy(&logits[i], &bits, sizeof bits);
    }
}

// --- backward -------------------------------------------------------------------------------------

void gpu_model_set_grad_ready_hook(GpuModel *m, GpuGradReadyFn fn, void *ctx) {
    m->grad_ready_fn = fn;
    m->grad_ready_ctx = ctx;
}

// The hook of model_gpu.h: the gradients [lo, hi) are final once the work enqueued so far runs.
static void grads_final(GpuModel *m, size_t lo, size_t hi) {
    if (m->grad_ready_fn) m->grad_ready_fn(m->grad_ready_ctx, lo, hi);
}

void gpu_model_backward(GpuModel *m, float loss_scale) {
    Dev *d = dev_of(m);
    const ModelConfig *mc = &m->cfg.model;
    if (!d->grad_ready)
        FATAL("gpu_model_backward: the last forward did not prepare a backward (it was gpu_model_loss or gpu_model_next_logits, "
              "or the attention precision or diagnostics changed since)");
    if (loss_scale != d->fwd_loss_scale)
        FATAL("gpu_model_backward: loss_scale %g but the forward's head gradient used %g (hint: call gpu_model_set_loss_scale before the forward)",
              (double)loss_scale, (double)d->fwd_loss_scale);
    d->grad_ready = 0;
    int B = d->fwd_B, T = d->fwd_T, BT = B * T, C = mc->d_model, F = mc->ffn_hidden;
    int H = mc->n_head, hd = mc->head_dim, Vp = mc->padded_vocab_size;
    float eps = (float)mc->norm_eps;
    cudaStream_t s = d->stream;

    // Final RMSNorm: dres = d(loss * loss_scale)/d(x_final) (dhf already carries the scale).
    prof_mark(d, PH_HOST);
    norm_backward_for_linear(m, P_MLP_PROJ, mc->n_layer - 1, d->dres, G(m, P_FINAL_NORM, 0), d->dhf, d->x_final,
                             W(m, P_FINAL_NORM, 0), d->rstd_f, BT, C, 0);
    prof_mark(d, PH_BWD_NORM);
    // Flat layout (model.c): wte, layers 0..L-1 (each from attn_norm), final_norm, [lm_head].
    grads_final(m, param_offset(m, P_FINAL_NORM, 0), m->table.total);  // + the forward's LM head
    for (int l = mc->n_layer - 1; l >= 0; l--) {
        LayerBufs *lb = &d->L[l];
        // The linears' inputs sw, h2, h1 (and o) for the weight gradients: BF16 linears read them,
        // kept or recomputed (train.recompute); FP8 linears read the Q(x^T) their forward saved,
        // and the layer kept none (NULL: nothing reads them)
        const int recompute = !lb->own_inputs && linear_precision_of(&m->cfg.precision, mc->n_layer, l) == LINEAR_BF16;
        // MLP: x_out = x_mid + sw @ Wp^T, sw = swiglu(fc), fc = h2 @ Wfc^T, h2 = RMSNorm(x_mid)
        const bf16 *sw = lb->own_inputs ? lb->sw : NULL;
        if (recompute) {
            swiglu_forward_gpu(d->buf1, lb->fc, BT, F, s);
            sw = d->buf1;
            prof_mark(d, PH_RECOMPUTE);
        }
        lin_wgrad(m, P_MLP_PROJ, l, d->dres, sw, BT, C, F);                         // (C, F)
        lin_dgrad(m, P_MLP_PROJ, l, d->buf2, d->dres, BT, C, F);                    // dsw (BT, F)
        prof_mark(d, PH_BWD_LINEAR);
        swiglu_backward_for_linear(m, P_MLP_FC, l, d->buf1, d->buf2, lb->fc, BT, F); // dfc (BT, 2F)
        prof_mark(d, PH_BWD_SWIGLU);
        const bf16 *h2 = lb->own_inputs ? lb->h2 : NULL;
        if (recompute) {
            rmsnorm_forward_gpu(d->dhf, lb->rstd2, lb->x_mid, W(m, P_MLP_NORM, l), BT, C, eps, s);
            h2 = d->dhf;
            prof_mark(d, PH_RECOMPUTE);
        }
        lin_wgrad(m, P_MLP_FC, l, d->buf1, h2, BT, 2 * F, C);                       // (2F, C)
        lin_dgrad(m, P_MLP_FC, l, d->buf2, d->buf1, BT, 2 * F, C);                  // dh (BT, C)
        prof_mark(d, PH_BWD_LINEAR);
        norm_backward_for_linear(m, P_ATTN_PROJ, l, d->dres, G(m, P_MLP_NORM, l), d->buf2, lb->x_mid,
                                 W(m, P_MLP_NORM, l), lb->rstd2, BT, C, 1);
        prof_mark(d, PH_BWD_NORM);
        // Attention: x_mid = x_in + o @ Wo^T
        lin_wgrad(m, P_ATTN_PROJ, l, d->dres, lb->own_o ? lb->o : NULL, BT, C, C);   // (C, C)
        lin_dgrad(m, P_ATTN_PROJ, l, d->dhf, d->dres, BT, C, C);                     // do (BT, C)
        prof_mark(d, PH_BWD_LINEAR);
        bf16 *dqkv = d->buf1;                                                        // (BT, 3C)
        const AttnDelayedGpu dl = attn_delayed_of(d, l, 1);
        AttnCall c = attn_call(m, l, B, T);
        if (lb->own_qkv) {  // else the backward reads the kept codes (gpu_model_set_attention)
            const bf16 *qkv = attention_inputs(m, l, d->buf2, B, T);
            if (mc->qk_norm) prof_mark(d, PH_RECOMPUTE);
            c.q = qkv, c.k = qkv + C, c.v = qkv + 2 * C;
        }
        if (!lb->own_o) c.o = NULL;  // (fp8_dm reads no O)
        c.saved = lb->attn_codes.buf ? &lb->attn_codes : NULL;
        c.delayed = d->attn_delayed ? &dl : NULL;
        attn_backward(&c);
        prof_mark(d, PH_BWD_ATTN);
        // (with delayed FP8 scales the RoPE backward writes the qkv linear's codes instead)
        if (mc->position == POS_ROPE && !rope_backward_for_linear(m, l, dqkv, B, T))
            rope_backward_gpu(dqkv, d->rope, B, T, H, hd, s);
        if (mc->qk_norm)  // in place: d(raw qkv) from d(normalised qkv); v copied through
            qk_rmsnorm_backward_gpu(dqkv, G(m, P_Q_NORM, l), G(m, P_K_NORM, l), d->norm_scratch, dqkv,
                                    lb->qkv, W(m, P_Q_NORM, l), W(m, P_K_NORM, l), lb->rstd_qk, BT, H, hd, s);
        prof_mark(d, PH_BWD_ROPE);
        const bf16 *h1 = lb->own_inputs ? lb->h1 : NULL;
        if (recompute) {
            rmsnorm_forward_gpu(d->buf2, lb->rstd1, lb->x_in, W(m, P_ATTN_NORM, l), BT, C, eps, s);
            h1 = d->buf2;
            prof_mark(d, PH_RECOMPUTE);
        }
        lin_wgrad(m, P_QKV, l, dqkv, h1, BT, 3 * C, C);                              // (3C, C)
        lin_dgrad(m, P_QKV, l, d->dhf, dqkv, BT, 3 * C, C);                          // dh (BT, C)
        prof_mark(d, PH_BWD_LINEAR);
        norm_backward_for_linear(m, P_MLP_PROJ, l - 1, d->dres, G(m, P_ATTN_NORM, l), d->dhf, lb->x_in,
                                 W(m, P_ATTN_NORM, l), lb->rstd1, BT, C, 1);
        prof_mark(d, PH_BWD_NORM);
        grads_final(m, param_offset(m, P_ATTN_NORM, l),  // this block's tensors, all written above
                    param_offset(m, l + 1 < mc->n_layer ? P_ATTN_NORM : P_FINAL_NORM, l + 1 < mc->n_layer ? l + 1 : 0));
    }
    embedding_backward_gpu(G(m, P_WTE, 0), d->dres, d->tokens, d->emb_scratch, BT, C, Vp, s);
    prof_mark(d, PH_BWD_EMBED);
    grads_final(m, 0, param_offset(m, P_ATTN_NORM, 0));  // wte (+ the tied head's, from the forward)
    delayed_download(m);      // attention delayed scaling: this step's amaxes to the host
    lin_delayed_download(m);  // linear delayed scaling: this micro-batch's amaxes to the host
    CUDA_CHECK(cudaStreamSynchronize(s));
    delayed_commit(m);        // and into the histories
    lin_delayed_commit(m);
}

// --- optimizer, norms, host copies ------------------------------------------------------------------

int gpu_model_set_attention(GpuModel *m, AttnPrecision p) {
    Dev *d = dev_of(m);
    AttnOptions o = d->attn;
    o.precision = p;
    if (attn_mode_supported(&o, m->cfg.model.head_dim, NULL)) return -1;
    for (int l = 0; l < m->cfg.model.n_layer; l++) {  // its backward must find what it reads
        const LayerBufs *lb = &d->L[l];
        if ((!lb->own_qkv && attn_backward_reads_qkv(p, lb->attn_codes.buf != NULL)) ||
            (!lb->own_o && attn_backward_reads_o(p)))
            return -1;
    }
    if (attn_mode_workspace_bytes(&o, m->B, m->cfg.model.n_head, m->T, m->cfg.model.head_dim) > d->attn_ws_bytes)
        return -1;
    d->attn = o;
    d->grad_ready = 0;  // a backward must follow a forward in the same precision
    return 0;
}
AttnPrecision gpu_model_attention(GpuModel *m) { return dev_of(m)->attn.precision; }
void gpu_model_set_attn_diag(GpuModel *m, const AttnModeDiag *per_layer) {
    Dev *d = dev_of(m);
    // a backward reads what its forward kept for these diagnostics (forward_blocks: the rotated
    // q, k for the local reference), so it must follow a forward with the same ones
    if (per_layer != d->attn_diag) d->grad_ready = 0;
    for (int l = 0; per_layer && l < m->cfg.model.n_layer; l++)
        if (per_layer[l].local_ref && !d->L[l].own_qkv)
            FATAL("gpu_model_set_attn_diag: layer %d's local reference reads the BF16 q, k, v, which this model does "
                  "not keep (FP8 attention with kept codes; hint: a config with diagnostics.interval > 0 keeps them)", l);
    d->attn_diag = per_layer;
}

void gpu_model_zero_grad(GpuModel *m) {
    Dev *d = dev_of(m);
    CUDA_CHECK(cudaMemsetAsync(d->g, 0, sizeof(float) * m->table.total, d->stream));
}

// Sum of squares of g[lo, hi): the partition of grad_norm_squared_gpu over that range, so the
// norm of plain data parallelism and of ZeRO-1 (backend.c adds the same slices in rank order)
// agree bit for bit.
double gpu_model_grad_sumsq(GpuModel *m, size_t lo, size_t hi) {
    Dev *d = dev_of(m);
    if (lo > hi || hi > m->table.total)
        FATAL("gpu_model_grad_sumsq: range [%zu, %zu) outside the %zu gradients", lo, hi, m->table.total);
    if (lo == hi) return 0.0;  // an empty slice (more ranks than values past the end)
    double sumsq = 0.0;
    grad_norm_squared_gpu(d->sumsq, d->norm_partials, d->g + lo, hi - lo, d->stream);
    CUDA_CHECK(cudaMemcpyAsync(&sumsq, d->sumsq, sizeof sumsq, cudaMemcpyDeviceToHost, d->stream));
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
    return sumsq;
}

double gpu_model_grad_norm(GpuModel *m) { return sqrt(gpu_model_grad_sumsq(m, 0, m->table.total)); }

// AdamW over the flat elements [lo, hi), cut at tensor boundaries so that each piece gets its own
// tensor's weight decay (adamw_update_slice's loop in optimizer.c). Weights and gradients are
// full (P) buffers; masters and moments start at element lo (their [0] is element lo).
static void adamw_range(GpuModel *m, size_t lo, size_t hi, double lr, double clip, const TrainConfig *tc) {
    Dev *d = dev_of(m);
    prof_mark(d, PH_REDUCE_NORM);
    for (int k = 0; k < m->table.n; k++) {
        const ParamDesc *pd = &m->table.p[k];
        size_t a = pd->offset > lo ? pd->offset : lo;
        size_t b = pd->offset + pd->numel < hi ? pd->offset + pd->numel : hi;
        if (a >= b) continue;  // the tensor lies outside [lo, hi)
        adamw_update_gpu(d->p + (a - lo), d->w + a, d->g + a, d->m + (a - lo), d->v + (a - lo), b - a, lr,
                         tc->beta1, tc->beta2, tc->eps, pd->weight_decay ? tc->weight_decay : 0.0, clip,
                         m->step + 1, d->stream);
    }
    m->step++;
    prof_mark(d, PH_OPTIMIZER);
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
}

// Under ZeRO-1 no GPU holds the full FP32 masters or moments.
static void refuse_sharded(const GpuModel *m, const char *what) {
    if (m->shard_world > 1)
        FATAL("%s: the FP32 masters and AdamW moments are sharded (ZeRO-1, rank %d of %d) (hint: the backend "
              "gathers them with zero1_gpu_gather_state)", what, m->shard_rank, m->shard_world);
}

void gpu_model_step(GpuModel *m, double lr, double clip, const TrainConfig *tc) {
    refuse_sharded(m, "gpu_model_step");
    adamw_range(m, 0, m->table.total, lr, clip, tc);
    dev_of(m)->w8_dirty = 1;  // FP8 linears: re-quantize the weights before the next forward
}

void gpu_model_step_slice(GpuModel *m, double lr, double clip, const TrainConfig *tc) {
    adamw_range(m, m->shard_lo, m->shard_hi, lr, clip, tc);
    dev_of(m)->w8_dirty = 1;  // (the all-gather writes the rest of the weights before the next forward)
}

static void copy_out(GpuModel *m, float *host, const float *dev) {
    Dev *d = dev_of(m);
    CUDA_CHECK(cudaMemcpyAsync(host, dev, sizeof(float) * m->table.total, cudaMemcpyDeviceToHost, d->stream));
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
}
static void copy_in(GpuModel *m, float *dev, const float *host) {
    Dev *d = dev_of(m);
    CUDA_CHECK(cudaMemcpyAsync(dev, host, sizeof(float) * m->table.total, cudaMemcpyHostToDevice, d->stream));
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
}

void gpu_model_get_params(GpuModel *m, float *params) {
    refuse_sharded(m, "gpu_model_get_params");
    copy_out(m, params, dev_of(m)->p);
}
void gpu_model_get_grads(GpuModel *m, float *grads) { copy_out(m, grads, dev_of(m)->g); }
void gpu_model_set_grads(GpuModel *m, const float *grads) { copy_in(m, dev_of(m)->g, grads); }
float *gpu_model_grads_device(GpuModel *m) { return dev_of(m)->g; }
long long gpu_model_fp8_gemm_count(GpuModel *m) { return dev_of(m)->fp8_gemms; }
void *gpu_model_stream(GpuModel *m) { return (void *)dev_of(m)->stream; }
uint16_t *gpu_model_weights_device(GpuModel *m) {  // the caller may write them: FP8 copies refreshed
    dev_of(m)->w8_dirty = 1;
    return dev_of(m)->w;
}
long long gpu_model_fp8_weight_refreshes(GpuModel *m) { return dev_of(m)->fp8_weight_refreshes; }
long long gpu_model_fp8_fused_count(GpuModel *m) { return dev_of(m)->fp8_fused; }
long long gpu_model_qkv_epilogue_count(GpuModel *m) { return dev_of(m)->qkv_epilogue_runs; }
long long gpu_model_attn_rope_fused_count(GpuModel *m) { return dev_of(m)->attn_rope_fused; }
void gpu_model_state_device(GpuModel *m, float **master, float **adam_m, float **adam_v) {
    Dev *d = dev_of(m);
    *master = d->p;
    *adam_m = d->m;
    *adam_v = d->v;
}

// Under ZeRO-1 the full values pass through the gradient buffer (P floats, overwritten: call it
// between steps, as a resume does): the BF16 weights are cast from all of them, the masters keep
// this rank's slice and zeros past it.
void gpu_model_set_params(GpuModel *m, const float *params) {
    Dev *d = dev_of(m);
    float *full = m->shard_world > 1 ? d->g : d->p;  // (P)
    copy_in(m, full, params);
    cast_f32_to_bf16_gpu(d->w, full, m->table.total, d->stream);
    d->w8_dirty = 1;
    if (full != d->p) {
        CUDA_CHECK(cudaMemsetAsync(d->p, 0, sizeof(float) * m->shard_len, d->stream));
        CUDA_CHECK(cudaMemcpyAsync(d->p, full + m->shard_lo, sizeof(float) * (m->shard_hi - m->shard_lo),
                                   cudaMemcpyDeviceToDevice, d->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
}

void gpu_model_get_opt_state(GpuModel *m, float *adam_m, float *adam_v, long long *step) {
    refuse_sharded(m, "gpu_model_get_opt_state");
    copy_out(m, adam_m, dev_of(m)->m);
    copy_out(m, adam_v, dev_of(m)->v);
    *step = m->step;
}

// Full host moments (P each); under ZeRO-1 this rank keeps [shard_lo, shard_hi), zeros past it.
void gpu_model_set_opt_state(GpuModel *m, const float *adam_m, const float *adam_v, long long step) {
    Dev *d = dev_of(m);
    const float *src[2] = {adam_m, adam_v};
    float *dst[2] = {d->m, d->v};
    const size_t n = m->shard_hi - m->shard_lo;
    for (int k = 0; k < 2; k++) {
        if (m->shard_len > n) CUDA_CHECK(cudaMemsetAsync(dst[k] + n, 0, sizeof(float) * (m->shard_len - n), d->stream));
        CUDA_CHECK(cudaMemcpyAsync(dst[k], src[k] + m->shard_lo, sizeof(float) * n, cudaMemcpyHostToDevice, d->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
    m->step = step;
}
