/*
 * test_security.c — enrollment and identity with real processes: `strait
 * init`, a running `strait coordinator start`, `strait site enroll/join/
 * hello/renew/revoke`, and gRPC clients holding whatever certificate a case
 * needs. Every refusal asserts its specific status and message.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "net/net.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"
#include "tests/harness.h"
#include "coordinator/coordinator.h"
#include "util/util.h"

static char *root, fed[600], site_dir[600];
static int coord_pid = -1, port;
static char ca_fp[65];

/* strait with the given arguments, as a real process */
#define S(...) harness_strait(__VA_ARGS__)

static void setup(void) {
    net_global_init();
    root = harness_tmpdir("sec");
    snprintf(fed, sizeof fed, "%s/fed", root);
    snprintf(site_dir, sizeof site_dir, "%s/site-alpha", root);
    ProcResult r = S("init", fed, "--listen", harness_listen(), "--name", "testfed");
    cr_assert_eq(r.status, 0, "init: %s", r.err);
    char *fp = strstr(r.out, "CA fingerprint (sites pin it): ");
    cr_assert_not_null(fp);
    memcpy(ca_fp, fp + 31, 64);
    ca_fp[64] = '\0';
    proc_result_free(&r);
    char *argv[] = {(char *)harness_strait_bin(), "coordinator", "start", fed, NULL};
    int fd;
    coord_pid = proc_spawn(argv, &fd);
    char line[256];
    cr_assert_gt(proc_read_line(fd, line, sizeof line, 20000), 0, "the coordinator did not start");
    cr_assert_eq(sscanf(strstr(line, "port "), "port %d", &port), 1, "%s", line);
    close(fd);
}

static void teardown(void) {
    if (coord_pid > 0) {
        int st = proc_stop(coord_pid, 10000);
        cr_expect_eq(st, 0, "the coordinator did not stop cleanly on SIGTERM (%d)", st);
    }
    harness_rmtree(root);
    free(root);
    net_global_shutdown();
}

TestSuite(security, .init = setup, .fini = teardown, .timeout = 120);

static char coord_addr[64];
static const char *coordinator(void) {
    snprintf(coord_addr, sizeof coord_addr, "127.0.0.1:%d", port);
    return coord_addr;
}

/* The token line of `strait site enroll`. */
static void enroll(const char *name, const char *ttl, char token[65]) {
    ProcResult r =
        ttl ? S("site", "enroll", fed, name, "--ttl", ttl) : S("site", "enroll", fed, name);
    cr_assert_eq(r.status, 0, "enroll: %s", r.err);
    char *nl = strchr(r.out, '\n');
    cr_assert_not_null(nl);
    memcpy(token, nl + 1, 64);
    token[64] = '\0';
    cr_assert_not_null(strstr(r.out, "strait site join SITEDIR --name "), "%s", r.out);
    proc_result_free(&r);
}

static ProcResult join(const char *dir, const char *name, const char *token, const char *fp) {
    char at[300], err[ERR_LEN];
    cr_assert_eq(coordinator_join_address(fed, at, sizeof at, err), 0, "%s", err);
    return S("site", "join", dir, "--name", name, "--coordinator", coordinator(), "--join", at,
             "--token", token, "--ca-sha256", fp);
}

/* One Join exchange on the coordinator's enrollment listener. */
static NetStatus join_call(const void *req, size_t n, NetBuf *resp, char *details, size_t len);

static char *read_text(const char *dir, const char *name) {
    char path[800], *data, err[ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(file_read_all(path, 1 << 20, &data, NULL, err), 0, "%s", err);
    return data;
}

static NetStatus join_call(const void *req, size_t n, NetBuf *resp, char *details, size_t len) {
    char at[300], err[ERR_LEN];
    cr_assert_eq(coordinator_join_address(fed, at, sizeof at, err), 0, "%s", err);
    char *ca = read_text(fed, "ca.crt");
    NetBuf none;
    NetStatus st = net_enroll_call(at, ca, req, n, resp ? resp : &none, 20000, details, len);
    if (!resp) net_buf_free(&none);
    free(ca);
    return st;
}

static NetChannel *channel_with(const char *cert, const char *key) {
    char *ca = read_text(fed, "ca.crt"), target[64], err[ERR_LEN];
    snprintf(target, sizeof target, "ipv4:127.0.0.1:%d", port);
    NetChannelConfig cc = {target, {ca, cert, key}, NULL, 0, 0};
    NetChannel *ch = net_channel_create(&cc, err);
    cr_assert_not_null(ch, "%s", err);
    free(ca);
    return ch;
}

static NetStatus hello(NetChannel *ch, uint32_t version, char *site_name, char *details) {
    Strait__HelloRequest req = STRAIT__HELLO_REQUEST__INIT;
    req.protocol_version = version;
    uint8_t buf[64];
    size_t n = strait__hello_request__pack(&req, buf);
    NetBuf resp;
    NetStatus st = net_unary(ch, "/strait.Federation/Hello", buf, n, &resp, 20000, details, 256);
    if (st == NET_OK) {
        Strait__HelloResponse *hr = strait__hello_response__unpack(NULL, resp.len, resp.data);
        cr_assert_not_null(hr);
        if (site_name) snprintf(site_name, 65, "%s", hr->site_name);
        strait__hello_response__free_unpacked(hr, NULL);
        net_buf_free(&resp);
    }
    return st;
}

static void joined_alpha(void) {
    char token[65];
    enroll("alpha", NULL, token);
    ProcResult r = join(site_dir, "alpha", token, ca_fp);
    cr_assert_eq(r.status, 0, "join: %s", r.err);
    cr_assert_not_null(strstr(r.out, "site alpha joined federation testfed"), "%s", r.out);
    proc_result_free(&r);
}

/* ---- the full path ----------------------------------------------------------------- */

Test(security, init_enroll_join_hello) {
    joined_alpha();
    ProcResult r = S("site", "hello", site_dir, "--json");
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_t *o = json_loads(r.out, 0, NULL);
    cr_assert_not_null(o, "%s", r.out);
    cr_assert_str_eq(json_string_value(json_object_get(o, "site")), "alpha");
    cr_assert_str_eq(json_string_value(json_object_get(o, "federation")), "testfed");
    json_decref(o);
    proc_result_free(&r);
    r = S("site", "list", fed, "--json");
    cr_assert_eq(r.status, 0);
    o = json_loads(r.out, 0, NULL);
    cr_assert_not_null(o, "%s", r.out);
    cr_assert_str_eq(json_string_value(json_object_get(o, "state")), "active");
    cr_assert(json_is_string(json_object_get(o, "last_seen")), "the coordinator never saw it");
    json_decref(o);
    proc_result_free(&r);
    /* renewal keeps the identity and switches the certificate */
    char *before = read_text(site_dir, "site.crt");
    r = S("site", "renew", site_dir);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    char *after = read_text(site_dir, "site.crt");
    cr_assert_str_neq(before, after);
    r = S("site", "hello", site_dir);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "knows this site as alpha"));
    proc_result_free(&r);
    free(before), free(after);
}

Test(security, keys_are_0600_and_init_refuses_to_overwrite) {
    joined_alpha();
    const char *keys[] = {"ca.key", "server.key", "admin.key"};
    char path[800];
    struct stat st;
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", fed, keys[i]);
        cr_assert_eq(stat(path, &st), 0);
        cr_assert_eq(st.st_mode & 0777, 0600, "%s is %o", keys[i], st.st_mode & 0777);
    }
    snprintf(path, sizeof path, "%s/site.key", site_dir);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    char *ca_before = read_text(fed, "ca.crt");
    ProcResult r = S("init", fed);
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "already holds a federation; pass --force"), "%s", r.err);
    proc_result_free(&r);
    char *ca_after = read_text(fed, "ca.crt");
    cr_assert_str_eq(ca_before, ca_after, "a refused init changed the CA");
    free(ca_before), free(ca_after);
}

/* ---- tokens --------------------------------------------------------------------------- */

Test(security, tokens_are_single_use_expiring_and_bound_to_a_name) {
    char token[65], dir2[700];
    enroll("alpha", NULL, token);
    ProcResult r = join(site_dir, "alpha", token, ca_fp);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    snprintf(dir2, sizeof dir2, "%s/again", root);
    r = join(dir2, "alpha", token, ca_fp);
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "PERMISSION_DENIED): token already used"), "%s", r.err);
    proc_result_free(&r);

    enroll("beta", NULL, token);
    snprintf(dir2, sizeof dir2, "%s/beta-as-gamma", root);
    r = join(dir2, "gamma", token, ca_fp);
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "token was issued for another site"), "%s", r.err);
    proc_result_free(&r);

    enroll("delta", "1s", token);
    usleep(1500000);
    snprintf(dir2, sizeof dir2, "%s/delta", root);
    r = join(dir2, "delta", token, ca_fp);
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "token expired"), "%s", r.err);
    proc_result_free(&r);

    r = join(dir2, "delta", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
             ca_fp);
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "unknown token"), "%s", r.err);
    cr_assert_neq(access(dir2, F_OK), 0, "a refused join left a site folder");
    proc_result_free(&r);
}

Test(security, join_refuses_a_coordinator_whose_ca_is_not_the_pinned_one) {
    char token[65];
    enroll("alpha", NULL, token);
    char wrong[65];
    memcpy(wrong, ca_fp, 65);
    wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
    ProcResult r = join(site_dir, "alpha", token, wrong);
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "not the pinned"), "%s", r.err);
    cr_assert_neq(access(site_dir, F_OK), 0);
    proc_result_free(&r);
    /* the token was not spent by the refused attempt */
    r = join(site_dir, "alpha", token, ca_fp);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
}

/* ---- identity on every call ------------------------------------------------------------- */

Test(security, calls_without_or_with_foreign_certificates_are_refused) {
    joined_alpha();
    char details[256];
    /* without a certificate the TLS handshake itself fails: no call is made */
    NetChannel *ch = channel_with(NULL, NULL);
    cr_assert_eq(hello(ch, 1, NULL, details), NET_UNAVAILABLE, "%s", details);
    net_channel_destroy(ch);
    /* a certificate from another CA, even with the right name */
    char *fca, *fca_key, *fcert, *fkey, err[ERR_LEN];
    SecurityCertSpec ca = {"Other CA", NULL, 1, 0, 0, 86400};
    SecurityCertSpec leaf = {"alpha", "DNS:alpha", 0, 0, 0, 86400};
    cr_assert_eq(security_cert_create(&ca, NULL, NULL, &fca, &fca_key, err), 0);
    cr_assert_eq(security_cert_create(&leaf, fca, fca_key, &fcert, &fkey, err), 0);
    ch = channel_with(fcert, fkey);
    cr_assert_eq(hello(ch, 1, NULL, details), NET_UNAVAILABLE, "%s", details);
    net_channel_destroy(ch);
    /* a certificate of our CA that the coordinator never issued to a site */
    char *fed_ca = read_text(fed, "ca.crt"), *fed_key = read_text(fed, "ca.key"), *c2, *k2;
    cr_assert_eq(security_cert_create(&leaf, fed_ca, fed_key, &c2, &k2, err), 0);
    ch = channel_with(c2, k2);
    cr_assert_eq(hello(ch, 1, NULL, details), NET_UNAUTHENTICATED, "%s", details);
    cr_assert_not_null(strstr(details, "was not issued to a site"), "%s", details);
    net_channel_destroy(ch);
    /* an expired certificate of our CA fails the handshake */
    SecurityCertSpec old = {"alpha", "DNS:alpha", 0, 0, -3 * 86400, -86400};
    char *c3, *k3;
    cr_assert_eq(security_cert_create(&old, fed_ca, fed_key, &c3, &k3, err), 0);
    ch = channel_with(c3, k3);
    cr_assert_eq(hello(ch, 1, NULL, details), NET_UNAVAILABLE, "%s", details);
    net_channel_destroy(ch);
    free(fca), free(fca_key), free(fcert), free(fkey), free(fed_ca), free(fed_key);
    free(c2), free(k2), free(c3), free(k3);
}

Test(security, identity_comes_from_the_certificate_not_the_message) {
    joined_alpha();
    char *cert = read_text(site_dir, "site.crt"), *key = read_text(site_dir, "site.key");
    NetChannel *ch = channel_with(cert, key);
    char name[65], details[256];
    cr_assert_eq(hello(ch, 1, name, details), NET_OK, "%s", details);
    cr_assert_str_eq(name, "alpha");
    /* alpha asks for a certificate in the name of beta: it gets alpha's */
    char *csr, *csr_key, err[ERR_LEN];
    cr_assert_eq(security_csr_create("beta", &csr, &csr_key, err), 0);
    Strait__RenewRequest req = STRAIT__RENEW_REQUEST__INIT;
    req.csr_pem.data = (uint8_t *)csr;
    req.csr_pem.len = strlen(csr);
    uint8_t buf[4096];
    size_t n = strait__renew_request__pack(&req, buf);
    NetBuf resp;
    cr_assert_eq(net_unary(ch, "/strait.Federation/Renew", buf, n, &resp, 20000, details, 256),
                 NET_OK, "%s", details);
    Strait__RenewResponse *rr = strait__renew_response__unpack(NULL, resp.len, resp.data);
    cr_assert_not_null(rr);
    char *issued = strndup((char *)rr->certificate_pem.data, rr->certificate_pem.len);
    SecurityIdentity id;
    cr_assert_eq(security_cert_identity(issued, &id, err), 0);
    cr_assert_str_eq(id.name, "alpha", "a site got a certificate for another name");
    strait__renew_response__free_unpacked(rr, NULL);
    net_buf_free(&resp);
    /* and an old protocol version is told to upgrade */
    cr_assert_eq(hello(ch, 0, NULL, details), NET_FAILED_PRECONDITION);
    cr_assert_not_null(strstr(details, "upgrade strait at the site"), "%s", details);
    net_channel_destroy(ch);
    free(cert), free(key), free(csr), free(csr_key), free(issued);
}

Test(security, a_revoked_site_is_refused_on_new_and_open_connections) {
    joined_alpha();
    char *cert = read_text(site_dir, "site.crt"), *key = read_text(site_dir, "site.key");
    NetChannel *open = channel_with(cert, key);
    char details[256];
    cr_assert_eq(hello(open, 1, NULL, details), NET_OK, "%s", details);
    ProcResult r = S("site", "revoke", fed, "alpha");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    cr_assert_eq(hello(open, 1, NULL, details), NET_PERMISSION_DENIED, "%s", details);
    /* refused by the call's own check ("site alpha is revoked"), or, when
     * the call is still in flight at the once-a-second sweep, cancelled by
     * it ("this site has been revoked") */
    cr_assert(strstr(details, "site alpha is revoked") || strstr(details, "has been revoked"), "%s",
              details);
    NetChannel *fresh = channel_with(cert, key);
    cr_assert_eq(hello(fresh, 1, NULL, details), NET_PERMISSION_DENIED, "%s", details);
    net_channel_destroy(open);
    net_channel_destroy(fresh);
    r = S("site", "hello", site_dir);
    cr_assert_eq(r.status, 1);
    cr_assert_not_null(strstr(r.err, "revoked"), "%s", r.err);
    proc_result_free(&r);
    free(cert), free(key);
}

Test(security, admin_calls_need_the_admin_certificate) {
    joined_alpha();
    char *cert = read_text(site_dir, "site.crt"), *key = read_text(site_dir, "site.key");
    char *acert = read_text(fed, "admin.crt"), *akey = read_text(fed, "admin.key");
    char details[256];
    NetChannel *ch = channel_with(cert, key);
    NetStatus st = net_unary(ch, "/strait.Admin/Status", "", 0, NULL, 20000, details, 256);
    cr_assert_eq(st, NET_PERMISSION_DENIED, "%s: %s", net_status_name(st), details);
    net_channel_destroy(ch);
    ch = channel_with(acert, akey);
    NetBuf resp;
    st = net_unary(ch, "/strait.Admin/Status", "", 0, &resp, 20000, details, 256);
    cr_assert_eq(st, NET_OK, "%s", details);
    Strait__StatusResponse *sr = strait__status_response__unpack(NULL, resp.len, resp.data);
    cr_assert_not_null(sr);
    cr_assert_str_eq(sr->federation, "testfed");
    cr_assert_eq(sr->sites_total, 1);
    strait__status_response__free_unpacked(sr, NULL);
    net_buf_free(&resp);
    /* the admin certificate is not a site */
    cr_assert_eq(hello(ch, 1, NULL, details), NET_PERMISSION_DENIED, "%s", details);
    net_channel_destroy(ch);
    free(cert), free(key), free(acert), free(akey);
}

Test(security, a_malformed_csr_is_refused_and_spends_no_token) {
    char token[65];
    enroll("alpha", NULL, token);
    char err[ERR_LEN], details[256];
    Strait__JoinRequest req = STRAIT__JOIN_REQUEST__INIT;
    req.token = token;
    req.site_name = "alpha";
    req.csr_pem.data = (uint8_t *)"-----BEGIN CERTIFICATE REQUEST-----\ngarbage\n";
    req.csr_pem.len = strlen((char *)req.csr_pem.data);
    uint8_t buf[8192];
    size_t n = strait__join_request__pack(&req, buf);
    NetStatus st = join_call(buf, n, NULL, details, sizeof details);
    cr_assert_eq(st, NET_INVALID_ARGUMENT, "%s: %s", net_status_name(st), details);
    cr_assert_not_null(strstr(details, "not a PEM CSR"), "%s", details);
    /* the token still works with a proper request, and the CSR's own name is ignored */
    char *csr, *key;
    cr_assert_eq(security_csr_create("someone-else", &csr, &key, err), 0);
    req.csr_pem.data = (uint8_t *)csr;
    req.csr_pem.len = strlen(csr);
    n = strait__join_request__pack(&req, buf);
    NetBuf resp;
    st = join_call(buf, n, &resp, details, sizeof details);
    cr_assert_eq(st, NET_OK, "%s: %s", net_status_name(st), details);
    Strait__JoinResponse *jr = strait__join_response__unpack(NULL, resp.len, resp.data);
    char *issued = strndup((char *)jr->certificate_pem.data, jr->certificate_pem.len);
    SecurityIdentity id;
    cr_assert_eq(security_cert_identity(issued, &id, err), 0);
    cr_assert_str_eq(id.name, "alpha");
    strait__join_response__free_unpacked(jr, NULL);
    net_buf_free(&resp);
    free(csr), free(key), free(issued);
}

/* Every field of a Join is a stranger's claim (no certificate yet): bytes
 * that are not a JoinRequest, a name with control characters (refused,
 * and audited with them replaced), a token of the wrong length and one
 * that was never issued are each refused with their reason and issue no
 * certificate; the same holds for Renew and Hello bytes from a site that
 * has one; and the honest join that follows is taken. */
Test(security, a_hostile_join_renew_and_hello_are_refused_field_by_field) {
    char token[65], details[256];
    enroll("alpha", NULL, token);
    NetBuf resp = {NULL, 0};
    NetStatus st = join_call("\xff\xff\xff\x01", 4, &resp, details, sizeof details);
    cr_assert_eq(st, NET_INVALID_ARGUMENT, "%s: %s", net_status_name(st), details);
    cr_assert_not_null(strstr(details, "malformed JoinRequest"), "%s", details);
    cr_assert_null(resp.data);
    static const struct {
        const char *name, *token;
        NetStatus want;
        const char *why;
    } cases[] = {
        {"al\x01pha", NULL, NET_INVALID_ARGUMENT, "bad site name 'al?pha'"},
        {"alpha", "abc", NET_INVALID_ARGUMENT, "malformed enrollment token"},
        {"alpha", "00000000000000000000000000000000000000000000000000000000000000ff",
         NET_PERMISSION_DENIED, "unknown token"},
    };
    char *csr, *key, err[ERR_LEN];
    cr_assert_eq(security_csr_create("alpha", &csr, &key, err), 0, "%s", err);
    uint8_t buf[8192];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Strait__JoinRequest req = STRAIT__JOIN_REQUEST__INIT;
        req.token = (char *)(cases[i].token ? cases[i].token : token);
        req.site_name = (char *)cases[i].name;
        req.csr_pem.data = (uint8_t *)csr;
        req.csr_pem.len = strlen(csr);
        size_t n = strait__join_request__pack(&req, buf);
        st = join_call(buf, n, &resp, details, sizeof details);
        cr_assert_eq(st, cases[i].want, "%s: %s: %s", cases[i].name, net_status_name(st), details);
        cr_assert_not_null(strstr(details, cases[i].why), "want '%s', got '%s'", cases[i].why,
                           details);
        cr_assert_null(resp.data, "a refused join was answered with a certificate");
    }
    ProcResult ev = S("events", fed, "--last", "100");
    cr_assert_not_null(strstr(ev.out, "al?pha"), "the audit log lacks the printable name:\n%s",
                       ev.out);
    cr_assert_null(strstr(ev.out, "al\x01pha"), "a control character reached the audit log");
    proc_result_free(&ev);
    free(csr), free(key);
    /* the token was spent by none of them */
    ProcResult r = join(site_dir, "alpha", token, ca_fp);
    cr_assert_eq(r.status, 0, "join after the refusals: %s", r.err);
    proc_result_free(&r);
    /* a site with a certificate sending bytes that are not its request */
    char *cert = read_text(site_dir, "site.crt"), *skey = read_text(site_dir, "site.key");
    NetChannel *ch = channel_with(cert, skey);
    st = net_unary(ch, "/strait.Federation/Renew", "\xff\xff\xff\x01", 4, &resp, 20000, details,
                   sizeof details);
    cr_assert_eq(st, NET_INVALID_ARGUMENT, "%s: %s", net_status_name(st), details);
    cr_assert_not_null(strstr(details, "malformed RenewRequest"), "%s", details);
    st = net_unary(ch, "/strait.Federation/Hello", "\xff\xff\xff\x01", 4, &resp, 20000, details,
                   sizeof details);
    cr_assert_eq(st, NET_INVALID_ARGUMENT, "%s: %s", net_status_name(st), details);
    cr_assert_not_null(strstr(details, "malformed HelloRequest"), "%s", details);
    char name[65];
    cr_assert_eq(hello(ch, 1, name, details), NET_OK, "%s", details);
    cr_assert_str_eq(name, "alpha");
    net_channel_destroy(ch);
    free(cert), free(skey);
}
