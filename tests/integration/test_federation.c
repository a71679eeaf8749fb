/*
 * test_federation.c — the main job with real processes: `strait demo` runs a
 * coordinator and three sites over mutual TLS (tiny model, three rounds,
 * int8 updates), and the store it leaves is checked: every round committed
 * by all three sites, validation loss lower after the last round than after
 * the first, bytes recorded per update, the downlink a delta after round 0,
 * every checkpoint verified.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "coordinator/store.h"
#include "kernels/kernels.h"
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
    cr_assert_eq(gpt_eval_checkpoint(path, paths, 2, 8, 64, 16, &loss, err), 0, "%s", err);
    return loss;
}

Test(federation, three_sites_three_rounds_int8, .timeout = 300) {
    char *root = harness_tmpdir("fed");
    char *argv[] = {(char *)harness_strait_bin(),
                    "demo",
                    "--sites",
                    "3",
                    "--rounds",
                    "3",
                    "--model",
                    "tiny",
                    "--steps",
                    "30",
                    "--codec",
                    "int8",
                    "--dir",
                    root,
                    NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "demo failed: %s %s", r.out, r.err);
    cr_assert_not_null(strstr(r.out, "a sample from the final model"), "%s", r.out);
    /* the global model's own score: the last checkpoint on the held-out
     * collections (a few short rounds need not beat an untrained model —
     * Nesterov can overshoot early — so the figure is checked, not a bound) */
    const char *held = strstr(r.out, "the final global model on held-out text");
    cr_assert_not_null(held, "%s", r.out);
    double score = NAN;
    cr_assert_eq(sscanf(strchr(held, ':') + 1, "%lf", &score), 1, "%s", held);
    proc_result_free(&r);
    char db[800], fed[700], err[ERR_LEN];
    cr_assert_float_eq(score, held_out_of(root, "fed/checkpoints/round-000002.safetensors"), 1e-4);
    snprintf(fed, sizeof fed, "%s/fed", root);
    snprintf(db, sizeof db, "%s/%s", fed, STORE_DB_FILE);
    Store *s = store_open(db, STORE_READONLY, err);
    cr_assert_not_null(s, "%s", err);
    double first = NAN, last = NAN;
    int64_t down0 = 0;
    for (int n = 0; n < 3; n++) {
        StoreRound rd;
        cr_assert_eq(store_round_get(s, n, &rd, err), 0, "round %d missing", n);
        cr_assert_str_eq(rd.state, "committed");
        cr_assert_eq(rd.participants, 3, "round %d had %lld sites", n, (long long)rd.participants);
        cr_assert_gt(rd.bytes_up, 0);
        cr_assert(isfinite(rd.eval_loss));
        if (n == 0) first = rd.eval_loss, down0 = rd.bytes_down;
        /* after round 0 the sites hold the previous model: the downlink is a delta */
        if (n > 0)
            cr_assert_lt(rd.bytes_down, down0, "round %d sent %lld bytes down, round 0 %lld", n,
                         (long long)rd.bytes_down, (long long)down0);
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
    StoreCheck chk;
    cr_assert_eq(store_check(s, fed, &chk, NULL, NULL, err), 0, "%s", err);
    cr_assert(chk.integrity_ok);
    cr_assert_eq(chk.checkpoints_ok, 3);
    cr_assert_eq(chk.checkpoints_bad, 0);
    store_close(s);
    harness_rmtree(root);
    free(root);
}

/* --baseline: a centralized `strait train` on the same collections and
 * tokens, both final models scored on the same held-out text. */
Test(federation, demo_baseline_scores_both_models_on_held_out_text, .timeout = 300) {
    char *root = harness_tmpdir("fedbase");
    char *argv[] = {(char *)harness_strait_bin(),
                    "demo",
                    "--sites",
                    "2",
                    "--rounds",
                    "3",
                    "--model",
                    "tiny",
                    "--steps",
                    "20",
                    "--baseline",
                    "--dir",
                    root,
                    NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "demo failed: %s %s", r.out, r.err);
    cr_assert(strstr(r.out, "120 steps of 8 x 64"), "not the federation's token budget:\n%s",
              r.out);
    double fed = NAN, central = NAN, ratio = NAN;
    const char *f = strstr(r.out, "  federated    "), *c = strstr(r.out, "  centralized  "),
               *q = strstr(r.out, "  ratio        ");
    cr_assert(f && c && q, "%s", r.out);
    sscanf(f + 15, "%lf", &fed);
    sscanf(c + 15, "%lf", &central);
    sscanf(q + 15, "%lf", &ratio);
    /* each is its final checkpoint's score on the held-out collections; the
     * centralized one learned (an untrained byte model scores ln 256 = 5.55) */
    cr_assert_float_eq(fed, held_out_of(root, "fed/checkpoints/round-000002.safetensors"), 1e-4);
    cr_assert_float_eq(central, held_out_of(root, "central.safetensors"), 1e-4);
    cr_assert(central > 0.5 && central < 5.0, "centralized held-out loss %g", central);
    cr_assert_float_eq(ratio, fed / central, 1e-3);
    char ckpt[800];
    snprintf(ckpt, sizeof ckpt, "%s/central.safetensors", root);
    cr_assert_eq(access(ckpt, R_OK), 0, "no centralized checkpoint at %s", ckpt);
    proc_result_free(&r);
    harness_rmtree(root);
    free(root);
}
