/*
 * gpt.c — the GPT-2 style model's compute on the CPU ops (API: model.h):
 * forward and backward with the fused classifier, gradient clipping and
 * next-token logits. Activations are sized for the (B, T) of the first
 * forward and regrown if a larger one comes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/model.h"
#include "kernels/ops.h"
#include "util/util.h"

/* the views of one layer, by position in the table */
enum { LN1W, LN1B, QKVW, QKVB, APW, APB, LN2W, LN2B, FCW, FCB, FPW, FPB };
static float *lp(const GPT *m, float *base, int l, int which) {
    return base + m->views[2 + 12 * l + which].offset;
}

/* ---- activations --------------------------------------------------------------------- */

/* Offsets of each activation inside one buffer, for a (B, T). */
static void acts_layout(GPT *m, int B, int T) {
    const GPTConfig *c = &m->cfg;
    size_t BT = (size_t)B * T, C = (size_t)c->C, L = (size_t)c->L, NH = (size_t)c->NH;
    size_t off = 0;
#define A(field, n) m->a.field = off, off += (n)
    A(encoded, BT * C);
    A(ln1, L * BT * C);
    A(ln1_mean, L * BT);
    A(ln1_rstd, L * BT);
    A(qkv, L * BT * 3 * C);
    A(atty, L * BT * C);
    A(preatt, L * B * NH * T * T);
    A(att, L * B * NH * T * T);
    A(attproj, L * BT * C);
    A(residual2, L * BT * C);
    A(ln2, L * BT * C);
    A(ln2_mean, L * BT);
    A(ln2_rstd, L * BT);
    A(fch, L * BT * 4 * C);
    A(fch_gelu, L * BT * 4 * C);
    A(fcproj, L * BT * C);
    A(residual3, L * BT * C);
    A(lnf, BT * C);
    A(lnf_mean, BT);
    A(lnf_rstd, BT);
    A(losses, BT);
    A(lse, BT); /* each row's log-sum-exp of the logits, for the classifier's backward */
#undef A
    m->acts_len = off;
}

static void ensure_acts(GPT *m, int B, int T) {
    if (m->acts && B * T <= m->act_B * m->act_T && T <= m->act_T && B <= m->act_B) {
        acts_layout(m, B, T);
        return;
    }
    free(m->acts), free(m->dacts), free(m->inputs), free(m->targets);
    acts_layout(m, B, T);
    m->acts = mallocCheck(m->acts_len * sizeof(float));
    m->dacts = mallocCheck(m->acts_len * sizeof(float));
    m->inputs = mallocCheck((size_t)B * T * sizeof(int));
    m->targets = mallocCheck((size_t)B * T * sizeof(int));
    m->act_B = B, m->act_T = T;
}

/* ---- forward and backward --------------------------------------------------------------- */

float gpt_forward(GPT *m, const int *inputs, const int *targets, int B, int T) {
    const GPTConfig *c = &m->cfg;
    if (T > c->T) DIE("sequence of %d tokens is longer than the model's %d", T, c->T);
    ensure_acts(m, B, T);
    int C = c->C, NH = c->NH, L = c->L, BT = B * T;
    memcpy(m->inputs, inputs, sizeof(int) * (size_t)BT);
    for (int i = 0; i < BT; i++)
        if (inputs[i] < 0 || inputs[i] >= c->V) DIE("token %d outside the vocabulary", inputs[i]);
    float *a = m->acts, *p = m->params;
    size_t sBTC = (size_t)BT * C, sBT = (size_t)BT, sATT = (size_t)B * NH * T * T;
    encoder_forward(a + m->a.encoded, inputs, p + m->views[0].offset, p + m->views[1].offset, B, T,
                    C);
    for (int l = 0; l < L; l++) {
        float *residual = l == 0 ? a + m->a.encoded : a + m->a.residual3 + (l - 1) * sBTC;
        float *ln1 = a + m->a.ln1 + l * sBTC, *qkv = a + m->a.qkv + l * 3 * sBTC;
        float *atty = a + m->a.atty + l * sBTC, *attproj = a + m->a.attproj + l * sBTC;
        float *res2 = a + m->a.residual2 + l * sBTC, *ln2 = a + m->a.ln2 + l * sBTC;
        float *fch = a + m->a.fch + l * 4 * sBTC, *fchg = a + m->a.fch_gelu + l * 4 * sBTC;
        float *fcproj = a + m->a.fcproj + l * sBTC, *res3 = a + m->a.residual3 + l * sBTC;
        layernorm_forward(ln1, a + m->a.ln1_mean + l * sBT, a + m->a.ln1_rstd + l * sBT, residual,
                          lp(m, p, l, LN1W), lp(m, p, l, LN1B), BT, C);
        matmul_forward(qkv, ln1, lp(m, p, l, QKVW), lp(m, p, l, QKVB), BT, C, 3 * C);
        attention_forward(atty, a + m->a.preatt + l * sATT, a + m->a.att + l * sATT, qkv, B, T, C,
                          NH);
        matmul_forward(attproj, atty, lp(m, p, l, APW), lp(m, p, l, APB), BT, C, C);
        residual_forward(res2, residual, attproj, sBTC);
        layernorm_forward(ln2, a + m->a.ln2_mean + l * sBT, a + m->a.ln2_rstd + l * sBT, res2,
                          lp(m, p, l, LN2W), lp(m, p, l, LN2B), BT, C);
        matmul_forward(fch, ln2, lp(m, p, l, FCW), lp(m, p, l, FCB), BT, C, 4 * C);
        gelu_forward(fchg, fch, 4 * sBTC);
        matmul_forward(fcproj, fchg, lp(m, p, l, FPW), lp(m, p, l, FPB), BT, 4 * C, C);
        residual_forward(res3, res2, fcproj, sBTC);
    }
    const ParamView *lnfw = &m->views[m->n_views - 2], *lnfb = &m->views[m->n_views - 1];
    layernorm_forward(a + m->a.lnf, a + m->a.lnf_mean, a + m->a.lnf_rstd,
                      a + m->a.residual3 + (L - 1) * sBTC, p + lnfw->offset, p + lnfb->offset, BT,
                      C);
    m->fwd_B = B, m->fwd_T = T, m->has_targets = targets != NULL;
    if (targets == NULL) return -1.0f;
    memcpy(m->targets, targets, sizeof(int) * (size_t)BT);
    m->loss = classifier_forward(a + m->a.losses, a + m->a.lse, a + m->a.lnf,
                                 p + m->views[0].offset, targets, BT, C, c->V);
    return m->loss;
}

void gpt_zero_grad(GPT *m) {
    memset(m->grads, 0, m->n_params * sizeof(float));
}

void gpt_backward(GPT *m) {
    if (!m->has_targets) DIE("backward needs a forward with targets");
    const GPTConfig *c = &m->cfg;
    int B = m->fwd_B, T = m->fwd_T, C = c->C, NH = c->NH, L = c->L, BT = B * T;
    float *a = m->acts, *d = m->dacts, *p = m->params, *g = m->grads;
    size_t sBTC = (size_t)BT * C, sBT = (size_t)BT, sATT = (size_t)B * NH * T * T;
    memset(d, 0, m->acts_len * sizeof(float));
    classifier_backward(d + m->a.lnf, g + m->views[0].offset, a + m->a.lnf, p + m->views[0].offset,
                        m->targets, a + m->a.lse, BT, C, c->V);
    const ParamView *lnfw = &m->views[m->n_views - 2], *lnfb = &m->views[m->n_views - 1];
    layernorm_backward(d + m->a.residual3 + (L - 1) * sBTC, g + lnfw->offset, g + lnfb->offset,
                       d + m->a.lnf, a + m->a.residual3 + (L - 1) * sBTC, p + lnfw->offset,
                       a + m->a.lnf_mean, a + m->a.lnf_rstd, BT, C);
    for (int l = L - 1; l >= 0; l--) {
        float *residual = l == 0 ? a + m->a.encoded : a + m->a.residual3 + (l - 1) * sBTC;
        float *dresidual = l == 0 ? d + m->a.encoded : d + m->a.residual3 + (l - 1) * sBTC;
#define ACT(f, mult)  (a + m->a.f + l * (mult)*sBTC)
#define DACT(f, mult) (d + m->a.f + l * (mult)*sBTC)
        residual_backward(DACT(residual2, 1), DACT(fcproj, 1), DACT(residual3, 1), sBTC);
        matmul_backward(DACT(fch_gelu, 4), lp(m, g, l, FPW), lp(m, g, l, FPB), DACT(fcproj, 1),
                        ACT(fch_gelu, 4), lp(m, p, l, FPW), BT, 4 * C, C);
        gelu_backward(DACT(fch, 4), ACT(fch, 4), DACT(fch_gelu, 4), 4 * sBTC);
        matmul_backward(DACT(ln2, 1), lp(m, g, l, FCW), lp(m, g, l, FCB), DACT(fch, 4), ACT(ln2, 1),
                        lp(m, p, l, FCW), BT, C, 4 * C);
        layernorm_backward(DACT(residual2, 1), lp(m, g, l, LN2W), lp(m, g, l, LN2B), DACT(ln2, 1),
                           ACT(residual2, 1), lp(m, p, l, LN2W), a + m->a.ln2_mean + l * sBT,
                           a + m->a.ln2_rstd + l * sBT, BT, C);
        residual_backward(dresidual, DACT(attproj, 1), DACT(residual2, 1), sBTC);
        matmul_backward(DACT(atty, 1), lp(m, g, l, APW), lp(m, g, l, APB), DACT(attproj, 1),
                        ACT(atty, 1), lp(m, p, l, APW), BT, C, C);
        attention_backward(DACT(qkv, 3), d + m->a.preatt + l * sATT, d + m->a.att + l * sATT,
                           DACT(atty, 1), ACT(qkv, 3), a + m->a.att + l * sATT, B, T, C, NH);
        matmul_backward(DACT(ln1, 1), lp(m, g, l, QKVW), lp(m, g, l, QKVB), DACT(qkv, 3),
                        ACT(ln1, 1), lp(m, p, l, QKVW), BT, C, 3 * C);
        layernorm_backward(dresidual, lp(m, g, l, LN1W), lp(m, g, l, LN1B), DACT(ln1, 1), residual,
                           lp(m, p, l, LN1W), a + m->a.ln1_mean + l * sBT,
                           a + m->a.ln1_rstd + l * sBT, BT, C);
#undef ACT
#undef DACT
    }
    encoder_backward(g + m->views[0].offset, g + m->views[1].offset, d + m->a.encoded, m->inputs, B,
                     T, C);
}

/* ---- optimisation ---------------------------------------------------------------------- */

float gpt_grad_norm(const GPT *m) {
    /* blocks summed in float over 8 lanes (vectorised), the blocks in
     * double: the threads split the blocks, so the order of the sum is
     * fixed for a given thread count */
    enum { BLOCK = 4096 };
    const float *g = m->grads;
    size_t n = m->n_params, blocks = (n + BLOCK - 1) / BLOCK;
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (size_t b = 0; b < blocks; b++) {
        size_t i = b * BLOCK, end = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
        float lane[8] = {0};
        for (; i + 8 <= end; i += 8)
            for (int k = 0; k < 8; k++) lane[k] += g[i + k] * g[i + k];
        float part = 0;
        for (; i < end; i++) part += g[i] * g[i];
        for (int k = 0; k < 8; k++) part += lane[k];
        s += part;
    }
    return (float)sqrt(s);
}

float gpt_clip_grad_norm(GPT *m, float max_norm) {
    float norm = gpt_grad_norm(m);
    if (max_norm > 0 && norm > max_norm) {
        float scale = max_norm / norm, *g = m->grads;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < m->n_params; i++) g[i] *= scale;
    }
    return norm;
}

void gpt_next_logits(GPT *m, const int *ctx, int n, float *logits) {
    int T = n < m->cfg.T ? n : m->cfg.T;
    const int *start = ctx + (n - T);
    gpt_forward(m, start, NULL, 1, T);
    const float *h = m->acts + m->a.lnf + (size_t)(T - 1) * m->cfg.C;
    classifier_logits(logits, h, m->params + m->views[0].offset, m->cfg.C, m->cfg.V);
}
