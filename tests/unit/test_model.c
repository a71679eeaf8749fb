/*
 * test_model.c — the CPU ops and the Model: every backward op against central
 * finite differences (accumulated in double), the whole tiny model's loss
 * against finite differences for samples of every tensor and along a
 * random direction through the whole of each, the fused
 * classifier against a naive full softmax, determinism, learning (a repeated
 * batch, and real text), checkpoints and token shards.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>
#include <criterion/criterion.h>

#include "client/client_internal.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "kernels/model.h"
#include "kernels/sampler.h"
#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "kernels/data.h"
#include "kernels/train.h"
#include "tests/harness.h"
#include "util/util.h"

static uint64_t rs = 12345;
static float urand(void) { /* uniform in [-1, 1) */
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((double)(rs >> 11) / 4503599627370496.0 - 1.0);
}
static float *rvec(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = scale * urand();
    return x;
}

/* Compares an analytic gradient with central differences of f, of step
 * eps (divided by the step float can take, not the one asked for). */
typedef double (*LossFn)(void *ctx);
static void check_grad_step(const char *what, float *x, const float *grad, size_t n, size_t samples,
                            LossFn f, void *ctx, double tol, double eps) {
    for (size_t s = 0; s < samples; s++) {
        size_t i = samples >= n ? s : (size_t)((rs = rs * 6364136223846793005ull + 1) >> 33) % n;
        if (i >= n) break;
        float orig = x[i];
        float up = (float)(orig + eps), down = (float)(orig - eps);
        x[i] = up;
        double lp = f(ctx);
        x[i] = down;
        double lm = f(ctx);
        x[i] = orig;
        double num = (lp - lm) / ((double)up - (double)down), ana = grad[i];
        double err = fabs(num - ana) / fmax(1e-2, fabs(num) + fabs(ana));
        cr_assert_leq(err, tol, "%s[%zu]: analytic %.6g, numeric %.6g", what, i, ana, num);
    }
}

static void check_grad(const char *what, float *x, const float *grad, size_t n, size_t samples,
                       LossFn f, void *ctx, double tol) {
    check_grad_step(what, x, grad, n, samples, f, ctx, tol, 1e-3);
}

/* ---- ops ------------------------------------------------------------------------ */

/* loss = Σ out ⊙ R, so dout = R */
static double dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

typedef struct OpCtx {
    int B, T, C, NH, OC;
    float *inp, *w, *bias, *out, *r, *mean, *rstd, *lse;
} OpCtx;

static double ln_loss(void *p) {
    OpCtx *c = p;
    layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->bias, c->B * c->T, c->C);
    return dot(c->out, c->r, (size_t)c->B * c->T * c->C);
}

Test(ops, layernorm_backward_matches_finite_differences) {
    OpCtx c = {.B = 2, .T = 3, .C = 16};
    size_t n = (size_t)c.B * c.T * c.C;
    c.inp = rvec(n, 1), c.w = rvec(c.C, 1), c.bias = rvec(c.C, 1), c.out = rvec(n, 0);
    c.r = rvec(n, 1), c.mean = rvec(6, 0), c.rstd = rvec(6, 0);
    float *dinp = calloc(n, 4), *dw = calloc(c.C, 4), *db = calloc(c.C, 4);
    ln_loss(&c);
    layernorm_backward(dinp, dw, db, c.r, c.inp, c.w, c.mean, c.rstd, c.B * c.T, c.C);
    check_grad("layernorm dinp", c.inp, dinp, n, n, ln_loss, &c, 2e-2);
    check_grad("layernorm dw", c.w, dw, c.C, c.C, ln_loss, &c, 2e-2);
    check_grad("layernorm db", c.bias, db, c.C, c.C, ln_loss, &c, 2e-2);
}

static double mm_loss(void *p) {
    OpCtx *c = p;
    matmul_forward(c->out, c->inp, c->w, c->bias, c->B * c->T, c->C, c->OC);
    return dot(c->out, c->r, (size_t)c->B * c->T * c->OC);
}

Test(ops, matmul_backward_matches_finite_differences) {
    OpCtx c = {.B = 2, .T = 5, .C = 12, .OC = 7};
    size_t N = (size_t)c.B * c.T;
    c.inp = rvec(N * c.C, 1), c.w = rvec((size_t)c.OC * c.C, 1), c.bias = rvec(c.OC, 1);
    c.out = rvec(N * c.OC, 0), c.r = rvec(N * c.OC, 1);
    float *dinp = calloc(N * c.C, 4), *dw = calloc((size_t)c.OC * c.C, 4), *db = calloc(c.OC, 4);
    mm_loss(&c);
    matmul_backward(dinp, dw, db, c.r, c.inp, c.w, (int)N, c.C, c.OC);
    /* the loss is linear in each input: a wide step has no truncation
     * error, and keeps the forward's float rounding (which differs with
     * the sgemm kernel OpenBLAS picks for the CPU) well under the change */
    check_grad_step("matmul dinp", c.inp, dinp, N * c.C, N * c.C, mm_loss, &c, 1e-2, 0.05);
    check_grad_step("matmul dw", c.w, dw, (size_t)c.OC * c.C, 84, mm_loss, &c, 1e-2, 0.05);
    check_grad_step("matmul db", c.bias, db, c.OC, c.OC, mm_loss, &c, 1e-2, 0.05);
}

/* The matmuls cut their products across threads by whichever operand is
 * larger (the activations' rows, or the weight's rows or columns): at 1,
 * 2, 3 and 7 threads, on shapes that take each cut (fewer rows than
 * outputs, than inputs, fewer outputs than threads), out, dinp, dweight
 * and dbias against fp64 sums, accumulating into what was there */
static void matmul_split_against_fp64(int N, int C, int OC, int threads) {
    kernels_set_threads(threads);
    float *x = rvec((size_t)N * C, 1), *w = rvec((size_t)OC * C, 1), *b = rvec(OC, 1);
    float *dout = rvec((size_t)N * OC, 1), *out = calloc((size_t)N * OC, 4);
    float *dx = rvec((size_t)N * C, 1), *dw = rvec((size_t)OC * C, 1), *db = rvec(OC, 1);
    float *dx0 = malloc((size_t)N * C * 4), *dw0 = malloc((size_t)OC * C * 4),
          *db0 = malloc(OC * 4);
    memcpy(dx0, dx, (size_t)N * C * 4), memcpy(dw0, dw, (size_t)OC * C * 4),
        memcpy(db0, db, OC * 4);
    matmul_forward(out, x, w, b, N, C, OC);
    matmul_backward(dx, dw, db, dout, x, w, N, C, OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b[o];
            for (int c = 0; c < C; c++) s += (double)x[n * C + c] * w[o * C + c];
            cr_assert_float_eq(out[n * OC + o], s, 1e-5 * (C + 1), "%dx%dx%d at %d threads: out", N,
                               C, OC, threads);
        }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = dx0[n * C + c];
            for (int o = 0; o < OC; o++) s += (double)dout[n * OC + o] * w[o * C + c];
            cr_assert_float_eq(dx[n * C + c], s, 1e-5 * (OC + 1), "%dx%dx%d at %d threads: dinp", N,
                               C, OC, threads);
        }
    for (int o = 0; o < OC; o++) {
        double sb = db0[o];
        for (int n = 0; n < N; n++) sb += dout[n * OC + o];
        cr_assert_float_eq(db[o], sb, 1e-5 * (N + 1), "dbias");
        for (int c = 0; c < C; c++) {
            double s = dw0[o * C + c];
            for (int n = 0; n < N; n++) s += (double)dout[n * OC + o] * x[n * C + c];
            cr_assert_float_eq(dw[o * C + c], s, 1e-5 * (N + 1), "%dx%dx%d at %d threads: dweight",
                               N, C, OC, threads);
        }
    }
    free(x), free(w), free(b), free(dout), free(out), free(dx), free(dw), free(db);
    free(dx0), free(dw0), free(db0);
    kernels_set_threads(1);
}

Test(ops, matmuls_split_over_threads_by_the_larger_operand_sum_as_fp64) {
    static const int shapes[][3] = {
        {40, 24, 96}, {24, 96, 40}, {96, 24, 5}, {3, 7, 2}, {64, 64, 64}};
    static const int threads[] = {1, 2, 3, 7};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++)
            matmul_split_against_fp64(shapes[s][0], shapes[s][1], shapes[s][2], threads[t]);
}

static double att_loss(void *p) {
    OpCtx *c = p;
    AttnShape s = {c->B, c->T, c->NH, c->NH, c->C / c->NH, 3 * c->C, 3 * c->C};
    attention_forward(c->out, c->lse, c->inp, c->inp + c->C, c->inp + 2 * c->C, &s);
    return dot(c->out, c->r, (size_t)c->B * c->T * c->C);
}

Test(ops, attention_backward_matches_finite_differences) {
    OpCtx c = {.B = 2, .T = 6, .C = 8, .NH = 2};
    size_t n3 = (size_t)c.B * c.T * 3 * c.C, n = (size_t)c.B * c.T * c.C;
    c.inp = rvec(n3, 1), c.out = rvec(n, 0), c.r = rvec(n, 1);
    c.lse = rvec((size_t)c.B * c.NH * c.T, 0);
    float *dinp = calloc(n3, 4);
    att_loss(&c);
    AttnShape s = {c.B, c.T, c.NH, c.NH, c.C / c.NH, 3 * c.C, 3 * c.C};
    attention_backward(dinp, dinp + c.C, dinp + 2 * c.C, NULL, c.r, c.inp, c.inp + c.C,
                       c.inp + 2 * c.C, c.out, c.lse, &s);
    check_grad("attention dinp", c.inp, dinp, n3, n3, att_loss, &c, 2e-2);
}

static double gelu_loss(void *p) {
    OpCtx *c = p;
    gelu_forward(c->out, c->inp, (size_t)c->C);
    return dot(c->out, c->r, (size_t)c->C);
}

Test(ops, gelu_backward_matches_finite_differences) {
    OpCtx c = {.B = 1, .T = 1, .C = 64};
    c.inp = rvec(64, 4), c.out = rvec(64, 0), c.r = rvec(64, 1);
    float *d = calloc(64, 4);
    gelu_backward(d, c.inp, c.r, 64);
    check_grad("gelu", c.inp, d, 64, 64, gelu_loss, &c, 1e-2);
}

/* ---- the Llama family's ops ------------------------------------------------------ */

static double rms_loss(void *p) {
    OpCtx *c = p;
    rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->B * c->T, c->C, 1e-5f);
    return dot(c->out, c->r, (size_t)c->B * c->T * c->C);
}

Test(ops, rmsnorm_backward_matches_finite_differences) {
    OpCtx c = {.B = 2, .T = 3, .C = 16};
    size_t n = (size_t)c.B * c.T * c.C;
    c.inp = rvec(n, 1), c.w = rvec(c.C, 1), c.out = rvec(n, 0), c.r = rvec(n, 1);
    c.rstd = rvec(6, 0);
    float *dinp = calloc(n, 4), *dw = calloc(c.C, 4);
    rms_loss(&c);
    rmsnorm_backward(dinp, dw, c.r, c.inp, c.w, c.rstd, c.B * c.T, c.C);
    check_grad("rmsnorm dinp", c.inp, dinp, n, n, rms_loss, &c, 2e-2);
    check_grad("rmsnorm dw", c.w, dw, c.C, c.C, rms_loss, &c, 2e-2);
    /* and the forward is x / sqrt(mean x² + eps) ⊙ w */
    double ss = 0;
    for (int i = 0; i < c.C; i++) ss += (double)c.inp[i] * c.inp[i];
    cr_assert_float_eq(c.out[3], c.inp[3] / sqrt(ss / c.C + 1e-5) * c.w[3], 1e-5);
}

static RopeConfig rope_cfg = {10000.0f, 0, 0, 0, 0};
static double rope_loss(void *p) {
    OpCtx *c = p; /* inp (B, T, NH, HD) with rows of C = NH·HD */
    memcpy(c->out, c->inp, sizeof(float) * (size_t)c->B * c->T * c->C);
    rope_forward(c->out, c->B, c->T, c->NH, c->C / c->NH, c->C, &rope_cfg);
    return dot(c->out, c->r, (size_t)c->B * c->T * c->C);
}

Test(ops, rope_is_a_rotation_and_its_backward_matches_finite_differences) {
    RopeConfig scaled = {500000.0f, 8.0f, 1.0f, 4.0f, 8};
    for (int k = 0; k < 2; k++) {
        rope_cfg = k ? scaled : (RopeConfig){10000.0f, 0, 0, 0, 0};
        OpCtx c = {.B = 2, .T = 7, .C = 24, .NH = 3};
        size_t n = (size_t)c.B * c.T * c.C;
        c.inp = rvec(n, 1), c.out = rvec(n, 0), c.r = rvec(n, 1);
        float *d = malloc(n * 4);
        memcpy(d, c.r, n * 4);
        rope_backward(d, c.B, c.T, c.NH, c.C / c.NH, c.C, &rope_cfg);
        check_grad(k ? "rope (llama3 scaling)" : "rope", c.inp, d, n, n, rope_loss, &c, 1e-2);
        /* position 0 is not turned; every position keeps each pair's length */
        rope_loss(&c);
        for (int i = 0; i < c.C; i++) cr_assert_float_eq(c.out[i], c.inp[i], 1e-7);
        size_t row = (size_t)5 * c.C;
        for (int i = 0; i < 4; i++) {
            double before = hypot(c.inp[row + i], c.inp[row + i + 4]);
            double after = hypot(c.out[row + i], c.out[row + i + 4]);
            cr_assert_float_eq(after, before, 1e-5);
        }
        free(d), free(c.inp), free(c.out), free(c.r);
    }
    /* Llama 3.1's scaling, by transformers' rule (modeling_rope_utils.py,
     * _compute_llama3_parameters) at factor 8, low 1, high 4, context 8192
     * and theta 500000 for heads of 128: the highest frequency is kept, the
     * lowest divided by 8 */
    RopeConfig l31 = {500000.0f, 8.0f, 1.0f, 4.0f, 8192};
    float f[64];
    rope_inv_freq(&l31, 128, f);
    cr_assert_float_eq(f[0], 1.0f, 1e-7);
    cr_assert_float_eq(f[63], powf(500000.0f, -126.0f / 128.0f) / 8.0f, 1e-12);
}

static double swiglu_loss(void *p) {
    OpCtx *c = p; /* gate inp, up w */
    swiglu_forward(c->out, c->inp, c->w, (size_t)c->C);
    return dot(c->out, c->r, (size_t)c->C);
}

Test(ops, swiglu_backward_matches_finite_differences) {
    OpCtx c = {.C = 64};
    c.inp = rvec(64, 4), c.w = rvec(64, 2), c.out = rvec(64, 0), c.r = rvec(64, 1);
    float *dg = calloc(64, 4), *du = calloc(64, 4);
    swiglu_backward(dg, du, c.r, c.inp, c.w, 64);
    check_grad("swiglu dgate", c.inp, dg, 64, 64, swiglu_loss, &c, 1e-2);
    check_grad("swiglu dup", c.w, du, 64, 64, swiglu_loss, &c, 1e-2);
}

/* grouped-query attention: q (B,T,NH·HD), k and v (B,T,NKV·HD) */
typedef struct GqaCtx {
    AttnShape s;
    float *q, *k, *v, *out, *lse, *r;
} GqaCtx;
static double gqa_loss(void *p) {
    GqaCtx *c = p;
    attention_forward(c->out, c->lse, c->q, c->k, c->v, &c->s);
    return dot(c->out, c->r, (size_t)c->s.B * c->s.T * c->s.NH * c->s.HD);
}

Test(ops, grouped_query_attention_is_multi_head_on_shared_heads_and_its_backward_checks) {
    int B = 2, T = 5, NH = 4, NKV = 2, HD = 4, Qd = NH * HD, KVd = NKV * HD;
    GqaCtx c = {{B, T, NH, NKV, HD, Qd, KVd}, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t nq = (size_t)B * T * Qd, nk = (size_t)B * T * KVd, nl = (size_t)B * NH * T;
    c.q = rvec(nq, 1), c.k = rvec(nk, 1), c.v = rvec(nk, 1), c.out = rvec(nq, 0);
    c.lse = rvec(nl, 0), c.r = rvec(nq, 1);
    gqa_loss(&c);
    /* the same as multi-head attention with each key/value head repeated
     * for its two query heads */
    float *k2 = malloc(nq * 4), *v2 = malloc(nq * 4), *out2 = malloc(nq * 4);
    for (size_t bt = 0; bt < (size_t)B * T; bt++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD; i++) {
                k2[bt * Qd + h * HD + i] = c.k[bt * KVd + (h / 2) * HD + i];
                v2[bt * Qd + h * HD + i] = c.v[bt * KVd + (h / 2) * HD + i];
            }
    AttnShape mha = {B, T, NH, NH, HD, Qd, Qd};
    float *lse2 = malloc(nl * 4);
    attention_forward(out2, lse2, c.q, k2, v2, &mha);
    for (size_t i = 0; i < nq; i++) cr_assert_float_eq(c.out[i], out2[i], 1e-6, "out[%zu]", i);
    float *dq = calloc(nq, 4), *dk = calloc(nk, 4), *dv = calloc(nk, 4);
    attention_backward(dq, dk, dv, NULL, c.r, c.q, c.k, c.v, c.out, c.lse, &c.s);
    check_grad("gqa dq", c.q, dq, nq, nq, gqa_loss, &c, 2e-2);
    check_grad("gqa dk", c.k, dk, nk, nk, gqa_loss, &c, 2e-2);
    check_grad("gqa dv", c.v, dv, nk, nk, gqa_loss, &c, 2e-2);
}

/* Attention in double, by its definition: out, each row's log-sum-exp,
 * and the gradients of Σ out·r (dp = r·vᵀ, ds = p ⊙ (dp − Σ p·dp)). */
static void attention_naive(const GqaCtx *c, double *out, double *lse, double *dq, double *dk,
                            double *dv) {
    const AttnShape *s = &c->s;
    int T = s->T, HD = s->HD, G = s->NH / s->NKV, Qd = s->NH * HD;
    double scale = 1.0 / sqrt((double)HD), *p = malloc(sizeof(double) * T);
    double *dp = malloc(sizeof(double) * T);
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->NH; h++)
            for (int t = 0; t < T; t++) {
                const float *qt = c->q + ((size_t)b * T + t) * s->ldq + h * HD;
                const float *rt = c->r + ((size_t)b * T + t) * Qd + h * HD;
                size_t kv0 = (size_t)b * T * s->ldkv + (size_t)(h / G) * HD;
                double mx = -INFINITY, z = 0, dsum = 0;
                for (int j = 0; j <= t; j++) {
                    double sc = 0, d = 0;
                    for (int e = 0; e < HD; e++) {
                        sc += (double)qt[e] * c->k[kv0 + (size_t)j * s->ldkv + e];
                        d += (double)rt[e] * c->v[kv0 + (size_t)j * s->ldkv + e];
                    }
                    p[j] = sc * scale, dp[j] = d;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j <= t; j++) z += p[j] = exp(p[j] - mx);
                for (int j = 0; j <= t; j++) p[j] /= z, dsum += p[j] * dp[j];
                lse[((size_t)b * s->NH + h) * T + t] = mx + log(z);
                double *ot = out + ((size_t)b * T + t) * Qd + h * HD;
                double *dqt = dq + ((size_t)b * T + t) * s->ldq + h * HD;
                for (int j = 0; j <= t; j++) {
                    double ds = p[j] * (dp[j] - dsum) * scale;
                    for (int e = 0; e < HD; e++) {
                        size_t kj = kv0 + (size_t)j * s->ldkv + e;
                        ot[e] += p[j] * c->v[kj];
                        dv[kj] += p[j] * rt[e];
                        dqt[e] += ds * c->k[kj];
                        dk[kj] += ds * qt[e];
                    }
                }
            }
    free(p), free(dp);
}

static void expect_near(const char *what, const float *got, const double *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        cr_assert_leq(fabs(got[i] - want[i]), 1e-4 * (1 + fabs(want[i])), "%s[%zu]: %g, want %g",
                      what, i, got[i], want[i]);
}

/* Past one block of query rows (64): three blocks, the last short, grouped
 * heads, q, k and v in buffers of their own or packed in rows of one,
 * against the definition in double (finite differences over 150 rows'
 * sums are noisier than the gradients they would check). */
static void blocked_against_definition(int packed) {
    int B = 2, T = 150, NH = 4, NKV = 2, HD = 8, Qd = NH * HD, KVd = NKV * HD, W = Qd + 2 * KVd;
    size_t BT = (size_t)B * T, n = BT * W, nq = BT * Qd, nl = (size_t)B * NH * T;
    size_t ko = packed ? (size_t)Qd : nq, vo = packed ? (size_t)Qd + KVd : nq + BT * KVd;
    GqaCtx c = {
        {B, T, NH, NKV, HD, packed ? W : Qd, packed ? W : KVd}, NULL, NULL, NULL, NULL, NULL, NULL};
    float *x = rvec(n, 2);
    c.q = x, c.k = x + ko, c.v = x + vo, c.out = rvec(nq, 0), c.lse = rvec(nl, 0),
    c.r = rvec(nq, 1);
    double *out = calloc(nq, 8), *lse = calloc(nl, 8), *want = calloc(n, 8);
    attention_naive(&c, out, lse, want, want + ko, want + vo);
    gqa_loss(&c);
    expect_near("out", c.out, out, nq);
    expect_near("lse", c.lse, lse, nl);
    float *dx = rvec(n, 1); /* the gradients add to what is there */
    for (size_t i = 0; i < n; i++) want[i] += dx[i];
    attention_backward(dx, dx + ko, dx + vo, NULL, c.r, c.q, c.k, c.v, c.out, c.lse, &c.s);
    expect_near(packed ? "packed dq, dk, dv" : "dq, dk, dv", dx, want, n);
    free(x), free(c.out), free(c.lse), free(c.r), free(out), free(lse), free(want), free(dx);
}

Test(ops, attention_by_blocks_of_rows_matches_its_definition) {
    blocked_against_definition(0);
    blocked_against_definition(1);
}

/* The op as it was when it kept the (T,T) probabilities, one (batch, head)
 * at a time: the same BLAS calls its blocks make at T <= 64 */
static void attention_kept(float *out, float *pre, float *att, float *dq, float *dk, float *dv,
                           const float *dout, const GqaCtx *c) {
    const AttnShape *s = &c->s;
    int T = s->T, hs = s->HD, G = s->NH / s->NKV, C = s->NH * hs;
    float scale = 1.0f / sqrtf((float)hs), *da = calloc((size_t)T * T, 4);
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->NH; h++) {
            size_t qo = (size_t)b * T * s->ldq + h * hs,
                   ko = (size_t)b * T * s->ldkv + (h / G) * hs;
            const float *d = dout + (size_t)b * T * C + h * hs;
            memset(pre, 0, sizeof(float) * T * T), memset(da, 0, sizeof(float) * T * T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, c->q + qo, s->ldq,
                        c->k + ko, s->ldkv, 0.0f, pre, T);
            for (int t = 0; t < T; t++) {
                float *pr = pre + (size_t)t * T, *ar = att + (size_t)t * T, maxv = -INFINITY,
                      sum = 0;
                for (int j = 0; j <= t; j++) maxv = pr[j] > maxv ? pr[j] : maxv;
                for (int j = 0; j <= t; j++) sum += ar[j] = expf(pr[j] - maxv);
                float inv = 1.0f / sum;
                for (int j = 0; j <= t; j++) ar[j] *= inv;
                for (int j = t + 1; j < T; j++) ar[j] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, att, T,
                        c->v + ko, s->ldkv, 0.0f, out + (size_t)b * T * C + h * hs, C);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, c->v + ko,
                        s->ldkv, 1.0f, da, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, att, T, d, C, 1.0f,
                        dv + ko, s->ldkv);
            memset(pre, 0, sizeof(float) * T * T); /* now the scores' gradient */
            for (int t = 0; t < T; t++) {
                const float *ar = att + (size_t)t * T, *dar = da + (size_t)t * T;
                float ada = 0;
                for (int j = 0; j <= t; j++) ada += ar[j] * dar[j];
                for (int j = 0; j <= t; j++) pre[(size_t)t * T + j] += ar[j] * (dar[j] - ada);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, pre, T,
                        c->k + ko, s->ldkv, 1.0f, dq + qo, s->ldq);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, pre, T, c->q + qo,
                        s->ldq, 1.0f, dk + ko, s->ldkv);
        }
    free(da);
}

/* Up to one block of rows the op makes the products and sums it made when
 * it kept the probabilities, so models train to the same bits as then:
 * the output and the gradients compared bit for bit, grouped heads, at a
 * block's length and under it. */
Test(ops, attention_up_to_one_block_computes_what_the_kept_probabilities_did) {
    kernels_set_threads(1);
    static const int shapes[][2] = {{64, 8}, {17, 16}};
    for (int k = 0; k < 2; k++) {
        int B = 2, T = shapes[k][0], NH = 4, NKV = 2, HD = shapes[k][1];
        int Qd = NH * HD, KVd = NKV * HD;
        size_t nq = (size_t)B * T * Qd, nk = (size_t)B * T * KVd, na = (size_t)T * T;
        GqaCtx c = {{B, T, NH, NKV, HD, Qd, KVd}, NULL, NULL, NULL, NULL, NULL, NULL};
        c.q = rvec(nq, 2), c.k = rvec(nk, 2), c.v = rvec(nk, 1), c.r = rvec(nq, 1);
        c.out = calloc(nq, 4), c.lse = calloc((size_t)B * NH * T, 4);
        float *out = calloc(nq, 4), *pre = calloc(na, 4), *att = calloc(na, 4);
        float *dq = calloc(nq, 4), *dk = calloc(nk, 4), *dv = calloc(nk, 4);
        float *gq = calloc(nq, 4), *gk = calloc(nk, 4), *gv = calloc(nk, 4);
        attention_kept(out, pre, att, dq, dk, dv, c.r, &c);
        attention_forward(c.out, c.lse, c.q, c.k, c.v, &c.s);
        attention_backward(gq, gk, gv, NULL, c.r, c.q, c.k, c.v, c.out, c.lse, &c.s);
        cr_assert(memcmp(out, c.out, nq * 4) == 0, "T %d: the output's bits moved", T);
        cr_assert(memcmp(dq, gq, nq * 4) == 0, "T %d: dq's bits moved", T);
        cr_assert(memcmp(dk, gk, nk * 4) == 0, "T %d: dk's bits moved", T);
        cr_assert(memcmp(dv, gv, nk * 4) == 0, "T %d: dv's bits moved", T);
        free(c.q), free(c.k), free(c.v), free(c.r), free(c.out), free(c.lse), free(out), free(pre);
        free(att), free(dq), free(dk), free(dv), free(gq), free(gk), free(gv);
    }
}

/* ---- fused classifier ---------------------------------------------------------- */

/* The vocabulary's chunks are split over the threads and their partial
 * softmax sums merged: every thread count, one with a thread that gets no
 * chunk at all, must give the naive result. */
static void classifier_against_naive(int threads) {
    kernels_set_threads(threads);
    int N = 300, C = 24, V = 1800; /* two blocks of rows, four chunks, the last uneven */
    float *h = rvec((size_t)N * C, 1), *wte = rvec((size_t)V * C, 0.5f);
    int *tg = malloc(N * sizeof *tg);
    for (int i = 0; i < N; i++) tg[i] = (int)((unsigned)(i * 7919) % (unsigned)V);
    float *losses = calloc(N, 4), *dh = calloc((size_t)N * C, 4), *dw = calloc((size_t)V * C, 4);
    float mean = classifier_forward_backward(losses, dh, dw, h, wte, tg, N, C, V);
    double *ndh = calloc((size_t)N * C, 8), *ndw = calloc((size_t)V * C, 8), total = 0;
    double *logits = malloc(V * sizeof(double));
    for (int n = 0; n < N; n++) {
        double mx = -1e300, s = 0;
        for (int v = 0; v < V; v++) {
            logits[v] = dot(h + (size_t)n * C, wte + (size_t)v * C, C);
            mx = fmax(mx, logits[v]);
        }
        for (int v = 0; v < V; v++) s += exp(logits[v] - mx);
        double loss = log(s) + mx - logits[tg[n]];
        total += loss;
        cr_assert_float_eq(losses[n], loss, 1e-4 * fmax(1, fabs(loss)), "row %d", n);
        for (int v = 0; v < V; v++) {
            double g = (exp(logits[v] - mx) / s - (v == tg[n])) / N;
            for (int k = 0; k < C; k++) {
                ndh[(size_t)n * C + k] += g * wte[(size_t)v * C + k];
                ndw[(size_t)v * C + k] += g * h[(size_t)n * C + k];
            }
        }
    }
    cr_assert_float_eq(mean, total / N, 1e-4);
    for (size_t i = 0; i < (size_t)N * C; i++)
        cr_assert_float_eq(dh[i], ndh[i], 1e-5 + 1e-3 * fabs(ndh[i]), "dh[%zu]", i);
    for (size_t i = 0; i < (size_t)V * C; i++)
        cr_assert_float_eq(dw[i], ndw[i], 1e-5 + 1e-3 * fabs(ndw[i]), "dwte[%zu]", i);
    free(h), free(wte), free(tg), free(losses), free(dh), free(dw), free(ndh), free(ndw);
    free(logits);
    kernels_set_threads(1);
}

Test(classifier, fused_equals_a_naive_softmax_cross_entropy) {
    classifier_against_naive(1);
}

Test(classifier, fused_is_the_same_on_two_and_five_threads) {
    classifier_against_naive(2);
    classifier_against_naive(5);
}

/* ---- the whole model ------------------------------------------------------------- */

static Model preset_model(const char *preset, uint64_t seed) {
    ModelConfig cfg;
    cr_assert_eq(model_config_preset(preset, &cfg), 0);
    Model m;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&m, &cfg, seed, err), 0, "%s", err);
    return m;
}
static Model tiny(uint64_t seed) {
    return preset_model("tiny", seed);
}

typedef struct ModelCtx {
    Model *m;
    int *in, *tg, B, T;
} ModelCtx;

static double model_loss(void *p) {
    ModelCtx *c = p;
    return model_forward(c->m, c->in, c->tg, c->B, c->T);
}

/* every tensor of what trains (the whole model, or its adapters) against
 * finite differences of the loss */
static void every_tensor_gradient(Model *mp) {
    Model m = *mp;
    int B = 2, T = 8, in[16], tg[16];
    for (int i = 0; i < B * T; i++) in[i] = (i * 37) % 256, tg[i] = (i * 91 + 5) % 256;
    ModelCtx c = {&m, in, tg, B, T};
    model_zero_grad(&m);
    model_loss(&c);
    model_backward(&m);
    float *grads = malloc(m.n_params * 4);
    memcpy(grads, m.grads, m.n_params * 4);
    for (int v = 0; v < m.n_views; v++) {
        const ParamView *pv = &m.views[v];
        size_t numel = pv->numel;
        if (strcmp(pv->name, "wte") == 0) numel = 256 * (size_t)m.cfg.C; /* padded rows: no use */
        check_grad(pv->name, m.params + pv->offset, grads + pv->offset, numel, 4, model_loss, &c,
                   5e-2);
        /* the whole tensor at once: the derivative along a random ±1
         * direction against g·v. Sampled elements alone let a tensor whose
         * gradient was zeroed pass (a small numeric value under a relative
         * floor); this sum over every element does not */
        float *x = m.params + pv->offset, *save = malloc(numel * 4);
        int8_t *dir = malloc(numel);
        memcpy(save, x, numel * 4);
        double ana = 0, eps = 1e-3;
        for (size_t i = 0; i < numel; i++) {
            dir[i] = (rs = rs * 6364136223846793005ull + 1) >> 63 ? 1 : -1;
            ana += (double)grads[pv->offset + i] * dir[i];
        }
        for (size_t i = 0; i < numel; i++) x[i] = (float)(save[i] + eps * dir[i]);
        double lp = model_loss(&c);
        for (size_t i = 0; i < numel; i++) x[i] = (float)(save[i] - eps * dir[i]);
        double lm = model_loss(&c);
        memcpy(x, save, numel * 4);
        double num = (lp - lm) / (2 * eps);
        /* a key bias shifts every score of a query alike, which softmax
         * ignores: only the rotary embeddings (a different turn at each
         * position) leave it a gradient, too small for this float
         * difference; its sampled elements above are checked */
        if (strstr(pv->name, "attn.k.bias")) {
            free(save), free(dir);
            continue;
        }
        double err = fabs(num - ana) / fmax(1e-3, fabs(num) + fabs(ana));
        cr_assert_leq(err, 3e-2, "%s along a random direction: analytic %.6g, numeric %.6g",
                      pv->name, ana, num);
        /* and it could fail: with g zeroed, err would be 1 (measured: the
         * weakest tensor's |num| is 0.005, all others' errors under 0.01) */
        cr_assert_gt(fabs(num), 1e-3, "%s: the direction is too weak to catch a zeroed gradient",
                     pv->name);
        free(save), free(dir);
    }
    free(grads);
    *mp = m;
}

static void whole_model_gradient(const char *preset) {
    Model m = preset_model(preset, 7);
    /* larger weights than at init, so every path carries gradient */
    for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.05f * urand();
    every_tensor_gradient(&m);
    model_free(&m);
}

Test(model, loss_gradient_matches_finite_differences_in_every_tensor, .timeout = 120) {
    whole_model_gradient("tiny");
}

/* the Llama family's graph: untied output layer, grouped-query attention
 * (4 query heads on 2 key/value heads), rotary embeddings; Qwen2's q/k/v
 * biases and tied embeddings */
Test(model, llama_and_qwen2_gradients_match_finite_differences_in_every_tensor, .timeout = 180) {
    whole_model_gradient("llama-tiny");
    whole_model_gradient("qwen2-tiny");
}

/* The activations' gradients live one layer at a time: every layer's in
 * one shared block, the residual stream's in two slots taken in turn. At
 * three layers and more a slot is written, read and written again within
 * one backward (at two, each once): every tensor of every layer against
 * finite differences there, and the buffer smaller than the activations
 * by about the layers' factor. */
Test(model, three_layers_share_their_activations_gradients_and_match_finite_differences,
     .timeout = 180) {
    const char *presets[] = {"tiny", "llama-tiny"};
    for (int k = 0; k < 2; k++) {
        ModelConfig cfg;
        cr_assert_eq(model_config_preset(presets[k], &cfg), 0);
        cfg.L = 3;
        Model m;
        char err[ERR_LEN];
        cr_assert_eq(model_build(&m, &cfg, 5, err), 0, "%s", err);
        /* larger than at init, so each tensor's direction is strong enough
         * to catch a zeroed gradient (at 0.05, or with seeds 3 and 7, a
         * norm's or a key's was not, in the old layout as in this one) */
        for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.1f * urand();
        every_tensor_gradient(&m);
        ActLayout lay;
        model_layout(&m, 4, 64, &lay);
        cr_assert_lt(lay.dlen * 2, lay.len, "%s: gradients of %zu floats for %zu of activations",
                     presets[k], lay.dlen, lay.len);
        model_free(&m);
    }
}

/* ---- adapters ------------------------------------------------------------------- */

static Model adapted(const char *preset, unsigned targets, int rank) {
    Model m = preset_model(preset, 7);
    for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.05f * urand();
    AdapterConfig a = {.rank = rank, .alpha = 2.0f * (float)rank, .targets = targets};
    char err[ERR_LEN];
    cr_assert_eq(model_add_adapters(&m, &a, 11, err), 0, "%s", err);
    return m;
}

Test(adapters, every_adapter_gradient_matches_finite_differences, .timeout = 180) {
    const char *presets[] = {"llama-tiny", "qwen2-tiny"};
    for (int k = 0; k < 2; k++) {
        Model m = adapted(presets[k], LORA_ALL, 4);
        cr_assert_eq(m.n_views, 2 * 7 * m.cfg.L, "A and B of seven projections in each layer");
        /* B nonzero, so A's gradient is too */
        for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.1f * urand();
        every_tensor_gradient(&m);
        model_free(&m);
    }
}

/* FFA-LoRA trains B alone over a frozen A; Fed-SB trains R alone between
 * a frozen A and B (R nonzero, so the path through it to the earlier
 * layers' adapters carries gradient too) */
Test(adapters, with_a_or_a_and_b_frozen_every_trained_gradient_matches_finite_differences,
     .timeout = 180) {
    const int rules[] = {LORA_RULE_FFA, LORA_RULE_FEDSB};
    for (int k = 0; k < 2; k++) {
        Model m = preset_model("llama-tiny", 7);
        for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.05f * urand();
        AdapterConfig a = {
            .rank = 4, .alpha = 8, .targets = LORA_ALL, .rule = rules[k], .a_seed = 5};
        char err[ERR_LEN];
        cr_assert_eq(model_add_adapters(&m, &a, 11, err), 0, "%s", err);
        cr_assert_eq(m.n_views, 7 * m.cfg.L, "one trained view per adapted projection");
        /* R's few values (16 a projection) carry a weaker directional
         * derivative than B's; larger frozen factors lift it (k's R:
         * 1e-4 at their draw, under what the float loss resolves) */
        size_t frozen = (size_t)model_adapter_params(&m.cfg) - m.n_params;
        if (k == 1)
            for (size_t i = 0; i < frozen; i++) m.lora_frozen[i] *= 4;
        for (int v = 0; v < m.n_views; v++)
            cr_assert(strstr(m.views[v].name, k ? "lora_R" : "lora_B"), "%s", m.views[v].name);
        for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.1f * urand();
        every_tensor_gradient(&m);
        model_free(&m);
    }
}

/* The rule the aggregation must keep: the aggregate of the sites'
 * adapters (their plain mean, value by value: what FedAvg of the table
 * computes) updates each adapted projection by the mean of the sites'
 * updates, ΔW = s·B·A (fedit, ffa) or s·B·R·A (fedsb), computed here in
 * double from the factors. With A frozen (ffa), or A and B (fedsb), it
 * does to float rounding (the mean is rounded to float once, about 1e-7
 * relative: 1e-6 is the tolerance); FedIT's mean(B)·mean(A) misses by far
 * more. Returns the worst relative miss, ‖ΔW_agg − mean ΔW‖ / ‖mean ΔW‖,
 * over the adapted projections. */
static double aggregate_miss(int rule, int N) {
    Model site[8], agg;
    AdapterConfig a = {
        .rank = 4, .alpha = 8, .targets = LORA_Q | LORA_V | LORA_DOWN, .rule = rule, .a_seed = 9};
    char err[ERR_LEN];
    for (int k = 0; k <= N; k++) { /* N sites, and the aggregate, from one start */
        Model *m = k < N ? &site[k] : &agg;
        *m = preset_model("llama-tiny", 7);
        cr_assert_eq(model_add_adapters(m, &a, 20, err), 0, "%s", err);
        if (k < N) /* each site's training moved what it trains */
            for (size_t i = 0; i < m->n_params; i++) m->params[i] += 0.3f * urand();
    }
    for (size_t i = 0; i < agg.n_params; i++) {
        double sum = 0;
        for (int k = 0; k < N; k++) sum += site[k].params[i];
        agg.params[i] = (float)(sum / N);
    }
    double worst = 0, s = 8.0 / 4;
    int matrices = 0;
    for (int l = 0; l < agg.cfg.L; l++)
        for (int r = 0; r < model_table_rows(&agg); r++) {
            LoraAt at[9];
            if (!model_lora_at(&agg, agg.params, r, l, &at[N])) continue;
            for (int k = 0; k < N; k++)
                cr_assert(model_lora_at(&site[k], site[k].params, r, l, &at[k]));
            int in = at[N].in, out = at[N].out;
            double diff = 0, norm = 0;
            for (int o = 0; o < out; o++)
                for (int i = 0; i < in; i++) {
                    double dw[9] = {0}; /* ΔW[o][i] of each site, and of the aggregate */
                    for (int k = 0; k <= N; k++)
                        for (int j = 0; j < 4; j++) {
                            double ra = 0; /* (R A)[j][i], or A[j][i] */
                            if (at[k].R)
                                for (int q = 0; q < 4; q++)
                                    ra += (double)at[k].R[j * 4 + q] * at[k].A[q * in + i];
                            else
                                ra = at[k].A[j * in + i];
                            dw[k] += s * at[k].B[o * 4 + j] * ra;
                        }
                    double mean = 0;
                    for (int k = 0; k < N; k++) mean += dw[k] / N;
                    diff += (dw[N] - mean) * (dw[N] - mean), norm += mean * mean;
                }
            cr_assert_gt(norm, 0, "the sites' updates are not zero");
            worst = fmax(worst, sqrt(diff / norm));
            matrices++;
        }
    cr_assert_eq(matrices, 3 * agg.cfg.L);
    for (int k = 0; k < N; k++) model_free(&site[k]);
    model_free(&agg);
    return worst;
}

Test(adapters, the_aggregate_update_is_the_sites_mean_update_for_ffa_and_fedsb_not_fedit) {
    for (int N = 2; N <= 8; N++) {
        double ffa = aggregate_miss(LORA_RULE_FFA, N), fedsb = aggregate_miss(LORA_RULE_FEDSB, N),
               fedit = aggregate_miss(LORA_RULE_FEDIT, N);
        cr_assert_leq(ffa, 1e-6, "ffa, %d sites: the aggregate's update is %g off (relative)", N,
                      ffa);
        cr_assert_leq(fedsb, 1e-6, "fedsb, %d sites: the aggregate's update is %g off", N, fedsb);
        cr_assert_geq(fedit, 1e-2, "fedit, %d sites: averaged apart it should miss: %g", N, fedit);
    }
}

/* What travels with Fed-SB is R alone: rank² values per adapted
 * projection, whatever its sides; A and B lie beside the table, drawn
 * from a_seed, the same at every site (FFA's A is the same draw). */
Test(adapters, fedsb_trains_and_moves_rank_squared_values_per_adapted_projection) {
    char err[ERR_LEN];
    Model m[3];
    const int rules[] = {LORA_RULE_FEDSB, LORA_RULE_FEDSB, LORA_RULE_FFA};
    for (int k = 0; k < 3; k++) {
        m[k] = preset_model("llama-tiny", 7);
        AdapterConfig a = {
            .rank = 4, .alpha = 4, .targets = LORA_ALL, .rule = rules[k], .a_seed = 5};
        cr_assert_eq(model_add_adapters(&m[k], &a, 100 + k, err), 0, "%s", err);
        cr_assert_eq((double)m[k].n_params, model_adapter_trained(&m[k].cfg));
    }
    int adapted = 0;
    for (int l = 0; l < m[0].cfg.L; l++)
        for (int r = 0; r < model_table_rows(&m[0]); r++) {
            LoraAt at, at1, ffa, g;
            if (!model_lora_at(&m[0], m[0].params, r, l, &at)) continue;
            adapted++;
            cr_assert(model_lora_at(&m[1], m[1].params, r, l, &at1));
            cr_assert(model_lora_at(&m[2], m[2].params, r, l, &ffa));
            cr_assert(model_lora_at(&m[0], m[0].grads, r, l, &g));
            cr_assert(g.A == NULL && g.B == NULL && g.R != NULL, "R alone has a gradient");
            cr_assert_eq(at.R - m[0].params, g.R - m[0].grads, "R is in the table");
            for (int i = 0; i < 16; i++) cr_assert_eq(at.R[i], 0.0f, "R starts at zero");
            cr_assert_eq(memcmp(at.A, at1.A, sizeof(float) * 4 * at.in), 0, "one A everywhere");
            cr_assert_eq(memcmp(at.B, at1.B, sizeof(float) * 4 * at.out), 0, "one B everywhere");
            cr_assert_eq(memcmp(at.A, ffa.A, sizeof(float) * 4 * at.in), 0, "FFA's A");
            double bound = 1 / sqrt(4.0), sq = 0;
            for (int i = 0; i < 4 * at.out; i++) {
                cr_assert_leq(fabs(at.B[i]), bound, "B in ±1/sqrt(rank)");
                sq += (double)at.B[i] * at.B[i];
            }
            /* uniform in ±1/2: a variance of 1/12 */
            cr_assert_float_eq(sq / (4 * at.out), 1.0 / 12, 0.02, "B's variance");
        }
    cr_assert_eq(adapted, 7 * m[0].cfg.L);
    cr_assert_eq(m[0].n_views, adapted);
    cr_assert_eq(m[0].n_params, (size_t)adapted * 4 * 4, "the table is rank² per projection");
    /* llama-tiny's projections (in, out): q and o (64, 64), k and v (64,
     * 32), gate and up (64, 176), down (176, 64); A and B beside the table */
    cr_assert_eq(model_adapter_params(&m[0].cfg),
                 (double)m[0].cfg.L *
                     (4 * (64 + 64) * 2 + 4 * (64 + 32) * 2 + 4 * (64 + 176) * 3 + 7 * 16));
    for (int k = 0; k < 3; k++) model_free(&m[k]);
}

/* A checkpoint of Fed-SB's adapters reads back as the same model: R from
 * the file, A and B drawn again from its a_seed, the base from its seed */
Test(adapters, a_fedsb_checkpoint_reads_back_bit_for_bit, .timeout = 60) {
    char *dir = harness_tmpdir("fedsb"), path[700], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    Model m = preset_model("llama-tiny", 7), back;
    AdapterConfig a = {
        .rank = 4, .alpha = 4, .targets = LORA_Q | LORA_O, .rule = LORA_RULE_FEDSB, .a_seed = 3};
    cr_assert_eq(model_add_adapters(&m, &a, 1, err), 0, "%s", err);
    m.cfg.lora.base_seed = 7; /* drawn: as strait train marks it */
    for (size_t i = 0; i < m.n_params; i++) m.params[i] = 0.2f * urand();
    cr_assert_eq(model_save(&m, path, 3, err), 0, "%s", err);
    ModelConfig cfg;
    cr_assert_eq(model_read_config(path, &cfg, NULL, err), 0, "%s", err);
    cr_assert_eq(model_load_checkpoint(&back, &cfg, path, NULL, err), 0, "%s", err);
    cr_assert(back.cfg.lora.rule == LORA_RULE_FEDSB && back.cfg.lora.a_seed == 3);
    cr_assert_eq(back.n_params, m.n_params);
    cr_assert_eq(memcmp(back.params, m.params, m.n_params * 4), 0);
    int ctx[5] = {1, 2, 3, 4, 5};
    float *l0 = malloc(m.cfg.Vp * 4), *l1 = malloc(m.cfg.Vp * 4);
    model_next_logits(&m, ctx, 5, l0), model_next_logits(&back, ctx, 5, l1);
    cr_assert_eq(memcmp(l0, l1, m.cfg.V * 4), 0, "the same logits");
    free(l0), free(l1);
    model_free(&m), model_free(&back);
    harness_rmtree(dir);
    free(dir);
}

/* --format peft writes Fed-SB's adapters as plain LoRA (lora_A = R·A,
 * lora_B = B, the same alpha), which PEFT's arithmetic, W x + s·B·A' x,
 * and --merge, W + s·B·(R·A), both compute as the Fed-SB model does; a
 * PEFT folder does not go into a Fed-SB model */
Test(adapters, fedsb_goes_out_as_plain_lora_with_the_same_update, .timeout = 60) {
    char *dir = harness_tmpdir("fedsbpeft"), err[ERR_LEN];
    Model m = preset_model("llama-tiny", 7), plain = preset_model("llama-tiny", 7), merged;
    AdapterConfig a = {
        .rank = 4, .alpha = 6, .targets = LORA_ALL, .rule = LORA_RULE_FEDSB, .a_seed = 3};
    cr_assert_eq(model_add_adapters(&m, &a, 1, err), 0, "%s", err);
    for (size_t i = 0; i < m.n_params; i++) m.params[i] = 0.5f * urand();
    cr_assert_eq(model_export_peft(&m, dir, NULL, err), 0, "%s", err);
    cr_assert_eq(model_import_peft(&plain, dir, err), 0, "%s", err);
    cr_assert(plain.cfg.lora.rule == LORA_RULE_FEDIT && plain.cfg.lora.rank == 4 &&
              plain.cfg.lora.alpha == 6 && plain.cfg.lora.targets == LORA_ALL);
    cr_assert_eq(model_merge_adapters(&m, &merged, err), 0, "%s", err);
    int ctx[6] = {5, 9, 2, 7, 1, 3};
    float *want = malloc(m.cfg.Vp * 4), *got = malloc(m.cfg.Vp * 4), *base = malloc(m.cfg.Vp * 4);
    Model bare = preset_model("llama-tiny", 7);
    model_next_logits(&bare, ctx, 6, base);
    model_next_logits(&m, ctx, 6, want);
    double moved = 0;
    for (int v = 0; v < m.cfg.V; v++) moved = fmax(moved, fabs(want[v] - base[v]));
    cr_assert_gt(moved, 1e-2, "the adapters change the logits (%g)", moved);
    Model *others[] = {&plain, &merged};
    for (int k = 0; k < 2; k++) {
        model_next_logits(others[k], ctx, 6, got);
        for (int v = 0; v < m.cfg.V; v++)
            cr_assert_float_eq(got[v], want[v], 1e-5 + 1e-5 * fabs(want[v]), "%s: logit %d",
                               k ? "merged" : "PEFT's", v);
    }
    /* and back in: refused by name */
    Model again = preset_model("llama-tiny", 7);
    cr_assert_eq(model_add_adapters(&again, &a, 1, err), 0, "%s", err);
    cr_assert_neq(model_import_peft(&again, dir, err), 0);
    cr_assert(strstr(err, "Fed-SB") && strstr(err, "B·R·A"), "%s", err);
    free(want), free(got), free(base);
    model_free(&m), model_free(&plain), model_free(&merged), model_free(&bare);
    harness_rmtree(dir);
    free(dir);
}

/* Every rule starts as a no-op: B zero (fedit, ffa) or R zero (fedsb), so
 * the adapted model's logits are its base's, bit for bit */
Test(adapters, every_rule_starts_with_the_base_logits_bit_for_bit) {
    int ctx[7] = {3, 1, 4, 1, 5, 9, 2};
    for (int rule = 0; rule < LORA_RULE_COUNT; rule++) {
        Model m = preset_model("llama-tiny", 7);
        for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.05f * urand();
        float *base = malloc(m.cfg.Vp * 4), *adapted = malloc(m.cfg.Vp * 4);
        model_next_logits(&m, ctx, 7, base);
        AdapterConfig a = {.rank = 4, .alpha = 8, .targets = LORA_ALL, .rule = rule, .a_seed = 2};
        char err[ERR_LEN];
        cr_assert_eq(model_add_adapters(&m, &a, 11, err), 0, "%s", err);
        model_next_logits(&m, ctx, 7, adapted);
        cr_assert_eq(memcmp(base, adapted, m.cfg.V * 4), 0, "%s: not the base's logits",
                     model_lora_rule_name(rule));
        free(base), free(adapted);
        model_free(&m);
    }
}

Test(adapters, start_as_a_no_op_and_leave_the_base_as_it_was, .timeout = 120) {
    Model m = preset_model("llama-tiny", 7);
    int B = 2, T = 16, in[32], tg[32];
    for (int i = 0; i < B * T; i++) in[i] = (i * 37) % 256, tg[i] = (i * 91 + 5) % 256;
    float before = model_forward(&m, in, tg, B, T);
    size_t n_base = m.n_params;
    AdapterConfig a = {.rank = 8, .alpha = 16, .targets = LORA_Q | LORA_V};
    char err[ERR_LEN];
    cr_assert_eq(model_add_adapters(&m, &a, 3, err), 0, "%s", err);
    uint64_t fp = m.cfg.lora.base;
    cr_assert_eq(fp, model_base_fingerprint(&m));
    cr_assert_eq(m.n_base, n_base);
    /* PEFT's q and v at rank 8: A (8, 64) and B (64, 8) for q, B (32, 8) for v */
    cr_assert_eq(m.n_params, (size_t)m.cfg.L * (8 * 64 + 64 * 8 + 8 * 64 + 32 * 8));
    const ParamView *qa = model_view(&m, "h.0.attn.q.lora_A"),
                    *vb = model_view(&m, "h.1.attn.v.lora_B");
    cr_assert(qa && vb && qa->shape[0] == 8 && qa->shape[1] == 64 && vb->shape[0] == 32 &&
              vb->shape[1] == 8);
    float after = model_forward(&m, in, tg, B, T);
    cr_assert_eq(after, before, "B is zero: the adapted model computes what the base did");
    TrainConfig tc = train_defaults(1e-2f, 20);
    for (int s = 0; s < 20; s++) {
        model_forward(&m, in, tg, B, T);
        model_zero_grad(&m);
        model_backward(&m);
        model_adamw_step(&m, &tc.adamw, 1e-2f);
    }
    float trained = model_forward(&m, in, tg, B, T);
    cr_assert_lt(trained, before - 0.1f, "the adapters learn the batch: %f from %f", trained,
                 before);
    cr_assert_eq(model_base_fingerprint(&m), fp, "the base is frozen");
    model_free(&m);
}

/* ---- the adapters' dropout ---- */

/* The op: a fraction p of the values dropped, the rest scaled by
 * 1 / (1 - p), the same mask from the same seed, another from another; p
 * 0 an identity; accumulate adds. */
Test(adapters, dropout_drops_its_fraction_and_keeps_the_mean) {
    size_t n = 1u << 20;
    float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] = 1.0f;
    ops_cpu.dropout(y, x, 0.25f, 77, n, 0, NULL);
    size_t dropped = 0;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(y[i] == 0.0f || y[i] == 1.0f / 0.75f, "y[%zu] = %g", i, y[i]);
        dropped += y[i] == 0.0f, sum += y[i];
    }
    /* binomial: its standard deviation is 0.0004 of n here */
    cr_assert(fabs((double)dropped / n - 0.25) < 0.003, "%zu of %zu dropped", dropped, n);
    cr_assert(fabs(sum / n - 1) < 0.005, "mean %g", sum / n);
    ops_cpu.dropout(z, x, 0.25f, 77, n, 0, NULL);
    cr_assert_eq(memcmp(y, z, n * 4), 0, "the same seed draws the same mask");
    ops_cpu.dropout(z, x, 0.25f, 78, n, 0, NULL);
    size_t same = 0;
    for (size_t i = 0; i < n; i++) same += (y[i] == 0) == (z[i] == 0);
    cr_assert(same < n * 0.7, "another seed, another mask (%zu of %zu alike)", same, n);
    ops_cpu.dropout(z, x, 0.0f, 78, n, 0, NULL);
    cr_assert_eq(memcmp(x, z, n * 4), 0, "p 0 keeps every value as it is");
    memcpy(z, x, n * 4);
    ops_cpu.dropout(z, x, 0.25f, 77, n, 1, NULL);
    for (size_t i = 0; i < n; i++) cr_assert_eq(z[i], 1.0f + y[i], "accumulate adds");
    free(x), free(y), free(z);
}

/* The whole model with dropout on every adapter, one step's masks held
 * (drop_seed fixed): every trained gradient against finite differences of
 * that loss, so the backward draws the forward's masks and scales by
 * them; a pass with no seed is the model without dropout, to the bit. */
Test(adapters, with_dropout_every_gradient_matches_finite_differences, .timeout = 180) {
    Model m = preset_model("llama-tiny", 7);
    for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.05f * urand();
    AdapterConfig a = {.rank = 4, .alpha = 8, .targets = LORA_ALL, .dropout = 0.3f};
    char err[ERR_LEN];
    cr_assert_eq(model_add_adapters(&m, &a, 11, err), 0, "%s", err);
    /* B nonzero, and larger than in the test above, so that the paths
     * dropout thins still carry derivatives the float loss resolves
     * (at 0.1, A's of h.1's k gave 3e-4, at the loss's resolution; at
     * 0.4 the loss curves within the difference's step) */
    for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.2f * urand();
    int B = 2, T = 8, in[16], tg[16];
    for (int i = 0; i < B * T; i++) in[i] = (i * 37) % 256, tg[i] = (i * 91 + 5) % 256;
    float plain = model_forward(&m, in, tg, B, T);
    Model same = preset_model("llama-tiny", 7);
    for (size_t i = 0; i < same.n_params; i++) same.params[i] = m.base[i];
    a.dropout = 0;
    cr_assert_eq(model_add_adapters(&same, &a, 11, err), 0, "%s", err);
    memcpy(same.params, m.params, m.n_params * 4);
    cr_assert_eq(model_forward(&same, in, tg, B, T), plain,
                 "outside training, dropout changes nothing");
    model_free(&same);
    m.drop_seed = 0x5eed;
    float dropped = model_forward(&m, in, tg, B, T);
    cr_assert_neq(dropped, plain, "a training pass drops some of the adapters' input");
    every_tensor_gradient(&m);
    m.drop_seed = 0x5eee;
    cr_assert_neq(model_forward(&m, in, tg, B, T), dropped, "another step, other masks");
    model_free(&m);
}

/* A trainer's step draws its own masks (from its seed and the step) and
 * leaves the model's passes without them: the evaluation after it scores
 * the model itself. */
Test(adapters, a_training_step_drops_and_the_evaluation_after_it_does_not) {
    Model m = preset_model("llama-tiny", 7);
    AdapterConfig a = {.rank = 4, .alpha = 8, .targets = LORA_Q | LORA_V, .dropout = 0.5f};
    char err[ERR_LEN];
    cr_assert_eq(model_add_adapters(&m, &a, 11, err), 0, "%s", err);
    int B = 2, T = 16, in[32], tg[32];
    for (int i = 0; i < B * T; i++) in[i] = (i * 37) % 256, tg[i] = (i * 91 + 5) % 256;
    TrainConfig tc = train_defaults(1e-2f, 30);
    tc.seed = 9;
    Trainer *t = trainer_create(&m, &tc, 0, B, T, err);
    cr_assert_not_null(t, "%s", err);
    float first = model_forward(&m, in, tg, B, T), last = first;
    for (int s = 0; s < 30; s++) {
        trainer_step(t, in, tg, 1e-2f, NULL);
        cr_assert_eq(m.drop_seed, 0, "the step left its masks behind");
    }
    last = model_forward(&m, in, tg, B, T);
    cr_assert_eq(model_forward(&m, in, tg, B, T), last, "an evaluation draws no masks");
    cr_assert_lt(last, first - 0.1f, "the adapters learn the batch under dropout: %f from %f", last,
                 first);
    /* B is not zero now: a step's loss, on these same weights, is the
     * dropped model's */
    float step = trainer_step(t, in, tg, 1e-2f, NULL);
    cr_assert_neq(step, last, "the step's forward dropped nothing (%f)", step);
    trainer_free(t);
    model_free(&m);
}

Test(adapters, what_the_configuration_claims_is_checked) {
    ModelConfig c;
    char err[ERR_LEN];
    cr_assert_eq(model_config_preset("llama-tiny", &c), 0);
    c.lora = (AdapterConfig){.rank = 8, .alpha = 16, .targets = LORA_Q | LORA_V, .base = 0x1234};
    char *json = model_config_json(&c);
    ModelConfig back;
    cr_assert_eq(model_config_parse(json, strlen(json), &back, err), 0, "%s: %s", json, err);
    cr_assert(back.lora.rank == 8 && back.lora.alpha == 16 &&
              back.lora.targets == (LORA_Q | LORA_V) && back.lora.base == 0x1234 &&
              back.lora.dropout == 0);
    free(json);
    c.lora.dropout = 0.05f; /* PEFT's lora_dropout, read back as the same float */
    json = model_config_json(&c);
    cr_assert_eq(model_config_parse(json, strlen(json), &back, err), 0, "%s: %s", json, err);
    cr_assert_eq(back.lora.dropout, 0.05f, "%s", json);
    free(json);
    const char *bad[] = {
        "{\"arch\":\"llama\",\"L\":2,\"C\":64,\"NH\":4,\"T\":64,\"V\":256,\"NKV\":2,\"HD\":16,"
        "\"F\":176,\"eps\":1e-5,\"rope_theta\":10000,\"lora\":{\"rank\":0,\"alpha\":1,"
        "\"targets\":\"q\",\"base\":\"0000000000000001\"}}",
        "{\"arch\":\"llama\",\"L\":2,\"C\":64,\"NH\":4,\"T\":64,\"V\":256,\"NKV\":2,\"HD\":16,"
        "\"F\":176,\"eps\":1e-5,\"rope_theta\":10000,\"lora\":{\"rank\":4,\"alpha\":-1,"
        "\"targets\":\"q\",\"base\":\"0000000000000001\"}}",
        "{\"arch\":\"llama\",\"L\":2,\"C\":64,\"NH\":4,\"T\":64,\"V\":256,\"NKV\":2,\"HD\":16,"
        "\"F\":176,\"eps\":1e-5,\"rope_theta\":10000,\"lora\":{\"rank\":4,\"alpha\":8,"
        "\"targets\":\"q,lm_head\",\"base\":\"0000000000000001\"}}",
        "{\"arch\":\"llama\",\"L\":2,\"C\":64,\"NH\":4,\"T\":64,\"V\":256,\"NKV\":2,\"HD\":16,"
        "\"F\":176,\"eps\":1e-5,\"rope_theta\":10000,\"lora\":{\"rank\":4,\"alpha\":8,"
        "\"targets\":\"q\",\"base\":\"0000000000000001\",\"dropout\":1}}",
        "{\"arch\":\"llama\",\"L\":2,\"C\":64,\"NH\":4,\"T\":64,\"V\":256,\"NKV\":2,\"HD\":16,"
        "\"F\":176,\"eps\":1e-5,\"rope_theta\":10000,\"lora\":{\"rank\":4,\"alpha\":8,"
        "\"targets\":\"q\",\"base\":\"0000000000000001\",\"use_dora\":true}}",
        "{\"L\":2,\"C\":64,\"NH\":2,\"T\":64,\"V\":256,\"lora\":{\"rank\":4,\"alpha\":8,"
        "\"targets\":\"q\",\"base\":\"0000000000000001\"}}",
    };
    const char *says[] = {"rank", "alpha", "lm_head", "dropout", "use_dora", "Llama family"};
    for (int i = 0; i < 6; i++) {
        err[0] = '\0';
        cr_assert_neq(model_config_parse(bad[i], strlen(bad[i]), &back, err), 0, "%s", bad[i]);
        cr_assert(strstr(err, says[i]), "%s: %s (should name %s)", bad[i], err, says[i]);
    }
    /* and a GPT-2 takes none */
    Model g = tiny(1);
    AdapterConfig a = {.rank = 4, .alpha = 8, .targets = LORA_Q};
    cr_assert_neq(model_add_adapters(&g, &a, 1, err), 0);
    cr_assert(strstr(err, "Llama family"), "%s", err);
    model_free(&g);
}

/* The rule travels in the configuration (a checkpoint's metadata, Hello):
 * ffa and fedit as they always did (a_seed present or not, no other
 * key), fedsb by name, which a strait that does not know it refuses as
 * a field it does not know; whatever else a peer claims is refused. */
Test(adapters, the_rule_reads_back_and_what_a_peer_claims_of_it_is_checked) {
    ModelConfig c, back;
    char err[ERR_LEN];
    cr_assert_eq(model_config_preset("llama-tiny", &c), 0);
    for (int rule = 0; rule < LORA_RULE_COUNT; rule++) {
        c.lora = (AdapterConfig){.rank = 4,
                                 .alpha = 4,
                                 .targets = LORA_Q,
                                 .base = 0x99,
                                 .base_seed = -1,
                                 .rule = rule,
                                 .a_seed = 77};
        char *json = model_config_json(&c);
        cr_assert_eq(model_config_parse(json, strlen(json), &back, err), 0, "%s: %s", json, err);
        cr_assert_eq(back.lora.rule, rule, "%s", json);
        cr_assert_eq(back.lora.a_seed, rule == LORA_RULE_FEDIT ? 0u : 77u, "%s", json);
        cr_assert_eq(strstr(json, "\"rule\":\"fedsb\"") != NULL, rule == LORA_RULE_FEDSB, "%s",
                     json);
        cr_assert_eq(strstr(json, "\"rule\"") != NULL, rule == LORA_RULE_FEDSB, "%s", json);
        cr_assert_eq(strstr(json, "\"a_seed\":77") != NULL, rule != LORA_RULE_FEDIT, "%s", json);
        free(json);
    }
    const char *head = "{\"arch\":\"llama\",\"L\":2,\"C\":64,\"NH\":4,\"T\":64,\"V\":256,\"NKV\":2,"
                       "\"HD\":16,\"F\":176,\"eps\":1e-5,\"rope_theta\":10000,\"lora\":{\"rank\":4,"
                       "\"alpha\":8,\"targets\":\"q\",\"base\":\"0000000000000001\"";
    /* what checkpoints written before Fed-SB hold reads as it did */
    const char *old[] = {"}}", ",\"a_seed\":5}}"};
    for (int i = 0; i < 2; i++) {
        char text[512];
        snprintf(text, sizeof text, "%s%s", head, old[i]);
        cr_assert_eq(model_config_parse(text, strlen(text), &back, err), 0, "%s: %s", text, err);
        cr_assert_eq(back.lora.rule, i ? LORA_RULE_FFA : LORA_RULE_FEDIT);
        cr_assert_eq(back.lora.a_seed, i ? 5u : 0u);
    }
    const char *bad[] = {",\"rule\":\"fedex\",\"a_seed\":5}}", ",\"rule\":\"fedsb\"}}",
                         ",\"rule\":\"fedit\",\"a_seed\":5}}", ",\"rule\":2,\"a_seed\":5}}",
                         ",\"rule\":\"fedsb\",\"a_seed\":-1}}"};
    const char *says[] = {"rule should be one of", "needs a_seed", "takes no a_seed",
                          "rule should be one of", "a_seed"};
    for (int i = 0; i < 5; i++) {
        char text[512];
        snprintf(text, sizeof text, "%s%s", head, bad[i]);
        err[0] = '\0';
        cr_assert_neq(model_config_parse(text, strlen(text), &back, err), 0, "%s", text);
        cr_assert(strstr(err, says[i]), "%s: %s (should say %s)", text, err, says[i]);
    }
    /* and the checks a configuration built in memory passes */
    const int rules[] = {-1, LORA_RULE_COUNT};
    for (int i = 0; i < 2; i++) {
        c.lora = (AdapterConfig){.rank = 4, .alpha = 4, .targets = LORA_Q, .rule = rules[i]};
        cr_assert_neq(model_config_check(&c, err), 0);
        cr_assert(strstr(err, "rule"), "%s", err);
    }
    c.lora = (AdapterConfig){.rank = 40, .alpha = 4, .targets = LORA_K, .rule = LORA_RULE_FEDSB};
    cr_assert_neq(model_config_check(&c, err), 0, "rank 40 on a 64 x 32 projection");
    cr_assert(strstr(err, "rank 40"), "%s", err);
    c.lora = (AdapterConfig){.rule = LORA_RULE_FEDSB};
    cr_assert_neq(model_config_check(&c, err), 0, "a rule without a rank");
}

Test(model, a_shape_from_outside_is_checked_before_anything_is_allocated) {
    ModelConfig c;
    char err[ERR_LEN];
    cr_assert_eq(model_config_shape(&c, "custom", 2, 64, 2, 64, 2257, err), 0, "%s", err);
    cr_assert_eq(c.Vp, 2304, "the vocabulary is padded to a multiple of 64");
    cr_assert_eq(model_config_shape(&c, "x", 2, 64, 3, 64, 300, err), -1, "64 channels, 3 heads");
    cr_assert_eq(model_config_shape(&c, "x", 0, 64, 2, 64, 300, err), -1);
    cr_assert_eq(model_config_shape(&c, "x", 2, 64, 2, 64, 1, err), -1);
    cr_assert_eq(model_config_shape(&c, "x", 2, 64, 2, 0, 300, err), -1);
    /* in range one by one, too large together: 96 layers of 12288 channels */
    cr_assert_eq(model_config_shape(&c, "x", 96, 12288, 96, 2048, 50257, err), -1);
    cr_assert_not_null(strstr(err, "billion"), "%s", err);
}

/* A description from outside (a coordinator's Hello, a checkpoint) is
 * checked field by field, and what it describes before anything exists. */
Test(model, a_description_from_outside_is_checked_field_by_field) {
    ModelConfig c, back;
    char err[ERR_LEN];
    cr_assert_eq(model_config_preset("llama-3.2-1b", &c), 0);
    char *text = model_config_json(&c);
    cr_assert_eq(model_config_parse(text, strlen(text), &back, err), 0, "%s", err);
    cr_assert_eq(memcmp(&back.rope, &c.rope, sizeof c.rope), 0, "rope scaling lost: %s", text);
    cr_assert_eq(back.NKV, 8);
    cr_assert_eq(back.tied, 1);
    free(text);
    static const struct {
        const char *json, *said;
    } bad[] = {
        {"{\"arch\":\"mamba\",\"L\":2,\"C\":64,\"NH\":4,\"T\":64,\"V\":256}", "mamba"},
        {"{\"arch\":\"llama\",\"L\":2,\"C\":64,\"NH\":4,\"T\":64,\"V\":256,\"NKV\":3,"
         "\"HD\":16,\"F\":128,\"eps\":1e-5,\"rope_theta\":10000}",
         "key/value heads"},
        {"{\"arch\":\"llama\",\"L\":2,\"C\":64,\"NH\":4,\"T\":64,\"V\":256,\"NKV\":2,"
         "\"HD\":15,\"F\":128,\"eps\":1e-5,\"rope_theta\":10000}",
         "head size 15"},
        {"{\"arch\":\"llama\",\"L\":2,\"C\":64,\"NH\":4,\"T\":64,\"V\":256,\"NKV\":2,"
         "\"HD\":16,\"F\":128,\"eps\":1e-5,\"rope_theta\":10000,\"rope_scaling\":"
         "{\"factor\":0.5,\"low_freq_factor\":1,\"high_freq_factor\":4,"
         "\"original_max_position_embeddings\":8}}",
         "rope_scaling"},
        {"{\"arch\":\"llama\",\"L\":256,\"C\":16384,\"NH\":128,\"T\":64,\"V\":256,"
         "\"NKV\":8,\"HD\":128,\"F\":65536,\"eps\":1e-5,\"rope_theta\":10000}",
         "billion"},
        {"{\"L\":2,\"C\":64,\"NH\":2,\"T\":64,\"V\":300,\"Vp\":300}", "pads"},
        {"{\"L\":2,\"C\":64,\"NH\":2,\"T\":64}", "V should be"},
        {"[1,2]", "not a JSON object"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        cr_assert_eq(model_config_parse(bad[k].json, strlen(bad[k].json), &back, err), -1,
                     "accepted %s", bad[k].json);
        cr_assert_not_null(strstr(err, bad[k].said), "%s: %s", bad[k].json, err);
    }
}

Test(model, the_table_hash_names_the_layout) {
    Model a = tiny(1), b = tiny(2);
    cr_assert_eq(a.table_hash, b.table_hash, "the seed must not change the table");
    ModelConfig small;
    model_config_preset("small", &small);
    Model c;
    cr_assert_eq(model_build(&c, &small, 1, NULL), 0);
    cr_assert_neq(a.table_hash, c.table_hash);
    cr_assert_eq(a.views[0].offset, 0);
    cr_assert_str_eq(a.views[a.n_views - 1].name, "ln_f.bias");
    cr_assert_eq(a.views[a.n_views - 1].offset + a.views[a.n_views - 1].numel, a.n_params);
    model_free(&a), model_free(&b), model_free(&c);
}

static void train_steps(Model *m, const int *in, const int *tg, int B, int T, int steps, float lr,
                        float *losses) {
    AdamWConfig o = {0.9f, 0.95f, 1e-8f, 0.0f};
    for (int s = 0; s < steps; s++) {
        float loss = model_forward(m, in, tg, B, T);
        if (losses) losses[s] = loss;
        model_zero_grad(m);
        model_backward(m);
        model_clip_grad_norm(m, 1.0f);
        model_adamw_step(m, &o, lr);
    }
}

Test(model, same_seed_same_threads_same_losses_bit_for_bit) {
    int B = 4, T = 32, in[128], tg[128];
    for (int i = 0; i < B * T; i++) in[i] = (i * 13) % 251, tg[i] = (i * 17 + 3) % 251;
    float l1[20], l2[20];
    Model a = tiny(99), b = tiny(99);
    cr_assert_eq(memcmp(a.params, b.params, a.n_params * 4), 0, "same seed, different init");
    train_steps(&a, in, tg, B, T, 20, 1e-3f, l1);
    train_steps(&b, in, tg, B, T, 20, 1e-3f, l2);
    cr_assert_eq(memcmp(l1, l2, sizeof l1), 0, "losses differ between identical runs");
    model_free(&a), model_free(&b);
}

/* one batch of 4 x 64 bytes of pangrams, the same at every step */
static void pangram_batch(int *in, int *tg) {
    const char *text = "the quick brown fox jumps over the lazy dog. pack my box with five dozen "
                       "liquor jugs. how vexingly quick daft zebras jump! ";
    size_t n = strlen(text);
    for (int i = 0; i < 256; i++) in[i] = (uint8_t)text[i % n], tg[i] = (uint8_t)text[(i + 1) % n];
}

Test(model, tiny_learns_a_repeated_batch, .timeout = 120) {
    int B = 4, T = 64, in[256], tg[256];
    pangram_batch(in, tg);
    Model m = tiny(3);
    float losses[300];
    train_steps(&m, in, tg, B, T, 300, 3e-3f, losses);
    cr_assert_gt(losses[0], 5.0f, "initial loss %g should be near ln 256", losses[0]);
    cr_assert_lt(losses[299], 1.0f, "loss after 300 steps is %g nats/byte", losses[299]);
    model_free(&m);
}

/* The small model on real text from Debian's fortunes: validation loss falls
 * from about ln 256 = 5.5 to below 3.0 nats per byte. */
Test(model, small_learns_real_text, .timeout = 180) {
    const char *paths[] = {"/usr/share/games/fortunes/fortunes",
                           "/usr/share/games/fortunes/literature",
                           "/usr/share/games/fortunes/wisdom"};
    TokenSet ts;
    char err[ERR_LEN];
    cr_assert_eq(tokens_load(&ts, paths, 3, err), 0, "%s (make deps installs fortunes)", err);
    TokenView train, val;
    tokens_split(&ts, 0.1, &train, &val);
    ModelConfig cfg;
    model_config_preset("small", &cfg);
    Model m;
    cr_assert_eq(model_build(&m, &cfg, 1, err), 0);
    int B = 8, T = 64;
    Loader tl, vl;
    cr_assert_eq(loader_init(&tl, train, B, T, 0, 1, 1, err), 0, "%s", err);
    cr_assert_eq(loader_init(&vl, val, B, T, 0, 1, 2, err), 0, "%s", err);
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    float val0 = 0, val1 = 0;
    for (int k = 0; k < 4; k++) {
        loader_next(&vl, in, tg);
        val0 += model_forward(&m, in, tg, B, T) / 4;
    }
    AdamWConfig o = {0.9f, 0.95f, 1e-8f, 0.1f};
    for (int s = 0; s < 250; s++) {
        loader_next(&tl, in, tg);
        model_forward(&m, in, tg, B, T);
        model_zero_grad(&m);
        model_backward(&m);
        model_clip_grad_norm(&m, 1.0f);
        model_adamw_step(&m, &o, lr_schedule(s, 250, 20, 3e-3f, 0.1f));
    }
    vl.pos = 0;
    for (int k = 0; k < 4; k++) {
        loader_next(&vl, in, tg);
        val1 += model_forward(&m, in, tg, B, T) / 4;
    }
    cr_assert_gt(val0, 5.0f, "initial validation loss %g", val0);
    cr_assert_lt(val1, 3.0f, "validation loss only fell from %g to %g", val0, val1);
    free(in), free(tg);
    model_free(&m);
    tokens_free(&ts);
}

/* ---- AdamW's moments in bf16 ---------------------------------------------------- */

/* What keeping the moments in bf16 costs: 4 bytes a parameter less, and the
 * same learning within a few percent on a repeated batch; the file keeps
 * them as they are, and a model of the other kind reads them converted. */
Test(model, bf16_moments_learn_as_fp32_ones_for_a_quarter_less_memory, .timeout = 180) {
    int B = 4, T = 64, in[256], tg[256];
    pangram_batch(in, tg);
    enum { STEPS = 40 }; /* still learning, not memorised: a loss above 1 */
    float l32[STEPS], l16[STEPS];
    Model a = preset_model("llama-tiny", 3), b = preset_model("llama-tiny", 3);
    b.moments_bf16 = 1;
    train_steps(&a, in, tg, B, T, STEPS, 1e-3f, l32);
    train_steps(&b, in, tg, B, T, STEPS, 1e-3f, l16);
    cr_assert_null(b.m, "fp32 moments were allocated beside the bf16 ones");
    cr_assert_not_null(b.mh);
    cr_assert_lt(l16[STEPS - 1], l16[0] - 2.0f, "bf16 moments did not learn: %g to %g", l16[0],
                 l16[STEPS - 1]);
    cr_assert_gt(l32[STEPS - 1], 1.0f, "memorised already: the comparison would say nothing");
    cr_assert_float_eq(l16[STEPS - 1], l32[STEPS - 1], 0.05f * l32[STEPS - 1],
                       "bf16 %g, fp32 %g after %d steps", l16[STEPS - 1], l32[STEPS - 1], STEPS);
    cr_log_info("llama-tiny after %d steps: loss %.4f with fp32 moments, %.4f with bf16", STEPS,
                l32[STEPS - 1], l16[STEPS - 1]);
    ModelConfig c = a.cfg;
    double saved = model_train_bytes(&c, 8, 64, 0, 0) - model_train_bytes(&c, 8, 64, 1, 0);
    cr_assert_float_eq(saved, 4.0 * (double)a.n_params, 1.0);
    /* the file keeps bf16 moments as they are; each kind reads the other's */
    char *dir = harness_tmpdir("bf16"), p16[700], p32[700], err[ERR_LEN];
    snprintf(p16, sizeof p16, "%s/m16.opt.safetensors", dir);
    snprintf(p32, sizeof p32, "%s/m32.opt.safetensors", dir);
    cr_assert_eq(model_save_optimizer(&b, p16, err), 0, "%s", err);
    cr_assert_eq(model_save_optimizer(&a, p32, err), 0, "%s", err);
    Model r16 = preset_model("llama-tiny", 1), r32 = preset_model("llama-tiny", 1);
    r16.moments_bf16 = 1;
    cr_assert_eq(model_load_optimizer(&r16, p16, err), 0, "%s", err);
    cr_assert_eq(memcmp(r16.mh, b.mh, b.n_params * 2), 0, "bf16 moments changed in the file");
    cr_assert_eq(memcmp(r16.vh, b.vh, b.n_params * 2), 0);
    cr_assert_eq(r16.step, STEPS);
    cr_assert_eq(model_load_optimizer(&r32, p16, err), 0, "%s", err); /* widened, exactly */
    for (size_t i = 0; i < b.n_params; i++) {
        uint32_t u = (uint32_t)b.mh[i] << 16;
        float want;
        memcpy(&want, &u, 4);
        cr_assert_eq(memcmp(&r32.m[i], &want, 4), 0, "moment %zu", i);
    }
    cr_assert_eq(model_load_optimizer(&r16, p32, err), 0, "%s", err); /* rounded to nearest */
    for (size_t i = 0; i < a.n_params; i += 97) {
        uint32_t u = (uint32_t)r16.vh[i] << 16;
        float got;
        memcpy(&got, &u, 4);
        cr_assert_float_eq(got, a.v[i], 4e-3f * fabsf(a.v[i]) + 1e-38f, "v[%zu]", i);
    }
    model_free(&a), model_free(&b), model_free(&r16), model_free(&r32);
    harness_rmtree(dir);
    free(dir);
}

/* ---- recomputed activations ------------------------------------------------------ */

/* case k of the recompute test at a level: a GPT-2, a Llama, a Qwen2 (its
 * q, k, v biases) of three layers; adapters on every projection with
 * dropout; GPT-2 with bf16 products where the chip has them */
static Model recompute_case(int k, int level) {
    static const char *const presets[] = {"tiny", "llama-tiny", "qwen2-tiny", "llama-tiny", "tiny"};
    ModelConfig cfg;
    cr_assert_eq(model_config_preset(presets[k], &cfg), 0);
    cfg.L = 3;
    Model m;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&m, &cfg, 5, err), 0, "%s", err);
    if (k == 3) {
        AdapterConfig a = {.rank = 4, .alpha = 8, .targets = LORA_ALL, .dropout = 0.2f};
        cr_assert_eq(model_add_adapters(&m, &a, 11, err), 0, "%s", err);
        for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.05f * urand(); /* B nonzero */
        m.drop_seed = 0x5eed;
    }
    m.precision_bf16 = k == 4;
    m.recompute = level;
    return m;
}

/* Every level of recomputation trains the same steps to the bit, each
 * holding less: the MLP's activation once instead of once a layer, then
 * the norms' outputs too. A backward that
 * read a recomputed activation without computing it again would read the
 * last layer's. */
Test(model, recomputed_activations_train_the_same_steps_bit_for_bit_in_less_memory,
     .timeout = 120) {
    int B = 2, T = 32, in[64], tg[64];
    for (int i = 0; i < B * T; i++) in[i] = (i * 37 + 1) % 251, tg[i] = (i * 53 + 9) % 251;
    const char *names[] = {"gpt2", "llama", "qwen2", "llama with adapters", "gpt2, bf16 products"};
    for (int k = 0; k < 5; k++) {
        if (k == 4 && !bf16_units()) continue; /* --precision bf16 refuses such a chip */
        enum { STEPS = 4 };
        float want[STEPS], got[STEPS];
        uint64_t rs0 = rs; /* the adapters' values drawn again for each level */
        Model ref = recompute_case(k, MODEL_RECOMPUTE_NONE);
        train_steps(&ref, in, tg, B, T, STEPS, 3e-3f, want);
        size_t len[MODEL_RECOMPUTE_MAX + 1] = {ref.lay.len};
        for (int level = 1; level <= MODEL_RECOMPUTE_MAX; level++) {
            rs = rs0;
            Model m = recompute_case(k, level);
            train_steps(&m, in, tg, B, T, STEPS, 3e-3f, got);
            cr_assert_eq(memcmp(want, got, sizeof want), 0, "%s, level %d: loss %.9g, not %.9g",
                         names[k], level, got[STEPS - 1], want[STEPS - 1]);
            cr_assert_eq(memcmp(ref.params, m.params, m.n_params * 4), 0,
                         "%s, level %d: other parameters", names[k], level);
            len[level] = m.lay.len;
            model_free(&m);
        }
        /* what each level holds once instead of once a layer */
        const ModelConfig *c = &ref.cfg;
        size_t BT = (size_t)B * T, act = k == 0 || k == 4 ? 4 * (size_t)c->C : (size_t)c->F;
        size_t norms = 2 * BT * (size_t)c->C;
        cr_assert_eq(len[0] - len[1], (size_t)(c->L - 1) * BT * act, "%s", names[k]);
        if (k == 0) /* GPT-2's whole layout at 0: attention's log-sum-exps, no T·T */
            cr_assert_eq(len[0], (size_t)c->L * (18 * BT * c->C + 4 * BT + (size_t)B * c->NH * T) +
                                     2 * BT * c->C + 4 * BT);
        cr_assert_eq(len[1] - len[2], (size_t)(c->L - 1) * norms, "%s", names[k]);
        cr_assert_eq(model_train_bytes(c, B, T, 0, 0) - model_train_bytes(c, B, T, 0, 2),
                     4.0 * (double)(len[0] - len[2]), "%s", names[k]);
        model_free(&ref);
    }
}

/* ---- checkpoints and shards ------------------------------------------------------ */

Test(checkpoint_file, round_trip_is_bit_exact_and_damage_is_refused) {
    char *dir = harness_tmpdir("ckpt"), path[700], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    Model a = tiny(5);
    int B = 2, T = 8, in[16], tg[16];
    for (int i = 0; i < 16; i++) in[i] = i, tg[i] = i + 1;
    train_steps(&a, in, tg, B, T, 2, 1e-3f, NULL);
    cr_assert_eq(model_save(&a, path, 2, err), 0, "%s", err);
    ModelConfig cfg;
    int step;
    cr_assert_eq(model_read_config(path, &cfg, &step, err), 0, "%s", err);
    cr_assert_eq(step, 2);
    cr_assert_eq(cfg.C, 64);
    Model b;
    cr_assert_eq(model_build(&b, &cfg, 0, err), 0);
    cr_assert_eq(model_load(&b, path, NULL, err), 0, "%s", err);
    cr_assert_eq(memcmp(a.params, b.params, a.n_params * 4), 0);
    char opt[720];
    snprintf(opt, sizeof opt, "%s/model.opt.safetensors", dir);
    cr_assert_eq(access(opt, F_OK), 0, "the optimizer state was not written");
    /* damage: a header length past the end, then a truncated tensor */
    char *data;
    size_t len;
    cr_assert_eq(file_read_all(path, 1 << 26, &data, &len, err), 0);
    uint64_t hl;
    memcpy(&hl, data, 8);
    uint64_t huge = len;
    memcpy(data, &huge, 8);
    char bad[720];
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    cr_assert_eq(file_write_atomic(bad, data, len, 0644, err), 0);
    cr_assert_eq(model_load(&b, bad, NULL, err), -1);
    cr_assert_not_null(strstr(err, "does not fit"), "%s", err);
    memcpy(data, &hl, 8);
    cr_assert_eq(file_write_atomic(bad, data, len - 100, 0644, err), 0);
    cr_assert_eq(model_load(&b, bad, NULL, err), -1);
    cr_assert_not_null(strstr(err, "do not fit"), "%s", err);
    /* a wrong dtype and a wrong shape, with the header edited in place */
    char *dt = strstr(data + 8, "\"F32\"");
    cr_assert_not_null(dt);
    memcpy(dt, "\"F16\"", 5);
    cr_assert_eq(file_write_atomic(bad, data, len, 0644, err), 0);
    cr_assert_eq(model_load(&b, bad, NULL, err), -1);
    cr_assert_not_null(strstr(err, "dtype F16"), "%s", err);
    free(data);
    ModelConfig small;
    model_config_preset("small", &small);
    Model c;
    model_build(&c, &small, 0, err);
    cr_assert_eq(model_load(&c, path, NULL, err), -1, "a tiny checkpoint loaded into small");
    cr_assert_not_null(strstr(err, "parameter table"), "%s", err);
    model_free(&a), model_free(&b), model_free(&c);
    harness_rmtree(dir);
    free(dir);
}

Test(shards, bin_round_trip_and_header_validation) {
    char *dir = harness_tmpdir("bin"), path[700], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/train.bin", dir);
    uint32_t toks[1000];
    TokenSet ts;
    const char *paths[] = {path};
    /* GPT-2's ids in llm.c's uint16 shard; Llama 3's (128 256 tokens) in version 2 */
    const uint32_t vocabs[2] = {50257, 128256};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 1000; i++) toks[i] = (uint32_t)(i * 50 % vocabs[k]) + (k ? 70000 : 0);
        cr_assert_eq(tokens_write_bin(path, toks, 1000, err), 0, "%s", err);
        char *head;
        size_t hl;
        cr_assert_eq(file_read_all(path, 1 << 20, &head, &hl, err), 0);
        int32_t version;
        memcpy(&version, head + 4, 4);
        cr_assert_eq(version, k ? 2 : 1, "ids up to %u in shard version %d", vocabs[k], version);
        cr_assert_eq(hl, 1024 + 1000 * (k ? 4 : 2));
        free(head);
        cr_assert_eq(tokens_load(&ts, paths, 1, err), 0, "%s", err);
        cr_assert_eq(ts.n, 1000);
        uint32_t top = 0;
        for (int i = 0; i < 1000; i++) top = toks[i] > top ? toks[i] : top;
        cr_assert_eq(ts.vocab, (int)top + 1, "the least vocabulary holding every id");
        cr_assert(ts.shards);
        cr_assert_eq(memcmp(ts.tokens, toks, sizeof toks), 0);
        tokens_free(&ts);
    }
    for (int i = 0; i < 1000; i++) toks[i] = (uint32_t)(i * 50 % 50257);
    cr_assert_eq(tokens_write_bin(path, toks, 1000, err), 0, "%s", err);
    char *data;
    size_t len;
    cr_assert_eq(file_read_all(path, 1 << 20, &data, &len, err), 0);
    int32_t bad_magic = 1234;
    memcpy(data, &bad_magic, 4);
    cr_assert_eq(file_write_atomic(path, data, len, 0644, err), 0);
    cr_assert_eq(tokens_load(&ts, paths, 1, err), -1);
    cr_assert_not_null(strstr(err, "not a token shard"), "%s", err);
    int32_t magic = 20240520, count = 999999;
    memcpy(data, &magic, 4);
    memcpy(data + 8, &count, 4);
    cr_assert_eq(file_write_atomic(path, data, len, 0644, err), 0);
    cr_assert_eq(tokens_load(&ts, paths, 1, err), -1);
    cr_assert_not_null(strstr(err, "999999 tokens"), "%s", err);
    free(data);
    harness_rmtree(dir);
    free(dir);
}

/* The held-out score: the mean loss over the first batches of the tokens,
 * the same tokens for every model; fewer batches when the text is short,
 * NAN when not even one fits. */
Test(model, eval_tokens_is_the_mean_loss_of_the_first_batches) {
    Model m = tiny(3);
    int B = 2, T = 16;
    uint32_t tokens[3 * 2 * 16 + 1];
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++)
        tokens[i] = (uint32_t)(i * 7 % 256);
    int in[2 * 16], tg[2 * 16];
    double want = 0;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < B * T; i++)
            in[i] = tokens[k * B * T + i], tg[i] = tokens[k * B * T + i + 1];
        want += model_forward(&m, in, tg, B, T);
    }
    TokenView v = {tokens, sizeof tokens / sizeof tokens[0]};
    cr_assert_float_eq(model_eval_tokens(&m, v, B, T, 3), want / 3, 1e-6);
    /* asked for more batches than fit: the three that do */
    cr_assert_float_eq(model_eval_tokens(&m, v, B, T, 50), want / 3, 1e-6);
    TokenView short_view = {tokens, (size_t)B * T}; /* one token short of a batch */
    cr_assert(isnan(model_eval_tokens(&m, short_view, B, T, 1)));
    /* a site scores through its trainer, on that trainer's (B, T) batches */
    TrainConfig c = train_defaults(1e-3f, 10);
    Trainer *t = trainer_create(&m, &c, 0, B, T, NULL);
    cr_assert_not_null(t);
    cr_assert_eq(trainer_eval_tokens(t, v, 3), model_eval_tokens(&m, v, B, T, 3));
    trainer_free(t);
    model_free(&m);
}

/* The sampler: greedy is the argmax; at temperature 1 the draws follow the
 * softmax (logits 0 and ln 3: the second three times in four), the same
 * seed draws the same ids, and ids past `usable` never come out. */
Test(model, the_sampler_draws_from_the_softmax_and_is_seeded) {
    float logits[4] = {0.0f, logf(3.0f), 50.0f, 50.0f};
    Sampler g;
    sampler_init(&g, 1, 0);
    cr_assert_eq(sampler_next(&g, logits, 2), 1);
    cr_assert_eq(sampler_next(&g, logits, 4), 2);
    Sampler a, b;
    sampler_init(&a, 7, 1.0f), sampler_init(&b, 7, 1.0f);
    int ones = 0, n = 20000;
    for (int i = 0; i < n; i++) {
        int x = sampler_next(&a, logits, 2);
        cr_assert(x == 0 || x == 1, "id %d is past the usable two", x);
        cr_assert_eq(x, sampler_next(&b, logits, 2), "draw %d differs under the same seed", i);
        ones += x;
    }
    double f = (double)ones / n; /* 0.75, sd 0.003 */
    cr_assert(fabs(f - 0.75) < 0.02, "id 1 drawn %.3f of the time, not 0.75", f);
}

/* A site's memory check counts a federation of adapters at what it holds:
 * the base (loaded in fp32, then held in bf16 beside the activations),
 * the adapters' training state, and the round's copies of what travels,
 * the adapters alone. A 12 GB site cannot fine-tune all
 * of Llama-3.2-1B (16 bytes a parameter) but does hold its LoRA. */
Test(adapters, a_site_holds_the_lora_of_a_model_it_could_not_train_whole) {
    ModelConfig c;
    cr_assert_eq(model_config_preset("llama-3.2-1b", &c), 0);
    SiteRunOptions o = {.batch = 4, .seq = 128, .max_memory = 12000000000ull};
    char err[ERR_LEN];
    cr_assert_neq(site_check_memory(&o, &c, err), 0, "a full fine-tune of 1.2B fits 12 GB?");
    cr_assert(strstr(err, "needs about"), "%s", err);
    double whole = model_train_bytes(&c, 4, 128, 0, 0), n = model_config_params(&c);
    c.lora = (AdapterConfig){.rank = 16,
                             .alpha = 32,
                             .targets = LORA_Q | LORA_V,
                             .rule = LORA_RULE_FFA,
                             .a_seed = 1,
                             .base_bf16 = 1};
    cr_assert_eq(site_check_memory(&o, &c, err), 0, "%s", err);
    /* the base loaded at 4 bytes a value, then held at 2 beside the
     * activations: far from 16 bytes a parameter */
    double lora = model_train_bytes(&c, 4, 128, 0, 0);
    cr_assert_geq(lora, 4.0 * n, "%.0f bytes: less than the loaded base", lora);
    cr_assert_lt(lora, whole / 3, "%.0f bytes of %.0f", lora, whole);
    c.lora.base_bf16 = 0; /* an fp32 base: 4 bytes a value beside the activations */
    cr_assert_gt(model_train_bytes(&c, 4, 128, 0, 0), lora);
}

/* ZeRO-1's parts in one process: AdamW on two models that keep the
 * moments of [0, s) and [s, n) (s a share boundary, inside a view) updates
 * those parts of the parameters to the same bits as the whole update, over
 * three steps with fp32 and with bf16 moments; and the norm's block sums,
 * taken share by share, add up to model_grad_norm's bits. */
Test(model, moments_kept_in_shares_update_as_the_whole_state) {
    for (int bf = 0; bf < 2; bf++) {
        Model whole = preset_model("llama-tiny", 3), part[2];
        size_t n = whole.n_params, s = 3 * MODEL_NORM_BLOCK;
        cr_assert_lt(s, n);
        for (int k = 0; k < 2; k++) {
            part[k] = preset_model("llama-tiny", 3);
            part[k].moments_lo = k ? s : 0, part[k].moments_hi = k ? n : s;
            part[k].moments_bf16 = bf;
        }
        whole.moments_bf16 = bf;
        AdamWConfig o = {0.9f, 0.95f, 1e-8f, 0.1f};
        for (int step = 0; step < 3; step++) {
            for (size_t i = 0; i < n; i++) whole.grads[i] = urand();
            for (int k = 0; k < 2; k++) memcpy(part[k].grads, whole.grads, n * sizeof(float));
            size_t blocks = (n + MODEL_NORM_BLOCK - 1) / MODEL_NORM_BLOCK;
            double *sums = malloc(blocks * sizeof(double)), total = 0;
            model_grad_sumsq(&part[0], 0, s, sums);
            model_grad_sumsq(&part[1], s, n, sums + s / MODEL_NORM_BLOCK);
            for (size_t b = 0; b < blocks; b++) total += sums[b];
            float norm = (float)sqrt(total), want = model_grad_norm(&whole);
            cr_assert_eq(memcmp(&norm, &want, sizeof norm), 0, "norm %.9g from shares, %.9g", norm,
                         want);
            free(sums);
            model_adamw_step_scaled(&whole, &o, 1e-2f, 0.5f);
            for (int k = 0; k < 2; k++) model_adamw_step_scaled(&part[k], &o, 1e-2f, 0.5f);
            cr_assert_eq(memcmp(part[0].params, whole.params, s * sizeof(float)), 0);
            cr_assert_eq(memcmp(part[1].params + s, whole.params + s, (n - s) * sizeof(float)), 0,
                         "bf16 moments %d, step %d: the second share differs", bf, step);
            /* each share's model moved its own part alone; the rest is the whole's next step */
            memcpy(part[0].params + s, whole.params + s, (n - s) * sizeof(float));
            memcpy(part[1].params, whole.params, s * sizeof(float));
        }
        model_free(&whole), model_free(&part[0]), model_free(&part[1]);
    }
}
