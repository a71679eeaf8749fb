/*
 * aggregate.c — the coordinator's aggregation of N sites' updates, one JSON
 * line per (codec, N, rule, baseline), beside what a Flower user runs on the
 * same sizes in the same run: Flower 1.42's own functions (flwr from PyPI,
 * bench/flower_aggregate.py says how each is called): the mean against
 * FedAvg.aggregate_train (its current Message API) and against the legacy
 * aggregate_inplace, the median against aggregate_median (FedMedian), the
 * trimmed mean (0.1 from each end) against aggregate_trimmed_avg
 * (FedTrimmedAvg). Flower aggregates fp32 arrays whatever Strait's codec:
 * Strait's int8 lines compare what each sends over the wire.
 *
 * Both sides are warm: each case runs REPS times in its process, the first
 * repetition reported apart (first_seconds), seconds the median of the
 * others. ratio is the baseline's seconds over Strait's (above 1: Strait is
 * faster). The mean's lines also carry close_seconds, what is left once the
 * last update arrives (its check-and-add and the division: the round's
 * wait for its aggregate, the rest done while the others arrived), and
 * close_ratio, the baseline's seconds over it (Flower aggregates once every
 * result is in: all of its time is after the last arrival). read_once_s is
 * the time to read every input byte once (a 64-bit sum over the N blobs,
 * all cores), so vs_read_once says how far the rule is from the memory's
 * own speed.
 *
 * peak_rss_mb is the process's, which holds the bench's own inputs (the
 * blobs, the source vector and the result): inputs_rss_mb is that peak once
 * they are built, so the aggregation's own memory is the difference; the
 * baseline's two are its process's, likewise (peak so far: its cases run in
 * the order above).
 *
 * The mean is the coordinator's streaming path (RoundSum: each update read
 * once as it arrives — checksums, finite values and norm checked and the
 * update added into the sum's stage section by section, the stage swapped
 * in when the gates pass; a fresh sum each repetition, its first pages
 * paid as a round pays them, and the stage handed on from the repetition
 * before, as a closed round hands it to the next); median and trimmed mean are
 * robust_aggregate over the N blobs, as the coordinator runs them over the
 * kept files. The N updates are four distinct encoded updates taken in turn
 * (memory stays four blobs; Flower's side likewise references four arrays).
 *
 *   build/bench/aggregate [--full]
 *     25 M values (a 100 MB model), N 4 and 16; --full: GPT-2 124M's
 *     124 439 808 values, N 4, 16 and 64
 *
 * STRAIT_BENCH_PYTHON names the Python with flwr (make bench sets it to
 * build/venv-bench's); without one the lines say so and carry no ratio.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compress/compress.h"
#include "coordinator/coordinator.h"
#include "bench/bench.h"
#include "util/util.h"

#define DISTINCT 4
#define REPS     5

/* One Flower function's figures. */
typedef struct Baseline {
    char fn[64];
    double median_s, first_s, peak_rss_mb, inputs_rss_mb;
} Baseline;

enum { FL_TRAIN, FL_INPLACE, FL_MEDIAN, FL_TRIMMED, FL_N };
static const char *const fl_names[FL_N] = {"flwr FedAvg.aggregate_train", "flwr aggregate_inplace",
                                           "flwr aggregate_median", "flwr aggregate_trimmed_avg"};

/* Runs bench/flower_aggregate.py for n values and N sites; 0 with out[]
 * filled, or -1 with why. */
static int flower(uint64_t n, int N, Baseline out[FL_N], char *why, size_t why_len) {
    const char *py = getenv("STRAIT_BENCH_PYTHON"), *src = getenv("STRAIT_SRC");
    if (py == NULL || !py[0]) {
        snprintf(why, why_len,
                 "no Flower baseline: STRAIT_BENCH_PYTHON unset (make bench sets it)");
        return -1;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s/bench/flower_aggregate.py %llu %d %d 2>&1", py,
             src && src[0] ? src : ".", (unsigned long long)n, N, REPS);
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        snprintf(why, why_len, "no Flower baseline: cannot run %s", py);
        return -1;
    }
    memset(out, 0, sizeof(Baseline) * FL_N);
    char line[4096], last[300] = "";
    int got = 0;
    while (fgets(line, sizeof line, p)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        const char *fn = o ? json_string_value(json_object_get(o, "fn")) : NULL;
        for (int k = 0; fn && k < FL_N; k++)
            if (strcmp(fn, fl_names[k]) == 0) {
                snprintf(out[k].fn, sizeof out[k].fn, "%s", fn);
                out[k].median_s = json_number_value(json_object_get(o, "median_s"));
                out[k].first_s = json_number_value(json_object_get(o, "first_s"));
                out[k].peak_rss_mb = json_number_value(json_object_get(o, "peak_rss_mb"));
                out[k].inputs_rss_mb = json_number_value(json_object_get(o, "inputs_rss_mb"));
                got |= 1 << k;
            }
        if (fn == NULL) {
            line[strcspn(line, "\n")] = 0;
            snprintf(last, sizeof last, "%.290s", line);
        }
        json_decref(o);
    }
    int st = pclose(p);
    if (got != (1 << FL_N) - 1) {
        snprintf(why, why_len, "no Flower baseline (exit %d): %s", st,
                 last[0] ? last : "no output");
        return -1;
    }
    return 0;
}

/* Seconds to read every byte of the N inputs once, the best of three. */
static double read_once_s(const uint8_t *const *bp, const size_t *lens, int N) {
    double best = INFINITY;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        uint64_t t0 = time_monotonic_ns(), total = 0;
        for (int u = 0; u < N; u++) {
            const uint64_t *w = (const uint64_t *)bp[u];
            size_t words = lens[u] / 8;
            uint64_t acc = 0;
#pragma omp parallel for reduction(+ : acc) schedule(static)
            for (size_t i = 0; i < words; i++) acc += w[i];
            total += acc;
        }
        sink += total;
        double s = (double)(time_monotonic_ns() - t0) / 1e9;
        if (s < best) best = s;
    }
    (void)sink;
    return best;
}

static double inputs_rss_mb; /* peak RSS once a codec's inputs are built, before it runs */

/* Strait's figures for one case: REPS runs, the first apart. */
typedef struct Timing {
    double median_s, first_s;
} Timing;

static void emit(const char *codec, int N, uint64_t n, const char *rule, Timing t, double read_s,
                 const Timing *close, const Baseline *b, const char *why) {
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("aggregate"));
    json_object_set_new(o, "case", json_string(rule));
    json_object_set_new(o, "codec", json_string(codec));
    json_object_set_new(o, "sites", json_integer(N));
    json_object_set_new(o, "values", json_integer((json_int_t)n));
    json_object_set_new(o, "seconds", json_real(t.median_s));
    json_object_set_new(o, "first_seconds", json_real(t.first_s));
    json_object_set_new(o, "reps", json_integer(REPS));
    json_object_set_new(o, "values_per_s", json_real((double)N * (double)n / t.median_s));
    json_object_set_new(o, "read_once_s", json_real(read_s));
    json_object_set_new(o, "vs_read_once", json_real(t.median_s / read_s));
    json_object_set_new(o, "peak_rss_mb", json_real(bench_peak_rss_mb()));
    json_object_set_new(o, "inputs_rss_mb", json_real(inputs_rss_mb));
    json_object_set_new(o, "model_mb", json_real(4.0 * (double)n / 1048576.0));
    if (close) json_object_set_new(o, "close_seconds", json_real(close->median_s));
    if (b) {
        json_object_set_new(o, "baseline", json_string(b->fn));
        json_object_set_new(o, "baseline_seconds", json_real(b->median_s));
        json_object_set_new(o, "baseline_first_seconds", json_real(b->first_s));
        json_object_set_new(o, "baseline_peak_rss_mb", json_real(b->peak_rss_mb));
        json_object_set_new(o, "baseline_inputs_rss_mb", json_real(b->inputs_rss_mb));
        json_object_set_new(o, "ratio", json_real(b->median_s / t.median_s));
        if (close) json_object_set_new(o, "close_ratio", json_real(b->median_s / close->median_s));
    } else {
        json_object_set_new(o, "baseline", json_string(why));
    }
    json_emit_line(stdout, o);
}

/* The streaming mean as the coordinator runs it: each update checked,
 * added into the stage and gated in one read, as it arrives. */
static float *spare_stage; /* the stage a round hands the next, as rounds.c does */

static double mean_once(const uint8_t *const *bp, const size_t *lens, int N, uint64_t n, float *out,
                        double *close_s) {
    char err[ERR_LEN];
    RoundSum rs;
    if (round_sum_init(&rs, n, 0x5eed, 0, err) != 0) DIE("%s", err);
    rs.stage = spare_stage, spare_stage = NULL;
    uint64_t t0 = time_monotonic_ns(), last = t0;
    for (int u = 0; u < N; u++) {
        char why[ERR_LEN];
        if (u == N - 1) last = time_monotonic_ns();
        if (round_sum_add(&rs, bp[u], lens[u], (double)(1 + u % 3), why) != 0)
            DIE("update %d refused: %s", u, why);
    }
    if (round_sum_mean(&rs, out, err) != 0) DIE("%s", err);
    uint64_t t1 = time_monotonic_ns();
    double s = (double)(t1 - t0) / 1e9;
    *close_s = (double)(t1 - last) / 1e9;
    spare_stage = rs.stage, rs.stage = NULL;
    round_sum_free(&rs);
    return s;
}

static double robust_once(const uint8_t *const *bp, const size_t *lens, int N, uint64_t n,
                          AggregateRule rule, float *out) {
    char err[ERR_LEN];
    uint64_t t0 = time_monotonic_ns();
    if (robust_aggregate(bp, lens, N, n, rule, 0.1, out, err) != 0) DIE("%s", err);
    return (double)(time_monotonic_ns() - t0) / 1e9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static Timing timing(const double *s) {
    double rest[REPS - 1];
    memcpy(rest, s + 1, sizeof rest);
    qsort(rest, REPS - 1, sizeof *rest, cmp_double);
    int m = (REPS - 1) / 2;
    Timing t = {(REPS - 1) % 2 ? rest[m] : 0.5 * (rest[m - 1] + rest[m]), s[0]};
    return t;
}

int main(int argc, char **argv) {
    int full = argc > 1 && strcmp(argv[1], "--full") == 0;
    log_set_level(LOG_ERROR);
    uint64_t n = full ? 124439808ull : 25000000ull;
    int sites[3] = {4, 16, 64}, n_sites = full ? 3 : 2;
    float *x = mallocCheck(n * 4), *out = mallocCheck(n * 4);
    char err[ERR_LEN];
    /* Flower first, in its own process, so that its inputs are not this one's */
    Baseline fl[3][FL_N];
    char why[3][400] = {"", "", ""};
    int have[3];
    for (int k = 0; k < n_sites; k++)
        have[k] = flower(n, sites[k], fl[k], why[k], sizeof why[k]) == 0;
    const char *codecs[] = {"int8", "fp32"};
    for (int c = 0; c < 2; c++) {
        CodecParams p;
        if (codec_params_parse(codecs[c], &p, err) != 0) DIE("%s", err);
        CodecLayout L = {0x5eed, n, NULL, 0};
        Blob blobs[DISTINCT] = {{0}};
        uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(c + 1);
        for (int d = 0; d < DISTINCT; d++) {
            for (uint64_t i = 0; i < n; i++) { /* a pseudo-gradient: small, sign-mixed */
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                x[i] = 0.01f * ((float)(s >> 40) / 8388608.0f - 1.0f);
            }
            if (codec_encode(&p, &L, x, &blobs[d], err) != 0) DIE("%s", err);
        }
        memset(out, 0, n * 4); /* the result's pages are the bench's, not the aggregation's */
        inputs_rss_mb = bench_peak_rss_mb();
        for (int k = 0; k < n_sites; k++) {
            int N = sites[k];
            const uint8_t **bp = mallocCheck(sizeof *bp * (size_t)N);
            size_t *lens = mallocCheck(sizeof *lens * (size_t)N);
            for (int u = 0; u < N; u++)
                bp[u] = blobs[u % DISTINCT].data, lens[u] = blobs[u % DISTINCT].len;
            double read_s = read_once_s(bp, lens, N), secs[REPS], closing[REPS];
            for (int r = 0; r < REPS; r++) secs[r] = mean_once(bp, lens, N, n, out, &closing[r]);
            Timing t = timing(secs), close = timing(closing);
            emit(codecs[c], N, n, "mean", t, read_s, &close, have[k] ? &fl[k][FL_TRAIN] : NULL,
                 why[k]);
            emit(codecs[c], N, n, "mean", t, read_s, &close, have[k] ? &fl[k][FL_INPLACE] : NULL,
                 why[k]);
            const AggregateRule rules[] = {AGG_MEDIAN, AGG_TRIMMED_MEAN};
            const int against[] = {FL_MEDIAN, FL_TRIMMED};
            for (int r = 0; r < 2; r++) {
                for (int i = 0; i < REPS; i++) secs[i] = robust_once(bp, lens, N, n, rules[r], out);
                emit(codecs[c], N, n, aggregate_rule_name(rules[r]), timing(secs), read_s, NULL,
                     have[k] ? &fl[k][against[r]] : NULL, why[k]);
            }
            free(bp), free(lens);
        }
        for (int d = 0; d < DISTINCT; d++) blob_free(&blobs[d]);
    }
    free(x), free(out), free(spare_stage);
    return 0;
}
