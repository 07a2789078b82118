// tensor_map.h: TMA tensor maps (CUtensorMap) for the attention kernels, host side (CUDA sources). One place for
// cuTensorMapEncodeTiled, which the runtime hands out from the driver (no -lcuda at link time),
// and for the FATAL message when a map cannot be made.
#pragma once

#include <cuda.h>          // CUtensorMap and its enums (types only: no -lcuda)
#include <cuda_runtime.h>  // cudaGetDriverEntryPointByVersion
#include <stdint.h>        // uint32_t, uint64_t, uintptr_t

#include "attention/common.cuh"  // CUDA_OK
#include "core/common.h"         // FATAL

typedef CUresult (*TensorMapEncodeTiledFn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                           const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                           const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                           CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled, looked up once per translation unit. `who` names the kernel that needs
// it in the message when the driver has none (CUDA 12+ drivers do).
static inline TensorMapEncodeTiledFn tensor_map_encode_fn(const char *who) {
    static TensorMapEncodeTiledFn fn = nullptr;
    if (!fn) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult st;
        CUDA_OK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &st));
        if (st != cudaDriverEntryPointSuccess || !p)
            FATAL("cuTensorMapEncodeTiled not found in the CUDA driver (%s needs CUDA 12+)", who);
        fn = (TensorMapEncodeTiledFn)p;
    }
    return fn;
}

// A tiled map of `rank` dimensions (dims innermost first, byte strides of dims 1.. rank-1), box
// `box`, element strides 1, no interleave, the given swizzle, L2 promotion 256 B, out-of-bound
// elements read as zero (and not written by stores or reductions).
static inline CUtensorMap tensor_map_tiled(const char *who, CUtensorMapDataType type, int rank, const void *base,
                                           const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                           CUtensorMapSwizzle swizzle) {
    CUtensorMap m;
    const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
    const CUresult r = tensor_map_encode_fn(who)(&m, type, (cuuint32_t)rank, (void *)base, dims, strides, box,
                                                 elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        FATAL("%s: cuTensorMapEncodeTiled failed (%d) for a rank-%d map of dims %llu x %llu x %llu, box %u x %u", who,
              (int)r, rank, (unsigned long long)dims[0], (unsigned long long)(rank > 1 ? dims[1] : 1),
              (unsigned long long)(rank > 2 ? dims[2] : 1), box[0], rank > 1 ? box[1] : 1);
    }
    return m;
}

// A 2-D map of `rows` rows of `cols` elements, `row_bytes` apart (a multiple of 16), box
// box_cols x box_rows: the FP8 kernels' code matrices (plain and transposed) and per-row vectors.
static inline CUtensorMap tensor_map_2d(const char *who, CUtensorMapDataType type, const void *base, uint64_t cols,
                                        uint64_t rows, uint64_t row_bytes, uint32_t box_cols, uint32_t box_rows,
                                        CUtensorMapSwizzle swizzle) {
    const cuuint64_t dims[2] = {cols, rows}, strides[1] = {row_bytes};
    const cuuint32_t box[2] = {box_cols, box_rows};
    return tensor_map_tiled(who, type, 2, base, dims, strides, box, swizzle);
}

// A (B, T, H, D) BF16 tensor with a row stride of `stride` elements (q, k, v inside the qkv
// buffer, O, dO) as a 4-D map (d, h, t, b); box 64 x 1 x rows x 1 (a box row is 64 values = 128
// bytes) in the 128-byte swizzle (load_tile_sw128's layout, stage_o_sw128's): rows past T of a
// sequence are zero-filled by loads and not written by stores.
static inline CUtensorMap tensor_map_bthd(const char *who, const void *base, int B, int H, int T, int D, int stride,
                                          int rows) {
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)H, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)D * 2, (cuuint64_t)stride * 2, (cuuint64_t)T * stride * 2};
    const cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1};
    return tensor_map_tiled(who, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, base, dims, strides, box,
                            CU_TENSOR_MAP_SWIZZLE_128B);
}

// A tensor map's rows must start at 16-byte aligned addresses: the base and the row pitch. The
// launchers take a kernel's TMA form only where this holds (else its per-thread form).
static inline bool tma_rows_aligned(const void *base, long row_bytes) {
    return (uintptr_t)base % 16 == 0 && row_bytes % 16 == 0;
}
