/*
 * test_transformers.c — Strait's Hugging Face folders against transformers
 * 5 with PyTorch on the CPU, what users run (`make test-hf`: build/venv-hf
 * holds the pinned set from PyPI; skipped by `make test`, whose check of
 * the same layout is test_interop.c's independent numpy forward pass, and
 * whose transformers 4 fixture is test_hf_config.c's).
 * - A GPT-2 of a BPE-sized vocabulary exported by Strait: transformers'
 *   logits equal Strait's to 1e-4, before and after Strait trains it.
 * - A random GPT-2, Llama (SmolLM2's form: theta 100000, tied, with a
 *   tokenizer), Llama 3 (rope llama3) and Qwen2 made and saved by
 *   transformers 5 (config in its new form): Strait reads each with
 *   transformers' logits to 1e-4; the Llama family trained by Strait and
 *   exported goes back: in f32, and in bf16 cut into shards, whose every
 *   tensor is torch's own rounding of the f32 one and whose logits equal,
 *   to 1e-4, Strait's on its model rounded to bf16 (the same weights in
 *   fp32 arithmetic on both sides); and AutoTokenizer loads the export
 *   with the source's tokenizer, encoding as it does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "kernels/formats.h"
#include "kernels/model.h"
#include "kernels/train.h"
#include "tests/harness.h"
#include "util/util.h"

#define T_IDS 48

/* Strait's logits at every position: the next-token logits of each prefix. */
static float *strait_logits(Model *m, const int *ids, int n) {
    float *out = malloc(sizeof(float) * (size_t)n * m->cfg.V);
    for (int t = 1; t <= n; t++) model_next_logits(m, ids, t, out + (size_t)(t - 1) * m->cfg.V);
    return out;
}

/* The largest difference between logits from transformers (a file of
 * T_IDS x V floats) and Strait's on the same ids. */
static double max_diff(Model *m, const int *ids, const char *logits_path) {
    char *theirs, err[ERR_LEN];
    size_t len;
    cr_assert_eq(file_read_all(logits_path, 1 << 28, &theirs, &len, err), 0, "%s", err);
    cr_assert_eq(len, sizeof(float) * T_IDS * (size_t)m->cfg.V);
    float *ours = strait_logits(m, ids, T_IDS);
    double worst = 0;
    for (size_t i = 0; i < (size_t)T_IDS * m->cfg.V; i++) {
        float t;
        memcpy(&t, theirs + 4 * i, 4);
        double d = fabs((double)t - ours[i]);
        worst = d > worst ? d : worst;
    }
    free(ours), free(theirs);
    return worst;
}

static void some_ids(int *ids, int V) {
    uint64_t s = 17;
    for (int i = 0; i < T_IDS; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int)((s >> 33) % (uint64_t)V);
    }
}

static int run_python(char *const *argv) {
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "transformers: %s %s", r.out, r.err);
    proc_result_free(&r);
    return 0;
}

static void script(char *out, size_t n) {
    snprintf(out, n, "%s/tests/python/transformers_logits.py", getenv("STRAIT_SRC"));
}

/* transformers' logits of the folder `out` on ids, against m's */
static double transformers_vs(Model *m, const char *dir, const char *out, const char *tag) {
    const char *py = getenv("STRAIT_HF_PYTHON");
    char ids_path[800], logits_path[800], s[800], err[ERR_LEN];
    int ids[T_IDS];
    some_ids(ids, m->cfg.V);
    snprintf(ids_path, sizeof ids_path, "%s/%s.ids", dir, tag);
    snprintf(logits_path, sizeof logits_path, "%s/%s.logits", dir, tag);
    cr_assert_eq(file_write_atomic(ids_path, ids, sizeof ids, 0644, err), 0, "%s", err);
    script(s, sizeof s);
    char *argv[] = {(char *)py, s, "logits", (char *)out, ids_path, logits_path, NULL};
    run_python(argv);
    return max_diff(m, ids, logits_path);
}

/* The largest difference between transformers' logits of m's export
 * (f32, one file) and Strait's own. */
static double max_diff_against_transformers(Model *m, const char *dir, const char *tag) {
    char out[800], err[ERR_LEN];
    snprintf(out, sizeof out, "%s/%s", dir, tag);
    cr_assert_eq(model_export_hf(m, out, NULL, err), 0, "%s", err);
    return transformers_vs(m, dir, out, tag);
}

static int count_shards(const char *dir) {
    char path[900], *text, err[ERR_LEN];
    size_t len;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (file_read_all(path, 1 << 24, &text, &len, err) != 0) return 1;
    HfIndex ix;
    cr_assert_eq(hf_index_parse(text, len, &ix, err), 0, "%s", err);
    int n = ix.n_files;
    hf_index_free(&ix);
    free(text);
    return n;
}

Test(transformers, loads_the_export_with_the_same_logits_before_and_after_training,
     .timeout = 600) {
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    char *dir = harness_tmpdir("transformers"), err[ERR_LEN];
    ModelConfig cfg;
    cr_assert_eq(model_config_shape(&cfg, "custom", 2, 64, 2, 64, 2257, err), 0, "%s", err);
    Model m;
    cr_assert_eq(model_build(&m, &cfg, 3, err), 0, "%s", err);
    double before = max_diff_against_transformers(&m, dir, "init");
    cr_assert_lt(before, 1e-4, "untrained: logits differ by %g", before);
    /* a few AdamW steps move every tensor off its init (biases and norms too) */
    TrainConfig c = train_defaults(1e-2f, 5);
    Trainer *t = trainer_create(&m, &c, 0, 4, 32, err);
    cr_assert_not_null(t, "%s", err);
    int in[128], tg[128];
    for (int i = 0; i < 128; i++) in[i] = (i * 37) % cfg.V, tg[i] = (i * 11 + 3) % cfg.V;
    for (int s = 0; s < 5; s++) trainer_step(t, in, tg, train_lr(&c, s), NULL);
    trainer_free(t);
    double after = max_diff_against_transformers(&m, dir, "trained");
    cr_assert_lt(after, 1e-4, "trained: logits differ by %g", after);
    fprintf(stderr,
            "transformers vs Strait, largest logit difference: %.2e untrained, %.2e trained\n",
            before, after);
    /* and the importer reads transformers' layout back to the same model */
    char path[800];
    snprintf(path, sizeof path, "%s/trained", dir);
    Model back;
    cr_assert_eq(model_import_hf(&back, path, err), 0, "%s", err);
    cr_assert_eq(memcmp(back.params, m.params, m.n_params * 4), 0);
    model_free(&back);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

static void saved_by_transformers(const char *make, int vocab) {
    const char *py = getenv("STRAIT_HF_PYTHON");
    char *dir = harness_tmpdir("transformers"), err[ERR_LEN];
    char saved[700], ids_path[700], logits_path[700], s[700];
    snprintf(saved, sizeof saved, "%s/saved", dir);
    snprintf(ids_path, sizeof ids_path, "%s/ids", dir);
    snprintf(logits_path, sizeof logits_path, "%s/logits", dir);
    script(s, sizeof s);
    int ids[T_IDS];
    some_ids(ids, vocab);
    cr_assert_eq(file_write_atomic(ids_path, ids, sizeof ids, 0644, err), 0, "%s", err);
    /* a random model made and saved by transformers 5 (its own layout and config) */
    char v[16];
    snprintf(v, sizeof v, "%d", vocab);
    char *argv[] = {(char *)py, s, (char *)make, saved, v, ids_path, logits_path, NULL};
    run_python(argv);
    Model m;
    cr_assert_eq(model_import_hf(&m, saved, err), 0, "%s", err);
    cr_assert_eq(m.cfg.V, vocab);
    double d = max_diff(&m, ids, logits_path);
    cr_assert_lt(d, 1e-4, "logits differ by %g", d);
    fprintf(stderr,
            "transformers 5's own %s save (%s) read by Strait, largest logit difference: "
            "%.2e\n",
            model_arch_name(m.cfg.arch), make, d);
    if (m.cfg.arch == ARCH_GPT2) goto done;
    /* Strait trains it a few steps and exports; transformers loads that */
    TrainConfig c = train_defaults(1e-2f, 5);
    Trainer *t = trainer_create(&m, &c, 0, 2, 16, err);
    cr_assert_not_null(t, "%s", err);
    int in[32], tg[32];
    for (int i = 0; i < 32; i++) in[i] = (i * 37) % vocab, tg[i] = (i * 11 + 3) % vocab;
    for (int k = 0; k < 5; k++) trainer_step(t, in, tg, train_lr(&c, k), NULL);
    trainer_free(t);
    double after = max_diff_against_transformers(&m, dir, "trained");
    cr_assert_lt(after, 1e-4, "trained: logits differ by %g", after);
    /* bf16 in shards of at most 40 kB, with the source's tokenizer if it has one */
    char tokjson[800], f32[800], bf16[800];
    snprintf(tokjson, sizeof tokjson, "%s/tokenizer.json", saved);
    int has_tokenizer = access(tokjson, F_OK) == 0;
    HfExport o = HF_EXPORT_DEFAULTS;
    o.dtype = HF_BF16, o.max_shard = 40000, o.tokenizer_dir = has_tokenizer ? saved : NULL;
    snprintf(f32, sizeof f32, "%s/trained", dir);
    snprintf(bf16, sizeof bf16, "%s/bf16", dir);
    cr_assert_eq(model_export_hf(&m, bf16, &o, err), 0, "%s", err);
    int shards = count_shards(bf16);
    cr_assert_gt(shards, 2, "%d shards", shards);
    char *check[] = {(char *)py, s, "rounded", f32, bf16, "bf16", NULL};
    run_python(check);
    Model rounded; /* Strait's model rounded to bf16: what the files hold, widened */
    cr_assert_eq(model_import_hf(&rounded, bf16, err), 0, "%s", err);
    double b = transformers_vs(&rounded, dir, bf16, "bf16");
    cr_assert_lt(b, 1e-4, "bf16: logits differ by %g", b);
    model_free(&rounded);
    if (has_tokenizer) {
        char *tok[] = {(char *)py, s, "tokenizer", bf16, saved, NULL};
        run_python(tok);
    }
    fprintf(stderr,
            "... trained by Strait and exported: f32 %.2e; bf16 in %d shards %.2e (against "
            "Strait's model rounded to bf16)%s\n",
            after, shards, b, has_tokenizer ? "; AutoTokenizer loads it" : "");
done:
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

Test(transformers, a_gpt2_transformers_5_saves_loads_with_the_same_logits, .timeout = 600) {
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    saved_by_transformers("make-gpt2", 2257);
}

/* SmolLM2's form (rope_parameters theta 100000, tied), with a tokenizer */
Test(transformers, a_llama_transformers_5_saves_loads_trains_and_goes_back, .timeout = 600) {
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    saved_by_transformers("make-llama", 300);
}

/* Llama 3's rope (rope_parameters of type llama3), grouped-query attention, untied */
Test(transformers, a_llama3_transformers_5_saves_loads_trains_and_goes_back, .timeout = 600) {
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    saved_by_transformers("make-llama3", 300);
}

/* biases on q, k and v; layer_types, all full_attention */
Test(transformers, a_qwen2_transformers_5_saves_loads_trains_and_goes_back, .timeout = 600) {
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    saved_by_transformers("make-qwen2", 300);
}

/* transformers loads what `strait export --format gguf` writes, through
 * from_pretrained(gguf_file=): a Llama of SmolLM2's vocabulary (grouped-
 * query attention, tied) trained a few steps by Strait, exported in f32
 * with the tokenizer of the real SmolLM2 GGUF; its logits equal Strait's
 * to 1e-4 and transformers' tokenizer loads from the same file. */
Test(transformers, loads_a_gguf_strait_exports_with_the_same_logits, .timeout = 600) {
    const char *py = getenv("STRAIT_HF_PYTHON"), *smol = getenv("STRAIT_SMOLLM2");
    if (py == NULL) cr_skip_test("make test-hf runs this one");
    if (smol == NULL || access(smol, R_OK) != 0) cr_skip_test("no SmolLM2 GGUF (make models)");
    char *dir = harness_tmpdir("transformers"), err[ERR_LEN];
    ModelConfig cfg;
    cr_assert_eq(model_config_preset("llama-tiny", &cfg), 0);
    cfg.V = 49152, cfg.tied = 1, cfg.rope.theta = 100000.0f;
    cr_assert_eq(model_config_check(&cfg, err), 0, "%s", err);
    Model m;
    cr_assert_eq(model_build(&m, &cfg, 5, err), 0, "%s", err);
    TrainConfig c = train_defaults(1e-2f, 3);
    Trainer *t = trainer_create(&m, &c, 0, 2, 16, err);
    cr_assert_not_null(t, "%s", err);
    int in[32], tg[32];
    for (int i = 0; i < 32; i++) in[i] = (i * 3701) % cfg.V, tg[i] = (i * 1103 + 7) % cfg.V;
    for (int s = 0; s < 3; s++) trainer_step(t, in, tg, train_lr(&c, s), NULL);
    trainer_free(t);
    char ckpt[800], out[800], ids_path[800], logits_path[800], s[800];
    snprintf(ckpt, sizeof ckpt, "%s/m.safetensors", dir);
    snprintf(out, sizeof out, "%s/m.gguf", dir);
    cr_assert_eq(model_save(&m, ckpt, 3, err), 0, "%s", err);
    ProcResult r = harness_strait("export", ckpt, "--format", "gguf", "--tokenizer", smol, out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    int ids[T_IDS];
    some_ids(ids, cfg.V);
    float *ours = strait_logits(&m, ids, T_IDS);
    snprintf(ids_path, sizeof ids_path, "%s/gguf.ids", dir);
    snprintf(logits_path, sizeof logits_path, "%s/gguf.logits", dir);
    cr_assert_eq(file_write_atomic(ids_path, ids, sizeof ids, 0644, err), 0, "%s", err);
    cr_assert_eq(
        file_write_atomic(logits_path, ours, sizeof(float) * T_IDS * (size_t)cfg.V, 0644, err), 0,
        "%s", err);
    free(ours);
    snprintf(s, sizeof s, "%s/tests/python/gguf_transformers.py", getenv("STRAIT_SRC"));
    char *argv[] = {(char *)py, s, out, ids_path, logits_path, NULL};
    r = proc_run(argv);
    cr_assert_eq(r.status, 0, "transformers: %s %s", r.out, r.err);
    const char *d = strstr(r.out, "max_diff ");
    cr_assert_not_null(d, "%s", r.out);
    double diff = atof(d + 9);
    cr_assert_lt(diff, 1e-4, "transformers' logits of the GGUF differ from Strait's by %g", diff);
    cr_assert_not_null(strstr(r.out, "tokenizer ["), "transformers' tokenizer: %s", r.out);
    fprintf(stderr, "transformers vs Strait on a GGUF export: largest logit difference %.2e\n",
            diff);
    proc_result_free(&r);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}
