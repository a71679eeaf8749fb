/*
 * test_adversary.c — a site is authenticated, never trusted (docs/design.md §6).
 * A real enrolled site (tests/attacker.c) drives net/ against a real
 * coordinator and tries what a malicious one would: writing into another
 * site's upload, reading its progress, choosing its own weight, sending an
 * update too large, in another codec or for another purpose, holding every
 * worker, staying on after its revocation, poisoning round 0 before the
 * federation has norms to bound it by. Each test asserts the refusal
 * and that the committed global model is bit for bit what the honest sites
 * alone make (computed here with the coordinator's own aggregation code).
 * Also: a site late every round does not set the rounds' pace; 256 sites
 * waiting on one round of a 16-worker coordinator, TLS 1.2
 * refused from outside (openssl s_client), joins that fail, and
 * federation.ini values refused whole before anything changes.
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "client/client.h"
#include "coordinator/coordinator.h"
#include "coordinator/store.h"
#include "kernels/model.h"
#include "kernels/formats.h"
#include "kernels/train.h"
#include "privacy/privacy.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"
#include "tests/attacker.h"
#include "tests/harness.h"
#include "tests/store_fixture.h"
#include "util/util.h"

static char *root, fed[600], addr[64];
static int coord = -1, sites_pid[2]; /* the real agents some tests run beside the attacker */

#define S(...) harness_strait(__VA_ARGS__)

static void ini_set(const char *section, const char *key, const char *value) {
    char path[700];
    snprintf(path, sizeof path, "%s/federation.ini", fed);
    harness_ini_set(path, section, key, value);
}

/* Starts the coordinator on port 0 and reads the bound port from its first line. */
static void start_coordinator(void) {
    coord = harness_start_coordinator(fed, addr);
    cr_assert_gt(coord, 0, "coordinator did not start");
}

static void init_federation(void) {
    net_global_init();
    root = harness_tmpdir("adversary");
    snprintf(fed, sizeof fed, "%s/fed", root);
    ProcResult r = S("init", fed, "--listen", harness_listen(), "--model", "tiny");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
}

/* A federation of `tiny` with the given rounds settings, not started.
 * robust_start is off: the tests compute round 0's model as the mean of
 * the honest sites' updates, the way every later round makes it; the
 * tests of the robust start turn it back on. */
static void federation_ini(const char *aggregate, const char *min_sites, const char *deadline) {
    init_federation();
    ini_set("rounds", "total", "1");
    ini_set("rounds", "min_sites", min_sites);
    ini_set("rounds", "deadline", deadline);
    ini_set("rounds", "aggregate", aggregate);
    ini_set("rounds", "max_extensions", "0");
    ini_set("rounds", "robust_start", "off");
}

/* The same, started. */
static void federation(const char *aggregate, const char *min_sites, const char *deadline) {
    federation_ini(aggregate, min_sites, deadline);
    start_coordinator();
}

static void site(const char *name, char *dir, size_t len) {
    snprintf(dir, len, "%s/%s", root, name);
    attacker_enroll(fed, addr, name, dir);
}

static void teardown(void) {
    if (root == NULL) return;
    for (int i = 0; i < 2; i++)
        if (sites_pid[i] > 0) proc_stop(sites_pid[i], 5000), sites_pid[i] = 0;
    if (coord > 0) proc_stop(coord, 10000), coord = -1;
    harness_rmtree(root);
    free(root);
    root = NULL;
    net_global_shutdown();
}

TestSuite(adversary, .fini = teardown, .timeout = 240);

static StoreRound wait_committed(int64_t n, int timeout_s) {
    return store_fixture_wait_committed(fed, n, timeout_s);
}

static Model tiny(void) {
    Model m;
    ModelConfig cfg;
    char err[ERR_LEN];
    model_config_preset("tiny", &cfg);
    cr_assert_eq(model_build(&m, &cfg, 1, err), 0, "%s", err); /* federation.ini's seed: θ0 */
    return m;
}

/* The next θ from m's by the default recipe, as the coordinator computes
 * it with its own code: Nesterov's step (lr 0.7, momentum 0.3) of the
 * round's mean (consumed), then the int8 downlink, θ + the decoded outer
 * update. The momentum and the residual start from b and e (NULL: zeros)
 * and are stepped there; step is the optimizer's step count. */
static float *recipe_step(const Model *m, float *mean, float *b, float *e, int step) {
    size_t n = m->n_params;
    char err[ERR_LEN];
    OuterOpt o;
    cr_assert_eq(outer_init(&o, OUTER_NESTEROV, n, 0.7f, 0.3f, err), 0);
    if (b) memcpy(o.b, b, n * 4);
    o.step = step;
    float *theta = malloc(n * 4);
    memcpy(theta, m->params, n * 4);
    outer_step(&o, theta, mean);
    if (b) memcpy(b, o.b, n * 4);
    outer_free(&o);
    CodecParams down = codec_params_default(CODEC_INT8);
    CodecLayout L = {m->table_hash, n, NULL, 0};
    ErrorFeedback ef;
    Blob d = {0};
    cr_assert_eq(ef_init(&ef, n, m->table_hash, 1.0f, err), 0, "%s", err);
    if (e) memcpy(ef.e, e, n * 4);
    cr_assert_eq(ef_encode(&ef, &down, &L, theta, m->params, NULL, &d, err), 0, "%s", err);
    if (e) memcpy(e, ef.e, n * 4);
    cr_assert_eq(codec_decode(d.data, d.len, mean, n, err), 0, "%s", err);
    for (size_t i = 0; i < n; i++) theta[i] = m->params[i] + mean[i];
    ef_free(&ef);
    blob_free(&d);
    return theta;
}

/* θ1 from θ0 and the honest updates alone, by the coordinator's own code
 * (weighted mean, or the median), then Nesterov's first step and the
 * int8 downlink of the default recipe. */
static float *expected_theta_as(const Blob *honest, const double *tokens, int n_honest, int median,
                                double total) {
    Model m = tiny();
    char err[ERR_LEN];
    float *mean = malloc(m.n_params * 4);
    if (median) {
        const uint8_t *blobs[8];
        size_t lens[8];
        for (int i = 0; i < n_honest; i++) blobs[i] = honest[i].data, lens[i] = honest[i].len;
        cr_assert_eq(robust_aggregate(blobs, lens, n_honest, m.n_params, AGG_MEDIAN, 0, mean, err),
                     0, "%s", err);
    } else {
        RoundSum rs;
        cr_assert_eq(round_sum_init(&rs, m.n_params, m.table_hash, 0, err), 0);
        for (int i = 0; i < n_honest; i++)
            cr_assert_eq(round_sum_add(&rs, honest[i].data, honest[i].len, tokens[i], err), 0, "%s",
                         err);
        if (total > 0) rs.weight = total; /* the coordinator's clipped mean: see weighed_mean */
        cr_assert_eq(round_sum_mean(&rs, mean, err), 0);
        round_sum_free(&rs);
    }
    float *theta = recipe_step(&m, mean, NULL, NULL, 0);
    free(mean);
    model_free(&m);
    return theta;
}

static float *expected_theta(const Blob *honest, const double *tokens, int n_honest, int median) {
    return expected_theta_as(honest, tokens, n_honest, median, 0);
}

/* θ of a committed round's checkpoint (n_params floats; the caller frees). */
static float *checkpoint_params(const StoreRound *r) {
    Model m = tiny();
    char path[1200], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", fed, r->checkpoint_path);
    cr_assert_eq(model_load(&m, path, NULL, err), 0, "%s", err);
    float *p = m.params;
    m.params = NULL;
    model_free(&m);
    return p;
}

static void assert_model_is(const StoreRound *r, const float *want) {
    Model t = tiny();
    float *got = checkpoint_params(r);
    size_t bad = 0;
    for (size_t i = 0; i < t.n_params; i++) bad += memcmp(&got[i], &want[i], 4) != 0;
    cr_assert_eq(bad, 0, "%zu of %zu parameters differ from the honest sites' model", bad,
                 t.n_params);
    free(got);
    model_free(&t);
}

/* The federation's store, read only (close it with store_close). */
static Store *store_ro(void) {
    char db[800], err[ERR_LEN];
    snprintf(db, sizeof db, "%s/%s", fed, STORE_DB_FILE);
    Store *s = store_open(db, STORE_READONLY, err);
    cr_assert_not_null(s, "%s", err);
    return s;
}

/* The store's updates of a round: how many rejected with `code`. */
static int rejected_with(int64_t round_id, const char *code) {
    char err[ERR_LEN];
    Store *s = store_ro();
    cr_assert_not_null(s, "%s", err);
    StoreUpdate *ups;
    size_t n;
    cr_assert_eq(store_updates_list(s, round_id, &ups, &n, err), 0, "%s", err);
    int count = 0;
    for (size_t i = 0; i < n; i++)
        count += strcmp(ups[i].state, "rejected") == 0 && strcmp(ups[i].reason_code, code) == 0;
    free(ups);
    store_close(s);
    return count;
}

/* ---- uploads belong to their sender ------------------------------------------------ */

Test(adversary, another_sites_upload_is_out_of_reach) {
    federation("median", "2", "4s");
    char b_dir[700], c_dir[700], m_dir[700], details[256];
    /* B and C share their first 40 characters: kept updates were once named
     * by a name cut there, and one site's overwrote the other's */
    site("hospital-in-a-town-with-a-rather-long-name-b", b_dir, sizeof b_dir);
    site("hospital-in-a-town-with-a-rather-long-name-c", c_dir, sizeof c_dir);
    site("m", m_dir, sizeof m_dir);
    NetChannel *b = attacker_channel(b_dir, addr), *c = attacker_channel(c_dir, addr),
               *m = attacker_channel(m_dir, addr);
    Model t = tiny();
    Blob good = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    Blob evil = attacker_update("int8", t.table_hash, t.n_params, -5.0f, 0);
    Blob junk = attacker_update("int8", t.table_hash, t.n_params, 0, 2e-3f);
    /* M opens a stream on B's predictable id and keeps it open */
    AttackClaim on_b = {0, "b-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    NetClientCall *held = attacker_open(m, &on_b, &evil);
    /* M seeds bytes under B's next id; B sees none of them, nor M's stream */
    AttackClaim seed = {0, "b-r1", 1000, NULL, 0, NULL, 0, 0, 0};
    NetClientCall *seeded = attacker_open(m, &seed, &junk);
    attacker_stream_rest(seeded, &(Blob){junk.data, junk.len / 2, 0}, 0, details,
                         sizeof details); /* half the bytes, then the stream ends */
    cr_assert_gt(attacker_query(m, "b-r1"), 0, "M's own partial upload is not held");
    cr_assert_eq(attacker_query(b, "b-r1"), 0, "B sees bytes M spooled under B's id");
    cr_assert_eq(attacker_query(b, "b-r0"), 0, "B sees M's stream");
    /* B's upload on its own id goes through while M's stream on that id is live */
    AttackClaim mine = {0, "b-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(b, &mine, &good, details, sizeof details), NET_OK, "%s", details);
    /* one live stream per upload: M's second stream on the id it holds open waits its turn */
    cr_assert_eq(attacker_push(m, &on_b, &evil, details, sizeof details), NET_ABORTED, "%s",
                 details);
    cr_assert_not_null(strstr(details, "already being received"), "%s", details);
    /* M finishes its stream: its own update, refused by the norm bound */
    NetStatus st = attacker_stream_rest(held, &evil, 0, details, sizeof details);
    cr_assert_eq(st, NET_FAILED_PRECONDITION, "%s: %s", net_status_name(st), details);
    cr_assert_not_null(strstr(details, "norm"), "%s", details);
    AttackClaim cc = {0, "c-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(c, &cc, &good, details, sizeof details), NET_OK, "%s", details);
    StoreRound r0 = wait_committed(0, 30);
    cr_assert_eq(r0.participants, 2);
    cr_assert_eq(rejected_with(r0.id, "norm_gate"), 1);
    Blob honest[2] = {good, good};
    float *want = expected_theta(honest, (double[]){1000, 1000}, 2, 1);
    assert_model_is(&r0, want);
    free(want);
    net_channel_destroy(b), net_channel_destroy(c), net_channel_destroy(m);
    blob_free(&good), blob_free(&evil), blob_free(&junk);
    model_free(&t);
}

/* ---- weights, bounds and codecs ---------------------------------------------------- */

Test(adversary, a_site_cannot_choose_its_weight_or_skip_the_gates) {
    federation_ini("mean", "1", "4s");
    ini_set("limits", "refusals_per_round", "100"); /* each lie below is read and judged */
    start_coordinator();
    char b_dir[700], m_dir[700], details[256];
    site("b", b_dir, sizeof b_dir), site("m", m_dir, sizeof m_dir);
    NetChannel *b = attacker_channel(b_dir, addr), *m = attacker_channel(m_dir, addr);
    Model t = tiny();
    Blob good = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    Blob big = attacker_update("int8", t.table_hash, t.n_params, -5.0f, 0);
    Blob fp32 = attacker_update("fp32", t.table_hash, t.n_params, 0, 1e-3f);
    /* weights far past what a round lets a site train (64 x 64 x 50 tokens) */
    const uint64_t lies[] = {1ull << 60, 1ull << 63, (uint64_t)INT64_MAX, UINT64_MAX};
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        char id[32];
        snprintf(id, sizeof id, "lie-%zu", i);
        AttackClaim a = {0, id, lies[i], NULL, 0, NULL, 0, 0, 0};
        NetStatus st = attacker_push(m, &a, &good, details, sizeof details);
        cr_assert_eq(st, NET_FAILED_PRECONDITION, "tokens %llu: %s", (unsigned long long)lies[i],
                     details);
        cr_assert_not_null(strstr(details, "what a round lets a site train"), "%s", details);
    }
    /* the first update of the first round is bounded too */
    AttackClaim first = {0, "big", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(m, &first, &big, details, sizeof details), NET_FAILED_PRECONDITION);
    cr_assert_not_null(strstr(details, "federation's bound"), "%s", details);
    /* another codec than the federation's, another purpose than an update */
    AttackClaim other = {0, "fp32", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(m, &other, &fp32, details, sizeof details), NET_FAILED_PRECONDITION);
    cr_assert_not_null(strstr(details, "codec fp32"), "%s", details);
    AttackClaim model = {0, "model", 1000, "model", 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(m, &model, &good, details, sizeof details), NET_INVALID_ARGUMENT,
                 "%s", details);
    /* a payload larger than the federation's codec can make is refused at the header */
    size_t huge_len = t.n_params * 4 + (1u << 20);
    Blob huge = {calloc(1, huge_len), huge_len, 0};
    AttackClaim h = {0, "huge", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(m, &h, &huge, details, sizeof details), NET_RESOURCE_EXHAUSTED, "%s",
                 details);
    free(huge.data);
    /* more inner steps than a round has (what dense bytes are counted
     * from), and a base model that is not this round's */
    uint8_t theta0[32], elsewhere[32] = {1};
    security_sha256(t.params, t.n_params * 4, theta0);
    AttackClaim steps = {0, "steps", 1000, NULL, 51, theta0, 0, 0, 0};
    cr_assert_eq(attacker_push(m, &steps, &good, details, sizeof details), NET_FAILED_PRECONDITION);
    cr_assert_not_null(strstr(details, "51 inner steps"), "%s", details);
    AttackClaim based = {0, "based", 1000, NULL, 10, elsewhere, 0, 0, 0};
    cr_assert_eq(attacker_push(m, &based, &good, details, sizeof details), NET_FAILED_PRECONDITION);
    cr_assert_not_null(strstr(details, "another model"), "%s", details);
    AttackClaim honest = {0, "b-r0", 1000, NULL, 10, theta0, 0, 0, 0};
    cr_assert_eq(attacker_push(b, &honest, &good, details, sizeof details), NET_OK, "%s", details);
    StoreRound r0 = wait_committed(0, 30);
    cr_assert_eq(r0.participants, 1);
    cr_assert_eq(r0.tokens, 1000, "the round's tokens include a lie: %lld", (long long)r0.tokens);
    cr_assert_eq(rejected_with(r0.id, "bad_weight"), 4);
    cr_assert_eq(rejected_with(r0.id, "norm_gate"), 1);
    cr_assert_eq(rejected_with(r0.id, "wrong_codec"), 1);
    cr_assert_eq(rejected_with(r0.id, "malformed"), 1);
    cr_assert_eq(rejected_with(r0.id, "wrong_base"), 1);
    /* bytes: the one update taken up, every refused one apart, and dense
     * training counted from the accepted update's 10 steps alone */
    cr_assert_eq(r0.bytes_up, (int64_t)good.len);
    cr_assert_eq(r0.bytes_rejected, (int64_t)(6 * good.len + big.len + fp32.len),
                 "refused bytes: %lld", (long long)r0.bytes_rejected);
    cr_assert_eq(r0.dense_bytes, 2 * 4 * (int64_t)t.n_params * 10);
    float *want = expected_theta(&good, (double[]){1000}, 1, 0);
    assert_model_is(&r0, want);
    free(want);
    ProcResult r = S("db", "check", fed);
    cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
    proc_result_free(&r);
    net_channel_destroy(b), net_channel_destroy(m);
    blob_free(&good), blob_free(&big), blob_free(&fp32);
    model_free(&t);
}

/* A stream that stalls — after its header, or before it — is cut at the
 * federation's deadlines instead of holding a worker for the client's. */
Test(adversary, a_stalled_upload_is_cut) {
    init_federation();
    ini_set("limits", "upload_idle", "1s");
    ini_set("limits", "upload_header", "1s");
    start_coordinator();
    char m_dir[700], details[256], err[ERR_LEN];
    site("m", m_dir, sizeof m_dir);
    NetChannel *m = attacker_channel(m_dir, addr);
    Model t = tiny();
    Blob good = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    AttackClaim a = {0, "slow", 1000, NULL, 0, NULL, 0, 0, 0};
    int64_t t0 = time_wall_ms();
    NetClientCall *c = attacker_open(m, &a, &good); /* the header, then nothing */
    cr_assert_eq(net_client_finish(c, details, sizeof details), NET_DEADLINE_EXCEEDED, "%s",
                 details);
    cr_assert_lt(time_wall_ms() - t0, 30000, "the stalled stream lived to its client's deadline");
    cr_assert_eq(attacker_query(m, "slow"), 0);
    /* a stream that never sends its header is cut at the header deadline */
    t0 = time_wall_ms();
    c = net_client_start(m, "/strait.Federation/PushUpdate", 60000, err);
    cr_assert_not_null(c, "%s", err);
    cr_assert_eq(net_client_finish(c, details, sizeof details), NET_DEADLINE_EXCEEDED, "%s",
                 details);
    cr_assert_lt(time_wall_ms() - t0, 30000, "a header-less stream lived to its client's deadline");
    net_channel_destroy(m);
    blob_free(&good);
    model_free(&t);
}

/* Uploads in flight count against a site's spool quota at their declared
 * size: a site cannot open many and fill the disk before any ends. */
Test(adversary, uploads_in_flight_count_against_the_quota) {
    init_federation();
    ini_set("limits", "spool_per_site", "200000"); /* room for one update of tiny */
    start_coordinator();
    char m_dir[700], details[256];
    site("m", m_dir, sizeof m_dir);
    NetChannel *m = attacker_channel(m_dir, addr);
    Blob fake = {malloc(110000), 110000, 0}; /* under the size bound; never finished */
    harness_fill(fake.data, fake.len, 7);
    AttackClaim a1 = {0, "one", 1000, NULL, 0, NULL, 0, 0, 0},
                a2 = {0, "two", 1000, NULL, 0, NULL, 0, 0, 0};
    NetClientCall *first = attacker_open(m, &a1, &fake);
    usleep(300000);
    cr_assert_eq(attacker_push(m, &a2, &fake, details, sizeof details), NET_RESOURCE_EXHAUSTED,
                 "%s", details);
    cr_assert_not_null(strstr(details, "this site's spool quota"), "%s", details);
    net_client_cancel(first);
    net_client_finish(first, NULL, 0);
    net_channel_destroy(m);
    free(fake.data);
}

/* ---- a commit is all or nothing ---------------------------------------------------- */

/* The round's checkpoint cannot be written (a folder squats on its name):
 * the commit fails, the round fails with its reason once, θ and the round
 * number stay, and the next attempt commits what the honest site sends. */
Test(adversary, a_failed_commit_changes_nothing) {
    federation("mean", "1", "3s");
    char b_dir[700], details[256], squat[800], db[800], err[ERR_LEN];
    site("b", b_dir, sizeof b_dir);
    snprintf(squat, sizeof squat, "%s/checkpoints/round-000000.safetensors", fed);
    cr_assert_eq(file_mkdir_p(squat, 0700, err), 0, "%s", err);
    NetChannel *b = attacker_channel(b_dir, addr);
    Model t = tiny();
    Blob good = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    AttackClaim a = {0, "b-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(b, &a, &good, details, sizeof details), NET_OK, "%s", details);
    /* the first attempt fails at its commit */
    snprintf(db, sizeof db, "%s/%s", fed, STORE_DB_FILE);
    StoreRound *list = NULL;
    size_t n = 0;
    for (int i = 0; i < 100; i++) {
        Store *s = store_open(db, STORE_READONLY, err);
        cr_assert_not_null(s, "%s", err);
        free(list);
        cr_assert_eq(store_rounds_list(s, 10, 0, &list, &n, err), 0, "%s", err);
        store_close(s);
        if (n >= 1 && strcmp(list[n - 1].state, "failed") == 0) break;
        usleep(100000);
    }
    cr_assert_geq(n, 1);
    cr_assert_str_eq(list[n - 1].state, "failed", "the commit did not fail");
    cr_assert_not_null(strstr(list[n - 1].failed_reason, "commit failed"), "%s",
                       list[n - 1].failed_reason);
    cr_assert_eq(list[n - 1].number, 0);
    free(list);
    cr_assert_eq(rmdir(squat), 0);
    /* the next attempt of the same round, from the same θ */
    a.upload_id = "b-r0-again";
    cr_assert_eq(attacker_push(b, &a, &good, details, sizeof details), NET_OK, "%s", details);
    StoreRound r0 = wait_committed(0, 30);
    cr_assert_eq(r0.attempt, 2, "round 0 committed at attempt %lld", (long long)r0.attempt);
    float *want = expected_theta(&good, (double[]){1000}, 1, 0);
    assert_model_is(&r0, want);
    free(want);
    net_channel_destroy(b);
    blob_free(&good);
    model_free(&t);
}

/* The faultsim log's line for attempt a of scope ("faultsim: SCOPE attempt
 * A: C calls, F failed, built|failed"), waited for: F, and *built. */
static int attempt_logged(const char *log, const char *scope, int a, int *built) {
    char want[64], err[ERR_LEN];
    snprintf(want, sizeof want, "%s attempt %d: ", scope, a);
    for (int i = 0; i < 600; i++) {
        char *text = NULL;
        size_t len;
        const char *p =
            file_read_all(log, 1 << 24, &text, &len, err) == 0 ? strstr(text, want) : NULL;
        if (p) {
            long long calls, f;
            char what[16];
            int ok = sscanf(p + strlen(want), "%lld calls, %lld failed, %15s", &calls, &f, what);
            free(text);
            cr_assert_eq(ok, 3, "a bad faultsim line for attempt %d", a);
            *built = strcmp(what, "built") == 0;
            return (int)f;
        }
        free(text);
        cr_assert_eq(waitpid(coord, NULL, WNOHANG), 0, "the coordinator died at %s attempt %d",
                     scope, a);
        usleep(50000);
    }
    cr_assert_fail("%s attempt %d never ran", scope, a);
    return -1;
}

/* Waits until round `number` has `fails` failed rows, each failed by its
 * commit with the reason in one line. */
static void wait_failed_rows(int64_t number, int fails) {
    char err[ERR_LEN];
    int got = 0;
    for (int i = 0; i < 300 && got < fails; i++) {
        Store *s = store_ro();
        StoreRound *list = NULL;
        size_t n = 0;
        cr_assert_eq(store_rounds_list(s, 4000, 0, &list, &n, err), 0, "%s", err);
        store_close(s);
        got = 0;
        for (size_t j = 0; j < n; j++) {
            if (list[j].number != number || strcmp(list[j].state, "failed") != 0) continue;
            got++;
            cr_assert_not_null(strstr(list[j].failed_reason, "commit failed: "), "%s",
                               list[j].failed_reason);
            cr_assert_null(strchr(list[j].failed_reason, '\n'), "not one line: %s",
                           list[j].failed_reason);
        }
        free(list);
        if (got < fails) usleep(50000);
    }
    cr_assert_eq(got, fails, "round %lld has %d failed attempts, not %d", (long long)number, got,
                 fails);
}

typedef struct Walk {
    int failed;    /* attempts failed by their fault */
    int tolerated; /* faults a commit went on past, by design (a lossless stage kept raw) */
    int rounds;    /* rounds committed */
    int injected;  /* faults injected in all */
} Walk;

/* Every fault point of a scope, one attempt each (SQLite's faultsim, in
 * tests/faultsim/faultsim.h): the test build fails attempt a of the scope
 * named in `fault` (a round's commit, or an upload's receipt) at its a-th
 * call of the kind there, so each attempt walks one point further, until
 * one has fewer calls than its number. A commit its fault failed fails the
 * round with the reason in one line and leaves no file, and the site sends
 * its update again; a receipt its fault failed answers the site with a
 * status and one line, and the site sends again. An attempt that went on
 * past its fault, or had none, takes the update and commits the round.
 * Every committed round's model is, bit for bit, what the coordinator's
 * own code makes of the update from the round before's, so no failed
 * attempt stepped anything; then the test build stops cleanly (under ASan:
 * nothing leaked), nothing of a failed attempt is left, `strait db check`
 * passes and the production binary starts on the federation. */
static Walk fault_walk(const char *fault, int max_attempts) {
    char scope[16];
    snprintf(scope, sizeof scope, "%.*s", (int)strcspn(fault, ":"), fault);
    int upload = strcmp(scope, "upload") == 0;
    federation_ini("mean", "1", "3s");
    ini_set("rounds", "total", "1000");
    char log[700];
    snprintf(log, sizeof log, "%s/faultsim.log", root);
    harness_use_test_build(1);
    setenv("STRAIT_FAULT", fault, 1);
    setenv("STRAIT_FAULT_LOG", log, 1);
    start_coordinator();
    unsetenv("STRAIT_FAULT");
    unsetenv("STRAIT_FAULT_LOG");
    harness_use_test_build(0);
    char b_dir[700], details[256], err[ERR_LEN], id[48];
    site("b", b_dir, sizeof b_dir);
    NetChannel *b = attacker_channel(b_dir, addr);
    Model m = tiny();
    size_t n = m.n_params;
    Blob good = attacker_update("int8", m.table_hash, n, 0, 1e-3f);
    /* the round's mean of the one update, and the recipe's state */
    float *mean0 = malloc(n * 4), *mean = malloc(n * 4), *ob = calloc(n, 4), *oe = calloc(n, 4);
    RoundSum rs;
    cr_assert_eq(round_sum_init(&rs, n, m.table_hash, 0, err), 0);
    cr_assert_eq(round_sum_add(&rs, good.data, good.len, 1000, err), 0, "%s", err);
    cr_assert_eq(round_sum_mean(&rs, mean0, err), 0);
    round_sum_free(&rs);
    AttackClaim claim = {0, id, 1000, NULL, 0, NULL, 0, 0, 0};
    Walk w = {0, 0, 0, 0};
    int persistent = strstr(fault, ":short") != NULL; /* every write, from the first */
    int fails_here = 0, done = 0;
    for (int a = 1; a <= max_attempts && !done; a++) {
        snprintf(id, sizeof id, "b-r%d-%d", w.rounds, a);
        claim.round = (uint64_t)w.rounds;
        NetStatus st = NET_UNKNOWN;
        for (int i = 0; i < (upload ? 1 : 50) && st != NET_OK; i++) {
            details[0] = '\0';
            st = attacker_push(b, &claim, &good, details, sizeof details);
            if (st != NET_OK && !upload) usleep(100000); /* the round reopening */
        }
        int built, f = attempt_logged(log, scope, a, &built);
        w.injected += f;
        if (upload && !built) { /* the site is told, in one line */
            cr_assert_eq(f, 1, "upload attempt %d failed with %d faults injected", a, f);
            cr_assert_neq(st, NET_OK, "upload attempt %d failed, and the site was told OK", a);
            cr_assert(details[0] && !strchr(details, '\n'), "upload attempt %d: '%s'", a, details);
            w.failed++;
            continue;
        }
        cr_assert_eq(st, NET_OK, "attempt %d: the update was refused: %s", a, details);
        if (!built) {
            cr_assert_eq(f, 1, "commit attempt %d failed with %d faults injected", a, f);
            w.failed++;
            wait_failed_rows(w.rounds, ++fails_here);
            continue;
        }
        StoreRound r = wait_committed(w.rounds, 30);
        cr_assert_eq(r.attempt, fails_here + 1, "round %d committed at attempt %lld, not %d",
                     w.rounds, (long long)r.attempt, fails_here + 1);
        memcpy(mean, mean0, n * 4);
        float *theta = recipe_step(&m, mean, ob, oe, w.rounds);
        assert_model_is(&r, theta);
        memcpy(m.params, theta, n * 4);
        free(theta);
        w.rounds++, fails_here = 0;
        if (f == 0 || persistent)
            done = 1; /* fewer calls than its number: past the last point */
        else
            w.tolerated++;
    }
    if (getenv("STRAIT_FAULT_SHOW")) {
        char *text = NULL;
        size_t len;
        if (file_read_all(log, 1 << 24, &text, &len, err) == 0) fprintf(stderr, "%s", text);
        free(text);
    }
    cr_assert(done, "%s: the walk did not end in %d attempts", fault, max_attempts);
    net_channel_destroy(b);
    blob_free(&good);
    free(mean0), free(mean), free(ob), free(oe);
    model_free(&m);
    cr_assert_eq(proc_stop(coord, 10000), 0, "the test build did not stop cleanly");
    coord = -1;
    /* nothing of a failed attempt is left beside the committed rounds' files */
    char dir[800], next[64];
    snprintf(dir, sizeof dir, "%s/%s", fed, STORE_CHECKPOINT_DIR);
    snprintf(next, sizeof next, "round-%06d.", w.rounds);
    ProcResult ls = proc_run((char *const[]){"/bin/ls", dir, NULL});
    cr_assert_eq(ls.status, 0);
    cr_assert(strstr(ls.out, ".tmp.") == NULL && strstr(ls.out, next) == NULL, "left in %s:\n%s",
              dir, ls.out);
    proc_result_free(&ls);
    ProcResult chk = S("db", "check", fed);
    cr_assert_eq(chk.status, 0, "strait db check after %d failed commits: %s%s", w.failed, chk.out,
                 chk.err);
    proc_result_free(&chk);
    start_coordinator(); /* the production binary, on what the walk left */
    cr_log_info("%s: %d attempts failed by their fault, %d faults gone past by design, %d rounds",
                fault, w.failed, w.tolerated, w.rounds);
    return w;
}

Test(adversary, every_allocation_of_a_commit_can_fail, .timeout = 600) {
    Walk w = fault_walk("commit:alloc:enomem", 2000);
    cr_assert_gt(w.failed, 0, "no allocation of the commit was made to fail");
}

Test(adversary, every_file_call_of_a_commit_can_fail, .timeout = 600) {
    Walk w = fault_walk("commit:io:enospc", 2000);
    cr_assert_gt(w.failed, 0, "no file call of the commit was made to fail");
    /* the two a commit goes on past: the downlink delta's spill file (its
     * mkostemp and its write), kept on the heap instead */
    cr_assert_leq(w.tolerated, 2, "%d file calls failed and the commit went on", w.tolerated);
}

Test(adversary, every_store_write_of_a_commit_can_fail, .timeout = 600) {
    Walk w = fault_walk("commit:sql:ioerr", 2000);
    cr_assert_gt(w.failed, 0, "no store write of the commit was made to fail");
    cr_assert_eq(w.tolerated, 0, "%d store writes failed and the commit went on", w.tolerated);
}

/* A full disk seen by SQLite is a failure like any other I/O error. */
Test(adversary, a_full_store_fails_a_commit_cleanly, .timeout = 600) {
    Walk w = fault_walk("commit:sql:full", 2000);
    cr_assert_gt(w.failed, 0, "no store write of the commit was made to fail");
    cr_assert_eq(w.tolerated, 0);
}

/* Short writes are not failures: every write of the commit carries half
 * of what it was asked (faultsim.h), and the commit is whole at its first
 * attempt. */
Test(adversary, short_writes_make_the_same_commit) {
    Walk w = fault_walk("commit:io:short", 1);
    cr_assert_eq(w.failed, 0);
    cr_assert_gt(w.injected, 0, "no write of the commit was cut short");
}

Test(adversary, every_allocation_of_an_upload_can_fail, .timeout = 600) {
    Walk w = fault_walk("upload:alloc:enomem", 2000);
    cr_assert_gt(w.failed, 0, "no allocation of the upload was made to fail");
}

Test(adversary, every_file_call_of_an_upload_can_fail, .timeout = 600) {
    Walk w = fault_walk("upload:io:enospc", 2000);
    cr_assert_gt(w.failed, 0, "no file call of the upload was made to fail");
    cr_assert_eq(w.tolerated, 0, "%d file calls failed and the upload went on", w.tolerated);
}

/* A busy store (another writer's lock, once) waits for it within its busy
 * timeout and commits at its first attempt. */
Test(adversary, a_busy_store_commits_at_the_first_attempt) {
    Walk w = fault_walk("commit:sql:busy", 20);
    cr_assert_eq(w.failed, 0, "a busy store failed %d commits", w.failed);
    cr_assert_gt(w.tolerated, 0, "the store's lock was never refused");
}

/* The optimizer's momentum and the downlink's residual are stepped in
 * place by a commit: one that fails past its outer step (round 1's
 * checkpoint cannot be written) reads them back from round 0's state file,
 * so the retried round steps them once. Its model and state are what
 * round 0's checkpoint and state give, one step on, bit for bit. */
Test(adversary, a_failed_commit_puts_the_optimizer_state_back) {
    federation_ini("mean", "1", "3s");
    ini_set("rounds", "total", "2");
    start_coordinator();
    char b_dir[700], details[256], squat[800], path[1200], err[ERR_LEN];
    site("b", b_dir, sizeof b_dir);
    NetChannel *b = attacker_channel(b_dir, addr);
    Model t = tiny();
    Blob u0 = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    Blob u1 = attacker_update("int8", t.table_hash, t.n_params, 0, -2e-3f);
    AttackClaim a = {0, "b-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(b, &a, &u0, details, sizeof details), NET_OK, "%s", details);
    StoreRound r0 = wait_committed(0, 30);
    /* round 0's model and outer state, read while it is the newest: once
     * round 1 commits, retention keeps the newest round's state alone */
    Model m = tiny();
    size_t n = m.n_params;
    float *b0 = calloc(n, 4), *e0 = calloc(n, 4), *mean = malloc(n * 4);
    snprintf(path, sizeof path, "%s/%s", fed, r0.checkpoint_path);
    cr_assert_eq(model_load(&m, path, NULL, err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/%s", fed, r0.state_path);
    float *dsts[2] = {b0, e0};
    const char *prefixes[2] = {"outer_b.", "down_e."};
    cr_assert_eq(model_load_state(&m, path, dsts, prefixes, 2, err), 0, "%s", err);
    snprintf(squat, sizeof squat, "%s/checkpoints/round-000001.safetensors", fed);
    cr_assert_eq(file_mkdir_p(squat, 0700, err), 0, "%s", err);
    a.round = 1, a.upload_id = "b-r1";
    cr_assert_eq(attacker_push(b, &a, &u1, details, sizeof details), NET_OK, "%s", details);
    /* round 1's first attempt fails at its checkpoint, after its step */
    int failed = 0;
    for (int i = 0; i < 100 && !failed; i++) {
        Store *s = store_ro();
        StoreRound *list = NULL;
        size_t k = 0;
        cr_assert_eq(store_rounds_list(s, 10, 0, &list, &k, err), 0, "%s", err);
        store_close(s);
        for (size_t j = 0; j < k; j++)
            failed |= list[j].number == 1 && strcmp(list[j].state, "failed") == 0 &&
                      strstr(list[j].failed_reason, "commit failed") != NULL;
        free(list);
        if (!failed) usleep(100000);
    }
    cr_assert(failed, "round 1's commit did not fail");
    cr_assert_eq(rmdir(squat), 0);
    a.upload_id = "b-r1-again";
    cr_assert_eq(attacker_push(b, &a, &u1, details, sizeof details), NET_OK, "%s", details);
    StoreRound r1 = wait_committed(1, 30);
    cr_assert_eq(r1.attempt, 2, "round 1 committed at attempt %lld", (long long)r1.attempt);
    /* one step from round 0's files (read above), by the coordinator's own code */
    RoundSum rs;
    cr_assert_eq(round_sum_init(&rs, n, m.table_hash, 0, err), 0);
    cr_assert_eq(round_sum_add(&rs, u1.data, u1.len, 1000, err), 0, "%s", err);
    cr_assert_eq(round_sum_mean(&rs, mean, err), 0);
    round_sum_free(&rs);
    float *theta = recipe_step(&m, mean, b0, e0, 1); /* b0, e0: stepped once */
    assert_model_is(&r1, theta);
    /* and the state it pinned: momentum and residual stepped once */
    float *b1 = malloc(n * 4), *e1 = malloc(n * 4);
    float *got[2] = {b1, e1};
    snprintf(path, sizeof path, "%s/%s", fed, r1.state_path);
    cr_assert_eq(model_load_state(&m, path, got, prefixes, 2, err), 0, "%s", err);
    size_t bad_b = 0, bad_e = 0;
    for (size_t i = 0; i < n; i++)
        bad_b += memcmp(&b0[i], &b1[i], 4) != 0, bad_e += memcmp(&e0[i], &e1[i], 4) != 0;
    cr_assert_eq(bad_b, 0, "%zu momenta differ from one step on round 0's", bad_b);
    cr_assert_eq(bad_e, 0, "%zu residuals differ from one step on round 0's", bad_e);
    free(b0), free(e0), free(b1), free(e1), free(mean), free(theta);
    model_free(&m);
    net_channel_destroy(b);
    blob_free(&u0), blob_free(&u1);
    model_free(&t);
}

/* ---- no site can starve the others ------------------------------------------------- */

typedef struct Waiting {
    NetChannel *ch;
    int retry_busy; /* as a site does: a busy or unavailable coordinator is asked again */
    NetStatus st;
    int finished;
    int64_t asked_at; /* when the call that was answered began */
    int in_call;      /* a call is out (atomic: the test reads it while it runs) */
} Waiting;

static void *wait_round(void *arg) {
    Waiting *w = arg;
    Strait__WaitRoundRequest req = STRAIT__WAIT_ROUND_REQUEST__INIT;
    req.after_round = 1; /* past the open round: it parks until the federation moves */
    uint8_t buf[32];
    size_t n = strait__wait_round_request__pack(&req, buf);
    NetBuf resp;
    char details[256];
    /* a site asks a busy coordinator again, with backoff, for as long as
     * its round lasts: here up to 30 s (a loaded CI machine answers a
     * burst of 256 over 16 workers slowly; 100 tries were once too few) */
    int64_t first = time_wall_ms();
    for (int attempt = 0;; attempt++) {
        __atomic_store_n(&w->asked_at, time_wall_ms(), __ATOMIC_RELEASE);
        __atomic_store_n(&w->in_call, 1, __ATOMIC_RELEASE);
        w->st = net_unary(w->ch, "/strait.Federation/WaitRound", buf, n, &resp, 60000, details,
                          sizeof details);
        __atomic_store_n(&w->in_call, 0, __ATOMIC_RELEASE);
        int transient = w->st == NET_RESOURCE_EXHAUSTED || w->st == NET_UNAVAILABLE;
        if (!(w->retry_busy && transient && time_wall_ms() - first < 30000)) break;
        usleep(20000 + 1000 * (attempt % 50));
    }
    if (w->st == NET_OK) {
        Strait__WaitRoundResponse *r =
            strait__wait_round_response__unpack(NULL, resp.len, resp.data);
        w->finished = r && r->finished;
        if (r) strait__wait_round_response__free_unpacked(r, NULL);
        net_buf_free(&resp);
    }
    return NULL;
}

/* One site piles up calls (long polls, parked: they hold no worker, but
 * they count against its certificate's limit), then is revoked. */
Test(adversary, one_site_cannot_pile_up_calls_and_revocation_ends_them) {
    init_federation();
    ini_set("rounds", "deadline", "60s");
    start_coordinator();
    char b_dir[700], m_dir[700], details[256], err[ERR_LEN];
    site("b", b_dir, sizeof b_dir), site("m", m_dir, sizeof m_dir);
    enum { CALLS = 16 };
    static Waiting w[CALLS];
    pthread_t th[CALLS];
    NetChannel *m = attacker_channel(m_dir, addr);
    for (int i = 0; i < CALLS; i++) {
        w[i].ch = m;
        w[i].st = NET_UNKNOWN;
        pthread_create(&th[i], NULL, wait_round, &w[i]);
    }
    usleep(1000000);
    SiteHello hello;
    cr_assert_eq(client_hello(b_dir, &hello, err), 0, "another site was starved: %s", err);
    ProcResult r = S("status", fed);
    cr_assert_eq(r.status, 0, "the admin was starved: %s", r.err);
    proc_result_free(&r);
    r = S("site", "revoke", fed, "m");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    int64_t t0 = time_wall_ms();
    int refused = 0, denied = 0;
    for (int i = 0; i < CALLS; i++) {
        pthread_join(th[i], NULL);
        refused += w[i].st == NET_RESOURCE_EXHAUSTED;
        denied += w[i].st == NET_PERMISSION_DENIED;
    }
    cr_assert_eq(refused, CALLS - NET_PER_PEER_DEFAULT, "the per-site limit let %d of %d in",
                 CALLS - refused, CALLS);
    cr_assert_eq(denied, NET_PER_PEER_DEFAULT, "a revoked site's calls went on: %d cancelled",
                 denied);
    cr_assert_lt(time_wall_ms() - t0, 10000, "a revoked site's calls stayed open");
    usleep(600000); /* the coordinator lets go of the cancelled calls at its next tick */
    Model t = tiny();
    Blob good = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    AttackClaim a = {0, "m-1", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(m, &a, &good, details, sizeof details), NET_PERMISSION_DENIED, "%s",
                 details);
    net_channel_destroy(m);
    blob_free(&good);
    model_free(&t);
}

Test(adversary, sites_waiting_on_a_round_do_not_hold_workers, .timeout = 400) {
#ifdef __SANITIZE_ADDRESS__
    /* under ASan a 2-core machine seats 256 too slowly to tell a parked
     * call from one about to be told busy; 128 on 16 workers shows the same */
    enum { SITES = 128 };
#else
    enum { SITES = 256 };
#endif
    init_federation();
    ini_set("rounds", "total", "1");
    ini_set("rounds", "min_sites", "1");
    ini_set("rounds", "deadline", "5s");
    ini_set("limits", "workers", "16");
    /* 256 sites dial in at once from one address, before any has made a
     * call that trusts it */
    ini_set("limits", "connections_per_address", "1024");
    start_coordinator();
    static Waiting w[SITES];
    static pthread_t th[SITES];
    char dir[700], name[32], details[256], err[ERR_LEN];
    for (int i = 0; i < SITES; i++) {
        snprintf(name, sizeof name, "w%03d", i);
        site(name, dir, sizeof dir);
        w[i].ch = attacker_channel(dir, addr);
    }
    for (int i = 0; i < SITES; i++) {
        /* a burst of 256 over 16 workers and a backlog: some are told busy,
         * and a connection may fail in the burst (UNAVAILABLE, once in a run
         * of make test): a site asks again in both cases */
        w[i].retry_busy = 1;
        pthread_create(&th[i], NULL, wait_round, &w[i]);
    }
    /* until every site's call has been out for a second (parked, not being
     * told busy): a loaded machine takes longer than 2 s to seat 256 */
    for (int64_t t0 = time_wall_ms(); time_wall_ms() - t0 < 30000;) {
        sleep(1);
        int seated = 0;
        int64_t now = time_wall_ms();
        for (int i = 0; i < SITES; i++)
            seated += __atomic_load_n(&w[i].in_call, __ATOMIC_ACQUIRE) &&
                      now - __atomic_load_n(&w[i].asked_at, __ATOMIC_ACQUIRE) > 1000;
        if (seated == SITES) break;
    }
    /* 256 calls parked on 16 workers: the admin and another site are answered meanwhile */
    ProcResult r = S("status", fed);
    cr_assert_eq(r.status, 0, "status with %d sites waiting: %s", SITES, r.err);
    proc_result_free(&r);
    char b_dir[700];
    site("b", b_dir, sizeof b_dir);
    SiteHello hello;
    /* answered while the 256 wait; under the sanitizers a worker may still
     * be seating the last of them when b asks, so b asks up to 3 times, as
     * a site told busy does */
    int rc = -1;
    for (int k = 0; k < 3 && rc != 0; k++)
        if ((rc = client_hello(b_dir, &hello, err)) != 0 && strstr(err, "busy")) sleep(1);
    cr_assert_eq(rc, 0, "%s", err);
    NetChannel *b = attacker_channel(b_dir, addr);
    Model t = tiny();
    Blob good = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    AttackClaim a = {0, "b-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    int64_t pushed_at = time_wall_ms();
    cr_assert_eq(attacker_push(b, &a, &good, details, sizeof details), NET_OK, "%s", details);
    wait_committed(0, 60);
    int ok = 0, finished = 0, waiting_before = 0;
    NetStatus other = NET_OK;
    for (int i = 0; i < SITES; i++) {
        pthread_join(th[i], NULL);
        ok += w[i].st == NET_OK;
        if (w[i].st != NET_OK) other = w[i].st;
        finished += w[i].finished;
        waiting_before += w[i].asked_at < pushed_at;
        net_channel_destroy(w[i].ch);
    }
    cr_assert_eq(ok, SITES, "%d of %d waiting sites were answered (another got %s)", ok, SITES,
                 net_status_name(other));
    cr_assert_eq(finished, SITES, "%d of %d heard the federation finish", finished, SITES);
    /* all at once: every answered call had been waiting before the round's update came */
    cr_assert_eq(waiting_before, SITES, "only %d of %d were waiting together", waiting_before,
                 SITES);
    net_channel_destroy(b);
    blob_free(&good);
    model_free(&t);
}

/* ---- the port, joins and configuration ------------------------------------------------ */

static int s_client(const char *version, char *out, size_t len) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "echo | timeout 10 openssl s_client -connect %s %s -alpn h2 2>&1",
             addr, version);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    return pclose(p);
}

Test(adversary, the_port_speaks_tls_1_3_only) {
    cr_assert(net_tls13_only(), "this build cannot refuse TLS 1.2 (libgrpc lacks the setter)");
    init_federation();
    start_coordinator();
    static char out[65536];
    s_client("-tls1_2", out, sizeof out);
    cr_assert_not_null(strstr(out, "Cipher is (NONE)"), "TLS 1.2 negotiated:\n%s", out);
    s_client("-tls1_3", out, sizeof out);
    cr_assert_not_null(strstr(out, "TLSv1.3"), "TLS 1.3 failed:\n%s", out);
}

/* Failed joins: audited (three rows per address and minute, the rest
 * counted), then refused for a bad token, never for a good one. */
Test(adversary, failed_joins_are_audited_then_refused_and_sign_nothing) {
    init_federation();
    ini_set("limits", "join_failures", "3");
    start_coordinator();
    char dir[700], err[ERR_LEN], fp[65], join[300];
    cr_assert_eq(coordinator_home_info(fed, fp, NULL, 0, err), 0);
    cr_assert_eq(coordinator_join_address(fed, join, sizeof join, err), 0, "%s", err);
    const char *bad = "0000000000000000000000000000000000000000000000000000000000000000";
    for (int i = 0; i < 20; i++) { /* twenty from one address: three rows */
        snprintf(dir, sizeof dir, "%s/j%d", root, i);
        SiteJoinOptions o = {dir, "eve", addr, bad, fp, join};
        cr_assert_neq(client_join(&o, err), 0);
        if (i < 3)
            cr_assert_not_null(strstr(err, "token"), "%s", err);
        else
            cr_assert_not_null(strstr(err, "too many failed joins"), "%s", err);
    }
    Store *s = store_ro();
    StoreEvent *ev;
    size_t n;
    cr_assert_eq(store_events_list(s, 1000, 0, &ev, &n, err), 0, "%s", err);
    int rows = 0;
    for (size_t i = 0; i < n; i++) rows += strcmp(ev[i].action, "site.join_failed") == 0;
    free(ev);
    store_close(s);
    cr_assert_eq(rows, 3, "%d rows for 20 failed joins", rows);

    ProcResult r = S("events", fed);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "site.join_failed"), "%s", r.out);
    proc_result_free(&r);
    r = S("site", "list", fed);
    cr_assert_null(strstr(r.out, "eve"), "a failed join left a site: %s", r.out);
    proc_result_free(&r);
    /* names that are paths, not sites */
    r = S("site", "enroll", fed, "..");
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "starting with a letter or a digit"), "%s", r.err);
    proc_result_free(&r);
    /* a site with a good token behind the same address still joins */
    snprintf(dir, sizeof dir, "%s/alice", root);
    attacker_enroll(fed, addr, "alice", dir); /* asserts that the join succeeds */
}

Test(adversary, bad_settings_are_refused_whole_before_anything_changes) {
    init_federation();
    ProcResult r = S("init", fed, "--force", "--listen", "127.0.0.1:99999", "--model", "tiny");
    cr_assert_eq(r.status, 1, "port 99999 was accepted");
    cr_assert_not_null(strstr(r.err, "0 to 65535"), "%s", r.err);
    proc_result_free(&r);
    r = S("init", fed, "--force", "--listen", "nohostnoport", "--model", "tiny");
    cr_assert_eq(r.status, 1, "a listen address without a port was accepted");
    proc_result_free(&r);
    static const struct {
        const char *section, *key, *value, *said;
    } bad[] = {{"rounds", "deadline", "0s", "[rounds] deadline"},
               {"optimizer", "momentum", "1.5", "[optimizer] momentum"},
               {"rounds", "batch", "0", "[rounds] batch"},
               {"limits", "calls_per_site", "0", "[limits] calls_per_site"},
               {"roundz", "total", "3", "unknown section [roundz]"},
               {"recipe", "name", "localsgd", "[recipe] name = localsgd; use diloco"},
               {"codec", "downlink", "int4", "[codec] downlink = int4"},
               {"codec", "uplink", "int4", "use fp32, fp16, bf16, int8, topk or topk2"},
               {"codec", "ef_decay", "0", "[codec] ef_decay"},
               {"codec", "density", "0.9", "[codec] density = 0.9"},
               {"optimizer", "eps", "0", "[optimizer] eps"},
               {"optimizer", "outer", "sgd", "[optimizer] outer = sgd"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = S("init", fed, "--force", "--listen", harness_listen(), "--model", "tiny");
        cr_assert_eq(r.status, 0, "%s", r.err);
        proc_result_free(&r);
        ini_set(bad[i].section, bad[i].key, bad[i].value);
        r = S("coordinator", "start", fed);
        cr_assert_eq(r.status, 1, "%s = %s was accepted", bad[i].key, bad[i].value);
        cr_assert_not_null(strstr(r.err, bad[i].said), "%s", r.err);
        cr_assert_eq(harness_count_lines(r.err), 1, "not one line: %s", r.err);
        proc_result_free(&r);
    }
}

/* ---- the trust boundary, second pass --------------------------------------------------- */

/* A site's first certificate, kept in a folder of its own (the files
 * attacker_channel and client_hello read), and its fingerprint. */
static void keep_certificate(const char *site_dir, const char *copy_dir, char sha[65]) {
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp -p %s/* %s/", copy_dir, site_dir, copy_dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    char path[800], *pem, err[ERR_LEN];
    snprintf(path, sizeof path, "%s/site.crt", copy_dir);
    cr_assert_eq(file_read_all(path, 1 << 20, &pem, NULL, err), 0, "%s", err);
    SecurityIdentity id;
    cr_assert_eq(security_cert_identity(pem, &id, err), 0, "%s", err);
    memcpy(sha, id.sha256_hex, 65);
    free(pem);
}

static int cert_in_store(const char *sha) {
    char err[ERR_LEN];
    Store *s = store_ro();
    cr_assert_not_null(s, "%s", err);
    int rc = store_cert_find(s, sha, NULL, NULL, err);
    store_close(s);
    return rc == 0;
}

/* Mallory renews and holds both certificates: its calls count together
 * (four at most, across both), a second renewal is refused while the
 * first's overlap runs, the replaced certificate is refused once it has
 * retired, and the store keeps the valid certificates only. */
Test(adversary, a_site_is_one_site_whatever_certificates_it_holds) {
    init_federation();
    ini_set("security", "renew_overlap", "3s");
    ini_set("rounds", "deadline", "60s");
    start_coordinator();
    char b_dir[700], m_dir[700], m_old[700], first[65], err[ERR_LEN], details[256];
    site("b", b_dir, sizeof b_dir), site("m", m_dir, sizeof m_dir);
    snprintf(m_old, sizeof m_old, "%s/m-first", root);
    keep_certificate(m_dir, m_old, first);
    cr_assert_eq(client_renew(m_dir, err), 0, "%s", err);
    int64_t renewed_at = time_wall_ms();
    cr_assert_neq(client_renew(m_dir, err), 0, "a second renewal inside the overlap was taken");
    cr_assert_not_null(strstr(err, "renew again in"), "%s", err);
    /* two long polls on each certificate: four, the site's limit */
    NetChannel *m1 = attacker_channel(m_old, addr), *m2 = attacker_channel(m_dir, addr);
    static Waiting w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        w[i].ch = i < 2 ? m1 : m2;
        w[i].st = NET_UNKNOWN;
        pthread_create(&th[i], NULL, wait_round, &w[i]);
    }
    usleep(1000000);
    Strait__WaitRoundRequest req = STRAIT__WAIT_ROUND_REQUEST__INIT;
    req.after_round = 1;
    uint8_t buf[32];
    size_t n = strait__wait_round_request__pack(&req, buf);
    NetBuf resp;
    for (int k = 0; k < 2; k++) { /* a fifth, on either certificate */
        NetStatus st = net_unary(k ? m1 : m2, "/strait.Federation/WaitRound", buf, n, &resp, 5000,
                                 details, sizeof details);
        cr_assert_eq(st, NET_RESOURCE_EXHAUSTED, "a fifth call got %s: %s", net_status_name(st),
                     details);
        cr_assert_not_null(strstr(details, "all its certificates together"), "%s", details);
    }
    SiteHello hello;
    cr_assert_eq(client_hello(b_dir, &hello, err), 0, "another site was starved: %s", err);
    /* the replaced certificate retires: refused, and its calls in flight end */
    while (time_wall_ms() - renewed_at < 3500) usleep(100000);
    cr_assert_neq(client_hello(m_old, &hello, err), 0, "a retired certificate still works");
    cr_assert_not_null(strstr(err, "replaced by a renewal"), "%s", err);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(w[i].st, NET_PERMISSION_DENIED, "a call on the retired certificate got %s",
                     net_status_name(w[i].st));
    }
    /* the renewed certificate works once the server has let the ended calls
     * go (the site hears their status a moment before their slots are free;
     * slower under ASan): a slot that never came back fails after 3 s */
    int rc = -1;
    for (int k = 0; k < 30 && (rc = client_hello(m_dir, &hello, err)) != 0 &&
                    strstr(err, "too many calls at once") != NULL;
         k++)
        usleep(100000);
    cr_assert_eq(rc, 0, "%s", err);
    /* the overlap over, a renewal is taken, and the store lets the first go */
    cr_assert(cert_in_store(first));
    cr_assert_eq(client_renew(m_dir, err), 0, "%s", err);
    cr_assert(!cert_in_store(first), "the store still holds a retired certificate");
    ProcResult r = S("site", "revoke", fed, "m"); /* ends the calls still parked */
    proc_result_free(&r);
    for (int i = 2; i < 4; i++) pthread_join(th[i], NULL);
    net_channel_destroy(m1), net_channel_destroy(m2);
}

/* Mallory holds every upload it is allowed, on both its certificates, and
 * trickles them a byte at a time: it holds four streams (the rest are
 * refused at once), each is cut at the minimum rate once its grace is
 * over, and the honest sites' round commits meanwhile with their model. */
Test(adversary, a_trickling_site_is_cut_and_the_honest_round_commits) {
    federation_ini("mean", "2", "4s");
    ini_set("limits", "upload_grace", "2s");
    start_coordinator();
    char b_dir[700], c_dir[700], m_dir[700], m_old[700], sha[65], err[ERR_LEN], details[256];
    site("b", b_dir, sizeof b_dir), site("c", c_dir, sizeof c_dir), site("m", m_dir, sizeof m_dir);
    snprintf(m_old, sizeof m_old, "%s/m-first", root);
    keep_certificate(m_dir, m_old, sha);
    cr_assert_eq(client_renew(m_dir, err), 0, "%s", err);
    NetChannel *m[2] = {attacker_channel(m_old, addr), attacker_channel(m_dir, addr)};
    NetChannel *b = attacker_channel(b_dir, addr), *c = attacker_channel(c_dir, addr);
    Model t = tiny();
    Blob good = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    Blob other = attacker_update("int8", t.table_hash, t.n_params, 0, 2e-3f);
    enum { STREAMS = 8 };
    NetClientCall *calls[STREAMS];
    for (int i = 0; i < STREAMS; i++) {
        char id[32];
        snprintf(id, sizeof id, "m-trickle-%d", i);
        AttackClaim a = {0, id, 1000, NULL, 0, NULL, 0, 0, 0};
        calls[i] = attacker_open(m[i % 2], &a, &good);
    }
    int64_t t0 = time_wall_ms();
    AttackClaim ab = {0, "b-r0", 1000, NULL, 0, NULL, 0, 0, 0},
                ac = {0, "c-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(b, &ab, &good, details, sizeof details), NET_OK, "%s", details);
    cr_assert_eq(attacker_push(c, &ac, &other, details, sizeof details), NET_OK, "%s", details);
    cr_assert_lt(time_wall_ms() - t0, 3000, "the honest uploads waited on the trickles");
    int cut = 0, refused = 0;
    for (int i = 0; i < STREAMS; i++) {
        uint64_t sent = 0;
        /* a byte every 250 ms for 4 s: cut after the 2 s grace, short of its end */
        NetStatus st =
            attacker_trickle(calls[i], &good, 1, 250, 16, &sent, details, sizeof details);
        cut +=
            st == NET_DEADLINE_EXCEEDED && strstr(details, "slower than this receiver's minimum");
        refused += st == NET_RESOURCE_EXHAUSTED;
    }
    cr_assert_eq(refused, STREAMS - NET_PER_PEER_DEFAULT, "%d of %d streams were refused", refused,
                 STREAMS);
    cr_assert_eq(cut, NET_PER_PEER_DEFAULT, "%d of the trickles were cut at the minimum rate", cut);
    StoreRound r = wait_committed(0, 30);
    float *want = expected_theta((Blob[]){good, other}, (double[]){1000, 1000}, 2, 0);
    assert_model_is(&r, want);
    free(want);
    net_channel_destroy(m[0]), net_channel_destroy(m[1]);
    net_channel_destroy(b), net_channel_destroy(c);
    blob_free(&good), blob_free(&other);
    model_free(&t);
}

/* Abandoned calls stop counting: calls queued behind busy workers whose
 * clients gave up do not hold the site's slots. */
Test(adversary, calls_whose_client_gave_up_stop_counting) {
    init_federation();
    ini_set("limits", "workers", "3");
    ini_set("limits", "admin_reserve", "1");
    ini_set("limits", "upload_grace", "4s");
    start_coordinator();
    char b_dir[700], m_dir[700], details[256];
    site("b", b_dir, sizeof b_dir), site("m", m_dir, sizeof m_dir);
    NetChannel *m = attacker_channel(m_dir, addr), *b = attacker_channel(b_dir, addr);
    Model t = tiny();
    Blob good = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    /* m holds both common workers with streams that say nothing */
    NetClientCall *hold[2];
    for (int i = 0; i < 2; i++) {
        AttackClaim a = {0, i ? "m-hold-1" : "m-hold-0", 1000, NULL, 0, NULL, 0, 0, 0};
        hold[i] = attacker_open(m, &a, &good);
    }
    usleep(500000);
    /* b's calls queue behind them and its client gives up on each */
    for (int i = 0; i < NET_PER_PEER_DEFAULT; i++)
        cr_assert_eq(attacker_heartbeat(b, 0, 300, NULL, details, sizeof details),
                     NET_DEADLINE_EXCEEDED, "%s", details);
    /* and its next call is not told it has too many */
    NetStatus st = attacker_heartbeat(b, 0, 20000, NULL, details, sizeof details);
    cr_assert_eq(st, NET_OK, "after its abandoned calls, b got %s: %s", net_status_name(st),
                 details);
    for (int i = 0; i < 2; i++) net_client_finish(hold[i], details, sizeof details);
    net_channel_destroy(m), net_channel_destroy(b);
    blob_free(&good);
    model_free(&t);
}

/* An update accepted just before its site is revoked leaves the round:
 * the round does not close on its account, and what commits is the honest
 * sites' model alone. */
Test(adversary, a_revoked_sites_update_leaves_the_open_round) {
    federation("mean", "2", "30s");
    char b_dir[700], c_dir[700], m_dir[700], details[256];
    site("b", b_dir, sizeof b_dir), site("c", c_dir, sizeof c_dir), site("m", m_dir, sizeof m_dir);
    NetChannel *b = attacker_channel(b_dir, addr), *c = attacker_channel(c_dir, addr),
               *m = attacker_channel(m_dir, addr);
    Model t = tiny();
    Blob gb = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    Blob gc = attacker_update("int8", t.table_hash, t.n_params, 0, 2e-3f);
    Blob gm = attacker_update("int8", t.table_hash, t.n_params, 0, -4e-3f);
    AttackClaim am = {0, "m-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(m, &am, &gm, details, sizeof details), NET_OK, "%s", details);
    ProcResult r = S("site", "revoke", fed, "m");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    /* at once: b and the revoked m would be every active site */
    AttackClaim ab = {0, "b-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(b, &ab, &gb, details, sizeof details), NET_OK, "%s", details);
    usleep(1500000);
    AttackClaim ac = {0, "c-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(c, &ac, &gc, details, sizeof details), NET_OK, "%s", details);
    /* b sends again, as a site told its round reopened without it does */
    AttackClaim ab2 = {0, "b-r0-again", 1000, NULL, 0, NULL, 0, 0, 0};
    NetStatus st = attacker_push(b, &ab2, &gb, details, sizeof details);
    cr_assert(st == NET_OK || strstr(details, "duplicate") || strstr(details, "closed"), "%s: %s",
              net_status_name(st), details);
    StoreRound rr = wait_committed(0, 30);
    cr_assert_eq(rr.participants, 2);
    float *want = expected_theta((Blob[]){gb, gc}, (double[]){1000, 1000}, 2, 0);
    assert_model_is(&rr, want);
    free(want);
    /* the attempt that held m's update failed, saying why */
    char err[ERR_LEN];
    Store *s = store_ro();
    cr_assert_not_null(s, "%s", err);
    StoreRound *rounds;
    size_t n = 0;
    cr_assert_eq(store_rounds_list(s, 10, 0, &rounds, &n, err), 0, "%s", err);
    int failed = 0;
    for (size_t i = 0; i < n; i++)
        failed +=
            strcmp(rounds[i].state, "failed") == 0 && strstr(rounds[i].failed_reason, "revoked");
    free(rounds);
    store_close(s);
    cr_assert_eq(failed, 1, "no attempt failed for the revocation");
    net_channel_destroy(b), net_channel_destroy(c), net_channel_destroy(m);
    blob_free(&gb), blob_free(&gc), blob_free(&gm);
    model_free(&t);
}

static double l2_norm(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

static double l2_distance(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s);
}

/* The blob's norm, as the coordinator's gate measures it. */
static double blob_norm(const Model *t, const Blob *b) {
    RoundGate g;
    cr_assert_eq(round_gate_inspect(t->n_params, t->table_hash, b->data, b->len, NULL, &g), 0);
    double norm = g.norm;
    round_gate_free(&g);
    return norm;
}

/* Mallory inside every bound of its own — the largest weight a round
 * allows, a norm just under the absolute bound — against two honest sites
 * under the mean's caps (every round's once the federation has norms;
 * round 0's with robust_start off): its weight counts as 2 x the round's
 * median claim and its norm is clipped to 3 x the median norm, exactly;
 * without those caps the same round moves θ many times further. */
Test(adversary, a_site_inside_every_bound_cannot_take_over_the_mean) {
    federation_ini("mean", "3", "30s");
    start_coordinator();
    char b_dir[700], c_dir[700], m_dir[700], details[256];
    site("b", b_dir, sizeof b_dir), site("c", c_dir, sizeof c_dir), site("m", m_dir, sizeof m_dir);
    NetChannel *b = attacker_channel(b_dir, addr), *c = attacker_channel(c_dir, addr),
               *m = attacker_channel(m_dir, addr);
    Model t = tiny();
    double theta_norm = l2_norm(t.params, t.n_params);
    float v = (float)(1.9 * theta_norm / sqrt((double)t.n_params));
    Blob gb = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    Blob gc = attacker_update("int8", t.table_hash, t.n_params, 0, 1.5e-3f);
    Blob gm = attacker_update("int8", t.table_hash, t.n_params, v, 0);
    const uint64_t honest_tokens = 50 * 8 * 64, most = 50 * 64 * 64; /* a CPU agent's; the cap */
    AttackClaim ab = {0, "b-r0", honest_tokens, NULL, 0, NULL, 0, 0, 0};
    AttackClaim ac = {0, "c-r0", honest_tokens, NULL, 0, NULL, 0, 0, 0};
    AttackClaim am = {0, "m-r0", most, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(m, &am, &gm, details, sizeof details), NET_OK, "%s", details);
    cr_assert_eq(attacker_push(b, &ab, &gb, details, sizeof details), NET_OK, "%s", details);
    cr_assert_eq(attacker_push(c, &ac, &gc, details, sizeof details), NET_OK, "%s", details);
    StoreRound r = wait_committed(0, 30);
    /* what the coordinator must have made of it, by its own rules */
    double norms[3] = {blob_norm(&t, &gm), blob_norm(&t, &gb), blob_norm(&t, &gc)};
    double claims[3] = {(double)most, (double)honest_tokens, (double)honest_tokens};
    double wcap = 2 * round_median(claims, 3, 1), ncap = 3 * round_median(norms, 3, 1);
    double w[3], total = 0;
    for (int i = 0; i < 3; i++) {
        double wi = claims[i] > wcap ? wcap : claims[i];
        w[i] = wi * (norms[i] > ncap ? ncap / norms[i] : 1.0);
        total += wi;
    }
    cr_assert_lt(w[0], 0.1 * claims[0], "Mallory's update was barely capped");
    float *want = expected_theta_as((Blob[]){gm, gb, gc}, w, 3, 0, total);
    assert_model_is(&r, want);
    /* how far θ moved from the honest sites' model, and how far the plain
     * mean of the same three updates would have moved it */
    float *honest = expected_theta((Blob[]){gb, gc},
                                   (double[]){(double)honest_tokens, (double)honest_tokens}, 2, 0);
    float *plain = expected_theta((Blob[]){gm, gb, gc}, claims, 3, 0);
    double capped = l2_distance(want, honest, t.n_params);
    double uncapped = l2_distance(plain, honest, t.n_params);
    cr_log_info("distance from the honest model: %.4g with the caps, %.4g without (|theta0| %.4g)",
                capped, uncapped, theta_norm);
    cr_assert_lt(capped, 0.1 * uncapped, "the caps did not bound the damage");
    free(want), free(honest), free(plain);
    net_channel_destroy(b), net_channel_destroy(c), net_channel_destroy(m);
    blob_free(&gb), blob_free(&gc), blob_free(&gm);
    model_free(&t);
}

/* The same Mallory in round 0 under robust_start, before any round has
 * bounded norms: beside two honest sites the round is the coordinate-wise
 * median of the three updates, bit for bit; beside one, the mean of the
 * two with Mallory's weight and norm capped at the honest site's. */
Test(adversary, round_0_is_robust_before_the_federation_has_norms) {
    Model t = tiny();
    float v = (float)(1.9 * l2_norm(t.params, t.n_params) / sqrt((double)t.n_params));
    Blob gb = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    Blob gc = attacker_update("int8", t.table_hash, t.n_params, 0, 1.5e-3f);
    Blob gm = attacker_update("int8", t.table_hash, t.n_params, v, 0);
    const uint64_t honest_tokens = 50 * 8 * 64, most = 50 * 64 * 64;
    double claims[3] = {(double)most, (double)honest_tokens, (double)honest_tokens};
    for (int n_honest = 2; n_honest >= 1; n_honest--) {
        federation_ini("mean", n_honest == 2 ? "3" : "2", "30s");
        ini_set("rounds", "robust_start", "on");
        start_coordinator();
        char b_dir[700], c_dir[700], m_dir[700], details[256];
        site("m", m_dir, sizeof m_dir), site("b", b_dir, sizeof b_dir);
        if (n_honest == 2) site("c", c_dir, sizeof c_dir);
        NetChannel *m = attacker_channel(m_dir, addr), *b = attacker_channel(b_dir, addr);
        AttackClaim am = {0, "m-r0", most, NULL, 0, NULL, 0, 0, 0};
        AttackClaim ab = {0, "b-r0", honest_tokens, NULL, 0, NULL, 0, 0, 0};
        cr_assert_eq(attacker_push(m, &am, &gm, details, sizeof details), NET_OK, "%s", details);
        cr_assert_eq(attacker_push(b, &ab, &gb, details, sizeof details), NET_OK, "%s", details);
        if (n_honest == 2) {
            NetChannel *c = attacker_channel(c_dir, addr);
            AttackClaim ac = {0, "c-r0", honest_tokens, NULL, 0, NULL, 0, 0, 0};
            cr_assert_eq(attacker_push(c, &ac, &gc, details, sizeof details), NET_OK, "%s",
                         details);
            net_channel_destroy(c);
        }
        StoreRound r = wait_committed(0, 30);
        cr_assert_eq(r.participants, 1 + n_honest);
        float *want;
        if (n_honest == 2) {
            want = expected_theta((Blob[]){gm, gb, gc}, claims, 3, 1);
        } else { /* each weight and norm at most the lower median's: b's */
            double norms[2] = {blob_norm(&t, &gm), blob_norm(&t, &gb)};
            double wcap = round_median(claims, 2, 1), ncap = round_median(norms, 2, 1);
            double w[2], total = 0;
            for (int i = 0; i < 2; i++) {
                double wi = claims[i] > wcap ? wcap : claims[i];
                w[i] = wi * (norms[i] > ncap ? ncap / norms[i] : 1.0);
                total += wi;
            }
            want = expected_theta_as((Blob[]){gm, gb}, w, 2, 0, total);
        }
        assert_model_is(&r, want);
        float *honest = expected_theta((Blob[]){gb, gc}, claims + 1, n_honest, 0);
        cr_log_info("%d honest site%s: distance from the honest model %.4g (|theta0| %.4g)",
                    n_honest, n_honest > 1 ? "s" : "", l2_distance(want, honest, t.n_params),
                    l2_norm(t.params, t.n_params));
        free(want), free(honest);
        net_channel_destroy(m), net_channel_destroy(b);
        teardown();
    }
    blob_free(&gb), blob_free(&gc), blob_free(&gm);
    model_free(&t);
}

/* After a round with a quorum, the absolute bound is 4 x the median of
 * recent rounds' median norms, not 2 x |θ|: an update of 1.9 |θ0| that
 * round 0 allowed is refused in round 1. */
Test(adversary, the_norm_bound_follows_the_honest_rounds) {
    federation_ini("mean", "2", "30s");
    ini_set("rounds", "total", "2");
    start_coordinator();
    char b_dir[700], m_dir[700], details[256];
    site("b", b_dir, sizeof b_dir), site("m", m_dir, sizeof m_dir);
    NetChannel *b = attacker_channel(b_dir, addr), *m = attacker_channel(m_dir, addr);
    Model t = tiny();
    float v = (float)(1.9 * l2_norm(t.params, t.n_params) / sqrt((double)t.n_params));
    Blob gb = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    Blob gm = attacker_update("int8", t.table_hash, t.n_params, 0, 1.2e-3f);
    Blob big = attacker_update("int8", t.table_hash, t.n_params, v, 0);
    AttackClaim ab = {0, "b-r0", 1000, NULL, 0, NULL, 0, 0, 0},
                am = {0, "m-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(b, &ab, &gb, details, sizeof details), NET_OK, "%s", details);
    cr_assert_eq(attacker_push(m, &am, &gm, details, sizeof details), NET_OK, "%s", details);
    wait_committed(0, 30);
    AttackClaim am1 = {1, "m-r1", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(m, &am1, &big, details, sizeof details), NET_FAILED_PRECONDITION,
                 "an update of 1.9 |theta| passed after an honest round: %s", details);
    cr_assert_not_null(strstr(details, "federation's bound"), "%s", details);
    char err[ERR_LEN];
    Store *s = store_ro();
    StoreRound r1;
    cr_assert_eq(store_round_get(s, 1, &r1, err), 0, "%s", err);
    store_close(s);
    cr_assert_eq(rejected_with(r1.id, "norm_gate"), 1);
    net_channel_destroy(b), net_channel_destroy(m);
    blob_free(&gb), blob_free(&gm), blob_free(&big);
    model_free(&t);
}

/* `strait site run` for the site in dir on one fortunes file, in the
 * background: seed 7, the same data order in every run. */
static int run_site(const char *dir, const char *data) {
    char *argv[] = {(char *)harness_strait_bin(),
                    "site",
                    "run",
                    (char *)dir,
                    "--data",
                    (char *)data,
                    "--threads",
                    "1",
                    "--seed",
                    "7",
                    NULL};
    int fd;
    int pid = proc_spawn(argv, &fd);
    close(fd);
    cr_assert_gt(pid, 0);
    return pid;
}

/* Round n's model on text no site trains on: the demo's held-out score. */
static double held_out(int64_t n) {
    const char *paths[2] = {"/usr/share/games/fortunes/platitudes",
                            "/usr/share/games/fortunes/miscellaneous"};
    StoreRound r = wait_committed(n, 1);
    char path[1300], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", fed, r.checkpoint_path);
    double loss = NAN;
    cr_assert_eq(model_eval_checkpoint(path, paths, 2, 8, 64, 16, &loss, err), 0, "%s", err);
    return loss;
}

/* Two real sites of `tiny` (50 inner steps, batch 8) for four rounds,
 * their held-out loss after each in loss[]. With mallory, m pushes
 * 1.99 |θ0| along θ0 — what shrinks θ under the outer step — first in
 * round 0, claiming the largest weight a round allows, and is revoked
 * once round 0 commits: the rounds after are the honest sites' alone. */
static void shrinking_attack(int mallory, double loss[4]) {
    federation_ini("mean", "2", "60s");
    ini_set("rounds", "total", "4");
    ini_set("rounds", "robust_start", "on");
    ini_set("store", "keep_last", "4"); /* every round's model is scored after the run */
    start_coordinator();
    char b_dir[700], c_dir[700], m_dir[700], details[256];
    site("b", b_dir, sizeof b_dir), site("c", c_dir, sizeof c_dir);
    if (mallory) {
        site("m", m_dir, sizeof m_dir);
        NetChannel *m = attacker_channel(m_dir, addr);
        Model t = tiny();
        float *x = malloc(t.n_params * 4);
        for (size_t i = 0; i < t.n_params; i++) x[i] = 1.99f * t.params[i];
        Blob gm = attacker_encode("int8", t.table_hash, x, t.n_params);
        AttackClaim am = {0, "m-r0", 50 * 64 * 64, NULL, 0, NULL, 0, 0, 0};
        cr_assert_eq(attacker_push(m, &am, &gm, details, sizeof details), NET_OK, "%s", details);
        net_channel_destroy(m);
        blob_free(&gm), free(x);
        model_free(&t);
    }
    sites_pid[0] = run_site(b_dir, "/usr/share/games/fortunes/fortunes");
    sites_pid[1] = run_site(c_dir, "/usr/share/games/fortunes/literature");
    StoreRound r0 = wait_committed(0, 300);
    cr_assert_eq(r0.participants, 2 + mallory);
    if (mallory) {
        ProcResult r = S("site", "revoke", fed, "m");
        cr_assert_eq(r.status, 0, "%s", r.err);
        proc_result_free(&r);
    }
    wait_committed(3, 600);
    for (int i = 0; i < 2; i++) {
        int st;
        cr_assert_eq(waitpid(sites_pid[i], &st, 0), sites_pid[i]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "site %d exited with %d", i, st);
        sites_pid[i] = 0;
    }
    for (int n = 0; n < 4; n++) loss[n] = held_out(n);
    teardown();
}

/* One site in round 0 alone, before the federation has norms of its
 * own to bound it by: pushing θ towards zero with the largest weight and
 * norm the round takes, then revoked. Three honest rounds later the model
 * must be as good as the honest sites alone make it. */
Test(adversary, round_0s_shrinking_attack_is_within_2_percent_by_round_3) {
    double honest[4], attacked[4];
    shrinking_attack(0, honest);
    shrinking_attack(1, attacked);
    cr_log_info("held-out loss after rounds 0-3: honest %.3f %.3f %.3f %.3f, Mallory in round 0 "
                "%.3f %.3f %.3f %.3f",
                honest[0], honest[1], honest[2], honest[3], attacked[0], attacked[1], attacked[2],
                attacked[3]);
    cr_assert_lt(attacked[3], 1.02 * honest[3],
                 "round 0's attack still costs %.1f%% of held-out loss after round 3 (%.3f, "
                 "honest %.3f)",
                 100 * (attacked[3] / honest[3] - 1), attacked[3], honest[3]);
}

/* Refusals and downloads cost bounded rows and bytes: past three refusals
 * in a round a site is refused at the header and counted, not recorded;
 * past four downloads it is told to wait; and bytes_down counts the model
 * once per site. */
Test(adversary, refusals_and_downloads_are_cheap) {
    federation("mean", "2", "3s");
    char b_dir[700], c_dir[700], m_dir[700], details[256], err[ERR_LEN];
    site("b", b_dir, sizeof b_dir), site("c", c_dir, sizeof c_dir), site("m", m_dir, sizeof m_dir);
    NetChannel *b = attacker_channel(b_dir, addr), *c = attacker_channel(c_dir, addr),
               *m = attacker_channel(m_dir, addr);
    Model t = tiny();
    Blob good = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    Blob junk = attacker_update("fp32", t.table_hash, t.n_params, 0, 1e-3f); /* the wrong codec */
    enum { JUNK = 12 };
    int at_header = 0;
    for (int i = 0; i < JUNK; i++) {
        char id[32];
        snprintf(id, sizeof id, "m-junk-%d", i);
        AttackClaim a = {0, id, 1000, NULL, 0, NULL, 0, 0, 0};
        cr_assert_eq(attacker_push(m, &a, &junk, details, sizeof details), NET_FAILED_PRECONDITION,
                     "%s", details);
        at_header += strstr(details, "refused until the round moves") != NULL;
    }
    cr_assert_eq(at_header, JUNK - 3, "%d of %d were refused at the header", at_header, JUNK);
    /* six downloads: four served, then refused until the round moves */
    int served = 0, limited = 0;
    size_t model_len = 0;
    NetLimits lim = {.max_total = 64u << 20};
    for (int i = 0; i < 6; i++) {
        NetBuf payload = {NULL, 0};
        NetStatus st = net_download(m, "/strait.Federation/GetModel", "", 0, &lim, 20000, &payload,
                                    NULL, NULL, details, sizeof details);
        served += st == NET_OK;
        limited += st == NET_RESOURCE_EXHAUSTED;
        if (st == NET_OK) model_len = payload.len;
        net_buf_free(&payload);
    }
    cr_assert_eq(served, 4, "%d downloads served", served);
    cr_assert_eq(limited, 2);
    AttackClaim ab = {0, "b-r0", 1000, NULL, 0, NULL, 0, 0, 0},
                ac = {0, "c-r0", 1000, NULL, 0, NULL, 0, 0, 0};
    cr_assert_eq(attacker_push(b, &ab, &good, details, sizeof details), NET_OK, "%s", details);
    cr_assert_eq(attacker_push(c, &ac, &good, details, sizeof details), NET_OK, "%s", details);
    StoreRound r = wait_committed(0, 30);
    cr_assert_eq(r.bytes_down, (int64_t)model_len, "bytes_down %lld for one model of %zu bytes",
                 (long long)r.bytes_down, model_len);
    cr_assert_eq(r.refusals_unrecorded, JUNK - 3);
    /* the store holds m's first three refusals, no more */
    Store *s = store_ro();
    StoreUpdate *ups;
    size_t n;
    cr_assert_eq(store_updates_list(s, r.id, &ups, &n, err), 0, "%s", err);
    store_close(s);
    free(ups);
    cr_assert_eq(n, 3 + 2, "%zu rows for round 0", n);
    net_channel_destroy(b), net_channel_destroy(c), net_channel_destroy(m);
    blob_free(&good), blob_free(&junk);
    model_free(&t);
}

/* A real site "s" enrolled and joined in dir, and text to train on in data. */
static void real_site_s(char *dir, size_t dir_len, char *data, size_t data_len) {
    snprintf(dir, dir_len, "%s/s", root);
    harness_enroll_join(fed, addr, "s", dir);
    snprintf(data, data_len, "%s/data.txt", root);
    FILE *f = fopen(data, "w");
    cr_assert_not_null(f, "%s", data);
    for (int i = 0; i < 2000; i++) fputs("the quick brown fox jumps over the lazy dog\n", f);
    fclose(f);
}

/* A site bounds what it builds: a model larger than --max-memory is
 * refused, with the sizes, before any of it is allocated. */
Test(adversary, a_site_refuses_a_model_larger_than_its_memory) {
    init_federation();
    start_coordinator();
    char dir[700], data[800];
    real_site_s(dir, sizeof dir, data, sizeof data);
    ProcResult r = S("site", "run", dir, "--data", data, "--max-memory", "1M");
    cr_assert_eq(r.status, 1, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "needs about"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "--max-memory"), "%s", r.err);
    cr_assert_eq(harness_count_lines(r.err), 1, "%s", r.err);
    proc_result_free(&r);
}

/* Reported losses are claims: the round shows the median, and a report far
 * from the others' is flagged in the audit log. */
Test(adversary, a_lying_loss_report_is_outvoted_and_flagged) {
    federation("mean", "3", "30s");
    char b_dir[700], c_dir[700], m_dir[700], details[256], err[ERR_LEN];
    site("b", b_dir, sizeof b_dir), site("c", c_dir, sizeof c_dir), site("m", m_dir, sizeof m_dir);
    NetChannel *ch[3] = {attacker_channel(b_dir, addr), attacker_channel(c_dir, addr),
                         attacker_channel(m_dir, addr)};
    Model t = tiny();
    Blob good = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    const char *ids[3] = {"b-r0", "c-r0", "m-r0"};
    const double losses[3] = {5.2, 5.4, 0.1}; /* m says its update made the model excellent */
    for (int i = 0; i < 3; i++) {
        AttackClaim a = {0, ids[i], 1000, NULL, 0, NULL, losses[i], 0, 0};
        cr_assert_eq(attacker_push(ch[i], &a, &good, details, sizeof details), NET_OK, "%s",
                     details);
    }
    StoreRound r = wait_committed(0, 30);
    cr_assert_float_eq(r.eval_loss, 5.2, 1e-9, "the round shows %g", r.eval_loss);
    char db[800];
    snprintf(db, sizeof db, "%s/%s", fed, STORE_DB_FILE);
    int flagged = 0, others = 0;
    for (int tries = 0; tries < 50 && !flagged; tries++) { /* written just after the commit */
        Store *s = store_open(db, STORE_READONLY, err);
        StoreEvent *ev;
        size_t n;
        cr_assert_eq(store_events_list(s, 100, 0, &ev, &n, err), 0, "%s", err);
        flagged = others = 0;
        for (size_t i = 0; i < n; i++)
            if (strcmp(ev[i].action, "update.loss_disputed") == 0) {
                flagged += strcmp(ev[i].actor, "m") == 0;
                others += strcmp(ev[i].actor, "m") != 0;
            }
        free(ev);
        store_close(s);
        if (!flagged) usleep(100000);
    }
    cr_assert_eq(flagged, 1, "m's report was not flagged");
    cr_assert_eq(others, 0, "an honest report was flagged");
    for (int i = 0; i < 3; i++) net_channel_destroy(ch[i]);
    blob_free(&good);
    model_free(&t);
}

/* Where a site says its round went (UpdateMeta's times) is shown as its
 * compute utilization and weighs nothing: a site that claims a training
 * time of years and an impossible download moves θ no differently from an
 * honest one, its utilization is capped at 100%, the impossible claim is
 * recorded as not sent, and the round's goodput cannot pass 100% (a site
 * can only misstate its own figure); so are impossible decode, eval and
 * encode times, and losses that are negative, not a number or beyond any
 * model's, which are recorded as not measured and leave the round's
 * losses to the honest sites. */
Test(adversary, claimed_times_change_only_the_claimants_figures) {
    federation("mean", "3", "30s");
    char b_dir[700], c_dir[700], m_dir[700], details[256];
    site("b", b_dir, sizeof b_dir), site("c", c_dir, sizeof c_dir), site("m", m_dir, sizeof m_dir);
    NetChannel *b = attacker_channel(b_dir, addr), *c = attacker_channel(c_dir, addr),
               *m = attacker_channel(m_dir, addr);
    Model t = tiny();
    Blob gb = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    Blob gc = attacker_update("int8", t.table_hash, t.n_params, 0, 1.2e-3f);
    Blob gm = attacker_update("int8", t.table_hash, t.n_params, 0, 1.1e-3f);
    AttackClaim ab = {0, "b-r0", 1000, NULL, 0, NULL, 0, 2, 50}; /* ms: under any wall time */
    AttackClaim ac = {0, "c-r0", 1000, NULL, 0, NULL, 0, 3, 50};
    /* and impossible times for the rest of its round, and losses no model
     * has: negative, not a number, beyond any vocabulary's */
    AttackClaim am = {0, "m-r0", 1000, NULL, 0, NULL, -1.0, 1000000000000ull, 1ull << 60};
    AttackMore more = {1ull << 60, 1ull << 60, 1ull << 60, NAN, 1e9};
    cr_assert_eq(attacker_push_more(m, &am, &more, &gm, details, sizeof details), NET_OK, "%s",
                 details);
    cr_assert_eq(attacker_push(b, &ab, &gb, details, sizeof details), NET_OK, "%s", details);
    cr_assert_eq(attacker_push(c, &ac, &gc, details, sizeof details), NET_OK, "%s", details);
    StoreRound r = wait_committed(0, 30);
    float *want = expected_theta((Blob[]){gm, gb, gc}, (double[]){1000, 1000, 1000}, 3, 0);
    assert_model_is(&r, want);
    free(want);
    /* the figures, as an operator reads them */
    ProcResult pr = S("round", "show", fed, "0", "--json");
    cr_assert_eq(pr.status, 0, "%s", pr.err);
    int seen = 0;
    for (char *save = NULL, *line = strtok_r(pr.out, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        cr_assert_not_null(o, "%s: %s", je.text, line);
        const char *name = json_string_value(json_object_get(o, "site"));
        double util = json_real_value(json_object_get(o, "utilization"));
        json_int_t down = json_integer_value(json_object_get(o, "download_ms"));
        cr_assert(util > 0 && util <= 1, "%s: utilization %g", name, util);
        if (strcmp(name, "m") == 0) {
            cr_assert_eq(util, 1.0, "m's claim of years of training is not capped at 100%%");
            cr_assert_eq(down, 0, "an impossible download time was recorded: %lld",
                         (long long)down);
            static const char *const times[] = {"decode_ms", "eval_ms", "encode_ms"};
            for (int k = 0; k < 3; k++)
                cr_assert_eq(json_integer_value(json_object_get(o, times[k])), 0,
                             "an impossible %s was recorded", times[k]);
            static const char *const losses[] = {"train_loss", "eval_loss", "start_eval_loss"};
            for (int k = 0; k < 3; k++)
                cr_assert(json_is_null(json_object_get(o, losses[k])),
                          "m's impossible %s was recorded as a loss", losses[k]);
        } else {
            cr_assert_lt(util, 1.0);
            cr_assert_eq(down, 50);
        }
        seen++;
        json_decref(o);
    }
    cr_assert_eq(seen, 3);
    proc_result_free(&pr);
    pr = S("rounds", fed, "--json");
    cr_assert_eq(pr.status, 0, "%s", pr.err);
    json_error_t je;
    json_t *o = json_loads(pr.out, JSON_DISABLE_EOF_CHECK, &je);
    cr_assert_not_null(o, "%s: %s", je.text, pr.out);
    double util = json_real_value(json_object_get(o, "utilization"));
    double good = json_real_value(json_object_get(o, "goodput"));
    double train = json_real_value(json_object_get(o, "train_loss"));
    cr_assert_float_eq(train, 3.0, 1e-9, "m's loss moved the round's: %g", train);
    cr_assert(util > 0 && util <= 1, "round utilization %g", util);
    cr_assert(good > 0 && good <= 1, "round goodput %g", good);
    json_decref(o);
    proc_result_free(&pr);
    net_channel_destroy(b), net_channel_destroy(c), net_channel_destroy(m);
    blob_free(&gb), blob_free(&gc), blob_free(&gm);
    model_free(&t);
}

/* A WaitRound whose poll runs out while round 0 is still open is answered
 * with round 0, not finished: a message of proto3 defaults, which packs to
 * 0 bytes and is a message still (a site must not read it as an answer
 * without one). */
Test(adversary, a_parked_wait_that_expires_in_round_0_is_answered) {
    federation("mean", "2", "60s");
    char b_dir[700], details[256];
    site("b", b_dir, sizeof b_dir);
    NetChannel *b = attacker_channel(b_dir, addr);
    Strait__WaitRoundRequest req = STRAIT__WAIT_ROUND_REQUEST__INIT;
    req.after_round = 1;
    uint8_t buf[32];
    size_t n = strait__wait_round_request__pack(&req, buf);
    NetBuf resp;
    /* a 2 s deadline: parked for 1.5 s, then answered as it stands */
    NetStatus st =
        net_unary(b, "/strait.Federation/WaitRound", buf, n, &resp, 2000, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    Strait__WaitRoundResponse *wr = strait__wait_round_response__unpack(NULL, resp.len, resp.data);
    cr_assert_not_null(wr);
    cr_assert_eq(wr->current_round, 0);
    cr_assert(!wr->finished);
    strait__wait_round_response__free_unpacked(wr, NULL);
    net_buf_free(&resp);
    net_channel_destroy(b);
}

/* ---- asynchronous rounds: the base a site names is a claim --------------------------- */
/* (a site that downloaded from this coordinator never names a base newer
 * than the newest model it was served: its weight follows its staleness) */

/* θ − the weighted mean of the updates (outer = avg, lr 1, lossless
 * downlink), by the coordinator's own code, in the order they arrived. */
static void step_avg(float *theta, size_t n, uint64_t table_hash, const Blob *ups, const double *w,
                     int k) {
    char err[ERR_LEN];
    RoundSum rs;
    cr_assert_eq(round_sum_init(&rs, n, table_hash, 0, err), 0, "%s", err);
    for (int i = 0; i < k; i++)
        cr_assert_eq(round_sum_add(&rs, ups[i].data, ups[i].len, w[i], err), 0, "%s", err);
    float *mean = malloc(n * 4);
    cr_assert_eq(round_sum_mean(&rs, mean, err), 0, "%s", err);
    OuterOpt o;
    cr_assert_eq(outer_init(&o, OUTER_AVG, n, 1.0f, 0, err), 0, "%s", err);
    outer_step(&o, theta, mean);
    outer_free(&o);
    round_sum_free(&rs);
    free(mean);
}

/* How many rounds back a site's update in the round was trained (its
 * refused one, or the other). */
static int64_t staleness_of(int64_t round_id, const char *site, int rejected) {
    char err[ERR_LEN];
    Store *s = store_ro();
    StoreUpdate *ups;
    size_t n;
    cr_assert_eq(store_updates_list(s, round_id, &ups, &n, err), 0, "%s", err);
    int64_t k = -1;
    for (size_t i = 0; i < n; i++)
        if (strcmp(ups[i].site_name, site) == 0 &&
            (strcmp(ups[i].state, "rejected") == 0) == rejected)
            k = ups[i].staleness;
    free(ups);
    store_close(s);
    return k;
}

/* The site downloads the current model (the coordinator records what it
 * served it). */
static void download_model(NetChannel *ch) {
    NetLimits lim = {.max_total = 64u << 20};
    NetBuf payload = {NULL, 0};
    char details[256];
    cr_assert_eq(net_download(ch, "/strait.Federation/GetModel", "", 0, &lim, 20000, &payload, NULL,
                              NULL, details, sizeof details),
                 NET_OK, "%s", details);
    net_buf_free(&payload);
}

/* Heartbeat's answer: whether the caller has an update in the open round
 * (what an async site waits on before it sends its next). */
static int heartbeat_reported(NetChannel *ch) {
    AttackBeat beat;
    char details[256];
    cr_assert_eq(attacker_heartbeat(ch, 0, 5000, &beat, details, sizeof details), NET_OK, "%s",
                 details);
    return beat.reported;
}

Test(adversary, async_rounds_weigh_stale_updates_and_refuse_older_ones) {
    federation_ini("mean", "2", "60s");
    ini_set("rounds", "total", "3");
    ini_set("rounds", "mode", "async");
    ini_set("rounds", "staleness", "1");
    ini_set("optimizer", "outer", "avg");
    ini_set("optimizer", "lr", "1");
    ini_set("codec", "downlink", "lossless");
    ini_set("limits", "refusals_per_round", "100");
    start_coordinator();
    char a_dir[700], b_dir[700], details[256];
    site("a", a_dir, sizeof a_dir), site("b", b_dir, sizeof b_dir);
    NetChannel *a = attacker_channel(a_dir, addr), *b = attacker_channel(b_dir, addr);
    Model t = tiny();
    size_t n = t.n_params;
    Blob u[4];
    for (int i = 0; i < 4; i++) u[i] = attacker_update("int8", t.table_hash, n, 0, 1e-3f * (i + 1));
    uint8_t sha[3][32];
    float *theta = malloc(n * 4);
    memcpy(theta, t.params, n * 4);
    security_sha256(theta, n * 4, sha[0]);
    /* round 0: both sites from θ0, b downloaded */
    download_model(b);
    AttackClaim a0 = {0, "a-r0", 1000, NULL, 10, sha[0], 0, 0, 0};
    AttackClaim b0 = {0, "b-r0", 1000, NULL, 10, sha[0], 0, 0, 0};
    cr_assert_eq(attacker_push(a, &a0, &u[0], details, sizeof details), NET_OK, "%s", details);
    cr_assert_eq(attacker_push(b, &b0, &u[1], details, sizeof details), NET_OK, "%s", details);
    StoreRound r0 = wait_committed(0, 30);
    step_avg(theta, n, t.table_hash, u, (double[]){1000, 1000}, 2);
    assert_model_is(&r0, theta);
    security_sha256(theta, n * 4, sha[1]);
    /* round 1: b's second update is still from θ0 (one round old: it
     * counts 1/sqrt(2) per token); a's from θ1. A base is a claim: θ0's
     * hash under round 1's name (from a, which downloaded nothing), or a
     * round to come, is refused. */
    AttackClaim lie = {1, "a-lie", 1000, NULL, 10, sha[0], 0, 0, 0};
    cr_assert_eq(attacker_push(a, &lie, &u[2], details, sizeof details), NET_FAILED_PRECONDITION);
    cr_assert_not_null(strstr(details, "another model"), "%s", details);
    AttackClaim ahead = {7, "b-ahead", 1000, NULL, 10, sha[0], 0, 0, 0};
    cr_assert_eq(attacker_push(b, &ahead, &u[2], details, sizeof details), NET_FAILED_PRECONDITION);
    cr_assert_not_null(strstr(details, "at round 1"), "%s", details);
    /* θ1 itself, to the bit, which b was never served: a fresher base (a
     * weight of 1 instead of 1/sqrt(2)) than the one it holds */
    AttackClaim fresher = {1, "b-fresher", 1000, NULL, 10, sha[1], 0, 0, 0};
    cr_assert_eq(attacker_push(b, &fresher, &u[2], details, sizeof details),
                 NET_FAILED_PRECONDITION);
    cr_assert_not_null(strstr(details, "served site b round 0's at the newest"), "%s", details);
    AttackClaim b1 = {0, "b-r0-again", 1000, NULL, 10, sha[0], 0, 0, 0};
    AttackClaim a1 = {1, "a-r1", 1000, NULL, 10, sha[1], 0, 0, 0};
    cr_assert_eq(attacker_push(b, &b1, &u[2], details, sizeof details), NET_OK, "%s", details);
    cr_assert(heartbeat_reported(b), "b's update is in the open round");
    cr_assert(!heartbeat_reported(a), "a has sent nothing to round 1");
    cr_assert_eq(attacker_push(a, &a1, &u[3], details, sizeof details), NET_OK, "%s", details);
    StoreRound r1 = wait_committed(1, 30);
    Blob order[2] = {u[2], u[3]};
    step_avg(theta, n, t.table_hash, order, (double[]){1000.0 * (1.0 / sqrt(2.0)), 1000}, 2);
    assert_model_is(&r1, theta);
    security_sha256(theta, n * 4, sha[2]);
    cr_assert_eq(staleness_of(r1.id, "b", 0), 1);
    cr_assert_eq(staleness_of(r1.id, "a", 0), 0);
    /* round 2: an update from θ0 is two rounds old, past the bound: refused
     * as stale (counted apart from the other refusals), and the round
     * commits from the current ones alone */
    AttackClaim old = {0, "b-r0-old", 1000, NULL, 10, sha[0], 0, 0, 0};
    cr_assert_eq(attacker_push(b, &old, &u[0], details, sizeof details), NET_FAILED_PRECONDITION);
    cr_assert_not_null(strstr(details, "2 rounds old"), "%s", details);
    cr_assert_not_null(strstr(details, "download the current model"), "%s", details);
    AttackClaim a2 = {2, "a-r2", 1000, NULL, 10, sha[2], 0, 0, 0};
    AttackClaim b2 = {2, "b-r2", 1000, NULL, 10, sha[2], 0, 0, 0};
    download_model(b); /* θ2 served to b: its claim of it is taken */
    cr_assert_eq(attacker_push(a, &a2, &u[1], details, sizeof details), NET_OK, "%s", details);
    cr_assert_eq(attacker_push(b, &b2, &u[0], details, sizeof details), NET_OK, "%s", details);
    StoreRound r2 = wait_committed(2, 30);
    Blob last[2] = {u[1], u[0]};
    step_avg(theta, n, t.table_hash, last, (double[]){1000, 1000}, 2);
    assert_model_is(&r2, theta);
    cr_assert_eq(rejected_with(r2.id, "stale"), 1);
    cr_assert_eq(staleness_of(r2.id, "b", 1), 2);
    cr_assert_eq(rejected_with(r1.id, "wrong_base"), 3);
    cr_assert_eq(rejected_with(r1.id, "stale") + rejected_with(r0.id, "stale"), 0);
    ProcResult r = S("db", "check", fed);
    cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
    proc_result_free(&r);
    free(theta);
    for (int i = 0; i < 4; i++) blob_free(&u[i]);
    net_channel_destroy(a), net_channel_destroy(b);
    model_free(&t);
}

/* An async round merges once its quorum is in and its grace window has
 * passed, not at its deadline: the slowest site's update joins the next
 * round instead. */
Test(adversary, an_async_round_merges_on_its_quorum_without_the_slowest) {
    federation_ini("mean", "2", "120s");
    ini_set("rounds", "total", "2");
    ini_set("rounds", "mode", "async");
    ini_set("rounds", "grace", "0.5");
    start_coordinator();
    char dirs[3][700], details[256];
    NetChannel *ch[3];
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "s%d", i);
        site(name, dirs[i], sizeof dirs[i]);
        ch[i] = attacker_channel(dirs[i], addr);
    }
    Model t = tiny();
    Blob u = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    uint8_t theta0[32];
    security_sha256(t.params, t.n_params * 4, theta0);
    uint64_t t0 = time_monotonic_ns();
    AttackClaim c0 = {0, "s0-r0", 1000, NULL, 10, theta0, 0, 0, 0};
    AttackClaim c1 = {0, "s1-r0", 1000, NULL, 10, theta0, 0, 0, 0};
    cr_assert_eq(attacker_push(ch[0], &c0, &u, details, sizeof details), NET_OK, "%s", details);
    cr_assert_eq(attacker_push(ch[1], &c1, &u, details, sizeof details), NET_OK, "%s", details);
    StoreRound r0 = wait_committed(0, 60); /* the deadline is 120 s */
    double took = (double)(time_monotonic_ns() - t0) / 1e9;
    cr_assert_eq(r0.participants, 2);
    cr_assert_lt(took, 100, "the round waited for its deadline: %.1f s", took);
    /* the third site's update, from θ0, joins round 1 one round old */
    AttackClaim c2 = {0, "s2-r0", 1000, NULL, 10, theta0, 0, 0, 0};
    cr_assert_eq(attacker_push(ch[2], &c2, &u, details, sizeof details), NET_OK, "%s", details);
    StoreRound open1;
    Store *s = store_ro();
    char err[ERR_LEN];
    cr_assert_eq(store_round_get(s, 1, &open1, err), 0, "%s", err);
    store_close(s);
    cr_assert_eq(staleness_of(open1.id, "s2", 0), 1);
    blob_free(&u);
    for (int i = 0; i < 3; i++) net_channel_destroy(ch[i]);
    model_free(&t);
}

/* A resume point is a claim: a GetModel that says it holds part of a
 * payload the coordinator is not serving (another hash), or more of it
 * than there is, is served the model whole from the start; the payload is
 * the same bytes an honest download gets. */
Test(adversary, a_lying_resume_point_is_served_the_whole_model) {
    federation("mean", "3", "30s");
    char m_dir[700], details[256];
    site("m", m_dir, sizeof m_dir);
    NetChannel *m = attacker_channel(m_dir, addr);
    NetLimits lim = {.max_total = 64u << 20};
    NetBuf honest = {NULL, 0};
    cr_assert_eq(net_download(m, "/strait.Federation/GetModel", "", 0, &lim, 20000, &honest, NULL,
                              NULL, details, sizeof details),
                 NET_OK, "%s", details);
    uint8_t sha[32], wrong[32];
    security_sha256(honest.data, honest.len, sha);
    memset(wrong, 0x5a, sizeof wrong);
    const struct {
        uint64_t offset;
        const uint8_t *sha;
        const char *what;
    } lies[] = {{100, wrong, "another payload's hash"},
                {honest.len + 10, sha, "more bytes than the payload has"},
                {honest.len, sha, "all of it already"}};
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        Strait__GetModelRequest req = STRAIT__GET_MODEL_REQUEST__INIT;
        req.resume_offset = lies[i].offset;
        req.resume_sha256.data = (uint8_t *)lies[i].sha;
        req.resume_sha256.len = 32;
        uint8_t buf[128];
        size_t n = strait__get_model_request__pack(&req, buf);
        NetBuf got = {NULL, 0};
        /* no held bytes: a stream that started past 0 would be refused here */
        NetStatus st = net_download(m, "/strait.Federation/GetModel", buf, n, &lim, 20000, &got,
                                    NULL, NULL, details, sizeof details);
        cr_assert_eq(st, NET_OK, "%s: %s: %s", lies[i].what, net_status_name(st), details);
        cr_assert(got.len == honest.len && memcmp(got.data, honest.data, got.len) == 0,
                  "%s: not the model an honest download gets", lies[i].what);
        net_buf_free(&got);
    }
    net_buf_free(&honest);
    net_channel_destroy(m);
}

/* ---- one site cannot set the pace ------------------------------------------------------ */

/* The row of round n once it is open (or past it). */
static StoreRound round_row(int64_t n) {
    char err[ERR_LEN];
    StoreRound r;
    for (int i = 0; i < 300; i++) {
        Store *s = store_ro();
        int rc = store_round_get(s, n, &r, err);
        store_close(s);
        if (rc == 0) return r;
        usleep(100000);
    }
    cr_assert_fail("round %lld did not open within 30 s", (long long)n);
    return r;
}

/* When the accepted update of `site` arrived in round row r, ms after the
 * attempt opened; -1: none. */
static int64_t arrival_of(const StoreRound *r, const char *site) {
    char err[ERR_LEN];
    Store *s = store_ro();
    StoreUpdate *ups;
    size_t n;
    cr_assert_eq(store_updates_list(s, r->id, &ups, &n, err), 0, "%s", err);
    int64_t ms = -1;
    for (size_t i = 0; i < n; i++)
        if (strcmp(ups[i].site_name, site) == 0 && strcmp(ups[i].state, "accepted") == 0)
            ms = ups[i].received_at - r->opened_at;
    free(ups);
    store_close(s);
    return ms;
}

/* One site sets the pace: m heartbeats through every round and sends a
 * tiny update 2.5x as late as the honest sites b and c send theirs. Its own
 * history says that is its usual arrival, so a rule judged against it
 * alone waits for it every round. Judged against the quorum's usual
 * arrival instead, once three rounds have said it, a round stops waiting
 * for m a quarter past the honest sites' pace (a second at least), and
 * `strait rounds` names m late. */
Test(adversary, a_late_every_round_site_does_not_set_the_pace) {
    federation_ini("mean", "2", "60s");
    ini_set("rounds", "total", "7");
    start_coordinator();
    char b_dir[700], c_dir[700], m_dir[700], details[256];
    site("b", b_dir, sizeof b_dir), site("c", c_dir, sizeof c_dir), site("m", m_dir, sizeof m_dir);
    NetChannel *b = attacker_channel(b_dir, addr), *c = attacker_channel(c_dir, addr),
               *m = attacker_channel(m_dir, addr);
    Model t = tiny();
    Blob honest = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-3f);
    Blob tiny_update = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-4f);
    const int64_t honest_ms = 4000, late_ms = 10000, rounds = 7;
    for (int64_t n = 0; n < rounds; n++) {
        StoreRound open = round_row(n);
        /* round 0 holds every site's start-up and teaches nothing: all at once */
        int64_t send_at = open.opened_at + (n == 0 ? 0 : honest_ms);
        int64_t late_at = open.opened_at + (n == 0 ? 0 : late_ms);
        char id[3][32];
        snprintf(id[0], sizeof id[0], "b-r%lld", (long long)n);
        snprintf(id[1], sizeof id[1], "c-r%lld", (long long)n);
        snprintf(id[2], sizeof id[2], "m-r%lld", (long long)n);
        AttackClaim cb = {(uint64_t)n, id[0], 1000, NULL, 0, NULL, 0, honest_ms - 500, 50};
        AttackClaim cc = {(uint64_t)n, id[1], 1000, NULL, 0, NULL, 0, honest_ms - 500, 50};
        AttackClaim cm = {(uint64_t)n, id[2], 10, NULL, 0, NULL, 0, late_ms - 500, 50};
        int sent = 0, moved = 0;
        while (!moved && time_wall_ms() < late_at) {
            AttackBeat beat;
            cr_assert_eq(attacker_heartbeat(m, (uint64_t)n, 5000, &beat, details, sizeof details),
                         NET_OK, "%s", details);
            moved = beat.current_round > (uint64_t)n;
            if (!sent && time_wall_ms() >= send_at) {
                cr_assert_eq(attacker_push(b, &cb, &honest, details, sizeof details), NET_OK, "%s",
                             details);
                cr_assert_eq(attacker_push(c, &cc, &honest, details, sizeof details), NET_OK, "%s",
                             details);
                sent = 1;
            }
            usleep(200000);
        }
        if (!sent) {
            cr_assert_eq(attacker_push(b, &cb, &honest, details, sizeof details), NET_OK, "%s",
                         details);
            cr_assert_eq(attacker_push(c, &cc, &honest, details, sizeof details), NET_OK, "%s",
                         details);
        }
        /* the round may have closed without it: then it is refused, and m
         * tries again next round */
        if (!moved) attacker_push(m, &cm, &tiny_update, details, sizeof details);
        wait_committed(n, 60);
    }
    /* rounds 1 to 3 teach the arrivals (round 0 does not count); from
     * round 4 on, each round is held to the honest sites' pace */
    for (int64_t n = 4; n < rounds; n++) {
        StoreRound r = wait_committed(n, 1);
        int64_t in_b = arrival_of(&r, "b"), in_c = arrival_of(&r, "c");
        int64_t pace = in_b > in_c ? in_b : in_c;
        int64_t took = r.closed_at - r.opened_at;
        cr_assert_gt(pace, 0, "round %lld took no update from b or c", (long long)n);
        cr_log_info("round %lld: the honest sites in by %.2f s, the round took %.2f s (%.2fx)",
                    (long long)n, pace / 1e3, took / 1e3, (double)took / (double)pace);
        cr_assert_lt((double)took, 1.5 * (double)pace,
                     "round %lld took %.2f s, %.2fx the honest sites' %.2f s: m set its pace",
                     (long long)n, took / 1e3, (double)took / (double)pace, pace / 1e3);
    }
    /* m is named, in the rounds that stopped waiting for it */
    ProcResult pr = S("rounds", fed, "--json");
    cr_assert_eq(pr.status, 0, "%s", pr.err);
    int named = 0;
    for (char *save = NULL, *line = strtok_r(pr.out, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        cr_assert_not_null(o, "%s: %s", je.text, line);
        json_int_t n = json_integer_value(json_object_get(o, "round"));
        json_t *late = json_object_get(o, "late");
        const char *first = json_string_value(json_array_get(late, 0));
        if (n >= 4) named += first && strncmp(first, "m ", 2) == 0;
        cr_log_info("round %lld: goodput %.3f", (long long)n,
                    json_real_value(json_object_get(o, "goodput")));
        json_decref(o);
    }
    proc_result_free(&pr);
    cr_assert_eq(named, rounds - 4, "strait rounds named m late in %d of %lld rounds", named,
                 (long long)(rounds - 4));
    net_channel_destroy(b), net_channel_destroy(c), net_channel_destroy(m);
    blob_free(&honest), blob_free(&tiny_update);
    model_free(&t);
}

/* ---- differential privacy ---------------------------------------------------------- */

/* Sites a and b each send their update for `round`, trained from the
 * model sha names, claiming 1000 and tokens_b tokens; both are taken. */
static void push_both(NetChannel *a, NetChannel *b, int round, const uint8_t sha[32],
                      const Blob *ua, const Blob *ub, uint64_t tokens_b) {
    char ida[16], idb[16], details[256];
    snprintf(ida, sizeof ida, "a-%d", round), snprintf(idb, sizeof idb, "b-%d", round);
    AttackClaim ca = {(uint64_t)round, ida, 1000, NULL, 10, sha, 0, 0, 0};
    AttackClaim cb = {(uint64_t)round, idb, tokens_b, NULL, 10, sha, 0, 0, 0};
    cr_assert_eq(attacker_push(a, &ca, ua, details, sizeof details), NET_OK, "%s", details);
    cr_assert_eq(attacker_push(b, &cb, ub, details, sizeof details), NET_OK, "%s", details);
}

static void dp_ini(const char *clip, const char *z, const char *budget) {
    ini_set("optimizer", "outer", "avg");
    ini_set("optimizer", "lr", "1");
    ini_set("codec", "downlink", "lossless");
    ini_set("privacy", "dp", "central");
    ini_set("privacy", "clip", clip);
    ini_set("privacy", "noise_multiplier", z);
    ini_set("privacy", "delta", "1e-5");
    if (budget) ini_set("privacy", "epsilon_budget", budget);
}

/* The update's values as the coordinator decodes them. */
static float *decoded(const Model *t, const Blob *b) {
    char err[ERR_LEN];
    RoundSum rs;
    float *x = malloc(t->n_params * 4);
    cr_assert_eq(round_sum_init(&rs, t->n_params, t->table_hash, 0, err), 0, "%s", err);
    cr_assert_eq(round_sum_add(&rs, b->data, b->len, 1, err), 0, "%s", err);
    cr_assert_eq(round_sum_mean(&rs, x, err), 0, "%s", err);
    round_sum_free(&rs);
    return x;
}

/* What θ moved by less the mean of the updates each clipped to `clip` and
 * weighed alike, into resid: the noise, if the coordinator did its part. */
static void dp_residual(const Model *t, const float *before, const float *after, const Blob *ups,
                        int k, double clip, double *resid) {
    size_t n = t->n_params;
    /* the outer step (avg, lr 1) moves θ by minus the mean: Δ is θ_r − θ_local */
    for (size_t i = 0; i < n; i++) resid[i] = (double)before[i] - after[i];
    for (int j = 0; j < k; j++) {
        double s = fmin(1.0, clip / blob_norm(t, &ups[j]));
        float *x = decoded(t, &ups[j]);
        for (size_t i = 0; i < n; i++) resid[i] -= s * x[i] / k;
        free(x);
    }
}

/* resid · b / ‖b‖: the residual along an update's direction. */
static double along(const Model *t, const double *resid, const Blob *b) {
    float *x = decoded(t, b);
    double dot = 0, nn = 0;
    for (size_t i = 0; i < t->n_params; i++) dot += resid[i] * x[i], nn += (double)x[i] * x[i];
    free(x);
    return dot / sqrt(nn);
}

/* [privacy] dp = central against a site that sends an update twenty
 * times the clip bound (inside max_update_ratio) and claims five times the
 * tokens: the round's mean is the two updates clipped to the bound and
 * weighed alike. What θ moved beyond that is the noise: along each
 * update's direction it is one Gaussian draw of deviation σ = 0.1 × 0.5 /
 * 2 (unclipped, the hostile update would leave 190 σ there; weighed by
 * its claim, 6.7 σ), and over the model's values it has mean 0 and
 * deviation σ. The round's row holds its noise multiplier and ε, as the
 * accountant gives them, and strait rounds and strait status report it. */
Test(adversary, central_dp_clips_every_update_weighs_them_alike_and_adds_calibrated_noise) {
    federation_ini("mean", "2", "60s");
    dp_ini("0.5", "0.1", NULL);
    start_coordinator();
    char a_dir[700], b_dir[700];
    site("a", a_dir, sizeof a_dir), site("b", b_dir, sizeof b_dir);
    NetChannel *a = attacker_channel(a_dir, addr), *b = attacker_channel(b_dir, addr);
    Model t = tiny();
    size_t n = t.n_params;
    Blob u[2] = {attacker_update("int8", t.table_hash, n, 0, 1e-4f),
                 attacker_update("int8", t.table_hash, n, 0, 1e-4f)};
    double na = blob_norm(&t, &u[0]);
    blob_free(&u[1]);
    u[1] = attacker_update("int8", t.table_hash, n, 0, (float)(1e-4 * 20 * 0.5 / na));
    cr_assert_lt(na, 0.5, "the honest update is inside the bound (%g)", na);
    cr_assert_gt(blob_norm(&t, &u[1]), 9, "the hostile one is far outside it");
    uint8_t sha[32];
    security_sha256(t.params, n * 4, sha);
    push_both(a, b, 0, sha, &u[0], &u[1], 5000);
    StoreRound r0 = wait_committed(0, 30);
    float *after = checkpoint_params(&r0);
    double *resid = malloc(n * sizeof *resid), sum = 0, sum2 = 0;
    dp_residual(&t, t.params, after, u, 2, 0.5, resid);
    for (size_t i = 0; i < n; i++) sum += resid[i], sum2 += resid[i] * resid[i];
    double mean = sum / n, sd = sqrt(sum2 / n - mean * mean), want = 0.1 * 0.5 / 2;
    /* 4 σ: one draw each, passed by chance once in 16,000 */
    double hostile = along(&t, resid, &u[1]), honest = along(&t, resid, &u[0]);
    cr_assert_lt(fabs(hostile), 4 * want, "the hostile update's direction holds %g (sigma %g)",
                 hostile, want);
    cr_assert_lt(fabs(honest), 4 * want, "the honest update's direction holds %g (sigma %g)",
                 honest, want);
    /* ten standard errors: the mean's want/√n, the deviation's want/√(2n) */
    cr_assert_lt(fabs(mean), 10 * want / sqrt((double)n), "the noise's mean is %g", mean);
    cr_assert_lt(fabs(sd - want), 10 * want / sqrt(2.0 * n),
                 "the noise's deviation is %g, not %g: the mean was not of clipped updates", sd,
                 want);
    cr_assert_float_eq(r0.dp_noise, 0.1, 0);
    cr_assert_float_eq(r0.dp_delta, 1e-5, 0);
    double eps = privacy_epsilon(privacy_spend(0.1), 1e-5, NULL);
    cr_assert_float_eq(r0.dp_epsilon, eps, 1e-12 * eps);
    ProcResult rr = S("rounds", fed, "--json");
    cr_assert_eq(rr.status, 0, "%s", rr.err);
    json_t *o = json_loads(rr.out, 0, NULL);
    cr_assert_not_null(o, "%s", rr.out);
    json_t *row = o; /* one round, one line */
    /* (JSON carries six digits) */
    cr_assert_float_eq(json_real_value(json_object_get(row, "dp_epsilon")), eps, 1e-5 * eps, "%s",
                       rr.out);
    json_decref(o);
    proc_result_free(&rr);
    ProcResult st = S("status", fed);
    cr_assert_eq(st.status, 0, "%s", st.err);
    char line[128];
    snprintf(line, sizeof line, "privacy      \u03b5 %.4g at \u03b4 1e-05 after round 0", eps);
    cr_assert_not_null(strstr(st.out, line), "no '%s' in:\n%s", line, st.out);
    proc_result_free(&st);
    free(resid), free(after);
    blob_free(&u[0]), blob_free(&u[1]);
    net_channel_destroy(a), net_channel_destroy(b);
    model_free(&t);
}

/* epsilon_budget ends the federation before the round that would pass
 * it, a restart keeps the account of the rounds before it (ε after round
 * 2 is three rounds' worth), and a coordinator started with the budget
 * spent is refused. */
Test(adversary, the_privacy_budget_ends_the_federation_and_a_restart_keeps_its_account) {
    federation_ini("mean", "2", "60s");
    double z = 2, three = privacy_epsilon(3 * privacy_spend(z), 1e-5, NULL);
    char budget[32];
    snprintf(budget, sizeof budget, "%.17g", three * 1.001);
    dp_ini("1", "2", budget);
    ini_set("rounds", "total", "10");
    start_coordinator();
    char a_dir[700], b_dir[700];
    site("a", a_dir, sizeof a_dir), site("b", b_dir, sizeof b_dir);
    Model t = tiny();
    size_t n = t.n_params;
    Blob u = attacker_update("int8", t.table_hash, n, 0, 1e-4f);
    float *theta = malloc(n * 4);
    memcpy(theta, t.params, n * 4);
    for (int round = 0; round < 3; round++) {
        if (round == 2) { /* a restart between rounds 1 and 2 */
            cr_assert_eq(proc_stop(coord, 10000), 0);
            start_coordinator();
        }
        NetChannel *a = attacker_channel(a_dir, addr), *b = attacker_channel(b_dir, addr);
        uint8_t sha[32];
        security_sha256(theta, n * 4, sha);
        push_both(a, b, round, sha, &u, &u, 1000);
        StoreRound r = wait_committed(round, 30);
        double eps = privacy_epsilon((round + 1) * privacy_spend(z), 1e-5, NULL);
        cr_assert_float_eq(r.dp_epsilon, eps, 1e-12 * eps, "round %d: %g", round, r.dp_epsilon);
        float *next = checkpoint_params(&r);
        memcpy(theta, next, n * 4);
        free(next);
        net_channel_destroy(a), net_channel_destroy(b);
    }
    /* three rounds were all the budget held: finished, with no fourth opened */
    ProcResult st = S("status", fed, "--json");
    cr_assert_eq(st.status, 0, "%s", st.err);
    json_t *o = json_loads(st.out, 0, NULL);
    cr_assert_not_null(o, "%s", st.out);
    cr_assert_str_eq(json_string_value(json_object_get(o, "round_state")), "finished", "%s",
                     st.out);
    cr_assert_eq(json_integer_value(json_object_get(o, "total_rounds")), 3, "%s", st.out);
    cr_assert_float_eq(json_real_value(json_object_get(o, "dp_epsilon")), three, 1e-5 * three, "%s",
                       st.out);
    json_decref(o);
    proc_result_free(&st);
    cr_assert_eq(proc_stop(coord, 10000), 0);
    coord = -1;
    /* started again with the budget spent: refused, saying so */
    ProcResult again = S("coordinator", "start", fed);
    cr_assert_neq(again.status, 0, "started with its budget spent: %s", again.out);
    cr_assert_not_null(strstr(again.err, "epsilon_budget"), "%s", again.err);
    cr_assert_not_null(strstr(again.err, "is spent"), "%s", again.err);
    proc_result_free(&again);
    free(theta), blob_free(&u);
    model_free(&t);
}

Test(adversary, dp_cannot_be_turned_on_over_rounds_without_noise) {
    federation_ini("mean", "2", "60s");
    ini_set("codec", "downlink", "lossless");
    start_coordinator();
    char a_dir[700], b_dir[700];
    site("a", a_dir, sizeof a_dir), site("b", b_dir, sizeof b_dir);
    NetChannel *a = attacker_channel(a_dir, addr), *b = attacker_channel(b_dir, addr);
    Model t = tiny();
    Blob u = attacker_update("int8", t.table_hash, t.n_params, 0, 1e-4f);
    uint8_t sha[32];
    security_sha256(t.params, t.n_params * 4, sha);
    push_both(a, b, 0, sha, &u, &u, 1000);
    wait_committed(0, 30);
    net_channel_destroy(a), net_channel_destroy(b);
    cr_assert_eq(proc_stop(coord, 10000), 0);
    coord = -1;
    ini_set("rounds", "total", "3");
    dp_ini("1", "1", NULL);
    ProcResult r = S("coordinator", "start", fed);
    cr_assert_neq(r.status, 0, "the coordinator started: %s", r.out);
    cr_assert_not_null(strstr(r.err, "1 committed rounds of this federation had no noise"), "%s",
                       r.err);
    proc_result_free(&r);
    blob_free(&u);
    model_free(&t);
}

/* ---- secure aggregation: sites that drop out and peers that lie ------------------------- */

typedef struct SaCall { /* one SecAgg call, on a thread of its own (a phase parks it) */
    NetChannel *ch;
    Strait__SecAggRequest q;
    Strait__SecAggResponse *resp;
    NetStatus st;
    char details[256];
} SaCall;

static void *sa_call_main(void *arg) {
    SaCall *c = arg;
    size_t n = strait__sec_agg_request__get_packed_size(&c->q);
    uint8_t *buf = malloc(n ? n : 1);
    strait__sec_agg_request__pack(&c->q, buf);
    NetBuf resp;
    c->resp = NULL;
    c->st = net_unary(c->ch, "/strait.Federation/SecAgg", buf, n, &resp, 60000, c->details,
                      sizeof c->details);
    if (c->st == NET_OK) {
        c->resp = strait__sec_agg_response__unpack(NULL, resp.len, resp.data);
        net_buf_free(&resp);
    }
    free(buf);
    return NULL;
}

static NetStatus sa_call(SaCall *c) {
    sa_call_main(c);
    return c->st;
}

/* Three sites (all of them the test's, driving privacy/secagg_proto.c
 * over the real SecAgg call): a and b send their masked updates; c shares
 * its seeds, then sends only bytes that are not a masked update and drops.
 * The coordinator refuses c's malformed keys and bytes, an envelope to the
 * sender itself, a's shares sealed to one neighbour of its two, and a
 * reveal of a survivor's mask key (with its self seed
 * it would unmask that survivor's update alone), waits the phase timeout
 * for c, unmasks a's and b's sum with c's mask key rebuilt from their
 * shares, and commits θ0 + the mean of what a and b sent — what the sites
 * quantized, to float rounding. */
Test(adversary, secure_aggregation_survives_a_site_that_drops_and_refuses_what_peers_fake) {
    federation_ini("mean", "2", "60s");
    ini_set("optimizer", "outer", "avg");
    ini_set("optimizer", "lr", "1");
    ini_set("codec", "downlink", "lossless");
    ini_set("privacy", "secure_aggregation", "on");
    ini_set("privacy", "range", "0.01");
    ini_set("privacy", "phase_timeout", "2s");
    start_coordinator();
    char dir[3][700];
    const char *names[3] = {"a", "b", "c"};
    NetChannel *ch[3];
    for (int i = 0; i < 3; i++) {
        site(names[i], dir[i], sizeof dir[i]);
        ch[i] = attacker_channel(dir[i], addr);
    }
    Model t = tiny();
    size_t n = t.n_params;
    char err[ERR_LEN];
    /* c's keys of the wrong length, and of small order: refused */
    SaCall bad = {.ch = ch[2]};
    strait__sec_agg_request__init(&bad.q);
    bad.q.round = 0, bad.q.phase = 1;
    uint8_t junk[96] = {0};
    bad.q.advert.data = junk, bad.q.advert.len = 10;
    cr_assert_eq(sa_call(&bad), NET_INVALID_ARGUMENT, "%s", bad.details);
    bad.q.advert.len = 96;
    cr_assert_eq(sa_call(&bad), NET_INVALID_ARGUMENT, "%s", bad.details);
    cr_assert(strstr(bad.details, "X25519"), "%s", bad.details);
    /* KEYS: each parked until all three have sent theirs */
    SecaggSite *me[3];
    SecaggAdvert ad[3];
    SaCall call[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        me[i] = secagg_site_new(&ad[i], err);
        cr_assert_not_null(me[i], "%s", err);
        memset(&call[i], 0, sizeof call[i]);
        call[i].ch = ch[i];
        strait__sec_agg_request__init(&call[i].q);
        call[i].q.round = 0, call[i].q.phase = 1;
        call[i].q.advert.data = (uint8_t *)&ad[i], call[i].q.advert.len = sizeof ad[i];
        pthread_create(&th[i], NULL, sa_call_main, &call[i]);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    Strait__SecAggResponse *k[3];
    SecaggParams p;
    SecaggAdvert cohort[3];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(call[i].st, NET_OK, "%s: %s", names[i], call[i].details);
        k[i] = call[i].resp;
        cr_assert(k[i]->sites == 3 && k[i]->n_adverts == 3);
    }
    cr_assert_eq(secagg_params(3, (int)k[0]->bits, k[0]->range, k[0]->context, &p, err), 0, "%s",
                 err);
    for (int j = 0; j < 3; j++) memcpy(&cohort[j], k[0]->adverts[j].data, sizeof cohort[j]);
    /* SHARES: an envelope to itself is refused; then each its own */
    SecaggEnvelope env[3][SECAGG_MAX_DEGREE];
    int n_env[3];
    Strait__SecAggEnvelope pe[3][SECAGG_MAX_DEGREE], *pp[3][SECAGG_MAX_DEGREE];
    for (int i = 0; i < 3; i++) {
        int idx = (int)k[i]->index;
        cr_assert_eq(secagg_site_share(me[i], &p, idx, cohort, env[i], &n_env[i], err), 0, "%s",
                     err);
        for (int e = 0; e < n_env[i]; e++) {
            strait__sec_agg_envelope__init(&pe[i][e]);
            pe[i][e].from = (uint32_t)env[i][e].from, pe[i][e].to = (uint32_t)env[i][e].to;
            pe[i][e].box.data = env[i][e].box, pe[i][e].box.len = SECAGG_BOX;
            pp[i][e] = &pe[i][e];
        }
    }
    SaCall self = {.ch = ch[0]};
    strait__sec_agg_request__init(&self.q);
    self.q.round = 0, self.q.phase = 2, self.q.attempt = k[0]->attempt;
    Strait__SecAggEnvelope to_self = pe[0][0];
    to_self.to = k[0]->index;
    Strait__SecAggEnvelope *to_self_p = &to_self;
    self.q.n_envelopes = 1, self.q.envelopes = &to_self_p;
    cr_assert_eq(sa_call(&self), NET_INVALID_ARGUMENT, "%s", self.details);
    /* and one envelope of its two: the other neighbour's pair mask would
     * stay in the sum */
    self.q.envelopes = pp[0], self.q.n_envelopes = 1;
    cr_assert_eq(sa_call(&self), NET_INVALID_ARGUMENT, "%s", self.details);
    cr_assert(strstr(self.details, "one each"), "%s", self.details);
    for (int i = 0; i < 3; i++) {
        memset(&call[i], 0, sizeof call[i]);
        call[i].ch = ch[i];
        strait__sec_agg_request__init(&call[i].q);
        call[i].q.round = 0, call[i].q.phase = 2, call[i].q.attempt = k[i]->attempt;
        call[i].q.n_envelopes = (size_t)n_env[i], call[i].q.envelopes = pp[i];
        pthread_create(&th[i], NULL, sa_call_main, &call[i]);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    /* a and b mask and send; c sends bytes that are not a masked update */
    float *x = malloc(n * sizeof *x), *sent[2];
    uint32_t *y = malloc(n * sizeof *y);
    uint8_t sha[32];
    security_sha256(t.params, n * 4, sha);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(call[i].st, NET_OK, "%s: %s", names[i], call[i].details);
        Strait__SecAggResponse *sh = call[i].resp;
        SecaggEnvelope in[SECAGG_MAX_DEGREE];
        for (size_t e = 0; e < sh->n_envelopes; e++) {
            in[e].from = (int)sh->envelopes[e]->from, in[e].to = (int)sh->envelopes[e]->to;
            memcpy(in[e].box, sh->envelopes[e]->box.data, SECAGG_BOX);
        }
        if (i == 2) {
            Blob junkb = {0};
            junkb.len = 64, junkb.data = calloc(1, 64);
            AttackClaim cc = {0, "c-0", 1000, NULL, 10, sha, 0, 0, 0};
            char details[256];
            cr_assert_eq(attacker_push(ch[2], &cc, &junkb, details, sizeof details),
                         NET_FAILED_PRECONDITION, "%s", details);
            cr_assert(strstr(details, "masked update"), "%s", details);
            blob_free(&junkb);
            strait__sec_agg_response__free_unpacked(sh, NULL);
            continue;
        }
        for (size_t v = 0; v < n; v++) x[v] = (float)(0.004 * sin(0.1 * v + i));
        sent[i] = malloc(n * sizeof *sent[i]);
        cr_assert_eq(
            secagg_site_mask(me[i], cohort, in, (int)sh->n_envelopes, x, n, y, sent[i], err), 0,
            "%s", err);
        Blob mb = {0};
        mb.len = secagg_masked_len(n, p.bits), mb.data = malloc(mb.len);
        secagg_masked_pack(y, n, p.bits, k[i]->index, k[i]->attempt, mb.data);
        char id[16], details[256];
        snprintf(id, sizeof id, "%s-0", names[i]);
        AttackClaim cl = {0, id, 1000, NULL, 10, sha, 0, 0, 0};
        cr_assert_eq(attacker_push(ch[i], &cl, &mb, details, sizeof details), NET_OK, "%s",
                     details);
        blob_free(&mb);
        strait__sec_agg_response__free_unpacked(sh, NULL);
    }
    /* SURVIVORS: a waits out c's phase timeout; then a's forged reveal of
     * b's mask key, refused, and each survivor's own */
    Strait__SecAggResponse *surv[2];
    for (int i = 0; i < 2; i++) {
        memset(&call[i], 0, sizeof call[i]);
        call[i].ch = ch[i];
        strait__sec_agg_request__init(&call[i].q);
        call[i].q.round = 0, call[i].q.phase = 3, call[i].q.attempt = k[i]->attempt;
        cr_assert_eq(sa_call(&call[i]), NET_OK, "%s", call[i].details);
        surv[i] = call[i].resp;
        cr_assert_eq(surv[i]->survived.len, 3);
        cr_assert(!surv[i]->survived.data[k[2]->index], "c sent no masked update");
    }
    for (int i = 0; i < 2; i++) {
        SecaggReveal rv[SECAGG_MAX_DEGREE + 1];
        int m;
        cr_assert_eq(secagg_site_reveal(me[i], surv[i]->survived.data, rv, &m, err), 0, "%s", err);
        Strait__SecAggReveal pr[SECAGG_MAX_DEGREE + 1], *prp[SECAGG_MAX_DEGREE + 1];
        for (int e = 0; e < m; e++) {
            strait__sec_agg_reveal__init(&pr[e]);
            pr[e].owner = (uint32_t)rv[e].owner, pr[e].key = rv[e].key;
            pr[e].share.data = rv[e].share, pr[e].share.len = SECAGG_SHARE;
            prp[e] = &pr[e];
        }
        SaCall rc = {.ch = ch[i]};
        strait__sec_agg_request__init(&rc.q);
        rc.q.round = 0, rc.q.phase = 4, rc.q.attempt = k[i]->attempt;
        rc.q.n_reveals = (size_t)m, rc.q.reveals = prp;
        if (i == 0) { /* b survived: its mask key is not the unmasking's to take */
            for (int e = 0; e < m; e++) pr[e].key = pr[e].owner == k[1]->index ? 1 : pr[e].key;
            cr_assert_eq(sa_call(&rc), NET_INVALID_ARGUMENT, "%s", rc.details);
            cr_assert(strstr(rc.details, "does not take"), "%s", rc.details);
            for (int e = 0; e < m; e++) pr[e].key = rv[e].key;
        }
        cr_assert_eq(sa_call(&rc), NET_OK, "%s", rc.details);
        strait__sec_agg_response__free_unpacked(rc.resp, NULL);
    }
    StoreRound r0 = wait_committed(0, 30);
    cr_assert_eq(r0.participants, 2);
    cr_assert_eq(rejected_with(r0.id, "malformed"), 1, "c's bytes are in the ledger, refused");
    /* θ1 = θ0 − (sent_a + sent_b) / 2 by the coordinator's outer step */
    float *mean = malloc(n * sizeof *mean);
    for (size_t v = 0; v < n; v++) mean[v] = (sent[0][v] + sent[1][v]) / 2;
    OuterOpt o;
    cr_assert_eq(outer_init(&o, OUTER_AVG, n, 1.0f, 0.0f, err), 0, "%s", err);
    float *want = malloc(n * 4);
    memcpy(want, t.params, n * 4);
    outer_step(&o, want, mean);
    float *got = checkpoint_params(&r0);
    double far = 0, moved = 0;
    for (size_t v = 0; v < n; v++)
        far = fmax(far, fabs((double)got[v] - want[v])),
        moved = fmax(moved, fabs((double)got[v] - t.params[v]));
    cr_assert_gt(moved, 1e-3, "the round did not move the model");
    cr_assert_lt(far, 1e-6, "the committed model is %g from θ0 − the survivors' mean", far);
    outer_free(&o);
    free(got), free(want), free(mean), free(x), free(y), free(sent[0]), free(sent[1]);
    for (int i = 0; i < 3; i++) {
        secagg_site_free(me[i]);
        strait__sec_agg_response__free_unpacked(k[i], NULL);
        net_channel_destroy(ch[i]);
    }
    for (int i = 0; i < 2; i++) strait__sec_agg_response__free_unpacked(surv[i], NULL);
    model_free(&t);
}

/* A site's own floor on privacy (--min-noise): against a coordinator
 * without secure aggregation it sends nothing and says why at start; in a
 * round whose coordinator asks for less noise than the floor (here 0.5
 * against 1, the cohort's other member the test) it stops after the keys,
 * before anything of its update leaves, and says so in one line. */
Test(adversary, a_site_with_a_privacy_floor_sends_nothing_below_it) {
    init_federation();
    start_coordinator();
    char dir[700], data[800];
    real_site_s(dir, sizeof dir, data, sizeof data);
    ProcResult r = S("site", "run", dir, "--data", data, "--min-noise", "1");
    cr_assert_eq(r.status, 1, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "without secure aggregation"), "%s", r.err);
    cr_assert_eq(harness_count_lines(r.err), 1, "%s", r.err);
    proc_result_free(&r);
    cr_assert_eq(proc_stop(coord, 10000), 0);
    coord = -1;
    ini_set("privacy", "secure_aggregation", "on");
    ini_set("privacy", "range", "0.05");
    ini_set("privacy", "dp", "distributed");
    ini_set("privacy", "clip", "0.5");
    ini_set("privacy", "noise_multiplier", "0.5");
    ini_set("privacy", "delta", "1e-5");
    start_coordinator();
    char other[700], err[ERR_LEN];
    site("t", other, sizeof other);
    NetChannel *ch = attacker_channel(other, addr);
    SecaggAdvert ad;
    SecaggSite *me = secagg_site_new(&ad, err);
    cr_assert_not_null(me, "%s", err);
    SaCall keys = {.ch = ch};
    strait__sec_agg_request__init(&keys.q);
    keys.q.round = 0, keys.q.phase = 1;
    keys.q.advert.data = (uint8_t *)&ad, keys.q.advert.len = sizeof ad;
    pthread_t th;
    pthread_create(&th, NULL, sa_call_main, &keys);
    r = S("site", "run", dir, "--data", data, "--min-noise", "1");
    pthread_join(th, NULL);
    cr_assert_eq(keys.st, NET_OK, "%s", keys.details);
    cr_assert(keys.resp->noise_multiplier == 0.5 && keys.resp->clip == 0.5, "the round's DP");
    cr_assert_eq(r.status, 1, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "under this site's floor"), "%s", r.err);
    cr_assert_eq(harness_count_lines(r.err), 1, "%s", r.err);
    proc_result_free(&r);
    /* nothing of it reached the coordinator: no update in the round's ledger */
    char db[800];
    snprintf(db, sizeof db, "%s/%s", fed, STORE_DB_FILE);
    Store *st = store_open(db, STORE_READONLY, err);
    cr_assert_not_null(st, "%s", err);
    StoreRound r0;
    cr_assert_eq(store_round_get(st, 0, &r0, err), 0, "%s", err);
    StoreUpdate *ups;
    size_t nu;
    cr_assert_eq(store_updates_list(st, r0.id, &ups, &nu, err), 0, "%s", err);
    cr_assert_eq(nu, 0, "%zu updates recorded (the first from %s)", nu, nu ? ups[0].site_name : "");
    free(ups);
    store_close(st);
    strait__sec_agg_response__free_unpacked(keys.resp, NULL);
    secagg_site_free(me);
    net_channel_destroy(ch);
}
