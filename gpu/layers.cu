// layers.cu: the element-wise and row-wise GPU layers (see layers.h for the contracts).
//
// Patterns used throughout:
//  - element-wise kernels: one thread per element, 64-bit indices;
//  - row kernels (RMSNorm, QK-norm, dx of their backward): one warp per row, lane j handles
//    the 8-element chunks j, j + 32, ... (16-byte accesses where the shapes allow, kept in
//    registers between passes); warp sums with a fixed butterfly (deterministic);
//  - element-wise kernels on BF16 rows (RoPE, SwiGLU): 8 elements per thread, 16-byte accesses,
//    with the scalar one-thread-per-element kernels kept for odd shapes;
//  - reductions across rows (gain and embedding gradients, the gradient norm): a fixed partition
//    of the rows into partial sums, then a fixed-order reduction. No floating-point atomics.
#include "gpu/layers.h"

#include <cuda_bf16.h>     // __nv_bfloat16 and its conversions
#include <cuda_runtime.h>  // kernel launches
#include <math.h>          // INFINITY, NAN
#include <stdint.h>        // int32_t, uintptr_t
#include <type_traits>     // std::integral_constant (the chunk count of the vectorized row kernels)

#include "core/common.h"          // FATAL
#include "gpu/cuda_check.h"       // CUDA_CHECK, CUDA_CHECK_LAUNCH
#include "gpu/ptx/fast_exp2.cuh"  // fast_exp2: the cross-entropy's exponentials
#include "gpu/fp8_quant.cuh"      // max_abs8, abs_bits, publish_amax: the outputs' amax for per-tensor FP8
#include "core/gpu_sizes.h"       // gpu_norm_chunks and the scratch sizes the memory plan uses too
#include "gpu/layers_math.cuh"    // the RMSNorm / SwiGLU arithmetic, shared with layers_fp8.cu

typedef __nv_bfloat16 bf16;

#define ROW_BLOCK 256                 // threads per block of the warp-per-row kernels
#define ROWS_PER_BLOCK (ROW_BLOCK / 32)
#define EW_BLOCK 256                  // threads per block of element-wise kernels

static __device__ __forceinline__ float bf2f(bf16 x) { return lm_bf2f(x); }
static __device__ __forceinline__ bf16 f2bf(float x) { return lm_f2bf(x); }
static __device__ __forceinline__ float warp_sum(float v) { return lm_warp_sum(v); }

static unsigned blocks_for(size_t n, int block) {
    size_t b = (n + (size_t)block - 1) / (size_t)block;
    if (b > 0x7fffffffu) FATAL("launch of %zu elements is too large for one grid (hint: split the call)", n);
    return (unsigned)(b ? b : 1);
}

// Where row r of a row-wise op lives: rows come in groups of `group` consecutive rows of width
// `dim` (the heads of a token), groups are `stride` elements apart. A plain (N, C) matrix is
// group 1, stride C, dim C; the q heads of a packed (N, 3, H, hd) buffer are group H,
// stride 3*H*hd, dim hd.
struct RowMap {
    int group;
    long long stride;
    int dim;
};
static __device__ __forceinline__ long long row_offset(RowMap m, long long r) {
    return (r / m.group) * m.stride + (r % m.group) * (long long)m.dim;
}

// max |v| of eight BF16 as bits (NaN ignored): an output's share of its tensor's amax.
static __device__ __forceinline__ unsigned amax8(const Bf16x8 &v) {
    const uint32_t w[4] = {v.u.x, v.u.y, v.u.z, v.u.w};
    return max_abs8(w);
}
static __device__ __forceinline__ unsigned amax1(bf16 v) { return abs_bits(__bfloat16_as_ushort(v)); }

// ---------------------------------------------------------------------------------------------
// RMSNorm (plain rows and per-head rows through RowMap)

// One warp per row. With delta != NULL (fused residual): res_out = bf16(x + delta) is stored
// first and the stored value is normalised. y may alias x (each lane rewrites only what it read),
// or be NULL: rstd (and the residual) only, for layers_fp8.cu's fused norm, which makes y itself.
// The order of a row's sum of squares (the scalar and vectorized forms must agree, for the BF16
// output to be the same whichever runs): lane l adds the elements of its 8-element chunks
// l, l + 32, l + 64, ... (element 8l + 256v + e for v = 0, 1, ..., e = 0..7), then the butterfly.
// The scalar form (any width or alignment) and the vectorized form add in that same order.
// amax (may be NULL): max |y| folded in (publish_amax), for per-tensor FP8 scaling of y.
__global__ void rmsnorm_forward_kernel(bf16 *y, float *rstd, const bf16 *x, const bf16 *g, RowMap map,
                                       long long n_rows, float eps, const bf16 *delta, bf16 *res_out,
                                       unsigned *amax) {
    const long long row = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= n_rows) return;
    const int lane = threadIdx.x & 31, dim = map.dim;
    const long long off = row_offset(map, row);
    float ss = 0.0f;
    for (int cb = lane * 8; cb < dim; cb += 256)
        for (int e = 0; e < 8 && cb + e < dim; e++) {
            const int c = cb + e;
            float v;
            if (delta) {
                bf16 r = f2bf(bf2f(x[off + c]) + bf2f(delta[off + c]));
                res_out[off + c] = r;
                v = bf2f(r);
            } else {
                v = bf2f(x[off + c]);
            }
            ss += v * v;
        }
    ss = warp_sum(ss);
    const float r = lm_rstd(ss, dim, eps);
    if (lane == 0) rstd[row] = r;
    if (!y) return;  // rstd (and the residual) only: layers_fp8.cu's fused norm writes the output
    const bf16 *src = delta ? res_out : x;  // each lane reads back only what it wrote (or read) above
    unsigned m = 0;
    for (int cb = lane * 8; cb < dim; cb += 256)
        for (int e = 0; e < 8 && cb + e < dim; e++) {
            const int c = cb + e;
            const bf16 o = f2bf(lm_rms_out(bf2f(src[off + c]), r, bf2f(g[c])));
            y[off + c] = o;
            m = max(m, amax1(o));
        }
    if (amax) publish_amax(m, amax);
}

// The vectorized form: a warp per row, lane l holding its NV 16-byte chunks in registers (one
// read of x and delta, one write of res_out and y, all 16 bytes wide).
template <int NV>
__global__ void __launch_bounds__(ROW_BLOCK) rmsnorm_forward_vec_kernel(bf16 *y, float *rstd, const bf16 *x,
                                                                         const bf16 *g, RowMap map, long long n_rows,
                                                                         float eps, const bf16 *delta, bf16 *res_out,
                                                                         unsigned *amax) {
    const long long row = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= n_rows) return;
    const int lane = threadIdx.x & 31, dim = map.dim;
    const long long off = row_offset(map, row);
    Bf16x8 v[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int c = (k * 32 + lane) * 8;
        if (c < dim) {
            v[k].u = *(const uint4 *)(x + off + c);
            if (delta) {
                Bf16x8 dl;
                dl.u = *(const uint4 *)(delta + off + c);
#pragma unroll
                for (int e = 0; e < 8; e++) v[k].h[e] = f2bf(bf2f(v[k].h[e]) + bf2f(dl.h[e]));
                *(uint4 *)(res_out + off + c) = v[k].u;
            }
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++)
        if ((k * 32 + lane) * 8 < dim) {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float f = bf2f(v[k].h[e]);
                ss += f * f;
            }
        }
    ss = warp_sum(ss);
    const float r = lm_rstd(ss, dim, eps);
    if (lane == 0) rstd[row] = r;
    if (!y) return;  // rstd (and the residual) only
    unsigned m = 0;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int c = (k * 32 + lane) * 8;
        if (c < dim) {
            Bf16x8 gg, o;
            gg.u = *(const uint4 *)(g + c);
#pragma unroll
            for (int e = 0; e < 8; e++) o.h[e] = f2bf(lm_rms_out(bf2f(v[k].h[e]), r, bf2f(gg.h[e])));
            *(uint4 *)(y + off + c) = o.u;
            if (amax) m = max(m, amax8(o));
        }
    }
    if (amax) publish_amax(m, amax);
}

// dx = r * (dy*g - xhat * mean(dy*g*xhat)), one warp per row; dx may alias dy.
// The generic form (2-byte accesses): rows whose width or alignment rules out 16-byte vectors.
// amax (may be NULL): max |dx| as stored (after the accumulation) folded in.
__global__ void rmsnorm_backward_dx_kernel(bf16 *dx, const bf16 *dy, const bf16 *x, const bf16 *g,
                                           const float *rstd, RowMap map, long long n_rows, int accumulate,
                                           unsigned *amax) {
    const long long row = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= n_rows) return;
    const int lane = threadIdx.x & 31, dim = map.dim;
    const long long off = row_offset(map, row);
    const float r = rstd[row];
    float dot = 0.0f;
    for (int c = lane; c < dim; c += 32) dot += bf2f(dy[off + c]) * bf2f(g[c]) * (bf2f(x[off + c]) * r);
    const float mean = warp_sum(dot) / (float)dim;
    unsigned m = 0;
    for (int c = lane; c < dim; c += 32) {
        float d = r * (bf2f(dy[off + c]) * bf2f(g[c]) - bf2f(x[off + c]) * r * mean);
        if (accumulate) d += bf2f(dx[off + c]);
        const bf16 o = f2bf(d);
        dx[off + c] = o;
        m = max(m, amax1(o));
    }
    if (amax) publish_amax(m, amax);
}

// The vectorized form, dx and the gain gradient's partials in one pass: block k takes chunk k of
// the rows (gpu_norm_chunks), warp w its rows r0 + w, r0 + w + 8, ...; lane j holds the row's
// 16-byte chunks j, j + 32, ... (NV of them, 256 * NV >= dim) of dy and x in registers, so both are
// read once and a row's loads are all in flight together (the scalar form waits for each load: with
// dx aliasing dy the compiler cannot hoist a load above the previous store). It writes dx from them
// and adds dy * x * rstd into per-lane column sums, which the block's 8 warps then add up in warp
// order into partial row k: 8 bytes per element with accumulate, against 12 when the gain had its
// own pass (7% faster at C 1536 on one H200, measured 2026-11-30). The sums' order is fixed (rows
// of a warp in order, warps in order), so the result does not depend on timing; it is not the
// two-kernel order of the scalar shapes. dx may alias dy: a warp reads a whole row before it writes
// it. red: dim floats of shared memory (dynamic).
template <int NV>
__global__ void __launch_bounds__(ROW_BLOCK, NV <= 6 ? 2 : 1)  // NV 8, 12: 2 blocks per SM would spill
    rmsnorm_backward_fused_kernel(bf16 *dx, float *partial, const bf16 *dy, const bf16 *x, const bf16 *g,
                                  const float *rstd, RowMap map, long long n_rows, long long chunk_rows,
                                  int accumulate, unsigned *amax) {
    extern __shared__ float red[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, dim = map.dim;
    const long long r0 = (long long)blockIdx.x * chunk_rows, r1 = min(r0 + chunk_rows, n_rows);
    float ga[NV][8];
#pragma unroll
    for (int v = 0; v < NV; v++)
#pragma unroll
        for (int e = 0; e < 8; e++) ga[v][e] = 0.0f;
    unsigned m = 0;
    for (long long row = r0 + warp; row < r1; row += ROWS_PER_BLOCK) {
        const long long off = row_offset(map, row);
        const float r = rstd[row];
        Bf16x8 vdy[NV], vx[NV];
#pragma unroll
        for (int v = 0; v < NV; v++) {
            const int c = (v * 32 + lane) * 8;
            if (c < dim) {
                vdy[v].u = *(const uint4 *)(dy + off + c);
                vx[v].u = *(const uint4 *)(x + off + c);
            }
        }
        float dot = 0.0f;
#pragma unroll
        for (int v = 0; v < NV; v++) {
            const int c = (v * 32 + lane) * 8;
            if (c < dim) {
                Bf16x8 vg;
                vg.u = *(const uint4 *)(g + c);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float xh = bf2f(vx[v].h[e]) * r;
                    dot += bf2f(vdy[v].h[e]) * bf2f(vg.h[e]) * xh;
                    ga[v][e] += bf2f(vdy[v].h[e]) * xh;
                }
            }
        }
        const float mean = warp_sum(dot) / (float)dim;
#pragma unroll
        for (int v = 0; v < NV; v++) {
            const int c = (v * 32 + lane) * 8;
            if (c < dim) {
                Bf16x8 vg, out, old;
                vg.u = *(const uint4 *)(g + c);
                if (accumulate) old.u = *(const uint4 *)(dx + off + c);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    float d = r * (bf2f(vdy[v].h[e]) * bf2f(vg.h[e]) - bf2f(vx[v].h[e]) * r * mean);
                    if (accumulate) d += bf2f(old.h[e]);
                    out.h[e] = f2bf(d);
                }
                *(uint4 *)(dx + off + c) = out.u;
                if (amax) m = max(m, amax8(out));
            }
        }
    }
    if (amax) publish_amax(m, amax);
    // the block's column sums, warp 0 first, then each warp adds its own in turn
    for (int w = 0; w < ROWS_PER_BLOCK; w++) {
        if (warp == w)
#pragma unroll
            for (int v = 0; v < NV; v++) {
                const int c = (v * 32 + lane) * 8;
                if (c < dim)
#pragma unroll
                    for (int e = 0; e < 8; e++) red[c + e] = w == 0 ? ga[v][e] : red[c + e] + ga[v][e];
            }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < dim; c += ROW_BLOCK) partial[(long long)blockIdx.x * dim + c] = red[c];
}

// Gain gradient, pass 1: the rows are cut into n_chunks fixed chunks; thread (chunk, column)
// sums dy * xhat over its chunk in row order. Pass 2 adds the chunks in order (FP64).
__global__ void norm_gain_partial_kernel(float *partial, const bf16 *dy, const bf16 *x, const float *rstd,
                                         RowMap map, long long n_rows, long long chunk_rows) {
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= map.dim) return;
    const long long r0 = (long long)blockIdx.x * chunk_rows;
    const long long r1 = min(r0 + chunk_rows, n_rows);
    float acc = 0.0f;
    for (long long r = r0; r < r1; r++) {
        long long off = row_offset(map, r);
        acc += bf2f(dy[off + c]) * (bf2f(x[off + c]) * rstd[r]);
    }
    partial[(long long)blockIdx.x * map.dim + c] = acc;
}

// The same sums, 8 columns per thread with 16-byte loads, GAIN_ROWS rows' loads in flight at a
// time, and the row offsets stepped instead of divided: the additions are the scalar form's,
// in the same order (bitwise the same partials).
#define GAIN_ROWS 8
__global__ void norm_gain_partial_vec_kernel(float *partial, const bf16 *dy, const bf16 *x, const float *rstd,
                                             RowMap map, long long n_rows, long long chunk_rows) {
    const int c = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (c >= map.dim) return;
    const long long r0 = (long long)blockIdx.x * chunk_rows;
    const long long r1 = min(r0 + chunk_rows, n_rows);
    long long base = (r0 / map.group) * map.stride;  // offset of row r's group
    int in_group = (int)(r0 % map.group);           // r's index inside its group
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (long long r = r0; r < r1; r += GAIN_ROWS) {
        Bf16x8 vdy[GAIN_ROWS], vx[GAIN_ROWS];
        float rs[GAIN_ROWS];
#pragma unroll
        for (int j = 0; j < GAIN_ROWS; j++) {
            if (r + j < r1) {
                const long long off = base + (long long)in_group * map.dim + c;
                vdy[j].u = *(const uint4 *)(dy + off);
                vx[j].u = *(const uint4 *)(x + off);
                rs[j] = rstd[r + j];
                if (++in_group == map.group) {
                    in_group = 0;
                    base += map.stride;
                }
            }
        }
#pragma unroll
        for (int j = 0; j < GAIN_ROWS; j++)
            if (r + j < r1) {
#pragma unroll
                for (int e = 0; e < 8; e++) acc[e] += bf2f(vdy[j].h[e]) * (bf2f(vx[j].h[e]) * rs[j]);
            }
    }
    float *out = partial + (long long)blockIdx.x * map.dim + c;
    *(float4 *)out = make_float4(acc[0], acc[1], acc[2], acc[3]);
    *(float4 *)(out + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
}

// The chunks are added strictly in order (so the result does not depend on the launch), but
// their loads are issued GAIN_BATCH at a time: one thread per column has up to 1024 of them, and a
// loop that waited for each load before the next add took ~1 ms (one H200, 2026-11-30); batched,
// the additions are the same, in the same order, and the loads overlap.
#define GAIN_BATCH 32
__global__ void norm_gain_reduce_kernel(float *dg, const float *partial, int n_chunks, int dim) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= dim) return;
    double acc = 0.0;
    int k = 0;
    for (; k + GAIN_BATCH <= n_chunks; k += GAIN_BATCH) {
        float v[GAIN_BATCH];
#pragma unroll
        for (int j = 0; j < GAIN_BATCH; j++) v[j] = partial[(long long)(k + j) * dim + c];
#pragma unroll
        for (int j = 0; j < GAIN_BATCH; j++) acc += v[j];
    }
    for (; k < n_chunks; k++) acc += partial[(long long)k * dim + c];
    dg[c] += (float)acc;
}

// Whether rows of map at these pointers allow 16-byte accesses: widths and strides multiples of
// 8 elements, every base 16-byte aligned (a NULL pointer, an unused operand, passes).
static bool vec8_ok(RowMap map, const void *a, const void *b, const void *c, const void *d,
                    const void *e = NULL) {
    uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)e;
    return map.dim % 8 == 0 && map.stride % 8 == 0 && (bits & 15) == 0;
}

// The vectorized row kernels hold a row's NV 16-byte chunks per lane in registers, NV a template
// parameter: launch(std::integral_constant<int, NV>) with the smallest instantiated NV such that
// 256 * NV >= dim; false (nothing launched) past 3072 columns, where the scalar kernels run.
template <class Launch>
static bool with_row_chunks(int dim, Launch launch) {
    const int nv = (dim + 255) / 256;
    if (nv <= 1) launch(std::integral_constant<int, 1>());
    else if (nv <= 2) launch(std::integral_constant<int, 2>());
    else if (nv <= 4) launch(std::integral_constant<int, 4>());
    else if (nv <= 6) launch(std::integral_constant<int, 6>());
    else if (nv <= 8) launch(std::integral_constant<int, 8>());
    else if (nv <= 12) launch(std::integral_constant<int, 12>());
    else return false;
    return true;
}

// (The gain gradient partitions the rows with gpu_norm_chunks: at most 1024 chunks of >= 32 rows.)
static void rmsnorm_forward_launch(bf16 *y, float *rstd, const bf16 *x, const bf16 *g, RowMap map,
                                   long long n_rows, float eps, const bf16 *delta, bf16 *res_out,
                                   unsigned *amax, cudaStream_t stream) {
    const unsigned blocks = blocks_for((size_t)n_rows, ROWS_PER_BLOCK);
    const bool vec = vec8_ok(map, y, x, g, delta, res_out) &&
                     with_row_chunks(map.dim, [&](auto nv) {
                         rmsnorm_forward_vec_kernel<decltype(nv)::value><<<blocks, ROW_BLOCK, 0, stream>>>(
                             y, rstd, x, g, map, n_rows, eps, delta, res_out, amax);
                     });
    if (!vec)
        rmsnorm_forward_kernel<<<blocks, ROW_BLOCK, 0, stream>>>(y, rstd, x, g, map, n_rows, eps, delta, res_out, amax);
    CUDA_CHECK_LAUNCH();
}

// Gain gradient first (dx may alias dy), then dx.
static void rmsnorm_backward_launch(bf16 *dx, float *dg, float *scratch, const bf16 *dy, const bf16 *x,
                                    const bf16 *g, const float *rstd, RowMap map, long long n_rows,
                                    int accumulate, unsigned *amax, cudaStream_t stream) {
    int n_chunks;
    long long chunk_rows;
    gpu_norm_chunks(n_rows, &n_chunks, &chunk_rows);
    const bool vec = vec8_ok(map, dx, dy, x, g, scratch);
    const size_t red_bytes = sizeof(float) * (size_t)map.dim;
    if (vec && red_bytes <= 48 * 1024 &&
        with_row_chunks(map.dim, [&](auto nv) {
            rmsnorm_backward_fused_kernel<decltype(nv)::value><<<n_chunks, ROW_BLOCK, red_bytes, stream>>>(
                dx, scratch, dy, x, g, rstd, map, n_rows, chunk_rows, accumulate, amax);
        })) {
        CUDA_CHECK_LAUNCH();
        norm_gain_reduce_kernel<<<blocks_for(map.dim, 32), 32, 0, stream>>>(dg, scratch, n_chunks, map.dim);
        CUDA_CHECK_LAUNCH();
        return;
    }
    // past 3072 columns: the gain partials (8 columns per thread where the rows allow), then dx
    if (vec) {  // 8 columns per thread, 128 threads per block
        dim3 grid((unsigned)n_chunks, (unsigned)((map.dim + 1023) / 1024));
        norm_gain_partial_vec_kernel<<<grid, 128, 0, stream>>>(scratch, dy, x, rstd, map, n_rows, chunk_rows);
    } else {
        const int cols = map.dim < 256 ? ((map.dim + 31) / 32) * 32 : 256;
        dim3 grid((unsigned)n_chunks, (unsigned)((map.dim + cols - 1) / cols));
        norm_gain_partial_kernel<<<grid, cols, 0, stream>>>(scratch, dy, x, rstd, map, n_rows, chunk_rows);
    }
    CUDA_CHECK_LAUNCH();
    // 32 columns per block: dim / 32 blocks (64 for C = 2048) spread the columns over the SMs
    norm_gain_reduce_kernel<<<blocks_for(map.dim, 32), 32, 0, stream>>>(dg, scratch, n_chunks, map.dim);
    CUDA_CHECK_LAUNCH();
    const unsigned blocks = blocks_for((size_t)n_rows, ROWS_PER_BLOCK);
    rmsnorm_backward_dx_kernel<<<blocks, ROW_BLOCK, 0, stream>>>(dx, dy, x, g, rstd, map, n_rows, accumulate, amax);
    CUDA_CHECK_LAUNCH();
}

static RowMap plain_rows(int C) { RowMap m = {1, C, C}; return m; }

extern "C" void rmsnorm_forward_gpu(uint16_t *y, float *rstd, const uint16_t *x, const uint16_t *g, int N,
                                    int C, float eps, cudaStream_t stream) {
    rmsnorm_forward_amax_gpu(y, rstd, x, g, N, C, eps, NULL, stream);
}
extern "C" void rmsnorm_forward_amax_gpu(uint16_t *y, float *rstd, const uint16_t *x, const uint16_t *g, int N,
                                         int C, float eps, unsigned *amax_f32, cudaStream_t stream) {
    rmsnorm_forward_launch((bf16 *)y, rstd, (const bf16 *)x, (const bf16 *)g, plain_rows(C), N, eps, NULL,
                           NULL, amax_f32, stream);
}

extern "C" void residual_rmsnorm_forward_gpu(uint16_t *res_out, uint16_t *y, float *rstd,
                                             const uint16_t *res_in, const uint16_t *delta, const uint16_t *g,
                                             int N, int C, float eps, cudaStream_t stream) {
    residual_rmsnorm_forward_amax_gpu(res_out, y, rstd, res_in, delta, g, N, C, eps, NULL, stream);
}
extern "C" void residual_rmsnorm_forward_amax_gpu(uint16_t *res_out, uint16_t *y, float *rstd,
                                                  const uint16_t *res_in, const uint16_t *delta, const uint16_t *g,
                                                  int N, int C, float eps, unsigned *amax_f32, cudaStream_t stream) {
    rmsnorm_forward_launch((bf16 *)y, rstd, (const bf16 *)res_in, (const bf16 *)g, plain_rows(C), N, eps,
                           (const bf16 *)delta, (bf16 *)res_out, amax_f32, stream);
}

extern "C" size_t rmsnorm_backward_scratch_bytes(int N, int dim) { return gpu_norm_scratch_bytes(N, (size_t)dim); }

extern "C" void rmsnorm_backward_gpu(uint16_t *dx, float *dg, void *scratch, const uint16_t *dy,
                                     const uint16_t *x, const uint16_t *g, const float *rstd, int N, int C,
                                     int accumulate, cudaStream_t stream) {
    rmsnorm_backward_amax_gpu(dx, dg, scratch, dy, x, g, rstd, N, C, accumulate, NULL, stream);
}
extern "C" void rmsnorm_backward_amax_gpu(uint16_t *dx, float *dg, void *scratch, const uint16_t *dy,
                                          const uint16_t *x, const uint16_t *g, const float *rstd, int N, int C,
                                          int accumulate, unsigned *amax_f32, cudaStream_t stream) {
    rmsnorm_backward_launch((bf16 *)dx, dg, (float *)scratch, (const bf16 *)dy, (const bf16 *)x,
                            (const bf16 *)g, rstd, plain_rows(C), N, accumulate, amax_f32, stream);
}

__global__ void residual_add_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2bf(bf2f(a[i]) + bf2f(b[i]));
}

extern "C" void residual_add_gpu(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n,
                                 cudaStream_t stream) {
    residual_add_kernel<<<blocks_for(n, EW_BLOCK), EW_BLOCK, 0, stream>>>((bf16 *)out, (const bf16 *)a,
                                                                        (const bf16 *)b, n);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// QK-RMSNorm: the generic row kernels over the q heads, then the k heads, of (N, 3, H, hd).

// Copies the v part (N, H*hd) of a packed (N, 3, H, hd) buffer.
__global__ void copy_v_kernel(bf16 *dst, const bf16 *src, long long N, int Hhd) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * Hhd) return;
    long long off = (idx / Hhd) * 3 * Hhd + 2 * (long long)Hhd + idx % Hhd;
    dst[off] = src[off];
}

static void copy_v(bf16 *dst, const bf16 *src, int N, int H, int hd, cudaStream_t stream) {
    if (dst == src) return;
    copy_v_kernel<<<blocks_for((size_t)N * H * hd, EW_BLOCK), EW_BLOCK, 0, stream>>>(dst, src, N, H * hd);
    CUDA_CHECK_LAUNCH();
}

static RowMap head_rows(int H, int hd) { RowMap m = {H, 3LL * H * hd, hd}; return m; }

extern "C" void qk_rmsnorm_forward_gpu(uint16_t *qkv_out, float *rstd, const uint16_t *qkv_in,
                                       const uint16_t *q_gain, const uint16_t *k_gain, int N, int H, int hd,
                                       float eps, cudaStream_t stream) {
    const RowMap m = head_rows(H, hd);
    const long long rows = (long long)N * H, k_off = (long long)H * hd;
    bf16 *out = (bf16 *)qkv_out;
    const bf16 *in = (const bf16 *)qkv_in;
    rmsnorm_forward_launch(out, rstd, in, (const bf16 *)q_gain, m, rows, eps, NULL, NULL, NULL, stream);
    rmsnorm_forward_launch(out + k_off, rstd + rows, in + k_off, (const bf16 *)k_gain, m, rows, eps, NULL,
                           NULL, NULL, stream);
    copy_v(out, in, N, H, hd, stream);
}

extern "C" size_t qk_rmsnorm_backward_scratch_bytes(int N, int H, int hd) {
    return gpu_norm_scratch_bytes((long long)N * H, (size_t)hd);
}

extern "C" void qk_rmsnorm_backward_gpu(uint16_t *dqkv_in, float *dq_gain, float *dk_gain, void *scratch,
                                        const uint16_t *dqkv_out, const uint16_t *qkv_in,
                                        const uint16_t *q_gain, const uint16_t *k_gain, const float *rstd,
                                        int N, int H, int hd, cudaStream_t stream) {
    const RowMap m = head_rows(H, hd);
    const long long rows = (long long)N * H, k_off = (long long)H * hd;
    bf16 *dx = (bf16 *)dqkv_in;
    const bf16 *dy = (const bf16 *)dqkv_out, *x = (const bf16 *)qkv_in;
    // The k pass reuses the scratch after the q pass on the same stream: ordered.
    rmsnorm_backward_launch(dx, dq_gain, (float *)scratch, dy, x, (const bf16 *)q_gain, rstd, m, rows, 0,
                            NULL, stream);
    rmsnorm_backward_launch(dx + k_off, dk_gain, (float *)scratch, dy + k_off, x + k_off,
                            (const bf16 *)k_gain, rstd + rows, m, rows, 0, NULL, stream);
    copy_v(dx, dy, N, H, hd, stream);
}

// ---------------------------------------------------------------------------------------------
// RoPE

__global__ void rope_table_kernel(float *cos_sin, int T, int hd, double theta) {
    const int half = hd / 2;
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)T * half) return;
    const int t = (int)(idx / half), i = (int)(idx % half);
    const double angle = t * pow(theta, -2.0 * i / hd);
    cos_sin[idx * 2 + 0] = (float)cos(angle);
    cos_sin[idx * 2 + 1] = (float)sin(angle);
}

extern "C" void rope_table_gpu(float *cos_sin, int T, int hd, double theta, cudaStream_t stream) {
    rope_table_kernel<<<blocks_for((size_t)T * (hd / 2), EW_BLOCK), EW_BLOCK, 0, stream>>>(cos_sin, T, hd, theta);
    CUDA_CHECK_LAUNCH();
}

// One thread per pair (i, i + hd/2) of every q and k head.
__global__ void rope_kernel(bf16 *qkv, const float *cos_sin, long long n_pairs, int T, int H, int hd, float sign) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_pairs) return;
    const int half = hd / 2;
    const int i = (int)(idx % half);
    long long rest = idx / half;
    const int h = (int)(rest % H);
    rest /= H;
    const int part = (int)(rest % 2);  // 0: q, 1: k
    const long long token = rest / 2;  // b * T + t
    const int t = (int)(token % T);
    bf16 *p = qkv + token * 3 * H * hd + (long long)part * H * hd + (long long)h * hd;
    const float c = cos_sin[((long long)t * half + i) * 2], s = sign * cos_sin[((long long)t * half + i) * 2 + 1];
    const float a = bf2f(p[i]), b = bf2f(p[i + half]);
    p[i] = f2bf(lm_rope_lo(a, b, c, s));
    p[i + half] = f2bf(lm_rope_hi(a, b, c, s));
}

// Eight pairs per thread with 16-byte accesses (hd % 16 == 0, aligned): a block per token, the
// threads over (q or k, head, group of 8 pairs). Same element math as rope_kernel, without its
// chain of 64-bit divisions per pair (it ran at ~1.3 TB/s on one H200, measured 2026-11-30).
__global__ void rope_vec_kernel(bf16 *qkv, const float *cos_sin, int T, int H, int hd, float sign) {
    const long long token = blockIdx.x;  // b * T + t
    const int t = (int)(token % T), half = hd / 2, groups = half / 8;
    const float4 *cs_row = (const float4 *)(cos_sin + (size_t)t * half * 2);  // (cos, sin) pairs
    for (int w = threadIdx.x; w < 2 * H * groups; w += blockDim.x) {
        const int i0 = (w % groups) * 8, head = w / groups;  // head: 0..2H-1 = q heads, then k heads
        bf16 *p = qkv + token * 3 * H * hd + (long long)head * hd;
        Bf16x8 a, b;
        a.u = *(const uint4 *)(p + i0);
        b.u = *(const uint4 *)(p + i0 + half);
        float cs[16];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 v = cs_row[i0 / 2 + k];
            cs[4 * k] = v.x, cs[4 * k + 1] = v.y, cs[4 * k + 2] = v.z, cs[4 * k + 3] = v.w;
        }
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float c = cs[2 * e], sn = sign * cs[2 * e + 1], x = bf2f(a.h[e]), y = bf2f(b.h[e]);
            a.h[e] = f2bf(lm_rope_lo(x, y, c, sn));
            b.h[e] = f2bf(lm_rope_hi(x, y, c, sn));
        }
        *(uint4 *)(p + i0) = a.u;
        *(uint4 *)(p + i0 + half) = b.u;
    }
}

static void rope_launch(uint16_t *qkv, const float *cos_sin, int B, int T, int H, int hd, float sign,
                        cudaStream_t stream) {
    if (hd % 2) FATAL("RoPE needs an even head size, got %d (hint: the config validation missed it)", hd);
    if (hd % 16 == 0 && aligned16(qkv) && aligned16(cos_sin)) {
        const int work = 2 * H * (hd / 16);  // (q or k, head, group of 8 pairs) per token
        const int threads = work < 256 ? (work + 31) / 32 * 32 : 256;
        rope_vec_kernel<<<(unsigned)((long long)B * T), threads, 0, stream>>>((bf16 *)qkv, cos_sin, T, H, hd, sign);
        CUDA_CHECK_LAUNCH();
        return;
    }
    const long long n_pairs = (long long)B * T * 2 * H * (hd / 2);
    rope_kernel<<<blocks_for((size_t)n_pairs, EW_BLOCK), EW_BLOCK, 0, stream>>>((bf16 *)qkv, cos_sin, n_pairs,
                                                                              T, H, hd, sign);
    CUDA_CHECK_LAUNCH();
}

extern "C" void rope_forward_gpu(uint16_t *qkv, const float *cos_sin, int B, int T, int H, int hd,
                                 cudaStream_t stream) {
    rope_launch(qkv, cos_sin, B, T, H, hd, 1.0f, stream);
}
extern "C" void rope_backward_gpu(uint16_t *dqkv, const float *cos_sin, int B, int T, int H, int hd,
                                  cudaStream_t stream) {
    rope_launch(dqkv, cos_sin, B, T, H, hd, -1.0f, stream);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

// amax (may be NULL, here and in the kernels below): max |output| folded in (publish_amax).
__global__ void swiglu_forward_kernel(bf16 *out, const bf16 *fc, long long N, int F, unsigned *amax) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * F) return;
    const long long row = idx / F;
    const int j = (int)(idx % F);
    const float g = bf2f(fc[row * 2 * F + j]), u = bf2f(fc[row * 2 * F + F + j]);
    const bf16 o = f2bf(lm_swiglu(g, u));
    out[idx] = o;
    if (amax) publish_amax(amax1(o), amax);
}

// out = silu(g) * u: the gradients of layers_math.cuh's lm_swiglu_grad.
__global__ void swiglu_backward_kernel(bf16 *dfc, const bf16 *dout, const bf16 *fc, long long N, int F,
                                       unsigned *amax) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * F) return;
    const long long row = idx / F;
    const int j = (int)(idx % F);
    const float g = bf2f(fc[row * 2 * F + j]), u = bf2f(fc[row * 2 * F + F + j]), d = bf2f(dout[idx]);
    float dg, du;
    lm_swiglu_grad(g, u, d, dg, du);
    const bf16 bg = f2bf(dg), bu = f2bf(du);
    dfc[row * 2 * F + F + j] = bu;
    dfc[row * 2 * F + j] = bg;
    if (amax) publish_amax(max(amax1(bg), amax1(bu)), amax);
}

// The same element math, 8 consecutive columns per thread with 16-byte accesses (F % 8 == 0,
// aligned rows): one 32-bit division per 8 elements instead of a 64-bit one per element, which
// held the scalar kernels to ~1.5-2.3 TB/s (one H200, measured 2026-11-30).
__global__ void swiglu_forward_vec_kernel(bf16 *out, const bf16 *fc, unsigned n_vec, unsigned f8, unsigned *amax) {
    const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_vec) return;
    const unsigned row = idx / f8, j = (idx - row * f8) * 8, F = f8 * 8;
    const bf16 *fr = fc + (size_t)row * 2 * F;
    Bf16x8 g, u, o;
    g.u = *(const uint4 *)(fr + j);
    u.u = *(const uint4 *)(fr + F + j);
#pragma unroll
    for (int e = 0; e < 8; e++) o.h[e] = f2bf(lm_swiglu(bf2f(g.h[e]), bf2f(u.h[e])));
    *(uint4 *)(out + (size_t)row * F + j) = o.u;
    if (amax) publish_amax(amax8(o), amax);
}

__global__ void swiglu_backward_vec_kernel(bf16 *dfc, const bf16 *dout, const bf16 *fc, unsigned n_vec, unsigned f8,
                                           unsigned *amax) {
    const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_vec) return;
    const unsigned row = idx / f8, j = (idx - row * f8) * 8, F = f8 * 8;
    const bf16 *fr = fc + (size_t)row * 2 * F;
    Bf16x8 g, u, d, dg, du;
    g.u = *(const uint4 *)(fr + j);
    u.u = *(const uint4 *)(fr + F + j);
    d.u = *(const uint4 *)(dout + (size_t)row * F + j);
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float a, b;
        lm_swiglu_grad(bf2f(g.h[e]), bf2f(u.h[e]), bf2f(d.h[e]), a, b);
        dg.h[e] = f2bf(a);
        du.h[e] = f2bf(b);
    }
    bf16 *dr = dfc + (size_t)row * 2 * F;
    *(uint4 *)(dr + j) = dg.u;
    *(uint4 *)(dr + F + j) = du.u;
    if (amax) publish_amax(max(amax8(dg), amax8(du)), amax);
}

// The vectorized SwiGLU kernels apply: 8 | F, aligned bases, and N * F / 8 within 32 bits.
static bool swiglu_vec_ok(int N, int F, const void *a, const void *b, const void *c) {
    return F % 8 == 0 && aligned16(a) && aligned16(b) && aligned16(c) && (size_t)N * F / 8 < 0x7fffffffu;
}

extern "C" void swiglu_forward_gpu(uint16_t *out, const uint16_t *fc, int N, int F, cudaStream_t stream) {
    swiglu_forward_amax_gpu(out, fc, N, F, NULL, stream);
}
extern "C" void swiglu_forward_amax_gpu(uint16_t *out, const uint16_t *fc, int N, int F, unsigned *amax_f32,
                                        cudaStream_t stream) {
    if (swiglu_vec_ok(N, F, out, fc, fc)) {
        const unsigned n_vec = (unsigned)((size_t)N * F / 8);
        swiglu_forward_vec_kernel<<<blocks_for(n_vec, EW_BLOCK), EW_BLOCK, 0, stream>>>(
            (bf16 *)out, (const bf16 *)fc, n_vec, (unsigned)F / 8, amax_f32);
    } else {
        swiglu_forward_kernel<<<blocks_for((size_t)N * F, EW_BLOCK), EW_BLOCK, 0, stream>>>(
            (bf16 *)out, (const bf16 *)fc, N, F, amax_f32);
    }
    CUDA_CHECK_LAUNCH();
}
extern "C" void swiglu_backward_gpu(uint16_t *dfc, const uint16_t *dout, const uint16_t *fc, int N, int F,
                                    cudaStream_t stream) {
    swiglu_backward_amax_gpu(dfc, dout, fc, N, F, NULL, stream);
}
extern "C" void swiglu_backward_amax_gpu(uint16_t *dfc, const uint16_t *dout, const uint16_t *fc, int N, int F,
                                         unsigned *amax_f32, cudaStream_t stream) {
    if (swiglu_vec_ok(N, F, dfc, dout, fc)) {
        const unsigned n_vec = (unsigned)((size_t)N * F / 8);
        swiglu_backward_vec_kernel<<<blocks_for(n_vec, EW_BLOCK), EW_BLOCK, 0, stream>>>(
            (bf16 *)dfc, (const bf16 *)dout, (const bf16 *)fc, n_vec, (unsigned)F / 8, amax_f32);
    } else {
        swiglu_backward_kernel<<<blocks_for((size_t)N * F, EW_BLOCK), EW_BLOCK, 0, stream>>>(
            (bf16 *)dfc, (const bf16 *)dout, (const bf16 *)fc, N, F, amax_f32);
    }
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy: one block per row. Pass 1: per-thread online (max, sum of exp) over the real
// columns, merged across the block; pass 2 rewrites the row with the gradient. Every element is
// read and rewritten by the same thread, and the target logit is read before the first barrier,
// so the in-place overwrite never races with a read.

#define CE_BLOCK 512

struct MaxSum {
    float m, s;  // running max and sum of exp(x - m)
};
static __device__ __forceinline__ MaxSum maxsum_merge(MaxSum a, MaxSum b) {
    if (a.m == -INFINITY) return b;
    if (b.m == -INFINITY) return a;
    float m = fmaxf(a.m, b.m);
    MaxSum r = {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
    return r;
}

__global__ void __launch_bounds__(CE_BLOCK) cross_entropy_kernel(bf16 *logits, float *loss, const int32_t *targets,
                                                                 int V, int Vp, float grad_scale) {
    __shared__ MaxSum warp_part[CE_BLOCK / 32];
    __shared__ MaxSum row_total;
    const long long row = blockIdx.x;
    bf16 *x = logits + row * Vp;
    const int tgt = targets[row];
    if (tgt < 0) {  // ignored row (uniform over the block)
        if (threadIdx.x == 0) loss[row] = 0.0f;
        if (grad_scale != 0.0f)
            for (int j = threadIdx.x; j < Vp; j += blockDim.x) x[j] = f2bf(0.0f);
        return;
    }
    const float target_logit = tgt < V ? bf2f(x[tgt]) : NAN;
    MaxSum ms = {-INFINITY, 0.0f};
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = bf2f(x[j]);
        if (v > ms.m) {
            ms.s = ms.s * expf(ms.m - v) + 1.0f;  // exp(-inf) = 0 on the first element
            ms.m = v;
        } else {
            ms.s += expf(v - ms.m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum other = {__shfl_xor_sync(0xffffffffu, ms.m, o), __shfl_xor_sync(0xffffffffu, ms.s, o)};
        ms = maxsum_merge(ms, other);
    }
    if ((threadIdx.x & 31) == 0) warp_part[threadIdx.x / 32] = ms;
    __syncthreads();
    if (threadIdx.x == 0) {
        MaxSum t = warp_part[0];
        for (int w = 1; w < (int)(blockDim.x / 32); w++) t = maxsum_merge(t, warp_part[w]);
        row_total = t;
        loss[row] = logf(t.s) + t.m - target_logit;  // NaN when the target is >= V
    }
    __syncthreads();
    if (grad_scale == 0.0f) return;
    const float mx = row_total.m, scale = grad_scale / row_total.s;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float p = expf(bf2f(x[j]) - mx) * scale;
        x[j] = f2bf(j == tgt ? p - grad_scale : p);
    }
    for (int j = V + threadIdx.x; j < Vp; j += blockDim.x) x[j] = f2bf(0.0f);
}

// The row in registers (Vp % 8 == 0, 16-byte aligned rows, Vp <= 8 * CE_VEC_BLOCK * NV): one block
// per row, thread t keeps the row's 8-element chunks t, t + CE_VEC_BLOCK, ... (at most NV) in
// registers from its one 16-byte load each, so the row is read from memory once and written once
// (the kernel above reads it twice, 2 bytes at a time: ~0.9 TB/s). The max, then the sum of
// 2^(x log2(e) - max log2(e)) (ex2.approx: ~2 ulp, against expf's 1), each over the block with a
// fixed butterfly and a fixed order across warps, so the result does not depend on timing.
#define CE_VEC_BLOCK 512
#define CE_VEC_WARPS (CE_VEC_BLOCK / 32)

#define CE_NEG_INF2 0xff80ff80u  // two BF16 -inf

static __device__ __forceinline__ __nv_bfloat162 ce_bf2(uint32_t w) { return *reinterpret_cast<__nv_bfloat162 *>(&w); }
// Elements 2k and 2k + 1 of a BF16 pair as floats: lm_bits2f's values, in one shift or mask each
// (through lm_bits2f the compiler emits a shift pair for the high half: ~4% more instructions)
static __device__ __forceinline__ float ce_lo(uint32_t w) { return __uint_as_float(w << 16); }
static __device__ __forceinline__ float ce_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
// Element 2k + hi of w set to BF16 -inf.
static __device__ __forceinline__ uint32_t ce_neg_inf(uint32_t w, int hi) {
    return hi ? (w & 0xffffu) | 0xff800000u : (w & 0xffff0000u) | 0xff80u;
}
// The row's words are "changed" here as far as the compiler knows: it recomputes from them
// instead of keeping an earlier pass's per-element values alive.
template <int NV>
static __device__ __forceinline__ void ce_fence(uint32_t (&w)[NV][4]) {
#pragma unroll
    for (int i = 0; i < NV; i++) asm volatile("" : "+r"(w[i][0]), "+r"(w[i][1]), "+r"(w[i][2]), "+r"(w[i][3]));
}
// The block's max (IS_MAX) or sum of v; part: CE_VEC_WARPS floats of shared memory used by this
// reduction only (so no barrier is needed before the next one).
template <bool IS_MAX>
static __device__ __forceinline__ float ce_block_reduce(float v, float *part) {
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = IS_MAX ? fmaxf(v, w) : v + w;
    }
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    float r = part[0];
#pragma unroll
    for (int w = 1; w < CE_VEC_WARPS; w++) r = IS_MAX ? fmaxf(r, part[w]) : r + part[w];
    return r;
}

// CODES: the gradient goes out as per-tensor FP8 codes (FMT) instead, codes (rows, Vp), each
// the code of the BF16 value the row would hold, with the scale of the amax grad_scale (the
// bound of |dlogits|: cross_entropy_fp8_gpu); the logits are left as they were.
template <int NV, bool CODES = false, Fp8Format FMT = FP8_E4M3>
__global__ void __launch_bounds__(CE_VEC_BLOCK, NV <= 13 ? 2 : 1)
    cross_entropy_vec_kernel(bf16 *logits, float *loss, const int32_t *targets, int V, int Vp, float grad_scale,
                             uint8_t *codes = nullptr) {
    __shared__ float part_max[CE_VEC_WARPS], part_sum[CE_VEC_WARPS];
    constexpr float LOG2E = 1.4426950408889634f;
    const long long row = blockIdx.x;
    bf16 *x = logits + row * Vp;
    uint4 *xv = reinterpret_cast<uint4 *>(x);
    const int tgt = targets[row], nvec = Vp / 8, t = threadIdx.x;
    uint2 *cv = CODES ? reinterpret_cast<uint2 *>(codes + row * Vp) : nullptr;  // 8 codes per chunk
    if (tgt < 0) {  // ignored row (uniform over the block)
        if (t == 0) loss[row] = 0.0f;
        if (grad_scale != 0.0f)
            for (int c = t; c < nvec; c += CE_VEC_BLOCK) {
                if (CODES) cv[c] = make_uint2(0u, 0u);
                else xv[c] = make_uint4(0u, 0u, 0u, 0u);
            }
        return;
    }
    // read before the first barrier; every write of the row comes after the second
    const float target_logit = t == 0 && tgt < V ? bf2f(x[tgt]) : NAN;
    // The columns past V (padding, and chunks past the row) become -inf in registers: they add
    // nothing to the max or the sum, and their gradient, 2^-inf * scale, is +0. The row stays
    // packed (4 words of two BF16 per chunk): the max is taken on BF16 pairs (exact), and each
    // pass unpacks what it needs, behind ce_fence so that the compiler does not keep 8 NV floats
    // alive across a barrier.
    uint32_t w[NV][4];
    // the target's chunk and element (none past V: padded columns stay 0 whatever the target)
    const int tc = tgt < V ? tgt / 8 : -1, te = tgt % 8;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = t + i * CE_VEC_BLOCK;
        const uint4 u = c < nvec ? xv[c] : make_uint4(CE_NEG_INF2, CE_NEG_INF2, CE_NEG_INF2, CE_NEG_INF2);
        w[i][0] = u.x, w[i][1] = u.y, w[i][2] = u.z, w[i][3] = u.w;
        if (8 * c + 8 > V)
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (8 * c + e >= V) w[i][e / 2] = ce_neg_inf(w[i][e / 2], e & 1);
    }
    __nv_bfloat162 m2 = ce_bf2(CE_NEG_INF2);
#pragma unroll
    for (int i = 0; i < NV; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) m2 = __hmax2(m2, ce_bf2(w[i][k]));
    float mx = fmaxf(__low2float(m2), __high2float(m2));
    mx = ce_block_reduce<true>(mx, part_max);
    const float mb = mx * LOG2E;
    float s = 0.0f;
    ce_fence(w);
#pragma unroll
    for (int i = 0; i < NV; i++)
#pragma unroll
        for (int k = 0; k < 4; k++)
            s += fast_exp2(fmaf(ce_lo(w[i][k]), LOG2E, -mb)) + fast_exp2(fmaf(ce_hi(w[i][k]), LOG2E, -mb));
    s = ce_block_reduce<false>(s, part_sum);
    if (t == 0) loss[row] = logf(s) + mx - target_logit;  // NaN when the target is >= V
    if (grad_scale == 0.0f) return;
    const float scale = grad_scale / s;
    const float code_scale = CODES ? fp8_scale_for_amax(FMT, grad_scale) : 1.0f;
    unsigned sat = 0, nan = 0;  // (not counted: the model passes no counters)
    ce_fence(w);
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = t + i * CE_VEC_BLOCK;
        if (c < nvec) {
            uint32_t g[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float lo = fast_exp2(fmaf(ce_lo(w[i][k]), LOG2E, -mb)) * scale;
                float hi = fast_exp2(fmaf(ce_hi(w[i][k]), LOG2E, -mb)) * scale;
                if (c == tc && te == 2 * k) lo -= grad_scale;
                if (c == tc && te == 2 * k + 1) hi -= grad_scale;
                const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
                g[k] = *reinterpret_cast<const uint32_t *>(&h);
            }
            if (CODES) cv[c] = quant8<FMT>(g, code_scale, sat, nan);
            else xv[c] = make_uint4(g[0], g[1], g[2], g[3]);
        }
    }
}

// The vectorized kernel's chunks per thread for Vp columns (0: the row does not fit it).
static int ce_vec_chunks(int Vp, const void *logits) {
    const int per = (Vp / 8 + CE_VEC_BLOCK - 1) / CE_VEC_BLOCK;
    return Vp % 8 != 0 || !aligned16(logits) || per > 16 ? 0 : per <= 4 ? 4 : per <= 8 ? 8 : per <= 13 ? 13 : 16;
}

extern "C" int cross_entropy_fp8_supported(int Vp, const void *logits, const void *codes) {
    return ce_vec_chunks(Vp, logits) > 0 && ((uintptr_t)codes & 7) == 0;
}

template <bool CODES, Fp8Format FMT>
static void launch_ce_vec(int nv, bf16 *lg, float *loss, const int32_t *targets, int N, int V, int Vp,
                          float grad_scale, uint8_t *codes, cudaStream_t stream) {
    switch (nv) {
    case 4: cross_entropy_vec_kernel<4, CODES, FMT><<<N, CE_VEC_BLOCK, 0, stream>>>(lg, loss, targets, V, Vp, grad_scale, codes); break;
    case 8: cross_entropy_vec_kernel<8, CODES, FMT><<<N, CE_VEC_BLOCK, 0, stream>>>(lg, loss, targets, V, Vp, grad_scale, codes); break;
    case 13: cross_entropy_vec_kernel<13, CODES, FMT><<<N, CE_VEC_BLOCK, 0, stream>>>(lg, loss, targets, V, Vp, grad_scale, codes); break;
    default: cross_entropy_vec_kernel<16, CODES, FMT><<<N, CE_VEC_BLOCK, 0, stream>>>(lg, loss, targets, V, Vp, grad_scale, codes); break;
    }
    CUDA_CHECK_LAUNCH();
}

extern "C" void cross_entropy_fp8_gpu(const uint16_t *logits, float *loss, const int32_t *targets, int N, int V,
                                      int Vp, float grad_scale, uint8_t *codes, Fp8Format fmt, cudaStream_t stream) {
    if (V <= 0 || V > Vp) FATAL("cross-entropy over %d real of %d columns (hint: need 0 < V <= Vp)", V, Vp);
    if (!cross_entropy_fp8_supported(Vp, logits, codes) || grad_scale == 0.0f)
        FATAL("cross_entropy_fp8_gpu: needs Vp %% 8 == 0 (got %d), Vp <= %d, 16-byte aligned logits, 8-byte aligned "
              "codes and a gradient (grad_scale %g) (hint: cross_entropy_fp8_supported)", Vp, 8 * CE_VEC_BLOCK * 16,
              (double)grad_scale);
    if (N == 0) return;
    bf16 *lg = (bf16 *)logits;  // (read only: CODES writes codes, not the row)
    const int nv = ce_vec_chunks(Vp, logits);
    if (fmt == FP8_E4M3) launch_ce_vec<true, FP8_E4M3>(nv, lg, loss, targets, N, V, Vp, grad_scale, codes, stream);
    else launch_ce_vec<true, FP8_E5M2>(nv, lg, loss, targets, N, V, Vp, grad_scale, codes, stream);
}

extern "C" void cross_entropy_gpu(uint16_t *logits, float *loss, const int32_t *targets, int N, int V, int Vp,
                                  float grad_scale, cudaStream_t stream) {
    if (V <= 0 || V > Vp) FATAL("cross-entropy over %d real of %d columns (hint: need 0 < V <= Vp)", V, Vp);
    if (N == 0) return;
    // chunks per thread of the vectorized kernel; 13 covers the GPT-2 vocabulary (Vp 50304: 12.3)
    // within 64 registers, two blocks per SM. Rows it cannot hold (Vp % 8, unaligned, Vp > 65536)
    // take the scalar kernel.
    bf16 *lg = (bf16 *)logits;
    const int nv = ce_vec_chunks(Vp, logits);
    if (nv == 0) {
        cross_entropy_kernel<<<N, CE_BLOCK, 0, stream>>>(lg, loss, targets, V, Vp, grad_scale);
        CUDA_CHECK_LAUNCH();
        return;
    }
    launch_ce_vec<false, FP8_E4M3>(nv, lg, loss, targets, N, V, Vp, grad_scale, NULL, stream);
}

// ---------------------------------------------------------------------------------------------
// Gradient norm: GRAD_NORM_PARTIALS blocks, each a grid-stride FP64 sum and a fixed tree; one
// block adds the partials in a fixed tree.

#define NORM_BLOCK 256

__global__ void __launch_bounds__(NORM_BLOCK) sumsq_partial_kernel(double *partials, const float *g, size_t n) {
    __shared__ double sh[NORM_BLOCK];
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * NORM_BLOCK + threadIdx.x; i < n; i += (size_t)gridDim.x * NORM_BLOCK) {
        double v = g[i];
        acc += v * v;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = NORM_BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

__global__ void __launch_bounds__(GRAD_NORM_PARTIALS) sumsq_final_kernel(double *out, const double *partials) {
    __shared__ double sh[GRAD_NORM_PARTIALS];
    sh[threadIdx.x] = partials[threadIdx.x];
    __syncthreads();
    for (int s = GRAD_NORM_PARTIALS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sh[0];
}

extern "C" void grad_norm_squared_gpu(double *sumsq_out, double *partials, const float *g, size_t n,
                                      cudaStream_t stream) {
    sumsq_partial_kernel<<<GRAD_NORM_PARTIALS, NORM_BLOCK, 0, stream>>>(partials, g, n);
    CUDA_CHECK_LAUNCH();
    sumsq_final_kernel<<<1, GRAD_NORM_PARTIALS, 0, stream>>>(sumsq_out, partials);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Casts

__global__ void cast_f32_to_bf16_kernel(bf16 *out, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2bf(in[i]);
}
__global__ void cast_bf16_to_f32_kernel(float *out, const bf16 *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf2f(in[i]);
}

extern "C" void cast_f32_to_bf16_gpu(uint16_t *out, const float *in, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    cast_f32_to_bf16_kernel<<<blocks_for(n, EW_BLOCK), EW_BLOCK, 0, stream>>>((bf16 *)out, in, n);
    CUDA_CHECK_LAUNCH();
}
extern "C" void cast_bf16_to_f32_gpu(float *out, const uint16_t *in, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    cast_bf16_to_f32_kernel<<<blocks_for(n, EW_BLOCK), EW_BLOCK, 0, stream>>>(out, (const bf16 *)in, n);
    CUDA_CHECK_LAUNCH();
}
