/*
 * model.c — the model without its compute (API: model.h): the parameter
 * table built from the architecture's tensor table (kernels/arch.h), and
 * seeded initialisation. No op is called here, so readers of model files
 * (and their fuzz targets) can build a table without BLAS.
 *
 * Ownership: a Model owns params, grads, m, v, its table and its activation
 * buffers; model_free releases all of them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/arch.h"
#include "kernels/model.h"
#include "util/util.h"

const Arch *arch_of(int arch) {
    static const Arch *const all[ARCH_COUNT] = {&arch_gpt2, &arch_llama, &arch_qwen2};
    return arch >= 0 && arch < ARCH_COUNT ? all[arch] : NULL;
}

int arch_dim(const ModelConfig *c, Dim d) {
    switch (d) {
    case DIM_NONE:
        return 1;
    case DIM_C:
        return c->C;
    case DIM_3C:
        return 3 * c->C;
    case DIM_4C:
        return 4 * c->C;
    case DIM_VP:
        return c->Vp;
    case DIM_T:
        return c->T;
    case DIM_Q:
        return c->NH * c->HD;
    case DIM_KV:
        return c->NKV * c->HD;
    case DIM_F:
        return c->F;
    }
    return 0;
}

int arch_has(const ModelConfig *c, const ArchTensor *t) {
    return t->when == IF_ALWAYS || (t->when == IF_UNTIED && !c->tied) ||
           (t->when == IF_QKV_BIAS && c->qkv_bias);
}

void act_add(ActLayout *lay, int a, size_t n, int layers) {
    lay->off[a] = lay->len;
    lay->stride[a] = layers > 0 ? n : 0;
    lay->len += layers > 0 ? n * (size_t)layers : n;
}

/* ---- the parameter table ----------------------------------------------------- */

/* Calls f for every tensor of the configuration in table order: its row,
 * layer (0 outside layers), name and shape. */
typedef void (*TensorFn)(void *ctx, int row, int layer, const char *name, int ndim, int d0, int d1);
static void each_tensor(const ModelConfig *c, TensorFn f, void *ctx) {
    const Arch *a = arch_of(c->arch);
    for (int r = 0; r < a->n_tensors; r++) {
        const ArchTensor *t = &a->tensors[r];
        if (!t->layer) {
            if (arch_has(c, t))
                f(ctx, r, 0, t->name, t->d1 == DIM_NONE ? 1 : 2, arch_dim(c, t->d0),
                  arch_dim(c, t->d1));
            continue;
        }
        int end = r; /* the block of layer rows, layer by layer */
        while (end < a->n_tensors && a->tensors[end].layer) end++;
        for (int l = 0; l < c->L; l++)
            for (int k = r; k < end; k++) {
                const ArchTensor *lt = &a->tensors[k];
                if (!arch_has(c, lt)) continue;
                char name[64];
                snprintf(name, sizeof name, "h.%d.%s", l, lt->name);
                f(ctx, k, l, name, lt->d1 == DIM_NONE ? 1 : 2, arch_dim(c, lt->d0),
                  arch_dim(c, lt->d1));
            }
        r = end - 1;
    }
}

static void count_tensor(void *ctx, int row, int layer, const char *name, int ndim, int d0,
                         int d1) {
    (void)row, (void)layer, (void)name;
    *(double *)ctx += (double)d0 * (ndim > 1 ? d1 : 1);
}

double model_config_params(const ModelConfig *c) {
    double n = 0;
    each_tensor(c, count_tensor, &n);
    return n;
}

double model_train_bytes(const ModelConfig *c, int B, int T, int moments_bf16) {
    ActLayout lay = {0};
    arch_of(c->arch)->layout(c, B, T, &lay);
    /* parameters, gradients, AdamW's two moments; a step's activations and
     * their gradients */
    return (moments_bf16 ? 12.0 : 16.0) * model_config_params(c) + 8.0 * (double)lay.len;
}

static void add_tensor(void *ctx, int row, int layer, const char *name, int ndim, int d0, int d1) {
    Model *m = ctx;
    ParamView *v = &m->views[m->n_views];
    snprintf(v->name, sizeof v->name, "%s", name);
    v->ndim = ndim;
    v->shape[0] = d0;
    v->shape[1] = ndim > 1 ? d1 : 1;
    v->numel = (size_t)d0 * (ndim > 1 ? (size_t)d1 : 1);
    v->offset = m->n_params;
    m->n_params += v->numel;
    m->row_view[row * m->cfg.L + layer] = m->n_views++;
}

static void count_view(void *ctx, int row, int layer, const char *name, int ndim, int d0, int d1) {
    (void)row, (void)layer, (void)name, (void)ndim, (void)d0, (void)d1;
    (*(int *)ctx)++;
}

static void build_table(Model *m) {
    int n = 0;
    each_tensor(&m->cfg, count_view, &n);
    m->views = callocCheck((size_t)n, sizeof(ParamView));
    size_t rows = (size_t)m->arch->n_tensors * (size_t)m->cfg.L;
    m->row_view = mallocCheck(rows * sizeof(int));
    for (size_t i = 0; i < rows; i++) m->row_view[i] = -1;
    each_tensor(&m->cfg, add_tensor, m);
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

const ParamView *model_view(const Model *m, const char *name) {
    for (int i = 0; i < m->n_views; i++)
        if (strcmp(m->views[i].name, name) == 0) return &m->views[i];
    return NULL;
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

typedef struct InitCtx {
    Model *m;
    uint64_t s;
    float resid_scale;
    int view;
} InitCtx;

static void init_tensor(void *ctx, int row, int layer, const char *name, int ndim, int d0, int d1) {
    (void)layer, (void)name, (void)ndim, (void)d1;
    InitCtx *c = ctx;
    const ArchTensor *t = &c->m->arch->tensors[row];
    const ParamView *v = &c->m->views[c->view++];
    float *p = c->m->params + v->offset;
    if (t->init == INIT_ZERO || t->init == INIT_ONE) {
        for (size_t k = 0; k < v->numel; k++) p[k] = t->init == INIT_ONE ? 1.0f : 0.0f;
        return;
    }
    float std = t->init == INIT_RESID ? 0.02f * c->resid_scale : 0.02f;
    size_t rows = t->d0 == DIM_VP ? (size_t)c->m->cfg.V : (size_t)d0; /* padding stays zero */
    for (size_t k = 0; k < rows * (size_t)v->shape[1]; k++) p[k] = std * normal(&c->s);
}

int model_build(Model *m, const ModelConfig *cfg, uint64_t seed, char *err) {
    memset(m, 0, sizeof *m);
    ModelConfig check = *cfg;
    char why[ERR_LEN];
    if (model_config_check(&check, why) != 0)
        return err_set(err, "inconsistent model configuration: %s", why);
    if (check.Vp != cfg->Vp)
        return err_set(err, "a vocabulary of %d pads to %d, not %d", cfg->V, check.Vp, cfg->Vp);
    m->cfg = check; /* with what the architecture derives (GPT-2's head size, ...) */
    m->arch = arch_of(cfg->arch);
    build_table(m);
    m->params = callocCheck(m->n_params, sizeof(float));
    m->grads = callocCheck(m->n_params, sizeof(float));
    InitCtx c = {m, seed, 1.0f / sqrtf(2.0f * (float)cfg->L), 0};
    each_tensor(cfg, init_tensor, &c);
    return 0;
}

void model_free(Model *m) {
    free(m->views), free(m->row_view), free(m->params), free(m->grads), free(m->m), free(m->v);
    free(m->mh), free(m->vh);
    free(m->acts), free(m->dacts), free(m->inputs), free(m->targets);
    memset(m, 0, sizeof *m);
}
