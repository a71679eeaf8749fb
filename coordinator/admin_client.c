/*
 * admin_client.c — the caller's side of the Admin API, for the command
 * line: a channel with the admin certificate to the coordinator of a
 * federation folder (through the coordinator.addr it writes) or of an admin
 * kit (admin.ini), the calls turned into the store's own types, and the
 * kit's export. A federation folder whose coordinator is not running is
 * read from its store by the same admin_query_* the service runs.
 */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "coordinator_internal.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"

#define ADMIN_CALL_MS 15000
#define KIT_INI       "admin.ini"

struct Admin {
    char dir[1024];
    char where[1100]; /* the coordinator's address, or the store's path */
    NetChannel *ch;   /* NULL: reading the store */
    Store *store;
    char *ca, *cert, *key;
    char unreachable[600]; /* why a coordinator that listens did not answer ("": none) */
};

int admin_running(const Admin *a) {
    return a->ch != NULL;
}
const char *admin_where(const Admin *a) {
    return a->where;
}
const char *admin_unreachable(const Admin *a) {
    return a->unreachable[0] ? a->unreachable : NULL;
}

/* Whether something accepts TCP connections at host:port (a coordinator
 * that is running, whether or not it answers): a second at most. */
static int listening_at(const char *hostport) {
    char host[256], port[16];
    if (hostport_split(hostport, host, sizeof host, port, sizeof port) != 0) return 0;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    if (getaddrinfo(host, port, &hints, &res) != 0) return 0;
    int up = 0;
    for (struct addrinfo *r = res; r && !up; r = r->ai_next) {
        int fd = socket(r->ai_family, r->ai_socktype | SOCK_CLOEXEC, r->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        up = connect(fd, r->ai_addr, r->ai_addrlen) == 0;
        close(fd);
    }
    freeaddrinfo(res);
    return up;
}

void admin_close(Admin *a) {
    if (a == NULL) return;
    if (a->ch) net_channel_destroy(a->ch);
    if (a->store) store_close(a->store);
    free(a->ca), free(a->cert), free(a->key);
    free(a);
}

static int read_in(const char *dir, const char *name, char **out, char *err) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return file_read_all(path, 1 << 20, out, NULL, err);
}

static int exists_in(const char *dir, const char *name) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* A unary Admin call; the status becomes err's message. */
static int call(Admin *a, const char *method, const void *req, size_t len, NetBuf *resp,
                char *err) {
    char details[512] = "";
    NetStatus st = net_unary(a->ch, method, req, len, resp, ADMIN_CALL_MS, details, sizeof details);
    if (st == NET_OK) return 0;
    if (st == NET_NOT_FOUND) return err_set(err, "%s", details), STORE_NOT_FOUND;
    if (st == NET_UNAVAILABLE || st == NET_DEADLINE_EXCEEDED)
        return err_set(err, "the coordinator at %s does not answer (%s); is it running?", a->where,
                       details[0] ? details : net_status_name(st));
    return err_set(err, "%s: %s", net_status_name(st), details);
}

/* Packs any request message and calls. */
static int call_msg(Admin *a, const char *method, const ProtobufCMessage *req, NetBuf *resp,
                    char *err) {
    size_t n = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL) return err_set(err, "out of memory");
    protobuf_c_message_pack(req, buf);
    int rc = call(a, method, buf, n, resp, err);
    free(buf);
    return rc;
}

int admin_is_kit(const char *dir) {
    return exists_in(dir, KIT_INI);
}

Admin *admin_open(const char *dir, char *err) {
    Admin *a = calloc(1, sizeof *a);
    if (a == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    snprintf(a->dir, sizeof a->dir, "%s", dir);
    int kit = exists_in(dir, KIT_INI), home = exists_in(dir, "federation.ini");
    if (!kit && !home) {
        err_set(err,
                "%s is neither a federation folder ('strait init') nor an admin kit "
                "('strait admin export')",
                dir);
        admin_close(a);
        return NULL;
    }
    char addr[256] = "";
    if (kit) {
        char path[1100];
        snprintf(path, sizeof path, "%s/%s", dir, KIT_INI);
        Config *cfg = config_load(path, err);
        if (cfg == NULL) {
            admin_close(a);
            return NULL;
        }
        snprintf(addr, sizeof addr, "%s", config_get_str(cfg, "admin", "coordinator", ""));
        config_free(cfg);
        if (!addr[0]) {
            err_set(err, "%s lacks [admin] coordinator; export the kit again", path);
            admin_close(a);
            return NULL;
        }
    } else {
        char *text = NULL;
        if (read_in(dir, COORD_ADDR_FILE, &text, NULL) == 0) {
            snprintf(addr, sizeof addr, "%.*s", (int)strcspn(text, "\r\n"), text);
            free(text);
        }
    }
    if (addr[0] &&
        (read_in(dir, "ca.crt", &a->ca, err) || read_in(dir, "admin.crt", &a->cert, err) ||
         read_in(dir, "admin.key", &a->key, err))) {
        admin_close(a);
        return NULL;
    }
    if (addr[0]) {
        char target[300];
        net_target(addr, target, sizeof target);
        net_global_init();
        NetChannelConfig cc = {target, {a->ca, a->cert, a->key}, NULL, 0, 0};
        snprintf(a->where, sizeof a->where, "%s", addr);
        a->ch = net_channel_create(&cc, err);
        if (a->ch == NULL) {
            admin_close(a);
            return NULL;
        }
        /* a folder's coordinator may have died leaving its address behind:
         * one quick Status tells, and its store answers instead */
        if (home) {
            Strait__StatusRequest req = STRAIT__STATUS_REQUEST__INIT;
            NetBuf resp = {NULL, 0};
            char probe[ERR_LEN];
            if (call_msg(a, "/strait.Admin/Status", &req.base, &resp, probe) == 0)
                net_buf_free(&resp);
            else if (strstr(probe, "does not answer")) {
                /* nothing listening: stopped; a listener that does not
                 * answer is a coordinator this command cannot reach */
                if (listening_at(addr))
                    snprintf(a->unreachable, sizeof a->unreachable, "%s", probe);
                net_channel_destroy(a->ch);
                a->ch = NULL;
            } else {
                err_set(err, "%s", probe);
                admin_close(a);
                return NULL;
            }
        }
    }
    if (a->ch == NULL) {
        snprintf(a->where, sizeof a->where, "%s/%s", dir, STORE_DB_FILE);
        a->store = store_open(a->where, STORE_READONLY, err);
        if (a->store == NULL) {
            admin_close(a);
            return NULL;
        }
    }
    return a;
}

/* ---- conversions ------------------------------------------------------------------ */

static void join_lines(char *out, size_t size, char **items, size_t n) {
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(out);
        if (len + 1 >= size) break;
        snprintf(out + len, size - len, "%s%s", i ? "\n" : "", items[i]);
    }
}

static void row_to_round(const Strait__RoundRow *row, AdminRound *a) {
    memset(a, 0, sizeof *a);
    StoreRound *r = &a->r;
    r->id = (int64_t)row->id;
    r->number = (int64_t)row->number;
    r->attempt = row->attempt;
    snprintf(r->state, sizeof r->state, "%s", row->state);
    r->participants = row->participants;
    r->tokens = (int64_t)row->tokens;
    r->train_loss = row->train_loss;
    r->eval_loss = row->eval_loss;
    r->bytes_up = (int64_t)row->bytes_up;
    r->bytes_down = (int64_t)row->bytes_down;
    r->bytes_rejected = (int64_t)row->bytes_rejected;
    r->dense_bytes = (int64_t)row->dense_bytes;
    r->refusals_unrecorded = (int64_t)row->refusals_unrecorded;
    r->opened_at = row->opened_at;
    r->closed_at = row->closed_at;
    snprintf(r->failed_reason, sizeof r->failed_reason, "%s", row->failed_reason);
    snprintf(r->late, sizeof r->late, "%s", row->late);
    a->expected = row->expected;
    a->raw_bytes = (int64_t)row->raw_bytes;
    r->start_eval_loss = row->start_eval_loss;
    int dp = row->dp_delta > 0; /* a coordinator before privacy sends none */
    r->dp_noise = dp ? row->dp_noise : NAN;
    r->dp_epsilon = dp ? row->dp_epsilon : NAN;
    r->dp_delta = dp ? row->dp_delta : NAN;
    a->wall_ms = (int64_t)row->wall_ms;
    a->utilization = row->utilization;
    a->goodput = row->goodput;
    join_lines(a->missed, sizeof a->missed, row->missed, row->n_missed);
    join_lines(a->rejected, sizeof a->rejected, row->rejected, row->n_rejected);
}

/* ---- the calls --------------------------------------------------------------------- */

static int status_from_store(Admin *a, AdminStatus *st, char *err) {
    memset(st, 0, sizeof *st);
    char path[1100];
    snprintf(path, sizeof path, "%s/federation.ini", a->dir);
    Config *cfg = config_load(path, err);
    if (cfg == NULL) return -1;
    snprintf(st->federation, sizeof st->federation, "%s",
             config_get_str(cfg, "federation", "name", "strait"));
    snprintf(st->address, sizeof st->address, "%s",
             config_get_str(cfg, "federation", "listen", ""));
    snprintf(st->model, sizeof st->model, "%s",
             config_get(cfg, "model", "init") ? "pretrained"
                                              : config_get_str(cfg, "model", "preset", "small"));
    int rc = config_get_int(cfg, "rounds", "total", 10, 1, 1000000, &st->total_rounds, err);
    if (rc == 0) /* read, not checked: the coordinator's start says a bad one */
        config_get_int(cfg, "store", "keep_every", 0, 0, INT64_MAX, &st->keep_every, NULL);
    config_free(cfg);
    if (rc != 0 || admin_query_status(a->store, time_wall_ms(), st, err) != 0) return -1;
    StoreRound live;
    if (store_round_live(a->store, &live, NULL) == 0) {
        st->current_round = live.number;
        st->round_opened_at = live.opened_at;
    } else {
        st->current_round = st->last_commit_round + 1;
    }
    int done = st->last_commit_round + 1 >= st->total_rounds;
    if (done) st->current_round = st->last_commit_round;
    snprintf(st->round_state, sizeof st->round_state, "%s", done ? "finished" : "stopped");
    return 0;
}

int admin_status(Admin *a, AdminStatus *st, char *err) {
    if (a->store) return status_from_store(a, st, err);
    Strait__StatusRequest req = STRAIT__STATUS_REQUEST__INIT;
    NetBuf resp;
    int rc = call_msg(a, "/strait.Admin/Status", &req.base, &resp, err);
    if (rc != 0) return rc;
    Strait__StatusResponse *r = strait__status_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    if (r == NULL) return err_set(err, "the coordinator sent a malformed StatusResponse");
    memset(st, 0, sizeof *st);
    st->running = r->running;
    snprintf(st->federation, sizeof st->federation, "%s", r->federation);
    snprintf(st->address, sizeof st->address, "%s", r->address);
    snprintf(st->model, sizeof st->model, "%s", r->model);
    snprintf(st->round_state, sizeof st->round_state, "%s", r->round_state);
    st->model_params = (int64_t)r->model_params;
    st->started_at = r->started_at;
    st->uptime_ms = (int64_t)r->uptime_ms;
    st->rss_bytes = (int64_t)r->rss_bytes;
    st->current_round = (int64_t)r->current_round;
    st->total_rounds = (int64_t)r->total_rounds;
    st->round_opened_at = (int64_t)r->round_opened_at;
    st->sites_reported = r->sites_reported;
    st->sites_total = r->sites_total;
    st->sites_online = r->sites_online;
    st->sites_offline = r->sites_offline;
    st->sites_revoked = r->sites_revoked;
    st->last_commit_round = r->last_commit_round;
    st->last_commit_at = r->last_commit_at;
    st->last_eval_loss = r->last_eval_loss;
    st->dp_epsilon = r->dp_delta > 0 ? r->dp_epsilon : NAN;
    st->dp_delta = r->dp_delta > 0 ? r->dp_delta : NAN;
    st->totals.bytes_up = (int64_t)r->bytes_up;
    st->totals.bytes_down = (int64_t)r->bytes_down;
    st->totals.bytes_rejected = (int64_t)r->bytes_rejected;
    st->totals.dense_bytes = (int64_t)r->dense_bytes;
    st->totals.rounds_committed = (int64_t)r->rounds_committed;
    st->totals.rounds_failed = (int64_t)r->rounds_failed;
    st->totals.updates_rejected = (int64_t)r->updates_rejected;
    st->utilization = r->utilization;
    st->goodput = r->goodput;
    st->utilization_rounds = r->utilization_rounds;
    st->disk.used = (int64_t)r->disk_used;
    st->disk.free = r->disk_free;
    st->disk.round_bytes = (int64_t)r->disk_round_bytes;
    st->disk.kept = (int64_t)r->checkpoints_kept;
    st->disk.pruned = (int64_t)r->checkpoints_pruned;
    /* a coordinator older than the disk's fields sends none: unknown, not "room for 0" */
    st->disk_rounds_left = r->disk_round_bytes > 0 ? r->disk_rounds_left : -1;
    strait__status_response__free_unpacked(r, NULL);
    return 0;
}

/* One page: at most ADMIN_PAGE rows, as the service answers. */
#define ADMIN_PAGE 500

static int rounds_page(Admin *a, int limit, int64_t before, AdminRound **out, size_t *n,
                       char *err) {
    if (a->store) return admin_query_rounds(a->store, limit, before, time_wall_ms(), out, n, err);
    Strait__RoundsRequest req = STRAIT__ROUNDS_REQUEST__INIT;
    req.limit = limit > 0 ? (uint32_t)limit : 0;
    req.before = before > 0 ? (uint64_t)before : 0;
    NetBuf resp;
    int rc = call_msg(a, "/strait.Admin/Rounds", &req.base, &resp, err);
    if (rc != 0) return rc;
    Strait__RoundsResponse *r = strait__rounds_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    if (r == NULL) return err_set(err, "the coordinator sent a malformed RoundsResponse");
    *out = calloc(r->n_rounds ? r->n_rounds : 1, sizeof **out);
    if (*out == NULL) {
        strait__rounds_response__free_unpacked(r, NULL);
        return err_set(err, "out of memory");
    }
    for (size_t i = 0; i < r->n_rounds; i++) row_to_round(r->rounds[i], &(*out)[i]);
    *n = r->n_rounds;
    strait__rounds_response__free_unpacked(r, NULL);
    return 0;
}

int admin_rounds(Admin *a, int limit, int64_t before, AdminRound **out, size_t *n, char *err) {
    *out = NULL;
    *n = 0;
    while (limit > 0) {
        AdminRound *page;
        size_t got;
        int ask = limit < ADMIN_PAGE ? limit : ADMIN_PAGE;
        if (rounds_page(a, ask, before, &page, &got, err) != 0) {
            free(*out);
            *out = NULL, *n = 0;
            return -1;
        }
        AdminRound *all = realloc(*out, (*n + got + 1) * sizeof *all);
        if (all == NULL) {
            free(page), free(*out);
            *out = NULL, *n = 0;
            return err_set(err, "out of memory");
        }
        memcpy(all + *n, page, got * sizeof *all);
        free(page);
        *out = all, *n += got;
        if ((int)got < ask || got == 0) break; /* the oldest was reached */
        before = all[*n - 1].r.id;
        limit -= (int)got;
    }
    if (*out == NULL && (*out = calloc(1, sizeof **out)) == NULL)
        return err_set(err, "out of memory");
    return 0;
}

int admin_round_updates(Admin *a, int64_t number, AdminRound *round, StoreUpdate **ups, size_t *n,
                        char *err) {
    if (a->store) return admin_query_round(a->store, number, time_wall_ms(), round, ups, n, err);
    Strait__RoundUpdatesRequest req = STRAIT__ROUND_UPDATES_REQUEST__INIT;
    req.number = (uint64_t)number;
    NetBuf resp;
    int rc = call_msg(a, "/strait.Admin/RoundUpdates", &req.base, &resp, err);
    if (rc != 0) return rc;
    Strait__RoundUpdatesResponse *r =
        strait__round_updates_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    if (r == NULL || r->round == NULL) {
        if (r) strait__round_updates_response__free_unpacked(r, NULL);
        return err_set(err, "the coordinator sent a malformed RoundUpdatesResponse");
    }
    row_to_round(r->round, round);
    *ups = calloc(r->n_updates ? r->n_updates : 1, sizeof **ups);
    if (*ups == NULL) {
        strait__round_updates_response__free_unpacked(r, NULL);
        return err_set(err, "out of memory");
    }
    for (size_t i = 0; i < r->n_updates; i++) {
        const Strait__UpdateRow *u = r->updates[i];
        StoreUpdate *o = &(*ups)[i];
        o->round_id = round->r.id;
        snprintf(o->site_name, sizeof o->site_name, "%s", u->site);
        snprintf(o->codec, sizeof o->codec, "%s", u->codec);
        o->raw_bytes = (int64_t)u->raw_bytes;
        o->wire_bytes = (int64_t)u->wire_bytes;
        o->tokens = (int64_t)u->tokens;
        o->train_loss = u->train_loss;
        o->eval_loss = u->eval_loss;
        o->train_ms = (int64_t)u->train_ms;
        o->upload_ms = (int64_t)u->upload_ms;
        snprintf(o->state, sizeof o->state, "%s", u->state);
        snprintf(o->reason, sizeof o->reason, "%s", u->reason);
        o->received_at = u->received_at;
        o->start_eval_loss = u->start_eval_loss;
        o->download_ms = (int64_t)u->download_ms;
        o->decode_ms = (int64_t)u->decode_ms;
        o->eval_ms = (int64_t)u->eval_ms;
        o->encode_ms = (int64_t)u->encode_ms;
        o->staleness = u->staleness <= 1000000 ? (int64_t)u->staleness : 0;
        o->wait_ms = u->wait_ms;
        o->utilization = u->utilization;
    }
    *n = r->n_updates;
    strait__round_updates_response__free_unpacked(r, NULL);
    return 0;
}

int admin_sites(Admin *a, AdminSite **out, size_t *n, char *err) {
    if (a->store) return admin_query_sites(a->store, time_wall_ms(), out, n, err);
    Strait__SitesRequest req = STRAIT__SITES_REQUEST__INIT;
    NetBuf resp;
    int rc = call_msg(a, "/strait.Admin/Sites", &req.base, &resp, err);
    if (rc != 0) return rc;
    Strait__SitesResponse *r = strait__sites_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    if (r == NULL) return err_set(err, "the coordinator sent a malformed SitesResponse");
    *out = calloc(r->n_sites ? r->n_sites : 1, sizeof **out);
    if (*out == NULL) {
        strait__sites_response__free_unpacked(r, NULL);
        return err_set(err, "out of memory");
    }
    for (size_t i = 0; i < r->n_sites; i++) {
        const Strait__SiteRow *s = r->sites[i];
        AdminSite *o = &(*out)[i];
        snprintf(o->s.name, sizeof o->s.name, "%s", s->name);
        snprintf(o->s.state, sizeof o->s.state, "%s", s->state);
        snprintf(o->s.cert_serial, sizeof o->s.cert_serial, "%s", s->cert_serial);
        o->s.enrolled_at = s->enrolled_at;
        o->s.last_seen = s->last_seen;
        o->cert_not_after = s->cert_not_after;
        o->online = s->online;
    }
    *n = r->n_sites;
    strait__sites_response__free_unpacked(r, NULL);
    return 0;
}

int admin_events(Admin *a, int limit, int64_t before, StoreEvent **out, size_t *n, char *err) {
    if (a->store) return store_events_list(a->store, limit, before, out, n, err);
    Strait__EventsRequest req = STRAIT__EVENTS_REQUEST__INIT;
    req.limit = limit > 0 ? (uint32_t)limit : 0;
    req.before = before > 0 ? (uint64_t)before : 0;
    NetBuf resp;
    int rc = call_msg(a, "/strait.Admin/Events", &req.base, &resp, err);
    if (rc != 0) return rc;
    Strait__EventsResponse *r = strait__events_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    if (r == NULL) return err_set(err, "the coordinator sent a malformed EventsResponse");
    *out = calloc(r->n_events ? r->n_events : 1, sizeof **out);
    if (*out == NULL) {
        strait__events_response__free_unpacked(r, NULL);
        return err_set(err, "out of memory");
    }
    for (size_t i = 0; i < r->n_events; i++) {
        StoreEvent *e = &(*out)[i];
        e->id = (int64_t)r->events[i]->id;
        e->at = r->events[i]->at;
        snprintf(e->actor, sizeof e->actor, "%s", r->events[i]->actor);
        snprintf(e->action, sizeof e->action, "%s", r->events[i]->action);
        snprintf(e->detail, sizeof e->detail, "%s", r->events[i]->detail);
    }
    *n = r->n_events;
    strait__events_response__free_unpacked(r, NULL);
    return 0;
}

int admin_enroll(Admin *a, const char *site, int64_t ttl_ms, char token[65], char *join_cmd,
                 size_t join_len, char *err) {
    if (a->store) /* a federation folder: the folder's own enrollment */
        return err_set(err, "internal: enroll through coordinator_enroll for a folder");
    Strait__EnrollRequest req = STRAIT__ENROLL_REQUEST__INIT;
    req.site_name = (char *)site;
    req.ttl_ms = (uint64_t)ttl_ms;
    NetBuf resp;
    int rc = call_msg(a, "/strait.Admin/Enroll", &req.base, &resp, err);
    if (rc != 0) return -1;
    Strait__EnrollResponse *r = strait__enroll_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    if (r == NULL || strlen(r->token) != 64) {
        if (r) strait__enroll_response__free_unpacked(r, NULL);
        return err_set(err, "the coordinator sent a malformed EnrollResponse");
    }
    memcpy(token, r->token, 65);
    snprintf(join_cmd, join_len, "%s", r->join_command);
    strait__enroll_response__free_unpacked(r, NULL);
    return 0;
}

int admin_revoke(Admin *a, const char *site, char *err) {
    if (a->store) return err_set(err, "internal: revoke through coordinator_revoke for a folder");
    Strait__RevokeRequest req = STRAIT__REVOKE_REQUEST__INIT;
    req.site_name = (char *)site;
    NetBuf resp;
    int rc = call_msg(a, "/strait.Admin/Revoke", &req.base, &resp, err);
    if (rc != 0) return -1;
    net_buf_free(&resp);
    return 0;
}

/* ---- the kit ----------------------------------------------------------------------- */

int admin_export(const char *home, const char *out_dir, const char *address, char *err) {
    char fp[65], adv[256];
    if (coordinator_home_info(home, fp, adv, sizeof adv, err) != 0) return -1;
    char *bound = NULL;
    const char *colon = strrchr(adv, ':');
    if (address) {
        snprintf(adv, sizeof adv, "%s", address);
    } else if (colon && strtol(colon + 1, NULL, 10) == 0 &&
               read_in(home, COORD_ADDR_FILE, &bound, NULL) == 0) {
        /* a federation on a random port (the demo's): where it runs now */
        snprintf(adv, sizeof adv, "%.*s", (int)strcspn(bound, "\r\n"), bound);
        free(bound);
    }
    if (!strchr(adv, ':') || strchr(adv, '\n'))
        return err_set(err, "coordinator address '%s' is not HOST:PORT; pass --coordinator", adv);
    colon = strrchr(adv, ':');
    if (strtol(colon + 1, NULL, 10) <= 0)
        return err_set(err,
                       "the federation advertises %s, which has no fixed port; pass "
                       "--coordinator HOST:PORT",
                       adv);
    if (exists_in(out_dir, KIT_INI) || exists_in(out_dir, "admin.key"))
        return err_set(err, "%s already holds an admin kit; choose another folder", out_dir);
    if (file_mkdir_p(out_dir, 0700, err) != 0) return -1;
    if (chmod(out_dir, 0700) != 0)
        return err_set(err, "cannot make %s private: %s", out_dir, strerror(errno));
    const char *names[3] = {"ca.crt", "admin.crt", "admin.key"};
    const int modes[3] = {0644, 0644, 0600};
    for (int i = 0; i < 3; i++) {
        char *text, path[1100];
        if (read_in(home, names[i], &text, err) != 0) return -1;
        snprintf(path, sizeof path, "%s/%s", out_dir, names[i]);
        int rc = file_write_atomic(path, text, strlen(text), modes[i], err);
        free(text);
        if (rc != 0) return -1;
    }
    char ini[800], path[1100];
    snprintf(ini, sizeof ini,
             "; an admin kit of a Strait federation: 'strait rounds|status|round show|site list "
             "DIR'\n; work from here with the admin certificate. admin.key is a secret.\n"
             "[admin]\ncoordinator = %s\nca_sha256 = %s\n",
             adv, fp);
    snprintf(path, sizeof path, "%s/%s", out_dir, KIT_INI);
    if (file_write_atomic(path, ini, strlen(ini), 0644, err) != 0) return -1;
    Store *s;
    snprintf(path, sizeof path, "%s/%s", home, STORE_DB_FILE);
    if ((s = store_open(path, STORE_READWRITE, NULL)) != NULL) {
        store_event_add(s, "strait admin export", "admin.export", out_dir, time_wall_ms(), NULL);
        store_close(s);
    }
    return 0;
}
