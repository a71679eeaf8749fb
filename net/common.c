/*
 * common.c — what server and client share: gRPC start-up with the signal
 * mask of net/NOTES-grpc-core.md, gRPC's log routed into util's, channel
 * arguments, byte buffers, queue teardown and status names.
 */
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net_internal.h"
#include "util/util.h"

const char *net_status_name(NetStatus s) {
    static const char *const names[] = {"OK",
                                        "CANCELLED",
                                        "UNKNOWN",
                                        "INVALID_ARGUMENT",
                                        "DEADLINE_EXCEEDED",
                                        "NOT_FOUND",
                                        "ALREADY_EXISTS",
                                        "PERMISSION_DENIED",
                                        "RESOURCE_EXHAUSTED",
                                        "FAILED_PRECONDITION",
                                        "ABORTED",
                                        "OUT_OF_RANGE",
                                        "UNIMPLEMENTED",
                                        "INTERNAL",
                                        "UNAVAILABLE",
                                        "DATA_LOSS",
                                        "UNAUTHENTICATED"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "UNKNOWN";
}

void net_target(const char *hostport, char *out, size_t len) {
    char host[256];
    const char *colon = strrchr(hostport, ':');
    snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - hostport) : (int)strlen(hostport),
             hostport);
    struct in_addr a;
    snprintf(out, len, "%s%s", inet_pton(AF_INET, host, &a) == 1 ? "ipv4:" : "", hostport);
}

/* TLS 1.3 only (docs/design.md §4). gRPC core 1.51's C API cannot say so; the
 * C++ members below are what its SSL credentials use for their minimum
 * version, and Debian's libgrpc exports them (net/NOTES-grpc-core.md). The
 * build probes for them (mk/probe.sh) and says loudly when they are absent. */
#ifdef STRAIT_HAVE_GRPC_TLS13
extern void net_grpc_server_min_tls(grpc_server_credentials *, grpc_tls_version) __asm__(
    "_ZN27grpc_ssl_server_credentials19set_min_tls_versionE16grpc_tls_version");
extern void net_grpc_channel_min_tls(grpc_channel_credentials *, grpc_tls_version) __asm__(
    "_ZN20grpc_ssl_credentials19set_min_tls_versionE16grpc_tls_version");
#endif

int net_tls13_only(void) {
#ifdef STRAIT_HAVE_GRPC_TLS13
    return 1;
#else
    return 0;
#endif
}

void net_server_creds_tls13(grpc_server_credentials *creds) {
#ifdef STRAIT_HAVE_GRPC_TLS13
    net_grpc_server_min_tls(creds, TLS1_3);
#else
    (void)creds;
    static int said;
    if (!said++)
        log_warn("net", "this build cannot refuse TLS 1.2 (libgrpc lacks set_min_tls_version)");
#endif
}

void net_channel_creds_tls13(grpc_channel_credentials *creds) {
#ifdef STRAIT_HAVE_GRPC_TLS13
    net_grpc_channel_min_tls(creds, TLS1_3);
#else
    (void)creds;
#endif
}

static void grpc_log_to_util(gpr_log_func_args *a) {
    LogLevel lvl = a->severity == GPR_LOG_SEVERITY_ERROR  ? LOG_WARN
                   : a->severity == GPR_LOG_SEVERITY_INFO ? LOG_DEBUG
                                                          : LOG_DEBUG;
    /* gRPC's own errors are usually a peer's fault (a failed handshake):
     * worth a warning in our log, never an error of ours */
    log_msg(lvl, "grpc", "%s (%s:%d)", a->message, a->file, a->line);
}

static sigset_t blocked;

void net_global_init(void) {
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGHUP);
    sigaddset(&blocked, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &blocked, NULL);
    gpr_set_log_function(grpc_log_to_util);
    gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
    grpc_init();
}

void net_global_shutdown(void) {
    grpc_shutdown_blocking();
}

static struct {
    pthread_mutex_t lock;
    pthread_cond_t done_cv;
    int done;
} shut = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void *shutdown_main(void *arg) {
    (void)arg;
    grpc_shutdown_blocking();
    pthread_mutex_lock(&shut.lock);
    shut.done = 1;
    pthread_cond_signal(&shut.done_cv);
    pthread_mutex_unlock(&shut.lock);
    return NULL;
}

int net_global_shutdown_within(int timeout_ms) {
    pthread_t t;
    if (pthread_create(&t, NULL, shutdown_main, NULL) != 0) {
        net_global_shutdown(); /* no thread to spare: wait it out */
        return 0;
    }
    struct timespec until = time_after_ms(CLOCK_REALTIME, timeout_ms);
    pthread_mutex_lock(&shut.lock);
    while (!shut.done && pthread_cond_timedwait(&shut.done_cv, &shut.lock, &until) == 0) {
    }
    int done = shut.done;
    pthread_mutex_unlock(&shut.lock);
    if (done) {
        pthread_join(t, NULL);
        return 0;
    }
    pthread_detach(t);
    return 1;
}

int net_wait_signal(int timeout_ms) {
    if (timeout_ms < 0) {
        int sig = 0;
        return sigwait(&blocked, &sig) == 0 ? sig : 0;
    }
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    int sig = sigtimedwait(&blocked, NULL, &ts);
    return sig > 0 ? sig : 0;
}

void net_buf_free(NetBuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = 0;
}

int net_bb_read(grpc_byte_buffer *bb, NetBuf *msg) {
    size_t len = grpc_byte_buffer_length(bb), at = 0;
    msg->data = malloc(len + 1);
    msg->len = len;
    if (msg->data == NULL) return -1;
    msg->data[len] = '\0'; /* a guard for readers of text, not counted in len */
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) {
        net_buf_free(msg);
        return -1;
    }
    grpc_slice s;
    while (grpc_byte_buffer_reader_next(&r, &s)) {
        size_t n = GRPC_SLICE_LENGTH(s);
        if (at + n <= len) memcpy(msg->data + at, GRPC_SLICE_START_PTR(s), n);
        at += n;
        grpc_slice_unref(s);
    }
    grpc_byte_buffer_reader_destroy(&r);
    if (at != len) {
        net_buf_free(msg);
        return -1;
    }
    return 0;
}

void net_cq_drain_destroy(grpc_completion_queue *cq) {
    grpc_completion_queue_shutdown(cq);
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    }
    grpc_completion_queue_destroy(cq);
}

int net_common_args(grpc_arg *args, size_t max_message, int keepalive_ms) {
    int n = 0;
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[n++].value.integer = (int)max_message;
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[n++].value.integer = (int)max_message;
    /* keepalive: a silently dropped peer is found within keepalive + timeout */
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_KEEPALIVE_TIME_MS;
    args[n++].value.integer = keepalive_ms;
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS;
    args[n++].value.integer = 10000;
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS;
    args[n++].value.integer = 1;
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA;
    args[n++].value.integer = 0;
    /* and accept the peer's pings at that rate instead of calling them abuse */
    args[n].type = GRPC_ARG_INTEGER,
    args[n].key = GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS;
    args[n++].value.integer = keepalive_ms / 2;
    return n;
}
