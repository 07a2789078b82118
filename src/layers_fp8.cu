// layers_fp8.cu: RMSNorm, SwiGLU and the SwiGLU backward writing the 1x128 FP8 codes of their
// output both ways (see layers_fp8.h for the contracts and why tiles of 128 tokens).
//
// Every kernel fills a 128 x 128 BF16 tile of its output in shared memory with layers_math.cuh's
// arithmetic (so the values are layers.cu's, bit for bit), writes the BF16 tile to global memory
// when asked, and hands the tile to fp8_quant.cuh's vec128_emit, the code vec128both_kernel runs
// on a loaded tile (so the codes and scales are fp8_quantize_gpu's, bit for bit).
//
// Bytes per output element (BF16 2 B, codes 1 B per layout), fused against layer + vec128both:
//   SwiGLU forward   reads fc 4, writes out 2 + codes 2        (unfused: 4 + 2, then 2 + 2)
//   SwiGLU backward  reads fc, dout 3 (each read by the gate tile and the up tile: the second read
//                    mostly from L2), writes dfc 2 + codes 2   (unfused: 3 + 2, then 2 + 2)
//   RMSNorm + res.   reads x, delta 4, writes res 2, re-reads res 2 (L2 when it fits), writes
//                    y 2 + codes 2                             (unfused: 4 + 2 + 2, then 2 + 2)
// and the BF16 output's 2 B go too when the caller passes NULL for it (the model does, when the
// codes are all the next GEMMs read). Row-local Q(y) alone would save nothing in training: a
// separate Q(y^T) pass would still re-read y.
#include "layers_fp8.h"

#include <cuda_bf16.h>     // __nv_bfloat16
#include <cuda_runtime.h>  // launches
#include <stdint.h>        // uintptr_t

#include "common.h"           // FATAL
#include "cuda_check.h"       // CUDA_CHECK_LAUNCH
#include "fp8_quant.cuh"      // Vec128Smem, vec128_emit, load8 (shared with linear_fp8_gpu.cu)
#include "layers_math.cuh"    // the RMSNorm / SwiGLU arithmetic (shared with layers.cu)

typedef __nv_bfloat16 bf16;

#define G FQ_G          // 128
#define TILE_THREADS 256  // SwiGLU kernels: a CTA per 128 x 128 output tile
#define NORM_THREADS 512  // RMSNorm: a CTA per 128 rows (only N / 128 CTAs: more warps each)
#define NORM_CHUNKS 2     // pass 1: 8-element chunks whose loads a lane issues before adding them

// Element e of eight BF16 packed in w[4] (element 0 in the low half of w[0]).
static __device__ __forceinline__ unsigned short half_of(const uint32_t w[4], int e) {
    return (unsigned short)(w[e >> 1] >> (16 * (e & 1)));
}

// Eight BF16 (w) to dst at columns [c, c + 8) of a group with nc valid columns: one 16-byte store
// when allowed, else element by element.
static __device__ __forceinline__ void store8(uint16_t *dst, const uint32_t w[4], int c, int nc, bool vec) {
    if (vec && c + 8 <= nc) {
        *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
        return;
    }
    for (int e = 0; e < 8 && c + e < nc; e++) dst[e] = half_of(w, e);
}
static __device__ __forceinline__ void tile_put8(uint16_t *dst, const uint32_t w[4]) {
    uint32_t *d = reinterpret_cast<uint32_t *>(dst);  // 4-byte aligned (pitch and c even)
    d[0] = w[0]; d[1] = w[1]; d[2] = w[2]; d[3] = w[3];
}

// --- RMSNorm -------------------------------------------------------------------------------------
// CTA = rows [r0, r0 + 128). Pass 1 (a warp per row): as rmsnorm_forward_kernel, lane j adds the
// squares of its 8-element chunks j, j + 32, ... in that order, then the butterfly, so rstd is the
// same float; the loads of NORM_CHUNKS chunks are issued before their adds (only 128 CTAs run:
// they need the memory-level parallelism). Pass 2: per 128 columns, y of the tile from the residual (or x), the
// gains and rstd, then vec128_emit.
template <Fp8Format FMT>
__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_fp8_kernel(bf16 *res_out, uint16_t *y, float *rstd, const bf16 *x, const bf16 *delta, const bf16 *g,
                       int N, int C, float eps, uint8_t *q, float *q_scales, uint8_t *qt, float *qt_scales) {
    __shared__ __align__(16) Vec128Smem<NORM_THREADS> sm;
    __shared__ float row_rstd[G];
    const int r0 = blockIdx.x * G, nr = min(G, N - r0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = warp; r < nr; r += NORM_THREADS / 32) {
        const size_t off = (size_t)(r0 + r) * C;
        float ss = 0.0f;
        // element 8 * lane + 256 v + e, v = 0, 1, ..., e = 0..7: rmsnorm_forward_kernel's order
        for (int cb = lane * 8; cb < C; cb += 256 * NORM_CHUNKS) {
            bf16 a[NORM_CHUNKS][8], b[NORM_CHUNKS][8];
#pragma unroll
            for (int k = 0; k < NORM_CHUNKS; k++)
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const int c = cb + 256 * k + e;
                    if (c < C) {
                        a[k][e] = x[off + c];
                        if (delta) b[k][e] = delta[off + c];
                    }
                }
#pragma unroll
            for (int k = 0; k < NORM_CHUNKS; k++)
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const int c = cb + 256 * k + e;
                    if (c < C) {
                        float v;
                        if (delta) {
                            const bf16 s = lm_f2bf(lm_bf2f(a[k][e]) + lm_bf2f(b[k][e]));
                            res_out[off + c] = s;
                            v = lm_bf2f(s);
                        } else {
                            v = lm_bf2f(a[k][e]);
                        }
                        ss += v * v;
                    }
                }
        }
        ss = lm_warp_sum(ss);
        const float rr = lm_rstd(ss, C, eps);
        if (lane == 0) {
            rstd[r0 + r] = rr;
            row_rstd[r] = rr;
        }
    }
    __syncthreads();  // row_rstd, and the residual rows this CTA wrote, are visible to all its threads
    // The residual is read back with plain loads (not the read-only path): this kernel wrote it.
    const uint16_t *src = reinterpret_cast<const uint16_t *>(delta ? res_out : x);
    const uint16_t *gb = reinterpret_cast<const uint16_t *>(g);
    const bool vec = C % 8 == 0 && aligned16(src) && aligned16(gb) && (!y || aligned16(y));
    for (int c0 = 0; c0 < C; c0 += G) {
        const int nc = min(G, C - c0);
        for (int id = threadIdx.x; id < G * G / 8; id += NORM_THREADS) {
            const int r = id / 16, c = (id % 16) * 8;
            uint32_t w[4] = {0, 0, 0, 0};
            if (r < nr) {
                uint32_t xs[4], gs[4];
                load8(xs, src + (size_t)(r0 + r) * C + c0 + c, c, nc, vec);
                load8(gs, gb + c0 + c, c, nc, vec);
                const float rr = row_rstd[r];
#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (c + e < nc)
                        w[e >> 1] |= (uint32_t)lm_f2bits(lm_rms_out(lm_bits2f(half_of(xs, e)), rr, lm_bits2f(half_of(gs, e))))
                                     << (16 * (e & 1));
                if (y) store8(y + (size_t)(r0 + r) * C + c0 + c, w, c, nc, vec);
            }
            tile_put8(&sm.tile[r][c], w);  // zeros outside y: they never win an amax
        }
        __syncthreads();
        vec128_emit<FMT, NORM_THREADS>(sm, r0, c0, nr, nc, N, C, q, q_scales, qt, qt_scales, nullptr);
        __syncthreads();  // the tile is refilled for the next columns
    }
}

// --- SwiGLU forward ------------------------------------------------------------------------------
// CTA = output tile (rows blockIdx.y * 128.., columns blockIdx.x * 128.. of out (N, F)).
template <Fp8Format FMT>
__global__ void __launch_bounds__(TILE_THREADS)
    swiglu_fp8_kernel(uint16_t *out, const uint16_t *fc, int N, int F, uint8_t *q, float *q_scales, uint8_t *qt,
                      float *qt_scales) {
    __shared__ __align__(16) Vec128Smem<TILE_THREADS> sm;
    const int r0 = blockIdx.y * G, c0 = blockIdx.x * G;
    const int nr = min(G, N - r0), nc = min(G, F - c0);
    const bool vec = F % 8 == 0 && aligned16(fc) && (!out || aligned16(out));
    for (int id = threadIdx.x; id < G * G / 8; id += TILE_THREADS) {
        const int r = id / 16, c = (id % 16) * 8;
        uint32_t w[4] = {0, 0, 0, 0};
        if (r < nr) {
            const uint16_t *row = fc + (size_t)(r0 + r) * 2 * F + c0 + c;  // gate; up is F further
            uint32_t gw[4], uw[4];
            load8(gw, row, c, nc, vec);
            load8(uw, row + F, c, nc, vec);
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (c + e < nc)
                    w[e >> 1] |= (uint32_t)lm_f2bits(lm_swiglu(lm_bits2f(half_of(gw, e)), lm_bits2f(half_of(uw, e))))
                                 << (16 * (e & 1));
            if (out) store8(out + (size_t)(r0 + r) * F + c0 + c, w, c, nc, vec);
        }
        tile_put8(&sm.tile[r][c], w);
    }
    __syncthreads();
    vec128_emit<FMT, TILE_THREADS>(sm, r0, c0, nr, nc, N, F, q, q_scales, qt, qt_scales, nullptr);
}

// --- SwiGLU backward -----------------------------------------------------------------------------
// CTA = output tile of dfc (N, 2F): columns < F are the gate's gradient, the rest the up's. Eight
// consecutive columns never straddle F (F % 8 == 0), so each group of eight reads eight
// consecutive gate, up and dout values. Grid x walks the 2F columns, so the gate tile and the up
// tile of the same inputs run close together and the second read of fc and dout hits L2.
template <Fp8Format FMT>
__global__ void __launch_bounds__(TILE_THREADS)
    swiglu_bwd_fp8_kernel(uint16_t *dfc, const uint16_t *dout, const uint16_t *fc, int N, int F, uint8_t *q,
                          float *q_scales, uint8_t *qt, float *qt_scales) {
    __shared__ __align__(16) Vec128Smem<TILE_THREADS> sm;
    const int W2 = 2 * F;
    const int r0 = blockIdx.y * G, c0 = blockIdx.x * G;
    const int nr = min(G, N - r0), nc = min(G, W2 - c0);
    const bool vec = aligned16(fc) && aligned16(dout) && (!dfc || aligned16(dfc));  // F % 8 == 0 (launcher)
    for (int id = threadIdx.x; id < G * G / 8; id += TILE_THREADS) {
        const int r = id / 16, c = (id % 16) * 8;
        uint32_t w[4] = {0, 0, 0, 0};
        if (r < nr) {
            const int cc = c0 + c;  // column of dfc
            const bool gate = cc < F;
            const int j = gate ? cc : cc - F;  // column of gate, up and dout
            const size_t row = (size_t)(r0 + r);
            uint32_t gw[4], uw[4], dw[4];
            load8(gw, fc + row * W2 + j, c, nc, vec);
            load8(uw, fc + row * W2 + F + j, c, nc, vec);
            load8(dw, dout + row * F + j, c, nc, vec);
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (c + e < nc) {
                    float dg, du;
                    lm_swiglu_grad(lm_bits2f(half_of(gw, e)), lm_bits2f(half_of(uw, e)), lm_bits2f(half_of(dw, e)), dg,
                                   du);
                    w[e >> 1] |= (uint32_t)lm_f2bits(gate ? dg : du) << (16 * (e & 1));
                }
            if (dfc) store8(dfc + row * W2 + cc, w, c, nc, vec);
        }
        tile_put8(&sm.tile[r][c], w);
    }
    __syncthreads();
    vec128_emit<FMT, TILE_THREADS>(sm, r0, c0, nr, nc, N, W2, q, q_scales, qt, qt_scales, nullptr);
}

// --- launchers -----------------------------------------------------------------------------------

// q must be a 1x128 operand (rows, cols); qt NULL or its transpose in the same format.
static void check_operands(const char *who, const Fp8Operand *q, const Fp8Operand *qt, int rows, int cols) {
    if (!q || !q->codes || !q->scales) FATAL("%s: q has no buffers (it is required)", who);
    if (q->grouping != FP8_GROUP_1x128 || q->rows != rows || q->cols != cols)
        FATAL("%s: q is (%d, %d) grouping %d, expected (%d, %d) 1x128", who, q->rows, q->cols, (int)q->grouping, rows,
              cols);
    if (qt && (!qt->codes || !qt->scales || qt->grouping != FP8_GROUP_1x128 || qt->rows != cols || qt->cols != rows ||
               qt->fmt != q->fmt))
        FATAL("%s: qt is (%d, %d) grouping %d format %d, expected (%d, %d) 1x128 format %d", who, qt->rows, qt->cols,
              (int)qt->grouping, (int)qt->fmt, cols, rows, (int)q->fmt);
    if (rows <= 0 || cols <= 0) FATAL("%s: empty shape (%d, %d)", who, rows, cols);
}

// Launches kernel<E4M3 or E5M2> on `stream` with `threads`, then checks the launch.
#define LAUNCH_FMT(fmt, kernel, grid, threads, ...)                                                 \
    do {                                                                                            \
        if ((fmt) == FP8_E4M3) kernel<FP8_E4M3><<<(grid), (threads), 0, stream>>>(__VA_ARGS__);     \
        else kernel<FP8_E5M2><<<(grid), (threads), 0, stream>>>(__VA_ARGS__);                       \
        CUDA_CHECK_LAUNCH();                                                                        \
    } while (0)

extern "C" void rmsnorm_forward_fp8_gpu(uint16_t *res_out, uint16_t *y, float *rstd, const uint16_t *x,
                                        const uint16_t *delta, const uint16_t *g, int N, int C, float eps,
                                        const Fp8Operand *q, const Fp8Operand *qt, cudaStream_t stream) {
    check_operands("rmsnorm_forward_fp8_gpu", q, qt, N, C);
    if (delta && !res_out) FATAL("rmsnorm_forward_fp8_gpu: a residual add needs res_out");
    const unsigned blocks = (unsigned)((N + G - 1) / G);
    LAUNCH_FMT(q->fmt, rmsnorm_fp8_kernel, blocks, NORM_THREADS, (bf16 *)res_out, y, rstd, (const bf16 *)x,
               (const bf16 *)delta, (const bf16 *)g, N, C, eps, q->codes, q->scales, qt ? qt->codes : NULL,
               qt ? qt->scales : NULL);
}

extern "C" void swiglu_forward_fp8_gpu(uint16_t *out, const uint16_t *fc, int N, int F, const Fp8Operand *q,
                                       const Fp8Operand *qt, cudaStream_t stream) {
    check_operands("swiglu_forward_fp8_gpu", q, qt, N, F);
    if (F % 8) FATAL("swiglu_forward_fp8_gpu: F = %d is not a multiple of 8", F);
    const dim3 grid((unsigned)((F + G - 1) / G), (unsigned)((N + G - 1) / G));
    LAUNCH_FMT(q->fmt, swiglu_fp8_kernel, grid, TILE_THREADS, out, fc, N, F, q->codes, q->scales,
               qt ? qt->codes : NULL, qt ? qt->scales : NULL);
}

extern "C" void swiglu_backward_fp8_gpu(uint16_t *dfc, const uint16_t *dout, const uint16_t *fc, int N, int F,
                                        const Fp8Operand *q, const Fp8Operand *qt, cudaStream_t stream) {
    check_operands("swiglu_backward_fp8_gpu", q, qt, N, 2 * F);
    if (F % 8) FATAL("swiglu_backward_fp8_gpu: F = %d is not a multiple of 8", F);
    const dim3 grid((unsigned)((2 * F + G - 1) / G), (unsigned)((N + G - 1) / G));
    LAUNCH_FMT(q->fmt, swiglu_bwd_fp8_kernel, grid, TILE_THREADS, dfc, dout, fc, N, F, q->codes, q->scales,
               qt ? qt->codes : NULL, qt ? qt->scales : NULL);
}
