/*
 * settings.c — federation.ini's round settings, read and range-checked
 * whole before the store opens, and the recipes: named sets of uplink
 * codec, downlink codec, outer optimizer and error-feedback decay that are
 * known to train together (docs/tuning.md has the sweep behind each).
 *
 * A recipe only supplies defaults: a key written in [codec] or [optimizer]
 * overrides its value, and an outer optimizer chosen apart from the
 * recipe's gets that optimizer's own defaults (FedAvg is lr 1, no
 * momentum; Nesterov 0.7 and 0.3; Adam 0.01 with β1 0.9).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "coordinator_internal.h"
#include "security/security.h"
#include "util/util.h"

typedef struct Recipe {
    const char *name;
    const char *uplink;   /* codec name (codec_params_parse) */
    const char *downlink; /* codec name, "uplink" (the same codec and parameters) or "lossless" */
    const char *outer;
    double lr, momentum;
    double ef_decay; /* the sites' error feedback: e ← decay·e + Δ */
    double density;  /* top-k: kept fraction (0: the codec's default) */
} Recipe;

/* The defaults come from the sweep in docs/tuning.md (tiny model, two
 * sites, ten rounds of 25 and 50 steps): where it and the papers'
 * settings part, the table says why. */
static const Recipe RECIPES[] = {
    /* DiLoCo with INTELLECT-1's int8 pseudo-gradients and int8 outer
     * updates down. DiLoCo's lr 0.7 with momentum 0.9 (an effective step
     * of 7 Δ̄, tuned at H = 500) never left the unigram plateau in ten
     * rounds of 25-50 steps; momentum 0.3 was the best of nine settings */
    {"diloco", "int8", "uplink", "nesterov", 0.7, 0.3, 1.0, 0},
    /* SparseLoCo: top-k with 2-bit values both ways, error feedback with
     * decay 0.95 in place of outer momentum, outer lr 1. Its 64 of 4096
     * (1.6%) left the global model at 1.43x the centralized loss after ten
     * rounds; 256 of 4096 (6.25%) at 1.14x, for 2.4x the bytes */
    {"sparseloco", "topk2", "uplink", "avg", 1.0, 0.0, 0.95, 256.0 / 4096},
    /* FedAvg as Flower runs it: fp32 up, the exact model down, θ ← θ − Δ̄ */
    {"fedavg", "fp32", "lossless", "avg", 1.0, 0.0, 1.0, 0},
    /* FedAdam (Reddi et al. 2021) over int8 updates */
    {"fedadam", "int8", "uplink", "adam", 0.01, 0.9, 1.0, 0},
};

/* An outer optimizer's own defaults, when it is chosen apart from a recipe. */
static void outer_defaults(OuterKind k, double *lr, double *momentum) {
    *lr = k == OUTER_NESTEROV ? 0.7 : k == OUTER_ADAM ? 0.01 : 1.0;
    *momentum = k == OUTER_NESTEROV ? 0.3 : k == OUTER_ADAM ? 0.9 : 0.0;
}

int rounds_recipe_known(const char *name) {
    for (size_t i = 0; i < sizeof RECIPES / sizeof RECIPES[0]; i++)
        if (strcmp(RECIPES[i].name, name) == 0) return 1;
    return 0;
}

/* "diloco, sparseloco, fedavg or fedadam", from the table */
static char recipe_names[160];
static void list_recipes(void) {
    size_t n = 0, count = sizeof RECIPES / sizeof RECIPES[0];
    for (size_t i = 0; i < count && n < sizeof recipe_names; i++)
        n += (size_t)snprintf(recipe_names + n, sizeof recipe_names - n, "%s%s",
                              i == 0           ? ""
                              : i + 1 == count ? " or "
                                               : ", ",
                              RECIPES[i].name);
}

const char *rounds_recipe_names(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, list_recipes);
    return recipe_names;
}

const char *coordinator_recipe_names(void) {
    return rounds_recipe_names();
}

/* The recipe's codecs and optimizer, with the keys written in the file over them. */
static int read_recipe(const Config *cfg, RoundsSettings *o, char *err) {
    const char *name = config_get_str(cfg, "recipe", "name", "diloco");
    const Recipe *rc = NULL;
    for (size_t i = 0; i < sizeof RECIPES / sizeof RECIPES[0]; i++)
        if (strcmp(RECIPES[i].name, name) == 0) rc = &RECIPES[i];
    if (rc == NULL)
        return err_set(err, "federation.ini: [recipe] name = %s; use %s", name,
                       rounds_recipe_names());
    snprintf(o->recipe, sizeof o->recipe, "%s", rc->name);
    const char *up = config_get_str(cfg, "codec", "uplink", rc->uplink);
    const char *down = config_get_str(cfg, "codec", "downlink", rc->downlink);
    const char *outer = config_get_str(cfg, "optimizer", "outer", rc->outer);
    if (codec_params_parse(up, &o->uplink, err) != 0)
        return err_set(err, "federation.ini: [codec] uplink = %s; use %s", up, codec_names());
    /* top-k's kept fraction, for whichever direction uses top-k */
    double density = rc->density > 0 ? rc->density : codec_params_default(CODEC_TOPK).density;
    if (config_get_double(cfg, "codec", "density", density, &density, err) != 0) return -1;
    if (!(density >= 1e-6 && density <= 0.5))
        return err_set(err, "federation.ini: [codec] density = %g; use 0.000001 to 0.5", density);
    if (o->uplink.id == CODEC_TOPK) o->uplink.density = density;
    o->downlink_lossless = strcmp(down, "lossless") == 0;
    if (strcmp(down, "uplink") == 0) {
        o->downlink = o->uplink;
    } else if (!o->downlink_lossless) {
        if (codec_params_parse(down, &o->downlink, NULL) != 0)
            return err_set(err,
                           "federation.ini: [codec] downlink = %s; use uplink (the same "
                           "codec), lossless or a codec: %s",
                           down, codec_names());
        if (o->downlink.id == CODEC_TOPK) o->downlink.density = density;
    }
    char why[ERR_LEN];
    if (codec_params_check(&o->uplink, why) != 0 ||
        (!o->downlink_lossless && codec_params_check(&o->downlink, why) != 0))
        return err_set(err, "federation.ini: [codec]: %s", why);
    if (outer_kind_parse(outer, &o->outer) != 0)
        return err_set(err, "federation.ini: [optimizer] outer = %s; use nesterov, avg or adam",
                       outer);
    double lr = rc->lr, momentum = rc->momentum;
    OuterKind recipe_outer;
    outer_kind_parse(rc->outer, &recipe_outer);
    if (o->outer != recipe_outer) outer_defaults(o->outer, &lr, &momentum);
    if (config_get_double(cfg, "optimizer", "lr", lr, &o->outer_lr, err) ||
        config_get_double(cfg, "optimizer", "momentum", momentum, &o->momentum, err) ||
        config_get_double(cfg, "codec", "ef_decay", rc->ef_decay, &o->ef_decay, err) ||
        config_get_double(cfg, "optimizer", "eps", 1e-3, &o->adam_eps, err))
        return -1;
    if (!(o->adam_eps > 0 && o->adam_eps <= 1))
        return err_set(err, "federation.ini: [optimizer] eps = %g; use more than 0, at most 1",
                       o->adam_eps);
    if (!(o->outer_lr > 0 && o->outer_lr <= 10))
        return err_set(err, "federation.ini: [optimizer] lr = %g; use more than 0, at most 10",
                       o->outer_lr);
    if (!(o->momentum >= 0 && o->momentum < 1))
        return err_set(err, "federation.ini: [optimizer] momentum = %g; use 0 to less than 1",
                       o->momentum);
    if (o->outer == OUTER_AVG && o->momentum != 0)
        return err_set(err,
                       "federation.ini: [optimizer] momentum = %g with outer = avg, which "
                       "has none; use nesterov for momentum, or momentum = 0",
                       o->momentum);
    if (!(o->ef_decay > 0 && o->ef_decay <= 1))
        return err_set(err, "federation.ini: [codec] ef_decay = %g; use more than 0, at most 1",
                       o->ef_decay);
    return 0;
}

/* [model] adapter = lora with rank, alpha and targets (adapter = none or
 * absent: the whole model trains, and the three must be absent) */
static int adapter_settings_read(const Config *cfg, AdapterConfig *a, char *err) {
    memset(a, 0, sizeof *a);
    const char *adapter = config_get_str(cfg, "model", "adapter", "none");
    int lora = strcmp(adapter, "lora") == 0;
    if (!lora && strcmp(adapter, "none") != 0)
        return err_set(err, "federation.ini: [model] adapter = %s; use lora or none", adapter);
    if (!lora) {
        if (config_get(cfg, "model", "rank") || config_get(cfg, "model", "alpha") ||
            config_get(cfg, "model", "targets") || config_get(cfg, "model", "rule") ||
            config_get(cfg, "model", "base_dtype") || config_get(cfg, "model", "dropout"))
            return err_set(err, "federation.ini: [model] rank, alpha, targets, rule, base_dtype "
                                "and dropout are the adapters'; set adapter = lora, or remove "
                                "them");
        return 0;
    }
    int64_t rank;
    double alpha;
    if (config_get_int(cfg, "model", "rank", 8, 1, LORA_RANK_MAX, &rank, err) ||
        config_get_double(cfg, "model", "alpha", (double)rank, &alpha, err))
        return -1;
    if (!(alpha > 0 && alpha < 1e6))
        return err_set(err,
                       "federation.ini: [model] alpha = %g; use more than 0 (PEFT's "
                       "lora_alpha: the adapters' output is scaled by alpha / rank)",
                       alpha);
    char why[ERR_LEN];
    a->rank = (int)rank, a->alpha = (float)alpha;
    if (model_lora_targets_parse(config_get_str(cfg, "model", "targets", "q,v"), &a->targets,
                                 why) != 0)
        return err_set(err, "federation.ini: [model] targets: %s", why);
    const char *rule = config_get_str(cfg, "model", "rule", "ffa");
    if ((a->rule = model_lora_rule_of(rule)) < 0)
        return err_set(err,
                       "federation.ini: [model] rule = %s; use ffa (A frozen, B averaged "
                       "exactly), fedsb (A and B frozen, R between them averaged exactly) or "
                       "fedit (A and B averaged apart)",
                       rule);
    /* absent: fp32 (what the federation's initial model then says too) */
    const char *dtype = config_get_str(cfg, "model", "base_dtype", "f32");
    if (strcmp(dtype, "bf16") != 0 && strcmp(dtype, "f32") != 0)
        return err_set(err,
                       "federation.ini: [model] base_dtype = %s; use bf16 (the base's matmuls "
                       "in bf16, sums in fp32) or f32",
                       dtype);
    a->base_bf16 = strcmp(dtype, "bf16") == 0;
    double dropout;
    if (config_get_double(cfg, "model", "dropout", 0, &dropout, err)) return -1;
    if (!((float)dropout >= 0 && (float)dropout < 1)) /* as the float the sites take */
        return err_set(err,
                       "federation.ini: [model] dropout = %g; use 0 (none) or more, below 1 "
                       "(PEFT's lora_dropout: that fraction of each adapter's input zeroed in "
                       "training)",
                       dropout);
    a->dropout = (float)dropout;
    return 0;
}

int model_settings_read(const Config *cfg, Coordinator *co, char *err) {
    const char *init = config_get(cfg, "model", "init");
    co->model_init[0] = '\0';
    AdapterConfig lora;
    if (adapter_settings_read(cfg, &lora, err) != 0) return -1;
    if (init == NULL || init[0] == '\0') {
        const char *preset = config_get_str(cfg, "model", "preset", "small");
        snprintf(co->model, sizeof co->model, "%s", preset);
        if (model_config_preset(preset, &co->model_cfg) != 0)
            return err_set(err,
                           "federation.ini: [model] preset = %s is not a model this strait "
                           "knows; use one of %s",
                           preset, model_preset_names());
        if (lora.rank == 0) return 0;
        /* adapters over the base the seed draws: its fingerprint, which
         * every site's seeded base must match */
        Model base;
        int64_t seed;
        if (config_get_int(cfg, "model", "seed", 1, 0, INT64_MAX, &seed, err) != 0 ||
            model_build(&base, &co->model_cfg, (uint64_t)seed, err) != 0)
            return -1;
        lora.base = model_base_fingerprint(&base);
        lora.base_seed = seed;
        lora.a_seed = (uint64_t)seed; /* the frozen A's (and B's) draw: the [model] seed's */
        model_free(&base);
        co->model_cfg.lora = lora;
        return model_config_check(&co->model_cfg, err);
    }
    /* a pretrained start: the file strait init wrote, exactly */
    if (init[0] == '/' || strstr(init, ".."))
        return err_set(err,
                       "federation.ini: [model] init = %s; give a path inside the federation "
                       "folder",
                       init);
    snprintf(co->model_init, sizeof co->model_init, "%s/%s", co->dir, init);
    snprintf(co->model, sizeof co->model, "pretrained");
    const char *want = config_get_str(cfg, "model", "init_sha256", "");
    char have[65];
    int64_t bytes;
    if (security_sha256_file(co->model_init, have, &bytes, err) != 0) return -1;
    if (strcmp(have, want) != 0)
        return err_set(err,
                       "%s has SHA-256 %s, not the %s strait init recorded in federation.ini "
                       "([model] init_sha256): the initial model changed; restore it or run "
                       "strait init --init-from again",
                       co->model_init, have, want[0] ? want : "(none)");
    if (model_read_config(co->model_init, &co->model_cfg, NULL, err) != 0) return -1;
    const AdapterConfig *have_lora = &co->model_cfg.lora;
    if (have_lora->rank != lora.rank || have_lora->alpha != lora.alpha ||
        have_lora->targets != lora.targets || have_lora->rule != lora.rule ||
        have_lora->base_bf16 != lora.base_bf16 || have_lora->dropout != lora.dropout)
        return err_set(err,
                       "federation.ini's [model] adapter settings are not those of %s (strait "
                       "init wrote both): restore them, or run strait init again",
                       co->model_init);
    return 0;
}

/* [rounds] min_sites: a number, or quorum (the default): more than half of
 * the active sites, whatever their number when the round is judged. */
static int read_min_sites(const Config *cfg, int64_t *out, char *err) {
    const char *v = config_get(cfg, "rounds", "min_sites");
    if (v == NULL || strcmp(v, "quorum") == 0) {
        *out = 0;
        return 0;
    }
    return config_get_int(cfg, "rounds", "min_sites", 1, 1, ROUNDS_MAX_SITES, out, err);
}

/* [rounds] mode (sync or async) and, for async, staleness and grace. */
static int read_mode(const Config *cfg, RoundsSettings *o, char *err) {
    const char *mode = config_get_str(cfg, "rounds", "mode", "sync");
    if (strcmp(mode, "sync") != 0 && strcmp(mode, "async") != 0)
        return err_set(err, "federation.ini: [rounds] mode = %s; use sync or async", mode);
    o->async = strcmp(mode, "async") == 0;
    int64_t staleness;
    if (config_get_int(cfg, "rounds", "staleness", 4, 1, MAX_STALENESS, &staleness, err) ||
        config_get_double(cfg, "rounds", "grace", 0.25, &o->grace, err))
        return -1;
    if (!(o->grace >= 0 && o->grace <= 10))
        return err_set(err,
                       "federation.ini: [rounds] grace = %g; use 0 to 10 (times what the round's "
                       "quorum took)",
                       o->grace);
    if (o->async && o->overlap)
        return err_set(err, "federation.ini: [rounds] mode = async with overlap = on; async "
                            "rounds already take updates from older models: set overlap = off");
    o->staleness = o->async ? staleness : 0;
    return 0;
}

/* [store] keep_last and keep_every (docs/operations.md: the disk a
 * federation needs). The defaults keep the two newest checkpoints and no
 * milestones: a 1B-parameter DiLoCo federation then holds two 4 GB
 * checkpoints, the model it started from, the delta and one 8 GB outer
 * state whatever its length, about 24 GB (36 GB while a commit is written);
 * each milestone kept is one more checkpoint. A bound that grows with the
 * run (a milestone every M rounds) is the operator's choice, not a default. */
static int read_retention(const Config *cfg, RoundsSettings *o, char *err) {
    StoreRetention *p = &o->retain;
    if (config_get_int(cfg, "store", "keep_last", 2, INT64_MIN, INT64_MAX, &p->keep_last, err) ||
        config_get_int(cfg, "store", "keep_every", 0, INT64_MIN, INT64_MAX, &p->keep_every, err))
        return -1;
    if (p->keep_last < 1 || p->keep_last > 1000000)
        return err_set(err,
                       "federation.ini: [store] keep_last = %lld; use 1 to 1000000 (the newest "
                       "rounds whose checkpoints are kept; a restart resumes from the newest)",
                       (long long)p->keep_last);
    if (p->keep_every < 0 || p->keep_every > 1000000)
        return err_set(err,
                       "federation.ini: [store] keep_every = %lld; use 0 (no milestones) to "
                       "1000000 (also keep every round numbered a multiple of it)",
                       (long long)p->keep_every);
    /* what a restart reads back: the round before's model, for the delta
     * it serves, and with async rounds the `staleness` models before */
    p->keep_back = o->async && o->staleness > 1 ? o->staleness : 1;
    return 0;
}

/* [privacy] (docs/privacy.md). Everything that sets the noise is said,
 * never defaulted; the median and trimmed mean have another sensitivity
 * than the clipped mean the noise is calibrated to. */
static int read_privacy(const Config *cfg, RoundsSettings *o, char *err) {
    const char *dp = config_get_str(cfg, "privacy", "dp", "off");
    if (strcmp(dp, "off") == 0) {
        static const char *const keys[] = {"clip", "noise_multiplier", "delta", "epsilon_budget"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (config_get(cfg, "privacy", keys[i]) != NULL)
                return err_set(err,
                               "federation.ini: [privacy] %s is set but dp = off; set dp = "
                               "central, or remove it",
                               keys[i]);
        return 0;
    }
    if (strcmp(dp, "central") != 0 && strcmp(dp, "distributed") != 0)
        return err_set(err, "federation.ini: [privacy] dp = %s; use off, central or distributed",
                       dp);
    o->dp = 1;
    o->dp_distributed = strcmp(dp, "distributed") == 0;
    static const char *const needed[] = {"clip", "noise_multiplier", "delta"};
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++)
        if (config_get(cfg, "privacy", needed[i]) == NULL)
            return err_set(err,
                           "federation.ini: [privacy] dp = %s needs %s (clip: the L2 bound "
                           "on one site's update; noise_multiplier: the noise's deviation over "
                           "it; delta: the δ of the (ε, δ) reported)",
                           dp, needed[i]);
    if (config_get_double(cfg, "privacy", "clip", 0, &o->dp_clip, err) ||
        config_get_double(cfg, "privacy", "noise_multiplier", 0, &o->dp_noise, err) ||
        config_get_double(cfg, "privacy", "delta", 0, &o->dp_delta, err) ||
        config_get_double(cfg, "privacy", "epsilon_budget", 0, &o->dp_budget, err))
        return -1;
    if (!(o->dp_clip > 0 && o->dp_clip <= 1e6))
        return err_set(err,
                       "federation.ini: [privacy] clip = %g; use a positive L2 bound on one "
                       "site's update, up to 1000000",
                       o->dp_clip);
    if (!(o->dp_noise >= 0.1 && o->dp_noise <= 1000))
        return err_set(err,
                       "federation.ini: [privacy] noise_multiplier = %g; use 0.1 to 1000 (the "
                       "noise's standard deviation over clip)",
                       o->dp_noise);
    if (!(o->dp_delta > 0 && o->dp_delta <= 0.01))
        return err_set(err,
                       "federation.ini: [privacy] delta = %g; use more than 0 and at most 0.01 "
                       "(well under 1 / the number of sites)",
                       o->dp_delta);
    if (!(o->dp_budget >= 0 && isfinite(o->dp_budget)))
        return err_set(err,
                       "federation.ini: [privacy] epsilon_budget = %g; use 0 (none) or the "
                       "epsilon past which no round commits",
                       o->dp_budget);
    if (o->keeps_updates)
        return err_set(err,
                       "federation.ini: [privacy] dp = %s with [rounds] aggregate = %s: "
                       "the noise is calibrated to the mean of clipped updates; use aggregate = "
                       "mean",
                       dp, aggregate_rule_name(o->rule));
    /* the fixed clip bounds every update; a gate from the medians of other
     * sites' norms would make one site's acceptance depend on their data */
    o->norm_bound = 0;
    return 0;
}

/* [privacy] secure_aggregation (docs/privacy.md): the coordinator sees
 * only the sum. What needs each update in the clear is refused by name. */
static int read_secagg(const Config *cfg, RoundsSettings *o, char *err) {
    if (config_get_bool(cfg, "privacy", "secure_aggregation", 0, &o->secagg, err) != 0) return -1;
    static const char *const keys[] = {"range", "bits", "phase_timeout"};
    if (!o->secagg) {
        if (o->dp_distributed)
            return err_set(err, "federation.ini: [privacy] dp = distributed needs "
                                "secure_aggregation = on (each site's noise is a share of the "
                                "sum's, which only secure aggregation keeps from the "
                                "coordinator); turn it on, or use dp = central");
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (config_get(cfg, "privacy", keys[i]) != NULL)
                return err_set(err,
                               "federation.ini: [privacy] %s is set but secure_aggregation is "
                               "off; turn it on, or remove it",
                               keys[i]);
        return 0;
    }
    if (config_get(cfg, "privacy", "range") == NULL)
        return err_set(err, "federation.ini: [privacy] secure_aggregation = on needs range: the "
                            "bound each value of a site's update is clipped to, the shared scale "
                            "every site quantizes at (docs/privacy.md says how to choose it)");
    if (config_get_double(cfg, "privacy", "range", 0, &o->secagg_range, err) ||
        config_get_int(cfg, "privacy", "bits", 0, 0, 32, &o->secagg_bits, err) ||
        config_get_duration_ms(cfg, "privacy", "phase_timeout", 60000, &o->secagg_timeout_ms, err))
        return -1;
    if (!(o->secagg_range > 0 && o->secagg_range <= 1e6))
        return err_set(err,
                       "federation.ini: [privacy] range = %g; use a positive bound, up to "
                       "1000000",
                       o->secagg_range);
    if (o->secagg_bits != 0 && o->secagg_bits < 8)
        return err_set(err,
                       "federation.ini: [privacy] bits = %lld; use 0 (enough for the cohort: 9 "
                       "+ log2 of its sites) or 8 to 32",
                       (long long)o->secagg_bits);
    if (o->secagg_timeout_ms < 1000)
        return err_set(err, "federation.ini: [privacy] phase_timeout is at least 1s");
    const char *why = o->dp && !o->dp_distributed
                          ? "dp = central clips and weighs each update in the clear"
                      : o->keeps_updates ? "a robust rule needs each update in the clear"
                      : o->async         ? "async rounds merge updates of different rounds"
                      : o->overlap       ? "overlapped rounds take updates of two rounds at once"
                      : o->uplink.id == CODEC_TOPK
                          ? "top-k: a value only one site sent would be in the sum in the clear"
                          : NULL;
    if (why)
        return err_set(err,
                       "federation.ini: [privacy] secure_aggregation = on cannot work here: %s; "
                       "turn it off or change that setting",
                       why);
    o->norm_bound = 0; /* no update is seen to be judged */
    return 0;
}

double rounds_lookahead(const RoundsSettings *s) {
    if (!s->overlap) return 0;
    switch (s->outer) {
    case OUTER_NESTEROV:
        return s->lookahead * s->outer_lr * (1 + s->momentum);
    case OUTER_AVG:
        return s->lookahead * s->outer_lr;
    case OUTER_ADAM:
        return 0;
    }
    return 0;
}

int rounds_settings_read(const Config *cfg, const ModelConfig *model, RoundsSettings *o,
                         char *err) {
    memset(o, 0, sizeof *o);
    ModelConfig gc = *model;
    const char *agg = config_get_str(cfg, "rounds", "aggregate", "mean");
    const int64_t DAY = 24LL * 3600 * 1000;
    if (config_get_int(cfg, "rounds", "total", 10, 1, 1000000, &o->total, err) ||
        read_min_sites(cfg, &o->min_sites, err) ||
        config_get_duration_ms(cfg, "rounds", "deadline", 600000, &o->deadline_ms, err) ||
        config_get_int(cfg, "rounds", "inner_steps", 50, 1, 1000000, &o->inner_steps, err) ||
        config_get_int(cfg, "rounds", "max_extensions", 3, 0, 1000, &o->max_extensions, err) ||
        config_get_duration_ms(cfg, "rounds", "time_budget", 0, &o->budget_ms, err) ||
        config_get_bool(cfg, "rounds", "overlap", 0, &o->overlap, err) ||
        config_get_double(cfg, "rounds", "lookahead", 0.5, &o->lookahead, err) ||
        read_mode(cfg, o, err) ||
        config_get_bool(cfg, "rounds", "adaptive_deadline", 1, &o->adaptive_deadline, err) ||
        config_get_int(cfg, "rounds", "batch", 64, 1, 1 << 20, &o->batch, err) ||
        config_get_int(cfg, "rounds", "seq", gc.T, 1, gc.T, &o->seq, err) ||
        config_get_double(cfg, "rounds", "max_update_ratio", 2.0, &o->max_update_ratio, err) ||
        config_get_double(cfg, "rounds", "norm_bound", 4.0, &o->norm_bound, err) ||
        config_get_double(cfg, "rounds", "clip", 3.0, &o->clip, err) ||
        config_get_double(cfg, "rounds", "weight_cap", 2.0, &o->weight_cap, err) ||
        config_get_bool(cfg, "rounds", "robust_start", 1, &o->robust_start, err) ||
        config_get_int(cfg, "limits", "upload_min_rate", 16384, 0, INT64_MAX, &o->upload_min_rate,
                       err) ||
        config_get_duration_ms(cfg, "limits", "upload_grace", 10000, &o->upload_grace_ms, err) ||
        config_get_int(cfg, "limits", "refusals_per_round", 3, 1, 1000000, &o->refusals, err) ||
        config_get_int(cfg, "limits", "downloads_per_round", 4, 1, 1000000, &o->downloads, err) ||
        config_get_int(cfg, "model", "seed", 1, 0, INT64_MAX, &o->seed, err) ||
        config_get_double(cfg, "rounds", "trim", 0.1, &o->trim, err) ||
        config_get_int(cfg, "limits", "spool", 64LL << 30, 1 << 20, INT64_MAX, &o->spool_bytes,
                       err) ||
        config_get_int(cfg, "limits", "spool_per_site", 0, 0, INT64_MAX, &o->spool_site_bytes,
                       err) ||
        config_get_duration_ms(cfg, "limits", "upload_header", 30000, &o->upload_header_ms, err) ||
        config_get_duration_ms(cfg, "limits", "upload_idle", 60000, &o->upload_idle_ms, err) ||
        config_get_duration_ms(cfg, "limits", "upload_life", 3600000, &o->upload_life_ms, err) ||
        read_recipe(cfg, o, err) || read_retention(cfg, o, err))
        return -1;
    /* ranges the typed reads above cannot say */
    const struct {
        const char *section, *key;
        int64_t value, min, max;
    } spans[] = {{"rounds", "deadline", o->deadline_ms, 1000, 7 * DAY},
                 {"rounds", "time_budget", o->budget_ms, 0, 7 * DAY},
                 {"limits", "upload_header", o->upload_header_ms, 100, 3600000},
                 {"limits", "upload_idle", o->upload_idle_ms, 100, 3600000},
                 {"limits", "upload_life", o->upload_life_ms, 1000, 7 * DAY},
                 {"limits", "upload_grace", o->upload_grace_ms, 100, 3600000}};
    for (size_t i = 0; i < sizeof spans / sizeof spans[0]; i++)
        if (spans[i].value < spans[i].min || spans[i].value > spans[i].max)
            return err_set(err,
                           "federation.ini: [%s] %s = %lld ms is out of range; use %lld ms to "
                           "%lld ms",
                           spans[i].section, spans[i].key, (long long)spans[i].value,
                           (long long)spans[i].min, (long long)spans[i].max);
    if (!(o->max_update_ratio >= 0))
        return err_set(err,
                       "federation.ini: [rounds] max_update_ratio = %g; use 0 (off) or a positive "
                       "bound on |update| / |model|",
                       o->max_update_ratio);
    if (aggregate_rule_parse(agg, &o->rule) != 0)
        return err_set(err, "federation.ini: [rounds] aggregate = %s; use %s", agg,
                       aggregate_rule_names());
    o->keeps_updates = aggregate_rule_keeps_updates(o->rule);
    if (!(o->trim >= 0 && o->trim < 0.5))
        return err_set(err, "federation.ini: [rounds] trim = %g; use 0 to less than 0.5", o->trim);
    if (!(o->lookahead >= 0 && o->lookahead <= 1))
        return err_set(err,
                       "federation.ini: [rounds] lookahead = %g; use 0 to 1 (the fraction of its "
                       "own update's outer step an overlapped site looks ahead by)",
                       o->lookahead);
    const struct {
        const char *key;
        double value, min;
    } bounds[] = {
        {"norm_bound", o->norm_bound, 1}, {"clip", o->clip, 1}, {"weight_cap", o->weight_cap, 1}};
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++)
        if (!(bounds[i].value == 0 || (bounds[i].value >= bounds[i].min && bounds[i].value <= 1e6)))
            return err_set(err,
                           "federation.ini: [rounds] %s = %g; use 0 (off) or a multiple of the "
                           "median from %g to 1000000",
                           bounds[i].key, bounds[i].value, bounds[i].min);
    if (read_privacy(cfg, o, err) != 0) return -1;
    return read_secagg(cfg, o, err);
}
