/*
 * codec.c — benchmark of the update codecs on a 25 M-value update (Gaussian,
 * σ = 0.01, like a pseudo-gradient), one JSON line per codec and thread
 * count: encode and decode-accumulate throughput in GB/s of fp32 input,
 * beside single-thread memcpy bandwidth measured right before each row (the
 * machine's bandwidth drifts by a third over a run on a shared host), the ratio
 * per thread (throughput / threads / memcpy), bytes on the wire relative to
 * fp32, and the relative L2 error of the decoded update.
 *
 * Then the lossless model delta the coordinator serves each round
 * (ckpt_encode of θ' against θ, θ' = θ + a round's step of the same scale
 * as the pseudo-gradient), encode and decode into a resident model, against
 * zstd level 1 of θ' whole (what a plain compressed download costs), same
 * data, same run; and a sender's error-feedback step (ef_encode) beside the
 * same step spelt out in separate passes.
 *
 *   build/bench/codec [--full] [--zstd LEVEL]
 *     25 M values (100 M with --full); each codec without the lossless stage
 *     and at its default zstd level, or only at LEVEL (0: off)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef STRAIT_HAVE_OPENMP
#include <omp.h>
#endif

#include <zstd.h>

#include "bench/bench.h"
#include "compress/compress.h"
#include "util/util.h"

#define REPEAT 3

static double median3(double a, double b, double c) {
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

static double secs_since(uint64_t t0) {
    return (double)(time_monotonic_ns() - t0) / 1e9;
}

/* ckpt_encode / ckpt_decode_into of theta2 against theta beside zstd -1 of
 * theta2 whole: one JSON line */
static void checkpoint_delta(const float *theta, const float *theta2, float *back, uint64_t n,
                             int threads) {
    char err[ERR_LEN];
    size_t len = n * 4, bound = ZSTD_compressBound(len);
    uint8_t *z = mallocCheck(bound);
    Blob d = {0};
    double te[REPEAT], td[REPEAT], ze[REPEAT], zd[REPEAT];
    size_t zlen = 0;
    for (int r = 0; r < REPEAT; r++) {
        uint64_t t0 = time_monotonic_ns();
        if (ckpt_encode(theta2, len, 4, theta, 1, &d, err) != 0) DIE("%s", err);
        te[r] = secs_since(t0);
        t0 = time_monotonic_ns();
        if (ckpt_decode_into(d.data, d.len, theta, len, back, len, err) != 0) DIE("%s", err);
        td[r] = secs_since(t0);
        if (memcmp(back, theta2, len) != 0) DIE("checkpoint delta did not round-trip");
        t0 = time_monotonic_ns();
        zlen = ZSTD_compress(z, bound, theta2, len, 1);
        ze[r] = secs_since(t0);
        if (ZSTD_isError(zlen)) DIE("zstd: %s", ZSTD_getErrorName(zlen));
        t0 = time_monotonic_ns();
        size_t got = ZSTD_decompress(back, len, z, zlen);
        zd[r] = secs_since(t0);
        if (got != len) DIE("zstd did not round-trip");
    }
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("codec"));
    json_object_set_new(o, "case", json_string("checkpoint_delta"));
    json_object_set_new(o, "n", json_integer((json_int_t)n));
    json_object_set_new(o, "threads", json_integer(threads));
    json_object_set_new(o, "encode_s", json_real(median3(te[0], te[1], te[2])));
    json_object_set_new(o, "decode_s", json_real(median3(td[0], td[1], td[2])));
    json_object_set_new(o, "bytes_ratio", json_real((double)d.len / (double)len));
    json_object_set_new(o, "baseline", json_string("zstd -1 of the whole new model, 1 thread"));
    json_object_set_new(o, "baseline_encode_s", json_real(median3(ze[0], ze[1], ze[2])));
    json_object_set_new(o, "baseline_decode_s", json_real(median3(zd[0], zd[1], zd[2])));
    json_object_set_new(o, "baseline_bytes_ratio", json_real((double)zlen / (double)len));
    json_emit_line(stdout, o);
    blob_free(&d);
    free(z);
}

/* A sender's error-feedback step with codec `name` on Δ = theta - local,
 * ef_encode's one pass per section, beside the step spelt out as a
 * federated framework writes it: Δ into a buffer, e = βe + Δ, C(e), then
 * e -= decode(C(e)) from the blob. Both start from the same residual; the
 * blobs and residuals must be the same bytes. One JSON line. */
static void error_feedback_row(const char *name, const float *theta, const float *local, uint64_t n,
                               int threads) {
    char err[ERR_LEN];
    CodecParams p;
    if (codec_params_parse(name, &p, err) != 0) DIE("%s", err);
    CodecLayout L = {0x1234, n, NULL, 0};
    ErrorFeedback one, two;
    if (ef_init(&one, n, 0x1234, 0.9f, err) != 0 || ef_init(&two, n, 0x1234, 0.9f, err) != 0)
        DIE("%s", err);
    float *delta = mallocCheck(n * 4);
    memset(one.e, 0, n * 4), memset(two.e, 0, n * 4), memset(delta, 0, n * 4); /* no first-touch */
    Blob a = {0}, b = {0};
    double tf[REPEAT], ts[REPEAT];
    int same = 1;
    for (int r = 0; r < REPEAT; r++) {
        uint64_t t0 = time_monotonic_ns();
        if (ef_encode(&one, &p, &L, theta, local, NULL, &a, err) != 0) DIE("%s", err);
        tf[r] = secs_since(t0);
        t0 = time_monotonic_ns();
        for (uint64_t i = 0; i < n; i++) delta[i] = theta[i] - local[i];
        for (uint64_t i = 0; i < n; i++) two.e[i] = 0.9f * two.e[i] + delta[i];
        if (codec_encode(&p, &L, two.e, &b, err) != 0 ||
            codec_decode_accumulate(b.data, b.len, -1.0f, two.e, n, err) != 0)
            DIE("%s", err);
        ts[r] = secs_since(t0);
        same = same && a.len == b.len && memcmp(a.data, b.data, a.len) == 0 &&
               memcmp(one.e, two.e, n * 4) == 0;
    }
    double f = median3(tf[0], tf[1], tf[2]), sp = median3(ts[0], ts[1], ts[2]);
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("codec"));
    json_object_set_new(o, "case", json_string("error_feedback"));
    json_object_set_new(o, "codec", json_string(name));
    json_object_set_new(o, "zstd", json_integer(p.zstd_level));
    json_object_set_new(o, "n", json_integer((json_int_t)n));
    json_object_set_new(o, "threads", json_integer(threads));
    json_object_set_new(o, "seconds", json_real(f));
    json_object_set_new(o, "baseline",
                        json_string("the step spelt out: delta buffer, e = b*e + "
                                    "delta, encode, decode-accumulate of the blob"));
    json_object_set_new(o, "baseline_seconds", json_real(sp));
    json_object_set_new(o, "speedup", json_real(sp / f));
    json_object_set_new(o, "same_bytes_and_residual", json_boolean(same));
    json_emit_line(stdout, o);
    blob_free(&a), blob_free(&b);
    ef_free(&one), ef_free(&two);
    free(delta);
}

static double memcpy_gbps(const float *src, float *dst, uint64_t n) {
    double t[REPEAT];
    for (int r = 0; r < REPEAT; r++) {
        uint64_t t0 = time_monotonic_ns();
        memcpy(dst, src, n * 4);
        t[r] = (double)(time_monotonic_ns() - t0) / 1e9;
        __asm__ volatile("" : : "r"(dst) : "memory");
    }
    return 4.0 * (double)n / median3(t[0], t[1], t[2]) / 1e9;
}

int main(int argc, char **argv) {
    int full = 0, zstd = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--full") == 0)
            full = 1;
        else if (strcmp(argv[i], "--zstd") == 0 && i + 1 < argc)
            zstd = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--full] [--zstd LEVEL]\n", argv[0]);
            return 2;
        }
    }
    uint64_t n = full ? 100000000ull : 25000000ull;
    log_set_level(LOG_ERROR);
    float *x = mallocCheck(n * 4), *sum = mallocCheck(n * 4), *y = mallocCheck(n * 4);
    bench_pseudo_gradient(x, n);
    memset(sum, 0, n * 4);
    memset(y, 0, n * 4);
    int max_threads = 1;
#ifdef STRAIT_HAVE_OPENMP
    max_threads = omp_get_max_threads();
#endif
    const char *codecs[] = {"fp32", "fp16", "bf16", "int8", "topk", "topk2"};
    CodecLayout L = {0x1234, n, NULL, 0};
    char err[ERR_LEN];
    for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
        CodecParams p;
        if (codec_params_parse(codecs[c], &p, err) != 0) DIE("%s", err);
        int levels[2] = {0, p.zstd_level}, n_levels = 2;
        if (zstd >= 0) levels[0] = zstd, n_levels = 1;
        for (int li = 0; li < n_levels; li++) {
            p.zstd_level = levels[li];
            for (int threads = 1; threads <= max_threads;
                 threads = threads == 1 && max_threads > 1 ? max_threads : threads + max_threads) {
#ifdef STRAIT_HAVE_OPENMP
                omp_set_num_threads(threads);
#endif
                double mcpy = memcpy_gbps(x, y, n);
                Blob b = {0};
                double te[REPEAT], td[REPEAT];
                for (int r = 0; r < REPEAT; r++) {
                    uint64_t t0 = time_monotonic_ns();
                    if (codec_encode(&p, &L, x, &b, err) != 0) DIE("%s", err);
                    te[r] = (double)(time_monotonic_ns() - t0) / 1e9;
                    t0 = time_monotonic_ns();
                    if (codec_decode_accumulate(b.data, b.len, 0.25f, sum, n, err) != 0)
                        DIE("%s", err);
                    td[r] = (double)(time_monotonic_ns() - t0) / 1e9;
                }
                double enc = 4.0 * (double)n / median3(te[0], te[1], te[2]) / 1e9;
                double dec = 4.0 * (double)n / median3(td[0], td[1], td[2]) / 1e9;
                if (codec_decode(b.data, b.len, y, n, err) != 0) DIE("%s", err);
                double num = 0, den = 0;
                for (uint64_t i = 0; i < n; i++) {
                    double d = (double)x[i] - y[i];
                    num += d * d;
                    den += (double)x[i] * x[i];
                }
                json_t *o = json_object();
                json_object_set_new(o, "bench", json_string("codec"));
                json_object_set_new(o, "case", json_string(codecs[c]));
                json_object_set_new(o, "codec", json_string(codecs[c]));
                json_object_set_new(o, "n", json_integer((json_int_t)n));
                json_object_set_new(o, "threads", json_integer(threads));
                json_object_set_new(o, "isa", json_string(codec_isa()));
                json_object_set_new(o, "zstd", json_integer(p.zstd_level));
                json_object_set_new(o, "encode_gbps", json_real(enc));
                json_object_set_new(o, "decode_acc_gbps", json_real(dec));
                json_object_set_new(o, "memcpy_gbps", json_real(mcpy));
                json_object_set_new(o, "encode_ratio", json_real(enc / threads / mcpy));
                json_object_set_new(o, "decode_ratio", json_real(dec / threads / mcpy));
                json_object_set_new(o, "wire_bytes", json_integer((json_int_t)b.len));
                json_object_set_new(o, "bytes_ratio", json_real((double)b.len / (4.0 * (double)n)));
                json_object_set_new(o, "rel_l2_err", json_real(sqrt(num / den)));
                json_emit_line(stdout, o);
                blob_free(&b);
            }
        }
    }
    /* θ from a wider pseudo-gradient (weights of scale 0.1), θ' = θ + x */
    float *theta = sum;
    for (uint64_t i = 0; i < n; i++) theta[i] = 10.0f * x[(i * 7919) % n] + x[i] * 0.5f;
    for (uint64_t i = 0; i < n; i++) x[i] = theta[i] + 0.01f * x[i];
    for (int threads = 1; threads <= max_threads;
         threads = threads == 1 && max_threads > 1 ? max_threads : threads + max_threads) {
#ifdef STRAIT_HAVE_OPENMP
        omp_set_num_threads(threads);
#endif
        checkpoint_delta(theta, x, y, n, threads);
        /* θ_local = θ' here: a round's step of the pseudo-gradient's scale */
        error_feedback_row("int8", theta, x, n, threads);
        error_feedback_row("topk2", theta, x, n, threads);
    }
    free(x);
    free(y);
    free(sum);
    return 0;
}
