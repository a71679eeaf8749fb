/*
 * test_secagg.c — secure aggregation's arithmetic (privacy/secagg.c) run as
 * SecAgg+ runs it, sites and coordinator in one process: the unmasked sum
 * equals the plain sum of the quantized updates exactly for 2 to 16 sites,
 * with none, one and several sites dropping after masking; below the
 * threshold the seeds are not recovered; a masked update is uniform; the
 * shared-scale quantization is unbiased; bad keys and shares are refused.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "privacy/privacy.h"
#include "tests/harness.h"
#include "util/util.h"

enum { N_MAX = 16, LEN = 5000, BITS = 20 };
#define CONTEXT "fed/round-0/attempt-1" /* what binds a pair's seed to its round */

typedef struct Site {
    SecaggKeys keys;
    uint8_t self_seed[SECAGG_KEY];
    /* shares of its self seed and its private key, one per site (the
     * neighbours' rows are the ones dealt) */
    uint8_t seed_share[N_MAX][SECAGG_SHARE], key_share[N_MAX][SECAGG_SHARE];
    uint32_t q[LEN], y[LEN];
} Site;

static int degree(int n) { /* SecAgg+'s k: about 2 log2 n, even, at most n − 1 */
    int k = 2 * (int)ceil(log2((double)n));
    return k >= n - 1 ? n - 1 : k;
}

/* Site i's masked update: q + PRG(self seed) ± PRG(pair seed) per neighbour. */
static void mask_site(Site *s, int i, int n, int k) {
    char err[ERR_LEN];
    memcpy(s[i].y, s[i].q, sizeof s[i].y);
    cr_assert_eq(secagg_mask(s[i].y, LEN, BITS, s[i].self_seed, 1, err), 0, "%s", err);
    for (int j = 0; j < n; j++) {
        if (!secagg_neighbours(i, j, n, k)) continue;
        uint8_t seed[SECAGG_KEY];
        cr_assert_eq(secagg_agree(&s[i].keys, s[j].keys.pub, CONTEXT, seed, err), 0, "%s", err);
        cr_assert_eq(secagg_mask(s[i].y, LEN, BITS, seed, secagg_sign(i, j), err), 0, "%s", err);
    }
}

/* A secret from the shares that site `owner` dealt to itself and its
 * neighbours, those of them alive (at most t, as the coordinator would
 * ask): the number combined, fewer than t when too few are left (then the
 * secret is not the one dealt). */
static int recover(Site *s, int owner, int n, int k, int t, const int *alive, int key,
                   uint8_t secret[SECAGG_KEY]) {
    uint8_t got[N_MAX][SECAGG_SHARE];
    int m = 0;
    for (int j = 0; j < n && m < t; j++)
        if (alive[j] && (j == owner || secagg_neighbours(owner, j, n, k)))
            memcpy(got[m++], key ? s[owner].key_share[j] : s[owner].seed_share[j], SECAGG_SHARE);
    char err[ERR_LEN];
    cr_assert_gt(m, 0);
    cr_assert_eq(shamir_combine((const uint8_t(*)[SECAGG_SHARE])got, m, secret, err), 0, "%s", err);
    return m;
}

/* One round of n sites of which those `dropped` drop after masking. The
 * coordinator unmasks with what shares are left: 0 when each secret had t
 * (the sum must then be the plain sum), -1 when one had fewer (it must not
 * be: a secret from t − 1 shares is not the secret). */
static int round_of(int n, const int *dropped) {
    char err[ERR_LEN];
    /* a majority of each neighbourhood, the site itself among it */
    int k = degree(n), t = (k + 1) / 2 + 1;
    Site *s = calloc((size_t)n, sizeof *s);
    for (int i = 0; i < n; i++) cr_assert_eq(secagg_keygen(&s[i].keys, err), 0, "%s", err);
    for (int i = 0; i < n; i++) {
        harness_fill(s[i].self_seed, SECAGG_KEY, 1000 + (uint64_t)i);
        uint8_t all[N_MAX][SECAGG_SHARE];
        cr_assert_eq(shamir_split(s[i].self_seed, t, n, all, err), 0, "%s", err);
        memcpy(s[i].seed_share, all, sizeof all[0] * (size_t)n);
        cr_assert_eq(shamir_split(s[i].keys.priv, t, n, all, err), 0, "%s", err);
        memcpy(s[i].key_share, all, sizeof all[0] * (size_t)n);
        float x[LEN];
        for (int v = 0; v < LEN; v++) x[v] = (float)sin(0.37 * v + i) * 0.9f;
        cr_assert_eq(secagg_quantize(x, LEN, 1, 1.0, secagg_scale(BITS, n, 1.0), BITS, s[i].q, err),
                     0, "%s", err);
        mask_site(s, i, n, k);
    }
    int alive[N_MAX];
    for (int i = 0; i < n; i++) alive[i] = !dropped[i];
    uint32_t sum[LEN] = {0}, plain[LEN] = {0}, mod = (1u << BITS) - 1;
    for (int i = 0; i < n; i++)
        if (alive[i])
            for (int v = 0; v < LEN; v++)
                sum[v] = (sum[v] + s[i].y[v]) & mod, plain[v] = (plain[v] + s[i].q[v]) & mod;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        uint8_t secret[SECAGG_KEY];
        if (alive[i]) { /* its self mask goes */
            if (recover(s, i, n, k, t, alive, 0, secret) < t) rc = -1;
            secagg_mask(sum, LEN, BITS, secret, -1, err);
            continue;
        }
        /* a dropped site: its key, and the pair masks its neighbours added */
        if (recover(s, i, n, k, t, alive, 1, secret) < t) rc = -1;
        SecaggKeys back;
        memcpy(back.pub, s[i].keys.pub, SECAGG_KEY), memcpy(back.priv, secret, SECAGG_KEY);
        for (int j = 0; j < n; j++) {
            if (!alive[j] || !secagg_neighbours(i, j, n, k)) continue;
            uint8_t seed[SECAGG_KEY];
            cr_assert_eq(secagg_agree(&back, s[j].keys.pub, CONTEXT, seed, err), 0, "%s", err);
            secagg_mask(sum, LEN, BITS, seed, -secagg_sign(j, i), err);
        }
    }
    if (rc == 0)
        cr_assert_eq(memcmp(sum, plain, sizeof sum), 0,
                     "%d sites: the unmasked sum is not the plain sum", n);
    else
        cr_assert_neq(memcmp(sum, plain, sizeof sum), 0,
                      "%d sites: unmasked from fewer than t shares", n);
    free(s);
    return rc;
}

Test(secagg, the_unmasked_sum_is_the_plain_sum_for_2_to_16_sites_with_and_without_drops) {
    for (int n = 2; n <= N_MAX; n++) {
        int none[N_MAX] = {0}, one[N_MAX] = {0}, several[N_MAX] = {0};
        cr_assert_eq(round_of(n, none), 0, "%d sites, none dropped", n);
        if (n < 4) continue; /* a neighbourhood of 2 or 3 cannot lose one of its 2 needed */
        one[n / 2] = 1;
        cr_assert_eq(round_of(n, one), 0, "%d sites, one dropped", n);
        if (n < 9) continue;
        several[1] = several[n / 2] = 1; /* apart: each neighbourhood loses one */
        cr_assert_eq(round_of(n, several), 0, "%d sites, two dropped", n);
    }
}

/* Too many of a neighbourhood gone: the coordinator holds fewer than t
 * shares of a dropped site's key, and what it combines from them is not
 * the key: the sum it gets is not the sum (the protocol fails the round,
 * counting the shares it holds against t). */
Test(secagg, below_the_threshold_the_round_cannot_be_unmasked) {
    int n = 8, dropped[N_MAX] = {0}; /* k = 6, t = 4: site 2 keeps neighbours 0, 1, 7 */
    dropped[2] = dropped[3] = dropped[4] = dropped[5] = 1;
    cr_assert_eq(round_of(n, dropped), -1);
}

Test(secagg, shamir_gives_the_secret_from_any_t_shares_and_not_from_fewer) {
    uint8_t secret[SECAGG_KEY], got[SECAGG_KEY], shares[10][SECAGG_SHARE];
    char err[ERR_LEN];
    harness_fill(secret, sizeof secret, 7);
    cr_assert_eq(shamir_split(secret, 4, 10, shares, err), 0, "%s", err);
    for (int first = 0; first + 4 <= 10; first++) {
        cr_assert_eq(shamir_combine((const uint8_t(*)[SECAGG_SHARE])shares + first, 4, got, err), 0,
                     "%s", err);
        cr_assert_eq(memcmp(got, secret, sizeof got), 0, "shares %d..%d", first, first + 3);
    }
    cr_assert_eq(shamir_combine((const uint8_t(*)[SECAGG_SHARE])shares, 3, got, err), 0);
    cr_assert_neq(memcmp(got, secret, sizeof got), 0, "three shares of a 4-of-10 split");
    /* peers' bytes: an x of zero, or twice the same, is refused */
    uint8_t bad[2][SECAGG_SHARE];
    memcpy(bad[0], shares[0], SECAGG_SHARE), memcpy(bad[1], shares[0], SECAGG_SHARE);
    cr_assert_eq(shamir_combine((const uint8_t(*)[SECAGG_SHARE])bad, 2, got, err), -1);
    cr_assert_not_null(strstr(err, "repeated"), "%s", err);
    bad[1][0] = 0;
    cr_assert_eq(shamir_combine((const uint8_t(*)[SECAGG_SHARE])bad, 2, got, err), -1);
    cr_assert_eq(shamir_split(secret, 1, 10, shares, err), -1);
    cr_assert_eq(shamir_split(secret, 11, 10, shares, err), -1);
}

/* Either end agrees the same seed for one context, another for another. */
Test(secagg, a_pair_agrees_one_seed_per_context) {
    SecaggKeys a, b;
    uint8_t ab[SECAGG_KEY], ba[SECAGG_KEY], other[SECAGG_KEY];
    char err[ERR_LEN];
    cr_assert_eq(secagg_keygen(&a, err), 0, "%s", err);
    cr_assert_eq(secagg_keygen(&b, err), 0, "%s", err);
    cr_assert_eq(secagg_agree(&a, b.pub, CONTEXT, ab, err), 0, "%s", err);
    cr_assert_eq(secagg_agree(&b, a.pub, CONTEXT, ba, err), 0, "%s", err);
    cr_assert_eq(memcmp(ab, ba, SECAGG_KEY), 0);
    cr_assert_eq(secagg_agree(&a, b.pub, "fed/round-0/attempt-2", other, err), 0, "%s", err);
    cr_assert_neq(memcmp(ab, other, SECAGG_KEY), 0);
}

Test(secagg, a_peer_key_of_small_order_is_refused) {
    SecaggKeys me;
    uint8_t zero[SECAGG_KEY] = {0}, seed[SECAGG_KEY];
    char err[ERR_LEN];
    cr_assert_eq(secagg_keygen(&me, err), 0, "%s", err);
    cr_assert_eq(secagg_agree(&me, zero, CONTEXT, seed, err), -1);
    cr_assert_not_null(strstr(err, "X25519"), "%s", err);
}

/* What the coordinator holds of one site: its masked update, whose values
 * are uniform modulo 2^bits whatever the update (a chi-square over 256 bins
 * of the top bits, for an update of all zeros). */
Test(secagg, a_masked_update_is_uniform) {
    enum { M = 1 << 18 };
    uint32_t *y = calloc(M, sizeof *y);
    uint8_t seed[SECAGG_KEY];
    char err[ERR_LEN];
    harness_fill(seed, sizeof seed, 3);
    cr_assert_eq(secagg_mask(y, M, BITS, seed, 1, err), 0, "%s", err);
    double bins[256] = {0}, chi = 0, want = M / 256.0;
    for (int i = 0; i < M; i++) bins[y[i] >> (BITS - 8)]++;
    for (int b = 0; b < 256; b++) chi += (bins[b] - want) * (bins[b] - want) / want;
    /* 255 degrees of freedom: mean 255, sd 22.6; 360 is past 4.6 sd */
    cr_assert_lt(chi, 360, "chi-square %g over 256 bins", chi);
    cr_assert_gt(chi, 170, "chi-square %g: too even to be random", chi);
    free(y);
}

/* The shared scale: stochastic rounding is unbiased (the mean of many
 * quantizations of one value is the value) and within one level of it,
 * and n sites' extremes sum without wrapping. */
Test(secagg, quantization_is_unbiased_and_sums_without_wrapping) {
    enum { M = 200000 };
    float *x = malloc(M * sizeof *x), *back = malloc(M * sizeof *back);
    uint32_t *q = malloc(M * sizeof *q);
    char err[ERR_LEN];
    for (int i = 0; i < M; i++) x[i] = 0.3333f;
    int bits = 16, n = 64;
    cr_assert_eq(secagg_quantize(x, M, 1, 1.0, secagg_scale(bits, n, 1.0), bits, q, err), 0, "%s",
                 err);
    secagg_dequantize(q, M, bits, secagg_scale(bits, n, 1.0), back);
    double level = 1.0 / floor((pow(2, bits - 1) - 1) / n), mean = 0;
    for (int i = 0; i < M; i++) {
        cr_assert_lt(fabs(back[i] - x[i]), level * 1.0001, "%g from %g", back[i], x[i]);
        mean += back[i];
    }
    mean /= M;
    cr_assert_lt(fabs(mean - 0.3333), 10 * level / sqrt(M), "mean %g", mean);
    /* 64 sites each at −clip: the sum is −64 clips, not wrapped */
    uint32_t sum = 0, one;
    float lo = -5.0f, got;
    cr_assert_eq(secagg_quantize(&lo, 1, 1, 1.0, secagg_scale(bits, n, 1.0), bits, &one, err), 0,
                 "%s", err);
    for (int i = 0; i < n; i++) sum = (sum + one) & 0xffffu;
    secagg_dequantize(&sum, 1, bits, secagg_scale(bits, n, 1.0), &got);
    cr_assert_float_eq(got, -64.0f, 1e-3, "%g", got);
    cr_assert_eq(secagg_quantize(x, 1, 1, 1.0, secagg_scale(8, 300, 1.0), 8, q, err), -1,
                 "300 sites in 8 bits");
    x[5] = NAN;
    cr_assert_eq(secagg_quantize(x, 10, 1, 1.0, secagg_scale(bits, n, 1.0), bits, q, err), -1,
                 "a NaN taken");
    cr_assert_not_null(strstr(err, "not finite"), "%s", err);
    free(x), free(back), free(q);
}
