// gpu_info.h: is there a usable GPU, and what are its peak rates (for MFU).
#ifndef GPU_INFO_H
#define GPU_INFO_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int count;            // usable CUDA devices (0 where no driver or no GPU)
    char name[256];       // device 0's name
    int sm_major, sm_minor;
    double peak_bf16_tflops;  // dense BF16 tensor-core peak of device 0 (0 when unknown)
    double mem_gib;
} GpuInfo;

// Never fails: a machine without a driver or GPU reports count 0 and why in `why`.
void gpu_info_query(GpuInfo *g, char *why, int why_len);

#ifdef __cplusplus
}
#endif
#endif  // GPU_INFO_H
