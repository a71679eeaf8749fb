/*
 * test_db.c — `strait db check` run as a real process against a store made
 * by the library: a healthy federation passes (text and JSON), an altered or
 * missing checkpoint and a damaged database fail with exit status 1.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "tests/harness.h"
#include "tests/store_fixture.h"
#include "util/util.h"

static StoreFixture fx;

static void setup(void) {
    store_fixture_init(&fx, "dbcheck");
    char err[ERR_LEN];
    int64_t site;
    cr_assert_eq(store_site_add(fx.store, "alpha", 1, &site, err), 0, "%s", err);
    for (int i = 0; i < 4; i++) {
        int64_t rid;
        cr_assert_eq(store_round_open(fx.store, i, 10 + i, &rid, err), 0, "%s", err);
        StoreUpdate u;
        memset(&u, 0, sizeof u);
        u.round_id = rid, u.site_id = site, u.tokens = 10, u.raw_bytes = 40, u.wire_bytes = 10;
        u.train_loss = 2.0, u.eval_loss = NAN, u.received_at = 20;
        strcpy(u.codec, "fp16");
        strcpy(u.state, "received");
        cr_assert_eq(store_update_record(fx.store, &u, NULL, err), 0, "%s", err);
        StoreCheckpoint ck;
        store_fixture_write_checkpoint(&fx, i, NULL, &ck);
        cr_assert_eq(store_round_commit(fx.store, rid, &ck, 1.0, 5, 30 + i, err), 0, "%s", err);
    }
    store_close(fx.store);
    fx.store = NULL;
}
static void teardown(void) {
    store_fixture_fini(&fx);
}
TestSuite(db, .init = setup, .fini = teardown);

static ProcResult db_check(const char *flag) {
    char *argv[] = {(char *)harness_strait_bin(), "db", "check", fx.home, (char *)flag, NULL};
    return proc_run(argv);
}

Test(db, check_passes_a_healthy_store) {
    ProcResult r = db_check(NULL);
    cr_assert_eq(r.status, 0, "stdout: %s\nstderr: %s", r.out, r.err);
    cr_assert_not_null(strstr(r.out, "integrity    ok\n"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "rounds       4 committed (last 3)"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "checkpoints  4 verified, 0 bad"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "verdict      ok"), "%s", r.out);
    proc_result_free(&r);
    r = db_check("--json");
    cr_assert_eq(r.status, 0);
    json_t *o = json_loads(r.out, 0, NULL);
    cr_assert_not_null(o, "not JSON: %s", r.out);
    cr_assert(json_is_true(json_object_get(o, "ok")));
    cr_assert_eq(json_integer_value(json_object_get(o, "rounds_committed")), 4);
    cr_assert_eq(json_integer_value(json_object_get(o, "checkpoints_ok")), 4);
    cr_assert_eq(json_integer_value(json_object_get(o, "updates")), 4);
    cr_assert_eq(json_array_size(json_object_get(o, "bad")), 0);
    json_decref(o);
    proc_result_free(&r);
}

Test(db, check_fails_on_altered_and_missing_checkpoints) {
    char rel[64];
    snprintf(rel, sizeof rel, "%s/round-000001.safetensors", STORE_CHECKPOINT_DIR);
    store_fixture_flip_byte(&fx, rel, 10);
    snprintf(rel, sizeof rel, "%s/round-000003.safetensors", STORE_CHECKPOINT_DIR);
    store_fixture_remove(&fx, rel);
    ProcResult r = db_check(NULL);
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.out, "checkpoints  2 verified, 2 bad"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "verdict      DAMAGED"), "%s", r.out);
    cr_assert_not_null(strstr(r.err, "round 1: checkpoint"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "round 3: checkpoint"), "%s", r.err);
    proc_result_free(&r);
    r = db_check("--json");
    cr_assert_eq(r.status, 1);
    json_t *o = json_loads(r.out, 0, NULL);
    cr_assert_not_null(o);
    cr_assert(json_is_false(json_object_get(o, "ok")));
    json_t *bad = json_object_get(o, "bad");
    cr_assert_eq(json_array_size(bad), 2);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(bad, 0), "round")), 1);
    json_decref(o);
    proc_result_free(&r);
}

Test(db, check_reports_a_damaged_database) {
    /* overwrite pages in the middle of the file, after the header */
    char db[700];
    snprintf(db, sizeof db, "%s", fx.db_path);
    FILE *f = fopen(db, "r+b");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    cr_assert_gt(size, 8192);
    char junk[4096];
    memset(junk, 0xA5, sizeof junk);
    fseek(f, 4096, SEEK_SET);
    fwrite(junk, 1, sizeof junk, f);
    fclose(f);
    ProcResult r = db_check(NULL);
    cr_assert_eq(r.status, 1, "a damaged file passed: %s", r.out);
    cr_assert_eq(harness_count_lines(r.err), 1, "stderr: %s", r.err);
    proc_result_free(&r);
}

Test(db, check_usage_errors) {
    char *none[] = {(char *)harness_strait_bin(), "db", "check", NULL};
    ProcResult r = proc_run(none);
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "expected one federation folder DIR"), "%s", r.err);
    proc_result_free(&r);
    char *missing[] = {(char *)harness_strait_bin(), "db", "check", "/nonexistent-fed", NULL};
    r = proc_run(missing);
    cr_assert_eq(r.status, 1);
    cr_assert_eq(harness_count_lines(r.err), 1);
    cr_assert_not_null(strstr(r.err, "no store at /nonexistent-fed/strait.db"), "%s", r.err);
    proc_result_free(&r);
}
