/*
 * fuzz_secagg.c — libFuzzer target for what secure aggregation takes from
 * peers: Shamir shares (33 bytes each), an X25519 public key, a masked
 * update's bytes ("SAGM"), sealed envelopes of shares at a site, and
 * revealed shares at the coordinator. Whatever the bytes, no crash and no
 * leak; shares with a zero or repeated x are refused, any others combined;
 * a public key is agreed with or refused (small order); a masked update is
 * added only when it parses, and then exactly as long as it says;
 * envelopes and reveals are refused unless they check. And the
 * coordinator's distributed-DP parameters as a site takes them: refused,
 * or a scale, sensitivity and noise that fit the modulus, and a masked
 * update with its share of noise made from them.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "privacy/privacy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A cohort of 6 made once: site 0 for the envelopes, a coordinator past
 * its sum for the reveals. */
static SecaggParams P;
static SecaggAdvert AD[6];
static SecaggSite *SITE[6];
static int ready;

static void cohort(void) {
    char err[512];
    uint8_t shared[6] = {1, 1, 1, 1, 1, 1};
    if (secagg_params(6, 16, 1.0, "fuzz", &P, err) != 0) abort();
    for (int i = 0; i < 6; i++)
        if ((SITE[i] = secagg_site_new(&AD[i], err)) == NULL) abort();
    SecaggEnvelope env[SECAGG_MAX_DEGREE];
    int n;
    if (secagg_site_share(SITE[0], &P, 0, AD, env, &n, err) != 0) abort();
    (void)shared;
    ready = 1;
}

static void masked(const uint8_t *data, size_t size) {
    char err[512];
    SecaggMasked h;
    if (secagg_masked_parse(data, size, &h, err) != 0) return;
    if (secagg_masked_len(h.n, h.bits) != size) abort();
    uint32_t *sum = calloc(h.n ? h.n : 1, sizeof *sum);
    if (sum == NULL) return;
    secagg_masked_add(sum, data);
    free(sum);
}

static void envelopes(const uint8_t *data, size_t size) {
    char err[512];
    int n = (int)(size / (8 + SECAGG_BOX));
    if (n > SECAGG_MAX_DEGREE) n = SECAGG_MAX_DEGREE;
    SecaggEnvelope in[SECAGG_MAX_DEGREE];
    for (int e = 0; e < n; e++) {
        const uint8_t *b = data + e * (8 + SECAGG_BOX);
        in[e].from = (int8_t)b[0], in[e].to = (int8_t)b[4];
        memcpy(in[e].box, b + 8, SECAGG_BOX);
    }
    float x[4] = {0};
    uint32_t y[4];
    /* nothing a forger sends opens: the boxes need the pair's key */
    if (n > 0 && secagg_site_mask(SITE[0], AD, in, n, x, 4, y, NULL, err) == 0) abort();
}

static void reveals(const uint8_t *data, size_t size) {
    char err[512];
    uint8_t shared[6] = {1, 1, 1, 1, 1, 1}, survived[6];
    SecaggServer *v = secagg_server_new(&P, AD, shared, 4, err);
    if (v == NULL) return;
    uint32_t y[4] = {0};
    uint8_t blob[64];
    for (int i = 0; i < 6; i++) {
        secagg_masked_pack(y, 4, 16, (uint32_t)i, 0, blob);
        if (i < 5 && secagg_server_add(v, i, blob, secagg_masked_len(4, 16), err) != 0) abort();
    }
    if (secagg_server_close(v, survived, err) != 0) abort();
    int n = (int)(size / (2 + SECAGG_SHARE));
    if (n > SECAGG_MAX_DEGREE) n = SECAGG_MAX_DEGREE;
    SecaggReveal r[SECAGG_MAX_DEGREE];
    for (int e = 0; e < n; e++) {
        const uint8_t *b = data + e * (2 + SECAGG_SHARE);
        r[e].owner = (int8_t)b[0], r[e].key = b[1] & 1;
        memcpy(r[e].share, b + 2, SECAGG_SHARE);
    }
    (void)secagg_server_reveal(v, 1, r, n, err);
    float out[4];
    int summed;
    (void)secagg_server_unmask(v, out, &summed, err); /* short of shares, or checked */
    secagg_server_free(v);
}

/* clip, noise multiplier, range (doubles), noise sites, values (u32),
 * cohort and bits (bytes): what a SecAgg answer's fields carry */
static void dp_params(const uint8_t *data, size_t size) {
    char err[512];
    double clip, z, range;
    uint32_t noise_sites, dim;
    if (size < 34) return;
    memcpy(&clip, data, 8), memcpy(&z, data + 8, 8), memcpy(&range, data + 16, 8);
    memcpy(&noise_sites, data + 24, 4), memcpy(&dim, data + 28, 4);
    int n = data[32], bits = data[33];
    dim = dim % 64 + 1;
    SecaggParams p;
    if (secagg_params(n, bits, range, "fuzz", &p, err) != 0) return;
    if (secagg_params_dp(&p, clip, z, (int)noise_sites, dim, err) != 0) return;
    double top = ldexp(1, p.bits - 1) - 1;
    if (!(p.scale > 0) || !(p.l2 >= sqrt((double)dim)) || !(p.mu >= 0) || !isfinite(p.mu) ||
        !(n * (p.range * p.scale + 1) + 8 * p.noise * p.l2 * sqrt((double)n / p.noise_sites) <=
          top * (1 + 1e-9)) ||
        !(p.mu / p.noise_sites / 2 <= PRIVACY_POISSON_MAX * (1 + 1e-9)))
        abort();
    float x[64];
    uint32_t y[64];
    for (uint32_t i = 0; i < dim; i++) x[i] = (float)(clip * (i % 3 ? 1 : -1));
    if (secagg_quantize(x, dim, 1, p.range, p.scale, p.bits, y, err) != 0 ||
        privacy_skellam_add(y, dim, p.mu / p.noise_sites, p.bits, err) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    if (!ready) cohort();
    if (size > 1 && data[0] < 0x40) {
        switch (data[0] & 3) {
        case 0:
            masked(data + 1, size - 1);
            return 0;
        case 1:
            envelopes(data + 1, size - 1);
            return 0;
        case 2:
            reveals(data + 1, size - 1);
            return 0;
        default:
            dp_params(data + 1, size - 1);
            return 0;
        }
    }
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
