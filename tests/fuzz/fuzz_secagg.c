/*
 * fuzz_secagg.c — libFuzzer target for what secure aggregation will take
 * from peers: Shamir shares (33 bytes each) and an X25519 public key.
 * Whatever the bytes, no crash and no leak; shares with a zero or repeated
 * x are refused, any others combined; a public key is agreed with or
 * refused (small order), never read past its 32 bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "privacy/privacy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    uint8_t secret[SECAGG_KEY];
    int k = (int)(size / SECAGG_SHARE);
    if (k > 255) k = 255;
    if (k > 0) {
        uint8_t(*shares)[SECAGG_SHARE] = malloc((size_t)k * SECAGG_SHARE);
        memcpy(shares, data, (size_t)k * SECAGG_SHARE);
        int ok = shamir_combine((const uint8_t(*)[SECAGG_SHARE])shares, k, secret, err) == 0;
        int distinct = 1;
        for (int i = 0; i < k && distinct; i++)
            for (int j = 0; j < i; j++) distinct &= shares[i][0] != shares[j][0];
        for (int i = 0; i < k; i++) distinct &= shares[i][0] != 0;
        if (ok != distinct) abort();
        free(shares);
    }
    if (size >= SECAGG_KEY) {
        static SecaggKeys me;
        static int made;
        if (!made && secagg_keygen(&me, err) == 0) made = 1;
        uint8_t seed[SECAGG_KEY];
        if (made) (void)secagg_agree(&me, data, "fuzz", seed, err);
    }
    return 0;
}
