/*
 * service.c — the coordinator's gRPC service, as far as identity goes:
 * Join (enrollment by token and CSR), Hello and Renew; the lifecycle of the
 * service (the Admin service is admin.c, the rounds rounds.c).
 *
 * Identity is the verified client certificate, looked up by its SHA-256
 * fingerprint on every call — never a field of a message — so a revocation
 * written to the store by `strait site revoke` refuses the very next call,
 * also on connections opened before it.
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

/* ---- identity ------------------------------------------------------------------ */

/* The site behind the call's certificate, or a refusal set on the call. */
int coordinator_authorize_site(Coordinator *co, NetCall *c, StoreSite *site) {
    const NetPeer *p = net_call_peer(c);
    if (!p->has_cert) {
        net_call_status(c, NET_UNAUTHENTICATED, "a site certificate is required");
        return -1;
    }
    if (strcmp(p->sha256_hex, co->admin_sha) == 0) {
        net_call_status(c, NET_PERMISSION_DENIED, "the admin certificate is not a site's");
        return -1;
    }
    StoreCert cert;
    char err[ERR_LEN];
    int64_t now = time_wall_ms();
    pthread_mutex_lock(&co->store_lock);
    int rc = store_cert_find(co->store, p->sha256_hex, site, &cert, err);
    if (rc == 0 && strcmp(site->state, "active") == 0 && cert.revoked_at == 0)
        store_site_touch(co->store, site->id, now, NULL);
    pthread_mutex_unlock(&co->store_lock);
    if (rc < 0) {
        log_error("coordinator", "%s", err);
        net_call_status(c, NET_INTERNAL, "the coordinator's store failed; retry later");
        return -1;
    }
    if (rc == STORE_NOT_FOUND) {
        net_call_status(c, NET_UNAUTHENTICATED,
                        "certificate %.16s… was not issued to a site of this federation",
                        p->sha256_hex);
        return -1;
    }
    if (strcmp(site->state, "active") != 0 || cert.revoked_at != 0) {
        net_call_status(c, NET_PERMISSION_DENIED, "site %s is revoked", site->name);
        return -1;
    }
    if (cert.not_after <= now) {
        net_call_status(c, NET_UNAUTHENTICATED,
                        "the certificate of site %s has expired; enroll the site again",
                        site->name);
        return -1;
    }
    return 0;
}

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

static void h_join(NetCall *c, void *user) {
    Coordinator *co = user;
    Strait__JoinRequest *req;
    READ_REQUEST(c, JoinRequest, strait__join_request, req);
    char err[ERR_LEN], *cert = NULL;
    StoreCert rec;
    if (!coordinator_valid_site_name(req->site_name)) {
        net_call_status(c, NET_INVALID_ARGUMENT, "bad site name '%.64s'", req->site_name);
        goto out;
    }
    if (strlen(req->token) != 64) {
        net_call_status(c, NET_INVALID_ARGUMENT, "malformed enrollment token");
        goto out;
    }
    /* sign first: a certificate whose token fails is never returned */
    if (security_csr_sign(co->ca, co->ca_key, req->csr_pem.data, req->csr_pem.len, req->site_name,
                          co->site_cert_days, &cert, err) != 0) {
        net_call_status(c, NET_INVALID_ARGUMENT, "%s", err);
        goto out;
    }
    if (cert_record(cert, &rec, err) != 0) {
        net_call_status(c, NET_INTERNAL, "%s", err);
        goto out;
    }
    uint8_t hash[SHA256_LEN];
    security_sha256(req->token, 64, hash);
    int64_t now = time_wall_ms();
    pthread_mutex_lock(&co->store_lock);
    StoreTokenResult r = store_token_consume(co->store, hash, req->site_name, now, &rec, NULL, err);
    if (r == STORE_TOKEN_OK)
        store_event_add(co->store, req->site_name, "site.join", rec.serial, now, NULL);
    pthread_mutex_unlock(&co->store_lock);
    switch (r) {
    case STORE_TOKEN_OK:
        break;
    case STORE_TOKEN_ERROR:
        log_error("coordinator", "join of %s: %s", req->site_name, err);
        net_call_status(c, NET_INTERNAL, "the coordinator's store failed; retry later");
        goto out;
    case STORE_TOKEN_EXPIRED:
        net_call_status(c, NET_PERMISSION_DENIED,
                        "token expired; ask the federation's admin for a new one");
        goto out;
    default:
        net_call_status(c, NET_PERMISSION_DENIED, "%s", store_token_result_str(r));
        goto out;
    }
    log_info("coordinator", "site %s joined (certificate %s)", req->site_name, rec.serial);
    Strait__JoinResponse resp = STRAIT__JOIN_RESPONSE__INIT;
    resp.certificate_pem.data = (uint8_t *)cert;
    resp.certificate_pem.len = strlen(cert);
    resp.ca_chain_pem.data = (uint8_t *)co->ca;
    resp.ca_chain_pem.len = strlen(co->ca);
    SEND_RESPONSE(c, strait__join_response, resp);
out:
    free(cert);
    strait__join_request__free_unpacked(req, NULL);
}

static void h_renew(NetCall *c, void *user) {
    Coordinator *co = user;
    StoreSite site;
    if (coordinator_authorize_site(co, c, &site) != 0) return;
    Strait__RenewRequest *req;
    READ_REQUEST(c, RenewRequest, strait__renew_request, req);
    char err[ERR_LEN], *cert = NULL;
    StoreCert rec;
    /* the name is the one the caller's certificate proves, whatever the CSR says */
    cert = sign_site_csr(co, c, &req->csr_pem, site.name, &rec);
    if (cert == NULL) goto out;
    pthread_mutex_lock(&co->store_lock);
    int rc = store_cert_add(co->store, site.id, &rec, err);
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
    } else {
        Strait__HelloResponse resp = STRAIT__HELLO_RESPONSE__INIT;
        resp.protocol_version = COORD_PROTOCOL_VERSION;
        resp.federation = co->name;
        resp.site_name = site.name;
        resp.model = co->model;
        int finished = 0;
        const char *codec = "int8";
        rounds_describe(co, &resp.current_round, &resp.total_rounds, &resp.table_hash,
                        &resp.inner_steps, &resp.round_budget_ms, &finished, &codec);
        resp.finished = finished;
        resp.uplink_codec = (char *)codec;
        SEND_RESPONSE(c, strait__hello_response, resp);
    }
    strait__hello_request__free_unpacked(req, NULL);
}

/* ---- lifecycle ---------------------------------------------------------------------- */

static int read_pem(const char *dir, const char *name, char **out, char *err) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return file_read_all(path, 1 << 20, out, NULL, err);
}

static void coordinator_free(Coordinator *co) {
    if (co->store) store_close(co->store);
    free(co->ca), free(co->ca_key), free(co->server_chain), free(co->server_key);
    pthread_mutex_destroy(&co->store_lock);
}

/* federation.ini holds only keys this coordinator reads: a misspelt one
 * ("inner_step") is an error naming it, not a setting silently ignored. */
static int check_keys(const Config *cfg, char *err) {
    static const char *const federation[] = {"name", "listen", "advertise", NULL};
    static const char *const model[] = {"preset", "seed", NULL};
    static const char *const rounds[] = {"total",          "min_sites",   "deadline",
                                         "max_extensions", "aggregate",   "trim",
                                         "inner_steps",    "time_budget", NULL};
    static const char *const codec[] = {"uplink", NULL};
    static const char *const optimizer[] = {"outer", "lr", "momentum", NULL};
    static const char *const security[] = {"site_cert_days", "token_ttl", NULL};
    static const char *const limits[] = {"workers", NULL};
    static const char *const metrics[] = {"listen", NULL};
    static const struct {
        const char *section;
        const char *const *keys;
    } known[] = {{"federation", federation}, {"model", model},         {"rounds", rounds},
                 {"codec", codec},           {"optimizer", optimizer}, {"security", security},
                 {"limits", limits},         {"metrics", metrics}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (config_check_keys(cfg, known[i].section, known[i].keys, err) != 0) return -1;
    return 0;
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

int coordinator_run(const char *dir, void (*listening)(int port, void *ctx), void *ctx, char *err) {
    Coordinator co;
    memset(&co, 0, sizeof co);
    pthread_mutex_init(&co.store_lock, NULL);
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
    int64_t days, workers;
    const char *listen = config_get_str(cfg, "federation", "listen", "0.0.0.0:7700");
    char listen_addr[256];
    snprintf(listen_addr, sizeof listen_addr, "%s", listen);
    snprintf(co.name, sizeof co.name, "%s", config_get_str(cfg, "federation", "name", "strait"));
    snprintf(co.model, sizeof co.model, "%s", config_get_str(cfg, "model", "preset", "small"));
    int bad = config_get_int(cfg, "security", "site_cert_days", 90, 1, 3650, &days, err) ||
              config_get_int(cfg, "limits", "workers", 16, 1, 1024, &workers, err);
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
        rounds_start(&co, cfg, err) != 0) {
        config_free(cfg);
        coordinator_free(&co);
        return -1;
    }
    char metrics_listen[256];
    snprintf(metrics_listen, sizeof metrics_listen, "%s",
             config_get_str(cfg, "metrics", "listen", ""));
    config_free(cfg);
    net_global_init();
    NetServerConfig sc = {listen_addr, {co.ca, co.server_chain, co.server_key}, (int)workers, 0, 0};
    NetServer *srv = net_server_create(&sc, err);
    int port = 0;
    int rc = srv ? 0 : -1;
    if (rc == 0)
        rc =
            net_server_add_method(srv, "/strait.Federation/Join", NET_UNARY, 0, h_join, &co, err) ||
            net_server_add_method(srv, "/strait.Federation/Renew", NET_UNARY, 1, h_renew, &co,
                                  err) ||
            net_server_add_method(srv, "/strait.Federation/Hello", NET_UNARY, 1, h_hello, &co,
                                  err) ||
            admin_add_methods(&co, srv, err) || rounds_add_methods(&co, srv, err) ||
            net_server_start(srv, &port, err);
    Metrics *metrics = NULL;
    if (rc == 0) {
        bound_address(listen_addr, port, co.address, sizeof co.address);
        snprintf(path, sizeof path, "%s/%s", dir, COORD_ADDR_FILE);
        if (file_write_atomic(path, co.address, strlen(co.address), 0644, err) != 0)
            log_warn("coordinator", "monitors will not find this coordinator: %s", err);
        if (metrics_listen[0] && (metrics = metrics_start(&co, metrics_listen, err)) == NULL)
            rc = -1;
        snprintf(path, sizeof path, "%s/%s", dir, METRICS_ADDR_FILE);
        if (metrics && file_write_atomic(path, metrics_address(metrics),
                                         strlen(metrics_address(metrics)), 0644, err) != 0)
            log_warn("coordinator", "cannot record where the metrics are: %s", err);
    }
    if (rc == 0) {
        log_info("coordinator", "federation %s serving on %s (port %d)", co.name, listen_addr,
                 port);
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
    }
    if (metrics) {
        snprintf(path, sizeof path, "%s/%s", dir, METRICS_ADDR_FILE);
        unlink(path);
    }
    metrics_stop(metrics);
    net_server_stop(srv, 5000);
    rounds_stop(&co);
    coordinator_free(&co);
    net_global_shutdown();
    return rc;
}
