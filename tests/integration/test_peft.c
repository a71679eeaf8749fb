/*
 * test_peft.c — LoRA adapters out to PEFT's folder and back, and merged
 * into their base (kernels/peft.c), directly and through `strait export`:
 * - a llama-tiny with adapters (B drawn nonzero) written as PEFT's folder
 *   and read over the same base gives back every value bit for bit and
 *   the same logits; the file's names, shapes and config are PEFT's;
 * - the merged model's logits equal the adapted model's to 1e-5;
 * - every refusal (a regular expression for target_modules, use_dora,
 *   rank_pattern, an unknown key, a missing tensor, a wrong shape, one
 *   tensor more) names what it refuses;
 * - `strait export --format peft` and `--format hf --merge --base`, and an
 *   adapter checkpoint without --base refused saying so.
 * Under make test-hf (suite transformers, peft_check.py): PEFT 0.21 loads
 * Strait's adapter over the exported base with Strait's logits to 1e-4;
 * Strait reads an adapter PEFT trained with PEFT's logits, over a tiny
 * Llama's folder and over SmolLM2's GGUF (to 1e-4 of the largest logit).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "kernels/model.h"
#include "tests/harness.h"
#include "util/util.h"

#define N_IDS 12

static char *root;
static void setup(void) {
    root = harness_tmpdir("peft");
}
static void teardown(void) {
    harness_rmtree(root);
    free(root);
}
TestSuite(peft, .init = setup, .fini = teardown);

static ModelConfig adapted_config(unsigned targets) {
    ModelConfig cfg;
    cr_assert_eq(model_config_preset("llama-tiny", &cfg), 0);
    cfg.lora.rank = 4, cfg.lora.alpha = 8, cfg.lora.targets = targets;
    cfg.lora.base_seed = 7; /* a drawn base: the one model_build(..., 7) draws */
    return cfg;
}

/* a llama-tiny with adapters on targets, B drawn nonzero; and its base alone */
static void adapted(Model *m, Model *base, unsigned targets) {
    char err[ERR_LEN];
    ModelConfig cfg = adapted_config(targets);
    cr_assert_eq(model_build(m, &cfg, 7, err), 0, "%s", err);
    m->cfg.lora.base = model_base_fingerprint(m); /* what this base is */
    uint64_t s = 99;
    for (int i = 1; i < m->n_views; i += 2) {
        float *p = m->params + m->views[i].offset;
        for (size_t k = 0; k < m->views[i].numel; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            p[k] = 0.05f * ((float)(s >> 40) / 8388608.0f - 1.0f);
        }
    }
    if (base == NULL) return;
    memset(&cfg.lora, 0, sizeof cfg.lora);
    cr_assert_eq(model_build(base, &cfg, 7, err), 0, "%s", err);
    cr_assert_eq(base->n_params, m->n_base);
    cr_assert_eq(memcmp(base->params, m->base, m->n_base * sizeof(float)), 0);
}

static float *logits(Model *m) {
    int ids[N_IDS];
    for (int i = 0; i < N_IDS; i++) ids[i] = (i * 37 + 5) % m->cfg.V;
    float *out = malloc(sizeof(float) * (size_t)N_IDS * m->cfg.V);
    for (int t = 1; t <= N_IDS; t++) model_next_logits(m, ids, t, out + (size_t)(t - 1) * m->cfg.V);
    return out;
}

static double max_diff(Model *a, Model *b) {
    float *x = logits(a), *y = logits(b);
    double worst = 0;
    for (size_t i = 0; i < (size_t)N_IDS * a->cfg.V; i++)
        worst = fmax(worst, fabs((double)x[i] - y[i]));
    free(x), free(y);
    return worst;
}

static char *path_in(const char *name) {
    char *p = malloc(1200);
    snprintf(p, 1200, "%s/%s", root, name);
    return p;
}

Test(peft, export_and_import_give_back_every_value_and_the_same_logits) {
    Model m, b;
    char err[ERR_LEN];
    adapted(&m, &b, LORA_Q | LORA_V | LORA_DOWN);
    m.cfg.lora.dropout = 0.05f; /* training's alone: the logits are the same */
    char *dir = path_in("adapter");
    cr_assert_eq(model_export_peft(&m, dir, "HuggingFaceTB/SmolLM2-135M", err), 0, "%s", err);
    cr_assert_eq(model_import_peft(&b, dir, err), 0, "%s", err);
    cr_assert_eq(b.cfg.lora.rank, 4);
    cr_assert_eq(b.cfg.lora.alpha, 8.0f);
    cr_assert_eq(b.cfg.lora.dropout, 0.05f);
    cr_assert_eq(b.cfg.lora.targets, (unsigned)(LORA_Q | LORA_V | LORA_DOWN));
    cr_assert_eq(b.n_params, m.n_params);
    cr_assert_eq(memcmp(b.params, m.params, m.n_params * sizeof(float)), 0);
    cr_assert_eq(max_diff(&m, &b), 0.0);
    /* PEFT's names, shapes and keys */
    char *text, path[1300];
    size_t len;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    cr_assert_eq(file_read_all(path, 1 << 20, &text, &len, err), 0, "%s", err);
    json_t *j = json_loadb(text, len, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "peft_type")), "LORA");
    cr_assert_eq(json_integer_value(json_object_get(j, "r")), 4);
    cr_assert_float_eq(json_number_value(json_object_get(j, "lora_dropout")), 0.05, 1e-7);
    json_t *t = json_object_get(j, "target_modules");
    cr_assert_eq(json_array_size(t), 3);
    cr_assert_str_eq(json_string_value(json_array_get(t, 0)), "q_proj");
    cr_assert_str_eq(json_string_value(json_array_get(t, 2)), "down_proj");
    cr_assert_str_eq(json_string_value(json_object_get(j, "base_model_name_or_path")),
                     "HuggingFaceTB/SmolLM2-135M");
    json_decref(j), free(text);
    StMap *f = st_map(dir, "adapter_model.safetensors", err);
    cr_assert_not_null(f, "%s", err);
    cr_assert_eq(json_object_size(st_header(f)), (size_t)m.n_views + 1); /* and __metadata__ */
    int C = m.cfg.C, F = m.cfg.F, Q = m.cfg.NH * m.cfg.HD;
    cr_assert_eq(st_take(f, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", 4, C,
                         NULL, err),
                 0, "%s", err);
    cr_assert_eq(st_take(f, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", Q, 4,
                         NULL, err),
                 0, "%s", err);
    cr_assert_eq(
        st_take(f, "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight", 4, F, NULL, err),
        0, "%s", err);
    cr_assert_str_eq(
        json_string_value(json_object_get(json_object_get(st_header(f), "__metadata__"), "format")),
        "pt");
    st_unmap(f);
    model_free(&m), model_free(&b), free(dir);
}

Test(peft, merged_model_computes_what_the_adapters_do) {
    Model m, merged;
    char err[ERR_LEN];
    adapted(&m, NULL, LORA_ALL);
    cr_assert_eq(model_merge_adapters(&m, &merged, err), 0, "%s", err);
    cr_assert_eq(merged.cfg.lora.rank, 0);
    double d = max_diff(&m, &merged);
    fprintf(stderr, "merged against adapted: logits differ by %g\n", d);
    cr_assert(d < 1e-5, "merged logits differ by %g", d);
    cr_assert(d >= 0);
    /* and the adapters did change the model */
    Model base;
    ModelConfig cfg = adapted_config(LORA_ALL);
    memset(&cfg.lora, 0, sizeof cfg.lora);
    cr_assert_eq(model_build(&base, &cfg, 7, err), 0, "%s", err);
    cr_assert(max_diff(&base, &merged) > 1e-3);
    model_free(&m), model_free(&merged), model_free(&base);
}

/* the exported folder with key set to value (JSON text; NULL: removed) */
static void edit_config(const char *dir, const char *key, const char *value) {
    char path[1300], *text, err[ERR_LEN];
    size_t len;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    cr_assert_eq(file_read_all(path, 1 << 20, &text, &len, err), 0, "%s", err);
    json_t *j = json_loadb(text, len, 0, NULL);
    free(text);
    if (value)
        json_object_set_new(j, key, json_loads(value, JSON_DECODE_ANY, NULL));
    else
        json_object_del(j, key);
    text = json_dumps(j, JSON_INDENT(2));
    cr_assert_eq(file_write_atomic(path, text, strlen(text), 0644, err), 0, "%s", err);
    free(text), json_decref(j);
}

/* the folder's import over a fresh base fails, its error naming `names` */
static void refused(const char *dir, const char *names) {
    Model b, m;
    char err[ERR_LEN];
    adapted(&m, &b, LORA_Q | LORA_V);
    model_free(&m);
    cr_assert_neq(model_import_peft(&b, dir, err), 0, "accepted (%s)", names);
    cr_assert(strstr(err, names) != NULL, "\"%s\" does not name %s", err, names);
    cr_assert_eq(b.params, NULL); /* freed */
}

static char *exported(const char *name) {
    Model m;
    char err[ERR_LEN], *dir = path_in(name);
    adapted(&m, NULL, LORA_Q | LORA_V);
    cr_assert_eq(model_export_peft(&m, dir, NULL, err), 0, "%s", err);
    model_free(&m);
    return dir;
}

Test(peft, a_config_strait_cannot_honour_is_refused_by_key) {
    static const struct {
        const char *key, *value, *named;
    } cases[] = {
        {"target_modules", "\".*\\\\.(q|v)_proj\"", "regular expression"},
        {"target_modules", "[\"q_proj\", \"lm_head\"]", "lm_head"},
        {"use_dora", "true", "use_dora"},
        {"use_rslora", "true", "use_rslora"},
        {"rank_pattern", "{\"q_proj\": 8}", "rank_pattern"},
        {"alpha_pattern", "{\"q_proj\": 8}", "alpha_pattern"},
        {"layers_to_transform", "[0]", "layers_to_transform"},
        {"modules_to_save", "[\"lm_head\"]", "modules_to_save"},
        {"bias", "\"all\"", "bias"},
        {"fan_in_fan_out", "true", "fan_in_fan_out"},
        {"init_lora_weights", "\"pissa\"", "init_lora_weights"},
        {"peft_type", "\"IA3\"", "peft_type"},
        {"lora_dropout", "1.5", "lora_dropout"},
        {"lora_dropout", "\"some\"", "lora_dropout"},
        {"lora_frobnicate", "1", "lora_frobnicate"},
        {"r", NULL, "r should be"},
        {"r", "0", "r should be"},
        {"lora_alpha", "-1", "lora_alpha"},
        {"target_modules", NULL, "target_modules"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "case%zu", i);
        char *dir = exported(name);
        edit_config(dir, cases[i].key, cases[i].value);
        refused(dir, cases[i].named);
        free(dir);
    }
}

Test(peft, harmless_keys_are_taken_as_they_are) {
    char *dir = exported("harmless");
    edit_config(dir, "lora_dropout", "0.1");
    edit_config(dir, "peft_version", "\"0.21.2\"");
    edit_config(dir, "loftq_config", "{}");
    edit_config(dir, "eva_config", "null");
    edit_config(dir, "megatron_core", "\"megatron.core\"");
    edit_config(dir, "lora_bias", "false");
    edit_config(dir, "target_modules", "[\"v_proj\", \"q_proj\"]");
    Model m, b;
    char err[ERR_LEN];
    adapted(&m, &b, LORA_Q | LORA_V);
    model_free(&m);
    cr_assert_eq(model_import_peft(&b, dir, err), 0, "%s", err);
    cr_assert_eq(b.cfg.lora.targets, (unsigned)(LORA_Q | LORA_V));
    /* lora_dropout is read: a run that goes on from the folder drops as it did */
    cr_assert_eq(b.cfg.lora.dropout, 0.1f);
    model_free(&b), free(dir);
}

/* the folder's tensors rewritten by f: the rest as exported */
static void rewrite_tensors(const char *dir, int drop, int reshape, int extra) {
    Model m;
    char err[ERR_LEN], path[1300];
    adapted(&m, NULL, LORA_Q | LORA_V);
    StTensor ts[64];
    int n = 0;
    static float zeros[4096];
    for (int i = 0; i < m.n_views; i++) {
        if (i == drop) continue;
        StTensor *t = &ts[n++];
        snprintf(t->name, sizeof t->name,
                 "base_model.model.model.layers.%d.self_attn.%s_proj.lora_%c.weight", i / 4,
                 (i / 2) % 2 ? "v" : "q", i % 2 ? 'B' : 'A');
        t->shape[0] = m.views[i].shape[0], t->shape[1] = m.views[i].shape[1];
        if (i == reshape) t->shape[0]--;
        t->src = m.params + m.views[i].offset;
    }
    if (extra) {
        StTensor *t = &ts[n++];
        snprintf(t->name, sizeof t->name, "base_model.model.lm_head.lora_A.weight");
        t->shape[0] = 4, t->shape[1] = 8, t->src = zeros;
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    cr_assert_eq(st_write(path, ts, n, err), 0, "%s", err);
    model_free(&m);
}

Test(peft, a_missing_misshapen_or_extra_tensor_is_named) {
    char *dir = exported("tensors");
    rewrite_tensors(dir, -1, -1, 0); /* as exported: read */
    Model m, b;
    char err[ERR_LEN];
    adapted(&m, &b, LORA_Q | LORA_V);
    cr_assert_eq(model_import_peft(&b, dir, err), 0, "%s", err);
    cr_assert_eq(memcmp(b.params, m.params, m.n_params * sizeof(float)), 0);
    model_free(&m), model_free(&b);
    rewrite_tensors(dir, 3, -1, 0);
    refused(dir, "layers.0.self_attn.v_proj.lora_B.weight");
    rewrite_tensors(dir, -1, 4, 0);
    refused(dir, "layers.1.self_attn.q_proj.lora_A.weight has shape [3, ");
    rewrite_tensors(dir, -1, -1, 1);
    refused(dir, "lm_head.lora_A.weight");
    free(dir);
}

/* `strait export` with args; its exit status, output in out (caller frees) */
static int strait(char **out, const char *a0, const char *a1, const char *a2, const char *a3,
                  const char *a4, const char *a5, const char *a6, const char *a7) {
    char *argv[] = {(char *)harness_strait_bin(),
                    "export",
                    (char *)a0,
                    (char *)a1,
                    (char *)a2,
                    (char *)a3,
                    (char *)a4,
                    (char *)a5,
                    (char *)a6,
                    (char *)a7,
                    NULL};
    ProcResult r = proc_run(argv);
    size_t n = strlen(r.out) + strlen(r.err) + 2;
    *out = malloc(n);
    snprintf(*out, n, "%s\n%s", r.out, r.err);
    int st = r.status;
    proc_result_free(&r);
    return st;
}

Test(peft, strait_export_writes_the_adapter_and_the_merged_model) {
    Model m, b, merged, back;
    char err[ERR_LEN], *out;
    adapted(&m, &b, LORA_Q | LORA_V | LORA_UP);
    char *ckpt = path_in("round.safetensors"), *base = path_in("base"), *peft = path_in("out"),
         *hf = path_in("merged"), *wrong = path_in("wrong");
    cr_assert_eq(model_export_hf(&b, base, NULL, err), 0, "%s", err);
    /* adapters over a pretrained base, merged without it */
    m.cfg.lora.base_seed = -1;
    cr_assert_eq(model_save(&m, ckpt, 3, err), 0, "%s", err);
    cr_assert_neq(strait(&out, ckpt, "--format", "hf", "--merge", hf, NULL, NULL, NULL), 0);
    cr_assert(strstr(out, "--base PATH") != NULL, "%s", out);
    free(out);
    /* over a drawn base, which the seed draws again */
    m.cfg.lora.base_seed = 7;
    cr_assert_eq(model_save(&m, ckpt, 3, err), 0, "%s", err);
    cr_assert_eq(strait(&out, ckpt, "--format", "hf", "--merge", hf, NULL, NULL, NULL), 0, "%s",
                 out);
    free(out);
    cr_assert_eq(model_merge_adapters(&m, &merged, err), 0, "%s", err);
    cr_assert_eq(model_import_hf(&back, hf, err), 0, "%s", err);
    cr_assert_eq(memcmp(back.params, merged.params, merged.n_params * sizeof(float)), 0);
    model_free(&back), model_free(&merged);
    cr_assert_neq(strait(&out, ckpt, "--format", "hf", hf, NULL, NULL, NULL, NULL), 0);
    cr_assert(strstr(out, "--merge") != NULL, "%s", out);
    free(out);
    /* another base: refused by its fingerprint */
    b.params[0] += 1.0f;
    cr_assert_eq(model_export_hf(&b, wrong, NULL, err), 0, "%s", err);
    cr_assert_neq(strait(&out, ckpt, "--format", "hf", "--merge", "--base", wrong, hf, NULL), 0);
    cr_assert(strstr(out, "fingerprint") != NULL, "%s", out);
    free(out);
    model_free(&b);
    /* the adapter: read back over the base */
    cr_assert_eq(strait(&out, ckpt, "--format", "peft", "--base", base, peft, NULL, NULL), 0, "%s",
                 out);
    free(out);
    cr_assert_eq(model_import_adapted(&back, base, peft, err), 0, "%s", err);
    cr_assert_eq(memcmp(back.params, m.params, m.n_params * sizeof(float)), 0);
    model_free(&back);
    /* strait train goes on from it: the same adapters, trained further */
    char *cont = path_in("cont.safetensors");
    ProcResult tr = harness_strait("train", "--init-from", base, "--adapters", peft, "--data",
                                   "/usr/share/games/fortunes/debian", "--steps", "3", "--batch",
                                   "2", "--seq", "32", "--out", cont);
    cr_assert_eq(tr.status, 0, "%s", tr.err);
    cr_assert(strstr(tr.err, "training adapters"), "%s", tr.err);
    proc_result_free(&tr);
    ModelConfig went;
    cr_assert_eq(model_read_config(cont, &went, NULL, err), 0, "%s", err);
    cr_assert(went.lora.rank == 4 && went.lora.targets == (LORA_Q | LORA_V | LORA_UP) &&
              went.lora.base == m.cfg.lora.base);
    cr_assert_eq(model_import_base(&back, &went, base, err), 0, "%s", err);
    cr_assert_eq(model_load(&back, cont, NULL, err), 0, "%s", err);
    double moved = 0;
    for (size_t i = 0; i < m.n_params; i++) moved += fabs((double)back.params[i] - m.params[i]);
    cr_assert(moved > 0 && moved < 1e3 * (double)m.n_params, "went on from %g away", moved);
    model_free(&back);
    tr = harness_strait("train", "--adapters", peft, "--data", "/usr/share/games/fortunes/debian",
                        "--steps", "1");
    cr_assert_neq(tr.status, 0);
    cr_assert(strstr(tr.err, "--init-from"), "%s", tr.err);
    proc_result_free(&tr);
    free(cont);
    /* the merged model, as transformers would read it */
    cr_assert_eq(strait(&out, ckpt, "--format", "hf", "--merge", "--base", base, hf, NULL), 0, "%s",
                 out);
    free(out);
    cr_assert_eq(model_merge_adapters(&m, &merged, err), 0, "%s", err);
    cr_assert_eq(model_import_hf(&back, hf, err), 0, "%s", err);
    cr_assert_eq(back.cfg.lora.rank, 0);
    cr_assert_eq(memcmp(back.params, merged.params, merged.n_params * sizeof(float)), 0);
    model_free(&back);
    /* and as llama.cpp's file (f32: read back bit for bit) */
    char *gguf = path_in("merged.gguf");
    cr_assert_eq(strait(&out, ckpt, "--format", "gguf", "--merge", "--base", base, gguf, NULL), 0,
                 "%s", out);
    free(out);
    cr_assert_eq(model_import_gguf(&back, gguf, err), 0, "%s", err);
    cr_assert_eq(memcmp(back.params, merged.params, merged.n_params * sizeof(float)), 0);
    model_free(&back), model_free(&merged);
    /* a whole model's checkpoint takes none of it */
    Model plain;
    ModelConfig cfg = adapted_config(LORA_Q);
    memset(&cfg.lora, 0, sizeof cfg.lora);
    cr_assert_eq(model_build(&plain, &cfg, 1, err), 0, "%s", err);
    cr_assert_eq(model_save(&plain, ckpt, 1, err), 0, "%s", err);
    model_free(&plain);
    cr_assert_neq(strait(&out, ckpt, "--format", "peft", peft, NULL, NULL, NULL, NULL), 0);
    cr_assert(strstr(out, "not LoRA adapters") != NULL, "%s", out);
    free(out);
    model_free(&m);
    free(ckpt), free(base), free(peft), free(hf), free(wrong), free(gguf);
}

/* ---- against PEFT itself (make test-hf: STRAIT_HF_PYTHON has peft) ------------------- */

/* tests/python/peft_check.py with args; its output (caller frees) */
static char *peft_check(const char *cmd, const char *base, const char *adapter, const char *ids,
                        const char *file) {
    char script[800];
    snprintf(script, sizeof script, "%s/tests/python/peft_check.py", getenv("STRAIT_SRC"));
    char *argv[] = {(char *)getenv("STRAIT_HF_PYTHON"),
                    script,
                    (char *)cmd,
                    (char *)base,
                    (char *)adapter,
                    (char *)ids,
                    (char *)file,
                    NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "peft_check.py %s: %s %s", cmd, r.out, r.err);
    char *out = strdup(r.out);
    proc_result_free(&r);
    return out;
}

/* N_IDS ids into dir/ids, as int32 */
static char *ids_file(const char *dir, int V, int *ids) {
    char *path = malloc(1200), err[ERR_LEN];
    for (int i = 0; i < N_IDS; i++) ids[i] = (i * 37 + 5) % V;
    snprintf(path, 1200, "%s/ids", dir);
    cr_assert_eq(file_write_atomic(path, ids, sizeof(int) * N_IDS, 0644, err), 0, "%s", err);
    return path;
}

/* m's adapters exported for PEFT over b, its base as a Hugging Face
 * folder: PEFT's logits over them are Strait's */
static void peft_loads(Model *m, Model *b, const char *tag) {
    char *dir = harness_tmpdir(tag), err[ERR_LEN], base[1200], adapter[1200], lg[1200];
    snprintf(base, sizeof base, "%s/base", dir);
    snprintf(adapter, sizeof adapter, "%s/adapter", dir);
    snprintf(lg, sizeof lg, "%s/strait.logits", dir);
    cr_assert_eq(model_export_hf(b, base, NULL, err), 0, "%s", err);
    cr_assert_eq(model_export_peft(m, adapter, base, err), 0, "%s", err);
    int ids[N_IDS];
    char *ids_path = ids_file(dir, m->cfg.V, ids);
    float *ours = logits(m);
    cr_assert_eq(file_write_atomic(lg, ours, sizeof(float) * N_IDS * m->cfg.V, 0644, err), 0, "%s",
                 err);
    char *out = peft_check("load", base, adapter, ids_path, lg);
    double d = -1, e = -1;
    cr_assert_eq(sscanf(out, "ok max_diff %lf base_diff %lf", &d, &e), 2, "%s", out);
    fprintf(stderr,
            "PEFT over Strait's adapter (%s): logits differ by %g (the adapter moves them %g)\n",
            model_lora_rule_name(m->cfg.lora.rule), d, e);
    cr_assert_lt(d, 1e-4, "PEFT's logits differ from Strait's by %g", d);
    cr_assert_gt(e, 1e-3, "the adapter changed nothing in PEFT (%g)", e);
    free(out), free(ours), free(ids_path);
    harness_rmtree(dir), free(dir);
}

Test(transformers, peft_loads_straits_adapter_over_its_base_with_the_same_logits, .timeout = 600) {
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    Model m, b;
    adapted(&m, &b, LORA_ALL);
    peft_loads(&m, &b, "peft-out");
    model_free(&m), model_free(&b);
}

/* Fed-SB's adapters go out as plain LoRA, R folded into lora_A: PEFT
 * computes what Strait's B·R·A does */
Test(transformers, peft_loads_straits_fedsb_adapter_as_plain_lora_with_the_same_logits,
     .timeout = 600) {
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    Model m, b;
    char err[ERR_LEN];
    ModelConfig cfg = adapted_config(LORA_ALL);
    cfg.lora.rule = LORA_RULE_FEDSB, cfg.lora.a_seed = 3;
    cr_assert_eq(model_build(&m, &cfg, 7, err), 0, "%s", err);
    uint64_t s = 5;
    for (size_t k = 0; k < m.n_params; k++) { /* R, drawn nonzero */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        m.params[k] = 0.5f * ((float)(s >> 40) / 8388608.0f - 1.0f);
    }
    memset(&cfg.lora, 0, sizeof cfg.lora);
    cr_assert_eq(model_build(&b, &cfg, 7, err), 0, "%s", err);
    cr_assert_eq(memcmp(b.params, m.base, m.n_base * sizeof(float)), 0);
    peft_loads(&m, &b, "peft-fedsb");
    model_free(&m), model_free(&b);
}

Test(transformers, strait_imports_an_adapter_peft_trained_with_the_same_logits, .timeout = 600) {
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    char *dir = harness_tmpdir("peft-in"), err[ERR_LEN], base[1200], adapter[1200], lg[1200];
    Model b, m;
    ModelConfig cfg = adapted_config(LORA_Q | LORA_V);
    memset(&cfg.lora, 0, sizeof cfg.lora);
    cr_assert_eq(model_build(&b, &cfg, 5, err), 0, "%s", err);
    snprintf(base, sizeof base, "%s/base", dir);
    snprintf(adapter, sizeof adapter, "%s/adapter", dir);
    snprintf(lg, sizeof lg, "%s/peft.logits", dir);
    cr_assert_eq(model_export_hf(&b, base, NULL, err), 0, "%s", err);
    model_free(&b);
    int ids[N_IDS];
    char *ids_path = ids_file(dir, cfg.V, ids);
    free(peft_check("make", base, adapter, ids_path, lg));
    cr_assert_eq(model_import_adapted(&m, base, adapter, err), 0, "%s", err);
    cr_assert_eq(m.cfg.lora.rank, 4);
    cr_assert_eq(m.cfg.lora.alpha, 8.0f);
    cr_assert_eq(m.cfg.lora.targets, (unsigned)(LORA_Q | LORA_V));
    char *theirs;
    size_t len;
    cr_assert_eq(file_read_all(lg, 1 << 26, &theirs, &len, err), 0, "%s", err);
    cr_assert_eq(len, sizeof(float) * N_IDS * (size_t)m.cfg.V);
    float *ours = logits(&m);
    double d = 0;
    for (size_t i = 0; i < (size_t)N_IDS * m.cfg.V; i++) {
        float t;
        memcpy(&t, theirs + 4 * i, 4);
        d = fmax(d, fabs((double)t - ours[i]));
    }
    fprintf(stderr, "Strait over PEFT's adapter: logits differ by %g\n", d);
    cr_assert_lt(d, 1e-4, "Strait's logits differ from PEFT's by %g", d);
    free(theirs), free(ours), free(ids_path);
    model_free(&m);
    harness_rmtree(dir), free(dir);
}

Test(transformers, an_adapter_peft_trained_over_smollm2_goes_over_its_gguf, .timeout = 900) {
    const char *smol = getenv("STRAIT_SMOLLM2");
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    if (smol == NULL || access(smol, R_OK) != 0) cr_skip_test("no SmolLM2 GGUF (make models)");
    char *dir = harness_tmpdir("peft-gguf"), err[ERR_LEN], base[1200], adapter[1200], lg[1200];
    Model g, m;
    /* PEFT trains over the GGUF's weights as a Hugging Face folder (f32) */
    cr_assert_eq(model_import(&g, smol, err), 0, "%s", err);
    snprintf(base, sizeof base, "%s/base", dir);
    snprintf(adapter, sizeof adapter, "%s/adapter", dir);
    snprintf(lg, sizeof lg, "%s/peft.logits", dir);
    cr_assert_eq(model_export_hf(&g, base, NULL, err), 0, "%s", err);
    int V = g.cfg.V, ids[N_IDS];
    model_free(&g);
    char *ids_path = ids_file(dir, V, ids);
    free(peft_check("make", base, adapter, ids_path, lg));
    /* Strait puts the adapter over the GGUF itself */
    cr_assert_eq(model_import_adapted(&m, smol, adapter, err), 0, "%s", err);
    char *theirs;
    size_t len;
    cr_assert_eq(file_read_all(lg, 1 << 28, &theirs, &len, err), 0, "%s", err);
    cr_assert_eq(len, sizeof(float) * N_IDS * (size_t)V);
    float *ours = logits(&m);
    double d = 0, top = 0;
    for (size_t i = 0; i < (size_t)N_IDS * V; i++) {
        float t;
        memcpy(&t, theirs + 4 * i, 4);
        d = fmax(d, fabs((double)t - ours[i]));
        top = fmax(top, fabs((double)t));
    }
    fprintf(stderr, "SmolLM2's GGUF with PEFT's adapter: logits differ by %g (largest %g)\n", d,
            top);
    cr_assert_lt(d, 1e-4 * fmax(top, 1.0), "Strait's logits differ from PEFT's by %g", d);
    free(theirs), free(ours), free(ids_path);
    model_free(&m);
    harness_rmtree(dir), free(dir);
}
