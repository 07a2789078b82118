// matmul.cu: cuBLASLt BF16 GEMMs with FP32 accumulation, cached plans, one workspace
// (see matmul.h).
//
// Row-major to cuBLAS's column-major: a row-major (R, C) matrix is a column-major (C, R) one,
// so every product is computed transposed. With x (M, K), W (N, K):
//   forward  Y^T (N, M)  = op_T(W as (K, N)) . (x as (K, M))       m=N n=M k=K  A=W^T B=x
//   dgrad    dX^T (K, M) = (W as (K, N)) . (dy as (N, M))          m=K n=M k=N  A=W   B=dy
//   wgrad    dW^T (K, N) = (x as (K, M)) . op_T(dy as (N, M))      m=K n=N k=M  A=x   B=dy^T
#include "gpu/matmul.h"

#include <cublasLt.h>      // the cuBLASLt API
#include <cuda_runtime.h>  // cudaMalloc, cudaFree
#include <stdint.h>        // uintptr_t
#include <string.h>        // memset

#include "core/common.h"          // FATAL
#include "gpu/cuda_check.h"       // CUDA_CHECK, CUBLASLT_CHECK
#include "gpu/gemm_plan_cache.h"  // GemmPlanCache: the plans cached per shape

// Everything that selects a plan. Pointer alignment is part of it because the heuristic only
// returns algorithms valid for the alignment it was promised.
typedef struct {
    int transa, transb;   // 0: N, 1: T
    int m, n, k;
    long long lda, ldb, ldc;
    int out_fp32;         // C/D type: 0 BF16, 1 FP32
    int align_a, align_b, align_c;  // bytes, power of two <= 256
} GemmKey;

typedef struct {
    GemmKey key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

#define MAX_PLANS 64  // a model uses ~10 distinct shapes; the table evicts round-robin if full

static cublasLtHandle_t handle;
static void *workspace;  // MATMUL_WORKSPACE_BYTES on the device
static GemmPlanCache<GemmPlan, MAX_PLANS> cache;

extern "C" void matmul_gpu_init(void) {
    if (handle) return;
    CUBLASLT_CHECK(cublasLtCreate(&handle));
    CUDA_CHECK(cudaMalloc(&workspace, MATMUL_WORKSPACE_BYTES));
}

extern "C" int matmul_gpu_pick_algo(void *op, void *a, void *b, void *c, int align_a, int align_b, int align_c,
                                    void *algo) {
    if (!handle) FATAL("matmul_gpu_pick_algo before matmul_gpu_init() (hint: call it once at start)");
    cublasLtMatmulPreference_t pref;
    CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = MATMUL_WORKSPACE_BYTES;
    const uint32_t al[4] = {(uint32_t)align_a, (uint32_t)align_b, (uint32_t)align_c, (uint32_t)align_c};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    for (int i = 0; i < 4; i++) CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, (cublasLtMatmulDesc_t)op, (cublasLtMatrixLayout_t)a,
                                                       (cublasLtMatrixLayout_t)b, (cublasLtMatrixLayout_t)c,
                                                       (cublasLtMatrixLayout_t)c, pref, 1, &result, &found);
    CUBLASLT_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (st == CUBLAS_STATUS_SUCCESS && found == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS) *(cublasLtMatmulAlgo_t *)algo = result.algo;
    return (int)st;
}

extern "C" void *matmul_gpu_lt_handle(void) {
    if (!handle) FATAL("matmul_gpu_lt_handle before matmul_gpu_init() (hint: call it once at start)");
    return (void *)handle;
}

extern "C" void *matmul_gpu_workspace(void) {
    if (!handle) FATAL("matmul_gpu_workspace before matmul_gpu_init() (hint: call it once at start)");
    return workspace;
}

extern "C" void matmul_gpu_shutdown(void) {
    if (!handle) return;
    cache.clear();
    CUDA_CHECK(cudaFree(workspace));
    workspace = NULL;
    CUBLASLT_CHECK(cublasLtDestroy(handle));
    handle = NULL;
}

extern "C" int matmul_gpu_plan_count(void) { return cache.n; }

static int pointer_alignment(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 1;
    while (a < 256 && !(u & (uintptr_t)a)) a <<= 1;
    return a;
}

// A stored (rows, cols) column-major matrix with leading dimension ld.
static cublasLtMatrixLayout_t make_layout(cudaDataType_t type, long long rows, long long cols, long long ld) {
    cublasLtMatrixLayout_t l;
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&l, type, (uint64_t)rows, (uint64_t)cols, ld));
    return l;
}

static void plan_build(GemmPlan *p, const GemmKey *k) {
    memset(p, 0, sizeof *p);
    p->key = *k;
    const cublasOperation_t ta = k->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = k->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLASLT_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    // Stored shapes: op(A) is (m, k), op(B) is (k, n), C/D is (m, n).
    p->a = k->transa ? make_layout(CUDA_R_16BF, k->k, k->m, k->lda) : make_layout(CUDA_R_16BF, k->m, k->k, k->lda);
    p->b = k->transb ? make_layout(CUDA_R_16BF, k->n, k->k, k->ldb) : make_layout(CUDA_R_16BF, k->k, k->n, k->ldb);
    p->c = make_layout(k->out_fp32 ? CUDA_R_32F : CUDA_R_16BF, k->m, k->n, k->ldc);

    cublasStatus_t st = (cublasStatus_t)matmul_gpu_pick_algo(p->op, p->a, p->b, p->c, k->align_a, k->align_b,
                                                              k->align_c, &p->algo);
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) CUBLASLT_CHECK(st);
    if (st != CUBLAS_STATUS_SUCCESS)
        FATAL("cuBLASLt has no algorithm for GEMM m=%d n=%d k=%d trans=%d%d out=%s alignments %d/%d/%d "
              "(hint: pad the dimensions to multiples of 8 and align the buffers to 16 bytes)",
              k->m, k->n, k->k, k->transa, k->transb, k->out_fp32 ? "fp32" : "bf16", k->align_a, k->align_b,
              k->align_c);
}

static const GemmPlan *plan_get(const GemmKey *k) {
    if (const GemmPlan *hit = cache.find(*k)) return hit;
    GemmPlan *p = cache.slot();
    plan_build(p, k);
    return p;
}

// D = A op B (+ D when accumulate) in column-major terms; D is also C.
static void gemm(int transa, int transb, int m, int n, int k, const void *A, long long lda, const void *B,
                 long long ldb, void *D, long long ldd, int out_fp32, int accumulate, cudaStream_t stream) {
    if (!handle) FATAL("matmul used before matmul_gpu_init() (hint: call it once at start)");
    if (m <= 0 || n <= 0 || k <= 0) FATAL("GEMM with empty shape m=%d n=%d k=%d", m, n, k);
    GemmKey key;
    memset(&key, 0, sizeof key);  // padding bytes too: the key is compared with memcmp
    key.transa = transa;
    key.transb = transb;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldd;
    key.out_fp32 = out_fp32;
    key.align_a = pointer_alignment(A);
    key.align_b = pointer_alignment(B);
    key.align_c = pointer_alignment(D);
    const GemmPlan *p = plan_get(&key);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    CUBLASLT_CHECK(cublasLtMatmul(handle, p->op, &alpha, A, p->a, B, p->b, &beta, D, p->c, D, p->c, &p->algo,
                                  workspace, MATMUL_WORKSPACE_BYTES, stream));
}

extern "C" void matmul_forward_gpu(uint16_t *y, const uint16_t *x, const uint16_t *w, int M, int N, int K,
                                   int accumulate, cudaStream_t stream) {
    gemm(1, 0, N, M, K, w, K, x, K, y, N, 0, accumulate, stream);
}

extern "C" void matmul_dgrad_gpu(uint16_t *dx, const uint16_t *dy, const uint16_t *w, int M, int N, int K,
                                 int accumulate, cudaStream_t stream) {
    gemm(0, 0, K, M, N, w, K, dy, N, dx, K, 0, accumulate, stream);
}

extern "C" void matmul_wgrad_gpu(float *dw, const uint16_t *dy, const uint16_t *x, int M, int N, int K,
                                 cudaStream_t stream) {
    gemm(0, 1, K, N, M, x, K, dy, N, dw, K, 1, 1, stream);
}
