/*
 * test_load.c — a thousand sites against one coordinator (make test-wan):
 * 1,000 enrolled sites, each with its own certificate and TLS connection,
 * send prepared int8 updates of `tiny` (a real update's size and codec, not
 * a thousand trainers) for several rounds, over loopback. Every round must
 * commit with every site's update, no upload that should be taken may be
 * refused, and the coordinator's memory and CPU per round are printed (one
 * JSON line a round on stderr). A second case: six sites of GPT-2 large
 * beside NVIDIA FLARE's published figure.
 */
#include <pthread.h>
#include <sys/statvfs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "client/client_internal.h"
#include "coordinator/store.h"
#include "compress/compress.h"
#include "kernels/device.h"
#include "kernels/model.h"
#include "net/net.h"
#include "tests/attacker.h"
#include "tests/harness.h"
#include "tests/store_fixture.h"
#include "util/util.h"

#define SITES   1000
#define ROUNDS  3
#define PUSHERS 16

static char *root, fed[600], addr[64];
static int coord = -1;
static NetChannel *ch[SITES];

static void teardown(void) {
    for (int i = 0; i < SITES; i++)
        if (ch[i]) net_channel_destroy(ch[i]), ch[i] = NULL;
    if (coord > 0) proc_stop(coord, 20000), coord = -1;
    if (root) harness_rmtree(root), free(root), root = NULL;
    net_global_shutdown();
}

TestSuite(load, .fini = teardown, .timeout = 900);

typedef struct Pusher {
    int first, stride, n_sites, round;
    const Blob *update;
    int failed, retried;
    char why[400], retry_why[400];
} Pusher;

static void *pusher_main(void *arg) {
    Pusher *p = arg;
    for (int i = p->first; i < p->n_sites; i += p->stride) {
        char id[32], details[256];
        snprintf(id, sizeof id, "s%d-r%d", i, p->round);
        AttackClaim a = {(uint64_t)p->round, id, 1000, NULL, 0, NULL, 0, 5, 1};
        NetStatus st = NET_UNAVAILABLE;
        /* what a site retries, this retries (site_transient: a busy server
         * is routine, and so is a stream reset under load — counted, so
         * its rate stays in the round's line) */
        for (int attempt = 0; attempt < 5; attempt++) {
            st = attacker_push(ch[i], &a, p->update, details, sizeof details);
            if (st == NET_OK || !site_transient(st)) break;
            if (st != NET_RESOURCE_EXHAUSTED && st != NET_UNAVAILABLE && !p->retried++)
                snprintf(p->retry_why, sizeof p->retry_why, "s%d: %s: %s", i, net_status_name(st),
                         details);
            usleep(200000 << attempt);
        }
        if (st != NET_OK) {
            if (!p->failed++)
                snprintf(p->why, sizeof p->why, "s%d: %s: %s", i, net_status_name(st), details);
        }
    }
    return NULL;
}

/* The coordinator's resident memory (MiB), its peak, and its CPU seconds. */
static void coordinator_usage(int pid, double *rss, double *peak, double *cpu) {
    char path[64], *text = NULL, err[ERR_LEN];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    cr_assert_eq(file_read_all(path, 1 << 20, &text, NULL, err), 0, "%s", err);
    const char *r = strstr(text, "VmRSS:"), *h = strstr(text, "VmHWM:");
    *rss = r ? atof(r + 6) / 1024 : 0, *peak = h ? atof(h + 6) / 1024 : 0;
    free(text);
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    cr_assert_eq(file_read_all(path, 1 << 20, &text, NULL, err), 0, "%s", err);
    const char *p = strrchr(text, ')'); /* fields after the command's name */
    unsigned long long ut = 0, stime = 0;
    cr_assert_eq(
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &stime), 2);
    *cpu = (double)(ut + stime) / (double)sysconf(_SC_CLK_TCK);
    free(text);
}

/* An update as a trained site's looks to the codec: values that do not
 * repeat (zstd gains little), of a trained update's size. */
static Blob noisy_update(uint64_t table_hash, size_t n_params, const char *codec) {
    float *x = malloc(n_params * sizeof(float));
    cr_assert_not_null(x, "no memory for an update of %zu parameters", n_params);
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < n_params; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = 1e-3f * ((float)(s >> 40) / (float)(1 << 24) - 0.5f);
    }
    CodecParams p;
    char err[ERR_LEN];
    cr_assert_eq(codec_params_parse(codec, &p, err), 0, "%s", err);
    CodecLayout L = {table_hash, n_params, NULL, 0};
    Blob b = {0};
    cr_assert_eq(codec_encode(&p, &L, x, &b, err), 0, "%s", err);
    free(x);
    return b;
}

/* A federation of `model` for n_sites sites, every round waiting for all
 * of them, the coordinator started and each site enrolled with a channel
 * of its own. */
static void start_federation(const char *model, int n_sites, int rounds, const char *codec) {
    net_global_init();
    root = harness_tmpdir("load");
    snprintf(fed, sizeof fed, "%s/fed", root);
    ProcResult r = harness_strait("init", fed, "--listen", harness_listen(), "--model", model);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    char ini[700], total[16], sites[16];
    snprintf(ini, sizeof ini, "%s/federation.ini", fed);
    snprintf(total, sizeof total, "%d", rounds);
    snprintf(sites, sizeof sites, "%d", n_sites);
    harness_ini_set(ini, "rounds", "total", total);
    harness_ini_set(ini, "rounds", "min_sites", sites);
    harness_ini_set(ini, "rounds", "deadline", "1800s");
    if (codec) harness_ini_set(ini, "codec", "uplink", codec);
    /* every site calls from 127.0.0.1 here: one address (a NAT of sites) holds them all */
    harness_ini_set(ini, "limits", "connections_per_site_address", "4096");
    coord = harness_start_coordinator(fed, addr);
    cr_assert_gt(coord, 0, "the coordinator did not start");
    uint64_t t0 = time_monotonic_ns();
    for (int i = 0; i < n_sites; i++) {
        char name[16], dir[700];
        snprintf(name, sizeof name, "s%d", i);
        snprintf(dir, sizeof dir, "%s/%s", root, name);
        attacker_enroll(fed, addr, name, dir);
        ch[i] = attacker_channel(dir, addr);
    }
    fprintf(stderr, "{\"bench\":\"load\",\"sites\":%d,\"enroll_join_s\":%.1f}\n", n_sites,
            (double)(time_monotonic_ns() - t0) / 1e9);
}

/* Every site's update for `round`, from `threads` threads: none may be
 * refused or lost (retried as a site retries, the retries said). */
static void push_round(int n_sites, int threads, int round, const Blob *update) {
    pthread_t th[PUSHERS];
    Pusher p[PUSHERS];
    for (int t = 0; t < threads; t++) {
        memset(&p[t], 0, sizeof p[t]);
        p[t].first = t, p[t].stride = threads, p[t].n_sites = n_sites;
        p[t].round = round, p[t].update = update;
        cr_assert_eq(pthread_create(&th[t], NULL, pusher_main, &p[t]), 0);
    }
    int failed = 0, retried = 0;
    const char *why = "", *retry_why = "";
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        if (p[t].failed && !failed) why = p[t].why;
        if (p[t].retried && !retried) retry_why = p[t].retry_why;
        failed += p[t].failed, retried += p[t].retried;
    }
    if (retried)
        fprintf(stderr,
                "load: round %d: uploads failed on the wire and were sent again %d times, "
                "first %s\n",
                round, retried, retry_why);
    cr_assert_eq(failed, 0, "round %d: %d uploads refused or lost, first %s", round, failed, why);
}

/* `rounds` rounds of n_sites sites' prepared updates of `model` in
 * `codec`: every round commits with every update, and a JSON line a round
 * on stderr says its time and the coordinator's CPU and memory. */
static void load_run(const char *model, int n_sites, int threads, int rounds, const char *codec) {
    ModelConfig cfg;
    Model m;
    char err[ERR_LEN];
    cr_assert_eq(model_config_preset(model, &cfg), 0);
    cr_assert_eq(model_build(&m, &cfg, 1, err), 0, "%s", err);
    uint64_t table_hash = m.table_hash;
    size_t n_params = m.n_params;
    model_free(&m); /* only its table: the coordinator has the model */
    Blob update = noisy_update(table_hash, n_params, codec);
    /* the coordinator's disk at a commit: every site's spooled update, the
     * current checkpoint, the new one and the next model's delta */
    double need = ((double)n_sites * update.len + 3.0 * 4 * n_params) / (1u << 30) + 1;
    struct statvfs vfs;
    cr_assert_eq(statvfs("/tmp", &vfs), 0);
    double have = (double)vfs.f_bavail * vfs.f_frsize / (1u << 30);
    if (have < need) {
        blob_free(&update);
        cr_skip_test("%.1f GiB of disk free in /tmp; %d sites' updates of %s and its "
                     "checkpoints need %.1f",
                     have, n_sites, model, need);
    }
    start_federation(model, n_sites, rounds, codec);
    double rss0, peak0, cpu0;
    coordinator_usage(coord, &rss0, &peak0, &cpu0);
    for (int round = 0; round < rounds; round++) {
        uint64_t start = time_monotonic_ns();
        push_round(n_sites, threads, round, &update);
        StoreRound sr = store_fixture_wait_committed_by(fed, round, 1800, coord);
        cr_assert_eq(sr.participants, n_sites, "round %d committed with %lld sites", round,
                     (long long)sr.participants);
        double rss, peak, cpu;
        coordinator_usage(coord, &rss, &peak, &cpu);
        fprintf(stderr,
                "{\"bench\":\"load\",\"model\":\"%s\",\"params\":%zu,\"codec\":\"%s\","
                "\"sites\":%d,\"round\":%d,\"update_bytes\":%zu,\"round_s\":%.2f,"
                "\"coordinator_cpu_s\":%.2f,\"coordinator_rss_mib\":%.0f,"
                "\"coordinator_peak_mib\":%.0f}\n",
                model, n_params, codec, n_sites, round, update.len,
                (double)(time_monotonic_ns() - start) / 1e9, cpu - cpu0, rss, peak);
        cpu0 = cpu;
    }
    ProcResult chk = harness_strait("db", "check", fed);
    cr_assert_eq(chk.status, 0, "%s %s", chk.out, chk.err);
    proc_result_free(&chk);
    blob_free(&update);
}

Test(load, a_thousand_sites_every_round_commits) {
    load_run("tiny", SITES, PUSHERS, ROUNDS, "int8");
}

/* The largest figure NVIDIA FLARE publishes (examples/advanced/
 * tensor-stream/COMPARISON.md): 6 sites and GPT-2 large (774M parameters),
 * 154 s a round and 81.75 GiB at peak on a 256 GB machine that also ran
 * the six trainers. Here the sites are prepared updates, so a round's time
 * is the coordinator's alone: six uploads over loopback TLS, the merge, the
 * checkpoint and the next model's delta; fp32 updates, as FLARE sends the
 * model. Measured on a 2-core, 24 GB machine: 152 s and 132 s a round, the
 * coordinator's peak 17.4 GiB with fixed windows, 18.6 GiB with windows
 * sized from the link (six of the model's 2.9 GiB of fp32); with
 * the prepared update and 2 GiB besides, it skips, saying so, where less
 * than seven models' worth of memory is free, or less disk in /tmp than
 * the six spooled updates and three models' worth (20.6 GiB at most,
 * sampled every 10 s, on the machine above). */
Test(load, six_sites_of_gpt2_large_as_flare_measures_it, .timeout = 3600) {
    ModelConfig cfg;
    cr_assert_eq(model_config_preset("gpt2-large", &cfg), 0);
    double model = 4.0 * model_config_params(&cfg) / (double)(1u << 30);
    double need = 7 * model + 2, avail = kernels_mem_available() / (double)(1u << 30);
    if (avail < need)
        cr_skip_test("%.1f GiB of memory free; six fp32 updates of GPT-2 large need %.1f", avail,
                     need);
    load_run("gpt2-large", 6, 6, 2, "fp32");
}
