// layers_fp8.cu: RMSNorm, SwiGLU and the SwiGLU backward writing the FP8 codes of their output
// both ways, in 1x128 slices or (delayed fp8_tensor scaling) per tensor, and the RoPE backward
// writing dqkv's per-tensor codes (see layers_fp8.h for the contracts and why tiles of 128 tokens).
//
// Every kernel produces a 128 x 128 BF16 tile of its output with layers_math.cuh's arithmetic
// (so the values are layers.cu's, bit for bit), eight values of a row at a time, writes them to
// global memory when asked, and hands them to fp8_quant.cuh's vec128_tile or tensor_tile, the code
// vec128both_kernel / tensor_both_kernel run on a loaded tile (so the codes and scales are
// fp8_quantize_gpu's, bit for bit). The RMSNorm needs whole rows before any output (their rstd):
// layers.cu's norm adds the residual and computes rstd (no output), then the tile kernel
// normalises and quantizes.
//
// Bytes per output element (BF16 2 B, codes 1 B per layout), fused against layer + vec128both:
//   SwiGLU forward   reads fc 4, writes codes 2 (+ out 2)     (unfused: 4 + 2, then 2 + 2)
//   SwiGLU backward  reads fc, dout 3 (each read by the gate tile and the up tile: the second read
//                    mostly from L2), writes codes 2 (+ dfc 2) (unfused: 3 + 2, then 2 + 2)
//   RMSNorm + res.   reads x, delta 4, writes res 2; re-reads res 2, writes codes 2 (+ y 2)
//                                                              (unfused: 4 + 2 + 2, then 2 + 2)
// The BF16 output is written only when the caller passes a pointer for it (the model passes NULL
// when the codes are all the next GEMMs read).
#include "gpu/layers_fp8.h"

#include <cuda_bf16.h>     // __nv_bfloat16
#include <cuda_runtime.h>  // launches
#include <stdint.h>        // uintptr_t

#include "core/common.h"        // FATAL
#include "gpu/cuda_check.h"     // CUDA_CHECK_LAUNCH
#include "gpu/fp8_quant.cuh"    // Vec128Tile, vec128_tile, load8 (shared with linear_fp8_gpu.cu)
#include "gpu/layers.h"         // the RMSNorm's rows (rstd, residual): rmsnorm_forward_gpu
#include "gpu/layers_math.cuh"  // the RMSNorm / SwiGLU arithmetic (shared with layers.cu)

typedef __nv_bfloat16 bf16;

#define G FQ_G          // 128
#define TILE_THREADS FQ_NT  // every tile kernel: a CTA per 128 x 128 output tile
// Rows whose loads a thread has in flight together (vec128_tile's and tensor_tile's BATCH), and
// the CTAs per SM every tile kernel is compiled for (__launch_bounds__' second argument: it caps
// their registers). Timed at paper_569m's shapes with dev/bench/bench_fp8_quant.cu on one H200
// (2026-11-30; the kernels' times: docs/perf.md, "FP8 linears: quantize kernels and GEMMs"):
constexpr int NORM_TILE_BATCH = 8;        // 8 rows of 2 loads (source, gains)
constexpr int SWIGLU_BATCH = 8;           // 8 rows of 2 loads (gate, up)
constexpr int SWIGLU_BWD_BATCH = 4;       // 3 loads a row (gate, up, dout): 12 words a row in flight
constexpr int SWIGLU_BWD_PAIR_BATCH = 4;  // the pair kernel: 8 rows spill and are slower
constexpr int ROPE_BWD_BATCH = 1;         // its (cos, sin) loads come with each row: 2 rows are slower
constexpr int TILE_MIN_CTAS = 3;          // 4 makes the fused SwiGLU slower

// Eight BF16 (w) to dst at columns [c, c + 8) of a group with nc valid columns: one 16-byte store
// when allowed, else element by element.
static __device__ __forceinline__ void store8(uint16_t *dst, const uint32_t w[4], int c, int nc, bool vec) {
    if (vec && c + 8 <= nc) {
        *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
        return;
    }
    for (int e = 0; e < 8 && c + e < nc; e++) dst[e] = half_of(w, e);
}
// store8 for a group known to be whole (FULL: no per-element bounds checks) or not.
template <bool FULL>
static __device__ __forceinline__ void store8_tile(uint16_t *dst, const uint32_t w[4], int c, int nc, bool vec) {
    if (FULL && vec) {
        *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    } else if (FULL) {
#pragma unroll
        for (int e = 0; e < 8; e++) dst[e] = half_of(w, e);
    } else {
        store8(dst, w, c, nc, vec);
    }
}

// The shared memory of a tile kernel: vec128_tile's BF16 tile, or per tensor tensor_tile's codes.
template <bool TENSOR>
struct TileSmem {
    typedef Vec128Tile type;
};
template <>
struct TileSmem<true> {
    typedef CodeTile type;
};

// The tile in 1x128 groups (vec128_tile), or per tensor (TENSOR: tensor_tile with the scale of
// *ts.amax, observing into ts.observe, and writing both operands' scale floats).
template <Fp8Format FMT, int BATCH, class Raw, bool TENSOR, class Load, class Make>
static __device__ __forceinline__ void tile_dispatch(typename TileSmem<TENSOR>::type &sm, int r0, int c0, int nr,
                                                     int nc, int rows, int cols, uint8_t *q, float *q_scales,
                                                     uint8_t *qt, float *qt_scales, bool qt_block, Fp8TensorScale ts,
                                                     Load load, Make make) {
    if constexpr (!TENSOR) {
        vec128_tile<FMT, BATCH, Raw>(sm, r0, c0, nr, nc, rows, cols, q, q_scales, qt, qt_scales, qt_block, nullptr,
                                     load, make);
    } else {
        tensor_tile<FMT, BATCH, Raw>(sm, r0, c0, nr, nc, rows, cols, q, q_scales, qt, qt_scales, ts.amax, ts.observe,
                                     nullptr, load, make);
    }
}

// --- RMSNorm -------------------------------------------------------------------------------------
// Tiles: y = src * rstd * g of the tile (src the residual the row kernel stored, or x), stored
// when y is not NULL, and quantized both ways.
template <Fp8Format FMT, bool TENSOR>
__global__ void __launch_bounds__(TILE_THREADS, TILE_MIN_CTAS)
    rmsnorm_tile_fp8_kernel(uint16_t *y, const float *rstd, const uint16_t *src, const uint16_t *g, int N, int C,
                            bool vec, uint8_t *q, float *q_scales, uint8_t *qt, float *qt_scales, bool qt_block,
                            Fp8TensorScale ts) {
    __shared__ __align__(16) typename TileSmem<TENSOR>::type sm;
    const int r0 = blockIdx.y * G, c0 = blockIdx.x * G;
    const int nr = min(G, N - r0), nc = min(G, C - c0);
    typedef Bf16x8Loads<2> In;  // v[0] the source, v[1] the gains, f the row's rstd
    tile_dispatch<FMT, NORM_TILE_BATCH, In, TENSOR>(
        sm, r0, c0, nr, nc, N, C, q, q_scales, qt, qt_scales, qt_block, ts,
        [&](auto full, int r, int c, In &in) {
            constexpr bool FULL = decltype(full)::value;
            load8_tile<FULL>(in.v[0], src + (size_t)(r0 + r) * C + c0 + c, c, nc, vec);
            load8_tile<FULL>(in.v[1], g + c0 + c, c, nc, vec);
            in.f = rstd[r0 + r];
        },
        [&](auto full, int r, int c, const In &in, uint32_t w[4]) {
            constexpr bool FULL = decltype(full)::value;
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (FULL || c + e < nc)
                    w[e >> 1] |= (uint32_t)lm_f2bits(lm_rms_out(lm_bits2f(half_of(in.v[0], e)), in.f,
                                                                lm_bits2f(half_of(in.v[1], e))))
                                 << (16 * (e & 1));
            if (y) store8_tile<FULL>(y + (size_t)(r0 + r) * C + c0 + c, w, c, nc, vec);
        });
}

// --- SwiGLU forward ------------------------------------------------------------------------------
// CTA = output tile (rows blockIdx.y * 128.., columns blockIdx.x * 128.. of out (N, F)).
template <Fp8Format FMT, bool TENSOR>
__global__ void __launch_bounds__(TILE_THREADS, TILE_MIN_CTAS)
    swiglu_fp8_kernel(uint16_t *out, const uint16_t *fc, int N, int F, uint8_t *q, float *q_scales, uint8_t *qt,
                      float *qt_scales, bool qt_block, Fp8TensorScale ts) {
    __shared__ __align__(16) typename TileSmem<TENSOR>::type sm;
    const int r0 = blockIdx.y * G, c0 = blockIdx.x * G;
    const int nr = min(G, N - r0), nc = min(G, F - c0);
    const bool vec = F % 8 == 0 && aligned16(fc) && (!out || aligned16(out));
    typedef Bf16x8Loads<2> In;  // v[0] the gate, v[1] the up
    tile_dispatch<FMT, SWIGLU_BATCH, In, TENSOR>(
        sm, r0, c0, nr, nc, N, F, q, q_scales, qt, qt_scales, qt_block, ts,
        [&](auto full, int r, int c, In &in) {
            constexpr bool FULL = decltype(full)::value;
            const uint16_t *row = fc + (size_t)(r0 + r) * 2 * F + c0 + c;  // gate; up is F further
            load8_tile<FULL>(in.v[0], row, c, nc, vec);
            load8_tile<FULL>(in.v[1], row + F, c, nc, vec);
        },
        [&](auto full, int r, int c, const In &in, uint32_t w[4]) {
            constexpr bool FULL = decltype(full)::value;
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (FULL || c + e < nc)
                    w[e >> 1] |= (uint32_t)lm_f2bits(lm_swiglu(lm_bits2f(half_of(in.v[0], e)), lm_bits2f(half_of(in.v[1], e))))
                                 << (16 * (e & 1));
            if (out) store8_tile<FULL>(out + (size_t)(r0 + r) * F + c0 + c, w, c, nc, vec);
        });
}

// --- SwiGLU backward -----------------------------------------------------------------------------
// CTA = output tile of dfc (N, 2F): columns < F are the gate's gradient, the rest the up's. Eight
// consecutive columns never straddle F (F % 8 == 0), so each group of eight reads eight
// consecutive gate, up and dout values. Grid x walks the 2F columns, so the gate tile and the up
// tile of the same inputs run close together and the second read of fc and dout hits L2.
template <Fp8Format FMT, bool TENSOR>
__global__ void __launch_bounds__(TILE_THREADS, TILE_MIN_CTAS)
    swiglu_bwd_fp8_kernel(uint16_t *dfc, const uint16_t *dout, const uint16_t *fc, int N, int F, uint8_t *q,
                          float *q_scales, uint8_t *qt, float *qt_scales, bool qt_block, Fp8TensorScale ts) {
    __shared__ __align__(16) typename TileSmem<TENSOR>::type sm;
    const int W2 = 2 * F;
    const int r0 = blockIdx.y * G, c0 = blockIdx.x * G;
    const int nr = min(G, N - r0), nc = min(G, W2 - c0);
    const bool vec = aligned16(fc) && aligned16(dout) && (!dfc || aligned16(dfc));  // F % 8 == 0 (launcher)
    typedef Bf16x8Loads<3> In;  // v[0] the gate, v[1] the up, v[2] dout (4 rows in flight: 12 words each)
    tile_dispatch<FMT, SWIGLU_BWD_BATCH, In, TENSOR>(
        sm, r0, c0, nr, nc, N, W2, q, q_scales, qt, qt_scales, qt_block, ts,
        [&](auto full, int r, int c, In &in) {
            constexpr bool FULL = decltype(full)::value;
            const int cc = c0 + c, j = cc < F ? cc : cc - F;  // column of dfc; of gate, up and dout
            const size_t row = (size_t)(r0 + r);
            load8_tile<FULL>(in.v[0], fc + row * W2 + j, c, nc, vec);
            if (cc < F) load8_tile<FULL>(in.v[1], fc + row * W2 + F + j, c, nc, vec);  // the up: dg only
            load8_tile<FULL>(in.v[2], dout + row * F + j, c, nc, vec);
        },
        [&](auto full, int r, int c, const In &in, uint32_t w[4]) {
            constexpr bool FULL = decltype(full)::value;
            const int cc = c0 + c;
            const bool gate = cc < F;
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (FULL || c + e < nc) {
                    const float g = lm_bits2f(half_of(in.v[0], e)), d = lm_bits2f(half_of(in.v[2], e));
                    const float s = lm_sigmoid(g);  // only the gradient this column needs
                    const float v = gate ? lm_swiglu_grad_gate(g, lm_bits2f(half_of(in.v[1], e)), d, s)
                                         : lm_swiglu_grad_up(g, d, s);
                    w[e >> 1] |= (uint32_t)lm_f2bits(v) << (16 * (e & 1));
                }
            if (dfc) store8_tile<FULL>(dfc + (size_t)(r0 + r) * W2 + cc, w, c, nc, vec);
        });
}

// Per tensor (delayed scaling) with F % 128 == 0: one CTA makes the gate tile and the up tile of
// the same rows and columns j0.. of the SwiGLU's inputs, which it reads once (the kernel above reads
// fc and dout for each of the two tiles). Each gradient's codes are made at once from the
// thread's registers, as tensor_tile makes them (the same values, scale and codes): stored to
// Q(dfc) and to one CodeTile per tile, whose transposes are Q(dfc^T) (emit_qt_codes).
// SWIGLU_BWD_PAIR_BATCH rows of loads in flight. Grid (F / 128, ceil(N / 128)). Per tensor only:
// a 1x128 pair must also carry both tiles' amaxes, which costs more than the second read it saves.
template <Fp8Format FMT>
__global__ void __launch_bounds__(TILE_THREADS, TILE_MIN_CTAS)
    swiglu_bwd_pair_tensor_kernel(const uint16_t *dout, const uint16_t *fc, int N, int F, uint8_t *q, float *q_scales,
                                  uint8_t *qt, float *qt_scales, Fp8TensorScale ts) {
    __shared__ __align__(16) CodeTile cg, cu;  // the gate's codes, the up's
    const int W2 = 2 * F, j0 = blockIdx.x * G, r0 = blockIdx.y * G, nr = min(G, N - r0);
    const int t = threadIdx.x, c = (t & 15) * 8, rsub = t >> 4;
    const float s = fp8_scale_for_amax(FMT, *ts.amax);
    tensor_scales_once(q_scales, qt_scales, 1.0f / s, ts.amax);  // (exact: a power of two)
    const bool vec = aligned16(fc) && aligned16(dout);  // (F % 8 == 0: every row's groups of 8 aligned too)
    unsigned sat = 0, nan = 0;  // (not counted: the model passes no counters)
    uint32_t om = 0;            // the amax of this thread's gradients, gate and up (one tensor: dfc)
#pragma unroll
    for (int kb = 0; kb < 8; kb += SWIGLU_BWD_PAIR_BATCH) {
        Bf16x8Loads<3> in[SWIGLU_BWD_PAIR_BATCH];  // v[0] the gate, v[1] the up, v[2] dout
#pragma unroll
        for (int j = 0; j < SWIGLU_BWD_PAIR_BATCH; j++) {
            const int r = rsub + 16 * (kb + j);
            if (r >= nr) continue;
            const size_t row = (size_t)(r0 + r);
            load8_tile<true>(in[j].v[0], fc + row * W2 + j0 + c, c, G, vec);
            load8_tile<true>(in[j].v[1], fc + row * W2 + F + j0 + c, c, G, vec);
            load8_tile<true>(in[j].v[2], dout + row * F + j0 + c, c, G, vec);
        }
#pragma unroll
        for (int j = 0; j < SWIGLU_BWD_PAIR_BATCH; j++) {
            const int r = rsub + 16 * (kb + j);
            uint32_t wg[4] = {0, 0, 0, 0}, wu[4] = {0, 0, 0, 0};
            if (r < nr) {
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float g = lm_bits2f(half_of(in[j].v[0], e)), d = lm_bits2f(half_of(in[j].v[2], e));
                    const float sg = lm_sigmoid(g);
                    const float dg = lm_swiglu_grad_gate(g, lm_bits2f(half_of(in[j].v[1], e)), d, sg);
                    wg[e >> 1] |= (uint32_t)lm_f2bits(dg) << (16 * (e & 1));
                    wu[e >> 1] |= (uint32_t)lm_f2bits(lm_swiglu_grad_up(g, d, sg)) << (16 * (e & 1));
                }
            }
            if (ts.observe)
#pragma unroll
                for (int i = 0; i < 4; i++) om = amax2(amax2(om, wg[i]), wu[i]);
            const uint2 qg = quant8<FMT>(wg, s, sat, nan), qu = quant8<FMT>(wu, s, sat, nan);
            if (r < nr) {
                uint8_t *row = q + (size_t)(r0 + r) * W2 + j0 + c;
                *reinterpret_cast<uint2 *>(row) = qg;
                *reinterpret_cast<uint2 *>(row + F) = qu;
            }
            code_tile_put(cg, r, c, qg);
            code_tile_put(cu, r, c, qu);
        }
    }
    if (ts.observe) publish_amax(amax_of_pair(om), ts.observe);
    if (qt == nullptr) return;
    __syncthreads();
    // Q(dfc^T): rows j0.. (gate) and F + j0.. (up) of qt (2F, N)
    if (nr == G) {
        emit_qt_codes<true>(cg, qt, N, r0, j0, G, G);
        emit_qt_codes<true>(cu, qt, N, r0, F + j0, G, G);
    } else {
        emit_qt_codes<false>(cg, qt, N, r0, j0, nr, G);
        emit_qt_codes<false>(cu, qt, N, r0, F + j0, nr, G);
    }
}

// --- RoPE backward writing dqkv's per-tensor codes ------------------------------------------------
// dqkv (N, 3C) as the attention backward wrote it (the gradients of the rotated q, k and of v):
// each 128 x 128 tile is rotated back (q and k columns; v as it is) with lm_rope_lo / lm_rope_hi,
// as rope_backward_gpu rotates it in place, and quantized both ways per tensor (delayed scaling).
// A column's RoPE partner (i +- hd/2 within its head) lies in the same tile (128 % hd == 0): the
// thread loads its own 8 values and its partner's 8 (the latter another thread's own, mostly
// from L1), and the (cos, sin) of its 8 pairs at the row's position, all in load() so that they
// are in flight with the batch's other rows (in make() each row would wait for its table
// entries in turn). The BF16 result is not written: the qkv linear's GEMMs read only the codes.
// One row per batch (ROPE_BWD_BATCH): with the table loads in load(), batch 1 took 0.119 ms and
// batch 2 0.128 ms (paper_569m's dqkv, one H200).
struct RopeLoads {
    uint32_t v[2][4];  // the column's own 8 BF16, its partners' 8
    float4 cs[4];      // (cos, sin) of pairs j0 + 2k and j0 + 2k + 1
    float f;           // (unused: the tile body's Raw interface)
};
template <Fp8Format FMT>
__global__ void __launch_bounds__(TILE_THREADS, TILE_MIN_CTAS)
    rope_bwd_fp8_kernel(const uint16_t *dqkv, const float *cos_sin, int N, int T, int C, int hd, uint8_t *q,
                        float *q_scales, uint8_t *qt, float *qt_scales, Fp8TensorScale ts) {
    __shared__ __align__(16) CodeTile sm;
    const int W3 = 3 * C, half = hd / 2;
    const int r0 = blockIdx.y * G, c0 = blockIdx.x * G;
    const int nr = min(G, N - r0), nc = G;  // (3C % 128 == 0: whole columns)
    const bool rotate = c0 < 2 * C;        // q or k columns (a tile never straddles v: C % 128 == 0)
    tile_dispatch<FMT, ROPE_BWD_BATCH, RopeLoads, true>(
        sm, r0, c0, nr, nc, N, W3, q, q_scales, qt, qt_scales, false, ts,
        [&](auto full, int r, int c, RopeLoads &in) {
            constexpr bool FULL = decltype(full)::value;
            const uint16_t *row = dqkv + (size_t)(r0 + r) * W3;
            const int col = c0 + c;
            load8_tile<FULL>(in.v[0], row + col, c, nc, true);
            if (rotate) {
                const int i = col % hd, j0 = i % half, t = (r0 + r) % T;  // pairs j0 .. j0 + 7 of position t
                load8_tile<FULL>(in.v[1], row + (i < half ? col + half : col - half), c, nc, true);
                const float4 *cs = reinterpret_cast<const float4 *>(cos_sin + ((size_t)t * half + j0) * 2);
#pragma unroll
                for (int k = 0; k < 4; k++) in.cs[k] = cs[k];
            }
        },
        [&](auto, int, int c, const RopeLoads &in, uint32_t w[4]) {
            if (!rotate) {
#pragma unroll
                for (int k = 0; k < 4; k++) w[k] = in.v[0][k];
                return;
            }
            const int i = (c0 + c) % hd;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float cv[2] = {in.cs[k].x, in.cs[k].z}, sv[2] = {-in.cs[k].y, -in.cs[k].w};  // by -angle
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int e = 2 * k + h;
                    const float own = lm_bits2f(half_of(in.v[0], e)), partner = lm_bits2f(half_of(in.v[1], e));
                    const float o = i < half ? lm_rope_lo(own, partner, cv[h], sv[h])
                                             : lm_rope_hi(partner, own, cv[h], sv[h]);
                    w[k] |= (uint32_t)lm_f2bits(o) << (16 * h);
                }
            }
        });
}

// --- launchers -----------------------------------------------------------------------------------

// q must be a 1x128 operand (rows, cols), or per tensor with ts (its scale's amax); qt NULL or
// its transpose in the same format (1x128 or 128x128 with a 1x128 q, per tensor with a per-tensor
// one). Returns whether the operands are per tensor.
static bool check_operands(const char *who, const Fp8Operand *q, const Fp8Operand *qt, int rows, int cols,
                           const Fp8TensorScale *ts) {
    if (!q || !q->codes || !q->scales) FATAL("%s: q has no buffers (it is required)", who);
    const bool tensor = q->grouping == FP8_GROUP_TENSOR;
    if ((q->grouping != FP8_GROUP_1x128 && !tensor) || q->rows != rows || q->cols != cols)
        FATAL("%s: q is (%d, %d) grouping %d, expected (%d, %d) 1x128 or per tensor", who, q->rows, q->cols,
              (int)q->grouping, rows, cols);
    if (tensor != (ts != NULL) || (ts && !ts->amax))
        FATAL("%s: %s operands %s the amax to scale by (hint: Fp8TensorScale goes with FP8_GROUP_TENSOR only)", who,
              tensor ? "per-tensor" : "1x128", tensor ? "need" : "take no");
    const bool qt_ok = qt && (tensor ? qt->grouping == FP8_GROUP_TENSOR
                                     : (qt->grouping == FP8_GROUP_1x128 || qt->grouping == FP8_GROUP_128x128));
    if (qt && (!qt->codes || !qt->scales || !qt_ok || qt->rows != cols || qt->cols != rows || qt->fmt != q->fmt))
        FATAL("%s: qt is (%d, %d) grouping %d format %d, expected (%d, %d) %s format %d", who, qt->rows, qt->cols,
              (int)qt->grouping, (int)qt->fmt, cols, rows, tensor ? "per tensor" : "1x128 or 128x128", (int)q->fmt);
    if (rows <= 0 || cols <= 0) FATAL("%s: empty shape (%d, %d)", who, rows, cols);
    return tensor;
}

// Whether qt is one 128x128 block per tile (a wgrad operand in blocks) rather than 1x128 slices.
static bool qt_block(const Fp8Operand *qt) { return qt && qt->grouping == FP8_GROUP_128x128; }

// Launches kernel<E4M3 or E5M2, per tensor or not> on `stream` with `threads`, then checks the launch.
#define LAUNCH_FMT(fmt, tensor, kernel, grid, threads, ...)                                                   \
    do {                                                                                                      \
        if ((fmt) == FP8_E4M3 && (tensor)) kernel<FP8_E4M3, true><<<(grid), (threads), 0, stream>>>(__VA_ARGS__); \
        else if ((fmt) == FP8_E4M3) kernel<FP8_E4M3, false><<<(grid), (threads), 0, stream>>>(__VA_ARGS__);      \
        else if (tensor) kernel<FP8_E5M2, true><<<(grid), (threads), 0, stream>>>(__VA_ARGS__);                   \
        else kernel<FP8_E5M2, false><<<(grid), (threads), 0, stream>>>(__VA_ARGS__);                              \
        CUDA_CHECK_LAUNCH();                                                                                  \
    } while (0)

static Fp8TensorScale ts_or_none(const Fp8TensorScale *ts) {
    Fp8TensorScale none = {NULL, NULL};
    return ts ? *ts : none;
}

extern "C" void rmsnorm_forward_fp8_gpu(uint16_t *res_out, uint16_t *y, float *rstd, const uint16_t *x,
                                        const uint16_t *delta, const uint16_t *g, int N, int C, float eps,
                                        const Fp8Operand *q, const Fp8Operand *qt, const Fp8TensorScale *ts,
                                        cudaStream_t stream) {
    const bool tensor = check_operands("rmsnorm_forward_fp8_gpu", q, qt, N, C, ts);
    if (delta && !res_out) FATAL("rmsnorm_forward_fp8_gpu: a residual add needs res_out");
    // rows first: rstd (and the residual) from layers.cu's own norm with no output, then the tiles
    if (delta) residual_rmsnorm_forward_gpu(res_out, NULL, rstd, x, delta, g, N, C, eps, stream);
    else rmsnorm_forward_gpu(NULL, rstd, x, g, N, C, eps, stream);
    const bool vec = C % 8 == 0 && aligned16(delta ? res_out : x) && aligned16(g) && (!y || aligned16(y));
    const dim3 grid((unsigned)((C + G - 1) / G), (unsigned)((N + G - 1) / G));
    LAUNCH_FMT(q->fmt, tensor, rmsnorm_tile_fp8_kernel, grid, TILE_THREADS, y, rstd, delta ? res_out : x, g, N, C,
               vec, q->codes, q->scales, qt ? qt->codes : NULL, qt ? qt->scales : NULL, qt_block(qt), ts_or_none(ts));
}

extern "C" void rope_backward_fp8_gpu(const uint16_t *dqkv, const float *cos_sin, int B, int T, int H, int hd,
                                      const Fp8Operand *q, const Fp8Operand *qt, const Fp8TensorScale *ts,
                                      cudaStream_t stream) {
    const int C = H * hd, N = B * T;
    const bool tensor = check_operands("rope_backward_fp8_gpu", q, qt, N, 3 * C, ts);
    if (!tensor) FATAL("rope_backward_fp8_gpu: per-tensor operands only (delayed scaling), got grouping %d",
                       (int)q->grouping);
    if (!rope_backward_fp8_supported(H, hd) || !aligned16(dqkv) || !aligned16(cos_sin))
        FATAL("rope_backward_fp8_gpu: needs C %% 128 == 0, 128 %% hd == 0, hd %% 16 == 0 and 16-byte aligned "
              "buffers (got H %d, hd %d; hint: rope_backward_fp8_supported)", H, hd);
    const dim3 grid((unsigned)(3 * C / G), (unsigned)((N + G - 1) / G));
    LAUNCH_BY_FMT(q->fmt, rope_bwd_fp8_kernel, grid, TILE_THREADS, stream, dqkv, cos_sin, N, T, C, hd, q->codes, q->scales,
                      qt ? qt->codes : NULL, qt ? qt->scales : NULL, *ts);
}

extern "C" int rope_backward_fp8_supported(int H, int hd) {
    return hd > 0 && hd % 16 == 0 && 128 % hd == 0 && (H * hd) % 128 == 0;
}

extern "C" void swiglu_forward_fp8_gpu(uint16_t *out, const uint16_t *fc, int N, int F, const Fp8Operand *q,
                                       const Fp8Operand *qt, const Fp8TensorScale *ts, cudaStream_t stream) {
    const bool tensor = check_operands("swiglu_forward_fp8_gpu", q, qt, N, F, ts);
    if (F % 8) FATAL("swiglu_forward_fp8_gpu: F = %d is not a multiple of 8", F);
    const dim3 grid((unsigned)((F + G - 1) / G), (unsigned)((N + G - 1) / G));
    LAUNCH_FMT(q->fmt, tensor, swiglu_fp8_kernel, grid, TILE_THREADS, out, fc, N, F, q->codes, q->scales,
               qt ? qt->codes : NULL, qt ? qt->scales : NULL, qt_block(qt), ts_or_none(ts));
}

extern "C" void swiglu_backward_fp8_gpu(uint16_t *dfc, const uint16_t *dout, const uint16_t *fc, int N, int F,
                                        const Fp8Operand *q, const Fp8Operand *qt, const Fp8TensorScale *ts,
                                        cudaStream_t stream) {
    const bool tensor = check_operands("swiglu_backward_fp8_gpu", q, qt, N, 2 * F, ts);
    // per tensor, whole 128-column tiles, the BF16 output not asked for: one CTA per gate + up
    // pair of tiles; other shapes take one tile per CTA
    if (tensor && F % G == 0 && !dfc && ((uintptr_t)q->codes & 7) == 0) {
        const dim3 grid((unsigned)(F / G), (unsigned)((N + G - 1) / G));
        LAUNCH_BY_FMT(q->fmt, swiglu_bwd_pair_tensor_kernel, grid, TILE_THREADS, stream, dout, fc, N, F, q->codes, q->scales,
                          qt ? qt->codes : NULL, qt ? qt->scales : NULL, *ts);
        return;
    }
    if (F % 8) FATAL("swiglu_backward_fp8_gpu: F = %d is not a multiple of 8", F);
    const dim3 grid((unsigned)((2 * F + G - 1) / G), (unsigned)((N + G - 1) / G));
    LAUNCH_FMT(q->fmt, tensor, swiglu_bwd_fp8_kernel, grid, TILE_THREADS, dfc, dout, fc, N, F, q->codes, q->scales,
               qt ? qt->codes : NULL, qt ? qt->scales : NULL, qt_block(qt), ts_or_none(ts));
}
