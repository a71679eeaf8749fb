/*
 * test_hf_export.c — `strait export --format hf` as a user runs it: the
 * tensors in bf16 or f16 (each value the compiler's own rounding of
 * Strait's fp32), cut into shards past --max-shard-size with an index
 * whose total_size and weight_map are the files', the tokenizer's files
 * copied as they are with its token ids in config.json and
 * generation_config.json; without a tokenizer, one line saying how to add
 * it; bad flags refused by name. (transformers itself loading such folders
 * is test_transformers.c's, in make test-hf.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "kernels/formats.h"
#include "kernels/model.h"
#include "kernels/tokenizer.h"
#include "tests/harness.h"
#include "util/util.h"

static char *root;

/* bf16's value of x, by arithmetic rather than bits: x's significand
 * rounded to 8 bits, ties to even (the default rounding of nearbyint) */
static float bf16_of(float x) {
    int e;
    double m = frexp((double)x, &e); /* |m| in [0.5, 1) */
    return (float)ldexp(nearbyint(m * 256.0), e - 8);
}

/* a byte-level BPE trained by PyPI's tokenizers (vocab.json, merges.txt),
 * with a generation_config.json of its own */
static int tokenizer_folder(const char *dir) {
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with tokenizers)");
    char script[700], err[ERR_LEN], path[800];
    snprintf(script, sizeof script, "%s/tests/python/bpe_reference.py", src);
    char *argv[] = {
        (char *)py, script, "train", (char *)dir, "300", "/usr/share/games/fortunes/wisdom", NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
    proc_result_free(&r);
    static const char gen[] = "{\"bos_token_id\": 0, \"eos_token_id\": 0, \"max_new_tokens\": 20}";
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    cr_assert_eq(file_write_atomic(path, gen, strlen(gen), 0644, err), 0, "%s", err);
    Tokenizer *tok = tokenizer_load_dir(dir, err);
    cr_assert_not_null(tok, "%s", err);
    int V = tokenizer_vocab_size(tok);
    tokenizer_free(tok);
    return V;
}

/* a GPT-2 of V tokens saved as Strait's checkpoint; m stays built */
static void checkpoint(Model *m, int V, const char *path) {
    char err[ERR_LEN];
    ModelConfig cfg;
    cr_assert_eq(model_config_shape(&cfg, "custom", 2, 64, 2, 64, V, err), 0, "%s", err);
    cr_assert_eq(model_build(m, &cfg, 5, err), 0, "%s", err);
    cr_assert_eq(model_save(m, path, 0, err), 0, "%s", err);
}

static json_t *json_of(const char *dir, const char *file) {
    char path[900];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    cr_assert_not_null(j, "%s: %s", path, je.text);
    return j;
}

static int same_file(const char *a, const char *b) {
    char *x, *y, err[ERR_LEN];
    size_t nx, ny;
    cr_assert_eq(file_read_all(a, 1 << 26, &x, &nx, err), 0, "%s", err);
    cr_assert_eq(file_read_all(b, 1 << 26, &y, &ny, err), 0, "%s", err);
    int same = nx == ny && memcmp(x, y, nx) == 0;
    free(x), free(y);
    return same;
}

Test(hf_export, bf16_shards_with_their_index_and_the_tokenizers_files, .timeout = 120) {
    root = harness_tmpdir("hfexport");
    char tok[700], ckpt[700], out[700], err[ERR_LEN];
    snprintf(tok, sizeof tok, "%s/tok", root);
    snprintf(ckpt, sizeof ckpt, "%s/model.safetensors", root);
    snprintf(out, sizeof out, "%s/out", root);
    int V = tokenizer_folder(tok);
    Model m;
    checkpoint(&m, V, ckpt);
    ProcResult r = harness_strait("export", ckpt, "--format", "hf", out, "--dtype", "bf16",
                                  "--max-shard-size", "20KB", "--tokenizer", tok);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "with the tokenizer"), "%s", r.out);
    proc_result_free(&r);
    /* the index: every tensor in a shard that holds it, total_size the files' */
    json_t *ix = json_of(out, "model.safetensors.index.json");
    json_t *map = json_object_get(ix, "weight_map");
    json_int_t total = json_integer_value(
                   json_object_get(json_object_get(ix, "metadata"), "total_size")),
               seen = 0;
    int shards = 0;
    for (int s = 1;; s++, shards++) { /* the shards' own headers */
        char name[64], path[800];
        /* the count is in the name: find it from the embedding's entry */
        const char *first = json_string_value(json_object_get(map, "transformer.wte.weight"));
        cr_assert_not_null(first);
        int n = atoi(first + strlen("model-00001-of-"));
        if (s > n) break;
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s, n);
        snprintf(path, sizeof path, "%s/%s", out, name);
        char *text;
        size_t len;
        cr_assert_eq(file_read_all(path, 1 << 26, &text, &len, err), 0, "%s", err);
        uint64_t hl;
        memcpy(&hl, text, 8);
        json_t *hdr = json_loadb(text + 8, (size_t)hl, 0, NULL);
        cr_assert_not_null(hdr, "%s", name);
        const char *key;
        json_t *v;
        size_t bytes = len - 8 - (size_t)hl;
        json_object_foreach(hdr, key, v) {
            if (strcmp(key, "__metadata__") == 0) continue;
            cr_assert_str_eq(json_string_value(json_object_get(map, key)), name, "%s", key);
            cr_assert_str_eq(json_string_value(json_object_get(v, "dtype")), "BF16");
        }
        cr_assert(bytes <= 20000 || json_object_size(hdr) == 2, "%s holds %zu bytes", name, bytes);
        seen += (json_int_t)bytes;
        json_decref(hdr);
        free(text);
    }
    cr_assert_gt(shards, 2);
    cr_assert_eq(seen, total, "index total_size %lld, shards hold %lld", (long long)total,
                 (long long)seen);
    json_decref(ix);
    /* each value is bf16's rounding of Strait's */
    Model back;
    cr_assert_eq(model_import_hf(&back, out, err), 0, "%s", err);
    for (size_t i = 0; i < m.n_params; i++) {
        float want = bf16_of(m.params[i]);
        cr_assert(back.params[i] == want, "parameter %zu: %.9g, bf16 of %.9g is %.9g", i,
                  back.params[i], m.params[i], want);
    }
    model_free(&back);
    /* the tokenizer's files as they are, its ids in both configs */
    static const char *const files[] = {"vocab.json", "merges.txt"};
    for (int k = 0; k < 2; k++) {
        char a[800], b[800];
        snprintf(a, sizeof a, "%s/%s", tok, files[k]);
        snprintf(b, sizeof b, "%s/%s", out, files[k]);
        cr_assert(same_file(a, b), "%s differs from the tokenizer's", files[k]);
    }
    json_t *cfg = json_of(out, "config.json"), *gen = json_of(out, "generation_config.json");
    cr_assert_str_eq(json_string_value(json_object_get(cfg, "torch_dtype")), "bfloat16");
    cr_assert_eq(json_integer_value(json_object_get(cfg, "eos_token_id")), 0);
    cr_assert_eq(json_integer_value(json_object_get(gen, "eos_token_id")), 0);
    cr_assert_eq(json_integer_value(json_object_get(gen, "max_new_tokens")), 20);
    json_decref(cfg), json_decref(gen);
    /* again into the same folder, unsharded: the old shards and index go */
    r = harness_strait("export", ckpt, "--format", "hf", out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    char ixp[800];
    snprintf(ixp, sizeof ixp, "%s/model.safetensors.index.json", out);
    cr_assert_neq(access(ixp, F_OK), 0, "a stale index was left");
    cr_assert_eq(model_import_hf(&back, out, err), 0, "%s", err);
    cr_assert_eq(memcmp(back.params, m.params, m.n_params * 4), 0);
    model_free(&back);
    model_free(&m);
    harness_rmtree(root);
    free(root);
}

Test(hf_export, f16_without_a_tokenizer_says_how_to_add_one, .timeout = 60) {
    root = harness_tmpdir("hfexport");
    char ckpt[700], out[700], err[ERR_LEN];
    snprintf(ckpt, sizeof ckpt, "%s/model.safetensors", root);
    snprintf(out, sizeof out, "%s/out", root);
    Model m;
    checkpoint(&m, 300, ckpt);
    ProcResult r = harness_strait("export", ckpt, "--format", "hf", out, "--dtype", "f16");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "no tokenizer files written"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "--tokenizer"), "%s", r.out);
    proc_result_free(&r);
    char path[800];
    snprintf(path, sizeof path, "%s/vocab.json", out);
    cr_assert_neq(access(path, F_OK), 0);
    Model back;
    cr_assert_eq(model_import_hf(&back, out, err), 0, "%s", err);
    for (size_t i = 0; i < m.n_params; i++)
        cr_assert(back.params[i] == (float)(_Float16)m.params[i], "parameter %zu", i);
    model_free(&back);
    json_t *cfg = json_of(out, "config.json");
    cr_assert_str_eq(json_string_value(json_object_get(cfg, "torch_dtype")), "float16");
    json_decref(cfg);
    model_free(&m);
    harness_rmtree(root);
    free(root);
}

Test(hf_export, bad_flags_are_refused_by_name, .timeout = 60) {
    root = harness_tmpdir("hfexport");
    char ckpt[700], out[700], empty[700];
    snprintf(ckpt, sizeof ckpt, "%s/model.safetensors", root);
    snprintf(out, sizeof out, "%s/out", root);
    snprintf(empty, sizeof empty, "%s/empty", root);
    cr_assert_eq(mkdir(empty, 0755), 0);
    Model m;
    checkpoint(&m, 300, ckpt);
    model_free(&m);
    static const struct {
        const char *flag, *value, *said;
    } bad[] = {
        {"--dtype", "q4", "--dtype q4"},
        {"--max-shard-size", "5XB", "--max-shard-size 5XB"},
        {"--max-shard-size", "0", "--max-shard-size 0"},
        {"--tokenizer", NULL, "holds no tokenizer files"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ProcResult r = harness_strait("export", ckpt, "--format", "hf", out, bad[k].flag,
                                      bad[k].value ? bad[k].value : empty);
        cr_assert_neq(r.status, 0, "%s %s was accepted", bad[k].flag, bad[k].value);
        cr_assert_not_null(strstr(r.err, bad[k].said), "%s: %s", bad[k].flag, r.err);
        proc_result_free(&r);
    }
    ProcResult r = harness_strait("export", ckpt, "--format", "llmc", out, "--dtype", "bf16");
    cr_assert_neq(r.status, 0);
    cr_assert_not_null(strstr(r.err, "--format hf"), "%s", r.err);
    proc_result_free(&r);
    harness_rmtree(root);
    free(root);
}
