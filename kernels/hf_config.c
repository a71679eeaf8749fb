/*
 * hf_config.c — config.json's fields, checked for the architectures'
 * readers (API: arch.h). A config names its fields freely and transformers
 * adds new ones with every release; Strait honours those it reads, knows
 * some to be harmless (bookkeeping, token ids, the dtype of the files) and
 * some to be harmless only at a neutral value (no dropout, no bias, one
 * tensor-parallel slice). Any other field is refused by name: it might
 * change the arithmetic, and a model built from a silent default is wrong
 * without a word.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/arch.h"
#include "util/util.h"

/* fields every PretrainedConfig may write that do not change the model */
static const HfField COMMON[] = {
    {"architectures", HF_HARMLESS},
    {"model_type", HF_USED},
    {"transformers_version", HF_HARMLESS},
    {"_name_or_path", HF_HARMLESS},
    {"_model_name_or_path", HF_HARMLESS}, /* a GGUF's general.name, as transformers 5 keeps it */
    {"dtype", HF_HARMLESS},               /* the files' precision: Strait computes in fp32 */
    {"torch_dtype", HF_HARMLESS},
    {"use_cache", HF_HARMLESS},
    {"initializer_range", HF_HARMLESS},
    {"output_attentions", HF_HARMLESS},
    {"output_hidden_states", HF_HARMLESS},
    {"return_dict", HF_HARMLESS},
    {"tokenizer_class", HF_HARMLESS},
    {"task_specific_params", HF_HARMLESS},
    {"id2label", HF_HARMLESS}, /* a classifier's labels: a causal LM has no classifier */
    {"label2id", HF_HARMLESS},
    {"_num_labels", HF_HARMLESS},
    {"bos_token_id", HF_TOKEN_ID},
    {"eos_token_id", HF_TOKEN_ID},
    {"pad_token_id", HF_TOKEN_ID},
    {"unk_token_id", HF_TOKEN_ID},
    {"sep_token_id", HF_TOKEN_ID},
};

static const HfField *field_of(const char *key, const HfField *f, int n, const HfField *more,
                               int n_more) {
    for (int i = 0; i < n; i++)
        if (strcmp(f[i].key, key) == 0) return &f[i];
    for (int i = 0; i < n_more; i++)
        if (strcmp(more[i].key, key) == 0) return &more[i];
    for (size_t i = 0; i < sizeof COMMON / sizeof COMMON[0]; i++)
        if (strcmp(COMMON[i].key, key) == 0) return &COMMON[i];
    return NULL;
}

static int token_id_ok(json_t *v) {
    return json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < (1 << 30);
}

int hf_fields_check(json_t *j, const HfField *fields, int n, const HfField *more, int n_more,
                    char *err) {
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v) {
        const HfField *f = field_of(key, fields, n, more, n_more);
        if (f == NULL)
            return err_set(err,
                           "config.json has %.80s, a field Strait does not know (it might change "
                           "the model); remove it from config.json if it does not change the model",
                           key);
        if (f->rule == HF_USED || f->rule == HF_HARMLESS) continue;
        /* null is transformers' None: false or 0, neutral only where that is */
        if (json_is_null(v) && f->rule != HF_TRUE && f->rule != HF_ONE) continue;
        if (f->rule == HF_TOKEN_ID) {
            int ok = token_id_ok(v);
            if (json_is_array(v)) {
                ok = json_array_size(v) > 0;
                for (size_t i = 0; i < json_array_size(v); i++)
                    ok = ok && token_id_ok(json_array_get(v, i));
            }
            if (!ok)
                return err_set(err, "config.json's %s should be a token id or a list of them", key);
            continue;
        }
        int neutral = json_is_null(v)       ? 0
                      : f->rule == HF_FALSE ? json_is_false(v)
                      : f->rule == HF_TRUE  ? json_is_true(v)
                      : json_is_number(v) ? json_number_value(v) == (f->rule == HF_ONE ? 1.0 : 0.0)
                                          : 0;
        if (!neutral) {
            static const char *const want[] = {
                [HF_FALSE] = "false", [HF_TRUE] = "true", [HF_ZERO] = "0", [HF_ONE] = "1"};
            char *said = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            err_set(err, "config.json sets %s to %.40s; Strait computes this model only with %s",
                    key, said ? said : "?", want[f->rule]);
            free(said);
            return -1;
        }
    }
    return 0;
}

int hf_int(json_t *j, const char *key, long long def, long long lo, long long hi, int *out,
           char *err) {
    json_t *v = json_object_get(j, key);
    if (v == NULL || json_is_null(v)) {
        if (def < 0) return err_set(err, "config.json has no %s", key);
        *out = (int)def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return err_set(err, "config.json's %s should be an integer from %lld to %lld", key, lo, hi);
    *out = (int)json_integer_value(v);
    return 0;
}

int hf_num(json_t *j, const char *key, double def, float *out, char *err) {
    json_t *v = json_object_get(j, key);
    if (v == NULL || json_is_null(v)) {
        *out = (float)def;
        return 0;
    }
    if (!json_is_number(v)) return err_set(err, "config.json's %s should be a number", key);
    *out = (float)json_number_value(v);
    return 0;
}
