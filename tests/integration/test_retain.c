/*
 * test_retain.c — a long federation's disk, with real processes: many
 * short rounds under [store] keep_last = 2, keep_every = 5 keep exactly the
 * checkpoints the policy names and the newest round's outer state alone;
 * `strait db check` passes and counts what was pruned on purpose; `strait
 * status` shows the disk; an old kept round exports and a pruned one is
 * refused in one line; a site some rounds behind still takes the chain of
 * deltas; a site's folder holds one state whatever the rounds; async rounds
 * keep their `staleness` models; a coordinator killed inside its prunes
 * resumes; and one whose folder's free space (faked in the test build,
 * STRAIT_TEST_DISK_FREE) holds fewer than five commits warns, in one line
 * and in its status, before any commit fails.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>

#include "compress/compress.h"
#include "coordinator/store.h"
#include "kernels/model.h"
#include "net/net.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"
#include "tests/attacker.h"
#include "tests/harness.h"
#include "tests/store_fixture.h"
#include "util/util.h"

static char *root, fed[600], addr[64], log_path[700];
static int coord = -1, site_pid = -1;

#define S(...) harness_strait(__VA_ARGS__)
#define BIT(n) (1ull << (n))

static void ini(const char *section, const char *key, const char *value) {
    char path[700];
    snprintf(path, sizeof path, "%s/federation.ini", fed);
    harness_ini_set(path, section, key, value);
}

/* The coordinator with its stderr in log_path; the pid, or -1 when it
 * ended before it said where it listens (a kill at its start). */
static int spawn_coordinator(void) {
    char *argv[] = {(char *)harness_strait_bin(), "coordinator", "start", fed, NULL};
    int fd;
    int pid = proc_start(argv, &(ProcIo){.log = log_path, .out_fd = &fd});
    cr_assert_gt(pid, 0);
    char line[256];
    int got = proc_read_line(fd, line, sizeof line, 60000);
    close(fd);
    const char *p = got > 0 ? strstr(line, "port ") : NULL;
    if (p == NULL) {
        proc_wait(pid);
        return -1;
    }
    if (addr[0] == '\0') { /* restarts keep the port the site knows */
        snprintf(addr, sizeof addr, "127.0.0.1:%d", atoi(p + 5));
        ini("federation", "listen", addr);
    }
    return pid;
}

static void setup_federation(const char *total) {
    net_global_init();
    root = harness_tmpdir("retain");
    snprintf(fed, sizeof fed, "%s/fed", root);
    snprintf(log_path, sizeof log_path, "%s/coordinator.log", root);
    addr[0] = '\0';
    ProcResult r = S("init", fed, "--listen", harness_listen(), "--model", "tiny");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    ini("rounds", "total", total);
    ini("rounds", "min_sites", "1");
    ini("rounds", "deadline", "60s");
    ini("rounds", "inner_steps", "2");
    ini("store", "keep_last", "2");
    ini("store", "keep_every", "5");
}

static void join_site(void) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/s0", root);
    harness_enroll_join(fed, addr, "s0", dir);
}

static void run_site(void) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/s0", root);
    char *argv[] = {(char *)harness_strait_bin(),         "site",      "run", dir, "--data",
                    "/usr/share/games/fortunes/fortunes", "--threads", "1",   NULL};
    int fd;
    site_pid = proc_spawn(argv, &fd);
    close(fd);
}

static void teardown(void) {
    if (root == NULL) return;
    if (site_pid > 0) proc_stop(site_pid, 5000), site_pid = -1;
    if (coord > 0) proc_stop(coord, 10000), coord = -1;
    harness_rmtree(root);
    free(root);
    root = NULL;
    net_global_shutdown();
}

TestSuite(retain, .fini = teardown, .timeout = 300);

static void wait_site_done(void) {
    int st;
    cr_assert_eq(waitpid(site_pid, &st, 0), site_pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the site exited with %d", st);
    site_pid = -1;
}

static void assert_files(uint64_t models, uint64_t states) {
    uint64_t m, s;
    store_fixture_files(fed, &m, &s);
    cr_assert_eq(m, models, "checkpoints kept %#llx, the policy names %#llx", (unsigned long long)m,
                 (unsigned long long)models);
    cr_assert_eq(s, states, "outer states kept %#llx, want %#llx", (unsigned long long)s,
                 (unsigned long long)states);
}

static void assert_db_check(int pruned) {
    ProcResult r = S("db", "check", fed, "--json");
    cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
    json_t *o = json_loads(r.out, 0, NULL);
    cr_assert_not_null(o, "%s", r.out);
    cr_assert(json_is_true(json_object_get(o, "ok")));
    cr_assert_eq(json_integer_value(json_object_get(o, "checkpoints_pruned")), pruned, "%s", r.out);
    cr_assert_eq(json_integer_value(json_object_get(o, "prunes_pending")), 0, "%s", r.out);
    json_decref(o);
    proc_result_free(&r);
}

/* What GetModel gives a site holding round `have`'s model (checkpoint of
 * have - 1): a link of the chain, decoded onto it, is the next model. */
static void assert_chain_link(int64_t have) {
    Model base, next;
    char rel[64], err[ERR_LEN], details[256], dir[700];
    snprintf(rel, sizeof rel, "checkpoints/round-%06lld.safetensors", (long long)have - 1);
    store_fixture_load_tiny(fed, rel, &base);
    snprintf(rel, sizeof rel, "checkpoints/round-%06lld.safetensors", (long long)have);
    store_fixture_load_tiny(fed, rel, &next);
    uint8_t sha[32];
    security_sha256(base.params, base.n_params * 4, sha);
    snprintf(dir, sizeof dir, "%s/s0", root);
    NetChannel *ch = attacker_channel(dir, addr);
    Strait__GetModelRequest req = STRAIT__GET_MODEL_REQUEST__INIT;
    req.has_model = 1;
    req.have_round = (uint64_t)have;
    req.have_sha256.data = sha;
    req.have_sha256.len = 32;
    uint8_t buf[96];
    size_t n = strait__get_model_request__pack(&req, buf);
    NetBuf payload;
    NetLimits lim = {.max_total = 64u << 20};
    cr_assert_eq(net_download(ch, "/strait.Federation/GetModel", buf, n, &lim, 30000, &payload,
                              NULL, NULL, details, sizeof details),
                 NET_OK, "%s", details);
    cr_assert_eq(compress_blob_kind(payload.data, payload.len), BLOB_KIND_UPDATE,
                 "a site holding round %lld's model got %zu bytes, not a link of the chain",
                 (long long)have, payload.len);
    float *u = malloc(base.n_params * 4);
    cr_assert_eq(codec_decode(payload.data, payload.len, u, base.n_params, err), 0, "%s", err);
    size_t differ = 0;
    for (size_t i = 0; i < base.n_params; i++) {
        float x = base.params[i] + u[i];
        differ += memcmp(&x, &next.params[i], 4) != 0;
    }
    cr_assert_eq(differ, 0, "the link onto round %lld's model: %zu parameters differ",
                 (long long)have, differ);
    free(u);
    net_buf_free(&payload);
    net_channel_destroy(ch);
    model_free(&base), model_free(&next);
}

/* Thirteen rounds under keep_last = 2, keep_every = 5: rounds 0, 5 and 10
 * (milestones), 11 and 12 (the newest two) keep their checkpoints, round 12
 * alone its outer state. */
Test(retain, a_long_federation_keeps_what_the_policy_names) {
    setup_federation("13");
    coord = spawn_coordinator();
    cr_assert_gt(coord, 0, "the coordinator did not start");
    join_site();
    run_site();
    store_fixture_wait_committed(fed, 12, 240);
    wait_site_done();
    const uint64_t kept = BIT(0) | BIT(5) | BIT(10) | BIT(11) | BIT(12);
    assert_files(kept, BIT(12));
    assert_db_check(8);
    /* the disk, as the status says it */
    ProcResult r = S("status", fed);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "in 5 checkpoints (8 pruned)"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "GB free: room for"), "%s", r.out);
    proc_result_free(&r);
    r = S("status", fed, "--json");
    json_t *o = json_loads(r.out, 0, NULL);
    cr_assert_not_null(o, "%s", r.out);
    cr_assert_eq(json_integer_value(json_object_get(o, "checkpoints_kept")), 5);
    cr_assert_gt(json_integer_value(json_object_get(o, "disk_used")), 0);
    cr_assert_gt(json_integer_value(json_object_get(o, "disk_free")), 0);
    json_decref(o);
    proc_result_free(&r);
    /* a site two rounds behind is served the chain, from the models kept */
    assert_chain_link(11);
    /* the site's folder: one state, whatever the rounds */
    char dir[700];
    snprintf(dir, sizeof dir, "%s/s0", root);
    ProcResult ls = proc_run((char *const[]){"/bin/ls", "-A", dir, NULL});
    cr_assert_eq(ls.status, 0);
    cr_assert_null(strstr(ls.out, "state.new"), "%s", ls.out);
    cr_assert_null(strstr(ls.out, "state.old"), "%s", ls.out);
    proc_result_free(&ls);
    snprintf(dir, sizeof dir, "%s/s0/state", root);
    ls = proc_run((char *const[]){"/bin/ls", "-A", dir, NULL});
    cr_assert_str_eq(ls.out, "ef.bin\ninner.opt.safetensors\nstate.ini\n");
    proc_result_free(&ls);
    /* an old kept round exports; a pruned one is refused, in one line */
    char ckpt[800], out[800];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/round-000005.safetensors", fed);
    snprintf(out, sizeof out, "%s/export5", root);
    r = S("export", ckpt, "--format", "hf", out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/round-000003.safetensors", fed);
    snprintf(out, sizeof out, "%s/export3", root);
    r = S("export", ckpt, "--format", "hf", out);
    cr_assert_eq(r.status, 1);
    cr_assert_eq(harness_count_lines(r.err), 1, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "round 3's checkpoint was pruned"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "0, 5, 10, 11, 12"), "%s", r.err);
    proc_result_free(&r);
}

/* Async rounds take updates trained from the last `staleness` models: a
 * restart reads them back from the checkpoints, which retention keeps. */
Test(retain, async_rounds_keep_the_models_updates_may_be_trained_from) {
    setup_federation("9");
    ini("rounds", "mode", "async");
    ini("rounds", "staleness", "3");
    ini("store", "keep_every", "0");
    coord = spawn_coordinator();
    cr_assert_gt(coord, 0, "the coordinator did not start");
    join_site();
    run_site();
    store_fixture_wait_committed(fed, 8, 240);
    wait_site_done();
    assert_files(BIT(5) | BIT(6) | BIT(7) | BIT(8), BIT(8));
    assert_db_check(5);
}

/* The coordinator (the test build) killed inside a prune, at its 1st, 2nd,
 * 3rd, 5th and 7th file call or store write in turn (each in a later prune:
 * one with fewer calls runs whole), then restarted: it resumes, every kept file is whole, what a
 * kill left marked is removed at the start, and the rounds end at the
 * policy's files. Every point of a prune is walked in
 * tests/unit/test_store_crash.c. */
Test(retain, a_coordinator_killed_inside_its_prunes_resumes) {
    setup_federation("14");
    coord = spawn_coordinator();
    cr_assert_gt(coord, 0, "the coordinator did not start");
    join_site();
    proc_stop(coord, 10000);
    coord = -1;
    run_site();
    static const char *points[] = {"1", "2", "3", "5", "7"};
    int kills = 0;
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
        char fault[64];
        snprintf(fault, sizeof fault, "prune:kill:sigkill:%s", points[i]);
        harness_use_test_build(1);
        setenv("STRAIT_FAULT", fault, 1);
        int pid = spawn_coordinator();
        unsetenv("STRAIT_FAULT");
        harness_use_test_build(0);
        int st = 0, ended = pid < 0;               /* a kill at the prune at its start */
        for (int t = 0; t < 1200 && !ended; t++) { /* until a prune reaches that call */
            ended = proc_ended(pid, &st) == 1;
            if (!ended) usleep(100000);
        }
        if (!ended) proc_stop(pid, 10000); /* no prune that long: the last rounds ran */
        kills += ended;
        ProcResult r = S("db", "check", fed);
        cr_assert_eq(r.status, 0, "after the kill at call %s: %s%s", points[i], r.out, r.err);
        proc_result_free(&r);
    }
    coord = spawn_coordinator();
    cr_assert_gt(kills, 2, "the coordinator was killed %d times only", kills);
    cr_assert_gt(coord, 0, "the production build did not start after %d kills", kills);
    store_fixture_wait_committed(fed, 13, 240);
    wait_site_done();
    assert_files(BIT(0) | BIT(5) | BIT(10) | BIT(12) | BIT(13), BIT(13));
    assert_db_check(9);
    cr_log_info("a coordinator killed in %d of its prunes resumed", kills);
}

/* Free space (faked: statvfs says one model's bytes, less than a commit
 * writes: its checkpoint, outer state and delta) short of the commits left:
 * the coordinator warns at start, in one line, before its first commit,
 * and says so in its status; the rounds still commit (the disk is not
 * really short). */
Test(retain, a_coordinator_short_of_disk_warns_before_a_commit_fails) {
    setup_federation("2");
    Model m;
    char err[ERR_LEN];
    ModelConfig cfg;
    cr_assert_eq(model_config_preset("tiny", &cfg), 0);
    cr_assert_eq(model_build(&m, &cfg, 1, err), 0, "%s", err);
    char fake[32];
    snprintf(fake, sizeof fake, "%lld", (long long)((int64_t)m.n_params * 4));
    model_free(&m);
    harness_use_test_build(1);
    setenv("STRAIT_TEST_DISK_FREE", fake, 1);
    setenv("STRAIT_LOG", "info", 1);
    coord = spawn_coordinator();
    unsetenv("STRAIT_TEST_DISK_FREE");
    setenv("STRAIT_LOG", "error", 1);
    harness_use_test_build(0);
    cr_assert_gt(coord, 0, "the coordinator did not start");
    /* before its first commit, with both rounds to go */
    ProcResult r = S("status", fed, "--json");
    json_t *o = json_loads(r.out, 0, NULL);
    cr_assert_not_null(o, "%s", r.out);
    cr_assert(json_is_true(json_object_get(o, "disk_short")), "%s", r.out);
    cr_assert_eq(json_integer_value(json_object_get(o, "disk_rounds_left")), 0, "%s", r.out);
    json_decref(o);
    proc_result_free(&r);
    join_site();
    run_site();
    store_fixture_wait_committed(fed, 1, 240);
    wait_site_done();
    char *text;
    size_t len;
    cr_assert_eq(file_read_all(log_path, 1 << 24, &text, &len, err), 0, "%s", err);
    const char *warn = strstr(text, "disk: ");
    const char *first = strstr(text, "round 0 committed");
    cr_assert_not_null(warn, "no disk warning in:\n%s", text);
    cr_assert_not_null(first, "round 0 did not commit:\n%s", text);
    cr_assert_lt(warn, first, "the warning came after the first commit");
    cr_assert_not_null(strstr(warn, "holds 0 of the 2 commits left"), "%.300s", warn);
    const char *eol = strchr(warn, '\n');
    cr_assert_not_null(strstr(warn, "keep_every"), "%.300s", warn);
    cr_assert(eol && (size_t)(eol - warn) < 400, "the warning is not one line");
    free(text);
}
