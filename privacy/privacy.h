/*
 * privacy.h — differential privacy's arithmetic, shared by the coordinator
 * and (secure aggregation) the sites: the Rényi accountant of
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

/* The account of rounds of different mechanisms: each order's Rényi DP,
 * the rounds added (they compose by adding), turned into ε as above. */
typedef struct PrivacyAccount {
    double rdp[PRIVACY_ORDERS];
} PrivacyAccount;
/* One round of the Gaussian mechanism at noise multiplier z: α / (2z²). */
void privacy_add_gaussian(PrivacyAccount *a, double z);
/* One round of the Skellam mechanism on integers (Agarwal, Kairouz and
 * Liu, NeurIPS 2021, Theorem 3.5): noise of variance mu on each coordinate
 * of the sum (two Poissons of mean mu / 2), one site moving the sum by at
 * most l2 in L2 norm and l1 in L1, all in the integers' units. Its bound
 * holds at integer orders: the others get +inf (they never give the least
 * ε). α l2² / (2 mu) + min(((2α − 1) l2² + 6 l1) / (4 mu²), 3 l1 / (2 mu)). */
void privacy_add_skellam(PrivacyAccount *a, double mu, double l1, double l2);
/* a += times × b (the rounds a budget leaves, looked ahead). */
void privacy_account_add(PrivacyAccount *a, const PrivacyAccount *b, double times);
/* ε at delta of the account (0 when it holds no round), as privacy_epsilon. */
double privacy_account_epsilon(const PrivacyAccount *a, double delta, double *order_out);

/* x[i] += N(0, std²) for every i, from OpenSSL's DRBG (never a seeded
 * generator: the noise must not be reproducible by anyone), by Box–Muller
 * over 53-bit uniforms. 0, or -1 with err when the DRBG fails. */
int privacy_gaussian_add(float *x, uint64_t n, double std, char *err);
/* The largest Poisson mean drawn: 2^48, so every draw near it is a
 * double exactly. */
#define PRIVACY_POISSON_MAX 281474976710656.0
/* x[i] += Skellam(var) modulo 2^bits (bits 8 to 32): the difference of two
 * Poisson draws of mean var / 2 each, from OpenSSL's DRBG (Knuth's product
 * below a mean of 10, Hörmann's transformed rejection, PTRS, above, its
 * acceptance test in a form that keeps its precision at any mean: a
 * sampler in double precision, as numpy's and TensorFlow's are). 0, or -1
 * with err when the DRBG fails or var / 2 is not in [0, PRIVACY_POISSON_MAX]. */
int privacy_skellam_add(uint32_t *x, uint64_t n, double var, int bits, char *err);

/* ---- secure aggregation's arithmetic (secagg.c) ------------------------------------
 * SecAgg+ (Bell et al., CCS 2020) over integers modulo 2^bits: each site
 * adds to its quantized update a self mask and, for each neighbour in the
 * round's sharing graph, a pairwise mask that the neighbour subtracts, so
 * the masks cancel in the sum; the seeds of a site's masks are Shamir-
 * shared with its neighbours, so the sum is recovered when sites drop after
 * masking. The arithmetic, then the protocol's phases without their
 * transport (below; coordinator/secagg_round.c and client/secagg_site.c
 * run them in each round, docs/privacy.md). */

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

/* The shared scale (integer steps a unit) at which n_sites values within
 * ±range sum in 2^bits without wrapping: L = ⌊(2^(bits−1) − 1) / n_sites⌋
 * levels over range; 0 when not one level fits. */
double secagg_scale(int bits, int n_sites, double range);
/* The update's values times factor (an L2 clip's; 1: none), clipped to
 * ±range, as integers modulo 2^bits at the round's shared scale, by
 * stochastic rounding (unbiased: up with probability the fraction).
 * secagg_dequantize undoes the scale on a sum (centred: values above
 * 2^(bits−1) are negative). A value that is not finite is refused. */
int secagg_quantize(const float *x, uint64_t n, double factor, double range, double scale, int bits,
                    uint32_t *out, char *err);
void secagg_dequantize(const uint32_t *sum, uint64_t n, int bits, double scale, float *out);

/* ---- SecAgg+'s protocol at both ends, without the transport (secagg_proto.c) -------
 * An attempt's phases: (1) each site makes its keys and commits to its self
 * seed (SecaggAdvert); the coordinator fixes the cohort (indices 0..n-1)
 * and the parameters; (2) each site seals its two seeds' shares to each
 * neighbour (SecaggEnvelope), which the coordinator routes; those that did
 * are U2; (3) each site of U2 masks its quantized update with them ("SAGM"
 * bytes), the coordinator sums those that come (U3); (4) each survivor
 * reveals, for each neighbour, the share of its self seed (it survived) or
 * of its mask key (it dropped), never both; the coordinator unmasks with t
 * shares a secret and checks each against its commitment or public key. */

#define SECAGG_BOX        (2 * SECAGG_SHARE + 16) /* two shares sealed, and the tag */
#define SECAGG_MAX_DEGREE 64

/* A round attempt's parameters, the same at every site and the coordinator. */
typedef struct SecaggParams {
    int n;        /* the cohort */
    int k;        /* each site's neighbours (SecAgg+'s degree; n − 1: all) */
    int t;        /* shares that recover a secret: a majority of a neighbourhood */
    int bits;     /* values modulo 2^bits */
    double range; /* a value is clipped to ±range */
    double scale; /* integer steps a unit (secagg_scale, or as DP sets it) */
    /* distributed DP (secagg_params_dp; clip 0: none): each site clips its
     * update to L2 norm clip and adds Skellam noise of variance mu /
     * noise_sites a value, so any noise_sites of them sum to noise of
     * variance mu = (noise × l2)², l2 and l1 the sensitivity in integers */
    double clip, noise, l2, l1, mu;
    int noise_sites;
    uint64_t dim;      /* the update's values */
    char context[160]; /* the federation, round and attempt every key is bound to */
} SecaggParams;

/* n, bits and range as chosen; k and t derived (secagg_degree, a majority
 * of each site and its neighbours), and the scale (secagg_scale). */
int secagg_params(int n, int bits, double range, const char *context, SecaggParams *p, char *err);
/* Distributed DP on p (after secagg_params): clip (L2), noise multiplier z
 * (> 0), the survivors the round commits with at least (2 to n), dim
 * values. The scale is remade so that n sites' values within ±range (a
 * step of rounding each) and 8 standard deviations of all n sites' noise
 * fit 2^bits: with h = 8z √(n / noise_sites), scale = (2^(bits−1) − 1 − n
 * − h√dim) / (n range + h clip), at most the scale at which a share's
 * Poisson means reach PRIVACY_POISSON_MAX / 2; l2 = scale clip + √dim
 * (stochastic rounding moves each value by less than one), l1 = min(l2²,
 * √dim l2), mu = (z l2)². Refused (err says how many bits would do) when
 * rounding would add more than a tenth to l2, or range is under one step. */
int secagg_params_dp(SecaggParams *p, double clip, double z, int noise_sites, uint64_t dim,
                     char *err);
/* What an update's values are multiplied by to clip it to L2 norm
 * p->clip (1 within it, or without distributed DP). */
double secagg_clip_factor(const SecaggParams *p, const float *x, uint64_t len);
/* The fewest bits (from min_bits to 32) at which secagg_params_dp's
 * rounding adds at most 1% to l2 and range is a step or more; 32 when none
 * is. */
int secagg_dp_bits(int n, double range, double clip, double z, int noise_sites, uint64_t dim,
                   int min_bits);
/* A uniform permutation of 0..n-1 into place, from OpenSSL's DRBG: the
 * cohort's places on the ring. */
void secagg_permutation(int *place, int n);
/* 2 ⌈log2 n⌉ (even), at most n − 1 and SECAGG_MAX_DEGREE. */
int secagg_degree(int n);
/* The x of the share of owner's secrets that holder holds (1 .. 2 k/2 + 1):
 * by their distance on the ring, so neighbourhoods of any cohort fit
 * Shamir's 255 points. */
int secagg_share_x(const SecaggParams *p, int owner, int holder);

typedef struct SecaggAdvert {        /* phase 1, from each site */
    uint8_t c_pub[SECAGG_KEY];       /* seals shares */
    uint8_t s_pub[SECAGG_KEY];       /* agrees pair masks */
    uint8_t seed_commit[SECAGG_KEY]; /* SHA-256 of its self seed, for the unmasking's check */
} SecaggAdvert;

typedef struct SecaggEnvelope { /* phase 2: from one site to one neighbour, sealed */
    int from, to;
    uint8_t box[SECAGG_BOX];
} SecaggEnvelope;

typedef struct SecaggReveal { /* phase 4: a share of a neighbour's secret */
    int owner;
    int key; /* 1: of its mask key (it dropped); 0: of its self seed */
    uint8_t share[SECAGG_SHARE];
} SecaggReveal;

typedef struct SecaggSite SecaggSite;
/* A site's state for one attempt: its keys and self seed, made fresh (a
 * dropped site's mask key is revealed: never use one twice); ad gets what
 * it advertises. */
SecaggSite *secagg_site_new(SecaggAdvert *ad, char *err);
void secagg_site_free(SecaggSite *s);
/* Phase 2: the cohort's adverts (its own at index me, checked), its seeds'
 * shares sealed to each neighbour: out has room for SECAGG_MAX_DEGREE. */
int secagg_site_share(SecaggSite *s, const SecaggParams *p, int me, const SecaggAdvert *cohort,
                      SecaggEnvelope *out, int *n_out, char *err);
/* Phase 3: the envelopes sealed to it (each opened and checked: from a
 * neighbour, to it, once, its x; a bad one takes none), then y =
 * quantize(x) + its self mask ± a pair mask with each neighbour that
 * shared; sent (NULL: not wanted) gets x as quantized, what the sum holds
 * of it, for the site's error feedback. */
int secagg_site_mask(SecaggSite *s, const SecaggAdvert *cohort, const SecaggEnvelope *in, int n_in,
                     const float *x, uint64_t len, uint32_t *y, float *sent, char *err);
/* Phase 4: survived[j] for the cohort (as the coordinator says); the
 * shares it reveals, one per site it holds shares of, into out (room for
 * SECAGG_MAX_DEGREE + 1). Refused when the coordinator counts this site
 * dropped, fewer than t of its neighbourhood survived, or (distributed
 * DP) fewer than noise_sites are in the sum. */
int secagg_site_reveal(SecaggSite *s, const uint8_t *survived, SecaggReveal *out, int *n_out,
                       char *err);

typedef struct SecaggServer SecaggServer;
/* The coordinator's side of an attempt: the cohort's adverts, shared[i]
 * for the sites whose envelopes it routed (U2), len values. */
SecaggServer *secagg_server_new(const SecaggParams *p, const SecaggAdvert *cohort,
                                const uint8_t *shared, uint64_t len, char *err);
void secagg_server_free(SecaggServer *v);
/* Phase 3: site i's masked update (peer bytes: parsed and checked whole
 * first) added to the sum modulo 2^bits. */
int secagg_server_add(SecaggServer *v, int i, const uint8_t *blob, size_t len, char *err);
/* The masked updates are in: survived[i] (n) says whose, which every
 * survivor is told. -1 when fewer than t came, or (distributed DP) fewer
 * than the noise_sites whose shares of noise make the sum's. */
int secagg_server_close(SecaggServer *v, uint8_t *survived, char *err);
/* Phase 4: what site `from` reveals (checked whole: its neighbours' only,
 * the secret the unmasking takes of each, the right x, once). */
int secagg_server_reveal(SecaggServer *v, int from, const SecaggReveal *r, int n, char *err);
/* 1 when every secret the unmasking needs has t shares. */
int secagg_server_ready(const SecaggServer *v);
/* The sum unmasked and dequantized into out (len floats): each survivor's
 * self mask and each dropped site's pair masks taken out, every secret
 * recovered from t of its shares that check against its commitment or
 * public key (other choices of t tried, so shares that lie are stepped
 * around while the honest ones number t); *summed gets the number of
 * updates in it. -1 with err naming the site whose secret was short of
 * shares or could not be made to check; the sum is then untouched, and
 * more reveals may let a later call succeed. A failure while the masks are
 * taken off (OpenSSL's) leaves the sum spoiled: every later call refuses. */
int secagg_server_unmask(SecaggServer *v, float *out, int *summed, char *err);

/* A masked update's bytes: "SAGM", bits, three zero bytes, the site's
 * index (u32), the attempt (u64), n (u32), then the n values of `bits`
 * bits, packed little-endian (docs: schema/FORMATS.md). */
typedef struct SecaggMasked {
    int bits;
    uint32_t index;
    uint64_t attempt, n;
} SecaggMasked;
size_t secagg_masked_len(uint64_t n, int bits);
void secagg_masked_pack(const uint32_t *y, uint64_t n, int bits, uint32_t index, uint64_t attempt,
                        uint8_t *out);
/* Peer bytes: the header and the exact length checked (0), else -1 with err. */
int secagg_masked_parse(const uint8_t *blob, size_t len, SecaggMasked *h, char *err);
/* sum += the values, modulo 2^bits: blob must have passed secagg_masked_parse. */
void secagg_masked_add(uint32_t *sum, const uint8_t *blob);

#endif
