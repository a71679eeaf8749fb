/*
 * graph.c — the model's compute (API: model.h): one pass of any
 * architecture's graph on any backend's Ops table with the fused
 * classifier, the host model on the CPU ops, gradient clipping and
 * next-token logits. Activations are sized for the (B, T) of the first
 * forward and regrown if a larger one comes.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/arch.h"
#include "kernels/model.h"
#include "kernels/ops.h"
#include "util/util.h"

/* the output layer's weight inside base: its own, or the tied embedding */
static float *head_w(const Model *m, float *base) {
    assert(m->arch->embed_row >= 0 && m->arch->embed_row < m->arch->n_tensors);
    if (base == NULL) return NULL; /* frozen */
    float *w = m->arch->head_row >= 0 ? arch_w(m, base, m->arch->head_row, 0) : NULL;
    return w ? w : arch_w(m, base, m->arch->embed_row, 0);
}

/* ---- one pass on any backend ------------------------------------------------------- */

/* a pass's buffers are laid out for its own (B, T) and the model's table */
static void assert_pass(const Model *m, const Pass *p) {
    assert(p->ops != NULL && p->lay != NULL && p->params != NULL && p->acts != NULL);
    assert(p->B >= 1 && p->T >= 1 && p->T <= m->cfg.T);
    assert(p->lay->B == p->B && p->lay->T == p->T && p->lay->len > 0);
    assert(m->arch == arch_of(m->cfg.arch) && m->n_views > 0);
    (void)m, (void)p;
}

float model_pass_forward(const Model *m, const Pass *p) {
    assert_pass(m, p);
    m->arch->forward(m, p);
    if (p->targets == NULL) return -1.0f;
    float *a = p->acts;
    return p->ops->classifier_forward(act_at(p, a, ACT_LOSSES, 0), act_at(p, a, ACT_LSE, 0),
                                      act_at(p, a, ACT_OUT, 0), head_w(m, p->params), p->targets,
                                      p->B * p->T, m->cfg.C, m->cfg.V, p->stream);
}

void model_pass_backward(const Model *m, const Pass *p) {
    assert_pass(m, p);
    assert((p->grads != NULL || p->dlora != NULL) && p->dacts != NULL && p->targets != NULL);
    assert((p->lora != NULL) == (m->cfg.lora.rank > 0));
    float *a = p->acts;
    /* outside the layers' block: each layer's backward zeroes that itself */
    p->ops->zero(p->dacts + p->lay->dlayer, p->lay->dlen - p->lay->dlayer, p->stream);
    p->ops->classifier_backward(
        dact_at(p, ACT_OUT, 0), head_w(m, p->grads), act_at(p, a, ACT_OUT, 0), head_w(m, p->params),
        p->targets, act_at(p, a, ACT_LSE, 0), p->B * p->T, m->cfg.C, m->cfg.V, p->stream);
    m->arch->backward(m, p);
}

/* ---- the host model on the CPU ops --------------------------------------------------- */

void model_layout(const Model *m, int B, int T, ActLayout *lay) {
    memset(lay, 0, sizeof *lay);
    assert(m->recompute >= 0 && m->recompute <= MODEL_RECOMPUTE_MAX);
    lay->recompute = m->recompute;
    m->arch->layout(&m->cfg, B, T, lay);
}

/* Activations sized for (B, T): regrown only when a larger pass comes. */
static void ensure_acts(Model *m, int B, int T) {
    model_layout(m, B, T, &m->lay);
    if (m->acts && m->lay.len <= m->acts_cap && m->lay.dlen <= m->dacts_cap && B * T <= m->fwd_cap)
        return;
    free(m->acts), free(m->dacts), free(m->inputs), free(m->targets);
    m->acts = mallocCheck(m->lay.len * sizeof(float));
    m->dacts = mallocCheck(m->lay.dlen * sizeof(float));
    m->dacts_cap = m->lay.dlen;
    m->inputs = mallocCheck((size_t)B * T * sizeof(int));
    m->targets = mallocCheck((size_t)B * T * sizeof(int));
    m->acts_cap = m->lay.len, m->fwd_cap = B * T;
    assert(m->lay.len <= m->acts_cap && B * T <= m->fwd_cap);
}

/* The frozen base in bf16 alone, at the first pass: its fingerprint taken
 * from the values as loaded, then each matrix (what the stream serves:
 * matmuls, the classifier, the embedding) held as bf16 and its fp32 pages
 * given back one tensor at a time (so the peak is the fp32 table's, not
 * fp32 and bf16 together), and the fp32 table rebuilt as a reservation of
 * address space in which only the vectors (norms, biases) have pages: the
 * stream still finds a matrix by its fp32 address, and a read of its
 * fp32 values faults (those on a page it shares with a vector read zero). A matrix its file holds
 * in quantized blocks (and blocks_off unset) has no copy: the stream unpacks it at each use. A chip
 * without bf16 instructions runs sgemm on the values rounded to bf16, in place. */
static void hold_base_bf16(Model *m) {
    m->base_print = model_base_fingerprint(m);
    m->base_rounded = 1;
    size_t n = m->n_base;
    if (!bf16_units()) { /* the matrices rounded; the vectors stay fp32 */
        for (int i = 0; i < m->n_base_views; i++) {
            const ParamView *v = &m->base_views[i];
            if (v->ndim == 2) bf16_round(m->base + v->offset, m->base + v->offset, v->numel);
        }
        m->cpu = (CpuStream){.f32 = m->base, .copy = {NULL, m->base}, .n = n};
        model_drop_held(m);
        return;
    }
    int blocks = m->n_held > 0 && !m->blocks_off, b = 0;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    size_t bytes = (n * sizeof(float) + page - 1) / page * page;
    /* mapped, not allocated: a held matrix's part of it is never touched,
     * so never resident */
    m->base16_mapped = (n * sizeof(uint16_t) + page - 1) / page * page;
    m->base16 = mmap(NULL, m->base16_mapped, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m->base16 == MAP_FAILED)
        DIE("cannot map %zu bytes for the base's bf16 copy", m->base16_mapped);
    float *kept = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (kept == MAP_FAILED) DIE("cannot reserve %zu bytes of address space for the base", bytes);
    for (int i = 0; i < m->n_base_views; i++) {
        const ParamView *v = &m->base_views[i];
        assert(i == 0 || v->offset > m->base_views[i - 1].offset); /* table order */
        float *from = m->base + v->offset;
        if (v->ndim == 2) { /* a matrix: its bf16 copy alone, or its blocks */
            while (blocks && b < m->n_held && m->held[b].offset < v->offset) b++;
            int in_blocks = blocks && b < m->n_held && m->held[b].offset == v->offset;
            if (!in_blocks) bf16_from_float(m->base16 + v->offset, from, v->numel);
            /* the whole pages inside it (freed memory reads as zeros: never read again) */
            uintptr_t lo = ((uintptr_t)from + page - 1) / page * page;
            uintptr_t hi = (uintptr_t)(from + v->numel) / page * page;
            if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
            continue;
        }
        uintptr_t lo = (uintptr_t)(kept + v->offset) / page * page;
        uintptr_t hi = ((uintptr_t)(kept + v->offset + v->numel) + page - 1) / page * page;
        if (mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE) != 0)
            DIE("cannot map the base's %s: %s", v->name, strerror(errno));
        memcpy(kept + v->offset, from, v->numel * sizeof(float));
    }
    free(m->base);
    m->base = kept, m->base_mapped = bytes;
    if (!blocks) model_drop_held(m);
    m->cpu = (CpuStream){.f32 = m->base,
                         .copy = {m->base16, NULL},
                         .n = n,
                         .held = blocks ? m->held : NULL,
                         .n_held = blocks ? m->n_held : 0};
}

/* Mixed precision: the matrices' bf16 copy of the parameters as they are
 * now (whoever wrote them last: AdamW, a round's download), and the stream
 * that points the matmuls at it while everything else reads fp32. */
static void copy_params_bf16(Model *m) {
    if (m->params16 == NULL) m->params16 = callocCheck(m->n_params, sizeof(uint16_t));
    for (int i = 0; i < m->n_views; i++) {
        const ParamView *v = &m->views[i];
        if (v->ndim == 2) bf16_from_float(m->params16 + v->offset, m->params + v->offset, v->numel);
    }
    m->cpu =
        (CpuStream){.f32 = m->params, .copy = {m->params16, NULL}, .n = m->n_params, .live = 1};
}

static Pass host_pass(Model *m) {
    int adapted = m->cfg.lora.rank > 0;          /* the base frozen, the adapters training */
    int bf16 = adapted && m->cfg.lora.base_bf16; /* its matmuls in bf16 */
    int mixed = !adapted && m->precision_bf16;   /* the model's own, copied each forward */
    if (bf16 && m->cpu.f32 == NULL) hold_base_bf16(m);
    if (!bf16 && m->held) model_drop_held(m); /* an fp32 base reads its fp32 values */
    Pass p = {.ops = &ops_cpu,
              .stream = bf16 || mixed ? &m->cpu : NULL,
              .params = model_base(m),
              .grads = adapted ? NULL : m->grads,
              .lora = adapted ? m->params : NULL,
              .dlora = adapted ? m->grads : NULL,
              .acts = m->acts,
              .dacts = m->dacts,
              .lay = &m->lay,
              .inputs = m->inputs,
              .targets = m->has_targets ? m->targets : NULL,
              .B = m->fwd_B,
              .T = m->fwd_T,
              .drop = m->drop_seed};
    return p;
}

float model_forward(Model *m, const int *inputs, const int *targets, int B, int T) {
    const ModelConfig *c = &m->cfg;
    if (T > c->T) DIE("sequence of %d tokens is longer than the model's %d", T, c->T);
    for (int i = 0; i < B * T; i++)
        if (inputs[i] < 0 || inputs[i] >= c->V) DIE("token %d outside the vocabulary", inputs[i]);
    ensure_acts(m, B, T);
    memcpy(m->inputs, inputs, sizeof(int) * (size_t)B * T);
    if (targets) memcpy(m->targets, targets, sizeof(int) * (size_t)B * T);
    m->fwd_B = B, m->fwd_T = T, m->has_targets = targets != NULL;
    if (m->precision_bf16 && c->lora.rank == 0) copy_params_bf16(m);
    Pass p = host_pass(m);
    float loss = model_pass_forward(m, &p);
    if (targets) m->loss = loss;
    return loss;
}

void model_zero_grad(Model *m) {
    memset(m->grads, 0, m->n_params * sizeof(float));
}

void model_backward(Model *m) {
    if (!m->has_targets) DIE("backward needs a forward with targets");
    Pass p = host_pass(m);
    model_pass_backward(m, &p);
}

/* ---- optimisation ---------------------------------------------------------------------- */

void model_grad_sumsq(const Model *m, size_t lo, size_t hi, double *part) {
    enum { BLOCK = MODEL_NORM_BLOCK };
    const float *g = m->grads;
    assert(lo % BLOCK == 0 && lo <= hi && hi <= m->n_params);
    size_t blocks = (hi - lo + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < blocks; b++) {
        size_t i = lo + b * BLOCK, end = i + BLOCK < hi ? i + BLOCK : hi;
        float lane[8] = {0};
        assert(i < end);
        for (; i + 8 <= end; i += 8)
            for (int k = 0; k < 8; k++) lane[k] += g[i + k] * g[i + k];
        float sum = 0;
        for (; i < end; i++) sum += g[i] * g[i];
        for (int k = 0; k < 8; k++) sum += lane[k];
        part[b] = sum;
    }
}

float model_grad_norm(const Model *m) {
    size_t n = m->n_params, blocks = (n + MODEL_NORM_BLOCK - 1) / MODEL_NORM_BLOCK;
    double *part = mallocCheck((blocks ? blocks : 1) * sizeof(double)), s = 0;
    model_grad_sumsq(m, 0, n, part);
    for (size_t b = 0; b < blocks; b++) s += part[b]; /* in order: the same bits on any split */
    free(part);
    return (float)sqrt(s);
}

float model_clip_grad_norm(Model *m, float max_norm) {
    float norm = model_grad_norm(m);
    if (max_norm > 0 && norm > max_norm) {
        float scale = max_norm / norm, *g = m->grads;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < m->n_params; i++) g[i] *= scale;
    }
    return norm;
}

void model_next_logits(Model *m, const int *ctx, int n, float *logits) {
    assert(n >= 1);
    int T = n < m->cfg.T ? n : m->cfg.T;
    const int *start = ctx + (n - T);
    model_forward(m, start, NULL, 1, T);
    const float *h = m->acts + m->lay.off[ACT_OUT] + (size_t)(T - 1) * m->cfg.C;
    if (m->cpu.f32) /* a bf16 base: the pass's own output layer */
        ops_cpu.matmul_forward(logits, h, head_w(m, model_base(m)), NULL, 1, m->cfg.C, m->cfg.V,
                               &m->cpu);
    else
        classifier_logits(logits, h, head_w(m, model_base(m)), m->cfg.C, m->cfg.V);
}
