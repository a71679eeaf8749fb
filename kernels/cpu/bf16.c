/*
 * bf16.c — matmuls over a frozen weight held again in bf16 (API: ops.h):
 * the input rounded to bf16 (to nearest, ties to even), the products of
 * bf16 values summed in fp32, as mixed-precision training computes them.
 * With oneDNN (Debian's libdnnl) they run on the chip's bf16 units (AMX,
 * AVX-512 BF16, or oneDNN's own emulation elsewhere) through its matmul
 * primitive, one kept per shape (the least recently used goes first).
 * On a chip without bf16 instructions oneDNN only emulates them, several
 * times slower than fp32, so there the frozen weights are held widened
 * back to fp32 (the same values: a bf16 widens exactly) and the rounded
 * inputs go through OpenBLAS's sgemm: the arithmetic is the same either
 * way up to the order of the sums. The classifier over a frozen output layer (a tied
 * embedding under adapters) is here too: the same online softmax as
 * classifier.c's, over wider chunks of the vocabulary, each chunk's logits
 * one bf16 product.
 */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef STRAIT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

#include "kernels/half.h"
#include "kernels/ops.h"
#include "util/util.h"

void bf16_from_float(uint16_t *out, const float *x, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = float_to_bf16(x[i]);
}

void bf16_round(float *out, const float *x, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(float_to_bf16(x[i]));
}

void bf16_widen(float *out, const uint16_t *h, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(h[i]);
}

int bf16_units(void) {
#ifdef STRAIT_HAVE_DNNL
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa(); /* a mask: AMX's holds BF16's */
    return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
#else
    return 0;
#endif
}

#ifdef STRAIT_HAVE_DNNL
/* ---- oneDNN: one engine and stream, a primitive per (kind, M, K, N) ---- */

enum { FWD, BWD, WGT }; /* out = x · Wᵀ; dinp = dout · W; dW = doutᵀ · x */
typedef struct Prim {
    int kind, M, K, N;
    uint64_t used;      /* the last call's stamp: the least recent goes first */
    dnnl_primitive_t p; /* NULL: oneDNN made none for this shape (kept, not tried again) */
    dnnl_memory_desc_t src, wei, dst;
} Prim;
#define PRIMS 64
static struct {
    pthread_mutex_t lock;
    int state; /* 0: not tried, 1: ready, -1: no engine */
    dnnl_engine_t eng;
    dnnl_stream_t st;
    Prim prims[PRIMS];
    int n;
    uint64_t clock;
} dn = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* the primitive for src (M,K) · weights (K,N) -> dst (M,N), f32 out; the
 * weights are W (N,K) read transposed for FWD, W (K,N) as it is for BWD
 * and WGT, whose src is dout (K,M) read transposed; BWD and WGT add their
 * product to dst (a sum post-op: the gradients accumulate, with no
 * product-sized scratch and no second pass over it); NULL when oneDNN
 * makes none. Called with dn.lock held. */
static Prim *prim(int kind, int M, int K, int N) {
    if (dn.state == 0) {
        dn.state =
            dnnl_engine_create(&dn.eng, dnnl_cpu, 0) == dnnl_success &&
                    dnnl_stream_create(&dn.st, dn.eng, dnnl_stream_default_flags) == dnnl_success
                ? 1
                : -1;
    }
    if (dn.state < 0) return NULL;
    dn.clock++;
    for (int i = 0; i < dn.n; i++) {
        Prim *q = &dn.prims[i];
        if (q->kind == kind && q->M == M && q->K == K && q->N == N) {
            q->used = dn.clock;
            return q->p ? q : NULL;
        }
    }
    Prim *q = &dn.prims[dn.n < PRIMS ? dn.n++ : 0];
    if (dn.n == PRIMS) /* full: the least recently used shape makes room */
        for (int i = 1; i < PRIMS; i++)
            if (dn.prims[i].used < q->used) q = &dn.prims[i];
    if (q->p) dnnl_primitive_destroy(q->p);
    *q = (Prim){.kind = kind, .M = M, .K = K, .N = N, .used = dn.clock};
    dnnl_dims_t sd = {M, K}, ss = {K, 1}, wd = {K, N}, dd = {M, N}, ds = {N, 1};
    if (kind == WGT) ss[0] = 1, ss[1] = M;
    dnnl_dims_t ws_fwd = {1, K}, ws_bwd = {N, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_attr_t attr = NULL;
    int ok = kind == FWD || (dnnl_post_ops_create(&po) == dnnl_success &&
                             dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
                             dnnl_primitive_attr_create(&attr) == dnnl_success &&
                             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success);
    ok = ok && dnnl_memory_desc_init_by_strides(&q->src, 2, sd, dnnl_bf16, ss) == dnnl_success &&
         dnnl_memory_desc_init_by_strides(&q->wei, 2, wd, dnnl_bf16,
                                          kind == FWD ? ws_fwd : ws_bwd) == dnnl_success &&
         dnnl_memory_desc_init_by_strides(&q->dst, 2, dd, dnnl_f32, ds) == dnnl_success &&
         dnnl_matmul_desc_init(&md, &q->src, &q->wei, NULL, &q->dst) == dnnl_success &&
         dnnl_primitive_desc_create(&pd, &md, attr, dn.eng, NULL) == dnnl_success &&
         dnnl_primitive_create(&q->p, pd) == dnnl_success;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (po) dnnl_post_ops_destroy(po);
    if (!ok) q->p = NULL;
    return q->p ? q : NULL;
}

/* dst (M,N) = src (M,K) bf16 · weights (FWD), or dst += it (BWD, WGT);
 * 0, or -1 when oneDNN could not (dst then holds nothing the caller's
 * fallback minds). An accumulating primitive that fails as it runs may
 * have added part of its product: that stops the process rather than add
 * it twice. */
static int dnnl_mm(int kind, float *dst, const uint16_t *src, const uint16_t *w, int M, int K,
                   int N) {
    pthread_mutex_lock(&dn.lock);
    Prim *q = prim(kind, M, K, N);
    int rc = -1;
    dnnl_memory_t ms = NULL, mw = NULL, md = NULL;
    if (q && dnnl_memory_create(&ms, &q->src, dn.eng, (void *)src) == dnnl_success &&
        dnnl_memory_create(&mw, &q->wei, dn.eng, (void *)w) == dnnl_success &&
        dnnl_memory_create(&md, &q->dst, dn.eng, dst) == dnnl_success) {
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}};
        rc = dnnl_primitive_execute(q->p, dn.st, 3, args) == dnnl_success &&
                     dnnl_stream_wait(dn.st) == dnnl_success
                 ? 0
                 : -1;
        if (rc != 0 && kind != FWD)
            DIE("oneDNN's bf16 matmul (%d x %d x %d) failed as it ran, halfway through a "
                "gradient; train with --precision fp32 (or --lora-base-dtype f32)",
                M, K, N);
    }
    if (ms) dnnl_memory_destroy(ms);
    if (mw) dnnl_memory_destroy(mw);
    if (md) dnnl_memory_destroy(md);
    pthread_mutex_unlock(&dn.lock);
    return rc;
}
#endif

/* A thread's scratch k (S_IN, S_DOUT) of at least bytes, kept from call to
 * call: the oneDNN paths' rounded inputs are activation-sized, and a
 * fresh allocation of that size each call is a mapping made, faulted in,
 * zeroed and unmapped (with a TLB shootdown on every core) each time. */
#ifdef STRAIT_HAVE_DNNL
enum { S_IN, S_DOUT, S_N };
static void *scratch(int k, size_t bytes) {
    static _Thread_local struct {
        void *p;
        size_t cap;
    } s[S_N];
    if (bytes > s[k].cap) {
        free(s[k].p);
        s[k].p = mallocCheck(bytes);
        s[k].cap = bytes;
    }
    return s[k].p;
}
#endif

/* the widened values of n bf16s, allocated */
static float *widened(const uint16_t *h, size_t n) {
    float *f = mallocCheck(n * sizeof(float));
    bf16_widen(f, h, n);
    return f;
}

void matmul_forward_bf16(float *out, const float *inp, const BfWeight *w, const float *bias, int N,
                         int C, int OC) {
    assert(N > 0 && C > 0 && OC > 0 && out != inp && (w->h != NULL || w->f != NULL));
    int done = -1;
#ifdef STRAIT_HAVE_DNNL
    if (w->h) {
        uint16_t *x = scratch(S_IN, (size_t)N * C * sizeof(uint16_t));
        bf16_from_float(x, inp, (size_t)N * C);
        done = dnnl_mm(FWD, out, x, w->h, N, C, OC);
    }
#endif
    if (done != 0) { /* the same values through sgemm */
        float *x = mallocCheck((size_t)N * C * sizeof(float));
        float *wf = w->f ? (float *)w->f : widened(w->h, (size_t)OC * C);
        bf16_round(x, inp, (size_t)N * C);
        matmul_forward(out, x, wf, NULL, N, C, OC);
        if (!w->f) free(wf);
        free(x);
    }
    if (bias != NULL)
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

void matmul_backward_bf16(float *dinp, const float *dout, const BfWeight *w, int N, int C, int OC) {
    assert(N > 0 && C > 0 && OC > 0 && dinp != dout && (w->h != NULL || w->f != NULL));
    int done = -1;
#ifdef STRAIT_HAVE_DNNL
    if (w->h) { /* dinp += rounded dout · W */
        uint16_t *d = scratch(S_DOUT, (size_t)N * OC * sizeof(uint16_t));
        bf16_from_float(d, dout, (size_t)N * OC);
        done = dnnl_mm(BWD, dinp, d, w->h, N, OC, C);
    }
#endif
    if (done != 0) { /* dinp += rounded dout · W through sgemm's (it accumulates) */
        float *d = mallocCheck((size_t)N * OC * sizeof(float));
        float *wf = w->f ? (float *)w->f : widened(w->h, (size_t)OC * C);
        bf16_round(d, dout, (size_t)N * OC);
        matmul_backward(dinp, NULL, NULL, d, NULL, wf, N, C, OC);
        if (!w->f) free(wf);
        free(d);
    }
}

void matmul_weight_bf16(float *dweight, float *dbias, const float *dout, const float *inp, int N,
                        int C, int OC) {
    assert(N > 0 && C > 0 && OC > 0 && dweight != NULL);
    int done = -1;
#ifdef STRAIT_HAVE_DNNL
    uint16_t *d = scratch(S_DOUT, (size_t)N * OC * sizeof(uint16_t));
    uint16_t *x = scratch(S_IN, (size_t)N * C * sizeof(uint16_t));
    bf16_from_float(d, dout, (size_t)N * OC);
    bf16_from_float(x, inp, (size_t)N * C);
    done = dnnl_mm(WGT, dweight, d, x, OC, N, C); /* dweight += doutᵀ · x */
#endif
    if (done != 0) { /* the same rounded values through sgemm's (it accumulates) */
        float *dr = mallocCheck((size_t)N * OC * sizeof(float));
        float *xr = mallocCheck((size_t)N * C * sizeof(float));
        bf16_round(dr, dout, (size_t)N * OC);
        bf16_round(xr, inp, (size_t)N * C);
        matmul_backward(NULL, dweight, NULL, dr, xr, NULL, N, C, OC);
        free(dr), free(xr);
    }
    if (dbias != NULL) /* from dout as it is: a sum, no product */
#pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) {
            float sum = 0;
            for (int n = 0; n < N; n++) sum += dout[(size_t)n * OC + o];
            dbias[o] += sum;
        }
}

/* ---- the classifier over a bf16 output layer ------------------------------ */

#define CROWS  256
#define CCHUNK 4096

/* rows [v0, v0 + vc) of a frozen table */
static BfWeight rows_of(const BfWeight *w, int v0, int C) {
    size_t at = (size_t)v0 * C;
    return (BfWeight){.h = w->h ? w->h + at : NULL, .f = w->f ? w->f + at : NULL};
}

float classifier_forward_bf16(float *losses, float *lse, const float *h, const BfWeight *wte,
                              const int *targets, int N, int C, int V) {
    assert(N > 0 && C > 0 && V > 0);
    float *tile = mallocCheck(sizeof(float) * CROWS * CCHUNK);
    double *m = mallocCheck(sizeof(double) * 3 * CROWS), *s = m + CROWS, *zt = s + CROWS;
    double total = 0;
    for (int r0 = 0; r0 < N; r0 += CROWS) {
        int rows = N - r0 < CROWS ? N - r0 : CROWS;
        for (int r = 0; r < rows; r++) m[r] = -INFINITY, s[r] = 0, zt[r] = 0;
        for (int v0 = 0; v0 < V; v0 += CCHUNK) {
            int vc = V - v0 < CCHUNK ? V - v0 : CCHUNK;
            BfWeight chunk = rows_of(wte, v0, C);
            matmul_forward_bf16(tile, h + (size_t)r0 * C, &chunk, NULL, rows, C, vc);
#pragma omp parallel for schedule(static)
            for (int r = 0; r < rows; r++) { /* each row's running max and sum, in double */
                const float *l = tile + (size_t)r * vc;
                float cm = l[0];
                for (int j = 1; j < vc; j++) cm = l[j] > cm ? l[j] : cm;
                double mx = cm > m[r] ? cm : m[r], sum = s[r] * exp(m[r] - mx);
                for (int j = 0; j < vc; j++) sum += expf(l[j] - (float)mx);
                m[r] = mx, s[r] = sum;
                int tg = targets[r0 + r];
                if (tg >= v0 && tg < v0 + vc) zt[r] = l[tg - v0];
            }
        }
        for (int r = 0; r < rows; r++) {
            double l = log(s[r]) + m[r], loss = l - zt[r];
            if (lse) lse[r0 + r] = (float)l;
            if (losses) losses[r0 + r] = (float)loss;
            total += loss;
        }
    }
    free(tile), free(m);
    return (float)(total / N);
}

void classifier_backward_bf16(float *dh, float *dwte, const float *h, const BfWeight *wte,
                              const int *targets, const float *lse, int N, int C, int V) {
    assert(N > 0 && C > 0 && V > 0 && targets);
    float *tile = mallocCheck(sizeof(float) * CROWS * CCHUNK);
    float dscale = 1.0f / (float)N; /* the loss is the mean over rows */
    for (int r0 = 0; r0 < N; r0 += CROWS) {
        int rows = N - r0 < CROWS ? N - r0 : CROWS;
        for (int v0 = 0; v0 < V; v0 += CCHUNK) {
            int vc = V - v0 < CCHUNK ? V - v0 : CCHUNK;
            BfWeight chunk = rows_of(wte, v0, C);
            matmul_forward_bf16(tile, h + (size_t)r0 * C, &chunk, NULL, rows, C, vc);
#pragma omp parallel for schedule(static)
            for (int r = 0; r < rows; r++) { /* dlogits = (softmax - onehot) / N */
                float *l = tile + (size_t)r * vc, z = lse[r0 + r];
                for (int j = 0; j < vc; j++) l[j] = expf(l[j] - z) * dscale;
                int tg = targets[r0 + r];
                if (tg >= v0 && tg < v0 + vc) l[tg - v0] -= dscale;
            }
            /* dh (rows, C) += dlogits (rows, vc) · wte (vc, C) */
            matmul_backward_bf16(dh + (size_t)r0 * C, tile, &chunk, rows, C, vc);
            /* dwte (vc, C) += dlogitsᵀ · h (rows, C), in fp32 */
            if (dwte)
                matmul_weight_bf16(dwte + (size_t)v0 * C, NULL, tile, h + (size_t)r0 * C, rows, C,
                                   vc);
        }
    }
    free(tile);
}
