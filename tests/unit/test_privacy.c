/*
 * test_privacy.c — the accountant against Google's dp-accounting (PyPI,
 * RdpAccountant) on a grid of noise multipliers, rounds and δ, rounds of
 * different noise composed, and the noise's moments; the Skellam bound
 * against the mechanism's exact Rényi divergence (scipy's Skellam
 * distribution), its rounds turned into ε as dp-accounting turns them, and
 * the Skellam noise's moments and shape.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "privacy/privacy.h"
#include "tests/harness.h"
#include "util/util.h"

/* Each line's answer from tests/python/NAME in build/venv (dp-accounting,
 * scipy). */
static double *reference_of(const char *name, const char *lines, int n) {
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with dp-accounting)");
    char *dir = harness_tmpdir("dp"), in[700], script[700], cmd[3000], err[ERR_LEN];
    snprintf(in, sizeof in, "%s/grid", dir);
    snprintf(script, sizeof script, "%s/tests/python/%s", src, name);
    cr_assert_eq(file_write_atomic(in, lines, strlen(lines), 0644, err), 0, "%s", err);
    snprintf(cmd, sizeof cmd, "'%s' '%s' < '%s'", py, script, in);
    ProcResult r = proc_run((char *[]){"/bin/sh", "-c", cmd, NULL});
    cr_assert_eq(r.status, 0, "dp-accounting: %s", r.err);
    double *eps = malloc(sizeof(double) * (size_t)n);
    char *p = r.out;
    for (int i = 0; i < n; i++) {
        char *end;
        eps[i] = strtod(p, &end);
        cr_assert(end != p, "dp-accounting printed %d values of %d: %s", i, n, r.out);
        p = end;
    }
    proc_result_free(&r);
    harness_rmtree(dir);
    free(dir);
    return eps;
}

/* dp-accounting's ε for each "z1,z2,... rounds delta" line. */
static double *reference(const char *lines, int n) {
    return reference_of("dp_reference.py", lines, n);
}

Test(privacy, epsilon_matches_dp_accounting_on_a_grid) {
    static const double zs[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 4.0, 10.0};
    static const int rounds[] = {1, 10, 100, 1000};
    static const double deltas[] = {1e-3, 1e-5, 1e-8};
    enum { N = 8 * 4 * 3 };
    char *lines = calloc(N, 64);
    size_t at = 0;
    for (int a = 0; a < 8; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 3; c++)
                at += (size_t)sprintf(lines + at, "%.17g %d %.17g\n", zs[a], rounds[b], deltas[c]);
    double *want = reference(lines, N), worst = 0;
    int k = 0;
    for (int a = 0; a < 8; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 3; c++, k++) {
                double got = privacy_epsilon(rounds[b] * privacy_spend(zs[a]), deltas[c], NULL);
                double rel = fabs(got - want[k]) / fmax(want[k], 1e-12);
                cr_assert(rel < 1e-9, "z %g, %d rounds, delta %g: %.12g, dp-accounting %.12g",
                          zs[a], rounds[b], deltas[c], got, want[k]);
                if (rel > worst) worst = rel;
            }
    printf("accountant: %d points, largest relative difference from dp-accounting %.2g\n", N,
           worst);
    free(want), free(lines);
}

/* Rounds of different noise (a federation restarted with another
 * noise_multiplier) add their 1/z². */
Test(privacy, rounds_of_different_noise_compose_as_dp_accounting_composes_them) {
    double *want = reference("0.7,1.3,3 25 1e-6\n", 1);
    double inv = 25 * (privacy_spend(0.7) + privacy_spend(1.3) + privacy_spend(3));
    double got = privacy_epsilon(inv, 1e-6, NULL);
    cr_assert(fabs(got - want[0]) < 1e-9 * want[0], "%.12g against %.12g", got, want[0]);
    free(want);
}

Test(privacy, epsilon_is_zero_for_no_rounds_and_infinite_without_noise_or_delta) {
    cr_assert_eq(privacy_epsilon(0, 1e-5, NULL), 0);
    cr_assert(isinf(privacy_epsilon(INFINITY, 1e-5, NULL)));
    cr_assert(isinf(privacy_epsilon(1, 0, NULL)));
    cr_assert(isinf(privacy_epsilon(1, 1, NULL)));
    double order;
    double e1 = privacy_epsilon(privacy_spend(1), 1e-5, &order);
    cr_assert(order > 1 && e1 > 0);
    /* more rounds, more ε; more noise, less */
    cr_assert_gt(privacy_epsilon(2 * privacy_spend(1), 1e-5, NULL), e1);
    cr_assert_lt(privacy_epsilon(privacy_spend(2), 1e-5, NULL), e1);
}

/* The noise has the mean and variance asked for, its tails are Gaussian's,
 * and two draws differ (no seed). */
Test(privacy, noise_has_the_asked_moments) {
    enum { N = 1 << 20 };
    float *x = calloc(N + 1, sizeof(float)), *y = calloc(N + 1, sizeof(float));
    char err[ERR_LEN];
    cr_assert_eq(privacy_gaussian_add(x, N + 1, 2.5, err), 0, "%s", err); /* odd: the last alone */
    cr_assert_eq(privacy_gaussian_add(y, N + 1, 2.5, err), 0, "%s", err);
    double s = 0, s2 = 0, s4 = 0;
    int beyond3 = 0, same = 0;
    for (int i = 0; i <= N; i++) {
        double v = x[i] / 2.5;
        s += v, s2 += v * v, s4 += v * v * v * v;
        beyond3 += fabs(v) > 3;
        same += x[i] == y[i];
    }
    double n = N + 1, mean = s / n, var = s2 / n - mean * mean;
    /* the bounds are ten standard errors (mean 1/√n, variance √(2/n),
     * fourth moment √(96/n), the tail's count √(np)) */
    cr_assert_lt(fabs(mean), 10 / sqrt(n), "mean %g", mean);
    cr_assert_lt(fabs(var - 1), 10 * sqrt(2 / n), "variance %g", var);
    cr_assert_lt(fabs(s4 / n - 3), 10 * sqrt(96 / n), "fourth moment %g", s4 / n);
    double p3 = 0.0026997960632601866 * n;
    cr_assert_lt(fabs(beyond3 - p3), 10 * sqrt(p3), "%d beyond 3 sigma, %g expected", beyond3, p3);
    cr_assert_lt(same, 100, "two draws agree at %d of %d values", same, N + 1);
    cr_assert(x[N] != 0, "the odd last value got noise");
    free(x), free(y);
}

/* ---- distributed DP: the Skellam mechanism ------------------------------------------ */

static int order_index(double a) {
    for (int i = 0; i < PRIVACY_ORDERS; i++)
        if (privacy_order(i) == a) return i;
    cr_assert_fail("order %g is not one of the accountant's", a);
    return -1;
}

/* One dimension (L1 = L2 = Δ): the bound is never under the exact Rényi
 * divergence of the shifted Skellam distribution, at every order and
 * noise, and is within 2% of it once the noise's deviation is ten shifts
 * (the bound's surcharge over the Gaussian's α Δ² / 2μ fades as μ grows). */
Test(privacy, the_skellam_bound_holds_over_the_exact_divergence_and_nears_it) {
    static const double mus[] = {10, 100, 1000, 10000};
    static const int deltas[] = {1, 3, 10}, alphas[] = {2, 4, 8, 16, 32};
    enum { N = 4 * 3 * 5 };
    char *lines = calloc(N, 64);
    size_t at = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 5; c++)
                at +=
                    (size_t)sprintf(lines + at, "div %.17g %d %d\n", mus[a], deltas[b], alphas[c]);
    double *exact = reference_of("skellam_reference.py", lines, N), loosest = 0;
    int k = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 5; c++, k++) {
                PrivacyAccount acc = {{0}};
                privacy_add_skellam(&acc, mus[a], deltas[b], deltas[b]);
                double got = acc.rdp[order_index(alphas[c])];
                cr_assert_geq(got, exact[k] * (1 - 1e-9),
                              "mu %g, shift %d, order %d: bound %.10g under the exact %.10g",
                              mus[a], deltas[b], alphas[c], got, exact[k]);
                if (mus[a] >= 100.0 * deltas[b] * deltas[b]) {
                    cr_assert_leq(got, exact[k] * 1.05,
                                  "mu %g, shift %d, order %d: bound %.10g, exact %.10g", mus[a],
                                  deltas[b], alphas[c], got, exact[k]);
                    if (got / exact[k] - 1 > loosest) loosest = got / exact[k] - 1;
                }
            }
    printf("skellam: %d points, the bound at most %.2g over the exact divergence where the noise "
           "is ten shifts wide\n",
           N, loosest);
    free(exact), free(lines);
}

/* Skellam rounds (only integer orders: the others are infinite), alone and
 * beside Gaussian rounds, give dp-accounting's ε for the same RDP. */
Test(privacy, skellam_rounds_turn_into_epsilon_as_dp_accounting_turns_them) {
    PrivacyAccount alone = {{0}}, mixed = {{0}}, one = {{0}};
    privacy_add_skellam(&one, 4.2e9, 1.3e7, 6.4e4); /* z ≈ 1.01 at a sensitivity of 64,000 */
    privacy_account_add(&alone, &one, 20);
    privacy_add_gaussian(&mixed, 1.5);
    privacy_add_gaussian(&mixed, 1.5);
    privacy_account_add(&mixed, &one, 7);
    privacy_add_skellam(&mixed, 50, 4, 2); /* a round whose surcharge is most of it */
    const PrivacyAccount *accs[2] = {&alone, &mixed};
    char lines[2][20000];
    for (int a = 0; a < 2; a++) {
        size_t at = (size_t)sprintf(lines[a], "eps 1e-6 ");
        for (int i = 0; i < PRIVACY_ORDERS; i++) {
            double o = privacy_order(i);
            if (o != floor(o)) {
                cr_assert(isinf(accs[a]->rdp[i]), "order %g is not an integer's: +inf", o);
                continue;
            }
            at += (size_t)sprintf(lines[a] + at, "%s%.17g", at > 9 ? "," : "", accs[a]->rdp[i]);
        }
        sprintf(lines[a] + at, "\n");
    }
    char both[40000];
    snprintf(both, sizeof both, "%s%s", lines[0], lines[1]);
    double *want = reference_of("skellam_reference.py", both, 2);
    for (int a = 0; a < 2; a++) {
        double got = privacy_account_epsilon(accs[a], 1e-6, NULL);
        cr_assert(fabs(got - want[a]) < 1e-9 * want[a], "account %d: %.12g, dp-accounting %.12g", a,
                  got, want[a]);
    }
    /* a Skellam round of wide noise costs what the Gaussian round of the
     * same z does, and a little more */
    PrivacyAccount g = {{0}};
    privacy_add_gaussian(&g, sqrt(4.2e9) / 6.4e4);
    double eg = privacy_account_epsilon(&g, 1e-6, NULL),
           es = privacy_account_epsilon(&one, 1e-6, NULL);
    cr_assert(es >= eg && es < eg * 1.01, "Skellam %g, Gaussian %g", es, eg);
    free(want);
}

/* The Skellam distribution's mass at k for variance mu: the sum over j of
 * Poisson(j + |k|) Poisson(j), each of mean mu / 2. */
static double skellam_pmf(double mu, int k) {
    double lam = mu / 2, p = 0;
    k = abs(k);
    for (int j = 0; j < 400; j++)
        p += exp((2.0 * j + k) * log(lam) - 2 * lam - lgamma(j + k + 1.0) - lgamma(j + 1.0));
    return p;
}

/* The noise, at variances from under one to 2e14 (Poisson means of 1e14,
 * near the largest drawn): mean 0 and the variance asked, to ten standard
 * errors, at every width; at variance 7 (Knuth's product) and 60 (PTRS)
 * the counts of each value against the distribution's mass (chi-square);
 * at 2e14 the counts in bands of half a deviation against the normal
 * law's (the Skellam law's shape there, to 1e-7: what PTRS's acceptance
 * test must keep, far past where its direct form loses precision);
 * taken modulo 2^bits; a variance past the largest refused. */
Test(privacy, skellam_noise_has_the_asked_variance_and_shape) {
    enum { N = 1 << 18 };
    static const double vars[] = {0.6, 7, 60, 3000, 1e9, 2e14};
    uint32_t *x = malloc(N * sizeof *x);
    char err[ERR_LEN];
    for (int a = 0; a < 6; a++) {
        memset(x, 0, N * sizeof *x);
        cr_assert_eq(privacy_skellam_add(x, N, vars[a], 32, err), 0, "%s", err);
        enum { BANDS = 14 }; /* half deviations out to ±3, and the two tails */
        double s = 0, s2 = 0, band[BANDS] = {0};
        for (int i = 0; i < N; i++) {
            /* 2e14: the deviation is 1.4e7, far inside 2^31 */
            double v = (double)(int32_t)x[i], zv = v / sqrt(vars[a]);
            s += v, s2 += v * v;
            band[zv < -3 ? 0 : zv >= 3 ? BANDS - 1 : 1 + (int)floor((zv + 3) * 2)]++;
        }
        if (vars[a] > 1e10) {
            double chi = 0;
            for (int b = 0; b < BANDS; b++) {
                double lo = b == 0 ? -INFINITY : -3 + (b - 1) * 0.5;
                double hi = b == BANDS - 1 ? INFINITY : -3 + b * 0.5;
                double want = N * 0.5 * (erfc(-hi / M_SQRT2) - erfc(-lo / M_SQRT2));
                chi += (band[b] - want) * (band[b] - want) / want;
            }
            /* 13 degrees of freedom: mean 13, sd 5.1; 45 is past 6 sd */
            cr_assert_lt(chi, 45, "variance %g: chi-square %g over %d bands", vars[a], chi, BANDS);
        }
        double mean = s / N, var = s2 / N - mean * mean, v0 = vars[a];
        /* the variance's standard error: v √(2/N), and the excess kurtosis 1/v */
        cr_assert_lt(fabs(mean), 10 * sqrt(v0 / N), "variance %g: mean %g", v0, mean);
        cr_assert_lt(fabs(var / v0 - 1), 10 * sqrt((2 + 1 / v0) / N), "variance %g: %g", v0, var);
        if (v0 != 7 && v0 != 60) continue;
        int half = v0 == 7 ? 8 : 20, bins = 2 * half + 1;
        double chi = 0, *count = calloc((size_t)bins + 2, sizeof *count), tail = 1;
        for (int i = 0; i < N; i++) {
            int v = (int32_t)x[i];
            count[v < -half ? bins : v > half ? bins + 1 : v + half]++;
        }
        for (int k = -half; k <= half; k++) {
            double want = N * skellam_pmf(v0, k);
            tail -= want / N;
            chi += (count[k + half] - want) * (count[k + half] - want) / want;
        }
        double want = N * tail / 2; /* each side's tail */
        chi += (count[bins] - want) * (count[bins] - want) / want;
        chi += (count[bins + 1] - want) * (count[bins + 1] - want) / want;
        /* bins + 1 degrees of freedom (18 or 42): 80 and 110 are past 7 sd */
        cr_assert_lt(chi, v0 == 7 ? 80 : 110, "variance %g: chi-square %g over %d bins", v0, chi,
                     bins + 2);
        free(count);
    }
    /* modulo 2^8: the noise wraps, as the masks do */
    for (int i = 0; i < N; i++) x[i] = 3;
    cr_assert_eq(privacy_skellam_add(x, N, 60, 8, err), 0, "%s", err);
    int below = 0;
    for (int i = 0; i < N; i++) {
        cr_assert_lt(x[i], 256u);
        below += x[i] > 128; /* 3 + noise < 0 wrapped */
    }
    cr_assert_gt(below, N / 5, "only %d of %d wrapped below zero", below, N);
    cr_assert_eq(privacy_skellam_add(x, 1, -1, 8, err), -1);
    cr_assert_eq(privacy_skellam_add(x, 1, 2.01 * PRIVACY_POISSON_MAX, 32, err), -1);
    cr_assert_eq(privacy_skellam_add(x, 1, 1, 33, err), -1);
    free(x);
}
