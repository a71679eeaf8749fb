/*
 * device.h — what this build of kernels/ can run on: the capabilities the
 * Makefile's probes compiled in, the machine's GPUs and NCCL, and the CPU
 * threads the ops use (kernels/device.c, kernels/cuda/device.cu).
 */
#ifndef STRAIT_KERNELS_DEVICE_H
#define STRAIT_KERNELS_DEVICE_H

#include <stddef.h>

/* What this binary was built with, as the Makefile's probes found it. */
typedef struct KernelsBuildCaps {
    int cuda;     /* CUDA kernels compiled in (nvcc, cudart, cuBLAS) */
    int nccl;     /* NCCL linked for multi-GPU data parallelism */
    int openblas; /* OpenBLAS for CPU matrix products */
    int openmp;   /* OpenMP for CPU threads */
    int mpi;      /* MPI for sites of several ranks (mpirun, srun) */
} KernelsBuildCaps;

KernelsBuildCaps kernels_build_caps(void);

/* The machine's GPUs as the CUDA runtime sees them.
 * Returns the device count (0 when there is no GPU or no driver, with the
 * runtime's reason in `why`), and the first device's name in `name`.
 * Both buffers may be NULL. Never fails hard: no GPU is a normal state. */
int kernels_gpu_count(char *name, size_t name_len, char *why, size_t why_len);

/* NCCL's version as "2.27.7", or "" when NCCL is not linked. */
const char *kernels_nccl_version(void);

/* The memory this machine has available now (MemAvailable, else the free
 * pages), in bytes; 0 if neither can be read. */
double kernels_mem_available(void);

/* n OpenMP threads for the ops (0: keep the default), OpenBLAS on one: the
 * ops split their products across the OpenMP threads themselves. */
void kernels_set_threads(int n);

/* The CPU's kernels (kernels/cpu/chip.c): the OpenBLAS kernel this
 * process runs ("SkylakeX"; "none" without OpenBLAS), the one the chip's
 * instructions allow (by CPUID, never by model name), a kernel's rank
 * (1 SSE, 2 AVX, 3 AVX2, 4 AVX-512; 0: not known here), and 1 with why
 * when the one running is below the chip's. kernels_blas_check computes a
 * small product and compares it with a reference: 0, or -1 with err when
 * the kernel is wrong here. kernels_bf16_isa: what runs the bf16 matmuls. */
const char *kernels_blas_core(void);
const char *kernels_blas_core_for_chip(void);
int kernels_blas_rank(const char *core);
int kernels_blas_below_chip(char *why, size_t len);
int kernels_blas_check(char *err);
const char *kernels_bf16_isa(void);

#endif /* STRAIT_KERNELS_DEVICE_H */
