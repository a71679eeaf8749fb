/*
 * table.c — ops_cpu, the CPU ops as an Ops table (API: ops.h): each entry
 * is its op with the stream argument every backend's table takes: here
 * NULL, or a CpuStream whose frozen table the matmuls read in bf16.
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/half.h"
#include "kernels/ops.h"
#include "util/util.h"

static void zero(float *p, size_t n, void *st) {
    (void)st;
    memset(p, 0, n * sizeof(float));
}
/* the held matrix with the table's value i, or NULL */
static const HeldRows *held_rows(const CpuStream *s, size_t i) {
    int lo = 0, hi = s->n_held - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const HeldRows *h = &s->held[mid];
        if (i < h->offset)
            hi = mid - 1;
        else if (i >= h->offset + h->rows * h->cols)
            lo = mid + 1;
        else
            return h;
    }
    return NULL;
}

/* rows [r0, r0 + n) of h as bf16, in the stream's scratch */
static const uint16_t *unpacked(CpuStream *s, const HeldRows *h, size_t r0, size_t n) {
    size_t C = h->cols, need = n * C, chunk = 16;
    if (need > s->scratch_cap) {
        free(s->scratch);
        s->scratch = mallocCheck(need * sizeof(uint16_t));
        s->scratch_cap = need;
    }
#pragma omp parallel
    {
        float *rows = mallocCheck(chunk * C * sizeof(float));
#pragma omp for schedule(static)
        for (size_t r = 0; r < n; r += chunk) {
            size_t k = n - r < chunk ? n - r : chunk;
            h->unpack(h, r0 + r, k, rows);
            bf16_from_float(s->scratch + r * C, rows, k * C);
        }
        free(rows);
    }
    return s->scratch;
}

/* 1 with the copy of the n values at weight when the stream holds them
 * all (a held matrix's rows unpacked into its scratch), else 0 */
static int held(void *st, const float *weight, size_t n, BfWeight *w) {
    CpuStream *s = st;
    if (s == NULL) return 0;
    uintptr_t at = (uintptr_t)weight, lo = (uintptr_t)s->f32, hi = lo + s->n * sizeof(float);
    if (at < lo || at >= hi) return 0;
    size_t i = (size_t)(weight - s->f32);
    assert(i + n <= s->n); /* a weight is one tensor of the table, never across its end */
    const HeldRows *h = s->n_held ? held_rows(s, i) : NULL;
    if (h) {
        /* whole rows of the one matrix */
        assert((i - h->offset) % h->cols == 0 && n % h->cols == 0);
        assert((i - h->offset) / h->cols + n / h->cols <= h->rows);
        *w = (BfWeight){.h = unpacked(s, h, (i - h->offset) / h->cols, n / h->cols)};
        return 1;
    }
    *w = (BfWeight){.h = s->copy.h ? s->copy.h + i : NULL, .f = s->copy.f ? s->copy.f + i : NULL};
    return 1;
}
static void enc_f(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                  int C, void *st) {
    BfWeight te;
    const CpuStream *s = st;
    if ((s && s->live) || !held(st, wte, (size_t)C, &te)) { /* the fp32 table, when it is kept */
        encoder_forward(out, inp, wte, wpe, B, T, C);
        return;
    }
    /* a frozen embedding in bf16 (adapters are the Llama family's: no
     * position table), its rows widened */
    assert(wpe == NULL);
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        size_t at = (size_t)inp[bt] * C;
        float *o = out + (size_t)bt * C;
        for (int i = 0; i < C; i++) o[i] = te.h ? bf16_to_float(te.h[at + i]) : te.f[at + i];
    }
}
static void enc_b(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C,
                  void *st) {
    (void)st;
    encoder_backward(dwte, dwpe, dout, inp, B, T, C);
}
static void ln_f(float *out, float *mean, float *rstd, const float *inp, const float *w,
                 const float *bias, int N, int C, void *st) {
    (void)st;
    layernorm_forward(out, mean, rstd, inp, w, bias, N, C);
}
static void ln_b(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                 const float *w, const float *mean, const float *rstd, int N, int C, void *st) {
    (void)st;
    layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}
static void rms_f(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                  float eps, void *st) {
    (void)st;
    rmsnorm_forward(out, rstd, inp, w, N, C, eps);
}
static void rms_b(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                  const float *rstd, int N, int C, void *st) {
    (void)st;
    rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
}
static void scale_add(float *y, const float *x, float a, size_t N, void *st) {
    (void)st;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) y[i] += a * x[i];
}
static void dropout(float *y, const float *x, float p, uint64_t seed, size_t N, int accumulate,
                    void *st) {
    (void)st;
    uint32_t th = dropout_threshold(p);
    float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        float v = dropout_keep(seed, i, th) ? x[i] * scale : 0.0f;
        y[i] = accumulate ? y[i] + v : v;
    }
}
static void mm_f(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                 int OC, void *st) {
    BfWeight w;
    if (held(st, weight, (size_t)OC * C, &w))
        matmul_forward_bf16(out, inp, &w, bias, N, C, OC);
    else
        matmul_forward(out, inp, weight, bias, N, C, OC);
}
static void mm_b(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                 const float *weight, int N, int C, int OC, void *st) {
    BfWeight w;
    if (!held(st, weight, (size_t)OC * C, &w)) {
        matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
        return;
    }
    matmul_backward_bf16(dinp, dout, &w, N, C, OC);
    if (dweight) /* mixed precision: the weight's gradient's products in bf16 too */
        matmul_weight_bf16(dweight, dbias, dout, inp, N, C, OC);
}
static void att_f(float *out, float *lse, const float *q, const float *k, const float *v,
                  const AttnShape *s, void *st) {
    (void)st;
    attention_forward(out, lse, q, k, v, s);
}
static void att_b(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                  const float *q, const float *k, const float *v, const float *out,
                  const float *lse, const AttnShape *s, void *st) {
    (void)st;
    attention_backward(dq, dk, dv, scratch, dout, q, k, v, out, lse, s);
}
static void rope_f(float *x, int B, int T, int NH, int HD, int ld, const RopeConfig *r, void *st) {
    (void)st;
    rope_forward(x, B, T, NH, HD, ld, r);
}
static void rope_b(float *dx, int B, int T, int NH, int HD, int ld, const RopeConfig *r, void *st) {
    (void)st;
    rope_backward(dx, B, T, NH, HD, ld, r);
}
static void gelu_f(float *out, const float *inp, size_t N, void *st) {
    (void)st;
    gelu_forward(out, inp, N);
}
static void gelu_b(float *dinp, const float *inp, const float *dout, size_t N, void *st) {
    (void)st;
    gelu_backward(dinp, inp, dout, N);
}
static void swiglu_f(float *out, const float *gate, const float *up, size_t N, void *st) {
    (void)st;
    swiglu_forward(out, gate, up, N);
}
static void swiglu_b(float *dgate, float *dup, const float *dout, const float *gate,
                     const float *up, size_t N, void *st) {
    (void)st;
    swiglu_backward(dgate, dup, dout, gate, up, N);
}
static void res_f(float *out, const float *a, const float *b, size_t N, void *st) {
    (void)st;
    residual_forward(out, a, b, N);
}
static void res_b(float *da, float *db, const float *dout, size_t N, void *st) {
    (void)st;
    residual_backward(da, db, dout, N);
}
static float cls_f(float *losses, float *lse, const float *h, const float *w, const int *targets,
                   int N, int C, int V, void *st) {
    BfWeight w16;
    return held(st, w, (size_t)V * C, &w16)
               ? classifier_forward_bf16(losses, lse, h, &w16, targets, N, C, V)
               : classifier_forward(losses, lse, h, w, targets, N, C, V);
}
static void cls_b(float *dh, float *dw, const float *h, const float *w, const int *targets,
                  const float *lse, int N, int C, int V, void *st) {
    BfWeight w16;
    if (held(st, w, (size_t)V * C, &w16))
        classifier_backward_bf16(dh, dw, h, &w16, targets, lse, N, C, V);
    else
        classifier_backward(dh, dw, h, w, targets, lse, N, C, V);
}

const Ops ops_cpu = {
    .name = "cpu",
    .zero = zero,
    .encoder_forward = enc_f,
    .encoder_backward = enc_b,
    .layernorm_forward = ln_f,
    .layernorm_backward = ln_b,
    .rmsnorm_forward = rms_f,
    .rmsnorm_backward = rms_b,
    .matmul_forward = mm_f,
    .matmul_backward = mm_b,
    .attention_forward = att_f,
    .attention_backward = att_b,
    .rope_forward = rope_f,
    .rope_backward = rope_b,
    .gelu_forward = gelu_f,
    .gelu_backward = gelu_b,
    .swiglu_forward = swiglu_f,
    .swiglu_backward = swiglu_b,
    .residual_forward = res_f,
    .residual_backward = res_b,
    .classifier_forward = cls_f,
    .classifier_backward = cls_b,
    .scale_add = scale_add,
    .dropout = dropout,
};
