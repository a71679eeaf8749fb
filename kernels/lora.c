/*
 * lora.c — low-rank adapters inside an architecture's graph (API: arch.h):
 * beside an adapted projection out = W inp, out += s·B (A inp) with
 * s = alpha / rank, A (rank x in) and B (out x rank) from the adapters'
 * table. The forward keeps A inp (the backward's input for B); the
 * backward, given dout:
 *   dB += s·dout · (A inp)ᵀ,  d(A inp) = s·doutᵀ B,  dA += d(A inp)ᵀ inp,
 *   dinp += d(A inp) A.
 * Everything runs through the backend's Ops, so the CPU and the GPUs run
 * the same steps.
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

/* row r's adapter at layer l: A, B (inside base), its activation's index;
 * 0 when the row is not adapted there */
static int adapter(const Model *m, const Pass *p, float *base, int a0, int r, int l, float **A,
                   float **Bm, int *act) {
    if (p->lora == NULL || m->lora_view == NULL) return 0;
    int v = m->lora_view[r * m->cfg.L + l];
    if (v < 0) return 0;
    unsigned bit = m->arch->tensors[r].lora;
    assert(bit != 0 && (bit & (bit - 1)) == 0 && (bit & m->cfg.lora.targets));
    *act = a0 + __builtin_ctz(bit);
    *A = base ? base + m->views[v].offset : NULL;
    *Bm = base ? base + m->views[v + 1].offset : NULL;
    assert(m->views[v].shape[0] == m->cfg.lora.rank &&
           m->views[v + 1].shape[1] == m->cfg.lora.rank);
    return 1;
}

void lora_forward(const Model *m, const Pass *p, int a0, int r, int l, const float *inp,
                  float *out) {
    float *A, *Bm;
    int act;
    if (!adapter(m, p, p->lora, a0, r, l, &A, &Bm, &act)) return;
    const Ops *o = p->ops;
    int R = m->cfg.lora.rank, BT = p->B * p->T;
    int in = m->views[m->lora_view[r * m->cfg.L + l]].shape[1];
    int outd = m->views[m->lora_view[r * m->cfg.L + l] + 1].shape[0];
    float *ax = act_at(p, p->acts, act, l), *tmp = act_at(p, p->acts, a0 + LORA_ACTS - 1, 0);
    o->matmul_forward(ax, inp, A, NULL, BT, in, R, p->stream);
    o->matmul_forward(tmp, ax, Bm, NULL, BT, R, outd, p->stream);
    o->scale_add(out, tmp, m->cfg.lora.alpha / (float)R, (size_t)BT * outd, p->stream);
}

void lora_backward(const Model *m, const Pass *p, int a0, int r, int l, const float *inp,
                   float *dinp, const float *dout) {
    float *A, *Bm, *dA, *dB;
    int act;
    if (!adapter(m, p, p->lora, a0, r, l, &A, &Bm, &act)) return;
    adapter(m, p, p->dlora, a0, r, l, &dA, &dB, &act);
    const Ops *o = p->ops;
    int R = m->cfg.lora.rank, BT = p->B * p->T;
    int in = m->views[m->lora_view[r * m->cfg.L + l]].shape[1];
    int outd = m->views[m->lora_view[r * m->cfg.L + l] + 1].shape[0];
    float *ax = act_at(p, p->acts, act, l), *dax = act_at(p, p->dacts, act, l);
    float *sd = act_at(p, p->dacts, a0 + LORA_ACTS - 1, 0); /* s·dout */
    o->zero(sd, (size_t)BT * outd, p->stream);
    o->scale_add(sd, dout, m->cfg.lora.alpha / (float)R, (size_t)BT * outd, p->stream);
    /* dax is zero (the backward zeroes dacts) and takes s·dout B; dB += */
    o->matmul_backward(dax, dB, NULL, sd, ax, Bm, BT, R, outd, p->stream);
    o->matmul_backward(dinp, dA, NULL, dax, inp, A, BT, in, R, p->stream);
}
