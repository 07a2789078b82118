// model_gpu_linear.cu: the GPU backend's linear layers (model_gpu_internal.h): the BF16 cuBLASLt
// GEMMs of matmul.h, or, for the blocks linear_precision_of() puts in fp8_tensor / fp8_block,
// FP8 operands quantized with linear_fp8_gpu.h exactly as linear_fp8.c's contract says, and
// cuBLASLt's FP8 GEMMs. The memory for the FP8 operands (scratch slots, persistent Q(W) / Q(W^T),
// the forward's saved Q(x^T)) is carved by model_gpu.cu's carve() with the helpers below.
//
// Fused quantization (fp8_block, Dev.fp8_fuse): the kernels that produce a linear's input x
// (the RMSNorms for qkv and MLP-in, SwiGLU for MLP-out) or its output gradient dy (the SwiGLU
// backward for MLP-in) are the layers_fp8.h versions, which write Q(x) into slot 0 and Q(x^T)
// into the layer's saved buffer (or Q(dy) into slot 0 and Q(dy^T) into slot 1) from the tile
// they compute; lin_forward / lin_wgrad / lin_dgrad find the codes there (x_in_slot0,
// dyt_in_slot1, dy_in_slot0) and skip their quantization. Same codes, same GEMMs. The BF16 output
// is then not written: with FP8 linears the only readers of h1, h2, sw and dfc are these GEMMs
// (wgrad uses the saved Q(x^T), not x), and the BF16 fallbacks (a BF16 block, or a forward whose
// token count is not a multiple of 4) take the unfused path, which writes it.
//
// fp8_tensor with current scaling cannot write codes from a tile: its one scale per tensor needs
// the whole tensor's amax before any code. Its producers (the same four, and the RMSNorm
// backwards that make the residual gradient, dy of the two output projections) are the layers.h
// kernels that also take their output's amax (*_amax_gpu) into Dev.prod_amax; lin_forward /
// lin_wgrad then quantize with it (fp8_quantize_gpu_with_amax): the amax pass over x or dy is
// gone, the codes are the same (a max does not depend on the order it is taken in).
//
// fp8_tensor with delayed scaling (precision.linear_scaling, linear_fp8.c's contract): once the
// histories hold a micro-batch (Dev.lin_ready), every scale is known before the tensor exists
// (lin_amax_dev), so the four producers above write per-tensor codes both ways like fp8_block's
// (layers_fp8.h with an Fp8TensorScale), and so does the RoPE backward for dqkv when no QK-norm
// follows it (rope_backward_for_linear); o, the residual gradients (and dqkv otherwise) are
// quantized in one pass with fp8_quantize_gpu_with_amax, and every one of them folds its tensor's
// amax into the operand's prod_amax word, the micro-batch's record that model_gpu.cu commits to
// the histories after the backward. The first micro-batch (empty histories) runs the current-scaling path
// above; its amaxes reach the same words (the producers' own, or the quantization's by-product).
#include "gpu/model_gpu_internal.h"

#include <string.h>  // memset

#include "gpu/cuda_check.h"  // CUDA_CHECK (the first delayed micro-batch's amax copies)
#include "gpu/layers.h"      // the unfused producers (and those that take an fp8_tensor operand's amax)
#include "gpu/layers_fp8.h"  // the producers that also write the codes
#include "gpu/matmul.h"      // matmul_forward/dgrad/wgrad_gpu

// --- FP8 operand slots ------------------------------------------------------------------------
// Their shapes and sizes are gpu_sizes.h's gpu_fp8_slot_size (model.c's memory plan uses the same
// function). Per FP8 block, each of its 4 linears (fp8_lin_shape: W (M, K)) also has Q(W) (M, K)
// and, but per tensor (then each dgrad transposes Q(W) into Dev.wt_scratch), Q(W^T) (K, M) (plan
// category weights) and Q(x^T) (K, BT) (activations); an FP8 LM head has
// Q(W) (Vp, C), Q(W^T) (C, Vp) (weights) and its chunk's Q(hf^T) (C, n) (workspace).
// Bytes of codes and floats of scales slot `slot` needs for config c's linears.
void fp8_slot_size(const Config *c, int slot, long BT, size_t *codes, long *scales) {
    size_t ns;
    gpu_fp8_slot_size(slot, c->precision.linear, (size_t)BT, (size_t)c->model.d_model, (size_t)c->model.ffn_hidden,
                      (size_t)fp8_head_chunk(c, BT), (size_t)c->model.padded_vocab_size, codes, &ns);
    *scales = (long)ns;
}
// Tokens per LM-head chunk when the head runs in FP8 (gpu_fp8_head_chunk), else 0.
long fp8_head_chunk(const Config *c, long BT) {
    return (long)gpu_fp8_head_chunk(linear_precision_of(&c->precision, c->model.n_layer, -1), (size_t)BT);
}

// The FP8 linears of a block, i = 0..3: qkv (3C, C), attention projection (C, C), MLP in
// (2F, C), MLP out (C, F) as W (M, K).
static const ParamKind fp8_lin_kind[4] = {P_QKV, P_ATTN_PROJ, P_MLP_FC, P_MLP_PROJ};
void fp8_lin_shape(int i, int C, int F, int *M, int *K) {
    *M = i == 0 ? 3 * C : i == 2 ? 2 * F : C;
    *K = i == 3 ? F : C;
}
static int fp8_lin_index(ParamKind k) {
    for (int i = 0; i < 4; i++)
        if (fp8_lin_kind[i] == k) return i;
    FATAL("model_gpu: parameter kind %d is not an FP8 linear", (int)k);
}
// An FP8 operand's codes then scales, carved (model.c's plan takes the same two buffers).
Fp8Operand take_operand(Carver *cv, int rows, int cols, Fp8Grouping g, Fp8Format fmt, size_t *category) {
    Fp8Operand op;
    memset(&op, 0, sizeof op);
    op.codes = (uint8_t *)take(cv, (size_t)rows * cols, category);
    op.scales = (float *)take(cv, sizeof(float) * (size_t)fp8_gpu_scale_count(g, rows, cols), category);
    op.rows = rows;
    op.cols = cols;
    op.grouping = g;
    op.fmt = fmt;
    return op;
}

// --- linear layers: BF16 GEMMs, or FP8 operands as linear_fp8.c's contract says -------------------
// kind/layer name the weight W (M, K) of y = x W^T; x (N, K) with N = tokens.

static LinearPrecision lin_prec(const GpuModel *m, int layer) {
    return linear_precision_of(&m->cfg.precision, m->cfg.model.n_layer, layer);
}
// Whether a GEMM of an FP8 linear in precision p accumulates without FP32 promotion
// (precision.linear_fast_accum; fp8_tensor only): the forward's (backward 0) or the dgrad's and
// wgrad's (backward 1).
static int fast_accum(const GpuModel *m, LinearPrecision p, int backward) {
    const FastAccum f = m->cfg.precision.linear_fast_accum;
    return p == LINEAR_FP8_TENSOR && (f == FAST_ACCUM_ALL || (f == FAST_ACCUM_FORWARD && !backward));
}
// Output gradients: linear_grad_format with fp8_tensor, E4M3 with fp8_block (as linear_fp8_init).
static Fp8Format grad_format(const GpuModel *m) {
    const PrecisionConfig *p = &m->cfg.precision;
    return p->linear == LINEAR_FP8_TENSOR && p->linear_grad_format == GRADFMT_E5M2 ? FP8_E5M2 : FP8_E4M3;
}
// An operand (rows, cols) in slot `slot` (capacity checked: the plan must have room for it).
static Fp8Operand fp8_slot(Dev *d, int slot, int rows, int cols, Fp8Grouping g, Fp8Format fmt) {
    if (!d->q8_codes[slot]) FATAL("model_gpu: FP8 linear used but no FP8 slots were planned (precision.linear bf16?)");
    if ((size_t)rows * cols > d->q8_codes_cap[slot] || fp8_gpu_scale_count(g, rows, cols) > d->q8_scales_cap[slot])
        FATAL("model_gpu: FP8 operand (%d, %d) does not fit slot %d (%zu codes, %ld scales planned)", rows, cols,
              slot, d->q8_codes_cap[slot], d->q8_scales_cap[slot]);
    Fp8Operand op;
    memset(&op, 0, sizeof op);
    op.codes = d->q8_codes[slot];
    op.scales = d->q8_scales[slot];
    op.rows = rows;
    op.cols = cols;
    op.grouping = g;
    op.fmt = fmt;
    return op;
}

// Delayed scaling is on and the histories are not empty: linear (kind, layer)'s operands take
// their scales from them (only fp8_tensor linears have histories).
static int delayed_ready(GpuModel *m, int layer) {
    const Dev *d = dev_of(m);
    return d->lin_delayed && d->lin_ready && layer >= 0 && lin_prec(m, layer) == LINEAR_FP8_TENSOR;
}
// The prod_amax word of operand `which` (0 x, 1 dy) of FP8 linear li.
static unsigned *prod_word(Dev *d, int li, int which) { return d->prod_amax + 2 * li + which; }
// Operand `which` of FP8 linear li: the amax its delayed scale comes from, and the word its own
// amax is folded into.
static Fp8TensorScale delayed_scale_of(Dev *d, int li, int which) {
    Fp8TensorScale ts = {d->lin_amax_dev + 2 * li + which, prod_word(d, li, which)};
    return ts;
}
// Slots 0 and 1 as the dy (N, M) and dy^T (M, N) operands of a linear in FP8 precision p.
static void dy_operands(GpuModel *m, LinearPrecision p, int N, int M, Fp8Operand *dyq, Fp8Operand *dyt) {
    Dev *d = dev_of(m);
    *dyq = fp8_slot(d, 0, N, M, linear_act_grouping(p), grad_format(m));
    *dyt = fp8_slot(d, 1, M, N, linear_dyt_grouping(p, m->cfg.precision.linear_wgrad_blocks), grad_format(m));
}
// dy's producer wrote both dy operands (dy_operands): lin_wgrad and lin_dgrad skip their
// quantization.
static void mark_dy_operands(Dev *d, const bf16 *dy, int N, int M) {
    d->x_in_slot0 = NULL;
    d->dy_in_slot0 = d->dyt_in_slot1 = dy;
    d->dy_in_slot0_n = d->dyt_in_slot1_n = N;
    d->dy_in_slot0_m = d->dyt_in_slot1_m = M;
    d->fp8_fused++;
}

// --- fp8_tensor: amaxes taken by the producers -------------------------------------------------
// which: 0 for a linear's x, 1 for its dy. The producer of t (rows, cols), the operand of linear
// (kind, layer), gets the word to put the amax in (Dev.prod_amax: the forward zeroed it, and no
// other producer of the pass uses it), or NULL when that linear is not fp8_tensor (or fusion is
// off, or layer < 0: no linear); the consumer takes it back once.
static unsigned *amax_for_producer(GpuModel *m, int which, ParamKind kind, int layer, const bf16 *t, int rows,
                                   int cols) {
    Dev *d = dev_of(m);
    d->amax_of[which] = NULL;
    if (!d->fp8_fuse || layer < 0 || lin_prec(m, layer) != LINEAR_FP8_TENSOR || delayed_ready(m, layer))
        return NULL;  // (delayed scales: the producers write codes, or the quantization observes the amax)
    d->amax_of[which] = t;
    d->amax_rows[which] = rows;
    d->amax_cols[which] = cols;
    d->fp8_fused++;
    return prod_word(d, 4 * layer + fp8_lin_index(kind), which);
}

// fp8_quantize_gpu of operand `which` (0 x, 1 dy) of linear (layer, li), without its amax pass
// when t's producer took the amax; with delayed scaling, from the histories' amax once they have
// one (observing t's own), else current with t's amax copied to its word for the histories.
static void quantize_operand(GpuModel *m, int layer, int li, int which, const Fp8Operand *q, const Fp8Operand *qt,
                             const bf16 *t, int rows, int cols) {
    Dev *d = dev_of(m);
    const int ready = d->amax_of[which] == t && d->amax_rows[which] == rows && d->amax_cols[which] == cols;
    d->amax_of[which] = NULL;
    if (delayed_ready(m, layer)) {
        const Fp8TensorScale ts = delayed_scale_of(d, li, which);
        fp8_quantize_gpu_with_amax(q, qt, t, rows, cols, ts.amax, ts.observe, NULL, d->stream);
    } else if (ready) {  // (its word already holds the amax)
        fp8_quantize_gpu_with_amax(q, qt, t, rows, cols, (const float *)prod_word(d, li, which), NULL, NULL,
                                   d->stream);
    } else {
        fp8_quantize_gpu(q, qt, t, rows, cols, NULL, d->stream);
        if (d->lin_delayed && lin_prec(m, layer) == LINEAR_FP8_TENSOR)  // scales[1]: the amax the pass took
            CUDA_CHECK(cudaMemcpyAsync(prod_word(d, li, which), (q ? q : qt)->scales + 1, sizeof(float),
                                       cudaMemcpyDeviceToDevice, d->stream));
    }
}

// y (N, M) BF16 = x (N, K) . W^T. A 1x128-scaled x needs N % 4 == 0 (cuBLASLt's VEC128 layout):
// only gpu_model_next_logits can break that (training checks B*T % 16), and such a forward
// runs in BF16 (the CPU would still quantize: sampling logits may then differ slightly).
void lin_forward(GpuModel *m, ParamKind kind, int layer, bf16 *y, const bf16 *x, int N, int M, int K) {
    Dev *d = dev_of(m);
    LinearPrecision p = lin_prec(m, layer);
    const bf16 *w = W(m, kind, layer);
    if (p == LINEAR_BF16 || (linear_act_grouping(p) == FP8_GROUP_1x128 && N % 4)) {
        matmul_forward_gpu(y, x, w, N, M, K, 0, d->stream);
        return;
    }
    const int li = 4 * layer + fp8_lin_index(kind);
    Fp8Operand xq = fp8_slot(d, 0, N, K, linear_act_grouping(p), FP8_E4M3);  // (N, K)
    d->dy_in_slot0 = NULL;
    if (d->x_in_slot0 == x && d->x_in_slot0_li == li && d->x_in_slot0_n == N) {
        // x's producer wrote Q(x) here, and Q(x^T) with xt8_n[li] (norm_for_linear, swiglu_for_linear)
    } else if (d->save_xt) {  // Q(x) and Q(x^T) in one call (one pass over x unless 1x128)
        Fp8Operand xt = d->xt8[li];                                 // (K, N <= BT)
        if (N > xt.cols) FATAL("model_gpu: %d tokens, the saved Q(x^T) has room for %d", N, xt.cols);
        xt.cols = N;
        quantize_operand(m, layer, li, 0, &xq, &xt, x, N, K);
        d->xt8_n[li] = N;
    } else {
        quantize_operand(m, layer, li, 0, &xq, NULL, x, N, K);
        d->xt8_n[li] = 0;
    }
    d->x_in_slot0 = NULL;
    linear_fp8_forward_gpu(y, &xq, &d->w8[li], fast_accum(m, p, 0), d->stream);
    d->fp8_gemms++;
}

// Q(W^T) (K, M) of FP8 linear li for its dgrad: kept, or for a per-tensor weight the transpose of
// Q(W)'s codes with its scales, made into the scratch now (the codes a quantization of W^T would
// give: one scale for the whole tensor; gpu_sizes.h's gpu_fp8_keeps_weight_t).
static Fp8Operand weight_t(Dev *d, int li) {
    Fp8Operand wt = d->wt8[li];
    if (wt.codes) return wt;
    const Fp8Operand *w = &d->w8[li];
    if (!d->wt_scratch.codes || (size_t)w->rows * w->cols > d->wt_scratch_cap)
        FATAL("model_gpu: Q(W^T) of linear %d (%d, %d) does not fit the planned scratch (%zu bytes)", li, w->cols,
              w->rows, d->wt_scratch_cap);
    wt = d->wt_scratch;
    wt.rows = w->cols;
    wt.cols = w->rows;
    wt.grouping = w->grouping;
    wt.fmt = w->fmt;
    fp8_transpose_tensor_gpu(w, &wt, d->stream);
    return wt;
}

// dx (N, K) BF16 = dy (N, M) . W
void lin_dgrad(GpuModel *m, ParamKind kind, int layer, bf16 *dx, const bf16 *dy, int N, int M, int K) {
    Dev *d = dev_of(m);
    LinearPrecision p = lin_prec(m, layer);
    const bf16 *w = W(m, kind, layer);
    if (p == LINEAR_BF16) {
        matmul_dgrad_gpu(dx, dy, w, N, M, K, 0, d->stream);
        return;
    }
    const int li = 4 * layer + fp8_lin_index(kind);
    Fp8Operand dyq = fp8_slot(d, 0, N, M, linear_act_grouping(p), grad_format(m));  // (N, M), groups along M
    if (d->dy_in_slot0 != dy || d->dy_in_slot0_n != N || d->dy_in_slot0_m != M)  // not made by lin_wgrad
        quantize_operand(m, layer, li, 1, &dyq, NULL, dy, N, M);
    d->dy_in_slot0 = NULL;
    const Fp8Operand wt = weight_t(d, li);                                          // W^T (K, M)
    linear_fp8_dgrad_gpu(dx, &dyq, &wt, fast_accum(m, p, 1), d->stream);
    d->fp8_gemms++;
}

// dW (M, K) FP32 += dy (N, M)^T . x (N, K): both operands transposed, groups along the tokens.
void lin_wgrad(GpuModel *m, ParamKind kind, int layer, const bf16 *dy, const bf16 *x, int N, int M, int K) {
    Dev *d = dev_of(m);
    LinearPrecision p = lin_prec(m, layer);
    float *gw = G(m, kind, layer);
    if (p == LINEAR_BF16) {
        matmul_wgrad_gpu(gw, dy, x, N, M, K, d->stream);
        return;
    }
    (void)x;  // its Q(x^T) was saved by the forward
    const int li = 4 * layer + fp8_lin_index(kind);
    if (d->xt8_n[li] != N)
        FATAL("model_gpu: lin_wgrad of layer %d linear %d: the forward saved Q(x^T) for %d tokens, not %d", layer,
              li % 4, d->xt8_n[li], N);
    Fp8Operand xt = d->xt8[li];
    xt.cols = N;                                                            // x^T (K, N)
    // Q(dy^T) for this GEMM and Q(dy) (slot 0) for the lin_dgrad that follows, in one call.
    Fp8Operand dyq, dyt;  // dy (N, M), dy^T (M, N)
    dy_operands(m, p, N, M, &dyq, &dyt);
    if (d->dyt_in_slot1 != dy || d->dyt_in_slot1_n != N || d->dyt_in_slot1_m != M ||
        d->dy_in_slot0 != dy || d->dy_in_slot0_n != N || d->dy_in_slot0_m != M) {  // not made by dy's producer
        quantize_operand(m, layer, li, 1, &dyq, &dyt, dy, N, M);
        d->dy_in_slot0 = dy;
        d->dy_in_slot0_n = N;
        d->dy_in_slot0_m = M;
    }
    d->dyt_in_slot1 = NULL;
    linear_fp8_wgrad_gpu(gw, &dyt, &xt, 1, fast_accum(m, p, 1), d->stream);
    d->fp8_gemms++;
}

// Q(W) and Q(W^T) of every FP8 linear from the BF16 working weights, when they were written
// since the last refresh (one tile pass per weight; the values the contract's per-GEMM
// quantization gives, since nothing writes the weights between the refresh and the GEMMs).
void fp8_refresh_weights(GpuModel *m) {
    Dev *d = dev_of(m);
    if (!d->w8_dirty || !d->w8) return;
    const ModelConfig *mc = &m->cfg.model;
    for (int l = 0; l < mc->n_layer; l++)
        for (int i = 0; i < 4; i++) {
            Fp8Operand *w = &d->w8[4 * l + i], *wt = &d->wt8[4 * l + i];
            if (!w->codes) continue;  // a BF16 block
            fp8_quantize_gpu(w, wt->codes ? wt : NULL, W(m, fp8_lin_kind[i], l), w->rows, w->cols, NULL, d->stream);
            d->fp8_weight_refreshes++;
        }
    if (d->head_w8.codes) {  // an FP8 LM head: its weight (wte when tied)
        const ParamKind hk = mc->tied_embeddings ? P_WTE : P_LM_HEAD;
        fp8_quantize_gpu(&d->head_w8, &d->head_wt8, W(m, hk, 0), d->head_w8.rows, d->head_w8.cols, NULL, d->stream);
        d->fp8_weight_refreshes++;
    }
    d->w8_dirty = 0;
}

// The fused LM head's GEMMs for one chunk of n tokens in FP8 (model_gpu.cu's head_and_loss runs
// the chunks and the cross-entropy): logits (n, Vp) = Q(hf) Q(W)^T, with Q(hf^T) kept for the
// wgrad when want_grad; then, once the chunk holds dlogits, head_fp8_backward: dhf (n, C) =
// Q(dy) Q(W^T)^T and dW (Vp, C) += Q(dy^T) Q(hf^T)^T, with fp8_block's Q(dy) and Q(dy^T) made
// in one pass. Codes and scales as linear_fp8.c's linear_forward / dgrad / wgrad make them for the
// CPU's chunks (fp8_head_chunk): fp8_block's 1x128 slices, or fp8_tensor's scales of the
// micro-batch, hf's amax taken by head_fp8_begin into head_xt's scales[1] (each chunk's
// quantization reads it there and leaves it) and dlogits' bound written into slot 0's scales[1]
// before each chunk's; fp8_tensor's Q(dlogits) (with fusion on, the cross-entropy writes its codes
// itself: head_fp8_cross_entropy) is transposed for Q(dlogits^T) into the chunk's logits buffer,
// whose BF16 values nothing reads by then.
void head_fp8_begin(GpuModel *m, const bf16 *hf, int rows) {
    Dev *d = dev_of(m);
    if (lin_prec(m, -1) != LINEAR_FP8_TENSOR) return;  // fp8_block: each slice's own scale
    fp8_amax_gpu(d->head_xt.scales + 1, hf, (long)rows * m->cfg.model.d_model, d->stream);
}

void head_fp8_forward(GpuModel *m, bf16 *logits, const bf16 *hf, int n, int want_grad) {
    Dev *d = dev_of(m);
    const int C = m->cfg.model.d_model;
    const LinearPrecision hp = lin_prec(m, -1);
    Fp8Operand xq = fp8_slot(d, 0, n, C, linear_act_grouping(hp), FP8_E4M3);  // (n, C)
    Fp8Operand xt = d->head_xt;                                                // (C, n <= chunk)
    if (n > xt.cols) FATAL("model_gpu: LM head chunk of %d tokens, Q(hf^T) has room for %d", n, xt.cols);
    xt.cols = n;
    if (hp == LINEAR_FP8_TENSOR)
        fp8_quantize_gpu_with_amax(&xq, want_grad ? &xt : NULL, hf, n, C, d->head_xt.scales + 1, NULL, NULL,
                                   d->stream);
    else
        fp8_quantize_gpu(&xq, want_grad ? &xt : NULL, hf, n, C, NULL, d->stream);
    d->x_in_slot0 = NULL;  // slots 0 and 1 now hold the head's operands
    d->dy_in_slot0 = d->dyt_in_slot1 = NULL;
    linear_fp8_forward_gpu(logits, &xq, &d->head_w8, fast_accum(m, hp, 0), d->stream);
    d->fp8_gemms++;
}
int head_fp8_cross_entropy(GpuModel *m, bf16 *logits, float *losses, const int32_t *targets, int n,
                           float grad_scale) {
    Dev *d = dev_of(m);
    const int V = m->cfg.model.vocab_size, Vp = m->cfg.model.padded_vocab_size;
    const Fp8Operand dyq = fp8_slot(d, 0, n, Vp, linear_act_grouping(lin_prec(m, -1)), grad_format(m));  // (n, Vp)
    if (d->fp8_fuse && lin_prec(m, -1) == LINEAR_FP8_TENSOR && grad_scale != 0.0f &&
        cross_entropy_fp8_supported(Vp, logits, dyq.codes)) {
        cross_entropy_fp8_gpu(logits, losses, targets, n, V, Vp, grad_scale, dyq.codes, dyq.fmt, d->stream);
        return 1;
    }
    cross_entropy_gpu(logits, losses, targets, n, V, Vp, grad_scale, d->stream);
    return 0;
}

void head_fp8_backward(GpuModel *m, bf16 *dhf, float *gw, const bf16 *dlogits, int n, float grad_scale,
                       int codes_ready) {
    Dev *d = dev_of(m);
    const int Vp = m->cfg.model.padded_vocab_size;
    const LinearPrecision hp = lin_prec(m, -1);
    Fp8Operand dyq, dyt;  // (n, Vp), (Vp, n)
    Fp8Operand xt = d->head_xt;
    xt.cols = n;
    if (hp == LINEAR_FP8_TENSOR) {  // the bound |dlogits| <= grad_scale is the amax of the scale
        // Q(dy) in slot 0 (the cross-entropy's codes, or made here), then Q(dy^T), its transpose,
        // into the chunk's logits buffer: its BF16 dlogits are not read again (gpu_fp8_slot_size)
        if (dlogits != d->logits || d->q8_scales_cap[1] < (long)gpu_fp8_scales_tensor())
            FATAL("model_gpu: the FP8 LM head's dlogits are not the chunk's logits buffer");
        dyq = fp8_slot(d, 0, n, Vp, FP8_GROUP_TENSOR, grad_format(m));
        dyt = dyq;
        dyt.codes = (uint8_t *)d->logits;
        dyt.scales = d->q8_scales[1];
        dyt.rows = Vp;
        dyt.cols = n;
        fp8_set_tensor_scale_gpu(&dyq, grad_scale, d->stream);
        if (!codes_ready) fp8_quantize_gpu_with_amax(&dyq, NULL, dlogits, n, Vp, dyq.scales + 1, NULL, NULL, d->stream);
        fp8_transpose_tensor_gpu(&dyq, &dyt, d->stream);
    } else {
        dy_operands(m, hp, n, Vp, &dyq, &dyt);
        fp8_quantize_gpu(&dyq, &dyt, dlogits, n, Vp, NULL, d->stream);
    }
    linear_fp8_dgrad_gpu(dhf, &dyq, &d->head_wt8, fast_accum(m, hp, 1), d->stream);  // W^T (C, Vp)
    linear_fp8_wgrad_gpu(gw, &dyt, &xt, 1, fast_accum(m, hp, 1), d->stream);
    d->fp8_gemms += 2;
}

// --- producers that write the codes of a linear's operand (fp8_block) ---------------------------

// Slot 0 (and the saved Q(x^T) when this forward keeps it) as the operands of linear (kind,
// layer)'s input x (N, K) that its producer writes, marked for lin_forward; 0 (nothing set) when
// the producer must write BF16 x instead: a linear that is neither fp8_block nor fp8_tensor with
// delayed scales ready, fusion off, or a forward lin_forward runs in BF16 (fp8_block, N % 4).
// *has_qt: whether qt is to be written; *ts: per tensor, the scale's amax and x's word (else NULL).
static int fused_x_operands(GpuModel *m, ParamKind kind, int layer, const bf16 *x, int N, int K, Fp8Operand *q,
                            Fp8Operand *qt, int *has_qt, Fp8TensorScale *ts, const Fp8TensorScale **pts) {
    Dev *d = dev_of(m);
    const int tensor = delayed_ready(m, layer);
    *pts = NULL;
    if (!d->fp8_fuse || (lin_prec(m, layer) != LINEAR_FP8_BLOCK && !tensor) || (!tensor && N % 4)) return 0;
    const int li = 4 * layer + fp8_lin_index(kind);
    *q = fp8_slot(d, 0, N, K, tensor ? FP8_GROUP_TENSOR : FP8_GROUP_1x128, FP8_E4M3);
    if (tensor) {
        *ts = delayed_scale_of(d, li, 0);
        *pts = ts;
    }
    *has_qt = d->save_xt;
    if (d->save_xt) {
        *qt = d->xt8[li];  // (K, N <= BT)
        if (N > qt->cols) FATAL("model_gpu: %d tokens, the saved Q(x^T) has room for %d", N, qt->cols);
        qt->cols = N;
    }
    d->xt8_n[li] = d->save_xt ? N : 0;
    d->x_in_slot0 = x;  // slot 0 is overwritten: no older Q(x) or Q(dy) is there any more
    d->x_in_slot0_li = li;
    d->x_in_slot0_n = N;
    d->dy_in_slot0 = NULL;
    d->fp8_fused++;
    return 1;
}

void norm_for_linear(GpuModel *m, ParamKind kind, int layer, bf16 *res_out, bf16 *h, float *rstd, const bf16 *x,
                     const bf16 *delta, const bf16 *g, int N, int C, float eps) {
    Dev *d = dev_of(m);
    Fp8Operand q, qt;
    Fp8TensorScale ts;
    const Fp8TensorScale *pts;
    int has_qt = 0;
    if (fused_x_operands(m, kind, layer, h, N, C, &q, &qt, &has_qt, &ts, &pts)) {
        rmsnorm_forward_fp8_gpu(res_out, NULL, rstd, x, delta, g, N, C, eps, &q, has_qt ? &qt : NULL, pts, d->stream);
        return;
    }
    unsigned *amax = amax_for_producer(m, 0, kind, layer, h, N, C);
    if (delta)
        residual_rmsnorm_forward_amax_gpu(res_out, h, rstd, x, delta, g, N, C, eps, amax, d->stream);
    else
        rmsnorm_forward_amax_gpu(h, rstd, x, g, N, C, eps, amax, d->stream);
}

void swiglu_for_linear(GpuModel *m, ParamKind kind, int layer, bf16 *sw, const bf16 *fc, int N, int F) {
    Dev *d = dev_of(m);
    Fp8Operand q, qt;
    Fp8TensorScale ts;
    const Fp8TensorScale *pts;
    int has_qt = 0;
    if (fused_x_operands(m, kind, layer, sw, N, F, &q, &qt, &has_qt, &ts, &pts))
        swiglu_forward_fp8_gpu(NULL, fc, N, F, &q, has_qt ? &qt : NULL, pts, d->stream);
    else
        swiglu_forward_amax_gpu(sw, fc, N, F, amax_for_producer(m, 0, kind, layer, sw, N, F), d->stream);
}

// dy (N, M = 2F) of linear (kind, layer): Q(dy) into slot 0 for lin_dgrad and Q(dy^T) into slot 1
// for lin_wgrad, both marked, when fusion is on and the linear is fp8_block or fp8_tensor with
// delayed scales ready (then per tensor, observing dy's amax into its word).
void swiglu_backward_for_linear(GpuModel *m, ParamKind kind, int layer, bf16 *dfc, const bf16 *dsw, const bf16 *fc,
                                int N, int F) {
    Dev *d = dev_of(m);
    const int tensor = delayed_ready(m, layer);
    if (!d->fp8_fuse || (lin_prec(m, layer) != LINEAR_FP8_BLOCK && !tensor)) {
        swiglu_backward_amax_gpu(dfc, dsw, fc, N, F, amax_for_producer(m, 1, kind, layer, dfc, N, 2 * F),
                                 d->stream);
        return;
    }
    const int li = 4 * layer + fp8_lin_index(kind);
    const int M = 2 * F;
    Fp8Operand q, qt;  // dy (N, M), dy^T (M, N)
    dy_operands(m, lin_prec(m, layer), N, M, &q, &qt);
    const Fp8TensorScale ts = tensor ? delayed_scale_of(d, li, 1) : Fp8TensorScale{NULL, NULL};
    swiglu_backward_fp8_gpu(NULL, dsw, fc, N, F, &q, &qt, tensor ? &ts : NULL, d->stream);
    mark_dy_operands(d, dfc, N, M);
}

// The RoPE backward of dqkv (B*T, 3C), the qkv linear's dy: with delayed scales ready, fusion on,
// no QK-norm after it and heads rope_backward_fp8_supported takes, its per-tensor codes both ways
// straight into slots 0 and 1 (marked for lin_wgrad / lin_dgrad; dqkv itself is left unrotated:
// nothing else reads it) and 1; else 0, and the caller rotates dqkv in place (rope_backward_gpu).
int rope_backward_for_linear(GpuModel *m, int layer, const bf16 *dqkv, int B, int T) {
    Dev *d = dev_of(m);
    const ModelConfig *mc = &m->cfg.model;
    if (!d->fp8_fuse || mc->qk_norm || !delayed_ready(m, layer) ||
        !rope_backward_fp8_supported(mc->n_head, mc->head_dim))
        return 0;
    const int N = B * T, M = 3 * mc->d_model, li = 4 * layer + fp8_lin_index(P_QKV);
    Fp8Operand q, qt;  // dy (N, M), dy^T (M, N), per tensor
    dy_operands(m, LINEAR_FP8_TENSOR, N, M, &q, &qt);
    const Fp8TensorScale ts = delayed_scale_of(d, li, 1);
    rope_backward_fp8_gpu(dqkv, d->rope, B, T, mc->n_head, mc->head_dim, &q, &qt, &ts, d->stream);
    mark_dy_operands(d, dqkv, N, M);
    return 1;
}

void norm_backward_for_linear(GpuModel *m, ParamKind kind, int layer, bf16 *dx, float *dg, const bf16 *dy,
                              const bf16 *x, const bf16 *g, const float *rstd, int N, int C, int accumulate) {
    Dev *d = dev_of(m);
    rmsnorm_backward_amax_gpu(dx, dg, d->norm_scratch, dy, x, g, rstd, N, C, accumulate,
                              amax_for_producer(m, 1, kind, layer, dx, N, C), d->stream);
}
