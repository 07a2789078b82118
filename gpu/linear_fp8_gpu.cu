// linear_fp8_gpu.cu: FP8 quantization kernels and cuBLASLt FP8 GEMMs of the linear layers (see
// linear_fp8_gpu.h; the contract is at the top of linear_fp8.c).
//
// Quantization. Every kernel reads BF16, takes amax over a group as the max of |x|'s bits (NaN
// ignored, exact, so any reduction order gives the same result), computes s with fp8.h's
// fp8_scale_for_amax and encodes x * s with the hardware conversion, which gives fp8.h's integer
// encoder's codes bit for bit (fp8_cvt.cuh): the same scales and codes as the CPU. Kernels:
//   amax_kernel + cast_tensor_kernel  per tensor, no transpose: flat, 16-byte loads
//   tile128_kernel     one 128x128 tile of x in shared memory; writes Q(x) and/or Q(x^T) from it
//                      (128x128 blocks, or per tensor with the amax of amax_kernel)
//   vec128_kernel      one warp per 1x128 slice along cols
//   vec128t_kernel     128 rows x 32 cols of x in shared memory: 32 slices along rows, written
//                      as rows of x^T
//   vec128both_kernel  1x128 Q(x) and Q(x^T) together: one 128x128 tile, its rows and columns
//                      are the slices of both (fp8_quant.cuh's vec128_tile, which layers_fp8.cu's
//                      RMSNorm and SwiGLU kernels run on the tiles they compute)
// GEMMs. out (n, m) row-major is column-major (m, n): D = op(A) . B with A = rhs stored (k, m)
// column-major, transposed ("T"), and B = lhs stored (k, n) column-major ("N"), the TN layout
// FP8 needs. A's scales are rhs's, B's are lhs's. Plans are cached per shape/format/grouping; the
// scale pointers are data, set on the cached descriptor before each call.
#include "gpu/linear_fp8_gpu.h"

#include <cublasLt.h>      // the cuBLASLt API
#include <cuda_runtime.h>  // cudaMalloc, launches
#include <stdint.h>        // uintptr_t
#include <string.h>        // memset

#include "core/common.h"      // FATAL
#include "gpu/cuda_check.h"   // CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLASLT_CHECK
#include "gpu/fp8_quant.cuh"  // the device quantization shared with layers_fp8.cu (abs_bits, quant,
                          // quant8, vec128_tile)
#include "gpu/gemm_plan_cache.h"  // GemmPlanCache: the plans cached per shape
#include "core/gpu_sizes.h"       // the scale-buffer sizes (shared with the memory plan)
#include "gpu/matmul.h"           // the shared cuBLASLt handle and workspace

#define THREADS 256   // every kernel; flush_counts needs whole warps
#define G FP8_GROUP   // 128

__host__ __device__ static inline int cdiv(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ static inline int round4(int a) { return (a + 3) & ~3; }

long fp8_gpu_scale_count(Fp8Grouping g, int rows, int cols) {
    if (g != FP8_GROUP_TENSOR && g != FP8_GROUP_1x128 && g != FP8_GROUP_128x128)
        FATAL("fp8_gpu_scale_count: unknown grouping %d", (int)g);
    return (long)gpu_fp8_scales(g, (size_t)rows, (size_t)cols);  // with cuBLASLt's padding (gpu_sizes.h)
}

void fp8_operand_alloc(Fp8Operand *op, int rows, int cols, Fp8Grouping g, Fp8Format fmt) {
    if (rows <= 0 || cols <= 0) FATAL("fp8_operand_alloc: empty shape (%d, %d)", rows, cols);
    memset(op, 0, sizeof *op);
    CUDA_CHECK(cudaMalloc(&op->codes, (size_t)rows * cols));
    CUDA_CHECK(cudaMalloc(&op->scales, sizeof(float) * (size_t)fp8_gpu_scale_count(g, rows, cols)));
    op->rows = rows;
    op->cols = cols;
    op->grouping = g;
    op->fmt = fmt;
}

void fp8_operand_free(Fp8Operand *op) {
    if (op->codes) CUDA_CHECK(cudaFree(op->codes));
    if (op->scales) CUDA_CHECK(cudaFree(op->scales));
    memset(op, 0, sizeof *op);
}

// ================================ quantization kernels ========================================

// Max over the block (all threads get it). red: 32 words of shared memory.
__device__ unsigned block_max(unsigned v, unsigned *red) {
    v = __reduce_max_sync(0xFFFFFFFFu, v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    unsigned r = lane < (int)(blockDim.x >> 5) ? red[lane] : 0u;
    r = __reduce_max_sync(0xFFFFFFFFu, r);
    __syncthreads();  // red may be reused
    return r;
}

// Stages rows [r0, r0 + nr) x columns [c0, c0 + nc) of x (rows of `cols` BF16) into a shared tile
// of ROWS x WIDTH elements with row pitch PITCH (zeros outside x), 8 elements per load; returns
// the largest |x| bit pattern this thread saw (max_abs8).
template <int ROWS, int WIDTH, int PITCH>
__device__ __forceinline__ unsigned stage_tile(uint16_t (*tile)[PITCH], const uint16_t *x, int cols, int r0, int c0,
                                               int nr, int nc) {
    const bool vec_in = cols % 8 == 0 && ((uintptr_t)x & 15) == 0;
    unsigned m = 0;
    for (int id = threadIdx.x; id < ROWS * WIDTH / 8; id += THREADS) {
        const int r = id / (WIDTH / 8), c = (id % (WIDTH / 8)) * 8;
        uint32_t w[4] = {0, 0, 0, 0};
        if (r < nr) load8(w, x + (size_t)(r0 + r) * cols + c0 + c, c, nc, vec_in);
        m = max(m, max_abs8(w));
        uint32_t *dst = reinterpret_cast<uint32_t *>(&tile[r][c]);  // 4-byte aligned (PITCH even)
        dst[0] = w[0]; dst[1] = w[1]; dst[2] = w[2]; dst[3] = w[3];
    }
    return m;
}

// Per tensor, pass 1: *amax_f32 = max |x| (as FP32 bits; non-negative floats order like their
// bits, so atomicMax on the bits is a float max). *amax_f32 must be 0 before.
__global__ void __launch_bounds__(THREADS) amax_kernel(const uint16_t *x, long n, unsigned *amax_f32) {
    __shared__ unsigned red[32];
    const long tid = (long)blockIdx.x * blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
    const long n8 = ((uintptr_t)x & 15) == 0 ? n / 8 : 0;
    unsigned m = 0;
    for (long i = tid; i < n8; i += stride) {
        const uint4 v = reinterpret_cast<const uint4 *>(x)[i];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        m = max(m, max_abs8(w));
    }
    for (long i = n8 * 8 + tid; i < n; i += stride) m = max(m, abs_bits(x[i]));
    m = block_max(m, red);
    if (threadIdx.x == 0 && m) atomicMax(amax_f32, m << 16);
}

// Per tensor, pass 2: codes (n) = fp8(x * s), s from the amax *amax; the scales as
// write_tensor_scales.
template <Fp8Format FMT>
__global__ void __launch_bounds__(THREADS) cast_tensor_kernel(uint8_t *codes, const uint16_t *x, long n, float *scales,
                                                              const float *amax, unsigned long long *counts) {
    const float s = fp8_scale_for_amax(FMT, *amax);
    if (blockIdx.x == 0 && threadIdx.x == 0) write_tensor_scales(scales, 1.0f / s, amax);  // exact: s a power of two
    const long tid = (long)blockIdx.x * blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
    const long n8 = (((uintptr_t)x & 15) == 0 && ((uintptr_t)codes & 7) == 0) ? n / 8 : 0;
    unsigned sat = 0, nan = 0;
    for (long i = tid; i < n8; i += stride) {
        const uint4 v = reinterpret_cast<const uint4 *>(x)[i];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        reinterpret_cast<uint2 *>(codes)[i] = quant8<FMT>(w, s, sat, nan);
    }
    for (long i = n8 * 8 + tid; i < n; i += stride) codes[i] = (uint8_t)quant<FMT>(x[i], s, sat, nan);
    flush_counts(counts, sat, nan);
}

// Writes the codes of a G x G tile in shared memory (nr x nc valid) into q, the row-major (rows,
// cols) codes, all with scale s: each thread 8 consecutive codes of one row.
template <Fp8Format FMT>
static __device__ __forceinline__ void emit_tile_rows(uint8_t *q, uint16_t (*tile)[G + 2], int rows, int cols, int r0,
                                                      int c0, int nr, int nc, float s, unsigned &sat, unsigned &nan) {
    const bool vec_out = cols % 8 == 0 && ((uintptr_t)q & 7) == 0;
    for (int id = threadIdx.x; id < G * G / 8; id += THREADS) {
        const int r = id / 16, c = (id % 16) * 8;
        if (r >= nr) continue;
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
// x; each thread 4 consecutive codes.
template <Fp8Format FMT>
static __device__ __forceinline__ void emit_tile_cols(uint8_t *qt, uint16_t (*tile)[G + 2], int rows, int r0, int c0,
                                                      int nr, int nc, float s, unsigned &sat, unsigned &nan) {
    const bool vec_out = rows % 4 == 0 && ((uintptr_t)qt & 3) == 0;
    for (int id = threadIdx.x; id < G * G / 4; id += THREADS) {
        const int c = id / 32, r = (id % 32) * 4;
        if (c >= nc) continue;
        uint8_t *dst = qt + (size_t)(c0 + c) * rows + r0 + r;
        if (vec_out && r + 4 <= nr) {
            *reinterpret_cast<uint32_t *>(dst) = quant2<FMT>(tile[r][c], tile[r + 1][c], s, sat, nan) |
                                                 quant2<FMT>(tile[r + 2][c], tile[r + 3][c], s, sat, nan) << 16;
        } else {
            for (int e = 0; e < 4 && r + e < nr; e++) dst[e] = (uint8_t)quant<FMT>(tile[r + e][c], s, sat, nan);
        }
    }
}

// One 128x128 tile of x (rows, cols): block (blockIdx.y, blockIdx.x). Scale: the tile's own amax
// (128x128 blocks) or, when tensor_amax is given, the tensor's (per-tensor scaling). Writes the
// tile's codes to q (rows, cols) and/or transposed to qt (cols, rows), and the scales.
template <Fp8Format FMT>
__global__ void __launch_bounds__(THREADS)
    tile128_kernel(const uint16_t *x, int rows, int cols, uint8_t *q, float *q_scales, uint8_t *qt,
                   float *qt_scales, const float *tensor_amax, unsigned long long *counts) {
    __shared__ __align__(16) uint16_t tile[G][G + 2];  // +2: the transposed reads hit 8 banks, not 1
    __shared__ unsigned red[32];
    const int bi = blockIdx.y, bj = blockIdx.x;
    const int r0 = bi * G, c0 = bj * G;
    const int nr = min(G, rows - r0), nc = min(G, cols - c0);
    unsigned m = stage_tile<G, G, G + 2>(tile, x, cols, r0, c0, nr, nc);
    float s;
    if (tensor_amax) s = fp8_scale_for_amax(FMT, *tensor_amax);  // uniform branch
    else s = scale_of_bits(FMT, block_max(m, red));
    __syncthreads();  // the tile is complete
    if (threadIdx.x == 0) {
        const float inv = 1.0f / s;
        if (tensor_amax) {
            tensor_scales_once(q_scales, qt_scales, inv, tensor_amax);
        } else {
            if (q_scales) write_block_scale(q_scales, bi, bj, cdiv(rows, G), cdiv(cols, G), inv);
            if (qt_scales) write_block_scale(qt_scales, bj, bi, cdiv(cols, G), cdiv(rows, G), inv);
        }
    }
    unsigned sat = 0, nan = 0, tsat = 0, tnan = 0;
    if (q) emit_tile_rows<FMT>(q, tile, rows, cols, r0, c0, nr, nc, s, sat, nan);
    if (qt) emit_tile_cols<FMT>(qt, tile, rows, r0, c0, nr, nc, s, tsat, tnan);
    if (!q) { sat = tsat; nan = tnan; }  // each element counted once
    flush_counts(counts, sat, nan);
}

// 1x128 slices along cols: one warp per slice (row r, slice j), 4 elements per lane.
template <Fp8Format FMT>
__global__ void __launch_bounds__(THREADS)
    vec128_kernel(const uint16_t *x, int rows, int cols, uint8_t *q, float *scales, unsigned long long *counts) {
    const int n_gc = (cols + G - 1) / G;
    const long slice = (long)blockIdx.x * (THREADS / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    unsigned sat = 0, nan = 0;
    if (slice < (long)rows * n_gc) {  // uniform across the warp
        const int r = (int)(slice / n_gc), j = (int)(slice % n_gc);
        const int nc = min(G, cols - j * G), cl = lane * 4;  // valid columns; this lane's first
        const size_t off = (size_t)r * cols + (size_t)j * G + cl;
        unsigned b[4] = {0, 0, 0, 0};
        if (cols % 4 == 0 && ((uintptr_t)x & 7) == 0 && cl + 4 <= nc) {
            const uint2 v = *reinterpret_cast<const uint2 *>(x + off);
            b[0] = v.x & 0xFFFFu; b[1] = v.x >> 16; b[2] = v.y & 0xFFFFu; b[3] = v.y >> 16;
        } else {
            for (int e = 0; e < 4; e++)
                if (cl + e < nc) b[e] = x[off + e];
        }
        unsigned m = max(max(abs_bits(b[0]), abs_bits(b[1])), max(abs_bits(b[2]), abs_bits(b[3])));
        m = __reduce_max_sync(0xFFFFFFFFu, m);
        const float s = scale_of_bits(FMT, m);
        if (lane == 0) scales[(size_t)j * rows + r] = 1.0f / s;  // VEC128: [j * R + r]
        if (cols % 4 == 0 && ((uintptr_t)q & 3) == 0 && cl + 4 <= nc) {
            *reinterpret_cast<uint32_t *>(q + off) =
                quant2<FMT>(b[0], b[1], s, sat, nan) | quant2<FMT>(b[2], b[3], s, sat, nan) << 16;
        } else {
            for (int e = 0; e < 4 && cl + e < nc; e++) q[off + e] = (uint8_t)quant<FMT>(b[e], s, sat, nan);
        }
    }
    flush_counts(counts, sat, nan);
}

// 1x128 slices of x^T (cols, rows) along its cols = x's rows (the tokens): block (blockIdx.y =
// token slice j, blockIdx.x = 32 columns of x). Writes 32 rows of qt, 128 codes each.
#define VT_COLS 32
template <Fp8Format FMT>
__global__ void __launch_bounds__(THREADS)
    vec128t_kernel(const uint16_t *x, int rows, int cols, uint8_t *qt, float *scales, unsigned long long *counts) {
    __shared__ __align__(16) uint16_t tile[G][VT_COLS + 2];
    __shared__ unsigned part[THREADS / VT_COLS][VT_COLS];
    __shared__ float scale[VT_COLS];
    const int j = blockIdx.y, r0 = j * G, c0 = blockIdx.x * VT_COLS;
    const int nr = min(G, rows - r0), nc = min(VT_COLS, cols - c0);
    stage_tile<G, VT_COLS, VT_COLS + 2>(tile, x, cols, r0, c0, nr, nc);
    __syncthreads();
    {  // column amax in 8 parts of 16 rows
        const int c = threadIdx.x % VT_COLS, p = threadIdx.x / VT_COLS;
        unsigned m = 0;
        for (int k = 0; k < G / (THREADS / VT_COLS); k++) m = max(m, abs_bits(tile[p * 16 + k][c]));
        part[p][c] = m;
    }
    __syncthreads();
    if (threadIdx.x < VT_COLS) {
        unsigned m = 0;
        for (int p = 0; p < THREADS / VT_COLS; p++) m = max(m, part[p][threadIdx.x]);
        const float s = scale_of_bits(FMT, m);
        scale[threadIdx.x] = s;
        if (threadIdx.x < nc) scales[(size_t)j * cols + c0 + threadIdx.x] = 1.0f / s;  // [j * R + r], R = cols
    }
    __syncthreads();
    unsigned sat = 0, nan = 0;
    const int c = threadIdx.x / 8, seg = (threadIdx.x % 8) * 16;  // row c of this block's qt rows, 16 codes
    if (c < nc) {
        const float s = scale[c];
        uint8_t *dst = qt + (size_t)(c0 + c) * rows + r0 + seg;
        if (rows % 16 == 0 && ((uintptr_t)qt & 15) == 0 && seg + 16 <= nr) {
            uint32_t o[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                o[k] = quant2<FMT>(tile[seg + 4 * k][c], tile[seg + 4 * k + 1][c], s, sat, nan) |
                       quant2<FMT>(tile[seg + 4 * k + 2][c], tile[seg + 4 * k + 3][c], s, sat, nan) << 16;
            *reinterpret_cast<uint4 *>(dst) = make_uint4(o[0], o[1], o[2], o[3]);
        } else {
            for (int e = 0; e < 16 && seg + e < nr; e++) dst[e] = (uint8_t)quant<FMT>(tile[seg + e][c], s, sat, nan);
        }
    }
    flush_counts(counts, sat, nan);
}

// 1x128 slices both ways from one 128x128 tile of x (block (blockIdx.y, blockIdx.x)): each tile
// row is one slice of Q(x) (row r, slice blockIdx.x) and each tile column one slice of Q(x^T)
// (row c of x^T, token slice blockIdx.y), so one read of x gives both (vec128_kernel +
// vec128t_kernel read it twice). Same amax, scales and codes as those two; counts of Q(x) only
// (each element once per call).
// Rows of a thread whose loads are in flight together, and the CTAs per SM the tile kernels are
// compiled for (their registers capped to fit), timed with dev/bench/bench_fp8_quant.cu on one H200
// (2026-11-30; the kernels' times: docs/perf.md, "FP8 linears: quantize kernels and GEMMs").
constexpr int VEC128_BATCH = 8;     // one load a row: 8 rows in flight
constexpr int VEC128_MIN_CTAS = 4;  // a 128 x 128 tile per CTA, 4 resident
// vec128_tile's producer when the tile is read from a BF16 x (rows, cols) as it is: the tile of
// this CTA (block (blockIdx.y, blockIdx.x), nr x nc valid), the loads of its row r, columns
// c .. c + 7, and the values unchanged (XTileCopy).
struct XTileLoad {
    const uint16_t *x;
    int cols, r0, c0, nr, nc;
    bool vec;
    __device__ XTileLoad(const uint16_t *x_, int rows, int cols_)
        : x(x_), cols(cols_), r0(blockIdx.y * G), c0(blockIdx.x * G), nr(min(G, rows - r0)), nc(min(G, cols - c0)),
          vec(cols_ % 8 == 0 && ((uintptr_t)x_ & 15) == 0) {}
    template <class Full>
    __device__ void operator()(Full, int r, int c, Bf16x8Loads<1> &in) const {
        load8_tile<Full::value>(in.v[0], x + (size_t)(r0 + r) * cols + c0 + c, c, nc, vec);
    }
};
struct XTileCopy {
    template <class Full>
    __device__ void operator()(Full, int, int, const Bf16x8Loads<1> &in, uint32_t w[4]) const {
        w[0] = in.v[0][0]; w[1] = in.v[0][1]; w[2] = in.v[0][2]; w[3] = in.v[0][3];
    }
};

template <Fp8Format FMT>
__global__ void __launch_bounds__(FQ_NT, VEC128_MIN_CTAS)
    vec128both_kernel(const uint16_t *x, int rows, int cols, uint8_t *q, float *q_scales, uint8_t *qt,
                      float *qt_scales, bool qt_block, unsigned long long *counts) {
    __shared__ __align__(16) Vec128Tile sm;
    const XTileLoad ld(x, rows, cols);
    vec128_tile<FMT, VEC128_BATCH, Bf16x8Loads<1>>(sm, ld.r0, ld.c0, ld.nr, ld.nc, rows, cols, q, q_scales, qt,
                                                   qt_scales, qt_block, counts, ld, XTileCopy());
}

// Per tensor, Q(x) and Q(x^T) both from one 128x128 tile of x, with the scale of the tensor's
// amax *amax (from the amax pass or x's producer); block (0, 0) writes both operands' scales
// (tensor_tile). The same codes as tile128_kernel with tensor_amax, made in registers
// (fp8_quant.cuh's tensor_tile: Q(x^T) is the transpose of Q(x)'s codes) instead of from
// tile128_kernel's shared-memory staging of the BF16 tile (0.198 against 0.220 ms for paper_569m's
// (N, 2F) with the amax given, one H200, measured 2026-11-30).
template <Fp8Format FMT>
__global__ void __launch_bounds__(FQ_NT, VEC128_MIN_CTAS)
    tensor_both_kernel(const uint16_t *x, int rows, int cols, uint8_t *q, float *q_scales, uint8_t *qt,
                       float *qt_scales, const float *amax, unsigned *observe, unsigned long long *counts) {
    __shared__ __align__(16) CodeTile ct;
    const XTileLoad ld(x, rows, cols);
    tensor_tile<FMT, VEC128_BATCH, Bf16x8Loads<1>>(ct, ld.r0, ld.c0, ld.nr, ld.nc, rows, cols, q, q_scales, qt,
                                                   qt_scales, amax, observe, counts, ld, XTileCopy());
}
static_assert(THREADS == FQ_NT, "vec128both_kernel launches THREADS threads, vec128_tile needs FQ_NT");

// Per-tensor codes q (rows, cols) -> their transpose qt (cols, rows), one 128 x 128 tile per CTA
// (block (blockIdx.y, blockIdx.x)): each thread loads 8 codes of 8 tile rows into a CodeTile as
// tensor_tile's producers put them, and emit_qt_codes writes the transpose (a per-tensor code is
// the same in both layouts).
__global__ void __launch_bounds__(FQ_NT) transpose_codes_kernel(const uint8_t *q, int rows, int cols, uint8_t *qt) {
    __shared__ __align__(16) CodeTile ct;
    const int r0 = blockIdx.y * G, c0 = blockIdx.x * G, nr = min(G, rows - r0), nc = min(G, cols - c0);
    const int t = threadIdx.x, c = (t & 15) * 8, rsub = t >> 4;
    const bool vec = cols % 8 == 0 && ((uintptr_t)q & 7) == 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int r = rsub + 16 * k;
        uint2 v = make_uint2(0u, 0u);
        if (r < nr && c < nc) {
            const uint8_t *src = q + (size_t)(r0 + r) * cols + c0 + c;
            if (vec && c + 8 <= nc) {
                v = *reinterpret_cast<const uint2 *>(src);
            } else {
                for (int e = 0; e < 8 && c + e < nc; e++) (e < 4 ? v.x : v.y) |= (uint32_t)src[e] << (8 * (e & 3));
            }
        }
        code_tile_put(ct, r, c, v);
    }
    __syncthreads();
    if (nr == G && nc == G) emit_qt_codes<true>(ct, qt, rows, r0, c0, nr, nc);
    else emit_qt_codes<false>(ct, qt, rows, r0, c0, nr, nc);
}

// Launches kernel<E4M3 or E5M2> with THREADS threads on `stream` (fp8_quant.cuh's LAUNCH_BY_FMT).
#define LAUNCH_FMT(fmt, kernel, grid, ...) LAUNCH_BY_FMT(fmt, kernel, grid, THREADS, stream, __VA_ARGS__)

static void check_operand(const Fp8Operand *op, int rows, int cols, const char *what) {
    if (!op->codes || !op->scales) FATAL("fp8_quantize_gpu: %s has no buffers (hint: fp8_operand_alloc)", what);
    if (op->rows != rows || op->cols != cols)
        FATAL("fp8_quantize_gpu: %s is (%d, %d), expected (%d, %d)", what, op->rows, op->cols, rows, cols);
}

// The amax pass over n values of x, folded into *word (FP32 bits; as amax_kernel).
static void amax_pass(const uint16_t *x, long n, unsigned *word, cudaStream_t stream) {
    const long blocks = n / (THREADS * 8) + 1;
    amax_kernel<<<(unsigned)(blocks < 1024 ? blocks : 1024), THREADS, 0, stream>>>(x, n, word);
    CUDA_CHECK_LAUNCH();
}

// amax_given: per tensor, the amax the scale comes from: x's own, taken by its producer, or delayed
// scaling's history maximum (else NULL: the amax pass runs here, into the operand's scales[1]).
// observe (per tensor, may be NULL): x's own amax is folded into it (publish_amax).
static void quantize(const Fp8Operand *q, const Fp8Operand *qt, const uint16_t *x, int rows, int cols,
                     const float *amax_given, unsigned *observe, unsigned long long *counts, cudaStream_t stream) {
    if (!q && !qt) return;
    if (rows <= 0 || cols <= 0) FATAL("fp8_quantize_gpu: empty shape (%d, %d)", rows, cols);
    if (q) check_operand(q, rows, cols, "q");
    if (qt) check_operand(qt, cols, rows, "qt");
    // q and qt share grouping and format; the one mix: 1x128 q with a 128x128 qt (a wgrad operand
    // in blocks, precision.linear_wgrad_blocks), from one tile pass too
    const bool mixed = q && qt && q->grouping == FP8_GROUP_1x128 && qt->grouping == FP8_GROUP_128x128;
    if (q && qt && ((q->grouping != qt->grouping && !mixed) || q->fmt != qt->fmt))
        FATAL("fp8_quantize_gpu: q and qt differ in grouping (%d, %d) or format (%d, %d) (hint: only a 1x128 q "
              "with a 128x128 qt may mix)", (int)q->grouping, (int)qt->grouping, (int)q->fmt, (int)qt->fmt);
    const Fp8Operand *any = q ? q : qt;
    const Fp8Format fmt = any->fmt;
    uint8_t *qc = q ? q->codes : NULL, *qtc = qt ? qt->codes : NULL;
    float *qs = q ? q->scales : NULL, *qts = qt ? qt->scales : NULL;
    const dim3 tiles(cdiv(cols, G), cdiv(rows, G));
    switch (any->grouping) {
    case FP8_GROUP_TENSOR: {
        const long n = (long)rows * cols;
        const long blocks = n / (THREADS * 8) + 1;
        const float *amax = amax_given;
        if (!amax_given) {
            amax = any->scales + 1;
            fp8_amax_gpu(any->scales + 1, x, n, stream);
        }
        if (observe && (!q || !qt)) {  // only tensor_both_kernel observes as it goes
            amax_pass(x, n, observe, stream);
            observe = NULL;
        }
        if (!qt) {
            LAUNCH_FMT(fmt, cast_tensor_kernel, (unsigned)(blocks < 4096 ? blocks : 4096), qc, x, n, qs, amax, counts);
        } else if (q) {
            LAUNCH_FMT(fmt, tensor_both_kernel, tiles, x, rows, cols, qc, qs, qtc, qts, amax, observe, counts);
        } else {
            LAUNCH_FMT(fmt, tile128_kernel, tiles, x, rows, cols, qc, qs, qtc, qts, amax, counts);
        }
        break;
    }
    case FP8_GROUP_128x128:
        LAUNCH_FMT(fmt, tile128_kernel, tiles, x, rows, cols, qc, qs, qtc, qts, (const float *)NULL, counts);
        break;
    case FP8_GROUP_1x128:
        if (q && qt) {  // one read of x for both (qt 1x128, or 128x128 blocks when mixed)
            LAUNCH_FMT(fmt, vec128both_kernel, tiles, x, rows, cols, qc, qs, qtc, qts, mixed, counts);
            break;
        }
        if (q) {
            const long slices = (long)rows * cdiv(cols, G);
            const unsigned blocks = (unsigned)((slices + THREADS / 32 - 1) / (THREADS / 32));  // a warp per slice
            LAUNCH_FMT(fmt, vec128_kernel, blocks, x, rows, cols, qc, qs, counts);
        }
        if (qt) {
            const dim3 grid(cdiv(cols, VT_COLS), cdiv(rows, G));
            LAUNCH_FMT(fmt, vec128t_kernel, grid, x, rows, cols, qtc, qts, q ? NULL : counts);
        }
        break;
    default: FATAL("fp8_quantize_gpu: unknown grouping %d", (int)any->grouping);
    }
}

void fp8_transpose_tensor_gpu(const Fp8Operand *q, const Fp8Operand *qt, cudaStream_t stream) {
    if (!q || !qt || q->grouping != FP8_GROUP_TENSOR || qt->grouping != FP8_GROUP_TENSOR || q->fmt != qt->fmt)
        FATAL("fp8_transpose_tensor_gpu: needs two per-tensor operands of one format (hint: 1x128 and 128x128 codes "
              "depend on their layout; quantize those from the BF16 values)");
    check_operand(q, q->rows, q->cols, "q");
    check_operand(qt, q->cols, q->rows, "qt");
    const dim3 tiles(cdiv(q->cols, G), cdiv(q->rows, G));
    transpose_codes_kernel<<<tiles, FQ_NT, 0, stream>>>(q->codes, q->rows, q->cols, qt->codes);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpyAsync(qt->scales, q->scales, 2 * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}

// One thread: a per-tensor operand's two scale floats (fp8_set_tensor_scale_gpu), in the layout
// every per-tensor producer writes (fp8_quant.cuh's write_tensor_scales).
__global__ void set_tensor_scale_kernel(float *scales, float inv, float amax) {
    write_tensor_scales(scales, inv, &amax);
}

void fp8_set_tensor_scale_gpu(const Fp8Operand *op, float amax, cudaStream_t stream) {
    if (!op || !op->scales || op->grouping != FP8_GROUP_TENSOR)
        FATAL("fp8_set_tensor_scale_gpu: needs a per-tensor operand with its scales (hint: fp8_operand_alloc)");
    const float inv = 1.0f / fp8_scale_for_amax(op->fmt, amax);  // exact: a power of two
    set_tensor_scale_kernel<<<1, 1, 0, stream>>>(op->scales, inv, amax);
    CUDA_CHECK_LAUNCH();
}

void fp8_amax_gpu(float *amax, const uint16_t *x, long n, cudaStream_t stream) {
    if (n < 0) FATAL("fp8_amax_gpu: %ld elements", n);
    CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
    amax_pass(x, n, (unsigned *)amax, stream);
}

void fp8_quantize_gpu(const Fp8Operand *q, const Fp8Operand *qt, const uint16_t *x, int rows, int cols,
                      unsigned long long *counts, cudaStream_t stream) {
    quantize(q, qt, x, rows, cols, NULL, NULL, counts, stream);
}

void fp8_quantize_gpu_with_amax(const Fp8Operand *q, const Fp8Operand *qt, const uint16_t *x, int rows, int cols,
                                const float *amax, unsigned *observe, unsigned long long *counts, cudaStream_t stream) {
    const Fp8Operand *any = q ? q : qt;
    if (!amax || (any && any->grouping != FP8_GROUP_TENSOR))
        FATAL("fp8_quantize_gpu_with_amax: needs per-tensor operands and the amax to scale by (got grouping %d, "
              "amax %p)", any ? (int)any->grouping : -1, (const void *)amax);
    quantize(q, qt, x, rows, cols, amax, observe, counts, stream);
}

void fp8_scales_to_rowmajor(float *s, const float *dev, Fp8Grouping g, int rows, int cols) {
    const int n_gc = cdiv(cols, G), n_gr = cdiv(rows, G);
    switch (g) {
    case FP8_GROUP_TENSOR: s[0] = 1.0f / dev[0]; return;
    case FP8_GROUP_1x128:
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < n_gc; j++) s[(long)r * n_gc + j] = 1.0f / dev[(long)j * rows + r];
        return;
    case FP8_GROUP_128x128:
        for (int i = 0; i < n_gr; i++)
            for (int j = 0; j < n_gc; j++) s[(long)i * n_gc + j] = 1.0f / dev[(long)i * round4(n_gc) + j];
        return;
    }
    FATAL("fp8_scales_to_rowmajor: unknown grouping %d", (int)g);
}

// ==================================== GEMMs ====================================================

// Everything that selects a plan (the scale pointers are per call).
typedef struct {
    int m, n, k;
    int a_fmt, b_fmt;  // Fp8Format of A (rhs) and B (lhs)
    int a_grp, b_grp;  // Fp8Grouping
    int out_fp32;
    int fast_accum;  // CUBLASLT_MATMUL_DESC_FAST_ACCUM (per-tensor operands only)
    int align_c;     // bytes, power of two <= 256
} Fp8GemmKey;

typedef struct {
    Fp8GemmKey key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} Fp8GemmPlan;

#define MAX_PLANS 64  // evicted round-robin when full

static cublasLtHandle_t handle;  // matmul.cu's, shared (see matmul.h)
static void *workspace;          // matmul.cu's MATMUL_WORKSPACE_BYTES
static GemmPlanCache<Fp8GemmPlan, MAX_PLANS> cache;

void linear_fp8_gpu_init(void) {
    if (handle) return;
    matmul_gpu_init();  // idempotent
    handle = (cublasLtHandle_t)matmul_gpu_lt_handle();
    workspace = matmul_gpu_workspace();
}

void linear_fp8_gpu_shutdown(void) {
    if (!handle) return;
    cache.clear();
    workspace = NULL;  // both belong to matmul.cu, which frees them in matmul_gpu_shutdown()
    handle = NULL;
}

int linear_fp8_gpu_plan_count(void) { return cache.n; }

static int pointer_alignment(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 1;
    while (a < 256 && !(u & (uintptr_t)a)) a <<= 1;
    return a;
}
static cudaDataType_t fp8_type(int fmt) { return fmt == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
static int32_t scale_mode(int grp) {
    return grp == FP8_GROUP_TENSOR  ? CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
           : grp == FP8_GROUP_1x128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                    : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

static void set_scale_pointers(cublasLtMatmulDesc_t op, const float *a_scales, const float *b_scales) {
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scales, sizeof a_scales));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scales, sizeof b_scales));
}

// Builds the plan for key; returns CUBLAS_STATUS_SUCCESS, or why cuBLASLt has no algorithm
// (then *p holds nothing).
static cublasStatus_t plan_build(Fp8GemmPlan *p, const Fp8GemmKey *k, const float *a_scales, const float *b_scales) {
    memset(p, 0, sizeof *p);
    p->key = *k;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;  // TN: the only FP8 layout
    const int32_t mode_a = scale_mode(k->a_grp), mode_b = scale_mode(k->b_grp);
    const int8_t fast_accum = (int8_t)k->fast_accum;  // (gemm_key: per-tensor operands only)
    CUBLASLT_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b));
    set_scale_pointers(p->op, a_scales, b_scales);
    // Stored column-major: A (k, m) ld k, B (k, n) ld k, C = D (m, n) ld m.
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p->a, fp8_type(k->a_fmt), (uint64_t)k->k, (uint64_t)k->m, k->k));
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p->b, fp8_type(k->b_fmt), (uint64_t)k->k, (uint64_t)k->n, k->k));
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p->c, k->out_fp32 ? CUDA_R_32F : CUDA_R_16BF, (uint64_t)k->m,
                                              (uint64_t)k->n, k->m));
    // codes: alignment checked >= 16 by the caller
    cublasStatus_t st = (cublasStatus_t)matmul_gpu_pick_algo(p->op, p->a, p->b, p->c, 16, 16, k->align_c, &p->algo);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cache.destroy(p);
        memset(p, 0, sizeof *p);
    }
    return st;
}

// The cached plan for key (built on first use), or NULL with *status saying why there is none.
static Fp8GemmPlan *plan_get(const Fp8GemmKey *k, const float *a_scales, const float *b_scales, cublasStatus_t *status) {
    *status = CUBLAS_STATUS_SUCCESS;
    if (Fp8GemmPlan *hit = cache.find(*k)) return hit;
    Fp8GemmPlan fresh;  // built first: a shape cuBLASLt cannot run takes no slot
    *status = plan_build(&fresh, k, a_scales, b_scales);
    if (*status != CUBLAS_STATUS_SUCCESS) return NULL;
    Fp8GemmPlan *p = cache.slot();
    *p = fresh;
    return p;
}

// The key of out (n, m) = lhs (n, k) . rhs (m, k)^T; misuse is FATAL.
static Fp8GemmKey gemm_key(const void *out, int out_fp32, int fast_accum, const Fp8Operand *lhs,
                           const Fp8Operand *rhs) {
    if (!handle) FATAL("linear_fp8 GEMM used before linear_fp8_gpu_init() (hint: call it once at start)");
    if (lhs->cols != rhs->cols)
        FATAL("fp8_gemm_gpu: reductions differ: lhs (%d, %d), rhs (%d, %d)", lhs->rows, lhs->cols, rhs->rows, rhs->cols);
    if (lhs->cols % 16 != 0)
        FATAL("fp8_gemm_gpu: reduction %d is not a multiple of 16 (cuBLASLt's FP8 rule; hint: pad the tokens or "
              "channels)", lhs->cols);
    if (lhs->fmt == FP8_E5M2 && rhs->fmt == FP8_E5M2) FATAL("fp8_gemm_gpu: E5M2 x E5M2 is not supported by cuBLASLt");
    if (lhs->grouping == FP8_GROUP_128x128 && rhs->grouping == FP8_GROUP_128x128)
        FATAL("fp8_gemm_gpu: 128x128 x 128x128 block scaling is not supported by cuBLASLt (hint: 1x128 on one side)");
    // cuBLASLt's VEC128 scale tensor is (ceil(C/128), R) with R fastest; the stride R was measured
    // only with R a multiple of 4 (cuBLASLt may pad R to 4, as the 128x128 layout pads), so other R
    // are refused rather than risk a silently wrong product.
    if ((lhs->grouping == FP8_GROUP_1x128 && lhs->rows % 4) || (rhs->grouping == FP8_GROUP_1x128 && rhs->rows % 4))
        FATAL("fp8_gemm_gpu: a 1x128-scaled operand has %d rows, not a multiple of 4 (the VEC128 scale layout is "
              "only known for those)", lhs->grouping == FP8_GROUP_1x128 && lhs->rows % 4 ? lhs->rows : rhs->rows);
    if (fast_accum && (lhs->grouping != FP8_GROUP_TENSOR || rhs->grouping != FP8_GROUP_TENSOR))
        FATAL("fp8_gemm_gpu: fast accumulation with groupings %d x %d (hint: per-tensor operands only; cuBLASLt "
              "promotes block-scaled sums to FP32 always)", (int)lhs->grouping, (int)rhs->grouping);
    if (pointer_alignment(lhs->codes) < 16 || pointer_alignment(rhs->codes) < 16)
        FATAL("fp8_gemm_gpu: FP8 codes must be 16-byte aligned (hint: fp8_operand_alloc)");
    Fp8GemmKey k;
    memset(&k, 0, sizeof k);  // padding too: keys are compared with memcmp
    k.m = rhs->rows;
    k.n = lhs->rows;
    k.k = lhs->cols;
    k.a_fmt = rhs->fmt;
    k.b_fmt = lhs->fmt;
    k.a_grp = rhs->grouping;
    k.b_grp = lhs->grouping;
    k.out_fp32 = out_fp32 ? 1 : 0;
    k.fast_accum = fast_accum ? 1 : 0;
    k.align_c = pointer_alignment(out);
    return k;
}

int fp8_gemm_gpu_supported(int out_fp32, int fast_accum, const Fp8Operand *lhs, const Fp8Operand *rhs) {
    const Fp8GemmKey k = gemm_key((const void *)(uintptr_t)256, out_fp32, fast_accum, lhs, rhs);  // any aligned output
    cublasStatus_t st;
    return plan_get(&k, rhs->scales, lhs->scales, &st) != NULL;
}

int fp8_gemm_gpu(void *out, int out_fp32, int accumulate, int fast_accum, const Fp8Operand *lhs,
                 const Fp8Operand *rhs, cudaStream_t stream) {
    const Fp8GemmKey k = gemm_key(out, out_fp32, fast_accum, lhs, rhs);
    cublasStatus_t st;
    Fp8GemmPlan *p = plan_get(&k, rhs->scales, lhs->scales, &st);
    if (!p) return (int)st;
    set_scale_pointers(p->op, rhs->scales, lhs->scales);  // A = rhs, B = lhs
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return (int)cublasLtMatmul(handle, p->op, &alpha, rhs->codes, p->a, lhs->codes, p->b, &beta, out, p->c, out, p->c,
                               &p->algo, workspace, MATMUL_WORKSPACE_BYTES, stream);
}

static void gemm_or_die(const char *what, void *out, int out_fp32, int accumulate, int fast_accum,
                        const Fp8Operand *lhs, const Fp8Operand *rhs, cudaStream_t stream) {
    const int st = fp8_gemm_gpu(out, out_fp32, accumulate, fast_accum, lhs, rhs, stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        FATAL("linear_fp8 %s GEMM (%d, %d) . (%d, %d)^T, groupings %d x %d, formats %d x %d failed: %s (%s)", what,
              lhs->rows, lhs->cols, rhs->rows, rhs->cols, (int)lhs->grouping, (int)rhs->grouping, (int)lhs->fmt,
              (int)rhs->fmt, cublasLtGetStatusName((cublasStatus_t)st), cublaslt_error_hint((cublasStatus_t)st));
}

void linear_fp8_forward_gpu(uint16_t *y, const Fp8Operand *x, const Fp8Operand *w, int fast_accum,
                            cudaStream_t stream) {
    gemm_or_die("forward", y, 0, 0, fast_accum, x, w, stream);
}
void linear_fp8_dgrad_gpu(uint16_t *dx, const Fp8Operand *dy, const Fp8Operand *wt, int fast_accum,
                          cudaStream_t stream) {
    gemm_or_die("dgrad", dx, 0, 0, fast_accum, dy, wt, stream);
}
void linear_fp8_wgrad_gpu(float *dw, const Fp8Operand *dyt, const Fp8Operand *xt, int accumulate, int fast_accum,
                          cudaStream_t stream) {
    gemm_or_die("wgrad", dw, 1, accumulate, fast_accum, dyt, xt, stream);
}
