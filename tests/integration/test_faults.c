/*
 * test_faults.c — every fault point of the commands an operator runs, one
 * run each (SQLite's do_faultsim_test): `strait init`, `strait site
 * enroll` and `strait site join` run as the test build
 * (tests/faultsim/faultsim.h) with STRAIT_FAULT=main:KIND:ERR:k for k =
 * 1, 2, … until a run injects nothing. A run its fault failed says why in
 * one line and exits non-zero, never by a signal; what it left lets the
 * production binary run the same command to the end, and `strait db
 * check` finds the federation consistent. Then the calls a running
 * coordinator answers: every admin call behind `strait status`, `rounds`,
 * `site list` and `events`, and GetModel (a model served to a site). The
 * commit's fault points are walked in test_adversary.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "net/net.h"
#include "tests/harness.h"
#include "coordinator/coordinator.h"
#include "util/util.h"

static char *root, fed[600], addr[64];
static int coord = -1;

#define S(...) harness_strait(__VA_ARGS__)

static void teardown(void) {
    if (root == NULL) return;
    if (coord > 0) proc_stop(coord, 10000), coord = -1;
    harness_rmtree(root);
    free(root);
    root = NULL;
    net_global_shutdown();
}

TestSuite(faults, .fini = teardown, .timeout = 600);

static void setup_root(void) {
    net_global_init();
    root = harness_tmpdir("faults");
    snprintf(fed, sizeof fed, "%s/fed", root);
}

/* The faults each command is walked with. */
static const char *const kinds[] = {"alloc:enomem", "io:enospc", "sql:ioerr"};
#define N_KINDS (sizeof kinds / sizeof kinds[0])

typedef struct Run {
    ProcResult r;
    int injected;  /* faultsim lines on stderr */
    char why[512]; /* the one other line, when it failed */
} Run;

/* args (NULL-terminated, without the binary) run by the test build with
 * fault `kind` at call k of its main thread. */
static Run run_faulted(const char *kind, int k, const char *const *args) {
    char fault[64];
    snprintf(fault, sizeof fault, "main:%s:%d", kind, k);
    const char *argv[32] = {harness_strait_test_bin()};
    for (int i = 0; args[i] && i < 30; i++) argv[i + 1] = args[i]; /* NULL-terminated by the rest */
    setenv("STRAIT_FAULT", fault, 1);
    Run run = {proc_run((char *const *)argv), 0, ""};
    unsetenv("STRAIT_FAULT");
    int others = 0;
    for (char *line = run.r.err; line && *line;) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        if (strncmp(line, "faultsim: ", 10) == 0) {
            run.injected++;
        } else if (len > 0) {
            others++;
            snprintf(run.why, sizeof run.why, "%.*s", (int)len, line);
        }
        line = nl ? nl + 1 : line + len;
    }
    cr_assert_lt(run.r.status, 128, "%s %s at call %d: killed by signal %d:\n%s", args[0], kind, k,
                 run.r.status - 128, run.r.err);
    if (run.r.status != 0) {
        cr_assert_eq(others, 1, "%s %s at call %d: not one line of error:\n%s", args[0], kind, k,
                     run.r.err);
        cr_assert_eq(strncmp(run.why, "strait ", 7), 0, "%s", run.why);
    }
    return run;
}

static void db_check(const char *dir, const char *after) {
    ProcResult chk = S("db", "check", dir);
    cr_assert_eq(chk.status, 0, "strait db check after %s: %s%s", after, chk.out, chk.err);
    proc_result_free(&chk);
}

/* Whether `strait events DIR` lists an event whose line holds both words. */
static int has_event(const char *dir, const char *action, const char *detail) {
    ProcResult ev = S("events", dir, "--last", "100000");
    int found = 0;
    for (char *line = ev.out; ev.status == 0 && line && *line && !found;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        found = strstr(line, action) && strstr(line, detail);
        line = nl ? nl + 1 : NULL;
    }
    proc_result_free(&ev);
    return found;
}

/* What one command's walk found: runs its fault failed, runs that went on
 * past theirs, and fault points in all. */
typedef struct Walked {
    int failed, tolerated, points;
} Walked;

static void report(const char *what, const char *kind, Walked w) {
    cr_log_info("%s, %s: %d fault points, %d failed the command, %d gone past", what, kind,
                w.points, w.failed, w.tolerated);
}

/* ---- strait init ----------------------------------------------------------------- */

/* A failed init leaves no federation.ini (its presence marks a complete
 * federation), so init run again finishes it without --force. */
Test(faults, every_fault_point_of_init_leaves_a_folder_init_can_finish) {
    setup_root();
    for (size_t i = 0; i < N_KINDS; i++) {
        Walked w = {0, 0, 0};
        for (int k = 1; k <= 5000; k++) {
            char dir[700], ini[800], what[800];
            snprintf(dir, sizeof dir, "%s/init-%zu-%d", root, i, k);
            snprintf(ini, sizeof ini, "%s/federation.ini", dir);
            snprintf(what, sizeof what, "init with %s at call %d", kinds[i], k);
            const char *args[] = {"init", dir, "--listen", "127.0.0.1:0", "--model", "tiny", NULL};
            Run run = run_faulted(kinds[i], k, args);
            int injected = run.injected, ok = run.r.status == 0;
            proc_result_free(&run.r);
            if (injected == 0) {
                cr_assert(ok, "%s: failed with nothing injected: %s", what, run.why);
                db_check(dir, what);
                break;
            }
            w.points++;
            if (ok) { /* a write SQLite retries, or its checkpoint at close: the log is whole */
                w.tolerated++;
                cr_assert(has_event(dir, "federation.init", ""),
                          "%s succeeded without its audit event", what);
            } else {
                w.failed++;
                cr_assert_neq(access(ini, F_OK), 0, "%s failed (%s) but left federation.ini", what,
                              run.why);
                ProcResult again = S("init", dir, "--listen", "127.0.0.1:0", "--model", "tiny");
                cr_assert_eq(again.status, 0, "init after %s: %s", what, again.err);
                proc_result_free(&again);
            }
            db_check(dir, what);
            harness_rmtree(dir);
        }
        report("init", kinds[i], w);
        cr_assert_gt(w.failed, 0, "init with %s: nothing was made to fail", kinds[i]);
        if (strncmp(kinds[i], "sql", 3) != 0)
            cr_assert_eq(w.tolerated, 0, "init with %s: %d faults went unnoticed", kinds[i],
                         w.tolerated);
    }
}

/* ---- strait site enroll ----------------------------------------------------------- */

/* A failed enroll issued no token the operator saw; enroll run again
 * issues one, and the store stays consistent. */
Test(faults, every_fault_point_of_enroll_fails_it_whole) {
    setup_root();
    ProcResult r = S("init", fed, "--listen", harness_listen(), "--model", "tiny");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    for (size_t i = 0; i < N_KINDS; i++) {
        Walked w = {0, 0, 0};
        for (int k = 1; k <= 5000; k++) {
            char name[64], what[200];
            snprintf(name, sizeof name, "s%zu-%d", i, k);
            snprintf(what, sizeof what, "enroll with %s at call %d", kinds[i], k);
            const char *args[] = {"site", "enroll", fed, name, NULL};
            Run run = run_faulted(kinds[i], k, args);
            int injected = run.injected, ok = run.r.status == 0;
            proc_result_free(&run.r);
            if (injected == 0) {
                cr_assert(ok, "%s: failed with nothing injected: %s", what, run.why);
                break;
            }
            w.points++;
            if (ok) { /* a write SQLite retries, or its checkpoint at close: the log is whole */
                w.tolerated++;
                cr_assert(has_event(fed, "site.enroll", name), "%s succeeded without its event",
                          what);
            } else {
                w.failed++;
                ProcResult again = S("site", "enroll", fed, name);
                cr_assert_eq(again.status, 0, "enroll after %s: %s", what, again.err);
                proc_result_free(&again);
            }
            db_check(fed, what);
        }
        report("enroll", kinds[i], w);
        cr_assert_gt(w.failed, 0, "enroll with %s: nothing was made to fail", kinds[i]);
        if (strncmp(kinds[i], "sql", 3) != 0)
            cr_assert_eq(w.tolerated, 0, "enroll with %s: %d faults went unnoticed", kinds[i],
                         w.tolerated);
    }
}

/* ---- strait site join ------------------------------------------------------------- */

/* The token and CA fingerprint `strait site enroll` printed for name. */
static void enroll(const char *name, char token[65], char fp[65]) {
    ProcResult r = S("site", "enroll", fed, name);
    cr_assert_eq(r.status, 0, "enroll %s: %s", name, r.err);
    const char *nl = strchr(r.out, '\n'), *ca = strstr(r.out, "--ca-sha256 ");
    cr_assert(nl && strlen(nl + 1) >= 64 && ca && strlen(ca + 12) >= 64, "%s", r.out);
    memcpy(token, nl + 1, 64), token[64] = 0;
    memcpy(fp, ca + 12, 64), fp[64] = 0;
    proc_result_free(&r);
}

/* A join its fault failed leaves a site folder that a join with a fresh
 * token finishes (the operator enrolls the site again, revoking it first
 * in case the coordinator had answered the failed join); a site that
 * joined says hello. */
Test(faults, every_fault_point_of_join_leaves_a_site_that_can_join) {
    setup_root();
    ProcResult r = S("init", fed, "--listen", harness_listen(), "--model", "tiny");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    coord = harness_start_coordinator(fed, addr);
    cr_assert_gt(coord, 0, "the coordinator did not start");
    char join[300], err[ERR_LEN];
    cr_assert_eq(coordinator_join_address(fed, join, sizeof join, err), 0, "%s", err);
    for (size_t i = 0; i < N_KINDS; i++) {
        if (strncmp(kinds[i], "sql", 3) == 0) continue; /* a site keeps no store */
        Walked w = {0, 0, 0};
        for (int k = 1; k <= 5000; k++) {
            char name[64], dir[700], what[200], token[65], fp[65];
            snprintf(name, sizeof name, "j%zu-%d", i, k);
            snprintf(dir, sizeof dir, "%s/%s", root, name);
            snprintf(what, sizeof what, "join with %s at call %d", kinds[i], k);
            enroll(name, token, fp);
            const char *args[] = {"site",          "join",        dir,      "--name", name,
                                  "--coordinator", addr,          "--join", join,     "--token",
                                  token,           "--ca-sha256", fp,       NULL};
            Run run = run_faulted(kinds[i], k, args);
            int injected = run.injected, ok = run.r.status == 0;
            proc_result_free(&run.r);
            if (injected == 0) {
                cr_assert(ok, "%s: failed with nothing injected: %s", what, run.why);
                break;
            }
            w.points++;
            if (ok) {
                w.tolerated++;
            } else if (strstr(run.why, "joined, but the first hello failed")) {
                w.failed++; /* joined: the hello below is the test */
            } else {
                w.failed++;
                /* as the error says: enrolled again (revoked first, should the
                 * coordinator have answered the join), then joined */
                ProcResult rv = S("site", "revoke", fed, name);
                proc_result_free(&rv);
                enroll(name, token, fp);
                ProcResult again = S("site", "join", dir, "--name", name, "--coordinator", addr,
                                     "--join", join, "--token", token, "--ca-sha256", fp);
                cr_assert_eq(again.status, 0, "join after %s: %s", what, again.err);
                proc_result_free(&again);
            }
            ProcResult hello = S("site", "hello", dir);
            cr_assert_eq(hello.status, 0, "hello after %s: %s", what, hello.err);
            proc_result_free(&hello);
            harness_rmtree(dir);
        }
        report("join", kinds[i], w);
        cr_assert_gt(w.failed, 0, "join with %s: nothing was made to fail", kinds[i]);
        cr_assert_eq(w.tolerated, 0, "join with %s: %d faults went unnoticed", kinds[i],
                     w.tolerated);
    }
    db_check(fed, "the joins");
}

/* ---- the admin API, in a running coordinator ---------------------------------- */

/* The last "faultsim: SCOPE attempt A: C calls, F failed" line of log:
 * its F (-1 when there is none), and A in *attempt. */
static int last_attempt(const char *log, const char *scope, long long *attempt) {
    char *text = NULL, err[ERR_LEN], want[64];
    size_t len;
    int failed = -1;
    snprintf(want, sizeof want, "faultsim: %s attempt ", scope);
    if (file_read_all(log, 64 << 20, &text, &len, err) != 0) return -1;
    for (char *p = strstr(text, want); p; p = strstr(p + 1, want)) {
        long long a, calls, f;
        if (sscanf(p + strlen(want), "%lld: %lld calls, %lld failed", &a, &calls, &f) == 3)
            failed = (int)f, *attempt = a;
    }
    free(text);
    return failed;
}

/* Every allocation of the admin calls behind one command: the coordinator
 * runs as the test build with admin:alloc:enomem, so its a-th admin call
 * fails at its a-th allocation; the command (the production binary) runs
 * until a call it makes injects nothing. Each run prints what it should or
 * fails with one line; the coordinator answers the next call, keeps
 * running, and stops cleanly at the end. */
static void walk_admin(const char *what, const char *const *args, const char *expect) {
    char log[700], fault[] = "admin:alloc:enomem";
    snprintf(log, sizeof log, "%s/admin-%s.log", root, args[0]);
    setenv("STRAIT_FAULT", fault, 1);
    setenv("STRAIT_FAULT_LOG", log, 1);
    harness_use_test_build(1);
    coord = harness_start_coordinator(fed, addr);
    harness_use_test_build(0);
    unsetenv("STRAIT_FAULT");
    unsetenv("STRAIT_FAULT_LOG");
    cr_assert_gt(coord, 0, "the test build's coordinator did not start");
    Walked w = {0, 0, 0};
    for (int run = 1;; run++) {
        cr_assert_leq(run, 3000, "%s: its calls still fail after 3000 runs", what);
        const char *argv[16] = {harness_strait_bin()};
        for (int i = 0; args[i] && i < 14; i++) argv[i + 1] = args[i];
        ProcResult r = proc_run((char *const *)argv);
        cr_assert_lt(r.status, 2, "%s, run %d: status %d: %s", what, run, r.status, r.err);
        if (r.status == 0) {
            cr_assert_not_null(strstr(r.out, expect), "%s, run %d: printed without '%s':\n%s", what,
                               run, expect, r.out);
        } else {
            w.failed++;
            cr_assert_null(strstr(r.err, "without a message"),
                           "%s, run %d: a failed call answered OK and empty: %s", what, run, r.err);
            size_t n = strlen(r.err);
            cr_assert(n > 0 && strchr(r.err, '\n') == r.err + n - 1 &&
                          strncmp(r.err, "strait ", 7) == 0,
                      "%s, run %d: not one line of error:\n%s", what, run, r.err);
        }
        int st;
        cr_assert_eq(proc_ended(coord, &st), 0, "%s, run %d: the coordinator ended (%d)", what, run,
                     st);
        long long attempt = 0;
        int failed = last_attempt(log, "admin", &attempt);
        proc_result_free(&r);
        if (r.status == 0 && failed == 0) {
            w.points = (int)attempt;
            break;
        }
    }
    cr_log_info("%s: %d admin calls walked, %d runs failed", what, w.points, w.failed);
    cr_assert_gt(w.failed, 0, "%s: no fault failed a run", what);
    cr_assert_eq(proc_stop(coord, 20000), 0, "%s: the coordinator did not stop cleanly", what);
    coord = -1;
    db_check(fed, what);
}

Test(faults, every_allocation_of_an_admin_call_fails_that_call_alone) {
    setup_root();
    ProcResult r = S("init", fed, "--listen", harness_listen(), "--model", "tiny");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    /* a site that joined, for the lists to hold */
    coord = harness_start_coordinator(fed, addr);
    cr_assert_gt(coord, 0);
    char site_dir[700];
    snprintf(site_dir, sizeof site_dir, "%s/site-a", root);
    harness_enroll_join(fed, addr, "site-a", site_dir);
    cr_assert_eq(proc_stop(coord, 20000), 0);
    coord = -1;
    const char *status[] = {"status", fed, "--json", NULL};
    walk_admin("strait status", status, "\"running\":true");
    const char *rounds[] = {"rounds", fed, "--json", NULL};
    walk_admin("strait rounds", rounds, "\"round\":0");
    const char *sites[] = {"site", "list", fed, NULL};
    walk_admin("strait site list", sites, "site-a");
    const char *events[] = {"events", fed, NULL};
    walk_admin("strait events", events, "site.enroll");
}

/* ---- a model served: GetModel ----------------------------------------------------- */

/* A demo federation whose coordinator (the test build, as are all its
 * processes) fails its a-th GetModel at that call's a-th allocation: each
 * site that was refused a download asks again, every round commits, and
 * the demo ends well. */
Test(faults, every_allocation_of_a_model_served_fails_that_download_alone) {
    setup_root();
    char dir[700], log[700], summary[800];
    snprintf(dir, sizeof dir, "%s/demo", root);
    snprintf(log, sizeof log, "%s/serve.log", root);
    snprintf(summary, sizeof summary, "%s/summary.json", dir);
    setenv("STRAIT_FAULT", "serve:alloc:enomem", 1);
    setenv("STRAIT_FAULT_LOG", log, 1);
    const char *argv[] = {harness_strait_test_bin(),
                          "demo",
                          "--sites",
                          "2",
                          "--rounds",
                          "3",
                          "--steps",
                          "5",
                          "--model",
                          "tiny",
                          "--dir",
                          dir,
                          NULL};
    ProcResult r = proc_run((char *const *)argv);
    unsetenv("STRAIT_FAULT");
    unsetenv("STRAIT_FAULT_LOG");
    cr_assert_eq(r.status, 0, "the demo under serve faults: %s", r.err);
    proc_result_free(&r);
    long long attempt = 0;
    cr_assert_eq(last_attempt(log, "serve", &attempt), 0, "the last download still failed");
    char *text = NULL, err[ERR_LEN];
    size_t len;
    cr_assert_eq(file_read_all(log, 1 << 20, &text, &len, err), 0, "%s", err);
    int refused = 0;
    for (char *p = strstr(text, " 1 failed, answered"); p; p = strstr(p + 1, " 1 failed, answered"))
        refused++;
    free(text);
    cr_log_info("GetModel: %lld calls served, %d refused by a fault", attempt, refused);
    cr_assert_gt(refused, 0, "no download was made to fail");
    cr_assert_eq(access(summary, F_OK), 0, "the demo wrote no summary");
    char fed_dir[800];
    snprintf(fed_dir, sizeof fed_dir, "%s/fed", dir);
    ProcResult rounds = S("rounds", fed_dir, "--json");
    cr_assert_eq(rounds.status, 0, "%s", rounds.err);
    int committed = 0;
    for (char *p = strstr(rounds.out, "\"state\":\"committed\""); p;
         p = strstr(p + 1, "\"state\":\"committed\""))
        committed++;
    cr_assert_eq(committed, 3, "%d rounds committed:\n%s", committed, rounds.out);
    proc_result_free(&rounds);
    db_check(fed_dir, "the demo under serve faults");
}
