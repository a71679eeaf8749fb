/*
 * ops_llama.c — the CPU ops the Llama family's blocks add (API: ops.h):
 * RMSNorm, rotary position embeddings with Llama 3's frequency scaling,
 * and SwiGLU. fp32, row-major; backward ops accumulate (+=) into their
 * gradients, except rope_backward, which turns its gradient in place.
 * The formulas are Hugging Face's LlamaRMSNorm, LlamaRotaryEmbedding
 * (rotate_half: pairs (i, i + HD/2)) and LlamaMLP (silu(gate) ⊙ up).
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/ops.h"
#include "util/util.h"

/* ---- RMSNorm ----------------------------------------------------------------- */

void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                     float eps) {
    assert(N > 0 && C > 0 && eps > 0);
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float ss = 0;
        for (int i = 0; i < C; i++) ss += x[i] * x[i];
        float s = 1.0f / sqrtf(ss / C + eps);
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) o[i] = w[i] * (x[i] * s);
        rstd[n] = s;
    }
}

/* y = w ⊙ x·s with s = (mean x² + eps)^-1/2:
 * dx = s·(w⊙d) − x·s³·Σ(w⊙d⊙x)/C, dw = Σ_rows d ⊙ x·s */
void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                      const float *rstd, int N, int C) {
    assert(N > 0 && C > 0);
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * C, *x = inp + (size_t)n * C;
        float *dx = dinp + (size_t)n * C, s = rstd[n], dot = 0;
        for (int i = 0; i < C; i++) dot += w[i] * d[i] * x[i];
        float k = s * s * s * dot / C;
        if (dw != NULL) /* NULL: frozen */
            for (int i = 0; i < C; i++) dw[i] += d[i] * (x[i] * s);
        for (int i = 0; i < C; i++) dx[i] += s * w[i] * d[i] - k * x[i];
    }
}

/* ---- rotary embeddings ------------------------------------------------------- */

/* cos and sin of t·inv_freq[i] for every position and pair: (T, HD/2) each */
static void rope_table(const RopeConfig *r, int T, int HD, float *cs, float *sn) {
    int half = HD / 2;
    float inv[512];
    if (half > 512) DIE("rotary embeddings over heads of %d channels; at most 1024", HD);
    rope_inv_freq(r, HD, inv);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float a = (float)t * inv[i];
            cs[(size_t)t * half + i] = cosf(a);
            sn[(size_t)t * half + i] = sinf(a);
        }
}

/* x1' = x1 cos − x2 sin, x2' = x2 cos + x1 sin (sign = 1); the transpose
 * for the backward (sign = −1) */
static void rope_apply(float *x, int B, int T, int NH, int HD, int ld, const RopeConfig *r,
                       float sign) {
    assert(HD > 0 && HD % 2 == 0 && ld >= NH * HD && T > 0);
    int half = HD / 2;
    float *cs = mallocCheck(sizeof(float) * (size_t)T * half * 2), *sn = cs + (size_t)T * half;
    rope_table(r, T, HD, cs, sn);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *c = cs + (size_t)t * half, *s = sn + (size_t)t * half;
            for (int h = 0; h < NH; h++) {
                float *p = x + ((size_t)b * T + t) * ld + (size_t)h * HD;
                for (int i = 0; i < half; i++) {
                    float x1 = p[i], x2 = p[i + half], si = sign * s[i];
                    p[i] = x1 * c[i] - x2 * si;
                    p[i + half] = x2 * c[i] + x1 * si;
                }
            }
        }
    free(cs);
}

void rope_forward(float *x, int B, int T, int NH, int HD, int ld, const RopeConfig *r) {
    rope_apply(x, B, T, NH, HD, ld, r, 1.0f);
}

void rope_backward(float *dx, int B, int T, int NH, int HD, int ld, const RopeConfig *r) {
    rope_apply(dx, B, T, NH, HD, ld, r, -1.0f);
}

/* ---- SwiGLU ------------------------------------------------------------------- */

void swiglu_forward(float *out, const float *gate, const float *up, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* silu'(g) = σ(g)·(1 + g·(1 − σ(g))) */
void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                     const float *up, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float g = gate[i], sig = 1.0f / (1.0f + expf(-g));
        dgate[i] += dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
        dup[i] += dout[i] * g * sig;
    }
}
