/*
 * security.h — the API of security/: identity and trust, all through
 * OpenSSL 3 (no home-made crypto).
 *
 * For now: SHA-256 of memory and of files, which the store uses to pin
 * checkpoints; EC keys and X.509 certificates (a CA, certificates it signs,
 * the identity of a peer's certificate). Enrollment and revocation build on
 * these.
 */
#ifndef STRAIT_SECURITY_H
#define STRAIT_SECURITY_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_LEN     32
#define SHA256_HEX_LEN 65 /* 64 hex digits and a NUL */

void security_sha256(const void *data, size_t len, uint8_t out[SHA256_LEN]);
/* Lowercase hex of `len` bytes into hex (2*len+1 bytes); returns hex. */
char *security_hex(const uint8_t *bytes, size_t len, char *hex);
/* SHA-256 of a whole file, streamed; its size in *bytes (may be NULL).
 * Returns 0, or -1 with a message in err. */
int security_sha256_file(const char *path, char hex[SHA256_HEX_LEN], int64_t *bytes, char *err);
/* The same of an open file from its first byte (name: for messages), into
 * out; the file's position is left alone. */
int security_sha256_fd(int fd, const char *name, uint8_t out[SHA256_LEN], int64_t *bytes,
                       char *err);

/* ---- keys and certificates ----------------------------------------------- */

typedef struct SecurityCertSpec {
    const char *common_name;
    const char *sans;         /* "DNS:localhost,IP:127.0.0.1", or NULL */
    int is_ca;                /* a CA (CA:TRUE, keyCertSign) */
    int server;               /* serverAuth EKU, else clientAuth (ignored for a CA) */
    long not_before_offset_s; /* validity, relative to now */
    long not_after_offset_s;
} SecurityCertSpec;

/* A fresh EC P-256 key and a certificate for it, signed by the CA given in
 * PEM (or self-signed when ca_cert_pem is NULL), with a random 128-bit
 * serial. Outputs are malloc'd PEM strings. */
int security_cert_create(const SecurityCertSpec *spec, const char *ca_cert_pem,
                         const char *ca_key_pem, char **out_cert_pem, char **out_key_pem,
                         char *err);

typedef struct SecurityIdentity {
    char name[65]; /* subject CN */
    char serial_hex[80];
    char sha256_hex[SHA256_HEX_LEN]; /* fingerprint of the DER certificate */
    int64_t not_after;               /* ms since the epoch */
} SecurityIdentity;

int security_cert_identity(const char *cert_pem, SecurityIdentity *id, char *err);

/* A site's key (EC P-256, made here, never sent) and a plain CSR for name. */
int security_csr_create(const char *name, char **out_csr_pem, char **out_key_pem, char *err);
/* Signs a site's CSR (untrusted bytes): the key must be EC P-256, the CSR's
 * signature must verify, and it may ask for no extensions. The certificate
 * carries only what the coordinator decides: CN and SAN site_name,
 * clientAuth, CA:FALSE, a random serial, `days` of validity. */
int security_csr_sign(const char *ca_cert_pem, const char *ca_key_pem, const uint8_t *csr,
                      size_t csr_len, const char *site_name, long days, char **out_cert_pem,
                      char *err);

/* Connects to HOST:PORT with TLS and returns (malloc'd PEM) the CA in the
 * server's chain whose SHA-256 fingerprint is pinned_hex, after checking
 * the server's certificate is signed by it. Refuses any other CA. */
int security_fetch_pinned_ca(const char *host_port, const char *pinned_hex, char **ca_pem,
                             char *err);

#define SECURITY_TOKEN_HEX 65 /* 256 bits as hex, and a NUL */
/* An enrollment token: 256 bits from the OS's CSPRNG, as hex. */
int security_random_token(char hex[SECURITY_TOKEN_HEX], char *err);
/* Constant-time equality of secrets. */
int security_ct_equal(const void *a, const void *b, size_t len);

#endif /* STRAIT_SECURITY_H */
