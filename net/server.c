/*
 * server.c — the gRPC server of net.h.
 *
 * Threads: one dispatcher drains the server's completion queue (new calls,
 * shutdown); `workers` threads run handlers. Each call gets its own pluck
 * completion queue, so a handler's blocking receive and send wait only for
 * their own events. A new call waits in a bounded queue for a worker or,
 * when the queue is full, is answered RESOURCE_EXHAUSTED by the dispatcher
 * — the pool never grows.
 *
 * Per call, RECV_CLOSE_ON_SERVER is started before the handler runs: its
 * `cancelled` flag is the only way to tell a client that finished sending
 * from one that vanished (net/NOTES-grpc-core.md).
 *
 * No one peer can starve the others: each site — every certificate issued
 * to one name counts as that name — (or, for calls without a certificate,
 * each address) may hold at most per_peer calls at once; a queued call
 * whose client gave up (cancelled, past its deadline) stops counting at
 * once and its handler is skipped,
 * `reserve` workers are kept for methods flagged NET_USE_RESERVE (Admin),
 * and every live call is on a list so that net_server_cancel_peer can end
 * a revoked site's calls in flight. A handler may park its call
 * (net_call_park): its worker is freed and the call is answered later from
 * any thread, so long polls do not pin workers.
 *
 * No peer that stops reading pins a thread: a response message waits at
 * most send_ms for its peer, and a call's final status (and a parked
 * call's answer) goes out as a batch that the reaper thread finishes,
 * cancelling the call when its peer has not taken it within REAP_MS. The
 * dispatcher never waits on a peer. Connections are capped by address
 * (guard.c), streams per connection by HTTP/2's own setting, the TLS
 * handshake and HTTP/2 preface by a deadline, idle connections by age.
 */
#include <assert.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "net_internal.h"
#include "security/security.h"
#include "util/util.h"

typedef struct Method Method;

/* One outstanding grpc_server_request_*call: what it fills in. */
typedef struct Request {
    int kind;       /* TAG_NEW_CALL */
    Method *method; /* NULL: the generic (unknown method) request */
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;
    grpc_call_details details; /* generic request only */
    grpc_completion_queue *cq; /* bound to the call: a pluck queue */
} Request;

struct Method {
    char path[128];
    NetMethodKind kind;
    int flags; /* NET_REQUIRE_CERT, NET_USE_RESERVE */
    NetHandler handler;
    void *user;
    void *handle; /* from grpc_server_register_method */
    Request req;
};

struct NetCall {
    NetServer *server;
    Method *method;
    grpc_call *call;
    grpc_completion_queue *cq;
    gpr_timespec deadline;
    grpc_byte_buffer *first; /* the request of unary and server-streaming calls */
    int first_taken;
    int sent_initial_md;
    int close_done, cancelled; /* RECV_CLOSE_ON_SERVER */
    int status_set;
    int sent;  /* messages sent */
    int ended; /* net_call_end sent the status already */
    NetStatus status;
    char details[512];
    NetPeer peer;
    int peer_loaded;
    int peer_port;      /* the connection's, for the guard */
    char slow_why[300]; /* the status a wait that times out cancels the call with ("": generic) */
    grpc_metadata_array md;
    char peer_key[80];    /* what per_peer counts by: the certificate, else the address */
    int reserved;         /* a NET_USE_RESERVE method's call */
    NetCall *prev, *next; /* the server's live list, under server->lock */
    int live;
    int queued; /* waiting for a worker, under server->lock */
    /* the reaper's: the final batch started (message and status), when to
     * give up on the peer, the status text the batch reads */
    int final_pending;
    int64_t reap_at_ms;
    grpc_slice final_details;
    int has_final_details;
    grpc_byte_buffer *final_message; /* the answer the batch sends; freed with the call */
    NetCall *reap_next;
    /* parking, under server->lock: PARK_NONE, or the call outlives its handler */
    int park;
    uint8_t *answer; /* a parked call's response, owned */
    size_t answer_len;
};

enum { PARK_NONE, PARK_IN_HANDLER, PARK_RELEASED, PARK_ANSWERED_EARLY };

enum { TAG_NEW_CALL = 1, TAG_SHUTDOWN = 2 };
static int tag_close, tag_op; /* addresses used as tags on a call's own queue */

struct NetServer {
    NetServerConfig cfg;
    char *ca, *cert, *key; /* owned copies of the TLS material */
    grpc_server *server;
    grpc_completion_queue *cq; /* for notifications: next-type */
    Method *methods[64];
    int n_methods;
    Request generic;
    pthread_t dispatcher;
    pthread_t *workers;
    int started;
    /* the pool: calls waiting for a worker, guarded by lock, reserved ones
     * at the head. Common calls run on at most workers - reserve workers and
     * wait in at most backlog more slots; reserved ones have reserve +
     * backlog slots: the queue holds at most q_cap = workers + 2 backlog. */
    pthread_mutex_t lock;
    pthread_cond_t work_ready;
    int idle, stopping;
    NetCall **queue;
    int q_head, q_len, q_cap;
    int q_reserved; /* queued calls of NET_USE_RESERVE methods */
    int run_common; /* running calls of the other methods */
    int shutdown_tag;
    NetCall *live; /* every call handed to a worker and not yet finished */
    int n_parked;
    /* calls whose final batch is out, for the reaper, oldest first */
    NetCall *reap_head, *reap_tail;
    int n_reaping, reap_stop;
    pthread_cond_t reap_ready;
    pthread_t reaper;
    /* certificates the service refused for good (net_call_deny_peer), under
     * lock: a ring, the oldest forgotten first */
    struct Denied {
        char sha256_hex[65];
        NetStatus status; /* the answer its later calls get */
        char why[200];
    } denied[NET_DENIED_MAX];
    int n_denied, denied_next;
    /* certificates that have had a call and are not denied, under lock: a
     * connection of theirs may be vouched for with no call in flight */
    char (*vouched)[65];
    int n_vouched, cap_vouched;
};

#define REAP_MS      5000 /* a peer has this long to take a call's final status */
#define REAP_MAX     8192 /* calls waiting on it at most; beyond, cancelled at once */
#define SEND_DEFAULT 60000

/* ---- calls --------------------------------------------------------------- */

/* "ipv4:127.0.0.1:5000" → "127.0.0.1" and port 5000; "ipv6:[::1]:5000",
 * or as gRPC 1.51 writes it "ipv6:%5B::1%5D:5000", → "::1" */
static void load_addr(NetCall *c) {
    char *peer = grpc_call_get_peer(c->call);
    const char *p = peer ? peer : "";
    const char *colon = strchr(p, ':');
    if (colon && (strncmp(p, "ipv4:", 5) == 0 || strncmp(p, "ipv6:", 5) == 0)) p = colon + 1;
    const char *end = strrchr(p, ':');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    c->peer_port = end ? atoi(end + 1) : 0;
    if (n > 1 && p[0] == '[' && p[n - 1] == ']') p++, n -= 2;
    if (n > 6 && strncmp(p, "%5B", 3) == 0 && strncmp(p + n - 3, "%5D", 3) == 0) p += 3, n -= 6;
    snprintf(c->peer.addr, sizeof c->peer.addr, "%.*s", (int)(n < 60 ? n : 60), p);
    if (peer) gpr_free(peer);
}

static void load_peer(NetCall *c) {
    if (c->peer_loaded) return;
    c->peer_loaded = 1;
    load_addr(c);
    grpc_auth_context *ctx = grpc_call_auth_context(c->call);
    if (ctx == NULL) return;
    grpc_auth_property_iterator it =
        grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_PEM_CERT_PROPERTY_NAME);
    const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
    if (p != NULL && p->value_length > 0) {
        char *pem = malloc(p->value_length + 1);
        if (pem) {
            memcpy(pem, p->value, p->value_length);
            pem[p->value_length] = '\0';
            SecurityIdentity id;
            char err[ERR_LEN];
            if (security_cert_identity(pem, &id, err) == 0) {
                c->peer.has_cert = 1;
                memcpy(c->peer.name, id.name, sizeof c->peer.name);
                memcpy(c->peer.serial_hex, id.serial_hex, sizeof c->peer.serial_hex);
                memcpy(c->peer.sha256_hex, id.sha256_hex, sizeof c->peer.sha256_hex);
                c->peer.not_after = id.not_after;
            }
            free(pem);
        }
    }
    grpc_auth_context_release(ctx);
}

const NetPeer *net_call_peer(NetCall *c) {
    load_peer(c);
    return &c->peer;
}

const char *net_call_method(NetCall *c) {
    return c->method ? c->method->path : "";
}

int64_t net_call_deadline_ms(NetCall *c) {
    gpr_timespec now = gpr_now(c->deadline.clock_type);
    if (gpr_time_cmp(c->deadline, gpr_inf_future(c->deadline.clock_type)) == 0) return INT64_MAX;
    return gpr_time_to_millis(gpr_time_sub(c->deadline, now));
}

/* Runs one batch on the call's own queue and waits for it, at most
 * wait_ms (-1: as long as the call lives): past that the call is cancelled
 * with DEADLINE_EXCEEDED and -2 returned once the batch has ended. */
static int call_batch_within(NetCall *c, grpc_op *ops, size_t n, int64_t wait_ms) {
    if (grpc_call_start_batch(c->call, ops, n, &tag_op, NULL) != GRPC_CALL_OK) return -1;
    gpr_timespec until = wait_ms < 0 ? gpr_inf_future(GPR_CLOCK_REALTIME)
                                     : gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                    gpr_time_from_millis(wait_ms, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_pluck(c->cq, &tag_op, until, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        grpc_call_cancel_with_status(c->call, GRPC_STATUS_DEADLINE_EXCEEDED,
                                     c->slow_why[0] ? c->slow_why : "the peer was too slow", NULL);
        grpc_completion_queue_pluck(c->cq, &tag_op, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        return -2;
    }
    return ev.type == GRPC_OP_COMPLETE && ev.success ? 0 : -1;
}

static void close_check(NetCall *c, int wait_ms) {
    if (c->close_done) return;
    gpr_timespec until = wait_ms < 0 ? gpr_inf_future(GPR_CLOCK_REALTIME)
                                     : gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                    gpr_time_from_millis(wait_ms, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_pluck(c->cq, &tag_close, until, NULL);
    if (ev.type == GRPC_OP_COMPLETE) c->close_done = 1;
}

int net_call_cancelled(NetCall *c, int wait_ms) {
    close_check(c, wait_ms);
    return c->close_done && c->cancelled;
}

void net_call_slow_reason(NetCall *c, const char *why) {
    snprintf(c->slow_why, sizeof c->slow_why, "%s", why ? why : "");
}

NetRecv net_call_recv(NetCall *c, NetBuf *msg) {
    return net_call_recv_within(c, msg, -1);
}

NetRecv net_call_recv_within(NetCall *c, NetBuf *msg, int64_t wait_ms) {
    msg->data = NULL;
    msg->len = 0;
    grpc_byte_buffer *bb = NULL;
    if (c->method && c->method->kind != NET_CLIENT_STREAM) {
        if (c->first_taken) return NET_RECV_END;
        c->first_taken = 1;
        bb = c->first;
        c->first = NULL;
        if (bb == NULL) return NET_RECV_BROKEN;
    } else {
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &bb;
        int rc = call_batch_within(c, &op, 1, wait_ms);
        if (rc == -2) {
            if (bb) grpc_byte_buffer_destroy(bb);
            return NET_RECV_TIMEOUT;
        }
        if (rc != 0) return NET_RECV_BROKEN;
        if (bb == NULL) /* clean end or a vanished client: ask RECV_CLOSE */
            return net_call_cancelled(c, 0) ? NET_RECV_BROKEN : NET_RECV_END;
    }
    int rc = net_bb_read(bb, msg);
    grpc_byte_buffer_destroy(bb);
    if (rc != 0) /* the peer sent it whole: what failed is this side's */
        net_call_status(c, NET_RESOURCE_EXHAUSTED,
                        "the coordinator is out of memory for a "
                        "request; try again");
    return rc == 0 ? NET_RECV_MESSAGE : NET_RECV_BROKEN;
}

static void send_initial_md_op(NetCall *c, grpc_op *op) {
    memset(op, 0, sizeof *op);
    op->op = GRPC_OP_SEND_INITIAL_METADATA;
    c->sent_initial_md = 1;
}

int net_call_send(NetCall *c, const void *data, size_t len) {
    return net_call_send2(c, data, len, NULL, 0);
}

int net_call_send2(NetCall *c, const void *a, size_t alen, const void *b, size_t blen) {
    grpc_op ops[2];
    size_t n = 0;
    if (!c->sent_initial_md) send_initial_md_op(c, &ops[n++]);
    grpc_slice s[2] = {grpc_slice_from_static_buffer(a, alen),
                       grpc_slice_from_static_buffer(b, blen)};
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, b ? 2 : 1);
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = bb;
    n++;
    int rc = call_batch_within(c, ops, n, c->server->cfg.send_ms);
    grpc_byte_buffer_destroy(bb);
    c->sent += rc == 0;
    return rc;
}

void net_call_status(NetCall *c, NetStatus code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->details, sizeof c->details, fmt, ap);
    va_end(ap);
    c->status = code;
    c->status_set = 1;
}

static void send_status(NetCall *c, NetStatus code, const char *details) {
    grpc_op ops[2];
    size_t n = 0;
    if (!c->sent_initial_md) send_initial_md_op(c, &ops[n++]);
    grpc_slice d = grpc_slice_from_copied_string(details);
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n].data.send_status_from_server.status_details = &d;
    n++;
    call_batch_within(c, ops, n,
                      c->server->cfg.send_ms); /* fails harmlessly when the client is gone */
    grpc_slice_unref(d);
}

static NetCall *call_from_request(NetServer *s, Request *r) {
    NetCall *c = calloc(1, sizeof *c);
    if (c == NULL) DIE("out of memory for a call");
    c->server = s;
    c->method = r->method;
    c->call = r->call;
    c->cq = r->cq;
    c->deadline = r->deadline;
    c->first = r->payload;
    c->md = r->md;
    r->call = NULL;
    r->payload = NULL;
    r->cq = NULL;
    /* RECV_CLOSE_ON_SERVER now: it completes at the end, or at once on cancel */
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    if (grpc_call_start_batch(c->call, &op, 1, &tag_close, NULL) != GRPC_CALL_OK) c->close_done = 1;
    return c;
}

static void live_remove(NetCall *c) {
    NetServer *s = c->server;
    pthread_mutex_lock(&s->lock);
    if (c->live) {
        if (c->prev)
            c->prev->next = c->next;
        else
            s->live = c->next;
        if (c->next) c->next->prev = c->prev;
        c->live = 0;
    }
    pthread_mutex_unlock(&s->lock);
}

/* The status a call ends with when its handler set none: OK, except for a
 * unary call that answered nothing, which a client would read as an empty
 * answer (a handler that returned on a failure it did not report). */
static void default_status(NetCall *c) {
    if (c->status_set) return;
    if (c->method && c->method->kind == NET_UNARY && c->sent == 0 && c->answer == NULL)
        net_call_status(c, NET_INTERNAL, "the coordinator failed the call without saying why");
    else
        c->status = NET_OK, c->details[0] = '\0';
}

void net_call_end(NetCall *c) {
    if (c->ended) return;
    default_status(c);
    send_status(c, c->status, c->details);
    c->ended = 1;
}

static void call_free(NetCall *c) {
    live_remove(c);
    free(c->answer);
    if (c->has_final_details) grpc_slice_unref(c->final_details);
    if (c->final_message) grpc_byte_buffer_destroy(c->final_message);
    if (c->first) grpc_byte_buffer_destroy(c->first);
    grpc_metadata_array_destroy(&c->md);
    grpc_call_unref(c->call);
    net_cq_drain_destroy(c->cq);
    free(c);
}

/* Ends a call without waiting on its peer: the answer (a parked call's)
 * and the status go out as one batch, the call leaves the live list (it no
 * longer counts against its peer), and the reaper waits for the batch and
 * the close, cancelling the call if its peer takes neither within REAP_MS. */
static void call_finish(NetCall *c) {
    NetServer *s = c->server;
    live_remove(c);
    c->final_pending = 0;
    if (!c->ended) {
        grpc_op ops[3];
        size_t n = 0;
        if (!c->sent_initial_md) send_initial_md_op(c, &ops[n++]);
        grpc_byte_buffer *bb = NULL; /* lives until the batch is done: freed with the call */
        if (c->answer && (!c->status_set || c->status == NET_OK)) {
            grpc_slice a = grpc_slice_from_static_buffer(c->answer, c->answer_len);
            bb = grpc_raw_byte_buffer_create(&a, 1);
            memset(&ops[n], 0, sizeof ops[n]);
            ops[n].op = GRPC_OP_SEND_MESSAGE;
            ops[n++].data.send_message.send_message = bb;
        }
        default_status(c);
        c->final_details = grpc_slice_from_copied_string(c->details);
        c->has_final_details = 1;
        memset(&ops[n], 0, sizeof ops[n]);
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = (grpc_status_code)c->status;
        ops[n++].data.send_status_from_server.status_details = &c->final_details;
        c->final_pending = grpc_call_start_batch(c->call, ops, n, &tag_op, NULL) == GRPC_CALL_OK;
        c->final_message = bb;
        c->ended = 1;
    }
    c->reap_at_ms = (int64_t)(time_monotonic_ns() / 1000000) + REAP_MS;
    c->reap_next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->n_reaping >= REAP_MAX) /* a flood of peers that read nothing: no waiting */
        grpc_call_cancel(c->call, NULL);
    if (s->reap_tail)
        s->reap_tail->reap_next = c;
    else
        s->reap_head = c;
    s->reap_tail = c;
    s->n_reaping++;
    pthread_cond_signal(&s->reap_ready);
    pthread_mutex_unlock(&s->lock);
}

/* Waits for tag on c's queue until the call's reap time; past it the call
 * is cancelled, which completes whatever is pending. */
static void reap_wait(NetCall *c, void *tag) {
    int64_t left = c->reap_at_ms - (int64_t)(time_monotonic_ns() / 1000000);
    gpr_timespec until = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                      gpr_time_from_millis(left > 0 ? left : 0, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_pluck(c->cq, tag, until, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        grpc_call_cancel(c->call, NULL);
        grpc_completion_queue_pluck(c->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    }
}

static void *reaper_main(void *arg) {
    NetServer *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (s->reap_head == NULL && !s->reap_stop) pthread_cond_wait(&s->reap_ready, &s->lock);
        NetCall *c = s->reap_head;
        if (c == NULL) { /* stopping, and nothing left */
            pthread_mutex_unlock(&s->lock);
            return NULL;
        }
        s->reap_head = c->reap_next;
        if (s->reap_head == NULL) s->reap_tail = NULL;
        s->n_reaping--;
        pthread_mutex_unlock(&s->lock);
        if (c->final_pending) reap_wait(c, &tag_op);
        if (!c->close_done) {
            reap_wait(c, &tag_close);
            c->close_done = 1;
        }
        call_free(c);
    }
}

static void call_reject(NetCall *c, NetStatus code, const char *why) {
    net_call_status(c, code, "%s", why);
    call_finish(c);
}

/* A call nobody waits for any more: past its deadline, or (read only while
 * it is queued, when no worker plucks its queue) cancelled by its client.
 * Under server->lock. */
static int call_abandoned(NetCall *c) {
    if (gpr_time_cmp(c->deadline, gpr_now(c->deadline.clock_type)) < 0) return 1;
    if (!c->queued) return 0;
    close_check(c, 0);
    return c->close_done && c->cancelled;
}

/* ---- requests ------------------------------------------------------------ */

static int request_next(NetServer *s, Request *r) {
    memset(&r->md, 0, sizeof r->md);
    grpc_metadata_array_init(&r->md);
    r->payload = NULL;
    r->call = NULL;
    r->cq = grpc_completion_queue_create_for_pluck(NULL);
    r->kind = TAG_NEW_CALL;
    grpc_call_error e;
    if (r->method) {
        e = grpc_server_request_registered_call(
            s->server, r->method->handle, &r->call, &r->deadline, &r->md,
            r->method->kind == NET_CLIENT_STREAM ? NULL : &r->payload, r->cq, s->cq, r);
    } else {
        grpc_call_details_init(&r->details);
        e = grpc_server_request_call(s->server, &r->call, &r->details, &r->md, r->cq, s->cq, r);
    }
    if (e != GRPC_CALL_OK) {
        grpc_metadata_array_destroy(&r->md);
        net_cq_drain_destroy(r->cq);
        r->cq = NULL;
        return -1;
    }
    return 0;
}

static void request_abandon(Request *r) {
    if (r->method == NULL) grpc_call_details_destroy(&r->details);
    grpc_metadata_array_destroy(&r->md);
    if (r->payload) grpc_byte_buffer_destroy(r->payload);
    if (r->cq) net_cq_drain_destroy(r->cq);
    r->cq = NULL;
}

/* The refusal of the certificate with this fingerprint, when it was
 * refused for good (NULL otherwise); under lock. */
static const struct Denied *denied_as(const NetServer *s, const char *sha256_hex) {
    for (int i = 0; i < s->n_denied; i++)
        if (strcmp(s->denied[i].sha256_hex, sha256_hex) == 0) return &s->denied[i];
    return NULL;
}

static void deny(NetServer *s, const char *sha256_hex, NetStatus status, const char *why) {
    net_guard_deny_cert(sha256_hex); /* its connections pending again, wherever they are */
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n_vouched; i++)
        if (strcmp(s->vouched[i], sha256_hex) == 0) {
            memcpy(s->vouched[i], s->vouched[--s->n_vouched], 65);
            break;
        }
    struct Denied *d = (struct Denied *)denied_as(s, sha256_hex);
    if (d == NULL) {
        d = &s->denied[s->denied_next];
        s->denied_next = (s->denied_next + 1) % NET_DENIED_MAX;
        if (s->n_denied < NET_DENIED_MAX) s->n_denied++;
    }
    snprintf(d->sha256_hex, sizeof d->sha256_hex, "%s", sha256_hex);
    d->status = status;
    snprintf(d->why, sizeof d->why, "%s", why);
    pthread_mutex_unlock(&s->lock);
}

void net_call_deny_peer(NetCall *c) {
    const NetPeer *p = net_call_peer(c);
    if (!p->has_cert) return;
    deny(c->server, p->sha256_hex, c->status_set ? c->status : NET_PERMISSION_DENIED,
         c->status_set ? c->details : "this certificate is refused by the federation");
    net_guard_unvouch(p->addr, c->peer_port);
}

/* Records a certificate that has had a call (so a revocation finds its
 * connections); under lock. Out of memory it is not recorded: its next
 * call, refused, still puts its connection back under the budget. */
static void remember_vouched(NetServer *s, const char *sha256_hex) {
    for (int i = 0; i < s->n_vouched; i++)
        if (strcmp(s->vouched[i], sha256_hex) == 0) return;
    if (s->n_vouched == s->cap_vouched) {
        int cap = s->cap_vouched ? 2 * s->cap_vouched : 64;
        char(*grown)[65] = realloc(s->vouched, 65 * (size_t)cap);
        if (grown == NULL) return;
        s->vouched = grown, s->cap_vouched = cap;
    }
    snprintf(s->vouched[s->n_vouched++], 65, "%s", sha256_hex);
}

/* A new call arrived on request r: hand it to a worker, or refuse it. */
static void dispatch(NetServer *s, Request *r) {
    if (r->method == NULL) { /* an unknown method: answer at once */
        char path[256];
        size_t n = GRPC_SLICE_LENGTH(r->details.method);
        snprintf(path, sizeof path, "%.*s", (int)(n < 200 ? n : 200),
                 (const char *)GRPC_SLICE_START_PTR(r->details.method));
        grpc_call_details_destroy(&r->details);
        NetCall *c = call_from_request(s, r);
        char why[300];
        snprintf(why, sizeof why, "no method %s on this server", path);
        call_reject(c, NET_UNIMPLEMENTED, why);
        return;
    }
    NetCall *c = call_from_request(s, r);
    const NetPeer *peer = net_call_peer(c);
    if ((r->method->flags & NET_REQUIRE_CERT) && !peer->has_cert) {
        call_reject(c, NET_UNAUTHENTICATED,
                    "this method needs a client certificate signed by the federation CA");
        return;
    }
    if (peer->has_cert) {
        NetStatus status = NET_OK;
        char why[200];
        pthread_mutex_lock(&s->lock);
        const struct Denied *d = denied_as(s, peer->sha256_hex);
        if (d) status = d->status, snprintf(why, sizeof why, "%s", d->why);
        pthread_mutex_unlock(&s->lock);
        if (d) { /* the same answer, without a worker; its connection pending again */
            net_guard_unvouch(peer->addr, c->peer_port);
            call_reject(c, status, why);
            return;
        }
    }
    /* a site is its name, whatever certificates were issued to it */
    snprintf(c->peer_key, sizeof c->peer_key, "%s%s",
             peer->has_cert ? "name:" : "addr:", peer->has_cert ? peer->name : peer->addr);
    if (peer->has_cert) net_guard_trust(peer->addr, c->peer_port, peer->sha256_hex);
    pthread_mutex_lock(&s->lock);
    if (peer->has_cert) remember_vouched(s, peer->sha256_hex);
    int mine = 0;
    for (NetCall *o = s->live; o; o = o->next) {
        if (strcmp(o->peer_key, c->peer_key) != 0) continue;
        mine += o->park != PARK_NONE || !call_abandoned(o); /* parked: the ticker's to check */
    }
    /* a call waits in the backlog for a worker; past it, RESOURCE_EXHAUSTED.
     * Common calls have workers - reserve workers; NET_USE_RESERVE methods
     * have the reserve too, and go first. */
    int reserved = (r->method->flags & NET_USE_RESERVE) != 0;
    int common_queued = s->q_len - s->q_reserved;
    int room =
        reserved ? s->cfg.reserve + s->cfg.backlog - s->q_reserved
                 : s->cfg.workers - s->cfg.reserve - s->run_common + s->cfg.backlog - common_queued;
    if (mine >= s->cfg.per_peer) {
        pthread_mutex_unlock(&s->lock);
        char why[160];
        snprintf(why, sizeof why,
                 "too many calls at once from this %s (%d, the limit per peer); retry when "
                 "one ends",
                 peer->has_cert ? "site (all its certificates together)" : "address", mine);
        call_reject(c, NET_RESOURCE_EXHAUSTED, why);
        return;
    }
    if (room <= 0 || s->stopping) {
        pthread_mutex_unlock(&s->lock);
        call_reject(c, NET_RESOURCE_EXHAUSTED, "server busy: every worker is taken; retry later");
        return;
    }
    c->next = s->live;
    if (s->live) s->live->prev = c;
    s->live = c;
    c->live = 1;
    c->reserved = reserved;
    c->queued = 1;
    if (reserved) { /* to the head of the queue */
        s->q_head = (s->q_head + s->q_cap - 1) % s->q_cap;
        s->queue[s->q_head] = c;
        s->q_reserved++;
    } else {
        s->queue[(s->q_head + s->q_len) % s->q_cap] = c;
    }
    s->q_len++;
    pthread_cond_broadcast(&s->work_ready); /* one that can take this head */
    pthread_mutex_unlock(&s->lock);
}

static void *dispatcher_main(void *arg) {
    NetServer *s = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        if (ev.tag == &s->shutdown_tag) { /* every call is done: drain and stop */
            grpc_completion_queue_shutdown(s->cq);
            continue;
        }
        Request *r = ev.tag;
        if (!ev.success) { /* the server is shutting down */
            request_abandon(r);
            continue;
        }
        dispatch(s, r);
        if (request_next(s, r) != 0 && r->method == NULL) grpc_call_details_destroy(&r->details);
    }
    return NULL;
}

/* Sends a parked call's answer and finishes it. */
static void parked_send(NetCall *c) {
    NetServer *s = c->server;
    call_finish(c); /* the answer and the status, without waiting on the peer */
    pthread_mutex_lock(&s->lock);
    s->n_parked--;
    pthread_mutex_unlock(&s->lock);
}

int net_call_park(NetCall *c) {
    NetServer *s = c->server;
    pthread_mutex_lock(&s->lock);
    int ok = c->park == PARK_NONE && !s->stopping && s->n_parked < s->cfg.max_parked;
    if (ok) c->park = PARK_IN_HANDLER, s->n_parked++;
    pthread_mutex_unlock(&s->lock);
    return ok ? 0 : -1;
}

void net_parked_answer(NetCall *c, const void *data, size_t len, NetStatus code,
                       const char *details) {
    NetServer *s = c->server;
    assert(c->park == PARK_IN_HANDLER || c->park == PARK_RELEASED);
    if (data) { /* an empty message is a message (a proto3 one of defaults packs to 0 bytes) */
        c->answer = malloc(len ? len : 1);
        if (c->answer) memcpy(c->answer, data, len), c->answer_len = len;
    }
    if (code != NET_OK || (data && c->answer == NULL))
        net_call_status(c, code != NET_OK ? code : NET_RESOURCE_EXHAUSTED, "%s",
                        code != NET_OK && details ? details : "out of memory");
    pthread_mutex_lock(&s->lock);
    int released = c->park == PARK_RELEASED;
    if (!released) c->park = PARK_ANSWERED_EARLY; /* its worker sends it */
    pthread_mutex_unlock(&s->lock);
    if (released) parked_send(c);
}

int net_server_cancel_peer(NetServer *s, const char *sha256_hex, const char *why) {
    int n = 0;
    deny(s, sha256_hex, NET_PERMISSION_DENIED, why);
    pthread_mutex_lock(&s->lock);
    for (NetCall *o = s->live; o; o = o->next)
        if (o->peer.has_cert && strcmp(o->peer.sha256_hex, sha256_hex) == 0) {
            grpc_call_cancel_with_status(o->call, GRPC_STATUS_PERMISSION_DENIED, why, NULL);
            net_guard_unvouch(o->peer.addr, o->peer_port); /* its connection is pending again */
            n++;
        }
    pthread_mutex_unlock(&s->lock);
    return n;
}

int net_server_live_peers(NetServer *s, char (**out)[65]) {
    pthread_mutex_lock(&s->lock);
    int n = 0, cap = s->n_vouched;
    for (NetCall *o = s->live; o; o = o->next) cap++;
    char(*peers)[65] = malloc(65 * (size_t)(cap ? cap : 1));
    for (int i = 0; peers && i < s->n_vouched; i++) memcpy(peers[n++], s->vouched[i], 65);
    for (NetCall *o = s->live; peers && o; o = o->next) {
        if (!o->peer.has_cert) continue;
        int seen = 0;
        for (int i = 0; i < n && !seen; i++) seen = strcmp(peers[i], o->peer.sha256_hex) == 0;
        if (!seen) snprintf(peers[n++], 65, "%s", o->peer.sha256_hex);
    }
    pthread_mutex_unlock(&s->lock);
    *out = peers;
    return peers ? n : -1;
}

/* Whether a worker may take the head of the queue: a reserved call always,
 * a common one only while fewer than workers - reserve common calls run, so
 * the reserve stays free for the methods flagged NET_USE_RESERVE. Under lock. */
static int can_take(const NetServer *s) {
    if (s->q_len == 0) return 0;
    return s->queue[s->q_head]->reserved || s->run_common < s->cfg.workers - s->cfg.reserve ||
           s->stopping;
}

static void *worker_main(void *arg) {
    NetServer *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (!can_take(s) && !(s->stopping && s->q_len == 0))
            pthread_cond_wait(&s->work_ready, &s->lock);
        if (s->q_len == 0) { /* stopping */
            pthread_mutex_unlock(&s->lock);
            return NULL;
        }
        NetCall *c = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->q_cap;
        s->q_len--;
        s->idle--;
        if (c->reserved)
            s->q_reserved--;
        else
            s->run_common++;
        int c_reserved = c->reserved;      /* c may be freed by the time it is needed */
        int abandoned = call_abandoned(c); /* its client gave up while it waited */
        c->queued = 0;
        pthread_mutex_unlock(&s->lock);
        if (!abandoned) c->method->handler(c, c->method->user);
        pthread_mutex_lock(&s->lock);
        int park = c->park;
        if (park == PARK_IN_HANDLER) c->park = PARK_RELEASED; /* answered later, elsewhere */
        pthread_mutex_unlock(&s->lock);
        if (park == PARK_ANSWERED_EARLY) {
            parked_send(c);
        } else if (park == PARK_NONE) {
            call_finish(c);
        }
        pthread_mutex_lock(&s->lock);
        s->idle++;
        if (!c_reserved) { /* a common slot is free: a worker waiting on one may go */
            s->run_common--;
            pthread_cond_broadcast(&s->work_ready);
        }
        pthread_mutex_unlock(&s->lock);
    }
}

/* ---- server lifecycle ---------------------------------------------------- */

NetServer *net_server_create(const NetServerConfig *cfg, char *err) {
    if (cfg->tls.ca_pem == NULL || cfg->tls.cert_pem == NULL || cfg->tls.key_pem == NULL) {
        err_set(err, "a server needs the CA, its certificate and its key");
        return NULL;
    }
    NetServer *s = calloc(1, sizeof *s);
    if (s == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    if (s->cfg.workers <= 0) s->cfg.workers = 8;
    if (s->cfg.per_peer <= 0) s->cfg.per_peer = NET_PER_PEER_DEFAULT;
    if (s->cfg.reserve < 0 || s->cfg.reserve >= s->cfg.workers) s->cfg.reserve = 0;
    if (s->cfg.max_parked <= 0) s->cfg.max_parked = NET_MAX_PARKED_DEFAULT;
    if (s->cfg.backlog == 0) s->cfg.backlog = 4 * s->cfg.workers;
    if (s->cfg.backlog < 0) s->cfg.backlog = 0; /* none */
    if (s->cfg.max_message == 0) s->cfg.max_message = NET_MAX_MESSAGE_DEFAULT;
    if (s->cfg.keepalive_ms <= 0) s->cfg.keepalive_ms = NET_KEEPALIVE_DEFAULT_MS;
    s->ca = strdup(cfg->tls.ca_pem);
    s->cert = strdup(cfg->tls.cert_pem);
    s->key = strdup(cfg->tls.key_pem);
    s->cfg.listen = strdup(cfg->listen ? cfg->listen : "127.0.0.1:0");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work_ready, NULL);
    pthread_cond_init(&s->reap_ready, NULL);
    if (s->cfg.transport_memory == 0) s->cfg.transport_memory = NET_TRANSPORT_MEMORY_DEFAULT;
    if (s->cfg.max_streams <= 0) s->cfg.max_streams = 32;
    if (s->cfg.handshake_ms <= 0) s->cfg.handshake_ms = 10000;
    if (s->cfg.send_ms <= 0) s->cfg.send_ms = SEND_DEFAULT;
    if (s->cfg.idle_conn_ms <= 0) s->cfg.idle_conn_ms = 600000;
    grpc_arg args[NET_COMMON_ARGS + 7];
    int n = net_common_args(args, s->cfg.max_message, s->cfg.keepalive_ms);
    /* a window sized from the link (the probe), or fixed (no probe: with
     * it, the connection's window stays at HTTP/2's 64 KB plus the streams'
     * own, measured 2026-12-02 on the bed: 54 Mbit/s of a 1 Gbit/s, 100 ms
     * link with 4 or 16 MiB; with the probe 0.72 cold, 0.93-0.99 warm) */
    int bdp = s->cfg.stream_window == NET_STREAM_WINDOW_AUTO;
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_HTTP2_BDP_PROBE;
    args[n++].value.integer = bdp;
    if (!bdp) {
        args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES;
        args[n++].value.integer =
            (int)(s->cfg.stream_window > INT32_MAX ? INT32_MAX : s->cfg.stream_window);
    }
    /* what one connection may hold: streams open at once (an HTTP/2
     * setting: a peer past it gets REFUSED_STREAM), the time to finish TLS
     * and send the HTTP/2 preface, and how long it may sit without calls */
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_MAX_CONCURRENT_STREAMS;
    args[n++].value.integer = s->cfg.max_streams;
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS;
    args[n++].value.integer = s->cfg.handshake_ms;
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_MAX_CONNECTION_IDLE_MS;
    args[n++].value.integer = s->cfg.idle_conn_ms;
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_MAX_METADATA_SIZE;
    args[n++].value.integer = 16 << 10;
    grpc_resource_quota *quota = grpc_resource_quota_create("strait-server");
    grpc_resource_quota_resize(quota, s->cfg.transport_memory);
    args[n].type = GRPC_ARG_POINTER, args[n].key = GRPC_ARG_RESOURCE_QUOTA;
    args[n].value.pointer.p = quota;
    args[n++].value.pointer.vtable = grpc_resource_quota_arg_vtable();
    grpc_channel_args ca = {(size_t)n, args};
    s->server = grpc_server_create(&ca, NULL);
    grpc_resource_quota_unref(quota); /* the server holds its own reference */
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    return s;
}

int net_server_add_method(NetServer *s, const char *path, NetMethodKind kind, int flags,
                          NetHandler handler, void *user, char *err) {
    if (s->started) return err_set(err, "add methods before starting the server");
    if (s->n_methods == (int)(sizeof s->methods / sizeof s->methods[0]))
        return err_set(err, "too many methods");
    Method *m = calloc(1, sizeof *m);
    if (m == NULL) return err_set(err, "out of memory");
    snprintf(m->path, sizeof m->path, "%s", path);
    m->kind = kind;
    m->flags = flags;
    m->handler = handler;
    m->user = user;
    /* client streams read their messages; the others get the request with
     * the call (a mismatch is GRPC_CALL_ERROR_PAYLOAD_TYPE_MISMATCH) */
    m->handle = grpc_server_register_method(s->server, m->path, NULL,
                                            kind == NET_CLIENT_STREAM
                                                ? GRPC_SRM_PAYLOAD_NONE
                                                : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
                                            0);
    if (m->handle == NULL) {
        free(m);
        return err_set(err, "cannot register method %s (registered twice?)", path);
    }
    m->req.method = m;
    s->methods[s->n_methods++] = m;
    return 0;
}

int net_server_start(NetServer *s, int *port, char *err) {
    grpc_ssl_pem_key_cert_pair pair = {s->key, s->cert};
    grpc_server_credentials *creds = grpc_ssl_server_credentials_create_ex(
        s->ca, &pair, 1,
        /* without anonymous, a peer with no certificate of the CA's never
         * gets past TLS: no HTTP/2 for it to hold streams with */
        s->cfg.anonymous ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
                         : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
        NULL);
    if (creds == NULL) return err_set(err, "cannot create TLS credentials from the PEM given");
    net_server_creds_tls13(creds);
    int bound = grpc_server_add_http2_port(s->server, s->cfg.listen, creds);
    grpc_server_credentials_release(creds);
    if (bound == 0)
        return err_set(err, "cannot listen on %s; is the address free and local?", s->cfg.listen);
    /* descriptors: as many as this process may have, and connections
     * capped below that (what the spool, the store and the files need stay
     * free), so that the listener keeps descriptors to accept with */
    char why[ERR_LEN];
    int nofile = net_raise_nofile(why);
    if (nofile < 0) log_warn("net", "%s", why);
    NetGuardLimits gl = s->cfg.connections;
    if (gl.total <= 0) gl.total = 4096;
    if (nofile > 0 && gl.total > nofile - 256) gl.total = nofile > 512 ? nofile - 256 : nofile / 2;
    net_guard_set(&gl);
    grpc_server_start(s->server);
    s->started = 1;
    for (int i = 0; i < s->n_methods; i++)
        if (request_next(s, &s->methods[i]->req) != 0)
            return err_set(err, "cannot accept calls for %s", s->methods[i]->path);
    s->generic.method = NULL;
    if (request_next(s, &s->generic) != 0) return err_set(err, "cannot accept calls");
    s->workers = calloc((size_t)s->cfg.workers, sizeof *s->workers);
    s->q_cap = s->cfg.workers + 2 * s->cfg.backlog;
    s->queue = calloc((size_t)s->q_cap, sizeof *s->queue);
    s->idle = s->cfg.workers;
    for (int i = 0; i < s->cfg.workers; i++) pthread_create(&s->workers[i], NULL, worker_main, s);
    pthread_create(&s->reaper, NULL, reaper_main, s);
    pthread_create(&s->dispatcher, NULL, dispatcher_main, s);
    if (port) *port = bound;
    log_info("net", "listening on %s (port %d, %d workers, %d connections at most, descriptors %d)",
             s->cfg.listen, bound, s->cfg.workers, gl.total, nofile);
    return 0;
}

void net_server_stop(NetServer *s, int grace_ms) {
    if (s == NULL) return;
    if (s->started) {
        grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
        /* running handlers get grace_ms to finish, then their calls are cancelled */
        uint64_t until = time_monotonic_ns() + (uint64_t)(grace_ms > 0 ? grace_ms : 0) * 1000000ull;
        for (;;) {
            pthread_mutex_lock(&s->lock);
            int busy = s->cfg.workers - s->idle + s->q_len;
            pthread_mutex_unlock(&s->lock);
            if (busy == 0 || time_monotonic_ns() >= until) break;
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
        grpc_server_cancel_all_calls(s->server);
        pthread_mutex_lock(&s->lock);
        int parked = s->n_parked;
        pthread_mutex_unlock(&s->lock);
        /* parked calls are their owner's to answer before stopping */
        if (parked) log_warn("net", "stopping with %d parked calls unanswered", parked);
        assert(parked == 0);
        pthread_mutex_lock(&s->lock);
        s->stopping = 1;
        pthread_cond_broadcast(&s->work_ready);
        pthread_mutex_unlock(&s->lock);
        for (int i = 0; i < s->cfg.workers; i++) pthread_join(s->workers[i], NULL);
        /* the dispatcher ends after the shutdown tag, once every call is done */
        pthread_join(s->dispatcher, NULL);
        pthread_mutex_lock(&s->lock);
        s->reap_stop = 1;
        pthread_cond_broadcast(&s->reap_ready);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->reaper, NULL);
    }
    grpc_server_destroy(s->server);
    grpc_completion_queue_destroy(s->cq);
    for (int i = 0; i < s->n_methods; i++) free(s->methods[i]);
    free(s->workers);
    free(s->ca);
    free(s->cert);
    free(s->key);
    free((char *)s->cfg.listen);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->work_ready);
    pthread_cond_destroy(&s->reap_ready);
    free(s->queue);
    free(s->vouched);
    free(s);
}
