/*
 * lora.c — low-rank adapters inside an architecture's graph (API: arch.h):
 * beside an adapted projection out = W inp, out += s·B (A inp) with
 * s = alpha / rank, A (rank x in) and B (out x rank) from the adapters'
 * table. The forward keeps A inp (the backward's input for B); the
 * backward, given dout:
 *   dB += s·dout · (A inp)ᵀ,  d(A inp) = s·doutᵀ B,  dA += d(A inp)ᵀ inp,
 *   dinp += d(A inp) A.
 * Fed-SB (rule fedsb) puts R (rank x rank) between them, out += s·B R A inp
 * with A and B frozen; the forward keeps h = A inp and g = R h, and the
 * backward: dg = s·doutᵀ B, dR += dgᵀ h, dh = dg R, dinp += dh A.
 * With dropout p in training, A takes x = inp·mask/(1 - p) instead of inp,
 * a mask of each adapter's own a step, drawn (ops.h's dropout_keep) from
 * the pass's seed, in the forward and again in the backward, where
 * dA += d(A x)ᵀ x and dinp += (d(A x) A)·mask/(1 - p).
 * Everything runs through the backend's Ops, so the CPU and the GPUs run
 * the same steps. Also model_lora_at (API: model.h), where an adapter is.
 */
#include <assert.h>

#include "kernels/arch.h"
#include "kernels/model.h"

/* activations a0 + k: A inp of the k-th of the LORA_* bits, per layer (BT
 * x rank), then with fedsb R A inp (BT x rank); a0 + 7: a scratch as wide
 * as the widest projection (with dropout, the widest of its sides); the
 * architecture's layout then calls act_finish */
void lora_layout(const ModelConfig *c, int B, int T, ActLayout *lay, int a0) {
    assert(a0 + LORA_ACTS <= ACT_MAX);
    if (c->lora.rank == 0) return;
    size_t BT = (size_t)B * T, widest = 0, per = c->lora.rule == LORA_RULE_FEDSB ? 2 : 1;
    const Arch *a = arch_of(c->arch);
    for (int r = 0; r < a->n_tensors; r++)
        if (a->tensors[r].lora & c->lora.targets) {
            size_t out = (size_t)arch_dim(c, a->tensors[r].d0);
            size_t in = c->lora.dropout > 0 ? (size_t)arch_dim(c, a->tensors[r].d1) : 0;
            widest = out > widest ? out : widest;
            widest = in > widest ? in : widest;
        }
    for (int k = 0; k < LORA_ACTS - 1; k++)
        if (c->lora.targets & (1u << k))
            act_add(lay, a0 + k, per * BT * (size_t)c->lora.rank, c->L);
    act_add(lay, a0 + LORA_ACTS - 1, BT * widest, 0);
}

int model_lora_at(const Model *m, const float *buf, int r, int l, LoraAt *at) {
    int i = r * m->cfg.L + l, v = m->lora_view ? m->lora_view[i] : -1;
    if (v < 0) return 0;
    const ArchTensor *t = &m->arch->tensors[r];
    at->out = arch_dim(&m->cfg, t->d0), at->in = arch_dim(&m->cfg, t->d1);
    int grads = buf != NULL && buf == m->grads, R = m->cfg.lora.rank;
    const float *last = buf ? buf + m->views[v].offset : NULL; /* what trains last: B, or R */
    const float *frozen = m->lora_frozen && !grads ? m->lora_frozen : NULL;
    switch (m->cfg.lora.rule) {
    case LORA_RULE_FEDIT: /* A then B in the table */
        at->A = buf ? buf + m->lora_a[i] : NULL, at->R = NULL, at->B = last;
        break;
    case LORA_RULE_FFA: /* A frozen beside it, B in it */
        at->A = frozen ? frozen + m->lora_a[i] : NULL, at->R = NULL, at->B = last;
        break;
    default: /* Fed-SB: A and B frozen beside it, R in it */
        assert(m->cfg.lora.rule == LORA_RULE_FEDSB && m->views[v].numel == (size_t)R * R);
        at->A = frozen ? frozen + m->lora_a[i] : NULL, at->R = last;
        at->B = frozen ? frozen + m->lora_b[i] : NULL;
        break;
    }
    return 1;
}

/* row r's adapter at layer l on pass p: A, R (fedsb; else NULL) and B,
 * their gradients (NULL for a frozen one), the activation holding A inp
 * (and then R A inp), and the dimensions; 0 when the row is not adapted
 * there */
typedef struct Adapter {
    float *A, *R, *B, *dA, *dR, *dB;
    int act, in, out;
} Adapter;

/* one of them on pass p: what trains (it has a gradient) at the same
 * offset inside the pass's own buffers (host or device), with its
 * gradient; a frozen one at the same offset inside the pass's copy of
 * lora_frozen (or the host's), without one */
static void on_pass(const Model *m, const Pass *p, const float *x, const float *dx, float **px,
                    float **pdx) {
    if (dx)
        *px = p->lora + (x - m->params);
    else if (x && p->frozen) {
        assert(m->lora_frozen != NULL && x >= m->lora_frozen);
        *px = (float *)p->frozen + (x - m->lora_frozen);
    } else
        *px = (float *)x;
    *pdx = dx && p->dlora ? p->dlora + (dx - m->grads) : NULL;
}

static int adapter(const Model *m, const Pass *p, int a0, int r, int l, Adapter *ad) {
    LoraAt w, g;
    if (p->lora == NULL || !model_lora_at(m, m->params, r, l, &w)) return 0;
    assert(m->grads != NULL); /* model_add_adapters made them */
    model_lora_at(m, m->grads, r, l, &g);
    unsigned bit = m->arch->tensors[r].lora;
    assert(bit != 0 && (bit & (bit - 1)) == 0 && (bit & m->cfg.lora.targets));
    ad->act = a0 + __builtin_ctz(bit);
    ad->in = w.in, ad->out = w.out;
    on_pass(m, p, w.A, g.A, &ad->A, &ad->dA);
    on_pass(m, p, w.R, g.R, &ad->R, &ad->dR);
    on_pass(m, p, w.B, g.B, &ad->B, &ad->dB);
    return 1;
}

/* the dropout mask's seed of row r's adapter at layer l on pass p; 0: none */
static uint64_t drop_seed(const Model *m, const Pass *p, int r, int l) {
    if (p->drop == 0 || !(m->cfg.lora.dropout > 0)) return 0;
    return mix64(p->drop + (uint64_t)(r * m->cfg.L + l) * 0x9E3779B97F4A7C15ull) | 1;
}

void lora_forward(const Model *m, const Pass *p, int a0, int r, int l, const float *inp,
                  float *out) {
    Adapter ad;
    assert((p->lora != NULL) == (m->cfg.lora.rank > 0));
    if (!adapter(m, p, a0, r, l, &ad)) return;
    const Ops *o = p->ops;
    int R = m->cfg.lora.rank, BT = p->B * p->T;
    float *ax = act_at(p, p->acts, ad.act, l), *tmp = act_at(p, p->acts, a0 + LORA_ACTS - 1, 0);
    float *bx = ad.R ? ax + (size_t)BT * R : ax; /* what B takes: A inp, or R A inp */
    uint64_t drop = drop_seed(m, p, r, l);
    if (drop) { /* the scratch holds x until A has taken it, then B's output */
        o->dropout(tmp, inp, m->cfg.lora.dropout, drop, (size_t)BT * ad.in, 0, p->stream);
        inp = tmp;
    }
    o->matmul_forward(ax, inp, ad.A, NULL, BT, ad.in, R, p->stream);
    if (ad.R) o->matmul_forward(bx, ax, ad.R, NULL, BT, R, R, p->stream);
    o->matmul_forward(tmp, bx, ad.B, NULL, BT, R, ad.out, p->stream);
    o->scale_add(out, tmp, m->cfg.lora.alpha / (float)R, (size_t)BT * ad.out, p->stream);
}

void lora_backward(const Model *m, const Pass *p, int a0, int r, int l, const float *inp,
                   float *dinp, const float *dout) {
    Adapter ad;
    if (!adapter(m, p, a0, r, l, &ad)) return;
    const Ops *o = p->ops;
    int R = m->cfg.lora.rank, BT = p->B * p->T;
    float *ax = act_at(p, p->acts, ad.act, l), *dax = dact_at(p, ad.act, l);
    float *bx = ad.R ? ax + (size_t)BT * R : ax, *dbx = ad.R ? dax + (size_t)BT * R : dax;
    float *sd = dact_at(p, a0 + LORA_ACTS - 1, 0); /* s·dout */
    o->zero(sd, (size_t)BT * ad.out, p->stream);
    o->scale_add(sd, dout, m->cfg.lora.alpha / (float)R, (size_t)BT * ad.out, p->stream);
    /* dbx is zero (the backward zeroes dacts) and takes s·dout B; dB +=
     * (NULL: B frozen) */
    o->matmul_backward(dbx, ad.dB, NULL, sd, bx, ad.B, BT, R, ad.out, p->stream);
    /* Fed-SB: dax takes dbx R, dR += dbxᵀ ax */
    if (ad.R) o->matmul_backward(dax, ad.dR, NULL, dbx, ax, ad.R, BT, R, R, p->stream);
    uint64_t drop = drop_seed(m, p, r, l);
    if (drop) { /* x again in the forward's scratch; d(x) in s·dout's, done with */
        float *x = act_at(p, p->acts, a0 + LORA_ACTS - 1, 0);
        size_t n = (size_t)BT * ad.in;
        o->dropout(x, inp, m->cfg.lora.dropout, drop, n, 0, p->stream);
        o->zero(sd, n, p->stream);
        o->matmul_backward(sd, ad.dA, NULL, dax, x, ad.A, BT, ad.in, R, p->stream);
        o->dropout(dinp, sd, m->cfg.lora.dropout, drop, n, 1, p->stream);
        return;
    }
    /* dA NULL: A is frozen, only dinp */
    o->matmul_backward(dinp, ad.dA, NULL, dax, inp, ad.A, BT, ad.in, R, p->stream);
}
