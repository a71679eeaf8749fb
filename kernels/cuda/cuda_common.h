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

/* the sum of v over a block (a multiple of 32 threads), through shared[32] */
static __device__ inline float block_sum(float v, float *shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float s = 0;
    for (int w = 0; w < nw; w++) s += shared[w];
    return s;
}

/* the largest head (HD) attention.cu's kernels take */
#define ATTN_MAX_HD 256

/* The op twins behind ops_cuda (ops.cu, ops_llama.cu, attention.cu): ops.h's arguments on
 * device pointers, and the stream. */
extern "C" {
#include "kernels/ops.h"
void encoder_forward_cuda(float *out, const int *inp, const float *wte, const float *wpe, int B,
                          int T, int C, void *stream);
void encoder_backward_cuda(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                           int T, int C, void *stream);
void layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *inp, const float *w,
                            const float *bias, int N, int C, void *stream);
void layernorm_backward_cuda(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C,
                             void *stream);
void rmsnorm_forward_cuda(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                          float eps, void *stream);
void rmsnorm_backward_cuda(float *dinp, float *dw, const float *dout, const float *inp,
                           const float *w, const float *rstd, int N, int C, void *stream);
void matmul_forward_cuda(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC, void *stream);
void matmul_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC,
                          void *stream);
void attention_forward_cuda(float *out, float *lse, const float *q, const float *k, const float *v,
                            const AttnShape *s, void *stream);
void attention_backward_cuda(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                             const float *q, const float *k, const float *v, const float *out,
                             const float *lse, const AttnShape *s, void *stream);
void rope_forward_cuda(float *x, int B, int T, int NH, int HD, int ld, const RopeConfig *r,
                       void *stream);
void rope_backward_cuda(float *dx, int B, int T, int NH, int HD, int ld, const RopeConfig *r,
                        void *stream);
void gelu_forward_cuda(float *out, const float *inp, size_t N, void *stream);
void gelu_backward_cuda(float *dinp, const float *inp, const float *dout, size_t N, void *stream);
void swiglu_forward_cuda(float *out, const float *gate, const float *up, size_t N, void *stream);
void swiglu_backward_cuda(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, size_t N, void *stream);
void residual_forward_cuda(float *out, const float *a, const float *b, size_t N, void *stream);
void residual_backward_cuda(float *da, float *db, const float *dout, size_t N, void *stream);
float classifier_forward_backward_cuda(float *losses, float *dh, float *dwte, const float *h,
                                       const float *wte, const int *targets, int N, int C, int V,
                                       void *stream);
}

#endif
