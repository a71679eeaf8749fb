/*
 * gpt.c — the GPT-2 style model on the CPU ops: presets, the parameter
 * table (one contiguous buffer of named views, which checkpoints, codecs and
 * aggregation all walk), seeded initialisation, forward and backward with
 * the fused classifier, AdamW, gradient clipping and the learning-rate
 * schedule.
 *
 * Ownership: a GPT owns params, grads, m, v and its activation buffers.
 * Activations are sized for the (B, T) of the first forward and regrown if
 * a larger one comes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "util/util.h"

/* ---- presets and the parameter table ---------------------------------------- */

int gpt_config_preset(const char *name, GPTConfig *cfg) {
    static const struct {
        const char *name;
        int L, C, NH, T, V;
    } presets[] = {{"tiny", 2, 64, 2, 64, 256},
                   {"small", 4, 128, 4, 128, 256},
                   {"base", 6, 384, 6, 256, 256},
                   {"gpt2-124m", 12, 768, 12, 1024, 50257}};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) != 0) continue;
        cfg->L = presets[i].L, cfg->C = presets[i].C, cfg->NH = presets[i].NH;
        cfg->T = presets[i].T, cfg->V = presets[i].V;
        cfg->Vp = (cfg->V + 63) / 64 * 64;
        snprintf(cfg->name, sizeof cfg->name, "%s", name);
        return 0;
    }
    return -1;
}

static void add_view(GPT *m, const char *name, int ndim, int d0, int d1, size_t *off) {
    ParamView *v = &m->views[m->n_views++];
    snprintf(v->name, sizeof v->name, "%s", name);
    v->ndim = ndim;
    v->shape[0] = d0;
    v->shape[1] = ndim > 1 ? d1 : 1;
    v->numel = (size_t)d0 * (ndim > 1 ? (size_t)d1 : 1);
    v->offset = *off;
    *off += v->numel;
}

static void build_table(GPT *m) {
    const GPTConfig *c = &m->cfg;
    int C = c->C;
    m->views = callocCheck((size_t)(4 + 12 * c->L), sizeof(ParamView));
    size_t off = 0;
    char n[64];
    add_view(m, "wte", 2, c->Vp, C, &off);
    add_view(m, "wpe", 2, c->T, C, &off);
    for (int l = 0; l < c->L; l++) {
#define V1(suffix, d0) snprintf(n, sizeof n, "h.%d.%s", l, suffix), add_view(m, n, 1, d0, 0, &off)
#define V2(suffix, d0, d1)                                                                         \
    snprintf(n, sizeof n, "h.%d.%s", l, suffix), add_view(m, n, 2, d0, d1, &off)
        V1("ln_1.weight", C);
        V1("ln_1.bias", C);
        V2("attn.qkv.weight", 3 * C, C);
        V1("attn.qkv.bias", 3 * C);
        V2("attn.proj.weight", C, C);
        V1("attn.proj.bias", C);
        V1("ln_2.weight", C);
        V1("ln_2.bias", C);
        V2("mlp.fc.weight", 4 * C, C);
        V1("mlp.fc.bias", 4 * C);
        V2("mlp.proj.weight", C, 4 * C);
        V1("mlp.proj.bias", C);
#undef V1
#undef V2
    }
    add_view(m, "ln_f.weight", 1, C, 0, &off);
    add_view(m, "ln_f.bias", 1, C, 0, &off);
    m->n_params = off;
    /* FNV-1a over names, shapes and order: the federation's table identity */
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < m->n_views; i++) {
        const ParamView *v = &m->views[i];
        char rec[128];
        int len =
            snprintf(rec, sizeof rec, "%s:%d:%d:%d;", v->name, v->ndim, v->shape[0], v->shape[1]);
        for (int k = 0; k < len; k++) h = (h ^ (uint8_t)rec[k]) * 0x100000001b3ull;
    }
    m->table_hash = h;
}

const ParamView *gpt_view(const GPT *m, const char *name) {
    for (int i = 0; i < m->n_views; i++)
        if (strcmp(m->views[i].name, name) == 0) return &m->views[i];
    return NULL;
}

/* the views of one layer, by position in the table */
enum { LN1W, LN1B, QKVW, QKVB, APW, APB, LN2W, LN2B, FCW, FCB, FPW, FPB };
static float *lp(const GPT *m, float *base, int l, int which) {
    return base + m->views[2 + 12 * l + which].offset;
}

/* ---- seeded initialisation ------------------------------------------------------ */

/* splitmix64: the same stream on every machine */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A standard normal from twelve uniforms (Irwin-Hall): only integer and
 * exactly rounded float arithmetic, so no libm difference can change a bit
 * between machines. */
static float normal(uint64_t *s) {
    int64_t acc = 0;
    for (int i = 0; i < 12; i++) acc += (int64_t)(rng_next(s) >> 40); /* 24-bit uniforms */
    return (float)((double)acc / 16777216.0 - 6.0);
}

int gpt_build(GPT *m, const GPTConfig *cfg, uint64_t seed, char *err) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    if (cfg->C % cfg->NH != 0 || cfg->L < 1 || cfg->V < 2 || cfg->Vp < cfg->V || cfg->T < 1)
        return err_set(err, "inconsistent model shape (C must divide by NH, Vp >= V)");
    build_table(m);
    m->params = callocCheck(m->n_params, sizeof(float));
    m->grads = callocCheck(m->n_params, sizeof(float));
    uint64_t s = seed;
    float resid_scale = 1.0f / sqrtf(2.0f * (float)cfg->L);
    for (int i = 0; i < m->n_views; i++) {
        const ParamView *v = &m->views[i];
        float *p = m->params + v->offset;
        size_t n = strlen(v->name);
        int is_ln_w = strstr(v->name, "ln_") && strcmp(v->name + n - 6, "weight") == 0;
        if (v->ndim == 1) {
            for (size_t k = 0; k < v->numel; k++) p[k] = is_ln_w ? 1.0f : 0.0f;
            continue;
        }
        float std = 0.02f;
        if (strstr(v->name, "proj.weight")) std *= resid_scale; /* residual projections */
        size_t rows = (size_t)v->shape[0];
        if (strcmp(v->name, "wte") == 0) rows = (size_t)cfg->V; /* padded rows stay zero */
        for (size_t k = 0; k < rows * (size_t)v->shape[1]; k++) p[k] = std * normal(&s);
    }
    return 0;
}

void gpt_free(GPT *m) {
    free(m->views), free(m->params), free(m->grads), free(m->m), free(m->v);
    free(m->acts), free(m->dacts), free(m->inputs), free(m->targets);
    memset(m, 0, sizeof *m);
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
    m->loss = classifier_forward_backward(a + m->a.losses, NULL, NULL, a + m->a.lnf,
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
    classifier_forward_backward(NULL, d + m->a.lnf, g + m->views[0].offset, a + m->a.lnf,
                                p + m->views[0].offset, m->targets, BT, C, c->V);
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

float gpt_clip_grad_norm(GPT *m, float max_norm) {
    double s = 0;
    for (size_t i = 0; i < m->n_params; i++) s += (double)m->grads[i] * m->grads[i];
    float norm = (float)sqrt(s);
    if (max_norm > 0 && norm > max_norm) {
        float scale = max_norm / norm;
        for (size_t i = 0; i < m->n_params; i++) m->grads[i] *= scale;
    }
    return norm;
}

void gpt_adamw_step(GPT *m, const AdamWConfig *o, float lr) {
    if (m->m == NULL) {
        m->m = callocCheck(m->n_params, sizeof(float));
        m->v = callocCheck(m->n_params, sizeof(float));
    }
    m->step++;
    float bc1 = 1.0f - powf(o->beta1, (float)m->step), bc2 = 1.0f - powf(o->beta2, (float)m->step);
    for (int i = 0; i < m->n_views; i++) {
        const ParamView *v = &m->views[i];
        float wd = v->ndim >= 2 ? o->weight_decay : 0.0f; /* no decay on biases and norms */
        float *p = m->params + v->offset, *g = m->grads + v->offset;
        float *mm = m->m + v->offset, *vv = m->v + v->offset;
#pragma omp parallel for
        for (size_t k = 0; k < v->numel; k++) {
            mm[k] = o->beta1 * mm[k] + (1.0f - o->beta1) * g[k];
            vv[k] = o->beta2 * vv[k] + (1.0f - o->beta2) * g[k] * g[k];
            float mhat = mm[k] / bc1, vhat = vv[k] / bc2;
            p[k] -= lr * (mhat / (sqrtf(vhat) + o->eps) + wd * p[k]);
        }
    }
}

float lr_schedule(int step, int total, int warmup, float max_lr, float min_lr_frac) {
    if (step < warmup) return max_lr * (float)(step + 1) / (float)warmup;
    if (total <= warmup) return max_lr;
    float progress = (float)(step - warmup) / (float)(total - warmup);
    if (progress > 1) progress = 1;
    float min_lr = max_lr * min_lr_frac;
    return min_lr + 0.5f * (max_lr - min_lr) * (1.0f + cosf(3.14159265358979f * progress));
}

void gpt_next_logits(GPT *m, const int *ctx, int n, float *logits) {
    int T = n < m->cfg.T ? n : m->cfg.T;
    const int *start = ctx + (n - T);
    gpt_forward(m, start, NULL, 1, T);
    const float *h = m->acts + m->a.lnf + (size_t)(T - 1) * m->cfg.C;
    classifier_logits(logits, h, m->params + m->views[0].offset, m->cfg.C, m->cfg.V);
}
