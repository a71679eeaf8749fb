/*
 * noise.c — Gaussian noise for the coordinator's aggregate, from OpenSSL's
 * DRBG. Box–Muller over 53-bit uniforms in double precision, rounded to
 * float when added: floating-point noise is not the ideal mechanism (its
 * low bits are not uniform; Mironov 2012 showed the attack on Laplace
 * noise), which docs/privacy.md states beside the ε it reports. And
 * Skellam noise on integers for distributed DP: Poisson draws by Knuth's
 * product (small means) and Hörmann's PTRS (1993; the rest).
 */
#include <math.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdlib.h>

#include "privacy.h"
#include "util/util.h"

#define BATCH 4096 /* pairs of uniforms drawn at a time */

/* (0, 1]: never 0, whose log Box–Muller takes */
static double uniform_open0(uint64_t bits) {
    return ((bits >> 11) + 1) * 0x1p-53;
}

int privacy_gaussian_add(float *x, uint64_t n, double std, char *err) {
    uint64_t u[2 * BATCH];
    for (uint64_t at = 0; at < n;) {
        uint64_t pairs = (n - at + 1) / 2;
        if (pairs > BATCH) pairs = BATCH;
        if (RAND_bytes((unsigned char *)u, (int)(2 * pairs * sizeof u[0])) != 1)
            return err_set(err, "OpenSSL's random generator failed; no noise was added");
        for (uint64_t k = 0; k < pairs && at < n; k++) {
            double r = std * sqrt(-2 * log(uniform_open0(u[2 * k])));
            double t = 2 * M_PI * ((u[2 * k + 1] >> 11) * 0x1p-53);
            x[at] = (float)(x[at] + r * cos(t)), at++;
            if (at < n) x[at] = (float)(x[at] + r * sin(t)), at++;
        }
    }
    return 0;
}

/* Uniforms from the DRBG, drawn a batch at a time. */
typedef struct Uniforms {
    uint64_t u[BATCH];
    int at, failed;
} Uniforms;

static double uniform(Uniforms *g) { /* [0, 1) */
    if (g->at == 0 || g->at == BATCH) {
        if (RAND_bytes((unsigned char *)g->u, (int)sizeof g->u) != 1) g->failed = 1;
        g->at = 0;
    }
    return (g->u[g->at++] >> 11) * 0x1p-53;
}

/* log of the Poisson mass at k ≥ 30 of mean lam, −lam + k log lam −
 * log k!, as (k − lam) − k log1p((k − lam)/lam) − ½ log 2πk − Stirling's
 * remainder: the two first terms cancel to O((k − lam)² / lam), so nothing
 * of size lam is subtracted (the direct form loses all precision at
 * means past 1e12). */
static double log_mass(double k, double lam) {
    double t = k - lam;
    double stirling = 1 / (12 * k) - 1 / (360 * k * k * k) + 1 / (1260 * k * k * k * k * k);
    return t - k * log1p(t / lam) - 0.5 * log(2 * M_PI * k) - stirling;
}

/* A Poisson distribution's constants, computed once for its draws. */
typedef struct Poisson {
    double lam, limit;                                    /* Knuth: e^−lam */
    double loglam, a, b, log_inv_alpha, vr, two_a, shift; /* PTRS */
} Poisson;

static Poisson poisson_of(double lam) {
    Poisson p = {.lam = lam, .limit = exp(-lam)};
    if (lam >= 10) {
        p.loglam = log(lam);
        p.b = 0.931 + 2.53 * sqrt(lam), p.a = -0.059 + 0.02483 * p.b;
        p.log_inv_alpha = log(1.1239 + 1.1328 / (p.b - 3.4)), p.vr = 0.9277 - 3.6224 / (p.b - 2);
        p.two_a = 2 * p.a, p.shift = lam + 0.43;
    }
    return p;
}

/* A Poisson draw (mean 0 ≤ lam ≤ PRIVACY_POISSON_MAX: every k near it is a
 * double exactly). */
static int64_t poisson(Uniforms *g, const Poisson *p) {
    if (p->lam == 0) return 0;
    if (p->lam < 10) { /* Knuth: the first k at which a product of uniforms falls under e^−lam */
        double prod = 1;
        int64_t k = -1;
        do prod *= 1 - uniform(g), k++;
        while (prod > p->limit && !g->failed);
        return k;
    }
    /* PTRS: a transformed-rejection hat over the Poisson's mass (Hörmann 1993) */
    for (;;) {
        double u = uniform(g) - 0.5, v = uniform(g), us = 0.5 - fabs(u);
        double k = floor((p->two_a / us + p->b) * u + p->shift);
        if (g->failed) return 0;
        if (us >= 0.07 && v <= p->vr) return (int64_t)k; /* inside the hat's sure part */
        if (k < 0 || (us < 0.013 && v > us)) continue;
        double mass = k < 30 ? -p->lam + k * p->loglam - lgamma(k + 1) : log_mass(k, p->lam);
        if (log(v) + p->log_inv_alpha - log(p->a / (us * us) + p->b) <= mass) return (int64_t)k;
    }
}

int privacy_skellam_add(uint32_t *x, uint64_t n, double var, int bits, char *err) {
    if (!(var >= 0 && var / 2 <= PRIVACY_POISSON_MAX) || bits < 8 || bits > 32)
        return err_set(err, "Skellam noise of variance %g in %d bits: out of range", var, bits);
    uint32_t mod = bits == 32 ? 0xffffffffu : (1u << bits) - 1;
    Uniforms *g = calloc(1, sizeof *g);
    if (g == NULL) return err_set(err, "out of memory");
    g->at = 0, g->failed = 0;
    Poisson half = poisson_of(var / 2);
    for (uint64_t i = 0; i < n && !g->failed; i++) {
        int64_t d = poisson(g, &half) - poisson(g, &half);
        x[i] = (uint32_t)((uint64_t)x[i] + (uint64_t)d) & mod;
    }
    int failed = g->failed;
    OPENSSL_cleanse(g, sizeof *g);
    free(g);
    return failed ? err_set(err, "OpenSSL's random generator failed; the noise is not whole") : 0;
}
