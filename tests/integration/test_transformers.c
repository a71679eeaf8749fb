/*
 * test_transformers.c — Strait's Hugging Face export read by transformers
 * itself (`make test-hf`: build/venv-hf holds transformers, Flax and JAX's
 * CPU backend from PyPI; skipped by `make test`, whose CI-sized check of
 * the same layout is test_interop.c's independent numpy forward pass).
 * A 2-layer, width-64 GPT-2 with a BPE-sized vocabulary: transformers'
 * logits on the same tokens agree with Strait's to 1e-4, before and after
 * Strait trains it, and after a round trip through the importer; and a
 * random GPT-2 made and saved by transformers itself, read by Strait, gives
 * transformers' logits; and a random Llama (grouped-query attention,
 * untied) the same, then trained by Strait and exported, read back by
 * transformers to Strait's logits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "kernels/formats.h"
#include "kernels/model.h"
#include "kernels/train.h"
#include "tests/harness.h"
#include "util/util.h"

#define T_IDS 48

/* Strait's logits at every position: the next-token logits of each prefix. */
static float *strait_logits(GPT *m, const int *ids, int n) {
    float *out = malloc(sizeof(float) * (size_t)n * m->cfg.V);
    for (int t = 1; t <= n; t++) gpt_next_logits(m, ids, t, out + (size_t)(t - 1) * m->cfg.V);
    return out;
}

/* The largest difference between logits from transformers (a file of
 * T_IDS x V floats) and Strait's on the same ids. */
static double max_diff(GPT *m, const int *ids, const char *logits_path) {
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

/* The largest difference between transformers' logits of m's export and
 * Strait's own. */
static double max_diff_against_transformers(GPT *m, const char *dir, const char *tag) {
    const char *py = getenv("STRAIT_HF_PYTHON"), *src = getenv("STRAIT_SRC");
    char out[800], ids_path[800], logits_path[800], script[800], err[ERR_LEN];
    snprintf(out, sizeof out, "%s/%s", dir, tag);
    cr_assert_eq(gpt_export_hf(m, out, NULL, err), 0, "%s", err);
    int ids[T_IDS];
    some_ids(ids, m->cfg.V);
    snprintf(ids_path, sizeof ids_path, "%s/%s.ids", dir, tag);
    snprintf(logits_path, sizeof logits_path, "%s/%s.logits", dir, tag);
    cr_assert_eq(file_write_atomic(ids_path, ids, sizeof ids, 0644, err), 0, "%s", err);
    snprintf(script, sizeof script, "%s/tests/python/transformers_logits.py", src);
    char *argv[] = {(char *)py, script, "logits", out, ids_path, logits_path, NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "transformers: %s %s", r.out, r.err);
    proc_result_free(&r);
    return max_diff(m, ids, logits_path);
}

Test(transformers, loads_the_export_with_the_same_logits_before_and_after_training,
     .timeout = 600) {
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    char *dir = harness_tmpdir("transformers"), err[ERR_LEN];
    GPTConfig cfg;
    cr_assert_eq(gpt_config_shape(&cfg, "custom", 2, 64, 2, 64, 2257, err), 0, "%s", err);
    GPT m;
    cr_assert_eq(gpt_build(&m, &cfg, 3, err), 0, "%s", err);
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
    GPT back;
    cr_assert_eq(gpt_import_hf(&back, path, err), 0, "%s", err);
    cr_assert_eq(memcmp(back.params, m.params, m.n_params * 4), 0);
    gpt_free(&back);
    gpt_free(&m);
    harness_rmtree(dir);
    free(dir);
}

static void saved_by_transformers(const char *make, int vocab) {
    const char *py = getenv("STRAIT_HF_PYTHON"), *src = getenv("STRAIT_SRC");
    char *dir = harness_tmpdir("transformers"), err[ERR_LEN];
    char saved[700], ids_path[700], logits_path[700], script[700];
    snprintf(saved, sizeof saved, "%s/saved", dir);
    snprintf(ids_path, sizeof ids_path, "%s/ids", dir);
    snprintf(logits_path, sizeof logits_path, "%s/logits", dir);
    snprintf(script, sizeof script, "%s/tests/python/transformers_logits.py", src);
    int ids[T_IDS];
    some_ids(ids, vocab);
    cr_assert_eq(file_write_atomic(ids_path, ids, sizeof ids, 0644, err), 0, "%s", err);
    /* a random model made and saved by transformers (its own safetensors layout) */
    char v[16];
    snprintf(v, sizeof v, "%d", vocab);
    char *argv[] = {(char *)py, script, (char *)make, saved, v, ids_path, logits_path, NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "transformers: %s %s", r.out, r.err);
    proc_result_free(&r);
    GPT m;
    cr_assert_eq(gpt_import_hf(&m, saved, err), 0, "%s", err);
    cr_assert_eq(m.cfg.V, vocab);
    double d = max_diff(&m, ids, logits_path);
    cr_assert_lt(d, 1e-4, "logits differ by %g", d);
    fprintf(stderr, "transformers' own %s save read by Strait, largest logit difference: %.2e\n",
            model_arch_name(m.cfg.arch), d);
    /* Strait trains it a few steps and exports; transformers loads that */
    if (m.cfg.arch != ARCH_GPT2) {
        TrainConfig c = train_defaults(1e-2f, 5);
        Trainer *t = trainer_create(&m, &c, 0, 2, 16, err);
        cr_assert_not_null(t, "%s", err);
        int in[32], tg[32];
        for (int i = 0; i < 32; i++) in[i] = (i * 37) % vocab, tg[i] = (i * 11 + 3) % vocab;
        for (int s = 0; s < 5; s++) trainer_step(t, in, tg, train_lr(&c, s), NULL);
        trainer_free(t);
        double after = max_diff_against_transformers(&m, dir, "trained");
        cr_assert_lt(after, 1e-4, "trained: logits differ by %g", after);
        fprintf(stderr, "... trained by Strait and exported: %.2e\n", after);
    }
    gpt_free(&m);
    harness_rmtree(dir);
    free(dir);
}

Test(transformers, a_model_transformers_saves_loads_with_the_same_logits, .timeout = 600) {
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    saved_by_transformers("make", 2257);
}

/* grouped-query attention, an untied lm_head, a vocabulary that pads */
Test(transformers, a_llama_transformers_saves_loads_trains_and_goes_back, .timeout = 600) {
    if (getenv("STRAIT_HF_PYTHON") == NULL) cr_skip_test("make test-hf runs this one");
    saved_by_transformers("make-llama", 300);
}
