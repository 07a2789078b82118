// gemm_plan_cache.h: the table of cached cuBLASLt GEMM plans that matmul.cu (BF16) and
// linear_fp8_gpu.cu (FP8) each keep. A plan is a struct with a `key` (a padding-free POD,
// compared byte for byte), an operation descriptor `op` and the layouts `a`, `b`, `c`. Plans are
// looked up by key, filled in order, and once the table is full its slots are replaced
// round-robin (a model uses ~10 shapes, so eviction is the exception, not the working mode).
// C++ (templates); included by those .cu files only.
#ifndef GEMM_PLAN_CACHE_H
#define GEMM_PLAN_CACHE_H

#include <cublasLt.h>  // cublasLtMatrixLayoutDestroy, cublasLtMatmulDescDestroy
#include <string.h>    // memcmp

#include "gpu/cuda_check.h"  // CUBLASLT_CHECK

template <class Plan, int N>
struct GemmPlanCache {
    Plan plans[N];
    int n = 0, next_evict = 0;

    // The descriptors a plan owns, released.
    static void destroy(Plan *p) {
        CUBLASLT_CHECK(cublasLtMatrixLayoutDestroy(p->a));
        CUBLASLT_CHECK(cublasLtMatrixLayoutDestroy(p->b));
        CUBLASLT_CHECK(cublasLtMatrixLayoutDestroy(p->c));
        CUBLASLT_CHECK(cublasLtMatmulDescDestroy(p->op));
    }
    template <class Key>
    Plan *find(const Key &k) {
        for (int i = 0; i < n; i++)
            if (memcmp(&plans[i].key, &k, sizeof k) == 0) return &plans[i];
        return nullptr;
    }
    // The slot for a new plan: the next unused one, or, when full, the oldest one (released).
    Plan *slot() {
        if (n < N) return &plans[n++];
        Plan *p = &plans[next_evict];
        next_evict = (next_evict + 1) % N;
        destroy(p);
        return p;
    }
    void clear() {
        for (int i = 0; i < n; i++) destroy(&plans[i]);
        n = next_evict = 0;
    }
};

#endif  // GEMM_PLAN_CACHE_H
