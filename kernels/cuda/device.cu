/*
 * device.cu — the device query of a CUDA build: how many GPUs the CUDA
 * runtime sees and what the first one is, and the NCCL version when NCCL is
 * linked. A machine without a GPU or driver is a normal state here, not an
 * error: the count is 0 and `why` carries the runtime's reason.
 */
#include <stdio.h>

#include <cuda_runtime.h>
#ifdef STRAIT_HAVE_NCCL
#include <nccl.h>
#endif

extern "C" {
#include "kernels/device.h"
#include "kernels/cuda.h"
}

/* what the loader checks before it calls anything here (cuda.h) */
extern "C" const int strait_cuda_plugin_abi = STRAIT_CUDA_ABI;

extern "C" int kernels_gpu_count(char *name, size_t name_len, char *why, size_t why_len) {
    if (name && name_len) name[0] = '\0';
    if (why && why_len) why[0] = '\0';
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        if (why && why_len) snprintf(why, why_len, "%s", cudaGetErrorString(rc));
        cudaGetLastError(); /* clear the sticky error so later calls start clean */
        return 0;
    }
    if (n > 0 && name && name_len) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
            snprintf(name, name_len, "%s (sm_%d%d, %.0f GiB)", prop.name, prop.major, prop.minor,
                     (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    }
    return n;
}

extern "C" const char *kernels_nccl_version(void) {
#ifdef STRAIT_HAVE_NCCL
    static char buf[32];
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) return "";
    /* NCCL >= 2.9 encodes major*10000 + minor*100 + patch */
    snprintf(buf, sizeof buf, "%d.%d.%d", v / 10000, (v / 100) % 100, v % 100);
    return buf;
#else
    return "";
#endif
}
