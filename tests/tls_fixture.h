/*
 * tls_fixture.h — a throwaway PKI for the transport tests: the federation CA
 * with a server certificate (localhost, 127.0.0.1) and a site's client
 * certificate, and a second, foreign CA with a client certificate of its
 * own. PEM strings in memory, and the same written to files in `dir` for
 * helper processes.
 */
#ifndef STRAIT_TESTS_TLS_FIXTURE_H
#define STRAIT_TESTS_TLS_FIXTURE_H

typedef struct TlsFixture {
    char *dir; /* owned; removed by tls_fixture_fini */
    char *ca_cert, *ca_key;
    char *server_cert, *server_key;
    char *site_cert, *site_key; /* CN "site-a", signed by the CA */
    char *foreign_ca, *foreign_ca_key;
    char *foreign_cert, *foreign_key; /* CN "site-a" too, signed by the foreign CA */
} TlsFixture;

void tls_fixture_init(TlsFixture *t);
void tls_fixture_fini(TlsFixture *t);
/* "<dir>/<name>" in a static buffer per call slot (0-7). */
const char *tls_fixture_path(const TlsFixture *t, const char *name, int slot);

#endif
