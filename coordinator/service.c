/*
 * service.c — the coordinator's service, as far as identity goes: Join
 * (enrollment by token and CSR, on the enrollment listener of net/enroll.c:
 * the gRPC port requires a certificate in its TLS handshake), Hello and
 * Renew; the lifecycle of the service (the Admin service is admin.c, the rounds rounds.c).
 *
 * Identity is the verified client certificate, looked up by its SHA-256
 * fingerprint on every call (coordinator_authorize_site, in round_calls.c
 * beside the calls that use it most, so the two files call one way) — never a field of a message —
 * so a revocation written to the store by `strait site revoke` refuses the very next call, also on
 * connections opened before it.
 *
 * Threading: handlers run on net/'s workers; the one store connection is
 * guarded by store_lock.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator_internal.h"
#include "net/net.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"
#include "util/util.h"

/* ---- identity ---------------------------------------------------------------- */

static int cert_record(const char *pem, StoreCert *out, char *err) {
    SecurityIdentity id;
    if (security_cert_identity(pem, &id, err) != 0) return -1;
    memset(out, 0, sizeof *out);
    snprintf(out->serial, sizeof out->serial, "%s", id.serial_hex);
    memcpy(out->sha256, id.sha256_hex, sizeof out->sha256);
    out->not_before = time_wall_ms() - 300000;
    out->not_after = id.not_after;
    return 0;
}

/* ---- Federation ----------------------------------------------------------------- */

/* Signs a site's CSR for `name` (the coordinator's choice, never the CSR's)
 * and describes the certificate for the store; NULL after setting the
 * call's status. The caller frees the PEM. */
static char *sign_site_csr(Coordinator *co, NetCall *c, const ProtobufCBinaryData *csr,
                           const char *name, StoreCert *rec) {
    char err[ERR_LEN], *cert = NULL;
    if (security_csr_sign(co->ca, co->ca_key, csr->data, csr->len, name, co->site_cert_days, &cert,
                          err) != 0) {
        net_call_status(c, NET_INVALID_ARGUMENT, "%s", err);
        return NULL;
    }
    if (cert_record(cert, rec, err) != 0) {
        net_call_status(c, NET_INTERNAL, "%s", err);
        free(cert);
        return NULL;
    }
    return cert;
}

/* Join failures per peer address in the minute since its first one (a
 * window of its own, not the clock's minute: a burst across a minute's
 * turn is still one burst): beyond the
 * federation's limit a join from the address is refused unless its token
 * is good (a token is 256 bits; this is for the signatures and rows a
 * stream of bad joins would cost, and a site behind the same NAT as a
 * flood still joins). Returns the address's count, or with record the
 * count after this failure; refused when it reaches the limit. */
static int join_failures(Coordinator *co, const char *addr, int record) {
    int64_t now = time_wall_ms();
    pthread_mutex_lock(&co->join_lock);
    struct JoinFailures *slot = NULL, *oldest = &co->join_failures[0];
    size_t n = sizeof co->join_failures / sizeof co->join_failures[0];
    for (size_t i = 0; i < n && !slot; i++) {
        struct JoinFailures *f = &co->join_failures[i];
        if (strcmp(f->addr, addr) == 0) slot = f;
        if (f->since < oldest->since) oldest = f;
    }
    if (slot == NULL && record) { /* the stalest slot makes room */
        slot = oldest;
        snprintf(slot->addr, sizeof slot->addr, "%s", addr);
        slot->count = 0, slot->since = now;
    }
    if (slot && now - slot->since >= 60000) slot->since = now, slot->count = 0;
    if (slot && record) slot->count++;
    int count = slot ? slot->count : 0;
    pthread_mutex_unlock(&co->join_lock);
    return count;
}

#define JOIN_ROWS 3 /* failed joins per address and minute that the audit log records */

/* A failed join: counted against the peer's address, and audited with it
 * for the first JOIN_ROWS of the minute (a flood writes no more rows). */
static void join_failed(Coordinator *co, const char *addr, const char *site, const char *why) {
    char detail[300];
    snprintf(detail, sizeof detail, "from %s: %s", addr, why);
    int n = join_failures(co, addr, 1);
    if (n > JOIN_ROWS) return;
    if (n == JOIN_ROWS)
        strncat(detail, " (later failures this minute are not recorded)",
                sizeof detail - strlen(detail) - 1);
    pthread_mutex_lock(&co->store_lock);
    store_event_add(co->store, site, "site.join_failed", detail, time_wall_ms(), NULL);
    pthread_mutex_unlock(&co->store_lock);
    log_warn("coordinator", "join of '%.64s' refused %s", site, detail);
}

/* Join, on the enrollment listener (net/enroll.c): a token and a CSR in,
 * a certificate out; the caller has no certificate yet. */
static void h_join(NetEnrollCall *c, void *user) {
    Coordinator *co = user;
    const char *addr = net_enroll_call_addr(c);
    int over = join_failures(co, addr, 0) >= co->join_limit;
    size_t len;
    const uint8_t *bytes = net_enroll_call_request(c, &len);
    Strait__JoinRequest *req = strait__join_request__unpack(NULL, len, bytes);
    if (req == NULL) {
        net_enroll_call_status(c, NET_INVALID_ARGUMENT, "malformed JoinRequest");
        return;
    }
    char err[ERR_LEN], *cert = NULL, name[80];
    StoreCert rec;
    snprintf(name, sizeof name, "%.64s", req->site_name);
    for (char *p = name; *p; p++) /* the audit log gets a printable name */
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
    if (!coordinator_valid_site_name(req->site_name)) {
        net_enroll_call_status(c, NET_INVALID_ARGUMENT,
                               "bad site name '%s'; use 1-64 letters, digits, '-', '_' or '.', "
                               "starting with a letter or a digit",
                               name);
        join_failed(co, addr, name, "bad site name");
        goto out;
    }
    if (strlen(req->token) != 64) {
        net_enroll_call_status(c, NET_INVALID_ARGUMENT, "malformed enrollment token");
        join_failed(co, addr, name, "malformed token");
        goto out;
    }
    uint8_t hash[SHA256_LEN];
    security_sha256(req->token, 64, hash);
    int64_t now = time_wall_ms();
    /* the token first, read only: a bad one costs no signature and no write lock */
    pthread_mutex_lock(&co->store_lock);
    StoreTokenResult r = store_token_check(co->store, hash, req->site_name, now, err);
    pthread_mutex_unlock(&co->store_lock);
    if (over && r != STORE_TOKEN_OK) { /* counted, not recorded, no signature */
        net_enroll_call_status(c, NET_RESOURCE_EXHAUSTED,
                               "too many failed joins from this address; wait a minute and check "
                               "the token");
        join_failures(co, addr, 1);
        goto out;
    }
    if (r == STORE_TOKEN_OK) {
        /* sign before consuming: a certificate whose token fails is never returned */
        if (security_csr_sign(co->ca, co->ca_key, req->csr_pem.data, req->csr_pem.len,
                              req->site_name, co->site_cert_days, &cert, err) != 0) {
            net_enroll_call_status(c, NET_INVALID_ARGUMENT, "%s", err);
            join_failed(co, addr, name, "bad CSR");
            goto out;
        }
        if (cert_record(cert, &rec, err) != 0) {
            net_enroll_call_status(c, NET_INTERNAL, "%s", err);
            goto out;
        }
        pthread_mutex_lock(&co->store_lock);
        r = store_token_consume(co->store, hash, req->site_name, now, &rec, NULL, err);
        if (r == STORE_TOKEN_OK)
            store_event_add(co->store, req->site_name, "site.join", rec.serial, now, NULL);
        pthread_mutex_unlock(&co->store_lock);
    }
    switch (r) {
    case STORE_TOKEN_OK:
        break;
    case STORE_TOKEN_ERROR:
        log_error("coordinator", "join of %s: %s", req->site_name, err);
        net_enroll_call_status(c, NET_INTERNAL, "the coordinator's store failed; retry later");
        goto out;
    case STORE_TOKEN_EXPIRED:
        net_enroll_call_status(c, NET_PERMISSION_DENIED,
                               "token expired; ask the federation's admin for a new one");
        join_failed(co, addr, name, "token expired");
        goto out;
    default:
        net_enroll_call_status(c, NET_PERMISSION_DENIED, "%s", store_token_result_str(r));
        join_failed(co, addr, name, store_token_result_str(r));
        goto out;
    }
    log_info("coordinator", "site %s joined (certificate %s)", req->site_name, rec.serial);
    Strait__JoinResponse resp = STRAIT__JOIN_RESPONSE__INIT;
    resp.certificate_pem.data = (uint8_t *)cert;
    resp.certificate_pem.len = strlen(cert);
    resp.ca_chain_pem.data = (uint8_t *)co->ca;
    resp.ca_chain_pem.len = strlen(co->ca);
    size_t n = strait__join_response__get_packed_size(&resp);
    uint8_t *packed = malloc(n ? n : 1);
    if (packed == NULL) {
        net_enroll_call_status(c, NET_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    strait__join_response__pack(&resp, packed);
    net_enroll_call_answer(c, packed, n);
    free(packed);
out:
    free(cert);
    strait__join_request__free_unpacked(req, NULL);
}

static void h_renew(NetCall *c, void *user) {
    Coordinator *co = user;
    StoreSite site;
    if (coordinator_authorize_site(co, c, &site) != 0) return;
    /* the certificate a renewal replaces stays valid for renew_overlap, and
     * no renewal is taken while one is: a site holds two valid certificates
     * at most, and renews at most once per overlap */
    int64_t now = time_wall_ms(), until = 0;
    pthread_mutex_lock(&co->store_lock);
    int found = store_cert_retiring(co->store, site.id, now, &until, NULL);
    pthread_mutex_unlock(&co->store_lock);
    if (found == 0 && until > now) {
        net_call_status(c, NET_RESOURCE_EXHAUSTED,
                        "site %s renewed less than %lld s ago; renew again in %lld s, once the "
                        "certificate that renewal replaced has retired ([security] "
                        "renew_overlap)",
                        site.name, (long long)(co->renew_overlap_ms / 1000),
                        (long long)((until - now + 999) / 1000));
        return;
    }
    Strait__RenewRequest *req;
    READ_REQUEST(c, RenewRequest, strait__renew_request, req);
    char err[ERR_LEN], *cert = NULL;
    StoreCert rec;
    /* the name is the one the caller's certificate proves, whatever the CSR says */
    cert = sign_site_csr(co, c, &req->csr_pem, site.name, &rec);
    if (cert == NULL) goto out;
    pthread_mutex_lock(&co->store_lock);
    int rc = store_cert_add(co->store, site.id, &rec, now + co->renew_overlap_ms, now, err);
    if (rc == 0)
        store_event_add(co->store, site.name, "site.renew", rec.serial, time_wall_ms(), NULL);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) {
        net_call_status(c, NET_FAILED_PRECONDITION, "%s", err);
        goto out;
    }
    Strait__RenewResponse resp = STRAIT__RENEW_RESPONSE__INIT;
    resp.certificate_pem.data = (uint8_t *)cert;
    resp.certificate_pem.len = strlen(cert);
    resp.ca_chain_pem.data = (uint8_t *)co->ca;
    resp.ca_chain_pem.len = strlen(co->ca);
    SEND_RESPONSE(c, strait__renew_response, resp);
out:
    free(cert);
    strait__renew_request__free_unpacked(req, NULL);
}

static void h_hello(NetCall *c, void *user) {
    Coordinator *co = user;
    StoreSite site;
    if (coordinator_authorize_site(co, c, &site) != 0) return;
    Strait__HelloRequest *req;
    READ_REQUEST(c, HelloRequest, strait__hello_request, req);
    if (req->protocol_version < COORD_PROTOCOL_VERSION) {
        net_call_status(c, NET_FAILED_PRECONDITION,
                        "this site speaks protocol %u and the coordinator needs %d; upgrade "
                        "strait at the site",
                        req->protocol_version, COORD_PROTOCOL_VERSION);
    } else if (co->rounds.set.secagg && req->protocol_version < COORD_PROTOCOL_SECAGG) {
        /* an older site would send plain updates, each refused */
        net_call_status(c, NET_FAILED_PRECONDITION,
                        "this federation runs secure aggregation, which this site's strait "
                        "(protocol %u) does not; upgrade strait at the site",
                        req->protocol_version);
    } else {
        Strait__HelloResponse resp = STRAIT__HELLO_RESPONSE__INIT;
        resp.protocol_version = COORD_PROTOCOL_VERSION;
        resp.federation = co->name;
        resp.site_name = site.name;
        resp.model = co->model;
        Strait__ModelShape shape = STRAIT__MODEL_SHAPE__INIT;
        shape.layers = (uint32_t)co->model_cfg.L, shape.channels = (uint32_t)co->model_cfg.C;
        shape.heads = (uint32_t)co->model_cfg.NH, shape.context = (uint32_t)co->model_cfg.T;
        shape.vocab = (uint32_t)co->model_cfg.V;
        char *config = model_config_json(&co->model_cfg);
        shape.config = config;
        resp.model_shape = &shape;
        uint8_t model_sha[32];
        rounds_describe(co, &resp, model_sha);
        SEND_RESPONSE(c, strait__hello_response, resp);
        free(config);
    }
    strait__hello_request__free_unpacked(req, NULL);
}

/* ---- lifecycle ---------------------------------------------------------------------- */

static int read_pem(const char *dir, const char *name, char **out, char *err) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return file_read_all(path, 1 << 20, out, NULL, err);
}

/* [metrics] tensorboard = DIR (relative: to the federation's folder): an
 * event file of this process's rounds there (TensorBoard reads the folder's
 * files as one run). */
static int tensorboard_open(Coordinator *co, const Config *cfg, char *err) {
    const char *tb = config_get(cfg, "metrics", "tensorboard");
    if (tb == NULL) return 0;
    if (!tb[0])
        return err_set(err, "federation.ini: [metrics] tensorboard is empty; name a folder for "
                            "TensorBoard's event files, or remove the key");
    char dir[2400];
    snprintf(dir, sizeof dir, "%s%s%s", tb[0] == '/' ? "" : co->dir, tb[0] == '/' ? "" : "/", tb);
    char why[ERR_LEN];
    if ((co->events = events_open(dir, why)) == NULL)
        return err_set(err, "federation.ini: [metrics] tensorboard: %s", why);
    log_info("coordinator", "TensorBoard: each round's scalars in %s (tensorboard --logdir %s)",
             events_path(co->events), dir);
    return 0;
}

static void coordinator_free(Coordinator *co) {
    events_close(co->events);
    if (co->store) store_close(co->store);
    free(co->ca), free(co->ca_key), free(co->server_chain), free(co->server_key);
    pthread_mutex_destroy(&co->store_lock);
    pthread_mutex_destroy(&co->join_lock);
}

/* federation.ini holds only keys this coordinator reads: a misspelt one
 * ("inner_step") is an error naming it, not a setting silently ignored. */
static int check_keys(const Config *cfg, char *err) {
    static const char *const federation[] = {"name",        "listen",         "advertise",
                                             "join_listen", "join_advertise", NULL};
    static const char *const model[] = {
        "preset", "seed",  "init",    "init_sha256", "source",     "source_sha256", "adapter",
        "rank",   "alpha", "targets", "rule",        "base_dtype", "dropout",       NULL};
    static const char *const rounds[] = {
        "total",        "min_sites",   "deadline",         "max_extensions", "aggregate",
        "trim",         "inner_steps", "time_budget",      "overlap",        "adaptive_deadline",
        "batch",        "seq",         "max_update_ratio", "norm_bound",     "clip",
        "weight_cap",   "mode",        "staleness",        "grace",          "lookahead",
        "robust_start", NULL};
    static const char *const recipe[] = {"name", NULL};
    static const char *const codec[] = {"uplink", "downlink", "density", "ef_decay", NULL};
    static const char *const optimizer[] = {"outer", "lr", "momentum", "eps", NULL};
    static const char *const security[] = {"site_cert_days", "token_ttl", "renew_overlap", NULL};
    static const char *const limits[] = {"workers",
                                         "calls_per_site",
                                         "admin_reserve",
                                         "spool",
                                         "spool_per_site",
                                         "upload_header",
                                         "upload_idle",
                                         "upload_life",
                                         "join_failures",
                                         "stream_window",
                                         "transport_memory",
                                         "upload_min_rate",
                                         "upload_grace",
                                         "refusals_per_round",
                                         "downloads_per_round",
                                         "connections",
                                         "connections_per_address",
                                         "connections_per_site_address",
                                         "streams_per_connection",
                                         "join_connections",
                                         "join_connections_per_address",
                                         NULL};
    static const char *const metrics[] = {"listen", "tensorboard", NULL};
    static const char *const store[] = {"keep_last", "keep_every", NULL};
    static const char *const privacy[] = {
        "dp",    "clip", "noise_multiplier", "delta", "epsilon_budget", "secure_aggregation",
        "range", "bits", "phase_timeout",    NULL};
    static const struct {
        const char *section;
        const char *const *keys;
    } known[] = {{"federation", federation}, {"model", model},         {"rounds", rounds},
                 {"codec", codec},           {"optimizer", optimizer}, {"security", security},
                 {"limits", limits},         {"metrics", metrics},     {"recipe", recipe},
                 {"store", store},           {"privacy", privacy}};
    const char *sections[sizeof known / sizeof known[0] + 1];
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        sections[i] = known[i].section;
        if (config_check_keys(cfg, known[i].section, known[i].keys, err) != 0) return -1;
    }
    sections[sizeof known / sizeof known[0]] = NULL;
    return config_check_sections(cfg, sections, err);
}

/* Where monitors on this machine reach a coordinator bound to listen: the
 * bound port, and loopback for a wildcard host. */
static void bound_address(const char *listen, int port, char *out, size_t len) {
    char host[256];
    const char *colon = strrchr(listen, ':');
    snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - listen) : 0, listen);
    int wildcard = !host[0] || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "[::]") == 0 ||
                   strcmp(host, "::") == 0;
    snprintf(out, len, "%.200s:%d", wildcard ? "127.0.0.1" : host, port);
}

/* [limits] stream_window: "auto" (the default: sized from the link) or
 * bytes, fixed. */
static int stream_window_read(const Config *cfg, int64_t *window, char *err) {
    const char *v = config_get(cfg, "limits", "stream_window");
    if (v == NULL || strcmp(v, "auto") == 0) {
        *window = NET_STREAM_WINDOW_AUTO;
        return 0;
    }
    if (strspn(v, "0123456789") != strlen(v))
        return err_set(err, "federation.ini: [limits] stream_window = '%s'; use auto or bytes", v);
    return config_get_int(cfg, "limits", "stream_window", 0, 65536, 1LL << 30, window, err);
}

/* [federation] listen, with the key named: the check alone speaks of an
 * address, as it does for strait init's --listen. */
static int check_listen_setting(const char *listen, char *err) {
    char why[ERR_LEN];
    if (coordinator_check_listen(listen, why) == 0) return 0;
    return err_set(err, "federation.ini: [federation] listen = %s: %s", listen, why);
}

/* [federation] join_listen: an address, and not the service's own port. */
static int check_join_listen_setting(const char *join, const char *listen, char *err) {
    char why[ERR_LEN];
    if (coordinator_check_listen(listen, why) != 0) return 0; /* listen's check says it */
    if (coordinator_check_listen(join, why) != 0)
        return err_set(err, "federation.ini: [federation] join_listen = %s: %s", join, why);
    const char *a = strrchr(join, ':'), *b = strrchr(listen, ':');
    if (atoi(a + 1) != 0 && atoi(a + 1) == atoi(b + 1))
        return err_set(err,
                       "federation.ini: [federation] join_listen = %s takes listen's port; "
                       "enrollment needs a port of its own (the default is listen's plus one)",
                       join);
    return 0;
}

int coordinator_run(const char *dir, void (*listening)(int port, void *ctx), void *ctx, char *err) {
    Coordinator co;
    memset(&co, 0, sizeof co);
    pthread_mutex_init(&co.store_lock, NULL);
    pthread_mutex_init(&co.join_lock, NULL);
    snprintf(co.dir, sizeof co.dir, "%s", dir);
    co.started_ms = time_wall_ms();
    char path[1100];
    snprintf(path, sizeof path, "%s/federation.ini", dir);
    Config *cfg = config_load(path, err);
    if (cfg == NULL) {
        coordinator_free(&co);
        return -1;
    }
    if (check_keys(cfg, err) != 0) {
        config_free(cfg);
        coordinator_free(&co);
        return -1;
    }
    int64_t days, workers, per_site, reserve, ttl_unused, window, conns, conns_addr, streams;
    int64_t conns_site_addr, transport;
    const char *listen = config_get_str(cfg, "federation", "listen", "0.0.0.0:7700");
    char listen_addr[256], join_listen[256];
    snprintf(listen_addr, sizeof listen_addr, "%s", listen);
    const char *jl = config_get(cfg, "federation", "join_listen");
    if (jl)
        snprintf(join_listen, sizeof join_listen, "%s", jl);
    else if (net_enroll_default_address(listen_addr, join_listen, sizeof join_listen) != 0)
        join_listen[0] = '\0'; /* the check of listen says why */
    int64_t join_total, join_per_addr;
    snprintf(co.name, sizeof co.name, "%s", config_get_str(cfg, "federation", "name", "strait"));
    /* every setting read and checked before anything changes (the store
     * marks an open round failed at start: not for a typo) */
    RoundsSettings rs;
    int bad = check_listen_setting(listen_addr, err) ||
              check_join_listen_setting(join_listen, listen_addr, err) ||
              config_get_int(cfg, "limits", "join_connections", NET_ENROLL_TOTAL_DEFAULT, 1, 1024,
                             &join_total, err) ||
              config_get_int(cfg, "limits", "join_connections_per_address",
                             NET_ENROLL_PER_ADDR_DEFAULT, 1, 1024, &join_per_addr, err) ||
              config_get_int(cfg, "security", "site_cert_days", 90, 1, 3650, &days, err) ||
              config_get_duration_ms(cfg, "security", "token_ttl", 0, &ttl_unused, err) ||
              config_get_duration_ms(cfg, "security", "renew_overlap", 600000, &co.renew_overlap_ms,
                                     err) ||
              config_get_int(cfg, "limits", "workers", 16, 2, 1024, &workers, err) ||
              config_get_int(cfg, "limits", "calls_per_site", NET_PER_PEER_DEFAULT, 1, 64,
                             &per_site, err) ||
              config_get_int(cfg, "limits", "admin_reserve", 2, 0, 64, &reserve, err) ||
              config_get_int(cfg, "limits", "join_failures", 10, 1, 100000, &co.join_limit, err) ||
              stream_window_read(cfg, &window, err) ||
              config_get_int(cfg, "limits", "transport_memory", NET_TRANSPORT_MEMORY_DEFAULT,
                             64LL << 20, 1LL << 40, &transport, err) ||
              config_get_int(cfg, "limits", "connections", 4096, 16, 1 << 20, &conns, err) ||
              config_get_int(cfg, "limits", "connections_per_address", 128, 1, 1 << 20, &conns_addr,
                             err) ||
              config_get_int(cfg, "limits", "connections_per_site_address", 512, 1, 1 << 20,
                             &conns_site_addr, err) ||
              config_get_int(cfg, "limits", "streams_per_connection", 32, 4, 1024, &streams, err) ||
              model_settings_read(cfg, &co, err) ||
              rounds_settings_read(cfg, &co.model_cfg, &rs, err);
    if (!bad && reserve >= workers)
        bad = err_set(err,
                      "federation.ini: [limits] admin_reserve = %lld; use fewer than workers "
                      "(%lld)",
                      (long long)reserve, (long long)workers);
    co.site_cert_days = (long)days;
    SecurityIdentity admin;
    char *admin_pem = NULL;
    if (bad || read_pem(dir, "ca.crt", &co.ca, err) || read_pem(dir, "ca.key", &co.ca_key, err) ||
        read_pem(dir, "server.crt", &co.server_chain, err) ||
        read_pem(dir, "server.key", &co.server_key, err) ||
        read_pem(dir, "admin.crt", &admin_pem, err) ||
        security_cert_identity(admin_pem, &admin, err)) {
        free(admin_pem);
        config_free(cfg);
        coordinator_free(&co);
        return -1;
    }
    free(admin_pem);
    memcpy(co.admin_sha, admin.sha256_hex, sizeof co.admin_sha);
    snprintf(path, sizeof path, "%s/%s", dir, STORE_DB_FILE);
    co.store = store_open(path, STORE_READWRITE, err);
    StoreRecovery rec;
    if (co.store == NULL || store_recover(co.store, dir, time_wall_ms(), &rec, err) != 0 ||
        tensorboard_open(&co, cfg, err) != 0 || rounds_start(&co, &rs, err) != 0) {
        config_free(cfg);
        coordinator_free(&co);
        return -1;
    }
    char metrics_listen[256];
    snprintf(metrics_listen, sizeof metrics_listen, "%s",
             config_get_str(cfg, "metrics", "listen", ""));
    config_free(cfg);
    net_global_init();
    NetServerConfig sc = {.listen = listen_addr,
                          .tls = {co.ca, co.server_chain, co.server_key},
                          .workers = (int)workers,
                          .per_peer = (int)per_site,
                          .reserve = (int)reserve,
                          .stream_window = (uint32_t)window,
                          .transport_memory = (size_t)transport,
                          .connections = {.total = (int)conns,
                                          .per_addr = (int)conns_addr,
                                          .trusted_per_addr = (int)conns_site_addr},
                          .max_streams = (int)streams};
    NetServer *srv = net_server_create(&sc, err);
    int port = 0;
    int rc = srv ? 0 : -1;
    if (rc == 0)
        rc = net_server_add_method(srv, "/strait.Federation/Renew", NET_UNARY, NET_REQUIRE_CERT,
                                   h_renew, &co, err) ||
             net_server_add_method(srv, "/strait.Federation/Hello", NET_UNARY, NET_REQUIRE_CERT,
                                   h_hello, &co, err) ||
             admin_add_methods(&co, srv, err) || rounds_add_methods(&co, srv, err) ||
             net_server_start(srv, &port, err);
    NetEnrollServer *enroll = NULL;
    int join_port = 0;
    if (rc == 0) {
        pthread_mutex_lock(&co.rounds.lock);
        co.server = srv;
        pthread_mutex_unlock(&co.rounds.lock);
        NetEnrollConfig ec = {.listen = join_listen,
                              .tls = {NULL, co.server_chain, co.server_key},
                              .total = (int)join_total,
                              .per_addr = (int)join_per_addr};
        enroll = net_enroll_start(&ec, h_join, &co, &join_port, err);
        if (enroll == NULL) {
            char why[ERR_LEN];
            snprintf(why, sizeof why, "%s", err);
            rc = err_set(err,
                         "the enrollment port: %s; set federation.ini's [federation] join_listen "
                         "(default: listen's port plus one)",
                         why);
        }
    }
    Metrics *metrics = NULL;
    if (rc == 0) {
        bound_address(listen_addr, port, co.address, sizeof co.address);
        bound_address(join_listen, join_port, co.join_address, sizeof co.join_address);
        snprintf(path, sizeof path, "%s/%s", dir, COORD_ADDR_FILE);
        if (file_write_atomic(path, co.address, strlen(co.address), 0644, err) != 0)
            log_warn("coordinator", "monitors will not find this coordinator: %s", err);
        snprintf(path, sizeof path, "%s/%s", dir, JOIN_ADDR_FILE);
        if (file_write_atomic(path, co.join_address, strlen(co.join_address), 0644, err) != 0)
            log_warn("coordinator", "enroll commands will not find the enrollment port: %s", err);
        if (metrics_listen[0] && (metrics = metrics_start(&co, metrics_listen, err)) == NULL)
            rc = -1;
        snprintf(path, sizeof path, "%s/%s", dir, METRICS_ADDR_FILE);
        if (metrics && file_write_atomic(path, metrics_address(metrics),
                                         strlen(metrics_address(metrics)), 0644, err) != 0)
            log_warn("coordinator", "cannot record where the metrics are: %s", err);
    }
    if (rc == 0) {
        log_info("coordinator", "federation %s serving on %s (port %d; enrollment on %s, port %d)",
                 co.name, listen_addr, port, join_listen, join_port);
        if (listening) listening(port, ctx);
        for (;;) {
            int sig = net_wait_signal(-1);
            if (sig == SIGINT || sig == SIGTERM) break;
        }
        log_info("coordinator", "stopping");
    }
    if (co.address[0]) {
        snprintf(path, sizeof path, "%s/%s", dir, COORD_ADDR_FILE);
        unlink(path);
        snprintf(path, sizeof path, "%s/%s", dir, JOIN_ADDR_FILE);
        unlink(path);
    }
    if (metrics) {
        snprintf(path, sizeof path, "%s/%s", dir, METRICS_ADDR_FILE);
        unlink(path);
    }
    metrics_stop(metrics);
    net_enroll_stop(enroll);
    rounds_release_waiters(&co); /* parked calls answered, the ticker stopped */
    net_server_stop(srv, 5000);
    rounds_stop(&co);
    coordinator_free(&co);
    /* the store is closed and every file written: a connection gRPC still
     * holds is not worth the stop's wait (a restart waits on it) */
    if (net_global_shutdown_within(2000)) {
        log_warn("coordinator", "gRPC still held connections 2 s after the stop; exiting "
                                "without waiting for them");
        if (rc != 0) log_error("coordinator", "%s", err); /* the command's line, said here */
        fflush(NULL);
        _exit(rc == 0 ? 0 : 1);
    }
    return rc;
}
