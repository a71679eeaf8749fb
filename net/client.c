/*
 * client.c — channels and calls of net.h. Each call has its own pluck queue;
 * RECV_STATUS_ON_CLIENT is started with the call, so a failed call's status
 * (deadline, cancel, refusal) is there for net_client_finish whatever the
 * caller was doing.
 */
#include <stdlib.h>
#include <string.h>

#include "net_internal.h"
#include "util/util.h"

struct NetChannel {
    grpc_channel *channel;
};

struct NetClientCall {
    grpc_call *call;
    grpc_completion_queue *cq;
    int got_initial_md;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code status;
    grpc_slice status_details;
    const char *error_string;
};

static int tag_op, tag_status;

NetChannel *net_channel_create(const NetChannelConfig *cfg, char *err) {
    if (cfg->tls.ca_pem == NULL) {
        err_set(err, "a channel needs the federation CA to verify the coordinator");
        return NULL;
    }
    if ((cfg->tls.cert_pem == NULL) != (cfg->tls.key_pem == NULL)) {
        err_set(err, "give both a client certificate and its key, or neither");
        return NULL;
    }
    grpc_ssl_pem_key_cert_pair pair = {cfg->tls.key_pem, cfg->tls.cert_pem};
    grpc_channel_credentials *creds = grpc_ssl_credentials_create_ex(
        cfg->tls.ca_pem, cfg->tls.cert_pem ? &pair : NULL, NULL, NULL);
    if (creds == NULL) {
        err_set(err, "cannot create TLS credentials from the PEM given");
        return NULL;
    }
    net_channel_creds_tls13(creds);
    grpc_arg args[NET_COMMON_ARGS + 3];
    int n = net_common_args(args, cfg->max_message ? cfg->max_message : NET_MAX_MESSAGE_DEFAULT,
                            cfg->keepalive_ms > 0 ? cfg->keepalive_ms : NET_KEEPALIVE_DEFAULT_MS);
    /* reconnect attempts back off to NET_RECONNECT_BACKOFF_MAX_MS, not
     * gRPC's 120 s, and an attempt whose SYNs go unanswered (a cut link)
     * gives up after NET_CONNECT_TIMEOUT_MS, not 20 s, to start afresh: a
     * site whose link or coordinator comes back rejoins within seconds
     * (bench/wan --faults measures it) */
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
    args[n++].value.integer = NET_RECONNECT_BACKOFF_MAX_MS;
    args[n].type = GRPC_ARG_INTEGER, args[n].key = GRPC_ARG_MIN_RECONNECT_BACKOFF_MS;
    args[n++].value.integer = NET_CONNECT_TIMEOUT_MS;
    if (cfg->server_name) {
        args[n].type = GRPC_ARG_STRING;
        args[n].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[n++].value.string = (char *)cfg->server_name;
    }
    grpc_channel_args ca = {(size_t)n, args};
    NetChannel *ch = calloc(1, sizeof *ch);
    if (ch == NULL) {
        grpc_channel_credentials_release(creds);
        err_set(err, "out of memory");
        return NULL;
    }
    ch->channel = grpc_channel_create(cfg->target, creds, &ca);
    grpc_channel_credentials_release(creds);
    if (ch->channel == NULL) {
        free(ch);
        err_set(err, "cannot create a channel to %s", cfg->target);
        return NULL;
    }
    return ch;
}

int net_channel_wait_ready(NetChannel *ch, int64_t timeout_ms) {
    grpc_connectivity_state st = grpc_channel_check_connectivity_state(ch->channel, 1);
    if (st == GRPC_CHANNEL_READY) return 1;
    /* a channel between failed attempts tries again now: the caller's
     * backoff paces the retries, not gRPC's (up to 4 s on top of it after a
     * restarted coordinator refused a few) */
    if (timeout_ms > 0 && st == GRPC_CHANNEL_TRANSIENT_FAILURE)
        grpc_channel_reset_connect_backoff(ch->channel);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec until =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    /* each watch ends on the next change of state or at the deadline */
    while (st != GRPC_CHANNEL_READY && st != GRPC_CHANNEL_SHUTDOWN &&
           gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), until) < 0) {
        grpc_channel_watch_connectivity_state(ch->channel, st, until, cq, &tag_op);
        grpc_event ev =
            grpc_completion_queue_pluck(cq, &tag_op, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success) break; /* the deadline */
        st = grpc_channel_check_connectivity_state(ch->channel, 1);
    }
    net_cq_drain_destroy(cq);
    return st == GRPC_CHANNEL_READY;
}

void net_channel_destroy(NetChannel *ch) {
    if (ch == NULL) return;
    grpc_channel_destroy(ch->channel);
    free(ch);
}

static int client_batch(NetClientCall *c, grpc_op *ops, size_t n) {
    if (grpc_call_start_batch(c->call, ops, n, &tag_op, NULL) != GRPC_CALL_OK) return -1;
    grpc_event ev =
        grpc_completion_queue_pluck(c->cq, &tag_op, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success ? 0 : -1;
}

NetClientCall *net_client_start(NetChannel *ch, const char *method, int64_t timeout_ms, char *err) {
    NetClientCall *c = calloc(1, sizeof *c);
    if (c == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    c->cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = timeout_ms > 0
                                ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                               gpr_time_from_millis(timeout_ms, GPR_TIMESPAN))
                                : gpr_inf_future(GPR_CLOCK_REALTIME);
    grpc_slice m = grpc_slice_from_copied_string(method);
    c->call = grpc_channel_create_call(ch->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, m, NULL,
                                       deadline, NULL);
    grpc_slice_unref(m);
    if (c->call == NULL) {
        net_cq_drain_destroy(c->cq);
        free(c);
        err_set(err, "cannot start a call to %s", method);
        return NULL;
    }
    grpc_metadata_array_init(&c->initial_md);
    grpc_metadata_array_init(&c->trailing_md);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[1].data.recv_status_on_client.trailing_metadata = &c->trailing_md;
    ops[1].data.recv_status_on_client.status = &c->status;
    ops[1].data.recv_status_on_client.status_details = &c->status_details;
    ops[1].data.recv_status_on_client.error_string = &c->error_string;
    if (grpc_call_start_batch(c->call, &ops[1], 1, &tag_status, NULL) != GRPC_CALL_OK) {
        grpc_call_unref(c->call);
        grpc_metadata_array_destroy(&c->initial_md);
        grpc_metadata_array_destroy(&c->trailing_md);
        net_cq_drain_destroy(c->cq);
        free(c);
        err_set(err, "cannot start a call to %s", method);
        return NULL;
    }
    /* fails only on a call that is already dead; finish reports why */
    (void)client_batch(c, &ops[0], 1);
    return c;
}

int net_client_send(NetClientCall *c, const void *data, size_t len) {
    return net_client_send2(c, data, len, NULL, 0);
}

int net_client_send2(NetClientCall *c, const void *a, size_t alen, const void *b, size_t blen) {
    /* static slices: the bytes stay the caller's and valid until we return */
    grpc_slice s[2] = {grpc_slice_from_static_buffer(a, alen),
                       grpc_slice_from_static_buffer(b, blen)};
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, b ? 2 : 1);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    int rc = client_batch(c, &op, 1);
    grpc_byte_buffer_destroy(bb);
    return rc;
}

int net_client_close_send(NetClientCall *c) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    return client_batch(c, &op, 1);
}

NetRecv net_client_recv(NetClientCall *c, NetBuf *msg) {
    msg->data = NULL;
    msg->len = 0;
    grpc_byte_buffer *bb = NULL;
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->got_initial_md) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = &c->initial_md;
        c->got_initial_md = 1;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &bb;
    if (client_batch(c, ops, n) != 0) return NET_RECV_BROKEN;
    if (bb == NULL) return NET_RECV_END; /* finish tells a clean end from a failure */
    int rc = net_bb_read(bb, msg);
    grpc_byte_buffer_destroy(bb);
    return rc == 0 ? NET_RECV_MESSAGE : NET_RECV_BROKEN;
}

void net_client_cancel(NetClientCall *c) {
    grpc_call_cancel(c->call, NULL);
}

NetStatus net_client_finish(NetClientCall *c, char *details, size_t details_len) {
    NetStatus st = NET_UNKNOWN;
    if (c->call && !c->got_initial_md) {
        /* gRPC core holds a call's status back until its initial metadata
         * has been asked for: a caller that never received would otherwise
         * wait for its own deadline (measured: a stream the server cut after
         * 1 s reported DEADLINE_EXCEEDED after the client's 60 s) */
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_INITIAL_METADATA;
        op.data.recv_initial_metadata.recv_initial_metadata = &c->initial_md;
        c->got_initial_md = 1;
        (void)client_batch(c, &op, 1); /* fails on a dead call: the status says why */
    }
    if (c->call) {
        grpc_event ev = grpc_completion_queue_pluck(c->cq, &tag_status,
                                                    gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_OP_COMPLETE) st = (NetStatus)c->status;
        if (details && details_len) {
            size_t n = GRPC_SLICE_LENGTH(c->status_details);
            snprintf(details, details_len, "%.*s", (int)n,
                     (const char *)GRPC_SLICE_START_PTR(c->status_details));
        }
        grpc_slice_unref(c->status_details);
        if (c->error_string) gpr_free((void *)c->error_string);
        grpc_call_unref(c->call);
    } else if (details && details_len) {
        snprintf(details, details_len, "could not create the call");
    }
    grpc_metadata_array_destroy(&c->initial_md);
    grpc_metadata_array_destroy(&c->trailing_md);
    net_cq_drain_destroy(c->cq);
    free(c);
    return st;
}

NetStatus net_unary(NetChannel *ch, const char *method, const void *req, size_t req_len,
                    NetBuf *resp, int64_t timeout_ms, char *details, size_t details_len) {
    char err[ERR_LEN];
    NetBuf ignore = {NULL, 0};
    NetBuf *out = resp ? resp : &ignore;
    out->data = NULL;
    out->len = 0;
    NetClientCall *c = net_client_start(ch, method, timeout_ms, err);
    if (c == NULL) {
        if (details) snprintf(details, details_len, "%s", err);
        return NET_INTERNAL;
    }
    if (net_client_send(c, req, req_len) == 0) net_client_close_send(c);
    NetRecv r = net_client_recv(c, out);
    NetStatus st = net_client_finish(c, details, details_len);
    if (st == NET_OK && r != NET_RECV_MESSAGE) {
        st = NET_INTERNAL;
        if (details) snprintf(details, details_len, "the server answered OK without a message");
    }
    if (st != NET_OK || resp == NULL) net_buf_free(out);
    return st;
}
