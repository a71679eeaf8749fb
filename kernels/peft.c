/*
 * peft.c — LoRA adapters in and out of PEFT's folder (API: formats.h), and
 * merged into their base.
 *
 * PEFT's plain LoRA: adapter_config.json (peft_type "LORA", r, lora_alpha,
 * target_modules, and keys that are neutral for plain LoRA) and
 * adapter_model.safetensors, one lora_A (r, in) and one lora_B (out, r) per
 * adapted projection, named after the base's Hugging Face module with the
 * prefix "base_model.model." (PeftModel over the causal LM); the output is
 * W x + (lora_alpha / r) B A x. The projections and their Hugging Face
 * names are the architecture's table (kernels/arch.h), as hf.c's are.
 *
 * In: the config is checked key by key (each one Strait uses, one known
 * not to change the model, or one at its neutral value; any other refused
 * by name: it might change the arithmetic), then every tensor of the file
 * against the adapters model_add_adapters lays out; all are checked before
 * any is read.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/arch.h"
#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "kernels/model.h"
#include "util/util.h"

#define PEFT_CONFIG  "adapter_config.json"
#define PEFT_TENSORS "adapter_model.safetensors"
#define PEFT_PREFIX  "base_model.model."

/* ---- names ---------------------------------------------------------------------------- */

/* The Hugging Face module of table row t at layer l, without ".weight"
 * ("model.layers.3.self_attn.q_proj"), after the architecture's prefix. */
static void module_name(const Arch *a, const ArchTensor *t, int l, char *out, size_t n) {
    const char *at = strstr(t->hf, "%d");
    char full[160];
    if (at == NULL)
        snprintf(full, sizeof full, "%s", t->hf);
    else
        snprintf(full, sizeof full, "%.*s%d%s", (int)(at - t->hf), t->hf, l, at + 2);
    size_t len = strlen(full), w = strlen(".weight");
    if (len > w && strcmp(full + len - w, ".weight") == 0) full[len - w] = '\0';
    snprintf(out, n, "%s%s", a->hf_prefix, full);
}

/* The projection name of a LORA_* bit ("q_proj"): its table row's Hugging
 * Face module's last part; NULL when the architecture has no such row. */
static const char *proj_name(const Arch *a, unsigned bit, char *out, size_t n) {
    for (int r = 0; r < a->n_tensors; r++)
        if (a->tensors[r].lora == bit) {
            char full[160];
            module_name(a, &a->tensors[r], 0, full, sizeof full);
            const char *dot = strrchr(full, '.');
            snprintf(out, n, "%.60s", dot ? dot + 1 : full);
            return out;
        }
    return NULL;
}

/* Fed-SB's R folded into A: R·A (rank x in) into out, summed in double,
 * so that B·(R·A) is the adapter's B·R·A as plain LoRA */
static void fold_r(const LoraAt *at, int R, float *out) {
    for (int i = 0; i < R; i++)
        for (int c = 0; c < at->in; c++) {
            double d = 0;
            for (int k = 0; k < R; k++)
                d += (double)at->R[(size_t)i * R + k] * at->A[(size_t)k * at->in + c];
            out[(size_t)i * at->in + c] = (float)d;
        }
}

/* The adapters of m in table order as PEFT's plain LoRA, A then B, under
 * its names (owned by the caller): n of them. Fed-SB's R is folded into
 * A (lora_A = R·A, lora_B = B, lora_alpha unchanged: the same update
 * s·B·R·A), into *folded (owned by the caller; NULL for the other rules,
 * whose A and B are the tensors themselves). */
static StTensor *peft_tensors(const Model *m, float *params, int *n, float **folded) {
    int adapted = 0, L = m->cfg.L, k = 0, R = m->cfg.lora.rank;
    LoraAt at;
    size_t fold_len = 0;
    for (int l = 0; l < L; l++)
        for (int r = 0; r < m->arch->n_tensors; r++)
            if (model_lora_at(m, params, r, l, &at)) adapted++, fold_len += (size_t)R * at.in;
    StTensor *ts = callocCheck((size_t)(adapted ? 2 * adapted : 1), sizeof *ts);
    int fedsb = m->cfg.lora.rule == LORA_RULE_FEDSB;
    *folded = fedsb ? callocCheck(fold_len ? fold_len : 1, sizeof(float)) : NULL;
    size_t at_fold = 0;
    for (int l = 0; l < L; l++)
        for (int r = 0; r < m->arch->n_tensors; r++) {
            if (!model_lora_at(m, params, r, l, &at)) continue;
            const float *A = at.A;
            if (fedsb) {
                fold_r(&at, R, *folded + at_fold);
                A = *folded + at_fold, at_fold += (size_t)R * at.in;
            }
            char mod[160];
            module_name(m->arch, &m->arch->tensors[r], l, mod, sizeof mod);
            for (int ab = 0; ab < 2; ab++) {
                StTensor *t = &ts[k++];
                snprintf(t->name, sizeof t->name, PEFT_PREFIX "%.120s.lora_%c.weight", mod,
                         ab ? 'B' : 'A');
                t->shape[0] = ab ? at.out : R, t->shape[1] = ab ? R : at.in;
                t->src = (float *)(ab ? at.B : A);
            }
        }
    *n = k;
    return ts;
}

/* ---- out ------------------------------------------------------------------------------ */

int model_export_peft(const Model *m, const char *dir, const char *base_name, char *err) {
    const AdapterConfig *a = &m->cfg.lora;
    if (a->rank == 0 || m->lora_view == NULL)
        return err_set(err, "the model has no adapters: PEFT's format holds adapters alone");
    json_t *targets = json_array();
    for (unsigned bit = 1; bit & LORA_ALL; bit <<= 1) {
        char name[64];
        if ((a->targets & bit) && proj_name(m->arch, bit, name, sizeof name))
            json_array_append_new(targets, json_string(name));
    }
    json_t *alpha = a->alpha == floorf(a->alpha) ? json_integer((json_int_t)a->alpha)
                                                 : json_real(float_decimal(a->alpha));
    json_t *base = base_name ? json_string(base_name) : json_null();
    if (base == NULL) {
        json_decref(targets), json_decref(alpha);
        return err_set(err, "the base's name is not UTF-8 text");
    }
    json_t *j = json_object();
    json_object_set_new(j, "alpha_pattern", json_object());
    json_object_set_new(j, "base_model_name_or_path", base);
    json_object_set_new(j, "bias", json_string("none"));
    json_object_set_new(j, "fan_in_fan_out", json_false());
    json_object_set_new(j, "inference_mode", json_true());
    json_object_set_new(j, "init_lora_weights", json_true());
    json_object_set_new(j, "layers_to_transform", json_null());
    json_object_set_new(j, "lora_alpha", alpha);
    json_object_set_new(j, "lora_dropout", json_real(float_decimal(a->dropout)));
    json_object_set_new(j, "modules_to_save", json_null());
    json_object_set_new(j, "peft_type", json_string("LORA"));
    json_object_set_new(j, "r", json_integer(a->rank));
    json_object_set_new(j, "rank_pattern", json_object());
    json_object_set_new(j, "revision", json_null());
    json_object_set_new(j, "target_modules", targets);
    json_object_set_new(j, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(j, "use_dora", json_false());
    json_object_set_new(j, "use_rslora", json_false());
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    int n, rc = file_mkdir_p(dir, 0755, err);
    float *folded;
    StTensor *ts = peft_tensors(m, m->params, &n, &folded);
    char path[1200];
    snprintf(path, sizeof path, "%s/" PEFT_TENSORS, dir);
    if (rc == 0) rc = st_write(path, ts, n, err);
    snprintf(path, sizeof path, "%s/" PEFT_CONFIG, dir);
    if (rc == 0) rc = file_write_atomic(path, text, strlen(text), 0644, err);
    free(ts), free(folded), free(text);
    return rc;
}

/* ---- adapter_config.json -------------------------------------------------------------- */

typedef enum {
    K_USED,     /* read below */
    K_HARMLESS, /* does not change the model */
    K_FALSE,    /* false (or null) */
    K_EMPTY,    /* null, [] or {} */
} KeyRule;
typedef struct PeftKey {
    const char *key;
    KeyRule rule;
    const char *what; /* for a refusal: what the setting is, and what to do */
} PeftKey;

#define SAVE_PLAIN "save the adapter as plain LoRA"
static const PeftKey KEYS[] = {
    {"peft_type", K_USED, NULL},
    {"r", K_USED, NULL},
    {"lora_alpha", K_USED, NULL},
    {"target_modules", K_USED, NULL},
    {"bias", K_USED, NULL},
    {"init_lora_weights", K_USED, NULL},
    {"task_type", K_HARMLESS, NULL},
    {"base_model_name_or_path", K_HARMLESS, NULL},
    {"revision", K_HARMLESS, NULL},
    {"inference_mode", K_HARMLESS, NULL},
    {"lora_dropout", K_USED, NULL}, /* training only: an identity at inference */
    {"peft_version", K_HARMLESS, NULL},
    {"auto_mapping", K_HARMLESS, NULL},
    {"megatron_config", K_HARMLESS, NULL},
    {"megatron_core", K_HARMLESS, NULL},
    {"qalora_group_size", K_HARMLESS, NULL}, /* used only with use_qalora */
    {"ensure_weight_tying", K_HARMLESS, NULL},
    {"layers_pattern", K_HARMLESS, NULL}, /* used only with layers_to_transform */
    {"use_rslora", K_FALSE,
     "rank-stabilized scaling (alpha / sqrt(r)); Strait scales by alpha / r: save with "
     "use_rslora false and lora_alpha multiplied by sqrt(r)"},
    {"use_dora", K_FALSE,
     "DoRA (magnitude vectors and another forward); Strait takes plain LoRA: merge the "
     "DoRA adapter into its base, or train plain LoRA"},
    {"fan_in_fan_out", K_FALSE,
     "weights stored (in, out) as GPT-2's Conv1D; the Llama family's are (out, in): " SAVE_PLAIN},
    {"lora_bias", K_FALSE, "a bias on lora_B; " SAVE_PLAIN " (lora_bias false)"},
    {"use_qalora", K_FALSE, "QA-LoRA's pooled inputs; " SAVE_PLAIN},
    {"modules_to_save", K_EMPTY,
     "whole modules trained beside the adapters; merge them into the base, or train without "
     "modules_to_save"},
    {"rank_pattern", K_EMPTY,
     "a rank per module; Strait's adapters have one rank: train with one r"},
    {"alpha_pattern", K_EMPTY,
     "an alpha per module; Strait's adapters have one alpha: train with one lora_alpha"},
    {"layers_to_transform", K_EMPTY,
     "adapters on some layers only; Strait adapts every layer: train with "
     "layers_to_transform null"},
    {"exclude_modules", K_EMPTY, "modules left out; Strait adapts every layer of each target"},
    {"layer_replication", K_EMPTY, "layers repeated in the base; Strait's base has its own"},
    {"trainable_token_indices", K_EMPTY, "embedding rows trained beside the adapters"},
    {"target_parameters", K_EMPTY, "adapters on parameters rather than modules"},
    {"alora_invocation_tokens", K_EMPTY, "activated LoRA (aLoRA), on after given tokens alone"},
    {"arrow_config", K_EMPTY, "Arrow routing between adapters"},
    {"loftq_config", K_EMPTY, "LoftQ, which changes the base's weights"},
    {"eva_config", K_EMPTY, "EVA initialisation"},
    {"corda_config", K_EMPTY, "CorDA, which changes the base's weights"},
    {"lora_ga_config", K_EMPTY, "LoRA-GA, which changes the base's weights"},
    {"kasa_config", K_EMPTY, "KaSA, which truncates the base's singular values"},
    {"monteclora_config", K_EMPTY, "MonteCLoRA's sampling over the adapters"},
    {"use_bdlora", K_EMPTY, "BD-LoRA's block-diagonal factors"},
    {"velora_config", K_EMPTY, "VeLoRA's compressed backward"},
};
#define N_KEYS (int)(sizeof KEYS / sizeof KEYS[0])

static int is_empty(json_t *v) {
    return json_is_null(v) || (json_is_array(v) && json_array_size(v) == 0) ||
           (json_is_object(v) && json_object_size(v) == 0);
}

/* target_modules: a list of the architecture's projection names, or
 * "all-linear" (every one); a string is PEFT's regular expression */
static int targets_of(json_t *v, unsigned *targets, char *err) {
    static const char *const names[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                        "gate_proj", "up_proj", "down_proj"};
    *targets = 0;
    if (json_is_string(v) && strcmp(json_string_value(v), "all-linear") == 0) {
        *targets = LORA_ALL;
        return 0;
    }
    if (json_is_string(v))
        return err_set(err,
                       "target_modules is a regular expression (\"%.80s\"); give the list of "
                       "projections (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                       "down_proj)",
                       json_string_value(v));
    if (!json_is_array(v) || json_array_size(v) == 0)
        return err_set(err, "target_modules should be a list of projections (q_proj, v_proj, ...)");
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *s = json_string_value(json_array_get(v, i));
        int k = 0;
        while (s && k < 7 && strcmp(s, names[k]) != 0) k++;
        if (s == NULL || k == 7)
            return err_set(err,
                           "target_modules names %.80s; Strait adapts q_proj, k_proj, v_proj, "
                           "o_proj, gate_proj, up_proj and down_proj",
                           s ? s : "something not a string");
        *targets |= 1u << k;
    }
    _Static_assert(LORA_Q == 1 && LORA_DOWN == 1 << 6, "names[] follows the LORA_* bits");
    return 0;
}

int peft_config_parse(const char *text, size_t len, AdapterConfig *a, char *err) {
    memset(a, 0, sizeof *a);
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    int rc = 0;
    if (!json_is_object(j)) {
        json_decref(j);
        return err_set(err, "not a JSON object (%s)", je.text);
    }
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v) {
        int k = 0;
        while (k < N_KEYS && strcmp(KEYS[k].key, key) != 0) k++;
        if (k == N_KEYS) {
            rc = err_set(err,
                         "key %.80s is not one of plain LoRA's; Strait refuses what might change "
                         "the arithmetic: save the adapter with a PEFT that writes plain LoRA",
                         key);
            break;
        }
        if ((KEYS[k].rule == K_FALSE && !json_is_false(v) && !json_is_null(v)) ||
            (KEYS[k].rule == K_EMPTY && !is_empty(v))) {
            rc = err_set(err, "%s is %s: %s", key, KEYS[k].rule == K_FALSE ? "set" : "not empty",
                         KEYS[k].what);
            break;
        }
    }
    const char *type = json_string_value(json_object_get(j, "peft_type"));
    json_t *r = json_object_get(j, "r"), *alpha = json_object_get(j, "lora_alpha");
    json_t *bias = json_object_get(j, "bias"), *init = json_object_get(j, "init_lora_weights");
    json_t *dropout = json_object_get(j, "lora_dropout"); /* absent or null: PEFT's 0 */
    if (rc == 0 && dropout && !json_is_null(dropout) &&
        (!json_is_number(dropout) || !((float)json_number_value(dropout) >= 0) ||
         !((float)json_number_value(dropout) < 1)))
        rc = err_set(err, "lora_dropout should be a number from 0 up to (not including) 1");
    if (rc == 0 && (type == NULL || strcmp(type, "LORA") != 0))
        rc =
            err_set(err, "peft_type is %.40s; Strait takes LORA adapters", type ? type : "missing");
    if (rc == 0 &&
        (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > LORA_RANK_MAX))
        rc = err_set(err, "r should be a rank of 1 to %d", LORA_RANK_MAX);
    if (rc == 0 && (!json_is_number(alpha) || !(json_number_value(alpha) > 0) ||
                    !(json_number_value(alpha) < 1e6)))
        rc = err_set(err, "lora_alpha should be a number above 0 (the scale is lora_alpha / r)");
    if (rc == 0 && bias && !json_is_null(bias) &&
        !(json_is_string(bias) && strcmp(json_string_value(bias), "none") == 0))
        rc = err_set(err, "bias is not \"none\": the adapter changes the base's biases; " SAVE_PLAIN
                          " (bias \"none\")");
    /* init only; the ones that change the base's weights do not fit it */
    if (rc == 0 && init && !json_is_boolean(init) && !json_is_null(init) &&
        !(json_is_string(init) && strcmp(json_string_value(init), "gaussian") == 0))
        rc = err_set(err,
                     "init_lora_weights is %.40s, which changes the base's weights as well: "
                     "convert the adapter to plain LoRA over the original base (PEFT's "
                     "path_initial_model_for_weight_conversion) or merge it",
                     json_is_string(init) ? json_string_value(init) : "not a boolean");
    if (rc == 0 && json_object_get(j, "target_modules") == NULL)
        rc = err_set(err, "target_modules is missing; give the list of projections");
    if (rc == 0) rc = targets_of(json_object_get(j, "target_modules"), &a->targets, err);
    a->base_seed = -1; /* over a pretrained base */
    if (rc == 0) {
        a->rank = (int)json_integer_value(r);
        a->alpha = (float)json_number_value(alpha);
        a->dropout = json_is_number(dropout) ? (float)json_number_value(dropout) : 0;
    }
    json_decref(j);
    return rc;
}

/* ---- in ------------------------------------------------------------------------------- */

static int import_peft(Model *m, const char *dir, char *err) {
    char path[1200], *text, why[ERR_LEN];
    size_t len;
    snprintf(path, sizeof path, "%s/" PEFT_CONFIG, dir);
    if (file_read_all(path, 1 << 20, &text, &len, err) != 0) return -1;
    AdapterConfig a;
    int rc = peft_config_parse(text, len, &a, why);
    free(text);
    if (rc != 0) return err_set(err, "%s: %s", path, why);
    if (m->cfg.lora.rule == LORA_RULE_FEDSB)
        return err_set(err,
                       "%s: a PEFT LoRA (lora_A, lora_B) cannot be split into Fed-SB's B·R·A over "
                       "the frozen B and A its seed draws; go on from it with the fedit rule",
                       dir);
    if (m->cfg.lora.rank > 0) return err_set(err, "the model has adapters already");
    if (model_add_adapters(m, &a, 0, why) != 0) return err_set(err, "%s: %s", path, why);
    StMap *f = st_map(dir, PEFT_TENSORS, err);
    if (f == NULL) return -1;
    int n;
    float *folded;
    StTensor *ts = peft_tensors(m, m->params, &n, &folded); /* fedit: A and B themselves */
    /* every tensor checked before any is read, then none more in the file */
    for (int pass = 0; pass < 2 && rc == 0; pass++)
        for (int i = 0; i < n && rc == 0; i++)
            if (st_take(f, ts[i].name, ts[i].shape[0], ts[i].shape[1],
                        pass ? (float *)ts[i].src : NULL, why) != 0)
                rc = err_set(err, "%s/%s: %s", dir, PEFT_TENSORS, why);
    char names[128];
    model_lora_targets_names(a.targets, names, sizeof names);
    const char *key;
    json_t *v;
    json_object_foreach(st_header(f), key, v) {
        if (rc != 0) break;
        int i = 0;
        while (i < n && strcmp(ts[i].name, key) != 0) i++;
        if (i == n && strcmp(key, "__metadata__") != 0)
            rc = err_set(err,
                         "%s/%s holds tensor %.120s, which is not one of the adapters the config "
                         "describes (rank %d on %s of every layer)",
                         dir, PEFT_TENSORS, key, a.rank, names);
    }
    st_unmap(f);
    free(ts), free(folded);
    return rc;
}

int model_import_peft(Model *m, const char *dir, char *err) {
    int rc = import_peft(m, dir, err);
    if (rc != 0) model_free(m);
    return rc;
}

int model_import_adapted(Model *m, const char *base_path, const char *peft_dir, char *err) {
    if (model_import_frozen(m, base_path, err) != 0) return -1;
    return model_import_peft(m, peft_dir, err);
}

/* ---- merged --------------------------------------------------------------------------- */

int model_merge_adapters(const Model *m, Model *out, char *err) {
    memset(out, 0, sizeof *out);
    if (m->cfg.lora.rank == 0 || m->lora_view == NULL)
        return err_set(err, "the model has no adapters to merge");
    assert(!m->base_rounded); /* merged from the base as loaded, never after a bf16 pass */
    ModelConfig c = m->cfg;
    memset(&c.lora, 0, sizeof c.lora);
    if (model_build(out, &c, 0, err) != 0) return -1;
    if (out->n_params != m->n_base) {
        model_free(out);
        return err_set(err, "the base's table differs from the architecture's");
    }
    memcpy(out->params, m->base, m->n_base * sizeof(float));
    int L = m->cfg.L, R = m->cfg.lora.rank;
    float s = m->cfg.lora.alpha / (float)R, *ra = NULL;
    for (int l = 0; l < L; l++)
        for (int r = 0; r < m->arch->n_tensors; r++) {
            LoraAt at;
            if (!model_lora_at(m, m->params, r, l, &at)) continue;
            const float *pa = at.A, *pb = at.B;
            int rows = at.out, cols = at.in;
            if (at.R) { /* Fed-SB: B·(R·A), as --format peft writes it */
                free(ra);
                ra = mallocCheck((size_t)R * cols * sizeof(float));
                fold_r(&at, R, ra);
                pa = ra;
            }
            float *w = arch_w(out, out->params, r, l);
            /* W += s (B A), B A in fp32 as PEFT's merge computes it */
            for (int o = 0; o < rows; o++)
                for (int i = 0; i < cols; i++) {
                    float d = 0;
                    for (int k = 0; k < R; k++)
                        d += pb[(size_t)o * R + k] * pa[(size_t)k * cols + i];
                    w[(size_t)o * cols + i] += s * d;
                }
        }
    free(ra);
    return 0;
}
