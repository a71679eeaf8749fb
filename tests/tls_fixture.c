/*
 * tls_fixture.c — see tls_fixture.h. Keys and certificates come from
 * security/'s real code (OpenSSL EVP/X509), not from canned files.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "security/security.h"
#include "tests/harness.h"
#include "tests/tls_fixture.h"
#include "util/util.h"

static void make(const SecurityCertSpec *spec, const char *ca, const char *ca_key, char **cert,
                 char **key) {
    char err[ERR_LEN];
    cr_assert_eq(security_cert_create(spec, ca, ca_key, cert, key, err), 0, "%s", err);
}

static void save(const TlsFixture *t, const char *name, const char *pem) {
    char err[ERR_LEN];
    cr_assert_eq(file_write_atomic(tls_fixture_path(t, name, 0), pem, strlen(pem), 0600, err), 0,
                 "%s", err);
}

void tls_fixture_init(TlsFixture *t) {
    memset(t, 0, sizeof *t);
    t->dir = harness_tmpdir("tls");
    long year = 365L * 86400;
    SecurityCertSpec ca = {"Strait test CA", NULL, 1, 0, 0, 10 * year};
    SecurityCertSpec server = {"coordinator", "DNS:localhost,IP:127.0.0.1", 0, 1, 0, year};
    SecurityCertSpec site = {"site-a", "DNS:site-a", 0, 0, 0, year};
    SecurityCertSpec foreign = {"Foreign CA", NULL, 1, 0, 0, year};
    make(&ca, NULL, NULL, &t->ca_cert, &t->ca_key);
    make(&server, t->ca_cert, t->ca_key, &t->server_cert, &t->server_key);
    make(&site, t->ca_cert, t->ca_key, &t->site_cert, &t->site_key);
    make(&foreign, NULL, NULL, &t->foreign_ca, &t->foreign_ca_key);
    make(&site, t->foreign_ca, t->foreign_ca_key, &t->foreign_cert, &t->foreign_key);
    save(t, "ca.crt", t->ca_cert);
    save(t, "site.crt", t->site_cert);
    save(t, "site.key", t->site_key);
}

void tls_fixture_fini(TlsFixture *t) {
    harness_rmtree(t->dir);
    free(t->dir);
    free(t->ca_cert), free(t->ca_key), free(t->server_cert), free(t->server_key);
    free(t->site_cert), free(t->site_key), free(t->foreign_ca), free(t->foreign_ca_key);
    free(t->foreign_cert), free(t->foreign_key);
}

const char *tls_fixture_path(const TlsFixture *t, const char *name, int slot) {
    static char buf[8][512];
    snprintf(buf[slot & 7], sizeof buf[0], "%s/%s", t->dir, name);
    return buf[slot & 7];
}
