/*
 * model.c — the model without its compute (API: model.h): presets, the
 * parameter table and seeded initialisation. No op is called here, so
 * readers of model files (and their fuzz targets) can build a table
 * without BLAS.
 *
 * Ownership: a GPT owns params, grads, m, v and its activation buffers;
 * gpt_free releases all of them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/model.h"
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

double gpt_config_params(const GPTConfig *c) {
    double C = c->C, L = c->L;
    return (double)c->Vp * C + (double)c->T * C + L * (12.0 * C * C + 13.0 * C) + 2.0 * C;
}

double gpt_train_bytes(const GPTConfig *c, int B, int T) {
    double n = gpt_config_params(c);
    /* parameters, gradients, AdamW's two moments; the activations and
     * their gradients of one step (about 16 C per token per layer and the
     * logits' chunk, twice) */
    return 16.0 * n + 8.0 * B * T * (16.0 * c->L * c->C + 8.0 * c->C + 8192);
}

int gpt_config_shape(GPTConfig *cfg, const char *name, long long L, long long C, long long NH,
                     long long T, long long V, char *err) {
    if (L < 1 || L > 256 || NH < 1 || C < 1 || C > 65536 || C % NH != 0 || T < 1 || T > (1 << 20) ||
        V < 2 || V > (1 << 22))
        return err_set(err,
                       "not a GPT-2 shape this strait builds: %lld layers, %lld channels, %lld "
                       "heads, context %lld, vocabulary %lld (1-256 layers, channels to 65536 "
                       "and a multiple of heads, context to 2^20, vocabulary 2 to 2^22)",
                       L, C, NH, T, V);
    /* the table's size, before anything is allocated: a claimed shape must
     * not be able to exhaust memory (GPT-2 XL has 1.6 billion) */
    GPTConfig probe = {.L = (int)L, .C = (int)C, .T = (int)T, .V = (int)V};
    probe.Vp = (probe.V + 63) / 64 * 64;
    double params = gpt_config_params(&probe);
    if (params > 4e9)
        return err_set(err,
                       "a shape of %.2f billion parameters; this strait builds at most 4 billion "
                       "(16 GB in fp32)",
                       params / 1e9);
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->name, sizeof cfg->name, "%s", name);
    cfg->L = (int)L, cfg->C = (int)C, cfg->NH = (int)NH, cfg->T = (int)T, cfg->V = (int)V;
    cfg->Vp = (cfg->V + 63) / 64 * 64;
    return 0;
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
