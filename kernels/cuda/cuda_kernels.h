/* The CUDA implementation's entry points, called from kernels/kernels.c when the build
 * has CUDA (FSDP_HAVE_CUDA).  C linkage so the C host code can call them. */
#ifndef FSDP_CUDA_KERNELS_H
#define FSDP_CUDA_KERNELS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no driver or no device. */
int kcuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
