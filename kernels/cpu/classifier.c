/*
 * classifier.c — the output layer fused with the loss: logits = h · wteᵀ
 * (lm_head tied to the token embedding) and cross-entropy, computed over
 * blocks of rows and chunks of the vocabulary with an online softmax (a
 * running max and sum per row), so the (B·T, V) logits are never held —
 * only a (ROWS, VCHUNK) tile per thread. The forward keeps each row's
 * log-sum-exp, so the backward recomputes each tile's logits once (three
 * lm_head products in all, not four) for O(tile) memory. Both split the
 * vocabulary's chunks over the OpenMP threads (OpenBLAS runs on one).
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/ops.h"
#include "util/util.h"

#define ROWS   256
#define VCHUNK 512

/* logits tile (rows, vc) = h[r0..r0+rows) · wte[v0..v0+vc)ᵀ */
static void tile_logits(float *tile, const float *h, const float *wte, int r0, int rows, int v0,
                        int vc, int C) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, vc, C, 1.0f, h + (size_t)r0 * C, C,
                wte + (size_t)v0 * C, C, 0.0f, tile, vc);
}

static int n_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

float classifier_forward(float *losses, float *lse, const float *h, const float *wte,
                         const int *targets, int N, int C, int V) {
    assert(N > 0 && C > 0 && V > 0);
    int P = n_threads(), chunks = (V + VCHUNK - 1) / VCHUNK;
    /* per thread: a tile, and each row's running max, sum and target logit
     * over the thread's chunks of the vocabulary */
    float *tiles = mallocCheck(sizeof(float) * ROWS * VCHUNK * (size_t)P);
    float *part = mallocCheck(sizeof(float) * 3 * ROWS * (size_t)P);
    double total = 0;
    for (int r0 = 0; r0 < N; r0 += ROWS) {
        int rows = N - r0 < ROWS ? N - r0 : ROWS;
#pragma omp parallel num_threads(P)
        {
            int t = thread_id();
            float *m = part + (size_t)3 * ROWS * t, *s = m + ROWS, *zt = s + ROWS;
            float *tile = tiles + (size_t)ROWS * VCHUNK * t;
            for (int r = 0; r < rows; r++) m[r] = -INFINITY, s[r] = 0, zt[r] = 0;
#pragma omp for schedule(static)
            for (int k = 0; k < chunks; k++) {
                int v0 = k * VCHUNK, vc = V - v0 < VCHUNK ? V - v0 : VCHUNK;
                tile_logits(tile, h, wte, r0, rows, v0, vc, C);
                for (int r = 0; r < rows; r++) {
                    const float *l = tile + (size_t)r * vc;
                    float cm = m[r];
                    for (int j = 0; j < vc; j++) cm = l[j] > cm ? l[j] : cm;
                    /* in double: summed in float, a large vocabulary's
                     * many small terms are lost (SmolLM2's 49,152 logits
                     * scored 1.6e-4 below the reference) */
                    double sum = (double)s[r] * exp((double)m[r] - cm);
                    for (int j = 0; j < vc; j++) sum += expf(l[j] - cm);
                    m[r] = cm;
                    s[r] = (float)sum;
                    int tg = targets[r0 + r];
                    if (tg >= v0 && tg < v0 + vc) zt[r] = l[tg - v0];
                }
            }
        }
        /* the threads' partial softmax sums, rescaled to one max */
        for (int r = 0; r < rows; r++) {
            float mx = -INFINITY, sum = 0, z = 0;
            for (int t = 0; t < P; t++)
                mx = part[(size_t)3 * ROWS * t + r] > mx ? part[(size_t)3 * ROWS * t + r] : mx;
            for (int t = 0; t < P; t++) {
                const float *m = part + (size_t)3 * ROWS * t;
                if (m[ROWS + r] > 0) sum += m[ROWS + r] * expf(m[r] - mx);
                z += m[2 * ROWS + r]; /* one thread saw the target; the others hold 0 */
            }
            /* the row's largest logit adds exp(0) = 1: sum >= 1 */
            float l = logf(fmaxf(sum, 1.0f)) + mx, loss = l - z;
            if (lse) lse[r0 + r] = l;
            if (losses) losses[r0 + r] = loss;
            total += loss;
        }
    }
    free(tiles), free(part);
    return (float)(total / N);
}

void classifier_backward(float *dh, float *dwte, const float *h, const float *wte,
                         const int *targets, const float *lse, int N, int C, int V) {
    assert(N > 0 && C > 0 && V > 0 && targets);
    int P = n_threads(), chunks = (V + VCHUNK - 1) / VCHUNK;
    float *tiles = mallocCheck(sizeof(float) * ROWS * VCHUNK * (size_t)P);
    /* dh sums over every chunk: one partial per thread, added up after;
     * dwte's chunks are disjoint rows, written in place */
    float *dhp = mallocCheck(sizeof(float) * ROWS * (size_t)C * P);
    float dscale = 1.0f / (float)N; /* the loss is the mean over rows */
    for (int r0 = 0; r0 < N; r0 += ROWS) {
        int rows = N - r0 < ROWS ? N - r0 : ROWS;
#pragma omp parallel num_threads(P)
        {
            int t = thread_id();
            float *tile = tiles + (size_t)ROWS * VCHUNK * t, *mine = dhp + (size_t)ROWS * C * t;
            memset(mine, 0, sizeof(float) * (size_t)rows * C);
#pragma omp for schedule(static)
            for (int k = 0; k < chunks; k++) {
                int v0 = k * VCHUNK, vc = V - v0 < VCHUNK ? V - v0 : VCHUNK;
                tile_logits(tile, h, wte, r0, rows, v0, vc, C);
                /* dlogits = (softmax − onehot) / N */
                for (int r = 0; r < rows; r++) {
                    float *l = tile + (size_t)r * vc, z = lse[r0 + r];
                    for (int j = 0; j < vc; j++) l[j] = expf(l[j] - z) * dscale;
                    int tg = targets[r0 + r];
                    if (tg >= v0 && tg < v0 + vc) l[tg - v0] -= dscale;
                }
                /* dh (rows,C) += dlogits (rows,vc) · wte (vc,C) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, C, vc, 1.0f, tile, vc,
                            wte + (size_t)v0 * C, C, 1.0f, mine, C);
                /* dwte (vc,C) += dlogitsᵀ (vc,rows) · h (rows,C); NULL: frozen */
                if (dwte != NULL)
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, vc, C, rows, 1.0f, tile,
                                vc, h + (size_t)r0 * C, C, 1.0f, dwte + (size_t)v0 * C, C);
            }
        }
        float *out = dh + (size_t)r0 * C;
        for (int t = 0; t < P; t++) {
            const float *mine = dhp + (size_t)ROWS * C * t;
            for (size_t i = 0; i < (size_t)rows * C; i++) out[i] += mine[i];
        }
    }
    free(tiles), free(dhp);
}

float classifier_forward_backward(float *losses, float *dh, float *dwte, const float *h,
                                  const float *wte, const int *targets, int N, int C, int V) {
    float *lse = mallocCheck(sizeof(float) * (size_t)N);
    float loss = classifier_forward(losses, lse, h, wte, targets, N, C, V);
    if (dh != NULL) classifier_backward(dh, dwte, h, wte, targets, lse, N, C, V);
    free(lse);
    return loss;
}

void classifier_logits(float *logits, const float *h, const float *wte, int C, int V) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, V, C, 1.0f, wte, C, h, 1, 0.0f, logits, 1);
}
