/*
 * test_enroll.c — net/'s enrollment listener over loopback with real TLS:
 * a round trip and a refusal through its client, the peer's address as the
 * handler sees it, a client that trusts another CA or names another host,
 * a peer speaking gRPC's ALPN, malformed frames (wrong magic, a length out
 * of bounds, bytes after the request), the caps per address and in all
 * (closed as accepted, the log saying so, another address still served),
 * and a silent peer cut at the deadline.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "net/net.h"
#include "tests/tls_fixture.h"
#include "util/util.h"

static TlsFixture tls;
static NetEnrollServer *server;
static int port;
static char at[64];

/* Answers "addr=<peer>;<request>", or refuses a request that says "no". */
static void h_echo(NetEnrollCall *c, void *user) {
    (void)user;
    size_t n;
    const uint8_t *req = net_enroll_call_request(c, &n);
    if (n == 2 && memcmp(req, "no", 2) == 0) {
        net_enroll_call_status(c, NET_PERMISSION_DENIED, "refused: %s", "as asked");
        return;
    }
    char out[256];
    int len = snprintf(out, sizeof out, "addr=%s;%.*s", net_enroll_call_addr(c), (int)n,
                       (const char *)req);
    net_enroll_call_answer(c, out, (size_t)len);
}

static void start_on(const char *listen, int total, int per_addr, int deadline_ms) {
    char err[ERR_LEN];
    NetEnrollConfig cfg = {.listen = listen,
                           .tls = {NULL, tls.server_cert, tls.server_key},
                           .total = total,
                           .per_addr = per_addr,
                           .deadline_ms = deadline_ms};
    server = net_enroll_start(&cfg, h_echo, NULL, &port, err);
    cr_assert_not_null(server, "%s", err);
    snprintf(at, sizeof at, "127.0.0.1:%d", port);
}

static void start(int total, int per_addr, int deadline_ms) {
    start_on("127.0.0.1:0", total, per_addr, deadline_ms);
}

/* Waits (bounded) for the listener's stats to say `served` answers. */
static NetEnrollStats stats_served(int64_t served) {
    NetEnrollStats s;
    for (int i = 0; i < 200; i++) {
        net_enroll_stats(server, &s);
        if (s.served >= served) break;
        usleep(10000);
    }
    return s;
}

static void setup(void) {
    tls_fixture_init(&tls);
}

static void teardown(void) {
    net_enroll_stop(server);
    server = NULL;
    tls_fixture_fini(&tls);
}

TestSuite(enroll, .init = setup, .fini = teardown, .timeout = 120);

/* A TCP connection to the listener from source address `from`. */
static int tcp_from(const char *from) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in src = {0}, dst = {0};
    src.sin_family = dst.sin_family = AF_INET;
    inet_pton(AF_INET, from, &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons((uint16_t)port);
    cr_assert_eq(bind(fd, (struct sockaddr *)&src, sizeof src), 0, "bind %s", from);
    cr_assert_eq(connect(fd, (struct sockaddr *)&dst, sizeof dst), 0);
    return fd;
}

/* Whether the peer closed fd within ms (bounded; a wait, not a timing). */
static int closed_within(int fd, int ms) {
    struct pollfd p = {fd, POLLIN, 0};
    char b[64];
    while (poll(&p, 1, ms) == 1) {
        ssize_t n = read(fd, b, sizeof b);
        if (n <= 0) return 1;
    }
    return 0;
}

/* A TLS client on fd offering alpn (wire form), verifying nothing. */
static SSL *tls_on(int fd, const char *alpn, size_t alpn_len, SSL_CTX **ctx) {
    *ctx = SSL_CTX_new(TLS_client_method());
    SSL *ssl = SSL_new(*ctx);
    SSL_set_alpn_protos(ssl, (const unsigned char *)alpn, (unsigned)alpn_len);
    SSL_set_fd(ssl, fd);
    return ssl;
}

/* Sends raw bytes after the handshake; the answer's status, -1 when none. */
static int raw_exchange(const void *bytes, size_t n, char *details, size_t len) {
    int fd = tcp_from("127.0.0.1");
    SSL_CTX *ctx;
    SSL *ssl = tls_on(fd, "\x0dstrait-join/1", 14, &ctx);
    cr_assert_eq(SSL_connect(ssl), 1, "handshake with the enrollment listener");
    cr_assert_eq(SSL_write(ssl, bytes, (int)n), (int)n);
    uint8_t buf[1024];
    size_t have = 0, body = 0;
    NetStatus st = NET_OK;
    int parsed = 0, got;
    while (parsed == 0 && (got = SSL_read(ssl, buf + have, (int)(sizeof buf - have))) > 0) {
        have += (size_t)got;
        parsed = net_enroll_answer_parse(buf, have, &st, &body);
    }
    if (parsed == 1) snprintf(details, len, "%.*s", (int)body, (const char *)buf + 9);
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
    return parsed == 1 ? (int)st : -1;
}

Test(enroll, a_request_is_answered_and_a_refusal_says_why) {
    start(0, 0, 0);
    NetBuf resp;
    char details[256];
    NetStatus st =
        net_enroll_call(at, tls.ca_cert, "hello", 5, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    cr_assert_str_eq((char *)resp.data, "addr=127.0.0.1;hello");
    net_buf_free(&resp);
    st = net_enroll_call(at, tls.ca_cert, "no", 2, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_PERMISSION_DENIED, "%s", net_status_name(st));
    cr_assert_str_eq(details, "refused: as asked");
    cr_assert_null(resp.data);
    NetEnrollStats s = stats_served(2); /* counted once its answer is out */
    cr_assert_eq(s.served, 2);
    cr_assert_eq(s.refused, 0);
}

Test(enroll, a_client_that_trusts_another_ca_or_names_another_host_refuses_it) {
    start_on("0.0.0.0:0", 0, 0, 0); /* reachable at 127.0.0.2 too */
    NetBuf resp;
    char details[256];
    NetStatus st =
        net_enroll_call(at, tls.foreign_ca, "x", 1, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_UNAVAILABLE, "%s: %s", net_status_name(st), details);
    cr_assert_not_null(strstr(details, "not the pinned federation's coordinator"), "%s", details);
    /* the certificate names localhost and 127.0.0.1, not 127.0.0.2 */
    char other[64];
    snprintf(other, sizeof other, "127.0.0.2:%d", port);
    st = net_enroll_call(other, tls.ca_cert, "x", 1, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_UNAVAILABLE, "%s: %s", net_status_name(st), details);
    cr_assert_not_null(strstr(details, "does not name 127.0.0.2"), "%s", details);
    /* and a malformed address is the caller's error */
    st = net_enroll_call("nowhere", tls.ca_cert, "x", 1, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_INVALID_ARGUMENT);
}

/* gRPC's ALPN (a site of an older Strait, or an HTTP/2 flood) gets no
 * session: the handshake fails. */
Test(enroll, a_peer_speaking_http2_is_refused_in_the_handshake) {
    start(0, 0, 0);
    int fd = tcp_from("127.0.0.1");
    SSL_CTX *ctx;
    SSL *ssl = tls_on(fd, "\x02h2", 3, &ctx);
    /* no protocol in common: the server's alert ends the handshake itself */
    cr_assert_neq(SSL_connect(ssl), 1, "an h2 client completed the handshake");
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
    ERR_clear_error();
}

Test(enroll, malformed_frames_are_refused_with_a_reason) {
    start(0, 0, 0);
    char details[256];
    /* another magic: what an HTTP/2 preface starts with */
    cr_assert_eq(raw_exchange("PRI * HTTP/2.0\r\n", 16, details, sizeof details),
                 NET_INVALID_ARGUMENT);
    cr_assert_str_eq(details, "not an enrollment request");
    /* a length beyond the limit, and a length of 0 */
    cr_assert_eq(raw_exchange("STJ1\x00\x10\x00\x01", 8, details, sizeof details),
                 NET_INVALID_ARGUMENT);
    cr_assert_eq(raw_exchange("STJ1\x00\x00\x00\x00", 8, details, sizeof details),
                 NET_INVALID_ARGUMENT);
    /* bytes after the request */
    cr_assert_eq(raw_exchange("STJ1\x00\x00\x00\x01xy", 10, details, sizeof details),
                 NET_INVALID_ARGUMENT);
    /* and a well-formed one is served */
    cr_assert_eq(raw_exchange("STJ1\x00\x00\x00\x01x", 9, details, sizeof details), NET_OK);
    cr_assert_str_eq(details, "addr=127.0.0.1;x");
}

/* The decoders on their own, at every split of a frame. */
Test(enroll, the_frame_decoders_need_whole_frames_and_refuse_the_rest) {
    const uint8_t req[] = "STJ1\x00\x00\x00\x03"
                          "abc";
    size_t body = 0;
    for (size_t have = 0; have < 11; have++)
        cr_assert_eq(net_enroll_request_parse(req, have, 16, &body), 0, "at %zu", have);
    cr_assert_eq(net_enroll_request_parse(req, 11, 16, &body), 1);
    cr_assert_eq(body, 3);
    cr_assert_eq(net_enroll_request_parse(req, 11, 2, &body), -1, "over max_request");
    cr_assert_eq(net_enroll_request_parse((const uint8_t *)"STX", 3, 16, &body), -1);
    const uint8_t ans[] = "STJ1\x07\x00\x00\x00\x02"
                          "no";
    NetStatus st;
    for (size_t have = 0; have < 11; have++)
        cr_assert_eq(net_enroll_answer_parse(ans, have, &st, &body), 0, "at %zu", have);
    cr_assert_eq(net_enroll_answer_parse(ans, 11, &st, &body), 1);
    cr_assert_eq(st, NET_PERMISSION_DENIED);
    cr_assert_eq(body, 2);
    const uint8_t bad_status[] = "STJ1\x63\x00\x00\x00\x00";
    cr_assert_eq(net_enroll_answer_parse(bad_status, 9, &st, &body), -1);
    const uint8_t too_long[] = "STJ1\x00\x7f\x00\x00\x00";
    cr_assert_eq(net_enroll_answer_parse(too_long, 9, &st, &body), -1);
}

/* Two connections at most from an address, three in all: the next from a
 * full address is closed as it is accepted, while another address is still
 * served; once the first ones go, the address is served again. */
Test(enroll, connections_are_capped_per_address_and_in_all) {
    start(3, 2, 0);
    int a1 = tcp_from("127.0.0.1"), a2 = tcp_from("127.0.0.1");
    int a3 = tcp_from("127.0.0.1");
    cr_assert(closed_within(a3, 5000), "a third connection from one address was kept");
    NetBuf resp;
    char details[256];
    char other[64];
    snprintf(other, sizeof other, "localhost:%d", port);
    /* 127.0.0.2 is another address on loopback; the certificate names localhost */
    int b1 = tcp_from("127.0.0.2");
    int b2 = tcp_from("127.0.0.2");
    cr_assert(closed_within(b2, 5000), "a fourth connection in all was kept");
    close(b1);
    NetEnrollStats s;
    for (int i = 0; i < 100; i++) { /* b1's slot comes free when its thread sees the close */
        net_enroll_stats(server, &s);
        if (s.held == 2) break;
        usleep(20000);
    }
    cr_assert_eq(s.held, 2, "%lld connections held", (long long)s.held);
    close(a1), close(a2), close(a3), close(b2);
    NetStatus st = NET_UNAVAILABLE;
    for (int i = 0; i < 100 && st != NET_OK; i++) { /* a1 and a2 free their slots */
        st = net_enroll_call(other, tls.ca_cert, "x", 1, &resp, 10000, details, sizeof details);
        if (st != NET_OK) usleep(20000);
    }
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    net_buf_free(&resp);
    net_enroll_stats(server, &s);
    cr_assert_geq(s.refused, 2);
}

/* Peers holding every slot without asking anything keep no one out: a
 * connection over the cap in all ends the oldest one that has had a
 * second without its whole request, and is served; the cap of an address
 * still closes its own at once. */
Test(enroll, a_full_listener_ends_its_oldest_silent_connection_for_a_new_one) {
    start(3, 2, 0);
    int held[3] = {tcp_from("127.0.0.3"), tcp_from("127.0.0.4"), tcp_from("127.0.0.5")};
    usleep(1200000); /* past their first second */
    NetBuf resp;
    char details[256];
    NetStatus st = net_enroll_call(at, tls.ca_cert, "x", 1, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    net_buf_free(&resp);
    cr_assert(closed_within(held[0], 5000), "the oldest silent connection was kept");
    NetEnrollStats s = stats_served(1);
    cr_assert_eq(s.evicted, 1);
    for (int i = 0; i < 3; i++) close(held[i]);
}

/* A peer that connects and says nothing holds its slot until the deadline,
 * no longer. */
Test(enroll, a_silent_peer_is_cut_at_the_deadline) {
    start(0, 0, 300);
    int fd = tcp_from("127.0.0.1");
    cr_assert(closed_within(fd, 10000), "a silent connection outlived the deadline");
    close(fd);
    NetEnrollStats s;
    net_enroll_stats(server, &s);
    cr_assert_eq(s.failed, 1);
}
