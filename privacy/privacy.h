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

#endif
