/*
 * admin.c — the Admin service (admin certificate required): status, rounds
 * in pages, one round's updates, sites, the audit log, enroll and revoke.
 * The reads are admin_query_* over a store, so that the service and a
 * monitor reading the store of a stopped coordinator show the same thing;
 * enroll and revoke are written to the audit log with the caller's name.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator_internal.h"
#include "schema/strait.pb-c.h"

/* ---- the reads ------------------------------------------------------------------ */

/* Appends "text" as a line of buf (truncating quietly when full). */
static void add_line(char *buf, size_t size, const char *text) {
    size_t n = strlen(buf);
    if (n + 1 < size) snprintf(buf + n, size - n, "%s%s", n ? "\n" : "", text);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The part of a round's wall time [start, closed) a site was in the
 * federation for: from its enrollment when that came later (a site that
 * did not exist yet could not train); the whole of it for a site not in
 * the list (revoked since). */
static int64_t site_wall(const StoreSite *sites, size_t n_sites, int64_t site_id, int64_t start,
                         int64_t closed) {
    for (size_t k = 0; k < n_sites; k++)
        if (sites[k].id == site_id && sites[k].enrolled_at > start)
            return sites[k].enrolled_at < closed ? closed - sites[k].enrolled_at : 1;
    return closed - start;
}

/* A round's wall time, compute utilization and goodput (AdminRound says
 * what each is), and each update's wait and utilization. */
static int utilization(Store *s, const StoreSite *sites, size_t n_sites, AdminRound *ar,
                       StoreUpdate *ups, size_t n, char *err) {
    ar->wall_ms = 0;
    ar->utilization = ar->goodput = NAN;
    ar->train_ms_sum = ar->site_wall_ms_sum = ar->tokens_accepted = ar->tokens_possible = 0;
    for (size_t i = 0; i < n; i++) {
        ups[i].wait_ms = ar->r.closed_at ? ar->r.closed_at - ups[i].received_at : -1;
        if (ups[i].wait_ms < -1) ups[i].wait_ms = 0; /* clocks: never negative */
        ups[i].utilization = NAN;
    }
    if (strcmp(ar->r.state, "committed") != 0 || ar->r.closed_at <= 0) return 0;
    int64_t start = ar->r.opened_at, closed = ar->r.closed_at;
    if (ar->r.number > 0) {
        StoreRound prev;
        int rc = store_round_get(s, ar->r.number - 1, &prev, err);
        if (rc != 0 && rc != STORE_NOT_FOUND) return -1;
        if (rc == 0 && strcmp(prev.state, "committed") == 0 && prev.closed_at > 0 &&
            prev.closed_at <= closed)
            start = prev.closed_at;
    }
    int64_t wall = closed - start;
    if (wall <= 0) return 0;
    ar->wall_ms = wall;
    double *rates = malloc((n ? n : 1) * sizeof *rates);
    if (rates == NULL) return err_set(err, "out of memory for a round's utilization");
    size_t n_rates = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(ups[i].state, "accepted") == 0) ar->tokens_accepted += (double)ups[i].tokens;
        if (strcmp(ups[i].state, "discarded") == 0 || ups[i].train_ms <= 0) continue;
        double w = (double)site_wall(sites, n_sites, ups[i].site_id, start, closed);
        double t = (double)ups[i].train_ms < w ? (double)ups[i].train_ms : w;
        ups[i].utilization = t / w;
        int later = 0; /* a site's refused retries: its last update speaks for it */
        for (size_t j = i + 1; j < n && !later; j++)
            later = ups[j].site_id == ups[i].site_id && ups[j].train_ms > 0 &&
                    strcmp(ups[j].state, "discarded") != 0;
        if (later) continue;
        ar->train_ms_sum += t, ar->site_wall_ms_sum += w;
        if (ups[i].tokens > 0) {
            rates[n_rates++] = (double)ups[i].tokens / t;
            ar->tokens_possible += (double)ups[i].tokens / t * w;
        }
    }
    if (ar->site_wall_ms_sum > 0) ar->utilization = ar->train_ms_sum / ar->site_wall_ms_sum;
    if (n_rates > 0) {
        /* every expected site could have trained for its wall time: at its
         * own rate, or the round's median for a site with none */
        qsort(rates, n_rates, sizeof *rates, cmp_double);
        double median =
            n_rates % 2 ? rates[n_rates / 2] : (rates[n_rates / 2 - 1] + rates[n_rates / 2]) / 2;
        for (size_t k = 0; k < n_sites; k++) {
            if (strcmp(sites[k].state, "active") != 0 || sites[k].enrolled_at > closed) continue;
            int rated = 0; /* as above: an update with a claimed rate speaks for its site */
            for (size_t i = 0; i < n && !rated; i++)
                rated = ups[i].site_id == sites[k].id && ups[i].tokens > 0 && ups[i].train_ms > 0 &&
                        strcmp(ups[i].state, "discarded") != 0;
            if (!rated)
                ar->tokens_possible +=
                    median * (double)site_wall(sites, n_sites, sites[k].id, start, closed);
        }
        if (ar->tokens_possible > 0) ar->goodput = ar->tokens_accepted / ar->tokens_possible;
    }
    free(rates);
    return 0;
}

/* Completes one round from its updates and the site list: the rejections,
 * the expected sites and those that sent nothing. */
static int describe_round(Store *s, const StoreSite *sites, size_t n_sites, int64_t now,
                          AdminRound *ar, StoreUpdate **ups_out, size_t *n_out, char *err) {
    StoreUpdate *ups;
    size_t n;
    if (store_updates_list(s, ar->r.id, &ups, &n, err) != 0) return -1;
    ar->raw_bytes = 0;
    ar->missed[0] = ar->rejected[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (strcmp(ups[i].state, "rejected") == 0) {
            char line[400];
            snprintf(line, sizeof line, "%s: %s", ups[i].site_name, ups[i].reason);
            add_line(ar->rejected, sizeof ar->rejected, line);
        } else {
            ar->raw_bytes += ups[i].raw_bytes;
        }
    }
    int64_t until = ar->r.closed_at ? ar->r.closed_at : now;
    ar->expected = 0;
    for (size_t k = 0; k < n_sites; k++) {
        if (strcmp(sites[k].state, "active") != 0 || sites[k].enrolled_at > until) continue;
        ar->expected++;
        int sent = 0;
        for (size_t i = 0; i < n && !sent; i++) sent = ups[i].site_id == sites[k].id;
        if (!sent) add_line(ar->missed, sizeof ar->missed, sites[k].name);
    }
    if (utilization(s, sites, n_sites, ar, ups, n, err) != 0) {
        free(ups);
        return -1;
    }
    if (ups_out) {
        *ups_out = ups;
        *n_out = n;
    } else {
        free(ups);
    }
    return 0;
}

int admin_query_rounds(Store *s, int limit, int64_t before, int64_t now, AdminRound **out,
                       size_t *n, char *err) {
    StoreRound *rounds;
    StoreSite *sites;
    size_t n_rounds, n_sites;
    *out = NULL;
    *n = 0;
    if (store_rounds_list(s, limit, before, &rounds, &n_rounds, err) != 0) return -1;
    if (store_site_list(s, &sites, &n_sites, err) != 0) {
        free(rounds);
        return -1;
    }
    AdminRound *ar = calloc(n_rounds ? n_rounds : 1, sizeof *ar);
    int rc = ar ? 0 : err_set(err, "out of memory listing rounds");
    for (size_t i = 0; rc == 0 && i < n_rounds; i++) {
        ar[i].r = rounds[i];
        rc = describe_round(s, sites, n_sites, now, &ar[i], NULL, NULL, err);
    }
    free(rounds);
    free(sites);
    if (rc != 0) {
        free(ar);
        return -1;
    }
    *out = ar;
    *n = n_rounds;
    return 0;
}

int admin_query_round(Store *s, int64_t number, int64_t now, AdminRound *round, StoreUpdate **ups,
                      size_t *n, char *err) {
    memset(round, 0, sizeof *round);
    int rc = store_round_get(s, number, &round->r, err);
    if (rc != 0) return rc;
    StoreSite *sites;
    size_t n_sites;
    if (store_site_list(s, &sites, &n_sites, err) != 0) return -1;
    rc = describe_round(s, sites, n_sites, now, round, ups, n, err);
    free(sites);
    return rc;
}

int admin_query_sites(Store *s, int64_t now, AdminSite **out, size_t *n, char *err) {
    StoreSite *sites;
    if (store_site_list(s, &sites, n, err) != 0) return -1;
    AdminSite *as = calloc(*n ? *n : 1, sizeof *as);
    if (as == NULL) {
        free(sites);
        return err_set(err, "out of memory listing sites");
    }
    for (size_t i = 0; i < *n; i++) {
        as[i].s = sites[i];
        StoreCert cert = {0};
        if (sites[i].cert_sha256[0] &&
            store_cert_find(s, sites[i].cert_sha256, NULL, &cert, NULL) == 0)
            as[i].cert_not_after = cert.not_after;
        as[i].online = strcmp(sites[i].state, "active") == 0 && sites[i].last_seen &&
                       now - sites[i].last_seen <= ADMIN_ONLINE_MS;
    }
    free(sites);
    *out = as;
    return 0;
}

/* Utilization and goodput over the last ADMIN_UTILIZATION_ROUNDS committed
 * rounds: their sums, not a mean of ratios (a long round weighs more). */
#define ADMIN_UTILIZATION_ROUNDS 10
static int status_utilization(Store *s, int64_t now, AdminStatus *st, char *err) {
    st->utilization = st->goodput = NAN;
    st->utilization_rounds = 0;
    AdminRound *ar;
    size_t n;
    /* attempts, newest first: failed ones among them */
    if (admin_query_rounds(s, 4 * ADMIN_UTILIZATION_ROUNDS, 0, now, &ar, &n, err) != 0) return -1;
    double train = 0, wall = 0, got = 0, possible = 0;
    for (size_t i = 0; i < n && st->utilization_rounds < ADMIN_UTILIZATION_ROUNDS; i++) {
        if (ar[i].wall_ms <= 0) continue;
        st->utilization_rounds++;
        train += ar[i].train_ms_sum, wall += ar[i].site_wall_ms_sum;
        got += ar[i].tokens_accepted, possible += ar[i].tokens_possible;
    }
    free(ar);
    if (wall > 0) st->utilization = train / wall;
    if (possible > 0) st->goodput = got / possible;
    return 0;
}

int admin_disk_short(const AdminStatus *st) {
    int64_t to_go = st->total_rounds - (st->last_commit_round + 1);
    return st->disk_rounds_left >= 0 && st->disk_rounds_left < DISK_ROUNDS_WARN &&
           st->disk_rounds_left < to_go;
}

int admin_query_status(Store *s, int64_t now, AdminStatus *st, char *err) {
    AdminSite *sites;
    size_t n;
    if (admin_query_sites(s, now, &sites, &n, err) != 0) return -1;
    st->sites_total = (int64_t)n;
    st->sites_online = st->sites_offline = st->sites_revoked = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(sites[i].s.state, "active") != 0)
            st->sites_revoked++;
        else if (sites[i].online)
            st->sites_online++;
        else
            st->sites_offline++;
    }
    free(sites);
    StoreRound last;
    int rc = store_round_last_committed(s, &last, err);
    if (rc < 0) return -1;
    st->last_commit_round = rc == 0 ? last.number : -1;
    st->last_commit_at = rc == 0 ? last.closed_at : 0;
    st->last_eval_loss = rc == 0 ? last.eval_loss : NAN;
    st->dp_epsilon = rc == 0 ? last.dp_epsilon : NAN;
    st->dp_delta = rc == 0 ? last.dp_delta : NAN;
    if (isfinite(st->dp_epsilon)) { /* and what attempts that failed after unmasking spent */
        PrivacyAccount acc;
        int64_t plain;
        if (store_privacy_spent(s, &acc, &plain, err) != 0) return -1;
        st->dp_epsilon = privacy_account_epsilon(&acc, st->dp_delta, NULL);
    }
    if (status_utilization(s, now, st, err) != 0) return -1;
    if (store_disk(s, &st->disk, err) != 0) return -1;
    st->disk_rounds_left =
        store_disk_rounds_left(st->disk.free, st->disk.round_bytes, st->disk.ckpt_bytes,
                               st->keep_every, st->total_rounds - (st->last_commit_round + 1));
    return store_totals(s, &st->totals, err);
}

/* ---- the service --------------------------------------------------------------- */

static int authorize_admin(Coordinator *co, NetCall *c) {
    const NetPeer *p = net_call_peer(c);
    if (!p->has_cert || strcmp(p->sha256_hex, co->admin_sha) != 0) {
        net_call_status(c, NET_PERMISSION_DENIED,
                        "the admin certificate is required (strait admin export makes a kit)");
        return -1;
    }
    return 0;
}

static int64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return (int64_t)resident * (int64_t)sysconf(_SC_PAGESIZE);
}

int admin_live_status(Coordinator *co, AdminStatus *st, char *err) {
    memset(st, 0, sizeof *st);
    st->running = 1;
    snprintf(st->federation, sizeof st->federation, "%s", co->name);
    snprintf(st->address, sizeof st->address, "%s", co->address);
    snprintf(st->model, sizeof st->model, "%s", co->model);
    st->started_at = co->started_ms;
    st->uptime_ms = time_wall_ms() - co->started_ms;
    st->rss_bytes = rss_bytes();
    Rounds *r = &co->rounds;
    pthread_mutex_lock(&r->lock);
    st->model_params = (int64_t)r->model.n_params;
    st->current_round = r->number;
    st->total_rounds = r->set.total;
    st->keep_every = r->set.retain.keep_every;
    st->round_opened_at = r->opened_ms;
    st->sites_reported = r->n_reported;
    st->last_commit_s = r->last_commit_s;
    int finished = r->state == ROUND_FINISHED;
    pthread_mutex_unlock(&r->lock);
    pthread_mutex_lock(&co->store_lock);
    StoreRound live;
    int rc = admin_query_status(co->store, time_wall_ms(), st, err);
    int has_live = rc == 0 && store_round_live(co->store, &live, NULL) == 0;
    pthread_mutex_unlock(&co->store_lock);
    if (rc == 0 && st->disk.round_bytes == 0) { /* before the first commit: the model says it */
        st->disk.round_bytes = r->commit_bytes;
        st->disk.ckpt_bytes = (int64_t)r->model.n_params * 4;
        st->disk_rounds_left =
            store_disk_rounds_left(st->disk.free, st->disk.round_bytes, st->disk.ckpt_bytes,
                                   st->keep_every, st->total_rounds - (st->last_commit_round + 1));
    }
    snprintf(st->round_state, sizeof st->round_state, "%s",
             finished   ? "finished"
             : has_live ? live.state
                        : "open");
    if (finished) { /* no round is open: the last one is the current */
        st->current_round = st->last_commit_round;
        st->sites_reported = 0;
        st->round_opened_at = 0;
    }
    return rc;
}

static void round_to_row(const AdminRound *a, Strait__RoundRow *row, char *lines, char **ptrs,
                         size_t max_ptrs) {
    const StoreRound *r = &a->r;
    row->number = (uint64_t)r->number;
    row->attempt = (uint32_t)r->attempt;
    row->state = (char *)r->state;
    row->participants = (uint32_t)r->participants;
    row->tokens = (uint64_t)r->tokens;
    row->train_loss = r->train_loss;
    row->eval_loss = r->eval_loss;
    row->bytes_up = (uint64_t)r->bytes_up;
    row->bytes_down = (uint64_t)r->bytes_down;
    row->bytes_rejected = (uint64_t)r->bytes_rejected;
    row->dense_bytes = (uint64_t)r->dense_bytes;
    row->refusals_unrecorded = (uint64_t)r->refusals_unrecorded;
    row->opened_at = r->opened_at;
    row->closed_at = r->closed_at;
    row->failed_reason = (char *)r->failed_reason;
    row->late = (char *)r->late;
    row->id = (uint64_t)r->id;
    row->expected = (uint32_t)a->expected;
    row->raw_bytes = (uint64_t)a->raw_bytes;
    row->start_eval_loss = r->start_eval_loss;
    row->dp_noise = r->dp_noise, row->dp_epsilon = r->dp_epsilon, row->dp_delta = r->dp_delta;
    row->wall_ms = (uint64_t)a->wall_ms;
    row->utilization = a->utilization;
    row->goodput = a->goodput;
    /* lines: a copy of missed, NUL, rejected, split at the newlines */
    size_t nm = strlen(a->missed);
    memcpy(lines, a->missed, nm + 1);
    memcpy(lines + nm + 1, a->rejected, strlen(a->rejected) + 1);
    char *parts[2] = {lines, lines + nm + 1};
    size_t used = 0;
    for (int k = 0; k < 2; k++) {
        char **first = ptrs + used;
        size_t count = 0;
        for (char *p = parts[k]; *p && used < max_ptrs;) {
            ptrs[used++] = p, count++;
            char *nl = strchr(p, '\n');
            if (nl == NULL) break;
            *nl = '\0';
            p = nl + 1;
        }
        if (k == 0)
            row->missed = first, row->n_missed = count;
        else
            row->rejected = first, row->n_rejected = count;
    }
}

/* Room to split one AdminRound's lines for its RoundRow. */
typedef struct RowText {
    char lines[sizeof(((AdminRound *)0)->missed) + sizeof(((AdminRound *)0)->rejected) + 2];
    char *ptrs[256];
} RowText;

static void h_status(NetCall *c, void *user) {
    Coordinator *co = user;
    if (authorize_admin(co, c) != 0) return;
    Strait__StatusRequest *req;
    READ_REQUEST(c, StatusRequest, strait__status_request, req);
    strait__status_request__free_unpacked(req, NULL);
    AdminStatus st;
    char err[ERR_LEN];
    if (admin_live_status(co, &st, err) != 0) {
        net_call_status(c, NET_INTERNAL, "%s", err);
        return;
    }
    Strait__StatusResponse resp = STRAIT__STATUS_RESPONSE__INIT;
    resp.federation = st.federation;
    resp.current_round = (uint64_t)st.current_round;
    resp.total_rounds = (uint64_t)st.total_rounds;
    resp.sites_online = (uint32_t)st.sites_online;
    resp.sites_total = (uint32_t)st.sites_total;
    resp.uptime_ms = (uint64_t)st.uptime_ms;
    resp.rss_bytes = (uint64_t)st.rss_bytes;
    resp.address = st.address;
    resp.round_state = st.round_state;
    resp.sites_offline = (uint32_t)st.sites_offline;
    resp.sites_revoked = (uint32_t)st.sites_revoked;
    resp.last_commit_round = st.last_commit_round;
    resp.last_commit_at = st.last_commit_at;
    resp.last_eval_loss = st.last_eval_loss;
    resp.dp_epsilon = st.dp_epsilon, resp.dp_delta = st.dp_delta;
    resp.bytes_up = (uint64_t)st.totals.bytes_up;
    resp.bytes_down = (uint64_t)st.totals.bytes_down;
    resp.bytes_rejected = (uint64_t)st.totals.bytes_rejected;
    resp.dense_bytes = (uint64_t)st.totals.dense_bytes;
    resp.utilization = st.utilization;
    resp.goodput = st.goodput;
    resp.utilization_rounds = (uint32_t)st.utilization_rounds;
    resp.rounds_committed = (uint64_t)st.totals.rounds_committed;
    resp.rounds_failed = (uint64_t)st.totals.rounds_failed;
    resp.updates_rejected = (uint64_t)st.totals.updates_rejected;
    resp.model = st.model;
    resp.model_params = (uint64_t)st.model_params;
    resp.started_at = st.started_at;
    resp.sites_reported = (uint32_t)st.sites_reported;
    resp.round_opened_at = (uint64_t)st.round_opened_at;
    resp.running = 1;
    resp.disk_used = (uint64_t)st.disk.used;
    resp.disk_free = st.disk.free;
    resp.disk_round_bytes = (uint64_t)st.disk.round_bytes;
    resp.disk_rounds_left = st.disk_rounds_left;
    resp.checkpoints_kept = (uint64_t)st.disk.kept;
    resp.checkpoints_pruned = (uint64_t)st.disk.pruned;
    SEND_RESPONSE(c, strait__status_response, resp);
}

#define ROUNDS_PAGE_MAX 500

static void h_rounds(NetCall *c, void *user) {
    Coordinator *co = user;
    if (authorize_admin(co, c) != 0) return;
    Strait__RoundsRequest *req;
    READ_REQUEST(c, RoundsRequest, strait__rounds_request, req);
    int limit = req->limit == 0 || req->limit > ROUNDS_PAGE_MAX ? ROUNDS_PAGE_MAX : (int)req->limit;
    int64_t before = (int64_t)(req->before > INT64_MAX ? INT64_MAX : req->before);
    strait__rounds_request__free_unpacked(req, NULL);
    AdminRound *rounds;
    size_t n;
    char err[ERR_LEN];
    pthread_mutex_lock(&co->store_lock);
    int rc = admin_query_rounds(co->store, limit, before, time_wall_ms(), &rounds, &n, err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) {
        net_call_status(c, NET_INTERNAL, "%s", err);
        return;
    }
    Strait__RoundRow *rows = calloc(n ? n : 1, sizeof *rows);
    Strait__RoundRow **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    RowText *text = calloc(n ? n : 1, sizeof *text);
    if (rows && ptrs && text) {
        for (size_t i = 0; i < n; i++) {
            strait__round_row__init(&rows[i]);
            round_to_row(&rounds[i], &rows[i], text[i].lines, text[i].ptrs, 256);
            ptrs[i] = &rows[i];
        }
        Strait__RoundsResponse resp = STRAIT__ROUNDS_RESPONSE__INIT;
        resp.rounds = ptrs;
        resp.n_rounds = n;
        SEND_RESPONSE(c, strait__rounds_response, resp);
    } else {
        net_call_status(c, NET_RESOURCE_EXHAUSTED, "out of memory");
    }
    free(rows), free(ptrs), free(text), free(rounds);
}

static void h_round_updates(NetCall *c, void *user) {
    Coordinator *co = user;
    if (authorize_admin(co, c) != 0) return;
    Strait__RoundUpdatesRequest *req;
    READ_REQUEST(c, RoundUpdatesRequest, strait__round_updates_request, req);
    int64_t number = (int64_t)(req->number > INT64_MAX ? INT64_MAX : req->number);
    strait__round_updates_request__free_unpacked(req, NULL);
    AdminRound round;
    StoreUpdate *ups = NULL;
    size_t n = 0;
    char err[ERR_LEN];
    pthread_mutex_lock(&co->store_lock);
    int rc = admin_query_round(co->store, number, time_wall_ms(), &round, &ups, &n, err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc == STORE_NOT_FOUND) {
        net_call_status(c, NET_NOT_FOUND, "no round %lld in this federation", (long long)number);
        return;
    }
    if (rc != 0) {
        net_call_status(c, NET_INTERNAL, "%s", err);
        return;
    }
    Strait__RoundRow row = STRAIT__ROUND_ROW__INIT;
    RowText *text = malloc(sizeof *text);
    Strait__UpdateRow *rows = calloc(n ? n : 1, sizeof *rows);
    Strait__UpdateRow **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    if (text && rows && ptrs) {
        round_to_row(&round, &row, text->lines, text->ptrs, 256);
        for (size_t i = 0; i < n; i++) {
            Strait__UpdateRow *u = &rows[i];
            strait__update_row__init(u);
            u->site = ups[i].site_name;
            u->codec = ups[i].codec;
            u->raw_bytes = (uint64_t)ups[i].raw_bytes;
            u->wire_bytes = (uint64_t)ups[i].wire_bytes;
            u->tokens = (uint64_t)ups[i].tokens;
            u->train_loss = ups[i].train_loss;
            u->eval_loss = ups[i].eval_loss;
            u->train_ms = (uint64_t)ups[i].train_ms;
            u->upload_ms = (uint64_t)ups[i].upload_ms;
            u->state = ups[i].state;
            u->reason = ups[i].reason;
            u->received_at = ups[i].received_at;
            u->start_eval_loss = ups[i].start_eval_loss;
            u->download_ms = (uint64_t)ups[i].download_ms;
            u->decode_ms = (uint64_t)ups[i].decode_ms;
            u->eval_ms = (uint64_t)ups[i].eval_ms;
            u->encode_ms = (uint64_t)ups[i].encode_ms;
            u->staleness = (uint64_t)ups[i].staleness;
            u->wait_ms = ups[i].wait_ms;
            u->utilization = ups[i].utilization;
            ptrs[i] = u;
        }
        Strait__RoundUpdatesResponse resp = STRAIT__ROUND_UPDATES_RESPONSE__INIT;
        resp.round = &row;
        resp.updates = ptrs;
        resp.n_updates = n;
        SEND_RESPONSE(c, strait__round_updates_response, resp);
    } else {
        net_call_status(c, NET_RESOURCE_EXHAUSTED, "out of memory");
    }
    free(text), free(rows), free(ptrs), free(ups);
}

static void h_sites(NetCall *c, void *user) {
    Coordinator *co = user;
    if (authorize_admin(co, c) != 0) return;
    Strait__SitesRequest *req;
    READ_REQUEST(c, SitesRequest, strait__sites_request, req);
    strait__sites_request__free_unpacked(req, NULL);
    AdminSite *sites;
    size_t n;
    char err[ERR_LEN];
    pthread_mutex_lock(&co->store_lock);
    int rc = admin_query_sites(co->store, time_wall_ms(), &sites, &n, err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) {
        net_call_status(c, NET_INTERNAL, "%s", err);
        return;
    }
    Strait__SiteRow *rows = calloc(n ? n : 1, sizeof *rows);
    Strait__SiteRow **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    if (rows && ptrs) {
        for (size_t i = 0; i < n; i++) {
            strait__site_row__init(&rows[i]);
            rows[i].name = sites[i].s.name;
            rows[i].state = sites[i].s.state;
            rows[i].enrolled_at = sites[i].s.enrolled_at;
            rows[i].last_seen = sites[i].s.last_seen;
            rows[i].cert_not_after = sites[i].cert_not_after;
            rows[i].cert_serial = sites[i].s.cert_serial;
            rows[i].online = sites[i].online;
            ptrs[i] = &rows[i];
        }
        Strait__SitesResponse resp = STRAIT__SITES_RESPONSE__INIT;
        resp.sites = ptrs;
        resp.n_sites = n;
        SEND_RESPONSE(c, strait__sites_response, resp);
    } else {
        net_call_status(c, NET_RESOURCE_EXHAUSTED, "out of memory");
    }
    free(rows), free(ptrs), free(sites);
}

static void h_events(NetCall *c, void *user) {
    Coordinator *co = user;
    if (authorize_admin(co, c) != 0) return;
    Strait__EventsRequest *req;
    READ_REQUEST(c, EventsRequest, strait__events_request, req);
    int limit = req->limit == 0 || req->limit > ROUNDS_PAGE_MAX ? ROUNDS_PAGE_MAX : (int)req->limit;
    int64_t before = (int64_t)(req->before > INT64_MAX ? INT64_MAX : req->before);
    strait__events_request__free_unpacked(req, NULL);
    StoreEvent *ev;
    size_t n;
    char err[ERR_LEN];
    pthread_mutex_lock(&co->store_lock);
    int rc = store_events_list(co->store, limit, before, &ev, &n, err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) {
        net_call_status(c, NET_INTERNAL, "%s", err);
        return;
    }
    Strait__EventRow *rows = calloc(n ? n : 1, sizeof *rows);
    Strait__EventRow **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    if (rows && ptrs) {
        for (size_t i = 0; i < n; i++) {
            strait__event_row__init(&rows[i]);
            rows[i].id = (uint64_t)ev[i].id;
            rows[i].at = ev[i].at;
            rows[i].actor = ev[i].actor;
            rows[i].action = ev[i].action;
            rows[i].detail = ev[i].detail;
            ptrs[i] = &rows[i];
        }
        Strait__EventsResponse resp = STRAIT__EVENTS_RESPONSE__INIT;
        resp.events = ptrs;
        resp.n_events = n;
        SEND_RESPONSE(c, strait__events_response, resp);
    } else {
        net_call_status(c, NET_RESOURCE_EXHAUSTED, "out of memory");
    }
    free(rows), free(ptrs), free(ev);
}

/* The audit log's actor for an admin call: the certificate's name. */
static void admin_actor(NetCall *c, char *out, size_t len) {
    snprintf(out, len, "admin:%s", net_call_peer(c)->name);
}

static void h_enroll(NetCall *c, void *user) {
    Coordinator *co = user;
    if (authorize_admin(co, c) != 0) return;
    Strait__EnrollRequest *req;
    READ_REQUEST(c, EnrollRequest, strait__enroll_request, req);
    char token[65], err[ERR_LEN], actor[80], fp[65], adv[256], join[300], cmd[1000];
    admin_actor(c, actor, sizeof actor);
    int64_t ttl = (int64_t)(req->ttl_ms > INT64_MAX ? INT64_MAX : req->ttl_ms);
    int rc = coordinator_home_info(co->dir, fp, adv, sizeof adv, err);
    if (rc == 0) rc = coordinator_join_address(co->dir, join, sizeof join, err);
    if (rc == 0 && ttl == 0) rc = coordinator_token_ttl(co->dir, &ttl, err);
    if (rc == 0) {
        pthread_mutex_lock(&co->store_lock);
        rc = coordinator_enroll_store(co->store, req->site_name, ttl, actor, token, err);
        pthread_mutex_unlock(&co->store_lock);
    }
    if (rc != 0) {
        net_call_status(c, NET_FAILED_PRECONDITION, "%s", err);
        strait__enroll_request__free_unpacked(req, NULL);
        return;
    }
    log_info("admin", "%s enrolled site %s", actor, req->site_name);
    snprintf(cmd, sizeof cmd,
             "strait site join SITEDIR --name %s --coordinator %s --join %s --token %s "
             "--ca-sha256 %s",
             req->site_name, adv, join, token, fp);
    Strait__EnrollResponse resp = STRAIT__ENROLL_RESPONSE__INIT;
    resp.token = token;
    resp.join_command = cmd;
    SEND_RESPONSE(c, strait__enroll_response, resp);
    strait__enroll_request__free_unpacked(req, NULL);
}

static void h_revoke(NetCall *c, void *user) {
    Coordinator *co = user;
    if (authorize_admin(co, c) != 0) return;
    Strait__RevokeRequest *req;
    READ_REQUEST(c, RevokeRequest, strait__revoke_request, req);
    char err[ERR_LEN], actor[80];
    admin_actor(c, actor, sizeof actor);
    pthread_mutex_lock(&co->store_lock);
    int rc = store_site_revoke(co->store, req->site_name, actor, time_wall_ms(), err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) {
        net_call_status(c, NET_FAILED_PRECONDITION, "%s", err);
    } else {
        log_info("admin", "%s revoked site %s", actor, req->site_name);
        Strait__RevokeResponse resp = STRAIT__REVOKE_RESPONSE__INIT;
        SEND_RESPONSE(c, strait__revoke_response, resp);
    }
    strait__revoke_request__free_unpacked(req, NULL);
}

int admin_add_methods(Coordinator *co, NetServer *srv, char *err) {
    static const struct {
        const char *path;
        NetHandler handler;
    } methods[] = {
        {"/strait.Admin/Status", h_status},
        {"/strait.Admin/Rounds", h_rounds},
        {"/strait.Admin/RoundUpdates", h_round_updates},
        {"/strait.Admin/Sites", h_sites},
        {"/strait.Admin/Events", h_events},
        {"/strait.Admin/Enroll", h_enroll},
        {"/strait.Admin/Revoke", h_revoke},
    };
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (net_server_add_method(srv, methods[i].path, NET_UNARY,
                                  NET_REQUIRE_CERT | NET_USE_RESERVE, methods[i].handler, co,
                                  err) != 0)
            return -1;
    return 0;
}
