/*
 * test_hf_config.c — config.json as transformers 4 and 5 write it
 * (the files of tests/fixtures/configs, each written by the library's own
 * save_pretrained: tests/python/make_fixtures.py) read to the same model,
 * and every field or value Strait cannot compute refused by name; and a
 * tiny Llama saved by transformers 4 (tests/fixtures/llama-transformers4)
 * read with the logits transformers 4 recorded at its making.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "kernels/formats.h"
#include "kernels/model.h"
#include "tests/harness.h"
#include "util/util.h"

static void fixture(char *out, size_t n, const char *name) {
    const char *src = getenv("STRAIT_SRC");
    cr_assert_not_null(src, "run through make test (it sets STRAIT_SRC)");
    snprintf(out, n, "%s/tests/fixtures/%s", src, name);
}

static ModelConfig config_of(const char *name) {
    char path[800], err[ERR_LEN];
    fixture(path, sizeof path, name);
    ModelConfig c;
    cr_assert_eq(hf_config_load(path, &c, err), 0, "%s: %s", name, err);
    return c;
}

/* the fields that make the model: everything but its name */
static void assert_same_model(const ModelConfig *a, const ModelConfig *b, const char *what) {
    cr_assert(a->arch == b->arch && a->L == b->L && a->C == b->C && a->NH == b->NH &&
                  a->T == b->T && a->V == b->V && a->NKV == b->NKV && a->HD == b->HD &&
                  a->F == b->F && a->tied == b->tied && a->qkv_bias == b->qkv_bias &&
                  a->eps == b->eps && memcmp(&a->rope, &b->rope, sizeof a->rope) == 0,
              "%s: transformers 4's and 5's configs give different models", what);
}

Test(hf_config, smollm2s_rope_parameters_theta_is_taken_as_transformers_5_writes_it) {
    ModelConfig c = config_of("configs/llama-transformers5.json");
    cr_assert_eq(c.arch, ARCH_LLAMA);
    cr_assert_eq(c.rope.theta, 100000.0f, "theta %g", c.rope.theta);
    cr_assert_eq(c.rope.factor, 0.0f);
    cr_assert(c.tied && c.L == 1 && c.C == 16 && c.NH == 2 && c.NKV == 1 && c.HD == 8);
    cr_assert_eq(c.eps, 1e-5f);
}

Test(hf_config, each_architecture_reads_the_same_from_transformers_4_and_5) {
    static const char *const arch[] = {"llama", "llama3", "qwen2", "gpt2"};
    for (int i = 0; i < 4; i++) {
        char four[80], five[80];
        snprintf(four, sizeof four, "configs/%s-transformers4.json", arch[i]);
        snprintf(five, sizeof five, "configs/%s-transformers5.json", arch[i]);
        ModelConfig a = config_of(four), b = config_of(five);
        assert_same_model(&a, &b, arch[i]);
    }
    ModelConfig l3 = config_of("configs/llama3-transformers5.json");
    cr_assert(l3.rope.theta == 500000.0f && l3.rope.factor == 8.0f && l3.rope.low_freq == 1.0f &&
              l3.rope.high_freq == 4.0f && l3.rope.original_ctx == 16 && !l3.tied);
    ModelConfig q = config_of("configs/qwen2-transformers5.json");
    cr_assert(q.arch == ARCH_QWEN2 && q.qkv_bias && q.rope.theta == 1000000.0f);
    ModelConfig g = config_of("configs/gpt2-transformers5.json");
    cr_assert(g.arch == ARCH_GPT2 && g.L == 1 && g.C == 16 && g.NH == 2 && g.V == 64);
}

/* a fixture with one field set (value: JSON; NULL removes it), loaded */
static int edited(const char *name, const char *key, const char *value, ModelConfig *c, char *err) {
    char path[800], out[800];
    fixture(path, sizeof path, name);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    cr_assert_not_null(j, "%s: %s", path, je.text);
    if (value == NULL) {
        json_object_del(j, key);
    } else {
        json_t *v = json_loads(value, JSON_DECODE_ANY, &je);
        cr_assert_not_null(v, "%s: %s", value, je.text);
        json_object_set_new(j, key, v);
    }
    char *dir = harness_tmpdir("hfconfig");
    snprintf(out, sizeof out, "%s/config.json", dir);
    cr_assert_eq(json_dump_file(j, out, JSON_INDENT(2)), 0);
    json_decref(j);
    int rc = hf_config_load(out, c, err);
    harness_rmtree(dir);
    free(dir);
    return rc;
}

/* by value: Criterion runs each case in a new process, where the parent's
 * pointers mean nothing */
typedef struct Refusal {
    char fixture[40], key[40], value[160], said[64];
} Refusal;

#define L4 "configs/llama-transformers4.json"
#define L5 "configs/llama-transformers5.json"
#define Q4 "configs/qwen2-transformers4.json"
#define Q5 "configs/qwen2-transformers5.json"
#define G5 "configs/gpt2-transformers5.json"
static Refusal REFUSED[] = {
    /* rotary embeddings Strait does not compute, in either form */
    {L5, "rope_parameters", "{\"rope_type\": \"yarn\", \"rope_theta\": 1e4, \"factor\": 4.0}",
     "rope_parameters of type yarn"},
    {L5, "rope_parameters", "{\"rope_type\": \"linear\", \"factor\": 2.0}", "of type linear"},
    {L5, "rope_parameters", "{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}",
     "partial_rotary_factor"},
    {L5, "rope_parameters",
     "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
     " \"high_freq_factor\": 4.0}",
     "original_max_position_embeddings"},
    {L4, "rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": 2.0}",
     "rope_scaling of type dynamic"},
    /* Llama 3's scaling without its factor: no scaling at all, were it defaulted */
    {L5, "rope_parameters",
     "{\"rope_type\": \"llama3\", \"rope_theta\": 100000.0, \"low_freq_factor\": 1.0,"
     " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
     "has no factor"},
    /* both forms, disagreeing */
    {L5, "rope_theta", "10000.0", "disagree"},
    {L4, "rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}", "disagree"},
    /* Qwen2's sliding windows */
    {Q5, "layer_types", "[\"sliding_attention\"]", "layer_types[0] is sliding_attention"},
    {Q5, "layer_types", "[\"full_attention\", \"full_attention\"]", "layer_types"},
    {Q4, "use_sliding_window", "true", "use_sliding_window"},
    /* settings computed only at their neutral value */
    {L5, "attention_bias", "true", "attention_bias"},
    {L5, "mlp_bias", "true", "mlp_bias"},
    {L5, "pretraining_tp", "2", "pretraining_tp"},
    {L5, "attention_dropout", "0.1", "attention_dropout"},
    {L4, "rope_interleaved", "true", "rope_interleaved"},
    {Q5, "attention_dropout", "0.1", "attention_dropout"},
    {L5, "hidden_act", "\"gelu\"", "hidden_act gelu"},
    {L5, "tie_word_embeddings", "\"yes\"", "tie_word_embeddings"},
    {L5, "bos_token_id", "\"<s>\"", "bos_token_id"},
    {L5, "eos_token_id", "[1, -2]", "eos_token_id"},
    {G5, "tie_word_embeddings", "false", "tie_word_embeddings"},
    {G5, "layer_norm_epsilon", "1e-6", "layer_norm_epsilon"},
    {G5, "n_inner", "100", "n_inner"},
    {G5, "add_cross_attention", "true", "add_cross_attention"},
    {G5, "scale_attn_weights", "false", "scale_attn_weights"},
    {G5, "scale_attn_weights", "null", "scale_attn_weights"}, /* None: falsy in transformers */
    {G5, "tie_word_embeddings", "null", "tie_word_embeddings"},
    {G5, "scale_attn_by_inverse_layer_idx", "true", "scale_attn_by_inverse_layer_idx"},
    {G5, "reorder_and_upcast_attn", "true", "reorder_and_upcast_attn"},
    /* fields Strait does not know at all */
    {L5, "quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4}",
     "config.json has quantization_config"},
    {L5, "partial_rotary_factor", "0.5", "partial_rotary_factor"},
    {Q5, "attention_bias", "true", "attention_bias"},
    {G5, "rotary_dim", "8", "rotary_dim"},
};

ParameterizedTestParameters(hf_config, refuses_what_it_cannot_compute_naming_it) {
    return cr_make_param_array(Refusal, REFUSED, sizeof REFUSED / sizeof REFUSED[0]);
}

ParameterizedTest(Refusal *r, hf_config, refuses_what_it_cannot_compute_naming_it) {
    ModelConfig c;
    char err[ERR_LEN];
    cr_assert_eq(edited(r->fixture, r->key, r->value, &c, err), -1, "%s = %s was accepted", r->key,
                 r->value);
    cr_assert_not_null(strstr(err, r->said), "%s = %s: %s", r->key, r->value, err);
}

Test(hf_config, an_unknown_field_says_what_to_do) {
    ModelConfig c;
    char err[ERR_LEN];
    cr_assert_eq(edited(L5, "some_new_knob", "3", &c, err), -1);
    cr_assert_not_null(strstr(err, "some_new_knob"), "%s", err);
    cr_assert_not_null(strstr(err, "remove it from config.json if it does not change the model"),
                       "%s", err);
}

Test(hf_config, what_does_not_change_the_model_is_taken) {
    static const struct {
        const char *fixture, *key, *value;
    } ok[] = {
        {L5, "eos_token_id", "[2, 7, 9]"}, /* Llama 3 lists several */
        {L5, "pad_token_id", "null"},
        {L5, "unk_token_id", "0"},                       /* as transformers 5 writes a GGUF's */
        {L5, "_model_name_or_path", "\"Smollm2 135M\""}, /* the same */
        {L5, "dtype", "\"bfloat16\""},
        {L4, "torch_dtype", "\"float16\""},
        {L5, "rope_theta", "100000.0"}, /* both forms, agreeing */
        {L5, "transformers.js_config", "{\"dtype\": \"q4\"}"},
        {L5, "is_llama_config", "true"},
        {Q4, "sliding_window", "4096"}, /* no layer slides: its size is moot */
        {Q5, "layer_types", "[\"full_attention\"]"},
        {G5, "n_ctx", "32"},
        {G5, "attn_pdrop", "0.1"},
        {L5, "rope_parameters", NULL}, /* transformers' own default: theta 10000 */
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        ModelConfig c;
        char err[ERR_LEN];
        cr_assert_eq(edited(ok[i].fixture, ok[i].key, ok[i].value, &c, err), 0, "%s = %s: %s",
                     ok[i].key, ok[i].value ? ok[i].value : "(removed)", err);
        if (ok[i].value == NULL) cr_assert_eq(c.rope.theta, 10000.0f);
    }
}

Test(hf_config, a_llama_saved_by_transformers_4_gives_the_logits_it_recorded, .timeout = 60) {
    char dir[800], path[900], err[ERR_LEN];
    fixture(dir, sizeof dir, "llama-transformers4");
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    cr_assert_not_null(ref, "%s: %s", path, je.text);
    Model m;
    cr_assert_eq(model_import_hf(&m, dir, err), 0, "%s", err);
    cr_assert_eq(m.cfg.rope.theta, 100000.0f, "the old form's rope_theta: %g", m.cfg.rope.theta);
    json_t *ids = json_object_get(ref, "ids"), *logits = json_object_get(ref, "logits");
    int n = (int)json_array_size(ids), V = m.cfg.V;
    cr_assert(n > 1 && (int)json_array_size(logits) == n);
    int *ctx = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) ctx[i] = (int)json_integer_value(json_array_get(ids, (size_t)i));
    float *ours = malloc(sizeof(float) * (size_t)V);
    double worst = 0;
    for (int t = 1; t <= n; t++) {
        model_next_logits(&m, ctx, t, ours);
        json_t *row = json_array_get(logits, (size_t)(t - 1));
        cr_assert_eq((int)json_array_size(row), V);
        for (int v = 0; v < V; v++) {
            double d = fabs(json_number_value(json_array_get(row, (size_t)v)) - ours[v]);
            worst = d > worst ? d : worst;
        }
    }
    cr_assert_lt(worst, 1e-4, "logits differ from transformers 4's by %g", worst);
    free(ctx), free(ours);
    model_free(&m);
    json_decref(ref);
}
