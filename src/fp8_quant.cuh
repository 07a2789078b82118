// fp8_quant.cuh: the device side of the linear layers' FP8 quantization (linear_fp8.c's contract),
// shared by the stand-alone quantize kernels (linear_fp8_gpu.cu) and the layers that quantize
// their own output (layers_fp8.cu), so that both run literally the same code: same amax (max of
// |x|'s BF16 bits, NaN ignored: exact, so any reduction order agrees), same power-of-two scale
// (fp8.h's fp8_scale_for_amax), same integer encoder (fp8.h's fp8_from_f32) as the CPU.
//
// vec128_emit is the second half of a "1x128 both ways" kernel: given a 128x128 BF16 tile of x
// in shared memory (rows r0.., columns c0.. of x (rows, cols); zeros outside x), it writes the
// tile's slices of Q(x) (each tile row: one 1x128 slice along cols) and of Q(x^T) (each tile
// column: one 1x128 slice along rows = tokens) with their VEC128 scales (1/s at [j * R + r]).
// Whoever fills the tile (a load of x, an RMSNorm, a SwiGLU) gets the codes fp8_quantize gives
// for that tile's BF16 values.
#ifndef FP8_QUANT_CUH
#define FP8_QUANT_CUH

#include <cuda_runtime.h>  // __reduce_max_sync, __syncthreads
#include <stdint.h>        // uint8_t, uint16_t, uint32_t, uintptr_t

#include "fp8.h"         // fp8_scale_for_amax, fp8_from_f32, bf16_to_f32, Fp8Format
#include "linear_fp8.h"  // FP8_GROUP

#define FQ_G FP8_GROUP  // 128: slice length, tile side

// |x| of a BF16 as bits, ordered like the values; NaN -> 0 so it never wins a max (fmaxf ignores
// NaN on the CPU).
static __device__ __forceinline__ unsigned abs_bits(unsigned b) {
    b &= 0x7FFFu;
    return b > 0x7F80u ? 0u : b;
}
static __device__ __forceinline__ unsigned max_abs8(const uint32_t w[4]) {
    unsigned m = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) m = max(m, max(abs_bits(w[k] & 0xFFFFu), abs_bits(w[k] >> 16)));
    return m;
}
static __device__ __forceinline__ float scale_of_bits(Fp8Format fmt, unsigned amax_bits) {
    return fp8_scale_for_amax(fmt, bf16_to_f32((uint16_t)amax_bits));
}

// code = fp8(x * s), counting saturations and NaNs exactly as linear_fp8.c's quantize_run.
template <Fp8Format FMT>
static __device__ __forceinline__ uint32_t quant(unsigned bf, float s, unsigned &sat, unsigned &nan) {
    const float v = bf16_to_f32((uint16_t)bf) * s;  // exact: s is a power of two
    if (v != v) nan++;
    else if (fabsf(v) > fp8_max(FMT)) sat++;
    return fp8_from_f32(FMT, v);
}
static __device__ __forceinline__ uint32_t pack4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    return a | (b << 8) | (c << 16) | (d << 24);  // element 0 in the lowest byte
}
// Eight BF16 (element 0 in the low half of w[0]) -> eight codes.
template <Fp8Format FMT>
static __device__ __forceinline__ uint2 quant8(const uint32_t w[4], float s, unsigned &sat, unsigned &nan) {
    uint32_t o[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
        o[h] = pack4(quant<FMT>(w[2 * h] & 0xFFFFu, s, sat, nan), quant<FMT>(w[2 * h] >> 16, s, sat, nan),
                     quant<FMT>(w[2 * h + 1] & 0xFFFFu, s, sat, nan), quant<FMT>(w[2 * h + 1] >> 16, s, sat, nan));
    return make_uint2(o[0], o[1]);
}

// Adds this warp's counts to counts[0] (saturated) and counts[1] (NaN). All 32 lanes must call.
static __device__ __forceinline__ void flush_counts(unsigned long long *counts, unsigned sat, unsigned nan) {
    if (counts == nullptr) return;
    sat = __reduce_add_sync(0xFFFFFFFFu, sat);
    nan = __reduce_add_sync(0xFFFFFFFFu, nan);
    if ((threadIdx.x & 31) == 0) {
        if (sat) atomicAdd(counts, (unsigned long long)sat);
        if (nan) atomicAdd(counts + 1, (unsigned long long)nan);
    }
}

// Eight BF16 of row `src` at columns [c, c + 8) of a group with nc valid columns: one 16-byte
// load when allowed, else element by element; missing elements are 0.
static __device__ __forceinline__ void load8(uint32_t w[4], const uint16_t *src, int c, int nc, bool vec) {
    if (vec && c + 8 <= nc) {
        const uint4 v = *reinterpret_cast<const uint4 *>(src);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
        return;
    }
    w[0] = w[1] = w[2] = w[3] = 0;
    for (int e = 0; e < 8; e++)
        if (c + e < nc) w[e >> 1] |= (uint32_t)src[e] << (16 * (e & 1));
}

// Writes the codes of a G x G tile in shared memory (nr x nc valid) into q, the row-major (rows,
// cols) codes, row r0 + r quantized with scale_of(r): each of the NT threads 8 consecutive codes of
// one row. linear_fp8_gpu.cu's 128x128 kernel (one scale) and vec128_emit (rs[r]) use it.
template <Fp8Format FMT, int NT, class Scale>
static __device__ __forceinline__ void emit_tile_rows(uint8_t *q, uint16_t (*tile)[FQ_G + 2], int rows, int cols,
                                                      int r0, int c0, int nr, int nc, Scale scale_of, unsigned &sat,
                                                      unsigned &nan) {
    constexpr int G = FQ_G;
    const bool vec_out = cols % 8 == 0 && ((uintptr_t)q & 7) == 0;
    for (int id = threadIdx.x; id < G * G / 8; id += NT) {
        const int r = id / 16, c = (id % 16) * 8;
        if (r >= nr) continue;
        const float s = scale_of(r);
        uint8_t *dst = q + (size_t)(r0 + r) * cols + c0 + c;
        if (vec_out && c + 8 <= nc) {
            const uint32_t *src = reinterpret_cast<const uint32_t *>(&tile[r][c]);
            const uint32_t w[4] = {src[0], src[1], src[2], src[3]};
            *reinterpret_cast<uint2 *>(dst) = quant8<FMT>(w, s, sat, nan);
        } else {
            for (int e = 0; e < 8 && c + e < nc; e++) dst[e] = (uint8_t)quant<FMT>(tile[r][c + e], s, sat, nan);
        }
    }
}

// The same tile transposed into qt, the (cols, rows) codes: row c of x^T holds column c0 + c of
// x, quantized with scale_of(c); each thread 4 consecutive codes.
template <Fp8Format FMT, int NT, class Scale>
static __device__ __forceinline__ void emit_tile_cols(uint8_t *qt, uint16_t (*tile)[FQ_G + 2], int rows, int r0,
                                                      int c0, int nr, int nc, Scale scale_of, unsigned &sat,
                                                      unsigned &nan) {
    constexpr int G = FQ_G;
    const bool vec_out = rows % 4 == 0 && ((uintptr_t)qt & 3) == 0;
    for (int id = threadIdx.x; id < G * G / 4; id += NT) {
        const int c = id / 32, r = (id % 32) * 4;
        if (c >= nc) continue;
        const float s = scale_of(c);
        uint8_t *dst = qt + (size_t)(c0 + c) * rows + r0 + r;
        if (vec_out && r + 4 <= nr) {
            *reinterpret_cast<uint32_t *>(dst) =
                pack4(quant<FMT>(tile[r][c], s, sat, nan), quant<FMT>(tile[r + 1][c], s, sat, nan),
                      quant<FMT>(tile[r + 2][c], s, sat, nan), quant<FMT>(tile[r + 3][c], s, sat, nan));
        } else {
            for (int e = 0; e < 4 && r + e < nr; e++) dst[e] = (uint8_t)quant<FMT>(tile[r + e][c], s, sat, nan);
        }
    }
}

// Shared memory of one 1x128-both-ways tile for NT threads. The pitch G + 2 keeps a column walk
// (Q(x^T)) off a single bank; rows stay 4-byte aligned.
template <int NT>
struct Vec128Smem {
    uint16_t tile[FQ_G][FQ_G + 2];  // the BF16 tile, zeros outside x
    unsigned part[NT / FQ_G][FQ_G]; // column amax in NT / 128 parts of rows
    float rs[FQ_G], cs[FQ_G];       // scale s of tile row r (Q(x)) and of tile column c (Q(x^T))
};

// Writes the slices of the tile (rows [r0, r0 + nr), columns [c0, c0 + nc) of x (rows, cols)):
// Q(x) (rows, cols) codes to q with VEC128 scales at q_scales[(c0 / 128) * rows + r], and, when qt
// is not NULL, Q(x^T) (cols, rows) to qt with scales at qt_scales[(r0 / 128) * cols + c]. The
// tile must be complete (a __syncthreads after it was filled); all NT threads call. counts (may be
// NULL) get Q(x)'s saturations and NaNs (each element once).
template <Fp8Format FMT, int NT>
static __device__ __forceinline__ void vec128_emit(Vec128Smem<NT> &sm, int r0, int c0, int nr, int nc, int rows,
                                                   int cols, uint8_t *q, float *q_scales, uint8_t *qt,
                                                   float *qt_scales, unsigned long long *counts) {
    constexpr int G = FQ_G;
    const int bi = r0 / G, bj = c0 / G;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = warp; r < G; r += NT / 32) {  // row amax: a warp per row, 4 elements a lane
        unsigned m = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) m = max(m, abs_bits(sm.tile[r][lane * 4 + k]));
        m = __reduce_max_sync(0xFFFFFFFFu, m);
        if (lane == 0) {
            const float sr = scale_of_bits(FMT, m);
            sm.rs[r] = sr;
            if (r < nr) q_scales[(size_t)bj * rows + r0 + r] = 1.0f / sr;  // VEC128: [j * R + r]
        }
    }
    if (qt) {  // column amax in NT / G parts of rows (uniform branch)
        const int c = threadIdx.x % G, p = threadIdx.x / G, per = G / (NT / G);
        unsigned m = 0;
        for (int k = 0; k < per; k++) m = max(m, abs_bits(sm.tile[p * per + k][c]));
        sm.part[p][c] = m;
    }
    __syncthreads();
    if (qt && threadIdx.x < G) {
        const int c = threadIdx.x;
        unsigned m = 0;
        for (int p = 0; p < NT / G; p++) m = max(m, sm.part[p][c]);
        const float sc = scale_of_bits(FMT, m);
        sm.cs[c] = sc;
        if (c < nc) qt_scales[(size_t)bi * cols + c0 + c] = 1.0f / sc;  // [j * R + r], R = cols
    }
    __syncthreads();
    unsigned sat = 0, nan = 0, tsat = 0, tnan = 0;
    emit_tile_rows<FMT, NT>(q, sm.tile, rows, cols, r0, c0, nr, nc, [&](int r) { return sm.rs[r]; }, sat, nan);
    if (qt) emit_tile_cols<FMT, NT>(qt, sm.tile, rows, r0, c0, nr, nc, [&](int c) { return sm.cs[c]; }, tsat, tnan);
    flush_counts(counts, sat, nan);  // Q(x)'s: each element counted once
}

#endif  // FP8_QUANT_CUH
