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
#include <stdint.h>

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

/* ---- CUDA kernels (kernels/cuda/; only in builds with STRAIT_HAVE_CUDA) -
 * Pointers without h_ are device memory; stream is a cudaStream_t (NULL:
 * the default stream), passed as void * so this header stays plain C.
 * Each produces the same bytes or floats as its CPU twin in compress/;
 * functions returning int give -1 when the input holds a non-finite value. */
#ifdef STRAIT_HAVE_CUDA
void *kernels_cuda_alloc(size_t bytes);
void kernels_cuda_free(void *p);
void kernels_cuda_to_device(void *d, const void *h, size_t bytes);
void kernels_cuda_to_host(void *h, const void *d, size_t bytes);

/* fp32 section payload: x copied to h_out after a finite check */
int kernels_cuda_copy_checked(const float *x, uint64_t n, float *h_out, void *stream);
/* fp16 (bf16 = 0) or bf16 payload of x[0..n) into h_out */
int kernels_cuda_cast_half(const float *x, uint64_t n, int bf16, uint16_t *h_out, void *stream);
/* int8 payload of a section (tables and codes, codec_int8.c's layout) */
int kernels_cuda_int8_encode(const float *x, uint32_t count, uint32_t block, uint8_t *h_raw,
                             void *stream);
/* sum[0..count) += w * decoded int8 payload h_raw */
void kernels_cuda_int8_accumulate(const uint8_t *h_raw, uint32_t count, uint32_t block, float w,
                                  float *sum, void *stream);
/* exact top-k of every chunk of a section: indices (ascending per chunk)
 * and values, total_k of each, chunk after chunk */
int kernels_cuda_topk_select(const float *x, uint32_t count, uint32_t chunk, uint32_t ppm,
                             uint64_t total_k, uint16_t *h_sel, float *h_vals, void *stream);
#endif

#endif /* STRAIT_KERNELS_H */
