/*
 * kernels.h — the API of kernels/: the math of Strait and the devices it runs
 * on. CPU ops live in kernels/cpu/ and CUDA ops in kernels/cuda/ with
 * the same signatures (the CUDA one adds a trailing stream); the Makefile
 * picks the backend at build time (STRAIT_HAVE_CUDA).
 *
 * For now this header holds what the foundation needs: which capabilities
 * the build has and which accelerators the machine has.
 */
#ifndef STRAIT_KERNELS_H
#define STRAIT_KERNELS_H

#include <stddef.h>

/* What this binary was built with, as the Makefile's probes found it. */
typedef struct KernelsBuildCaps {
    int cuda;     /* CUDA kernels compiled in (nvcc, cudart, cuBLAS) */
    int nccl;     /* NCCL linked for multi-GPU data parallelism */
    int openblas; /* OpenBLAS for CPU matrix products */
    int openmp;   /* OpenMP for CPU threads */
} KernelsBuildCaps;

KernelsBuildCaps kernels_build_caps(void);

/* The machine's GPUs as the CUDA runtime sees them.
 * Returns the device count (0 when there is no GPU or no driver, with the
 * runtime's reason in `why`), and the first device's name in `name`.
 * Both buffers may be NULL. Never fails hard: no GPU is a normal state. */
int kernels_gpu_count(char *name, size_t name_len, char *why, size_t why_len);

/* NCCL's version as "2.27.7", or "" when NCCL is not linked. */
const char *kernels_nccl_version(void);

#endif /* STRAIT_KERNELS_H */
