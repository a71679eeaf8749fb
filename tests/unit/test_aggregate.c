/*
 * test_aggregate.c — the coordinator's aggregation: the streaming weighted
 * mean, the gates that refuse an update before anything is added (table,
 * size, weight, norm against the round's median), coordinate-wise median and
 * trimmed mean across blocks and sections, and the outer optimizers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <criterion/criterion.h>
#ifdef STRAIT_HAVE_OPENMP
#include <omp.h>
#endif

#include "compress/compress.h"
#include "coordinator/coordinator.h"
#include "util/util.h"

#define HASH 0xabcdefull

static Blob encode(const float *x, uint64_t n, uint64_t hash) {
    CodecParams p = codec_params_default(CODEC_FP32);
    /* two tensors, so updates have two sections and blocks cross between them */
    uint64_t sizes[2] = {n / 3, n - n / 3};
    CodecLayout L = {hash, n, n >= 3 ? sizes : NULL, n >= 3 ? 2 : 0};
    Blob b = {0};
    char err[ERR_LEN];
    cr_assert_eq(codec_encode(&p, &L, x, &b, err), 0, "%s", err);
    return b;
}

static float *vec(uint64_t n, float base, float step) {
    float *x = malloc(n * sizeof *x);
    for (uint64_t i = 0; i < n; i++) x[i] = base + step * (float)(i % 17);
    return x;
}

Test(aggregate, weighted_mean_of_accepted_updates) {
    uint64_t n = 1000;
    RoundSum rs;
    char err[ERR_LEN];
    cr_assert_eq(round_sum_init(&rs, n, HASH, 0, err), 0);
    float *a = vec(n, 1, 0.5f), *b = vec(n, -2, 0.25f), *c = vec(n, 3, -1);
    Blob ba = encode(a, n, HASH), bb = encode(b, n, HASH), bc = encode(c, n, HASH);
    cr_assert_eq(round_sum_add(&rs, ba.data, ba.len, 1, err), 0, "%s", err);
    cr_assert_eq(round_sum_add(&rs, bb.data, bb.len, 2, err), 0, "%s", err);
    cr_assert_eq(round_sum_add(&rs, bc.data, bc.len, 3, err), 0, "%s", err);
    float *mean = malloc(n * 4);
    cr_assert_eq(round_sum_mean(&rs, mean, err), 0);
    for (uint64_t i = 0; i < n; i++)
        cr_assert_float_eq(mean[i], (1 * a[i] + 2 * b[i] + 3 * c[i]) / 6, 1e-5, "value %llu",
                           (unsigned long long)i);
    cr_assert_eq(rs.accepted, 3);
    blob_free(&ba), blob_free(&bb), blob_free(&bc);
    free(a), free(b), free(c), free(mean);
    round_sum_free(&rs);
}

Test(aggregate, refused_updates_leave_the_sum_untouched) {
    uint64_t n = 500;
    RoundSum rs;
    char why[ERR_LEN];
    cr_assert_eq(round_sum_init(&rs, n, HASH, 10.0, why), 0);
    float *x = vec(n, 0.1f, 0.01f), *big = vec(n, 50, 1);
    Blob good = encode(x, n, HASH), other = encode(x, n, HASH + 1), huge = encode(big, n, HASH);
    Blob shorter = encode(x, n - 1, HASH);
    cr_assert_eq(round_sum_add(&rs, good.data, good.len, 1, why), 0);
    cr_assert_eq(round_sum_add(&rs, good.data, good.len, 1, why), 0);
    float *before = malloc(n * 4);
    memcpy(before, rs.sum, n * 4);
    cr_assert_eq(round_sum_add(&rs, other.data, other.len, 1, why), 1);
    cr_assert_not_null(strstr(why, "parameter table"), "%s", why);
    cr_assert_eq(round_sum_add(&rs, shorter.data, shorter.len, 1, why), 1);
    cr_assert_eq(round_sum_add(&rs, good.data, good.len, 0, why), 1);
    cr_assert_not_null(strstr(why, "must be positive"), "%s", why);
    cr_assert_eq(round_sum_add(&rs, huge.data, huge.len, 1, why), 1);
    cr_assert_not_null(strstr(why, "over 10 x the round's median"), "%s", why);
    good.data[good.len - 1] ^= 1; /* a damaged payload */
    cr_assert_eq(round_sum_add(&rs, good.data, good.len, 1, why), 1);
    cr_assert_eq(memcmp(before, rs.sum, n * 4), 0, "a refused update changed the sum");
    cr_assert_eq(rs.accepted, 2);
    blob_free(&good), blob_free(&other), blob_free(&huge), blob_free(&shorter);
    free(x), free(big), free(before);
    round_sum_free(&rs);
}

/* Each update is read once (checked and added to the stage in one pass,
 * swapped in when it passes): the sum is the two-pass sum to the bit, and
 * a stage made before the sum moved is not swapped in: the update is added
 * from its inspection instead. */
Test(aggregate, one_pass_sums_are_the_two_pass_sums) {
    uint64_t n = 3000;
    char why[ERR_LEN];
    float *a = vec(n, 1, 0.5f), *b = vec(n, -2, 0.25f), *c = vec(n, 3, -1);
    Blob ba = encode(a, n, HASH), bb = encode(b, n, HASH), bc = encode(c, n, HASH);
    RoundSum one, two;
    cr_assert_eq(round_sum_init(&one, n, HASH, 10.0, why), 0);
    cr_assert_eq(round_sum_init(&two, n, HASH, 10.0, why), 0);
    const Blob *order[3] = {&ba, &bb, &bc};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(round_sum_add(&one, order[i]->data, order[i]->len, 1 + i, why), 0, "%s", why);
        RoundGate g; /* two passes: inspect, judge, add from what was kept */
        cr_assert_eq(round_sum_gate(&two, order[i]->data, order[i]->len, 1 + i, &g), 0);
        cr_assert_eq(g.staged, 0);
        cr_assert_eq(round_sum_apply(&two, &g, 1 + i, 1, why), 0);
        round_gate_free(&g);
    }
    cr_assert_not_null(one.stage, "the first add took no stage");
    cr_assert_eq(memcmp(one.sum, two.sum, n * 4), 0, "one pass and two differ");
    /* staged on a sum that was started again before the apply (a close
     * that adds its updates again): added from its inspection instead */
    RoundGate g;
    cr_assert_eq(round_sum_inspect_add(&one, ba.data, ba.len, 5, NULL, &g), 0);
    cr_assert_eq(g.staged, 1);
    round_sum_restart(&one);
    cr_assert_eq(round_sum_judge(&one, 5, &g), 0);
    cr_assert_eq(round_sum_apply(&one, &g, 5, 1, why), 0);
    round_gate_free(&g);
    round_sum_restart(&two);
    cr_assert_eq(round_sum_add(&two, ba.data, ba.len, 5, why), 0, "%s", why);
    cr_assert_eq(memcmp(one.sum, two.sum, n * 4), 0, "a stale stage was swapped in");
    /* staged at one weight, applied at another: added again at the other */
    cr_assert_eq(round_sum_inspect_add(&one, bc.data, bc.len, 2, NULL, &g), 0);
    cr_assert_eq(round_sum_apply(&one, &g, 3, 1, why), 0);
    round_gate_free(&g);
    cr_assert_eq(round_sum_add(&two, bc.data, bc.len, 3, why), 0, "%s", why);
    cr_assert_eq(memcmp(one.sum, two.sum, n * 4), 0, "a stage of another weight was swapped in");
    blob_free(&ba), blob_free(&bb), blob_free(&bc);
    free(a), free(b), free(c);
    round_sum_free(&one), round_sum_free(&two);
}

Test(aggregate, median_and_trimmed_mean_across_blocks) {
    /* 34 blocks of 64 Ki over three sections: the tensor cut at n/3 falls
     * inside a block and the second tensor is cut again at CODEC_SECTION_MAX */
    uint64_t n = 2 * CODEC_SECTION_MAX + 70000;
    enum { U = 5 };
    float *x[U];
    Blob b[U];
    const uint8_t *blobs[U];
    size_t lens[U];
    for (int u = 0; u < U; u++) {
        x[u] = vec(n, (float)u, 0.1f * (float)(u + 1));
        if (u == 4)
            for (uint64_t i = 0; i < n; i += 3) x[u][i] = 1e6f; /* a hostile site */
        b[u] = encode(x[u], n, HASH);
        blobs[u] = b[u].data, lens[u] = b[u].len;
    }
    float *med = malloc(n * 4), *trim = malloc(n * 4);
    char err[ERR_LEN];
    cr_assert_eq(robust_aggregate(blobs, lens, U, n, AGG_MEDIAN, 0, med, err), 0, "%s", err);
    cr_assert_eq(robust_aggregate(blobs, lens, U, n, AGG_TRIMMED_MEAN, 0.2, trim, err), 0, "%s",
                 err);
    for (uint64_t i = 0; i < n; i += 97) {
        float col[U];
        for (int u = 0; u < U; u++) col[u] = x[u][i];
        for (int p = 0; p < U; p++) /* sort */
            for (int q = p + 1; q < U; q++)
                if (col[q] < col[p]) {
                    float t = col[p];
                    col[p] = col[q];
                    col[q] = t;
                }
        cr_assert_float_eq(med[i], col[2], 1e-6, "median at %llu", (unsigned long long)i);
        cr_assert_float_eq(trim[i], (col[1] + col[2] + col[3]) / 3, 1e-4, "trimmed at %llu",
                           (unsigned long long)i);
        cr_assert_lt(trim[i], 1e5f, "the outlier leaked into the trimmed mean");
    }
#ifdef STRAIT_HAVE_OPENMP
    /* the same floats on one thread and on several: a column is one
     * coordinate's, sorted by whichever thread takes it */
    int threads = omp_get_max_threads();
    for (int t = 1; t <= 3; t += 2) {
        float *m2 = malloc(n * 4), *t2 = malloc(n * 4);
        omp_set_num_threads(t);
        cr_assert_eq(robust_aggregate(blobs, lens, U, n, AGG_MEDIAN, 0, m2, err), 0, "%s", err);
        cr_assert_eq(robust_aggregate(blobs, lens, U, n, AGG_TRIMMED_MEAN, 0.2, t2, err), 0, "%s",
                     err);
        cr_assert_eq(memcmp(m2, med, n * 4), 0, "the median differs on %d threads", t);
        cr_assert_eq(memcmp(t2, trim, n * 4), 0, "the trimmed mean differs on %d threads", t);
        free(m2), free(t2);
    }
    omp_set_num_threads(threads);
#endif
    cr_assert_eq(robust_aggregate(blobs, lens, U, n, AGG_TRIMMED_MEAN, 0.5, trim, err), -1);
    /* over maps of files, letting the pages read go block by block: the
     * same floats */
    const uint8_t *maps[U];
    for (int u = 0; u < U; u++) {
        char path[] = "/tmp/strait-aggregate-XXXXXX";
        int fd = mkstemp(path);
        cr_assert_geq(fd, 0);
        unlink(path);
        cr_assert_eq(write(fd, b[u].data, b[u].len), (ssize_t)b[u].len);
        maps[u] = mmap(NULL, b[u].len, PROT_READ, MAP_PRIVATE, fd, 0);
        cr_assert_neq(maps[u], MAP_FAILED);
        close(fd);
    }
    float *m3 = malloc(n * 4), *t3 = malloc(n * 4);
    cr_assert_eq(robust_aggregate_maps(maps, lens, U, n, AGG_MEDIAN, 0, m3, err), 0, "%s", err);
    cr_assert_eq(robust_aggregate_maps(maps, lens, U, n, AGG_TRIMMED_MEAN, 0.2, t3, err), 0, "%s",
                 err);
    cr_assert_eq(memcmp(m3, med, n * 4), 0, "the median over maps differs");
    cr_assert_eq(memcmp(t3, trim, n * 4), 0, "the trimmed mean over maps differs");
    for (int u = 0; u < U; u++) munmap((void *)maps[u], lens[u]);
    free(m3), free(t3);
    for (int u = 0; u < U; u++) blob_free(&b[u]), free(x[u]);
    free(med), free(trim);
}

/* Up to SORT_MAX updates the columns are sorted side by side by a sorting
 * network, past a few dozen each is selected: either way the median is the
 * very value an insertion sort gives (ties, an even count and hostile
 * outliers included), the trimmed mean the same within the sum's rounding. */
Test(aggregate, many_updates_are_selected_as_a_sort_would) {
    uint64_t n = 3000;
    static const int counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 23, 24, 25, 40, 41};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        int U = counts[c];
        float **x = malloc(sizeof *x * U);
        Blob *b = malloc(sizeof *b * U);
        const uint8_t **blobs = malloc(sizeof *blobs * U);
        size_t *lens = malloc(sizeof *lens * U);
        uint64_t r = 12345;
        for (int u = 0; u < U; u++) {
            x[u] = malloc(n * 4);
            for (uint64_t i = 0; i < n; i++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                x[u][i] = i % 3 == 0 ? (float)(r % 5)        /* many ties */
                          : u < 4    ? 1e6f * (float)(u + 1) /* outliers */
                                     : (float)((int64_t)(r >> 40) - (1 << 23)) * 1e-7f;
            }
            b[u] = encode(x[u], n, HASH);
            blobs[u] = b[u].data, lens[u] = b[u].len;
        }
        float *med = malloc(n * 4), *trim = malloc(n * 4), *col = malloc(sizeof *col * U);
        char err[ERR_LEN];
        cr_assert_eq(robust_aggregate(blobs, lens, U, n, AGG_MEDIAN, 0, med, err), 0, "%s", err);
        cr_assert_eq(robust_aggregate(blobs, lens, U, n, AGG_TRIMMED_MEAN, 0.1, trim, err), 0, "%s",
                     err);
        int drop = aggregate_trim_count(0.1, U);
        for (uint64_t i = 0; i < n; i++) {
            for (int u = 0; u < U; u++) col[u] = x[u][i];
            for (int p = 1; p < U; p++) /* insertion sort, the reference */
                for (int q = p; q > 0 && col[q - 1] > col[q]; q--) {
                    float t = col[q];
                    col[q] = col[q - 1];
                    col[q - 1] = t;
                }
            float want = U % 2 ? col[U / 2] : 0.5f * (col[U / 2 - 1] + col[U / 2]);
            cr_assert(memcmp(&med[i], &want, 4) == 0, "U %d median at %llu: %a, sorted %a", U,
                      (unsigned long long)i, med[i], want);
            double s = 0;
            for (int u = drop; u < U - drop; u++) s += col[u];
            float tw = (float)(s / (U - 2 * drop));
            cr_assert_float_eq(trim[i], tw, 1e-6 * (1 + fabs(tw)), "U %d trimmed at %llu", U,
                               (unsigned long long)i);
        }
        for (int u = 0; u < U; u++) blob_free(&b[u]), free(x[u]);
        free(x), free(b), free(blobs), free(lens), free(med), free(trim), free(col);
    }
}

Test(aggregate, outer_optimizers) {
    char err[ERR_LEN];
    OuterOpt o;
    /* FedAvg with η = 1 gives the mean of the sites' models */
    float theta[2] = {1, 2}, local[2][2] = {{0, 0}, {2, 2}}, d[2];
    for (int i = 0; i < 2; i++) d[i] = ((theta[i] - local[0][i]) + (theta[i] - local[1][i])) / 2;
    cr_assert_eq(outer_init(&o, OUTER_AVG, 2, 1.0f, 0, err), 0);
    outer_step(&o, theta, d);
    cr_assert_float_eq(theta[0], 1.0f, 1e-7);
    cr_assert_float_eq(theta[1], 1.0f, 1e-7);
    outer_free(&o);
    /* Nesterov (DiLoCo: η 0.7, μ 0.9): b ← μb + Δ; θ ← θ − η(Δ + μb) */
    float t[1] = {0}, g[1] = {1};
    cr_assert_eq(outer_init(&o, OUTER_NESTEROV, 1, 0.7f, 0.9f, err), 0);
    outer_step(&o, t, g);
    cr_assert_float_eq(t[0], -0.7f * (1 + 0.9f * 1), 1e-6);
    outer_step(&o, t, g); /* b = 1.9 */
    cr_assert_float_eq(t[0], -0.7f * 1.9f - 0.7f * (1 + 0.9f * 1.9f), 1e-5);
    outer_free(&o);
    /* Adam's first step moves every coordinate by about η, whatever its scale */
    float a[2] = {0, 0}, ga[2] = {1e-3f, -50};
    cr_assert_eq(outer_init(&o, OUTER_ADAM, 2, 0.01f, 0, err), 0);
    outer_step(&o, a, ga);
    cr_assert_float_eq(a[0], -0.01f, 1e-5);
    cr_assert_float_eq(a[1], 0.01f, 1e-5);
    outer_free(&o);
    OuterKind k;
    cr_assert_eq(outer_kind_parse("nesterov", &k), 0);
    cr_assert_eq(k, OUTER_NESTEROV);
    cr_assert_eq(outer_kind_parse("sgd-ish", &k), -1);
    cr_assert_eq(outer_init(&o, OUTER_AVG, 2, 0, 0, err), -1);
}

Test(aggregate_rules, one_table_names_every_rule_and_how_it_runs) {
    const char *names[] = {"mean", "median", "trimmed_mean"};
    for (int i = 0; i < 3; i++) {
        AggregateRule r;
        cr_assert_eq(aggregate_rule_parse(names[i], &r), 0, "%s", names[i]);
        cr_assert_str_eq(aggregate_rule_name(r), names[i]);
        cr_assert_eq(aggregate_rule_keeps_updates(r), r != AGG_MEAN, "%s", names[i]);
        cr_assert_not_null(strstr(aggregate_rule_names(), names[i]));
    }
    AggregateRule r;
    cr_assert_eq(aggregate_rule_parse("krum", &r), -1);
    cr_assert_eq(aggregate_rule_parse("Mean", &r), -1);
    /* the mean streams: asked to run coordinate-wise, it is refused, not
     * silently run as another rule */
    char err[ERR_LEN];
    float out[4];
    const uint8_t *blobs[1] = {(const uint8_t *)"x"};
    size_t lens[1] = {1};
    cr_assert_eq(robust_aggregate(blobs, lens, 1, 4, AGG_MEAN, 0, out, err), -1);
    cr_assert_not_null(strstr(err, "mean is not a coordinate-wise rule"), "%s", err);
}

/* trim = 0.1 of three updates is floor(0.3) = 0: a plain mean, with the
 * docs promising robustness. A trim asked for removes at least one from
 * each end once there are three. */
Test(aggregate, a_trim_removes_one_from_each_end_of_three) {
    cr_assert_eq(aggregate_trim_count(0.1, 3), 1);
    cr_assert_eq(aggregate_trim_count(0.1, 2), 0, "two updates have nothing to trim to");
    cr_assert_eq(aggregate_trim_count(0.25, 8), 2);
    cr_assert_eq(aggregate_trim_count(0.1, 25), 2);
    cr_assert_eq(aggregate_trim_count(0, 5), 0, "no trim asked for");
    uint64_t n = 5000;
    enum { U = 3 };
    float *x[U];
    Blob b[U];
    const uint8_t *blobs[U];
    size_t lens[U];
    for (int u = 0; u < U; u++) {
        x[u] = vec(n, (float)u, 0.1f);
        if (u == 2)
            for (uint64_t i = 0; i < n; i++) x[u][i] = 1e6f; /* a hostile site */
        b[u] = encode(x[u], n, HASH);
        blobs[u] = b[u].data, lens[u] = b[u].len;
    }
    float *trim = malloc(n * 4), *med = malloc(n * 4);
    char err[ERR_LEN];
    cr_assert_eq(robust_aggregate(blobs, lens, U, n, AGG_TRIMMED_MEAN, 0.1, trim, err), 0, "%s",
                 err);
    cr_assert_eq(robust_aggregate(blobs, lens, U, n, AGG_MEDIAN, 0, med, err), 0, "%s", err);
    cr_assert_eq(memcmp(trim, med, n * 4), 0, "a trimmed mean of three is their median");
    for (uint64_t i = 0; i < n; i++)
        cr_assert_lt(trim[i], 1e5f, "the outlier leaked at %llu", (unsigned long long)i);
    for (int u = 0; u < U; u++) free(x[u]), blob_free(&b[u]);
    free(trim), free(med);
}
