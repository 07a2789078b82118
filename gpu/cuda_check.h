// cuda_check.h: error checks for CUDA runtime and cuBLASLt calls. A failure is an internal
// error: FATAL-style message naming the file, the line, the call, the library's own error name
// and text, and a hint of what usually causes it; then exit(1) through fatal_at (common.h).
//
//   CUDA_CHECK(cudaMalloc(&p, n));          // any cudaError_t-returning call
//   my_kernel<<<grid, block, 0, s>>>(...);
//   CUDA_CHECK_LAUNCH();                    // launch-configuration errors (bad grid, smem, ...)
//   CUBLASLT_CHECK(cublasLtMatmul(...));    // any cublasStatus_t-returning call
//
// Launch errors only show up through cudaGetLastError; errors inside a kernel (bad address)
// surface at a later synchronising call, so the hint for those points at compute-sanitizer.
#ifndef CUDA_CHECK_H
#define CUDA_CHECK_H

#include <cublasLt.h>      // cublasStatus_t, cublasLtGetStatusName/String
#include <cuda_runtime.h>  // cudaError_t, cudaGetErrorName/String, cudaGetLastError

#include "core/common.h"  // fatal_at

// What to try first for the errors people actually hit.
static inline const char *cuda_error_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorMemoryAllocation:
        return "out of GPU memory: lower the micro-batch or the sequence length (see the memory plan of --dry-run)";
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return "no usable GPU or the driver is older than the toolkit: check nvidia-smi, or run on the CPU backend";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
        return "a kernel accessed memory out of bounds (this or an earlier launch): rerun under compute-sanitizer";
    case cudaErrorInvalidConfiguration:
        return "bad launch configuration (grid/block size or shared memory): check the shapes passed to the launcher";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return "the binary was not built for this GPU: rebuild with GPU_ARCH matching its compute capability";
    case cudaErrorInvalidValue:
        return "an argument is invalid (null or misaligned pointer, size 0, wrong direction)";
    default:
        return "check the arguments of the call and the launches before it";
    }
}

static inline const char *cublaslt_error_hint(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "no cuBLASLt kernel for this shape/type/alignment combination: check leading dimensions and pointer alignment";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an invalid matrix layout or descriptor attribute (dimensions vs. leading dimensions, transposes)";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "cuBLASLt could not allocate host or device memory";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "cuBLASLt handle missing: call matmul_gpu_init() first";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GEMM kernel failed to run: an earlier kernel may have corrupted memory (compute-sanitizer)";
    default:
        return "check the GEMM arguments";
    }
}

#define CUDA_CHECK(call)                                                                        \
    do {                                                                                        \
        cudaError_t cuda_check_err_ = (call);                                                   \
        if (cuda_check_err_ != cudaSuccess)                                                     \
            fatal_at(__FILE__, __LINE__, "CUDA call %s failed: %s (%s) (hint: %s)", #call,      \
                     cudaGetErrorName(cuda_check_err_), cudaGetErrorString(cuda_check_err_),    \
                     cuda_error_hint(cuda_check_err_));                                         \
    } while (0)

// After a <<<...>>> launch: catches configuration errors at once (asynchronous faults later).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLASLT_CHECK(call)                                                                    \
    do {                                                                                        \
        cublasStatus_t cublaslt_check_st_ = (call);                                             \
        if (cublaslt_check_st_ != CUBLAS_STATUS_SUCCESS)                                        \
            fatal_at(__FILE__, __LINE__, "cuBLASLt call %s failed: %s (%s) (hint: %s)", #call,  \
                     cublasLtGetStatusName(cublaslt_check_st_),                                 \
                     cublasLtGetStatusString(cublaslt_check_st_),                               \
                     cublaslt_error_hint(cublaslt_check_st_));                                  \
    } while (0)

#endif  // CUDA_CHECK_H
