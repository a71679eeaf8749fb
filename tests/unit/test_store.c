/*
 * test_store.c — the SQLite store: schema and migrations, every typed query,
 * constraint violations as errors, single-use tokens raced by two processes,
 * the round commit protocol and recovery, and checks of checkpoints.
 * The crash and concurrent-reader tests are in test_store_crash.c.
 */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <sqlite3.h>

#include "coordinator/coordinator_internal.h"
#include "coordinator/store.h"
#include "coordinator/store_internal.h"
#include "security/security.h"
#include "tests/harness.h"
#include "tests/store_fixture.h"
#include "util/util.h"

static StoreFixture fx;
static void setup(void) {
    store_fixture_init(&fx, "store");
}
static void teardown(void) {
    store_fixture_fini(&fx);
}
TestSuite(store, .init = setup, .fini = teardown);

static int64_t add_site(const char *name) {
    int64_t id;
    char err[ERR_LEN];
    cr_assert_eq(store_site_add(fx.store, name, 1000, &id, err), 0, "%s", err);
    return id;
}

/* ---- schema and migrations -------------------------------------------- */

Test(store, open_creates_the_schema_in_wal_mode) {
    cr_assert_eq(store_schema_version(fx.store), STORE_SCHEMA_VERSION);
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(fx.db_path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    const char *tables[] = {"sites",   "enroll_tokens", "certificates", "rounds",
                            "updates", "checkpoints",   "events"};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        cr_assert_eq(sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_schema WHERE name = ?1",
                                        -1, &st, NULL),
                     SQLITE_OK);
        sqlite3_bind_text(st, 1, tables[i], -1, SQLITE_STATIC);
        cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
        cr_assert_eq(sqlite3_column_int(st, 0), 1, "table %s missing", tables[i]);
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
}

Test(store, reopen_is_idempotent_and_keeps_data) {
    add_site("alpha");
    store_close(fx.store);
    char err[ERR_LEN];
    fx.store = store_open(fx.db_path, STORE_READWRITE, err);
    cr_assert_not_null(fx.store, "%s", err);
    cr_assert_eq(store_schema_version(fx.store), STORE_SCHEMA_VERSION);
    StoreSite site;
    cr_assert_eq(store_site_get(fx.store, "alpha", &site, err), 0);
}

static char *file_sha(const char *path) {
    static char hex[SHA256_HEX_LEN];
    char err[ERR_LEN];
    cr_assert_eq(security_sha256_file(path, hex, NULL, err), 0, "%s", err);
    return hex;
}

Test(store, newer_schema_is_refused_and_the_file_untouched) {
    store_close(fx.store);
    fx.store = NULL;
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(fx.db_path, &db), SQLITE_OK);
    /* back to a rollback journal so the whole state is in the one file */
    cr_assert_eq(
        sqlite3_exec(db, "PRAGMA journal_mode=DELETE; PRAGMA user_version=99", NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);
    char before[SHA256_HEX_LEN];
    strcpy(before, file_sha(fx.db_path));
    struct stat st0, st1;
    cr_assert_eq(stat(fx.db_path, &st0), 0);
    char err[ERR_LEN];
    cr_assert_null(store_open(fx.db_path, STORE_READWRITE, err));
    char want[80];
    snprintf(want, sizeof want, "schema version 99, newer than this strait (%d)",
             STORE_SCHEMA_VERSION);
    cr_assert_not_null(strstr(err, want), "%s", err);
    cr_assert_not_null(strstr(err, "was not changed"), "%s", err);
    cr_assert_null(store_open(fx.db_path, STORE_READONLY, err));
    cr_assert_str_eq(file_sha(fx.db_path), before);
    cr_assert_eq(stat(fx.db_path, &st1), 0);
    cr_assert_eq(st0.st_mtim.tv_sec, st1.st_mtim.tv_sec);
    cr_assert_eq(st0.st_mtim.tv_nsec, st1.st_mtim.tv_nsec);
    char wal[700];
    snprintf(wal, sizeof wal, "%s-wal", fx.db_path);
    cr_assert_neq(access(wal, F_OK), 0, "a WAL file appeared next to a refused store");
}

Test(store, migrations_apply_forward_in_one_transaction) {
    const char *v1[] = {"CREATE TABLE a (x INTEGER);"};
    const char *v2[] = {"CREATE TABLE a (x INTEGER);", "ALTER TABLE a ADD COLUMN y TEXT;"};
    const char *broken[] = {"CREATE TABLE a (x INTEGER);", "ALTER TABLE a ADD COLUMN y TEXT;",
                            "CREATE TABLE b (z); THIS IS NOT SQL;"};
    char path[600], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/mig.db", fx.home);
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_close(db);
    /* a store handle on a scratch file, to drive store_migrate_from directly */
    Store *s = store_open(path, STORE_READWRITE, err);
    cr_assert_not_null(s, "%s", err);
    cr_assert_eq(store_exec(s, "PRAGMA user_version=0; DROP TABLE events;", err), 0, "%s", err);
    cr_assert_eq(store_migrate_from(s, 0, v1, 1, err), 0, "%s", err);
    cr_assert_eq(store_schema_version(s), 1);
    cr_assert_eq(store_migrate_from(s, 1, v2, 2, err), 0, "%s", err);
    cr_assert_eq(store_schema_version(s), 2);
    cr_assert_eq(store_exec(s, "INSERT INTO a (x, y) VALUES (1, 'two')", err), 0, "%s", err);
    cr_assert_eq(store_migrate_from(s, 2, broken, 3, err), -1);
    cr_assert_not_null(strstr(err, "to schema version 3 failed"), "%s", err);
    cr_assert_eq(store_schema_version(s), 2, "a failed migration moved the version");
    cr_assert_eq(store_exec(s, "SELECT * FROM b", err), -1, "a failed migration left table b");
    cr_assert_eq(store_migrate_from(s, 2, v2, 2, err), 0, "an up-to-date file is a no-op");
    store_close(s);
}

Test(store, readonly_reads_and_never_writes) {
    add_site("alpha");
    char err[ERR_LEN];
    Store *ro = store_open(fx.db_path, STORE_READONLY, err);
    cr_assert_not_null(ro, "%s", err);
    StoreSite site;
    cr_assert_eq(store_site_get(ro, "alpha", &site, err), 0, "%s", err);
    cr_assert_eq(store_site_add(ro, "beta", 1, NULL, err), -1);
    store_close(ro);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/none.db", fx.home);
    cr_assert_null(store_open(missing, STORE_READONLY, err));
    cr_assert_not_null(strstr(err, "cannot open store"), "%s", err);
    cr_assert_neq(access(missing, F_OK), 0, "read-only open created a file");
}

/* ---- sites, tokens, certificates --------------------------------------- */

Test(store, sites_round_trip_and_refuse_bad_names) {
    char err[ERR_LEN];
    int64_t a = add_site("alpha"), b = add_site("beta-2.site_x");
    cr_assert_neq(a, b);
    cr_assert_eq(store_site_add(fx.store, "alpha", 5, NULL, err), -1);
    cr_assert_str_eq(err, "a site named 'alpha' already exists");
    const char *bad[] = {"", "has space", "semi;colon", "slash/x",
                         "a123456789012345678901234567890123456789012345678901234567890123456"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(store_site_add(fx.store, bad[i], 5, NULL, err), -1, "'%s' accepted", bad[i]);
        cr_assert_not_null(strstr(err, "bad site name"), "%s", err);
    }
    cr_assert_eq(store_site_touch(fx.store, a, 4242, err), 0);
    cr_assert_eq(store_site_touch(fx.store, a, 10, err), 0, "older time must not go back");
    StoreSite s;
    cr_assert_eq(store_site_get(fx.store, "alpha", &s, err), 0);
    cr_assert_eq(s.id, a);
    cr_assert_str_eq(s.state, "active");
    cr_assert_eq(s.enrolled_at, 1000);
    cr_assert_eq(s.last_seen, 4242);
    cr_assert_eq(store_site_get(fx.store, "nobody", &s, err), STORE_NOT_FOUND);
    StoreSite *list;
    size_t n;
    cr_assert_eq(store_site_list(fx.store, &list, &n, err), 0);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(list[0].name, "alpha");
    cr_assert_str_eq(list[1].name, "beta-2.site_x");
    free(list);
}

static void token(uint8_t hash[32], int seed) {
    char text[32];
    snprintf(text, sizeof text, "token-%d", seed);
    security_sha256(text, strlen(text), hash);
}

static StoreCert cert_for(int seed) {
    StoreCert c;
    memset(&c, 0, sizeof c);
    uint8_t h[32];
    snprintf(c.serial, sizeof c.serial, "5e71a1%04x", seed);
    security_sha256(c.serial, strlen(c.serial), h);
    security_hex(h, 32, c.sha256);
    c.not_before = 1000;
    c.not_after = 1000 + 86400000LL * 365;
    return c;
}

Test(store, tokens_are_single_use_and_checked) {
    char err[ERR_LEN];
    uint8_t t1[32], t2[32], t3[32], unknown[32];
    token(t1, 1), token(t2, 2), token(t3, 3), token(unknown, 99);
    cr_assert_eq(store_token_add(fx.store, t1, "alpha", 1000, 5000, err), 0, "%s", err);
    cr_assert_eq(store_token_add(fx.store, t2, "beta", 1000, 2000, err), 0);
    cr_assert_eq(store_token_add(fx.store, t3, "gamma", 1000, 5000, err), 0);
    cr_assert_eq(store_token_add(fx.store, unknown, "x", 1000, 1000, err), -1);
    cr_assert_not_null(strstr(err, "must expire after"), "%s", err);

    StoreCert c = cert_for(1);
    int64_t site_id = 0;
    cr_assert_eq(store_token_consume(fx.store, t1, "alpha", 1500, &c, &site_id, err),
                 STORE_TOKEN_OK, "%s", err);
    cr_assert_gt(site_id, 0);
    cr_assert_eq(store_token_consume(fx.store, t1, "alpha", 1600, &c, NULL, err), STORE_TOKEN_USED);
    cr_assert_str_eq(err, "token already used");
    cr_assert_eq(store_token_consume(fx.store, t2, "beta", 2000, NULL, NULL, err),
                 STORE_TOKEN_EXPIRED);
    cr_assert_eq(store_token_consume(fx.store, t3, "alpha", 1500, NULL, NULL, err),
                 STORE_TOKEN_WRONG_SITE);
    cr_assert_eq(store_token_consume(fx.store, unknown, "alpha", 1500, NULL, NULL, err),
                 STORE_TOKEN_UNKNOWN);
    /* a refused token is still usable by its rightful site */
    cr_assert_eq(store_token_consume(fx.store, t3, "gamma", 1500, NULL, NULL, err), STORE_TOKEN_OK);

    StoreSite site;
    StoreCert found;
    cr_assert_eq(store_cert_find(fx.store, c.sha256, &site, &found, err), 0, "%s", err);
    cr_assert_str_eq(site.name, "alpha");
    cr_assert_eq(site.id, site_id);
    cr_assert_str_eq(site.cert_serial, c.serial);
    cr_assert_str_eq(found.serial, c.serial);
    cr_assert_eq(found.revoked_at, 0);
    StoreCert other = cert_for(2);
    cr_assert_eq(store_cert_find(fx.store, other.sha256, NULL, NULL, err), STORE_NOT_FOUND);
}

Test(store, revoke_marks_site_and_certificates_and_logs) {
    char err[ERR_LEN];
    uint8_t t[32];
    token(t, 7);
    cr_assert_eq(store_token_add(fx.store, t, "alpha", 1000, 9000, err), 0);
    StoreCert c = cert_for(7);
    cr_assert_eq(store_token_consume(fx.store, t, "alpha", 1100, &c, NULL, err), STORE_TOKEN_OK);
    cr_assert_eq(store_site_revoke(fx.store, "alpha", "admin", 2000, err), 0, "%s", err);
    StoreSite site;
    StoreCert found;
    cr_assert_eq(store_cert_find(fx.store, c.sha256, &site, &found, err), 0);
    cr_assert_str_eq(site.state, "revoked");
    cr_assert_eq(found.revoked_at, 2000);
    cr_assert_eq(store_site_revoke(fx.store, "nobody", "admin", 2000, err), -1);
    cr_assert_not_null(strstr(err, "no site named 'nobody'"), "%s", err);
    StoreCheck chk;
    cr_assert_eq(store_check(fx.store, fx.home, &chk, NULL, NULL, err), 0);
    cr_assert_eq(chk.events, 1);
}

/* Two processes consume the same token at once, twenty times over: exactly
 * one of each pair wins. */
Test(store, token_race_between_two_processes_has_one_winner, .timeout = 60) {
    char err[ERR_LEN];
    enum { ROUNDS = 20 };
    for (int i = 0; i < ROUNDS; i++) {
        uint8_t t[32];
        token(t, 100 + i);
        cr_assert_eq(store_token_add(fx.store, t, "racer", 1000, 9000, err), 0);
    }
    for (int i = 0; i < ROUNDS; i++) {
        int gate[2], results[2];
        cr_assert_eq(pipe(gate), 0);
        cr_assert_eq(pipe(results), 0);
        pid_t kids[2];
        for (int k = 0; k < 2; k++) {
            kids[k] = fork();
            cr_assert_geq(kids[k], 0);
            if (kids[k] == 0) {
                close(gate[1]);
                Store *s = store_open(fx.db_path, STORE_READWRITE, err);
                if (s == NULL) _exit(3);
                char go;
                if (read(gate[0], &go, 1) != 1) _exit(4); /* both start together */
                uint8_t t[32];
                token(t, 100 + i);
                StoreTokenResult r = store_token_consume(s, t, "racer", 2000, NULL, NULL, err);
                char out = (char)r;
                if (write(results[1], &out, 1) != 1) _exit(5);
                store_close(s);
                _exit(0);
            }
        }
        close(gate[0]);
        usleep(20000);
        cr_assert_eq(write(gate[1], "gg", 2), 2);
        close(gate[1]);
        int ok = 0, used = 0;
        for (int k = 0; k < 2; k++) {
            int st;
            cr_assert_eq(waitpid(kids[k], &st, 0), kids[k]);
            cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "racer failed: %d", st);
            char r;
            cr_assert_eq(read(results[0], &r, 1), 1);
            ok += r == STORE_TOKEN_OK;
            used += r == STORE_TOKEN_USED;
        }
        close(results[0]);
        close(results[1]);
        cr_assert_eq(ok, 1, "race %d: %d winners", i, ok);
        cr_assert_eq(used, 1, "race %d: the loser did not see a used token", i);
    }
}

/* ---- rounds and updates ------------------------------------------------ */

static StoreUpdate update_of(int64_t round_id, int64_t site_id, int64_t tokens, double loss,
                             const char *state, const char *reason) {
    StoreUpdate u;
    memset(&u, 0, sizeof u);
    u.round_id = round_id;
    u.site_id = site_id;
    snprintf(u.codec, sizeof u.codec, "int8");
    u.raw_bytes = 4000;
    u.wire_bytes = 1000;
    u.tokens = tokens;
    u.steps = 10;
    u.train_loss = loss;
    u.eval_loss = NAN;
    u.train_ms = 10;
    u.upload_ms = 5;
    snprintf(u.state, sizeof u.state, "%s", state);
    snprintf(u.reason, sizeof u.reason, "%s", reason ? reason : "");
    snprintf(u.reason_code, sizeof u.reason_code, "%s", reason ? "malformed" : "");
    u.received_at = 3000;
    return u;
}

/* round 0's checkpoint row, for the commits of the tests below */
static const StoreCheckpoint round0_ckpt = {
    "checkpoints/round-000000.safetensors",
    1234,
    "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
    NULL,
    0,
    NULL,
    0,
    0,
    0,
    0,
    0};

Test(store, round_lifecycle_derives_totals_at_commit) {
    char err[ERR_LEN];
    int64_t a = add_site("alpha"), b = add_site("beta"), c = add_site("gamma");
    int64_t r0;
    cr_assert_eq(store_round_open(fx.store, 0, 2000, &r0, err), 0, "%s", err);
    int64_t other;
    cr_assert_eq(store_round_open(fx.store, 1, 2000, &other, err), -1);
    cr_assert_not_null(strstr(err, "another round is still open"), "%s", err);

    StoreUpdate ua = update_of(r0, a, 300, 2.0, "received", NULL);
    StoreUpdate ub = update_of(r0, b, 100, 4.0, "received", NULL);
    StoreUpdate uc = update_of(r0, c, 50, 9.0, "rejected", "norm 80.0 above 10x the median");
    cr_assert_eq(store_update_record(fx.store, &ua, NULL, err), 0, "%s", err);
    cr_assert_eq(store_update_record(fx.store, &ub, NULL, err), 0, "%s", err);
    cr_assert_eq(store_update_record(fx.store, &uc, NULL, err), 0, "%s", err);
    cr_assert_eq(store_update_record(fx.store, &ua, NULL, err), -1, "a duplicate counted twice");
    cr_assert_not_null(strstr(err, "duplicate update"), "%s", err);
    StoreUpdate dup = update_of(r0, a, 300, 2.0, "rejected", "duplicate update for this round");
    cr_assert_eq(store_update_record(fx.store, &dup, NULL, err), 0, "a refused duplicate is kept");

    cr_assert_eq(store_round_aggregating(fx.store, r0, err), 0, "%s", err);
    cr_assert_eq(store_round_aggregating(fx.store, r0, err), -1);
    StoreCheckpoint ck = round0_ckpt;
    cr_assert_eq(store_round_commit(fx.store, r0, &ck, 3.25, 777, 4000, err), 0, "%s", err);
    cr_assert_eq(store_round_commit(fx.store, r0, &ck, 3.25, 777, 4000, err), -1);

    StoreRound r;
    cr_assert_eq(store_round_get(fx.store, 0, &r, err), 0);
    cr_assert_str_eq(r.state, "committed");
    cr_assert_eq(r.participants, 2);
    cr_assert_eq(r.tokens, 400);
    /* reported losses are claims: the median of the accepted, not the mean
     * weighted by the tokens each claims ((300 x 2 + 100 x 4) / 400 = 2.5) */
    cr_assert_float_eq(r.train_loss, 3.0, 1e-12);
    cr_assert_float_eq(r.eval_loss, 3.25, 1e-12);
    cr_assert_eq(r.bytes_up, 2000, "bytes up counts the updates taken");
    cr_assert_eq(r.bytes_rejected, 2000, "refused updates are counted apart");
    cr_assert_eq(r.bytes_down, 777);
    /* dense: one fp32 gradient (raw_bytes) up and one down per step of each
     * accepted update: 2 x 4000 x 10 x 2 updates */
    cr_assert_eq(r.dense_bytes, 160000);
    cr_assert_float_eq(store_dense_ratio(r.dense_bytes, r.bytes_up, r.bytes_down),
                       160000.0 / 2777.0, 1e-9);
    cr_assert_eq(store_dense_ratio(0, r.bytes_up, r.bytes_down), 0, "not measured");
    cr_assert_eq(r.closed_at, 4000);
    cr_assert_str_eq(r.checkpoint_path, ck.path);
    cr_assert_eq(r.checkpoint_bytes, 1234);
    cr_assert_str_eq(r.checkpoint_sha256, ck.sha256);

    StoreUpdate *ups;
    size_t n;
    cr_assert_eq(store_updates_list(fx.store, r0, &ups, &n, err), 0);
    cr_assert_eq(n, 4);
    cr_assert_str_eq(ups[0].site_name, "alpha");
    cr_assert_str_eq(ups[0].state, "accepted");
    cr_assert_str_eq(ups[1].state, "accepted");
    cr_assert_str_eq(ups[2].state, "rejected");
    cr_assert_str_eq(ups[2].reason, "norm 80.0 above 10x the median");
    cr_assert(isnan(ups[0].eval_loss));
    free(ups);

    cr_assert_eq(store_round_open(fx.store, 0, 5000, NULL, err), -1);
    cr_assert_not_null(strstr(err, "already committed"), "%s", err);
    int64_t r1;
    cr_assert_eq(store_round_open(fx.store, 1, 5000, &r1, err), 0, "%s", err);
    StoreRound last;
    cr_assert_eq(store_round_last_committed(fx.store, &last, err), 0);
    cr_assert_eq(last.number, 0);
    cr_assert_eq(store_round_live(fx.store, &last, err), 0);
    cr_assert_eq(last.id, r1);
}

/* A round's goodput counts each site from its enrollment when that came
 * after the round's start: a site that did not exist yet could not train.
 * Round 0 opens at 1 s and commits at 11 s; alpha, enrolled at 1 s, trains
 * 8,000 tokens in 8 s (10 s of wall); beta, enrolled at 6 s, 4,000 in 4 s
 * (5 s of wall); gamma, enrolled at 3 s, sends nothing and counts at the
 * median rate (1 token/ms) for its 8 s; delta enrolls after the close. */
Test(store, goodput_counts_each_site_from_its_enrollment) {
    char err[ERR_LEN];
    int64_t a, b, c, d, r0;
    cr_assert_eq(store_site_add(fx.store, "alpha", 1000, &a, err), 0, "%s", err);
    cr_assert_eq(store_round_open(fx.store, 0, 1000, &r0, err), 0, "%s", err);
    cr_assert_eq(store_site_add(fx.store, "gamma", 3000, &c, err), 0, "%s", err);
    cr_assert_eq(store_site_add(fx.store, "beta", 6000, &b, err), 0, "%s", err);
    StoreUpdate ua = update_of(r0, a, 8000, 2.0, "received", NULL);
    StoreUpdate ub = update_of(r0, b, 4000, 2.0, "received", NULL);
    ua.train_ms = 8000, ub.train_ms = 4000;
    ua.received_at = ub.received_at = 10000;
    cr_assert_eq(store_update_record(fx.store, &ua, NULL, err), 0, "%s", err);
    cr_assert_eq(store_update_record(fx.store, &ub, NULL, err), 0, "%s", err);
    cr_assert_eq(store_round_aggregating(fx.store, r0, err), 0, "%s", err);
    StoreCheckpoint ck = round0_ckpt;
    cr_assert_eq(store_round_commit(fx.store, r0, &ck, 3.0, 0, 11000, err), 0, "%s", err);
    cr_assert_eq(store_site_add(fx.store, "delta", 12000, &d, err), 0, "%s", err);
    AdminRound *ar;
    size_t n;
    cr_assert_eq(admin_query_rounds(fx.store, 10, 0, 13000, &ar, &n, err), 0, "%s", err);
    cr_assert_eq(n, 1);
    cr_assert_eq(ar[0].expected, 3, "delta came after the round");
    cr_assert_eq(ar[0].wall_ms, 10000);
    cr_assert_float_eq(ar[0].tokens_accepted, 12000, 1e-9);
    cr_assert_float_eq(ar[0].tokens_possible, 10000 + 5000 + 8000, 1e-6);
    cr_assert_float_eq(ar[0].goodput, 12000.0 / 23000, 1e-12);
    cr_assert_float_eq(ar[0].utilization, 12000.0 / 15000, 1e-12, "beta trained 4 of its 5 s");
    free(ar);
}

Test(store, failed_round_discards_updates_and_reopens_as_next_attempt) {
    char err[ERR_LEN];
    int64_t a = add_site("alpha");
    int64_t r1;
    cr_assert_eq(store_round_open(fx.store, 5, 1000, &r1, err), 0);
    StoreUpdate u = update_of(r1, a, 10, 1.0, "received", NULL);
    cr_assert_eq(store_update_record(fx.store, &u, NULL, err), 0);
    cr_assert_eq(
        store_round_fail(fx.store, r1, "no quorum: 1 of 2 sites by the deadline", 555, 2000, err),
        0, "%s", err);
    cr_assert_eq(store_round_fail(fx.store, r1, "again", 0, 2000, err), -1);
    StoreUpdate *ups;
    size_t n;
    cr_assert_eq(store_updates_list(fx.store, r1, &ups, &n, err), 0);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(ups[0].state, "discarded");
    cr_assert_str_eq(ups[0].reason, "no quorum: 1 of 2 sites by the deadline");
    free(ups);
    int64_t r2;
    cr_assert_eq(store_round_open(fx.store, 5, 3000, &r2, err), 0, "%s", err);
    StoreRound r;
    cr_assert_eq(store_round_get(fx.store, 5, &r, err), 0);
    cr_assert_eq(r.id, r2);
    cr_assert_eq(r.attempt, 2);
    cr_assert_str_eq(r.state, "open");
    StoreRound *list;
    cr_assert_eq(store_rounds_list(fx.store, 10, 0, &list, &n, err), 0);
    cr_assert_eq(n, 2);
    cr_assert_eq(list[0].attempt, 2, "newest first");
    cr_assert_str_eq(list[1].state, "failed");
    cr_assert_str_eq(list[1].failed_reason, "no quorum: 1 of 2 sites by the deadline");
    /* a failed attempt's traffic still crossed the wire: counted, never dense */
    cr_assert_eq(list[1].bytes_up, 1000);
    cr_assert_eq(list[1].bytes_down, 555);
    cr_assert_eq(list[1].dense_bytes, 0);
    StoreTotals t;
    cr_assert_eq(store_totals(fx.store, &t, err), 0, "%s", err);
    cr_assert_eq(t.bytes_up, 1000);
    cr_assert_eq(t.bytes_down, 555);
    cr_assert_eq(t.dense_bytes, 0, "dense counts committed training only");
    free(list);
    cr_assert_eq(store_round_last_committed(fx.store, &r, err), STORE_NOT_FOUND);
}

/* The privacy account read back: a committed central round (Gaussian), a
 * distributed attempt whose sum was unmasked and whose commit failed, and
 * the distributed round committed after it (Skellam, each), as the
 * accountant adds them; a round committed without noise is counted
 * apart; a sum's noise is recorded only on a live attempt. */
Test(store, the_privacy_account_counts_every_unmasked_sum_and_each_committed_round) {
    char err[ERR_LEN];
    int64_t r0, r1a, r1b, r2;
    StoreCheckpoint ck = round0_ckpt;
    ck.dp_noise = 1.5, ck.dp_epsilon = 1, ck.dp_delta = 1e-5;
    cr_assert_eq(store_round_open(fx.store, 0, 1000, &r0, err), 0, "%s", err);
    cr_assert_eq(store_round_commit(fx.store, r0, &ck, 3.0, 0, 1100, err), 0, "%s", err);
    cr_assert_eq(store_round_open(fx.store, 1, 1200, &r1a, err), 0, "%s", err);
    cr_assert_eq(store_round_noise(fx.store, r1a, 0.9, 4e10, 3e7, 1e-5, err), 0, "%s", err);
    cr_assert_eq(store_round_fail(fx.store, r1a, "the commit failed", 0, 1300, err), 0, "%s", err);
    cr_assert_eq(store_round_noise(fx.store, r1a, 0.9, 4e10, 3e7, 1e-5, err), -1, "not live");
    cr_assert_eq(store_round_open(fx.store, 1, 1400, &r1b, err), 0, "%s", err);
    cr_assert_eq(store_round_noise(fx.store, r1b, 0.8, 5e10, 3e7, 1e-5, err), 0, "%s", err);
    StoreCheckpoint ck1 = round0_ckpt;
    ck1.path = "checkpoints/round-000001.safetensors";
    ck1.dp_noise = 0.8, ck1.dp_epsilon = 2, ck1.dp_delta = 1e-5, ck1.dp_mu = 5e10, ck1.dp_l1 = 3e7;
    cr_assert_eq(store_round_commit(fx.store, r1b, &ck1, 3.0, 0, 1500, err), 0, "%s", err);
    PrivacyAccount got, want = {{0}};
    int64_t plain;
    cr_assert_eq(store_privacy_spent(fx.store, &got, &plain, err), 0, "%s", err);
    cr_assert_eq(plain, 0);
    privacy_add_gaussian(&want, 1.5);
    privacy_add_skellam(&want, 4e10, 3e7, sqrt(4e10) / 0.9);
    privacy_add_skellam(&want, 5e10, 3e7, sqrt(5e10) / 0.8);
    for (int i = 0; i < PRIVACY_ORDERS; i++)
        cr_assert(got.rdp[i] == want.rdp[i] ||
                      fabs(got.rdp[i] - want.rdp[i]) <= 1e-12 * want.rdp[i],
                  "order %g: %.17g, not %.17g", privacy_order(i), got.rdp[i], want.rdp[i]);
    StoreCheckpoint bare = round0_ckpt;
    bare.path = "checkpoints/round-000002.safetensors";
    cr_assert_eq(store_round_open(fx.store, 2, 1600, &r2, err), 0, "%s", err);
    cr_assert_eq(store_round_commit(fx.store, r2, &bare, 3.0, 0, 1700, err), 0, "%s", err);
    cr_assert_eq(store_privacy_spent(fx.store, &got, &plain, err), 0, "%s", err);
    cr_assert_eq(plain, 1, "the round without noise is counted apart");
}

Test(store, constraint_violations_are_errors_not_crashes) {
    char err[ERR_LEN];
    int64_t a = add_site("alpha");
    int64_t r;
    cr_assert_eq(store_round_open(fx.store, 0, 1000, &r, err), 0);
    StoreUpdate neg = update_of(r, a, -5, 1.0, "received", NULL);
    cr_assert_eq(store_update_record(fx.store, &neg, NULL, err), -1);
    cr_assert_not_null(strstr(err, "refused by the schema"), "%s", err);
    StoreUpdate no_reason = update_of(r, a, 5, 1.0, "rejected", NULL);
    cr_assert_eq(store_update_record(fx.store, &no_reason, NULL, err), -1);
    StoreUpdate bad_state = update_of(r, a, 5, 1.0, "maybe", NULL);
    cr_assert_eq(store_update_record(fx.store, &bad_state, NULL, err), -1);
    StoreUpdate ghost_site = update_of(r, 999, 5, 1.0, "received", NULL);
    cr_assert_eq(store_update_record(fx.store, &ghost_site, NULL, err), -1);
    cr_assert_not_null(strstr(err, "unknown round attempt"), "%s", err);
    StoreUpdate ghost_round = update_of(12345, a, 5, 1.0, "received", NULL);
    cr_assert_eq(store_update_record(fx.store, &ghost_round, NULL, err), -1);
    cr_assert_eq(store_round_open(fx.store, -1, 1000, NULL, err), -1);
    StoreCheckpoint short_hash = {"checkpoints/x", 1, "abc", NULL, 0, NULL, 0, 0, 0, 0, 0};
    cr_assert_eq(store_round_commit(fx.store, r, &short_hash, NAN, 0, 2000, err), -1);
    StoreRound live;
    cr_assert_eq(store_round_live(fx.store, &live, err), 0, "a failed commit left no live round");
    cr_assert_eq(live.id, r);
    StoreCheck chk;
    cr_assert_eq(store_check(fx.store, fx.home, &chk, NULL, NULL, err), 0);
    cr_assert(chk.integrity_ok);
    cr_assert_eq(chk.updates, 0, "a refused update was half-written");
}

/* ---- recovery, resume and check ----------------------------------------- */

Test(store, recover_fails_live_rounds_and_removes_orphans) {
    char err[ERR_LEN];
    int64_t a = add_site("alpha");
    StoreCheckpoint ck;
    char sha[SHA256_HEX_LEN];
    int64_t r0;
    cr_assert_eq(store_round_open(fx.store, 0, 1000, &r0, err), 0);
    store_fixture_write_checkpoint(&fx, 0, sha, &ck);
    StoreUpdate u = update_of(r0, a, 10, 1.0, "received", NULL);
    cr_assert_eq(store_update_record(fx.store, &u, NULL, err), 0);
    cr_assert_eq(store_round_commit(fx.store, r0, &ck, NAN, 0, 2000, err), 0, "%s", err);
    /* a round in flight when the coordinator died: its file is renamed into
     * place but the row never committed, and a temporary of another write */
    int64_t r1;
    cr_assert_eq(store_round_open(fx.store, 1, 3000, &r1, err), 0);
    StoreCheckpoint orphan;
    char sha1[SHA256_HEX_LEN];
    store_fixture_write_checkpoint(&fx, 1, sha1, &orphan);
    store_fixture_touch(&fx, "checkpoints/round-000002.safetensors.tmp.AbC123");
    store_fixture_touch(&fx, "checkpoints/README.txt");

    StoreRecovery rep;
    cr_assert_eq(store_recover(fx.store, fx.home, 5000, &rep, err), 0, "%s", err);
    cr_assert_eq(rep.rounds_failed, 1);
    cr_assert_eq(rep.orphans_removed, 2);
    cr_assert(store_fixture_exists(&fx, ck.path), "the committed checkpoint was removed");
    cr_assert_not(store_fixture_exists(&fx, orphan.path));
    cr_assert(store_fixture_exists(&fx, "checkpoints/README.txt"), "a foreign file was removed");
    StoreRound r;
    cr_assert_eq(store_round_get(fx.store, 1, &r, err), 0);
    cr_assert_str_eq(r.state, "failed");
    cr_assert_str_eq(r.failed_reason, "coordinator restarted");
    cr_assert_eq(store_recover(fx.store, fx.home, 6000, &rep, err), 0);
    cr_assert_eq(rep.rounds_failed + rep.orphans_removed, 0, "recovery is not idempotent");
}

Test(store, resume_refuses_a_missing_or_altered_checkpoint) {
    char err[ERR_LEN], sha[SHA256_HEX_LEN];
    log_set_level(LOG_OFF); /* the refusal is logged loudly by design */
    StoreRound r;
    cr_assert_eq(store_resume_point(fx.store, fx.home, &r, err), STORE_NOT_FOUND);
    int64_t r0;
    StoreCheckpoint ck;
    cr_assert_eq(store_round_open(fx.store, 0, 1000, &r0, err), 0);
    store_fixture_write_checkpoint(&fx, 0, sha, &ck);
    cr_assert_eq(store_round_commit(fx.store, r0, &ck, NAN, 0, 2000, err), 0);
    cr_assert_eq(store_resume_point(fx.store, fx.home, &r, err), 0, "%s", err);
    cr_assert_eq(r.number, 0);

    /* same size, one byte flipped */
    store_fixture_flip_byte(&fx, ck.path, 100);
    cr_assert_eq(store_resume_point(fx.store, fx.home, &r, err), -1);
    cr_assert_not_null(strstr(err, "refusing to resume: round 0: checkpoint"), "%s", err);
    cr_assert_not_null(strstr(err, "SHA-256"), "%s", err);
    StoreCheck chk;
    cr_assert_eq(store_check(fx.store, fx.home, &chk, NULL, NULL, err), 0);
    cr_assert(chk.integrity_ok);
    cr_assert_eq(chk.checkpoints_bad, 1);
    cr_assert_eq(chk.checkpoints_ok, 0);

    store_fixture_remove(&fx, ck.path);
    cr_assert_eq(store_resume_point(fx.store, fx.home, &r, err), -1);
    cr_assert_not_null(strstr(err, "unreadable"), "%s", err);
}

/* The outer optimizer's state beside a checkpoint is pinned with it: a
 * resume refuses a state file that was altered or lost, rather than
 * restarting the momentum from zero without a word. */
Test(store, resume_refuses_a_missing_or_altered_outer_state) {
    char err[ERR_LEN], sha[SHA256_HEX_LEN], state_sha[SHA256_HEX_LEN];
    log_set_level(LOG_OFF);
    int64_t r0;
    StoreCheckpoint ck;
    cr_assert_eq(store_round_open(fx.store, 0, 1000, &r0, err), 0);
    store_fixture_write_checkpoint(&fx, 0, sha, &ck);
    const char *state_rel = "checkpoints/round-000000.outer.safetensors";
    char full[800];
    snprintf(full, sizeof full, "%s/%s", fx.home, state_rel);
    unsigned char state[4096];
    for (size_t i = 0; i < sizeof state; i++) state[i] = (unsigned char)(i * 31);
    cr_assert_eq(file_write_atomic(full, state, sizeof state, 0644, err), 0, "%s", err);
    int64_t bytes;
    cr_assert_eq(security_sha256_file(full, state_sha, &bytes, err), 0);
    ck.state_path = state_rel, ck.state_bytes = bytes, ck.state_sha256 = state_sha;
    cr_assert_eq(store_round_commit(fx.store, r0, &ck, NAN, 0, 2000, err), 0, "%s", err);
    StoreRound r;
    cr_assert_eq(store_resume_point(fx.store, fx.home, &r, err), 0, "%s", err);
    cr_assert_str_eq(r.state_path, state_rel);
    cr_assert_eq(r.state_bytes, (int64_t)sizeof state);
    cr_assert_str_eq(r.state_sha256, state_sha);

    store_fixture_flip_byte(&fx, state_rel, 7);
    cr_assert_eq(store_resume_point(fx.store, fx.home, &r, err), -1);
    cr_assert_not_null(strstr(err, "outer optimizer state"), "%s", err);
    cr_assert_not_null(strstr(err, "SHA-256"), "%s", err);
    StoreCheck chk;
    cr_assert_eq(store_check(fx.store, fx.home, &chk, NULL, NULL, err), 0);
    cr_assert_eq(chk.checkpoints_bad, 1);

    store_fixture_remove(&fx, state_rel);
    cr_assert_eq(store_resume_point(fx.store, fx.home, &r, err), -1);
    cr_assert_not_null(strstr(err, "unreadable"), "%s", err);
}

/* A store made by schema 1 (before the outer state was pinned) is migrated
 * in place at open; its rounds read back with no state pinned. */
Test(store, a_version_1_store_migrates_to_pin_outer_states) {
    extern const char schema_store_sql[];
    char path[600], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/v1.db", fx.home);
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(db, schema_store_sql, NULL, NULL, NULL), SQLITE_OK);
    cr_assert_eq(
        sqlite3_exec(db,
                     "PRAGMA user_version=1;"
                     "INSERT INTO checkpoints (id, round, path, bytes, sha256, created_at) VALUES "
                     "(1, 0, 'checkpoints/round-000000.safetensors', 10, "
                     "'00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', 5);"
                     "INSERT INTO rounds (number, attempt, state, opened_at, closed_at, "
                     "checkpoint_id) VALUES (0, 1, 'committed', 1, 5, 1);",
                     NULL, NULL, NULL),
        SQLITE_OK, "%s", sqlite3_errmsg(db));
    sqlite3_close(db);
    Store *s = store_open(path, STORE_READWRITE, err);
    cr_assert_not_null(s, "%s", err);
    cr_assert_eq(store_schema_version(s), STORE_SCHEMA_VERSION);
    StoreRound r;
    cr_assert_eq(store_round_last_committed(s, &r, err), 0, "%s", err);
    cr_assert_eq(r.number, 0);
    cr_assert_str_eq(r.state_path, "");
    store_close(s);
}

/* A schema 4 store counted refused updates in rounds.bytes_up; migration 5
 * moves them to bytes_rejected, and leaves dense_bytes unmeasured. */
Test(store, a_version_4_store_splits_refused_bytes_out) {
    extern const char schema_store_sql[], schema_store_v2_sql[], schema_store_v3_sql[],
        schema_store_v4_sql[];
    char path[600], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/v4.db", fx.home);
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    const char *steps[] = {schema_store_sql, schema_store_v2_sql, schema_store_v3_sql,
                           schema_store_v4_sql};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sqlite3_exec(db, steps[i], NULL, NULL, NULL), SQLITE_OK, "%s",
                     sqlite3_errmsg(db));
    cr_assert_eq(
        sqlite3_exec(
            db,
            "PRAGMA user_version=4;"
            "INSERT INTO sites (id, name, enrolled_at) VALUES (1, 'a', 1), (2, 'b', 1);"
            "INSERT INTO checkpoints (id, round, path, bytes, sha256, created_at) VALUES "
            "(1, 0, 'checkpoints/round-000000.safetensors', 10, "
            "'00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', 5);"
            "INSERT INTO rounds (id, number, attempt, state, opened_at, closed_at, "
            "checkpoint_id, bytes_up, bytes_down) VALUES (1, 0, 1, 'committed', 1, 5, 1, 700, 9);"
            "INSERT INTO updates (round_id, site_id, codec, raw_bytes, wire_bytes, tokens, state, "
            "reason, reason_code, received_at) VALUES "
            "(1, 1, 'int8', 4000, 500, 10, 'accepted', NULL, NULL, 2),"
            "(1, 2, 'int8', 4000, 200, 10, 'rejected', 'norm', 'norm_gate', 3);",
            NULL, NULL, NULL),
        SQLITE_OK, "%s", sqlite3_errmsg(db));
    sqlite3_close(db);
    Store *s = store_open(path, STORE_READWRITE, err);
    cr_assert_not_null(s, "%s", err);
    cr_assert_eq(store_schema_version(s), STORE_SCHEMA_VERSION);
    StoreRound r;
    cr_assert_eq(store_round_get(s, 0, &r, err), 0, "%s", err);
    cr_assert_eq(r.bytes_up, 500);
    cr_assert_eq(r.bytes_rejected, 200);
    cr_assert_eq(r.bytes_down, 9);
    cr_assert_eq(r.dense_bytes, 0, "the steps of old updates are not known");
    store_close(s);
}

Test(store, check_reports_a_healthy_store) {
    char err[ERR_LEN], sha[SHA256_HEX_LEN];
    int64_t a = add_site("alpha");
    for (int i = 0; i < 3; i++) {
        int64_t rid;
        StoreCheckpoint ck;
        cr_assert_eq(store_round_open(fx.store, i, 1000 + i, &rid, err), 0);
        StoreUpdate u = update_of(rid, a, 10, 1.0, "received", NULL);
        cr_assert_eq(store_update_record(fx.store, &u, NULL, err), 0);
        store_fixture_write_checkpoint(&fx, i, sha, &ck);
        cr_assert_eq(store_round_commit(fx.store, rid, &ck, 2.0, 10, 2000 + i, err), 0);
    }
    StoreCheck chk;
    cr_assert_eq(store_check(fx.store, fx.home, &chk, NULL, NULL, err), 0, "%s", err);
    cr_assert(chk.integrity_ok);
    cr_assert_str_eq(chk.integrity, "ok");
    cr_assert_eq(chk.schema_version, STORE_SCHEMA_VERSION);
    cr_assert_eq(chk.sites, 1);
    cr_assert_eq(chk.rounds_committed, 3);
    cr_assert_eq(chk.updates, 3);
    cr_assert_eq(chk.checkpoints_ok, 3);
    cr_assert_eq(chk.checkpoints_bad, 0);
    cr_assert_eq(chk.last_committed, 2);
}

Test(store, a_renewal_retires_the_replaced_certificate_and_drops_retired_ones) {
    char err[ERR_LEN];
    uint8_t t[32];
    token(t, 9);
    cr_assert_eq(store_token_add(fx.store, t, "alpha", 1000, 9000, err), 0);
    StoreCert c1 = cert_for(11), c2 = cert_for(12), c3 = cert_for(13);
    int64_t site_id = 0;
    cr_assert_eq(store_token_consume(fx.store, t, "alpha", 1100, &c1, &site_id, err),
                 STORE_TOKEN_OK);
    /* renewed at 2000, the first retires at 2600 */
    cr_assert_eq(store_cert_add(fx.store, site_id, &c2, 2600, 2000, err), 0, "%s", err);
    StoreSite site;
    StoreCert found;
    cr_assert_eq(store_cert_find(fx.store, c1.sha256, &site, &found, err), 0);
    cr_assert_eq(found.revoked_at, 2600);
    cr_assert_str_eq(site.cert_sha256, c2.sha256);
    cr_assert_eq(store_cert_find(fx.store, c2.sha256, NULL, &found, err), 0);
    cr_assert_eq(found.revoked_at, 0);
    /* renewed again at 3000: the first (retired by then) is gone, the second retires */
    cr_assert_eq(store_cert_add(fx.store, site_id, &c3, 3600, 3000, err), 0, "%s", err);
    cr_assert_eq(store_cert_find(fx.store, c1.sha256, NULL, NULL, err), STORE_NOT_FOUND);
    cr_assert_eq(store_cert_find(fx.store, c2.sha256, NULL, &found, err), 0);
    cr_assert_eq(found.revoked_at, 3600);
    /* a revocation now ends the retiring one at once */
    cr_assert_eq(store_site_revoke(fx.store, "alpha", "admin", 3100, err), 0, "%s", err);
    cr_assert_eq(store_cert_find(fx.store, c2.sha256, NULL, &found, err), 0);
    cr_assert_eq(found.revoked_at, 3100);
    cr_assert_eq(store_cert_find(fx.store, c3.sha256, NULL, &found, err), 0);
    cr_assert_eq(found.revoked_at, 3100);
}

Test(store, a_rounds_loss_is_the_median_report_so_one_liar_cannot_move_it) {
    char err[ERR_LEN];
    int64_t a = add_site("alpha"), b = add_site("beta"), c = add_site("gamma");
    int64_t r0;
    cr_assert_eq(store_round_open(fx.store, 0, 2000, &r0, err), 0, "%s", err);
    /* the liar claims the most tokens and a loss far from the others' */
    StoreUpdate ua = update_of(r0, a, 100, 4.0, "received", NULL);
    StoreUpdate ub = update_of(r0, b, 100, 4.2, "received", NULL);
    StoreUpdate uc = update_of(r0, c, 100000, 0.5, "received", NULL);
    cr_assert_eq(store_update_record(fx.store, &ua, NULL, err), 0, "%s", err);
    cr_assert_eq(store_update_record(fx.store, &ub, NULL, err), 0, "%s", err);
    cr_assert_eq(store_update_record(fx.store, &uc, NULL, err), 0, "%s", err);
    StoreCheckpoint ck = round0_ckpt;
    cr_assert_eq(store_round_commit(fx.store, r0, &ck, 3.0, 0, 4000, err), 0, "%s", err);
    StoreRound r;
    cr_assert_eq(store_round_get(fx.store, 0, &r, err), 0);
    cr_assert_float_eq(r.train_loss, 4.0, 1e-12, "%g", r.train_loss);
    cr_assert_eq(store_round_refusals_unrecorded(fx.store, r0, 5, err), 0, "%s", err);
    cr_assert_eq(store_round_refusals_unrecorded(fx.store, r0, 2, err), 0, "%s", err);
    cr_assert_eq(store_round_get(fx.store, 0, &r, err), 0);
    cr_assert_eq(r.refusals_unrecorded, 7);
}
