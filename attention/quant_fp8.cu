// quant_fp8.cu: FP8 quantization of the attention operands (interface and layouts:
// attention/kernels_fp8.h). One CTA per (tensor, b, h, 128-token block): the block is read from
// global memory once into registers (16-byte loads), its amax reduced, the scale derived with
// fp8.h's fp8_scale_for_amax and every value cast with fp8.h's encoder, so that codes and
// scales equal the CPU emulation's (attention_cpu.c, attn_quantize_operand) bit for bit. With a
// RoPE table the values are rotated in registers first (rope_chunk: rope_forward_gpu's rotation,
// and its BF16 rounding, bit for bit), optionally written back rotated. The
// encoder is integer-only; x * s with a power-of-two s is exact in FP32 (denormals are kept:
// this file must not be built with -use_fast_math / -ftz=true). Optionally the dequantized
// values are written back in BF16 in the input's layout (fp8_hybrid's BF16 backward reads them).
#include "attention/kernels_fp8.h"

#include <cuda_runtime.h>  // launches, cudaGetLastError
#include <stdint.h>        // uint8_t, uint32_t, uintptr_t

#include "attention/common.cuh"  // cvt_e4m3x2 / cvt_e5m2x2 (hardware FP8 conversion)
#include "gpu/fp8_cvt.cuh"       // transpose4x4: the transposed tile from the codes
#include "core/common.h"         // FATAL
#include "gpu/cuda_check.h"      // CUDA_CHECK_LAUNCH
#include "core/fp8.h"            // fp8_from_f32, fp8_scale_for_amax, bf16_to_f32, fp8_max
#include "gpu/layers_math.cuh"   // lm_rope_lo / lm_rope_hi, lm_f2bits: rope_forward_gpu's own element math

#define QB ATTN_SCALE_BLOCK  // tokens per CTA = tokens per scale (128)
#define QTHREADS 256

struct AttnQuantBatch {
    AttnQuantTensor t[ATTN_QUANT_MAX_TENSORS];
};

// RoPE of one 16-byte chunk (8 BF16 values, columns 8 ch .. 8 ch + 7) of token t, in registers.
// Column i < D/2 pairs with i + D/2, which the partner thread CH/2 lanes away holds (same row, same
// warp: CH = D/8 threads per row). The two split the chunk's 8 pairs: the first-half thread rotates
// pairs i0 .. i0+3, the second-half one i0+4 .. i0+7, so each loads the (cos, sin) of 4 pairs (2
// float4 of rope_table_gpu's table, issued before anything waits) and not 8: two shuffles bring the
// partner's half of its pairs, two send back the results that belong to the partner's columns. The
// arithmetic is rope_vec_kernel's (lm_rope_lo, lm_rope_hi, rounded to BF16 by lm_f2bits), so the
// result is rope_forward_gpu's bit for bit. Every lane of the warp must call it (the shuffles);
// rows t >= T (zeros) stay zero.
template <int D>
__device__ __forceinline__ uint4 rope_chunk(uint4 v, const float *cos_sin, int t, int T, int ch) {
    constexpr int CH = D / 8, HALF = D / 2;
    const bool lo = ch < CH / 2;
    const int p0 = (ch % (CH / 2)) * 8 + (lo ? 0 : 4);  // the first of this thread's 4 pairs
    float4 cs[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
    if (t < T) {
        const float4 *row = reinterpret_cast<const float4 *>(cos_sin + ((size_t)t * HALF + p0) * 2);
        cs[0] = row[0];  // pairs p0, p0 + 1: (cos, sin, cos, sin)
        cs[1] = row[1];  // pairs p0 + 2, p0 + 3
    }
    // the partner's values of this thread's pairs: the first-half thread gets the second-half
    // values of pairs i0 .. i0+3 (the partner's words 0, 1), the other the first-half values of
    // pairs i0+4 .. i0+7 (the partner's words 2, 3)
    const uint32_t g0 = __shfl_xor_sync(0xffffffffu, lo ? v.z : v.x, CH / 2);
    const uint32_t g1 = __shfl_xor_sync(0xffffffffu, lo ? v.w : v.y, CH / 2);
    const uint32_t xw[2] = {lo ? v.x : g0, lo ? v.y : g1};  // first-half values of the 4 pairs
    const uint32_t yw[2] = {lo ? g0 : v.z, lo ? g1 : v.w};  // second-half values
    uint32_t nx[2] = {0u, 0u}, ny[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int w = j >> 1, sh = 16 * (j & 1);
        const float x = bf16_to_f32((uint16_t)(xw[w] >> sh)), y = bf16_to_f32((uint16_t)(yw[w] >> sh));
        const float c = (j & 1) ? cs[w].z : cs[w].x, sn = (j & 1) ? cs[w].w : cs[w].y;
        nx[w] |= (uint32_t)lm_f2bits(lm_rope_lo(x, y, c, sn)) << sh;
        ny[w] |= (uint32_t)lm_f2bits(lm_rope_hi(x, y, c, sn)) << sh;
    }
    // the results in the partner's columns go to the partner
    const uint32_t r0 = __shfl_xor_sync(0xffffffffu, lo ? ny[0] : nx[0], CH / 2);
    const uint32_t r1 = __shfl_xor_sync(0xffffffffu, lo ? ny[1] : nx[1], CH / 2);
    return lo ? make_uint4(nx[0], nx[1], r0, r1) : make_uint4(r0, r1, ny[0], ny[1]);
}

// grid (B*H*nblk, n_tensors), block QTHREADS. Thread i of the CTA holds one 16-byte BF16 column
// chunk (columns 8*ch .. +7, ch = i % CH) of RT consecutive rows (rq*RT .. +RT-1, rq = i / CH) of
// the (QB, D) tile: per load instruction a warp reads whole 256- (D 128) or 128-byte (D 64) row
// segments, and after the cast each thread holds, for each of its 8 columns, the RT codes of its
// rows: one RT-byte unit of the transposed tile, built in registers (byte permutes) and stored to
// shared memory in one instruction, instead of RT byte stores.
//
// The transposed tile sT is D rows of QB bytes, no padding, its RT-byte units XOR-swizzled per
// row so that both phases are free of bank conflicts: unit u of row c lives at u ^ sw(c), with
// sw = ch for RT 8 (a half-warp's 16 8-byte stores, one per ch, cover the 32 banks once) and
// sw = 4 ch for RT 4 (the warp's 32 4-byte stores: rq = 4w + q, unit (4w + q) ^ 4ch = 4(w ^ ch)
// + q, all 32 banks). The write-out reads 16-byte chunks (8 lanes = one whole row per phase) and
// undoes the swizzle on the chunk index (and, for RT 8 and odd ch, swaps the chunk's two units).
template <int D>
__global__ void __launch_bounds__(QTHREADS)
    attn_quant_kernel(const AttnQuantBatch batch, int H, int T, int nblk) {
    constexpr int CH = D / 8;                 // 16-byte BF16 chunks per row
    constexpr int RT = QB * CH / QTHREADS;    // rows per thread (8 for D 128, 4 for D 64)
    constexpr int UPC = 16 / RT;              // RT-byte units per 16-byte chunk of sT
    static_assert(QB * CH % QTHREADS == 0 && (RT == 4 || RT == 8), "tile must split into 4- or 8-row units");
    __shared__ __align__(16) uint8_t sT[D * QB];
    __shared__ float red[QTHREADS / 32];

    const AttnQuantTensor &a = batch.t[blockIdx.y];
    const int blk = blockIdx.x % nblk, bh = blockIdx.x / nblk, b = bh / H, h = bh % H;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ch = tid % CH, rq = tid / CH;
    const int Tp = nblk * QB;

    // load the thread's RT rows of its chunk (rows past T are zeros: they change no amax and
    // become code 0)
    uint4 raw[RT];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < RT; i++) {
        const int t = blk * QB + rq * RT + i;
        if (t < T) {
            raw[i] = *reinterpret_cast<const uint4 *>(a.x + ((long)b * T + t) * a.stride + (long)h * D + ch * 8);
        } else {
            raw[i] = make_uint4(0u, 0u, 0u, 0u);
        }
        if (a.rope) raw[i] = rope_chunk<D>(raw[i], a.rope, t, T, ch);  // uniform over the CTA
        if (a.rotated && t < T)
            *reinterpret_cast<uint4 *>(a.rotated + ((long)b * T + t) * a.rotated_stride + (long)h * D + ch * 8) = raw[i];
        const uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            amax = fmaxf(amax, fabsf(bf16_to_f32((uint16_t)(w[e] & 0xFFFFu))));
            amax = fmaxf(amax, fabsf(bf16_to_f32((uint16_t)(w[e] >> 16))));
        }
    }
    // block amax (max is exact in any order) -> scale, derived by every thread from the same
    // partial maxima (one barrier; the same value everywhere)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0) red[warp] = amax;
    __syncthreads();
    float m = red[0];
#pragma unroll
    for (int w = 1; w < QTHREADS / 32; w++) m = fmaxf(m, red[w]);
    const float s = a.scale_in ? a.scale_in[a.scale_in_per_head ? bh : 0] : fp8_scale_for_amax_within(a.fmt, m, a.max_scale_exp);
    if (tid == 0) {
        const long sidx = (long)bh * nblk + blk;
        if (a.scales) a.scales[sidx] = s;
        if (a.block_amax) a.block_amax[sidx] = m;
    }
    const float inv_s = 1.0f / s, fmax = fp8_max(a.fmt);  // 1/s exact: a power of two
    const Fp8Format fmt = a.fmt;

    // cast; row-major codes straight to global (8 bytes per row). The codes come from the
    // hardware conversion (cvt.rn.satfinite, two per instruction), which equals fp8.h's integer
    // encoder bit for bit on finite inputs (test_fp8) at a fraction of its cost; x * s is finite
    // (s is derived from the block's amax, or a delayed scale whose overflow saturates, as the
    // encoder does).
    unsigned sat = 0;
    const bool e5 = fmt == FP8_E5M2;
    uint32_t packed[RT][2];
#pragma unroll
    for (int i = 0; i < RT; i++) {
        const int r = rq * RT + i, t = blk * QB + r;
        const uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
        float xs[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const uint16_t hbits = (uint16_t)((e & 1) ? (w[e >> 1] >> 16) : (w[e >> 1] & 0xFFFFu));
            xs[e] = bf16_to_f32(hbits) * s;
            sat += fabsf(xs[e]) > fmax;
        }
        packed[i][0] = packed[i][1] = 0u;
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
            const uint32_t q2 = e5 ? cvt_e5m2x2(xs[e], xs[e + 1]) : cvt_e4m3x2(xs[e], xs[e + 1]);
            packed[i][e >> 2] |= q2 << (8 * (e & 3));
        }
        if (a.codes)
            *reinterpret_cast<uint2 *>(a.codes + ((long)bh * Tp + t) * D + ch * 8) = make_uint2(packed[i][0], packed[i][1]);
        if (a.dequant && t < T) {
            uint32_t deq[4] = {0u, 0u, 0u, 0u};
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const uint8_t q = (uint8_t)(packed[i][e >> 2] >> (8 * (e & 3)));
                deq[e >> 1] |= (uint32_t)bf16_from_f32(fp8_to_f32(fmt, q) * inv_s) << (16 * (e & 1));
            }
            *reinterpret_cast<uint4 *>(a.dequant + ((long)b * T + t) * a.dequant_stride + (long)h * D + ch * 8) =
                make_uint4(deq[0], deq[1], deq[2], deq[3]);
        }
    }
    if (a.saturated) {
        sat = __reduce_add_sync(0xffffffffu, sat);
        if (lane == 0 && sat) atomicAdd(a.saturated, (unsigned long long)sat);
    }
    if (!a.codes_t) return;  // uniform over the CTA: no barrier below is skipped by part of it

    // transposed units: col[e][k] = codes of column 8 ch + e, rows 4k .. 4k+3 of the thread's RT
    uint32_t col[8][RT / 4];
#pragma unroll
    for (int k = 0; k < RT / 4; k++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            uint32_t out[4];
            transpose4x4(packed[4 * k][half], packed[4 * k + 1][half], packed[4 * k + 2][half],
                         packed[4 * k + 3][half], out);
#pragma unroll
            for (int j = 0; j < 4; j++) col[4 * half + j][k] = out[j];
        }
    const int sw = RT == 8 ? ch : 4 * ch;  // the swizzle of rows 8 ch .. 8 ch + 7
#pragma unroll
    for (int e = 0; e < 8; e++) {
        uint8_t *dst = sT + (ch * 8 + e) * QB + (rq ^ sw) * RT;
        if constexpr (RT == 8) *reinterpret_cast<uint2 *>(dst) = make_uint2(col[e][0], col[e][1]);
        else *reinterpret_cast<uint32_t *>(dst) = col[e][0];
    }
    __syncthreads();
    // D rows of QB bytes = 8 chunks of 16 each: a warp writes four whole 128-byte row segments
#pragma unroll
    for (int j = 0; j < D * (QB / 16) / QTHREADS; j++) {
        const int idx = tid + j * QTHREADS, c = idx / (QB / 16), k = idx % (QB / 16);
        const int swc = RT == 8 ? (c >> 3) : 4 * (c >> 3);  // sw of the thread that wrote row c
        uint4 v = *reinterpret_cast<const uint4 *>(sT + c * QB + k * 16);
        if (UPC == 2 && (swc & 1)) v = make_uint4(v.z, v.w, v.x, v.y);  // the chunk's two units swapped
        const int kk = k ^ (swc / UPC);                                   // the chunk's place in the row
        *reinterpret_cast<uint4 *>(a.codes_t + ((long)bh * D + c) * Tp + (long)blk * QB + kk * 16) = v;
    }
}

// grid n_groups, block 256: max |in| over each group of group_len floats.
__global__ void attn_amax_reduce_kernel(const float *__restrict__ in, int group_len, Fp8Format fmt, int max_exp,
                                        float *__restrict__ amax_out, float *__restrict__ scale_out) {
    __shared__ float red[8];
    const long base = (long)blockIdx.x * group_len;
    float m = 0.0f;
    for (int i = threadIdx.x; i < group_len; i += blockDim.x) m = fmaxf(m, fabsf(in[base + i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; w++) m = fmaxf(m, red[w]);
        if (amax_out) amax_out[blockIdx.x] = m;
        if (scale_out) scale_out[blockIdx.x] = fp8_scale_for_amax_within(fmt, m, max_exp);
    }
}

// --- launchers ---------------------------------------------------------------------------------

static void check_tensor(const AttnQuantTensor *t, int i, int H, int d) {
    if (!t->x) FATAL("attn_gpu_quantize: tensor %d has no input", i);
    if ((uintptr_t)t->x % 16) FATAL("attn_gpu_quantize: tensor %d input not 16-byte aligned", i);
    if (t->stride % 8 || t->stride < H * d)
        FATAL("attn_gpu_quantize: tensor %d row stride %d must be a multiple of 8 and >= H*d = %d", i,
              t->stride, H * d);
    if ((uintptr_t)t->codes % 16 || (uintptr_t)t->codes_t % 16)
        FATAL("attn_gpu_quantize: tensor %d code buffers must be 16-byte aligned", i);
    if (t->fmt != FP8_E4M3 && t->fmt != FP8_E5M2) FATAL("attn_gpu_quantize: tensor %d format %d", i, (int)t->fmt);
    if (t->dequant && ((uintptr_t)t->dequant % 16 || t->dequant_stride % 8 || t->dequant_stride < H * d))
        FATAL("attn_gpu_quantize: tensor %d dequant output must be 16-byte aligned with a row stride "
              "(%d) that is a multiple of 8 and >= H*d = %d", i, t->dequant_stride, H * d);
    if (t->scale_in_per_head != 0 && t->scale_in_per_head != 1)
        FATAL("attn_gpu_quantize: tensor %d scale_in_per_head must be 0 or 1", i);
    if (t->max_scale_exp < 0 || t->max_scale_exp > FP8_SCALE_MAX_EXP)
        FATAL("attn_gpu_quantize: tensor %d max_scale_exp %d (0 for the default %d, or 1..%d; V: %d)", i,
              t->max_scale_exp, FP8_SCALE_MAX_EXP, FP8_SCALE_MAX_EXP, ATTN_V_SCALE_MAX_EXP);
    if (t->rope && (uintptr_t)t->rope % 16)
        FATAL("attn_gpu_quantize: tensor %d RoPE table must be 16-byte aligned", i);
    if (t->rotated && (!t->rope || (uintptr_t)t->rotated % 16 || t->rotated_stride % 8 || t->rotated_stride < H * d))
        FATAL("attn_gpu_quantize: tensor %d rotated output needs a RoPE table, 16-byte alignment and a row stride "
              "(%d) that is a multiple of 8 and >= H*d = %d", i, t->rotated_stride, H * d);
}

extern "C" void attn_gpu_quantize(const AttnQuantTensor *tensors, int n, int B, int H, int T, int d,
                                  cudaStream_t stream) {
    if (n < 1 || n > ATTN_QUANT_MAX_TENSORS) FATAL("attn_gpu_quantize: %d tensors (1..%d)", n, ATTN_QUANT_MAX_TENSORS);
    if (d != 64 && d != 128) FATAL("attn_gpu_quantize: head dim %d unsupported (64 or 128)", d);
    if (B <= 0 || H <= 0 || T <= 0) FATAL("attn_gpu_quantize: bad shape B=%d H=%d T=%d", B, H, T);
    AttnQuantBatch batch;
    for (int i = 0; i < n; i++) {
        check_tensor(&tensors[i], i, H, d);
        batch.t[i] = tensors[i];
        if (!batch.t[i].max_scale_exp) batch.t[i].max_scale_exp = FP8_SCALE_MAX_EXP;  // the kernel reads it as is
    }
    const int nblk = attn_quant_n_blocks(T);
    const long n_cta = (long)B * H * nblk;
    if (n_cta > 0x7fffffffL) FATAL("attn_gpu_quantize: B*H*ceil(T/128) = %ld CTAs is too many", n_cta);
    dim3 grid((unsigned)n_cta, (unsigned)n);
    if (d == 64) attn_quant_kernel<64><<<grid, QTHREADS, 0, stream>>>(batch, H, T, nblk);
    else attn_quant_kernel<128><<<grid, QTHREADS, 0, stream>>>(batch, H, T, nblk);
    CUDA_CHECK_LAUNCH();
}

extern "C" void attn_gpu_amax_reduce(const float *in, int n_groups, int group_len, Fp8Format fmt, int max_scale_exp,
                                     float *amax_out, float *scale_out, cudaStream_t stream) {
    if (n_groups <= 0 || group_len <= 0)
        FATAL("attn_gpu_amax_reduce: %d groups of %d (both must be positive)", n_groups, group_len);
    if (max_scale_exp < 0 || max_scale_exp > FP8_SCALE_MAX_EXP)
        FATAL("attn_gpu_amax_reduce: max_scale_exp %d (0 for the default %d, or 1..%d)", max_scale_exp,
              FP8_SCALE_MAX_EXP, FP8_SCALE_MAX_EXP);
    attn_amax_reduce_kernel<<<n_groups, 256, 0, stream>>>(in, group_len, fmt,
                                                          max_scale_exp ? max_scale_exp : FP8_SCALE_MAX_EXP,
                                                          amax_out, scale_out);
    CUDA_CHECK_LAUNCH();
}
