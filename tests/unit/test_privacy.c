/*
 * test_privacy.c — the accountant against Google's dp-accounting (PyPI,
 * RdpAccountant) on a grid of noise multipliers, rounds and δ, rounds of
 * different noise composed, and the noise's moments.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "privacy/privacy.h"
#include "tests/harness.h"
#include "util/util.h"

/* dp-accounting's ε for each "z1,z2,... rounds delta" line, by
 * tests/python/dp_reference.py in build/venv. */
static double *reference(const char *lines, int n) {
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with dp-accounting)");
    char *dir = harness_tmpdir("dp"), in[700], script[700], cmd[3000], err[ERR_LEN];
    snprintf(in, sizeof in, "%s/grid", dir);
    snprintf(script, sizeof script, "%s/tests/python/dp_reference.py", src);
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
