/*
 * config.c — the model's configuration (API: model.h): the presets (each
 * architecture's own, from the registry), the checks every configuration
 * from outside passes (the shape here, the rest the architecture's check)
 * (a checkpoint's metadata, a config.json, a coordinator's Hello), and the
 * configuration as JSON, the one description a checkpoint and Hello carry.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/arch.h"
#include "kernels/data.h"
#include "kernels/model.h"
#include "util/util.h"

/* ---- presets: every architecture's, in the registry's order ------------------------ */

/* the presets' names, comma-separated; byte_level: those of 256 tokens */
static void preset_names(char *names, size_t cap, int byte_level) {
    for (int a = 0; a < ARCH_COUNT; a++)
        for (int i = 0; i < arch_of(a)->n_presets; i++) {
            const ArchPreset *p = &arch_of(a)->presets[i];
            if (!byte_level || p->V == 256)
                snprintf(names + strlen(names), cap - strlen(names), "%s%s", names[0] ? ", " : "",
                         p->name);
        }
}

const char *model_preset_names(void) {
    static char names[512];
    if (names[0] == '\0') preset_names(names, sizeof names, 0);
    return names;
}

const char *model_byte_preset_names(void) {
    static char names[512];
    if (names[0] == '\0') preset_names(names, sizeof names, 1);
    return names;
}

int model_config_preset(const char *name, ModelConfig *cfg) {
    for (int a = 0; a < ARCH_COUNT; a++)
        for (int i = 0; i < arch_of(a)->n_presets; i++) {
            const ArchPreset *p = &arch_of(a)->presets[i];
            if (strcmp(p->name, name) != 0) continue;
            ModelConfig c = {.arch = a,
                             .L = p->L,
                             .C = p->C,
                             .NH = p->NH,
                             .T = p->T,
                             .V = p->V,
                             .NKV = p->NKV,
                             .HD = p->C / p->NH,
                             .F = p->F,
                             .tied = p->tied,
                             .qkv_bias = p->qkv_bias,
                             .eps = p->eps,
                             .rope = p->scaling};
            c.rope.theta = p->theta;
            snprintf(c.name, sizeof c.name, "%s", name);
            if (model_config_check(&c, NULL) != 0) return -1;
            *cfg = c;
            return 0;
        }
    return -1;
}

/* ---- checks ------------------------------------------------------------------- */

/* adapters: none, or a rank, an alpha and targets the architecture has */
static int lora_check(const ModelConfig *c, char *err) {
    const AdapterConfig *a = &c->lora;
    if (a->rank == 0)
        return a->targets == 0 && a->alpha == 0 && a->base == 0 && a->base_seed <= 0 &&
                       a->rule == 0 && a->a_seed == 0 && a->base_bf16 == 0 && a->dropout == 0
                   ? 0
                   : err_set(err, "adapter settings without a rank");
    if (a->base_seed < -1) return err_set(err, "adapter base_seed %lld", (long long)a->base_seed);
    if (model_lora_rule_name(a->rule) == NULL)
        return err_set(err, "adapter rule %d; one of %s", a->rule, model_lora_rule_names());
    if (a->base_bf16 != 0 && a->base_bf16 != 1)
        return err_set(err, "adapter base_bf16 %d; 0 or 1", a->base_bf16);
    if (!(a->dropout >= 0 && a->dropout < 1))
        return err_set(err, "adapter dropout %g; use 0 or more, below 1 (PEFT's lora_dropout)",
                       a->dropout);
    const Arch *arch = arch_of(c->arch);
    unsigned takes = 0;
    for (int r = 0; r < arch->n_tensors; r++) takes |= arch->tensors[r].lora;
    if (takes == 0)
        return err_set(err, "LoRA adapters take the Llama family's projections; a %s has none",
                       arch->name);
    if (a->rank < 1 || a->rank > LORA_RANK_MAX)
        return err_set(err, "adapter rank %d; use 1 to %d", a->rank, LORA_RANK_MAX);
    if (!(a->alpha > 0 && a->alpha < 1e6f))
        return err_set(err, "adapter alpha %g; use more than 0 (PEFT's lora_alpha)", a->alpha);
    if (a->targets == 0 || (a->targets & ~takes) != 0)
        return err_set(err, "adapter targets 0x%x; a %s takes q, k, v, o, gate, up, down",
                       a->targets, arch->name);
    /* a rank past a projection's own sides adds nothing it could not have */
    for (int r = 0; r < arch->n_tensors; r++)
        if ((arch->tensors[r].lora & a->targets) && (a->rank > arch_dim(c, arch->tensors[r].d0) ||
                                                     a->rank > arch_dim(c, arch->tensors[r].d1)))
            return err_set(err, "adapter rank %d is more than a %d x %d projection's sides",
                           a->rank, arch_dim(c, arch->tensors[r].d0),
                           arch_dim(c, arch->tensors[r].d1));
    double n = model_config_params(c) + model_adapter_params(c);
    if (n > 4e9)
        return err_set(err,
                       "a base and adapters of %.2f billion values; this strait builds at most 4 "
                       "billion",
                       n / 1e9);
    return 0;
}

int model_config_check(ModelConfig *c, char *err) {
    if (arch_of(c->arch) == NULL)
        return err_set(err, "architecture %d is not one this strait builds", c->arch);
    if (c->L < 1 || c->L > 256 || c->NH < 1 || c->C < 1 || c->C > 65536 || c->T < 1 ||
        c->T > (1 << 20) || c->V < 2 || c->V > (1 << 22))
        return err_set(err,
                       "not a shape this strait builds: %d layers, %d channels, %d heads, "
                       "context %d, vocabulary %d (1-256 layers, channels to 65536, context to "
                       "2^20, vocabulary 2 to 2^22)",
                       c->L, c->C, c->NH, c->T, c->V);
    if (arch_of(c->arch)->check(c, err) != 0) return -1;
    if (lora_check(c, err) != 0) return -1;
    c->Vp = (c->V + 63) / 64 * 64;
    /* the table's size, before anything is allocated: a claimed shape must
     * not be able to exhaust memory */
    double params = model_config_params(c);
    if (params > 4e9)
        return err_set(err,
                       "a shape of %.2f billion parameters; this strait builds at most 4 billion "
                       "(16 GB in fp32)",
                       params / 1e9);
    return 0;
}

int model_config_shape(ModelConfig *cfg, const char *name, long long L, long long C, long long NH,
                       long long T, long long V, char *err) {
    if (L < 1 || L > 256 || NH < 1 || C < 1 || C > 65536 || C % NH != 0 || T < 1 || T > (1 << 20) ||
        V < 2 || V > (1 << 22))
        return err_set(err,
                       "not a GPT-2 shape this strait builds: %lld layers, %lld channels, %lld "
                       "heads, context %lld, vocabulary %lld (1-256 layers, channels to 65536 "
                       "and a multiple of heads, context to 2^20, vocabulary 2 to 2^22)",
                       L, C, NH, T, V);
    ModelConfig c = {
        .arch = ARCH_GPT2, .L = (int)L, .C = (int)C, .NH = (int)NH, .T = (int)T, .V = (int)V};
    snprintf(c.name, sizeof c.name, "%s", name);
    if (model_config_check(&c, err) != 0) return -1;
    *cfg = c;
    return 0;
}

/* ---- as JSON -------------------------------------------------------------------- */

char *model_config_json(const ModelConfig *c) {
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(c->name));
    json_object_set_new(o, "L", json_integer(c->L));
    json_object_set_new(o, "C", json_integer(c->C));
    json_object_set_new(o, "NH", json_integer(c->NH));
    json_object_set_new(o, "T", json_integer(c->T));
    json_object_set_new(o, "V", json_integer(c->V));
    json_object_set_new(o, "Vp", json_integer(c->Vp));
    if (!arch_of(c->arch)->shape_only) {
        json_object_set_new(o, "arch", json_string(model_arch_name(c->arch)));
        json_object_set_new(o, "NKV", json_integer(c->NKV));
        json_object_set_new(o, "HD", json_integer(c->HD));
        json_object_set_new(o, "F", json_integer(c->F));
        json_object_set_new(o, "tied", json_boolean(c->tied));
        json_object_set_new(o, "qkv_bias", json_boolean(c->qkv_bias));
        json_object_set_new(o, "eps", json_real(c->eps));
        json_object_set_new(o, "rope_theta", json_real(c->rope.theta));
        if (c->rope.factor > 0)
            json_object_set_new(
                o, "rope_scaling",
                json_pack("{s:f,s:f,s:f,s:i}", "factor", (double)c->rope.factor, "low_freq_factor",
                          (double)c->rope.low_freq, "high_freq_factor", (double)c->rope.high_freq,
                          "original_max_position_embeddings", c->rope.original_ctx));
    }
    if (c->lora.rank > 0) {
        char targets[64], base[17];
        model_lora_targets_names(c->lora.targets, targets, sizeof targets);
        snprintf(base, sizeof base, "%016llx", (unsigned long long)c->lora.base);
        json_t *l = json_pack("{s:i,s:f,s:s,s:s}", "rank", c->lora.rank, "alpha",
                              (double)c->lora.alpha, "targets", targets, "base", base);
        if (c->lora.base_seed >= 0) /* a drawn base: anyone can draw it again */
            json_object_set_new(l, "base_seed", json_integer(c->lora.base_seed));
        /* A frozen (ffa; with fedsb B too): every site draws it from a_seed */
        if (c->lora.rule != LORA_RULE_FEDIT)
            json_object_set_new(l, "a_seed", json_integer((json_int_t)c->lora.a_seed));
        /* ffa and fedit are told by a_seed alone; fedsb names itself, a
         * key a strait without it refuses by name rather than reading the
         * adapters as LoRA */
        if (c->lora.rule == LORA_RULE_FEDSB)
            json_object_set_new(l, "rule", json_string(model_lora_rule_name(c->lora.rule)));
        if (c->lora.base_bf16) /* absent: fp32 */
            json_object_set_new(l, "base_dtype", json_string("bf16"));
        if (c->lora.dropout > 0) /* absent: none */
            json_object_set_new(l, "dropout", json_real(float_decimal(c->lora.dropout)));
        json_object_set_new(o, "lora", l);
    }
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return text;
}

/* an integer field in range, or -1 naming it */
static int int_field(json_t *o, const char *key, int required, int lo, int hi, int *out,
                     char *err) {
    json_t *v = json_object_get(o, key);
    if (v == NULL && !required) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return err_set(err, "the model configuration's %s should be an integer from %d to %d", key,
                       lo, hi);
    *out = (int)json_integer_value(v);
    return 0;
}

static int real_field(json_t *o, const char *key, float *out, char *err) {
    json_t *v = json_object_get(o, key);
    if (v == NULL) return 0;
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return err_set(err, "the model configuration's %s should be a number", key);
    *out = (float)json_number_value(v);
    return 0;
}

/* "lora": {"rank": 8, "alpha": 16, "targets": "q,v", "base": "<16 hex digits>"}, and
 * "base_seed", "a_seed", "rule", "base_dtype" and "dropout" when they have
 * something to say */
static int lora_parse(json_t *o, AdapterConfig *a, char *err) {
    const char *targets = json_string_value(json_object_get(o, "targets"));
    const char *base = json_string_value(json_object_get(o, "base"));
    if (!json_is_object(o) || targets == NULL || base == NULL || strlen(base) != 16 ||
        strspn(base, "0123456789abcdef") != 16)
        return err_set(err, "the model configuration's lora should be an object of rank, alpha, "
                            "targets and base (16 hex digits)");
    if (int_field(o, "rank", 1, 1, LORA_RANK_MAX, &a->rank, err) ||
        real_field(o, "alpha", &a->alpha, err) ||
        model_lora_targets_parse(targets, &a->targets, err))
        return -1;
    a->base = strtoull(base, NULL, 16);
    a->base_seed = -1;
    json_t *seed = json_object_get(o, "base_seed");
    if (seed != NULL) {
        if (!json_is_integer(seed) || json_integer_value(seed) < 0)
            return err_set(err, "the model configuration's lora base_seed should be an integer "
                                "of at least 0");
        a->base_seed = json_integer_value(seed);
    }
    json_t *a_seed = json_object_get(o, "a_seed"); /* present: A is frozen at its draw */
    if (a_seed != NULL) {
        if (!json_is_integer(a_seed) || json_integer_value(a_seed) < 0)
            return err_set(err, "the model configuration's lora a_seed should be an integer of "
                                "at least 0");
        a->rule = LORA_RULE_FFA, a->a_seed = (uint64_t)json_integer_value(a_seed);
    }
    json_t *rule = json_object_get(o, "rule"); /* absent: ffa with a_seed, else fedit */
    if (rule != NULL) {
        const char *name = json_string_value(rule);
        int k = name ? model_lora_rule_of(name) : -1;
        if (k < 0)
            return err_set(err, "the model configuration's lora rule should be one of %s",
                           model_lora_rule_names());
        if ((k != LORA_RULE_FEDIT) != (a_seed != NULL))
            return err_set(err,
                           "the model configuration's lora rule %s %s a_seed (the draw of what "
                           "it freezes)",
                           name, k == LORA_RULE_FEDIT ? "takes no" : "needs");
        a->rule = k;
    }
    json_t *dtype = json_object_get(o, "base_dtype");
    if (dtype != NULL) {
        const char *d = json_string_value(dtype);
        if (d == NULL || (strcmp(d, "bf16") && strcmp(d, "f32")))
            return err_set(err, "the model configuration's lora base_dtype should be bf16 or f32");
        a->base_bf16 = strcmp(d, "bf16") == 0;
    }
    json_t *dropout = json_object_get(o, "dropout");
    if (dropout != NULL) {
        float p = (float)json_number_value(dropout); /* 0.99999999 is 1 as a float */
        if (!json_is_number(dropout) || !(p >= 0 && p < 1))
            return err_set(err, "the model configuration's lora dropout should be a number from 0 "
                                "up to (not including) 1");
        a->dropout = p;
    }
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (strcmp(key, "rank") && strcmp(key, "alpha") && strcmp(key, "targets") &&
            strcmp(key, "base") && strcmp(key, "base_seed") && strcmp(key, "a_seed") &&
            strcmp(key, "rule") && strcmp(key, "base_dtype") && strcmp(key, "dropout"))
            return err_set(err,
                           "the model configuration's lora has a field '%s' this strait does "
                           "not know",
                           key);
    }
    return 0;
}

int model_config_parse(const char *text, size_t len, ModelConfig *cfg, char *err) {
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return err_set(err, "the model configuration is not a JSON object");
    }
    ModelConfig c;
    memset(&c, 0, sizeof c);
    const char *arch = json_string_value(json_object_get(o, "arch"));
    const char *name = json_string_value(json_object_get(o, "name"));
    snprintf(c.name, sizeof c.name, "%s", name ? name : "custom");
    int rc = 0;
    if (arch && (c.arch = model_arch_of(arch)) < 0)
        rc = err_set(err, "architecture '%s' is not one this strait builds (%s)", arch,
                     model_arch_names());
    int more = rc == 0 && !arch_of(c.arch)->shape_only; /* the fields beyond the shape */
    int vp = 0;
    json_t *scaling = json_object_get(o, "rope_scaling");
    if (rc == 0)
        rc = int_field(o, "L", 1, 1, 256, &c.L, err) || int_field(o, "C", 1, 1, 65536, &c.C, err) ||
                     int_field(o, "NH", 1, 1, 65536, &c.NH, err) ||
                     int_field(o, "T", 1, 1, 1 << 20, &c.T, err) ||
                     int_field(o, "V", 1, 2, 1 << 22, &c.V, err) ||
                     int_field(o, "Vp", 0, 2, 1 << 22, &vp, err) ||
                     int_field(o, "NKV", more, 1, 65536, &c.NKV, err) ||
                     int_field(o, "HD", more, 1, 65536, &c.HD, err) ||
                     int_field(o, "F", more, 1, 1 << 20, &c.F, err) ||
                     real_field(o, "eps", &c.eps, err) ||
                     real_field(o, "rope_theta", &c.rope.theta, err)
                 ? -1
                 : 0;
    if (rc == 0 && more) {
        c.tied = json_is_true(json_object_get(o, "tied"));
        c.qkv_bias = json_is_true(json_object_get(o, "qkv_bias"));
    }
    if (rc == 0 && scaling != NULL)
        rc = !json_is_object(scaling) || real_field(scaling, "factor", &c.rope.factor, err) ||
                     real_field(scaling, "low_freq_factor", &c.rope.low_freq, err) ||
                     real_field(scaling, "high_freq_factor", &c.rope.high_freq, err) ||
                     int_field(scaling, "original_max_position_embeddings", 1, 1, 1 << 24,
                               &c.rope.original_ctx, err)
                 ? (err && !json_is_object(scaling)
                        ? err_set(err, "the model configuration's rope_scaling is not an object")
                        : -1)
                 : 0;
    json_t *lora = json_object_get(o, "lora");
    if (rc == 0 && lora != NULL) rc = lora_parse(lora, &c.lora, err);
    json_decref(o);
    if (rc == 0) rc = model_config_check(&c, err);
    if (rc == 0 && vp != 0 && vp != c.Vp)
        rc = err_set(err, "the model configuration pads its vocabulary of %d to %d, not %d", c.V,
                     vp, c.Vp);
    if (rc == 0) *cfg = c;
    return rc;
}

int model_config_fit_tokens(ModelConfig *cfg, int vocab, int pretrained, const TokenSet *ts,
                            const char *name, char *err) {
    if (vocab < 0 || vocab > 65536 || (vocab && pretrained))
        return err_set(err, "--vocab is 1 to 65536, and not with --init-from (its config.json "
                            "has one)");
    if (!pretrained && (vocab || (ts->shards && cfg->V == 256))) {
        cfg->V = vocab ? vocab : ts->vocab > 50257 ? ts->vocab : 50257;
        cfg->Vp = (cfg->V + 63) / 64 * 64;
    }
    if (ts->vocab > cfg->V)
        return err_set(err,
                       "the data holds token ids up to %d, beyond model %s's vocabulary of %d; "
                       "give --vocab (at least %d) or the model its tokenizer was made for",
                       ts->vocab - 1, name, cfg->V, ts->vocab);
    return 0;
}
