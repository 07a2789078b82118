// embedding.cu: the token embedding, forward (a gather) and backward (a deterministic scatter-add
// into the FP32 gradient of wte). Contracts in layers.h.
//
// The backward must add the rows of dx that share a token in an order that does not depend on
// scheduling (training is bitwise reproducible), and it must stay fast when the tokens are far
// from uniform: natural text follows Zipf's law (the most frequent token is ~5-9% of a batch) and
// a batch can hold one token thousands of times (padding, a run of spaces). So:
//   1. sort the (token, position) pairs by token with CUB's radix sort, which is stable: the
//      positions of one token stay in increasing order;
//   2. cut the sorted list into fixed tiles of EMB_TILE entries; a warp per (tile, 256 columns)
//      adds its tile's rows token run by token run, in sorted order. A run that lies inside one
//      tile goes straight into dwte; the pieces of a run that crosses tiles go to per-tile
//      partial rows (head piece / tail piece);
//   3. the tile where a crossing run begins adds its pieces, tile by tile in order, into dwte.
// Every sum is over a fixed partition in a fixed order: the result is a function of the tokens
// and dx only. The longest chain of dependent additions is EMB_TILE rows (plus one per tile a run
// crosses in step 3), whatever the distribution: 0.07-0.21 ms for 16K tokens (uniform, Zipf, one
// token; docs/perf.md, "Layer kernels"), where a block per token took 1.6 ms (Zipf) and 24 ms (one
// token) on one H200 (measured 2026-11-30).
#include "gpu/layers.h"

#include <cub/device/device_radix_sort.cuh>  // cub::DeviceRadixSort::SortPairs (stable LSD radix sort)
#include <cuda_bf16.h>                       // __nv_bfloat16 and its conversions
#include <cuda_runtime.h>                    // kernel launches
#include <math.h>                            // NAN
#include <stdint.h>                          // int32_t, uint32_t, uintptr_t

#include "core/common.h"        // FATAL
#include "gpu/cuda_check.h"     // CUDA_CHECK, CUDA_CHECK_LAUNCH
#include "core/gpu_sizes.h"     // gpu_embedding_scratch_bytes, EMB_TILE: the memory plan sizes it too
#include "gpu/layers_math.cuh"  // Bf16x8, aligned16

typedef __nv_bfloat16 bf16;

#define EMB_FWD_BLOCK 256
#define EMB_COLS 8     // columns per thread in the backward (one 16-byte load of dx)
#define EMB_BATCH 8    // sorted entries whose dx loads are in flight together

static __device__ __forceinline__ float bf2f(bf16 x) { return __bfloat162float(x); }

// --- forward -----------------------------------------------------------------------------------

__global__ void embedding_forward_kernel(bf16 *x, const int32_t *tokens, const bf16 *wte, long long N,
                                         int C, int Vp) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C) return;
    long long row = idx / C;
    int c = (int)(idx % C);
    int tok = tokens[row];
    x[idx] = (tok >= 0 && tok < Vp) ? wte[(long long)tok * C + c] : __float2bfloat16_rn(NAN);
}

extern "C" void embedding_forward_gpu(uint16_t *x, const int32_t *tokens, const uint16_t *wte, int N,
                                      int C, int Vp, cudaStream_t stream) {
    size_t n = (size_t)N * C;
    if (n == 0) return;
    embedding_forward_kernel<<<(unsigned)((n + EMB_FWD_BLOCK - 1) / EMB_FWD_BLOCK), EMB_FWD_BLOCK, 0, stream>>>(
        (bf16 *)x, tokens, (const bf16 *)wte, N, C, Vp);
    CUDA_CHECK_LAUNCH();
}

// --- backward ----------------------------------------------------------------------------------

extern "C" size_t embedding_backward_scratch_bytes(int N, int C) {
    return gpu_embedding_scratch_bytes((size_t)N, (size_t)C);
}

// The sort keys: the token, or Vp for a token outside [0, Vp) (sorted last, then skipped).
__global__ void emb_keys_kernel(uint32_t *keys, uint32_t *pos, const int32_t *tokens, int N, int Vp) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    int tok = tokens[i];
    keys[i] = (tok >= 0 && tok < Vp) ? (uint32_t)tok : (uint32_t)Vp;
    pos[i] = (uint32_t)i;
}

// Adds EMB_COLS columns of dx row p into acc (scalar loads when the row is not 16-byte aligned).
template <bool VEC>
static __device__ __forceinline__ void load_cols(float (&v)[EMB_COLS], const bf16 *dx, long long p, int C, int c0) {
    const bf16 *row = dx + p * C + c0;
    if (VEC) {
        Bf16x8 w;
        w.u = *(const uint4 *)row;
#pragma unroll
        for (int j = 0; j < EMB_COLS; j++) v[j] = bf2f(w.h[j]);
    } else {
#pragma unroll
        for (int j = 0; j < EMB_COLS; j++) v[j] = c0 + j < C ? bf2f(row[j]) : 0.0f;
    }
}

// Writes a finished run piece [s, end) of token v (end within tile [b, e)).
static __device__ __forceinline__ void flush_run(float *dwte, float *head, float *tail, const float (&acc)[EMB_COLS],
                                                 const uint32_t *keys, uint32_t v, long long s, long long end,
                                                 long long b, long long e, int N, int C, int c0, int tile, int Vp) {
    if (v >= (uint32_t)Vp) return;
    const bool begins = !(s == b && b > 0 && keys[b - 1] == v);  // no entry of v before the tile
    const bool ends = !(end == e && e < N && keys[e] == v);      // none after it
    float *out;
    if (begins && ends) {
        out = dwte + (long long)v * C + c0;
        for (int j = 0; j < EMB_COLS && c0 + j < C; j++) out[j] += acc[j];
        return;
    }
    out = (begins ? tail : head) + (long long)tile * C + c0;
    for (int j = 0; j < EMB_COLS && c0 + j < C; j++) out[j] = acc[j];
}

// Step 2: grid (tiles, ceil(C / (32 * EMB_COLS))), one warp per block; lane l owns columns
// c0 .. c0 + 7. The entries of the tile are walked in sorted order, EMB_BATCH at a time (the
// keys and positions are the same for the whole warp: broadcast loads).
template <bool VEC>
__global__ void __launch_bounds__(32) emb_accumulate_kernel(float *dwte, float *head, float *tail, const bf16 *dx,
                                                            const uint32_t *keys, const uint32_t *pos, int N, int C,
                                                            int Vp) {
    const int tile = blockIdx.x;
    const int c0 = (blockIdx.y * 32 + threadIdx.x) * EMB_COLS;
    if (c0 >= C) return;
    const long long b = (long long)tile * EMB_TILE, e = min(b + EMB_TILE, (long long)N);
    float acc[EMB_COLS] = {};
    uint32_t cur = keys[b];
    long long run_start = b;
    for (long long i0 = b; i0 < e; i0 += EMB_BATCH) {
        float v[EMB_BATCH][EMB_COLS];
        uint32_t k[EMB_BATCH];
#pragma unroll
        for (int j = 0; j < EMB_BATCH; j++) {
            if (i0 + j < e) {
                k[j] = keys[i0 + j];
                load_cols<VEC>(v[j], dx, pos[i0 + j], C, c0);
            }
        }
#pragma unroll
        for (int j = 0; j < EMB_BATCH; j++) {
            if (i0 + j >= e) break;
            if (k[j] != cur) {
                flush_run(dwte, head, tail, acc, keys, cur, run_start, i0 + j, b, e, N, C, c0, tile, Vp);
#pragma unroll
                for (int q = 0; q < EMB_COLS; q++) acc[q] = 0.0f;
                cur = k[j];
                run_start = i0 + j;
            }
#pragma unroll
            for (int q = 0; q < EMB_COLS; q++) acc[q] += v[j][q];
        }
    }
    flush_run(dwte, head, tail, acc, keys, cur, run_start, e, b, e, N, C, c0, tile, Vp);
}

// Step 3: the tile whose tail run continues past its end and began inside it adds that run's
// pieces: its own tail piece, then the head pieces of the next tiles in order.
__global__ void __launch_bounds__(32) emb_fixup_kernel(float *dwte, const float *head, const float *tail,
                                                       const uint32_t *keys, int N, int C, int Vp) {
    const int tile = blockIdx.x;
    const int c0 = (blockIdx.y * 32 + threadIdx.x) * EMB_COLS;
    if (c0 >= C) return;
    const long long b = (long long)tile * EMB_TILE, e = min(b + EMB_TILE, (long long)N);
    const uint32_t v = keys[e - 1];
    if (v >= (uint32_t)Vp || e == N || keys[e] != v) return;  // the tail run ends in this tile
    if (keys[b] == v && b > 0 && keys[b - 1] == v) return;     // it began in an earlier tile
    float total[EMB_COLS];
    for (int j = 0; j < EMB_COLS; j++) total[j] = c0 + j < C ? tail[(long long)tile * C + c0 + j] : 0.0f;
    for (int u = tile + 1;; u++) {
        const long long ue = min((long long)(u + 1) * EMB_TILE, (long long)N);
        for (int j = 0; j < EMB_COLS && c0 + j < C; j++) total[j] += head[(long long)u * C + c0 + j];
        if (ue == N || keys[ue] != v) break;
    }
    float *out = dwte + (long long)v * C + c0;
    for (int j = 0; j < EMB_COLS && c0 + j < C; j++) out[j] += total[j];
}

extern "C" void embedding_backward_gpu(float *dwte, const uint16_t *dx, const int32_t *tokens, void *scratch,
                                       int N, int C, int Vp, cudaStream_t stream) {
    if (N <= 0) return;
    GpuEmbeddingScratch sl = gpu_embedding_scratch_layout((size_t)N, (size_t)C);
    char *base = (char *)scratch;
    uint32_t *keys_a = (uint32_t *)(base + sl.keys_a), *keys_b = (uint32_t *)(base + sl.keys_b);
    uint32_t *pos_a = (uint32_t *)(base + sl.pos_a), *pos_b = (uint32_t *)(base + sl.pos_b);
    float *head = (float *)(base + sl.head), *tail = (float *)(base + sl.tail);
    void *temp = base + sl.sort_temp;

    emb_keys_kernel<<<(N + 255) / 256, 256, 0, stream>>>(keys_a, pos_a, tokens, N, Vp);
    CUDA_CHECK_LAUNCH();
    int end_bit = 1;  // keys are 0 .. Vp: sort only the bits that can be set
    while (end_bit < 32 && ((uint64_t)1 << end_bit) <= (uint64_t)Vp) end_bit++;
    cub::DoubleBuffer<uint32_t> k(keys_a, keys_b), p(pos_a, pos_b);
    size_t need = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, need, k, p, N, 0, end_bit, stream));
    if (need > sl.sort_temp_bytes)
        FATAL("embedding backward: CUB's radix sort of %d keys needs %zu bytes of temporary storage, the plan has %zu "
              "(hint: raise the bound in gpu_sizes.h's gpu_embedding_scratch_layout)", N, need, sl.sort_temp_bytes);
    size_t have = sl.sort_temp_bytes;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, have, k, p, N, 0, end_bit, stream));
    const uint32_t *keys = k.Current(), *pos = p.Current();

    const int tiles = (N + EMB_TILE - 1) / EMB_TILE;
    dim3 grid((unsigned)tiles, (unsigned)((C + 32 * EMB_COLS - 1) / (32 * EMB_COLS)));
    const bool vec = C % 8 == 0 && aligned16(dx);
    if (vec)
        emb_accumulate_kernel<true><<<grid, 32, 0, stream>>>(dwte, head, tail, (const bf16 *)dx, keys, pos, N, C, Vp);
    else
        emb_accumulate_kernel<false><<<grid, 32, 0, stream>>>(dwte, head, tail, (const bf16 *)dx, keys, pos, N, C, Vp);
    CUDA_CHECK_LAUNCH();
    emb_fixup_kernel<<<grid, 32, 0, stream>>>(dwte, head, tail, keys, N, C, Vp);
    CUDA_CHECK_LAUNCH();
}
