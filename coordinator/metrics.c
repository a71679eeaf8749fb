/*
 * metrics.c — the coordinator's Prometheus endpoint: GET /metrics answers
 * the text exposition format (version 0.0.4) from the same status the Admin
 * API serves, plus update rejections by reason. Plain HTTP through
 * libmicrohttpd on its own thread, off unless federation.ini has
 * [metrics] listen = HOST:PORT (127.0.0.1:9464 is the usual; it carries no
 * secrets, but keep it on loopback or behind the scraper's network).
 */
#include <arpa/inet.h>
#include <math.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator_internal.h"

struct Metrics {
    struct MHD_Daemon *daemon;
    Coordinator *co;
    char address[300]; /* host:port as bound (a port of 0 in listen picks one) */
};

const char *metrics_address(const Metrics *m) {
    return m->address;
}

typedef struct Text {
    char *buf;
    size_t len, cap;
} Text;

static void put(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Text *t, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (t->buf && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap ? t->cap * 2 : 4096) + (size_t)n;
        char *grown = realloc(t->buf, cap);
        if (grown == NULL) return;
        t->buf = grown, t->cap = cap;
    }
}

/* A metric's HELP and TYPE, and its value when has_value. */
static void metric_if(Text *t, const char *name, const char *type, const char *help, double v,
                      int has_value) {
    put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    if (!has_value)
        return;
    else if (isnan(v))
        put(t, "%s NaN\n", name);
    else
        put(t, "%s %.17g\n", name, v);
}

static void metric(Text *t, const char *name, const char *type, const char *help, double v) {
    metric_if(t, name, type, help, v, 1);
}

/* Each site's compute utilization in the last committed round (its last
 * update there), one series per site; none before a round commits. */
static int site_utilization(Coordinator *co, Text *t, int64_t round, char *err) {
    put(t, "# HELP strait_site_utilization A site's training time over the last committed "
           "round's wall time.\n# TYPE strait_site_utilization gauge\n");
    if (round < 0) return 0;
    AdminRound ar;
    StoreUpdate *ups = NULL;
    size_t n = 0;
    pthread_mutex_lock(&co->store_lock);
    int rc = admin_query_round(co->store, round, time_wall_ms(), &ar, &ups, &n, err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        int later = 0;
        for (size_t j = i + 1; j < n && !later; j++) later = ups[j].site_id == ups[i].site_id;
        if (later || isnan(ups[i].utilization)) continue;
        /* site names are [A-Za-z0-9._-]: nothing to escape in a label */
        put(t, "strait_site_utilization{site=\"%s\"} %.6g\n", ups[i].site_name, ups[i].utilization);
    }
    free(ups);
    return 0;
}

static int render(Coordinator *co, Text *t, char *err) {
    AdminStatus st;
    if (admin_live_status(co, &st, err) != 0) return -1;
    StoreReasonCount *reasons = NULL;
    size_t n = 0;
    pthread_mutex_lock(&co->store_lock);
    int rc = store_rejections(co->store, &reasons, &n, err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) return -1;
    metric(t, "strait_rounds_committed_total", "counter", "Rounds committed.",
           (double)st.totals.rounds_committed);
    metric(t, "strait_rounds_failed_total", "counter", "Round attempts failed (no quorum).",
           (double)st.totals.rounds_failed);
    metric(t, "strait_current_round", "gauge", "The round open now.", (double)st.current_round);
    metric(t, "strait_total_rounds", "gauge", "Rounds the federation runs.",
           (double)st.total_rounds);
    metric(t, "strait_finished", "gauge", "1 once the federation has run all its rounds.",
           strcmp(st.round_state, "finished") == 0);
    metric(t, "strait_sites_online", "gauge", "Active sites seen within the last minute.",
           (double)st.sites_online);
    metric(t, "strait_sites_offline", "gauge", "Active sites not seen within the last minute.",
           (double)st.sites_offline);
    metric(t, "strait_sites_revoked", "gauge", "Revoked sites.", (double)st.sites_revoked);
    metric(t, "strait_round_updates", "gauge", "Updates counted in the open round.",
           (double)st.sites_reported);
    metric(t, "strait_bytes_up_total", "counter",
           "Update bytes received and not refused, in every closed round.",
           (double)st.totals.bytes_up);
    metric(t, "strait_bytes_rejected_total", "counter",
           "Bytes of refused updates, in every closed round.", (double)st.totals.bytes_rejected);
    metric(t, "strait_bytes_down_total", "counter", "Model bytes sent, in every closed round.",
           (double)st.totals.bytes_down);
    metric(t, "strait_dense_bytes_total", "counter",
           "Bytes dense data-parallel training would have moved for the committed rounds' "
           "training (docs/communication.md).",
           (double)st.totals.dense_bytes);
    metric(t, "strait_dense_ratio", "gauge",
           "Dense data-parallel bytes over the bytes moved up and down (0: not measured).",
           store_dense_ratio(st.totals.dense_bytes, st.totals.bytes_up, st.totals.bytes_down));
    metric(t, "strait_utilization", "gauge",
           "Compute utilization over the last committed rounds: the sites' training time over "
           "wall time (NaN: none).",
           st.utilization);
    metric(t, "strait_goodput", "gauge",
           "Accepted tokens over what the sites could have trained in the same wall time, over "
           "the last committed rounds (NaN: none).",
           st.goodput);
    if (site_utilization(co, t, st.last_commit_round, err) != 0) {
        free(reasons);
        return -1;
    }
    metric(t, "strait_tokens_total", "counter", "Tokens trained in committed rounds.",
           (double)st.totals.tokens);
    metric(t, "strait_last_validation_loss", "gauge",
           "Validation loss of the last committed round (nats per token).", st.last_eval_loss);
    /* declared always (a dashboard's query finds the name), a value only
     * where rounds had noise */
    metric_if(t, "strait_dp_epsilon", "gauge",
              "Differential privacy: the federation's epsilon after the last committed round, "
              "at strait_dp_delta (no value: no round had noise).",
              st.dp_epsilon, isfinite(st.dp_epsilon));
    metric_if(t, "strait_dp_delta", "gauge", "The delta strait_dp_epsilon is at.", st.dp_delta,
              isfinite(st.dp_epsilon));
    metric(t, "strait_last_commit_timestamp_seconds", "gauge", "When the last round committed.",
           st.last_commit_at / 1000.0);
    metric(t, "strait_last_commit_duration_seconds", "gauge",
           "How long the last commit took: aggregation, outer step, files, hashes, store "
           "(NaN before this process's first).",
           st.last_commit_s);
    metric(t, "strait_disk_used_bytes", "gauge",
           "Bytes of the kept checkpoints and outer optimizer states.", (double)st.disk.used);
    metric(t, "strait_disk_free_bytes", "gauge",
           "Bytes free in the federation's folder (-1: unknown).", (double)st.disk.free);
    metric(t, "strait_disk_commit_bytes", "gauge",
           "What one commit writes before retention prunes: checkpoint, outer state, delta.",
           (double)st.disk.round_bytes);
    metric(t, "strait_disk_rounds_left", "gauge",
           "Of the commits the federation has left, those the free space holds (-1: unknown).",
           (double)st.disk_rounds_left);
    metric(t, "strait_disk_short", "gauge",
           "1 while the free space holds fewer commits than the coordinator warns at.",
           admin_disk_short(&st));
    metric(t, "strait_checkpoints_kept", "gauge", "Round checkpoints kept.", (double)st.disk.kept);
    metric(t, "strait_checkpoints_pruned", "gauge",
           "Round checkpoints removed by the retention policy ([store] keep_last, keep_every).",
           (double)st.disk.pruned);
    metric(t, "strait_resident_memory_bytes", "gauge", "The coordinator's resident memory.",
           (double)st.rss_bytes);
    metric(t, "strait_uptime_seconds", "gauge", "Since the coordinator started.",
           st.uptime_ms / 1000.0);
    NetGuardStats g;
    net_guard_stats(&g);
    metric(t, "strait_connections", "gauge", "TCP connections held now.", (double)g.connections);
    metric(t, "strait_connections_pending", "gauge",
           "Of those, connections no call with a certificate has come on yet.", (double)g.pending);
    metric(t, "strait_connections_evicted_total", "counter",
           "Pending connections reset to make room for a newer one from their address.",
           (double)g.evicted);
    metric(t, "strait_connections_refused_total", "counter",
           "Connections closed as they were accepted: over a cap per address or in all.",
           (double)g.refused);
    metric(t, "strait_connections_reset_total", "counter",
           "Connections reset for sending too much before a call with a certificate.",
           (double)g.cut);
    metric(t, "strait_connections_no_descriptor_total", "counter",
           "Connections closed for want of a descriptor (raise LimitNOFILE).", (double)g.emfile);
    /* one series per label: reasons with the same label are summed */
    put(t, "# HELP strait_update_rejections_total Updates refused, by reason.\n"
           "# TYPE strait_update_rejections_total counter\n");
    /* every code, zeros included, so a dashboard's series exist from the start */
    for (size_t l = 0; store_reason_codes[l]; l++) {
        int64_t count = 0;
        for (size_t i = 0; i < n; i++)
            if (strcmp(reasons[i].reason, store_reason_codes[l]) == 0) count += reasons[i].count;
        put(t, "strait_update_rejections_total{reason=\"%s\"} %lld\n", store_reason_codes[l],
            (long long)count);
    }
    free(reasons);
    return t->buf ? 0 : err_set(err, "out of memory");
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **state) {
    (void)version, (void)upload, (void)state;
    Metrics *m = cls;
    if (*upload_len) return MHD_NO; /* GET carries no body; drop the connection */
    int code = MHD_HTTP_OK;
    const char *type = "text/plain; version=0.0.4; charset=utf-8";
    Text t = {NULL, 0, 0};
    char err[ERR_LEN];
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
        put(&t, "only GET /metrics here\n");
    } else if (strcmp(url, "/metrics") != 0) {
        code = MHD_HTTP_NOT_FOUND;
        put(&t, "not found; the metrics are at /metrics\n");
    } else if (render(m->co, &t, err) != 0) {
        code = MHD_HTTP_INTERNAL_SERVER_ERROR;
        free(t.buf);
        t.buf = NULL, t.len = t.cap = 0;
        put(&t, "%s\n", err);
    }
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(t.len, t.buf ? t.buf : (char *)"", MHD_RESPMEM_MUST_COPY);
    free(t.buf);
    if (resp == NULL) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", type);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)code, resp);
    MHD_destroy_response(resp);
    return rc;
}

Metrics *metrics_start(Coordinator *co, const char *listen, char *err) {
    char host[256];
    const char *colon = strrchr(listen, ':');
    long port = colon ? strtol(colon + 1, NULL, 10) : -1;
    snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - listen) : 0, listen);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (port < 0 || port > 65535 || inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        err_set(err, "[metrics] listen = '%s': give an IPv4 HOST:PORT such as 127.0.0.1:9464",
                listen);
        return NULL;
    }
    Metrics *m = calloc(1, sizeof *m);
    if (m == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    m->co = co;
    m->daemon =
        MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, answer,
                         m, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                         /* idle peers cannot take the scraper's place: a few
                          * connections per address, more in all, and 5 s each */
                         MHD_OPTION_CONNECTION_LIMIT, 256U, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 8U,
                         MHD_OPTION_CONNECTION_TIMEOUT, 5U, MHD_OPTION_END);
    if (m->daemon == NULL) {
        err_set(err, "cannot serve metrics on %s (in use? another HOST:PORT in [metrics] listen)",
                listen);
        free(m);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->daemon, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(m->address, sizeof m->address, "%s:%u", host,
             info ? (unsigned)info->port : (unsigned)port);
    log_info("metrics", "Prometheus metrics on http://%s/metrics", m->address);
    return m;
}

void metrics_stop(Metrics *m) {
    if (m == NULL) return;
    MHD_stop_daemon(m->daemon);
    free(m);
}

/* ---- TensorBoard ------------------------------------------------------------------- */

void metrics_tensorboard(Coordinator *co, int64_t number) {
    AdminRound ar;
    StoreUpdate *ups = NULL;
    size_t n = 0;
    char err[ERR_LEN];
    pthread_mutex_lock(&co->store_lock);
    int rc = admin_query_round(co->store, number, time_wall_ms(), &ar, &ups, &n, err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) {
        log_warn("metrics", "round %lld is not in TensorBoard's file: %s", (long long)number, err);
        return;
    }
    const StoreRound *r = &ar.r;
    int64_t refused = r->refusals_unrecorded;
    for (size_t i = 0; i < n; i++) refused += strcmp(ups[i].state, "rejected") == 0;
    enum { ROUND_TAGS = 14, SITE_TAGS = 3 };
    const char *fixed[ROUND_TAGS] = {
        "loss/global",     "loss/validation", "loss/train",          "tokens",
        "sites",           "bytes/up",        "bytes/down",          "bytes/refused",
        "compression",     "round/seconds",   "compute/utilization", "compute/goodput",
        "updates/refused", "privacy/epsilon"};
    double fixed_v[ROUND_TAGS] = {r->start_eval_loss,
                                  r->eval_loss,
                                  r->train_loss,
                                  (double)r->tokens,
                                  (double)r->participants,
                                  (double)r->bytes_up,
                                  (double)r->bytes_down,
                                  (double)r->bytes_rejected,
                                  r->bytes_up ? (double)ar.raw_bytes / (double)r->bytes_up : NAN,
                                  ar.wall_ms ? ar.wall_ms / 1000.0 : NAN,
                                  ar.utilization,
                                  ar.goodput,
                                  (double)refused,
                                  r->dp_epsilon};
    size_t cap = ROUND_TAGS + SITE_TAGS * n;
    const char **tags = malloc(cap * sizeof *tags);
    double *values = malloc(cap * sizeof *values);
    char(*names)[96] = malloc((SITE_TAGS * n + 1) * sizeof *names);
    if (tags == NULL || values == NULL || names == NULL) {
        log_warn("metrics", "round %lld is not in TensorBoard's file: out of memory",
                 (long long)number);
        free(tags), free(values), free(names), free(ups);
        return;
    }
    int k = 0, m = 0;
    for (int i = 0; i < ROUND_TAGS; i++) tags[k] = fixed[i], values[k++] = fixed_v[i];
    for (size_t i = 0; i < n; i++) { /* each site's accepted update */
        if (strcmp(ups[i].state, "rejected") == 0) continue;
        const char *what[SITE_TAGS] = {"train_loss", "eval_loss", "utilization"};
        double v[SITE_TAGS] = {ups[i].train_loss, ups[i].eval_loss, ups[i].utilization};
        for (int j = 0; j < SITE_TAGS; j++) {
            snprintf(names[m], sizeof names[m], "site/%s/%s", ups[i].site_name, what[j]);
            tags[k] = names[m++], values[k++] = v[j];
        }
    }
    if (events_scalars(co->events, number, r->closed_at / 1000.0, tags, values, k, err) != 0 ||
        events_sync(co->events, err) != 0)
        log_warn("metrics", "round %lld is not in TensorBoard's file: %s", (long long)number, err);
    free(tags), free(values), free(names), free(ups);
}
