/*
 * wan.c — federations across the WAN test bed (tests/wan_bed.h), by round
 * mode: synchronous rounds against overlapped ones ([rounds] overlap) and
 * asynchronous ones ([rounds] mode = async: a round merges on a quorum of 3
 * of the 4 sites and a grace window, and takes updates up to 4 rounds old),
 * on the same links, sites, data and seeds. Async runs half as many rounds
 * again (each merges fewer updates), so that it can reach sync's loss. The bed: 4 sites, each link
 * 100 ms round trip (50 ms each way), 0.1% loss each way and 50 Mbit/s both ways but site 3's at 10
 * Mbit/s; each site a CPU share of its own through a cgroup's CFS quota (0.4 of a core; with
 * --slow, site 2 gets a third of that: three times slower at training). One JSON line per mode:
 *
 *   mode, wall_s (first opening to last commit), utilization and goodput
 *   (the store's, over every committed round: docs/operations.md),
 *   bytes_up, bytes_down, final_loss (the last checkpoint's held-out loss
 *   on collections no site trains on), time_to_target_s (the first commit
 *   whose checkpoint reaches sync's final loss), speedup_vs_sync (sync's
 *   time to that target over this mode's) and loss_vs_sync (this mode's
 *   held-out loss over sync's at equal tokens: both curves of loss against
 *   accepted tokens, read at the smaller of their last token counts).
 *
 *   build/bench/wan [--model M] [--rounds R] [--steps H] [--slow] [--faults] [--no-async]
 *
 * --faults runs the three modes under a fault schedule (the Schedule
 * below: link cuts, resets mid-upload, a coordinator restart), sync and
 * overlap too with the federation's default quorum of 3 (min_sites in each
 * line; without faults sync waits for all 4); each line
 * then also says what was carried out and how many committed rounds went
 * missing after (rounds_lost, to be 0). A site that stops fails the run.
 * --no-async leaves async out (sync and overlap only: at 200 inner steps
 * async alone takes a quarter of an hour).
 *
 * --pipe instead: a long fat pipe (issue 27's item 6). One site of
 * gpt2-124m with the fedavg recipe (fp32 updates, about 330 MB on the wire
 * after zstd) on a 1 Gbit/s link each way with 100 ms round trip and no
 * loss, 3 rounds of one inner step each, with [limits] stream_window = auto
 * and then fixed at 4 MiB; beside them, in the same run, raw TCP over the
 * same link each way (1 GiB through one socket, these namespaces' 64 MiB
 * TCP buffers). One JSON line per window: each round's upload and download
 * in Mbit/s (the update's wire bytes over the upload time the coordinator
 * measured; the round's model bytes over the download time the site
 * reported) and as a fraction of the link's 1000 Mbit/s.
 *
 * Needs root (namespaces, TUN, tc, cgroups); without it, one line says why.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <sqlite3.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coordinator/coordinator.h"
#include "kernels/train.h"
#include "tests/wan_bed.h"
#include "util/util.h"

#define SITES 4

static char strait_bin[1200], root[256];
static const char *model = "small";
static int rounds = 8, steps = 20, slow = 0, faults = 0;

static void ini_set(const char *fed, const char *section, const char *key, const char *value) {
    char path[600], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/federation.ini", fed);
    if (config_file_set(path, section, key, value, err) != 0) {
        fprintf(stderr, "bench/wan: %s\n", err);
        exit(1);
    }
}

/* A CPU share for pid: a cgroup (v1's cpu controller, else v2's) with a
 * CFS quota of `cores`; 0, or -1 when this machine has neither. */
static int write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f == NULL) return -1;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int cpu_share(int site, int pid, double cores, char *path, size_t len) {
    long quota = (long)(cores * 100000);
    char file[2048], v[64];
    snprintf(path, len, "/sys/fs/cgroup/cpu/swb%d-%d", (int)getpid(), site);
    if (access("/sys/fs/cgroup/cpu/cgroup.procs", F_OK) == 0 && mkdir(path, 0755) == 0) {
        snprintf(file, sizeof file, "%s/cpu.cfs_quota_us", path);
        snprintf(v, sizeof v, "%ld\n", quota);
    } else {
        snprintf(path, len, "/sys/fs/cgroup/swb%d-%d", (int)getpid(), site);
        if (mkdir(path, 0755) != 0) return -1;
        snprintf(file, sizeof file, "%s/cpu.max", path);
        snprintf(v, sizeof v, "%ld 100000\n", quota);
    }
    char procs[2048], p[32];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", path);
    snprintf(p, sizeof p, "%d\n", pid);
    return write_file(file, v) == 0 && write_file(procs, p) == 0 ? 0 : -1;
}

typedef struct Result {
    double wall_s, utilization, goodput, final_loss, ttt_s;
    int64_t bytes_up, bytes_down;
    int committed;
    int cuts, restarts; /* the fault schedule's, as carried out */
    long resets;        /* connections the relays reset */
    int rounds_lost;    /* rounds committed once and missing after */
    /* each committed round's checkpoint loss, when, and the tokens accepted
     * up to it */
    double loss[384], at_s[384], tokens[384];
} Result;

enum { SYNC, OVERLAP, ASYNC };
static const char *const mode_names[] = {"sync", "overlap", "async"};

/* The fault schedule (--faults): a 60 s cut of one site's link every ten
 * rounds (rounds 5, 15, ...; the sites in turn), one connection reset
 * mid-upload each round (armed on one site, in turn, when the round opens:
 * its next 400 KB towards the coordinator, about half of a small int8
 * update, then every connection on its link is reset), and the coordinator
 * stopped and started again once, when round 3 opens. The round the
 * federation is at comes from the store (read-only, beside the running
 * coordinator). */
typedef struct Schedule {
    char db[600];
    int next_round; /* the first round not yet acted on */
    int cuts, restarts;
    int64_t committed_max; /* the most rounds ever seen committed */
} Schedule;

/* The open round's number, or the last committed one's + 1; -1 when the
 * store cannot be read now. */
static int64_t store_round(const char *db, int64_t *committed) {
    sqlite3 *h = NULL;
    sqlite3_stmt *q = NULL;
    int64_t r = -1;
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_busy_timeout(h, 2000) == SQLITE_OK &&
        sqlite3_prepare_v2(h,
                           "SELECT coalesce(max(number), -1), "
                           "(SELECT count(DISTINCT number) FROM rounds WHERE state = 'committed') "
                           "FROM rounds WHERE state IN ('open', 'committed')",
                           -1, &q, NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        r = sqlite3_column_int64(q, 0), *committed = sqlite3_column_int64(q, 1);
    sqlite3_finalize(q);
    sqlite3_close(h);
    return r;
}

/* Starts the coordinator of fed in the bed, its log at log; 0 once it says
 * it listens. */
static int start_coordinator(const Bed *bed, const char *fed, const char *log, int *coord) {
    char line[256];
    char *argv[] = {strait_bin, "coordinator", "start", (char *)fed, NULL};
    int fd;
    *coord = bed_spawn(bed, -1, argv, log, &fd);
    if (*coord < 0) return -1;
    int ok = proc_read_line(fd, line, sizeof line, 60000) > 0;
    close(fd);
    return ok ? 0 : -1;
}

/* Enrolls site `name` with fed and joins it from site `i`'s namespace into
 * dir; 0, or -1 with why on stderr. */
static int enroll_join(const Bed *bed, const char *fed, int i, const char *name, const char *dir) {
    char *en[] = {strait_bin, "site", "enroll", (char *)fed, (char *)name, NULL};
    ProcResult pr = proc_run(en);
    const char *nl = strchr(pr.out, '\n'), *ca = strstr(pr.out, "--ca-sha256 ");
    char token[65] = "", fp[65] = "";
    if (pr.status == 0 && nl && ca && strlen(nl + 1) >= 64 && strlen(ca + 12) >= 64)
        memcpy(token, nl + 1, 64), memcpy(fp, ca + 12, 64);
    proc_result_free(&pr);
    char *join[] = {strait_bin, "site",       "join",          (char *)dir,
                    "--name",   (char *)name, "--coordinator", BED_COORD_HOST ":7700",
                    "--token",  token,        "--ca-sha256",   fp,
                    NULL};
    pr = bed_run(bed, i, join);
    int rc = pr.status == 0 ? 0 : -1;
    if (rc) fprintf(stderr, "bench/wan: join %s: %s\n", name, pr.err);
    proc_result_free(&pr);
    return rc;
}

static int fault_step(const Bed *bed, Schedule *s, const char *fed, const char *log, int *coord) {
    int64_t committed = 0, at = store_round(s->db, &committed);
    if (at < 0) return 0; /* busy: the next poll */
    if (committed > s->committed_max) s->committed_max = committed;
    for (; s->next_round <= at; s->next_round++) {
        int n = s->next_round;
        bed_command(bed, n % SITES, "after 400000 reset"); /* the relay counts what it does */
        if (n % 10 == 5 && bed_command(bed, (n / 10) % SITES, "cut 60000") == 0) s->cuts++;
        if (n == 3) {
            proc_stop(*coord, 20000);
            if (start_coordinator(bed, fed, log, coord) != 0) {
                fprintf(stderr, "bench/wan: the coordinator did not start again\n");
                return -1;
            }
            s->restarts++;
        }
    }
    return 0;
}

/* The updates a round waits for: every site's in a plain sync run (the
 * strictest lockstep, the baseline async is measured against), a quorum of
 * 3 with async rounds and under the fault schedule (the federation's
 * default, `min_sites = quorum`: a federation that expects cut links does
 * not wait for every site) */
static int quorum(int mode) {
    return mode == ASYNC || faults ? 3 : SITES;
}

static int run_mode(int mode, double target, Result *out) {
    int overlap = mode + 3 * faults; /* the folders' and logs' number */
    memset(out, 0, sizeof *out);
    BedLink fast = {50, 50, 50, 0, 0.001, 0}, thin = {10, 10, 50, 0, 0.001, 0};
    BedLink links[SITES] = {fast, fast, fast, thin};
    Bed bed;
    char why[512], fed[400], err[ERR_LEN];
    if (bed_open(&bed, SITES, links, why, sizeof why) != 0) {
        printf("{\"bench\":\"wan\",\"skipped\":\"%s\"}\n", why);
        return -1;
    }
    snprintf(fed, sizeof fed, "%s/fed-%d", root, overlap);
    char coord_log[500];
    snprintf(coord_log, sizeof coord_log, "%s/coordinator-%d.log", root, overlap);
    char r_s[16], h_s[16];
    snprintf(r_s, sizeof r_s, "%d", mode == ASYNC ? rounds + rounds / 2 : rounds);
    snprintf(h_s, sizeof h_s, "%d", steps);
    char *init[] = {strait_bin, "init",        fed, "--listen", BED_COORD_HOST ":7700",
                    "--model",  (char *)model, NULL};
    ProcResult pr = proc_run(init);
    int rc = pr.status == 0 ? 0 : -1;
    if (rc) fprintf(stderr, "bench/wan: init: %s\n", pr.err);
    proc_result_free(&pr);
    int coord = -1, pids[SITES] = {0};
    char cgroups[SITES][400] = {{0}};
    if (rc == 0) {
        ini_set(fed, "rounds", "total", r_s);
        char q[8];
        snprintf(q, sizeof q, "%d", quorum(mode));
        ini_set(fed, "rounds", "min_sites", q);
        ini_set(fed, "rounds", "deadline", "600s");
        ini_set(fed, "rounds", "inner_steps", h_s);
        ini_set(fed, "rounds", "overlap", mode == OVERLAP ? "on" : "off");
        ini_set(fed, "rounds", "mode", mode == ASYNC ? "async" : "sync");
        if (start_coordinator(&bed, fed, coord_log, &coord) != 0) rc = -1;
    }
    static const char *data[SITES] = {
        "/usr/share/games/fortunes/fortunes", "/usr/share/games/fortunes/literature",
        "/usr/share/games/fortunes/wisdom", "/usr/share/games/fortunes/science"};
    for (int i = 0; rc == 0 && i < SITES; i++) {
        char name[16], dir[500];
        snprintf(name, sizeof name, "s%d", i);
        snprintf(dir, sizeof dir, "%s/site-%d-%d", root, overlap, i);
        rc = enroll_join(&bed, fed, i, name, dir);
    }
    for (int i = 0; rc == 0 && i < SITES; i++) {
        char dir[500], log[500];
        snprintf(dir, sizeof dir, "%s/site-%d-%d", root, overlap, i);
        snprintf(log, sizeof log, "%s/site-%d-%d.log", root, overlap, i);
        char *argv[] = {strait_bin,  "site", "run",    dir, "--data", (char *)data[i],
                        "--threads", "1",    "--seed", "7", NULL};
        pids[i] = bed_spawn(&bed, i, argv, log, NULL);
        double cores = slow && i == 2 ? 0.4 / 3 : 0.4;
        if (pids[i] < 0 || cpu_share(i, pids[i], cores, cgroups[i], sizeof cgroups[i]) != 0) {
            fprintf(stderr, "bench/wan: cannot give site %d a CPU share (cgroups)\n", i);
            rc = -1;
        }
    }
    /* the sites run to the federation's end (an hour at most), under the
     * fault schedule when asked for */
    Schedule sched = {.next_round = 0};
    snprintf(sched.db, sizeof sched.db, "%s/strait.db", fed);
    int running = rc == 0 ? SITES : 0;
    for (int t = 0; running > 0 && t < 18000; t++) {
        for (int i = 0; i < SITES; i++) {
            int st = -1;
            if (pids[i] <= 0 || waitpid(pids[i], &st, WNOHANG) != pids[i]) continue;
            pids[i] = 0, running--;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "bench/wan: site %d ended with %d (its log: %s)\n", i, st, root);
                rc = -1, running = 0;
            }
        }
        if (faults && running > 0 && fault_step(&bed, &sched, fed, coord_log, &coord) != 0)
            rc = -1, running = 0;
        usleep(200000);
    }
    if (running > 0) fprintf(stderr, "bench/wan: the sites ran past an hour\n"), rc = -1;
    out->cuts = sched.cuts, out->restarts = sched.restarts;
    for (int i = 0; i < SITES; i++) { /* the resets carried out, not armed */
        char stats[256];
        const char *r =
            bed_stats(&bed, i, stats, sizeof stats) == 0 ? strstr(stats, "resets=") : NULL;
        if (r) out->resets += atol(r + 7);
    }
    for (int i = 0; i < SITES; i++)
        if (pids[i] > 0) proc_stop(pids[i], 5000);
    if (coord > 0) proc_stop(coord, 20000);
    bed_close(&bed);
    for (int i = 0; i < SITES; i++)
        if (cgroups[i][0]) rmdir(cgroups[i]);
    int64_t final_committed = 0;
    if (store_round(sched.db, &final_committed) >= 0 && sched.committed_max > final_committed)
        out->rounds_lost = (int)(sched.committed_max - final_committed);
    if (rc != 0) return -1;
    /* the figures, from the store (the coordinator has stopped) */
    Admin *a = admin_open(fed, err);
    AdminRound *ar = NULL;
    size_t n = 0;
    AdminStatus st;
    if (a == NULL || admin_rounds(a, 1000, 0, &ar, &n, err) != 0 ||
        admin_status(a, &st, err) != 0) {
        fprintf(stderr, "bench/wan: %s\n", err);
        if (a) admin_close(a);
        return -1;
    }
    double train = 0, site_wall = 0, got = 0, possible = 0;
    int64_t t0 = 0, t1 = 0;
    const char *held[2] = {"/usr/share/games/fortunes/platitudes",
                           "/usr/share/games/fortunes/miscellaneous"};
    for (size_t i = n; i-- > 0;) { /* oldest first */
        if (t0 == 0 || ar[i].r.opened_at < t0) t0 = ar[i].r.opened_at;
        if (strcmp(ar[i].r.state, "committed") != 0) continue;
        train += ar[i].train_ms_sum, site_wall += ar[i].site_wall_ms_sum;
        got += ar[i].tokens_accepted, possible += ar[i].tokens_possible;
        t1 = ar[i].r.closed_at;
        char path[1000];
        snprintf(path, sizeof path, "%s/%s", fed, ar[i].r.checkpoint_path);
        double loss = NAN;
        if (out->committed < 384 &&
            model_eval_checkpoint(path, held, 2, 8, 64, 16, &loss, err) == 0) {
            out->loss[out->committed] = loss;
            out->tokens[out->committed] = got;
            out->at_s[out->committed++] = (double)(ar[i].r.closed_at - t0) / 1e3;
        }
    }
    out->wall_s = (double)(t1 - t0) / 1e3;
    out->utilization = site_wall > 0 ? train / site_wall : NAN;
    out->goodput = possible > 0 ? got / possible : NAN;
    out->bytes_up = st.totals.bytes_up, out->bytes_down = st.totals.bytes_down;
    out->final_loss = out->committed ? out->loss[out->committed - 1] : NAN;
    out->ttt_s = NAN;
    for (int i = 0; i < out->committed && isfinite(target); i++)
        if (out->loss[i] <= target) {
            out->ttt_s = out->at_s[i];
            break;
        }
    free(ar);
    admin_close(a);
    return 0;
}

/* r's held-out loss after `tokens` accepted tokens, linear between its
 * commits (its first commit's below them) */
static double loss_at(const Result *r, double tokens) {
    if (r->committed == 0) return NAN;
    if (tokens <= r->tokens[0]) return r->loss[0];
    for (int i = 1; i < r->committed; i++)
        if (tokens <= r->tokens[i]) {
            double f = (tokens - r->tokens[i - 1]) / (r->tokens[i] - r->tokens[i - 1]);
            return r->loss[i - 1] + f * (r->loss[i] - r->loss[i - 1]);
        }
    return r->loss[r->committed - 1];
}

/* r's loss over sync's at the same accepted tokens */
static double loss_vs(const Result *r, const Result *sync) {
    if (r->committed == 0 || sync->committed == 0) return NAN;
    double t = fmin(r->tokens[r->committed - 1], sync->tokens[sync->committed - 1]);
    return loss_at(r, t) / loss_at(sync, t);
}

/* a number, or null when there is none (JSON has no NaN) */
static const char *num(double v, int digits, char *buf, size_t len) {
    if (!isfinite(v)) return "null";
    snprintf(buf, len, "%.*f", digits, v);
    return buf;
}

static void emit(const char *mode, const Result *r, const Result *sync) {
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32];
    printf("{\"bench\":\"wan\",\"mode\":\"%s\",\"model\":\"%s\",\"sites\":%d,\"rounds\":%d,"
           "\"inner_steps\":%d,\"slow_site\":%s,\"links\":\"100 ms RTT, 0.1%% loss, 50 Mbit/s "
           "(site 3: 10 Mbit/s)\",\"cpu_per_site\":0.4,\"committed\":%d,\"wall_s\":%s,"
           "\"utilization\":%s,\"goodput\":%s,\"bytes_up\":%lld,\"bytes_down\":%lld,"
           "\"final_loss\":%s,\"time_to_target_s\":%s,\"min_sites\":%d",
           mode, model, SITES, r->committed ? r->committed : rounds, steps, slow ? "true" : "false",
           r->committed, num(r->wall_s, 1, a, sizeof a), num(r->utilization, 4, b, sizeof b),
           num(r->goodput, 4, c, sizeof c), (long long)r->bytes_up, (long long)r->bytes_down,
           num(r->final_loss, 4, d, sizeof d), num(r->ttt_s, 1, e, sizeof e),
           quorum(strcmp(mode, "async") == 0 ? ASYNC : SYNC));
    if (faults)
        printf(",\"faults\":\"a 60 s link cut every 10 rounds, a reset mid-upload each round, a "
               "coordinator restart\",\"cuts\":%d,\"connections_reset\":%ld,\"restarts\":%d,"
               "\"rounds_lost\":%d",
               r->cuts, r->resets, r->restarts, r->rounds_lost);
    if (sync != r)
        printf(",\"speedup_vs_sync\":%s,\"loss_vs_sync\":%s",
               num(sync->ttt_s / r->ttt_s, 3, f, sizeof f), num(loss_vs(r, sync), 4, g, sizeof g));
    printf("}\n");
    fflush(stdout);
}

/* ---- --pipe: one transfer on a long fat link ------------------------------ */

#define PIPE_MBIT     1000
#define PIPE_DELAY_MS 50 /* each way */
#define TCP_PORT      7799
#define TCP_BYTES     (1L << 30)
#define PIPE_ROUNDS   3
#define PIPE_ROUNDS_S "3"

/* Run as a child inside a namespace (bed_spawn of this binary): accept one
 * connection on port, read it to its end, close. Prints "ready" once
 * listening. */
static int tcp_sink(int port) {
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0) return 1;
    printf("ready\n");
    fflush(stdout);
    int c = accept(ls, NULL, NULL);
    static char buf[1 << 20];
    while (c >= 0 && read(c, buf, sizeof buf) > 0) {
    }
    if (c >= 0) close(c);
    close(ls);
    return 0;
}

/* The other end: TCP_BYTES to host:port, then the time until the sink has
 * read them all (its close), printed as Mbit/s. */
static int tcp_send(const char *host, int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (s < 0 || inet_pton(AF_INET, host, &a.sin_addr) != 1 ||
        connect(s, (struct sockaddr *)&a, sizeof a) != 0)
        return 1;
    static char buf[1 << 20];
    memset(buf, 0x5a, sizeof buf);
    int64_t t0 = time_monotonic_ns();
    for (long sent = 0; sent < TCP_BYTES;) {
        ssize_t w = write(s, buf, sizeof buf);
        if (w <= 0) return 1;
        sent += w;
    }
    shutdown(s, SHUT_WR);
    while (read(s, buf, sizeof buf) > 0) {
    }
    double secs = (double)(time_monotonic_ns() - t0) / 1e9;
    printf("%.1f\n", (double)TCP_BYTES * 8 / secs / 1e6);
    close(s);
    return 0;
}

static char self_bin[1200];

/* Raw TCP across the bed from `from` to `to` (-1: the coordinator's
 * namespace, 0: the site's), Mbit/s; NAN when it failed. */
static double raw_tcp(const Bed *bed, int from, int to) {
    char port[16], log[500], line[64];
    snprintf(port, sizeof port, "%d", TCP_PORT);
    snprintf(log, sizeof log, "%s/tcp.log", root);
    char *sink[] = {self_bin, "--tcp-sink", port, NULL};
    char *send[] = {self_bin, "--tcp-send", to < 0 ? BED_COORD_HOST : "10.79.1.2", port, NULL};
    int sfd = -1, cfd = -1, spid = bed_spawn(bed, to, sink, log, &sfd), cpid = -1;
    double mbit = NAN;
    if (spid > 0 && proc_read_line(sfd, line, sizeof line, 10000) > 0 &&
        (cpid = bed_spawn(bed, from, send, log, &cfd)) > 0 &&
        proc_read_line(cfd, line, sizeof line, 120000) > 0)
        mbit = atof(line);
    if (sfd >= 0) close(sfd);
    if (cfd >= 0) close(cfd);
    if (cpid > 0) proc_stop(cpid, 2000);
    if (spid > 0) proc_stop(spid, 2000);
    return mbit;
}

typedef struct PipeRound {
    double up_mbit, down_mbit;
    long long up_bytes, down_bytes;
} PipeRound;

/* One federation on the bed with [limits] stream_window = window; its
 * rounds' transfer rates from the store. 0, or -1 with why on stderr. */
static int pipe_run(const Bed *bed, const char *window, PipeRound out[PIPE_ROUNDS]) {
    char fed[400], dir[400], log[500];
    snprintf(fed, sizeof fed, "%s/pipe-%s", root, window);
    snprintf(dir, sizeof dir, "%s/pipe-site-%s", root, window);
    char *init[] = {strait_bin, "init",      fed,        "--listen", BED_COORD_HOST ":7700",
                    "--model",  "gpt2-124m", "--recipe", "fedavg",   NULL};
    ProcResult pr = proc_run(init);
    int rc = pr.status == 0 ? 0 : -1;
    if (rc) fprintf(stderr, "bench/wan: init: %s\n", pr.err);
    proc_result_free(&pr);
    if (rc) return -1;
    ini_set(fed, "rounds", "total", PIPE_ROUNDS_S);
    ini_set(fed, "rounds", "min_sites", "1");
    ini_set(fed, "rounds", "deadline", "600s");
    ini_set(fed, "rounds", "inner_steps", "1");
    ini_set(fed, "limits", "stream_window", window);
    snprintf(log, sizeof log, "%s/pipe-coordinator-%s.log", root, window);
    int coord = -1, site = -1;
    if (start_coordinator(bed, fed, log, &coord) != 0 || enroll_join(bed, fed, 0, "s0", dir) != 0)
        rc = -1;
    if (rc == 0) {
        snprintf(log, sizeof log, "%s/pipe-site-%s.log", root, window);
        char *run[] = {
            strait_bin, "site", "run",   dir,  "--data", "/usr/share/games/fortunes/fortunes",
            "--batch",  "1",    "--seq", "32", "--seed", "7",
            NULL};
        site = bed_spawn(bed, 0, run, log, NULL);
        int st = -1;
        for (int t = 0; site > 0 && t < 9000 && waitpid(site, &st, WNOHANG) != site; t++)
            usleep(100000); /* 15 minutes at most */
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "bench/wan: the site ended with %d (its log: %s)\n", st, log);
            rc = -1;
            proc_stop(site, 5000);
        }
    }
    if (coord > 0) proc_stop(coord, 20000);
    if (rc) return -1;
    char db[500];
    snprintf(db, sizeof db, "%s/strait.db", fed);
    sqlite3 *h = NULL;
    sqlite3_stmt *q = NULL;
    int n = 0;
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(h,
                           "SELECT u.wire_bytes, u.upload_ms, r.bytes_down, u.download_ms "
                           "FROM updates u JOIN rounds r ON r.id = u.round_id "
                           "WHERE u.state = 'accepted' ORDER BY r.number",
                           -1, &q, NULL) == SQLITE_OK)
        for (; n < PIPE_ROUNDS && sqlite3_step(q) == SQLITE_ROW; n++) {
            long long up = sqlite3_column_int64(q, 0), down = sqlite3_column_int64(q, 2);
            double up_ms = (double)sqlite3_column_int64(q, 1);
            double down_ms = (double)sqlite3_column_int64(q, 3);
            out[n].up_bytes = up, out[n].down_bytes = down;
            out[n].up_mbit = up_ms > 0 ? (double)up * 8 / up_ms / 1e3 : NAN;
            out[n].down_mbit = down_ms > 0 && down > 0 ? (double)down * 8 / down_ms / 1e3 : NAN;
        }
    sqlite3_finalize(q);
    sqlite3_close(h);
    if (n != PIPE_ROUNDS)
        fprintf(stderr, "bench/wan: %s holds %d accepted updates, not %d\n", db, n, PIPE_ROUNDS);
    return n == PIPE_ROUNDS ? 0 : -1;
}

static int pipe_case(void) {
    BedLink link = {PIPE_MBIT, PIPE_MBIT, PIPE_DELAY_MS, 0, 0, 9000};
    Bed bed;
    char why[512];
    if (bed_open(&bed, 1, &link, why, sizeof why) != 0) {
        printf("{\"bench\":\"wan\",\"case\":\"pipe\",\"skipped\":\"%s\"}\n", why);
        return 0;
    }
    double tcp_up = raw_tcp(&bed, 0, -1), tcp_down = raw_tcp(&bed, -1, 0);
    static const char *const windows[] = {"auto", "4194304"};
    int rc = 0;
    for (int w = 0; w < 2 && rc == 0; w++) {
        PipeRound r[PIPE_ROUNDS];
        if (pipe_run(&bed, windows[w], r) != 0) {
            rc = -1;
            break;
        }
        char a[6][32];
        printf("{\"bench\":\"wan\",\"case\":\"pipe\",\"model\":\"gpt2-124m\",\"recipe\":\"fedavg\","
               "\"link\":\"%d Mbit/s each way, %d ms RTT, no loss, MTU "
               "9000\",\"stream_window\":\"%s\","
               "\"raw_tcp_up_mbit\":%s,\"raw_tcp_down_mbit\":%s,\"rounds\":[",
               PIPE_MBIT, 2 * PIPE_DELAY_MS, windows[w], num(tcp_up, 1, a[0], sizeof a[0]),
               num(tcp_down, 1, a[1], sizeof a[1]));
        for (int i = 0; i < PIPE_ROUNDS; i++)
            printf("%s{\"up_bytes\":%lld,\"up_mbit\":%s,\"up_of_link\":%s,\"down_bytes\":%lld,"
                   "\"down_mbit\":%s,\"down_of_link\":%s}",
                   i ? "," : "", r[i].up_bytes, num(r[i].up_mbit, 1, a[2], sizeof a[2]),
                   num(r[i].up_mbit / PIPE_MBIT, 3, a[3], sizeof a[3]), r[i].down_bytes,
                   num(r[i].down_mbit, 1, a[4], sizeof a[4]),
                   num(r[i].down_mbit / PIPE_MBIT, 3, a[5], sizeof a[5]));
        printf("]}\n");
        fflush(stdout);
    }
    bed_close(&bed);
    fprintf(stderr, "bench/wan: logs and stores in %s\n", root);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    int pipe_mode = 0, last_mode = ASYNC;
    if (argc == 3 && strcmp(argv[1], "--tcp-sink") == 0) return tcp_sink(atoi(argv[2]));
    if (argc == 4 && strcmp(argv[1], "--tcp-send") == 0) return tcp_send(argv[2], atoi(argv[3]));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model = argv[++i];
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--slow") == 0)
            slow = 1;
        else if (strcmp(argv[i], "--pipe") == 0)
            pipe_mode = 1;
        else if (strcmp(argv[i], "--faults") == 0)
            faults = 1;
        else if (strcmp(argv[i], "--no-async") == 0)
            last_mode = OVERLAP;
        else {
            fprintf(stderr,
                    "usage: bench/wan [--model M] [--rounds R (1-256)] [--steps H] [--slow] "
                    "[--faults] [--no-async] | --pipe\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 256 || steps < 1) {
        fprintf(stderr, "bench/wan: --rounds 1 to 256, --steps at least 1\n");
        return 2;
    }
    if (geteuid() != 0) {
        printf("{\"bench\":\"wan\",\"skipped\":\"needs root: network namespaces, TUN devices, "
               "tc and cgroups\"}\n");
        return 0;
    }
    const char *bin = getenv("STRAIT_BIN");
    snprintf(strait_bin, sizeof strait_bin, "%s", bin ? bin : "build/strait");
    if (strait_bin[0] != '/') {
        char cwd[900];
        if (getcwd(cwd, sizeof cwd))
            snprintf(strait_bin, sizeof strait_bin, "%s/%s", cwd, bin ? bin : "build/strait");
    }
    /* the logs and stores stay for a reader: said on stderr at the end */
    snprintf(root, sizeof root, "/tmp/strait-bench-wan-XXXXXX"); /* mkdtemp's template */
    if (mkdtemp(root) == NULL) {
        fprintf(stderr, "bench/wan: cannot make a folder under /tmp: %s\n", strerror(errno));
        return 1;
    }
    setenv("STRAIT_LOG", "info", 0);
    setenv("OMP_NUM_THREADS", "1", 0), setenv("OPENBLAS_NUM_THREADS", "1", 0);
    if (pipe_mode) {
        if (realpath("/proc/self/exe", self_bin) == NULL) return 1;
        return pipe_case();
    }
    static Result sync, other;
    if (run_mode(SYNC, NAN, &sync) != 0) return 1;
    /* sync's final loss is the target, reached by definition at its last commit */
    sync.ttt_s = sync.committed ? sync.at_s[sync.committed - 1] : NAN;
    emit("sync", &sync, &sync);
    for (int m = OVERLAP; m <= last_mode; m++) {
        if (run_mode(m, sync.final_loss, &other) != 0) return 1;
        emit(mode_names[m], &other, &sync);
    }
    fprintf(stderr, "bench/wan: logs and stores in %s\n", root);
    return 0;
}
