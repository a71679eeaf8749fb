/*
 * net.c — transport benchmark: a 256 MiB payload uploaded and downloaded over
 * loopback with mutual TLS through net/ (the real transfer path: SHA-256 on
 * both ends, chunks of 1 MiB, the upload spooled to disk), beside a raw
 * OpenSSL TLS 1.3 socket (mutual, AES-256-GCM) moving the same bytes in the
 * same run. Also the bare stream (1 MiB messages, no hashing, no spool) to
 * show where the rest goes, and each transfer against it (up_vs_stream,
 * down_vs_stream: issue 28's figure). The upload is timed as a site makes
 * it: the site hashes its update once when it encodes it (session_encode,
 * counted in the round's encode time) and every upload and retry streams
 * with that hash in hand, so the timed span holds the receiver's hash and
 * spool; the same upload hashing on the sender inside the span is
 * up_hashed_mib_s, and the sender's SHA-256 alone is sender_sha256_s. The
 * download's sender has the hash already (the coordinator hashes a model
 * once and serves it to every site), its receiver verifies it.
 *
 *   build/bench/net [--full]      256 MiB (1 GiB with --full), median of 3
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include "net/net.h"
#include "security/security.h"
#include "util/util.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) DIE(__VA_ARGS__);                                                             \
    } while (0)

static char *ca_cert, *ca_key, *srv_cert, *srv_key, *cli_cert, *cli_key;
static size_t payload_len;
static uint8_t *payload;
static NetSpool *spool;
static uint8_t payload_sha[32]; /* hashed once, as the coordinator does for a model */

static double median3(double a, double b, double c) {
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

/* ---- raw OpenSSL TLS 1.3 ---------------------------------------------------- */

static SSL_CTX *raw_ctx(int server) {
    SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_ciphersuites(ctx, "TLS_AES_256_GCM_SHA384");
    BIO *b = BIO_new_mem_buf(server ? srv_cert : cli_cert, -1);
    X509 *c = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    b = BIO_new_mem_buf(server ? srv_key : cli_key, -1);
    EVP_PKEY *k = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
    BIO_free(b);
    CHECK(SSL_CTX_use_certificate(ctx, c) == 1 && SSL_CTX_use_PrivateKey(ctx, k) == 1,
          "raw TLS: certificate");
    X509_free(c);
    EVP_PKEY_free(k);
    b = BIO_new_mem_buf(ca_cert, -1);
    X509 *ca = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca);
    X509_free(ca);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    return ctx;
}

typedef struct RawServer {
    int listen_fd;
    size_t received;
} RawServer;

static void *raw_server_main(void *arg) {
    RawServer *rs = arg;
    SSL_CTX *ctx = raw_ctx(1);
    int fd = accept(rs->listen_fd, NULL, NULL);
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    CHECK(SSL_accept(ssl) == 1, "raw TLS accept");
    uint8_t *buf = malloc(1 << 20);
    int n;
    while ((n = SSL_read(ssl, buf, 1 << 20)) > 0) rs->received += (size_t)n;
    free(buf);
    SSL_free(ssl);
    close(fd);
    SSL_CTX_free(ctx);
    return NULL;
}

static double raw_tls_mib_s(void) {
    RawServer rs = {socket(AF_INET, SOCK_STREAM, 0), 0};
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    CHECK(bind(rs.listen_fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(rs.listen_fd, 1) == 0,
          "raw TLS: listen");
    getsockname(rs.listen_fd, (struct sockaddr *)&a, &al);
    pthread_t t;
    pthread_create(&t, NULL, raw_server_main, &rs);
    SSL_CTX *ctx = raw_ctx(0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "raw TLS: connect");
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, "localhost");
    CHECK(SSL_connect(ssl) == 1, "raw TLS connect");
    uint64_t t0 = time_monotonic_ns();
    for (size_t at = 0; at < payload_len; at += 1 << 20) {
        size_t n = payload_len - at < (1u << 20) ? payload_len - at : (1u << 20);
        CHECK(SSL_write(ssl, payload + at, (int)n) == (int)n, "raw TLS write");
    }
    SSL_shutdown(ssl);
    shutdown(fd, SHUT_WR);
    pthread_join(t, NULL);
    double s = (double)(time_monotonic_ns() - t0) / 1e9;
    CHECK(rs.received == payload_len, "raw TLS: %zu of %zu bytes arrived", rs.received,
          payload_len);
    SSL_free(ssl);
    close(fd);
    close(rs.listen_fd);
    SSL_CTX_free(ctx);
    return (double)payload_len / (1 << 20) / s;
}

/* ---- net/ ------------------------------------------------------------------ */

static void h_upload(NetCall *c, void *u) {
    (void)u;
    NetLimits lim = {.max_total = payload_len};
    NetReceived got;
    char err[ERR_LEN];
    NetStatus st = net_upload_receive(c, spool, "bench", &lim, &got, err);
    if (st != NET_OK) {
        net_call_status(c, st, "%s", err);
        return;
    }
    net_upload_answer(c, got.upload_id, got.length, 1);
    net_received_free(&got);
}

static void h_query(NetCall *c, void *u) {
    (void)u;
    net_upload_query_handle(c, spool, "bench");
}

static void h_download(NetCall *c, void *u) {
    (void)u;
    NetBuf m;
    if (net_call_recv(c, &m) == NET_RECV_MESSAGE) net_buf_free(&m);
    NetTransferSpec spec = {"model", 1, "dl", 0, NULL, 0, payload_sha};
    char err[ERR_LEN];
    if (net_download_send(c, &spec, payload, payload_len, err) != 0)
        net_call_status(c, NET_UNAVAILABLE, "%s", err);
}

static void h_sink(NetCall *c, void *u) {
    (void)u;
    NetBuf m;
    size_t total = 0;
    while (net_call_recv(c, &m) == NET_RECV_MESSAGE) {
        total += m.len;
        net_buf_free(&m);
    }
    net_call_send(c, &total, sizeof total);
}

int main(int argc, char **argv) {
    int full = argc > 1 && strcmp(argv[1], "--full") == 0;
    payload_len = full ? (1u << 30) : (256u << 20);
    log_set_level(LOG_ERROR);
    net_global_init();
    char err[ERR_LEN];
    SecurityCertSpec ca = {"bench CA", NULL, 1, 0, 0, 86400};
    SecurityCertSpec srv = {"coordinator", "DNS:localhost,IP:127.0.0.1", 0, 1, 0, 86400};
    SecurityCertSpec cli = {"site-a", NULL, 0, 0, 0, 86400};
    CHECK(security_cert_create(&ca, NULL, NULL, &ca_cert, &ca_key, err) == 0, "%s", err);
    CHECK(security_cert_create(&srv, ca_cert, ca_key, &srv_cert, &srv_key, err) == 0, "%s", err);
    CHECK(security_cert_create(&cli, ca_cert, ca_key, &cli_cert, &cli_key, err) == 0, "%s", err);
    payload = mallocCheck(payload_len);
    for (size_t i = 0; i < payload_len; i++) payload[i] = (uint8_t)(i * 2654435761u >> 13);
    security_sha256(payload, payload_len, payload_sha);
    char dir[] = "/tmp/strait-bench-net-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    spool = net_spool_open(dir, 4ull << 30, 0, 3600000, err);
    CHECK(spool != NULL, "%s", err);

    NetServerConfig sc = {
        .listen = "127.0.0.1:0", .tls = {ca_cert, srv_cert, srv_key}, .workers = 4};
    NetServer *s = net_server_create(&sc, err);
    CHECK(s != NULL, "%s", err);
    net_server_add_method(s, "/strait.Bench/Upload", NET_CLIENT_STREAM, 1, h_upload, NULL, err);
    net_server_add_method(s, "/strait.Bench/Query", NET_UNARY, 1, h_query, NULL, err);
    net_server_add_method(s, "/strait.Bench/Download", NET_SERVER_STREAM, 1, h_download, NULL, err);
    net_server_add_method(s, "/strait.Bench/Sink", NET_CLIENT_STREAM, 1, h_sink, NULL, err);
    int port;
    CHECK(net_server_start(s, &port, err) == 0, "%s", err);
    char target[64];
    snprintf(target, sizeof target, "ipv4:127.0.0.1:%d", port);
    NetChannelConfig cc = {target, {ca_cert, cli_cert, cli_key}, NULL, 0, 0};
    NetChannel *ch = net_channel_create(&cc, err);
    CHECK(ch != NULL, "%s", err);

    double raw[3], up[3], up_hashed[3], sender_hash[3], down[3], bare[3];
    for (int r = 0; r < 3; r++) {
        raw[r] = raw_tls_mib_s();
        char id[32], details[256];
        uint8_t sha[32];
        uint64_t t0 = time_monotonic_ns();
        security_sha256(payload, payload_len, sha); /* the site's, at encode */
        sender_hash[r] = (double)(time_monotonic_ns() - t0) / 1e9;
        snprintf(id, sizeof id, "bench-%d", r);
        NetTransferSpec spec = {"bench", 1, id, 0, NULL, 0, sha};
        t0 = time_monotonic_ns();
        NetStatus st = net_upload(ch, "/strait.Bench/Upload", NULL, &spec, payload, payload_len,
                                  600000, NULL, details, sizeof details);
        CHECK(st == NET_OK, "upload: %s %s", net_status_name(st), details);
        up[r] = (double)payload_len / (1 << 20) / ((double)(time_monotonic_ns() - t0) / 1e9);
        snprintf(id, sizeof id, "bench-h%d", r);
        NetTransferSpec hashed = {"bench", 1, id, 0, NULL, 0, NULL};
        t0 = time_monotonic_ns();
        st = net_upload(ch, "/strait.Bench/Upload", NULL, &hashed, payload, payload_len, 600000,
                        NULL, details, sizeof details);
        CHECK(st == NET_OK, "upload: %s %s", net_status_name(st), details);
        up_hashed[r] = (double)payload_len / (1 << 20) / ((double)(time_monotonic_ns() - t0) / 1e9);
        NetLimits lim = {.max_total = payload_len};
        NetBuf got;
        t0 = time_monotonic_ns();
        st = net_download(ch, "/strait.Bench/Download", "x", 1, &lim, 600000, &got, NULL, NULL,
                          details, sizeof details);
        CHECK(st == NET_OK && got.len == payload_len, "download: %s %s", net_status_name(st),
              details);
        down[r] = (double)payload_len / (1 << 20) / ((double)(time_monotonic_ns() - t0) / 1e9);
        net_buf_free(&got);
        NetClientCall *c = net_client_start(ch, "/strait.Bench/Sink", 600000, err);
        t0 = time_monotonic_ns();
        for (size_t at = 0; at < payload_len; at += 1 << 20)
            CHECK(net_client_send(c, payload + at, 1 << 20) == 0, "stream send");
        net_client_close_send(c);
        NetBuf m;
        CHECK(net_client_recv(c, &m) == NET_RECV_MESSAGE, "stream answer");
        net_buf_free(&m);
        CHECK(net_client_finish(c, NULL, 0) == NET_OK, "stream status");
        bare[r] = (double)payload_len / (1 << 20) / ((double)(time_monotonic_ns() - t0) / 1e9);
    }
    double raw_m = median3(raw[0], raw[1], raw[2]), up_m = median3(up[0], up[1], up[2]);
    double down_m = median3(down[0], down[1], down[2]), bare_m = median3(bare[0], bare[1], bare[2]);
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("net"));
    json_object_set_new(o, "case", json_string("mtls_transfer"));
    json_object_set_new(o, "mib", json_integer((json_int_t)(payload_len >> 20)));
    json_object_set_new(o, "up_mib_s", json_real(up_m));
    json_object_set_new(o, "down_mib_s", json_real(down_m));
    json_object_set_new(o, "stream_up_mib_s", json_real(bare_m));
    json_object_set_new(o, "raw_tls_mib_s", json_real(raw_m));
    json_object_set_new(o, "ratio_up", json_real(up_m / raw_m));
    json_object_set_new(o, "ratio_down", json_real(down_m / raw_m));
    json_object_set_new(o, "ratio_stream_up", json_real(bare_m / raw_m));
    json_object_set_new(o, "up_vs_stream", json_real(up_m / bare_m));
    json_object_set_new(o, "down_vs_stream", json_real(down_m / bare_m));
    json_object_set_new(o, "up_hashed_mib_s",
                        json_real(median3(up_hashed[0], up_hashed[1], up_hashed[2])));
    json_object_set_new(o, "sender_sha256_s",
                        json_real(median3(sender_hash[0], sender_hash[1], sender_hash[2])));
    json_emit_line(stdout, o);
    net_channel_destroy(ch);
    net_server_stop(s, 1000);
    net_spool_close(spool);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    free(payload), free(ca_cert), free(ca_key), free(srv_cert), free(srv_key), free(cli_cert),
        free(cli_key);
    net_global_shutdown();
    return 0;
}
