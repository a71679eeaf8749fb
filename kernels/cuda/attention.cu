/*
 * attention.cu — causal attention on the GPU without the (B, NH, T, T)
 * tensor: FlashAttention-2's scheme in fp32 on the CUDA cores, the CUDA
 * twin of kernels/cpu/ops.c's attention_forward and attention_backward:
 * both keep each query row's log-sum-exp for the backward, not the
 * probabilities.
 *
 * The forward walks the keys by tiles in shared memory with an online
 * softmax and keeps each query row's log-sum-exp (lse, B·NH·T floats). The
 * backward makes the probabilities again from it: one kernel by query rows
 * makes dq and each row's Σ dout·out (the scratch), another by key
 * rows makes dk and dv, summing over the query heads that share a
 * key/value head (grouped-query attention). Every gradient value has one
 * writer and its terms add in a fixed order: no atomics, the same bits
 * twice.
 *
 * A row's HD values are spread over R = HDM/32 adjacent threads of a warp
 * (value d on thread d mod R, 32 values a thread), so a dot product is
 * each thread's partial sum added across its group by warp shuffles; HDM
 * is HD rounded up to 32, 64, 128 or 256 (values past HD are zeros;
 * ATTN_MAX_HD, which the GPU trainer checks).
 * Tiles are FA_TILE floats, rows of HDM: 128 rows at HD 32, 16 at 256.
 *
 * cuDNN's fused attention takes fp16 or bf16 operands only; the GPU's
 * activations are fp32, so these kernels are the fp32 path.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "cuda_common.h"

#define FA_TILE 4096 /* floats of a tile in shared memory */

/* query rows (forward, dq) or key rows (dk, dv) a block: 64, and 32 at
 * HDM 256, whose dk, dv kernel holds 128 floats a thread in registers
 * (256 threads a block leave it 255 registers, 512 would leave 128) */
template <int HDM> struct Fa {
    static const int ROWS = HDM == 256 ? 32 : 64;
    static const int THREADS = ROWS * (HDM / 32);
};

/* x summed over the R adjacent lanes of its group (R divides 32); every
 * lane of the warp takes part */
template <int R> __device__ __forceinline__ float group_sum(float x) {
#pragma unroll
    for (int o = R / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* a row's HD values (d = i·R + lane for i < 32) into v, times scale, zeros
 * past HD or for a row past T */
template <int R>
__device__ __forceinline__ void load_row(float *v, const float *row, int hd, int lane, int live,
                                         float scale) {
#pragma unroll
    for (int i = 0; i < 32; i++) {
        int d = i * R + lane;
        v[i] = live && d < hd ? row[d] * scale : 0.0f;
    }
}

/* rows [r0, r0 + FA_TILE/HDM) of a (T, ld) matrix into a tile, HDM floats
 * a row, times scale, zeros past HD and past T */
template <int HDM>
__device__ __forceinline__ void load_tile(float *tile, const float *m, size_t ld, int r0, int T,
                                          int hd, float scale) {
    for (int i = threadIdx.x; i < FA_TILE; i += blockDim.x) {
        int r = r0 + i / HDM, d = i % HDM;
        tile[i] = r < T && d < hd ? m[(size_t)r * ld + d] * scale : 0.0f;
    }
}

/* grid (T / ROWS rounded up, B·NH); one query row per group of R threads */
template <int HDM>
__global__ void __launch_bounds__(Fa<HDM>::THREADS)
    flash_forward_k(float *out, float *lse, const float *q, const float *k, const float *v,
                    AttnShape s, float scale) {
    const int R = HDM / 32, BC = FA_TILE / HDM;
    __shared__ float ks[FA_TILE], vs[FA_TILE];
    int b = blockIdx.y / s.NH, h = blockIdx.y % s.NH, kh = h / (s.NH / s.NKV);
    int T = s.T, hd = s.HD, lane = threadIdx.x % R;
    int t = blockIdx.x * Fa<HDM>::ROWS + threadIdx.x / R, live = t < T;
    float qv[32], o[32], m = -INFINITY, l = 0.0f;
    /* q scaled once: the scores are (q·scale)·k, as the backward makes them */
    load_row<R>(qv, q + ((size_t)b * T + (live ? t : 0)) * s.ldq + (size_t)h * hd, hd, lane, live,
                scale);
#pragma unroll
    for (int i = 0; i < 32; i++) o[i] = 0.0f;
    const float *kb = k + (size_t)b * T * s.ldkv + (size_t)kh * hd;
    const float *vb = v + (size_t)b * T * s.ldkv + (size_t)kh * hd;
    int last = min(T, (int)(blockIdx.x + 1) * Fa<HDM>::ROWS); /* the block's rows see keys < last */
    for (int j0 = 0; j0 < last; j0 += BC) {
        __syncthreads(); /* the tile before read by all */
        load_tile<HDM>(ks, kb, s.ldkv, j0, T, hd, 1.0f);
        load_tile<HDM>(vs, vb, s.ldkv, j0, T, hd, 1.0f);
        __syncthreads();
        int n = min(BC, last - j0);
        for (int j = 0; j < n; j++) {
            const float *kr = ks + j * HDM, *vr = vs + j * HDM;
            float sc = 0.0f;
#pragma unroll
            for (int i = 0; i < 32; i++) sc += qv[i] * kr[i * R + lane];
            sc = group_sum<R>(sc);
            if (!live || j0 + j > t) continue; /* masked: after the shuffle, which all take */
            float mn = fmaxf(m, sc), corr = expf(m - mn), p = expf(sc - mn);
            l = l * corr + p;
#pragma unroll
            for (int i = 0; i < 32; i++) o[i] = o[i] * corr + p * vr[i * R + lane];
            m = mn;
        }
    }
    if (!live) return;
    float inv = 1.0f / l, *orow = out + ((size_t)b * T + t) * (size_t)(s.NH * hd) + (size_t)h * hd;
#pragma unroll
    for (int i = 0; i < 32; i++)
        if (i * R + lane < hd) orow[i * R + lane] = o[i] * inv;
    if (lane == 0) lse[((size_t)b * s.NH + h) * T + t] = m + logf(l);
}

/* dq by query rows, and each row's Σ dout·out into dsum (for the dk, dv
 * kernel after it): grid and groups as the forward's */
template <int HDM>
__global__ void __launch_bounds__(Fa<HDM>::THREADS)
    flash_backward_dq_k(float *dq, float *dsum, const float *dout, const float *out, const float *q,
                        const float *k, const float *v, const float *lse, AttnShape s,
                        float scale) {
    const int R = HDM / 32, BC = FA_TILE / HDM;
    __shared__ float ks[FA_TILE], vs[FA_TILE];
    int b = blockIdx.y / s.NH, h = blockIdx.y % s.NH, kh = h / (s.NH / s.NKV);
    int T = s.T, hd = s.HD, lane = threadIdx.x % R, C = s.NH * hd;
    int t = blockIdx.x * Fa<HDM>::ROWS + threadIdx.x / R, live = t < T, tt = live ? t : 0;
    size_t row = (size_t)b * s.NH * T + (size_t)h * T + tt; /* (b, h, t) in lse and dsum */
    float qv[32], dov[32], acc[32];
    load_row<R>(qv, q + ((size_t)b * T + tt) * s.ldq + (size_t)h * hd, hd, lane, live, scale);
    load_row<R>(dov, dout + ((size_t)b * T + tt) * C + (size_t)h * hd, hd, lane, live, 1.0f);
    load_row<R>(acc, out + ((size_t)b * T + tt) * C + (size_t)h * hd, hd, lane, live, 1.0f);
    float dsr = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) dsr += dov[i] * acc[i], acc[i] = 0.0f;
    dsr = group_sum<R>(dsr);
    float ls = live ? lse[row] : 0.0f;
    if (live && lane == 0) dsum[row] = dsr;
    const float *kb = k + (size_t)b * T * s.ldkv + (size_t)kh * hd;
    const float *vb = v + (size_t)b * T * s.ldkv + (size_t)kh * hd;
    int last = min(T, (int)(blockIdx.x + 1) * Fa<HDM>::ROWS);
    for (int j0 = 0; j0 < last; j0 += BC) {
        __syncthreads();
        load_tile<HDM>(ks, kb, s.ldkv, j0, T, hd, 1.0f);
        load_tile<HDM>(vs, vb, s.ldkv, j0, T, hd, 1.0f);
        __syncthreads();
        int n = min(BC, last - j0);
        for (int j = 0; j < n; j++) {
            const float *kr = ks + j * HDM, *vr = vs + j * HDM;
            float sc = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < 32; i++)
                sc += qv[i] * kr[i * R + lane], dp += dov[i] * vr[i * R + lane];
            sc = group_sum<R>(sc), dp = group_sum<R>(dp);
            if (!live || j0 + j > t) continue;
            float ds = expf(sc - ls) * (dp - dsr);
#pragma unroll
            for (int i = 0; i < 32; i++) acc[i] += ds * kr[i * R + lane];
        }
    }
    if (!live) return;
    float *dqr = dq + ((size_t)b * T + t) * s.ldq + (size_t)h * hd;
#pragma unroll
    for (int i = 0; i < 32; i++)
        if (i * R + lane < hd) dqr[i * R + lane] += acc[i] * scale;
}

/* dk and dv by key rows: grid (T / ROWS rounded up, B·NKV), one key row a group,
 * over the query heads of its key/value head in order, then the query rows
 * from the block's first key on */
template <int HDM>
__global__ void __launch_bounds__(Fa<HDM>::THREADS)
    flash_backward_dkv_k(float *dk, float *dv, const float *dout, const float *q, const float *k,
                         const float *v, const float *lse, const float *dsum, AttnShape s,
                         float scale) {
    const int R = HDM / 32, BC = FA_TILE / HDM;
    __shared__ float qs[FA_TILE], dos[FA_TILE], ls[BC], dss[BC];
    int G = s.NH / s.NKV, b = blockIdx.y / s.NKV, kh = blockIdx.y % s.NKV;
    int T = s.T, hd = s.HD, lane = threadIdx.x % R, C = s.NH * hd;
    int j = blockIdx.x * Fa<HDM>::ROWS + threadIdx.x / R, live = j < T, jj = live ? j : 0;
    float kv[32], vv[32], dka[32], dva[32];
    load_row<R>(kv, k + ((size_t)b * T + jj) * s.ldkv + (size_t)kh * hd, hd, lane, live, 1.0f);
    load_row<R>(vv, v + ((size_t)b * T + jj) * s.ldkv + (size_t)kh * hd, hd, lane, live, 1.0f);
#pragma unroll
    for (int i = 0; i < 32; i++) dka[i] = 0.0f, dva[i] = 0.0f;
    int first = blockIdx.x * Fa<HDM>::ROWS; /* queries before it see none of the block's keys */
    for (int g = 0; g < G; g++) {
        int h = kh * G + g;
        const float *qb = q + (size_t)b * T * s.ldq + (size_t)h * hd;
        const float *db = dout + (size_t)b * T * C + (size_t)h * hd;
        const float *lb = lse + ((size_t)b * s.NH + h) * T, *sb = dsum + ((size_t)b * s.NH + h) * T;
        for (int i0 = first; i0 < T; i0 += BC) {
            __syncthreads();
            load_tile<HDM>(qs, qb, s.ldq, i0, T, hd, scale); /* as the forward scaled them */
            load_tile<HDM>(dos, db, C, i0, T, hd, 1.0f);
            for (int i = threadIdx.x; i < BC; i += blockDim.x) {
                ls[i] = i0 + i < T ? lb[i0 + i] : 0.0f;
                dss[i] = i0 + i < T ? sb[i0 + i] : 0.0f;
            }
            __syncthreads();
            int n = min(BC, T - i0);
            for (int i = 0; i < n; i++) {
                const float *qr = qs + i * HDM, *dr = dos + i * HDM;
                float sc = 0.0f, dp = 0.0f;
#pragma unroll
                for (int e = 0; e < 32; e++)
                    sc += qr[e * R + lane] * kv[e], dp += dr[e * R + lane] * vv[e];
                sc = group_sum<R>(sc), dp = group_sum<R>(dp);
                if (!live || i0 + i < j) continue;
                float p = expf(sc - ls[i]), ds = p * (dp - dss[i]);
#pragma unroll
                for (int e = 0; e < 32; e++)
                    dva[e] += p * dr[e * R + lane], dka[e] += ds * qr[e * R + lane];
            }
        }
    }
    if (!live) return;
    float *dkr = dk + ((size_t)b * T + j) * s.ldkv + (size_t)kh * hd;
    float *dvr = dv + ((size_t)b * T + j) * s.ldkv + (size_t)kh * hd;
#pragma unroll
    for (int e = 0; e < 32; e++)
        if (e * R + lane < hd) dkr[e * R + lane] += dka[e], dvr[e * R + lane] += dva[e];
}

/* HD's rounding up: the kernels' HDM */
static int hdm_of(int hd) {
    if (hd <= 0 || hd > ATTN_MAX_HD) {
        fprintf(stderr, "fatal: attention heads of %d values on the GPU (1 to %d)\n", hd,
                ATTN_MAX_HD);
        abort();
    }
    return hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : 256;
}

template <int HDM>
static void forward(float *out, float *lse, const float *q, const float *k, const float *v,
                    const AttnShape *s, cudaStream_t st) {
    dim3 grid((s->T + Fa<HDM>::ROWS - 1) / Fa<HDM>::ROWS, s->B * s->NH);
    float scale = 1.0f / sqrtf((float)s->HD);
    flash_forward_k<HDM><<<grid, Fa<HDM>::THREADS, 0, st>>>(out, lse, q, k, v, *s, scale);
    launchCheck();
}

template <int HDM>
static void backward(float *dq, float *dk, float *dv, float *dsum, const float *dout,
                     const float *q, const float *k, const float *v, const float *out,
                     const float *lse, const AttnShape *s, cudaStream_t st) {
    float scale = 1.0f / sqrtf((float)s->HD);
    int tiles = (s->T + Fa<HDM>::ROWS - 1) / Fa<HDM>::ROWS, threads = Fa<HDM>::THREADS;
    flash_backward_dq_k<HDM><<<dim3(tiles, s->B * s->NH), threads, 0, st>>>(dq, dsum, dout, out, q,
                                                                            k, v, lse, *s, scale);
    launchCheck();
    flash_backward_dkv_k<HDM><<<dim3(tiles, s->B * s->NKV), threads, 0, st>>>(dk, dv, dout, q, k, v,
                                                                              lse, dsum, *s, scale);
    launchCheck();
}

extern "C" void attention_forward_cuda(float *out, float *lse, const float *q, const float *k,
                                       const float *v, const AttnShape *s, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    switch (hdm_of(s->HD)) {
    case 32:
        forward<32>(out, lse, q, k, v, s, st);
        break;
    case 64:
        forward<64>(out, lse, q, k, v, s, st);
        break;
    case 128:
        forward<128>(out, lse, q, k, v, s, st);
        break;
    default:
        forward<256>(out, lse, q, k, v, s, st);
        break;
    }
}

/* scratch: B·NH·T floats, each query row's Σ dout·out */
extern "C" void attention_backward_cuda(float *dq, float *dk, float *dv, float *scratch,
                                        const float *dout, const float *q, const float *k,
                                        const float *v, const float *out, const float *lse,
                                        const AttnShape *s, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    switch (hdm_of(s->HD)) {
    case 32:
        backward<32>(dq, dk, dv, scratch, dout, q, k, v, out, lse, s, st);
        break;
    case 64:
        backward<64>(dq, dk, dv, scratch, dout, q, k, v, out, lse, s, st);
        break;
    case 128:
        backward<128>(dq, dk, dv, scratch, dout, q, k, v, out, lse, s, st);
        break;
    default:
        backward<256>(dq, dk, dv, scratch, dout, q, k, v, out, lse, s, st);
        break;
    }
}
