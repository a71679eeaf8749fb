/*
 * lora_rules.c — federated LoRA's aggregation rules compared on the same
 * runs: FedIT (A and B averaged apart: the naive baseline), FFA-LoRA (A
 * frozen at one shared draw, B averaged: exact), FedEx-LoRA (FedIT's means
 * plus the residual mean(s·B_i·A_i) − s·mean(B)·mean(A) folded into the
 * base: exact, and the base changes every round) and Fed-SB (A and B
 * frozen at one shared draw, the r x r R between them averaged: exact),
 * FFA and Fed-SB also at a larger step of their own; beside two references
 * at equal tokens: centralized LoRA (one model, every site's batches, as
 * many steps as the sites together) and the whole model fine-tuned by the
 * same federation with plain averaging.
 *
 * A federation simulated in one process (the network is measured by
 * bench/net and bench/wan): N sites, each its own Strait model, trainer
 * (AdamW, the schedule over every inner step of the federation, moments
 * kept from round to round, as `strait site run` keeps them) and loader,
 * each over its own text (non-IID: an English collection of Debian's
 * fortunes and German, Spanish and Italian ones, byte-level), R rounds of
 * H steps from the global model, then the rule's aggregate. The shared
 * base is the byte-level llama-small drawn from a seed and pretrained a
 * little on fortunes no site holds, so that fine-tuning starts from a
 * model of text. Held out: the last 10% of every site's text, which no
 * site and no reference trains on, as a site splits its data.
 *
 * Each rule's line: held-out loss per site and their mean after the last
 * round; the exactness error of every round's aggregate, ‖ΔW_agg − mean
 * ΔW_i‖ / ‖mean ΔW_i‖ over every adapted matrix (the sites' effective
 * weights W + s·B·A or W + s·B·R·A, in fp64); bytes a site sends and
 * receives each round (fp32 values x 4; FedEx's downlink includes the
 * residual of every adapted matrix); and the loss's ratio to centralized
 * LoRA's and to full fine-tuning's. Every aggregate is checked before it
 * is reported (the global adapters are the sites' mean to the bit, what
 * FFA and Fed-SB freeze never moves, a base that is not folded never
 * moves, FedEx's folded base is the same at every site each round, an
 * exact rule's ΔW is the sites' mean every round): a check that fails ends
 * the run without a number.
 *
 * Sizes: 4 sites, 8 rounds of 10 steps, batches of 8 x 128, rank 8 on
 * every projection, alpha 16 at every rank (fixed, as PEFT's users keep
 * it: under AdamW the update's size then does not grow with the rank, and
 * one learning rate serves every rank), the base in fp32 for every rule:
 * about 4 minutes on one thread. The learning rates (1e-2 for LoRA, 3e-3
 * for the whole model) are the best of a sweep of the references (3e-2 to
 * 1e-3; 1e-2 to 3e-4). Byte-level llama-small, not SmolLM2: the default's
 * eight trainings of 327,680 tokens each would take SmolLM2's LoRA step
 * (about 300 tokens/s on this machine's two cores) over two hours, and
 * four sites fine-tuning all of it would hold four copies of its AdamW
 * state (about 9 GB).
 *
 *   build/bench/lora_rules [--full] [--rank R] [--sites N] [--rounds R]
 *                          [--steps H] [--lr X] [--full-lr X] [--alpha A]
 *                          [--rules LIST] [--targets LIST] [--threads N]
 *   (--full: more rounds and steps, ranks 8, 16 and 64)
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/data.h"
#include "kernels/device.h"
#include "kernels/model.h"
#include "kernels/train.h"
#include "util/util.h"

#define FORTUNES     "/usr/share/games/fortunes/"
#define MAX_SITES    8
#define EVAL_BATCHES 8
#define PRETRAIN_LR  3e-3f

/* the sites' text, one collection each, and the base's (none of the sites') */
static const char *const SITE_TEXT[MAX_SITES] = {FORTUNES "science",
                                                 FORTUNES "de/witze",
                                                 FORTUNES "es/refranes.fortunes",
                                                 FORTUNES "it/italia",
                                                 FORTUNES "wisdom",
                                                 FORTUNES "de/zitate",
                                                 FORTUNES "es/sabiduria.fortunes",
                                                 FORTUNES "it/zuse"};
static const char *const BASE_TEXT = FORTUNES "cookie";

/* An aggregation rule: the adapters' rule in kernels/ (what trains and
 * travels: A and B, B alone, or R), whose mean is the aggregate, and what
 * the bench adds to it (FedEx's fold of the residual into the base). */
typedef struct Rule {
    const char *name, *what;
    int lora_rule;  /* LORA_RULE_* */
    int fold;       /* FedEx-LoRA: the residual into the base, sent down with it */
    float lr_scale; /* times the learning rate every LoRA rule shares */
} Rule;

static const Rule RULES[] = {
    {.name = "fedit",
     .what = "FedIT: A and B trained, averaged apart (the naive baseline)",
     .lora_rule = LORA_RULE_FEDIT,
     .lr_scale = 1},
    {.name = "ffa",
     .what = "FFA-LoRA: A frozen at one shared draw, B averaged (exact)",
     .lora_rule = LORA_RULE_FFA,
     .lr_scale = 1},
    /* with A frozen, ΔW is linear in B: alpha and the step are one knob,
     * and the step tuned for the others is not FFA's own */
    {.name = "ffa_lr3x",
     .what = "FFA-LoRA at 3x the learning rate the other LoRA rules share",
     .lora_rule = LORA_RULE_FFA,
     .lr_scale = 3},
    {.name = "fedex",
     .what = "FedEx-LoRA: A and B averaged apart, the residual mean(s B_i A_i) - s mean(B) "
             "mean(A) folded into the base (exact)",
     .lora_rule = LORA_RULE_FEDIT,
     .fold = 1,
     .lr_scale = 1},
    {.name = "fedsb",
     .what = "Fed-SB: A and B frozen at one shared draw, the r x r R between them trained and "
             "averaged (exact)",
     .lora_rule = LORA_RULE_FEDSB,
     .lr_scale = 1},
    /* R alone trains (rank² values a projection): at the shared step it
     * barely moves (3x and 10x were better still in a sweep) */
    {.name = "fedsb_lr10x",
     .what = "Fed-SB at 10x the learning rate the other LoRA rules share",
     .lora_rule = LORA_RULE_FEDSB,
     .lr_scale = 10},
};
#define N_RULES (int)(sizeof RULES / sizeof RULES[0])

typedef struct Setup {
    int sites, rounds, H, B, T, threads;
    unsigned targets;
    float lr, full_lr, alpha;
    uint64_t seed;
    Model base; /* the pretrained base, no adapters */
    TokenSet text[MAX_SITES];
    TokenView train[MAX_SITES], val[MAX_SITES];
    char names[MAX_SITES][48];
} Setup;

/* What a run measured. */
typedef struct Result {
    double loss[MAX_SITES], mean;
    double exact_err; /* the last round's; NAN: not a federation */
    double worst_err; /* the worst round's */
    double *by_round; /* every round's (owned; NULL: not a federation) */
    double up, down;  /* bytes per round per site */
    double seconds;
    size_t trained; /* values that train at a site */
} Result;

/* ---- models ------------------------------------------------------------------------- */

/* a copy of the pretrained base (its values, fresh optimizer state) */
static void base_copy(const Setup *s, Model *m) {
    char err[ERR_LEN];
    if (model_build(m, &s->base.cfg, s->seed, err) != 0) DIE("%s", err);
    if (m->n_params != s->base.n_params) DIE("the base's table changed between two builds");
    memcpy(m->params, s->base.params, sizeof(float) * m->n_params);
}

/* the base with adapters of rank `rank` under lora_rule (LORA_RULE_*),
 * over the base in fp32 (base_bf16 0: every rule and the full fine-tune
 * compute alike): every model of a run draws its adapters from the run's
 * seed (also the shared a_seed of what ffa and fedsb freeze) */
static void adapted_copy(const Setup *s, Model *m, int rank, int lora_rule) {
    char err[ERR_LEN];
    base_copy(s, m);
    AdapterConfig a = {.rank = rank,
                       .alpha = s->alpha,
                       .targets = s->targets,
                       .rule = lora_rule,
                       .a_seed = s->seed,
                       .base_bf16 = 0};
    if (model_add_adapters(m, &a, s->seed, err) != 0) DIE("%s", err);
}

/* An adapted projection: table row r at layer l, with index r * L + l. */
typedef struct Row {
    int r, l, in, out;
} Row;

/* The adapted rows of m, layer by layer in table order. */
static int adapted_rows(const Model *m, Row *rows) {
    int n = 0;
    for (int l = 0; l < m->cfg.L; l++)
        for (int r = 0; r < model_table_rows(m); r++) {
            LoraAt at;
            if (model_lora_at(m, m->params, r, l, &at)) rows[n++] = (Row){r, l, at.in, at.out};
        }
    return n;
}

/* W + s·B·A (fedsb: W + s·B·R·A) of row `w` in fp64 (without adapters: W),
 * into eff (out x in); ra: rank x in scratch */
static void effective(const Model *m, const Row *w, double *eff, double *ra) {
    int L = m->cfg.L, vi = m->row_view[w->r * L + w->l];
    if (vi < 0) DIE("row %d of layer %d has no weight in the base", w->r, w->l);
    const ParamView *v = &model_base_views(m)[vi];
    if ((size_t)w->in * w->out != v->numel) DIE("%s is not %d x %d", v->name, w->out, w->in);
    const float *W = model_base(m) + v->offset;
    for (size_t k = 0; k < v->numel; k++) eff[k] = W[k];
    LoraAt at;
    if (m->cfg.lora.rank == 0 || !model_lora_at(m, m->params, w->r, w->l, &at)) return;
    int R = m->cfg.lora.rank, in = at.in;
    double sc = (double)m->cfg.lora.alpha / R;
    for (int r = 0; r < R; r++) /* R·A, or A */
        for (int i = 0; i < in; i++) {
            double x = 0;
            if (at.R)
                for (int k = 0; k < R; k++) x += (double)at.R[r * R + k] * at.A[(size_t)k * in + i];
            else
                x = at.A[(size_t)r * in + i];
            ra[(size_t)r * in + i] = x;
        }
    for (int o = 0; o < at.out; o++)
        for (int r = 0; r < R; r++) {
            double b = sc * at.B[(size_t)o * R + r];
            const double *a = ra + (size_t)r * in;
            double *e = eff + (size_t)o * in;
            for (int i = 0; i < in; i++) e[i] += b * a[i];
        }
}

/* ---- one federation ---------------------------------------------------------------------- */

typedef struct Fed {
    const Setup *s;
    const Rule *rule; /* NULL: the whole model trains */
    int rank;
    Model g, site[MAX_SITES];
    Trainer *tr[MAX_SITES];
    Loader ld[MAX_SITES];
    TrainConfig tc;
    Row *rows;
    int n_rows;
    size_t n_cells; /* the adapted matrices' values */
    double *ra;     /* effective's scratch: rank x the widest input */
} Fed;

/* the sites' loaders: the same batches in every run of the bench */
static void loaders(const Setup *s, Loader *ld) {
    char err[ERR_LEN];
    for (int i = 0; i < s->sites; i++)
        if (loader_init(&ld[i], s->train[i], s->B, s->T, 0, 1, s->seed + 1 + (uint64_t)i, err) != 0)
            DIE("%s: %s", s->names[i], err);
}

/* ‖agg − mean_i W_i‖ / ‖mean_i W_i − start‖ over every adapted matrix,
 * where `mean` holds mean_i W_i − start (made by fed_mean_update) */
static double fed_exactness(Fed *f, const double *mean, const double *start) {
    double *eff = mallocCheck(sizeof(double) * f->n_cells), num = 0, den = 0;
    size_t at = 0;
    for (int k = 0; k < f->n_rows; k++) {
        size_t n = (size_t)f->rows[k].in * f->rows[k].out;
        effective(&f->g, &f->rows[k], eff, f->ra);
        for (size_t c = 0; c < n; c++) {
            double want = start[at + c] + mean[at + c], d = eff[c] - want;
            num += d * d, den += mean[at + c] * mean[at + c];
        }
        at += n;
    }
    free(eff);
    return den > 0 ? sqrt(num / den) : NAN;
}

/* before the aggregate: the global model's effective weights (start) and
 * the sites' mean update (mean_i W_i − start), fp64 */
static void fed_mean_update(Fed *f, double *mean, double *start) {
    double *eff = mallocCheck(sizeof(double) * f->n_cells);
    size_t at = 0;
    for (int k = 0; k < f->n_rows; k++) {
        size_t n = (size_t)f->rows[k].in * f->rows[k].out;
        effective(&f->g, &f->rows[k], start + at, f->ra);
        memset(mean + at, 0, sizeof(double) * n);
        for (int i = 0; i < f->s->sites; i++) {
            effective(&f->site[i], &f->rows[k], eff, f->ra);
            for (size_t c = 0; c < n; c++) mean[at + c] += (eff[c] - start[at + c]) / f->s->sites;
        }
        at += n;
    }
    free(eff);
}

/* FedEx-LoRA's fold: W ← W + s·(mean_i B_i A_i − mean(B) mean(A)) for every
 * adapted matrix, from this round's sites' own adapters, before the global
 * adapters become the means; summed in fp64, added to the fp32 base. */
static void fedex_fold(Fed *f, float *Bm, float *Am) {
    const Model *g = &f->g;
    int R = f->rank, L = g->cfg.L, N = f->s->sites;
    double sc = (double)g->cfg.lora.alpha / R;
    for (int k = 0; k < f->n_rows; k++) {
        const Row *w = &f->rows[k];
        const float *A[MAX_SITES], *B[MAX_SITES];
        int in = w->in, out = w->out;
        for (int i = 0; i < N; i++) {
            LoraAt at;
            if (!model_lora_at(&f->site[i], f->site[i].params, w->r, w->l, &at) || at.in != in ||
                at.out != out || at.R != NULL)
                DIE("site %d's adapter at row %d, layer %d is not the global one's", i, w->r, w->l);
            A[i] = at.A, B[i] = at.B;
        }
        for (size_t c = 0; c < (size_t)R * in; c++) { /* mean(A), mean(B) as FedIT makes them */
            double a = 0;
            for (int i = 0; i < N; i++) a += A[i][c];
            Am[c] = (float)(a / N);
        }
        for (size_t c = 0; c < (size_t)out * R; c++) {
            double b = 0;
            for (int i = 0; i < N; i++) b += B[i][c];
            Bm[c] = (float)(b / N);
        }
        float *W = f->g.base + f->g.base_views[f->g.row_view[w->r * L + w->l]].offset;
        for (int o = 0; o < out; o++)
            for (int c = 0; c < in; c++) {
                double sum = 0, ofmean = 0;
                for (int r = 0; r < R; r++) {
                    for (int i = 0; i < N; i++)
                        sum += (double)B[i][(size_t)o * R + r] * A[i][(size_t)r * in + c];
                    ofmean += (double)Bm[(size_t)o * R + r] * Am[(size_t)r * in + c];
                }
                W[(size_t)o * in + c] = (float)(W[(size_t)o * in + c] + sc * (sum / N - ofmean));
            }
    }
    /* base_bf16 0: no bf16 copy of the base to make again */
    assert(f->g.cpu.f32 == NULL);
}

/* the mean of what the sites trained, fp64 summed; the global's table */
static void fed_mean(Fed *f) {
    size_t n = f->g.n_params;
    for (size_t k = 0; k < n; k++) {
        double sum = 0;
        for (int i = 0; i < f->s->sites; i++) sum += f->site[i].params[k];
        f->g.params[k] = (float)(sum / f->s->sites);
    }
}

/* What the rule freezes (ffa: A; fedsb: A and B) of m, row by row, into
 * out (NULL: only its count); compared with a snapshot, it never moves. */
static size_t frozen(const Fed *f, const Model *m, float *out) {
    size_t n = 0;
    for (int k = 0; k < f->n_rows; k++) {
        LoraAt at;
        if (!model_lora_at(m, m->params, f->rows[k].r, f->rows[k].l, &at))
            DIE("row %d of layer %d lost its adapter", f->rows[k].r, f->rows[k].l);
        size_t a = (size_t)f->rank * at.in, b = at.R ? (size_t)at.out * f->rank : 0;
        if (out) memcpy(out + n, at.A, sizeof(float) * a);
        if (out && b) memcpy(out + n + a, at.B, sizeof(float) * b);
        n += a + b;
    }
    return n;
}

static int frozen_same(const Fed *f, const Model *m, const float *snap, float *scratch, size_t n) {
    frozen(f, m, scratch);
    return memcmp(scratch, snap, sizeof(float) * n) == 0;
}

/* One federation under rule (NULL: the whole model, plain averaging). */
static Result federate(const Setup *s, const Rule *rule, int rank, const Row *rows, int n_rows) {
    Fed f = {.s = s, .rule = rule, .rank = rank};
    char err[ERR_LEN];
    uint64_t t0 = time_monotonic_ns();
    int lora = rule != NULL, N = s->sites;
    if (lora)
        adapted_copy(s, &f.g, rank, rule->lora_rule);
    else
        base_copy(s, &f.g);
    f.rows = mallocCheck(sizeof(Row) * (size_t)(n_rows > f.g.n_views ? n_rows : f.g.n_views));
    f.n_rows = lora ? adapted_rows(&f.g, f.rows) : n_rows;
    if (!lora) memcpy(f.rows, rows, sizeof(Row) * (size_t)n_rows);
    if (f.n_rows != n_rows) DIE("%s: %d adapted matrices, not %d", rule->name, f.n_rows, n_rows);
    for (int k = 0; k < n_rows; k++) f.n_cells += (size_t)f.rows[k].in * f.rows[k].out;
    f.tc = train_defaults(lora ? s->lr * rule->lr_scale : s->full_lr, s->rounds * s->H);
    for (int i = 0; i < N; i++) {
        if (lora)
            adapted_copy(s, &f.site[i], rank, rule->lora_rule);
        else
            base_copy(s, &f.site[i]);
        if ((f.tr[i] = trainer_create(&f.site[i], &f.tc, 0, s->B, s->T, err)) == NULL)
            DIE("%s", err);
    }
    loaders(s, f.ld);
    uint64_t base_fp = model_base_fingerprint(&f.g);
    /* what ffa and fedsb freeze, as drawn: the same every round, everywhere */
    int freezes = lora && rule->lora_rule != LORA_RULE_FEDIT;
    size_t n_frozen = freezes ? frozen(&f, &f.g, NULL) : 0;
    float *snap = freezes ? mallocCheck(sizeof(float) * n_frozen) : NULL,
          *now = freezes ? mallocCheck(sizeof(float) * n_frozen) : NULL;
    if (freezes) frozen(&f, &f.g, snap);
    int widest = 0;
    for (int k = 0; k < n_rows; k++) {
        int w = f.rows[k].in > f.rows[k].out ? f.rows[k].in : f.rows[k].out;
        widest = w > widest ? w : widest;
    }
    float *Am = mallocCheck(sizeof(float) * (size_t)rank * widest),
          *Bm = mallocCheck(sizeof(float) * (size_t)rank * widest);
    f.ra = mallocCheck(sizeof(double) * (size_t)(rank ? rank : 1) * widest);
    double *mean = mallocCheck(sizeof(double) * f.n_cells),
           *start = mallocCheck(sizeof(double) * f.n_cells);
    int *in = mallocCheck(sizeof(int) * (size_t)s->B * s->T),
        *tg = mallocCheck(sizeof(int) * (size_t)s->B * s->T);
    Result res = {.exact_err = NAN,
                  .trained = f.g.n_params,
                  .by_round = mallocCheck(sizeof(double) * (size_t)s->rounds)};
    for (int round = 0; round < s->rounds; round++) {
        /* the round's download: the global adapters (or model), and the
         * folded base with FedEx; one base for every site, checked */
        uint64_t g_fp = model_base_fingerprint(&f.g);
        for (int i = 0; i < N; i++) {
            memcpy(f.site[i].params, f.g.params, sizeof(float) * f.g.n_params);
            if (lora && rule->fold) {
                memcpy(f.site[i].base, f.g.base, sizeof(float) * f.g.n_base);
                assert(f.site[i].cpu.f32 == NULL); /* fp32 base: no copy to make again */
            }
            if (model_base_fingerprint(&f.site[i]) != g_fp)
                DIE("round %d: site %d's base is not the global one", round, i);
        }
        for (int i = 0; i < N; i++)
            for (int h = 0; h < s->H; h++) {
                loader_next(&f.ld[i], in, tg);
                trainer_step(f.tr[i], in, tg, train_lr(&f.tc, round * s->H + h), NULL);
            }
        fed_mean_update(&f, mean, start);
        if (lora && rule->fold) fedex_fold(&f, Bm, Am); /* from the sites' adapters, first */
        fed_mean(&f);
        /* the aggregate is what the rule says it is: the global table the
         * sites' mean to the bit (recomputed), the base untouched unless
         * folded, FFA's A where it was drawn */
        for (size_t k = 0; k < f.g.n_params; k++) {
            double sum = 0;
            for (int i = 0; i < N; i++) sum += f.site[i].params[k];
            if (f.g.params[k] != (float)(sum / N))
                DIE("round %d: the global value %zu is not the sites' mean", round, k);
        }
        if (lora && !rule->fold && model_base_fingerprint(&f.g) != base_fp)
            DIE("round %d: the base moved under a rule that leaves it frozen", round);
        if (lora && rule->fold && model_base_fingerprint(&f.g) == g_fp)
            DIE("round %d: FedEx's residual left the base as it was", round);
        if (freezes) {
            if (!frozen_same(&f, &f.g, snap, now, n_frozen))
                DIE("round %d: what %s freezes moved in the global model", round, rule->name);
            for (int i = 0; i < N; i++)
                if (!frozen_same(&f, &f.site[i], snap, now, n_frozen))
                    DIE("round %d: what %s freezes moved at site %d", round, rule->name, i);
        }
        res.exact_err = res.by_round[round] = fed_exactness(&f, mean, start);
        res.worst_err = fmax(res.worst_err, res.exact_err);
        /* an exact rule's aggregate is the sites' mean update, to fp32's rounding */
        if ((!lora || freezes || rule->fold) && !(res.exact_err < 1e-4))
            DIE("round %d: %s claims an exact aggregate and is %.3g off", round,
                lora ? rule->name : "full fine-tuning", res.exact_err);
    }
    for (int i = 0; i < N; i++)
        res.loss[i] = model_eval_tokens(&f.g, s->val[i], s->B, s->T, EVAL_BATCHES);
    res.up = 4.0 * (double)f.g.n_params;
    res.down = res.up + (lora && rule->fold ? 4.0 * (double)f.n_cells : 0);
    res.seconds = (double)(time_monotonic_ns() - t0) / 1e9;
    for (int i = 0; i < N; i++) trainer_free(f.tr[i]), model_free(&f.site[i]);
    model_free(&f.g);
    free(f.rows), free(f.ra), free(snap), free(now), free(Am), free(Bm), free(mean), free(start),
        free(in), free(tg);
    return res;
}

/* Centralized LoRA at equal tokens: one model takes every site's batches,
 * the same ones the federation's sites take, in turn: N x R x H steps. */
static Result centralized(const Setup *s, int rank) {
    Model m;
    char err[ERR_LEN];
    uint64_t t0 = time_monotonic_ns();
    adapted_copy(s, &m, rank, LORA_RULE_FEDIT);
    Loader ld[MAX_SITES];
    loaders(s, ld);
    int steps = s->sites * s->rounds * s->H;
    TrainConfig tc = train_defaults(s->lr, steps);
    Trainer *t = trainer_create(&m, &tc, 0, s->B, s->T, err);
    if (t == NULL) DIE("%s", err);
    int *in = mallocCheck(sizeof(int) * (size_t)s->B * s->T),
        *tg = mallocCheck(sizeof(int) * (size_t)s->B * s->T);
    for (int k = 0; k < steps; k++) {
        loader_next(&ld[k % s->sites], in, tg);
        trainer_step(t, in, tg, train_lr(&tc, k), NULL);
    }
    Result res = {.exact_err = NAN, .trained = m.n_params};
    for (int i = 0; i < s->sites; i++)
        res.loss[i] = model_eval_tokens(&m, s->val[i], s->B, s->T, EVAL_BATCHES);
    res.seconds = (double)(time_monotonic_ns() - t0) / 1e9;
    trainer_free(t);
    model_free(&m);
    free(in), free(tg);
    return res;
}

/* ---- output ---------------------------------------------------------------------------- */

static void mean_loss(const Setup *s, Result *r) {
    r->mean = 0;
    for (int i = 0; i < s->sites; i++) r->mean += r->loss[i] / s->sites;
}

static json_t *line(const Setup *s, const char *rule, const char *what, int rank, double lr,
                    const Result *r) {
    json_t *o = json_object(), *per = json_object();
    json_object_set_new(o, "bench", json_string("lora_rules"));
    json_object_set_new(o, "rule", json_string(rule));
    json_object_set_new(o, "what", json_string(what));
    json_object_set_new(o, "sites", json_integer(s->sites));
    json_object_set_new(o, "rounds", json_integer(s->rounds));
    json_object_set_new(o, "steps", json_integer(s->H));
    json_object_set_new(o, "tokens",
                        json_integer((json_int_t)s->sites * s->rounds * s->H * s->B * s->T));
    json_object_set_new(o, "rank", rank ? json_integer(rank) : json_null());
    if (rank) json_object_set_new(o, "alpha", json_real(s->alpha));
    if (rank) {
        char names[64];
        model_lora_targets_names(s->targets, names, sizeof names);
        json_object_set_new(o, "targets", json_string(names));
    }
    json_object_set_new(o, "lr", lr > 0 ? json_real(lr) : json_null());
    json_object_set_new(o, "trained_values", json_integer((json_int_t)r->trained));
    for (int i = 0; i < s->sites; i++) json_object_set_new(per, s->names[i], json_real(r->loss[i]));
    json_object_set_new(o, "held_out_loss", per);
    json_object_set_new(o, "held_out_loss_mean", json_real(r->mean));
    json_object_set_new(o, "exactness_rel_err",
                        isnan(r->exact_err) ? json_null() : json_real(r->exact_err));
    json_object_set_new(o, "exactness_rel_err_worst_round",
                        isnan(r->exact_err) ? json_null() : json_real(r->worst_err));
    if (r->by_round) {
        json_t *a = json_array();
        for (int k = 0; k < s->rounds; k++) json_array_append_new(a, json_real(r->by_round[k]));
        json_object_set_new(o, "exactness_rel_err_by_round", a);
    }
    json_object_set_new(o, "bytes_up_per_round_per_site", json_real(r->up));
    json_object_set_new(o, "bytes_down_per_round_per_site", json_real(r->down));
    json_object_set_new(o, "seconds", json_real(r->seconds));
    return o;
}

static void ratios(json_t *o, const Result *r, const Result *central, const Result *full) {
    json_object_set_new(o, "baseline",
                        json_string("centralized LoRA and full fine-tuning "
                                    "(FedAvg), same base, batches and tokens, "
                                    "measured in this run"));
    if (central)
        json_object_set_new(o, "loss_vs_centralized_lora", json_real(r->mean / central->mean));
    json_object_set_new(o, "loss_vs_full_ft", json_real(r->mean / full->mean));
}

/* ---- setup ----------------------------------------------------------------------------- */

static const char *arg_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) DIE("%s needs a value", argv[*i]);
    return argv[++*i];
}

static float arg_lr(int argc, char **argv, int *i) {
    const char *flag = argv[*i], *v = arg_value(argc, argv, i);
    char *end;
    double x = strtod(v, &end);
    if (*end || !(x > 0 && x < 1)) DIE("%s %s: use a learning rate between 0 and 1", flag, v);
    return (float)x;
}

/* "fedit,fedsb"-style lists of RULES' names, as bits of their rows */
static unsigned rules_parse(const char *list) {
    unsigned bits = 0;
    char copy[256];
    snprintf(copy, sizeof copy, "%s", list);
    for (char *save = NULL, *name = strtok_r(copy, ",", &save); name;
         name = strtok_r(NULL, ",", &save)) {
        int r = 0;
        while (r < N_RULES && strcmp(RULES[r].name, name) != 0) r++;
        if (r == N_RULES)
            DIE("--rules: '%s' is not one of fedit, ffa, ffa_lr3x, fedex, fedsb, fedsb_lr10x",
                name);
        bits |= 1u << r;
    }
    if (bits == 0) DIE("--rules: name at least one rule");
    return bits;
}

static int arg_int(int argc, char **argv, int *i, int lo, int hi) {
    const char *flag = argv[*i], *v = arg_value(argc, argv, i);
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) DIE("%s %s: use a whole number from %d to %d", flag, v, lo, hi);
    return (int)x;
}

/* the base: llama-small drawn from the seed and trained `steps` on BASE_TEXT */
static void pretrain(Setup *s, int steps) {
    char err[ERR_LEN];
    ModelConfig cfg;
    TokenSet ts;
    const char *path = BASE_TEXT;
    if (model_config_preset("llama-small", &cfg) != 0) DIE("no llama-small preset");
    if (tokens_load(&ts, &path, 1, err) != 0) DIE("%s", err);
    if (model_config_fit_tokens(&cfg, 256, 0, &ts, "llama-small", err) != 0) DIE("%s", err);
    if (model_build(&s->base, &cfg, s->seed, err) != 0) DIE("%s", err);
    TrainConfig tc = train_defaults(PRETRAIN_LR, steps);
    TokenView all = {ts.tokens, ts.n};
    if (train_run(&s->base, &tc, all, 0, s->B, s->T, s->seed, NULL, NULL, err) != 0) DIE("%s", err);
    tokens_free(&ts);
}

int main(int argc, char **argv) {
    Setup s = {.sites = 4,
               .rounds = 8,
               .H = 10,
               .B = 8,
               .T = 128,
               .threads = 1,
               .targets = LORA_ALL,
               .lr = 1e-2f,
               .alpha = 16,
               .full_lr = 3e-3f,
               .seed = 1234};
    int full = 0, rank = 0, pre_steps = 150;
    unsigned want_rules = (1u << N_RULES) - 1;
    char err[ERR_LEN];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--full") == 0)
            full = 1;
        else if (strcmp(argv[i], "--rank") == 0)
            rank = arg_int(argc, argv, &i, 1, 128);
        else if (strcmp(argv[i], "--sites") == 0)
            s.sites = arg_int(argc, argv, &i, 2, MAX_SITES);
        else if (strcmp(argv[i], "--rounds") == 0)
            s.rounds = arg_int(argc, argv, &i, 1, 10000);
        else if (strcmp(argv[i], "--steps") == 0)
            s.H = arg_int(argc, argv, &i, 1, 10000);
        else if (strcmp(argv[i], "--lr") == 0)
            s.lr = arg_lr(argc, argv, &i);
        else if (strcmp(argv[i], "--alpha") == 0)
            s.alpha = (float)arg_int(argc, argv, &i, 1, 4096);
        else if (strcmp(argv[i], "--full-lr") == 0)
            s.full_lr = arg_lr(argc, argv, &i);
        else if (strcmp(argv[i], "--rules") == 0)
            want_rules = rules_parse(arg_value(argc, argv, &i));
        else if (strcmp(argv[i], "--targets") == 0) {
            if (model_lora_targets_parse(arg_value(argc, argv, &i), &s.targets, err) != 0)
                DIE("--targets: %s", err);
        } else if (strcmp(argv[i], "--threads") == 0)
            s.threads = arg_int(argc, argv, &i, 1, 256);
        else
            DIE("unknown flag %s; use --full, --rank R, --sites N, --rounds R, --steps H, "
                "--lr X, --full-lr X, --alpha A, --rules fedit,ffa,..., --targets q,v,..., "
                "--threads N",
                argv[i]);
    }
    int ranks[3] = {rank ? rank : 8, 16, 64}, n_ranks = full && !rank ? 3 : 1;
    if (full) s.rounds *= 2, s.H *= 2, pre_steps *= 2;
    log_set_level(LOG_ERROR);
    kernels_set_threads(s.threads);
    uint64_t t0 = time_monotonic_ns();
    pretrain(&s, pre_steps);
    for (int i = 0; i < s.sites; i++) {
        const char *path = SITE_TEXT[i];
        if (tokens_load(&s.text[i], &path, 1, err) != 0) DIE("%s", err);
        tokens_split(&s.text[i], 0.1, &s.train[i], &s.val[i]);
        if (s.val[i].n <= (size_t)EVAL_BATCHES * s.B * s.T)
            DIE("%s: %zu held-out bytes, fewer than %d batches of %d x %d", path, s.val[i].n,
                EVAL_BATCHES, s.B, s.T);
        snprintf(s.names[i], sizeof s.names[i], "%s", path + strlen(FORTUNES));
    }
    /* the base before any fine-tuning, on the same held-out text */
    Result before = {.exact_err = NAN};
    for (int i = 0; i < s.sites; i++)
        before.loss[i] = model_eval_tokens(&s.base, s.val[i], s.B, s.T, EVAL_BATCHES);
    mean_loss(&s, &before);
    before.seconds = (double)(time_monotonic_ns() - t0) / 1e9;
    before.trained = s.base.n_params;
    json_t *o = line(&s, "base", "the pretrained base before fine-tuning", 0, PRETRAIN_LR, &before);
    json_object_del(o, "rounds"), json_object_del(o, "steps"), json_object_del(o, "tokens");
    json_object_set_new(o, "pretrain_text", json_string(BASE_TEXT));
    json_object_set_new(o, "pretrain_steps", json_integer(pre_steps));
    json_object_set_new(o, "pretrain_tokens", json_integer((json_int_t)pre_steps * s.B * s.T));
    json_emit_line(stdout, o);
    fflush(stdout);
    /* the adapted matrices (the full fine-tune's exactness is over the same) */
    Model probe;
    adapted_copy(&s, &probe, 1, LORA_RULE_FEDIT);
    Row *rows = mallocCheck(sizeof(Row) * (size_t)probe.n_views);
    int n_rows = adapted_rows(&probe, rows);
    model_free(&probe);
    Result fullft = federate(&s, NULL, 0, rows, n_rows);
    mean_loss(&s, &fullft);
    o = line(&s, "full_ft", "every parameter trained, plain FedAvg over the same rounds", 0,
             s.full_lr, &fullft);
    ratios(o, &fullft, NULL, &fullft);
    json_emit_line(stdout, o);
    fflush(stdout);
    for (int k = 0; k < n_ranks; k++) {
        Result central = centralized(&s, ranks[k]);
        mean_loss(&s, &central);
        o = line(&s, "centralized_lora",
                 "one model, every site's batches in turn, as many steps as all sites", ranks[k],
                 s.lr, &central);
        ratios(o, &central, &central, &fullft);
        json_object_set_new(o, "bytes_up_per_round_per_site", json_null());
        json_object_set_new(o, "bytes_down_per_round_per_site", json_null());
        json_emit_line(stdout, o);
        fflush(stdout);
        for (int r = 0; r < N_RULES; r++) {
            const Rule *rule = &RULES[r];
            if (!(want_rules >> r & 1)) continue;
            Result res = federate(&s, rule, ranks[k], rows, n_rows);
            mean_loss(&s, &res);
            o = line(&s, rule->name, rule->what, ranks[k], s.lr * rule->lr_scale, &res);
            ratios(o, &res, &central, &fullft);
            json_emit_line(stdout, o);
            fflush(stdout);
            free(res.by_round);
        }
    }
    free(fullft.by_round);
    free(rows);
    for (int i = 0; i < s.sites; i++) tokens_free(&s.text[i]);
    model_free(&s.base);
    return 0;
}
