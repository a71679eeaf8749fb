/*
 * flood.c — the unauthenticated peer of flood.h: sockets bound to a chosen
 * loopback source, OpenSSL without a client certificate, and HTTP/2
 * frames packed by hand (a 9-byte frame header; HPACK with the static
 * table and literals, no Huffman coding, no dynamic table).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "tests/flood.h"

struct FloodTls {
    int fd;
    SSL_CTX *ctx;
    SSL *ssl;
    uint32_t next_stream;
};

static int split_addr(const char *addr, struct sockaddr_in *sa) {
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || colon - addr >= (long)sizeof host) return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)atoi(colon + 1));
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

int flood_connect(const char *addr, const char *src) {
    struct sockaddr_in to, from;
    if (split_addr(addr, &to) != 0) return -1;
    memset(&from, 0, sizeof from);
    from.sin_family = AF_INET;
    if (inet_pton(AF_INET, src, &from.sin_addr) != 1) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct timeval tv = {2, 0}; /* a write the server does not read ends, it does not hang */
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (bind(fd, (struct sockaddr *)&from, sizeof from) != 0 ||
        connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One look at every descriptor: how many the other end has closed. */
static int count_closed_now(const int *fds, int n) {
    int closed = 0;
    for (int i = 0; i < n; i++) {
        if (fds[i] < 0) {
            closed++;
            continue;
        }
        char b;
        ssize_t r = recv(fds[i], &b, 1, MSG_DONTWAIT | MSG_PEEK);
        closed += r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    }
    return closed;
}

int flood_count_closed(const int *fds, int n, int wait_ms) {
    /* the server accepts (and closes) from its backlog at its own pace:
     * counted until the count has not moved for half a second */
    int last = -1, stable_ms = 0;
    for (int waited = 0; waited < wait_ms && stable_ms < 500; waited += 100) {
        int now = count_closed_now(fds, n);
        stable_ms = now == last ? stable_ms + 100 : 0;
        last = now;
        usleep(100000);
    }
    return count_closed_now(fds, n);
}

int flood_hello_stall(const char *addr, const char *src, size_t bytes) {
    int fd = flood_connect(addr, src);
    if (fd < 0) return -1;
    /* one ClientHello of 120,000 bytes (OpenSSL takes up to 131,396), sent
     * in TLS records of at most 16 KiB, of which `bytes` go */
    static uint8_t rec[5 + 16384];
    size_t sent = 0;
    int first = 1;
    while (sent < bytes) {
        size_t n = bytes - sent > 16000 ? 16000 : bytes - sent;
        rec[0] = 0x16, rec[1] = 0x03, rec[2] = 0x01;
        rec[3] = (uint8_t)(n >> 8), rec[4] = (uint8_t)n;
        memset(rec + 5, 0x41, n);
        if (first) rec[5] = 0x01, rec[6] = 0x01, rec[7] = 0xd4, rec[8] = 0xc0; /* 120,000 */
        first = 0;
        if (write(fd, rec, 5 + n) != (ssize_t)(5 + n)) break;
        sent += n;
    }
    return fd;
}

static int send_all(FloodTls *t, const uint8_t *p, size_t n) {
    while (n > 0) {
        int w = SSL_write(t->ssl, p, (int)(n > 1 << 30 ? 1 << 30 : n));
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static size_t frame_header(uint8_t *o, size_t len, uint8_t type, uint8_t flags, uint32_t id) {
    o[0] = (uint8_t)(len >> 16), o[1] = (uint8_t)(len >> 8), o[2] = (uint8_t)len;
    o[3] = type, o[4] = flags;
    o[5] = (uint8_t)(id >> 24 & 0x7f), o[6] = (uint8_t)(id >> 16), o[7] = (uint8_t)(id >> 8),
    o[8] = (uint8_t)id;
    return 9;
}

FloodTls *flood_tls_open(const char *addr, const char *src) {
    return flood_tls_open_as(addr, src, NULL, NULL);
}

/* TLS from src to addr offering alpn (wire form), verifying nothing, with
 * a client certificate when cert_file; NULL when refused. */
static FloodTls *tls_start(const char *addr, const char *src, const char *alpn,
                           const char *cert_file, const char *key_file) {
    FloodTls *t = calloc(1, sizeof *t);
    if (t == NULL) return NULL;
    t->fd = flood_connect(addr, src);
    t->ctx = SSL_CTX_new(TLS_client_method());
    if (t->fd < 0 || t->ctx == NULL) goto fail;
    SSL_CTX_set_verify(t->ctx, SSL_VERIFY_NONE, NULL);
    if (cert_file && (SSL_CTX_use_certificate_chain_file(t->ctx, cert_file) != 1 ||
                      SSL_CTX_use_PrivateKey_file(t->ctx, key_file, SSL_FILETYPE_PEM) != 1))
        goto fail;
    SSL_CTX_set_alpn_protos(t->ctx, (const unsigned char *)alpn, (unsigned)strlen(alpn));
    t->ssl = SSL_new(t->ctx);
    if (t->ssl == NULL || SSL_set_fd(t->ssl, t->fd) != 1 || SSL_connect(t->ssl) != 1) goto fail;
    return t;
fail:
    flood_tls_close(t);
    return NULL;
}

FloodTls *flood_tls_open_as(const char *addr, const char *src, const char *cert_file,
                            const char *key_file) {
    FloodTls *t = tls_start(addr, src, "\x02h2", cert_file, key_file);
    if (t == NULL) return NULL;
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    uint8_t settings[9];
    frame_header(settings, 0, 0x4, 0, 0);
    if (send_all(t, (const uint8_t *)preface, sizeof preface - 1) != 0 ||
        send_all(t, settings, sizeof settings) != 0) {
        flood_tls_close(t);
        return NULL;
    }
    t->next_stream = 1;
    return t;
}

FloodTls *flood_join_hold(const char *addr, const char *src, size_t bytes) {
    FloodTls *t = tls_start(addr, src, "\x0dstrait-join/1", NULL, NULL);
    if (t == NULL) return NULL;
    /* a request of the largest length the listener takes, `bytes` of it */
    static uint8_t req[8 + (16u << 10)];
    memcpy(req, "STJ1\x00\x00\x40\x00", 8);
    memset(req + 8, 0x41, sizeof req - 8);
    if (send_all(t, req, 8 + (bytes < (16u << 10) ? bytes : (16u << 10))) != 0) {
        flood_tls_close(t);
        return NULL;
    }
    return t;
}

/* HPACK: a literal without indexing, its name from the static table (4-bit
 * prefix) or new (index 0), no Huffman. */
static size_t hpack_literal(uint8_t *o, int name_index, const char *name, const char *value) {
    size_t n = 0;
    if (name_index > 0 && name_index < 15) {
        o[n++] = (uint8_t)name_index;
    } else if (name_index >= 15) {
        o[n++] = 0x0f, o[n++] = (uint8_t)(name_index - 15);
    } else {
        o[n++] = 0;
        o[n++] = (uint8_t)strlen(name);
        memcpy(o + n, name, strlen(name)), n += strlen(name);
    }
    o[n++] = (uint8_t)strlen(value);
    memcpy(o + n, value, strlen(value));
    return n + strlen(value);
}

int flood_tls_streams(FloodTls *t, const char *path, int n, int with_body) {
    uint8_t block[256];
    size_t b = 0;
    block[b++] = 0x83; /* :method POST */
    block[b++] = 0x87; /* :scheme https */
    b += hpack_literal(block + b, 4, NULL, path);
    b += hpack_literal(block + b, 1, NULL, "strait");            /* :authority */
    b += hpack_literal(block + b, 31, NULL, "application/grpc"); /* content-type */
    b += hpack_literal(block + b, 0, "te", "trailers");
    /* streams are written in batches: one frame per stream, many per write */
    enum { BATCH = 256 };
    size_t per = 9 + b + (with_body ? 9 + 5 : 0);
    uint8_t *buf = malloc(per * BATCH);
    if (buf == NULL) return 0;
    int sent = 0;
    while (sent < n) {
        int k = n - sent < BATCH ? n - sent : BATCH;
        size_t len = 0;
        for (int i = 0; i < k; i++) {
            uint32_t id = t->next_stream + 2 * (uint32_t)i;
            len += frame_header(buf + len, b, 0x1, 0x4, id); /* HEADERS, END_HEADERS */
            memcpy(buf + len, block, b), len += b;
            if (with_body) { /* an empty message, and the end of the stream */
                len += frame_header(buf + len, 5, 0x0, 0x1, id);
                memset(buf + len, 0, 5), len += 5;
            }
        }
        if (send_all(t, buf, len) != 0) break;
        t->next_stream += 2 * (uint32_t)k;
        sent += k;
    }
    free(buf);
    return sent;
}

int flood_tls_unread(FloodTls *t) {
    int n = 0;
    return ioctl(t->fd, FIONREAD, &n) == 0 ? n : -1;
}

int flood_tls_closed(FloodTls *t, int wait_ms) {
    char buf[16384];
    struct pollfd p = {t->fd, POLLIN, 0};
    for (int waited = 0; waited <= wait_ms; waited += 50) {
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t r = recv(t->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return 1;
    }
    return 0;
}

void flood_tls_close(FloodTls *t) {
    if (t == NULL) return;
    if (t->ssl) SSL_free(t->ssl);
    if (t->ctx) SSL_CTX_free(t->ctx);
    if (t->fd >= 0) close(t->fd);
    free(t);
}

long flood_rss(int pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}
