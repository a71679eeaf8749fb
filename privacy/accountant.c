/*
 * accountant.c — ε of a federation's rounds composed, by Rényi differential
 * privacy (Mironov 2017): every site is in every round (Strait does not
 * sample sites), so a central round is the Gaussian mechanism, RDP α /
 * (2 z_r²) at order α, a distributed one the Skellam mechanism's bound on
 * integers; the rounds add, order by order.
 */
#include <math.h>

#include "privacy.h"

/* dp-accounting 0.6.0's DEFAULT_RDP_ORDERS: 1.1 to 10.9 by tenths, 11 to
 * 63, then 128, 256, 512, 1024. */
double privacy_order(int i) {
    static const double tail[] = {128, 256, 512, 1024};
    if (i < 99) return 1 + (i + 1) / 10.0;
    if (i < 99 + 53) return 11 + (i - 99);
    return tail[i - 99 - 53];
}

/* Balle et al.'s conversion of RDP r at order a to ε at delta (as
 * dp-accounting's compute_epsilon). */
static double order_epsilon(double a, double r, double delta) {
    if (delta * delta + expm1(-r) > 0) return 0; /* δ ≥ √(1 − e^−KL) already */
    if (a > 1.01 && isfinite(r)) return r + log1p(-1 / a) - log(delta * a) / (a - 1);
    return INFINITY;
}

double privacy_account_epsilon(const PrivacyAccount *acc, double delta, double *order_out) {
    if (order_out) *order_out = 0;
    int any = 0;
    for (int i = 0; i < PRIVACY_ORDERS; i++) any |= acc->rdp[i] != 0;
    if (!any) return 0;
    if (!(delta > 0 && delta < 1)) return INFINITY;
    double best = INFINITY, best_order = 0;
    for (int i = 0; i < PRIVACY_ORDERS; i++) {
        double a = privacy_order(i), r = acc->rdp[i];
        if (isnan(r) || !(r > 0)) continue; /* no round, or a NaN that must not count as none */
        double eps = order_epsilon(a, r, delta);
        if (eps < best) best = eps, best_order = a;
    }
    if (order_out) *order_out = best_order;
    return best > 0 ? best : 0;
}

double privacy_epsilon(double inv_z2, double delta, double *order_out) {
    if (order_out) *order_out = 0;
    if (inv_z2 == 0) return 0;
    if (!(inv_z2 > 0) || isinf(inv_z2)) return INFINITY;
    PrivacyAccount a;
    for (int i = 0; i < PRIVACY_ORDERS; i++) a.rdp[i] = privacy_order(i) / 2 * inv_z2;
    return privacy_account_epsilon(&a, delta, order_out);
}

void privacy_add_gaussian(PrivacyAccount *acc, double z) {
    for (int i = 0; i < PRIVACY_ORDERS; i++) acc->rdp[i] += privacy_order(i) / (2 * z * z);
}

void privacy_add_skellam(PrivacyAccount *acc, double mu, double l1, double l2) {
    for (int i = 0; i < PRIVACY_ORDERS; i++) {
        double a = privacy_order(i);
        if (a != floor(a)) {
            acc->rdp[i] = INFINITY;
            continue;
        }
        double gauss = a * l2 * l2 / (2 * mu);
        double extra = fmin(((2 * a - 1) * l2 * l2 + 6 * l1) / (4 * mu * mu), 3 * l1 / (2 * mu));
        acc->rdp[i] += gauss + extra;
    }
}

void privacy_account_add(PrivacyAccount *acc, const PrivacyAccount *b, double times) {
    for (int i = 0; i < PRIVACY_ORDERS; i++)
        if (b->rdp[i] != 0) acc->rdp[i] += times * b->rdp[i];
}
