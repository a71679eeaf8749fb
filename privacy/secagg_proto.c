/*
 * secagg_proto.c — SecAgg+'s protocol at both ends, without the transport:
 * what a site makes and checks at each phase (its keys and the commitment
 * to its self seed; its seeds' shares sealed to each neighbour; its masked
 * update; the shares it reveals for the unmasking) and what the
 * coordinator keeps (the cohort's mask keys, the modular sum of the masked
 * updates, the revealed shares) and how it unmasks. Every input that comes
 * from a peer is checked here: a share sealed for someone else, from a
 * site that is not a neighbour, twice, or with the wrong x; a revealed
 * share that would give away both of a site's secrets; seeds that do not
 * match their commitment or public key. The masked update's wire format
 * ("SAGM") is here too. docs/privacy.md says what it protects.
 */
#include <math.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

#include "privacy.h"
#include "util/util.h"

/* ---- the cohort's graph and shares' x --------------------------------------------- */

int secagg_degree(int n) {
    int k = 2, m = n - 1;
    while (k < SECAGG_MAX_DEGREE && (1L << (k / 2)) < n) k += 2; /* 2 ceil(log2 n), even */
    return k >= m ? m : k;
}

/* How far j is from i along the ring, in (−n/2, n/2]. */
static int ring_offset(int i, int j, int n) {
    int off = ((j - i) % n + n) % n;
    return off > n / 2 ? off - n : off;
}

/* The half-width of a neighbourhood: k / 2, or n / 2 when all are. */
static int half_width(const SecaggParams *p) {
    return p->k >= p->n - 1 ? p->n / 2 : p->k / 2;
}

int secagg_share_x(const SecaggParams *p, int owner, int holder) {
    return ring_offset(owner, holder, p->n) + half_width(p) + 1;
}

static int neighbourhood(const SecaggParams *p) { /* the site and its neighbours */
    return (p->k >= p->n - 1 ? p->n - 1 : p->k) + 1;
}

int secagg_params(int n, int bits, double range, const char *context, SecaggParams *p, char *err) {
    memset(p, 0, sizeof *p);
    if (n < 2) return err_set(err, "secure aggregation needs 2 sites at least, not %d", n);
    if (bits < 8 || bits > 32 || !(range > 0))
        return err_set(err, "secure aggregation: %d bits (8 to 32), range %g (> 0)", bits, range);
    p->n = n, p->bits = bits, p->range = range;
    if ((p->scale = secagg_scale(bits, n, range)) == 0)
        return err_set(err,
                       "secure aggregation: %d bits cannot hold the sum of %d sites; use more "
                       "bits",
                       bits, n);
    if (!isfinite(p->scale))
        return err_set(err, "secure aggregation: range %g is too small", range);
    p->k = secagg_degree(n);
    p->t = neighbourhood(p) / 2 + 1; /* a majority of each neighbourhood */
    if (neighbourhood(p) > 255 || half_width(p) * 2 + 1 > 255)
        return err_set(err, "secure aggregation: a neighbourhood of %d is more than 255 shares",
                       neighbourhood(p));
    size_t len = strlen(context);
    if (len >= sizeof p->context)
        return err_set(err, "secure aggregation: a context of %zu bytes", len);
    memcpy(p->context, context, len + 1);
    return 0;
}

#define DP_HEADROOM 8.0 /* the noise's standard deviations the modulus holds */

/* The scale at which n values within ±range and the noise fit bits: each
 * value may round up a step past range, and the noise of all n shares
 * (deviation z l2 √(n / noise_sites)) fits DP_HEADROOM times. At most
 * the scale at which a share's Poisson means are PRIVACY_POISSON_MAX / 2
 * (a wider one gains nothing: rounding already adds under 1e-6 there). */
static double dp_scale(int n, int bits, double range, double clip, double z, int noise_sites,
                       uint64_t dim) {
    double h = DP_HEADROOM * z * sqrt((double)n / noise_sites), root = sqrt((double)dim);
    double room = ldexp(1, bits - 1) - 1 - n - h * root;
    double scale = room / (n * range + h * clip);
    double widest = (sqrt(PRIVACY_POISSON_MAX * noise_sites) / z - root) / clip;
    return fmin(scale, widest);
}

int secagg_dp_bits(int n, double range, double clip, double z, int noise_sites, uint64_t dim,
                   int min_bits) {
    for (int bits = min_bits < 8 ? 8 : min_bits; bits < 32; bits++) {
        double scale = dp_scale(n, bits, range, clip, z, noise_sites, dim);
        if (scale * clip >= 100 * sqrt((double)dim) && scale * range >= 1) return bits;
    }
    return 32;
}

double secagg_clip_factor(const SecaggParams *p, const float *x, uint64_t len) {
    if (!(p->clip > 0)) return 1;
    double norm = 0;
    for (uint64_t i = 0; i < len; i++) norm += (double)x[i] * x[i];
    norm = sqrt(norm);
    return norm > p->clip ? p->clip / norm : 1; /* NaN: 1, and quantizing refuses it */
}

int secagg_params_dp(SecaggParams *p, double clip, double z, int noise_sites, uint64_t dim,
                     char *err) {
    if (!(clip > 0 && clip <= 1e6) || !(z > 0 && z <= 1e4) || noise_sites < 2 ||
        noise_sites > p->n || dim < 1)
        return err_set(err,
                       "distributed DP: clip %g, noise multiplier %g, noise over %d of %d sites, "
                       "%llu values: out of range",
                       clip, z, noise_sites, p->n, (unsigned long long)dim);
    double scale = dp_scale(p->n, p->bits, p->range, clip, z, noise_sites, dim);
    double root = sqrt((double)dim);
    if (!(scale * clip >= 10 * root) || !(scale * p->range >= 1))
        return err_set(err,
                       "distributed DP: %d bits leave too few steps for %d sites and the noise "
                       "(rounding would add over a tenth to the sensitivity, or range is under "
                       "a step); use bits = %d or more",
                       p->bits, p->n,
                       secagg_dp_bits(p->n, p->range, clip, z, noise_sites, dim, p->bits));
    double l2 = scale * clip + root, mu = (z * l2) * (z * l2);
    if (!isfinite(scale) || !isfinite(mu))
        return err_set(err, "distributed DP: clip %g and range %g give no finite scale", clip,
                       p->range);
    p->scale = scale, p->clip = clip, p->noise = z, p->noise_sites = noise_sites, p->dim = dim;
    p->l2 = l2, p->l1 = fmin(l2 * l2, root * l2), p->mu = mu;
    return 0;
}

static int is_neighbour(const SecaggParams *p, int i, int j) {
    return secagg_neighbours(i, j, p->n, p->k);
}

void secagg_permutation(int *place, int n) {
    for (int i = 0; i < n; i++) place[i] = i;
    for (int i = n - 1; i > 0; i--) {
        uint64_t u = 0;
        if (RAND_bytes((uint8_t *)&u, sizeof u) != 1) abort(); /* no draw is safe without it */
        int j = (int)(u % (uint64_t)(i + 1)), tmp = place[i];
        place[i] = place[j], place[j] = tmp;
    }
}

/* ---- sealing shares: ChaCha20-Poly1305 under the pair's agreed key --------------- */

/* The sealing key of a pair (the c keys, a context of its own), and the
 * nonce of a direction: a key seals one envelope each way. */
static int box_key(const SecaggKeys *mine, const uint8_t peer[SECAGG_KEY], const SecaggParams *p,
                   uint8_t key[SECAGG_KEY], char *err) {
    char ctx[sizeof p->context + 16];
    snprintf(ctx, sizeof ctx, "shares/%s", p->context);
    return secagg_agree(mine, peer, ctx, key, err);
}

static void box_nonce(int from, int to, uint8_t nonce[12]) {
    for (int i = 0; i < 4; i++) nonce[i] = (uint8_t)((uint32_t)from >> (8 * i));
    for (int i = 0; i < 4; i++) nonce[4 + i] = (uint8_t)((uint32_t)to >> (8 * i));
    memset(nonce + 8, 0, 4);
}

static int seal(const uint8_t key[SECAGG_KEY], int from, int to,
                const uint8_t plain[2 * SECAGG_SHARE], uint8_t box[SECAGG_BOX]) {
    uint8_t nonce[12], aad[8];
    box_nonce(from, to, nonce), memcpy(aad, nonce, 8);
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int len = 0, fin = 0;
    int ok = c && EVP_EncryptInit_ex(c, EVP_chacha20_poly1305(), NULL, key, nonce) == 1 &&
             EVP_EncryptUpdate(c, NULL, &len, aad, sizeof aad) == 1 &&
             EVP_EncryptUpdate(c, box, &len, plain, 2 * SECAGG_SHARE) == 1 &&
             EVP_EncryptFinal_ex(c, box + len, &fin) == 1 &&
             EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, box + 2 * SECAGG_SHARE) == 1;
    EVP_CIPHER_CTX_free(c);
    cpu_upper_clear(); /* OpenSSL's Poly1305 leaves them dirty (util.h) */
    return ok ? 0 : -1;
}

/* 0 and the plaintext when the box is whole and was sealed from `from` to
 * `to` under key; -1 otherwise (whatever the bytes). */
static int unseal(const uint8_t key[SECAGG_KEY], int from, int to, const uint8_t box[SECAGG_BOX],
                  uint8_t plain[2 * SECAGG_SHARE]) {
    uint8_t nonce[12], aad[8], tag[16];
    box_nonce(from, to, nonce), memcpy(aad, nonce, 8);
    memcpy(tag, box + 2 * SECAGG_SHARE, 16);
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int len = 0, fin = 0;
    int ok = c && EVP_DecryptInit_ex(c, EVP_chacha20_poly1305(), NULL, key, nonce) == 1 &&
             EVP_DecryptUpdate(c, NULL, &len, aad, sizeof aad) == 1 &&
             EVP_DecryptUpdate(c, plain, &len, box, 2 * SECAGG_SHARE) == 1 &&
             EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, 16, tag) == 1 &&
             EVP_DecryptFinal_ex(c, plain + len, &fin) == 1;
    EVP_CIPHER_CTX_free(c);
    cpu_upper_clear(); /* OpenSSL's Poly1305 leaves them dirty (util.h) */
    if (!ok) OPENSSL_cleanse(plain, 2 * SECAGG_SHARE);
    return ok ? 0 : -1;
}

/* ---- commitments ------------------------------------------------------------------ */

static int commit_seed(const uint8_t seed[SECAGG_KEY], uint8_t out[SECAGG_KEY]) {
    uint8_t msg[18 + SECAGG_KEY];
    memcpy(msg, "strait secagg self", 18);
    memcpy(msg + 18, seed, SECAGG_KEY);
    unsigned int len = 0;
    int ok = EVP_Digest(msg, sizeof msg, out, &len, EVP_sha256(), NULL) == 1 && len == SECAGG_KEY;
    OPENSSL_cleanse(msg, sizeof msg);
    return ok ? 0 : -1;
}

static int public_of(const uint8_t priv[SECAGG_KEY], uint8_t pub[SECAGG_KEY]) {
    EVP_PKEY *k = EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, NULL, priv, SECAGG_KEY);
    size_t len = SECAGG_KEY;
    int ok = k && EVP_PKEY_get_raw_public_key(k, pub, &len) == 1 && len == SECAGG_KEY;
    EVP_PKEY_free(k);
    return ok ? 0 : -1;
}

/* The seed of the pair masks of i and j (the s keys). */
static int mask_seed(const SecaggKeys *mine, const uint8_t peer[SECAGG_KEY], const SecaggParams *p,
                     uint8_t seed[SECAGG_KEY], char *err) {
    char ctx[sizeof p->context + 16];
    snprintf(ctx, sizeof ctx, "masks/%s", p->context);
    return secagg_agree(mine, peer, ctx, seed, err);
}

/* ---- a site ----------------------------------------------------------------------- */

struct SecaggSite {
    SecaggParams p;
    int me, phase; /* 0 keys made, 1 shared, 2 masked, 3 revealed */
    SecaggKeys c, s;
    uint8_t self_seed[SECAGG_KEY];
    uint8_t (*s_pub)[SECAGG_KEY];
    uint8_t *holds; /* n: 1 where it holds that site's shares (its own among them) */
    uint8_t (*held)[2][SECAGG_SHARE]; /* n: [0] of the self seed, [1] of the mask key */
};

SecaggSite *secagg_site_new(SecaggAdvert *ad, char *err) {
    SecaggSite *s = calloc(1, sizeof *s);
    if (s == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    if (secagg_keygen(&s->c, err) != 0 || secagg_keygen(&s->s, err) != 0 ||
        RAND_priv_bytes(s->self_seed, SECAGG_KEY) != 1 ||
        commit_seed(s->self_seed, ad->seed_commit) != 0) {
        if (!err[0]) err_set(err, "OpenSSL's random generator failed");
        secagg_site_free(s);
        return NULL;
    }
    memcpy(ad->c_pub, s->c.pub, SECAGG_KEY);
    memcpy(ad->s_pub, s->s.pub, SECAGG_KEY);
    return s;
}

void secagg_site_free(SecaggSite *s) {
    if (s == NULL) return;
    if (s->held) OPENSSL_cleanse(s->held, (size_t)s->p.n * sizeof *s->held);
    free(s->s_pub), free(s->holds), free(s->held);
    OPENSSL_cleanse(s, sizeof *s);
    free(s);
}

int secagg_site_share(SecaggSite *s, const SecaggParams *p, int me, const SecaggAdvert *cohort,
                      SecaggEnvelope *out, int *n_out, char *err) {
    *n_out = 0;
    if (s->phase != 0) return err_set(err, "secure aggregation: shares were made already");
    if (me < 0 || me >= p->n) return err_set(err, "secure aggregation: index %d of %d", me, p->n);
    if (memcmp(cohort[me].c_pub, s->c.pub, SECAGG_KEY) != 0 ||
        memcmp(cohort[me].s_pub, s->s.pub, SECAGG_KEY) != 0)
        return err_set(err, "secure aggregation: the cohort's entry %d is not this site's keys",
                       me);
    s->p = *p, s->me = me;
    s->s_pub = calloc((size_t)p->n, sizeof *s->s_pub);
    s->holds = calloc((size_t)p->n, 1);
    s->held = calloc((size_t)p->n, sizeof *s->held);
    if (!s->s_pub || !s->holds || !s->held) return err_set(err, "out of memory");
    for (int j = 0; j < p->n; j++) memcpy(s->s_pub[j], cohort[j].s_pub, SECAGG_KEY);
    /* shares of both secrets for x = 1 .. 2 half-width + 1: each holder's x */
    int width = 2 * half_width(p) + 1, rc = 0;
    uint8_t(*seed_sh)[SECAGG_SHARE] = calloc((size_t)width, SECAGG_SHARE);
    uint8_t(*key_sh)[SECAGG_SHARE] = calloc((size_t)width, SECAGG_SHARE);
    if (!seed_sh || !key_sh) rc = err_set(err, "out of memory");
    if (rc == 0 && (shamir_split(s->self_seed, p->t, width, seed_sh, err) != 0 ||
                    shamir_split(s->s.priv, p->t, width, key_sh, err) != 0))
        rc = -1;
    for (int j = 0; j < p->n && rc == 0; j++) {
        if (j != me && !is_neighbour(p, me, j)) continue;
        int x = secagg_share_x(p, me, j);
        uint8_t plain[2 * SECAGG_SHARE], key[SECAGG_KEY];
        memcpy(plain, seed_sh[x - 1], SECAGG_SHARE);
        memcpy(plain + SECAGG_SHARE, key_sh[x - 1], SECAGG_SHARE);
        if (j == me) { /* its own, kept */
            memcpy(s->held[me][0], plain, SECAGG_SHARE);
            memcpy(s->held[me][1], plain + SECAGG_SHARE, SECAGG_SHARE);
            s->holds[me] = 1;
        } else if (box_key(&s->c, cohort[j].c_pub, p, key, err) != 0) {
            rc = err_set(err, "secure aggregation: site %d's key: %s", j, err);
        } else {
            SecaggEnvelope *e = &out[(*n_out)++];
            e->from = me, e->to = j;
            if (seal(key, me, j, plain, e->box) != 0)
                rc = err_set(err, "ChaCha20-Poly1305 failed (OpenSSL)");
        }
        OPENSSL_cleanse(plain, sizeof plain), OPENSSL_cleanse(key, sizeof key);
    }
    if (seed_sh) OPENSSL_cleanse(seed_sh, (size_t)width * SECAGG_SHARE);
    if (key_sh) OPENSSL_cleanse(key_sh, (size_t)width * SECAGG_SHARE);
    free(seed_sh), free(key_sh);
    if (rc == 0) s->phase = 1;
    return rc;
}

int secagg_site_mask(SecaggSite *s, const SecaggAdvert *cohort, const SecaggEnvelope *in, int n_in,
                     const float *x, uint64_t len, uint32_t *y, float *sent, char *err) {
    const SecaggParams *p = &s->p;
    if (s->phase != 1) return err_set(err, "secure aggregation: mask before sharing");
    /* every envelope opened and checked before any is kept: a bad one takes none */
    uint8_t(*plain)[2 * SECAGG_SHARE] = calloc((size_t)(n_in ? n_in : 1), sizeof *plain);
    if (plain == NULL) return err_set(err, "out of memory");
    int rc = 0;
    for (int e = 0; e < n_in && rc == 0; e++) {
        int from = in[e].from, twice = 0;
        for (int f = 0; f < e; f++) twice |= in[f].from == from;
        if (in[e].to != s->me || from < 0 || from >= p->n || from == s->me ||
            !is_neighbour(p, s->me, from) || s->holds[from] || twice) {
            rc = err_set(err,
                         "secure aggregation: shares from site %d to %d are not this site's to "
                         "take (not a neighbour, not to it, or twice)",
                         from, in[e].to);
            break;
        }
        uint8_t key[SECAGG_KEY];
        if (box_key(&s->c, cohort[from].c_pub, p, key, err) != 0 ||
            unseal(key, from, s->me, in[e].box, plain[e]) != 0)
            rc = err_set(err, "secure aggregation: site %d's shares do not open", from);
        OPENSSL_cleanse(key, sizeof key);
        int x_want = secagg_share_x(p, from, s->me);
        if (rc == 0 && (plain[e][0] != x_want || plain[e][SECAGG_SHARE] != x_want))
            rc = err_set(err, "secure aggregation: site %d's shares have the wrong x", from);
    }
    for (int e = 0; e < n_in && rc == 0; e++) {
        memcpy(s->held[in[e].from][0], plain[e], SECAGG_SHARE);
        memcpy(s->held[in[e].from][1], plain[e] + SECAGG_SHARE, SECAGG_SHARE);
        s->holds[in[e].from] = 1;
    }
    OPENSSL_cleanse(plain, (size_t)(n_in ? n_in : 1) * sizeof *plain);
    free(plain);
    if (rc != 0) return -1;
    if (p->clip > 0 && len > p->dim) /* its rounding would pass the sensitivity */
        return err_set(err, "distributed DP: an update of %llu values, past the round's %llu",
                       (unsigned long long)len, (unsigned long long)p->dim);
    double factor = secagg_clip_factor(p, x, len);
    if (secagg_quantize(x, len, factor, p->range, p->scale, p->bits, y, err) != 0) return -1;
    if (sent) secagg_dequantize(y, len, p->bits, p->scale, sent); /* its share of the sum */
    /* its share of the noise: any noise_sites of the shares make the sum's */
    if (p->clip > 0 && privacy_skellam_add(y, len, p->mu / p->noise_sites, p->bits, err) != 0)
        return -1;
    if (secagg_mask(y, len, p->bits, s->self_seed, 1, err) != 0) return -1;
    /* a pair mask with each neighbour that shared: it shared with this site too */
    for (int j = 0; j < p->n; j++) {
        if (j == s->me || !s->holds[j]) continue;
        uint8_t seed[SECAGG_KEY];
        int rc = mask_seed(&s->s, s->s_pub[j], p, seed, err) != 0 ||
                 secagg_mask(y, len, p->bits, seed, secagg_sign(s->me, j), err) != 0;
        OPENSSL_cleanse(seed, sizeof seed);
        if (rc) return -1;
    }
    s->phase = 2;
    return 0;
}

int secagg_site_reveal(SecaggSite *s, const uint8_t *survived, SecaggReveal *out, int *n_out,
                       char *err) {
    const SecaggParams *p = &s->p;
    *n_out = 0;
    if (s->phase != 2) return err_set(err, "secure aggregation: reveal before masking");
    if (!survived[s->me])
        return err_set(err, "secure aggregation: the coordinator counts this site as dropped "
                            "although it sent its update; nothing is revealed");
    int alive = 0;
    for (int j = 0; j < p->n; j++) alive += s->holds[j] && survived[j];
    if (alive < p->t)
        return err_set(err,
                       "secure aggregation: %d of this site's neighbourhood survived, fewer "
                       "than the %d the unmasking needs; nothing is revealed",
                       alive, p->t);
    int summed = 0; /* distributed DP: a sum of fewer shares of noise than owed is not unmasked */
    for (int j = 0; j < p->n; j++) summed += survived[j] != 0;
    if (p->clip > 0 && summed < p->noise_sites)
        return err_set(err,
                       "secure aggregation: the coordinator would sum %d updates, fewer than the "
                       "%d whose noise makes the sum's; nothing is revealed",
                       summed, p->noise_sites);
    for (int j = 0; j < p->n; j++) {
        if (!s->holds[j]) continue;
        SecaggReveal *r = &out[(*n_out)++];
        r->owner = j, r->key = !survived[j]; /* never both of one site's secrets */
        memcpy(r->share, s->held[j][r->key], SECAGG_SHARE);
    }
    s->phase = 3;
    return 0;
}

/* ---- the coordinator -------------------------------------------------------------- */

struct SecaggServer {
    SecaggParams p;
    SecaggAdvert *cohort; /* n */
    uint8_t *shared, *in; /* n: who shared (U2), whose masked update is summed (U3) */
    uint32_t *sum;
    uint64_t len;
    int width;                    /* shares a secret can have */
    uint8_t *n_got;               /* n: shares revealed of each site's secret */
    uint8_t (*got)[SECAGG_SHARE]; /* n × width */
    uint8_t *revealed;            /* n: the sites that revealed */
    int phase;                    /* 0 summing, 1 revealing */
};

SecaggServer *secagg_server_new(const SecaggParams *p, const SecaggAdvert *cohort,
                                const uint8_t *shared, uint64_t len, char *err) {
    SecaggServer *v = calloc(1, sizeof *v);
    if (v == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    v->p = *p, v->len = len, v->width = 2 * half_width(p) + 1;
    v->cohort = calloc((size_t)p->n, sizeof *v->cohort);
    v->shared = calloc((size_t)p->n, 1), v->in = calloc((size_t)p->n, 1);
    v->revealed = calloc((size_t)p->n, 1), v->n_got = calloc((size_t)p->n, 1);
    v->got = calloc((size_t)p->n * (size_t)v->width, SECAGG_SHARE);
    v->sum = calloc(len ? len : 1, sizeof *v->sum);
    if (!v->cohort || !v->shared || !v->in || !v->revealed || !v->n_got || !v->got || !v->sum) {
        err_set(err, "out of memory for secure aggregation's sum");
        secagg_server_free(v);
        return NULL;
    }
    memcpy(v->cohort, cohort, (size_t)p->n * sizeof *cohort);
    memcpy(v->shared, shared, (size_t)p->n);
    return v;
}

void secagg_server_free(SecaggServer *v) {
    if (v == NULL) return;
    free(v->cohort), free(v->shared), free(v->in), free(v->revealed), free(v->n_got);
    free(v->got), free(v->sum);
    free(v);
}

int secagg_server_add(SecaggServer *v, int i, const uint8_t *blob, size_t len, char *err) {
    SecaggMasked h;
    if (v->phase != 0) return err_set(err, "secure aggregation: the sum is closed");
    if (secagg_masked_parse(blob, len, &h, err) != 0) return -1;
    if (i < 0 || i >= v->p.n || !v->shared[i])
        return err_set(err, "secure aggregation: site %d did not share its seeds this attempt", i);
    if (h.index != (uint32_t)i || h.bits != v->p.bits || h.n != v->len)
        return err_set(err,
                       "secure aggregation: a masked update of site %u, %d bits, %llu values; "
                       "this attempt takes site %d's, %d bits, %llu values",
                       h.index, h.bits, (unsigned long long)h.n, i, v->p.bits,
                       (unsigned long long)v->len);
    if (v->in[i]) return err_set(err, "secure aggregation: site %d's update is in already", i);
    secagg_masked_add(v->sum, blob);
    v->in[i] = 1;
    return 0;
}

int secagg_server_close(SecaggServer *v, uint8_t *survived, char *err) {
    int alive = 0;
    for (int i = 0; i < v->p.n; i++) alive += survived[i] = v->in[i];
    if (alive < v->p.t)
        return err_set(err, "secure aggregation: %d masked updates, fewer than the %d to unmask",
                       alive, v->p.t);
    if (v->p.clip > 0 && alive < v->p.noise_sites) /* the sum would have less noise than owed */
        return err_set(err,
                       "secure aggregation: %d masked updates, fewer than the %d the noise is "
                       "shared among",
                       alive, v->p.noise_sites);
    v->phase = 1;
    return 0;
}

int secagg_server_reveal(SecaggServer *v, int from, const SecaggReveal *r, int n, char *err) {
    const SecaggParams *p = &v->p;
    if (v->phase != 1) return err_set(err, "secure aggregation: not unmasking");
    if (from < 0 || from >= p->n || !v->in[from] || v->revealed[from])
        return err_set(err, "secure aggregation: site %d reveals nothing here (dropped, or twice)",
                       from);
    /* checked whole before anything is kept: a bad entry takes none */
    for (int e = 0; e < n; e++) {
        int o = r[e].owner;
        if (o < 0 || o >= p->n || !v->shared[o] || (o != from && !is_neighbour(p, from, o)))
            return err_set(err,
                           "secure aggregation: site %d reveals a share of site %d, not its "
                           "neighbour's",
                           from, o);
        if (r[e].key != !v->in[o])
            return err_set(err,
                           "secure aggregation: site %d reveals site %d's %s, which the "
                           "unmasking does not take",
                           from, o, r[e].key ? "mask key" : "self seed");
        if (r[e].share[0] != secagg_share_x(p, o, from))
            return err_set(err, "secure aggregation: site %d's share of site %d has the wrong x",
                           from, o);
        for (int f = 0; f < e; f++)
            if (r[f].owner == o)
                return err_set(err, "secure aggregation: site %d reveals site %d twice", from, o);
    }
    for (int e = 0; e < n; e++) {
        int o = r[e].owner;
        if (v->n_got[o] < v->width)
            memcpy(v->got[(size_t)o * v->width + v->n_got[o]++], r[e].share, SECAGG_SHARE);
    }
    v->revealed[from] = 1;
    return 0;
}

int secagg_server_ready(const SecaggServer *v) {
    for (int o = 0; o < v->p.n; o++)
        if (v->shared[o] && v->n_got[o] < v->p.t) return 0;
    return 1;
}

/* Whether secret is site o's: its self seed's commitment (survivor) or
 * its mask key's public half (dropped). */
static int secret_checks(const SecaggServer *v, int o, const uint8_t secret[SECAGG_KEY]) {
    uint8_t check[SECAGG_KEY];
    if (v->in[o])
        return commit_seed(secret, check) == 0 &&
               memcmp(check, v->cohort[o].seed_commit, SECAGG_KEY) == 0;
    return public_of(secret, check) == 0 && memcmp(check, v->cohort[o].s_pub, SECAGG_KEY) == 0;
}

/* Site o's secret from t of its g shares that check: the first t, then
 * other choices of t, so a share that lies is stepped around while the
 * honest ones number t (at most SUBSETS tries). 0, or -1. */
#define SUBSETS 20000
static int recover_secret(const SecaggServer *v, int o, uint8_t secret[SECAGG_KEY]) {
    int t = v->p.t, g = v->n_got[o], pick[256];
    const uint8_t(*got)[SECAGG_SHARE] =
        (const uint8_t(*)[SECAGG_SHARE]) & v->got[(size_t)o * v->width];
    uint8_t chosen[256][SECAGG_SHARE];
    char err[ERR_LEN];
    for (int i = 0; i < t; i++) pick[i] = i;
    for (int tries = 0; tries < SUBSETS; tries++) {
        for (int i = 0; i < t; i++) memcpy(chosen[i], got[pick[i]], SECAGG_SHARE);
        if (shamir_combine((const uint8_t(*)[SECAGG_SHARE])chosen, t, secret, err) == 0 &&
            secret_checks(v, o, secret)) {
            OPENSSL_cleanse(chosen, sizeof chosen);
            return 0;
        }
        int i = t - 1; /* the next choice, in lexicographic order */
        while (i >= 0 && pick[i] == g - t + i) i--;
        if (i < 0) break;
        pick[i]++;
        for (int j = i + 1; j < t; j++) pick[j] = pick[j - 1] + 1;
    }
    OPENSSL_cleanse(chosen, sizeof chosen);
    OPENSSL_cleanse(secret, SECAGG_KEY);
    return -1;
}

int secagg_server_unmask(SecaggServer *v, float *out, int *summed, char *err) {
    const SecaggParams *p = &v->p;
    if (v->phase != 1) return err_set(err, "secure aggregation: not unmasking");
    /* every secret first, checked: the sum is touched only when all are */
    uint8_t(*secret)[SECAGG_KEY] = calloc((size_t)p->n, SECAGG_KEY);
    if (secret == NULL) return err_set(err, "out of memory");
    int rc = 0;
    for (int o = 0; o < p->n && rc == 0; o++) {
        if (!v->shared[o]) continue;
        if (v->n_got[o] < p->t)
            rc = err_set(err,
                         "secure aggregation: %d shares of site %d's %s, fewer than %d: the sum "
                         "cannot be unmasked",
                         v->n_got[o], o, v->in[o] ? "self seed" : "mask key", p->t);
        else if (recover_secret(v, o, secret[o]) != 0)
            rc = err_set(err,
                         "secure aggregation: no %d of the %d shares of site %d's %s make the %s: "
                         "shares that lie",
                         p->t, v->n_got[o], o, v->in[o] ? "self seed" : "mask key",
                         v->in[o] ? "seed it committed to" : "key it advertised");
    }
    int touched = rc == 0; /* the secrets all check: the sum is changed from here on */
    for (int o = 0; o < p->n && rc == 0; o++) {
        if (!v->shared[o]) continue;
        if (v->in[o]) { /* a survivor: its self mask goes */
            rc = secagg_mask(v->sum, v->len, p->bits, secret[o], -1, err);
            continue;
        }
        SecaggKeys back; /* dropped after sharing: the pair masks its neighbours added */
        memcpy(back.priv, secret[o], SECAGG_KEY);
        memcpy(back.pub, v->cohort[o].s_pub, SECAGG_KEY);
        for (int j = 0; j < p->n && rc == 0; j++) {
            if (!v->in[j] || !is_neighbour(p, o, j)) continue;
            uint8_t seed[SECAGG_KEY];
            if (mask_seed(&back, v->cohort[j].s_pub, p, seed, err) != 0 ||
                secagg_mask(v->sum, v->len, p->bits, seed, -secagg_sign(j, o), err) != 0)
                rc = -1;
            OPENSSL_cleanse(seed, sizeof seed);
        }
        OPENSSL_cleanse(&back, sizeof back);
    }
    OPENSSL_cleanse(secret, (size_t)p->n * SECAGG_KEY);
    free(secret);
    if (rc != 0) {
        if (touched) v->phase = 3; /* some masks are off: no later call takes them off again */
        return -1;
    }
    int alive = 0;
    for (int o = 0; o < p->n; o++) alive += v->in[o];
    secagg_dequantize(v->sum, v->len, p->bits, p->scale, out);
    *summed = alive;
    v->phase = 2;
    return 0;
}

/* ---- the masked update's bytes ("SAGM") ------------------------------------------ */

#define MASKED_HEAD 24 /* "SAGM", bits, 3 zero bytes, index (u32), attempt (u64), n (u32) */

static uint64_t get_le(const uint8_t *b, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

static void put_le(uint8_t *b, uint64_t v, int n) {
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
}

size_t secagg_masked_len(uint64_t n, int bits) {
    return MASKED_HEAD + (size_t)((n * (uint64_t)bits + 7) / 8);
}

void secagg_masked_pack(const uint32_t *y, uint64_t n, int bits, uint32_t index, uint64_t attempt,
                        uint8_t *out) {
    memcpy(out, "SAGM", 4);
    out[4] = (uint8_t)bits, out[5] = out[6] = out[7] = 0;
    put_le(out + 8, index, 4), put_le(out + 12, attempt, 8), put_le(out + 20, n, 4);
    uint8_t *b = out + MASKED_HEAD;
    uint64_t acc = 0;
    int have = 0;
    size_t at = 0;
    for (uint64_t i = 0; i < n; i++) { /* little-endian bit order, value after value */
        acc |= (uint64_t)y[i] << have;
        have += bits;
        while (have >= 8) b[at++] = (uint8_t)acc, acc >>= 8, have -= 8;
    }
    if (have) b[at++] = (uint8_t)acc;
}

int secagg_masked_parse(const uint8_t *blob, size_t len, SecaggMasked *h, char *err) {
    if (len < MASKED_HEAD || memcmp(blob, "SAGM", 4) != 0)
        return err_set(err, "not a masked update (no SAGM header)");
    h->bits = blob[4];
    h->index = (uint32_t)get_le(blob + 8, 4);
    h->attempt = get_le(blob + 12, 8);
    h->n = get_le(blob + 20, 4);
    if (h->bits < 8 || h->bits > 32 || blob[5] || blob[6] || blob[7])
        return err_set(err, "a masked update of %d bits (8 to 32)", h->bits);
    if (len != secagg_masked_len(h->n, h->bits))
        return err_set(err, "a masked update of %llu values at %d bits is %zu bytes, not %zu",
                       (unsigned long long)h->n, h->bits, secagg_masked_len(h->n, h->bits), len);
    /* the last byte's bits past the values are zero: one update, one encoding */
    int spare = (int)((8 - (h->n * (uint64_t)h->bits) % 8) % 8);
    if (spare && blob[len - 1] >> (8 - spare))
        return err_set(err, "a masked update's padding bits are not zero");
    return 0;
}

void secagg_masked_add(uint32_t *sum, const uint8_t *blob) {
    int bits = blob[4];
    uint64_t n = get_le(blob + 20, 4), acc = 0;
    uint32_t mod = bits == 32 ? 0xffffffffu : (1u << bits) - 1;
    const uint8_t *b = blob + MASKED_HEAD;
    int have = 0;
    size_t at = 0;
    for (uint64_t i = 0; i < n; i++) {
        while (have < bits) acc |= (uint64_t)b[at++] << have, have += 8;
        sum[i] = (sum[i] + (uint32_t)(acc & mod)) & mod;
        acc >>= bits, have -= bits;
    }
}
