/*
 * test_pin.c — security/pin.c, trust on first contact against a TLS server
 * in this process (a thread with OpenSSL's server side): the pinned CA is
 * taken from a coordinator that presents it; refused when the chain lacks
 * it, when the server's certificate is not signed by it (a chain that
 * merely carries the pinned CA), when the peer does not speak TLS, when
 * nothing listens, and for addresses that are not HOST:PORT; and with
 * OpenSSL's k-th allocation failing, every fetch either returns the pinned
 * CA whole or fails with its reason, never blaming the pin.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include "security/security.h"
#include "tests/faultsim/faultsim.h"
#include "tests/tls_fixture.h"
#include "util/util.h"

typedef enum Mode { SERVE_TLS, SERVE_GARBAGE } Mode;

typedef struct Server {
    int listen_fd, port;
    Mode mode;
    SSL_CTX *ctx;
    pthread_t thread;
    atomic_int stop;
} Server;

static TlsFixture fx;
static Server srv;
static char addr[64];

static X509 *pem_cert(const char *pem) {
    BIO *b = BIO_new_mem_buf(pem, -1);
    X509 *c = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    cr_assert_not_null(c);
    return c;
}

static EVP_PKEY *pem_key(const char *pem) {
    BIO *b = BIO_new_mem_buf(pem, -1);
    EVP_PKEY *k = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
    BIO_free(b);
    cr_assert_not_null(k);
    return k;
}

/* Accepts connections until stop: a TLS handshake with the server's
 * certificate and chain, or a line of plain text. */
static void *serve(void *arg) {
    Server *s = arg;
    while (!atomic_load(&s->stop)) {
        struct pollfd p = {s->listen_fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        int fd = accept(s->listen_fd, NULL, NULL);
        if (fd < 0) continue;
        if (s->mode == SERVE_GARBAGE) {
            static const char junk[] = "HTTP/1.0 400 not TLS\r\n\r\n";
            ssize_t n = write(fd, junk, sizeof junk - 1);
            (void)n;
        } else {
            SSL *ssl = SSL_new(s->ctx);
            SSL_set_fd(ssl, fd);
            if (SSL_accept(ssl) == 1) SSL_shutdown(ssl);
            SSL_free(ssl);
        }
        close(fd);
    }
    return NULL;
}

/* A server presenting leaf (signed by whoever) with chain behind it. */
static void start(Mode mode, const char *leaf, const char *leaf_key, const char *chain) {
    srv.mode = mode;
    srv.ctx = SSL_CTX_new(TLS_server_method());
    cr_assert_not_null(srv.ctx);
    X509 *c = pem_cert(leaf);
    EVP_PKEY *k = pem_key(leaf_key);
    cr_assert_eq(SSL_CTX_use_certificate(srv.ctx, c), 1);
    cr_assert_eq(SSL_CTX_use_PrivateKey(srv.ctx, k), 1);
    X509_free(c), EVP_PKEY_free(k);
    if (chain) {
        X509 *ca = pem_cert(chain);
        cr_assert_eq(SSL_CTX_add1_chain_cert(srv.ctx, ca), 1);
        X509_free(ca);
    }
    srv.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(srv.listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(srv.listen_fd, 16), 0);
    cr_assert_eq(getsockname(srv.listen_fd, (struct sockaddr *)&a, &len), 0);
    srv.port = ntohs(a.sin_port);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", srv.port);
    atomic_store(&srv.stop, 0);
    cr_assert_eq(pthread_create(&srv.thread, NULL, serve, &srv), 0);
}

static void setup(void) {
    signal(SIGPIPE, SIG_IGN); /* as net_global_init has it: a peer gone is an error */
    tls_fixture_init(&fx);
    srv.listen_fd = -1;
}

static void teardown(void) {
    if (srv.listen_fd >= 0) {
        atomic_store(&srv.stop, 1);
        pthread_join(srv.thread, NULL);
        close(srv.listen_fd);
        SSL_CTX_free(srv.ctx);
        srv.listen_fd = -1;
    }
    tls_fixture_fini(&fx);
}

TestSuite(pin, .init = setup, .fini = teardown, .timeout = 300);

static void fingerprint(const char *pem, char hex[SHA256_HEX_LEN]) {
    SecurityIdentity id;
    char err[ERR_LEN];
    cr_assert_eq(security_cert_identity(pem, &id, err), 0, "%s", err);
    memcpy(hex, id.sha256_hex, SHA256_HEX_LEN);
}

static void expect_refused(const char *address, const char *pin, const char *why) {
    char *ca = NULL, err[ERR_LEN] = "";
    cr_assert_eq(security_fetch_pinned_ca(address, pin, &ca, err), -1, "fetched from %s", address);
    cr_assert_null(ca);
    cr_assert_not_null(strstr(err, why), "want '%s', got '%s'", why, err);
}

Test(pin, the_pinned_ca_is_taken_from_a_coordinator_that_presents_it) {
    start(SERVE_TLS, fx.server_cert, fx.server_key, fx.ca_cert);
    char pin[SHA256_HEX_LEN], got_fp[SHA256_HEX_LEN], *ca = NULL, err[ERR_LEN];
    fingerprint(fx.ca_cert, pin);
    for (char *p = pin; *p; p++) *p = (char)(*p >= 'a' && *p <= 'f' ? *p - 32 : *p);
    cr_assert_eq(security_fetch_pinned_ca(addr, pin, &ca, err), 0, "pin in capitals: %s", err);
    fingerprint(ca, got_fp);
    fingerprint(fx.ca_cert, pin);
    cr_assert_str_eq(got_fp, pin, "the CA handed back is not the pinned one");
    free(ca);
}

Test(pin, a_chain_without_the_pinned_ca_is_refused_naming_what_it_presents) {
    start(SERVE_TLS, fx.server_cert, fx.server_key, fx.ca_cert);
    char pin[SHA256_HEX_LEN], seen[SHA256_HEX_LEN];
    fingerprint(fx.foreign_ca, pin);
    fingerprint(fx.ca_cert, seen);
    expect_refused(addr, pin, "not the pinned");
    expect_refused(addr, pin, seen); /* the operator sees which CA it is */
}

Test(pin, a_server_not_signed_by_the_pinned_ca_is_refused_though_it_carries_it) {
    /* an impostor with its own certificate that copies the real CA into
     * its chain: the pin matches, the signature does not */
    char *cert = NULL, *key = NULL, err[ERR_LEN], pin[SHA256_HEX_LEN];
    SecurityCertSpec spec = {"coordinator", "DNS:localhost,IP:127.0.0.1", 0, 1, 0, 86400};
    cr_assert_eq(security_cert_create(&spec, fx.foreign_ca, fx.foreign_ca_key, &cert, &key, err), 0,
                 "%s", err);
    start(SERVE_TLS, cert, key, fx.ca_cert);
    fingerprint(fx.ca_cert, pin);
    expect_refused(addr, pin, "not signed by the pinned CA");
    free(cert), free(key);
}

Test(pin, a_peer_that_does_not_speak_tls_is_refused) {
    start(SERVE_GARBAGE, fx.server_cert, fx.server_key, NULL);
    char pin[SHA256_HEX_LEN];
    fingerprint(fx.ca_cert, pin);
    expect_refused(addr, pin, "TLS handshake with");
}

Test(pin, nothing_listening_and_malformed_addresses_are_refused) {
    char pin[SHA256_HEX_LEN];
    fingerprint(fx.ca_cert, pin);
    /* a port just closed: nothing listens there */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char closed[64];
    snprintf(closed, sizeof closed, "127.0.0.1:%d", ntohs(a.sin_port));
    close(fd);
    expect_refused(closed, pin, "cannot connect to 127.0.0.1");
    expect_refused("127.0.0.1", pin, "must be HOST:PORT");
    expect_refused(":443", pin, "must be HOST:PORT");
    expect_refused("127.0.0.1:123456789012345678", pin, "must be HOST:PORT");
    char long_host[400];
    memset(long_host, 'a', 300);
    snprintf(long_host + 300, sizeof long_host - 300, ":443");
    expect_refused(long_host, pin, "must be HOST:PORT");
    expect_refused("127.0.0.1:notaport", pin, "cannot resolve 127.0.0.1");
}

Test(pin, every_openssl_allocation_of_a_fetch_can_fail) {
    start(SERVE_TLS, fx.server_cert, fx.server_key, fx.ca_cert);
    char pin[SHA256_HEX_LEN];
    fingerprint(fx.ca_cert, pin);
    int failed = 0, tolerated = 0;
    for (int k = 1; k <= 50000; k++) {
        char *ca = NULL, err[ERR_LEN] = "";
        faultsim_arm(FAULT_SSL, k, ENOMEM, 0);
        int rc = security_fetch_pinned_ca(addr, pin, &ca, err);
        int64_t fired, calls = faultsim_disarm(&fired);
        if (rc == 0) {
            char fp[SHA256_HEX_LEN];
            fingerprint(ca, fp);
            cr_assert_str_eq(fp, pin, "fetched past allocation %d: not the pinned CA", k);
            free(ca);
            if (fired == 0) {
                cr_log_info("a pinned fetch: %lld OpenSSL allocations, %d failed it, %d gone past",
                            (long long)calls, failed, tolerated);
                cr_assert_gt(failed, 10);
                return;
            }
            tolerated++;
            continue;
        }
        failed++;
        cr_assert_null(ca);
        cr_assert_neq(err[0], '\0', "failed at allocation %d without a reason", k);
        /* never the pin's verdict for a fault: a site told "not the pinned
         * CA" would distrust a coordinator that is the right one (a
         * handshake short of memory can leave a server certificate that
         * does not verify: refused, which is the safe side) */
        cr_assert_null(strstr(err, "not the pinned"), "allocation %d: %s", k, err);
    }
    cr_assert_fail("still failing after 50000 allocations");
}
