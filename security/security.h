/*
 * security.h — the API of security/: identity and trust, all through
 * OpenSSL 3 (no home-made crypto).
 *
 * For now: SHA-256 of memory and of files, which the store uses to pin
 * checkpoints. The CA, enrollment, certificates and revocation land here
 * with the security issue.
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

#endif /* STRAIT_SECURITY_H */
