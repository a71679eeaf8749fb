/*
 * test_net.c — net/ over loopback with real mutual TLS and a throwaway CA:
 * unary, server- and client-streaming round trips, 256 MiB both ways with
 * the hash verified, the refusals (no certificate, a foreign CA, a wrong
 * server name, an oversized header, a chunk out of place, a wrong hash, an
 * unknown method), a real uploader process killed with SIGKILL and resumed
 * by a new one, deadlines and cancellation seen on both sides, and the
 * worker pool's limit.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "net/net.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"
#include "tests/harness.h"
#include "tests/tls_fixture.h"
#include "util/util.h"

static TlsFixture tls;
static NetServer *server;
static NetSpool *spool;
static char target[64], spool_dir[600];

/* what the handlers saw, for the assertions */
static struct {
    pthread_mutex_t lock;
    int accepted, sum_broken, slow_cancelled, slow_done;
    NetStatus last_upload;
    char last_sha[SHA256_HEX_LEN];
    atomic_int running;
    atomic_int release;
    size_t last_mapped; /* the accepted payload's map of the spool file */
} seen = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, NET_OK, "", 0, 0, 0};

/* ---- handlers -------------------------------------------------------------- */

static void h_echo(NetCall *c, void *u) {
    (void)u;
    NetBuf m;
    if (net_call_recv(c, &m) != NET_RECV_MESSAGE) return;
    const NetPeer *p = net_call_peer(c);
    char out[512];
    int n = snprintf(out, sizeof out, "peer=%s;sha=%s;%.*s", p->name, p->sha256_hex, (int)m.len,
                     (const char *)m.data);
    net_call_send(c, out, (size_t)n);
    net_buf_free(&m);
}

static void h_addr(NetCall *c, void *u) {
    (void)u;
    NetBuf m;
    if (net_call_recv(c, &m) != NET_RECV_MESSAGE) return;
    net_buf_free(&m);
    const NetPeer *p = net_call_peer(c);
    net_call_send(c, p->addr, strlen(p->addr));
}

static void h_open(NetCall *c, void *u) {
    (void)u;
    NetBuf m;
    if (net_call_recv(c, &m) != NET_RECV_MESSAGE) return;
    net_buf_free(&m);
    char out[64];
    int n = snprintf(out, sizeof out, "open;has_cert=%d", net_call_peer(c)->has_cert);
    net_call_send(c, out, (size_t)n);
}

static void h_count(NetCall *c, void *u) {
    (void)u;
    NetBuf m;
    if (net_call_recv(c, &m) != NET_RECV_MESSAGE) return;
    int n = atoi((const char *)m.data);
    net_buf_free(&m);
    for (int i = 0; i < n; i++) {
        char msg[16];
        int len = snprintf(msg, sizeof msg, "%d", i);
        if (net_call_send(c, msg, (size_t)len) != 0) return;
    }
}

static void h_sum(NetCall *c, void *u) {
    (void)u;
    size_t total = 0;
    NetBuf m;
    NetRecv r;
    while ((r = net_call_recv(c, &m)) == NET_RECV_MESSAGE) {
        total += m.len;
        net_buf_free(&m);
    }
    if (r == NET_RECV_BROKEN) {
        pthread_mutex_lock(&seen.lock);
        seen.sum_broken++;
        pthread_mutex_unlock(&seen.lock);
        return;
    }
    char out[32];
    int n = snprintf(out, sizeof out, "%zu", total);
    net_call_send(c, out, (size_t)n);
}

/* uploads are spooled under the sender's certificate name ("site-a") */
#define OWNER "site-a"

static void h_upload(NetCall *c, void *u) {
    (void)u;
    NetLimits lim = {.max_total = 300u << 20, .idle_ms = 3000};
    NetReceived got;
    char err[ERR_LEN];
    NetStatus st = net_upload_receive(c, spool, net_call_peer(c)->name, &lim, &got, err);
    pthread_mutex_lock(&seen.lock);
    seen.last_upload = st;
    if (st == NET_OK) {
        seen.accepted++;
        uint8_t sha[32];
        security_sha256(got.data, got.length, sha);
        security_hex(sha, 32, seen.last_sha);
        seen.last_mapped = got.mapped;
    }
    pthread_mutex_unlock(&seen.lock);
    if (st != NET_OK) {
        net_call_status(c, st, "%s", err);
        return;
    }
    net_upload_answer(c, got.upload_id, got.length, 1);
    net_received_free(&got);
}

static void h_query(NetCall *c, void *u) {
    (void)u;
    net_upload_query_handle(c, spool, net_call_peer(c)->name);
}

static void h_download(NetCall *c, void *u) {
    (void)u;
    NetBuf m;
    if (net_call_recv(c, &m) != NET_RECV_MESSAGE) return;
    unsigned long long bytes = 0, seed = 0;
    sscanf((const char *)m.data, "%llu:%llu", &bytes, &seed);
    net_buf_free(&m);
    uint8_t *data = malloc(bytes ? bytes : 1);
    harness_fill(data, bytes, seed);
    NetTransferSpec spec = {"model", 3, "dl", 0, NULL, 0, NULL};
    char err[ERR_LEN];
    if (net_download_send(c, &spec, data, bytes, err) != 0)
        net_call_status(c, NET_UNAVAILABLE, "%s", err);
    free(data);
}

/* A coordinator that lies in its download: the request names how. The
 * payload is 8 KiB of harness_fill(…, 9) in chunks of NET_CHUNK_MIN. */
#define HOSTILE_LEN (2 * NET_CHUNK_MIN)
static void send_frame(NetCall *c, Strait__StreamFrame *f) {
    size_t n = strait__stream_frame__get_packed_size(f);
    uint8_t *b = malloc(n ? n : 1);
    strait__stream_frame__pack(f, b);
    net_call_send(c, b, n);
    free(b);
}
static void send_header(NetCall *c, uint64_t total, const uint8_t *sha, size_t sha_len,
                        uint32_t chunk, uint64_t offset, size_t meta_len) {
    static uint8_t meta[256];
    Strait__TransferHeader h = STRAIT__TRANSFER_HEADER__INIT;
    h.purpose = "model";
    h.upload_id = "dl";
    h.total_length = total;
    h.sha256.data = (uint8_t *)sha;
    h.sha256.len = sha_len;
    h.chunk_size = chunk;
    h.offset = offset;
    h.meta.data = meta;
    h.meta.len = meta_len;
    Strait__StreamFrame f = STRAIT__STREAM_FRAME__INIT;
    f.frame_case = STRAIT__STREAM_FRAME__FRAME_HEADER;
    f.header = &h;
    send_frame(c, &f);
}
static void send_chunk(NetCall *c, uint64_t offset, const uint8_t *data, size_t len) {
    Strait__Chunk ck = STRAIT__CHUNK__INIT;
    ck.offset = offset;
    ck.data.data = (uint8_t *)data;
    ck.data.len = len;
    Strait__StreamFrame f = STRAIT__STREAM_FRAME__INIT;
    f.frame_case = STRAIT__STREAM_FRAME__FRAME_CHUNK;
    f.chunk = &ck;
    send_frame(c, &f);
}
static void h_hostile_download(NetCall *c, void *u) {
    (void)u;
    NetBuf m;
    if (net_call_recv(c, &m) != NET_RECV_MESSAGE) return;
    char mode[32];
    snprintf(mode, sizeof mode, "%.*s", (int)m.len, (const char *)m.data);
    net_buf_free(&m);
    static uint8_t data[HOSTILE_LEN];
    uint8_t sha[32], wrong[32];
    harness_fill(data, sizeof data, 9);
    security_sha256(data, sizeof data, sha);
    memset(wrong, 5, sizeof wrong);
    const uint32_t K = NET_CHUNK_MIN;
    if (!strcmp(mode, "chunk-first")) {
        send_chunk(c, 0, data, K);
    } else if (!strcmp(mode, "garbage")) {
        static const char junk[] = "\xff\xff\xff not a frame";
        net_call_send(c, junk, sizeof junk - 1);
    } else if (!strcmp(mode, "short-sha")) {
        send_header(c, HOSTILE_LEN, sha, 16, K, 0, 0);
    } else if (!strcmp(mode, "tiny-chunks")) {
        send_header(c, HOSTILE_LEN, sha, 32, 16, 0, 0);
    } else if (!strcmp(mode, "huge-meta")) {
        send_header(c, HOSTILE_LEN, sha, 32, K, 0, NET_DOWNLOAD_META_MAX + 1);
    } else if (!strcmp(mode, "unasked-resume")) {
        send_header(c, HOSTILE_LEN, sha, 32, K, K, 0);
        send_chunk(c, K, data + K, K);
    } else if (!strcmp(mode, "too-big")) {
        send_header(c, 1ull << 40, sha, 32, K, 0, 0);
    } else {
        send_header(c, HOSTILE_LEN, !strcmp(mode, "wrong-sha") ? wrong : sha, 32, K, 0, 0);
        if (!strcmp(mode, "bad-offset")) {
            send_chunk(c, 5, data, K);
        } else if (!strcmp(mode, "empty-chunk")) {
            send_chunk(c, 0, data, 0);
        } else if (!strcmp(mode, "past-end")) {
            send_chunk(c, 0, data, K);
            send_chunk(c, K, data, K);
            send_chunk(c, 2 * K, data, K);
        } else if (!strcmp(mode, "oversized-chunk")) {
            send_chunk(c, 0, data, 2 * K);
        } else if (!strcmp(mode, "header-twice")) {
            send_header(c, HOSTILE_LEN, sha, 32, K, 0, 0);
        } else if (!strcmp(mode, "truncated")) {
            send_chunk(c, 0, data, K);
        } else { /* "honest", "wrong-sha" */
            send_chunk(c, 0, data, K);
            send_chunk(c, K, data + K, K);
        }
    }
}

static void h_slow(NetCall *c, void *u) {
    (void)u;
    NetBuf m;
    if (net_call_recv(c, &m) == NET_RECV_MESSAGE) net_buf_free(&m);
    int cancelled = 0;
    for (int i = 0; i < 200 && !cancelled; i++) cancelled = net_call_cancelled(c, 50);
    pthread_mutex_lock(&seen.lock);
    seen.slow_cancelled = cancelled;
    seen.slow_done = 1;
    pthread_mutex_unlock(&seen.lock);
}

static void h_block(NetCall *c, void *u) {
    (void)u;
    NetBuf m;
    if (net_call_recv(c, &m) == NET_RECV_MESSAGE) net_buf_free(&m);
    atomic_fetch_add(&seen.running, 1);
    for (int i = 0; i < 2000 && !atomic_load(&seen.release); i++) usleep(5000);
    net_call_send(c, "done", 4);
}

/* ---- fixture --------------------------------------------------------------- */

/* backlog -1: none, a busy pool refuses at once */
static char listen_at[64] = "127.0.0.1:0"; /* a test that restarts its server sets the port */

static void start_server_with(int workers, int reserve, int backlog) {
    char err[ERR_LEN];
    NetServerConfig cfg = {.listen = listen_at,
                           .tls = {tls.ca_cert, tls.server_cert, tls.server_key},
                           .workers = workers,
                           .per_peer = 64,
                           .reserve = reserve,
                           .backlog = backlog,
                           .anonymous = 1}; /* per-method certificates are under test */
    server = net_server_create(&cfg, err);
    cr_assert_not_null(server, "%s", err);
    struct {
        const char *path;
        NetMethodKind kind;
        int cert;
        NetHandler h;
    } m[] = {{"/strait.Test/Echo", NET_UNARY, 1, h_echo},
             {"/strait.Test/Open", NET_UNARY, 0, h_open},
             {"/strait.Test/Count", NET_SERVER_STREAM, 1, h_count},
             {"/strait.Test/Sum", NET_CLIENT_STREAM, 1, h_sum},
             {"/strait.Test/Upload", NET_CLIENT_STREAM, 1, h_upload},
             {"/strait.Test/Query", NET_UNARY, 1, h_query},
             {"/strait.Test/Download", NET_SERVER_STREAM, 1, h_download},
             {"/strait.Test/HostileDownload", NET_SERVER_STREAM, 1, h_hostile_download},
             {"/strait.Test/Slow", NET_UNARY, 1, h_slow},
             {"/strait.Test/Block", NET_UNARY, 1, h_block},
             {"/strait.Test/Admin", NET_UNARY, NET_REQUIRE_CERT | NET_USE_RESERVE, h_echo}};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        cr_assert_eq(
            net_server_add_method(server, m[i].path, m[i].kind, m[i].cert, m[i].h, NULL, err), 0,
            "%s", err);
    int port;
    cr_assert_eq(net_server_start(server, &port, err), 0, "%s", err);
    snprintf(target, sizeof target, "ipv4:127.0.0.1:%d", port);
}

static void start_server(int workers) {
    start_server_with(workers, 0, -1);
}

static void setup(void) {
    net_global_init();
    tls_fixture_init(&tls);
    snprintf(spool_dir, sizeof spool_dir, "%s/spool", tls.dir);
    char err[ERR_LEN];
    spool = net_spool_open(spool_dir, 1ull << 30, 0, 3600000, err);
    cr_assert_not_null(spool, "%s", err);
    start_server(4);
}

static void teardown(void) {
    net_server_stop(server, 10000); /* returns once drained; 1 s was short under ASan */
    net_spool_close(spool);
    tls_fixture_fini(&tls);
    net_global_shutdown();
}

TestSuite(net, .init = setup, .fini = teardown, .timeout = 240);

static NetChannel *channel(const char *cert, const char *key, const char *ca,
                           const char *server_name) {
    char err[ERR_LEN];
    NetChannelConfig cc = {target, {ca ? ca : tls.ca_cert, cert, key}, server_name, 0, 0};
    NetChannel *ch = net_channel_create(&cc, err);
    cr_assert_not_null(ch, "%s", err);
    return ch;
}

static NetChannel *site_channel(void) {
    return channel(tls.site_cert, tls.site_key, NULL, NULL);
}

/* ---- round trips ------------------------------------------------------------ */

/* A site's retry waits on net_channel_wait_ready: it must see a connection
 * lost and come back on the same address, and a wait of 0 only asks. */
Test(net, a_channel_waits_for_its_server_to_come_back) {
    NetChannel *ch = site_channel();
    cr_assert_eq(net_channel_wait_ready(ch, 20000), 1, "the server is up");
    cr_assert_eq(net_channel_wait_ready(ch, 0), 1);
    int port = atoi(strrchr(target, ':') + 1);
    net_server_stop(server, 1000);
    server = NULL;
    NetBuf resp;
    char details[256];
    NetStatus st = NET_OK;
    /* the channel learns the server went: bounded in count */
    for (int i = 0; i < 200 && st == NET_OK; i++) {
        st = net_unary(ch, "/strait.Test/Echo", "x", 1, &resp, 2000, details, sizeof details);
        if (st == NET_OK) net_buf_free(&resp), usleep(20000);
    }
    cr_assert_eq(st, NET_UNAVAILABLE, "%s: %s", net_status_name(st), details);
    cr_assert_eq(net_channel_wait_ready(ch, 0), 0, "nothing listens");
    /* refused attempts for 6 s: gRPC's own backoff between them has grown
     * to its 4 s at most */
    cr_assert_eq(net_channel_wait_ready(ch, 6000), 0, "nothing listens");
    snprintf(listen_at, sizeof listen_at, "127.0.0.1:%d", port);
    start_server(4);
    snprintf(listen_at, sizeof listen_at, "127.0.0.1:0");
    /* a wait tells the channel to try at once, not at the end of that */
    cr_assert_eq(net_channel_wait_ready(ch, 2000), 1,
                 "the server came back on port %d and the channel waited out gRPC's backoff", port);
    st = net_unary(ch, "/strait.Test/Echo", "x", 1, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    net_buf_free(&resp);
    net_channel_destroy(ch);
}

Test(net, unary_round_trip_sees_the_verified_peer) {
    NetChannel *ch = site_channel();
    NetBuf resp;
    char details[256];
    NetStatus st =
        net_unary(ch, "/strait.Test/Echo", "hello", 5, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    SecurityIdentity id;
    char err[ERR_LEN];
    cr_assert_eq(security_cert_identity(tls.site_cert, &id, err), 0);
    char want[256];
    snprintf(want, sizeof want, "peer=site-a;sha=%s;hello", id.sha256_hex);
    cr_assert_eq(resp.len, strlen(want));
    cr_assert_eq(memcmp(resp.data, want, resp.len), 0, "got %.*s", (int)resp.len, resp.data);
    net_buf_free(&resp);
    net_channel_destroy(ch);
}

Test(net, server_stream_delivers_every_message_in_order) {
    NetChannel *ch = site_channel();
    char err[ERR_LEN];
    NetClientCall *c = net_client_start(ch, "/strait.Test/Count", 10000, err);
    cr_assert_not_null(c, "%s", err);
    cr_assert_eq(net_client_send(c, "500", 4), 0);
    net_client_close_send(c);
    NetBuf m;
    int i = 0;
    while (net_client_recv(c, &m) == NET_RECV_MESSAGE) {
        char want[16];
        snprintf(want, sizeof want, "%d", i++);
        cr_assert_eq(m.len, strlen(want));
        cr_assert_eq(memcmp(m.data, want, m.len), 0);
        net_buf_free(&m);
    }
    cr_assert_eq(i, 500);
    cr_assert_eq(net_client_finish(c, NULL, 0), NET_OK);
    net_channel_destroy(ch);
}

Test(net, client_stream_arrives_whole) {
    NetChannel *ch = site_channel();
    char err[ERR_LEN];
    NetClientCall *c = net_client_start(ch, "/strait.Test/Sum", 10000, err);
    cr_assert_not_null(c, "%s", err);
    uint8_t buf[1000] = {0};
    for (int i = 0; i < 300; i++) cr_assert_eq(net_client_send(c, buf, (size_t)(i % 1000) + 1), 0);
    net_client_close_send(c);
    NetBuf m;
    cr_assert_eq(net_client_recv(c, &m), NET_RECV_MESSAGE);
    size_t want = 0;
    for (int i = 0; i < 300; i++) want += (size_t)(i % 1000) + 1;
    cr_assert_eq((size_t)atoll((const char *)m.data), want);
    net_buf_free(&m);
    cr_assert_eq(net_client_finish(c, NULL, 0), NET_OK);
    net_channel_destroy(ch);
}

Test(net, upload_and_download_of_256_mib_arrive_intact) {
    size_t n = 256u << 20;
    uint8_t *data = malloc(n);
    harness_fill(data, n, 42);
    uint8_t md[32];
    char want[SHA256_HEX_LEN], details[256];
    security_sha256(data, n, md);
    security_hex(md, 32, want);
    NetChannel *ch = site_channel();
    NetTransferSpec spec = {"update", 7, "big-1", 0, (const uint8_t *)"meta", 4, NULL};
    NetStatus st = net_upload(ch, "/strait.Test/Upload", "/strait.Test/Query", &spec, data, n,
                              120000, NULL, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    cr_assert_eq(seen.accepted, 1);
    cr_assert_str_eq(seen.last_sha, want, "the server's copy has another hash");
    /* handed on as a map of the spooled file (page cache, not a heap copy),
     * and the file is gone from the spool */
    cr_assert_eq(seen.last_mapped, n);
    cr_assert_eq(net_spool_committed(spool, OWNER, "big-1"), 0);
    NetBuf got;
    NetLimits lim = {.max_total = n};
    char req[64];
    int rl = snprintf(req, sizeof req, "%zu:42", n);
    st = net_download(ch, "/strait.Test/Download", req, (size_t)rl, &lim, 120000, &got, NULL, NULL,
                      details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    cr_assert_eq(got.len, n);
    cr_assert_eq(memcmp(got.data, data, n), 0);
    net_buf_free(&got);
    /* a download over the client's limit is refused before it allocates */
    lim.max_total = n - 1;
    st = net_download(ch, "/strait.Test/Download", req, (size_t)rl, &lim, 120000, &got, NULL, NULL,
                      details, sizeof details);
    cr_assert_eq(st, NET_RESOURCE_EXHAUSTED, "%s: %s", net_status_name(st), details);
    cr_assert_null(got.data);
    net_channel_destroy(ch);
    free(data);
}

/* ---- refusals ------------------------------------------------------------------- */

Test(net, a_client_without_certificate_is_refused_where_one_is_required) {
    NetChannel *ch = channel(NULL, NULL, NULL, NULL);
    NetBuf resp;
    char details[256];
    NetStatus st =
        net_unary(ch, "/strait.Test/Echo", "x", 1, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_UNAUTHENTICATED, "%s: %s", net_status_name(st), details);
    cr_assert_not_null(strstr(details, "client certificate"), "%s", details);
    /* ... but may call a method that needs none (Join) */
    st = net_unary(ch, "/strait.Test/Open", "x", 1, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    cr_assert_eq(memcmp(resp.data, "open;has_cert=0", resp.len), 0);
    net_buf_free(&resp);
    net_channel_destroy(ch);
}

/* A server that is not anonymous (the coordinator's) requires the
 * certificate in the TLS handshake: a peer without one never makes a call,
 * not even to a method that needs none; a site is answered. */
Test(net, a_server_that_requires_certificates_refuses_a_peer_without_one_in_the_handshake) {
    char err[ERR_LEN], details[256], t[64];
    NetServerConfig cfg = {.listen = "127.0.0.1:0",
                           .tls = {tls.ca_cert, tls.server_cert, tls.server_key}};
    NetServer *s = net_server_create(&cfg, err);
    cr_assert_not_null(s, "%s", err);
    cr_assert_eq(net_server_add_method(s, "/strait.Test/Open", NET_UNARY, 0, h_open, NULL, err), 0);
    int p;
    cr_assert_eq(net_server_start(s, &p, err), 0, "%s", err);
    snprintf(t, sizeof t, "ipv4:127.0.0.1:%d", p);
    NetChannelConfig none = {t, {tls.ca_cert, NULL, NULL}, NULL, 0, 0};
    NetChannel *ch = net_channel_create(&none, err);
    NetStatus st = net_unary(ch, "/strait.Test/Open", "x", 1, NULL, 10000, details, sizeof details);
    cr_assert_eq(st, NET_UNAVAILABLE, "%s: %s", net_status_name(st), details);
    net_channel_destroy(ch);
    NetChannelConfig site = {t, {tls.ca_cert, tls.site_cert, tls.site_key}, NULL, 0, 0};
    ch = net_channel_create(&site, err);
    NetBuf resp;
    st = net_unary(ch, "/strait.Test/Open", "x", 1, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    cr_assert_eq(memcmp(resp.data, "open;has_cert=1", resp.len), 0);
    net_buf_free(&resp);
    net_channel_destroy(ch);
    net_server_stop(s, 1000);
}

Test(net, a_certificate_from_another_ca_fails_the_handshake) {
    NetChannel *ch = channel(tls.foreign_cert, tls.foreign_key, NULL, NULL);
    char details[256];
    NetStatus st = net_unary(ch, "/strait.Test/Open", "x", 1, NULL, 10000, details, sizeof details);
    cr_assert_eq(st, NET_UNAVAILABLE, "%s: %s", net_status_name(st), details);
    net_channel_destroy(ch);
    /* and a client that trusts another CA refuses our server */
    ch = channel(tls.site_cert, tls.site_key, tls.foreign_ca, NULL);
    st = net_unary(ch, "/strait.Test/Open", "x", 1, NULL, 10000, details, sizeof details);
    cr_assert_eq(st, NET_UNAVAILABLE, "%s: %s", net_status_name(st), details);
    net_channel_destroy(ch);
}

Test(net, a_wrong_server_name_is_refused) {
    NetChannel *ch = channel(tls.site_cert, tls.site_key, NULL, "coordinator.example.org");
    char details[256];
    NetStatus st = net_unary(ch, "/strait.Test/Echo", "x", 1, NULL, 10000, details, sizeof details);
    cr_assert_eq(st, NET_UNAVAILABLE, "%s: %s", net_status_name(st), details);
    net_channel_destroy(ch);
}

Test(net, an_unknown_method_is_unimplemented_not_a_hang) {
    NetChannel *ch = site_channel();
    char details[256];
    NetStatus st = net_unary(ch, "/strait.Test/Nope", "x", 1, NULL, 20000, details, sizeof details);
    cr_assert_eq(st, NET_UNIMPLEMENTED, "%s: %s", net_status_name(st), details);
    net_channel_destroy(ch);
}

/* Sends a raw upload stream: a header frame with the given fields, then the
 * given chunks; returns the status. */
/* A chunk frame at offset, as an uploader sends it (or a hostile one). */
static void client_chunk(NetClientCall *c, uint64_t offset, const uint8_t *data, size_t len) {
    Strait__Chunk ck = STRAIT__CHUNK__INIT;
    ck.offset = offset;
    ck.data.data = (uint8_t *)data;
    ck.data.len = len;
    Strait__StreamFrame cf = STRAIT__STREAM_FRAME__INIT;
    cf.frame_case = STRAIT__STREAM_FRAME__FRAME_CHUNK;
    cf.chunk = &ck;
    uint8_t *out = malloc(strait__stream_frame__get_packed_size(&cf) + 1);
    size_t ol = strait__stream_frame__pack(&cf, out);
    net_client_send(c, out, ol);
    free(out);
}

/* Ends an upload's stream and takes the receiver's answer and status. */
static NetStatus client_finish(NetClientCall *c, char *details) {
    net_client_close_send(c);
    NetBuf m;
    if (net_client_recv(c, &m) == NET_RECV_MESSAGE) net_buf_free(&m);
    return net_client_finish(c, details, 256);
}

static NetStatus raw_upload(NetChannel *ch, const char *id, uint64_t total, const uint8_t *sha,
                            const uint64_t *offsets, const uint8_t *data, const size_t *lens,
                            int n_chunks, char *details) {
    Strait__TransferHeader h = STRAIT__TRANSFER_HEADER__INIT;
    h.purpose = "update";
    h.upload_id = (char *)id;
    h.total_length = total;
    h.sha256.data = (uint8_t *)sha;
    h.sha256.len = 32;
    h.chunk_size = 1 << 20;
    Strait__StreamFrame f = STRAIT__STREAM_FRAME__INIT;
    f.frame_case = STRAIT__STREAM_FRAME__FRAME_HEADER;
    f.header = &h;
    uint8_t buf[4096];
    size_t len = strait__stream_frame__pack(&f, buf);
    char err[ERR_LEN];
    NetClientCall *c = net_client_start(ch, "/strait.Test/Upload", 20000, err);
    cr_assert_not_null(c);
    net_client_send(c, buf, len);
    for (int i = 0; i < n_chunks; i++) client_chunk(c, offsets[i], data + offsets[i], lens[i]);
    return client_finish(c, details);
}

Test(net, transfer_refusals_commit_nothing) {
    NetChannel *ch = site_channel();
    uint8_t data[4096], sha[32], wrong[32];
    harness_fill(data, sizeof data, 1);
    security_sha256(data, sizeof data, sha);
    memset(wrong, 7, 32);
    char details[256];
    uint64_t offs[2] = {0, 2048};
    size_t lens[2] = {2048, 2048};
    /* a header claiming more than the limit: refused before a byte is spooled */
    NetStatus st = raw_upload(ch, "huge", 1ull << 40, sha, NULL, NULL, NULL, 0, details);
    cr_assert_eq(st, NET_RESOURCE_EXHAUSTED, "%s: %s", net_status_name(st), details);
    cr_assert_eq(net_spool_committed(spool, OWNER, "huge"), 0, "an oversized upload was spooled");
    /* a chunk at the wrong offset */
    uint64_t bad_offs[2] = {0, 1000};
    st = raw_upload(ch, "gap", 4096, sha, bad_offs, data, lens, 2, details);
    cr_assert_eq(st, NET_INVALID_ARGUMENT, "%s: %s", net_status_name(st), details);
    cr_assert_not_null(strstr(details, "expected one at 2048"), "%s", details);
    /* a payload whose hash does not match: nothing kept */
    st = raw_upload(ch, "liar", 4096, wrong, offs, data, lens, 2, details);
    cr_assert_eq(st, NET_DATA_LOSS, "%s: %s", net_status_name(st), details);
    cr_assert_eq(net_spool_committed(spool, OWNER, "liar"), 0,
                 "a payload with a wrong hash was kept");
    /* a malformed upload id (it names a file) */
    st = raw_upload(ch, "../escape", 4096, sha, offs, data, lens, 2, details);
    cr_assert_eq(st, NET_INVALID_ARGUMENT, "%s: %s", net_status_name(st), details);
    cr_assert_eq(seen.accepted, 0, "a refused upload was accepted");
    /* the same bytes with the right hash are accepted */
    st = raw_upload(ch, "honest", 4096, sha, offs, data, lens, 2, details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    cr_assert_eq(seen.accepted, 1);
    net_channel_destroy(ch);
}

/* A site downloading from a coordinator that lies: every header field
 * and chunk a download's receiver checks, each broken alone, is refused
 * with its reason, and nothing of it is handed back or kept for a resume. */
Test(net, a_hostile_download_is_refused_field_by_field) {
    NetChannel *ch = site_channel();
    static const struct {
        const char *mode;
        NetStatus want;
        const char *why;
    } cases[] = {
        {"chunk-first", NET_INTERNAL, "did not start with its header"},
        {"garbage", NET_INTERNAL, "did not start with its header"},
        {"short-sha", NET_INTERNAL, "malformed download header"},
        {"tiny-chunks", NET_INTERNAL, "malformed download header"},
        {"huge-meta", NET_INTERNAL, "malformed download header"},
        {"unasked-resume", NET_INTERNAL, "malformed download header"},
        {"too-big", NET_RESOURCE_EXHAUSTED, "over the limit"},
        {"bad-offset", NET_INTERNAL, "out of order or out of bounds at 0"},
        {"empty-chunk", NET_INTERNAL, "out of order or out of bounds at 0"},
        {"past-end", NET_INTERNAL, "out of order or out of bounds at 8192"},
        {"oversized-chunk", NET_INTERNAL, "out of order or out of bounds at 0"},
        {"header-twice", NET_INTERNAL, "out of order or out of bounds at 0"},
        {"truncated", NET_DATA_LOSS, "failed its length or SHA-256 check"},
        {"wrong-sha", NET_DATA_LOSS, "failed its length or SHA-256 check"},
    };
    NetLimits lim = {.max_total = 1 << 20};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        NetBuf got;
        NetDownloadHeld held = {0};
        NetDownloadHead head;
        char details[256] = "";
        NetStatus st =
            net_download(ch, "/strait.Test/HostileDownload", cases[i].mode, strlen(cases[i].mode),
                         &lim, 20000, &got, &head, &held, details, sizeof details);
        cr_assert_eq(st, cases[i].want, "%s: %s (%s)", cases[i].mode, net_status_name(st), details);
        cr_assert_not_null(strstr(details, cases[i].why), "%s: want '%s', got '%s'", cases[i].mode,
                           cases[i].why, details);
        cr_assert_null(got.data, "%s: a refused download was handed back", cases[i].mode);
        cr_assert_null(held.data, "%s: a refused download was kept to resume", cases[i].mode);
    }
    /* the same server telling the truth is believed */
    NetBuf got;
    char details[256] = "";
    NetStatus st = net_download(ch, "/strait.Test/HostileDownload", "honest", 6, &lim, 20000, &got,
                                NULL, NULL, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s", details);
    cr_assert_eq(got.len, HOSTILE_LEN);
    net_buf_free(&got);
    net_channel_destroy(ch);
}

/* The header an upload's receiver checks, each field broken alone, and
 * frames that are not the chunk it expects: each refused with its reason
 * and nothing spooled. */
typedef struct BadHeader {
    const char *name;
    uint32_t chunk_size;
    size_t sha_len, meta_len;
    const char *purpose;
    uint64_t offset;
    const char *then; /* after the header: "header", "garbage", "zero", "long" or NULL */
    NetStatus want;
    const char *why;
} BadHeader;

static NetStatus header_upload(NetChannel *ch, const BadHeader *b, const uint8_t *sha,
                               const uint8_t *data, char *details) {
    static uint8_t meta[70000];
    Strait__TransferHeader h = STRAIT__TRANSFER_HEADER__INIT;
    h.purpose = (char *)b->purpose;
    h.upload_id = (char *)b->name;
    h.total_length = 8192;
    h.sha256.data = (uint8_t *)sha;
    h.sha256.len = b->sha_len;
    h.chunk_size = b->chunk_size;
    h.offset = b->offset;
    h.meta.data = meta;
    h.meta.len = b->meta_len;
    Strait__StreamFrame f = STRAIT__STREAM_FRAME__INIT;
    f.frame_case = STRAIT__STREAM_FRAME__FRAME_HEADER;
    f.header = &h;
    size_t len = strait__stream_frame__get_packed_size(&f);
    uint8_t *buf = malloc(len);
    strait__stream_frame__pack(&f, buf);
    char err[ERR_LEN];
    NetClientCall *c = net_client_start(ch, "/strait.Test/Upload", 20000, err);
    cr_assert_not_null(c, "%s", err);
    net_client_send(c, buf, len);
    if (b->then && !strcmp(b->then, "header")) net_client_send(c, buf, len);
    free(buf);
    static const char junk[] = "\xff\xfe junk";
    if (b->then && !strcmp(b->then, "garbage")) net_client_send(c, junk, sizeof junk - 1);
    if (b->then && (!strcmp(b->then, "zero") || !strcmp(b->then, "long")))
        client_chunk(c, 0, data, !strcmp(b->then, "zero") ? 0 : 8192); /* 8192: over a chunk */
    return client_finish(c, details);
}

Test(net, a_hostile_upload_header_is_refused_field_by_field) {
    NetChannel *ch = site_channel();
    uint8_t data[8192], sha[32];
    harness_fill(data, sizeof data, 3);
    security_sha256(data, sizeof data, sha);
    const uint32_t K = NET_CHUNK_MIN;
    static char long_purpose[200];
    memset(long_purpose, 'p', sizeof long_purpose - 1);
    const char *bad = "malformed transfer header";
    const BadHeader cases[] = {
        {"tiny-chunks", 16, 32, 0, "update", 0, NULL, NET_INVALID_ARGUMENT, bad},
        {"huge-chunks", NET_CHUNK_MAX + 1, 32, 0, "update", 0, NULL, NET_INVALID_ARGUMENT, bad},
        {"short-sha", K, 20, 0, "update", 0, NULL, NET_INVALID_ARGUMENT, bad},
        {"long-purpose", K, 32, 0, long_purpose, 0, NULL, NET_INVALID_ARGUMENT, bad},
        {"huge-meta", K, 32, 65537, "update", 0, NULL, NET_INVALID_ARGUMENT, bad},
        {"past-end", K, 32, 0, "update", 8193, NULL, NET_INVALID_ARGUMENT, bad},
        {"unheld-resume", K, 32, 0, "update", 4096, NULL, NET_FAILED_PRECONDITION,
         "resume from there"},
        {"two-headers", K, 32, 0, "update", 0, "header", NET_INVALID_ARGUMENT, "expected a chunk"},
        {"junk-frame", K, 32, 0, "update", 0, "garbage", NET_INVALID_ARGUMENT, "expected a chunk"},
        {"empty-chunk", K, 32, 0, "update", 0, "zero", NET_INVALID_ARGUMENT,
         "chunk of 0 bytes at 0"},
        {"long-chunk", K, 32, 0, "update", 0, "long", NET_INVALID_ARGUMENT,
         "chunk of 8192 bytes at 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char details[256] = "";
        NetStatus st = header_upload(ch, &cases[i], sha, data, details);
        cr_assert_eq(st, cases[i].want, "%s: %s (%s)", cases[i].name, net_status_name(st), details);
        cr_assert_not_null(strstr(details, cases[i].why), "%s: want '%s', got '%s'", cases[i].name,
                           cases[i].why, details);
        cr_assert_eq(net_spool_committed(spool, OWNER, cases[i].name), 0,
                     "%s: a refused upload was spooled", cases[i].name);
    }
    cr_assert_eq(seen.accepted, 0, "a refused upload was accepted");
    net_channel_destroy(ch);
}

/* What net/ refuses to build and what it fills in: a server without its
 * CA, certificate or key, a channel without a CA or with a certificate
 * and no key; a server of all defaults serves, over IPv6 loopback too,
 * where the peer's address comes without its brackets and port; status
 * names and targets as the messages print them. */
Test(net, configuration_refusals_defaults_and_ipv6_peers) {
    char err[ERR_LEN] = "";
    NetServerConfig bad = {.listen = "127.0.0.1:0", .tls = {tls.ca_cert, NULL, tls.server_key}};
    cr_assert_null(net_server_create(&bad, err));
    cr_assert_not_null(strstr(err, "needs the CA, its certificate and its key"), "%s", err);
    NetChannelConfig nca = {target, {NULL, NULL, NULL}, NULL, 0, 0};
    cr_assert_null(net_channel_create(&nca, err));
    cr_assert_neq(err[0], '\0');
    NetChannelConfig half = {target, {tls.ca_cert, tls.site_cert, NULL}, NULL, 0, 0};
    err[0] = '\0';
    cr_assert_null(net_channel_create(&half, err));
    cr_assert_neq(err[0], '\0');
    cr_assert_str_eq(net_status_name(NET_OK), "OK");
    cr_assert_str_eq(net_status_name((NetStatus)999), "UNKNOWN");
    char t[128];
    net_target("127.0.0.1:7700", t, sizeof t);
    cr_assert_str_eq(t, "ipv4:127.0.0.1:7700");
    net_target("coordinator.example:7700", t, sizeof t);
    cr_assert_str_eq(t, "coordinator.example:7700", "a name is left to the resolver");
    /* every knob at 0: the defaults; on [::1] */
    NetServerConfig cfg = {.listen = "[::1]:0",
                           .tls = {tls.ca_cert, tls.server_cert, tls.server_key}};
    NetServer *s6 = net_server_create(&cfg, err);
    cr_assert_not_null(s6, "%s", err);
    cr_assert_eq(net_server_add_method(s6, "/strait.Test/Addr", NET_UNARY, 1, h_addr, NULL, err), 0,
                 "%s", err);
    int port;
    if (net_server_start(s6, &port, err) != 0) { /* a host without IPv6 loopback */
        cr_log_warn("no IPv6 loopback here (%s): the IPv6 half is skipped", err);
        net_server_stop(s6, 1000);
        return;
    }
    char t6[64];
    snprintf(t6, sizeof t6, "ipv6:[::1]:%d", port);
    NetChannelConfig cc = {t6, {tls.ca_cert, tls.site_cert, tls.site_key}, "localhost", 0, 0};
    NetChannel *ch = net_channel_create(&cc, err);
    cr_assert_not_null(ch, "%s", err);
    NetBuf resp;
    char details[256];
    NetStatus st =
        net_unary(ch, "/strait.Test/Addr", "?", 1, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    cr_assert(resp.len == 3 && memcmp(resp.data, "::1", 3) == 0, "peer address '%.*s'",
              (int)resp.len, resp.data);
    net_buf_free(&resp);
    net_channel_destroy(ch);
    net_server_stop(s6, 1000);
}

/* ---- a real uploader killed mid-upload, then resumed ------------------------------ */

static pid_t spawn_peer(const char *id, size_t bytes, int out_fd) {
    char sz[32];
    snprintf(sz, sizeof sz, "%zu", bytes);
    char helper[600];
    snprintf(helper, sizeof helper, "%s/tests/net_peer",
             getenv("STRAIT_BUILD") ? getenv("STRAIT_BUILD") : "build");
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (out_fd >= 0) dup2(out_fd, 1);
        /* 64 KiB chunks: many small writes, so the kill lands mid-stream */
        execl(helper, helper, "upload", target, tls_fixture_path(&tls, "ca.crt", 0),
              tls_fixture_path(&tls, "site.crt", 1), tls_fixture_path(&tls, "site.key", 2), id, sz,
              "99", "65536", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* An uploader of n bytes under id, in its own process, killed once the
 * spool holds at least `part` of them; what the spool holds then. */
static uint64_t kill_uploader_partway(const char *id, size_t n, uint64_t part) {
    pid_t pid = spawn_peer(id, n, -1);
    uint64_t held = 0;
    for (int i = 0; i < 6000 && held < part; i++) {
        usleep(5000);
        held = net_spool_committed(spool, OWNER, id);
    }
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFSIGNALED(st), "the uploader finished before it could be killed");
    return net_spool_committed(spool, OWNER, id);
}

Test(net, a_killed_uploader_resumes_in_a_new_process) {
    size_t n = 96u << 20;
    uint64_t held = kill_uploader_partway("resume-me", n, 8u << 20);
    int st;
    pid_t pid;
    cr_assert_gt(held, 0, "nothing was spooled before the kill");
    cr_assert_lt(held, n);
    /* the server saw a broken stream and accepted nothing */
    for (int i = 0; i < 400 && seen.last_upload == NET_OK; i++) usleep(5000);
    cr_assert_eq(seen.last_upload, NET_CANCELLED, "server status %s",
                 net_status_name(seen.last_upload));
    cr_assert_eq(seen.accepted, 0);
    /* ... and keeps serving others */
    NetChannel *ch = site_channel();
    NetBuf resp;
    cr_assert_eq(net_unary(ch, "/strait.Test/Open", "x", 1, &resp, 10000, NULL, 0), NET_OK);
    net_buf_free(&resp);
    net_channel_destroy(ch);
    /* a new process resumes from what the server holds */
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid = spawn_peer("resume-me", n, fds[1]);
    close(fds[1]);
    char out[512] = "";
    ssize_t got = 0, r;
    while ((r = read(fds[0], out + got, sizeof out - 1 - (size_t)got)) > 0) got += r;
    close(fds[0]);
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "resume failed: %s", out);
    unsigned long long from = 0;
    cr_assert_eq(sscanf(out, "resumed_from=%llu", &from), 1, "%s", out);
    cr_assert_geq(from, held, "resumed from %llu, the server held %llu", from,
                  (unsigned long long)held);
    cr_assert_gt(from, 0);
    uint8_t *data = malloc(n), md[32];
    harness_fill(data, n, 99);
    security_sha256(data, n, md);
    char want[SHA256_HEX_LEN];
    security_hex(md, 32, want);
    cr_assert_eq(seen.accepted, 1);
    cr_assert_str_eq(seen.last_sha, want, "the resumed payload has the wrong hash");
    free(data);
}

/* An upload that starts from the beginning (it did not ask what is held)
 * replaces what an earlier attempt of the same id left in the spool: the
 * file is made anew, and the payload is the new bytes, whole. */
Test(net, an_upload_from_the_start_replaces_what_was_held) {
    cr_assert_gt(kill_uploader_partway("again", 48u << 20, 4u << 20), 0);
    for (int i = 0; i < 400 && seen.last_upload == NET_OK; i++) usleep(5000);
    size_t m = 5u << 20; /* shorter, and other bytes */
    uint8_t *data = malloc(m), md[32];
    harness_fill(data, m, 7);
    security_sha256(data, m, md);
    char want[SHA256_HEX_LEN], details[256];
    security_hex(md, 32, want);
    NetChannel *ch = site_channel();
    NetTransferSpec spec = {"update", 7, "again", 0, NULL, 0, NULL};
    NetStatus ns = net_upload(ch, "/strait.Test/Upload", NULL, &spec, data, m, 60000, NULL, details,
                              sizeof details);
    cr_assert_eq(ns, NET_OK, "%s: %s", net_status_name(ns), details);
    cr_assert_eq(seen.accepted, 1);
    cr_assert_str_eq(seen.last_sha, want, "the server kept bytes of the earlier attempt");
    cr_assert_eq(seen.last_mapped, m);
    cr_assert_eq(net_spool_committed(spool, OWNER, "again"), 0);
    net_channel_destroy(ch);
    free(data);
}

/* ---- deadlines, cancellation, the pool -------------------------------------------- */

Test(net, a_deadline_is_seen_by_both_sides) {
    NetChannel *ch = site_channel();
    char details[256];
    NetStatus st = net_unary(ch, "/strait.Test/Slow", "x", 1, NULL, 300, details, sizeof details);
    cr_assert_eq(st, NET_DEADLINE_EXCEEDED, "%s: %s", net_status_name(st), details);
    for (int i = 0; i < 400 && !seen.slow_done; i++) usleep(10000);
    cr_assert(seen.slow_done);
    cr_assert_eq(seen.slow_cancelled, 1, "the handler never learnt of the deadline");
    net_channel_destroy(ch);
}

Test(net, a_cancelled_stream_is_seen_by_both_sides) {
    NetChannel *ch = site_channel();
    char err[ERR_LEN];
    NetClientCall *c = net_client_start(ch, "/strait.Test/Sum", 10000, err);
    cr_assert_not_null(c);
    cr_assert_eq(net_client_send(c, "abc", 3), 0);
    usleep(100000);
    net_client_cancel(c);
    cr_assert_eq(net_client_finish(c, NULL, 0), NET_CANCELLED);
    for (int i = 0; i < 400 && !seen.sum_broken; i++) usleep(10000);
    cr_assert_eq(seen.sum_broken, 1, "the handler did not see the stream break");
    net_channel_destroy(ch);
}

typedef struct BlockCall {
    NetChannel *ch;
    NetStatus st;
} BlockCall;

static void *block_thread(void *arg) {
    BlockCall *b = arg;
    b->st = net_unary(b->ch, "/strait.Test/Block", "x", 1, NULL, 30000, NULL, 0);
    return NULL;
}

Test(net, calls_beyond_the_pool_get_resource_exhausted) {
    net_server_stop(server, 10000); /* returns once drained; 1 s was short under ASan */
    start_server(2);
    NetChannel *ch = site_channel();
    BlockCall calls[2] = {{ch, NET_UNKNOWN}, {ch, NET_UNKNOWN}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, block_thread, &calls[i]);
    for (int i = 0; i < 1000 && atomic_load(&seen.running) < 2; i++) usleep(5000);
    cr_assert_eq(atomic_load(&seen.running), 2, "both workers should be busy");
    char details[256];
    NetStatus st = net_unary(ch, "/strait.Test/Open", "x", 1, NULL, 10000, details, sizeof details);
    cr_assert_eq(st, NET_RESOURCE_EXHAUSTED, "%s: %s", net_status_name(st), details);
    atomic_store(&seen.release, 1);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    cr_assert_eq(calls[0].st, NET_OK);
    cr_assert_eq(calls[1].st, NET_OK);
    /* a worker frees itself just after its client has the answer: the pool
     * recovers within moments, not necessarily before the next call */
    NetBuf resp = {NULL, 0};
    for (int i = 0; i < 100; i++) {
        st = net_unary(ch, "/strait.Test/Open", "x", 1, &resp, 10000, details, sizeof details);
        if (st != NET_RESOURCE_EXHAUSTED) break;
        usleep(20000);
    }
    cr_assert_eq(st, NET_OK, "the server did not recover: %s", details);
    net_buf_free(&resp);
    net_channel_destroy(ch);
}

/* spec under another upload id, through the test's upload method */
static NetStatus upload_as(NetChannel *ch, NetTransferSpec *spec, const char *id,
                           const uint8_t *data, size_t n, char details[256]) {
    spec->upload_id = id;
    return net_upload(ch, "/strait.Test/Upload", "/strait.Test/Query", spec, data, n, 20000, NULL,
                      details, 256);
}

Test(net, the_spool_is_bounded_and_expires_old_uploads) {
    char err[ERR_LEN], old[700], held_dir[700];
    /* an upload a sender abandoned long ago */
    snprintf(old, sizeof old, "%s/" OWNER, spool_dir);
    cr_assert_eq(file_mkdir_p(old, 0700, err), 0, "%s", err);
    snprintf(old, sizeof old, "%s/" OWNER "/abandoned.part", spool_dir);
    cr_assert_eq(file_write_atomic(old, "partial", 7, 0600, err), 0, "%s", err);
    struct timespec times[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    cr_assert_eq(utimensat(AT_FDCWD, old, times, 0), 0);
    net_spool_close(spool);
    spool = net_spool_open(spool_dir, 1u << 20, 0, 3600000, err); /* 1 MiB, one hour */
    cr_assert_not_null(spool, "%s", err);
    NetChannel *ch = site_channel();
    size_t n = 600u << 10;
    uint8_t *data = malloc(n);
    harness_fill(data, n, 5);
    char details[256];
    NetTransferSpec spec = {"update", 1, "fits", 64u << 10, NULL, 0, NULL};
    NetStatus st = net_upload(ch, "/strait.Test/Upload", "/strait.Test/Query", &spec, data, n,
                              20000, NULL, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    cr_assert_neq(access(old, F_OK), 0, "an expired upload was kept");
    /* two uploads that together pass the bound: the second is refused */
    snprintf(old, sizeof old, "%s/someone-else/held.part", spool_dir); /* counts in the total */
    snprintf(held_dir, sizeof held_dir, "%s/someone-else", spool_dir);
    cr_assert_eq(file_mkdir_p(held_dir, 0700, err), 0, "%s", err);
    uint8_t *held = calloc(1, 700u << 10);
    cr_assert_eq(file_write_atomic(old, held, 700u << 10, 0600, err), 0, "%s", err);
    st = upload_as(ch, &spec, "too-much", data, n, details);
    cr_assert_eq(st, NET_RESOURCE_EXHAUSTED, "%s: %s", net_status_name(st), details);
    cr_assert_not_null(strstr(details, "spool is full"), "%s", details);
    /* a quota per owner: another owner's bytes do not count against this
     * one's, this owner's own held bytes do */
    net_spool_close(spool);
    spool = net_spool_open(spool_dir, 8u << 20, 1u << 20, 3600000, err); /* 1 MiB per owner */
    cr_assert_not_null(spool, "%s", err);
    st = upload_as(ch, &spec, "own-quota", data, n, details);
    cr_assert_eq(st, NET_OK, "another owner's 700 KiB counted: %s", details);
    snprintf(old, sizeof old, "%s/" OWNER "/mine.part", spool_dir);
    cr_assert_eq(file_write_atomic(old, held, 700u << 10, 0600, err), 0, "%s", err);
    st = upload_as(ch, &spec, "over-quota", data, n, details);
    cr_assert_eq(st, NET_RESOURCE_EXHAUSTED, "%s: %s", net_status_name(st), details);
    cr_assert_not_null(strstr(details, "this site's spool quota"), "%s", details);
    free(held);
    free(data);
    net_channel_destroy(ch);
}

/* The reserve is the admin's even when common calls pile up: with two
 * workers, one reserved and a backlog, a second common call waits in the
 * backlog instead of taking the reserved worker, and an admin call runs. */
Test(net, the_reserve_stays_free_for_its_methods) {
    net_server_stop(server, 10000); /* returns once drained; 1 s was short under ASan */
    start_server_with(2, 1, 2);
    NetChannel *ch = site_channel();
    BlockCall calls[2] = {{ch, NET_UNKNOWN}, {ch, NET_UNKNOWN}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, block_thread, &calls[i]);
    for (int i = 0; i < 1000 && atomic_load(&seen.running) < 1; i++) usleep(5000);
    usleep(300000);
    cr_assert_eq(atomic_load(&seen.running), 1, "a common call took the reserved worker");
    char details[256];
    NetBuf resp;
    NetStatus st =
        net_unary(ch, "/strait.Test/Admin", "hi", 2, &resp, 5000, details, sizeof details);
    cr_assert_eq(st, NET_OK, "the reserved method was starved: %s: %s", net_status_name(st),
                 details);
    net_buf_free(&resp);
    atomic_store(&seen.release, 1);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    cr_assert_eq(calls[0].st, NET_OK, "%s", net_status_name(calls[0].st));
    cr_assert_eq(calls[1].st, NET_OK, "the queued common call: %s", net_status_name(calls[1].st));
    net_channel_destroy(ch);
}
