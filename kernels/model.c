/*
 * model.c — the model without its compute (API: model.h): the parameter
 * table built from the architecture's tensor table (kernels/arch.h), and
 * seeded initialisation. No op is called here, so readers of model files
 * (and their fuzz targets) can build a table without BLAS.
 *
 * Ownership: a Model owns params, grads, m, v, its table and its activation
 * buffers; model_free releases all of them.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <xxhash.h>

#include "kernels/arch.h"
#include "kernels/model.h"
#include "util/util.h"

/* ---- the parameter table ----------------------------------------------------- */

static void add_tensor(void *ctx, int row, int layer, const char *name, int ndim, int d0, int d1) {
    Model *m = ctx;
    assert(row >= 0 && row < m->arch->n_tensors && layer >= 0 && layer < m->cfg.L);
    assert(d0 >= 1 && (ndim == 1 || d1 >= 1) && strlen(name) < sizeof m->views[0].name);
    assert(m->row_view[row * m->cfg.L + layer] == -1); /* each (row, layer) once */
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

/* FNV-1a over names, shapes and order: the federation's table identity */
static uint64_t table_hash(const ParamView *views, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) {
        const ParamView *v = &views[i];
        char rec[128];
        int len =
            snprintf(rec, sizeof rec, "%s:%d:%d:%d;", v->name, v->ndim, v->shape[0], v->shape[1]);
        for (int k = 0; k < len; k++) h = (h ^ (uint8_t)rec[k]) * 0x100000001b3ull;
    }
    return h;
}

static void build_table(Model *m) {
    int n = 0;
    arch_each_tensor(&m->cfg, count_view, &n);
    m->views = callocCheck((size_t)n, sizeof(ParamView));
    size_t rows = (size_t)m->arch->n_tensors * (size_t)m->cfg.L;
    m->row_view = mallocCheck(rows * sizeof(int));
    for (size_t i = 0; i < rows; i++) m->row_view[i] = -1;
    arch_each_tensor(&m->cfg, add_tensor, m);
    assert(m->n_views == n && (double)m->n_params == model_config_params(&m->cfg));
    m->table_hash = table_hash(m->views, m->n_views);
}

const ParamView *model_view(const Model *m, const char *name) {
    for (int i = 0; i < m->n_views; i++)
        if (strcmp(m->views[i].name, name) == 0) return &m->views[i];
    return NULL;
}

/* ---- seeded initialisation ------------------------------------------------------ */

/* splitmix64: the same stream on every machine */
static uint64_t rng_next(uint64_t *s) {
    return mix64(*s += 0x9E3779B97F4A7C15ull);
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
    memset(&m->cfg.lora, 0, sizeof m->cfg.lora); /* added below, over the base */
    m->arch = arch_of(cfg->arch);
    assert(m->arch != NULL && m->cfg.Vp >= m->cfg.V && m->cfg.Vp % 64 == 0);
    build_table(m);
    m->params = callocCheck(m->n_params, sizeof(float));
    m->grads = callocCheck(m->n_params, sizeof(float));
    int drawn = check.lora.rank > 0 && check.lora.base_seed >= 0;
    InitCtx c = {m, drawn ? (uint64_t)check.lora.base_seed : seed,
                 1.0f / sqrtf(2.0f * (float)cfg->L), 0};
    arch_each_tensor(&m->cfg, init_tensor, &c);
    if (check.lora.rank > 0) {
        if (model_add_adapters(m, &check.lora, seed, err) != 0) {
            model_free(m);
            return -1;
        }
        /* what the configuration names (a pretrained base is stood in for) */
        m->cfg.lora.base = check.lora.base, m->cfg.lora.base_seed = check.lora.base_seed;
    }
    return 0;
}

/* ---- adapters ------------------------------------------------------------------------ */

uint64_t model_base_fingerprint(const Model *m) {
    if (m->base_rounded) return m->base_print;
    return XXH3_64bits(model_base(m), model_base_count(m) * sizeof(float));
}

/* the base's row r at layer l: (out, in) of its projection */
static void adapter_dims(const Model *m, int r, int *out, int *in) {
    const ArchTensor *t = &m->arch->tensors[r];
    *out = arch_dim(&m->cfg, t->d0), *in = arch_dim(&m->cfg, t->d1);
}

/* A view of the adapters' table: name, (d0, d1), after the last */
static void adapter_view(Model *m, const char *name, int d0, int d1) {
    ParamView *v = &m->views[m->n_views++];
    snprintf(v->name, sizeof v->name, "%s", name);
    v->ndim = 2, v->shape[0] = d0, v->shape[1] = d1;
    v->numel = (size_t)d0 * (size_t)d1;
    v->offset = m->n_params;
    m->n_params += v->numel;
}

int model_add_adapters(Model *m, const AdapterConfig *a, uint64_t seed, char *err) {
    if (m->cfg.lora.rank > 0) return err_set(err, "the model has adapters already");
    ModelConfig want = m->cfg; /* the configuration's own check: rank, alpha, targets, rule, size */
    want.lora = *a;
    if (model_config_check(&want, err) != 0) return -1;
    int L = m->cfg.L, n = 0, R = a->rank, rule = a->rule;
    int fedit = rule == LORA_RULE_FEDIT, fedsb = rule == LORA_RULE_FEDSB;
    size_t rows = (size_t)m->arch->n_tensors * L, n_frozen = 0;
    for (int l = 0; l < L; l++)
        for (int r = 0; r < m->arch->n_tensors; r++)
            n += (m->arch->tensors[r].lora & a->targets) && m->row_view[r * L + l] >= 0;
    /* the base: what trained until now, frozen, without gradients */
    free(m->grads), free(m->m), free(m->v), free(m->mh), free(m->vh);
    m->grads = NULL, m->m = m->v = NULL, m->mh = m->vh = NULL, m->step = 0;
    m->moments_lo = m->moments_hi = 0;
    m->base = m->params, m->base_views = m->views;
    m->n_base = m->n_params, m->n_base_views = m->n_views;
    m->views = callocCheck((size_t)n * (fedit ? 2 : 1), sizeof(ParamView));
    m->n_views = 0, m->n_params = 0;
    m->lora_view = mallocCheck(rows * sizeof(int));
    m->lora_a = callocCheck(rows, sizeof(size_t));
    if (fedsb) m->lora_b = callocCheck(rows, sizeof(size_t));
    for (size_t i = 0; i < rows; i++) m->lora_view[i] = -1;
    for (int l = 0; l < L; l++)
        for (int r = 0; r < m->arch->n_tensors; r++) {
            const ArchTensor *t = &m->arch->tensors[r];
            if (!(t->lora & a->targets) || m->row_view[r * L + l] < 0) continue;
            int out, in;
            adapter_dims(m, r, &out, &in);
            const char *base = m->base_views[m->row_view[r * L + l]].name;
            size_t stem = strlen(base) - (strstr(base, ".weight") ? strlen(".weight") : 0);
            char name[64];
            if (fedit) {
                m->lora_a[r * L + l] = m->n_params;
                snprintf(name, sizeof name, "%.*s.lora_A", (int)stem, base);
                adapter_view(m, name, R, in);
            } else { /* A beside the table: it neither trains nor travels */
                m->lora_a[r * L + l] = n_frozen;
                n_frozen += (size_t)R * in;
            }
            m->lora_view[r * L + l] = m->n_views;
            if (fedsb) { /* B beside it too, and R between them is the table */
                m->lora_b[r * L + l] = n_frozen;
                n_frozen += (size_t)out * R;
                snprintf(name, sizeof name, "%.*s.lora_R", (int)stem, base);
                adapter_view(m, name, R, R);
            } else {
                snprintf(name, sizeof name, "%.*s.lora_B", (int)stem, base);
                adapter_view(m, name, out, R);
            }
        }
    assert(m->n_views == n * (fedit ? 2 : 1));
    m->params = callocCheck(m->n_params, sizeof(float));
    m->grads = callocCheck(m->n_params, sizeof(float));
    if (!fedit) m->lora_frozen = callocCheck(n_frozen ? n_frozen : 1, sizeof(float));
    /* A as PEFT draws it (kaiming_uniform with a = sqrt(5): uniform in
     * ±1/sqrt(in)) from 24-bit uniforms, layer by layer in table order; B
     * zero, so nothing changes yet. Fed-SB's B is drawn the same way as
     * the rank-in layer it is (uniform in ±1/sqrt(rank), PyTorch's default
     * for a Linear(rank, out)), from its own stream: then A, R and B each
     * keep a vector's scale within a constant (about 1/sqrt(3) each), so
     * R's entries and their steps weigh what a LoRA's do; R starts at zero,
     * so nothing changes yet either. */
    uint64_t s = (fedit ? seed : a->a_seed) ^ 0x4c6f5241ull; /* "LoRA": not the base's stream */
    uint64_t sb = a->a_seed ^ 0x4c6f5242ull;                 /* "LoRB": Fed-SB's B */
    for (int l = 0; l < L; l++)
        for (int r = 0; r < m->arch->n_tensors; r++) {
            if (m->lora_view[r * L + l] < 0) continue;
            int out, in;
            adapter_dims(m, r, &out, &in);
            float bound = 1.0f / sqrtf((float)in);
            float *A = (fedit ? m->params : m->lora_frozen) + m->lora_a[r * L + l];
            for (size_t k = 0; k < (size_t)R * in; k++)
                A[k] = bound * (float)((double)(rng_next(&s) >> 40) / 8388608.0 - 1.0);
            if (!fedsb) continue;
            float *B = m->lora_frozen + m->lora_b[r * L + l];
            bound = 1.0f / sqrtf((float)R);
            for (size_t k = 0; k < (size_t)out * R; k++)
                B[k] = bound * (float)((double)(rng_next(&sb) >> 40) / 8388608.0 - 1.0);
        }
    m->table_hash = table_hash(m->views, m->n_views);
    m->cfg.lora = *a;
    m->cfg.lora.base = model_base_fingerprint(m);
    m->cfg.lora.base_seed = -1;
    return 0;
}

int model_table_rows(const Model *m) {
    return m->arch->n_tensors;
}

void model_drop_held(Model *m) {
    if (m->held_close) m->held_close(m->held_file);
    free(m->held);
    m->held = NULL, m->n_held = 0, m->held_file = NULL, m->held_close = NULL;
}

void model_free(Model *m) {
    model_drop_held(m);
    free(m->cpu.scratch);
    if (m->base_mapped)
        munmap(m->base, m->base_mapped);
    else
        free(m->base);
    if (m->base16) munmap(m->base16, m->base16_mapped);
    free(m->base_views);
    free(m->views), free(m->row_view), free(m->lora_view), free(m->lora_a), free(m->lora_b);
    free(m->lora_frozen);
    free(m->params), free(m->grads);
    free(m->m), free(m->v), free(m->mh), free(m->vh), free(m->params16);
    free(m->acts), free(m->dacts), free(m->inputs), free(m->targets);
    memset(m, 0, sizeof *m);
}
