/*
 * test_federation.c — the main job with real processes: `strait demo` runs a
 * coordinator and three sites over mutual TLS (tiny model, three rounds,
 * the diloco recipe: int8 both ways), and the store it leaves is checked:
 * every round committed by all three sites, validation loss lower after the
 * last round than after the first, bytes recorded per update both ways,
 * every site's model bit-identical to the coordinator's, every checkpoint
 * verified. Then --baseline, --non-iid with four sites, and a demo that
 * must stop instead of hanging.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "coordinator/store.h"
#include "kernels/model.h"
#include "kernels/formats.h"
#include "kernels/train.h"
#include "privacy/privacy.h"
#include "security/security.h"
#include "tests/harness.h"
#include "util/util.h"

/* What the demo scores a checkpoint under root by: the mean loss of 16
 * batches of 8 x 64 from the start of the held-out collections. */
static double held_out_of(const char *root, const char *rel) {
    const char *paths[2] = {"/usr/share/games/fortunes/platitudes",
                            "/usr/share/games/fortunes/miscellaneous"};
    char path[900], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    double loss = NAN;
    cr_assert_eq(model_eval_checkpoint(path, paths, 2, 8, 64, 16, &loss, err), 0, "%s", err);
    return loss;
}

static Model load_checkpoint(const char *root, const char *rel) {
    char path[900], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    ModelConfig cfg;
    Model m;
    cr_assert_eq(model_read_config(path, &cfg, NULL, err), 0, "%s", err);
    cr_assert_eq(model_build(&m, &cfg, 0, err), 0, "%s", err);
    cr_assert_eq(model_load(&m, path, NULL, err), 0, "%s", err);
    return m;
}

/* The sites' logged model hashes for rounds 1 .. rounds-1 are those of the
 * coordinator's checkpoints of the round before. */
static void assert_models_identical(const char *root, int sites, int rounds) {
    char err[ERR_LEN];
    for (int site = 1; site <= sites; site++) {
        char log[800], *text;
        snprintf(log, sizeof log, "%s/site-%d.log", root, site);
        cr_assert_eq(file_read_all(log, 1 << 24, &text, NULL, err), 0, "%s", err);
        for (int n = 1; n < rounds; n++) {
            char rel[64], want[112], hex[65];
            snprintf(rel, sizeof rel, "fed/checkpoints/round-%06d.safetensors", n - 1);
            Model m = load_checkpoint(root, rel);
            uint8_t sha[32];
            security_sha256(m.params, m.n_params * 4, sha);
            security_hex(sha, 32, hex);
            model_free(&m);
            snprintf(want, sizeof want, "round %d: model sha256 %s", n, hex);
            cr_assert_not_null(strstr(text, want),
                               "site-%d's model of round %d is not the coordinator's (%s)", site, n,
                               hex);
        }
        free(text);
    }
}

Test(federation, three_sites_three_rounds_int8, .timeout = 300) {
    setenv("STRAIT_LOG", "info", 1); /* the sites log their model's SHA-256 at info */
    char *root = harness_tmpdir("fed");
    ProcResult r = harness_strait("demo", "--sites", "3", "--rounds", "3", "--model", "tiny",
                                  "--steps", "30", "--dir", root);
    cr_assert_eq(r.status, 0, "demo failed: %s %s", r.out, r.err);
    cr_assert_not_null(strstr(r.out, "a sample from the final model"), "%s", r.out);
    /* the global model's own score: the last checkpoint on the held-out
     * collections, better than an untrained model's ln 256 (the bounds
     * against a centralized run are test_learning.c's) */
    const char *held = strstr(r.out, "the final global model on held-out text");
    cr_assert_not_null(held, "%s", r.out);
    double score = NAN;
    cr_assert_eq(sscanf(strchr(held, ':') + 1, "%lf", &score), 1, "%s", held);
    cr_assert_lt(score, logf(256.0f) - 0.5, "the global model did not learn: %g", score);
    proc_result_free(&r);
    char db[800], fed[700], err[ERR_LEN];
    cr_assert_float_eq(score, held_out_of(root, "fed/checkpoints/round-000002.safetensors"), 1e-4);
    snprintf(fed, sizeof fed, "%s/fed", root);
    snprintf(db, sizeof db, "%s/%s", fed, STORE_DB_FILE);
    Store *s = store_open(db, STORE_READONLY, err);
    cr_assert_not_null(s, "%s", err);
    double first = NAN, last = NAN;
    for (int n = 0; n < 3; n++) {
        StoreRound rd;
        cr_assert_eq(store_round_get(s, n, &rd, err), 0, "round %d missing", n);
        cr_assert_str_eq(rd.state, "committed");
        cr_assert_eq(rd.participants, 3, "round %d had %lld sites", n, (long long)rd.participants);
        cr_assert_gt(rd.bytes_up, 0);
        cr_assert(isfinite(rd.eval_loss));
        if (n == 0) first = rd.eval_loss;
        /* round 0's model is the seeded one, which each site builds itself;
         * after it, the sites hold the previous model and get the int8 outer
         * update: about what they send up, a quarter of the whole model */
        if (n == 0)
            cr_assert_eq(rd.bytes_down, 0, "round 0 sent %lld bytes down",
                         (long long)rd.bytes_down);
        else
            cr_assert(rd.bytes_down > 0 && rd.bytes_down < 2 * rd.bytes_up,
                      "round %d sent %lld bytes down, %lld up", n, (long long)rd.bytes_down,
                      (long long)rd.bytes_up);
        last = rd.eval_loss;
        StoreUpdate *ups;
        size_t nu;
        cr_assert_eq(store_updates_list(s, rd.id, &ups, &nu, err), 0);
        cr_assert_eq(nu, 3);
        for (size_t i = 0; i < nu; i++) {
            cr_assert_str_eq(ups[i].state, "accepted");
            cr_assert_str_eq(ups[i].codec, "int8");
            cr_assert_gt(ups[i].wire_bytes, 0);
            /* int8 sends about a quarter of the fp32 bytes */
            cr_assert_lt(ups[i].wire_bytes * 3, ups[i].raw_bytes, "update not compressed");
            cr_assert_gt(ups[i].tokens, 0);
        }
        free(ups);
    }
    cr_assert_lt(last, first, "validation loss did not fall: %g after round 0, %g after round 2",
                 first, last);
    /* one model everywhere: the SHA-256 each site logs for round R's model
     * is that of the parameters in the coordinator's checkpoint of R - 1 */
    assert_models_identical(root, 3, 3);
    StoreCheck chk;
    cr_assert_eq(store_check(s, fed, &chk, NULL, NULL, err), 0, "%s", err);
    cr_assert(chk.integrity_ok);
    cr_assert_eq(chk.checkpoints_ok, 3);
    cr_assert_eq(chk.checkpoints_bad, 0);
    store_close(s);
    harness_rmtree(root);
    free(root);
}

/* The Llama family federates as GPT-2 does: its configuration goes to the
 * sites in Hello, every round commits with every site, one model
 * everywhere, and held-out loss falls. */
Test(federation, a_tiny_llama_federation_commits_with_one_model_everywhere, .timeout = 300) {
    setenv("STRAIT_LOG", "info", 1);
    char *root = harness_tmpdir("fedllama");
    ProcResult r = harness_strait("demo", "--sites", "3", "--rounds", "3", "--model", "llama-tiny",
                                  "--steps", "30", "--dir", root);
    cr_assert_eq(r.status, 0, "demo failed: %s %s", r.out, r.err);
    proc_result_free(&r);
    Model m = load_checkpoint(root, "fed/checkpoints/round-000002.safetensors");
    cr_assert_eq(m.cfg.arch, ARCH_LLAMA, "the federation's model is a %s",
                 model_arch_name(m.cfg.arch));
    cr_assert_eq(m.cfg.NKV, 2);
    model_free(&m);
    double first = held_out_of(root, "fed/checkpoints/round-000000.safetensors");
    double last = held_out_of(root, "fed/checkpoints/round-000002.safetensors");
    cr_assert_lt(last, first - 0.1, "held-out loss %g after round 0, %g after round 2", first,
                 last);
    char db[800], err[ERR_LEN];
    snprintf(db, sizeof db, "%s/fed/%s", root, STORE_DB_FILE);
    Store *s = store_open(db, STORE_READONLY, err);
    cr_assert_not_null(s, "%s", err);
    for (int n = 0; n < 3; n++) {
        StoreRound rd;
        cr_assert_eq(store_round_get(s, n, &rd, err), 0, "round %d missing", n);
        cr_assert_str_eq(rd.state, "committed");
        cr_assert_eq(rd.participants, 3, "round %d had %lld sites", n, (long long)rd.participants);
    }
    store_close(s);
    assert_models_identical(root, 3, 3);
    harness_rmtree(root);
    free(root);
}

/* fedavg: fp32 up, the exact model delta down (a checkpoint blob), the
 * plain mean; the models stay identical without any error feedback. */
/* Adapters federate as the whole model does: the round's model is the
 * adapters alone (over the base the seed draws, which every site draws
 * again and checks, so it stays bit-identical), one model everywhere,
 * held-out loss falls, and an update is the size of what the rule
 * trains. */
static void lora_federation(const char *rule, int want_rule, size_t values, double drop,
                            const char *dropout) {
    setenv("STRAIT_LOG", "info", 1);
    char *root = harness_tmpdir("fedlora");
    ProcResult r = harness_strait("demo", "--sites", "2", "--rounds", "3", "--model", "llama-tiny",
                                  "--steps", "30", "--lora-rank", "4", "--lora-targets", "all",
                                  "--lora-rule", rule, "--lora-dropout", dropout, "--dir", root);
    cr_assert_eq(r.status, 0, "demo failed: %s %s", r.out, r.err);
    proc_result_free(&r);
    Model m = load_checkpoint(root, "fed/checkpoints/round-000002.safetensors");
    cr_assert_eq(m.cfg.lora.rank, 4);
    cr_assert_eq(m.cfg.lora.dropout, strtof(dropout, NULL), "the sites' dropout is the ini's");
    cr_assert(m.cfg.lora.rule == want_rule && m.lora_frozen != NULL, "%s: A is frozen", rule);
    cr_assert_eq(m.n_params, values, "the round's model holds %zu values", m.n_params);
    cr_assert_eq(m.cfg.lora.base_seed, 1, "the base is the one [model] seed draws");
    cr_assert_eq(model_base_fingerprint(&m), m.cfg.lora.base);
    model_free(&m);
    double first = held_out_of(root, "fed/checkpoints/round-000000.safetensors");
    double last = held_out_of(root, "fed/checkpoints/round-000002.safetensors");
    cr_assert_lt(last, first - drop, "%s: held-out loss %g after round 0, %g after round 2", rule,
                 first, last);
    assert_models_identical(root, 2, 3);
    char db[800], err[ERR_LEN];
    snprintf(db, sizeof db, "%s/fed/%s", root, STORE_DB_FILE);
    Store *s = store_open(db, STORE_READONLY, err);
    cr_assert_not_null(s, "%s", err);
    for (int n = 0; n < 3; n++) {
        StoreRound rd;
        cr_assert_eq(store_round_get(s, n, &rd, err), 0, "%s", err);
        cr_assert_str_eq(rd.state, "committed");
        StoreUpdate *ups;
        size_t nu;
        cr_assert_eq(store_updates_list(s, rd.id, &ups, &nu, err), 0, "%s", err);
        cr_assert_eq(nu, 2);
        for (size_t i = 0; i < nu; i++)
            cr_assert_eq(ups[i].raw_bytes, (int64_t)(4 * values), "%s: round %d's update is %lld",
                         rule, n, (long long)ups[i].raw_bytes);
        free(ups);
    }
    store_close(s);
    harness_rmtree(root);
    free(root);
}

/* B alone (FFA-LoRA, a federation's default: A frozen at the seed's
 * draw): rank 4 on all seven projections of two layers of 64 channels,
 * their outputs q 64, k 32, v 32, o 64, gate 176, up 176, down 64; the
 * sites train with dropout on the adapters' input, and still every site's
 * model is the coordinator's, bit for bit */
Test(federation, a_lora_federation_moves_only_the_adapters, .timeout = 300) {
    lora_federation("ffa", LORA_RULE_FFA, 2 * 4 * (64 + 32 + 32 + 64 + 176 + 176 + 64), 0.01,
                    "0.1");
}

/* Fed-SB: R alone, 4 x 4 for each of the fourteen adapted projections,
 * whatever their sides */
Test(federation, a_fedsb_federation_moves_only_the_r_between_frozen_factors, .timeout = 300) {
    lora_federation("fedsb", LORA_RULE_FEDSB, 2 * 7 * 4 * 4, 0.01, "0");
}

/* The adapters' flags reach the federation: --lora-rule says which rule
 * federation.ini holds, a wrong one is refused by name */
Test(federation, the_lora_flags_reach_federation_ini) {
    char *root = harness_tmpdir("lorarule");
    const char *rules[] = {"fedit", "ffa", "fedsb"};
    for (int i = 0; i < 3; i++) {
        char fed[700], ini[800], err[ERR_LEN];
        snprintf(fed, sizeof fed, "%s/fed-%s", root, rules[i]);
        /* the base in bf16 unless f32 is said (fedit's here); no dropout
         * unless said (fedsb's) */
        const char *dtype = i == 0 ? "f32" : "bf16", *dropout = i == 2 ? "0.05" : "0";
        ProcResult r =
            i == 0   ? harness_strait("init", fed, "--model", "llama-tiny", "--lora-rank", "4",
                                      "--lora-alpha", "8", "--lora-targets", "q,o,down",
                                      "--lora-rule", rules[i], "--lora-base-dtype", "f32")
            : i == 1 ? harness_strait("init", fed, "--model", "llama-tiny", "--lora-rank", "4",
                                      "--lora-alpha", "8", "--lora-targets", "q,o,down",
                                      "--lora-rule", rules[i])
                     : harness_strait("init", fed, "--model", "llama-tiny", "--lora-rank", "4",
                                      "--lora-alpha", "8", "--lora-targets", "q,o,down",
                                      "--lora-rule", rules[i], "--lora-dropout", dropout);
        cr_assert_eq(r.status, 0, "%s", r.err);
        proc_result_free(&r);
        snprintf(ini, sizeof ini, "%s/federation.ini", fed);
        Config *c = config_load(ini, err);
        cr_assert_not_null(c, "%s", err);
        cr_assert_str_eq(config_get_str(c, "model", "adapter", ""), "lora");
        cr_assert_str_eq(config_get_str(c, "model", "rank", ""), "4");
        cr_assert_str_eq(config_get_str(c, "model", "alpha", ""), "8");
        cr_assert_str_eq(config_get_str(c, "model", "targets", ""), "q,o,down");
        cr_assert_str_eq(config_get_str(c, "model", "rule", ""), rules[i]);
        cr_assert_str_eq(config_get_str(c, "model", "base_dtype", ""), dtype);
        cr_assert_str_eq(config_get_str(c, "model", "dropout", ""), dropout);
        config_free(c);
    }
    const char *bad_dropout[][2] = {{"1", "--lora-dropout is 0"},
                                    {"-0.1", "--lora-dropout is 0"},
                                    {"nan", "--lora-dropout is 0"},
                                    {"x", "--lora-dropout"}};
    for (int i = 0; i < 4; i++) {
        ProcResult b = harness_strait("init", root, "--model", "llama-tiny", "--lora-rank", "4",
                                      "--lora-dropout", bad_dropout[i][0], "--force");
        cr_assert_eq(b.status, 2, "--lora-dropout %s was taken", bad_dropout[i][0]);
        cr_assert(strstr(b.err, bad_dropout[i][1]), "%s", b.err);
        proc_result_free(&b);
    }
    ProcResult nr =
        harness_strait("init", root, "--model", "llama-tiny", "--lora-dropout", "0.1", "--force");
    cr_assert_eq(nr.status, 2, "a dropout without adapters was taken");
    cr_assert(strstr(nr.err, "need --lora-rank"), "%s", nr.err);
    proc_result_free(&nr);
    ProcResult r = harness_strait("init", root, "--model", "llama-tiny", "--lora-rank", "4",
                                  "--lora-rule", "fedex", "--force");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--lora-rule"), "%s", r.err);
    proc_result_free(&r);
    r = harness_strait("init", root, "--model", "llama-tiny", "--lora-rank", "4",
                       "--lora-base-dtype", "fp8", "--force");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--lora-base-dtype is bf16"), "%s", r.err);
    proc_result_free(&r);
    r = harness_strait("init", root, "--model", "tiny", "--lora-rank", "4", "--force");
    cr_assert_eq(r.status, 2, "a GPT-2 took adapters: %s", r.out);
    cr_assert(strstr(r.err, "Llama family"), "%s", r.err);
    proc_result_free(&r);
    harness_rmtree(root);
    free(root);
}

Test(federation, demo_fedavg_sends_the_exact_model_down, .timeout = 300) {
    setenv("STRAIT_LOG", "info", 1);
    char *root = harness_tmpdir("fedavg");
    ProcResult r = harness_strait("demo", "--sites", "2", "--rounds", "3", "--steps", "5",
                                  "--model", "tiny", "--recipe", "fedavg", "--dir", root);
    cr_assert_eq(r.status, 0, "demo failed: %s %s", r.out, r.err);
    /* it says where its TensorBoard files and its report are, and they are */
    char page[700], tb[700], err[ERR_LEN];
    snprintf(page, sizeof page, "the run as one page: %s/report.html", root);
    snprintf(tb, sizeof tb, "tensorboard --logdir %s/fed/tb", root);
    cr_assert(strstr(r.out, page) && strstr(r.out, tb), "%s", r.out);
    size_t len;
    char *html;
    cr_assert_eq(file_read_all(page + strlen("the run as one page: "), 1 << 22, &html, &len, err),
                 0, "%s", err);
    cr_assert(strstr(html, "data-series=\"validation\"") && strstr(html, "</html>"),
              "the page has no validation curve");
    free(html);
    proc_result_free(&r);
    assert_models_identical(root, 2, 3);
    char db[800];
    snprintf(db, sizeof db, "%s/fed/%s", root, STORE_DB_FILE);
    Store *s = store_open(db, STORE_READONLY, err);
    cr_assert_not_null(s, "%s", err);
    StoreRound rd;
    cr_assert_eq(store_round_get(s, 1, &rd, err), 0, "%s", err);
    StoreUpdate *ups;
    size_t nu;
    cr_assert_eq(store_updates_list(s, rd.id, &ups, &nu, err), 0, "%s", err);
    cr_assert_eq(nu, 2);
    cr_assert_str_eq(ups[0].codec, "fp32");
    /* lossless: the byte planes' zstd shrinks sign and exponent, and the two
     * low mantissa bytes of a pseudo-gradient do not shrink */
    cr_assert(ups[0].wire_bytes < ups[0].raw_bytes && ups[0].wire_bytes * 2 > ups[0].raw_bytes,
              "fp32 (byte planes, zstd) came to %lld of %lld bytes", (long long)ups[0].wire_bytes,
              (long long)ups[0].raw_bytes);
    /* the lossless delta: smaller than the two whole models, never empty */
    cr_assert(rd.bytes_down > 0 && rd.bytes_down < 2 * ups[0].raw_bytes, "%lld bytes down",
              (long long)rd.bytes_down);
    free(ups);
    store_close(s);
    harness_rmtree(root);
    free(root);
}

/* --baseline: a centralized and a data-parallel `strait train` on the same
 * collections and tokens, every model scored on the same held-out text,
 * the figures in DIR/summary.json as printed. */
Test(federation, demo_baseline_scores_both_models_on_held_out_text, .timeout = 300) {
    char *root = harness_tmpdir("fedbase");
    ProcResult r = harness_strait("demo", "--sites", "2", "--rounds", "3", "--model", "tiny",
                                  "--steps", "20", "--baseline", "--dir", root);
    cr_assert_eq(r.status, 0, "demo failed: %s %s", r.out, r.err);
    cr_assert(strstr(r.out, "120 steps of 8 x 64"), "not the federation's token budget:\n%s",
              r.out);
    cr_assert(strstr(r.out, "60 steps of 16 x 64"), "not data-parallel at equal tokens:\n%s",
              r.out);
    double fed = NAN, central = NAN, dp = NAN;
    const char *f = strstr(r.out, "  federated      "), *c = strstr(r.out, "  centralized    "),
               *d = strstr(r.out, "  data-parallel  ");
    cr_assert(f && c && d, "%s", r.out);
    sscanf(f + 17, "%lf", &fed);
    sscanf(c + 17, "%lf", &central);
    sscanf(d + 17, "%lf", &dp);
    /* each is its final checkpoint's score on the held-out collections; the
     * baselines learned (an untrained byte model scores ln 256 = 5.55) */
    cr_assert_float_eq(fed, held_out_of(root, "fed/checkpoints/round-000002.safetensors"), 1e-4);
    cr_assert_float_eq(central, held_out_of(root, "centralized.safetensors"), 1e-4);
    cr_assert_float_eq(dp, held_out_of(root, "data-parallel.safetensors"), 1e-4);
    cr_assert(central > 0.5 && central < 5.0, "centralized held-out loss %g", central);
    cr_assert(dp > 0.5 && dp < 5.0, "data-parallel held-out loss %g", dp);
    proc_result_free(&r);
    char path[800];
    snprintf(path, sizeof path, "%s/summary.json", root);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    cr_assert_not_null(o, "%s", je.text);
    cr_assert_float_eq(json_number_value(json_object_get(o, "val_loss")), fed, 1e-4);
    cr_assert_float_eq(json_number_value(json_object_get(o, "central_val_loss")), central, 1e-4);
    cr_assert_float_eq(json_number_value(json_object_get(o, "dataparallel_val_loss")), dp, 1e-4);
    cr_assert_eq(json_array_size(json_object_get(o, "round_val_losses")), 3);
    /* the ratio the demo prints is the store's, both ways */
    double up = json_number_value(json_object_get(o, "bytes_up")),
           down = json_number_value(json_object_get(o, "bytes_down")),
           dense = json_number_value(json_object_get(o, "dense_bytes"));
    cr_assert_float_eq(json_number_value(json_object_get(o, "dense_ratio")), dense / (up + down),
                       1e-6);
    /* 2 sites x 3 rounds x 20 steps, one fp32 gradient up and one down each */
    ModelConfig cfg;
    Model m;
    char err[ERR_LEN];
    model_config_preset("tiny", &cfg);
    cr_assert_eq(model_build(&m, &cfg, 1, err), 0);
    cr_assert_float_eq(dense, 2.0 * 3 * 20 * 2 * 4.0 * (double)m.n_params, 1);
    model_free(&m);
    json_decref(o);
    harness_rmtree(root);
    free(root);
}

/* The README's --non-iid example with four sites: the Spanish collection
 * holds a subfolder (es/off), which once killed a site and hung the demo. */
Test(federation, demo_non_iid_four_sites_finishes, .timeout = 300) {
    char *root = harness_tmpdir("noniid");
    ProcResult r = harness_strait("demo", "--sites", "4", "--non-iid", "--rounds", "1", "--steps",
                                  "2", "--model", "tiny", "--dir", root);
    cr_assert_eq(r.status, 0, "demo failed: %s %s", r.out, r.err);
    cr_assert_not_null(strstr(r.out, "site-3 joined; trains on"), "%s", r.out);
    cr_assert_null(strstr(r.out, "trains on 0 collections"), "%s", r.out);
    proc_result_free(&r);
    harness_rmtree(root);
    free(root);
}

/* A round no update can close stops the demo with the refusals shown,
 * instead of waiting out its deadlines. */
Test(federation, demo_stops_when_every_update_is_refused, .timeout = 300) {
    char *root = harness_tmpdir("refused");
    ProcResult r =
        harness_strait("demo", "--sites", "2", "--rounds", "2", "--steps", "2", "--model", "tiny",
                       "--set", "rounds.max_update_ratio=0.0000001", "--dir", root);
    cr_assert_eq(r.status, 1, "%s %s", r.out, r.err);
    cr_assert_not_null(strstr(r.out, "update refused (norm_gate)"), "%s", r.out);
    cr_assert_not_null(strstr(r.err, "every site's update in round 0 was refused"), "%s", r.err);
    cr_assert_eq(harness_count_lines(r.err), 1, "%s", r.err);
    proc_result_free(&r);
    harness_rmtree(root);
    free(root);
}

/* The pid of the process whose command line holds both words, or 0. */
static int find_process(const char *a, const char *b) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        char path[64], cmd[4096];
        snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
        FILE *f = pid > 0 ? fopen(path, "r") : NULL;
        if (f == NULL) continue;
        size_t n = fread(cmd, 1, sizeof cmd - 1, f);
        fclose(f);
        for (size_t i = 0; i < n; i++)
            if (cmd[i] == '\0') cmd[i] = ' ';
        cmd[n] = '\0';
        if (strstr(cmd, a) && strstr(cmd, b)) found = pid;
    }
    if (d) closedir(d);
    return found;
}

/* A site process that dies stops the demo, which says which one. */
Test(federation, demo_stops_when_a_site_dies, .timeout = 300) {
    char *root = harness_tmpdir("dies");
    char *argv[] = {(char *)harness_strait_bin(),
                    "demo",
                    "--sites",
                    "2",
                    "--rounds",
                    "100",
                    "--steps",
                    "50",
                    "--model",
                    "tiny",
                    "--dir",
                    root,
                    NULL};
    int fd, pid = proc_spawn(argv, &fd);
    char line[512], site_dir[700];
    while (proc_read_line(fd, line, sizeof line, 60000) >= 0 && !strstr(line, "site-2 joined")) {
    }
    snprintf(site_dir, sizeof site_dir, "%s/site-2", root);
    /* the demo says so once it has started the process, which may not
     * have become `site run` yet */
    int site = 0;
    for (int i = 0; i < 100 && (site = find_process("site run", site_dir)) <= 0; i++)
        usleep(100000);
    cr_assert_gt(site, 0, "no site-2 process");
    kill(site, SIGKILL);
    /* the demo ends (it would have trained 100 rounds); it does not wait */
    int status = -1;
    for (int i = 0; i < 600 && status < 0; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        else
            usleep(100000);
    }
    if (status < 0) proc_stop(pid, 1000);
    cr_assert_eq(status, 1, "the demo went on without its site (status %d)", status);
    close(fd);
    harness_rmtree(root);
    free(root);
}

/* Secure aggregation ([privacy] secure_aggregation = on): three sites send
 * masked updates through the SecAgg phases, every round commits with all
 * three, every site holds the coordinator's model to the bit, and the
 * model is the one the same federation commits without it (fp32 updates,
 * the same seeds, the plain mean) to the quantization's error (28 bits: a
 * step of 6e-9). */
Test(federation, secure_aggregation_commits_the_plain_federations_model_to_quantization,
     .timeout = 300) {
    setenv("STRAIT_LOG", "info", 1);
    char *sa = harness_tmpdir("secagg"), *plain = harness_tmpdir("plain");
    /* the plain mean: no median at the start, no caps drawn from the others */
    const char *common[] = {"demo",
                            "--sites",
                            "3",
                            "--rounds",
                            "2",
                            "--model",
                            "tiny",
                            "--steps",
                            "10",
                            "--seed",
                            "5",
                            "--set",
                            "codec.uplink=fp32",
                            "--set",
                            "rounds.robust_start=off",
                            "--set",
                            "rounds.clip=0",
                            "--set",
                            "rounds.weight_cap=0"};
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)harness_strait_bin();
    for (size_t i = 0; i < sizeof common / sizeof *common; i++) argv[n++] = (char *)common[i];
    int base = n;
    argv[n++] = "--dir", argv[n++] = plain, argv[n] = NULL;
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "the plain demo failed: %s %s", r.out, r.err);
    proc_result_free(&r);
    n = base;
    argv[n++] = "--dir", argv[n++] = sa;
    argv[n++] = "--set", argv[n++] = "privacy.secure_aggregation=on";
    argv[n++] = "--set", argv[n++] = "privacy.range=0.25";
    argv[n++] = "--set", argv[n++] = "privacy.bits=28", argv[n] = NULL;
    r = proc_run(argv);
    cr_assert_eq(r.status, 0, "the secure demo failed: %s %s", r.out, r.err);
    proc_result_free(&r);
    char db[800], pdb[800], err[ERR_LEN];
    snprintf(db, sizeof db, "%s/fed/%s", sa, STORE_DB_FILE);
    snprintf(pdb, sizeof pdb, "%s/fed/%s", plain, STORE_DB_FILE);
    Store *s = store_open(db, STORE_READONLY, err), *ps = store_open(pdb, STORE_READONLY, err);
    cr_assert(s && ps, "%s", err);
    /* round 0: the sites trained the same model on the same data, so the
     * models differ by the aggregation alone (after it, Adam's steps turn
     * any difference in a coordinate of no gradient into a step of lr) */
    Model a = load_checkpoint(sa, "fed/checkpoints/round-000000.safetensors");
    Model b = load_checkpoint(plain, "fed/checkpoints/round-000000.safetensors");
    double diff = 0, moved = 0;
    for (size_t i = 0; i < a.n_params; i++)
        diff = fmax(diff, fabs((double)a.params[i] - b.params[i]));
    for (int k = 0; k < 2; k++) {
        StoreRound ra, rb;
        cr_assert_eq(store_round_get(s, k, &ra, err), 0, "round %d missing: %s", k, err);
        cr_assert_eq(store_round_get(ps, k, &rb, err), 0, "%s", err);
        cr_assert_str_eq(ra.state, "committed");
        cr_assert_eq(ra.participants, 3, "round %d had %lld sites", k, (long long)ra.participants);
        cr_assert_float_eq(ra.eval_loss, rb.eval_loss, 1e-3,
                           "round %d: %g with secure aggregation, %g without", k, ra.eval_loss,
                           rb.eval_loss);
        if (k == 0) moved = fabs(ra.start_eval_loss - ra.eval_loss);
        StoreUpdate *ups;
        size_t nu;
        cr_assert_eq(store_updates_list(s, ra.id, &ups, &nu, err), 0, "%s", err);
        cr_assert_eq(nu, 3);
        for (size_t i = 0; i < nu; i++) {
            cr_assert_str_eq(ups[i].state, "accepted");
            cr_assert_str_eq(ups[i].codec, "secagg");
            cr_assert_eq(ups[i].wire_bytes, 24 + ((int64_t)a.n_params * 28 + 7) / 8,
                         "a masked update is 28 bits a value and its header");
        }
        free(ups);
    }
    store_close(s), store_close(ps);
    assert_models_identical(sa, 3, 2);
    cr_assert_gt(moved, 0.05, "round 0 did not train");
    cr_assert_lt(diff, 1e-6,
                 "after round 0, with secure aggregation the model is %g from the plain "
                 "federation's",
                 diff);
    model_free(&a), model_free(&b);
    harness_rmtree(sa), harness_rmtree(plain);
    free(sa), free(plain);
}

/* Distributed DP ([privacy] dp = distributed under secure aggregation):
 * three sites, the noise shared among the quorum's two, so each round's
 * sum carries three halves of the noise owed. What the round moved the
 * model by (outer avg at lr 1: minus the mean) is, over the model's
 * values, noise of mean 0 and the deviation the round's account says —
 * √(3/2 mu) / scale / 3, mu and scale as privacy/secagg_proto.c derives
 * them for the cohort, against which the clipped updates' own share is
 * under 0.1% — so each site added its share, no more and no less (the
 * whole noise at each site would be 41% over, none 100% under). Each
 * round's row holds the noise multiplier its sum had, z √(3/2), and ε
 * after it is the accountant's for the Skellam rounds so far, as strait
 * rounds reports it; no site's loss reached the coordinator. */
Test(federation, distributed_dp_adds_the_noise_it_accounts_under_secure_aggregation,
     .timeout = 300) {
    char *dir = harness_tmpdir("ddp");
    char *argv[] = {(char *)harness_strait_bin(),
                    "demo",
                    "--dir",
                    dir,
                    "--sites",
                    "3",
                    "--rounds",
                    "2",
                    "--model",
                    "tiny",
                    "--steps",
                    "5",
                    "--seed",
                    "5",
                    "--set",
                    "optimizer.outer=avg",
                    "--set",
                    "optimizer.lr=1",
                    "--set",
                    "codec.downlink=lossless",
                    "--set",
                    "rounds.min_sites=2",
                    "--set",
                    "privacy.secure_aggregation=on",
                    "--set",
                    "privacy.range=0.25",
                    "--set",
                    "privacy.dp=distributed",
                    "--set",
                    "privacy.clip=0.5",
                    "--set",
                    "privacy.noise_multiplier=0.3",
                    "--set",
                    "privacy.delta=1e-5",
                    NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "the demo failed: %s %s", r.out, r.err);
    proc_result_free(&r);
    Model m0 = load_checkpoint(dir, "fed/checkpoints/round-000000.safetensors");
    Model m1 = load_checkpoint(dir, "fed/checkpoints/round-000001.safetensors");
    uint64_t d = m0.n_params;
    /* the cohort's parameters, as the coordinator and the sites derive them */
    char err[ERR_LEN];
    int bits = secagg_dp_bits(3, 0.25, 0.5, 0.3, 2, d, 11);
    SecaggParams p;
    cr_assert_eq(secagg_params(3, bits, 0.25, "test", &p, err), 0, "%s", err);
    cr_assert_eq(secagg_params_dp(&p, 0.5, 0.3, 2, d, err), 0, "%s", err);
    double mu = p.mu * 3 / 2, want = sqrt(mu) / p.scale / 3, s = 0, s2 = 0;
    for (uint64_t i = 0; i < d; i++) {
        double v = (double)m1.params[i] - m0.params[i];
        s += v, s2 += v * v;
    }
    double mean = s / d, sd = sqrt(s2 / d - mean * mean);
    cr_assert_lt(fabs(mean), 10 * want / sqrt((double)d), "the noise's mean is %g", mean);
    cr_assert_lt(fabs(sd / want - 1), 0.03,
                 "round 1 moved the model by %g a value, not the %g of its noise", sd, want);
    char db[800];
    snprintf(db, sizeof db, "%s/fed/%s", dir, STORE_DB_FILE);
    Store *st = store_open(db, STORE_READONLY, err);
    cr_assert_not_null(st, "%s", err);
    PrivacyAccount acc = {{0}};
    double eps = 0;
    for (int k = 0; k < 2; k++) {
        StoreRound rr;
        cr_assert_eq(store_round_get(st, k, &rr, err), 0, "%s", err);
        cr_assert_str_eq(rr.state, "committed");
        cr_assert_eq(rr.participants, 3);
        cr_assert_float_eq(rr.dp_noise, 0.3 * sqrt(1.5), 1e-9, "round %d: %g", k, rr.dp_noise);
        /* the sites' losses stayed at the sites: what the noise hides */
        cr_assert(isnan(rr.eval_loss) && isnan(rr.train_loss), "round %d: losses %g, %g", k,
                  rr.eval_loss, rr.train_loss);
        privacy_add_skellam(&acc, mu, p.l1, p.l2);
        eps = privacy_account_epsilon(&acc, 1e-5, NULL);
        cr_assert_float_eq(rr.dp_epsilon, eps, 1e-9 * eps, "round %d: epsilon %.10g, not %.10g", k,
                           rr.dp_epsilon, eps);
        StoreUpdate *ups;
        size_t nu;
        cr_assert_eq(store_updates_list(st, rr.id, &ups, &nu, err), 0, "%s", err);
        for (size_t i = 0; i < nu; i++)
            cr_assert_eq(ups[i].wire_bytes, 24 + ((int64_t)d * bits + 7) / 8,
                         "a masked update of %d bits a value", bits);
        free(ups);
    }
    store_close(st);
    char fed[800];
    snprintf(fed, sizeof fed, "%s/fed", dir);
    char *rargv[] = {(char *)harness_strait_bin(), "rounds", fed, "--json", NULL};
    r = proc_run(rargv);
    cr_assert_eq(r.status, 0, "%s", r.err);
    const char *last = strrchr(r.out, '{');
    json_t *o = last ? json_loads(last, 0, NULL) : NULL;
    cr_assert_not_null(o, "%s", r.out);
    cr_assert_float_eq(json_real_value(json_object_get(o, "dp_epsilon")), eps, 1e-5 * eps, "%s",
                       r.out);
    json_decref(o);
    proc_result_free(&r);
    model_free(&m0), model_free(&m1);
    harness_rmtree(dir);
    free(dir);
}

/* Secure aggregation on a sparse graph: ten sites, each with 8 neighbours
 * of the 9 others (2 log2 n), so each KEYS answer leaves one site's keys
 * empty; every site shares, masks and reveals from what it got, and both
 * rounds commit with all ten, each site holding the coordinator's model.
 * (That the answers leave keys out is bench/secagg's bytes down, not this
 * test's: an answer with every key would pass it too.) */
Test(federation, secure_aggregation_on_a_sparse_graph_commits_every_site, .timeout = 300) {
    setenv("STRAIT_LOG", "info", 1);
    char *dir = harness_tmpdir("sparse");
    char *argv[] = {(char *)harness_strait_bin(),
                    "demo",
                    "--dir",
                    dir,
                    "--sites",
                    "10",
                    "--rounds",
                    "2",
                    "--model",
                    "tiny",
                    "--steps",
                    "2",
                    "--seed",
                    "3",
                    "--set",
                    "privacy.secure_aggregation=on",
                    "--set",
                    "privacy.range=0.25",
                    NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "the demo failed: %s %s", r.out, r.err);
    proc_result_free(&r);
    char db[800], err[ERR_LEN], log[800], *text;
    snprintf(log, sizeof log, "%s/coordinator.log", dir);
    cr_assert_eq(file_read_all(log, 1 << 24, &text, NULL, err), 0, "%s", err);
    cr_assert_not_null(strstr(text, "a cohort of 10 sites, each with 8 neighbours"), "%s", text);
    free(text);
    snprintf(db, sizeof db, "%s/fed/%s", dir, STORE_DB_FILE);
    Store *s = store_open(db, STORE_READONLY, err);
    cr_assert_not_null(s, "%s", err);
    for (int k = 0; k < 2; k++) {
        StoreRound rr;
        cr_assert_eq(store_round_get(s, k, &rr, err), 0, "%s", err);
        cr_assert_str_eq(rr.state, "committed");
        cr_assert_eq(rr.participants, 10, "round %d: %lld sites", k, (long long)rr.participants);
    }
    store_close(s);
    assert_models_identical(dir, 10, 2);
    harness_rmtree(dir);
    free(dir);
}
