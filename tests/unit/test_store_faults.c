/*
 * test_store_faults.c — every SQLite write of the store's transactions that
 * are not a round's commit (walked in integration/test_adversary.c) made to
 * fail, one at a time (tests/faultsim/faultsim.h: SQLITE_IOERR, SQLITE_FULL
 * and SQLITE_BUSY through its VFS), and every allocation SQLite makes for
 * them (SQLite's own do_malloc_test): a site's revocation, a join (its token
 * consumed, the site and its certificate recorded in one transaction), a
 * renewal, a round failed and an update recorded. For each k on a fresh
 * store: the call fails with its reason in one line and changes nothing of
 * what it would have written, or succeeds whole (SQLite went on past the
 * fault, as at a checkpoint); the store passes its integrity check, and the
 * same call without a fault then succeeds. And a backup, at every write,
 * SQLite allocation and file call: whole or absent, nothing left beside it.
 */
#include <dirent.h>
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "coordinator/store.h"
#include "tests/faultsim/faultsim.h"
#include "tests/store_fixture.h"
#include "util/util.h"

#define NOW 1700000000000LL

static const uint8_t TOKEN[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9};

static StoreCert cert_of(const char *serial, char c) {
    StoreCert k = {.not_before = NOW - 1000, .not_after = NOW + 86400000LL};
    snprintf(k.serial, sizeof k.serial, "%s", serial);
    memset(k.sha256, c, 64);
    k.sha256[64] = '\0';
    return k;
}

/* The state every walk starts from: site "a" with its certificate, a token
 * for "b", round 0 open. */
static int64_t site_a, round0; /* their ids, so the calls walked look nothing up */
static void prepare(Store *s) {
    char err[ERR_LEN];
    int64_t site, round;
    StoreCert k = cert_of("0a", 'a');
    cr_assert_eq(store_site_add(s, "a", NOW, &site, err), 0, "%s", err);
    cr_assert_eq(store_cert_add(s, site, &k, NOW, NOW, err), 0, "%s", err);
    cr_assert_eq(store_token_add(s, TOKEN, "b", NOW, NOW + 3600000, err), 0, "%s", err);
    cr_assert_eq(store_round_open(s, 0, NOW, &round, err), 0, "%s", err);
    site_a = site, round0 = round;
}

typedef struct Op {
    const char *name;
    int (*run)(Store *s, char *err);
    int (*done)(Store *s); /* whether its effect is in the store: 1, 0 */
} Op;

static int revoke_a(Store *s, char *err) {
    return store_site_revoke(s, "a", "admin", NOW + 1, err);
}
static int revoked(Store *s) {
    StoreSite site;
    StoreCert k;
    cr_assert_eq(store_site_get(s, "a", &site, NULL), 0);
    cr_assert_eq(store_cert_find(s, cert_of("0a", 'a').sha256, NULL, &k, NULL), 0);
    int a = strcmp(site.state, "revoked") == 0, b = k.revoked_at != 0;
    cr_assert_eq(a, b, "the site and its certificate disagree: half a revocation");
    return a;
}

static int join(Store *s, char *err) {
    StoreCert k = cert_of("0b", 'b');
    int64_t id;
    StoreTokenResult r = store_token_consume(s, TOKEN, "b", NOW + 1, &k, &id, err);
    return r == STORE_TOKEN_OK ? 0 : -1;
}
static int joined(Store *s) {
    StoreSite site;
    int has_site = store_site_get(s, "b", &site, NULL) == 0;
    int has_cert = store_cert_find(s, cert_of("0b", 'b').sha256, NULL, NULL, NULL) == 0;
    int spent = store_token_check(s, TOKEN, "b", NOW + 2, NULL) == STORE_TOKEN_USED;
    cr_assert(has_site == has_cert && has_cert == spent,
              "half a join: site %d, certificate %d, token spent %d", has_site, has_cert, spent);
    return has_site;
}

static int renew(Store *s, char *err) {
    StoreCert k = cert_of("1a", 'c');
    return store_cert_add(s, site_a, &k, NOW + 600000, NOW + 1, err);
}
static int renewed(Store *s) {
    StoreCert old;
    int has_new = store_cert_find(s, cert_of("1a", 'c').sha256, NULL, NULL, NULL) == 0;
    cr_assert_eq(store_cert_find(s, cert_of("0a", 'a').sha256, NULL, &old, NULL), 0);
    cr_assert_eq(has_new, old.revoked_at != 0, "half a renewal: the old one %s",
                 old.revoked_at ? "retired without a new one" : "not retired");
    return has_new;
}

static int fail_round(Store *s, char *err) {
    return store_round_fail(s, round0, "walked", 0, NOW + 1, err);
}
static int failed_round(Store *s) {
    StoreRound r;
    cr_assert_eq(store_round_get(s, 0, &r, NULL), 0);
    return strcmp(r.state, "failed") == 0;
}

static int record(Store *s, char *err) {
    StoreUpdate u = {.round_id = round0, .site_id = site_a, .tokens = 100, .wire_bytes = 10};
    snprintf(u.codec, sizeof u.codec, "int8");
    snprintf(u.state, sizeof u.state, "received");
    int64_t id;
    return store_update_record(s, &u, &id, err);
}
static int recorded(Store *s) {
    StoreRound r;
    StoreUpdate *ups;
    size_t n;
    cr_assert_eq(store_round_get(s, 0, &r, NULL), 0);
    cr_assert_eq(store_updates_list(s, r.id, &ups, &n, NULL), 0);
    free(ups);
    return n == 1;
}

/* The faults a walk injects, and their names in its messages. */
typedef struct Kind {
    FaultKind kind;
    int err;
    const char *name;
} Kind;
#define IOERR                                                                                      \
    { FAULT_SQL, SQLITE_IOERR, "ioerr" }
#define FULL                                                                                       \
    { FAULT_SQL, SQLITE_FULL, "full" }
#define SQLMEM                                                                                     \
    { FAULT_SQLMEM, ENOMEM, "SQLite's allocations" }

static void consistent(StoreFixture *fx, const char *what) {
    StoreCheck chk;
    char err[ERR_LEN];
    cr_assert_eq(store_check(fx->store, fx->home, &chk, NULL, NULL, err), 0, "%s: %s", what, err);
    cr_assert(chk.integrity_ok, "%s: %s", what, chk.integrity);
}

Test(store_faults, every_write_of_the_stores_transactions_fails_whole, .timeout = 600) {
    static const Op ops[] = {{"a revocation", revoke_a, revoked},
                             {"a join", join, joined},
                             {"a renewal", renew, renewed},
                             {"a round failed", fail_round, failed_round},
                             {"an update recorded", record, recorded}};
    static const Kind kinds[] = {IOERR, FULL, {FAULT_SQL, SQLITE_BUSY, "busy"}, SQLMEM};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
            int failed = 0, tolerated = 0, k;
            for (k = 1; k <= 5000; k++) {
                StoreFixture fx;
                store_fixture_init(&fx, "store-faults");
                prepare(fx.store);
                char err[ERR_LEN] = "", what[128];
                snprintf(what, sizeof what, "%s with %s at write %d", ops[o].name, kinds[i].name,
                         k);
                faultsim_arm(kinds[i].kind, k, kinds[i].err, 0);
                int rc = ops[o].run(fx.store, err);
                int64_t fired;
                faultsim_disarm(&fired);
                int done = ops[o].done(fx.store);
                consistent(&fx, what);
                if (fired == 0) {
                    cr_assert_eq(rc, 0, "%s: failed with nothing injected: %s", what, err);
                    cr_assert(done, "%s: succeeded without its effect", what);
                    store_fixture_fini(&fx);
                    break;
                }
                if (rc == 0) {
                    tolerated++;
                    cr_assert(done, "%s: succeeded without its effect", what);
                } else {
                    failed++;
                    cr_assert_neq(err[0], '\0', "%s: failed without a reason", what);
                    cr_assert_null(strchr(err, '\n'), "%s: '%s' is more than a line", what, err);
                    cr_assert(!done, "%s: failed (%s) but left its effect", what, err);
                    cr_assert_eq(ops[o].run(fx.store, err), 0, "%s, again: %s", what, err);
                    cr_assert(ops[o].done(fx.store), "%s, again: no effect", what);
                }
                store_fixture_fini(&fx);
            }
            cr_assert_leq(k, 5000, "%s with %s: still failing at 5000 calls", ops[o].name,
                          kinds[i].name);
            cr_log_info("%s, %s: %d faults failed it, %d gone past", ops[o].name, kinds[i].name,
                        failed, tolerated);
            /* a lock it could not take, the store waits out (its busy
             * timeout): those go past; a write that fails fails the call */
            if (kinds[i].err == SQLITE_BUSY)
                cr_assert_gt(failed + tolerated, 0, "%s with busy: no lock was refused",
                             ops[o].name);
            else
                cr_assert_gt(failed, 0, "%s with %s: nothing was made to fail", ops[o].name,
                             kinds[i].name);
        }
    }
}

/* Whether a file other than the store's own (strait.db, its -wal and -shm)
 * and the backup named `keep` is in dir: a temporary left behind. */
static int stray_files(const char *dir, const char *keep) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.' && strncmp(e->d_name, "strait.db", 9) != 0 &&
             strcmp(e->d_name, keep) != 0 && strcmp(e->d_name, "checkpoints") != 0;
    closedir(d);
    return n;
}

/* A backup (SQLite's online backup into a temporary, its integrity checked,
 * synced, renamed into place) with each write, SQLite allocation and file
 * call failing in turn: path is absent and no temporary is left, or path is
 * a whole store that opens and passes its check (the one failure after the
 * rename is the folder's sync, which says so). */
Test(store_faults, a_backup_is_whole_or_absent_at_every_fault, .timeout = 600) {
    static const Kind kinds[] = {IOERR, FULL, SQLMEM, {FAULT_IO, EIO, "file calls (EIO)"}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        int failed = 0, tolerated = 0, k;
        for (k = 1; k <= 5000; k++) {
            StoreFixture fx;
            store_fixture_init(&fx, "store-backup");
            prepare(fx.store);
            char path[700], err[ERR_LEN] = "";
            snprintf(path, sizeof path, "%s/backup.db", fx.home);
            faultsim_arm(kinds[i].kind, k, kinds[i].err, 0);
            int rc = store_backup(fx.store, path, err);
            int64_t fired;
            faultsim_disarm(&fired);
            int there = access(path, F_OK) == 0;
            cr_assert_eq(stray_files(fx.home, "backup.db"), 0,
                         "%s at %d: a temporary was left beside the backup", kinds[i].name, k);
            if (rc != 0) {
                cr_assert_eq(fired, 1, "%s at %d: failed with nothing injected: %s", kinds[i].name,
                             k, err);
                cr_assert_null(strchr(err, '\n'), "more than one line: %s", err);
                if (there)
                    cr_assert(strstr(err, "sync folder") || strstr(err, "to sync it"),
                              "%s at %d: failed (%s) but left a backup", kinds[i].name, k, err);
                failed++;
            }
            if (there) { /* whole: it opens and passes its check */
                Store *b = store_open(path, STORE_READONLY, err);
                cr_assert_not_null(b, "%s at %d: the backup does not open: %s", kinds[i].name, k,
                                   err);
                StoreCheck chk;
                cr_assert_eq(store_check(b, fx.home, &chk, NULL, NULL, err), 0, "%s", err);
                cr_assert(chk.integrity_ok && chk.sites == 1, "%s at %d: %s, %lld sites",
                          kinds[i].name, k, chk.integrity, (long long)chk.sites);
                store_close(b);
            } else {
                cr_assert_neq(rc, 0, "%s at %d: succeeded without a backup", kinds[i].name, k);
            }
            tolerated += rc == 0 && fired > 0;
            store_fixture_fini(&fx);
            if (fired == 0) break;
        }
        cr_assert_leq(k, 5000, "%s: still failing at 5000 calls", kinds[i].name);
        cr_log_info("a backup, %s: %d faults failed it, %d gone past", kinds[i].name, failed,
                    tolerated);
        cr_assert_gt(failed, 0, "a backup with %s: nothing was made to fail", kinds[i].name);
    }
}

/* A prune (retention) at every SQLite write, SQLite allocation, file call
 * and allocation, one at a time, on rounds 0-7 with keep_last = 2 and
 * keep_every = 3: it fails in one line or prunes whole; either way every
 * file the store keeps is there and sound (no file goes before its mark is
 * committed), a file marked and left is what recovery removes, and the next
 * prune without a fault ends at exactly the policy's files. */
Test(store_faults, a_prune_keeps_the_store_true_at_every_fault, .timeout = 600) {
    static const Kind kinds[] = {IOERR,
                                 FULL,
                                 SQLMEM,
                                 {FAULT_IO, EIO, "file calls (EIO)"},
                                 {FAULT_ALLOC, ENOMEM, "allocations"}};
    const uint64_t kept = 1u << 0 | 1u << 3 | 1u << 6 | 1u << 7;
    StoreRetention p = {.keep_last = 2, .keep_every = 3, .keep_back = 1};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        int failed = 0, k;
        for (k = 1; k <= 5000; k++) {
            StoreFixture fx;
            store_fixture_init(&fx, "store-prune");
            store_fixture_commit_rounds(&fx, 0, 8, 1);
            char err[ERR_LEN] = "";
            StorePruneReport rep;
            faultsim_arm(kinds[i].kind, k, kinds[i].err, 0);
            int rc = store_prune(fx.store, fx.home, &p, NOW, &rep, err);
            int64_t fired;
            faultsim_disarm(&fired);
            if (rc != 0) {
                cr_assert_eq(fired, 1, "%s at %d: failed with nothing injected: %s", kinds[i].name,
                             k, err);
                cr_assert_null(strchr(err, '\n'), "more than one line: %s", err);
                failed++;
            }
            StoreCheck chk;
            cr_assert_eq(store_check(fx.store, fx.home, &chk, NULL, NULL, err), 0, "%s", err);
            cr_assert(chk.integrity_ok, "%s at %d: %s", kinds[i].name, k, chk.integrity);
            cr_assert_eq(chk.checkpoints_bad, 0, "%s at %d: a kept file is gone or damaged",
                         kinds[i].name, k);
            StoreRecovery rec;
            cr_assert_eq(store_recover(fx.store, fx.home, NOW, &rec, err), 0, "%s", err);
            cr_assert_eq(store_prune(fx.store, fx.home, &p, NOW, &rep, err), 0, "%s", err);
            uint64_t models, states;
            store_fixture_files(fx.home, &models, &states);
            cr_assert_eq(models, kept, "%s at %d: models %#llx", kinds[i].name, k,
                         (unsigned long long)models);
            cr_assert_eq(states, 1u << 7, "%s at %d: states %#llx", kinds[i].name, k,
                         (unsigned long long)states);
            store_fixture_fini(&fx);
            if (fired == 0) break;
        }
        cr_assert_leq(k, 5000, "%s: still failing at 5000 calls", kinds[i].name);
        cr_log_info("a prune, %s: %d faults failed it", kinds[i].name, failed);
        cr_assert_gt(failed, 0, "a prune with %s: nothing was made to fail", kinds[i].name);
    }
}
