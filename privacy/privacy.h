/*
 * privacy.h — differential privacy's arithmetic, shared by the coordinator
 * and (with secure aggregation, later) the sites: the Rényi accountant of
 * the Gaussian mechanism under full participation, and Gaussian noise drawn
 * from OpenSSL's DRBG (docs/privacy.md).
 */
#ifndef STRAIT_PRIVACY_H
#define STRAIT_PRIVACY_H

#include <stddef.h>
#include <stdint.h>

/* The Rényi orders the accountant minimizes over: those of Google's
 * dp-accounting (RdpAccountant's defaults), so its ε is theirs. */
#define PRIVACY_ORDERS 156
double privacy_order(int i);

/* ε at delta after rounds of the Gaussian mechanism, every site in every
 * round, with sensitivity-relative noise multipliers z_r: the rounds
 * compose as one Gaussian whose 1/z² is theirs summed (inv_z2, from
 * privacy_spend). RDP α/2 · inv_z2 at each order, turned into (ε, δ) by
 * Balle et al.'s conversion (2020, Prop. 12), the least over the orders;
 * order_out (NULL: not wanted) gets the order that gave it. 0 for no
 * rounds; +inf when delta is not in (0, 1) or a round had no noise. */
double privacy_epsilon(double inv_z2, double delta, double *order_out);

/* What one round with noise multiplier z adds to inv_z2. */
static inline double privacy_spend(double z) {
    return 1.0 / (z * z);
}

/* x[i] += N(0, std²) for every i, from OpenSSL's DRBG (never a seeded
 * generator: the noise must not be reproducible by anyone), by Box–Muller
 * over 53-bit uniforms. 0, or -1 with err when the DRBG fails. */
int privacy_gaussian_add(float *x, uint64_t n, double std, char *err);

/* ---- secure aggregation's arithmetic (secagg.c) ------------------------------------
 * SecAgg+ (Bell et al., CCS 2020) over integers modulo 2^bits: each site
 * adds to its quantized update a self mask and, for each neighbour in the
 * round's sharing graph, a pairwise mask that the neighbour subtracts, so
 * the masks cancel in the sum; the seeds of a site's masks are Shamir-
 * shared with its neighbours, so the sum is recovered when sites drop after
 * masking. Built and tested as arithmetic; NOT YET IN THE ROUND PROTOCOL
 * (docs/privacy.md). */

#define SECAGG_KEY   32 /* an X25519 key, a seed */
#define SECAGG_SHARE 33 /* a Shamir share: its x (1..255), then 32 bytes */

typedef struct SecaggKeys {
    uint8_t pub[SECAGG_KEY], priv[SECAGG_KEY];
} SecaggKeys;

/* A fresh X25519 key pair (OpenSSL). */
int secagg_keygen(SecaggKeys *k, char *err);
/* The seed two sites share: SHA-256 of the X25519 secret, both public keys
 * in order and context (the federation and the round attempt: a seed keys
 * one ChaCha20 stream, one round's mask, and no other), the same at either
 * end. -1 with err for a bad peer key. The protocol must make new keys for
 * every round attempt: a dropped site's private key is revealed. */
int secagg_agree(const SecaggKeys *mine, const uint8_t peer_pub[SECAGG_KEY], const char *context,
                 uint8_t seed[SECAGG_KEY], char *err);
/* x[i] += sign × PRG(seed)[i] modulo 2^bits (bits 8 to 32; sign ±1): the
 * PRG is ChaCha20's keystream under the seed, so either end draws the same
 * mask. */
int secagg_mask(uint32_t *x, uint64_t n, int bits, const uint8_t seed[SECAGG_KEY], int sign,
                char *err);
/* SecAgg+'s sharing graph: sites i and j of n (i ≠ j) are neighbours when
 * their distance on a ring is at most k / 2 (k even; k ≥ n − 1: all). */
static inline int secagg_neighbours(int i, int j, int n, int k) {
    int d = i > j ? i - j : j - i;
    if (n - d < d) d = n - d;
    return i != j && (k >= n - 1 || 2 * d <= k);
}
/* The sign of site i's mask for the pair (i, j): +1 below j, −1 above. */
static inline int secagg_sign(int i, int j) {
    return i < j ? 1 : -1;
}

/* Shamir's t-of-n sharing of a 32-byte secret over GF(2^8), byte by byte
 * (the field of AES): shares[k] has x = k + 1. 2 ≤ t ≤ n ≤ 255. */
int shamir_split(const uint8_t secret[SECAGG_KEY], int t, int n, uint8_t (*shares)[SECAGG_SHARE],
                 char *err);
/* The secret from k shares (peers' bytes: each x must be 1..255 and
 * distinct; -1 with err otherwise). Any t of a t-of-n split give it back;
 * fewer give bytes unrelated to it, which the caller cannot tell: the
 * protocol counts the shares it holds against t. */
int shamir_combine(const uint8_t (*shares)[SECAGG_SHARE], int k, uint8_t secret[SECAGG_KEY],
                   char *err);

/* The update's values, clipped to [−clip, clip], as integers modulo
 * 2^bits that n_sites of them can be summed in without wrapping: levels L
 * = (2^(bits−1) − 1) / n_sites per clip, stochastic rounding (unbiased),
 * the round's scale shared by every site. secagg_dequantize undoes it on
 * the sum (centred: values above 2^(bits−1) are negative). n_sites is the
 * round's largest cohort, fixed before any site quantizes; a value that is
 * not finite is refused. */
int secagg_quantize(const float *x, uint64_t n, double clip, int bits, int n_sites, uint32_t *out,
                    char *err);
void secagg_dequantize(const uint32_t *sum, uint64_t n, double clip, int bits, int n_sites,
                       float *out);

#endif
