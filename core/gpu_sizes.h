// gpu_sizes.h: the byte counts of the GPU kernels' scratch buffers, as plain C. The kernels'
// launchers (gpu/layers.cu, attention/bwd_bf16.cu, gpu/linear_fp8_gpu.cu) and the memory plan (core/model.c, which
// links no GPU code so that --dry-run needs no CUDA runtime) both use these, so the plan cannot
// drift from what the kernels need.
#ifndef GPU_SIZES_H
#define GPU_SIZES_H

#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t

#include "core/config.h"     // AttnPrecision, attn_precision_is_fp8
#include "core/precision.h"  // Fp8Grouping and the FP8 linears' groupings (linear_act_grouping, ...)

// RMSNorm and QK-norm backward: the gain gradient is summed in FP32 partials over row chunks:
// at most 1024 chunks of at least 32 rows, each giving one partial row of `dim` floats.
static inline void gpu_norm_chunks(long long n_rows, int *n_chunks, long long *chunk_rows) {
    long long nc = (n_rows + 31) / 32;
    if (nc > 1024) nc = 1024;
    if (nc < 1) nc = 1;
    *chunk_rows = (n_rows + nc - 1) / nc;
    *n_chunks = (int)((n_rows + *chunk_rows - 1) / *chunk_rows);
    if (*n_chunks < 1) *n_chunks = 1;
}
static inline size_t gpu_norm_scratch_bytes(long long n_rows, size_t dim) {
    int nc;
    long long cr;
    gpu_norm_chunks(n_rows, &nc, &cr);
    return sizeof(float) * (size_t)nc * dim;
}

// Gradient norm: the number of FP64 partial sums (a fixed partition: the result never depends on
// the GPU, the launch or the run).
#define GRAD_NORM_PARTIALS 1024
// cuBLASLt's workspace (matmul.cu allocates it outside the arena).
#define MATMUL_WORKSPACE_BYTES ((size_t)32 << 20)

static inline size_t gpu_align256(size_t n) { return (n + 255) / 256 * 256; }

// Embedding backward (embedding.cu): the (token, position) pairs sorted by token (double
// buffers of N keys and N positions), the per-tile partial rows of token runs that cross a tile
// of EMB_TILE sorted entries (a head piece and a tail piece per tile, C floats each), and CUB's
// radix-sort temporary storage. CUB decides the latter at run time; this bound (1 MiB + 8 bytes
// per key: ~40 KiB is what it asks for 16K keys of 17 bits) is checked against its request on
// every call, with a message naming this function if it ever falls short.
#define EMB_TILE 64
typedef struct {
    size_t keys_a, keys_b, pos_a, pos_b, head, tail, sort_temp;  // byte offsets, 256-aligned
    size_t sort_temp_bytes, total;
} GpuEmbeddingScratch;
static inline GpuEmbeddingScratch gpu_embedding_scratch_layout(size_t N, size_t C) {
    GpuEmbeddingScratch s;
    size_t at = 0, tiles = (N + EMB_TILE - 1) / EMB_TILE;
    s.keys_a = at; at += gpu_align256(4 * N);
    s.keys_b = at; at += gpu_align256(4 * N);
    s.pos_a = at; at += gpu_align256(4 * N);
    s.pos_b = at; at += gpu_align256(4 * N);
    s.head = at; at += gpu_align256(4 * tiles * C);
    s.tail = at; at += gpu_align256(4 * tiles * C);
    s.sort_temp = at;
    s.sort_temp_bytes = ((size_t)1 << 20) + 8 * N;
    s.total = at + s.sort_temp_bytes;
    return s;
}
static inline size_t gpu_embedding_scratch_bytes(size_t N, size_t C) {
    return gpu_embedding_scratch_layout(N, C).total;
}

// BF16 attention backward: the FP32 dQ accumulator (B, H, T, d) and D = rowsum(dO * O) (B, H, T).
static inline size_t gpu_attn_bwd_workspace_bytes(size_t B, size_t H, size_t T, size_t d) {
    return B * H * T * d * sizeof(float) + B * H * T * sizeof(float);
}

// Attention of one layer in a precision mode (attention_fp8.h's attn_mode_workspace_bytes):
// BF16 needs the backward's scratch only. The FP8 modes add the quantized operands: codes and
// transposed codes of Q, K, V, dO, each (B, H, Tp, d) bytes with Tp = T rounded up to 128, and
// their per-128-token-block scales (B, H, Tp/128) FP32; then fp8_hybrid the dequantized Q̂, K̂,
// V̂ in BF16 (B, T, 3, H, d) for its BF16 backward, the others the FP8 backward's scratch (the
// same dQ accumulator and D); then, for delayed scaling, each operand's block amaxes (B, H,
// Tp/128) and per-head scales (B, H) FP32 (a few KB; there in block scaling too). Every part
// starts on a 256-byte boundary. The layout is described once, here: attention_fp8.cu carves the
// workspace in this order with these sizes.
typedef struct {
    size_t codes;   // bytes of one operand's codes (or transposed codes); 8 of them; 0 in bf16
    size_t scales;  // bytes of one operand's scales (and of its block amaxes); 4 + 4 of them; 0 in bf16
    size_t bwd;     // the backward's FP32 scratch
    size_t deq;     // fp8_hybrid's dequantized Q, K, V; else 0
    size_t heads;   // bytes of one operand's per-head scales; 4 of them; 0 in bf16
    size_t total;   // 8 codes + 4 scales + bwd + deq + 4 block amaxes + 4 per-head scales
} GpuAttnLayout;
static inline GpuAttnLayout gpu_attn_mode_layout(AttnPrecision p, size_t B, size_t H, size_t T, size_t d) {
    GpuAttnLayout l = {0, 0, gpu_align256(gpu_attn_bwd_workspace_bytes(B, H, T, d)), 0, 0, 0};
    if (attn_precision_is_fp8(p)) {
        size_t Tp = (T + 127) / 128 * 128;
        l.codes = gpu_align256(B * H * Tp * d);
        l.scales = gpu_align256(sizeof(float) * B * H * (Tp / 128));
        l.heads = gpu_align256(sizeof(float) * B * H);
    }
    if (p == ATTN_FP8_HYBRID) l.deq = gpu_align256(2 * 3 * B * T * H * d);
    l.total = 8 * l.codes + 4 * l.scales + l.bwd + l.deq + 4 * l.scales + 4 * l.heads;
    return l;
}
static inline size_t gpu_attn_mode_workspace_bytes(AttnPrecision p, size_t B, size_t H, size_t T, size_t d) {
    return gpu_attn_mode_layout(p, B, H, T, d).total;
}

// Q, K, V of one layer quantized by its forward and kept for its backward
// (precision.attention_keep_codes; attention_fp8.h's AttnSavedCodes): codes and transposed codes
// of each, (B, H, Tp, d) bytes apiece, then their scales (B, H, Tp/128) FP32, every part on a
// 256-byte boundary: 6 bytes per q/k/v element plus 12 bytes per (b, h, 128-token block). The
// same buffer holds fp8_hybrid's dequantized Q̂, K̂, V̂ instead ((B, T, 3, H, d) BF16, 6 bytes per
// element, T <= Tp), so every FP8 mode takes the one size; bf16 keeps nothing (0). The parts are
// gpu_attn_mode_layout's codes and scales (attention_fp8.cu's carve_saved carves them).
static inline size_t gpu_attn_saved_codes_bytes(AttnPrecision p, size_t B, size_t H, size_t T, size_t d) {
    const GpuAttnLayout l = gpu_attn_mode_layout(p, B, H, T, d);
    return 6 * l.codes + 3 * l.scales;
}

// Floats in an FP8 operand's scale buffer (rows, cols with cols the reduction), with cuBLASLt's
// padding: per tensor 2 (1/s and the amax); 1x128 slices round4(ceil(cols/128)) * round4(rows);
// 128x128 blocks round4(ceil(rows/128)) * round4(ceil(cols/128)).
static inline size_t gpu_round4(size_t x) { return (x + 3) / 4 * 4; }
static inline size_t gpu_cdiv128(size_t x) { return (x + 127) / 128; }
static inline size_t gpu_fp8_scales_tensor(void) { return 2; }
static inline size_t gpu_fp8_scales_1x128(size_t rows, size_t cols) {
    return gpu_round4(gpu_cdiv128(cols)) * gpu_round4(rows);
}
static inline size_t gpu_fp8_scales_128x128(size_t rows, size_t cols) {
    return gpu_round4(gpu_cdiv128(rows)) * gpu_round4(gpu_cdiv128(cols));
}
// The same by grouping (linear_fp8_gpu.cu's fp8_gpu_scale_count).
static inline size_t gpu_fp8_scales(Fp8Grouping g, size_t rows, size_t cols) {
    return g == FP8_GROUP_TENSOR  ? gpu_fp8_scales_tensor()
           : g == FP8_GROUP_1x128 ? gpu_fp8_scales_1x128(rows, cols)
                                  : gpu_fp8_scales_128x128(rows, cols);
}

// Scale floats of a linear's saved Q(x^T) (rows = K, cols = tokens) for the wgrad, in FP8
// precision p with precision.linear_wgrad_blocks b (linear_xt_grouping).
static inline size_t gpu_fp8_scales_xt(LinearPrecision p, WgradBlocks b, size_t rows, size_t cols) {
    return gpu_fp8_scales(linear_xt_grouping(p, b), rows, cols);
}

// fp8_tensor's producer amaxes (model_gpu_linear.cu): an x and a dy word per FP8 linear.
static inline size_t gpu_fp8_prod_amax_bytes(size_t n_layer) { return sizeof(unsigned) * 8 * n_layer; }
// Delayed linear scaling's per-operand amaxes the scales come from (FP32, one per prod_amax word).
static inline size_t gpu_fp8_delayed_amax_bytes(size_t n_layer) { return sizeof(float) * 8 * n_layer; }

// The FP8 weights of the blocks' linears: Q(W) (M, K) for the forward and Q(W^T) (K, M) for the
// dgrad (FP8 GEMMs reduce over a contiguous dimension), made once per optimizer step. Per tensor
// (fp8_tensor) Q(W^T) is Q(W) transposed with the same scale, so only Q(W) is kept and each dgrad
// transposes it into one scratch operand first (model_gpu_linear.cu), sized for the largest
// block weight: qkv (3C, C) or MLP-in (2F, C). 128x128 blocks (fp8_block) keep both.
static inline int gpu_fp8_keeps_weight_t(LinearPrecision p) { return linear_weight_grouping(p) != FP8_GROUP_TENSOR; }
static inline size_t gpu_fp8_weight_t_scratch_codes(size_t C, size_t F) { return 3 * C > 2 * F ? 3 * C * C : 2 * F * C; }

// The fused LM head + cross-entropy runs chunks of this many tokens on the GPU (model_gpu.cu).
#define GPU_HEAD_CHUNK_TOKENS 8192
static inline size_t gpu_head_chunk(size_t BT) { return BT < GPU_HEAD_CHUNK_TOKENS ? BT : GPU_HEAD_CHUNK_TOKENS; }
// The chunk of an FP8 LM head (head: the head's linear precision), 0 when the head is BF16. Its
// codes do not depend on the chunking (linear_fp8.c's contract: fp8_block's 1x128 slices stay
// aligned, fp8_tensor's scales are the micro-batch's), so the GPU's chunks give the CPU
// emulation's codes.
static inline size_t gpu_fp8_head_chunk(LinearPrecision head, size_t BT) {
    return head == LINEAR_FP8_BLOCK || head == LINEAR_FP8_TENSOR ? gpu_head_chunk(BT) : 0;
}
// The GPU model's two FP8 operand slots (model_gpu_linear.cu), each sized for the largest of the
// shapes (rows, cols = the consuming GEMM's reduction) it takes in one micro-batch of BT tokens:
//   slot 0: forward x (BT, C) (BT, F); dgrad dy (BT, 3C) (BT, C) (BT, 2F)
//   slot 1: wgrad dy^T (3C, BT) (C, BT) (2F, BT)
// and an FP8 LM head's chunk (head_chunk > 0, gpu_fp8_head_chunk) its dlogits: Q(dy) (chunk, Vp)
// in slot 0, Q(dy^T) (Vp, chunk) in slot 1 with fp8_block (its x, hf (chunk, C), fits slot 0's
// (BT, C)); per tensor Q(dy^T) is Q(dy) transposed, written into the chunk's BF16 logits buffer
// once Q(dy) holds its values (model_gpu_linear.cu's head_fp8_backward), so slot 1 stays the
// blocks'. Bytes of codes and floats of scales (per tensor, or 1x128 slices with fp8_block: also
// enough for a dy^T in 128x128 blocks, precision.linear_wgrad_blocks = "gradient", which has fewer).
static inline void gpu_fp8_slot_size(int slot, LinearPrecision p, size_t BT, size_t C, size_t F, size_t head_chunk,
                                     size_t Vp, size_t *codes, size_t *scales) {
    const size_t s0[][2] = {{BT, C}, {BT, F}, {BT, 3 * C}, {BT, 2 * F}, {head_chunk, Vp}};
    const size_t s1[][2] = {{3 * C, BT}, {C, BT}, {2 * F, BT}, {Vp, head_chunk}};
    const size_t(*shapes)[2] = slot == 0 ? s0 : s1;
    const int head = head_chunk > 0 && (slot == 0 || linear_act_grouping(p) != FP8_GROUP_TENSOR);
    const int n = (slot == 0 ? 4 : 3) + head;
    *codes = *scales = 0;
    for (int i = 0; i < n; i++) {
        const size_t r = shapes[i][0], c = shapes[i][1];
        const size_t ns = gpu_fp8_scales(linear_act_grouping(p), r, c);
        if (r * c > *codes) *codes = r * c;
        if (ns > *scales) *scales = ns;
    }
}

#endif  // GPU_SIZES_H
