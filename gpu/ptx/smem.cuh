// smem.cuh: shared-memory addressing for the hand-written kernels: 32-bit shared addresses, the
// 1024-byte alignment of swizzled regions, the 128-byte swizzle's byte offsets, and loads and
// stores by 32-bit address that stay in program order.
#ifndef PTX_SMEM_CUH
#define PTX_SMEM_CUH

#include <stdint.h>  // uint8_t, uint32_t

// The 32-bit shared-memory address of a generic pointer into shared memory (PTX operands).
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// The dynamic shared memory rounded up to a 1024-byte boundary (the swizzled wgmma regions'
// alignment; the launches add 1024 bytes of slack). Rounded by pointer arithmetic on raw itself:
// rounding the generic address through an integer (uintptr_t) hides from the compiler that the
// result points to shared memory, and every access through such a pointer compiles to a generic
// 64-bit LD/ST with 64-bit address math.
__device__ __forceinline__ uint8_t *smem_align1024(unsigned char *raw) {
    return raw + ((0u - smem_addr(raw)) & 1023u);  // bytes to the next multiple of 1024
}
// Byte offset of (row r, byte column c) in a 128-byte-swizzled tile of 128-byte rows (16-byte
// chunk c / 16 of row r at chunk (c / 16) ^ (r % 8)): the FP8 kernels' K-major wgmma tiles.
__device__ __forceinline__ uint32_t sw128(int r, int c) {
    return (uint32_t)(r * 128 + ((((c >> 4) ^ (r & 7)) << 4) | (c & 15)));
}
// Shared-memory accesses by 32-bit address. volatile: they stay in program order with the other
// volatile asm of a loop body (lds_f32x2 keeps the compiler from loading a whole stage's LSE or D
// values at once, 16-32 registers).
__device__ __forceinline__ float2 lds_f32x2(uint32_t addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
}
__device__ __forceinline__ void sts_b32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void sts_f32x2(uint32_t addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

#endif  // PTX_SMEM_CUH
