/*
 * compress.cu — CUDA kernels behind compress/'s GPU paths: int8 encode and
 * decode-accumulate, fp16/bf16 casts, a finite check, exact top-k
 * selection, the dense and sparse accumulations behind every codec's
 * decode-accumulate, and error feedback's step. Each produces the same
 * bytes or floats as the CPU code in compress/ (codec_int8.c, codec_cast.c,
 * codec_topk.c, ef.c): the same float and double operations in the same
 * order, with FMA contraction ruled out by the explicit _rn intrinsics,
 * and every reduction either in a fixed tree or in integers. Inputs x and
 * sums are device pointers; payloads come back to host memory (h_*)
 * because zstd and checksums run on the CPU.
 *
 * Errors inside a kernel launch are programming or device faults: fail fast
 * with file:line (cudaCheck). A non-finite input is a normal refusal: the
 * wrapper returns -1.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

extern "C" {
#include "kernels/cuda.h"
}
#include "cuda_common.h"

#define FIX_MID  16777216.0f /* 2^24 */
#define FIX_EDGE 1048576.0   /* 2^20 */

static cudaStream_t as_stream(void *s) {
    return (cudaStream_t)s;
}

/* ---- memory helpers --------------------------------------------------- */

extern "C" void *kernels_cuda_alloc(size_t bytes) {
    void *p = NULL;
    cudaCheck(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}
extern "C" void kernels_cuda_free(void *p) {
    cudaCheck(cudaFree(p));
}
extern "C" int kernels_cuda_mem(int device, size_t *used, size_t *total) {
    size_t free_b = 0, total_b = 0;
    int was = 0;
    if (cudaGetDevice(&was) != cudaSuccess || cudaSetDevice(device) != cudaSuccess)
        return cudaGetLastError(), -1;
    cudaError_t rc = cudaMemGetInfo(&free_b, &total_b);
    cudaSetDevice(was);
    if (rc != cudaSuccess) return cudaGetLastError(), -1;
    *used = total_b - free_b, *total = total_b;
    return 0;
}
extern "C" void kernels_cuda_to_device(void *d, const void *h, size_t bytes) {
    cudaCheck(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
}
extern "C" void kernels_cuda_to_host(void *h, const void *d, size_t bytes) {
    cudaCheck(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}
extern "C" void kernels_cuda_copy(void *d_dst, const void *d_src, size_t bytes) {
    cudaCheck(cudaMemcpy(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice));
    /* a device-to-device cudaMemcpy returns before the copy is done */
    cudaCheck(cudaDeviceSynchronize());
}

/* ---- scratch ------------------------------------------------------------ */

/* Device memory the wrappers below keep between calls, per host thread and
 * slot, grown when a call needs more: a cudaMalloc and a cudaFree cost about
 * a device synchronisation each, and a section's encode with error feedback
 * made three of each (on an H200, a GPU site's int8 end of round of 64 M
 * values took 0.67 s with them, 0.56 s without). Freed when its thread
 * ends. */
enum { SLOT_RAW, SLOT_BAD, SLOT_IDX, SLOT_VALS, SLOTS };
typedef struct Scratch {
    void *p[SLOTS];
    size_t cap[SLOTS];
    int dev[SLOTS];
} Scratch;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_release(void *v) {
    Scratch *s = (Scratch *)v;
    for (int i = 0; i < SLOTS; i++)
        if (s->p[i]) {
            cudaSetDevice(s->dev[i]);
            cudaFree(s->p[i]);
        }
    free(s);
}
static void scratch_key_make(void) {
    if (pthread_key_create(&scratch_key, scratch_release) != 0) abort();
}

/* slot's memory, at least bytes, on the calling thread's current device */
static void *scratch(int slot, size_t bytes) {
    pthread_once(&scratch_once, scratch_key_make);
    Scratch *s = (Scratch *)pthread_getspecific(scratch_key);
    if (s == NULL) {
        s = (Scratch *)calloc(1, sizeof *s);
        if (s == NULL || pthread_setspecific(scratch_key, s) != 0) {
            fprintf(stderr, "fatal (%s:%d): out of memory\n", __FILE__, __LINE__);
            abort();
        }
    }
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    if (s->p[slot] == NULL || s->cap[slot] < bytes || s->dev[slot] != dev) {
        if (s->p[slot]) {
            int cur = dev;
            cudaCheck(cudaSetDevice(s->dev[slot]));
            cudaCheck(cudaFree(s->p[slot]));
            cudaCheck(cudaSetDevice(cur));
        }
        size_t cap = bytes < 4096 ? 4096 : bytes;
        s->p[slot] = kernels_cuda_alloc(cap);
        s->cap[slot] = cap, s->dev[slot] = dev;
    }
    return s->p[slot];
}

/* a cleared flag for a kernel's refusals */
static int *bad_flag(cudaStream_t st) {
    int *bad = (int *)scratch(SLOT_BAD, sizeof(int));
    cudaCheck(cudaMemsetAsync(bad, 0, sizeof(int), st));
    return bad;
}

/* ---- finite check and casts ------------------------------------------- */

__global__ void finite_kernel(const float *x, uint64_t n, int *bad) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        if ((__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u) atomicOr(bad, 1);
}

static int grid_for(uint64_t n) {
    uint64_t g = (n + 255) / 256;
    return (int)(g > 65535 ? 65535 : (g ? g : 1));
}

__global__ void fp32_accumulate_kernel(const float *x, uint64_t n, float w, float *sum);

extern "C" int kernels_cuda_copy_checked(float *x, uint64_t n, float *h_out, int take_off,
                                         void *stream) {
    cudaStream_t st = as_stream(stream);
    int *bad = bad_flag(st), h_bad = 0;
    finite_kernel<<<grid_for(n), 256, 0, st>>>(x, n, bad);
    launchCheck();
    cudaCheck(cudaMemcpyAsync(&h_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaMemcpyAsync(h_out, x, n * 4, cudaMemcpyDeviceToHost, st));
    if (take_off) { /* e - e, as the host's e[i] - decoded[i] */
        fp32_accumulate_kernel<<<grid_for(n), 256, 0, st>>>(x, n, -1.0f, x);
        launchCheck();
    }
    cudaCheck(cudaStreamSynchronize(st));
    return h_bad ? -1 : 0;
}

/* codec_f32_to_f16 and codec_f32_to_bf16 of codec_cast.c, bit for bit */
__device__ uint16_t f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ uint16_t f32_to_f16(float f) {
    uint32_t u = __float_as_uint(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu);
    if (a >= 0x477ff000u) return sign | 0x7c00u;
    if (a < 0x38800000u) {
        if (a < 0x33000000u) return sign;
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = ((a - 0x38000000u) >> 13);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return sign | (uint16_t)r;
}

__global__ void cast_kernel(const float *x, uint64_t n, int bf16, uint16_t *out, int *bad) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        float v = x[i];
        uint16_t h = bf16 ? f32_to_bf16(v) : f32_to_f16(v);
        /* non-finite input, or beyond the format's range: refused, as on the CPU */
        if ((h & 0x7fffu) >= (bf16 ? 0x7f80u : 0x7c00u)) atomicOr(bad, 1);
        out[i] = h;
    }
}

__global__ void half_accumulate_kernel(const uint16_t *h, uint64_t n, int bf16, float w,
                                       float *sum);

/* the payload is little-endian, as the device: its bytes come back as they are */
extern "C" int kernels_cuda_cast_half(float *x, uint64_t n, int bf16, uint8_t *h_out, int take_off,
                                      void *stream) {
    cudaStream_t st = as_stream(stream);
    uint16_t *d = (uint16_t *)scratch(SLOT_RAW, n * 2);
    int *bad = bad_flag(st), h_bad = 0;
    cast_kernel<<<grid_for(n), 256, 0, st>>>(x, n, bf16, d, bad);
    launchCheck();
    cudaCheck(cudaMemcpyAsync(h_out, d, n * 2, cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaMemcpyAsync(&h_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, st));
    if (take_off) {
        half_accumulate_kernel<<<grid_for(n), 256, 0, st>>>(d, n, bf16, -1.0f, x);
        launchCheck();
    }
    cudaCheck(cudaStreamSynchronize(st));
    return h_bad ? -1 : 0;
}

/* ---- int8 --------------------------------------------------------------- */

__device__ void store_f32(uint8_t *p, float v) {
    uint32_t u = __float_as_uint(v);
    p[0] = (uint8_t)u, p[1] = (uint8_t)(u >> 8), p[2] = (uint8_t)(u >> 16),
    p[3] = (uint8_t)(u >> 24);
}

__device__ float load_f32(const uint8_t *p) {
    return __uint_as_float((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
}

/* One CUDA block of 256 threads per int8 block; steps and rounding as in
 * codec_int8.c: lane sums of squares in double, the same tree, codes from
 * f = x * (1/scale), integer bin sums. */
__global__ void int8_encode_kernel(const float *x, uint32_t count, uint32_t block, uint8_t *raw,
                                   int *bad) {
    __shared__ double lane[256];
    __shared__ unsigned long long mid_sum[256], edge_sum[2];
    __shared__ unsigned int mid_count[256], edge_count[2];
    __shared__ float scale_s;
    uint32_t b = blockIdx.x, j = threadIdx.x, b0 = b * block;
    uint32_t n = count - b0 < block ? count - b0 : block;
    const float *xb = x + b0;
    uint8_t *table = raw + (size_t)b * (1024 + block), *codes = table + 1024;

    double acc = 0;
    for (uint32_t i = j; i < n; i += 256) {
        double v = (double)xb[i];
        acc = __dadd_rn(acc, __dmul_rn(v, v));
    }
    lane[j] = acc;
    mid_sum[j] = 0;
    mid_count[j] = 0;
    if (j < 2) edge_sum[j] = 0, edge_count[j] = 0;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if (j < (uint32_t)s) lane[j] = __dadd_rn(lane[j], lane[j + s]);
        __syncthreads();
    }
    if (j == 0) {
        double sumsq = lane[0];
        if (!isfinite(sumsq)) atomicOr(bad, 1);
        double sigma = __dsqrt_rn(__ddiv_rn(sumsq, (double)n));
        float scale = __double2float_rn(__ddiv_rn(__dmul_rn(6.0, sigma), 256.0));
        /* as the CPU: below the smallest normal float its reciprocal could overflow */
        scale_s = scale >= 1.17549435e-38f && isfinite(scale) ? scale : 1.0f;
    }
    __syncthreads();
    float scale = scale_s, inv = __fdiv_rn(1.0f, scale);
    const float magic = 12582912.0f;
    for (uint32_t i = j; i < n; i += 256) {
        float f = __fmul_rn(xb[i], inv);
        float fc = f < -129.0f ? -129.0f : f;
        fc = fc > 129.0f ? 129.0f : fc;
        float r = __fsub_rn(__fadd_rn(fc, magic), magic);
        float rq = r < -128.0f ? -128.0f : r;
        rq = rq > 127.0f ? 127.0f : rq;
        int q = (int)__fadd_rn(rq, 128.0f);
        codes[i] = (uint8_t)q;
        if (r != rq) {
            int hi = r > 0;
            atomicAdd(&edge_sum[hi],
                      (unsigned long long)__double2ll_rn(__dmul_rn((double)f, FIX_EDGE)));
            atomicAdd(&edge_count[hi], 1u);
        } else {
            int off = __float2int_rn(__fmul_rn(__fsub_rn(f, rq), FIX_MID));
            atomicAdd(&mid_sum[q], (unsigned long long)(long long)off);
            atomicAdd(&mid_count[q], 1u);
        }
    }
    __syncthreads();
    int q = (int)j, edge = q == 0 ? 0 : q == 255 ? 1 : -1;
    double centre = (double)(q - 128);
    double total = __dadd_rn(__dmul_rn((double)mid_count[q], centre),
                             __ddiv_rn((double)(long long)mid_sum[q], (double)FIX_MID));
    uint32_t c = mid_count[q];
    if (edge >= 0) {
        total = __dadd_rn(total, __ddiv_rn((double)(long long)edge_sum[edge], FIX_EDGE));
        c += edge_count[edge];
    }
    double mean = c ? __ddiv_rn(total, (double)c) : centre;
    store_f32(table + 4 * q, __double2float_rn(__dmul_rn(mean, (double)scale)));
}

__global__ void int8_accumulate_kernel(const uint8_t *raw, uint32_t count, uint32_t block, float w,
                                       float *sum);

extern "C" int kernels_cuda_int8_encode(float *x, uint32_t count, uint32_t block, uint8_t *h_raw,
                                        int take_off, void *stream) {
    cudaStream_t st = as_stream(stream);
    uint32_t blocks = (count + block - 1) / block;
    size_t raw_len = (size_t)blocks * 1024 + count;
    uint8_t *d = (uint8_t *)scratch(SLOT_RAW, raw_len);
    int *bad = bad_flag(st), h_bad = 0;
    int8_encode_kernel<<<blocks, 256, 0, st>>>(x, count, block, d, bad);
    launchCheck();
    cudaCheck(cudaMemcpyAsync(h_raw, d, raw_len, cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaMemcpyAsync(&h_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, st));
    if (take_off) { /* from the payload still on the device */
        int8_accumulate_kernel<<<blocks, 256, 0, st>>>(d, count, block, -1.0f, x);
        launchCheck();
    }
    cudaCheck(cudaStreamSynchronize(st));
    return h_bad ? -1 : 0;
}

/* sum[i] = sum[i] + w * table[code], as int8_apply does */
__global__ void int8_accumulate_kernel(const uint8_t *raw, uint32_t count, uint32_t block, float w,
                                       float *sum) {
    __shared__ float table[256];
    uint32_t b = blockIdx.x, b0 = b * block;
    uint32_t n = count - b0 < block ? count - b0 : block;
    const uint8_t *t = raw + (size_t)b * (1024 + block), *codes = t + 1024;
    table[threadIdx.x] = load_f32(t + 4 * threadIdx.x);
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n; i += 256)
        sum[b0 + i] = __fadd_rn(sum[b0 + i], __fmul_rn(w, table[codes[i]]));
}

extern "C" void kernels_cuda_int8_accumulate(const uint8_t *h_raw, uint32_t count, uint32_t block,
                                             float w, float *sum, void *stream) {
    cudaStream_t st = as_stream(stream);
    uint32_t blocks = (count + block - 1) / block;
    size_t raw_len = (size_t)blocks * 1024 + count;
    uint8_t *d = (uint8_t *)scratch(SLOT_RAW, raw_len);
    cudaCheck(cudaMemcpyAsync(d, h_raw, raw_len, cudaMemcpyHostToDevice, st));
    int8_accumulate_kernel<<<blocks, 256, 0, st>>>(d, count, block, w, sum);
    launchCheck();
    cudaCheck(cudaStreamSynchronize(st));
}

/* ---- dense and sparse accumulation, error feedback ------------------------ */

/* codec_f16_to_f32 and codec_bf16_to_f32 of codec_cast.c: exact widenings */
__device__ float half_to_f32(uint16_t h, int bf16) {
    if (bf16) return __uint_as_float((uint32_t)h << 16);
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        if (m == 0) {
            u = sign;
        } else {
            e = 113;
            while (!(m & 0x400u)) m <<= 1, e--;
            u = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    return __uint_as_float(u);
}

/* sum[i] = sum[i] + w * x[i], as the CPU's axpy (no FMA) */
__global__ void fp32_accumulate_kernel(const float *x, uint64_t n, float w, float *sum) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        sum[i] = __fadd_rn(sum[i], __fmul_rn(w, x[i]));
}

__global__ void half_accumulate_kernel(const uint16_t *h, uint64_t n, int bf16, float w,
                                       float *sum) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        sum[i] = __fadd_rn(sum[i], __fmul_rn(w, half_to_f32(h[i], bf16)));
}

__global__ void scatter_accumulate_kernel(const uint32_t *idx, const float *vals, uint64_t k,
                                          float w, float *sum) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < k;
         i += (uint64_t)gridDim.x * blockDim.x)
        sum[idx[i]] = __fadd_rn(sum[idx[i]], __fmul_rn(w, vals[i]));
}

/* e = beta * e + (base - local), each operation rounded as on the host */
__global__ void ef_step_kernel(float *e, const float *base, const float *local, float beta,
                               uint64_t n) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        e[i] = __fadd_rn(__fmul_rn(beta, e[i]), __fsub_rn(base[i], local[i]));
}

extern "C" void kernels_cuda_fp32_accumulate(const uint8_t *h_raw, uint64_t n, float w, float *sum,
                                             void *stream) {
    cudaStream_t st = as_stream(stream);
    float *d = (float *)scratch(SLOT_RAW, n * 4);
    cudaCheck(cudaMemcpyAsync(d, h_raw, n * 4, cudaMemcpyHostToDevice, st));
    fp32_accumulate_kernel<<<grid_for(n), 256, 0, st>>>(d, n, w, sum);
    launchCheck();
    cudaCheck(cudaStreamSynchronize(st));
}

extern "C" void kernels_cuda_half_accumulate(const uint8_t *h_raw, uint64_t n, int bf16, float w,
                                             float *sum, void *stream) {
    cudaStream_t st = as_stream(stream);
    uint16_t *d = (uint16_t *)scratch(SLOT_RAW, n * 2);
    /* the payload is little-endian, as the device */
    cudaCheck(cudaMemcpyAsync(d, h_raw, n * 2, cudaMemcpyHostToDevice, st));
    half_accumulate_kernel<<<grid_for(n), 256, 0, st>>>(d, n, bf16, w, sum);
    launchCheck();
    cudaCheck(cudaStreamSynchronize(st));
}

extern "C" void kernels_cuda_scatter_accumulate(const uint32_t *h_idx, const float *h_vals,
                                                uint64_t k, float w, float *sum, void *stream) {
    if (k == 0) return;
    cudaStream_t st = as_stream(stream);
    uint32_t *d_idx = (uint32_t *)scratch(SLOT_IDX, k * 4);
    float *d_vals = (float *)scratch(SLOT_VALS, k * 4);
    cudaCheck(cudaMemcpyAsync(d_idx, h_idx, k * 4, cudaMemcpyHostToDevice, st));
    cudaCheck(cudaMemcpyAsync(d_vals, h_vals, k * 4, cudaMemcpyHostToDevice, st));
    scatter_accumulate_kernel<<<grid_for(k), 256, 0, st>>>(d_idx, d_vals, k, w, sum);
    launchCheck();
    cudaCheck(cudaStreamSynchronize(st));
}

extern "C" void kernels_cuda_ef_step(float *e, const float *base, const float *local, float beta,
                                     uint64_t n, void *stream) {
    cudaStream_t st = as_stream(stream);
    ef_step_kernel<<<grid_for(n), 256, 0, st>>>(e, base, local, beta, n);
    launchCheck();
    cudaCheck(cudaStreamSynchronize(st));
}

/* ---- top-k ------------------------------------------------------------- */

__device__ uint32_t topk_k_dev(uint32_t ppm, uint32_t len) {
    uint64_t k = ((uint64_t)ppm * len + 999999u) / 1000000u;
    if (k < 1) k = 1;
    return (uint32_t)(k > len ? len : k);
}

/* The selection order of codec_topk.c as one 64-bit key, larger first:
 * magnitude bits, then the complement of the index (lower index first). */
__device__ uint64_t sel_key(const float *x, uint32_t i) {
    return (uint64_t)(__float_as_uint(x[i]) & 0x7fffffffu) << 32 | (0xffffffffu - i);
}

/* One CUDA block per chunk: radix-select the k-th largest key a byte at a
 * time, then write the indices at or above it in ascending order. */
__global__ void topk_select_kernel(const float *x, uint32_t count, uint32_t chunk, uint32_t ppm,
                                   uint16_t *sel, float *vals) {
    __shared__ unsigned int hist[256];
    __shared__ unsigned long long prefix_s;
    __shared__ unsigned int remaining_s;
    __shared__ unsigned int counts[256];
    uint32_t c = blockIdx.x, c0 = c * chunk, j = threadIdx.x;
    uint32_t len = count - c0 < chunk ? count - c0 : chunk, k = topk_k_dev(ppm, len);
    const float *xc = x + c0;
    uint64_t out0 = (uint64_t)c * topk_k_dev(ppm, chunk); /* chunks before are full */
    if (j == 0) prefix_s = 0, remaining_s = k;
    __syncthreads();
    for (int byte = 7; byte >= 0; byte--) {
        hist[j] = 0;
        __syncthreads();
        uint64_t prefix = prefix_s, high_mask = byte == 7 ? 0 : ~0ull << (8 * (byte + 1));
        for (uint32_t i = j; i < len; i += 256) {
            uint64_t key = sel_key(xc, i);
            if ((key & high_mask) == (prefix & high_mask))
                atomicAdd(&hist[(key >> (8 * byte)) & 255], 1u);
        }
        __syncthreads();
        if (j == 0) {
            unsigned int rem = remaining_s;
            int d = 255;
            for (; d > 0 && hist[d] < rem; d--) rem -= hist[d];
            remaining_s = rem;
            prefix_s = prefix | (uint64_t)d << (8 * byte);
        }
        __syncthreads();
    }
    uint64_t kth = prefix_s; /* keys are distinct: exactly k keys are >= kth */
    uint32_t per = (len + 255) / 256, lo = j * per, hi = lo + per < len ? lo + per : len;
    unsigned int mine = 0;
    for (uint32_t i = lo; i < hi; i++) mine += sel_key(xc, i) >= kth;
    counts[j] = mine;
    __syncthreads();
    if (j == 0) {
        unsigned int run = 0;
        for (int t = 0; t < 256; t++) {
            unsigned int v = counts[t];
            counts[t] = run;
            run += v;
        }
    }
    __syncthreads();
    uint64_t at = out0 + counts[j];
    for (uint32_t i = lo; i < hi; i++)
        if (sel_key(xc, i) >= kth) {
            sel[at] = (uint16_t)i;
            vals[at] = xc[i];
            at++;
        }
}

extern "C" int kernels_cuda_topk_select(const float *x, uint32_t count, uint32_t chunk,
                                        uint32_t ppm, uint64_t total_k, uint16_t *h_sel,
                                        float *h_vals, void *stream) {
    cudaStream_t st = as_stream(stream);
    int *bad = bad_flag(st), h_bad = 0;
    finite_kernel<<<grid_for(count), 256, 0, st>>>(x, count, bad);
    launchCheck();
    uint16_t *d_sel = (uint16_t *)scratch(SLOT_IDX, total_k * 2);
    float *d_vals = (float *)scratch(SLOT_VALS, total_k * 4);
    uint32_t chunks = (count + chunk - 1) / chunk;
    topk_select_kernel<<<chunks, 256, 0, st>>>(x, count, chunk, ppm, d_sel, d_vals);
    launchCheck();
    cudaCheck(cudaMemcpyAsync(h_sel, d_sel, total_k * 2, cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaMemcpyAsync(h_vals, d_vals, total_k * 4, cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaMemcpyAsync(&h_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaStreamSynchronize(st));
    return h_bad ? -1 : 0;
}
