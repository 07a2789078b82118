// wgmma.cuh: warpgroup matrix multiply-accumulate (sm_90a): the fences, commits and waits around
// it, the shared-memory matrix descriptors (128- and 64-byte swizzle), the BF16 wrappers (both
// operands from shared memory, or A from registers) and the FP8 ones (QGMMA in SASS: K-major
// operands, FP32 accumulators), and the register fences that keep the compiler from moving
// accumulator reads and writes across a wait.
//
// Shared tiles for wgmma use the 128-byte swizzle: a tile of R rows x 128 bytes is one region;
// 16-byte chunk c of row r sits at chunk c ^ (r % 8); wider tiles are several such regions.
// Regions start at 1024-byte boundaries.
#ifndef PTX_WGMMA_CUH
#define PTX_WGMMA_CUH

#include <stdint.h>  // uint32_t, uint64_t

#include "gpu/ptx/smem.cuh"  // smem_addr

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>  // wait until at most N committed wgmma groups are pending
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// Keeps the compiler from moving reads/writes of accumulator registers across wgmma waits.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(r[i][e])::"memory");
}

// Matrix descriptor: start address, leading and stride byte offsets, 128-byte swizzle.
// K-major operand: stride offset = 1024 (next 8 rows), leading offset unused.
// N-major operand (V in PV): leading offset = bytes to the next 64-column region, stride = 1024
// (next 8 rows along K).
__device__ __forceinline__ uint64_t wgmma_desc_at(uint32_t addr, uint32_t lbo, uint32_t sbo) {  // 32-bit shared address
    return ((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ uint64_t wgmma_desc(const void *p, uint32_t lbo, uint32_t sbo) {
    return wgmma_desc_at(smem_addr(p), lbo, sbo);
}
// The descriptor of a K-major tile (wgmma_desc(tile, 16, 1024)) handled as its low word: the high
// word is a constant (stride 1024 B per 8 rows, 128-byte swizzle); the low word is the start
// address in 16-byte units (bits 0-13) and the unused leading offset (16 B). Shared addresses
// stay below 2^18 (at most 228 KB), so the address field never carries into the leading offset:
// the tile o bytes (a multiple of 16) further on has the low word kmajor_desc_lo(..) + o / 16 (a
// 32-byte FP8 k-step: + 2). Loops derive every descriptor from one base by 32-bit adds of
// constants instead of rebuilding each with 64-bit math from a pointer.
__device__ __forceinline__ uint32_t kmajor_desc_lo(uint32_t addr) { return ((addr & 0x3FFFF) >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t lo) { return (uint64_t)(1024 >> 4) << 32 | 1ull << 62 | lo; }
// The same for a K-major tile of 64-byte rows in the 64-byte swizzle (TMA's SWIZZLE_64B: 16-byte
// chunk c of row r at c ^ ((r / 2) % 4), regions 512-byte aligned): stride 512 B per 8 rows,
// layout type 2. A reduction of 64 FP8 elements (two k32 steps: + 2 each) fits one row.
__device__ __forceinline__ uint64_t kmajor_desc_sw64(uint32_t lo) { return (uint64_t)(512 >> 4) << 32 | 2ull << 62 | lo; }

#define WG_ACC8(b) "+f"(d[(b) + 0]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3]), \
                   "+f"(d[(b) + 4]), "+f"(d[(b) + 5]), "+f"(d[(b) + 6]), "+f"(d[(b) + 7])
#define WG_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS64 WG_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
                  "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
// N = D + 8 (the FP8 forward's PV with its row-sum columns, l_add_ones): 4 more accumulators
#define WG_ACC4(b) "+f"(d[(b) + 0]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3])
#define WG_REGS36 WG_REGS32 ", %32, %33, %34, %35"
#define WG_REGS68 WG_REGS64 ", %64, %65, %66, %67"

// BF16 wgmma with both operands in shared memory: d (64 x N, FP32) (+)= A (64 x 16) * B (16 x N);
// accumulate = 0 starts a fresh accumulator. TA / TB: 0 = the operand is K-major, 1 = transposed
// (A M-major, B N-major).
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_m64n128_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_REGS64 "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA), "n"(TB));
}
// N = 256 with both operands K-major, the accumulators in two halves: lo holds columns 0..127
// (d[4 j + 2 rr + e] for column 8 j + 2 t4 + e, j < 16), hi columns 128..255 in the same layout,
// so each half is exactly an m64n128 accumulator (the QKV GEMM's two heads of a 256-wide tile).
#define WG_REGS128 WG_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, " \
                   "%79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, " \
                   "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, " \
                   "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_ACC8_H(h, b) "+f"(h[(b) + 0]), "+f"(h[(b) + 1]), "+f"(h[(b) + 2]), "+f"(h[(b) + 3]), \
                        "+f"(h[(b) + 4]), "+f"(h[(b) + 5]), "+f"(h[(b) + 6]), "+f"(h[(b) + 7])
__device__ __forceinline__ void wgmma_m64n256_ss(float (&lo)[64], float (&hi)[64], uint64_t desc_a, uint64_t desc_b,
                                                 int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_REGS128 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : WG_ACC8_H(lo, 0), WG_ACC8_H(lo, 8), WG_ACC8_H(lo, 16), WG_ACC8_H(lo, 24), WG_ACC8_H(lo, 32),
          WG_ACC8_H(lo, 40), WG_ACC8_H(lo, 48), WG_ACC8_H(lo, 56), WG_ACC8_H(hi, 0), WG_ACC8_H(hi, 8),
          WG_ACC8_H(hi, 16), WG_ACC8_H(hi, 24), WG_ACC8_H(hi, 32), WG_ACC8_H(hi, 40), WG_ACC8_H(hi, 48),
          WG_ACC8_H(hi, 56)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_REGS32 "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA), "n"(TB));
}
// d (64 x 128) += A (64 x 16, registers) * B (16 x 128, smem, N-major)
__device__ __forceinline__ void wgmma_m64n128_rs_nmajor(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_REGS64 "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
// d (64 x 64) += A (64 x 16, registers) * B (16 x 64, smem, N-major)
__device__ __forceinline__ void wgmma_m64n64_rs_nmajor(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_REGS32 "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
// --- FP8 wgmma (QGMMA in SASS): A and B K-major (the only FP8 form), FP32 accumulators -------
// Formats: 0 = e4m3, 1 = e5m2. accumulate = 0 starts a fresh accumulator.
// wg_fp8<N, AT, BT>: d (64 x N) (+)= A (64 x 32, smem) * B (32 x N, smem), descriptors da, db.
template <int N, int AT, int BT>
__device__ void wg_fp8(float (&d)[N / 2], uint64_t da, uint64_t db, int accumulate);
#define WG_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_FP8_SS(N, AT, BT, ATS, BTS, REGS, IA, IB, IP, ...)                                       \
    template <>                                                                                    \
    __device__ __forceinline__ void wg_fp8<N, AT, BT>(float (&d)[N / 2], uint64_t da, uint64_t db, \
                                                      int accumulate) {                            \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                            \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." ATS "." BTS " {" REGS       \
                     "}, %" #IA ", %" #IB ", p, 1, 1;\n}\n"                                        \
                     : __VA_ARGS__                                                                 \
                     : "l"(da), "l"(db), "r"(accumulate));                                         \
    }
// the type pairs the kernels use: e4m3.e4m3 (S, S^T), e4m3.grad (dP^T, dV), grad.e4m3 (dK, dQ)
#define WG_FP8_SS_TYPES(N, REGS, IA, IB, IP, ...)                      \
    WG_FP8_SS(N, 0, 0, "e4m3", "e4m3", REGS, IA, IB, IP, __VA_ARGS__)  \
    WG_FP8_SS(N, 0, 1, "e4m3", "e5m2", REGS, IA, IB, IP, __VA_ARGS__)  \
    WG_FP8_SS(N, 1, 0, "e5m2", "e4m3", REGS, IA, IB, IP, __VA_ARGS__)
WG_FP8_SS(32, 0, 0, "e4m3", "e4m3", WG_REGS16, 16, 17, 18, WG_ACC8(0), WG_ACC8(8))  // the backward's dQ, d = 64
WG_FP8_SS(32, 1, 0, "e5m2", "e4m3", WG_REGS16, 16, 17, 18, WG_ACC8(0), WG_ACC8(8))
WG_FP8_SS_TYPES(64, WG_REGS32, 32, 33, 34, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24))
WG_FP8_SS_TYPES(128, WG_REGS64, 64, 65, 66, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32),
                WG_ACC8(40), WG_ACC8(48), WG_ACC8(56))
#undef WG_FP8_SS_TYPES
#undef WG_FP8_SS
// wg_fp8_rs<N, AT>: d (64 x N) (+)= A (64 x 32, registers a[4], format AT) * B (32 x N E4M3, smem).
// The A fragment of 8-bit types: register q holds row warp*16 + g + 8 (q & 1), k = 16 (q >> 1) +
// 4 t4 .. + 3 of the k32 step (byte 0 the lowest k).
template <int N, int AT>
__device__ void wg_fp8_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, int accumulate);
#define WG_FP8_RS(N, AT, ATS, REGS, OPS, IP, ...)                                                              \
    template <>                                                                                                  \
    __device__ __forceinline__ void wg_fp8_rs<N, AT>(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db,    \
                                                     int accumulate) {                                           \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                                          \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." ATS ".e4m3 {" REGS "}, " OPS              \
                     ", p, 1, 1;\n}\n"                                                                           \
                     : __VA_ARGS__                                                                               \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));                   \
    }
WG_FP8_RS(128, 0, "e4m3", WG_REGS64, "{%64, %65, %66, %67}, %68", 69, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16),
          WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56))  // the forward's PV, the delta pass's S
WG_FP8_RS(128, 1, "e5m2", WG_REGS64, "{%64, %65, %66, %67}, %68", 69, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16),
          WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56))  // the delta pass's dP, E5M2 dO
WG_FP8_RS(64, 0, "e4m3", WG_REGS32, "{%32, %33, %34, %35}, %36", 37, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16),
          WG_ACC8(24))  // the forward's PV, d = 64
WG_FP8_RS(136, 0, "e4m3", WG_REGS68, "{%68, %69, %70, %71}, %72", 73, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16),
          WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56), WG_ACC4(64))  // PV and row sums, d = 128
WG_FP8_RS(72, 0, "e4m3", WG_REGS36, "{%36, %37, %38, %39}, %40", 41, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16),
          WG_ACC8(24), WG_ACC4(32))  // PV and row sums, d = 64
#undef WG_FP8_RS

// The k32 steps of one tile product, into a fresh accumulator (the caller fences and commits):
// d (64 x N) = A (64 x 32 STEPS) B (32 STEPS x N), B a K-major swizzled tile at descriptor low word
// b (kmajor_desc_lo; a k32 step is 32 bytes further, + 2), A likewise at a (wg_fp8_tile: 128-byte
// swizzle, B too or, B_SW64, in the 64-byte one, STEPS <= 2) or from registers (wg_fp8_rs_tile:
// a[kk] the A fragments of step kk, wg_fp8_rs's layout).
template <int N, int AT, int BT, int STEPS, bool B_SW64 = false>
__device__ __forceinline__ void wg_fp8_tile(float (&d)[N / 2], uint32_t a, uint32_t b) {
    static_assert(!B_SW64 || STEPS <= 2, "a 64-byte row holds two k32 steps");
#pragma unroll
    for (int kk = 0; kk < STEPS; kk++)
        wg_fp8<N, AT, BT>(d, kmajor_desc(a + 2 * kk), B_SW64 ? kmajor_desc_sw64(b + 2 * kk) : kmajor_desc(b + 2 * kk),
                          kk > 0);
}
template <int N, int AT, int STEPS>
__device__ __forceinline__ void wg_fp8_rs_tile(float (&d)[N / 2], const uint32_t (&a)[STEPS][4], uint32_t b) {
#pragma unroll
    for (int kk = 0; kk < STEPS; kk++) wg_fp8_rs<N, AT>(d, a[kk], kmajor_desc(b + 2 * kk), kk > 0);
}

#endif  // PTX_WGMMA_CUH
