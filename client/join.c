/*
 * join.c — a site's identity: join (pin the CA, make the key here, send a
 * CSR with the one-time token), hello, and renewal. The private key is
 * created in this process and written 0600; it is never sent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "net/net.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"
#include "util/util.h"

#define CALL_TIMEOUT_MS 30000

typedef struct SiteFiles {
    char *key, *cert, *ca; /* owned PEM */
    char name[65];
    char coordinator[256];
} SiteFiles;

static void site_files_free(SiteFiles *f) {
    free(f->key), free(f->cert), free(f->ca);
    memset(f, 0, sizeof *f);
}

static int site_path(const char *dir, const char *name, char *out, size_t len) {
    return snprintf(out, len, "%s/%s", dir, name) < (int)len ? 0 : -1;
}

/* Finishes a renewal a crash interrupted (see client_renew). */
static void finish_renewal(const char *dir) {
    char from[1100], to[1100];
    const char *names[2][2] = {{"renew.key", "site.key"}, {"renew.crt", "site.crt"}};
    for (int i = 0; i < 2; i++) {
        site_path(dir, names[i][0], from, sizeof from);
        site_path(dir, names[i][1], to, sizeof to);
        if (access(from, F_OK) == 0) rename(from, to);
    }
}

static int site_load(const char *dir, SiteFiles *f, char *err) {
    memset(f, 0, sizeof *f);
    finish_renewal(dir);
    char path[1100];
    site_path(dir, "site.ini", path, sizeof path);
    Config *cfg = config_load(path, err);
    if (cfg == NULL) return -1;
    snprintf(f->name, sizeof f->name, "%s", config_get_str(cfg, "site", "name", ""));
    snprintf(f->coordinator, sizeof f->coordinator, "%s",
             config_get_str(cfg, "site", "coordinator", ""));
    config_free(cfg);
    if (!f->name[0] || !f->coordinator[0])
        return err_set(err, "%s lacks [site] name or coordinator; join again", path);
    const char *files[3] = {"site.key", "site.crt", "ca.crt"};
    char **out[3] = {&f->key, &f->cert, &f->ca};
    for (int i = 0; i < 3; i++) {
        site_path(dir, files[i], path, sizeof path);
        if (file_read_all(path, 1 << 20, out[i], NULL, err) != 0) {
            site_files_free(f);
            return -1;
        }
    }
    return 0;
}

static NetChannel *site_channel(const SiteFiles *f, int with_cert, char *err) {
    char target[300];
    net_target(f->coordinator, target, sizeof target);
    NetChannelConfig cc = {
        target, {f->ca, with_cert ? f->cert : NULL, with_cert ? f->key : NULL}, NULL, 0, 0};
    return net_channel_create(&cc, err);
}

static int write_site(const char *dir, const char *name, const char *text, int mode, char *err) {
    char path[1100];
    site_path(dir, name, path, sizeof path);
    return file_write_atomic(path, text, strlen(text), mode, err);
}

int client_join(const SiteJoinOptions *o, char *err) {
    char path[1100];
    site_path(o->site_dir, "site.ini", path, sizeof path);
    if (access(path, F_OK) == 0)
        return err_set(err, "%s already holds a joined site; use another folder", o->site_dir);
    if (strlen(o->token) != 64)
        return err_set(err, "the token must be the 64 hex digits printed by 'strait site enroll'");
    if (strlen(o->ca_sha256) != 64) return err_set(err, "--ca-sha256 must be 64 hex digits");
    SiteFiles f;
    memset(&f, 0, sizeof f);
    snprintf(f.name, sizeof f.name, "%s", o->name);
    snprintf(f.coordinator, sizeof f.coordinator, "%s", o->coordinator);
    char *csr = NULL, join[300];
    NetBuf resp = {NULL, 0};
    Strait__JoinResponse *jr = NULL;
    int rc = -1;
    if (o->join)
        snprintf(join, sizeof join, "%s", o->join);
    else if (net_enroll_default_address(o->coordinator, join, sizeof join) != 0)
        return err_set(err, "--coordinator '%s' is not HOST:PORT", o->coordinator);
    if (security_fetch_pinned_ca(join, o->ca_sha256, &f.ca, err) != 0) {
        if (strncmp(err, "cannot connect", 14) == 0) /* the port a firewall forgets */
            strncat(err,
                    "; is it the coordinator's enrollment port (--join: its port plus one by "
                    "default), open to this site?",
                    ERR_LEN - strlen(err) - 1);
        goto out;
    }
    if (security_csr_create(o->name, &csr, &f.key, err) != 0) goto out;
    Strait__JoinRequest req = STRAIT__JOIN_REQUEST__INIT;
    req.token = (char *)o->token;
    req.site_name = (char *)o->name;
    req.csr_pem.data = (uint8_t *)csr;
    req.csr_pem.len = strlen(csr);
    size_t n = strait__join_request__get_packed_size(&req);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL) {
        err_set(err, "out of memory for the join request");
        goto out;
    }
    strait__join_request__pack(&req, buf);
    char details[512];
    /* on the enrollment listener, verified against the CA just pinned */
    NetStatus st =
        net_enroll_call(join, f.ca, buf, n, &resp, CALL_TIMEOUT_MS, details, sizeof details);
    free(buf);
    if (st != NET_OK) {
        /* a token is spent by the join the coordinator answered, even one
         * whose answer this site then could not keep */
        err_set(err, "join refused (%s): %s%s", net_status_name(st), details,
                st == NET_PERMISSION_DENIED
                    ? "; ask the federation's operator to enroll this site again (strait site "
                      "enroll; for a site whose join was answered but not kept, strait site "
                      "revoke first)"
                    : "");
        goto out;
    }
    jr = strait__join_response__unpack(NULL, resp.len, resp.data);
    if (jr == NULL || jr->certificate_pem.len == 0) {
        err_set(err, "the coordinator's answer is malformed");
        goto out;
    }
    f.cert = strndup((const char *)jr->certificate_pem.data, jr->certificate_pem.len);
    SecurityIdentity id;
    if (f.cert == NULL || security_cert_identity(f.cert, &id, err) != 0) goto out;
    if (strcmp(id.name, o->name) != 0) {
        err_set(err, "the coordinator issued a certificate for '%s', not '%s'", id.name, o->name);
        goto out;
    }
    if (file_mkdir_p(o->site_dir, 0700, err) != 0) goto out;
    char ini[1024];
    snprintf(ini, sizeof ini,
             "; site.ini — written by `strait site join`.\n[site]\nname = %s\ncoordinator = %s\n",
             o->name, o->coordinator);
    /* site.ini last: its presence marks a joined site, so one that could
     * not be synced into place is taken away again */
    if (write_site(o->site_dir, "site.key", f.key, 0600, err) ||
        write_site(o->site_dir, "site.crt", f.cert, 0644, err) ||
        write_site(o->site_dir, "ca.crt", f.ca, 0644, err))
        goto out;
    if (write_site(o->site_dir, "site.ini", ini, 0644, err)) {
        unlink(path);
        goto out;
    }
    rc = 0;
out:
    if (jr) strait__join_response__free_unpacked(jr, NULL);
    net_buf_free(&resp);
    free(csr);
    site_files_free(&f);
    return rc;
}

int client_hello(const char *site_dir, SiteHello *out, char *err) {
    SiteFiles f;
    if (site_load(site_dir, &f, err) != 0) return -1;
    net_global_init();
    NetChannel *ch = site_channel(&f, 1, err);
    int rc = -1;
    if (ch == NULL) goto out;
    Strait__HelloRequest req = STRAIT__HELLO_REQUEST__INIT;
    req.protocol_version = CLIENT_PROTOCOL_VERSION;
    req.strait_version = "strait";
    uint8_t buf[256];
    size_t n = strait__hello_request__pack(&req, buf);
    NetBuf resp;
    char details[512];
    NetStatus st = net_unary(ch, "/strait.Federation/Hello", buf, n, &resp, CALL_TIMEOUT_MS,
                             details, sizeof details);
    if (st != NET_OK) {
        err_set(err, "hello refused (%s): %s", net_status_name(st), details);
        goto out;
    }
    Strait__HelloResponse *hr = strait__hello_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    if (hr == NULL) {
        err_set(err, "the coordinator's answer is malformed");
        goto out;
    }
    snprintf(out->federation, sizeof out->federation, "%s", hr->federation);
    snprintf(out->site_name, sizeof out->site_name, "%s", hr->site_name);
    snprintf(out->model, sizeof out->model, "%s", hr->model);
    strait__hello_response__free_unpacked(hr, NULL);
    rc = 0;
out:
    net_channel_destroy(ch);
    site_files_free(&f);
    return rc;
}

int client_renew(const char *site_dir, char *err) {
    SiteFiles f;
    if (site_load(site_dir, &f, err) != 0) return -1;
    char *csr = NULL, *key = NULL;
    int rc = -1;
    net_global_init();
    NetChannel *ch = site_channel(&f, 1, err);
    if (ch == NULL || security_csr_create(f.name, &csr, &key, err) != 0) goto out;
    Strait__RenewRequest req = STRAIT__RENEW_REQUEST__INIT;
    req.csr_pem.data = (uint8_t *)csr;
    req.csr_pem.len = strlen(csr);
    size_t n = strait__renew_request__get_packed_size(&req);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL) {
        err_set(err, "out of memory for the renewal request");
        goto out;
    }
    strait__renew_request__pack(&req, buf);
    NetBuf resp;
    char details[512];
    NetStatus st = net_unary(ch, "/strait.Federation/Renew", buf, n, &resp, CALL_TIMEOUT_MS,
                             details, sizeof details);
    free(buf);
    if (st != NET_OK) {
        err_set(err, "renewal refused (%s): %s", net_status_name(st), details);
        goto out;
    }
    Strait__RenewResponse *rr = strait__renew_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    if (rr == NULL) {
        err_set(err, "the coordinator's answer is malformed");
        goto out;
    }
    char *cert = strndup((const char *)rr->certificate_pem.data, rr->certificate_pem.len);
    strait__renew_response__free_unpacked(rr, NULL);
    /* both files land under temporary names, then are renamed; a crash
     * between the renames is finished by finish_renewal at the next load */
    if (cert == NULL) err_set(err, "out of memory for the renewed certificate");
    if (cert && write_site(site_dir, "renew.key", key, 0600, err) == 0 &&
        write_site(site_dir, "renew.crt", cert, 0644, err) == 0) {
        finish_renewal(site_dir);
        rc = 0;
    }
    free(cert);
out:
    net_channel_destroy(ch);
    free(csr), free(key);
    site_files_free(&f);
    return rc;
}
