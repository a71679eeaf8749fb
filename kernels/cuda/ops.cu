/*
 * ops.cu — the CUDA twins of kernels/cpu/ops.c and classifier.c: the same
 * ops with the same argument order and a trailing stream, on device
 * pointers. Matrix products go through cuBLAS in fp32; the rest are plain
 * kernels; attention is attention.cu's. Backward ops accumulate (+=) like
 * the CPU ones.
 *
 * Mixed precision (kernels_cuda_set_mirror): a matmul or classifier whose
 * weight lies in the device's mirrored table reads the weight's bf16 copy,
 * rounds its other input (the activation, or dout) to bf16, and sums the
 * products in fp32 (cublasGemmEx on the tensor cores): the products of the
 * CPU's --precision bf16 (matmul_forward_bf16, matmul_backward_bf16,
 * matmul_weight_bf16), in another order of sums.
 *
 * Row-major buffers meet column-major cuBLAS by reading each row-major
 * matrix as its column-major transpose (llm.c's convention).
 *
 * Numerics: the same formulas as the CPU (tanh through expf, the tiled
 * online-softmax classifier); sums run in other
 * orders, so results agree within tolerances, not bit for bit
 * (make test-gpu states them). Reductions over rows use atomics.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "kernels/cuda.h"
}
#include "cuda_common.h"

#define cublasCheck(call)                                                                          \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "fatal (%s:%d): cuBLAS status %d\n", __FILE__, __LINE__, (int)s_);     \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static cudaStream_t S(void *s) {
    return (cudaStream_t)s;
}
static int blocks(size_t n, int per) {
    return (int)((n + (size_t)per - 1) / (size_t)per);
}

/* One cuBLAS handle per device for the process, made at its first use and
 * bound to each op's stream. Not one per host thread: model_cuda_step starts
 * a thread per GPU at every step, and a thread's handle (its workspace on
 * the device) would be lost with the thread, step after step. cuBLAS may be
 * called on one handle from several threads; here one thread at a time
 * drives a device (a replica's step thread, or the caller between steps). */
static int tf32_wanted; /* kernels_cuda_set_tf32 */

extern "C" void kernels_cuda_set_tf32(int on) {
    __atomic_store_n(&tf32_wanted, on ? 1 : 0, __ATOMIC_RELAXED);
}

#define MAX_DEVICES 16

/* the calling thread's current device, as an index into the tables below */
static int device_index(void) {
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    if (dev < 0 || dev >= MAX_DEVICES) {
        fprintf(stderr, "fatal (%s:%d): device %d beyond the %d this build drives\n", __FILE__,
                __LINE__, dev, MAX_DEVICES);
        abort();
    }
    return dev;
}

/* kind 0: fp32 products (fp32 to the bit of the CPU's, or TF32 tensor
 * cores: inputs rounded to 10 bits of mantissa, fp32 sums); kind 1: bf16
 * inputs with fp32 sums, cuBLAS's default math (tensor cores; the
 * pedantic mode of kind 0 would keep bf16 products off them) */
static cublasHandle_t blas_kind(void *stream, int kind) {
    static cublasHandle_t handles[MAX_DEVICES][2];
    static int tf32_set[MAX_DEVICES];
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    int dev = device_index();
    pthread_mutex_lock(&lock);
    int tf32 = __atomic_load_n(&tf32_wanted, __ATOMIC_RELAXED);
    if (handles[dev][kind] == NULL) {
        cublasCheck(cublasCreate(&handles[dev][kind]));
        if (kind == 1) cublasCheck(cublasSetMathMode(handles[dev][1], CUBLAS_DEFAULT_MATH));
    }
    if (kind == 0 && (tf32_set[dev] == 0 || tf32_set[dev] - 1 != tf32)) {
        cublasCheck(cublasSetMathMode(handles[dev][0],
                                      tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
        tf32_set[dev] = tf32 + 1;
    }
    cublasHandle_t h = handles[dev][kind];
    pthread_mutex_unlock(&lock);
    cublasCheck(cublasSetStream(h, S(stream)));
    return h;
}
static cublasHandle_t blas(void *stream) {
    return blas_kind(stream, 0);
}

/* ---- mixed precision: the table's bf16 mirror ---------------------------------- */

/* Per device: the table (f32, n values) whose bf16 copy h the matmuls
 * read, and two scratch buffers for the other input rounded to bf16, grown
 * as needed and kept for the process (as the handles are). Per device, not
 * per stream: one thread drives a device at a time, one pass after
 * another (a replica's step thread, or the caller between steps). */
typedef struct Mirror {
    const float *f32;
    const __nv_bfloat16 *h;
    size_t n;
    __nv_bfloat16 *scratch[2];
    size_t cap[2];
} Mirror;
static Mirror mirrors[MAX_DEVICES];

extern "C" void kernels_cuda_set_mirror(const float *f32, const uint16_t *h, size_t n) {
    Mirror *mr = &mirrors[device_index()];
    mr->f32 = h ? f32 : NULL;
    mr->h = (const __nv_bfloat16 *)h;
    mr->n = h ? n : 0;
}

/* w's bf16 copy when its len values lie in the device's mirrored table */
static const __nv_bfloat16 *mirrored(const float *w, size_t len) {
    const Mirror *mr = &mirrors[device_index()];
    uintptr_t a = (uintptr_t)w, lo = (uintptr_t)mr->f32;
    if (mr->h == NULL || a < lo || a + len * sizeof(float) > lo + mr->n * sizeof(float))
        return NULL;
    return mr->h + (w - mr->f32);
}

__global__ void to_bf16_k(__nv_bfloat16 *out, const float *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16_rn(x[i]); /* to nearest, ties to even: bf16_from_float */
}

extern "C" void kernels_cuda_to_bf16(uint16_t *out, const float *x, size_t n, void *stream) {
    if (n == 0) return;
    to_bf16_k<<<blocks(n, 256), 256, 0, S(stream)>>>((__nv_bfloat16 *)out, x, n);
    launchCheck();
}

/* x (n values) rounded to bf16 in the device's scratch k */
static const __nv_bfloat16 *rounded(int k, const float *x, size_t n, void *stream) {
    Mirror *mr = &mirrors[device_index()];
    if (mr->cap[k] < n) { /* what is queued may still read the old one */
        cudaCheck(cudaStreamSynchronize(S(stream)));
        cudaCheck(cudaFree(mr->scratch[k]));
        cudaCheck(cudaMalloc((void **)&mr->scratch[k], n * sizeof(__nv_bfloat16)));
        mr->cap[k] = n;
    }
    kernels_cuda_to_bf16((uint16_t *)mr->scratch[k], x, n, stream);
    return mr->scratch[k];
}

/* C (column-major m x n, ldc) = alpha op(A) op(B) + beta C over bf16 A and
 * B, fp32 C and sums */
static void gemm_bf16(void *stream, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      float alpha, const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B, int ldb,
                      float beta, float *C, int ldc) {
    cublasCheck(cublasGemmEx(blas_kind(stream, 1), ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B,
                             CUDA_R_16BF, ldb, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
}

/* ---- encoder ------------------------------------------------------------------- */

__global__ void encoder_forward_k(float *out, const int *inp, const float *wte, const float *wpe,
                                  int B, int T, int C) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, n = (size_t)B * T * C;
    if (i >= n) return;
    size_t bt = i / C;
    int c = (int)(i % C), t = (int)(bt % T);
    out[i] = wte[(size_t)inp[bt] * C + c] + (wpe ? wpe[(size_t)t * C + c] : 0.0f);
}

__global__ void encoder_backward_k(float *dwte, float *dwpe, const float *dout, const int *inp,
                                   int B, int T, int C) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, n = (size_t)B * T * C;
    if (i >= n) return;
    size_t bt = i / C;
    int c = (int)(i % C), t = (int)(bt % T);
    atomicAdd(&dwte[(size_t)inp[bt] * C + c], dout[i]);
    if (dwpe) atomicAdd(&dwpe[(size_t)t * C + c], dout[i]);
}

extern "C" void encoder_forward_cuda(float *out, const int *inp, const float *wte, const float *wpe,
                                     int B, int T, int C, void *stream) {
    encoder_forward_k<<<blocks((size_t)B * T * C, 256), 256, 0, S(stream)>>>(out, inp, wte, wpe, B,
                                                                             T, C);
    launchCheck();
}

extern "C" void encoder_backward_cuda(float *dwte, float *dwpe, const float *dout, const int *inp,
                                      int B, int T, int C, void *stream) {
    encoder_backward_k<<<blocks((size_t)B * T * C, 256), 256, 0, S(stream)>>>(dwte, dwpe, dout, inp,
                                                                              B, T, C);
    launchCheck();
}

/* ---- layernorm: one block of 128 threads per row --------------------------------- */

__global__ void layernorm_forward_k(float *out, float *mean, float *rstd, const float *inp,
                                    const float *w, const float *b, int C) {
    __shared__ float sh[32];
    const float *x = inp + (size_t)blockIdx.x * C;
    float s = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) s += x[i];
    float m = block_sum(s, sh) / C;
    float v = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) v += (x[i] - m) * (x[i] - m);
    float rs = 1.0f / sqrtf(block_sum(v, sh) / C + 1e-5f);
    float *o = out + (size_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) o[i] = (rs * (x[i] - m)) * w[i] + b[i];
    if (threadIdx.x == 0) mean[blockIdx.x] = m, rstd[blockIdx.x] = rs;
}

__global__ void layernorm_backward_k(float *dinp, float *dw, float *db, const float *dout,
                                     const float *inp, const float *w, const float *mean,
                                     const float *rstd, int C) {
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    const float *d = dout + row * C, *x = inp + row * C;
    float m = mean[row], rs = rstd[row], a = 0, bsum = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float norm = (x[i] - m) * rs, dn = w[i] * d[i];
        a += dn;
        bsum += dn * norm;
    }
    float dn_mean = block_sum(a, sh) / C;
    float dnn_mean = block_sum(bsum, sh) / C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float norm = (x[i] - m) * rs, dn = w[i] * d[i];
        atomicAdd(&db[i], d[i]);
        atomicAdd(&dw[i], norm * d[i]);
        dinp[row * C + i] += (dn - dn_mean - norm * dnn_mean) * rs;
    }
}

extern "C" void layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *inp,
                                       const float *w, const float *bias, int N, int C,
                                       void *stream) {
    layernorm_forward_k<<<N, 128, 0, S(stream)>>>(out, mean, rstd, inp, w, bias, C);
    launchCheck();
}

extern "C" void layernorm_backward_cuda(float *dinp, float *dw, float *db, const float *dout,
                                        const float *inp, const float *w, const float *mean,
                                        const float *rstd, int N, int C, void *stream) {
    layernorm_backward_k<<<N, 128, 0, S(stream)>>>(dinp, dw, db, dout, inp, w, mean, rstd, C);
    launchCheck();
}

/* ---- matmul ----------------------------------------------------------------------- */

__global__ void add_bias_k(float *out, const float *bias, size_t N, int OC) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < N * OC) out[i] += bias[i % OC];
}

__global__ void bias_backward_k(float *dbias, const float *dout, int N, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float s = 0;
    for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o];
    dbias[o] += s;
}

extern "C" void matmul_forward_cuda(float *out, const float *inp, const float *weight,
                                    const float *bias, int N, int C, int OC, void *stream) {
    const float one = 1.0f, zero = 0.0f;
    const __nv_bfloat16 *w16 = mirrored(weight, (size_t)OC * C);
    if (w16)
        gemm_bf16(stream, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, w16, C,
                  rounded(0, inp, (size_t)N * C, stream), C, 0.0f, out, OC);
    else
        cublasCheck(cublasSgemm(blas(stream), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, weight, C,
                                inp, C, &zero, out, OC));
    if (bias) {
        add_bias_k<<<blocks((size_t)N * OC, 256), 256, 0, S(stream)>>>(out, bias, (size_t)N, OC);
        launchCheck();
    }
}

extern "C" void matmul_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *weight, int N, int C, int OC,
                                     void *stream) {
    const float one = 1.0f;
    const __nv_bfloat16 *w16 = mirrored(weight, (size_t)OC * C);
    if (w16) { /* dout and inp rounded to bf16, as the CPU's mixed precision rounds them */
        const __nv_bfloat16 *d16 = rounded(0, dout, (size_t)N * OC, stream);
        gemm_bf16(stream, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, w16, C, d16, OC, 1.0f, dinp, C);
        if (dweight)
            gemm_bf16(stream, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f,
                      rounded(1, inp, (size_t)N * C, stream), C, d16, OC, 1.0f, dweight, C);
    } else {
        cublasHandle_t h = blas(stream);
        cublasCheck(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C, dout, OC,
                                &one, dinp, C));
        if (dweight)
            cublasCheck(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC,
                                    &one, dweight, C));
    }
    if (dweight == NULL) return; /* frozen */
    if (dbias) {
        bias_backward_k<<<blocks((size_t)OC, 128), 128, 0, S(stream)>>>(dbias, dout, N, OC);
        launchCheck();
    }
}

/* ---- GELU and residual --------------------------------------------------------------- */

#define GELU_SCALE 0.7978845608028654f

__device__ float tanh_fast(float x) {
    return 1.0f - 2.0f / (expf(2.0f * x) + 1.0f);
}

__global__ void gelu_forward_k(float *out, const float *inp, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = inp[i], cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanh_fast(GELU_SCALE * (x + cube)));
}

__global__ void gelu_backward_k(float *dinp, const float *inp, const float *dout, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = inp[i], cube = 0.044715f * x * x * x, th = tanh_fast(GELU_SCALE * (x + cube));
    float grad = 0.5f * (1.0f + th) +
                 x * 0.5f * (1.0f - th * th) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += grad * dout[i];
}

__global__ void residual_forward_k(float *out, const float *a, const float *b, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < N) out[i] = a[i] + b[i];
}

__global__ void residual_backward_k(float *da, float *db, const float *dout, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < N) da[i] += dout[i], db[i] += dout[i];
}

extern "C" void gelu_forward_cuda(float *out, const float *inp, size_t N, void *stream) {
    gelu_forward_k<<<blocks(N, 256), 256, 0, S(stream)>>>(out, inp, N);
    launchCheck();
}
extern "C" void gelu_backward_cuda(float *dinp, const float *inp, const float *dout, size_t N,
                                   void *stream) {
    gelu_backward_k<<<blocks(N, 256), 256, 0, S(stream)>>>(dinp, inp, dout, N);
    launchCheck();
}
extern "C" void residual_forward_cuda(float *out, const float *a, const float *b, size_t N,
                                      void *stream) {
    residual_forward_k<<<blocks(N, 256), 256, 0, S(stream)>>>(out, a, b, N);
    launchCheck();
}
extern "C" void residual_backward_cuda(float *da, float *db, const float *dout, size_t N,
                                       void *stream) {
    residual_backward_k<<<blocks(N, 256), 256, 0, S(stream)>>>(da, db, dout, N);
    launchCheck();
}

__global__ void scale_add_k(float *y, const float *x, float a, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < N) y[i] += a * x[i];
}
static void scale_add_cuda(float *y, const float *x, float a, size_t N, void *stream) {
    scale_add_k<<<blocks(N, 256), 256, 0, S(stream)>>>(y, x, a, N);
    launchCheck();
}

__global__ void dropout_k(float *y, const float *x, uint32_t th, float scale, uint64_t seed,
                          size_t N, int accumulate) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= N) return;
    float v = dropout_keep(seed, i, th) ? x[i] * scale : 0.0f;
    y[i] = accumulate ? y[i] + v : v;
}
static void dropout_cuda(float *y, const float *x, float p, uint64_t seed, size_t N, int accumulate,
                         void *stream) {
    dropout_k<<<blocks(N, 256), 256, 0, S(stream)>>>(y, x, dropout_threshold(p), 1.0f / (1.0f - p),
                                                     seed, N, accumulate);
    launchCheck();
}

/* ---- fused classifier ----------------------------------------------------------------- */

#define ROWS   1024
#define VCHUNK 4096

/* pass 1 on a tile: running max and sum per row, the target's logit */
__global__ void online_softmax_k(const float *tile, int vc, int v0, const int *targets, float *m,
                                 float *s, float *zt) {
    __shared__ float sh[32];
    int r = blockIdx.x;
    const float *l = tile + (size_t)r * vc;
    float cm = -INFINITY;
    for (int j = threadIdx.x; j < vc; j += blockDim.x) cm = fmaxf(cm, l[j]);
    for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = cm;
    __syncthreads();
    cm = sh[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++) cm = fmaxf(cm, sh[w]);
    __syncthreads();
    float newm = fmaxf(cm, m[r]), part = 0;
    for (int j = threadIdx.x; j < vc; j += blockDim.x) part += expf(l[j] - newm);
    float sum = block_sum(part, sh);
    if (threadIdx.x == 0) {
        s[r] = s[r] * expf(m[r] - newm) + sum;
        m[r] = newm;
        int t = targets[r];
        if (t >= v0 && t < v0 + vc) zt[r] = l[t - v0];
    }
}

__global__ void dlogits_k(float *tile, int rows, int vc, int v0, const int *targets, const float *m,
                          const float *s, float dscale) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * vc) return;
    int r = (int)(i / vc), j = (int)(i % vc);
    float p = expf(tile[i] - m[r]) / s[r] * dscale;
    if (targets[r] == v0 + j) p -= dscale;
    tile[i] = p;
}

__global__ void init_rows_k(float *m, float *s, float *zt, int rows) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) m[r] = -INFINITY, s[r] = 0, zt[r] = 0;
}

__global__ void row_losses_k(float *losses, double *total, const float *m, const float *s,
                             const float *zt, int rows) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float loss = logf(s[r]) + m[r] - zt[r];
    if (losses) losses[r] = loss;
    atomicAdd(total, (double)loss);
}

extern "C" float classifier_forward_backward_cuda(float *losses, float *dh, float *dwte,
                                                  const float *h, const float *wte,
                                                  const int *targets, int N, int C, int V,
                                                  void *stream) {
    cudaStream_t st = S(stream);
    float *tile, *m, *s, *zt;
    double *total, h_total = 0;
    cudaCheck(cudaMallocAsync((void **)&tile, sizeof(float) * ROWS * VCHUNK, st));
    cudaCheck(cudaMallocAsync((void **)&m, sizeof(float) * ROWS * 3, st));
    cudaCheck(cudaMallocAsync((void **)&total, sizeof(double), st));
    cudaCheck(cudaMemsetAsync(total, 0, sizeof(double), st));
    s = m + ROWS, zt = m + 2 * ROWS;
    float dscale = 1.0f / (float)N;
    for (int r0 = 0; r0 < N; r0 += ROWS) {
        int rows = N - r0 < ROWS ? N - r0 : ROWS;
        init_rows_k<<<blocks(rows, 256), 256, 0, st>>>(m, s, zt, rows);
        for (int v0 = 0; v0 < V; v0 += VCHUNK) {
            int vc = V - v0 < VCHUNK ? V - v0 : VCHUNK;
            matmul_forward_cuda(tile, h + (size_t)r0 * C, wte + (size_t)v0 * C, NULL, rows, C, vc,
                                stream);
            online_softmax_k<<<rows, 128, 0, st>>>(tile, vc, v0, targets + r0, m, s, zt);
            launchCheck();
        }
        row_losses_k<<<blocks(rows, 256), 256, 0, st>>>(losses ? losses + r0 : NULL, total, m, s,
                                                        zt, rows);
        launchCheck();
        if (dh == NULL) continue;
        for (int v0 = 0; v0 < V; v0 += VCHUNK) {
            int vc = V - v0 < VCHUNK ? V - v0 : VCHUNK;
            matmul_forward_cuda(tile, h + (size_t)r0 * C, wte + (size_t)v0 * C, NULL, rows, C, vc,
                                stream);
            dlogits_k<<<blocks((size_t)rows * vc, 256), 256, 0, st>>>(tile, rows, vc, v0,
                                                                      targets + r0, m, s, dscale);
            launchCheck();
            /* dwte NULL: a frozen head (adapters), no offset to make of it */
            matmul_backward_cuda(dh + (size_t)r0 * C, dwte ? dwte + (size_t)v0 * C : NULL, NULL,
                                 tile, h + (size_t)r0 * C, wte + (size_t)v0 * C, rows, C, vc,
                                 stream);
        }
    }
    cudaCheck(cudaMemcpyAsync(&h_total, total, sizeof(double), cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaFreeAsync(tile, st));
    cudaCheck(cudaFreeAsync(m, st));
    cudaCheck(cudaFreeAsync(total, st));
    cudaCheck(cudaStreamSynchronize(st));
    return (float)(h_total / N);
}

/* ---- AdamW and the gradient norm ---------------------------------------------------- */

__global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                        float b2, float bc1, float bc2, float eps, float wd) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    float mhat = m[i] / bc1, vhat = v[i] / bc2;
    p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
}

extern "C" void adamw_cuda(float *params, const float *grads, float *m, float *v, size_t n,
                           float lr, float beta1, float beta2, float eps, float weight_decay,
                           int step, void *stream) {
    float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    adamw_k<<<blocks(n, 256), 256, 0, S(stream)>>>(params, grads, m, v, n, lr, beta1, beta2, bc1,
                                                   bc2, eps, weight_decay);
    launchCheck();
}

/* Each block's sum of squares into out[block], in a fixed order: the norm
 * must be the same bits on every replica and rank holding the same averaged
 * gradients (an atomicAdd across blocks adds in whatever order they finish,
 * so two replicas could clip by factors a bit apart and their parameters
 * drift, which check_same_model refuses across ranks). */
__global__ void sumsq_k(const float *g, size_t n, double *out) {
    __shared__ float sh[32];
    float s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += g[i] * g[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = (double)s;
}

__global__ void scale_k(float *g, size_t n, float scale) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) g[i] *= scale;
}

extern "C" double sumsq_cuda(const float *x, size_t n, void *stream) {
    cudaStream_t st = S(stream);
    double *d, part[1024], h = 0;
    if (n == 0) return 0;
    int grid = blocks(n, 256) < 1024 ? blocks(n, 256) : 1024;
    cudaCheck(cudaMallocAsync((void **)&d, grid * sizeof(double), st));
    sumsq_k<<<grid, 256, 0, st>>>(x, n, d);
    launchCheck();
    cudaCheck(cudaMemcpyAsync(part, d, grid * sizeof(double), cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaFreeAsync(d, st));
    cudaCheck(cudaStreamSynchronize(st));
    for (int b = 0; b < grid; b++) h += part[b]; /* block order: the same sum everywhere */
    return h;
}

extern "C" void scale_cuda(float *x, size_t n, float s, void *stream) {
    if (n == 0) return;
    scale_k<<<blocks(n, 256), 256, 0, S(stream)>>>(x, n, s);
    launchCheck();
}

extern "C" float clip_grad_norm_cuda(float *grads, size_t n, float max_norm, void *stream) {
    float norm = (float)sqrt(sumsq_cuda(grads, n, stream));
    if (max_norm > 0 && norm > max_norm) scale_cuda(grads, n, max_norm / norm, stream);
    return norm;
}

/* ---- the table ----------------------------------------------------------------------- */

static void zero_cuda(float *p, size_t n, void *stream) {
    cudaCheck(cudaMemsetAsync(p, 0, n * sizeof(float), S(stream)));
}
/* the fused classifier as a forward (lse unused: the backward recomputes
 * it) and a backward */
static float classifier_forward_cuda(float *losses, float *lse, const float *h, const float *w,
                                     const int *targets, int N, int C, int V, void *stream) {
    (void)lse;
    return classifier_forward_backward_cuda(losses, NULL, NULL, h, w, targets, N, C, V, stream);
}
static void classifier_backward_cuda(float *dh, float *dw, const float *h, const float *w,
                                     const int *targets, const float *lse, int N, int C, int V,
                                     void *stream) {
    (void)lse;
    classifier_forward_backward_cuda(NULL, dh, dw, h, w, targets, N, C, V, stream);
}

/* in the order of Ops' fields: C++ takes designated initializers only so */
extern "C" const Ops ops_cuda = {
    .name = "cuda",
    .zero = zero_cuda,
    .encoder_forward = encoder_forward_cuda,
    .encoder_backward = encoder_backward_cuda,
    .layernorm_forward = layernorm_forward_cuda,
    .layernorm_backward = layernorm_backward_cuda,
    .rmsnorm_forward = rmsnorm_forward_cuda,
    .rmsnorm_backward = rmsnorm_backward_cuda,
    .matmul_forward = matmul_forward_cuda,
    .matmul_backward = matmul_backward_cuda,
    .attention_forward = attention_forward_cuda,
    .attention_backward = attention_backward_cuda,
    .rope_forward = rope_forward_cuda,
    .rope_backward = rope_backward_cuda,
    .gelu_forward = gelu_forward_cuda,
    .gelu_backward = gelu_backward_cuda,
    .swiglu_forward = swiglu_forward_cuda,
    .swiglu_backward = swiglu_backward_cuda,
    .residual_forward = residual_forward_cuda,
    .residual_backward = residual_backward_cuda,
    .classifier_forward = classifier_forward_cuda,
    .classifier_backward = classifier_backward_cuda,
    .scale_add = scale_add_cuda,
    .dropout = dropout_cuda,
};
