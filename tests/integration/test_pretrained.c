/*
 * test_pretrained.c — a federation that starts from a pretrained model:
 * `strait init --init-from HFDIR` checks the folder, copies the model into
 * the home and records both SHA-256s (federation.ini and the audit log);
 * the coordinator refuses to start when the copy changed; a site that joins
 * gets the pretrained shape in Hello and the model in round 0 (no download
 * when it holds the folder itself), and its round-0 start loss is the
 * pretrained model's held-out loss on its data. Then the whole path of
 * docs/models.md: tokenize, init --init-from, train, export, sample.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "coordinator/store.h"
#include "kernels/data.h"
#include "kernels/formats.h"
#include "kernels/model.h"
#include "kernels/tokenizer.h"
#include "kernels/train.h"
#include "net/net.h"
#include "security/security.h"
#include "tests/harness.h"
#include "tests/store_fixture.h"
#include "util/util.h"

#define S(...)    harness_strait(__VA_ARGS__)
#define SITE_DATA "/usr/share/games/fortunes/wisdom"

static char *root, fed[600], hf[600], addr[64];
static int coord = -1, site_pid = -1;

static void teardown(void) {
    if (root == NULL) return;
    if (site_pid > 0) proc_stop(site_pid, 5000), site_pid = -1;
    if (coord > 0) proc_stop(coord, 10000), coord = -1;
    harness_rmtree(root);
    free(root);
    root = NULL;
    net_global_shutdown();
}

TestSuite(pretrained, .fini = teardown, .timeout = 240);

/* A tiny model moved off its seeded init (no site could build it from a
 * seed), exported as a Hugging Face folder. */
static Model make_pretrained(void) {
    ModelConfig cfg;
    model_config_preset("tiny", &cfg);
    Model m;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&m, &cfg, 77, err), 0, "%s", err);
    uint64_t s = 5;
    for (size_t i = 0; i < m.n_params; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        m.params[i] += 0.03f * ((float)(s >> 40) / (float)(1 << 24) - 0.5f);
    }
    const ParamView *wte = model_view(&m, "wte");
    for (size_t i = (size_t)cfg.V * cfg.C; i < wte->numel; i++) m.params[wte->offset + i] = 0;
    cr_assert_eq(model_export_hf(&m, hf, NULL, err), 0, "%s", err);
    return m;
}

static int start_coordinator(char *line, size_t len) {
    char *argv[] = {(char *)harness_strait_bin(), "coordinator", "start", fed, NULL};
    int fd;
    coord = proc_spawn(argv, &fd);
    int n = proc_read_line(fd, line, len, 30000);
    close(fd);
    return n;
}

/* A federation of one round of 3 steps from the folder hfdir, its
 * coordinator started, and site s0 enrolled and joined in ROOT/site. */
static void federation_from(const char *hfdir) {
    ProcResult r = S("init", fed, "--listen", harness_listen(), "--init-from", hfdir);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    char path[800];
    snprintf(path, sizeof path, "%s/federation.ini", fed);
    harness_ini_set(path, "rounds", "total", "1");
    harness_ini_set(path, "rounds", "inner_steps", "3");
    harness_ini_set(path, "rounds", "deadline", "2m");
    char line[256];
    cr_assert_gt(start_coordinator(line, sizeof line), 0, "coordinator did not start");
    const char *p = strstr(line, "port ");
    cr_assert_not_null(p, "%s", line);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", atoi(p + 5));
    char sdir[700];
    snprintf(sdir, sizeof sdir, "%s/site", root);
    harness_enroll_join(fed, addr, "s0", sdir);
}

/* strait site run for s0 on data, holding init_from (may be NULL), its
 * AdamW moments kept as `moments` says ("fp32" or "bf16"). */
static void run_site_as(const char *data, const char *init_from, const char *moments) {
    char sdir[700];
    snprintf(sdir, sizeof sdir, "%s/site", root);
    char *argv[] = {(char *)harness_strait_bin(),
                    "site",
                    "run",
                    sdir,
                    "--data",
                    (char *)data,
                    "--threads",
                    "1",
                    "--moments",
                    (char *)moments,
                    init_from ? "--init-from" : NULL,
                    (char *)init_from,
                    NULL};
    int fd;
    site_pid = proc_spawn(argv, &fd);
    close(fd);
}
static void run_site(const char *data, const char *init_from) {
    run_site_as(data, init_from, "fp32");
}

/* A federation from the pretrained folder, one site on SITE_DATA (holding
 * the folder too when site_has_it), until round 0 commits; checks round 0
 * started from the pretrained model. */
static void round_zero(int site_has_it) {
    net_global_init();
    root = harness_tmpdir("pretrained");
    snprintf(fed, sizeof fed, "%s/fed", root);
    snprintf(hf, sizeof hf, "%s/hf", root);
    Model pre = make_pretrained();
    federation_from(hf);
    /* the source's SHA-256, in federation.ini and in the audit log */
    char path[800], src_sha[65], err[ERR_LEN], *ini;
    int64_t bytes;
    snprintf(path, sizeof path, "%s/model.safetensors", hf);
    cr_assert_eq(security_sha256_file(path, src_sha, &bytes, err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/federation.ini", fed);
    cr_assert_eq(file_read_all(path, 1 << 20, &ini, NULL, err), 0, "%s", err);
    char want[120];
    snprintf(want, sizeof want, "source_sha256 = %s", src_sha);
    cr_assert_not_null(strstr(ini, want), "%s", ini);
    cr_assert_not_null(strstr(ini, "init = model/initial.safetensors"), "%s", ini);
    free(ini);
    ProcResult r = S("events", fed, "--json");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "model.init"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, src_sha), "%s", r.out);
    proc_result_free(&r);
    run_site(SITE_DATA, site_has_it ? hf : NULL);
    StoreRound rd = store_fixture_wait_committed(fed, 0, 180);

    /* round 0 was the pretrained model: downloaded whole (no seed builds
     * it), unless the site holds the same folder */
    if (site_has_it)
        cr_assert_eq(rd.bytes_down, 0, "round 0 sent %lld bytes down to a site holding it",
                     (long long)rd.bytes_down);
    else
        cr_assert_gt(rd.bytes_down, (int64_t)pre.n_params * 2, "round 0 sent %lld bytes down",
                     (long long)rd.bytes_down);
    TokenSet ts;
    const char *paths[1] = {SITE_DATA};
    cr_assert_eq(tokens_load(&ts, paths, 1, err), 0, "%s", err);
    TokenView train, val;
    tokens_split(&ts, 0.1, &train, &val);
    double expect = model_eval_tokens(&pre, val, 8, 64, 4); /* the site's held-out batches */
    tokens_free(&ts);
    snprintf(path, sizeof path, "%s/%s", fed, STORE_DB_FILE);
    Store *st = store_open(path, STORE_READONLY, err);
    cr_assert_not_null(st, "%s", err);
    StoreUpdate *ups;
    size_t nu;
    cr_assert_eq(store_updates_list(st, rd.id, &ups, &nu, err), 0, "%s", err);
    cr_assert_eq(nu, 1);
    cr_assert_float_eq(ups[0].start_eval_loss, expect, 1e-5,
                       "round 0 started at %.6f; the pretrained model scores %.6f",
                       ups[0].start_eval_loss, expect);
    free(ups);
    store_close(st);
    model_free(&pre);
}

Test(pretrained, init_from_records_the_source_and_round_zero_starts_from_it) {
    round_zero(0);
}

Test(pretrained, a_site_holding_the_folder_builds_round_zero_without_a_download) {
    round_zero(1);
}

Test(pretrained, a_changed_initial_model_or_a_bad_folder_is_refused) {
    net_global_init();
    root = harness_tmpdir("pretrained");
    snprintf(fed, sizeof fed, "%s/fed", root);
    snprintf(hf, sizeof hf, "%s/hf", root);
    Model pre = make_pretrained();
    model_free(&pre);
    /* a folder with no model in it: refused before anything is written */
    char empty[700];
    snprintf(empty, sizeof empty, "%s/empty", root);
    char err[ERR_LEN];
    cr_assert_eq(file_mkdir_p(empty, 0755, err), 0);
    ProcResult r = S("init", fed, "--init-from", empty);
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "config.json"), "%s", r.err);
    cr_assert_eq(access(fed, F_OK), -1, "a refused init left %s behind", fed);
    proc_result_free(&r);
    r = S("init", fed, "--init-from", hf, "--model", "tiny");
    cr_assert_eq(r.status, 2, "%s", r.err);
    proc_result_free(&r);
    r = S("init", fed, "--listen", harness_listen(), "--init-from", hf);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    /* one flipped byte in the copy: the coordinator names it and does not start */
    char path[800];
    snprintf(path, sizeof path, "%s/model/initial.safetensors", fed);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, -3, SEEK_END);
    int ch = fgetc(f);
    fseek(f, -3, SEEK_END);
    fputc(ch ^ 0x40, f);
    fclose(f);
    r = S("coordinator", "start", fed);
    cr_assert_eq(r.status, 1, "%s", r.out);
    cr_assert_not_null(strstr(r.err, "init_sha256"), "%s", r.err);
    proc_result_free(&r);
}

/* The whole path of docs/models.md with real parts: a BPE trained by PyPI's
 * tokenizers, a GPT-2 of that vocabulary as a Hugging Face folder with its
 * vocab.json and merges.txt, the site's text tokenized by strait tokenize,
 * a federation from the folder training on the shards, the round's model
 * exported for transformers and sampled through the tokenizer. */
/* The path of docs/models.md for a GPT-2 (vocab.json and merges.txt) or a
 * Llama (tokenizer.json in Llama 3's style; grouped-query attention, an
 * untied output layer, Llama 3's rope scaling). */
static void whole_path(int llama) {
    net_global_init();
    root = harness_tmpdir("pretrained");
    snprintf(fed, sizeof fed, "%s/fed", root);
    snprintf(hf, sizeof hf, "%s/hf", root);
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with tokenizers)");
    char script[700];
    snprintf(script, sizeof script, "%s/tests/python/bpe_reference.py", src);
    const char *texts[] = {"/usr/share/games/fortunes/wisdom",
                           "/usr/share/games/fortunes/literature"};
    char *targv[] = {(char *)py, script,           "train",          hf,
                     "500",      (char *)texts[0], (char *)texts[1], NULL};
    char *jargv[] = {(char *)py, script,           "train-json",     hf,  "llama3",
                     "500",      (char *)texts[0], (char *)texts[1], NULL};
    ProcResult r = proc_run(llama ? jargv : targv);
    cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
    proc_result_free(&r);
    char err[ERR_LEN];
    Tokenizer *tok = tokenizer_load_dir(hf, err);
    cr_assert_not_null(tok, "%s", err);
    int V = tokenizer_vocab_size(tok);
    tokenizer_free(tok);
    /* the "pretrained" model of that vocabulary, in the same folder */
    ModelConfig cfg;
    if (llama) {
        cr_assert_eq(model_config_preset("llama-tiny", &cfg), 0);
        cfg.V = V, cfg.rope = (RopeConfig){500000.0f, 8.0f, 1.0f, 4.0f, 32};
        cr_assert_eq(model_config_check(&cfg, err), 0, "%s", err);
    } else {
        cr_assert_eq(model_config_shape(&cfg, "custom", 2, 64, 2, 64, V, err), 0, "%s", err);
    }
    Model m;
    cr_assert_eq(model_build(&m, &cfg, 9, err), 0, "%s", err);
    cr_assert_eq(model_export_hf(&m, hf, NULL, err), 0, "%s", err);
    model_free(&m);
    char shards[700], shard0[800];
    snprintf(shards, sizeof shards, "%s/shards", root);
    r = S("tokenize", "--tokenizer", hf, "--out", shards, texts[0], texts[1]);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    snprintf(shard0, sizeof shard0, "%s/tokens_000000.bin", shards);

    federation_from(hf);
    run_site_as(shard0, NULL, llama ? "bf16" : "fp32"); /* the Llama's site keeps bf16 moments */
    StoreRound rd = store_fixture_wait_committed(fed, 0, 180);
    cr_assert_eq(rd.participants, 1);
    cr_assert(isfinite(rd.eval_loss));
    /* the site's state after the round: its moments as it keeps them */
    char state[800], *st;
    size_t sl;
    snprintf(state, sizeof state, "%s/site/state/inner.opt.safetensors", root);
    for (int k = 0; k < 100 && access(state, F_OK) != 0; k++) usleep(50000);
    cr_assert_eq(file_read_all(state, 1 << 26, &st, &sl, err), 0, "%s", err);
    uint64_t hl;
    memcpy(&hl, st, 8);
    cr_assert_lt(hl, sl);
    const char *want = llama ? "\"dtype\":\"BF16\"" : "\"dtype\":\"F32\"";
    cr_assert_not_null(memmem(st + 8, hl, want, strlen(want)), "the site's moments file lacks %s",
                       want);
    free(st);

    char ckpt[800], out[800];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/round-000000.safetensors", fed);
    snprintf(out, sizeof out, "%s/export", root);
    r = S("export", ckpt, "--format", "hf", out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    /* the tokenizer comes from the folder the federation started from */
    cr_assert_not_null(strstr(r.out, "tokenizer files from"), "%s", r.out);
    proc_result_free(&r);
    {
        char a[1000], b[1000], *x, *y;
        size_t nx, ny;
        const char *file = llama ? "tokenizer.json" : "merges.txt";
        snprintf(a, sizeof a, "%s/%s", hf, file);
        snprintf(b, sizeof b, "%s/%s", out, file);
        cr_assert_eq(file_read_all(a, 1 << 26, &x, &nx, err), 0, "%s", err);
        cr_assert_eq(file_read_all(b, 1 << 26, &y, &ny, err), 0, "%s", err);
        cr_assert(nx == ny && memcmp(x, y, nx) == 0, "the export's %s is not the source's", file);
        free(x), free(y);
    }
    Model back;
    cr_assert_eq(model_import_hf(&back, out, err), 0, "%s", err);
    cr_assert_eq(back.cfg.V, V);
    cr_assert_eq(back.cfg.L, 2);
    cr_assert_eq(back.cfg.arch, cfg.arch);
    cr_assert_eq(back.cfg.rope.factor, cfg.rope.factor);
    model_free(&back);
    r = S("sample", ckpt, "--tokenizer", hf, "--tokens", "12", "--prompt", "The ", "--seed", "3");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strncmp(r.out, "The ", 4) == 0 && strlen(r.out) > 6, "%s", r.out);
    proc_result_free(&r);
    r = S("sample", ckpt); /* a BPE model without its tokenizer: told what to give */
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "--tokenizer"), "%s", r.err);
    proc_result_free(&r);
}

Test(pretrained, tokenize_init_from_train_export_sample, .timeout = 300) {
    whole_path(0);
}

Test(pretrained, the_same_path_for_a_llama_with_its_tokenizer_json, .timeout = 300) {
    whole_path(1);
}
