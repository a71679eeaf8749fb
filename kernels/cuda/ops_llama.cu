/*
 * ops_llama.cu — the CUDA twins of kernels/cpu/ops_llama.c: RMSNorm (one
 * block of 128 threads per row), rotary embeddings (the frequencies from
 * ops.h's rope_inv_freq, the CPU's floats, in constant memory) and SwiGLU.
 */
#include <math.h>

#include <cuda_runtime.h>

#include "cuda_common.h"

static cudaStream_t S(void *s) {
    return (cudaStream_t)s;
}
static int blocks(size_t n, int per) {
    return (int)((n + (size_t)per - 1) / (size_t)per);
}

/* ---- RMSNorm -------------------------------------------------------------------- */

__global__ void rmsnorm_forward_k(float *out, float *rstd, const float *inp, const float *w, int C,
                                  float eps) {
    __shared__ float sh[32];
    const float *x = inp + (size_t)blockIdx.x * C;
    float ss = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) ss += x[i] * x[i];
    float s = rsqrtf(block_sum(ss, sh) / C + eps);
    float *o = out + (size_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) o[i] = w[i] * (x[i] * s);
    if (threadIdx.x == 0) rstd[blockIdx.x] = s;
}

__global__ void rmsnorm_backward_k(float *dinp, float *dw, const float *dout, const float *inp,
                                   const float *w, const float *rstd, int C) {
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    const float *d = dout + row * C, *x = inp + row * C;
    float *dx = dinp + row * C, s = rstd[row], dot = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) dot += w[i] * d[i] * x[i];
    float k = s * s * s * block_sum(dot, sh) / C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        if (dw != NULL) atomicAdd(&dw[i], d[i] * (x[i] * s)); /* NULL: frozen */
        dx[i] += s * w[i] * d[i] - k * x[i];
    }
}

extern "C" void rmsnorm_forward_cuda(float *out, float *rstd, const float *inp, const float *w,
                                     int N, int C, float eps, void *stream) {
    rmsnorm_forward_k<<<N, 128, 0, S(stream)>>>(out, rstd, inp, w, C, eps);
    launchCheck();
}

extern "C" void rmsnorm_backward_cuda(float *dinp, float *dw, const float *dout, const float *inp,
                                      const float *w, const float *rstd, int N, int C,
                                      void *stream) {
    rmsnorm_backward_k<<<N, 128, 0, S(stream)>>>(dinp, dw, dout, inp, w, rstd, C);
    launchCheck();
}

/* ---- rotary embeddings ------------------------------------------------------------- */

__constant__ float inv_freq_c[512];

/* one thread per pair (b, t, h, i) */
__global__ void rope_k(float *x, int B, int T, int NH, int HD, int ld, float sign) {
    int half = HD / 2;
    size_t n = (size_t)B * T * NH * half, j = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (j >= n) return;
    int i = (int)(j % half);
    size_t bth = j / half;
    int h = (int)(bth % NH);
    size_t bt = bth / NH;
    int t = (int)(bt % T);
    float a = (float)t * inv_freq_c[i], c = cosf(a), s = sign * sinf(a);
    float *p = x + bt * ld + (size_t)h * HD;
    float x1 = p[i], x2 = p[i + half];
    p[i] = x1 * c - x2 * s;
    p[i + half] = x2 * c + x1 * s;
}

static void rope_cuda(float *x, int B, int T, int NH, int HD, int ld, const RopeConfig *r,
                      float sign, void *stream) {
    float inv[512];
    if (HD / 2 > 512) {
        fprintf(stderr, "fatal (%s:%d): heads of %d channels; at most 1024\n", __FILE__, __LINE__,
                HD);
        abort();
    }
    rope_inv_freq(r, HD, inv);
    /* from pageable memory the copy has left inv when the call returns
     * (CUDA's API synchronization behavior), in order on the stream */
    cudaCheck(cudaMemcpyToSymbolAsync(inv_freq_c, inv, sizeof(float) * (size_t)(HD / 2), 0,
                                      cudaMemcpyHostToDevice, S(stream)));
    size_t n = (size_t)B * T * NH * (HD / 2);
    rope_k<<<blocks(n, 256), 256, 0, S(stream)>>>(x, B, T, NH, HD, ld, sign);
    launchCheck();
}

extern "C" void rope_forward_cuda(float *x, int B, int T, int NH, int HD, int ld,
                                  const RopeConfig *r, void *stream) {
    rope_cuda(x, B, T, NH, HD, ld, r, 1.0f, stream);
}

extern "C" void rope_backward_cuda(float *dx, int B, int T, int NH, int HD, int ld,
                                   const RopeConfig *r, void *stream) {
    rope_cuda(dx, B, T, NH, HD, ld, r, -1.0f, stream);
}

/* ---- SwiGLU ---------------------------------------------------------------------- */

__global__ void swiglu_forward_k(float *out, const float *gate, const float *up, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= N) return;
    float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
}

__global__ void swiglu_backward_k(float *dgate, float *dup, const float *dout, const float *gate,
                                  const float *up, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= N) return;
    float g = gate[i], sig = 1.0f / (1.0f + expf(-g));
    dgate[i] += dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    dup[i] += dout[i] * g * sig;
}

extern "C" void swiglu_forward_cuda(float *out, const float *gate, const float *up, size_t N,
                                    void *stream) {
    swiglu_forward_k<<<blocks(N, 256), 256, 0, S(stream)>>>(out, gate, up, N);
    launchCheck();
}

extern "C" void swiglu_backward_cuda(float *dgate, float *dup, const float *dout, const float *gate,
                                     const float *up, size_t N, void *stream) {
    swiglu_backward_k<<<blocks(N, 256), 256, 0, S(stream)>>>(dgate, dup, dout, gate, up, N);
    launchCheck();
}
