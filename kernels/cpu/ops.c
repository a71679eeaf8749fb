/*
 * ops.c — the CPU reference ops of the Model model, forward and backward, in
 * fp32 (after llm.c's train_gpt2.c). Matrix products go through OpenBLAS;
 * attention runs over batch × heads with OpenMP. Every backward op
 * accumulates (+=) into its gradient buffers, which the caller zeroes.
 *
 * Shapes use one vocabulary: B batch, T time, C channels, NH heads, HS =
 * C/NH, OC output channels. Row-major throughout. The Llama family's own
 * ops (RMSNorm, rotary embeddings, SwiGLU) are in ops_llama.c.
 *
 * Determinism: for a fixed thread count every op gives the same floats run
 * to run (OpenMP loops write disjoint outputs; BLAS is called with the same
 * shapes); results may differ in the last bits across thread counts.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/device.h"
#include "kernels/ops.h"
#include "util/util.h"

void openblas_set_num_threads(int num_threads); /* OpenBLAS's own, not in cblas.h */

/* ---- encoder: token + position embeddings ------------------------------ */

void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                     int C) {
    assert(B > 0 && T > 0 && C > 0 && inp && wte);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *we = wte + (size_t)inp[b * T + t] * C;
            const float *pe = wpe ? wpe + (size_t)t * C : NULL;
            if (wpe == NULL)
                memcpy(o, we, sizeof(float) * (size_t)C);
            else
                for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
        }
}

void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                      int C) {
    assert(B > 0 && T > 0 && C > 0 && inp && dwte);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            float *dw = dwte + (size_t)inp[b * T + t] * C;
            for (int i = 0; i < C; i++) dw[i] += d[i];
            if (dwpe == NULL) continue;
            float *dp = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) dp[i] += d[i];
        }
}

/* ---- layernorm --------------------------------------------------------- */

/* mean and rstd (B*T) are kept for the backward pass */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                       const float *bias, int N, int C) {
    assert(N > 0 && C > 0 && w && bias);
    const float eps = 1e-5f;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0;
        for (int i = 0; i < C; i++) m += x[i];
        m /= C;
        float v = 0;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= C;
        float s = 1.0f / sqrtf(v + eps);
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) o[i] = (s * (x[i] - m)) * w[i] + bias[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C) {
    assert(N > 0 && C > 0 && mean && rstd);
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * C, *x = inp + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], s = rstd[n], dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = w[i] * d[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = w[i] * d[i];
            db[i] += d[i];
            dw[i] += norm * d[i];
            dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
}

/* ---- matmul: out (N,OC) = inp (N,C) · weight (OC,C)ᵀ + bias ------------- */

/* OpenBLAS runs single-threaded (kernels_set_threads); these ops split their
 * products into blocks over OpenMP threads instead, so the two thread pools
 * never spin against each other. */
static int omp_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Each thread's sgemm packs the whole of the operand the split does not
 * cut, so the split cuts the larger one: by rows of the activations when
 * they outnumber the weight's rows, else by the weight's rows or columns
 * (at a site's short batches, B·T of a few hundred against a model's
 * thousands, the weight is the large one: cut by rows, every thread packed
 * all of it, and packing took as long as the products). On the golden
 * test's shapes at 2 threads the bits did not move; a split, like a thread
 * count, can change which of OpenBLAS's kernels runs a product, and with
 * it the last bits. */
void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                    int C, int OC) {
    assert(N > 0 && C > 0 && OC > 0 && out != inp);
    int parts = omp_threads(), by_rows = N >= OC;
    int len = by_rows ? N : OC, per = (len + parts - 1) / parts;
#pragma omp parallel for
    for (int p = 0; p < parts; p++) {
        int a = p * per, n = len - a < per ? len - a : per;
        if (n <= 0) continue;
        if (by_rows)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, OC, C, 1.0f,
                        inp + (size_t)a * C, C, weight, C, 0.0f, out + (size_t)a * OC, OC);
        else /* out[:, a:a+n] = inp · weight[a:a+n]ᵀ */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, n, C, 1.0f, inp, C,
                        weight + (size_t)a * C, C, 0.0f, out + a, OC);
        if (bias != NULL) {
            int r0 = by_rows ? a : 0, r1 = by_rows ? a + n : N, o0 = by_rows ? 0 : a,
                o1 = by_rows ? OC : a + n;
            for (int r = r0; r < r1; r++)
                for (int o = o0; o < o1; o++) out[(size_t)r * OC + o] += bias[o];
        }
    }
}

void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC) {
    assert(N > 0 && C > 0 && OC > 0 && dinp != dout);
    int parts = omp_threads(), per_o = (OC + parts - 1) / parts;
    int in_rows = N >= C, in_len = in_rows ? N : C, per_i = (in_len + parts - 1) / parts;
#pragma omp parallel for
    for (int p = 0; p < parts; p++) {
        /* dinp (N,C) += dout (N,OC) · weight (OC,C), by blocks of its rows or
         * of its columns (NULL: made elsewhere, as the bf16 ops make it) */
        int a = p * per_i, n = in_len - a < per_i ? in_len - a : per_i;
        if (n > 0 && dinp != NULL) {
            if (in_rows)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, OC, 1.0f,
                            dout + (size_t)a * OC, OC, weight, C, 1.0f, dinp + (size_t)a * C, C);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, n, OC, 1.0f, dout, OC,
                            weight + a, C, 1.0f, dinp + a, C);
        }
        /* dweight rows (OC,C) += doutᵀ · inp, by blocks of output channels */
        int o0 = p * per_o, ocs = OC - o0 < per_o ? OC - o0 : per_o;
        if (ocs > 0 && dweight != NULL) { /* NULL: frozen */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ocs, C, N, 1.0f, dout + o0, OC,
                        inp, C, 1.0f, dweight + (size_t)o0 * C, C);
            if (dbias != NULL)
                for (int o = o0; o < o0 + ocs; o++) {
                    float sum = 0;
                    for (int n2 = 0; n2 < N; n2++) sum += dout[(size_t)n2 * OC + o];
                    dbias[o] += sum;
                }
        }
    }
}

/* Whatever a command sets or forgets to set: every process that links the
 * ops starts with OpenBLAS single-threaded (run after OpenBLAS's own
 * initializer, a library this executable depends on). A command that used
 * the ops without kernels_set_threads — the demo's held-out score and its
 * sample — ran OpenBLAS's pool inside every OpenMP thread: on 16 cores the
 * demo's 240-token sample had not ended after 80 s. */
__attribute__((constructor)) static void blas_single_threaded(void) {
    openblas_set_num_threads(1);
}

void kernels_set_threads(int n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
    openblas_set_num_threads(1);
}

/* ---- causal self-attention ------------------------------------------------ */

/* By blocks of ATTN_ROWS query rows, per (batch, query head): a block's
 * scores against the keys up to its last row, q·kᵀ·scale (a BLAS call on
 * strided views), their causal softmax in place, out = p·v, and each row's
 * log-sum-exp kept; the (T,T) probabilities never are, and the keys after
 * a block's rows are not multiplied at all. The backward makes a block's
 * scores and softmax again with the same calls and loops, so its
 * probabilities are the forward's to the bit (at T <= ATTN_ROWS one block:
 * the products of a whole (T,T) matrix, as the op once kept). The threads
 * split (batch, key/value head): the query heads that share one run in one
 * thread, so their gradients into it never race; each thread's scratch is
 * a block's scores (forward), and its gradient beside them (backward). */
#define ATTN_ROWS 64

/* rows r of scores p (rows × n, row r query i0 + r): masked past the
 * query, softmaxed; lse[r] each row's log-sum-exp */
static void causal_softmax_rows(float *p, int rows, int n, int i0, float *lse) {
    for (int r = 0; r < rows; r++) {
        float *pr = p + (size_t)r * n, maxv = -INFINITY, sum = 0;
        int t = i0 + r;
        for (int j = 0; j <= t; j++) maxv = pr[j] > maxv ? pr[j] : maxv;
        for (int j = 0; j <= t; j++) {
            pr[j] = expf(pr[j] - maxv);
            sum += pr[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j <= t; j++) pr[j] *= inv;
        for (int j = t + 1; j < n; j++) pr[j] = 0.0f;
        if (lse) lse[r] = maxv + logf(sum);
    }
}

static void check_shape(const AttnShape *s) {
    assert(s->NKV > 0 && s->NH % s->NKV == 0 && s->HD > 0 && s->T > 0);
    assert(s->ldq >= s->NH * s->HD && s->ldkv >= s->NKV * s->HD);
    (void)s;
}

void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                       const AttnShape *s) {
    check_shape(s);
    int B = s->B, T = s->T, NH = s->NH, NKV = s->NKV, hs = s->HD, G = NH / NKV, C = NH * hs;
    int R = T < ATTN_ROWS ? T : ATTN_ROWS;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
    {
        float *sc = mallocCheck(sizeof(float) * (size_t)R * T);
#pragma omp for collapse(2)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < NKV; kh++)
                for (int j = 0; j < G; j++) {
                    int h = kh * G + j;
                    const float *qh = q + (size_t)b * T * s->ldq + h * hs;
                    const float *kk = k + (size_t)b * T * s->ldkv + kh * hs;
                    const float *vv = v + (size_t)b * T * s->ldkv + kh * hs;
                    float *o = out + (size_t)b * T * C + h * hs;
                    for (int i0 = 0; i0 < T; i0 += R) {
                        int rows = T - i0 < R ? T - i0 : R, n = i0 + rows; /* keys 0 .. n-1 */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, hs, scale,
                                    qh + (size_t)i0 * s->ldq, s->ldq, kk, s->ldkv, 0.0f, sc, n);
                        causal_softmax_rows(sc, rows, n, i0, lse + ((size_t)b * NH + h) * T + i0);
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, n, 1.0f,
                                    sc, n, vv, s->ldkv, 0.0f, o + (size_t)i0 * C, C);
                    }
                }
        free(sc);
    }
}

void attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                        const float *q, const float *k, const float *v, const float *out,
                        const float *lse, const AttnShape *s) {
    (void)scratch, (void)out, (void)lse; /* the probabilities come again from q and k */
    check_shape(s);
    int B = s->B, T = s->T, NH = s->NH, NKV = s->NKV, hs = s->HD, G = NH / NKV, C = NH * hs;
    int R = T < ATTN_ROWS ? T : ATTN_ROWS;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
    {
        float *a = mallocCheck(sizeof(float) * 2 * (size_t)R * T), *da = a + (size_t)R * T;
#pragma omp for collapse(2)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < NKV; kh++)
                for (int j = 0; j < G; j++) {
                    int h = kh * G + j;
                    size_t qo = (size_t)b * T * s->ldq + h * hs;
                    size_t ko = (size_t)b * T * s->ldkv + kh * hs;
                    const float *kk = k + ko, *vv = v + ko, *d = dout + (size_t)b * T * C + h * hs;
                    float *dkk = dk + ko, *dvv = dv + ko;
                    for (int i0 = 0; i0 < T; i0 += R) {
                        int rows = T - i0 < R ? T - i0 : R, n = i0 + rows;
                        const float *qb = q + qo + (size_t)i0 * s->ldq, *db = d + (size_t)i0 * C;
                        /* the forward's probabilities a (rows, n) again */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, hs, scale, qb,
                                    s->ldq, kk, s->ldkv, 0.0f, a, n);
                        causal_softmax_rows(a, rows, n, i0, NULL);
                        /* out = a · v:  da = d · vᵀ,  dv += aᵀ · d */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, hs, 1.0f, db,
                                    C, vv, s->ldkv, 0.0f, da, n);
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, 1.0f, a,
                                    n, db, C, 1.0f, dvv, s->ldkv);
                        /* softmax, row by row: da = a ⊙ (da − Σ a·da); masked entries 0 */
                        for (int r = 0; r < rows; r++) {
                            const float *ar = a + (size_t)r * n;
                            float *dar = da + (size_t)r * n, ada = 0;
                            int t = i0 + r;
                            for (int t2 = 0; t2 <= t; t2++) ada += ar[t2] * dar[t2];
                            for (int t2 = 0; t2 <= t; t2++) dar[t2] = ar[t2] * (dar[t2] - ada);
                            for (int t2 = t + 1; t2 < n; t2++) dar[t2] = 0.0f;
                        }
                        /* scores = q · kᵀ · scale:  dq += da · k · scale,  dk += daᵀ · q · scale */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, n, scale,
                                    da, n, kk, s->ldkv, 1.0f, dq + qo + (size_t)i0 * s->ldq,
                                    s->ldq);
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, scale, da,
                                    n, qb, s->ldq, 1.0f, dkk, s->ldkv);
                    }
                }
        free(a);
    }
}

/* ---- GELU (tanh approximation) and residual -------------------------------- */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* tanh through one expf, about three times cheaper than glibc's tanhf and
 * within 1e-7 of it; saturates to ±1 where expf overflows or vanishes. */
static inline float tanh_fast(float x) {
    return 1.0f - 2.0f / (expf(2.0f * x) + 1.0f);
}

void gelu_forward(float *out, const float *inp, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i], cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + tanh_fast(GELU_SCALE * (x + cube)));
    }
}

void gelu_backward(float *dinp, const float *inp, const float *dout, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i], cube = 0.044715f * x * x * x;
        float arg = GELU_SCALE * (x + cube), th = tanh_fast(arg);
        float sech2 = 1.0f - th * th;
        float grad =
            0.5f * (1.0f + th) + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += grad * dout[i];
    }
}

void residual_forward(float *out, const float *a, const float *b, size_t N) {
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

void residual_backward(float *da, float *db, const float *dout, size_t N) {
    for (size_t i = 0; i < N; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}
