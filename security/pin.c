/*
 * pin.c — trust on first contact, pinned: before a site has the federation's
 * CA it connects to the coordinator with TLS, takes the certificate chain
 * the server presents, and keeps the certificate whose SHA-256 equals the
 * fingerprint it was given out of band (the join command). The server's own
 * certificate must verify against that CA; the enrollment exchange that
 * follows (net/enroll.c) verifies it again, by the book. It offers the
 * enrollment listener's ALPN and gRPC's, so either port answers.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "security.h"
#include "util/util.h"

static int tcp_connect(const char *host, const char *port, char *err) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) return err_set(err, "cannot resolve %s: %s", host, gai_strerror(rc));
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {10, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return err_set_errno(err, "cannot connect to %s:%s", host, port);
    return fd;
}

int security_fetch_pinned_ca(const char *host_port, const char *pinned_hex, char **ca_pem,
                             char *err) {
    *ca_pem = NULL;
    char host[256], port[16];
    if (hostport_split(host_port, host, sizeof host, port, sizeof port) != 0)
        return err_set(err, "coordinator address '%s' must be HOST:PORT", host_port);
    int fd = tcp_connect(host, port, err);
    if (fd < 0) return -1;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL *ssl = ctx ? SSL_new(ctx) : NULL;
    int rc = -1;
    if (ssl == NULL) {
        err_set(err, "cannot start TLS");
        goto out;
    }
    SSL_set_verify(ssl, SSL_VERIFY_NONE, NULL); /* checked below against the pin */
    /* the enrollment listener's protocol, or gRPC's on a service port */
    static const unsigned char alpn[] = "\x0dstrait-join/1\x02h2";
    SSL_set_alpn_protos(ssl, alpn, sizeof alpn - 1);
    SSL_set_tlsext_host_name(ssl, host);
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) != 1) {
        err_set(err, "TLS handshake with %s failed; is it a Strait coordinator?", host_port);
        goto out;
    }
    STACK_OF(X509) *chain = SSL_get_peer_cert_chain(ssl);
    X509 *leaf = SSL_get0_peer_certificate(ssl);
    X509 *ca = NULL;
    char seen[SHA256_HEX_LEN] = "";
    for (int i = 0; chain && i < sk_X509_num(chain); i++) {
        X509 *c = sk_X509_value(chain, i);
        unsigned char md[SHA256_LEN];
        unsigned int n = 0;
        char hex[SHA256_HEX_LEN];
        /* never a verdict on the pin for want of memory */
        if (!X509_digest(c, EVP_sha256(), md, &n) || n != SHA256_LEN) {
            err_set(err, "cannot fingerprint the certificates of %s (out of memory)", host_port);
            goto out;
        }
        security_hex(md, SHA256_LEN, hex);
        if (X509_check_ca(c)) memcpy(seen, hex, sizeof seen);
        if (strcasecmp(hex, pinned_hex) == 0) ca = c;
    }
    if (ca == NULL) {
        err_set(err,
                "the coordinator at %s presents CA %s, not the pinned %.64s: refusing to "
                "join; check the --ca-sha256 you were given",
                host_port, seen[0] ? seen : "(none)", pinned_hex);
        goto out;
    }
    EVP_PKEY *ca_key = X509_get0_pubkey(ca);
    /* (under memory pressure OpenSSL 3.0 can hand back a peer certificate
     * that does not verify: refused the same way, the safe side) */
    int v = leaf && ca_key ? X509_verify(leaf, ca_key) : 0;
    if (v != 1) {
        err_set(err, "the coordinator's certificate is not signed by the pinned CA");
        goto out;
    }
    BIO *b = BIO_new(BIO_s_mem());
    if (b && PEM_write_bio_X509(b, ca)) {
        char *data;
        long n = BIO_get_mem_data(b, &data);
        *ca_pem = malloc((size_t)n + 1);
        if (*ca_pem) {
            memcpy(*ca_pem, data, (size_t)n);
            (*ca_pem)[n] = '\0';
            rc = 0;
        }
    }
    BIO_free(b);
    if (rc != 0) err_set(err, "out of memory");
out:
    if (ssl) SSL_shutdown(ssl);
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
    ERR_clear_error();
    return rc;
}
