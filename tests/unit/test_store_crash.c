/*
 * test_store_crash.c — the commit protocol under real crashes and real
 * concurrency: a writer process committing rounds in a loop is killed with
 * SIGKILL at random instants, and after every kill the store must pass
 * integrity_check and hold every committed round whole, with its checkpoint
 * intact; a read-only process polling while a writer commits never sees
 * an error or a half-committed round; and a prune (retention) killed at
 * each of its points in turn resumes: the store keeps every file it names,
 * and the next start and prune end at the policy's files.
 */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "coordinator/store.h"
#include "tests/faultsim/faultsim.h"
#include "tests/harness.h"
#include "tests/store_fixture.h"
#include "util/util.h"

enum { SITES = 3, TOKENS_PER_SITE = 100 };

/* The coordinator's loop, reduced to the store's part of it: recover, then
 * for each round open it, record the sites' updates, write the checkpoint,
 * commit. Runs until killed or `max_rounds` are committed. */
static void writer_loop(const char *home, const char *db_path, int max_rounds) {
    char err[ERR_LEN];
    Store *s = store_open(db_path, STORE_READWRITE, err);
    if (s == NULL) _exit(10);
    StoreRecovery rep;
    if (store_recover(s, home, time_wall_ms(), &rep, err) != 0) _exit(11);
    StoreFixture fx; /* only its checkpoint writer is used */
    memset(&fx, 0, sizeof fx);
    fx.home = (char *)home;
    StoreRound last;
    int rc = store_round_last_committed(s, &last, err);
    if (rc < 0) _exit(12);
    int64_t next = rc == STORE_NOT_FOUND ? 0 : last.number + 1;
    for (int done = 0; done < max_rounds; done++, next++) {
        int64_t rid;
        if (store_round_open(s, next, time_wall_ms(), &rid, err) != 0) _exit(13);
        for (int site = 1; site <= SITES; site++) {
            StoreUpdate u;
            memset(&u, 0, sizeof u);
            u.round_id = rid;
            u.site_id = site;
            strcpy(u.codec, "int8");
            u.raw_bytes = 4096, u.wire_bytes = 1024 + site, u.tokens = TOKENS_PER_SITE;
            u.train_loss = 2.0 + site, u.eval_loss = NAN;
            strcpy(u.state, "received");
            u.received_at = time_wall_ms();
            if (store_update_record(s, &u, NULL, err) != 0) _exit(14);
        }
        if (store_round_aggregating(s, rid, err) != 0) _exit(15);
        StoreCheckpoint ck;
        store_fixture_write_checkpoint(&fx, next, NULL, &ck);
        if (store_round_commit(s, rid, &ck, 1.5, 100, time_wall_ms(), err) != 0) _exit(16);
    }
    store_close(s);
    _exit(0);
}

static void add_sites(StoreFixture *fx) {
    char err[ERR_LEN], name[16];
    for (int i = 1; i <= SITES; i++) {
        snprintf(name, sizeof name, "site%d", i);
        int64_t id;
        cr_assert_eq(store_site_add(fx->store, name, 1, &id, err), 0, "%s", err);
        cr_assert_eq(id, i);
    }
}

/* Everything a committed round must be: whole, with its updates accepted
 * and its checkpoint the right bytes. Returns the last committed number. */
static int64_t assert_consistent(Store *s, const char *home, int kill_no) {
    char err[ERR_LEN];
    StoreCheck chk;
    cr_assert_eq(store_check(s, home, &chk, NULL, NULL, err), 0, "%s", err);
    cr_assert(chk.integrity_ok, "kill %d: integrity_check: %s", kill_no, chk.integrity);
    cr_assert_eq(chk.checkpoints_bad, 0, "kill %d: a committed checkpoint is damaged", kill_no);
    cr_assert_eq(chk.rounds_committed, chk.last_committed + 1,
                 "kill %d: committed rounds have a gap", kill_no);
    for (int64_t n = 0; n <= chk.last_committed; n++) {
        StoreRound r;
        cr_assert_eq(store_round_get(s, n, &r, err), 0);
        cr_assert_str_eq(r.state, "committed");
        cr_assert_eq(r.participants, SITES, "kill %d: round %lld has %lld participants", kill_no,
                     (long long)n, (long long)r.participants);
        cr_assert_eq(r.tokens, SITES * TOKENS_PER_SITE);
        cr_assert(store_fixture_checkpoint_matches(home, r.checkpoint_path, n),
                  "kill %d: checkpoint of round %lld has the wrong bytes", kill_no, (long long)n);
        StoreUpdate *ups;
        size_t nu;
        cr_assert_eq(store_updates_list(s, r.id, &ups, &nu, err), 0);
        cr_assert_eq(nu, SITES);
        for (size_t i = 0; i < nu; i++) cr_assert_str_eq(ups[i].state, "accepted");
        free(ups);
    }
    return chk.last_committed;
}

/* Polls the store (read-only) until a round after `last` is committed,
 * for at most 30 s. */
static void wait_for_commit_after(const char *db, int64_t last) {
    char err[ERR_LEN];
    for (int i = 0; i < 30000; i++) {
        Store *s = store_open(db, STORE_READONLY, err);
        StoreRound r;
        int done = s && store_round_last_committed(s, &r, err) == 0 && r.number > last;
        if (s) store_close(s);
        if (done) return;
        usleep(1000);
    }
}

Test(store_crash, sigkill_at_random_instants_loses_no_committed_round, .timeout = 300) {
    enum { KILLS = 60 };
    StoreFixture fx;
    store_fixture_init(&fx, "crash");
    add_sites(&fx);
    store_close(fx.store);
    fx.store = NULL;
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    int64_t last = -1, progressed = 0;
    char err[ERR_LEN];
    for (int k = 0; k < KILLS; k++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) writer_loop(fx.home, fx.db_path, 1 << 30);
        /* every other kill waits until the writer has committed a round of
         * its own, so a loaded machine (where a few ms of wall time may be
         * no CPU time at all) still tests kills after progress */
        if (k % 2 == 0) wait_for_commit_after(fx.db_path, last);
        /* 1-40 ms: long enough to land anywhere in a commit, including the
         * first ones after recovery */
        usleep((useconds_t)(rand() % 40000 + 1000));
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        cr_assert(WIFSIGNALED(st), "kill %d (seed %u): the writer exited with %d before the kill",
                  k, seed, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        Store *s = store_open(fx.db_path, STORE_READWRITE, err);
        cr_assert_not_null(s, "kill %d: %s", k, err);
        int64_t now_last = assert_consistent(s, fx.home, k);
        cr_assert_geq(now_last, last, "kill %d: committed rounds went back from %lld to %lld", k,
                      (long long)last, (long long)now_last);
        progressed += now_last > last;
        last = now_last;
        store_close(s);
    }
    /* After the last kill, recovery leaves no live round and no orphan. */
    Store *s = store_open(fx.db_path, STORE_READWRITE, err);
    cr_assert_not_null(s);
    StoreRecovery rep;
    cr_assert_eq(store_recover(s, fx.home, time_wall_ms(), &rep, err), 0, "%s", err);
    StoreRound live;
    cr_assert_eq(store_round_live(s, &live, err), STORE_NOT_FOUND);
    assert_consistent(s, fx.home, KILLS);
    store_close(s);
    cr_assert_gt(progressed, KILLS / 4, "the writer rarely committed; the test proved little");
    cr_log_info("store crash test: %d kills survived, %lld rounds committed, seed %u", KILLS,
                (long long)last + 1, seed);
    fprintf(stderr, "store crash test: %d kills survived, %lld rounds committed (seed %u)\n", KILLS,
            (long long)last + 1, seed);
    store_fixture_fini(&fx);
}

Test(store_crash, reader_never_sees_an_error_or_a_partial_round, .timeout = 120) {
    enum { ROUNDS = 150 };
    StoreFixture fx;
    store_fixture_init(&fx, "reader");
    add_sites(&fx);
    store_close(fx.store);
    fx.store = NULL;
    pid_t writer = fork();
    cr_assert_geq(writer, 0);
    if (writer == 0) writer_loop(fx.home, fx.db_path, ROUNDS);

    pid_t reader = fork();
    cr_assert_geq(reader, 0);
    if (reader == 0) {
        char err[ERR_LEN];
        Store *s = store_open(fx.db_path, STORE_READONLY, err);
        if (s == NULL) _exit(20);
        int64_t seen = -1;
        uint64_t deadline = time_monotonic_ns() + 100ull * 1000000000ull;
        while (seen < ROUNDS - 1 && time_monotonic_ns() < deadline) {
            StoreRound *list;
            size_t n;
            if (store_rounds_list(s, 5, 0, &list, &n, err) != 0) _exit(21);
            for (size_t i = 0; i < n; i++) {
                StoreRound *r = &list[i];
                if (strcmp(r->state, "committed") != 0) continue;
                /* a committed round is visible whole or not at all */
                if (r->participants != SITES || r->tokens != SITES * TOKENS_PER_SITE ||
                    r->checkpoint_sha256[0] == '\0' || isnan(r->train_loss))
                    _exit(22);
                if (!store_fixture_checkpoint_matches(fx.home, r->checkpoint_path, r->number))
                    _exit(23);
                if (r->number > seen) seen = r->number;
            }
            free(list);
        }
        store_close(s);
        _exit(seen == ROUNDS - 1 ? 0 : 24);
    }
    int st;
    cr_assert_eq(waitpid(writer, &st, 0), writer);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer failed: %d", st);
    cr_assert_eq(waitpid(reader, &st, 0), reader);
    cr_assert(WIFEXITED(st), "reader crashed");
    cr_assert_eq(WEXITSTATUS(st), 0,
                 "reader saw: 20 open failed, 21 query error, 22 partial round, 23 wrong "
                 "checkpoint bytes, 24 never saw the last round (got %d)",
                 WEXITSTATUS(st));
    store_fixture_fini(&fx);
}

/* A prune killed (SIGKILL, tests/faultsim/faultsim.h's FAULT_KILL) at its
 * k-th file call or SQLite write, for every k until one runs to its end:
 * after each kill every checkpoint and state the store keeps is whole
 * (`strait db check`'s verdict), what it marked pruned and the kill left is
 * removed by the next start (store_recover), nothing kept is, and a prune
 * then ends at exactly the files the policy names. */
Test(store_crash, a_prune_killed_at_every_point_resumes, .timeout = 300) {
    StoreRetention p = {.keep_last = 2, .keep_every = 3, .keep_back = 1};
    const uint64_t kept = 1u << 0 | 1u << 3 | 1u << 6 | 1u << 7;
    int points = 0;
    for (int k = 1; k <= 500; k++) {
        StoreFixture fx;
        store_fixture_init(&fx, "prune-kill");
        store_fixture_commit_rounds(&fx, 0, 8, 1);
        store_close(fx.store);
        fx.store = NULL;
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            char err[ERR_LEN];
            Store *s = store_open(fx.db_path, STORE_READWRITE, err);
            if (s == NULL) _exit(10);
            StorePruneReport rep;
            faultsim_arm(FAULT_KILL, k, 0, 0);
            int rc = store_prune(s, fx.home, &p, 5000, &rep, err);
            faultsim_disarm(NULL);
            _exit(rc == 0 ? 0 : 11);
        }
        int st;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        int killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
        cr_assert(killed || (WIFEXITED(st) && WEXITSTATUS(st) == 0), "kill at %d: status %d", k,
                  st);
        char err[ERR_LEN];
        Store *s = store_open(fx.db_path, STORE_READWRITE, err);
        cr_assert_not_null(s, "kill at %d: %s", k, err);
        StoreCheck chk;
        cr_assert_eq(store_check(s, fx.home, &chk, NULL, NULL, err), 0, "%s", err);
        cr_assert(chk.integrity_ok, "kill at %d: %s", k, chk.integrity);
        cr_assert_eq(chk.checkpoints_bad, 0, "kill at %d: a file the store keeps is gone", k);
        StoreRecovery rec;
        cr_assert_eq(store_recover(s, fx.home, 6000, &rec, err), 0, "%s", err);
        cr_assert_eq(store_check(s, fx.home, &chk, NULL, NULL, err), 0, "%s", err);
        cr_assert_eq(chk.prunes_pending, 0, "kill at %d: recovery left a pruned file", k);
        uint64_t models, states;
        store_fixture_files(fx.home, &models, &states);
        cr_assert_eq(models & kept, kept, "kill at %d: a kept checkpoint is gone", k);
        cr_assert(states & 1u << 7, "kill at %d: the newest round's outer state is gone", k);
        StorePruneReport rep;
        cr_assert_eq(store_prune(s, fx.home, &p, 7000, &rep, err), 0, "%s", err);
        store_fixture_files(fx.home, &models, &states);
        cr_assert_eq(models, kept, "kill at %d: models %#llx", k, (unsigned long long)models);
        cr_assert_eq(states, 1u << 7, "kill at %d: states %#llx", k, (unsigned long long)states);
        store_close(s);
        store_fixture_fini(&fx);
        if (!killed) break; /* past its last point: the prune ran whole */
        points++;
    }
    cr_assert_gt(points, 10, "the prune was killed at %d points only", points);
    cr_log_info("a prune killed at each of its %d points resumed", points);
}
