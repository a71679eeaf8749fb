/*
 * cuda_common.h — what the .cu files of kernels/cuda share: fail-fast checks
 * with file:line after every CUDA, cuBLAS and NCCL call (STYLE.md: inside a
 * kernel or a training step, errors are fatal).
 */
#ifndef STRAIT_KERNELS_CUDA_COMMON_H
#define STRAIT_KERNELS_CUDA_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#define cudaCheck(call)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "fatal (%s:%d): CUDA: %s\n", __FILE__, __LINE__,                       \
                    cudaGetErrorString(e_));                                                       \
            abort();                                                                               \
        }                                                                                          \
    } while (0)
#define launchCheck() cudaCheck(cudaGetLastError())

#endif
