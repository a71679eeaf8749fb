/*
 * test_flood.c — unauthenticated peers against a real coordinator: idle
 * TCP connections from many addresses, a coordinator run out of
 * descriptors, HTTP/2 streams whose request never comes sent at the
 * service port and at the enrollment port (tests/flood.h). Each case checks that an honest
 * site's Hello and the admin's `strait status` are answered while it lasts
 * and after, and what the coordinator held. The peers come from loopback
 * addresses 127.0.0.10 and up; every socket is closed and every process
 * stopped by the end of the case, pass or fail. Loops are bounded in count
 * and time.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "client/client.h"
#include "coordinator/coordinator.h"
#include "net/net.h"
#include "tests/attacker.h"
#include "tests/flood.h"
#include "tests/harness.h"
#include "util/util.h"

#define S(...) harness_strait(__VA_ARGS__)

static char *root;
static char fed[600], addr[64], b_dir[700];
static int coord = -1;
static int *fds;
static int n_fds;
static FloodTls *tls[16];

static void teardown(void) {
    for (int i = 0; i < n_fds; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds), fds = NULL, n_fds = 0;
    for (int i = 0; i < 16; i++) flood_tls_close(tls[i]), tls[i] = NULL;
    if (root == NULL) return;
    if (coord > 0) proc_stop(coord, 10000), coord = -1;
    harness_rmtree(root);
    free(root);
    root = NULL;
    net_global_shutdown();
}

TestSuite(flood, .fini = teardown, .timeout = 240);

/* A tiny federation, started (with its metrics endpoint when metrics),
 * with site b enrolled and, with hello, seen once (so its address,
 * 127.0.0.1, is one the coordinator trusts). */
static void federation_of(int metrics, int hello) {
    net_global_init();
    root = harness_tmpdir("flood");
    snprintf(fed, sizeof fed, "%s/fed", root);
    ProcResult r = S("init", fed, "--listen", harness_listen(), "--model", "tiny");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    char ini[700];
    snprintf(ini, sizeof ini, "%s/federation.ini", fed);
    if (metrics) harness_ini_set(ini, "metrics", "listen", "127.0.0.1:0");
    coord = harness_start_coordinator(fed, addr);
    cr_assert_gt(coord, 0, "coordinator did not start");
    snprintf(b_dir, sizeof b_dir, "%s/b", root);
    attacker_enroll(fed, addr, "b", b_dir);
    if (!hello) return;
    SiteHello h;
    char err[ERR_LEN];
    cr_assert_eq(client_hello(b_dir, &h, err), 0, "%s", err);
}

static void federation(void) {
    federation_of(0, 1);
}

/* The honest site and the admin are answered. */
static void honest_answered(const char *when) {
    SiteHello hello;
    char err[ERR_LEN];
    cr_assert_eq(client_hello(b_dir, &hello, err), 0, "%s: site b's Hello: %s", when, err);
    ProcResult r = S("status", fed);
    cr_assert_eq(r.status, 0, "%s: strait status: %s", when, r.err);
    proc_result_free(&r);
}

static int open_fds(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", pid);
    DIR *d = opendir(path);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static void raise_own_nofile(int need) {
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < (rlim_t)need && rl.rlim_max >= (rlim_t)need) rl.rlim_cur = (rlim_t)need;
    setrlimit(RLIMIT_NOFILE, &rl);
    cr_assert_geq(rl.rlim_cur, (rlim_t)need, "this test needs %d descriptors", need);
}

/* 2,000 idle connections from 10 addresses, 200 each: an address not yet
 * trusted holds 128 (connections_per_address), the rest are closed as they
 * are accepted, and the site and the admin are answered. Then the
 * coordinator's descriptor limit is cut to just above what it holds and
 * 300 more come: it runs out, closes what it cannot serve, and once the
 * flood is gone it accepts again (gRPC's own listener gives up for good on
 * EMFILE). */
Test(flood, idle_connections_are_capped_per_address_and_emfile_does_not_end_the_listener) {
    enum { ADDRS = 10, EACH = 200, MORE = 300 };
    raise_own_nofile(ADDRS * EACH + MORE + 256);
    federation();
    fds = malloc(sizeof(int) * (ADDRS * EACH + MORE));
    char src[32];
    for (int a = 0; a < ADDRS; a++) {
        snprintf(src, sizeof src, "127.0.0.%d", 10 + a);
        for (int i = 0; i < EACH; i++) fds[n_fds++] = flood_connect(addr, src);
    }
    int held = open_fds(coord);
    for (int a = 0; a < ADDRS; a++) {
        int closed = flood_count_closed(fds + a * EACH, EACH, 2000);
        cr_assert_eq(closed, EACH - 128, "address %d: %d of %d connections closed, not %d", a,
                     closed, EACH, EACH - 128);
    }
    cr_assert_lt(held, ADDRS * 128 + 200, "the coordinator holds %d descriptors", held);
    honest_answered("2,000 idle connections held");
    /* out of descriptors: the limit just above what it holds now */
    struct rlimit tight = {(rlim_t)open_fds(coord) + 40, (rlim_t)open_fds(coord) + 40};
    cr_assert_eq(prlimit(coord, RLIMIT_NOFILE, &tight, NULL), 0, "prlimit on the coordinator");
    for (int i = 0; i < MORE; i++) {
        snprintf(src, sizeof src, "127.0.0.%d", 30 + i / 100);
        fds[n_fds++] = flood_connect(addr, src);
    }
    int dropped = flood_count_closed(fds + ADDRS * EACH, MORE, 2000);
    cr_assert_gt(dropped, MORE - 60, "only %d of %d connections past the limit were closed",
                 dropped, MORE);
    for (int i = 0; i < n_fds; i++)
        if (fds[i] >= 0) close(fds[i]), fds[i] = -1;
    /* the flood is gone: descriptors come back as the coordinator sees the
     * closes, and the listener still accepts */
    int answered = 0;
    for (int tries = 0; tries < 50 && !answered; tries++) {
        SiteHello hello;
        char err[ERR_LEN];
        answered = client_hello(b_dir, &hello, err) == 0;
        if (!answered) usleep(200000);
    }
    cr_assert(answered, "the coordinator accepted no connection after running out of descriptors");
    honest_answered("after the descriptors came back");
}

/* The attack of an anonymous peer that cost gigabytes: 70 TLS connections
 * from one address, each sending 3,500 HEADERS-only streams (about 60 KB,
 * their requests never come) before it acknowledges the server's SETTINGS,
 * once at the service port and once at the enrollment port. Neither gives
 * such a peer HTTP/2: the service port's TLS handshake requires a
 * certificate, the enrollment port speaks only its own ALPN. Every flooding
 * connection is closed, the coordinator's RSS stays within 64 MiB of where
 * it started while the flood runs and after (before: +3 GB, kept), and the
 * honest site and the admin are answered meanwhile. */
Test(flood, anonymous_streams_never_reach_http2_and_cost_bounded_memory) {
    enum { CONNS = 70, STREAMS = 3500 };
    federation();
    honest_answered("before");
    char join[300], err[ERR_LEN];
    cr_assert_eq(coordinator_join_address(fed, join, sizeof join, err), 0, "%s", err);
    long before = flood_rss(coord), flooded = 0;
    int sessions = 0, streams = 0;
    const char *ports[2] = {addr, join};
    static FloodTls *peers[CONNS];
    for (int p = 0; p < 2; p++) {
        for (int i = 0; i < CONNS; i++) {
            peers[i] = flood_tls_open(ports[p], "127.0.0.50");
            if (peers[i] == NULL) continue; /* refused in the handshake */
            sessions++;
            streams += flood_tls_streams(peers[i], "/strait.Federation/Hello", STREAMS, 0);
        }
        long rss = flood_rss(coord);
        if (rss > flooded) flooded = rss;
        honest_answered(p == 0 ? "the service port flooded" : "the enrollment port flooded");
        for (int i = 0; i < CONNS; i++) {
            cr_assert(peers[i] == NULL || flood_tls_closed(peers[i], 5000),
                      "flooding connection %d to %s is still open", i, ports[p]);
            flood_tls_close(peers[i]), peers[i] = NULL;
        }
    }
    usleep(1500000);
    long after = flood_rss(coord);
    honest_answered("after");
    cr_log_info("coordinator RSS: %ld MiB before, %ld at most while %d anonymous connections "
                "sent %d streams (%d of them finished their client's TLS handshake), %ld after",
                before >> 20, flooded >> 20, 2 * CONNS, streams, sessions, after >> 20);
#ifdef __SANITIZE_ADDRESS__
    /* ASan keeps freed memory in quarantine and pads every allocation: RSS
     * says nothing here; the closes above hold */
    return;
#endif
    cr_assert_lt(flooded - before, 64L << 20, "the anonymous flood cost %ld MiB",
                 (flooded - before) >> 20);
    cr_assert_lt(after - before, 64L << 20, "%ld MiB were not given back", (after - before) >> 20);
}

/* A revoked site still completes TLS (the handshake does not consult the
 * store), and connections it opened before its revocation had calls with
 * a certificate on them. Once a call of its certificate has been refused,
 * every later call is refused as it arrives and puts the connection it
 * came on back under the byte budget of connections before a certificate:
 * 3 connections made while the site was enrolled, then 20,000 HEADERS-only
 * streams each after its revocation, are reset, and the coordinator's
 * memory stays within 64 MiB. Before, they stayed vouched for, and the
 * streams were free. */
Test(flood, a_revoked_sites_certificate_opens_no_streams_for_free) {
    federation();
    honest_answered("before");
    char dir[700], cert[800], key[800], err[ERR_LEN], src[32];
    snprintf(dir, sizeof dir, "%s/m", root);
    attacker_enroll(fed, addr, "m", dir);
    SiteHello h;
    cr_assert_eq(client_hello(dir, &h, err), 0, "%s", err);
    snprintf(cert, sizeof cert, "%s/site.crt", dir);
    snprintf(key, sizeof key, "%s/site.key", dir);
    for (int i = 0; i < 3; i++) { /* each has had a whole call, taken, while m was enrolled */
        snprintf(src, sizeof src, "127.0.0.%d", 80 + i);
        tls[i] = flood_tls_open_as(addr, src, cert, key);
        cr_assert_not_null(tls[i], "TLS with m's certificate failed");
        cr_assert_eq(flood_tls_streams(tls[i], "/strait.Federation/Hello", 1, 1), 1);
    }
    usleep(300000);
    ProcResult r = S("site", "revoke", fed, "m");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    cr_assert_neq(client_hello(dir, &h, err), 0, "a revoked site was answered");
    cr_assert_not_null(strstr(err, "revoked"), "%s", err);
    long before = flood_rss(coord);
    int sent = 0;
    for (int i = 0; i < 3; i++)
        sent += flood_tls_streams(tls[i], "/strait.Federation/Hello", 20000, 0);
    usleep(500000);
    long during = flood_rss(coord);
    for (int i = 0; i < 3; i++)
        cr_assert(flood_tls_closed(tls[i], 5000), "the revoked site's connection %d is open", i);
    honest_answered("after a revoked site's streams");
    cr_log_info("coordinator RSS: %ld MiB before, %ld with a revoked site's %d streams",
                before >> 20, during >> 20, sent);
#ifndef __SANITIZE_ADDRESS__
    cr_assert_lt(during - before, 64L << 20, "a revoked site's streams cost %ld MiB",
                 (during - before) >> 20);
#endif
}

/* The enrollment port's worst case: peers from 16 addresses each holding
 * as many connections as they may, each past TLS with 16 KiB less a byte
 * of a request: the listener holds 32 (4 an address; past a second, the
 * newest in place of the oldest), closes the rest as they come, and costs
 * the coordinator a few MiB; a site joins the moment
 * they are gone, and the service port is answered throughout. */
Test(flood, the_enrollment_ports_worst_case_is_a_few_mib) {
    enum { ADDRS = 16, EACH = 6 };
    federation();
    char join[300], err[ERR_LEN], src[32];
    cr_assert_eq(coordinator_join_address(fed, join, sizeof join, err), 0, "%s", err);
    long before = flood_rss(coord);
    int held = 0;
    static FloodTls *peers[ADDRS * EACH];
    for (int a = 0; a < ADDRS; a++) {
        snprintf(src, sizeof src, "127.0.0.%d", 100 + a);
        for (int i = 0; i < EACH; i++) {
            FloodTls *t = flood_join_hold(join, src, (16u << 10) - 1);
            if (t && !flood_tls_closed(t, 200))
                peers[held++] = t;
            else
                flood_tls_close(t);
        }
    }
    long during = flood_rss(coord);
    honest_answered("the enrollment port full");
    int open = 0; /* the listener ends its oldest for newer ones once it is full */
    for (int i = 0; i < held; i++) open += !flood_tls_closed(peers[i], 50);
    cr_log_info("enrollment port: %d connections held past TLS with 16 KiB of a request each "
                "(%d taken in all); coordinator RSS %ld MiB before, %ld with them",
                open, held, before >> 20, during >> 20);
    cr_assert_eq(open, 32, "%d connections held, not [limits] join_connections", open);
    for (int i = 0; i < held; i++) flood_tls_close(peers[i]), peers[i] = NULL;
    char dir[700], token[65], fp[65];
    snprintf(dir, sizeof dir, "%s/late", root);
    cr_assert_eq(coordinator_enroll(fed, "late", 3600000, token, err), 0, "%s", err);
    cr_assert_eq(coordinator_home_info(fed, fp, NULL, 0, err), 0, "%s", err);
    SiteJoinOptions o = {dir, "late", addr, token, fp, join};
    int joined = 0;
    for (int tries = 0; tries < 50 && !joined; tries++) { /* slots free as threads see closes */
        joined = client_join(&o, err) == 0;
        if (!joined) usleep(100000);
    }
    cr_assert(joined, "no join once the enrollment port's peers were gone: %s", err);
#ifndef __SANITIZE_ADDRESS__
    cr_assert_lt(during - before, 16L << 20, "the enrollment port's worst case cost %ld MiB",
                 (during - before) >> 20);
#endif
}

/* One address fills what connections before a certificate may send: 69
 * connections each 60 KB into a TLS ClientHello they never finish (4 MiB,
 * the budget of every such connection together). An address's share is an
 * eighth of it: the filler's connections past its share are reset, and a
 * site never seen before (b, whose address no certificate has come from
 * yet) joins on the enrollment port and is answered its first Hello while
 * the filler holds what it can. Before, the filler took the whole budget
 * and every connection from an address not seen within the hour was reset
 * as long as it ran. */
Test(flood, one_address_cannot_fill_the_budget_of_connections_before_a_certificate) {
    enum { CONNS = 69, EACH = 60000 };
    federation_of(0, 0);
    fds = malloc(sizeof(int) * CONNS);
    for (int i = 0; i < CONNS; i++) fds[n_fds++] = flood_hello_stall(addr, "127.0.0.70", EACH);
    usleep(300000);
    int reset = flood_count_closed(fds, n_fds, 2000);
    cr_assert_geq(reset, CONNS - 9, "only %d of the filler's %d connections were reset", reset,
                  CONNS);
    SiteHello h;
    char err[ERR_LEN];
    cr_assert_eq(client_hello(b_dir, &h, err), 0, "a fresh site's Hello during the filler: %s",
                 err);
    char dir[700];
    snprintf(dir, sizeof dir, "%s/c", root);
    attacker_enroll(fed, addr, "c", dir); /* a join on the enrollment port, meanwhile */
    honest_answered("while one address holds its share");
}

/* A neighbour at a site's address (512 connections that never finish TLS,
 * from the site's own address, one it is trusted for) does not lock the
 * site out: once its pending connections have had a second, the site's
 * reconnect takes the place of the oldest, and it and the admin are
 * answered. Before, the neighbour held the address's 512 and every
 * reconnect of the site was closed as accepted. */
Test(flood, a_neighbour_at_a_sites_address_does_not_lock_it_out) {
    enum { IDLE = 512 };
    raise_own_nofile(IDLE + 256);
    federation();
    fds = malloc(sizeof(int) * IDLE);
    for (int i = 0; i < IDLE; i++) fds[n_fds++] = flood_hello_stall(addr, "127.0.0.1", 100);
    int closed = flood_count_closed(fds, n_fds, 2000);
    cr_assert_geq(closed, IDLE - 128, "the neighbour holds %d pending connections", IDLE - closed);
    usleep(1200000); /* the neighbour's connections are past their first second */
    honest_answered("a neighbour holding the site's address");
}

/* The metrics endpoint: idle connections from one address do not keep the
 * scraper (another address) out. */
Test(flood, idle_connections_do_not_keep_the_scraper_out) {
    federation_of(1, 1);
    char path[700], *maddr = NULL, err[ERR_LEN];
    snprintf(path, sizeof path, "%s/metrics.addr", fed);
    for (int i = 0; i < 100 && file_read_all(path, 256, &maddr, NULL, err) != 0; i++) usleep(50000);
    cr_assert_not_null(maddr, "%s", err);
    enum { IDLE = 64 };
    fds = malloc(sizeof(int) * IDLE);
    for (int i = 0; i < IDLE; i++) fds[n_fds++] = flood_connect(maddr, "127.0.0.60");
    int fd = flood_connect(maddr, "127.0.0.1");
    cr_assert_geq(fd, 0);
    static const char get[] = "GET /metrics HTTP/1.0\r\n\r\n";
    cr_assert_eq(write(fd, get, sizeof get - 1), (ssize_t)(sizeof get - 1));
    static char page[1 << 16];
    size_t got = 0;
    for (ssize_t k; got < sizeof page - 1 && (k = read(fd, page + got, sizeof page - 1 - got)) > 0;)
        got += (size_t)k;
    page[got] = 0;
    close(fd);
    cr_assert_not_null(strstr(page, "strait_connections "), "the scrape got: %.200s", page);
    free(maddr);
}
