// attn_bench_shim_delta.cu: launches fp8_dm's delta-pass kernel (attn_bwd_fp8_delta_kernel of
// src/attention_bwd_fp8.cu) on its own, so the benchmark can time it without touching src/. The
// kernel has no launcher of its own and its host stub is local to its object file, so this file
// compiles the same source once more (same flags, same code) with its exported functions
// renamed, and launches its copy of the kernel with the grid, shared memory and head groups of
// backward_fp8_d. If src/ changes those, the benchmark's check (D equal to the backward's
// delta_out) shows it; if it no longer compiles, the library is linked without this file.
#define attn_gpu_backward_fp8 shim_copy_attn_gpu_backward_fp8
#define attn_gpu_backward_fp8_workspace_bytes shim_copy_attn_gpu_backward_fp8_workspace_bytes
#define attn_gpu_backward_fp8_test_group_heads shim_copy_attn_gpu_backward_fp8_test_group_heads
#include "attention_bwd_fp8.cu"
#undef attn_gpu_backward_fp8
#undef attn_gpu_backward_fp8_workspace_bytes
#undef attn_gpu_backward_fp8_test_group_heads

template <int D, bool E5>
static int delta_launch(const uint8_t *qc, const uint8_t *kc, const uint8_t *vc, const uint8_t *doc,
                        const float *qs, const float *ks, const float *vs, const float *dos, const float *lse,
                        float *delta, int B, int H, int T, cudaStream_t stream) {
    const size_t smem = B8DeltaSmem::bytes;  // as backward_fp8_d
    static bool attr_set = false;
    if (!attr_set) {
        if (cudaFuncSetAttribute(attn_bwd_fp8_delta_kernel<D, E5>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) != cudaSuccess)
            return -1;
        attr_set = true;
    }
    // the FP32 dQ accumulator the kernel zeroes (its rows), as in the backward: a scratch buffer
    // of this shim, grown when a call needs more
    static float *dq_acc = NULL;
    static size_t dq_bytes = 0;
    const size_t need = (size_t)B * H * T * D * sizeof(float);
    if (need > dq_bytes) {
        if (dq_acc) cudaFree(dq_acc);
        dq_acc = NULL;
        dq_bytes = 0;
        if (cudaMalloc(&dq_acc, need) != cudaSuccess) return -1;
        dq_bytes = need;
    }
    attn_bwd_fp8_delta_kernel<D, E5><<<B8DeltaSmem::grid(T, B * H), B8_THREADS, smem, stream>>>(
        qc, kc, vc, doc, qs, ks, vs, dos, lse, delta, dq_acc, NULL, NULL, T, 1.0f / sqrtf((float)D),
        bwd_fp8_delta_heads_per_group(B * H));
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int shim_delta_launch(const uint8_t *qc, const uint8_t *kc, const uint8_t *vc, const uint8_t *doc,
                                 const float *qs, const float *ks, const float *vs, const float *dos,
                                 const float *lse, float *delta, int B, int H, int T, int d, int e5,
                                 cudaStream_t stream) {
    if (d == 64)
        return e5 ? delta_launch<64, true>(qc, kc, vc, doc, qs, ks, vs, dos, lse, delta, B, H, T, stream)
                  : delta_launch<64, false>(qc, kc, vc, doc, qs, ks, vs, dos, lse, delta, B, H, T, stream);
    return e5 ? delta_launch<128, true>(qc, kc, vc, doc, qs, ks, vs, dos, lse, delta, B, H, T, stream)
              : delta_launch<128, false>(qc, kc, vc, doc, qs, ks, vs, dos, lse, delta, B, H, T, stream);
}
