// gpu_info.cu: GPU discovery (count, name, compute capability, memory) and the dense BF16 peak
// used for MFU. The peak table lists the GPUs we know; others report 0 so MFU says "n/a".
#include "gpu/gpu_info.h"

#include <cuda_runtime.h>  // cudaGetDeviceCount, cudaGetDeviceProperties
#include <stdio.h>         // snprintf
#include <string.h>        // strstr

// Dense BF16 tensor-core peak in TFLOP/s by product name (vendor data sheets, SXM parts).
static double peak_bf16_for(const char *name) {
    if (strstr(name, "H200")) return 989.0;
    if (strstr(name, "H100")) return strstr(name, "PCIe") ? 756.0 : 989.0;
    if (strstr(name, "H800")) return 989.0;
    if (strstr(name, "A100")) return 312.0;
    if (strstr(name, "L40S")) return 362.0;
    return 0.0;
}

extern "C" void gpu_info_query(GpuInfo *g, char *why, int why_len) {
    memset(g, 0, sizeof *g);
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        // Without a driver the runtime reports "CUDA driver version is insufficient", which reads
        // as if a driver were there: the driver's version (0: none) tells the cases apart.
        int driver = 0, runtime = 0;
        cudaDriverGetVersion(&driver);
        cudaRuntimeGetVersion(&runtime);
        if (!why) {
        } else if (driver == 0) {
            snprintf(why, why_len, "no NVIDIA driver found");
        } else if (err == cudaErrorInsufficientDriver) {
            snprintf(why, why_len, "the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d this build needs: "
                                   "update the driver", driver / 1000, driver % 1000 / 10, runtime / 1000,
                     runtime % 1000 / 10);
        } else if (err == cudaErrorNoDevice || err == cudaSuccess) {
            snprintf(why, why_len, "the NVIDIA driver finds no GPU");
        } else {
            snprintf(why, why_len, "%s", cudaGetErrorString(err));
        }
        cudaGetLastError();  // clear the sticky error so later queries start clean
        return;
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        if (why) snprintf(why, why_len, "cudaGetDeviceProperties failed");
        return;
    }
    g->count = n;
    snprintf(g->name, sizeof g->name, "%s", prop.name);
    g->sm_major = prop.major;
    g->sm_minor = prop.minor;
    g->mem_gib = (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0);
    g->peak_bf16_tflops = peak_bf16_for(prop.name);
    if (why) snprintf(why, why_len, "ok");
}
