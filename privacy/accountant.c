/*
 * accountant.c — ε of the Gaussian mechanism composed over a federation's
 * rounds, by Rényi differential privacy (Mironov 2017): every site is in
 * every round (Strait does not sample sites), so round r is the Gaussian
 * mechanism at order α with RDP α / (2 z_r²), and the rounds add.
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

double privacy_epsilon(double inv_z2, double delta, double *order_out) {
    if (order_out) *order_out = 0;
    if (inv_z2 == 0) return 0;
    if (!(delta > 0 && delta < 1) || !(inv_z2 > 0) || isinf(inv_z2)) return INFINITY;
    double best = INFINITY, best_order = 0;
    for (int i = 0; i < PRIVACY_ORDERS; i++) {
        double a = privacy_order(i), rdp = a / 2 * inv_z2, eps;
        if (delta * delta + expm1(-rdp) > 0)
            eps = 0; /* δ ≥ √(1 − e^−KL) already */
        else if (a > 1.01)
            eps = rdp + log1p(-1 / a) - log(delta * a) / (a - 1);
        else
            eps = INFINITY;
        if (eps < best) best = eps, best_order = a;
    }
    if (order_out) *order_out = best_order;
    return best > 0 ? best : 0;
}
