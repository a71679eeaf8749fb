/*
 * enroll.c — the enrollment listener: a small TLS 1.3 server of its own,
 * apart from gRPC, for the one call a peer makes before it has a
 * certificate (Join), and its client.
 *
 * Why apart: gRPC core 1.51 gives an anonymous peer its whole HTTP/2
 * layer, where streams opened before SETTINGS are acknowledged cost the
 * server about 12 KB each for 17 bytes of the peer's (NOTES-grpc-core.md).
 * The service port requires a certificate in the TLS handshake; what
 * anonymous peers get is this: one request, one answer.
 *
 * The exchange, after a TLS 1.3 handshake whose ALPN is "strait-join/1"
 * (anything else is refused in the handshake):
 *   request: "STJ1", a 4-byte big-endian length (1..max_request), the body
 *   answer:  "STJ1", a status byte (NetStatus), a 4-byte big-endian length
 *            (at most NET_ENROLL_ANSWER_MAX), the body: the handler's
 *            response when the status is OK, the status details otherwise
 * then the server closes. Nothing else is read: bytes after the request
 * are refused as malformed.
 *
 * What a peer can hold, worst case: `total` connections at once (at most
 * `per_addr` from one address, an IPv6 address's /64 counting as one),
 * each one thread and one TLS session, each ended `deadline_ms` after it
 * was accepted whatever it does, each reading at most 8 + max_request
 * bytes. A connection over the cap of its address is closed as it is
 * accepted, and logged (once per 10 s, with counts); over the cap in all,
 * the oldest connection that has had a second and still lacks its whole
 * request is ended to make room, so peers holding every slot without
 * asking anything keep no one out for longer than that second. The listener
 * accepts with the kernel's accept4 and reads with read(2), so net/guard.c's
 * counting (of the gRPC port) never sees these connections.
 *
 * Threading: one acceptor thread; one thread per connection, joined by the
 * acceptor when its slot is reused and by net_enroll_stop.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "net.h"
#include "util/util.h"

#define ENROLL_MAGIC        "STJ1"
#define ENROLL_STACK        (512u << 10) /* a handler signs a CSR and writes SQLite */
#define ENROLL_LOG_EVERY_MS 10000
/* a connection without its whole request younger than this is never
 * evicted for room: TLS and a request take a few round trips */
#define ENROLL_EVICT_MIN_MS 1000

/* ALPN's wire form: a length byte, then the name */
static const unsigned char enroll_alpn[] = "\x0dstrait-join/1";
#define ENROLL_ALPN_LEN (sizeof enroll_alpn - 1)

/* ---- frames ----------------------------------------------------------------- */

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

int net_enroll_request_parse(const uint8_t *buf, size_t have, size_t max_request,
                             size_t *body_len) {
    size_t m = have < 4 ? have : 4;
    if (memcmp(buf, ENROLL_MAGIC, m) != 0) return -1;
    if (have < 8) return 0;
    uint32_t n = be32(buf + 4);
    if (n == 0 || n > max_request) return -1;
    if (have < 8 + (size_t)n) return 0;
    if (have > 8 + (size_t)n) return -1; /* one request, nothing after it */
    *body_len = n;
    return 1;
}

int net_enroll_answer_parse(const uint8_t *buf, size_t have, NetStatus *status, size_t *body_len) {
    size_t m = have < 4 ? have : 4;
    if (memcmp(buf, ENROLL_MAGIC, m) != 0) return -1;
    if (have >= 5 && buf[4] > NET_UNAUTHENTICATED) return -1;
    if (have < 9) return 0;
    uint32_t n = be32(buf + 5);
    if (n > NET_ENROLL_ANSWER_MAX) return -1;
    if (have < 9 + (size_t)n) return 0;
    if (have > 9 + (size_t)n) return -1;
    *status = (NetStatus)buf[4];
    *body_len = n;
    return 1;
}

int net_enroll_default_address(const char *service, char *out, size_t len) {
    const char *colon = strrchr(service, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (colon == NULL || colon[1] == '\0' || *end != '\0' || port < 0 || port > 65534) return -1;
    return snprintf(out, len, "%.*s:%ld", (int)(colon - service), service, port ? port + 1 : 0) <
                   (int)len
               ? 0
               : -1;
}

/* ---- TLS over a non-blocking socket, against a deadline ------------------------ */

static int64_t now_ms(void) {
    return (int64_t)(time_monotonic_ns() / 1000000);
}

/* Waits for what the last TLS call asked for; 0 to retry, -1 at the deadline
 * or on a TLS error that is not a wait. */
static int tls_wait(SSL *ssl, int rc, int fd, int64_t deadline_ms) {
    int e = SSL_get_error(ssl, rc);
    short ev = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
    if (ev == 0) return -1;
    int64_t left = deadline_ms - now_ms();
    if (left <= 0) return -1;
    struct pollfd p = {fd, ev, 0};
    int n = poll(&p, 1, left > 1000 ? 1000 : (int)left);
    if (n < 0 && errno != EINTR) return -1;
    return 0;
}

static int tls_write_all(SSL *ssl, int fd, const uint8_t *data, size_t len, int64_t deadline_ms) {
    while (len > 0) {
        int chunk = len > (1u << 20) ? 1 << 20 : (int)len;
        int n = SSL_write(ssl, data, chunk);
        if (n > 0) {
            data += n, len -= (size_t)n;
            continue;
        }
        if (tls_wait(ssl, n, fd, deadline_ms) != 0) return -1;
    }
    return 0;
}

/* ---- server ------------------------------------------------------------------ */

struct NetEnrollCall {
    char addr[64];
    const uint8_t *request;
    size_t request_len;
    NetStatus status;
    char details[512];
    uint8_t *response; /* owned */
    size_t response_len;
};

typedef struct Slot {
    pthread_t thread;
    int started; /* a thread to join */
    int busy;    /* serving a connection */
    int fd;
    char addr[64]; /* the peer's */
    char key[64];  /* what the cap per address counts: the address, an IPv6 one's /64 */
    int64_t accepted_ms;
    int requested; /* its whole request came: never evicted */
    struct NetEnrollServer *server;
} Slot;

struct NetEnrollServer {
    NetEnrollConfig cfg;
    NetEnrollHandler handler;
    void *user;
    SSL_CTX *ctx;
    int listen_fd;
    int wake[2]; /* the stop's pipe */
    pthread_t acceptor;
    int acceptor_started;
    pthread_mutex_t lock;
    Slot *slots; /* cfg.total */
    NetEnrollStats st;
    int64_t refused_since_log, last_log_ms;
};

const char *net_enroll_call_addr(const NetEnrollCall *c) {
    return c->addr;
}

const uint8_t *net_enroll_call_request(const NetEnrollCall *c, size_t *len) {
    *len = c->request_len;
    return c->request;
}

void net_enroll_call_answer(NetEnrollCall *c, const void *data, size_t len) {
    free(c->response);
    c->response = NULL, c->response_len = 0;
    if (len > NET_ENROLL_ANSWER_MAX || (c->response = malloc(len ? len : 1)) == NULL) {
        c->status = NET_RESOURCE_EXHAUSTED;
        snprintf(c->details, sizeof c->details, "the answer does not fit");
        return;
    }
    memcpy(c->response, data, len);
    c->response_len = len;
    c->status = NET_OK;
}

void net_enroll_call_status(NetEnrollCall *c, NetStatus code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->details, sizeof c->details, fmt, ap);
    va_end(ap);
    c->status = code;
}

static void count(NetEnrollServer *s, int64_t *field) {
    pthread_mutex_lock(&s->lock);
    (*field)++;
    pthread_mutex_unlock(&s->lock);
}

/* One connection, start to end, within the deadline. */
static void serve(NetEnrollServer *s, Slot *slot, int64_t deadline_ms) {
    int fd = slot->fd;
    const char *addr = slot->addr;
    SSL *ssl = SSL_new(s->ctx);
    uint8_t *buf = malloc(8 + s->cfg.max_request + 1);
    NetEnrollCall call;
    memset(&call, 0, sizeof call);
    snprintf(call.addr, sizeof call.addr, "%s", addr);
    int ok = ssl && buf && SSL_set_fd(ssl, fd) == 1;
    int rc;
    while (ok && (rc = SSL_accept(ssl)) != 1)
        if (tls_wait(ssl, rc, fd, deadline_ms) != 0) ok = 0;
    if (!ok) {
        count(s, &s->st.failed);
        goto out;
    }
    size_t have = 0, body = 0;
    int parsed = 0;
    while (parsed == 0) {
        int n = SSL_read(ssl, buf + have, (int)(8 + s->cfg.max_request + 1 - have));
        if (n <= 0) {
            if (tls_wait(ssl, n, fd, deadline_ms) != 0) break;
            continue;
        }
        have += (size_t)n;
        parsed = net_enroll_request_parse(buf, have, s->cfg.max_request, &body);
    }
    if (parsed != 1) {
        count(s, &s->st.failed);
        if (parsed < 0) { /* malformed: say so, then close */
            static const char why[] = "not an enrollment request";
            uint8_t head[9];
            memcpy(head, ENROLL_MAGIC, 4);
            head[4] = NET_INVALID_ARGUMENT;
            put_be32(head + 5, sizeof why - 1);
            if (tls_write_all(ssl, fd, head, sizeof head, deadline_ms) == 0)
                tls_write_all(ssl, fd, (const uint8_t *)why, sizeof why - 1, deadline_ms);
        }
        goto out;
    }
    pthread_mutex_lock(&s->lock);
    slot->requested = 1;
    pthread_mutex_unlock(&s->lock);
    call.request = buf + 8;
    call.request_len = body;
    call.status = NET_OK;
    s->handler(&call, s->user);
    const uint8_t *answer = call.status == NET_OK ? call.response : (const uint8_t *)call.details;
    size_t answer_len = call.status == NET_OK ? call.response_len : strlen(call.details);
    if (call.status == NET_OK && answer == NULL) answer = (const uint8_t *)"", answer_len = 0;
    uint8_t head[9];
    memcpy(head, ENROLL_MAGIC, 4);
    head[4] = (uint8_t)call.status;
    put_be32(head + 5, (uint32_t)answer_len);
    if (tls_write_all(ssl, fd, head, sizeof head, deadline_ms) == 0 &&
        tls_write_all(ssl, fd, answer, answer_len, deadline_ms) == 0) {
        count(s, &s->st.served);
        SSL_shutdown(ssl); /* once: the peer's close_notify is not waited for */
    } else {
        count(s, &s->st.failed);
    }
out:
    free(call.response);
    free(buf);
    SSL_free(ssl);
    ERR_clear_error();
}

/* SIGPIPE blocked in the calling thread: a write to a peer that is gone
 * (OpenSSL writes with write(2)) fails with EPIPE instead of ending the
 * process; *was gets the mask to restore with pipe_restore. */
static void pipe_block(sigset_t *was) {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, was);
}

/* Takes a SIGPIPE the writes left pending, then the mask back. */
static void pipe_restore(const sigset_t *was) {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    struct timespec zero = {0, 0};
    while (!sigismember(was, SIGPIPE) && sigtimedwait(&pipe, NULL, &zero) == SIGPIPE) {
    }
    pthread_sigmask(SIG_SETMASK, was, NULL);
}

static void *conn_main(void *arg) {
    Slot *slot = arg;
    sigset_t was;
    pipe_block(&was); /* for the thread's life: it ends with the connection */
    NetEnrollServer *s = slot->server;
    int64_t deadline = now_ms() + s->cfg.deadline_ms;
    serve(s, slot, deadline);
    pthread_mutex_lock(&s->lock);
    int fd = slot->fd; /* no longer the stop's to shut down once it is closed */
    slot->fd = -1;
    pthread_mutex_unlock(&s->lock);
    close(fd);
    pthread_mutex_lock(&s->lock);
    slot->busy = 0;
    pthread_mutex_unlock(&s->lock);
    ERR_clear_error();
    OPENSSL_thread_stop();
    return NULL;
}

static void addr_text(const struct sockaddr_storage *sa, char *out, size_t len) {
    if (sa->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a))
            inet_ntop(AF_INET, &a->s6_addr[12], out, (socklen_t)len);
        else
            inet_ntop(AF_INET6, a, out, (socklen_t)len);
    } else if (sa->ss_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)len);
    } else {
        snprintf(out, len, "?");
    }
}

/* A free slot for a connection from addr, or NULL over a cap; under lock. */
/* What the cap per address counts: an IPv4 address, or an IPv6 one's /64
 * (what one host or one customer of a provider holds). */
static void addr_key(const struct sockaddr_storage *sa, const char *text, char *out, size_t len) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (sa->ss_family != AF_INET6 || IN6_IS_ADDR_V4MAPPED(a)) {
        snprintf(out, len, "%s", text);
        return;
    }
    struct in6_addr net = *a;
    memset(net.s6_addr + 8, 0, 8);
    char t[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, &net, t, sizeof t);
    snprintf(out, len, "%s/64", t);
}

/* A free slot for a connection counted as key, or NULL over a cap; under
 * lock. *victim: over the cap in all, the oldest connection without its
 * whole request that has had EVICT_MIN_MS, to end for room (NULL: none). */
static Slot *take_slot(NetEnrollServer *s, const char *key, int64_t now, Slot **victim) {
    Slot *free_slot = NULL;
    int here = 0;
    *victim = NULL;
    for (int i = 0; i < s->cfg.total; i++) {
        Slot *sl = &s->slots[i];
        if (!sl->busy) {
            if (free_slot == NULL) free_slot = sl;
            continue;
        }
        here += strcmp(sl->key, key) == 0;
        if (!sl->requested && sl->fd >= 0 && now - sl->accepted_ms >= ENROLL_EVICT_MIN_MS &&
            (*victim == NULL || sl->accepted_ms < (*victim)->accepted_ms))
            *victim = sl;
    }
    if (here >= s->cfg.per_addr) {
        *victim = NULL;
        return NULL;
    }
    if (free_slot) *victim = NULL;
    return free_slot;
}

/* Over the cap in all: ends the victim's connection (its thread sees the
 * shutdown and frees the slot) and waits a moment for a slot; NULL when
 * none came. Under lock, which it lets go while it waits. */
static Slot *evict_for(NetEnrollServer *s, Slot *victim, const char *key) {
    shutdown(victim->fd, SHUT_RDWR);
    s->st.evicted++;
    for (int i = 0; i < 40; i++) {
        pthread_mutex_unlock(&s->lock);
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&s->lock);
        Slot *again;
        Slot *slot = take_slot(s, key, now_ms(), &again);
        if (slot) return slot;
    }
    return NULL;
}

static void refused(NetEnrollServer *s, const char *addr) {
    pthread_mutex_lock(&s->lock);
    s->st.refused++;
    s->refused_since_log++;
    int64_t now = now_ms();
    int64_t n = 0;
    if (now - s->last_log_ms >= ENROLL_LOG_EVERY_MS) {
        n = s->refused_since_log;
        s->refused_since_log = 0;
        s->last_log_ms = now;
    }
    pthread_mutex_unlock(&s->lock);
    if (n > 0)
        log_warn("net",
                 "enrollment listener: %lld connection(s) closed over its caps (%d at once, %d "
                 "from one address) in the last %d s, the latest from %s",
                 (long long)n, s->cfg.total, s->cfg.per_addr, ENROLL_LOG_EVERY_MS / 1000, addr);
}

static void *acceptor_main(void *arg) {
    NetEnrollServer *s = arg;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, ENROLL_STACK);
    for (;;) {
        struct pollfd p[2] = {{s->listen_fd, POLLIN, 0}, {s->wake[0], POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            log_error("net", "the enrollment listener stops: poll: %s", strerror(errno));
            break;
        }
        if (p[1].revents) break;
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        /* the kernel's accept4, not guard.c's: these are not the gRPC port's */
        long fd = syscall(SYS_accept4, s->listen_fd, (struct sockaddr *)&sa, &sl,
                          SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
                /* out of descriptors or memory: let the backlog wait a moment */
                struct timespec ts = {0, 50 * 1000000L};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        char addr[64], key[64];
        addr_text(&sa, addr, sizeof addr);
        addr_key(&sa, addr, key, sizeof key);
        pthread_mutex_lock(&s->lock);
        Slot *victim, *slot = take_slot(s, key, now_ms(), &victim);
        if (slot == NULL && victim) slot = evict_for(s, victim, key);
        if (slot) {
            slot->busy = 1;
            slot->fd = (int)fd;
            slot->requested = 0;
            slot->accepted_ms = now_ms();
            snprintf(slot->addr, sizeof slot->addr, "%s", addr);
            snprintf(slot->key, sizeof slot->key, "%s", key);
            s->st.accepted++;
        }
        pthread_mutex_unlock(&s->lock);
        if (slot == NULL) {
            close((int)fd);
            refused(s, addr);
            continue;
        }
        if (slot->started) pthread_join(slot->thread, NULL); /* ended: it freed the slot */
        slot->started = pthread_create(&slot->thread, &attr, conn_main, slot) == 0;
        if (!slot->started) {
            close((int)fd);
            pthread_mutex_lock(&s->lock);
            slot->busy = 0, slot->fd = -1;
            s->st.failed++;
            pthread_mutex_unlock(&s->lock);
        }
    }
    pthread_attr_destroy(&attr);
    return NULL;
}

static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg) {
    (void)ssl, (void)arg;
    unsigned char *sel = NULL;
    if (SSL_select_next_proto(&sel, outlen, enroll_alpn, ENROLL_ALPN_LEN, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

static SSL_CTX *server_ctx(const NetTls *tls, char *err) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    BIO *b = ctx ? BIO_new_mem_buf(tls->cert_pem, -1) : NULL;
    X509 *leaf = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    int ok = leaf && SSL_CTX_use_certificate(ctx, leaf) == 1;
    X509 *more;
    while (ok && (more = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL)
        if (SSL_CTX_add_extra_chain_cert(ctx, more) != 1) X509_free(more), ok = 0;
    X509_free(leaf);
    BIO_free(b);
    b = ok ? BIO_new_mem_buf(tls->key_pem, -1) : NULL;
    EVP_PKEY *key = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    ok = key && SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
    EVP_PKEY_free(key);
    BIO_free(b);
    if (ok) {
        SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
        SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
        SSL_CTX_set_num_tickets(ctx, 0);
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL); /* no client certificate here */
        SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
    }
    ERR_clear_error();
    if (!ok) {
        SSL_CTX_free(ctx);
        err_set(err, "the enrollment listener cannot use the server's certificate and key");
        return NULL;
    }
    return ctx;
}

/* "host:port", "[v6]:port" → a listening socket; port 0 picks one. */
static int listen_on(const char *hostport, int *port, char *err) {
    char host[256], serv[16];
    if (hostport_split(hostport, host, sizeof host, serv, sizeof serv) != 0)
        return err_set(err, "enrollment address '%s' must be HOST:PORT", hostport);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(host, serv, &hints, &res);
    if (g != 0) return err_set(err, "enrollment address '%s': %s", hostport, gai_strerror(g));
    int fd = -1, e = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return err_set(err, "cannot listen for enrollments on %s: %s", hostport,
                       strerror(e ? e : EADDRNOTAVAIL));
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    *port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                           : ((struct sockaddr_in *)&sa)->sin_port);
    return fd;
}

NetEnrollServer *net_enroll_start(const NetEnrollConfig *cfg, NetEnrollHandler handler, void *user,
                                  int *port, char *err) {
    NetEnrollServer *s = calloc(1, sizeof *s);
    if (s == NULL) {
        err_set(err, "out of memory for the enrollment listener");
        return NULL;
    }
    s->cfg = *cfg;
    if (s->cfg.total <= 0) s->cfg.total = NET_ENROLL_TOTAL_DEFAULT;
    if (s->cfg.per_addr <= 0) s->cfg.per_addr = NET_ENROLL_PER_ADDR_DEFAULT;
    if (s->cfg.deadline_ms <= 0) s->cfg.deadline_ms = NET_ENROLL_DEADLINE_DEFAULT;
    if (s->cfg.max_request == 0) s->cfg.max_request = NET_ENROLL_REQUEST_DEFAULT;
    s->handler = handler, s->user = user;
    s->listen_fd = -1, s->wake[0] = s->wake[1] = -1;
    pthread_mutex_init(&s->lock, NULL);
    s->slots = calloc((size_t)s->cfg.total, sizeof *s->slots);
    if (s->slots == NULL) {
        err_set(err, "out of memory for the enrollment listener");
        goto fail;
    }
    for (int i = 0; i < s->cfg.total; i++) s->slots[i].fd = -1, s->slots[i].server = s;
    if ((s->ctx = server_ctx(&cfg->tls, err)) == NULL) goto fail;
    if ((s->listen_fd = listen_on(cfg->listen, port, err)) < 0) goto fail;
    if (pipe2(s->wake, O_CLOEXEC) != 0) {
        err_set_errno(err, "cannot start the enrollment listener");
        goto fail;
    }
    if (pthread_create(&s->acceptor, NULL, acceptor_main, s) != 0) {
        err_set(err, "cannot start the enrollment listener's thread");
        goto fail;
    }
    s->acceptor_started = 1;
    return s;
fail:
    net_enroll_stop(s);
    return NULL;
}

void net_enroll_stop(NetEnrollServer *s) {
    if (s == NULL) return;
    if (s->acceptor_started) {
        ssize_t w = write(s->wake[1], "x", 1);
        (void)w;
        pthread_join(s->acceptor, NULL);
    }
    /* connections in flight end now: their reads and writes fail */
    pthread_mutex_lock(&s->lock);
    for (int i = 0; s->slots && i < s->cfg.total; i++)
        if (s->slots[i].busy && s->slots[i].fd >= 0) shutdown(s->slots[i].fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; s->slots && i < s->cfg.total; i++)
        if (s->slots[i].started) pthread_join(s->slots[i].thread, NULL);
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->wake[0] >= 0) close(s->wake[0]), close(s->wake[1]);
    SSL_CTX_free(s->ctx);
    free(s->slots);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void net_enroll_stats(NetEnrollServer *s, NetEnrollStats *out) {
    pthread_mutex_lock(&s->lock);
    *out = s->st;
    out->held = 0;
    for (int i = 0; i < s->cfg.total; i++) out->held += s->slots[i].busy;
    pthread_mutex_unlock(&s->lock);
}

/* ---- client ------------------------------------------------------------------ */

static int connect_within(const char *host, const char *port, int64_t deadline_ms, char *err) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) return err_set(err, "cannot resolve %s: %s", host, gai_strerror(rc));
    int fd = -1, e = ETIMEDOUT;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
            e = errno;
            close(fd);
            fd = -1;
            continue;
        }
        struct pollfd p = {fd, POLLOUT, 0};
        int64_t left = deadline_ms - now_ms();
        int soerr = ETIMEDOUT;
        socklen_t sl = sizeof soerr;
        if (left > 0 && poll(&p, 1, (int)left) == 1)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr != 0) {
            e = soerr;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return err_set(err, "cannot connect to %s:%s: %s", host, port, strerror(e));
    return fd;
}

NetStatus net_enroll_call(const char *hostport, const char *ca_pem, const void *req, size_t len,
                          NetBuf *resp, int64_t timeout_ms, char *details, size_t details_len) {
    resp->data = NULL, resp->len = 0;
    snprintf(details, details_len, "%s", "");
    char host[256], port[16], err[ERR_LEN];
    if (hostport_split(hostport, host, sizeof host, port, sizeof port) != 0) {
        snprintf(details, details_len, "enrollment address '%s' must be HOST:PORT", hostport);
        return NET_INVALID_ARGUMENT;
    }
    int64_t deadline = now_ms() + timeout_ms;
    NetStatus st = NET_UNAVAILABLE;
    sigset_t was;
    pipe_block(&was);
    SSL_CTX *ctx = NULL;
    SSL *ssl = NULL;
    uint8_t *buf = NULL;
    int fd = connect_within(host, port, deadline, err);
    if (fd < 0) {
        snprintf(details, details_len, "%s", err);
        pipe_restore(&was);
        return NET_UNAVAILABLE;
    }
    ctx = SSL_CTX_new(TLS_client_method());
    if (ctx) SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION); /* before SSL_new copies it */
    BIO *b = ctx ? BIO_new_mem_buf(ca_pem, -1) : NULL;
    X509 *ca = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    int ok = ca && X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca) == 1;
    X509_free(ca);
    if (!ok || (ssl = SSL_new(ctx)) == NULL) {
        snprintf(details, details_len, "cannot start TLS with the federation's CA");
        st = NET_INTERNAL;
        goto out;
    }
    SSL_set_verify(ssl, SSL_VERIFY_PEER, NULL);
    /* the name (or address) the coordinator's certificate must carry */
    struct in6_addr lit;
    if (inet_pton(AF_INET, host, &lit) == 1 || inet_pton(AF_INET6, host, &lit) == 1)
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host);
    else
        SSL_set1_host(ssl, host), SSL_set_tlsext_host_name(ssl, host);
    SSL_set_alpn_protos(ssl, enroll_alpn, ENROLL_ALPN_LEN);
    SSL_set_fd(ssl, fd);
    int rc;
    while ((rc = SSL_connect(ssl)) != 1) {
        if (tls_wait(ssl, rc, fd, deadline) != 0) {
            long v = SSL_get_verify_result(ssl);
            if (v == X509_V_ERR_HOSTNAME_MISMATCH || v == X509_V_ERR_IP_ADDRESS_MISMATCH)
                snprintf(details, details_len,
                         "the coordinator's certificate does not name %s; join at the host "
                         "'strait site enroll' printed (the coordinator's advertise or listen "
                         "host)",
                         host);
            else if (v != X509_V_OK)
                snprintf(details, details_len,
                         "the enrollment listener at %s is not the pinned federation's "
                         "coordinator: %s",
                         hostport, X509_verify_cert_error_string(v));
            else
                snprintf(details, details_len,
                         "TLS with %s failed; is it the coordinator's enrollment port "
                         "(--join: its port plus one by default)?",
                         hostport);
            goto out;
        }
    }
    const unsigned char *proto = NULL;
    unsigned proto_len = 0;
    SSL_get0_alpn_selected(ssl, &proto, &proto_len);
    if (proto_len != ENROLL_ALPN_LEN - 1 || memcmp(proto, enroll_alpn + 1, proto_len) != 0) {
        snprintf(details, details_len,
                 "%s is not an enrollment port (it does not speak strait-join/1); check --join "
                 "(the coordinator's port plus one by default)",
                 hostport);
        goto out;
    }
    uint8_t head[8];
    memcpy(head, ENROLL_MAGIC, 4);
    put_be32(head + 4, (uint32_t)len);
    if (tls_write_all(ssl, fd, head, sizeof head, deadline) != 0 ||
        tls_write_all(ssl, fd, req, len, deadline) != 0) {
        snprintf(details, details_len, "the enrollment listener at %s closed the connection",
                 hostport);
        goto out;
    }
    size_t cap = 9 + NET_ENROLL_ANSWER_MAX + 1, have = 0, body = 0;
    NetStatus answered = NET_UNKNOWN;
    int parsed = 0;
    if ((buf = malloc(cap)) == NULL) {
        snprintf(details, details_len, "out of memory");
        st = NET_RESOURCE_EXHAUSTED;
        goto out;
    }
    while (parsed == 0) {
        int n = SSL_read(ssl, buf + have, (int)(cap - have));
        if (n <= 0) {
            if (tls_wait(ssl, n, fd, deadline) != 0) break;
            continue;
        }
        have += (size_t)n;
        parsed = net_enroll_answer_parse(buf, have, &answered, &body);
    }
    if (parsed != 1) {
        snprintf(details, details_len, "%s",
                 parsed < 0 ? "the enrollment listener's answer is malformed"
                            : "the enrollment listener gave no answer in time");
        st = parsed < 0 ? NET_INTERNAL : NET_DEADLINE_EXCEEDED;
        goto out;
    }
    st = answered;
    if (st == NET_OK) {
        resp->data = malloc(body + 1);
        if (resp->data == NULL) {
            snprintf(details, details_len, "out of memory");
            st = NET_RESOURCE_EXHAUSTED;
            goto out;
        }
        memcpy(resp->data, buf + 9, body);
        resp->data[body] = 0;
        resp->len = body;
    } else {
        snprintf(details, details_len, "%.*s", (int)body, (const char *)buf + 9);
    }
out:
    free(buf);
    if (ssl) SSL_shutdown(ssl);
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
    ERR_clear_error();
    pipe_restore(&was);
    return st;
}
