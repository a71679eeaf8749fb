/*
 * train.c — the one trainer (API: train.h): AdamW, the schedule, a step on
 * the CPU or the site's GPUs, a whole run, and the held-out evaluator.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/data.h"
#include "kernels/device.h"
#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "kernels/model.h"
#include "kernels/ops.h"
#include "kernels/half.h"
#include "kernels/ranks.h"
#include "kernels/train.h"
#include "util/util.h"
#ifdef STRAIT_HAVE_CUDA
#include "kernels/cuda.h"
#endif

void model_adamw_step(Model *m, const AdamWConfig *o, float lr) {
    model_adamw_step_scaled(m, o, lr, 1.0f);
}

/* The part of the table whose moments m keeps (ZeRO-1: its rank's share) */
static void moments_range(const Model *m, size_t *lo, size_t *hi) {
    *lo = m->moments_hi ? m->moments_lo : 0, *hi = m->moments_hi ? m->moments_hi : m->n_params;
}

/* view v's part inside [lo, hi): its first value's index in v, and count (0: none) */
static size_t view_part(const ParamView *v, size_t lo, size_t hi, size_t *first) {
    size_t a = v->offset > lo ? v->offset : lo,
           b = v->offset + v->numel < hi ? v->offset + v->numel : hi;
    *first = a - v->offset;
    return b > a ? b - a : 0;
}

/* AdamW with its moments kept in bf16: read, updated in fp32, rounded back */
static void adamw_bf16(Model *m, const AdamWConfig *o, float lr, float grad_scale) {
    size_t lo, hi;
    moments_range(m, &lo, &hi);
    if (m->mh == NULL) {
        m->mh = callocCheck(hi - lo ? hi - lo : 1, sizeof(uint16_t));
        m->vh = callocCheck(hi - lo ? hi - lo : 1, sizeof(uint16_t));
    }
    m->step++;
    float bc1 = 1.0f - powf(o->beta1, (float)m->step), bc2 = 1.0f - powf(o->beta2, (float)m->step);
    for (int i = 0; i < m->n_views; i++) {
        const ParamView *v = &m->views[i];
        size_t first, n = view_part(v, lo, hi, &first);
        if (n == 0) continue; /* outside this share */
        float wd = v->ndim >= 2 ? o->weight_decay : 0.0f;
        float *p = m->params + v->offset + first, *g = m->grads + v->offset + first;
        uint16_t *mm = m->mh + (v->offset + first - lo), *vv = m->vh + (v->offset + first - lo);
        const float b1 = o->beta1, b2 = o->beta2, eps = o->eps, ib1 = 1.0f / bc1, ib2 = 1.0f / bc2;
#pragma omp parallel for schedule(static)
        for (size_t k = 0; k < n; k++) {
            float gk = g[k] * grad_scale;
            float mk = b1 * bf16_to_float(mm[k]) + (1.0f - b1) * gk;
            float vk = b2 * bf16_to_float(vv[k]) + (1.0f - b2) * gk * gk;
            mm[k] = float_to_bf16(mk), vv[k] = float_to_bf16(vk);
            p[k] -= lr * (mk * ib1 / (sqrtf(vk * ib2) + eps) + wd * p[k]);
        }
    }
}

void model_adamw_step_scaled(Model *m, const AdamWConfig *o, float lr, float grad_scale) {
    assert(m->params != NULL && m->grads != NULL && m->step >= 0);
    assert(grad_scale >= 0 && grad_scale <= 1); /* clipping only scales down */
    if (m->moments_bf16) {
        adamw_bf16(m, o, lr, grad_scale);
        return;
    }
    size_t lo, hi;
    moments_range(m, &lo, &hi);
    if (m->m == NULL) {
        m->m = callocCheck(hi - lo ? hi - lo : 1, sizeof(float));
        m->v = callocCheck(hi - lo ? hi - lo : 1, sizeof(float));
    }
    m->step++;
    float bc1 = 1.0f - powf(o->beta1, (float)m->step), bc2 = 1.0f - powf(o->beta2, (float)m->step);
    for (int i = 0; i < m->n_views; i++) {
        const ParamView *v = &m->views[i];
        size_t first, n = view_part(v, lo, hi, &first);
        if (n == 0) continue;                             /* outside this share */
        float wd = v->ndim >= 2 ? o->weight_decay : 0.0f; /* no decay on biases and norms */
        float *p = m->params + v->offset + first, *g = m->grads + v->offset + first;
        float *mm = m->m + (v->offset + first - lo), *vv = m->v + (v->offset + first - lo);
        const float b1 = o->beta1, b2 = o->beta2, eps = o->eps, ib1 = 1.0f / bc1, ib2 = 1.0f / bc2;
#pragma omp parallel for simd schedule(static)
        for (size_t k = 0; k < n; k++) {
            float gk = g[k] * grad_scale;
            float mk = b1 * mm[k] + (1.0f - b1) * gk, vk = b2 * vv[k] + (1.0f - b2) * gk * gk;
            mm[k] = mk, vv[k] = vk;
            p[k] -= lr * (mk * ib1 / (sqrtf(vk * ib2) + eps) + wd * p[k]);
        }
    }
}

float lr_schedule(int step, int total, int warmup, float max_lr, float min_lr_frac) {
    assert(step >= 0 && warmup >= 0);
    if (step < warmup) return max_lr * (float)(step + 1) / (float)warmup;
    if (total <= warmup) return max_lr;
    float progress = (float)(step - warmup) / (float)(total - warmup);
    if (progress > 1) progress = 1;
    float min_lr = max_lr * min_lr_frac;
    return min_lr + 0.5f * (max_lr - min_lr) * (1.0f + cosf(3.14159265358979f * progress));
}

TrainConfig train_defaults(float lr, int total_steps) {
    TrainConfig c = {{0.9f, 0.95f, 1e-8f, 0.1f}, lr, 0.1f, 1.0f, 0, total_steps, 0, 0, 1};
    c.warmup = total_steps / 10 < 100 ? total_steps / 10 : 100;
    return c;
}

float train_lr(const TrainConfig *c, int step) {
    return lr_schedule(step, c->total_steps, c->warmup, c->lr, c->min_lr_frac);
}

/* ---- the trainer ---------------------------------------------------------------------- */

struct Trainer {
    Model *m;
    TrainConfig c;
    int B, T, replicas;
    TrainCollectives coll; /* mean NULL: one process */
    /* ZeRO-1 across CPU ranks (NULL: none): the shares' bounds (ranks_shards), this rank's place */
    size_t *shard;
    int rank, size;
#ifdef STRAIT_HAVE_CUDA
    ModelCuda *gpu;
#endif
};

static void ranks_coll_mean(void *ctx, float *x, size_t n) {
    (void)ctx;
    ranks_mean(x, n);
}
static void ranks_coll_root(void *ctx, float *x, size_t n) {
    (void)ctx;
    ranks_bcast(x, n * sizeof *x);
}

/* The moments of a table share: m's (its whole, at rank 0 when whole) */
static void *moments_of(const Model *m, int k) {
    return m->moments_bf16 ? (void *)(k ? m->vh : m->mh) : (void *)(k ? m->v : m->m);
}
static void moments_set(Model *m, void *mm, void *vv) {
    if (m->moments_bf16)
        m->mh = mm, m->vh = vv;
    else
        m->m = mm, m->v = vv;
}

/* ZeRO-1: this rank keeps its share of the moments; rank 0's whole ones
 * (a resumed state's, loaded there alone) go to their owners */
static void shard_moments(Trainer *t, const Ranks *rk) {
    Model *m = t->m;
    t->rank = rk->rank, t->size = rk->size;
    t->shard = mallocCheck(sizeof(size_t) * (size_t)(rk->size + 1));
    ranks_shards(m->n_params, t->shard);
    size_t lo = t->shard[rk->rank], hi = t->shard[rk->rank + 1];
    size_t el = m->moments_bf16 ? 2 : 4, n = hi - lo ? hi - lo : 1;
    int have = moments_of(m, 0) != NULL;
    ranks_bcast(&have, sizeof have);
    m->moments_lo = lo, m->moments_hi = hi;
    if (!have) return; /* AdamW makes them at its first step, at the share's size */
    void *own[2] = {callocCheck(n, el), callocCheck(n, el)};
    for (int k = 0; k < 2; k++) {
        ranks_scatter(moments_of(m, k), own[k], el, t->shard);
        if (rk->rank == 0) free(moments_of(m, k));
    }
    moments_set(m, own[0], own[1]);
}

/* model_save_optimizer_from's pieces at rank 0: its own share's bytes,
 * and the other ranks' from them (they send in the same order) */
static void fill_from_shares(void *ctx, int k, size_t at, size_t n, void *buf) {
    Trainer *t = ctx;
    size_t el = t->m->moments_bf16 ? 2 : 4;
    for (int r = 0; r < t->size; r++) {
        size_t lo = t->shard[r] > at ? t->shard[r] : at;
        size_t hi = t->shard[r + 1] < at + n ? t->shard[r + 1] : at + n;
        if (hi <= lo) continue;
        char *to = (char *)buf + (lo - at) * el;
        if (r == 0)
            memcpy(to, (const char *)moments_of(t->m, k) + (lo - t->shard[0]) * el, (hi - lo) * el);
        else
            ranks_recv(to, (hi - lo) * el, r);
    }
}

int trainer_will_shard(size_t n_params, int ranks, int gpus, int zero) {
    return ranks > 1 && gpus == 0 && zero && n_params >= (size_t)ranks * RANKS_ALIGN;
}

const char *trainer_precision_refusal(int gpus, int adapted) {
    if (adapted)
        return "--precision bf16 is for whole-model training; with adapters the base's precision "
               "is --lora-base-dtype's (bf16 by default on CPUs)";
    if (gpus == 0 && !bf16_units())
        return "--precision bf16 needs a chip with bf16 instructions (AVX-512 BF16 or AMX) or a "
               "GPU; this one has none: train in fp32";
    return NULL;
}

int trainer_sharded(const Trainer *t) {
    return t->shard != NULL;
}

int trainer_save_moments(Trainer *t, const char *path, char *err) {
    Model *m = t->m;
    if (t->shard == NULL) return path ? model_save_optimizer(m, path, err) : 0;
    if (moments_of(m, 0) == NULL) /* no step yet, on any rank */
        return path ? err_set(err, "%s: no optimizer state to save (no step has run)", path) : 0;
    size_t el = m->moments_bf16 ? 2 : 4, lo = t->shard[t->rank], hi = t->shard[t->rank + 1];
    if (t->rank == 0) {
        assert(path != NULL);
        return model_save_optimizer_from(m, path, (int)el, fill_from_shares, t, err);
    }
    /* the pieces rank 0's writer asks for, in its order: this share's part of each */
    for (int k = 0; k < 2; k++)
        for (size_t at = 0; at < m->n_params; at += MODEL_SAVE_PIECE) {
            size_t end = at + MODEL_SAVE_PIECE < m->n_params ? at + MODEL_SAVE_PIECE : m->n_params;
            size_t a = lo > at ? lo : at, b = hi < end ? hi : end;
            if (b > a) ranks_send((const char *)moments_of(m, k) + (a - lo) * el, (b - a) * el, 0);
        }
    return 0;
}

/* A ZeRO-1 step after the backward: the gradients' mean of each share at
 * its owner, the norm from every share's block sums (the unsharded
 * norm's, in the same order), AdamW on this rank's share, the shares to
 * all. Every sum as the unsharded step makes it (ranks_mean sums a share
 * at its owner too), so the parameters are the same bits. */
static float sharded_update(Trainer *t, float loss, float lr, float *grad_norm) {
    Model *m = t->m;
    enum { BLOCK = MODEL_NORM_BLOCK };
    _Static_assert(RANKS_ALIGN % MODEL_NORM_BLOCK == 0, "a share holds whole norm blocks");
    assert(m->moments_hi == t->shard[t->rank + 1]);
    ranks_mean_owned(m->grads, t->shard);
    size_t n = m->n_params, blocks = (n + BLOCK - 1) / BLOCK;
    size_t *bb = mallocCheck(sizeof(size_t) * (size_t)(t->size + 1));
    for (int r = 0; r <= t->size; r++) bb[r] = (t->shard[r] + BLOCK - 1) / BLOCK;
    double *part = mallocCheck((blocks ? blocks : 1) * sizeof(double)), s = 0;
    model_grad_sumsq(m, t->shard[t->rank], t->shard[t->rank + 1], part + bb[t->rank]);
    ranks_share(part, sizeof(double), bb);
    for (size_t b = 0; b < blocks; b++) s += part[b];
    free(part), free(bb);
    float norm = (float)sqrt(s), max = t->c.max_grad_norm;
    float scale[3] = {max > 0 && norm > max ? max / norm : 1.0f, norm, loss};
    ranks_mean(&scale[2], 1); /* the loss over every rank's batch */
    ranks_bcast(scale, 2 * sizeof(float));
    if (grad_norm) *grad_norm = scale[1];
    model_adamw_step_scaled(m, &t->c.adamw, lr, scale[0]);
    ranks_share(m->params, sizeof(float), t->shard);
    return scale[2];
}

Trainer *trainer_create(Model *m, const TrainConfig *c, int gpus, int B, int T, char *err) {
    return trainer_create_ranks(m, c, gpus, B, T, NULL, err);
}

Trainer *trainer_create_ranks(Model *m, const TrainConfig *c, int gpus, int B, int T,
                              const Ranks *rk, char *err) {
    int ranks = rk ? rk->size : 1;
    if (B < 1 || T < 1 || T > m->cfg.T || gpus < 0) {
        err_set(err, "batches of %d x %d do not fit a model of context %d", B, T, m->cfg.T);
        return NULL;
    }
#ifndef STRAIT_HAVE_CUDA
    if (gpus > 0) {
        err_set(err, "this strait was built without CUDA; train on the CPU");
        return NULL;
    }
#endif
    if (gpus > 0 && m->moments_bf16) {
        err_set(err, "bf16 AdamW moments are kept on the CPU only; on GPUs use --moments fp32");
        return NULL;
    }
    Trainer *t = callocCheck(1, sizeof *t);
    t->m = m, t->c = *c, t->B = B, t->T = T, t->replicas = gpus > 0 ? gpus : 1;
    if (ranks > 1 && gpus == 0)
        t->coll = (TrainCollectives){ranks_coll_mean, ranks_coll_root, NULL};
    if (trainer_will_shard(m->n_params, ranks, gpus, c->zero)) shard_moments(t, rk);
#ifdef STRAIT_HAVE_CUDA
    uint8_t id[MODEL_CUDA_NCCL_ID_BYTES] = {0};
    int id_ok = 1;
    if (ranks > 1 && gpus > 0) { /* rank 0's NCCL id to every rank; all fail together */
        if (rk->rank == 0) id_ok = model_cuda_nccl_id(id) == 0;
        ranks_bcast(&id_ok, sizeof id_ok);
        ranks_bcast(id, sizeof id);
    }
    if (!id_ok) {
        err_set(err, "rank 0 could not make an NCCL id for the site's GPUs");
        free(t);
        return NULL;
    }
    if (gpus > 0 &&
        (t->gpu = model_cuda_create_world(m, gpus, B, T, rk ? rk->rank : 0, ranks,
                                          ranks > 1 ? id : NULL, c->zero, err)) == NULL) {
        free(t);
        return NULL;
    }
    if (gpus > 0) kernels_cuda_set_tf32(c->tf32); /* once the plugin has answered */
    if (gpus > 1 && ranks == 1 && c->zero)        /* model_cuda_create_world's rule */
        log_info("train",
                 "AdamW's moments sharded over %d GPUs (ZeRO-1): about %zu values a GPU, not "
                 "%zu (--zero 0 keeps them whole)",
                 gpus, (m->n_params + (size_t)gpus - 1) / (size_t)gpus, m->n_params);
#endif
    return t;
}

void trainer_free(Trainer *t) {
    if (t == NULL) return;
#ifdef STRAIT_HAVE_CUDA
    if (t->gpu) model_cuda_free(t->gpu);
#endif
    free(t->shard);
    free(t);
}

int trainer_replicas(const Trainer *t) {
    return t->replicas;
}
Model *trainer_model(Trainer *t) {
    return t->m;
}

float trainer_step(Trainer *t, const int *in, const int *tg, float lr, float *grad_norm) {
    if (grad_norm) *grad_norm = NAN;
    Model *m = t->m;
    assert(tg != NULL && t->B >= 1 && t->T >= 1 && t->T <= m->cfg.T);
    /* this step's masks, for its forward and backward alone (the GPUs'
     * too: their passes read the host's seed), from the steps taken */
    if (m->cfg.lora.dropout > 0) {
        uint64_t step = (uint64_t)m->step;
#ifdef STRAIT_HAVE_CUDA
        if (t->gpu) step = (uint64_t)model_cuda_steps(t->gpu);
#endif
        m->drop_seed = mix64(t->c.seed + step * 0x9E3779B97F4A7C15ull) | 1;
    }
#ifdef STRAIT_HAVE_CUDA
    if (t->gpu) {
        float loss = model_cuda_step(t->gpu, in, tg, &t->c.adamw, lr, t->c.max_grad_norm);
        m->drop_seed = 0;
        return loss;
    }
#endif
    float loss = model_forward(m, in, tg, t->B, t->T);
    model_zero_grad(m);
    model_backward(m);
    m->drop_seed = 0;
    if (t->shard) return sharded_update(t, loss, lr, grad_norm);
    if (t->coll.mean) t->coll.mean(t->coll.ctx, m->grads, m->n_params);
    /* clipping folded into AdamW: one pass over the gradients fewer */
    float norm = model_grad_norm(m), max = t->c.max_grad_norm;
    float scale[3] = {max > 0 && norm > max ? max / norm : 1.0f, norm, loss};
    if (t->coll.mean) {
        t->coll.mean(t->coll.ctx, &scale[2], 1); /* the loss over every rank's batch */
        t->coll.root(t->coll.ctx, scale, 2);
    }
    if (grad_norm) *grad_norm = scale[1];
    model_adamw_step_scaled(m, &t->c.adamw, lr, scale[0]);
    return scale[2];
}

int trainer_set_collectives(Trainer *t, const TrainCollectives *c, char *err) {
#ifdef STRAIT_HAVE_CUDA
    if (t->gpu && c) return err_set(err, "a GPU trainer does not take part in ranks yet");
#endif
    (void)err;
    if (c)
        t->coll = *c;
    else
        memset(&t->coll, 0, sizeof t->coll);
    return 0;
}

void trainer_to_host(Trainer *t, int what) {
#ifdef STRAIT_HAVE_CUDA
    if (t->gpu) model_cuda_to_host(t->gpu, t->m, what);
#else
    (void)t, (void)what;
#endif
}

void trainer_from_host(Trainer *t, int what) {
#ifdef STRAIT_HAVE_CUDA
    if (t->gpu) model_cuda_load_from_host(t->gpu, t->m, what);
#else
    (void)t, (void)what;
#endif
}

int trainer_keep_base(Trainer *t) {
#ifdef STRAIT_HAVE_CUDA
    if (t->gpu) {
        model_cuda_keep_base(t->gpu);
        return 0;
    }
#endif
    (void)t;
    return -1;
}

int trainer_device_params(Trainer *t, const float **d_params, const float **d_base) {
#ifdef STRAIT_HAVE_CUDA
    if (t->gpu) {
        *d_params = model_cuda_params(t->gpu, d_base);
        return *d_base ? 0 : -1;
    }
#endif
    (void)t, (void)d_params, (void)d_base;
    return -1;
}

int train_run(Model *m, const TrainConfig *c, TokenView data, int gpus, int B, int T, uint64_t seed,
              TrainObserver obs, void *ctx, char *err) {
    Loader ld;
    if (loader_init(&ld, data, B, T, 0, 1, seed, err) != 0) return -1;
    TrainConfig tc = *c;
    if (tc.seed == 0) tc.seed = seed; /* the dropout masks' too */
    Trainer *t = trainer_create(m, &tc, gpus, B, T, err);
    if (t == NULL) return -1;
    size_t span = (size_t)B * T * (size_t)t->replicas;
    int *in = mallocCheck(sizeof(int) * span), *tg = mallocCheck(sizeof(int) * span);
    uint64_t t0 = time_monotonic_ns();
    int rc = 0;
    for (int s = 0; s < c->total_steps && rc == 0; s++) {
        for (int r = 0; r < t->replicas; r++)
            loader_next(&ld, in + (size_t)r * B * T, tg + (size_t)r * B * T);
        TrainProgress p = {s + 1, c->total_steps, 0, train_lr(c, s), NAN, 0};
        p.loss = trainer_step(t, in, tg, p.lr, &p.grad_norm);
        double secs = (double)(time_monotonic_ns() - t0) / 1e9;
        p.tokens_per_s = secs > 0 ? (double)(s + 1) * (double)span / secs : 0;
        if (obs && obs(ctx, t, &p) != 0) rc = err_set(err, "training stopped at step %d", s + 1);
    }
    trainer_to_host(t, TRAINER_PARAMS | TRAINER_MOMENTS);
    free(in), free(tg);
    trainer_free(t);
    return rc;
}

/* ---- the held-out evaluator ------------------------------------------------------------ */

/* The held-out score over the first `batches` consecutive (B, T) spans of
 * v, each batch's loss from loss(ctx, inputs, targets). */
typedef float (*BatchLoss)(void *ctx, const int *in, const int *tg, int B, int T);

static double eval_batches(TokenView v, int B, int T, int batches, BatchLoss loss, void *ctx) {
    size_t span = (size_t)B * T;
    int fit = v.n > span ? (int)((v.n - 1) / span) : 0;
    if (fit < batches) batches = fit;
    if (batches <= 0) return NAN;
    int *in = mallocCheck(sizeof(int) * span), *tg = mallocCheck(sizeof(int) * span);
    double sum = 0;
    for (int k = 0; k < batches; k++) {
        const uint32_t *t = v.tokens + (size_t)k * span;
        for (size_t i = 0; i < span; i++) in[i] = t[i], tg[i] = t[i + 1];
        sum += loss(ctx, in, tg, B, T);
    }
    free(in), free(tg);
    return sum / batches;
}

static float cpu_loss(void *m, const int *in, const int *tg, int B, int T) {
    return model_forward(m, in, tg, B, T);
}

double model_eval_tokens(Model *m, TokenView v, int B, int T, int batches) {
    return eval_batches(v, B, T, batches, cpu_loss, m);
}

#ifdef STRAIT_HAVE_CUDA
static float gpu_loss(void *g, const int *in, const int *tg, int B, int T) {
    (void)B, (void)T; /* the replicas' own */
    return model_cuda_loss(g, in, tg);
}
#endif

double trainer_eval_tokens(Trainer *t, TokenView v, int batches) {
#ifdef STRAIT_HAVE_CUDA
    if (t->gpu) return eval_batches(v, t->B, t->T, batches, gpu_loss, t->gpu);
#endif
    return model_eval_tokens(t->m, v, t->B, t->T, batches);
}

int model_eval_checkpoint(const char *ckpt, const char *const *paths, int n_paths, int B, int T,
                          int batches, double *loss, char *err) {
    ModelConfig cfg;
    Model m;
    TokenSet ts;
    if (model_read_config(ckpt, &cfg, NULL, err) != 0) return -1;
    if (T > cfg.T) T = cfg.T;
    if (model_load_checkpoint(&m, &cfg, ckpt, NULL, err) != 0) return -1;
    int rc = tokens_load(&ts, paths, n_paths, err);
    if (rc == 0) {
        if (ts.vocab > cfg.V)
            rc = err_set(err, "the data's vocabulary (%d) is larger than the model's (%d)",
                         ts.vocab, cfg.V);
        TokenView v = {ts.tokens, ts.n};
        if (rc == 0) *loss = model_eval_tokens(&m, v, B, T, batches);
        if (rc == 0 && isnan(*loss))
            rc = err_set(err, "%zu tokens are too few for one batch of %d x %d", ts.n, B, T);
        tokens_free(&ts);
    }
    model_free(&m);
    return rc;
}

int train_job(const TrainJob *j, void (*started)(void *ctx, const TrainJobStart *s),
              TrainObserver obs, void *ctx, char *err) {
    ModelConfig cfg;
    Model m;
    memset(&m, 0, sizeof m);
    const char *name = j->init_from ? j->init_from : j->preset;
    if (j->adapters && (!j->init_from || j->lora.rank > 0))
        return err_set(err, "a PEFT adapter folder goes over its base (--init-from), and brings "
                            "its own rank, alpha and targets");
    if (j->adapters) { /* adapters over their base, to go on from */
        if (model_import_adapted(&m, j->init_from, j->adapters, err) != 0) return -1;
        cfg = m.cfg;
    } else if (j->init_from) { /* the pretrained model's shape, and its weights */
        if ((j->lora.rank > 0 ? model_import_frozen(&m, j->init_from, err)
                              : model_import(&m, j->init_from, err)) != 0)
            return -1;
        cfg = m.cfg;
    } else if (model_config_preset(j->preset, &cfg) != 0) {
        return err_set(err, "unknown model '%s'; use one of %s", j->preset, model_preset_names());
    }
    int T = j->T ? j->T : cfg.T, rc = -1;
    TokenSet ts = {0};
    if (T > cfg.T) {
        err_set(err, "--seq %d is longer than %s's %d", T, name, cfg.T);
        goto out;
    }
    if (tokens_load(&ts, j->data, j->n_data, err) != 0 ||
        model_config_fit_tokens(&cfg, j->vocab, j->init_from != NULL, &ts, name, err) != 0)
        goto out;
    TokenView train, val;
    tokens_split(&ts, 0.1, &train, &val);
    if (!j->init_from && model_build(&m, &cfg, j->seed, err) != 0) goto out;
    if (j->lora.rank > 0 && model_add_adapters(&m, &j->lora, j->seed, err) != 0) goto out;
    if (j->lora.rank > 0 && !j->init_from) m.cfg.lora.base_seed = (int64_t)j->seed; /* drawn */
    m.moments_bf16 = j->moments_bf16;
    const char *no_bf16 =
        j->precision_bf16 ? trainer_precision_refusal(j->gpus, j->lora.rank > 0) : NULL;
    if (no_bf16) {
        err_set(err, "%s", no_bf16);
        goto out;
    }
    m.precision_bf16 = j->precision_bf16;
    m.recompute = j->recompute;
    m.blocks_off = j->blocks_off;
    TrainJobStart st = {.name = name,
                        .n_params = m.n_params,
                        .train_tokens = train.n,
                        .n_frozen = m.base ? m.n_base : 0,
                        .base_bf16 = m.cfg.lora.base_bf16 && j->gpus == 0, /* GPUs: fp32 */
                        .val = val,
                        .T = T};
    if (started) started(ctx, &st);
    TrainConfig tc = train_defaults(j->lr, j->steps);
    tc.tf32 = j->tf32; /* the dropout masks' seed: train_run's, j->seed */
    tc.zero = !j->unsharded;
    if (train_run(&m, &tc, train, j->gpus, j->B, T, j->seed, obs, ctx, err) != 0) goto out;
    rc = j->out ? model_save(&m, j->out, j->steps, err) : 0;
out:
    model_free(&m);
    tokens_free(&ts);
    return rc;
}
