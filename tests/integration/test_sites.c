/*
 * test_sites.c — a site of several ranks under Open MPI's mpirun (real
 * processes: a coordinator, `strait site run` launched by mpirun, real
 * TLS, a real store). Two ranks train as one rank with twice the batch
 * would; a federation of a two-rank and a one-rank site commits its
 * rounds; a rank killed mid-round stops the site, the launcher names it,
 * and the site restarted under mpirun resumes from its saved state. Skipped
 * (with the reason) where this strait has no MPI or mpirun is missing.
 *
 * Under the sanitizers the ranks run without the leak check (the rest of
 * ASan stays on): Open MPI keeps allocations past MPI_Finalize in plugins it
 * has unloaded by then, whose stacks LeakSanitizer cannot read, so no
 * suppression can name them. The one-process sites of the other suites keep
 * it.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "coordinator/store.h"
#include "kernels/device.h"
#include "kernels/formats.h"
#include "kernels/model.h"
#include "tests/harness.h"
#include "tests/store_fixture.h"
#include "util/util.h"

#define DATA "/usr/share/games/fortunes/fortunes"
/* what every command of a rank starts with (see the comment above) */
#define RANK_ENV "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" STRAIT_LOG=info "

static char *root;
static int coord = -1;

static void teardown(void) {
    if (coord > 0) proc_stop(coord, 10000), coord = -1;
    if (root) harness_rmtree(root), free(root), root = NULL;
}

TestSuite(sites, .fini = teardown, .timeout = 300);

static void need_mpi(void) {
    if (!kernels_build_caps().mpi) cr_skip_test("this strait is built without MPI");
    if (system("command -v mpirun >/dev/null 2>&1") != 0) cr_skip_test("no mpirun on PATH");
}

/* A federation in root/NAME with its coordinator started; returns its folder. */
static char *federation(const char *name, const char *recipe, const char *total,
                        const char *min_sites, const char *inner_steps, char *addr) {
    char *fed = malloc(800);
    snprintf(fed, 800, "%s/%s", root, name);
    ProcResult r = harness_strait("init", fed, "--listen", harness_listen(), "--model", "tiny",
                                  "--recipe", recipe);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    char ini[900];
    snprintf(ini, sizeof ini, "%s/federation.ini", fed);
    harness_ini_set(ini, "rounds", "total", total);
    harness_ini_set(ini, "rounds", "min_sites", min_sites);
    harness_ini_set(ini, "rounds", "deadline", "600s");
    harness_ini_set(ini, "rounds", "inner_steps", inner_steps);
    /* long rounds of a tiny model move it far: no norm bound refuses them */
    harness_ini_set(ini, "rounds", "max_update_ratio", "0");
    coord = harness_start_coordinator(fed, addr);
    cr_assert_gt(coord, 0, "the coordinator of %s did not start", fed);
    return fed;
}

static void enroll_join(const char *fed, const char *addr, const char *name, char *dir) {
    snprintf(dir, 800, "%s/%s", root, name);
    harness_enroll_join(fed, addr, name, dir);
}

/* `strait site run DIR` on `ranks` ranks (1: no launcher) with batch B
 * and the flags in extra, stdout and stderr together; blocks until it ends. */
static ProcResult run_site(const char *dir, int ranks, int batch, const char *extra) {
    char cmd[3000];
    snprintf(cmd, sizeof cmd,
             RANK_ENV "%s '%s' site run '%s' --data " DATA
                      " --threads 1 --seed 7 --batch %d %s 2>&1",
             ranks > 1 ? "exec mpirun --allow-run-as-root --oversubscribe -np 2" : "exec",
             harness_strait_bin(), dir, batch, extra);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    return proc_run(argv);
}

/* The site's pseudo-gradient of round 0 through FedAvg (fp32 up, outer lr 1:
 * θ1 = θ0 − Δ exactly): 2 ranks of batch 4 against 1 of batch 8, the same
 * data order. Their sums are added in another order, so the floats differ;
 * the stated tolerance is on the update: ‖θ1ᵃ − θ1ᵇ‖ ≤ 1e-4 ‖θ1ᵇ − θ0‖
 * (measured: 5e-6). */
Test(sites, two_ranks_train_as_one_rank_with_twice_the_batch) {
    need_mpi();
    root = harness_tmpdir("sites");
    char addr[64], dir[800];
    char *fed_a = federation("a", "fedavg", "1", "1", "12", addr);
    enroll_join(fed_a, addr, "two", dir);
    ProcResult r = run_site(dir, 2, 4, "");
    cr_assert_eq(r.status, 0, "the 2-rank site failed: %s", r.out);
    cr_assert_not_null(strstr(r.out, "rank 1 of 2"), "%s", r.out);
    proc_result_free(&r);
    StoreRound ra = store_fixture_wait_committed(fed_a, 0, 60);
    proc_stop(coord, 10000), coord = -1;
    char *fed_b = federation("b", "fedavg", "1", "1", "12", addr);
    enroll_join(fed_b, addr, "one", dir);
    r = run_site(dir, 1, 8, "");
    cr_assert_eq(r.status, 0, "the 1-rank site failed: %s", r.out);
    proc_result_free(&r);
    StoreRound rb = store_fixture_wait_committed(fed_b, 0, 60);
    cr_assert_eq(ra.tokens, rb.tokens, "2 ranks of 4 trained %lld tokens, 1 of 8 %lld",
                 (long long)ra.tokens, (long long)rb.tokens);
    Model a, b, m0;
    store_fixture_load_tiny(fed_a, ra.checkpoint_path, &a);
    store_fixture_load_tiny(fed_b, rb.checkpoint_path, &b);
    ModelConfig cfg;
    model_config_preset("tiny", &cfg);
    char err[ERR_LEN];
    cr_assert_eq(model_build(&m0, &cfg, 1, err), 0); /* federation.ini's seed: θ0 */
    double diff = 0, step = 0;
    for (size_t i = 0; i < a.n_params; i++) {
        double d = (double)a.params[i] - b.params[i], u = (double)b.params[i] - m0.params[i];
        diff += d * d, step += u * u;
    }
    cr_log_info("2 ranks vs 1 rank x 2: |θa - θb| = %.3g of an update of %.3g", sqrt(diff),
                sqrt(step));
    cr_assert_gt(step, 0, "the round did not move the model");
    cr_assert_leq(sqrt(diff), 1e-4 * sqrt(step), "2 ranks: %.3g away, the update is %.3g",
                  sqrt(diff), sqrt(step));
    model_free(&a), model_free(&b), model_free(&m0);
    free(fed_a), free(fed_b);
}

/* ZeRO-1 (the default on CPU ranks) against every rank keeping the whole
 * optimizer state (--zero 0): each rank updates its share of the model
 * from the same sums, so two rounds of a two-rank site (AdamW's moments
 * carried from the first to the second) commit the same model to the bit,
 * and the state each saved (the sharded one written by rank 0 from every
 * rank's share, piece by piece) is the same file byte for byte. */
Test(sites, sharded_optimizer_state_takes_the_same_steps_as_the_whole) {
    need_mpi();
    root = harness_tmpdir("sites");
    char addr[64], dir[2][800];
    StoreRound got[2];
    char *fed[2];
    const char *zero[2] = {"1", "0"}, *flag[2] = {"--zero 1", "--zero 0"};
    for (int k = 0; k < 2; k++) {
        fed[k] = federation(k ? "whole" : "zero", "fedavg", "2", "1", "8", addr);
        enroll_join(fed[k], addr, k ? "w" : "z", dir[k]);
        ProcResult r = run_site(dir[k], 2, 4, flag[k]);
        cr_assert_eq(r.status, 0, "the 2-rank site (--zero %s) failed: %s", zero[k], r.out);
        const char *said = strstr(r.out, "keeps AdamW's moments of");
        cr_assert(k ? said == NULL : said != NULL, "--zero %s: %s", zero[k], r.out);
        if (!k) /* each rank its own half: the shares are whole blocks of 4096 */
            cr_assert(strstr(r.out, "rank 1 of 2 keeps"), "%s", r.out);
        proc_result_free(&r);
        got[k] = store_fixture_wait_committed(fed[k], 1, 60);
        proc_stop(coord, 10000), coord = -1;
    }
    Model a, b;
    store_fixture_load_tiny(fed[0], got[0].checkpoint_path, &a);
    store_fixture_load_tiny(fed[1], got[1].checkpoint_path, &b);
    cr_assert_eq(memcmp(a.params, b.params, a.n_params * sizeof(float)), 0,
                 "ZeRO-1 and the whole state committed different models after two rounds");
    model_free(&a), model_free(&b);
    char *opt[2], path[1700], err[ERR_LEN];
    size_t len[2];
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/state/inner.opt.safetensors", dir[k]);
        cr_assert_eq(file_read_all(path, 1 << 26, &opt[k], &len[k], err), 0, "%s", err);
    }
    cr_assert(len[0] == len[1] && memcmp(opt[0], opt[1], len[0]) == 0,
              "the saved moments differ (%zu and %zu bytes)", len[0], len[1]);
    free(opt[0]), free(opt[1]);
    free(fed[0]), free(fed[1]);
}

Test(sites, a_two_rank_site_and_a_one_rank_site_commit_their_rounds) {
    need_mpi();
    root = harness_tmpdir("sites");
    char addr[64], d2[800], d1[800];
    char *fed = federation("f", "diloco", "2", "2", "10", addr);
    enroll_join(fed, addr, "two", d2);
    enroll_join(fed, addr, "one", d1);
    char cmd[3000];
    snprintf(cmd, sizeof cmd,
             "exec '%s' site run '%s' --data /usr/share/games/fortunes/literature --threads 1 "
             "--batch 4 >/dev/null 2>&1",
             harness_strait_bin(), d1);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    int fd;
    int one = proc_spawn(argv, &fd);
    close(fd);
    ProcResult r = run_site(d2, 2, 4, "");
    cr_assert_eq(r.status, 0, "the 2-rank site failed: %s", r.out);
    proc_result_free(&r);
    int st;
    cr_assert_eq(waitpid(one, &st, 0), one);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the 1-rank site exited with %d", st);
    for (int n = 0; n < 2; n++) {
        StoreRound rr = store_fixture_wait_committed(fed, n, 60);
        cr_assert_eq(rr.participants, 2, "round %d: %lld sites", n, (long long)rr.participants);
    }
    free(fed);
}

/* Reads lines of fd until one holds `what` (within timeout_ms); 1 found. */
static int read_until(int fd, const char *what, char *line, size_t len, int timeout_ms) {
    while (proc_read_line(fd, line, len, timeout_ms) >= 0)
        if (strstr(line, what)) return 1;
    return 0;
}

Test(sites, a_killed_rank_stops_the_site_which_resumes_when_restarted) {
    need_mpi();
    root = harness_tmpdir("sites");
    char addr[64], dir[800];
    char *fed = federation("k", "diloco", "3", "1", "400", addr);
    enroll_join(fed, addr, "two", dir);
    char cmd[3000];
    snprintf(cmd, sizeof cmd,
             RANK_ENV "exec mpirun --allow-run-as-root --oversubscribe -np 2 '%s' site run "
                      "'%s' --data " DATA " --threads 1 --seed 7 --batch 4 2>&1",
             harness_strait_bin(), dir);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    int fd;
    int job = proc_spawn(argv, &fd);
    char line[1024];
    cr_assert(read_until(fd, "rank 1 of 2 (pid ", line, sizeof line, 60000), "no rank 1");
    int victim = atoi(strstr(line, "(pid ") + 5);
    cr_assert_gt(victim, 1);
    /* round 0 committed and its state saved: then a rank goes, mid-round 1 */
    cr_assert(read_until(fd, "round 1: model sha256", line, sizeof line, 120000),
              "the site never reached round 1");
    kill(victim, SIGKILL);
    /* the launcher ends the site and names the rank it lost */
    char said[8192] = "";
    size_t at = 0;
    while (proc_read_line(fd, line, sizeof line, 60000) >= 0 && at < sizeof said - 1100)
        at += (size_t)snprintf(said + at, sizeof said - at, "%s\n", line);
    close(fd);
    int st;
    cr_assert_eq(waitpid(job, &st, 0), job);
    cr_assert(!(WIFEXITED(st) && WEXITSTATUS(st) == 0), "the site went on without a rank");
    /* mpirun's own words (the site's "rank 1 of 2" line came before the kill) */
    cr_assert_not_null(strstr(said, "process rank 1"),
                       "the launcher did not name the lost rank: %s", said);
    /* restarted under mpirun: it resumes and finishes the federation */
    ProcResult r = run_site(dir, 2, 4, "");
    cr_assert_eq(r.status, 0, "the restarted site failed: %s", r.out);
    cr_assert_not_null(strstr(r.out, "resumed its saved state"), "%s", r.out);
    proc_result_free(&r);
    StoreRound r2 = store_fixture_wait_committed(fed, 2, 60);
    cr_assert_eq(r2.participants, 1);
    free(fed);
}
