// model_gpu_internal.h: what the GPU backend's translation units share (model_gpu.cu: plan,
// init, forward, backward, optimizer; model_gpu_linear.cu: the linear layers in BF16 or FP8):
// the device state behind GpuModel.priv, the carver of the one allocation, and accessors.
// Private to the backend: nothing outside model_gpu*.cu includes it.
#ifndef MODEL_GPU_INTERNAL_H
#define MODEL_GPU_INTERNAL_H

#include <cuda_runtime.h>  // cudaStream_t
#include <stdint.h>        // uint8_t, int32_t

#include "attention_fp8.h"       // AttnOptions, AttnModeDiag
#include "core/common.h"         // FATAL
#include "core/gpu_sizes.h"      // gpu_head_chunk, gpu_fp8_slot_size (shared with model.c's plan)
#include "core/precision.h"      // LinearPrecision, Fp8Grouping
#include "gpu/linear_fp8_gpu.h"  // Fp8Operand
#include "gpu/model_gpu.h"       // GpuModel

#define ARENA_ALIGN 256         // every buffer starts on a 256-byte boundary

typedef uint16_t bf16;  // BF16 bit patterns (the kernels' C interface)

typedef struct {
    bf16 *x_in, *h1, *qkv, *o, *x_mid, *h2, *fc, *sw;  // see the file comment for the shapes
    float *rstd1, *rstd2, *lse, *rstd_qk;             // (BT), (BT), (B, H, T), (2, BT, H)
    AttnSavedCodes attn_codes;  // the forward's quantized Q, K, V (attention_keep_codes), buf NULL if off
    // Whether h1, h2, sw / qkv / o are this layer's own, kept for the backward (model.h's
    // gpu_keeps_*); if not, they point into the forward's scratch (model_gpu.cu's file comment)
    // and the backward does not read them
    int own_inputs, own_qkv, own_o;
} LayerBufs;

typedef struct {
    char *arena;                     // the one allocation
    bf16 *w;                         // (P) BF16 working weights
    float *p, *g, *m, *v;            // (P) FP32 masters, gradients, AdamW moments
    LayerBufs *L;                    // (n_layer)
    bf16 *x_final, *hf;              // (BT, C) residual after the last block, final norm output
    float *rstd_f;                   // (BT)
    bf16 *logits;                    // (head_chunk, Vp) one chunk of logits / dlogits
    int head_chunk;
    bf16 *buf1, *buf2;               // (BT, wide) scratch
    bf16 *dres, *dhf;                // (BT, C) residual gradient; head input gradient / scratch
    int32_t *tokens, *targets;       // (BT) the last forward's batch on the device
    float *losses;                   // (BT) per-token loss
    float *rope;                     // (T, hd/2, 2) cos, sin
    AttnOptions attn;                // precision.attention and its options (attention_fp8.h)
    // Delayed scaling (precision.attention_scaling = "delayed"; else NULL): the per-layer history
    // on the host (the CPU backend's struct: same commits, checkpoints and restores), and per
    // layer 8 device floats, [this step's scales of Q, K, V, dO | their amax so far], uploaded
    // from the host state at every forward and read back at the end of every backward
    AttnDelayedState *attn_delayed;  // (n_layer) within delayed, or NULL
    float *dl_dev, *dl_host;         // (n_layer * 8) device, host staging
    // All the delayed-scaling states, one array for checkpoints, probes and evaluations, in the
    // CPU's layout (precision.h's delayed_states_new): attention's n_layer (attn_delayed points at
    // them when its scaling is delayed), then the FP8 linears' (lin_delayed: two per layer,
    // linear_delayed_slot, when precision.linear_scaling is delayed)
    AttnDelayedState *delayed;
    int n_delayed;
    AttnDelayedState *lin_delayed;   // (2 * n_layer) or NULL
    // Delayed linear scaling: per FP8 linear and role (the index of prod_amax) the amax its scale
    // comes from this micro-batch (the history's maximum; device, uploaded at every forward), a
    // host copy, and the host's copy of prod_amax read back at the end of every backward
    float *lin_amax_dev, *lin_amax_host;  // (n_layer * 8)
    float *lin_words_host;                // (n_layer * 8) the words' FP32 bits, read back as floats
    int lin_ready;                   // the histories are not empty: this forward / backward scales from them
    void *attn_ws;                   // attention workspace (quantized operands, backward scratch)
    size_t attn_ws_bytes;
    const AttnModeDiag *attn_diag;   // (n_layer) diagnostics outputs, or NULL (gpu_model_set_attn_diag)
    void *norm_scratch;              // RMSNorm / QK-norm backward scratch
    void *emb_scratch;               // embedding backward scratch
    double *norm_partials, *sumsq;   // (GRAD_NORM_PARTIALS), (1)
    cudaStream_t stream;
    int fwd_B, fwd_T;                // shape of the last forward
    int grad_ready;                  // the last forward prepared a backward
    float fwd_loss_scale;            // loss scale the last forward put into the head gradient
    float *host_losses;              // (BT) host copy of the per-token losses
    bf16 *host_logits;               // (Vp) host copy for next_logits
    // FP8 linears (precision.linear != bf16 only): operand slots, see fp8_slot_size
    uint8_t *q8_codes[2];            // slot 0: Q(x) of the forward, Q(dy) of dgrad;
    float *q8_scales[2];             // slot 1: Q(dy^T) of wgrad
    size_t q8_codes_cap[2];          // bytes
    long q8_scales_cap[2];           // floats
    Fp8Operand *w8, *wt8;            // (n_layer * 4) Q(W) (M, K), Q(W^T) (K, M) (codes NULL: BF16 block;
                                     //   wt8's alone: per-tensor weights, made by each dgrad in wt_scratch)
    Fp8Operand wt_scratch;           // per-tensor weights: Q(W^T) of the dgrad running now
    size_t wt_scratch_cap;           // its codes, bytes
    Fp8Operand *xt8;                 // (n_layer * 4) Q(x^T) (K, BT) saved by the forward for wgrad
    int *xt8_n;                      // (n_layer * 4) tokens of the saved Q(x^T) (0: none)
    Fp8Operand head_w8, head_wt8;    // an FP8 LM head's Q(W) (Vp, C), Q(W^T) (C, Vp) (codes NULL: BF16 head)
    Fp8Operand head_xt;              // and its chunk's Q(hf^T) (C, chunk) for the wgrad
    int w8_dirty;                    // BF16 weights written since w8 / wt8 (and head_w8) were made
    int save_xt;                     // this forward prepares a backward (keep Q(x^T), attention codes)
    const bf16 *dy_in_slot0;         // slot 0 holds Q(dy) of this dy (lin_wgrad or its producer made it)
    int dy_in_slot0_n, dy_in_slot0_m;
    const bf16 *dyt_in_slot1;        // slot 1 holds Q(dy^T) of this dy (its producer made it), or NULL
    int dyt_in_slot1_n, dyt_in_slot1_m;
    const bf16 *x_in_slot0;          // slot 0 holds Q(x) of this x for linear x_in_slot0_li (its
    int x_in_slot0_li, x_in_slot0_n; //   producer made it, and Q(x^T) when save_xt), or NULL
    // fp8_tensor: per FP8 linear (4 * layer + fp8_lin_index), the amax of its x ([2i]) and of its
    // dy ([2i + 1]) taken by their producers (device, FP32 bits; all zeroed once at the start of
    // each forward, each word written by one producer per pass; with delayed scaling also the
    // micro-batch's record for the histories, folded in by whoever quantizes); and per kind (x 0,
    // dy 1) the tensor whose amax is waiting in its linear's word for its quantization (amax_of
    // NULL: none; model_gpu_linear.cu)
    unsigned *prod_amax;             // (n_layer * 8)
    const bf16 *amax_of[2];
    int amax_rows[2], amax_cols[2];
    int fp8_fuse;                    // fp8_block: producers write the codes; fp8_tensor: they take
                                     //   the amax (precision.fuse_fp8_producers)
    long long fp8_fused;             // producer kernels that wrote codes (for tests)
    int attn_rope_fuse;              // FP8 attention: RoPE inside its quantize pass (precision.fuse_attention_rope)
    long long attn_rope_fused;       // forwards of a layer that ran it so (for tests)
    int qkv_epilogue;                // FP8 attention: the QKV projection writes Q, K, V codes (precision.fuse_qkv_epilogue)
    long long qkv_epilogue_runs;     // layer forwards that ran it so (for tests)
    long long fp8_gemms;             // FP8 GEMMs run so far (for tests)
    long long fp8_weight_refreshes;  // weight quantization passes (each FP8 linear's W and W^T)
    struct ProfState *prof;          // phase profile (model_gpu_profile.cu), NULL when off
} Dev;

static inline size_t align_up(size_t n) { return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

// --- the plan: sizing and carving are one function ---------------------------------------------
// With base == NULL only the sizes are added up (plan); with a base the pointers are set too.
// Categories as in model.h's MemoryPlan; padding to ARENA_ALIGN is counted where it falls.

typedef struct {
    char *base;
    size_t off;
    MemoryPlan *plan;
} Carver;

static inline void *take(Carver *cv, size_t bytes, size_t *category) {
    size_t n = align_up(bytes ? bytes : 1);
    void *p = cv->base ? cv->base + cv->off : NULL;
    cv->off += n;
    *category += n;
    return p;
}

static inline Dev *dev_of(GpuModel *m) {
    if (!m->priv) FATAL("model_gpu: the model is not initialised (gpu_model_init first)");
    return (Dev *)m->priv;
}

static inline size_t param_offset(const GpuModel *m, ParamKind kind, int layer) {
    const ParamDesc *d = param_find(&m->table, kind, layer);
    if (!d) FATAL("model_gpu: parameter kind %d layer %d missing from the table", (int)kind, layer);
    return d->offset;
}
static inline const bf16 *W(GpuModel *m, ParamKind kind, int layer) { return dev_of(m)->w + param_offset(m, kind, layer); }
static inline float *G(GpuModel *m, ParamKind kind, int layer) { return dev_of(m)->g + param_offset(m, kind, layer); }

// --- linear layers (model_gpu_linear.cu) ------------------------------------------------------
// (Groupings: precision.h's linear_act_grouping, linear_weight_grouping, and for the wgrad
// operands linear_xt_grouping, linear_dyt_grouping.)
// The FP8 linears of a block, i = 0..3: qkv, attention projection, MLP in, MLP out as W (M, K).
void fp8_lin_shape(int i, int C, int F, int *M, int *K);
// Bytes of codes and floats of scales FP8 scratch slot `slot` needs for config c's linears.
void fp8_slot_size(const Config *c, int slot, long BT, size_t *codes, long *scales);
// An FP8 operand's codes then scales, carved (model.c's plan takes the same two buffers).
Fp8Operand take_operand(Carver *cv, int rows, int cols, Fp8Grouping g, Fp8Format fmt, size_t *category);
// y (N, M) = x (N, K) W^T; dx (N, K) = dy (N, M) W; dW (M, K) += dy^T x, in the block's precision.
void lin_forward(GpuModel *m, ParamKind kind, int layer, bf16 *y, const bf16 *x, int N, int M, int K);
void lin_dgrad(GpuModel *m, ParamKind kind, int layer, bf16 *dx, const bf16 *dy, int N, int M, int K);
void lin_wgrad(GpuModel *m, ParamKind kind, int layer, const bf16 *dy, const bf16 *x, int N, int M, int K);
// Q(W), Q(W^T) of every FP8 linear (and of an FP8 LM head) when the BF16 weights changed since
// the last refresh.
void fp8_refresh_weights(GpuModel *m);
// Tokens per chunk of an FP8 LM head (linear_keep_lm_head_bf16 false), else 0.
long fp8_head_chunk(const Config *c, long BT);
// The FP8 LM head (model_gpu_linear.cu). head_fp8_begin before a micro-batch's chunks, with its
// whole hf (rows, C): fp8_tensor takes hf's amax (the scale of every chunk's Q(hf)). Then per
// chunk of n tokens the forward logits (n, Vp) from hf (n, C), keeping Q(hf^T) when want_grad;
// then, on the chunk's dlogits (|dlogits| <= grad_scale, the cross-entropy's factor: fp8_tensor's
// bound), dhf (n, C) and the weight gradient gw (Vp, C) += dlogits^T hf.
void head_fp8_begin(GpuModel *m, const bf16 *hf, int rows);
void head_fp8_forward(GpuModel *m, bf16 *logits, const bf16 *hf, int n, int want_grad);
// The chunk's cross-entropy (layers.h): with fp8_tensor and fusion on, its gradient as Q(dlogits)'s
// codes in slot 0 (cross_entropy_fp8_gpu; returns 1, and dlogits are not written), else in place.
int head_fp8_cross_entropy(GpuModel *m, bf16 *logits, float *losses, const int32_t *targets, int n,
                           float grad_scale);
void head_fp8_backward(GpuModel *m, bf16 *dhf, float *gw, const bf16 *dlogits, int n, float grad_scale,
                       int codes_ready);
// Producers of a linear's operands (model_gpu_linear.cu): the layers.h kernel, or, when the
// linear (kind, layer) is fp8_block and fusion is on, its layers_fp8.h twin writing the codes
// the linear's GEMMs read (and then no BF16 output: nothing else reads it); when it is
// fp8_tensor and fusion is on, the layers.h kernel that also takes the output's amax.
// h (N, C) = RMSNorm(x) (delta NULL) or RMSNorm(res_out = x + delta): the input of (kind, layer).
void norm_for_linear(GpuModel *m, ParamKind kind, int layer, bf16 *res_out, bf16 *h, float *rstd, const bf16 *x,
                     const bf16 *delta, const bf16 *g, int N, int C, float eps);
// sw (N, F) = SwiGLU(fc): the input of (kind, layer).
void swiglu_for_linear(GpuModel *m, ParamKind kind, int layer, bf16 *sw, const bf16 *fc, int N, int F);
// dfc (N, 2F) = SwiGLU backward: the output gradient of (kind, layer).
void swiglu_backward_for_linear(GpuModel *m, ParamKind kind, int layer, bf16 *dfc, const bf16 *dsw, const bf16 *fc,
                                int N, int F);
// The RoPE backward of dqkv (B*T, 3C) writing the qkv linear's codes (fp8_tensor with delayed
// scales ready, no QK-norm): 1, dqkv left as it was; else 0 and nothing done (rope_backward_gpu's turn).
int rope_backward_for_linear(GpuModel *m, int layer, const bf16 *dqkv, int B, int T);
// dx (N, C) (= or +=, accumulate) = RMSNorm backward: the residual gradient, the output gradient
// of (kind, layer) (layer -1: of no linear). Only fp8_tensor takes anything more (the amax).
void norm_backward_for_linear(GpuModel *m, ParamKind kind, int layer, bf16 *dx, float *dg, const bf16 *dy,
                              const bf16 *x, const bf16 *g, const float *rstd, int N, int C, int accumulate);

// --- phase profile (model_gpu_profile.cu) ---------------------------------------------------------
// prof_mark(d, ph) records an event on the model stream and charges the time since the previous
// mark to phase ph; a no-op unless gpu_model_profile turned the profile on.
typedef enum {
    PH_HOST = 0,      // between passes: host work, uploads, synchronisation, launch gaps
    PH_FWD_LINEAR,    // forward GEMMs of the blocks' linears (+ FP8 quantization, weight refresh)
    PH_FWD_ATTN,      // forward attention (+ its quantize passes)
    PH_FWD_NORM,      // embedding, RMSNorm, residual adds
    PH_FWD_ROPE,      // RoPE, QK-norm
    PH_FWD_SWIGLU,
    PH_HEAD,          // LM head + cross-entropy (its dgrad and wgrad included)
    PH_BWD_LINEAR,    // dgrad + wgrad of the blocks' linears
    PH_BWD_ATTN,
    PH_BWD_NORM,      // RMSNorm backward
    PH_BWD_EMBED,     // embedding backward (sort + scatter-add into wte's gradient)
    PH_BWD_ROPE,
    PH_BWD_SWIGLU,
    PH_RECOMPUTE,     // train.recompute, and the backward's re-derived QK-normed q, k
    PH_REDUCE_NORM,   // from the backward's end to the optimizer: data-parallel reduction, norm
    PH_OPTIMIZER,     // AdamW
    PH_N
} ProfPhase;
void prof_mark(Dev *d, ProfPhase ph);
void prof_free(Dev *d);

#endif  // MODEL_GPU_INTERNAL_H
