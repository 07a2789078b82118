// precision.h: the precision types both backends share: the config's precision section and
// its enums, what an attention precision is (AttnOptions), its FP8 casts (AttnCast), delayed
// scaling's amax histories (AttnDelayedState), the counters a call reports (AttnStats), and how
// the FP8 linears group their operands' scales (Fp8Grouping). The CPU emulation (cpu/), the GPU
// kernels (attention/, gpu/) and the dispatcher (attention_fp8.cu) all include this header;
// none of them includes another backend's header for a type. precision.c implements the
// host-side helpers declared here.
#ifndef PRECISION_H
#define PRECISION_H

#include "core/fp8.h"  // Fp8Format, fp8_scale_for_amax_within, FP8_SCALE_MAX_EXP

#include <stddef.h>  // NULL

#ifdef __cplusplus
extern "C" {
#endif

// =============================================================================================
// The precision section of the config (docs/config.md).

// Attention precisions of docs/fp8-attention.md §3 (plus fp32, the exact CPU reference,
// fp8_dm_approx, the ablation, and fp8_hybrid_dm, the hybrid with a matched D).
typedef enum {
    ATTN_FP32 = 0,
    ATTN_BF16,
    ATTN_FP8_NAIVE,
    ATTN_FP8_HYBRID,
    ATTN_FP8_DM,
    ATTN_FP8_DM_APPROX,
    ATTN_FP8_HYBRID_DM,
    ATTN_N_PRECISIONS
} AttnPrecision;
// Centred keys (docs/fp8-attention.md §6): the FP8 modes quantize K - c instead of K, for one
// vector c per head held constant; softmax does not see c, so the attention is exactly the same.
// off; mean: c is the mean of the head's keys in the sequence; delayed: c is the previous
// micro-batch's mean of the layer's head (the head's own mean until there is one).
typedef enum { CENTER_KEYS_OFF = 0, CENTER_KEYS_MEAN, CENTER_KEYS_DELAYED } AttnCenterKeys;
typedef enum { GRADFMT_E4M3 = 0, GRADFMT_E5M2 } GradFormat;
typedef enum { SCALING_BLOCK = 0, SCALING_DELAYED } ScalingKind;
typedef enum { LINEAR_BF16 = 0, LINEAR_FP8_TENSOR, LINEAR_FP8_BLOCK } LinearPrecision;
// fp8_block's weight-gradient operands: both in 1x128 slices along the tokens (none, DeepSeek-V3's
// choice), or x^T (activation) or dy^T (gradient) in 128x128 blocks, which cuBLASLt multiplies
// 1.25-1.5x faster against the other's 1x128 slices (docs/perf.md, "FP8 linears: quantize kernels
// and GEMMs").
typedef enum { WGRAD_BLOCKS_NONE = 0, WGRAD_BLOCKS_ACTIVATION, WGRAD_BLOCKS_GRADIENT } WgradBlocks;
// fp8_tensor's activation and gradient scales: from the tensor itself (current), or from the
// amax history of the previous micro-batches (delayed, Transformer Engine's DelayedScaling).
typedef enum { LINEAR_SCALING_CURRENT = 0, LINEAR_SCALING_DELAYED } LinearScaling;
// Which fp8_tensor GEMMs accumulate without cuBLASLt's periodic promotion to FP32 (FAST_ACCUM):
// none, the forward only (Transformer Engine's default), or all three.
typedef enum { FAST_ACCUM_NONE = 0, FAST_ACCUM_FORWARD, FAST_ACCUM_ALL } FastAccum;
// precision.recipe: a named set of the keys below, applied before the config's own keys (so any
// key given in the file or by --set still wins). "none": every key its own default.
typedef enum { RECIPE_NONE = 0, RECIPE_BF16, RECIPE_FP8 } PrecisionRecipe;

typedef struct {
    PrecisionRecipe recipe;            // the preset applied before the keys (precision_recipe_apply)
    AttnPrecision attention;
    GradFormat attention_grad_format;
    ScalingKind attention_scaling;
    double attention_p_scale;
    int attention_amax_history;
    int attention_block_q, attention_block_k;
    int attention_keep_codes;          // GPU, FP8 attention: keep the forward's Q, K, V codes for the backward
    AttnCenterKeys attention_center_keys;  // FP8 attention: quantize K - c (off, mean, delayed)
    int attention_rowsum_correction;   // FP8 attention: the rank-one correction of dQ by the cast dS's row sums
    LinearPrecision linear;
    GradFormat linear_grad_format;     // of output gradients with fp8_tensor (fp8_block: E4M3)
    int linear_keep_lm_head_bf16;      // the LM head GEMMs stay in BF16 when linear is FP8
    int linear_bf16_first_layers;      // this many first blocks keep BF16 linears
    int linear_bf16_last_layers;       // this many last blocks keep BF16 linears
    WgradBlocks linear_wgrad_blocks;   // fp8_block: which wgrad operand is quantized in 128x128 blocks
    LinearScaling linear_scaling;      // fp8_tensor: current or delayed scales for x and dy
    int linear_amax_history;           // delayed: micro-batches of amax history per tensor
    FastAccum linear_fast_accum;       // fp8_tensor, GPU: GEMMs with fast (unpromoted) accumulation
    // GPU fusions (on by default; off to measure them): the same results either way
    int fuse_fp8_producers;            // FP8 linears: RMSNorm / SwiGLU kernels quantize (or take the amax of) their output
    int fuse_attention_rope;           // FP8 attention: RoPE inside the quantize pass
    int fuse_qkv_epilogue;             // FP8 attention: the QKV GEMM's epilogue writes the Q, K, V codes
} PrecisionConfig;

// Sets the keys recipe r names (RECIPE_NONE: none) in p, over whatever p holds:
//   bf16  attention bf16, linears bf16: the baseline.
//   fp8   the fastest full-FP8 combination that trains within noise of BF16 (docs/perf.md, "FP8
//         configurations"): fp8_dm attention with kept codes (block scaling), fp8_tensor linears
//         with delayed scaling and E5M2 output gradients, the LM head in FP8 too, the forward
//         GEMMs with fast accumulation (Transformer Engine's default).
void precision_recipe_apply(PrecisionConfig *p, PrecisionRecipe r);

// =============================================================================================
// Attention.

// How each attention precision runs, decided here once for both backends: the CPU emulation
// (cpu/attention_cpu.c) and the GPU dispatcher (attention_fp8.cu) both read this plan.
//   precision       forward               backward                             D
//   fp32            FP32                  FP32                                 from O
//   bf16            BF16                  BF16                                 from O
//   fp8_naive       FP8 (Q, K, V E4M3)    FP8 (dO, dS in the grad format)      from O (stale)
//   fp8_hybrid      FP8                   BF16 on the dequantized Q̂, K̂, V̂     from O (stale)
//   fp8_dm          FP8                   FP8                                  matched (Delta-Matching)
//   fp8_dm_approx   FP8                   FP8                                  approx (ablation)
//   fp8_hybrid_dm   FP8                   BF16 on the dequantized Q̂, K̂, V̂     matched
// The D of dS_ij = P_ij (dP_ij - D_i), spec §1 and §3 (docs/fp8-attention.md):
typedef enum {
    ATTN_DELTA_FROM_O = 0,  // D_i = sum_c dO_ic O_ic (FlashAttention's; with FP8 casts it no longer
                            // matches the P and dP that form dS, so rows of dS stop summing to 0)
    ATTN_DELTA_MATCHED,     // D_i = sum_j P_ij dP_ij / sum_j P_ij over exactly the P and dP that form
                            // dS: every row of dS sums to 0 (a separate pass over the key blocks)
    ATTN_DELTA_APPROX,      // D_i = sum_c dÔ_ic O_ic: the quantized dO against the stored O
} AttnDelta;
typedef struct {
    int fp8_forward;   // Q, K, V quantized to E4M3 and the FP8 forward (P in E4M3 under p_scale)
    int fp8_backward;  // dO and dS quantized, the FP8 backward; else a BF16 (fp32: FP32) backward
    AttnDelta delta;   // how the backward forms D
} AttnModePlan;
static inline AttnModePlan attn_mode_plan(AttnPrecision p) {
    AttnModePlan m = {0, 0, ATTN_DELTA_FROM_O};
    switch (p) {
    case ATTN_FP8_NAIVE: m.fp8_forward = m.fp8_backward = 1; break;
    case ATTN_FP8_HYBRID: m.fp8_forward = 1; break;
    case ATTN_FP8_DM: m.fp8_forward = m.fp8_backward = 1, m.delta = ATTN_DELTA_MATCHED; break;
    case ATTN_FP8_DM_APPROX: m.fp8_forward = m.fp8_backward = 1, m.delta = ATTN_DELTA_APPROX; break;
    case ATTN_FP8_HYBRID_DM: m.fp8_forward = 1, m.delta = ATTN_DELTA_MATCHED; break;
    default: break;  // fp32, bf16
    }
    return m;
}// The FP8 modes (quantized Q, K, V and the FP8 forward); among them the hybrids, whose backward
// is the BF16 one on the dequantized operands, and the others, whose backward is the FP8 kernel.
static inline int attn_precision_is_fp8(AttnPrecision p) { return attn_mode_plan(p).fp8_forward; }
static inline int attn_precision_fp8_backward(AttnPrecision p) { return attn_mode_plan(p).fp8_backward; }
static inline int attn_precision_is_hybrid(AttnPrecision p) {
    return attn_precision_is_fp8(p) && !attn_precision_fp8_backward(p);
}

typedef struct {
    AttnPrecision precision;
    Fp8Format grad_format;  // dO and dS casts in the FP8 backward (E4M3 or E5M2)
    ScalingKind scaling;    // block (per 128-token block / per tile) or delayed (per tensor)
    float p_scale;          // static scale of P before its E4M3 cast (default 256)
    int block_q, block_k;   // tile sizes of the GPU kernel being emulated (default 128, 128)
    // Numerics beyond the paper (FP8 modes only; zero = off):
    AttnCenterKeys center_keys;  // quantize K - c (docs/fp8-attention.md §6)
    int rowsum_correction;       // dQ_i -= r_i sum_j P_ij K̂_j / sum_j P_ij, r_i = sum_j of the cast dS
} AttnOptions;

// Fills opt from the precision section of a config.
void attn_options_from_config(AttnOptions *opt, const PrecisionConfig *p);

// The FP8 casts whose scale and saturation are tracked.
typedef enum { CAST_Q = 0, CAST_K, CAST_V, CAST_DO, CAST_P, CAST_DS, ATTN_N_CASTS } AttnCast;

// Delayed scaling (scaling == SCALING_DELAYED): per layer, per tensor (Q, K, V, dO) an amax
// history of the previous `len` steps; the scale of a step comes from the max of the history
// (while the history is empty, i.e. on the first step, from the head's own amax). cur_amax
// collects this step's amax over all heads; attn_delayed_commit() pushes it into the history at the end of a step.
#define ATTN_MAX_AMAX_HISTORY 64
typedef struct {
    int len, pos, filled;
    float hist[4][ATTN_MAX_AMAX_HISTORY];
    float cur_amax[4];
} AttnDelayedState;
void attn_delayed_init(AttnDelayedState *s, int history_len);
// The maximum of tensor `tensor`'s history (0..3; the history must not be empty): the amax a
// delayed scale comes from (attention's and the FP8 linears' alike).
float attn_delayed_amax(const AttnDelayedState *s, int tensor);
void attn_delayed_commit(AttnDelayedState *s);
// A copy of n layers' states (n may be 0), for a step that must leave no trace in them (a
// diagnostics probe); attn_delayed_restore copies it back over s and frees it.
AttnDelayedState *attn_delayed_save(const AttnDelayedState *s, int n);
void attn_delayed_restore(AttnDelayedState *s, AttnDelayedState *saved, int n);
// The four tensor scales of a step from a history that is not empty: scale[t] =
// fp8_scale_for_amax(format of t, max of the history of t; V's within 2^±ATTN_V_SCALE_MAX_EXP), Q, K, V in E4M3 and dO in
// grad_format: what attn_quantize_operand uses past the first step (the GPU model uploads them).
void attn_delayed_scales(const AttnDelayedState *s, Fp8Format grad_format, float scale[4]);

// Centred keys, delayed form: per layer and head the c that the FP8 modes subtract from K (the
// previous micro-batch's mean of that head's keys, over its sequences and tokens, BF16-rounded).
// A forward writes its own means into `next` (attn_key_centers_accumulate); the backward commits
// them (attn_key_centers_commit), as delayed scaling commits its amaxes. Until the first commit
// (ready == 0) each head uses its own mean. Checkpoints keep `center` and `ready`.
typedef struct {
    int n_layer, n_head, head_dim;
    int ready;      // `center` holds a committed estimate
    float *center;  // (n_layer, n_head, head_dim) c of the delayed form
    float *next;    // (n_layer, n_head, head_dim) the last forward's means, committed by its backward
} AttnKeyCenters;
void attn_key_centers_init(AttnKeyCenters *kc, int n_layer, int n_head, int head_dim);
void attn_key_centers_free(AttnKeyCenters *kc);
// Values per array: n_layer * n_head * head_dim.
static inline long attn_key_centers_count(const AttnKeyCenters *kc) {
    return (long)kc->n_layer * kc->n_head * kc->head_dim;
}
// Layer `layer`'s `next` from its keys k: (B, n_head, T, head_dim), the mean over B and T of each
// head, rounded to BF16 (so that a BF16 GPU epilogue can hold the same c).
void attn_key_centers_accumulate(AttnKeyCenters *kc, int layer, int B, int T, const float *k);
void attn_key_centers_commit(AttnKeyCenters *kc);
// The c of one head for a forward or backward under CENTER_KEYS_DELAYED: NULL before the first
// commit (the attention then takes the head's own mean).
static inline const float *attn_key_center_of(const AttnKeyCenters *kc, int layer, int head) {
    return kc->ready ? kc->center + ((long)layer * kc->n_head + head) * kc->head_dim : NULL;
}

// Block scaling: one scale per ATTN_SCALE_BLOCK tokens of the head's sequence for Q, K, V, dO,
// independent of the kernel's block_q / block_k.
#define ATTN_SCALE_BLOCK 128
// V's block scales have their exponent clamped to [-40, 40] (fp8_scale_for_amax_within), not
// [-126, 126]: a V block whose amax lies in [~2^-32, ~2^49] is quantized as any other operand;
// smaller values lose bits (below 2^-49 they become 0), larger ones saturate at 448 * 2^40.
// Why: the FP8 forward carries O in the units of each key block's V scale, so that a block's O
// update is one FFMA (attention/fwd_fp8_step.cuh); those units move O by the ratio of two V
// scales of the head, at most 2^80 here, which keeps it inside FP32 for any T up to 2^20
// (docs/fp8-attention.md §2). Delayed scaling clamps V's tensor (or head) scale alike: its
// scales are all equal, so U stays within 2^8 * T * 448, but the epilogue's factor (1 / l) /
// s_v must stay a normal float (s_v <= 2^40).
#define ATTN_V_SCALE_MAX_EXP 40
// The exponent bound of an operand's scales (fp8_scale_for_amax_within), block or delayed: V's,
// or the default. The one place that decides it, for the CPU emulation and the GPU layer alike.
static inline int attn_scale_max_exp(AttnCast which) {
    return which == CAST_V ? ATTN_V_SCALE_MAX_EXP : FP8_SCALE_MAX_EXP;
}

// Counters a call adds to (callers zero them). FP8 casts only (BF16 roundings are not counted).
// Q, K, V casts are counted by the forward (the backward re-derives the same values); P by both
// (forward PV, backward dV); dO and dS by the backward.
//
// Row-sum residual. resid_max is spec §4.1's max_i |sum_j dS_ij| / sum_j |dS_ij|, measured on
// the FP32 dS before its cast (sums in FP64). For nearly one-hot rows (sharp attention, early
// rows) dS itself is below FP32 resolution and that ratio is rounding noise, up to 1 even in the
// fp32 mode; resid_cancel_max divides the same sum by the size of the terms that cancel in it,
// sum_j P_ij (|dP_ij| + |D_i|) (sum_j dS_ij = sum_j P dP - D sum_j P), which is what FP32
// rounding bounds: ~1e-7 for fp8_dm and fp32, 1e-3..1 for fp8_naive. Tests assert on it.
// post_resid_max is the same ratio as resid_max for the dS the dQ and dK matmuls use, after its
// cast (FP8, or BF16 in the hybrids and bf16): the cast breaks the invariant again, in every mode.
typedef struct {
    long long saturated[ATTN_N_CASTS];  // values whose |x*s| exceeded the format's max
    long long casts[ATTN_N_CASTS];      // values cast
    double resid_max;                   // max over rows of |sum_j dS_ij| / sum_j |dS_ij|
    double resid_cancel_max;            // max over rows of |sum_j dS_ij| / sum_j P_ij(|dP_ij|+|D_i|)
    double post_resid_max;              // max over rows of |sum_j cast(dS)_ij| / sum_j |dS_ij|
} AttnStats;

// =============================================================================================
// FP8 linears: how an operand's scales are grouped, which layers run FP8, delayed scaling's slots.

// How a (rows, cols) row-major matrix is cut into groups that share one scale. Slices always
// run along cols, the contiguous dimension, which is the reduction dimension of the GEMM that
// consumes the operand (the GPU's FP8 GEMMs exist only in the "TN" layout: both operands
// K-contiguous).
typedef enum {
    FP8_GROUP_TENSOR = 0,  // one scale for the whole matrix
    FP8_GROUP_1x128,       // per row, cols [128j, 128j + 128) (the last slice may be shorter)
    FP8_GROUP_128x128,     // rows [128i, ...) x cols [128j, ...) (edge blocks may be smaller)
} Fp8Grouping;

#define FP8_GROUP 128  // slice length and block side

// Number of scales of a (rows, cols) matrix: 1; rows * ceil(cols/128); ceil(rows/128) *
// ceil(cols/128). Scales are stored row-major over the group grid: scales[gr * n_gc + gc].
long fp8_group_count(Fp8Grouping g, int rows, int cols);

// What one linear layer runs in: the config's precision.linear, or LINEAR_BF16 for the blocks
// and the LM head kept in BF16 (layer = block index, or -1 for the LM head).
LinearPrecision linear_precision_of(const PrecisionConfig *p, int n_layer, int layer);

// The contract's groupings in FP8 precision p (fp8_tensor or fp8_block); both backends and the
// GPU memory plan take them from here. Activations and output gradients: per tensor, or 1x128
// slices along the reduction; weights: per tensor, or 128x128 blocks; the wgrad operands dy^T
// (M, N) and x^T (K, N): per tensor, or (fp8_block) 1x128 slices along the tokens N, one of them
// in 128x128 blocks with precision.linear_wgrad_blocks (x^T for "activation", dy^T for "gradient").
Fp8Grouping linear_act_grouping(LinearPrecision p);
Fp8Grouping linear_weight_grouping(LinearPrecision p);
Fp8Grouping linear_dyt_grouping(LinearPrecision p, WgradBlocks b);
Fp8Grouping linear_xt_grouping(LinearPrecision p, WgradBlocks b);
void linear_wgrad_groupings(LinearPrecision p, WgradBlocks b, Fp8Grouping *dyt, Fp8Grouping *xt);  // both

// Delayed scaling's bookkeeping (the contract in linear_fp8.c). A block's FP8 linear i (0 qkv,
// 1 attention projection, 2 MLP in, 3 MLP out) of layer l is site 4 l + i; its input x is role
// 0, its output gradient dy role 1. Their histories are tensor `tensor` of state `state` of the
// model's linear states (AttnDelayedState keeps 4 tensors: two sites per state), which is also
// the GPU's amax word 2 * site + role = 4 * state + tensor.
#define LINEAR_ROLE_X 0
#define LINEAR_ROLE_DY 1
void linear_delayed_slot(int site, int role, int *state, int *tensor);
// Delayed linear scaling is on: fp8_tensor with precision.linear_scaling "delayed".
int linear_delayed_on(const PrecisionConfig *p);
// A backend's delayed-scaling states, one array (checkpoints, probes and evaluations keep it
// whole), laid out alike on both backends so that a checkpoint's states mean the same on either:
// attention's n_layer first (attention_amax_history; kept when with_attention, or when the
// linears' follow), then with delayed linear scaling the FP8 linears' 2 n_layer
// (linear_amax_history, linear_delayed_slot's states) from index LINEAR_DELAYED_FIRST(n_layer).
// Returns the initialised array (NULL when *n is 0; free() it) and its length in *n.
#define LINEAR_DELAYED_FIRST(n_layer) (n_layer)
AttnDelayedState *delayed_states_new(const PrecisionConfig *p, int n_layer, int with_attention, int *n);

#ifdef __cplusplus
}
#endif
#endif  // PRECISION_H
