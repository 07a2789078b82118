// linear_fp8.c: FP8 linear layers of the CPU backend (precision.linear = fp8_tensor | fp8_block).
// The CPU quantizes every GEMM operand exactly as the GPU does (same groups, same power-of-two
// scales, same FP8 codes) and then multiplies the dequantized values in FP32, so the GPU's
// quantization kernels can be compared with fp8_quantize code for code, and its GEMMs with these
// products to within accumulation rounding.
//
// ================================== CONTRACT FOR THE GPU SIDE ==================================
// A linear layer y = x W^T: x (N, K) activations (N = B*T tokens), W (M, K) weight, y (N, M).
// Its three GEMMs, with the reduction dimension of each:
//   forward  y  (N, M) = x  (N, K) . W (M, K)^T       reduce over K
//   dgrad    dx (N, K) = dy (N, M) . W (M, K)         reduce over M
//   wgrad    dW (M, K) = dy (N, M)^T . x (N, K)       reduce over N (tokens)
// cuBLASLt runs FP8 GEMMs only in the TN layout: both operands K-contiguous, i.e. in row-major
// terms each operand is a (rows, reduction) matrix. So every operand below is named with the
// row-major shape it has when it enters the GEMM, and its groups are slices of that matrix.
//
// Scales (both modes). For a group with amax = max |x| (NaN ignored, as fmaxf), the scale is
// s = fp8_scale_for_amax(fmt, amax) = 2^floor(log2(FMAX / amax)) (fp8.h; s = 1 for amax 0 or
// inf; exponent clamped to [-126, 126]); code = fp8_from_f32(fmt, x * s) (RNE, satfinite);
// the value the GEMM sees is decode(code) / s, exactly. DeepSeek-V3 uses s = FMAX / amax in
// FP32; we use power-of-two scales, as the attention spec does, so that dequantization is exact,
// scales compose without rounding and the CPU and GPU agree bit for bit. The GPU passes 1/s
// (also exact) to cuBLASLt's A/B scale pointers, which multiply. Scales are current: computed
// from the tensor being quantized, every call (no amax history; but see fp8_tensor's delayed
// option below). The GPU model makes each
// quantization once per value of its tensor (a weight's Q(W), Q(W^T) once per optimizer step,
// an activation's Q(x^T) in the forward, dy's two layouts in one call) and reuses it in every GEMM
// below that consumes it: the same codes and scales as quantizing before each GEMM, which is what
// this file does.
//
// fp8_tensor (per-tensor current scaling). x and W in E4M3; dy in precision.linear_grad_format
// (E4M3 or E5M2; E5M2 x E5M2 never occurs since x and W are E4M3). One scale per tensor, so each
// tensor has one set of codes whatever its layout: the dgrad and wgrad operands are transposed
// copies of the same codes (W^T for dgrad; dy^T and x^T for wgrad). cuBLASLt scale mode
// SCALAR_32F.
//
// fp8_tensor with precision.linear_scaling = "delayed" (Transformer Engine's DelayedScaling, with
// power-of-two scales). Each FP8 linear of the blocks (site 4 l + i, linear_fp8.h) keeps an amax
// history of linear_amax_history entries for its input x (role 0) and for its output gradient dy
// (role 1). In a micro-batch whose history is not empty, every quantization of x (dy) uses
//   s = fp8_scale_for_amax(fmt, max of the history's entries)
// instead of the tensor's own amax, and codes beyond FMAX / s saturate (satfinite; counted in
// the stats). While the history is empty (the first micro-batch) the scale is current, as above.
// Either way the tensor's own amax (NaN ignored) is recorded: each forward starts this micro-
// batch's amaxes at zero (linear_fp8_forward_begin), every quantization of x or dy folds its
// amax in (max: quantizing the same tensor again changes nothing), and at the end of the
// backward the model commits them (attn_delayed_commit: pushed into the histories, the oldest
// dropped). A forward without a backward (evaluation, sampling) uses the scales but commits
// nothing. So the producers of x and dy can write their codes as they compute them (no amax
// pass before the codes), which is the point. Weights (quantized once per optimizer step, their
// amax included) and the LM head keep current scaling. The histories are model state: saved in
// checkpoints and restored around evaluations and diagnostics probes, as attention's.
//
// fp8_block (DeepSeek-V3 fine-grained scaling, E4M3 everywhere):
//   forward  x   (N, K)  1x128 slices along K              cuBLASLt VEC128_32F
//            W   (M, K)  128x128 blocks                     BLK128x128_32F
//   dgrad    dy  (N, M)  1x128 slices along M              VEC128_32F
//            W^T (K, M)  128x128 blocks: the same blocks, amax and codes as the forward's W
//                        (a block grid starting at (0, 0) is symmetric under transposition),
//                        so the GPU transposes W's codes and its block-scale grid
//   wgrad    dy^T (M, N) 1x128 slices along N (tokens)     VEC128_32F
//            x^T  (K, N) 1x128 slices along N (tokens)     VEC128_32F
//   wgrad quantizes dy and x again, along tokens: slice (m, tokens [128j, 128j+128)) of dy^T, not
//   the forward's slices, as DeepSeek-V3 does ("128x1" tiles of the original layouts).
//   precision.linear_wgrad_blocks = "activation" ("gradient") quantizes x^T (dy^T) in 128x128
//   blocks instead (BLK128x128_32F; the block grid of x^T is x's transposed, one scale per 128
//   tokens x 128 channels): 1.25-1.5x faster wgrad GEMMs, coarser groups. 128x128 x
//   128x128 is the one combination cuBLASLt refuses; VEC128 x VEC128, VEC128 x BLK128x128 and
//   BLK128x128 x VEC128 all run in TN (measured on an H200, cuBLASLt 13.1.0: heuristic status
//   15 = NOT_SUPPORTED only for BLK x BLK).
//   Edges: the last slice of a row and the last row/column of blocks may be partial (K, M, N
//   need not be multiples of 128); a partial group's amax is over its real elements only.
//
// Scale storage. fp8_quantize writes s row-major over the group grid: 1x128 of a (R, C) matrix:
// scales[r * ceil(C/128) + j]; 128x128: scales[i * ceil(C/128) + j]. cuBLASLt (13.1, measured on
// the H200 with distinct random power-of-two scales per group) wants, for an operand stored as
// (R, C) row-major with C the reduction dimension:
//   VEC128_32F:     dequant scale of (r, slice j) at [j * R + r]        (R fastest)
//   BLK128x128_32F: dequant scale of block (i, j) at [i * L + j], L = ceil(C/128) rounded up to
//                   a multiple of 4                                     (block columns fastest)
// so the GPU writes 1/s in those layouts; a comparison with fp8_quantize permutes accordingly.
//
// Which GEMMs: the qkv, attention-projection, MLP-in and MLP-out linears of every block, except
// the first precision.linear_bf16_first_layers and last linear_bf16_last_layers blocks. The LM
// head (fused with the cross-entropy, in chunks of tokens) is FP8 only when
// linear_keep_lm_head_bf16 is false; then each chunk's hf (n, C) and dlogits (n, Vp) are the
// operand tensors, and their codes must not depend on the chunking (the CPU's chunks are 256
// tokens, the GPU's 8192):
//   fp8_block: the 1x128 slices run along C, along Vp, and (wgrad) along runs of 128 tokens,
//     which both backends' chunks (multiples of 128) keep at the same tokens;
//   fp8_tensor: the scales are the micro-batch's, not a chunk's (linear_fp8_head_scales): hf's
//     from the amax of the whole hf (B*T, C), taken before the first chunk (current scaling),
//     and dlogits' from a bound, not an amax: dlogits = g (softmax - onehot) with g the loss's
//     factor per token (1 / counted tokens on the CPU; the GPU folds the loss scale in), so
//     |dlogits| <= g, and g is the amax its scale is taken from. The bound is tight (some token
//     of a micro-batch is nearly always predicted badly) and known before any dlogits exist, so
//     each chunk's dlogits are quantized as they are made. With a power-of-two loss scale both
//     backends give the same codes. The head keeps this with delayed linear scaling too (it has
//     no amax history). Its weight is per tensor as the blocks' weights.
// The embedding is never quantized. Accumulation is FP32; outputs (y, dx, dW) are written in the
// backend's own precision.
// ===============================================================================================
#include "cpu/linear_fp8.h"

#include <math.h>    // fabsf, fmaxf
#include <stdlib.h>  // free
#include <string.h>  // memset

#include "core/common.h"     // xrealloc, FATAL
#include "cpu/matmul_cpu.h"  // matmul_nt, matmul_nn, matmul_tn

// Below this many elements a quantization runs on one thread: an OpenMP region costs more than
// the work (and much more when the machine is oversubscribed).
#define PARALLEL_MIN_ELEMS (1L << 18)

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

void linear_fp8_site(LinearFp8 *L, int layer, int i) {
    if (layer >= 0 && (i < 0 || i > 3)) FATAL("linear_fp8_site: linear %d of layer %d (expected 0..3)", i, layer);
    L->site = layer < 0 ? -1 : 4 * layer + i;
    L->head_given = 0;
}

void linear_fp8_forward_begin(LinearFp8 *L, int n_layer) {
    if (!L->delayed) return;
    for (int j = 0; j < 2 * n_layer; j++) memset(L->delayed[j].cur_amax, 0, sizeof L->delayed[j].cur_amax);
}

// max |x| over rows [r0, r0 + nr) x cols [c0, c0 + nc) of x (row stride ld); NaN ignored.
static float block_amax(const float *x, long ld, int r0, int nr, int c0, int nc) {
    float m = 0.0f;
    for (int r = r0; r < r0 + nr; r++)
        for (int c = c0; c < c0 + nc; c++) m = fmaxf(m, fabsf(x[(long)r * ld + c]));
    return m;
}

// Quantizes one run of n elements with scale s; returns the saturation and NaN counts in *sat,
// *n_nan (added to).
static void quantize_run(float *out, uint8_t *codes, const float *x, long n, float s, Fp8Format fmt,
                         long long *sat, long long *n_nan) {
    float fmax = fp8_max(fmt);
    for (long i = 0; i < n; i++) {
        float v = x[i] * s;  // exact unless far below FP8's range (s is a power of two)
        uint8_t q = fp8_from_f32(fmt, v);
        if (v != v) (*n_nan)++;
        else if (fabsf(v) > fmax) (*sat)++;
        if (codes) codes[i] = q;
        if (out) out[i] = fp8_to_f32(fmt, q) / s;  // exact: s is a power of two
    }
}

// max |x| over the whole (rows, cols) x (NaN ignored); max is exact, so the order does not matter.
static float tensor_amax(const float *x, int rows, int cols) {
    float amax = 0.0f;
#pragma omp parallel for reduction(max : amax) schedule(static) if ((long)rows * cols >= PARALLEL_MIN_ELEMS)
    for (int r = 0; r < rows; r++) amax = fmaxf(amax, block_amax(x, cols, r, 1, 0, cols));
    return amax;
}

void linear_fp8_head_scales(LinearFp8 *L, const float *hf, int rows, int cols, float dy_bound) {
    linear_fp8_site(L, -1, 0);
    L->head_amax[LINEAR_ROLE_X] = tensor_amax(hf, rows, cols);
    L->head_amax[LINEAR_ROLE_DY] = dy_bound;
    L->head_given = 1;
}

// The whole (rows, cols) x quantized with the one scale s (per tensor: current or delayed);
// saturations and NaNs added to *sat, *n_nan.
static void quantize_tensor_with(float *out, uint8_t *codes, const float *x, int rows, int cols, float s,
                                 Fp8Format fmt, long long *sat, long long *n_nan) {
    long long sa = 0, na = 0;
#pragma omp parallel for reduction(+ : sa, na) schedule(static) if ((long)rows * cols >= PARALLEL_MIN_ELEMS)
    for (int r = 0; r < rows; r++) {
        long off = (long)r * cols;
        quantize_run(out ? out + off : NULL, codes ? codes + off : NULL, x + off, cols, s, fmt, &sa, &na);
    }
    *sat += sa;
    *n_nan += na;
}

static void add_stats(Fp8QuantStats *stats, long long casts, long long sat, long long n_nan) {
    if (!stats) return;
    stats->casts += casts;
    stats->saturated += sat;
    stats->nans += n_nan;
}

void fp8_quantize(float *out, uint8_t *codes, float *scales, const float *x, int rows, int cols,
                  Fp8Grouping g, Fp8Format fmt, Fp8QuantStats *stats) {
    if (rows < 0 || cols < 0) FATAL("fp8_quantize: negative shape (%d, %d)", rows, cols);
    long long sat = 0, n_nan = 0;
    int par = (long)rows * cols >= PARALLEL_MIN_ELEMS;
    int n_gc = ceil_div(cols, FP8_GROUP);  // slices or block columns per row
    if (g == FP8_GROUP_TENSOR) {
        float s = fp8_scale_for_amax(fmt, tensor_amax(x, rows, cols));
        if (scales) scales[0] = s;
        quantize_tensor_with(out, codes, x, rows, cols, s, fmt, &sat, &n_nan);
    } else if (g == FP8_GROUP_1x128) {
#pragma omp parallel for reduction(+ : sat, n_nan) schedule(static) if (par)
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < n_gc; j++) {
                int c0 = j * FP8_GROUP, nc = cols - c0 < FP8_GROUP ? cols - c0 : FP8_GROUP;
                long off = (long)r * cols + c0;
                float s = fp8_scale_for_amax(fmt, block_amax(x, cols, r, 1, c0, nc));
                if (scales) scales[(long)r * n_gc + j] = s;
                quantize_run(out ? out + off : NULL, codes ? codes + off : NULL, x + off, nc, s, fmt, &sat, &n_nan);
            }
    } else if (g == FP8_GROUP_128x128) {
        int n_gr = ceil_div(rows, FP8_GROUP);
#pragma omp parallel for collapse(2) reduction(+ : sat, n_nan) schedule(static) if (par)
        for (int i = 0; i < n_gr; i++)
            for (int j = 0; j < n_gc; j++) {
                int r0 = i * FP8_GROUP, nr = rows - r0 < FP8_GROUP ? rows - r0 : FP8_GROUP;
                int c0 = j * FP8_GROUP, nc = cols - c0 < FP8_GROUP ? cols - c0 : FP8_GROUP;
                float s = fp8_scale_for_amax(fmt, block_amax(x, cols, r0, nr, c0, nc));
                if (scales) scales[(long)i * n_gc + j] = s;
                for (int r = r0; r < r0 + nr; r++) {
                    long off = (long)r * cols + c0;
                    quantize_run(out ? out + off : NULL, codes ? codes + off : NULL, x + off, nc, s, fmt,
                                 &sat, &n_nan);
                }
            }
    } else {
        FATAL("fp8_quantize: unknown grouping %d", (int)g);
    }
    add_stats(stats, (long long)rows * cols, sat, n_nan);
}

// fp8_tensor's quantization of x (role LINEAR_ROLE_X) or dy of the current site: current scaling,
// or delayed as the contract says (the amax recorded either way), or for the LM head the
// micro-batch's amaxes linear_fp8_head_scales gave.
static void quantize_tensor(LinearFp8 *L, float *out, const float *x, int rows, int cols, int role, Fp8Format fmt,
                            Fp8QuantStats *stats) {
    float sc;  // the one scale of the tensor
    if (L->site < 0 && L->head_given) {
        sc = fp8_scale_for_amax(fmt, L->head_amax[role]);
    } else if (!L->delayed || L->site < 0) {
        fp8_quantize(out, NULL, NULL, x, rows, cols, FP8_GROUP_TENSOR, fmt, stats);  // current: its own amax
        return;
    } else {
        int si, t;
        linear_delayed_slot(L->site, role, &si, &t);
        AttnDelayedState *s = &L->delayed[si];
        const float own = tensor_amax(x, rows, cols);
        s->cur_amax[t] = fmaxf(s->cur_amax[t], own);
        // the first micro-batch (an empty history): current, from the amax just taken
        sc = fp8_scale_for_amax(fmt, s->filled == 0 ? own : attn_delayed_amax(s, t));
    }
    long long sat = 0, n_nan = 0;
    quantize_tensor_with(out, NULL, x, rows, cols, sc, fmt, &sat, &n_nan);
    add_stats(stats, (long long)rows * cols, sat, n_nan);
}

// --- the three GEMMs ---------------------------------------------------------------------------

void linear_fp8_init(LinearFp8 *L, const PrecisionConfig *p) {
    memset(L, 0, sizeof *L);
    L->site = -1;
    linear_wgrad_groupings(LINEAR_FP8_BLOCK, p->linear_wgrad_blocks, &L->wgrad_dyt, &L->wgrad_xt);
    // fp8_block: E4M3 for gradients too (1x128 slices leave no need for E5M2's range).
    L->grad_format = (p->linear == LINEAR_FP8_TENSOR && p->linear_grad_format == GRADFMT_E5M2) ? FP8_E5M2
                                                                                                 : FP8_E4M3;
}

void linear_fp8_free(LinearFp8 *L) {
    for (int i = 0; i < 2; i++) free(L->scratch[i]);
    memset(L, 0, sizeof *L);
}

// Scratch buffer i with room for n floats.
static float *scratch(LinearFp8 *L, int i, size_t n) {
    if (L->scratch_cap[i] < n) {
        L->scratch[i] = xrealloc(L->scratch[i], sizeof(float) * n);
        L->scratch_cap[i] = n;
    }
    return L->scratch[i];
}

static void check_precision(LinearPrecision p) {
    if (p != LINEAR_FP8_TENSOR && p != LINEAR_FP8_BLOCK) FATAL("linear_fp8: unknown linear precision %d", (int)p);
}

// dst (cols, rows) = src (rows, cols)^T
static void transpose(float *dst, const float *src, int rows, int cols) {
#pragma omp parallel for schedule(static) if ((long)rows * cols >= PARALLEL_MIN_ELEMS)
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) dst[(long)c * rows + r] = src[(long)r * cols + c];
}

void linear_forward(LinearFp8 *L, LinearPrecision prec, float *y, const float *x, const float *w,
                    int N, int M, int K, int accumulate) {
    if (prec == LINEAR_BF16) {
        matmul_nt(y, x, w, N, M, K, accumulate);
        return;
    }
    check_precision(prec);
    float *xq = scratch(L, 0, (size_t)N * K), *wq = scratch(L, 1, (size_t)M * K);
    if (prec == LINEAR_FP8_TENSOR) quantize_tensor(L, xq, x, N, K, LINEAR_ROLE_X, FP8_E4M3, &L->stats[LINEAR_X]);
    else fp8_quantize(xq, NULL, NULL, x, N, K, FP8_GROUP_1x128, FP8_E4M3, &L->stats[LINEAR_X]);  // (N, K)
    fp8_quantize(wq, NULL, NULL, w, M, K, linear_weight_grouping(prec), FP8_E4M3, &L->stats[LINEAR_W]);  // (M, K)
    matmul_nt(y, xq, wq, N, M, K, accumulate);
    L->gemms++;
}

void linear_dgrad(LinearFp8 *L, LinearPrecision prec, float *dx, const float *dy, const float *w,
                  int N, int M, int K, int accumulate) {
    if (prec == LINEAR_BF16) {
        matmul_nn(dx, dy, w, N, K, M, accumulate);
        return;
    }
    check_precision(prec);
    float *dyq = scratch(L, 0, (size_t)N * M), *wq = scratch(L, 1, (size_t)M * K);
    Fp8QuantStats *st = &L->stats[LINEAR_DY];
    if (prec == LINEAR_FP8_TENSOR) quantize_tensor(L, dyq, dy, N, M, LINEAR_ROLE_DY, L->grad_format, st);
    else fp8_quantize(dyq, NULL, NULL, dy, N, M, FP8_GROUP_1x128, L->grad_format, st);  // along M
    // W^T's blocks are W's blocks transposed: quantizing W in place gives the same values.
    fp8_quantize(wq, NULL, NULL, w, M, K, linear_weight_grouping(prec), FP8_E4M3, &L->stats[LINEAR_W]);
    matmul_nn(dx, dyq, wq, N, K, M, accumulate);
    L->gemms++;
}

void linear_wgrad(LinearFp8 *L, LinearPrecision prec, float *dw, const float *dy, const float *x,
                  int N, int M, int K, int accumulate) {
    if (prec == LINEAR_BF16) {
        matmul_tn(dw, dy, x, M, K, N, accumulate);
        return;
    }
    check_precision(prec);
    if (prec == LINEAR_FP8_TENSOR) {  // per-tensor codes do not depend on the layout
        float *dyq = scratch(L, 0, (size_t)N * M), *xq = scratch(L, 1, (size_t)N * K);
        quantize_tensor(L, dyq, dy, N, M, LINEAR_ROLE_DY, L->grad_format, &L->stats[LINEAR_DY]);
        quantize_tensor(L, xq, x, N, K, LINEAR_ROLE_X, FP8_E4M3, &L->stats[LINEAR_X]);
        matmul_tn(dw, dyq, xq, M, K, N, accumulate);
    } else {  // 1x128 slices along the tokens of the transposed operands (or one in 128x128 blocks)
        float *dyt = scratch(L, 0, (size_t)M * N), *xt = scratch(L, 1, (size_t)K * N);
        transpose(dyt, dy, N, M);  // (M, N)
        transpose(xt, x, N, K);    // (K, N)
        fp8_quantize(dyt, NULL, NULL, dyt, M, N, L->wgrad_dyt, FP8_E4M3, &L->stats[LINEAR_DY]);
        fp8_quantize(xt, NULL, NULL, xt, K, N, L->wgrad_xt, FP8_E4M3, &L->stats[LINEAR_X]);
        matmul_nt(dw, dyt, xt, M, K, N, accumulate);  // dW (M, K) = dy^T (M, N) . (x^T (K, N))^T
    }
    L->gemms++;
}
