/*
 * lora.c — low-rank adapters inside an architecture's graph (API: arch.h):
 * beside an adapted projection out = W inp, out += s·B (A inp) with
 * s = alpha / rank, A (rank x in) and B (out x rank) from the adapters'
 * table. The forward keeps A inp (the backward's input for B); the
 * backward, given dout:
 *   dB += s·dout · (A inp)ᵀ,  d(A inp) = s·doutᵀ B,  dA += d(A inp)ᵀ inp,
 *   dinp += d(A inp) A.
 * Everything runs through the backend's Ops, so the CPU and the GPUs run
 * the same steps. Also model_lora_at (API: model.h), where an adapter is.
 */
#include <assert.h>

#include "kernels/arch.h"
#include "kernels/model.h"

/* activations a0 + k: A inp of the k-th of the LORA_* bits, per layer (BT
 * x rank); a0 + 7: a scratch as wide as the widest projection */
void lora_layout(const ModelConfig *c, int B, int T, ActLayout *lay, int a0) {
    assert(a0 + LORA_ACTS <= ACT_MAX);
    if (c->lora.rank == 0) return;
    size_t BT = (size_t)B * T, widest = 0;
    const Arch *a = arch_of(c->arch);
    for (int r = 0; r < a->n_tensors; r++)
        if (a->tensors[r].lora & c->lora.targets) {
            size_t out = (size_t)arch_dim(c, a->tensors[r].d0);
            widest = out > widest ? out : widest;
        }
    for (int k = 0; k < LORA_ACTS - 1; k++)
        if (c->lora.targets & (1u << k)) act_add(lay, a0 + k, BT * (size_t)c->lora.rank, c->L);
    act_add(lay, a0 + LORA_ACTS - 1, BT * widest, 0);
}

int model_lora_at(const Model *m, const float *buf, int r, int l, const float **A, const float **B,
                  int *in, int *out) {
    int i = r * m->cfg.L + l, v = m->lora_view ? m->lora_view[i] : -1;
    if (v < 0) return 0;
    const ArchTensor *t = &m->arch->tensors[r];
    *out = arch_dim(&m->cfg, t->d0), *in = arch_dim(&m->cfg, t->d1);
    int grads = buf != NULL && buf == m->grads;
    *B = buf ? buf + m->views[v].offset : NULL;
    *A = m->lora_frozen ? (grads ? NULL : m->lora_frozen + m->lora_a[i])
                        : (buf ? buf + m->lora_a[i] : NULL);
    return 1;
}

/* row r's adapter at layer l on pass p: A and B, their gradients (dA NULL
 * for a frozen A), the activation holding A inp, and the dimensions; 0
 * when the row is not adapted there */
typedef struct Adapter {
    float *A, *B, *dA, *dB;
    int act, in, out;
} Adapter;

static int adapter(const Model *m, const Pass *p, int a0, int r, int l, Adapter *ad) {
    const float *A, *B, *dA, *dB;
    if (p->lora == NULL || !model_lora_at(m, m->params, r, l, &A, &B, &ad->in, &ad->out)) return 0;
    unsigned bit = m->arch->tensors[r].lora;
    assert(bit != 0 && (bit & (bit - 1)) == 0 && (bit & m->cfg.lora.targets));
    ad->act = a0 + __builtin_ctz(bit);
    /* the same offsets inside the pass's own buffers (host or device) */
    ad->B = p->lora + (B - m->params);
    ad->A = m->lora_frozen ? (float *)A : p->lora + (A - m->params);
    model_lora_at(m, m->grads, r, l, &dA, &dB, &ad->in, &ad->out);
    ad->dB = p->dlora ? p->dlora + (dB - m->grads) : NULL;
    ad->dA = p->dlora && dA ? p->dlora + (dA - m->grads) : NULL;
    return 1;
}

void lora_forward(const Model *m, const Pass *p, int a0, int r, int l, const float *inp,
                  float *out) {
    Adapter ad;
    assert((p->lora != NULL) == (m->cfg.lora.rank > 0));
    if (!adapter(m, p, a0, r, l, &ad)) return;
    const Ops *o = p->ops;
    int R = m->cfg.lora.rank, BT = p->B * p->T;
    float *ax = act_at(p, p->acts, ad.act, l), *tmp = act_at(p, p->acts, a0 + LORA_ACTS - 1, 0);
    o->matmul_forward(ax, inp, ad.A, NULL, BT, ad.in, R, p->stream);
    o->matmul_forward(tmp, ax, ad.B, NULL, BT, R, ad.out, p->stream);
    o->scale_add(out, tmp, m->cfg.lora.alpha / (float)R, (size_t)BT * ad.out, p->stream);
}

void lora_backward(const Model *m, const Pass *p, int a0, int r, int l, const float *inp,
                   float *dinp, const float *dout) {
    Adapter ad;
    if (!adapter(m, p, a0, r, l, &ad)) return;
    const Ops *o = p->ops;
    int R = m->cfg.lora.rank, BT = p->B * p->T;
    float *ax = act_at(p, p->acts, ad.act, l), *dax = act_at(p, p->dacts, ad.act, l);
    float *sd = act_at(p, p->dacts, a0 + LORA_ACTS - 1, 0); /* s·dout */
    o->zero(sd, (size_t)BT * ad.out, p->stream);
    o->scale_add(sd, dout, m->cfg.lora.alpha / (float)R, (size_t)BT * ad.out, p->stream);
    /* dax is zero (the backward zeroes dacts) and takes s·dout B; dB += */
    o->matmul_backward(dax, ad.dB, NULL, sd, ax, ad.B, BT, R, ad.out, p->stream);
    /* dA NULL: A is frozen, only dinp */
    o->matmul_backward(dinp, ad.dA, NULL, dax, inp, ad.A, BT, ad.in, R, p->stream);
}
