/*
 * aggregate.c — the coordinator's aggregation of N sites' updates, one JSON
 * line per (codec, N, rule): seconds per round, values per second, the
 * process's peak RSS so far, beside the baseline of the issue measured in
 * the same run: a numpy weighted mean of the same N fp32 arrays, the way
 * Python federated frameworks aggregate (Flower's aggregate(): each array
 * times its weight, reduced with np.add, divided by the total).
 *
 * peak_rss_mb is the process's, which holds the bench's own inputs (the
 * blobs, the source vector and the result): inputs_rss_mb is that peak once
 * they are built, so the aggregation's own memory is the difference.
 *
 * The mean is the coordinator's streaming path (RoundSum: each update gated
 * — checksums, finite values, norm — then accumulated from what its
 * inspection kept, as it arrives); median and trimmed mean are robust_aggregate over the N blobs,
 * as the coordinator runs them over the kept files. The N updates are four
 * distinct encoded updates taken in turn (memory stays four blobs).
 *
 *   build/bench/aggregate [--full]
 *     2^24 values (a 64 MB model), N 4 and 16; --full: GPT-2 124M's
 *     124 439 808 values, N 4, 16 and 64
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "compress/compress.h"
#include "coordinator/coordinator.h"
#include "util/util.h"

#define DISTINCT 4

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

/* numpy's weighted mean of N fp32 arrays of n values: seconds, or NAN with
 * the reason in why when there is no Python with numpy. */
static double numpy_mean_s(uint64_t n, int N, char *why, size_t why_len) {
    const char *py = getenv("STRAIT_PYTHON");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s -c 'import numpy as np, time, functools\n"
             "n, N = %llu, %d\n"
             "rng = np.random.default_rng(1)\n"
             "base = [rng.standard_normal(n, dtype=np.float32) * np.float32(0.01) for _ in "
             "range(%d)]\n"
             "xs = [base[i %% %d] for i in range(N)]\n"
             "ws = [float(1 + i %% 3) for i in range(N)]\n"
             "t = time.perf_counter()\n"
             "weighted = [x * w for x, w in zip(xs, ws)]\n"
             "mean = functools.reduce(np.add, weighted) / sum(ws)\n"
             "print(time.perf_counter() - t)' 2>&1",
             py && py[0] ? py : "build/venv/bin/python", (unsigned long long)n, N, DISTINCT,
             DISTINCT);
    FILE *p = popen(cmd, "r");
    double s = NAN;
    char line[512] = "";
    if (p) {
        if (fgets(line, sizeof line, p) == NULL) line[0] = '\0';
        pclose(p);
        char *end;
        s = strtod(line, &end);
        if (end == line) s = NAN;
    }
    if (isnan(s)) snprintf(why, why_len, "no numpy baseline: %.200s", line[0] ? line : "no python");
    return s;
}

static double inputs_rss_mb; /* peak RSS once a codec's inputs are built, before it runs */

static void emit(const char *codec, int N, uint64_t n, const char *rule, double secs,
                 double baseline_s, const char *why) {
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("aggregate"));
    json_object_set_new(o, "case", json_string(rule));
    json_object_set_new(o, "codec", json_string(codec));
    json_object_set_new(o, "sites", json_integer(N));
    json_object_set_new(o, "values", json_integer((json_int_t)n));
    json_object_set_new(o, "seconds", json_real(secs));
    json_object_set_new(o, "values_per_s", json_real((double)N * (double)n / secs));
    json_object_set_new(o, "peak_rss_mb", json_real(peak_rss_mb()));
    json_object_set_new(o, "inputs_rss_mb", json_real(inputs_rss_mb));
    json_object_set_new(o, "model_mb", json_real(4.0 * (double)n / 1048576.0));
    if (!isnan(baseline_s)) {
        json_object_set_new(o, "baseline", json_string("numpy weighted mean of N fp32 arrays"));
        json_object_set_new(o, "baseline_seconds", json_real(baseline_s));
        json_object_set_new(o, "ratio", json_real(baseline_s / secs));
    } else if (why && why[0]) {
        json_object_set_new(o, "baseline", json_string(why));
    }
    json_emit_line(stdout, o);
}

int main(int argc, char **argv) {
    int full = argc > 1 && strcmp(argv[1], "--full") == 0;
    log_set_level(LOG_ERROR);
    uint64_t n = full ? 124439808ull : (1ull << 24);
    int sites[3] = {4, 16, 64}, n_sites = full ? 3 : 2;
    float *x = mallocCheck(n * 4), *out = mallocCheck(n * 4);
    char err[ERR_LEN];
    double numpy_s[3];
    char why[3][300] = {"", "", ""};
    for (int k = 0; k < n_sites; k++) numpy_s[k] = numpy_mean_s(n, sites[k], why[k], sizeof why[k]);
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
        inputs_rss_mb = peak_rss_mb();
        for (int k = 0; k < n_sites; k++) {
            int N = sites[k];
            const uint8_t **bp = mallocCheck(sizeof *bp * (size_t)N);
            size_t *lens = mallocCheck(sizeof *lens * (size_t)N);
            for (int u = 0; u < N; u++)
                bp[u] = blobs[u % DISTINCT].data, lens[u] = blobs[u % DISTINCT].len;
            /* the streaming mean as the coordinator runs it: each update gated
             * (inspected whole: checksums, finite values, norms) then
             * decode-accumulated as it arrives */
            RoundSum rs;
            if (round_sum_init(&rs, n, 0x5eed, 0, err) != 0) DIE("%s", err);
            uint64_t t0 = time_monotonic_ns();
            for (int u = 0; u < N; u++) {
                char why[ERR_LEN];
                if (round_sum_add(&rs, bp[u], lens[u], (double)(1 + u % 3), why) != 0)
                    DIE("update %d refused: %s", u, why);
            }
            if (round_sum_mean(&rs, out, err) != 0) DIE("%s", err);
            double mean_s = (double)(time_monotonic_ns() - t0) / 1e9;
            round_sum_free(&rs);
            emit(codecs[c], N, n, "mean", mean_s, numpy_s[k], why[k]);
            const AggregateRule rules[] = {AGG_MEDIAN, AGG_TRIMMED_MEAN};
            for (int r = 0; r < 2; r++) {
                t0 = time_monotonic_ns();
                if (robust_aggregate(bp, lens, N, n, rules[r], 0.1, out, err) != 0) DIE("%s", err);
                double secs = (double)(time_monotonic_ns() - t0) / 1e9;
                emit(codecs[c], N, n, aggregate_rule_name(rules[r]), secs, NAN, "");
            }
            free(bp), free(lens);
        }
        for (int d = 0; d < DISTINCT; d++) blob_free(&blobs[d]);
    }
    free(x), free(out);
    return 0;
}
