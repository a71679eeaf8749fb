/*
 * classifier.c — the output layer fused with the loss: logits = h · wteᵀ
 * (lm_head tied to the token embedding) and cross-entropy, computed over
 * blocks of rows and chunks of the vocabulary with an online softmax (a
 * running max and sum per row), so the (B·T, V) logits are never held —
 * only a (ROWS, VCHUNK) tile. The backward pass recomputes each tile's
 * logits instead of storing them: twice the lm_head flops for O(tile) memory.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

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

float classifier_forward_backward(float *losses, float *dh, float *dwte, const float *h,
                                  const float *wte, const int *targets, int N, int C, int V) {
    float *tile = mallocCheck(sizeof(float) * ROWS * VCHUNK);
    float *m = mallocCheck(sizeof(float) * ROWS), *s = mallocCheck(sizeof(float) * ROWS);
    float *zt = mallocCheck(sizeof(float) * ROWS);
    double total = 0;
    float dscale = 1.0f / (float)N; /* the loss is the mean over rows */
    for (int r0 = 0; r0 < N; r0 += ROWS) {
        int rows = N - r0 < ROWS ? N - r0 : ROWS;
        for (int r = 0; r < rows; r++) m[r] = -INFINITY, s[r] = 0, zt[r] = 0;
        /* pass 1: running max and sum, and each row's target logit */
        for (int v0 = 0; v0 < V; v0 += VCHUNK) {
            int vc = V - v0 < VCHUNK ? V - v0 : VCHUNK;
            tile_logits(tile, h, wte, r0, rows, v0, vc, C);
            for (int r = 0; r < rows; r++) {
                const float *l = tile + (size_t)r * vc;
                float cm = m[r];
                for (int j = 0; j < vc; j++) cm = l[j] > cm ? l[j] : cm;
                float sum = s[r] * expf(m[r] - cm);
                for (int j = 0; j < vc; j++) sum += expf(l[j] - cm);
                m[r] = cm;
                s[r] = sum;
                int t = targets[r0 + r];
                if (t >= v0 && t < v0 + vc) zt[r] = l[t - v0];
            }
        }
        for (int r = 0; r < rows; r++) {
            float loss = logf(s[r]) + m[r] - zt[r];
            if (losses) losses[r0 + r] = loss;
            total += loss;
        }
        if (dh == NULL) continue;
        /* pass 2: dlogits = (softmax − onehot) / N, tile by tile */
        for (int v0 = 0; v0 < V; v0 += VCHUNK) {
            int vc = V - v0 < VCHUNK ? V - v0 : VCHUNK;
            tile_logits(tile, h, wte, r0, rows, v0, vc, C);
            for (int r = 0; r < rows; r++) {
                float *l = tile + (size_t)r * vc, inv = 1.0f / s[r];
                for (int j = 0; j < vc; j++) l[j] = expf(l[j] - m[r]) * inv * dscale;
                int t = targets[r0 + r];
                if (t >= v0 && t < v0 + vc) l[t - v0] -= dscale;
            }
            /* dh (rows,C) += dlogits (rows,vc) · wte (vc,C) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, C, vc, 1.0f, tile, vc,
                        wte + (size_t)v0 * C, C, 1.0f, dh + (size_t)r0 * C, C);
            /* dwte (vc,C) += dlogitsᵀ (vc,rows) · h (rows,C) */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, vc, C, rows, 1.0f, tile, vc,
                        h + (size_t)r0 * C, C, 1.0f, dwte + (size_t)v0 * C, C);
        }
    }
    free(tile), free(m), free(s), free(zt);
    return (float)(total / N);
}

void classifier_logits(float *logits, const float *h, const float *wte, int C, int V) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, V, C, 1.0f, wte, C, h, 1, 0.0f, logits, 1);
}
