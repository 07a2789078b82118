// fp8_quant.cuh: the device side of the linear layers' FP8 quantization (linear_fp8.c's contract),
// shared by the stand-alone quantize kernels (linear_fp8_gpu.cu) and the layers that quantize
// their own output (layers_fp8.cu), so that both run literally the same code: same amax (max of
// |x|'s BF16 bits, NaN ignored: exact, so any reduction order agrees), same power-of-two scale
// (fp8.h's fp8_scale_for_amax) and the same codes as the CPU's integer encoder (fp8.h's
// fp8_from_f32), here from the hardware conversion (fp8_cvt.cuh: equal bit for bit, NaN included).
//
// vec128_tile is a whole "1x128 both ways" tile: a producer gives a 128 x 128 BF16 tile of x (rows
// r0.., columns c0.. of x (rows, cols)), eight values of a row at a time, into registers; the
// tile's slices of Q(x) (each tile row: one 1x128 slice along cols) are quantized from those
// registers and the slices of Q(x^T) (each tile column: one 1x128 slice along rows = tokens) from
// a copy in shared memory, with their VEC128 scales (1/s at [j * R + r]). Whoever produces the
// tile (a load of x, an RMSNorm, a SwiGLU) gets the codes fp8_quantize gives for its BF16 values.
// tensor_tile is the same with per-tensor scaling (one scale known before the tile: the producer's
// amax or delayed scaling's): Q(x^T) is then the transpose of Q(x)'s codes, through shared memory.
#ifndef FP8_QUANT_CUH
#define FP8_QUANT_CUH

#include <cuda_runtime.h>  // __reduce_max_sync, __syncthreads
#include <stdint.h>        // uint8_t, uint16_t, uint32_t, uintptr_t

#include "core/fp8.h"        // fp8_scale_for_amax, bf16_to_f32, fp8_max, Fp8Format
#include "gpu/fp8_cvt.cuh"   // fp8x2_from_f32 (fp8_from_f32's codes from the hardware conversion), transpose4x4, amax2
#include "core/precision.h"  // FP8_GROUP

#define FQ_G FP8_GROUP  // 128: slice length, tile side

// Host: launches kernel<E4M3 or E5M2> (fmt) with `threads` threads on `stream`, then checks the
// launch (cuda_check.h's CUDA_CHECK_LAUNCH) - the kernels here are templated on the format.
#define LAUNCH_BY_FMT(fmt, kernel, grid, threads, stream, ...)                                   \
    do {                                                                                        \
        if ((fmt) == FP8_E4M3) kernel<FP8_E4M3><<<(grid), (threads), 0, (stream)>>>(__VA_ARGS__); \
        else kernel<FP8_E5M2><<<(grid), (threads), 0, (stream)>>>(__VA_ARGS__);                  \
        CUDA_CHECK_LAUNCH();                                                                    \
    } while (0)

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
// Folds m (abs_bits / max_abs8 of this thread's values) into *amax_f32, a tensor's amax as FP32
// bits (non-negative floats order like their bits, so atomicMax is a float max; start it at 0).
// Any subset of a warp's threads may call: the maximum over those is taken first, and the one
// atomic is skipped when the stored value is already as large, which after the first few warps
// is nearly always (a read from L2 instead of thousands of atomics on one address).
static __device__ __forceinline__ void publish_amax(unsigned m, unsigned *amax_f32) {
    const unsigned active = __activemask();
    m = __reduce_max_sync(active, m);
    if ((threadIdx.x & 31) == (unsigned)(__ffs(active) - 1) && m &&
        (m << 16) > *(volatile const unsigned *)amax_f32)
        atomicMax(amax_f32, m << 16);
}
static __device__ __forceinline__ float scale_of_bits(Fp8Format fmt, unsigned amax_bits) {
    return fp8_scale_for_amax(fmt, bf16_to_f32((uint16_t)amax_bits));
}

// x * s for the BF16 bits bf, counting saturations and NaNs exactly as linear_fp8.c's quantize_run.
template <Fp8Format FMT>
static __device__ __forceinline__ float scaled(unsigned bf, float s, unsigned &sat, unsigned &nan) {
    const float v = bf16_to_f32((uint16_t)bf) * s;  // exact: s is a power of two
    if (v != v) nan++;
    else if (fabsf(v) > fp8_max(FMT)) sat++;
    return v;
}
// code = fp8(x * s) (one value), and two codes (a in bits 0-7, b in bits 8-15).
template <Fp8Format FMT>
static __device__ __forceinline__ uint32_t quant(unsigned bf, float s, unsigned &sat, unsigned &nan) {
    return fp8x2_from_f32<FMT>(scaled<FMT>(bf, s, sat, nan), 0.0f) & 0xFFu;
}
template <Fp8Format FMT>
static __device__ __forceinline__ uint32_t quant2(unsigned a, unsigned b, float s, unsigned &sat, unsigned &nan) {
    return fp8x2_from_f32<FMT>(scaled<FMT>(a, s, sat, nan), scaled<FMT>(b, s, sat, nan));
}
// Eight BF16 (element 0 in the low half of w[0]) -> eight codes.
template <Fp8Format FMT>
static __device__ __forceinline__ uint2 quant8(const uint32_t w[4], float s, unsigned &sat, unsigned &nan) {
    uint32_t o[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
        o[h] = quant2<FMT>(w[2 * h] & 0xFFFFu, w[2 * h] >> 16, s, sat, nan) |
               quant2<FMT>(w[2 * h + 1] & 0xFFFFu, w[2 * h + 1] >> 16, s, sat, nan) << 16;
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

// Block (i, j) of a 128x128 grid of n_gr x n_gc blocks gets 1/s at [i * L + j], L = n_gc rounded
// up to 4 (cuBLASLt's BLK128x128_32F layout); the block at the end of a row also fills that row's
// padding, the last block the padding rows (1.0: harmless).
static __device__ __forceinline__ void write_block_scale(float *scales, int i, int j, int n_gr, int n_gc, float inv) {
    const int L = (n_gc + 3) & ~3;
    scales[(long)i * L + j] = inv;
    if (j == n_gc - 1) {
        for (int jj = n_gc; jj < L; jj++) scales[(long)i * L + jj] = 1.0f;
        if (i == n_gr - 1)
            for (int ii = n_gr; ii < ((n_gr + 3) & ~3); ii++)
                for (int jj = 0; jj < L; jj++) scales[(long)ii * L + jj] = 1.0f;
    }
}

// A per-tensor operand's two scale floats (may be NULL: no operand): [0] = 1/s, [1] = the amax
// *amax it came from, unless [1] is where the amax is read from (the amax pass writes it there).
// One thread of one CTA calls; the other CTAs read *amax, never these.
static __device__ __forceinline__ void write_tensor_scales(float *scales, float inv, const float *amax) {
    if (!scales) return;
    scales[0] = inv;
    if (scales + 1 != amax) scales[1] = *amax;
}
// A per-tensor kernel's two operands, Q(x) and Q(x^T) (either may be NULL), with the scale 1/inv
// of the amax *amax: their scale floats, written by thread 0 of CTA (0, 0) only.
static __device__ __forceinline__ void tensor_scales_once(float *q_scales, float *qt_scales, float inv,
                                                          const float *amax) {
    if (blockIdx.x != 0 || blockIdx.y != 0 || threadIdx.x != 0) return;
    write_tensor_scales(q_scales, inv, amax);
    write_tensor_scales(qt_scales, inv, amax);
}

// Element e of eight BF16 packed in w[4] (element 0 in the low half of w[0]), as bits.
static __device__ __forceinline__ unsigned short half_of(const uint32_t w[4], int e) {
    return (unsigned short)(w[e >> 1] >> (16 * (e & 1)));
}

// load8 for a group known to be whole (FULL) or not: FULL skips the per-element bounds checks.
template <bool FULL>
static __device__ __forceinline__ void load8_tile(uint32_t w[4], const uint16_t *src, int c, int nc, bool vec) {
    if (FULL && vec) {
        const uint4 v = *reinterpret_cast<const uint4 *>(src);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    } else if (FULL) {
#pragma unroll
        for (int e = 0; e < 8; e++) w[e >> 1] = (e & 1) ? (w[e >> 1] | (uint32_t)src[e] << 16) : (uint32_t)src[e];
    } else {
        load8(w, src, c, nc, vec);
    }
}

// --- vec128_tile ---------------------------------------------------------------------------------
// 256 threads per tile. Thread t produces columns [8 (t % 16), +8) of the tile rows t / 16 + 16 k,
// k = 0..7, and keeps them in registers: a row's 16 producers reduce its amax with shuffles and
// write its Q(x) codes (8 bytes each); each thread's column maxima over its 8 rows meet in
// shared memory per warp. The tile's copy in shared memory is read back by column pairs (thread
// t: columns 2 (t % 64) and + 1, rows [32 (t / 64), +32)), which gives 32 consecutive codes of two
// rows of Q(x^T): two 32-byte stores each. One __syncthreads.
//
// A producer comes in two parts so that the loads of several rows are in flight together (the
// kernels are memory-bound, and a load followed by its use at once would leave one row's loads
// in flight per thread): load(r, c, raw) issues the global loads of tile row r, columns [c, c + 8)
// into a Raw, make(r, c, raw, w) turns them into the eight BF16 of the output. BATCH rows are
// loaded before the first is made (BATCH * sizeof(Raw) registers). Both get a FullTag first:
// FullTag<true> when the whole tile lies inside x (no bounds checks needed).
//
// The amaxes are maxima of |x| over BF16 pairs (amax2, fp8_cvt.cuh): max(a, NaN) = a, so NaN is ignored as
// abs_bits ignores it, and on non-negative BF16 the order of values is the order of bits: the
// same amax bits as abs_bits / max_abs8.
#define FQ_NT 256

struct Vec128Tile {
    uint32_t tile[FQ_G][FQ_G / 2];       // BF16 pairs: word j of row r = columns 2j (low), 2j + 1
    uint32_t part[FQ_NT / 32][FQ_G / 2]; // column amax pairs (BF16x2, same layout) per warp's 16 rows
    unsigned wmax[FQ_NT / 32];           // the amax of each warp's 16 rows (qt in 128x128 blocks)
};

// A producer's loads: N groups of eight BF16 (and one float, e.g. a row's rstd).
template <int N>
struct Bf16x8Loads {
    uint32_t v[N][4];
    float f;
};

// FullTag<true>: the tile is 128 x 128 inside x, so load / make may skip their bounds checks.
template <bool F>
struct FullTag {
    static constexpr bool value = F;
};

// Q(x^T)'s codes of the tile's columns ca = 2 cp and ca + 1 with the scales sa, sb: the tile's rows
// [rb, rb + 32) of those columns (from sm's copy), 32 consecutive codes of rows c0 + ca and
// c0 + ca + 1 of qt (cols, rows) at its columns r0 + rb..; nr x nc of the tile valid (FULL: all).
template <Fp8Format FMT, bool FULL>
static __device__ __forceinline__ void emit_qt_columns(const Vec128Tile &sm, uint8_t *qt, int rows, int r0, int c0,
                                                       int nr, int nc, int cp, int rb, float sa, float sb) {
    const int ca = 2 * cp;
    uint32_t qa[8], qb[8];  // codes of column ca / ca + 1, rows rb + 4 i .. + 3
    unsigned tsat = 0, tnan = 0;  // Q(x^T)'s: not counted (each element once, in Q(x))
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint32_t x4[4];
#pragma unroll
        for (int j = 0; j < 4; j++) x4[j] = sm.tile[rb + 4 * i + j][cp];
        qa[i] = quant2<FMT>(x4[0] & 0xFFFFu, x4[1] & 0xFFFFu, sa, tsat, tnan) |
                quant2<FMT>(x4[2] & 0xFFFFu, x4[3] & 0xFFFFu, sa, tsat, tnan) << 16;
        qb[i] = quant2<FMT>(x4[0] >> 16, x4[1] >> 16, sb, tsat, tnan) |
                quant2<FMT>(x4[2] >> 16, x4[3] >> 16, sb, tsat, tnan) << 16;
    }
    const bool vec_t = rows % 16 == 0 && ((uintptr_t)qt & 15) == 0 && (FULL || rb + 32 <= nr);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int col = ca + h;
        if (!FULL && col >= nc) continue;
        uint32_t cd[8];  // (selected with constant indices: the arrays stay in registers)
#pragma unroll
        for (int i = 0; i < 8; i++) cd[i] = h ? qb[i] : qa[i];
        uint8_t *dst = qt + (size_t)(c0 + col) * rows + r0 + rb;
        if (vec_t) {
            reinterpret_cast<uint4 *>(dst)[0] = make_uint4(cd[0], cd[1], cd[2], cd[3]);
            reinterpret_cast<uint4 *>(dst)[1] = make_uint4(cd[4], cd[5], cd[6], cd[7]);
        } else {
#pragma unroll
            for (int e = 0; e < 32; e++)
                if (rb + e < nr) dst[e] = (uint8_t)(cd[e >> 2] >> (8 * (e & 3)));
        }
    }
}

// Eight codes of row r (tile rows), columns [c, c + 8), to q (rows, cols) at (r0 + r, c0 + c):
// one 8-byte store when vec (and whole), else byte by byte up to nc.
template <bool FULL>
static __device__ __forceinline__ void store_codes8(uint8_t *q, uint2 codes, int r0, int c0, int r, int c, int cols,
                                                    int nc, bool vec) {
    uint8_t *dst = q + (size_t)(r0 + r) * cols + c0 + c;
    if (vec && (FULL || c + 8 <= nc)) {
        *reinterpret_cast<uint2 *>(dst) = codes;
    } else {
        for (int e = 0; e < 8 && c + e < nc; e++) dst[e] = (uint8_t)((e < 4 ? codes.x : codes.y) >> (8 * (e & 3)));
    }
}

// The loads of the thread's tile rows rsub + 16 (kb + j), j < BATCH, columns [c, c + 8), issued
// before any is used (the rows inside the tile only), into raw.
template <bool FULL, int BATCH, class Raw, class Load>
static __device__ __forceinline__ void load_rows(Raw (&raw)[BATCH], Load &load, int kb, int rsub, int c, int nr,
                                                 int nc) {
#pragma unroll
    for (int j = 0; j < BATCH; j++) {
        const int r = rsub + 16 * (kb + j);
        if (FULL || (r < nr && c < nc)) load(FullTag<FULL>(), r, c, raw[j]);
    }
}

// Tile row r's eight values at columns [c, c + 8) from make (raw: load's), into w: zeros outside
// the tile (r >= nr or c >= nc), and columns past nc cleared. Returns whether (r, c) is inside.
template <bool FULL, class Raw, class Make>
static __device__ __forceinline__ bool make_row8(uint32_t w[4], Make &make, int r, int c, int nr, int nc,
                                                 const Raw &raw) {
    w[0] = w[1] = w[2] = w[3] = 0;
    const bool inside = FULL || (r < nr && c < nc);
    if (inside) {
        make(FullTag<FULL>(), r, c, raw, w);
        if (!FULL && c + 8 > nc)
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (c + e >= nc) w[e >> 1] &= ~(0xFFFFu << (16 * (e & 1)));
    }
    return inside;
}

// The tile rows [r0, r0 + nr) x columns [c0, c0 + nc) of x (rows, cols), from load / make (called
// for r < nr, c < nc only; elements past nc are zeroed here). Writes Q(x) (rows, cols) to q (may
// be NULL) with VEC128 scales at q_scales[(c0 / 128) * rows + r] and, when qt is not NULL,
// Q(x^T) (cols, rows) to qt: 1x128 slices along rows with scales at qt_scales[(r0 / 128) * cols +
// c], or, with qt_block, the tile as one 128x128 block of x^T (one scale from the tile's amax, in
// the BLK128x128 layout; the partial tiles at the edges are partial blocks). counts (may be NULL)
// get Q(x)'s saturations and NaNs (each element once). All FQ_NT threads call; the shared memory
// may be reused after a __syncthreads.
template <Fp8Format FMT, int BATCH, class Raw, bool FULL, bool QT_BLOCK, class Load, class Make>
static __device__ __forceinline__ void vec128_tile_body(Vec128Tile &sm, int r0, int c0, int nr, int nc, int rows, int cols,
                                                   uint8_t *q, float *q_scales, uint8_t *qt, float *qt_scales,
                                                   unsigned long long *counts, Load load, Make make) {
    static_assert(8 % BATCH == 0, "BATCH must divide the 8 rows of a thread");
    constexpr int G = FQ_G;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int c = (t & 15) * 8, rsub = t >> 4;
    uint32_t w[8][4];
    uint32_t cm[4] = {0, 0, 0, 0};  // this thread's column maxima, BF16 pairs as in the tile
    unsigned rm[8];                 // this thread's part of each row's amax
#pragma unroll
    for (int kb = 0; kb < 8; kb += BATCH) {
        Raw raw[BATCH];
        load_rows<FULL, BATCH>(raw, load, kb, rsub, c, nr, nc);
#pragma unroll
        for (int j = 0; j < BATCH; j++) {
            const int k = kb + j, r = rsub + 16 * k;
            make_row8<FULL>(w[k], make, r, c, nr, nc, raw[j]);
            *reinterpret_cast<uint4 *>(&sm.tile[r][c / 2]) = make_uint4(w[k][0], w[k][1], w[k][2], w[k][3]);
            uint32_t m2 = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                m2 = amax2(m2, w[k][i]);
                cm[i] = amax2(cm[i], w[k][i]);
            }
            rm[k] = amax_of_pair(m2);
        }
    }
    // Q(x): each row's amax over its 16 producers (lanes 0-15 or 16-31 of a warp), then the codes
    unsigned sat = 0, nan = 0, tile_m = 0;  // tile_m: the amax of this thread's rows
    const bool vec_q = cols % 8 == 0 && ((uintptr_t)q & 7) == 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        unsigned m = rm[k];
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
        if (QT_BLOCK) tile_m = max(tile_m, m);
        const int r = rsub + 16 * k;
        if (q == nullptr || (!FULL && r >= nr)) continue;
        const float s = scale_of_bits(FMT, m);
        if (c == 0) q_scales[(size_t)(c0 / G) * rows + r0 + r] = 1.0f / s;  // VEC128: [j * R + r]
        if (!FULL && c >= nc) continue;
        store_codes8<FULL>(q, quant8<FMT>(w[k], s, sat, nan), r0, c0, r, c, cols, nc, vec_q);
    }
    flush_counts(counts, sat, nan);
    if (qt == nullptr) return;
    // column maxima: the two half-warps, then the warps through shared memory
#pragma unroll
    for (int i = 0; i < 4; i++) cm[i] = amax2(cm[i], __shfl_xor_sync(0xFFFFFFFFu, cm[i], 16));
    if (lane < 16) *reinterpret_cast<uint4 *>(&sm.part[warp][c / 2]) = make_uint4(cm[0], cm[1], cm[2], cm[3]);
    if (QT_BLOCK) {
        tile_m = max(tile_m, __shfl_xor_sync(0xFFFFFFFFu, tile_m, 16));
        if (lane == 0) sm.wmax[warp] = tile_m;
    }
    __syncthreads();
    // Q(x^T): columns ca = 2 cp and ca + 1, rows [rb, rb + 32)
    const int cp = t & 63, ca = 2 * cp, rb = 32 * (t >> 6);
    uint32_t mp = 0;
#pragma unroll
    for (int v = 0; v < FQ_NT / 32; v++) mp = amax2(mp, sm.part[v][cp]);
    unsigned ma = mp & 0xFFFFu, mb = mp >> 16;
    if (QT_BLOCK) {  // one scale for the tile: the max over its warps' rows
        unsigned tm = 0;
#pragma unroll
        for (int v = 0; v < FQ_NT / 32; v++) tm = max(tm, sm.wmax[v]);
        ma = mb = tm;
    }
    const float sa = scale_of_bits(FMT, ma), sb = scale_of_bits(FMT, mb);
    if (QT_BLOCK) {  // BLK128x128 of qt (cols, rows): block (c0 / 128, r0 / 128)
        if (t == 0) write_block_scale(qt_scales, c0 / G, r0 / G, (cols + G - 1) / G, (rows + G - 1) / G, 1.0f / sa);
    } else if (rb == 0) {
        if (FULL || ca < nc) qt_scales[(size_t)(r0 / G) * cols + c0 + ca] = 1.0f / sa;  // [j * R + r], R = cols
        if (FULL || ca + 1 < nc) qt_scales[(size_t)(r0 / G) * cols + c0 + ca + 1] = 1.0f / sb;
    }
    emit_qt_columns<FMT, FULL>(sm, qt, rows, r0, c0, nr, nc, cp, rb, sa, sb);
}

// The tile as above; full tiles (128 x 128, all but the edges of x) take a copy of the code
// without the bounds checks (per element in make: they cost branches).
template <Fp8Format FMT, int BATCH, class Raw, class Load, class Make>
static __device__ __forceinline__ void vec128_tile(Vec128Tile &sm, int r0, int c0, int nr, int nc, int rows, int cols,
                                                   uint8_t *q, float *q_scales, uint8_t *qt, float *qt_scales,
                                                   bool qt_block, unsigned long long *counts, Load load, Make make) {
    const bool full = nr == FQ_G && nc == FQ_G;  // uniform branches: four copies of the body
    if (full && !qt_block)
        vec128_tile_body<FMT, BATCH, Raw, true, false>(sm, r0, c0, nr, nc, rows, cols, q, q_scales, qt,
                                                       qt_scales, counts, load, make);
    else if (!qt_block)
        vec128_tile_body<FMT, BATCH, Raw, false, false>(sm, r0, c0, nr, nc, rows, cols, q, q_scales, qt,
                                                        qt_scales, counts, load, make);
    else if (full)
        vec128_tile_body<FMT, BATCH, Raw, true, true>(sm, r0, c0, nr, nc, rows, cols, q, q_scales, qt,
                                                      qt_scales, counts, load, make);
    else
        vec128_tile_body<FMT, BATCH, Raw, false, true>(sm, r0, c0, nr, nc, rows, cols, q, q_scales, qt,
                                                       qt_scales, counts, load, make);
}

// --- per-tensor tiles: Q(x^T) as the transpose of Q(x)'s codes ---------------------------------
// With one scale for the whole tensor an element has the same code in both layouts, so Q(x^T) is
// a transpose of the codes (one byte each) rather than a second quantization of the BF16 tile:
// half the shared memory (16 KiB), no BF16 round trip through it, and one conversion per element.
//
// CodeTile: a 128 x 128 tile of codes, row r as 32 words (word i = columns 4i .. 4i + 3, column 4i
// in the low byte), stored at word i ^ (r & 16): the two 16-row halves that one warp of
// emit_qt_codes reads then fall in different banks.
struct CodeTile {
    uint32_t w[FQ_G][FQ_G / 4];
};
static __device__ __forceinline__ int code_word(int r, int i) { return i ^ (r & 16); }
// The eight codes of row r, columns [c, c + 8) (c % 8 == 0: one aligned 8-byte store).
static __device__ __forceinline__ void code_tile_put(CodeTile &ct, int r, int c, uint2 codes) {
    *reinterpret_cast<uint2 *>(&ct.w[r][code_word(r, c / 4)]) = codes;
}

// Q(x^T) (cols, rows) of the tile at rows r0.., columns c0.. of x (nr x nc valid; FULL: all) from
// its codes. Thread t transposes columns 4 cq .. 4 cq + 3 of tile rows rb .. rb + 15, cq = 16 (warp
// & 1) + lane / 2, rb = 32 (warp / 2) + 16 (lane & 1): 16 word reads (a warp's 32 lanes in 32
// banks), four 4x4 byte transposes, and per column one 16-byte store (a lane pair writes 32
// consecutive bytes of a row of qt). All FQ_NT threads call, after the barrier that follows the
// last code_tile_put.
template <bool FULL>
static __device__ __forceinline__ void emit_qt_codes(const CodeTile &ct, uint8_t *qt, int rows, int r0, int c0, int nr,
                                                     int nc) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int cq = 16 * (warp & 1) + (lane >> 1), rb = 32 * (warp >> 1) + 16 * (lane & 1);
    uint32_t col[4][4];  // col[h][b]: the codes of column 4 cq + h, rows rb + 4 b .. + 3 (low byte first)
#pragma unroll
    for (int b = 0; b < 4; b++) {
        uint32_t x[4], out[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = rb + 4 * b + i;
            x[i] = ct.w[r][code_word(r, cq)];
        }
        transpose4x4(x[0], x[1], x[2], x[3], out);
#pragma unroll
        for (int h = 0; h < 4; h++) col[h][b] = out[h];
    }
    const bool vec = rows % 16 == 0 && ((uintptr_t)qt & 15) == 0 && (FULL || rb + 16 <= nr);
#pragma unroll
    for (int h = 0; h < 4; h++) {
        const int c = 4 * cq + h;
        if (!FULL && c >= nc) continue;
        uint8_t *dst = qt + (size_t)(c0 + c) * rows + r0 + rb;
        if (vec) {
            *reinterpret_cast<uint4 *>(dst) = make_uint4(col[h][0], col[h][1], col[h][2], col[h][3]);
        } else {
#pragma unroll
            for (int e = 0; e < 16; e++)
                if (FULL || rb + e < nr) dst[e] = (uint8_t)(col[h][e >> 2] >> (8 * (e & 3)));
        }
    }
}

// The tile of vec128_tile_body's producer (same load / make and thread layout: thread t makes
// columns [8 (t % 16), +8) of rows t / 16 + 16 k) with per-tensor scaling: every code takes the
// one scale s (tensor_tile's, from the tensor's amax or delayed scaling's history maximum; codes
// past it saturate). Each row's codes are made as soon as its values are, stored to q (may
// be NULL) and to the CodeTile, and Q(x^T) (to qt, may be NULL) is their transpose. observe (may
// be NULL) gets the tile's own amax folded in (publish_amax); counts (may be NULL) Q(x)'s
// saturations and NaNs, each element once. The operands' scale floats are tensor_tile's.
template <Fp8Format FMT, int BATCH, class Raw, bool FULL, class Load, class Make>
static __device__ __forceinline__ void tensor_tile_body(CodeTile &ct, int r0, int c0, int nr, int nc, int rows, int cols,
                                                        uint8_t *q, uint8_t *qt, float s, unsigned *observe,
                                                        unsigned long long *counts, Load load, Make make) {
    static_assert(8 % BATCH == 0, "BATCH must divide the 8 rows of a thread");
    const int t = threadIdx.x, c = (t & 15) * 8, rsub = t >> 4;
    const bool vec_q = cols % 8 == 0 && ((uintptr_t)q & 7) == 0;
    unsigned sat = 0, nan = 0;
    uint32_t om = 0;  // the amax of this thread's values (a BF16 pair), when observed
#pragma unroll
    for (int kb = 0; kb < 8; kb += BATCH) {
        Raw raw[BATCH];
        load_rows<FULL, BATCH>(raw, load, kb, rsub, c, nr, nc);
#pragma unroll
        for (int j = 0; j < BATCH; j++) {
            const int r = rsub + 16 * (kb + j);
            uint32_t w[4];
            const bool inside = make_row8<FULL>(w, make, r, c, nr, nc, raw[j]);
            if (observe)
#pragma unroll
                for (int i = 0; i < 4; i++) om = amax2(om, w[i]);
            const uint2 codes = quant8<FMT>(w, s, sat, nan);  // (zeros outside the tile: no counts)
            if (q && inside) store_codes8<FULL>(q, codes, r0, c0, r, c, cols, nc, vec_q);
            if (qt) code_tile_put(ct, r, c, codes);
        }
    }
    flush_counts(counts, sat, nan);
    if (observe) publish_amax(amax_of_pair(om), observe);
    if (qt == nullptr) return;
    __syncthreads();
    emit_qt_codes<FULL>(ct, qt, rows, r0, c0, nr, nc);
}

// The per-tensor tile, full tiles without the bounds checks (as vec128_tile); CTA (0, 0) also
// writes both operands' scale floats (1/s and the amax s came from, as fp8_quantize_gpu's
// per-tensor operands hold them; q_scales, qt_scales may be NULL).
template <Fp8Format FMT, int BATCH, class Raw, class Load, class Make>
static __device__ __forceinline__ void tensor_tile(CodeTile &ct, int r0, int c0, int nr, int nc, int rows, int cols,
                                                   uint8_t *q, float *q_scales, uint8_t *qt, float *qt_scales,
                                                   const float *tensor_amax, unsigned *observe,
                                                   unsigned long long *counts, Load load, Make make) {
    const float s = fp8_scale_for_amax(FMT, *tensor_amax);
    tensor_scales_once(q_scales, qt_scales, 1.0f / s, tensor_amax);  // (exact: a power of two)
    if (nr == FQ_G && nc == FQ_G)
        tensor_tile_body<FMT, BATCH, Raw, true>(ct, r0, c0, nr, nc, rows, cols, q, qt, s, observe, counts, load, make);
    else
        tensor_tile_body<FMT, BATCH, Raw, false>(ct, r0, c0, nr, nc, rows, cols, q, qt, s, observe, counts, load, make);
}

#endif  // FP8_QUANT_CUH
