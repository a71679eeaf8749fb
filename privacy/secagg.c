/*
 * secagg.c — secure aggregation's arithmetic: X25519 agreement, ChaCha20
 * masks modulo 2^bits, Shamir's sharing over GF(2^8), and the shared-scale
 * quantization the masked values are taken in; secagg_proto.c runs them
 * as the protocol's phases, checked in tests/unit/test_secagg.c.
 */
#include <math.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

#include "privacy.h"
#include "util/util.h"

int secagg_keygen(SecaggKeys *k, char *err) {
    EVP_PKEY *p = EVP_PKEY_Q_keygen(NULL, NULL, "X25519");
    size_t lp = SECAGG_KEY, lq = SECAGG_KEY;
    int ok = p && EVP_PKEY_get_raw_public_key(p, k->pub, &lp) == 1 &&
             EVP_PKEY_get_raw_private_key(p, k->priv, &lq) == 1 && lp == SECAGG_KEY &&
             lq == SECAGG_KEY;
    EVP_PKEY_free(p);
    return ok ? 0 : err_set(err, "cannot make an X25519 key pair (OpenSSL)");
}

int secagg_agree(const SecaggKeys *mine, const uint8_t peer_pub[SECAGG_KEY], const char *context,
                 uint8_t seed[SECAGG_KEY], char *err) {
    EVP_PKEY *me = EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, NULL, mine->priv, SECAGG_KEY);
    EVP_PKEY *peer = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, NULL, peer_pub, SECAGG_KEY);
    EVP_PKEY_CTX *ctx = me ? EVP_PKEY_CTX_new(me, NULL) : NULL;
    uint8_t secret[SECAGG_KEY];
    size_t len = sizeof secret;
    /* OpenSSL refuses a peer key of small order (an all-zero secret) */
    int ok = ctx && peer && EVP_PKEY_derive_init(ctx) == 1 &&
             EVP_PKEY_derive_set_peer(ctx, peer) == 1 && EVP_PKEY_derive(ctx, secret, &len) == 1 &&
             len == SECAGG_KEY;
    EVP_PKEY_CTX_free(ctx);
    EVP_PKEY_free(me), EVP_PKEY_free(peer);
    if (!ok) return err_set(err, "the peer's X25519 public key is not one to agree with");
    /* both ends hash the same bytes: the secret, then the smaller public key */
    int first = memcmp(mine->pub, peer_pub, SECAGG_KEY) < 0;
    size_t cl = strlen(context), ml = 18 + 3 * SECAGG_KEY + cl;
    uint8_t *msg = malloc(ml);
    if (msg == NULL) {
        OPENSSL_cleanse(secret, sizeof secret);
        return err_set(err, "out of memory");
    }
    memcpy(msg, "strait secagg pair", 18);
    memcpy(msg + 18, secret, SECAGG_KEY);
    memcpy(msg + 18 + SECAGG_KEY, first ? mine->pub : peer_pub, SECAGG_KEY);
    memcpy(msg + 18 + 2 * SECAGG_KEY, first ? peer_pub : mine->pub, SECAGG_KEY);
    memcpy(msg + 18 + 3 * SECAGG_KEY, context, cl);
    unsigned int dl = 0;
    ok = EVP_Digest(msg, ml, seed, &dl, EVP_sha256(), NULL) == 1 && dl == SECAGG_KEY;
    OPENSSL_cleanse(msg, ml);
    free(msg);
    OPENSSL_cleanse(secret, sizeof secret);
    return ok ? 0 : err_set(err, "SHA-256 failed (OpenSSL)");
}

#define MASK_BATCH 4096 /* values drawn at a time */

int secagg_mask(uint32_t *x, uint64_t n, int bits, const uint8_t seed[SECAGG_KEY], int sign,
                char *err) {
    if (bits < 8 || bits > 32 || (sign != 1 && sign != -1))
        return err_set(err, "secure aggregation: %d bits, sign %d", bits, sign);
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    static const uint8_t iv[16] = {0}; /* one key, one stream: the seed is never reused */
    if (ctx == NULL || EVP_EncryptInit_ex(ctx, EVP_chacha20(), NULL, seed, iv) != 1) {
        EVP_CIPHER_CTX_free(ctx);
        return err_set(err, "cannot start ChaCha20 (OpenSSL)");
    }
    uint32_t mod = bits == 32 ? 0xffffffffu : (1u << bits) - 1;
    static const uint8_t zeros[MASK_BATCH * 4];
    uint32_t r[MASK_BATCH];
    for (uint64_t at = 0; at < n; at += MASK_BATCH) {
        int k = (int)(n - at < MASK_BATCH ? n - at : MASK_BATCH), out;
        if (EVP_EncryptUpdate(ctx, (uint8_t *)r, &out, zeros, 4 * k) != 1) {
            EVP_CIPHER_CTX_free(ctx);
            return err_set(err, "ChaCha20 failed (OpenSSL)");
        }
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
        const uint8_t *b = (const uint8_t *)r; /* little-endian, whatever the host */
        for (int i = 0; i < k; i++)
            r[i] = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 |
                   (uint32_t)b[4 * i + 3] << 24;
#endif
        uint32_t *y = x + at; /* two loops the compiler vectorizes */
        if (sign > 0)
            for (int i = 0; i < k; i++) y[i] = (y[i] + r[i]) & mod;
        else
            for (int i = 0; i < k; i++) y[i] = (y[i] - r[i]) & mod;
    }
    EVP_CIPHER_CTX_free(ctx);
    return 0;
}

/* ---- GF(2^8), AES's polynomial x^8 + x^4 + x^3 + x + 1 ---------------------------- */

/* without branches on the bytes (they are secrets): the same time for any */
static uint8_t gf_mul(uint8_t a, uint8_t b) {
    uint8_t p = 0;
    for (int i = 0; i < 8; i++) {
        p ^= (uint8_t)(a & -(b & 1));
        a = (uint8_t)((a << 1) ^ (0x1b & -(a >> 7)));
        b >>= 1;
    }
    return p;
}

static uint8_t gf_inv(uint8_t a) { /* a^254 */
    uint8_t r = 1, p = a;
    for (int e = 254; e; e >>= 1, p = gf_mul(p, p))
        if (e & 1) r = gf_mul(r, p);
    return r;
}

int shamir_split(const uint8_t secret[SECAGG_KEY], int t, int n, uint8_t (*shares)[SECAGG_SHARE],
                 char *err) {
    if (t < 2 || t > n || n > 255)
        return err_set(err, "Shamir sharing of %d of %d: use 2 <= t <= n <= 255", t, n);
    uint8_t coef[254][SECAGG_KEY]; /* the polynomial's t − 1 random coefficients */
    if (RAND_bytes(&coef[0][0], (t - 1) * SECAGG_KEY) != 1)
        return err_set(err, "OpenSSL's random generator failed");
    for (int k = 0; k < n; k++) {
        uint8_t x = (uint8_t)(k + 1);
        shares[k][0] = x;
        for (int b = 0; b < SECAGG_KEY; b++) { /* Horner, highest coefficient first */
            uint8_t y = 0;
            for (int c = t - 2; c >= 0; c--) y = gf_mul((uint8_t)(y ^ coef[c][b]), x);
            shares[k][1 + b] = (uint8_t)(y ^ secret[b]);
        }
    }
    OPENSSL_cleanse(coef, sizeof coef);
    return 0;
}

int shamir_combine(const uint8_t (*shares)[SECAGG_SHARE], int k, uint8_t secret[SECAGG_KEY],
                   char *err) {
    if (k < 1 || k > 255) return err_set(err, "Shamir: %d shares", k);
    uint8_t seen[256] = {0};
    for (int i = 0; i < k; i++) {
        uint8_t x = shares[i][0];
        if (x == 0 || seen[x]++)
            return err_set(err, "Shamir: share %d has x = %u, zero or repeated", i, x);
    }
    memset(secret, 0, SECAGG_KEY);
    for (int i = 0; i < k; i++) { /* Lagrange at 0: Π x_j / (x_j − x_i), − is ^ */
        uint8_t num = 1, den = 1;
        for (int j = 0; j < k; j++) {
            if (j == i) continue;
            num = gf_mul(num, shares[j][0]);
            den = gf_mul(den, (uint8_t)(shares[j][0] ^ shares[i][0]));
        }
        uint8_t l = gf_mul(num, gf_inv(den));
        for (int b = 0; b < SECAGG_KEY; b++) secret[b] ^= gf_mul(l, shares[i][1 + b]);
    }
    return 0;
}

/* ---- the round's shared scale ----------------------------------------------------- */

double secagg_scale(int bits, int n_sites, double range) {
    if (bits < 8 || bits > 32 || n_sites < 1 || !(range > 0)) return 0;
    return floor((ldexp(1, bits - 1) - 1) / n_sites) / range;
}

int secagg_quantize(const float *x, uint64_t n, double factor, double range, double scale, int bits,
                    uint32_t *out, char *err) {
    if (bits < 8 || bits > 32 || !(range > 0) || !(scale * range >= 1) || !(factor > 0))
        return err_set(err,
                       "secure aggregation cannot take a value in %d bits at %g steps over ±%g: "
                       "use more bits or fewer sites",
                       bits, scale * range, range);
    uint32_t mod = bits == 32 ? 0xffffffffu : (1u << bits) - 1, u[MASK_BATCH];
    for (uint64_t at = 0; at < n; at += MASK_BATCH) {
        int k = (int)(n - at < MASK_BATCH ? n - at : MASK_BATCH);
        if (RAND_bytes((uint8_t *)u, 4 * k) != 1)
            return err_set(err, "OpenSSL's random generator failed");
        for (int i = 0; i < k; i++)
            if (!isfinite(x[at + i]))
                return err_set(err, "value %llu of the update is not finite; nothing is sent",
                               (unsigned long long)(at + i));
        for (int i = 0; i < k; i++) {
            double v = fmax(-range, fmin(range, factor * (double)x[at + i])) * scale;
            double lo = floor(v); /* up with probability v − lo: unbiased */
            int64_t q = (int64_t)lo + ((double)u[i] * 0x1p-32 < v - lo);
            out[at + i] = (uint32_t)q & mod;
        }
    }
    return 0;
}

void secagg_dequantize(const uint32_t *sum, uint64_t n, int bits, double scale, float *out) {
    double half = ldexp(1, bits - 1), full = ldexp(1, bits);
    for (uint64_t i = 0; i < n; i++) {
        double v = sum[i] >= half ? sum[i] - full : sum[i];
        out[i] = (float)(v / scale);
    }
}
