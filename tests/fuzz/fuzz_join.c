/*
 * fuzz_join.c — libFuzzer target for the Join request's untrusted part: the
 * CSR the coordinator parses, checks and (maybe) signs. Whatever the bytes,
 * no crash, no leak, and anything signed is for the name the coordinator
 * chose.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "security/security.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *ca, *ca_key;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    if (ca == NULL) {
        SecurityCertSpec spec = {"Fuzz CA", NULL, 1, 0, 0, 86400};
        if (security_cert_create(&spec, NULL, NULL, &ca, &ca_key, err) != 0) abort();
    }
    char *cert = NULL;
    if (security_csr_sign(ca, ca_key, data, size, "fuzz-site", 1, &cert, err) == 0) {
        SecurityIdentity id;
        if (security_cert_identity(cert, &id, err) != 0 || strcmp(id.name, "fuzz-site") != 0)
            abort();
        free(cert);
    }
    return 0;
}
