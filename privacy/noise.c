/*
 * noise.c — Gaussian noise for the coordinator's aggregate, from OpenSSL's
 * DRBG. Box–Muller over 53-bit uniforms in double precision, rounded to
 * float when added: floating-point noise is not the ideal mechanism (its
 * low bits are not uniform; Mironov 2012 showed the attack on Laplace
 * noise), which docs/privacy.md states beside the ε it reports.
 */
#include <math.h>
#include <openssl/rand.h>

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
