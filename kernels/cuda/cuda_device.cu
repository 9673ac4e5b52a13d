// The CUDA side of kernels.h: device discovery.  The kernels themselves arrive with F9.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_kernels.h"

extern "C" int kcuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // no driver or no device: report none, clear the error
        return 0;
    }
    return n;
}
