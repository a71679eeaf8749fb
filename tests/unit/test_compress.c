/*
 * test_compress.c — codecs: round trips (lossless bit-exact, lossy within
 * stated bounds on Gaussian and heavy-tailed inputs), fp16/bf16 rounding
 * against references, exact top-k selection, decode-accumulate equal to
 * decode + axpy bit for bit, error feedback that stays bounded, sizes on
 * the wire, determinism across thread counts, and every kind of malformed
 * blob refused with its reason.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <xxhash.h>
#include <zstd.h>
#ifdef STRAIT_HAVE_OPENMP
#include <omp.h>
#endif

#include "compress/compress.h"
#include "compress/compress_internal.h"
#include "tests/harness.h"
#include "util/util.h"

#define HASH 0x5157a17ab1e5ull

/* ---- inputs ------------------------------------------------------------ */

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double uniform(void) {
    return ((rng_next() >> 11) + 0.5) / 9007199254740992.0;
}
static float gaussian(void) {
    return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()));
}
/* Student-t with 3 degrees of freedom: heavy tails, finite variance */
static float heavy(void) {
    double z = gaussian(), chi = 0;
    for (int i = 0; i < 3; i++) {
        double g = gaussian();
        chi += g * g;
    }
    return (float)(z / sqrt(chi / 3.0));
}

static float *make_vec(uint64_t n, int kind, float scale) {
    float *x = malloc(n * sizeof *x);
    for (uint64_t i = 0; i < n; i++) x[i] = scale * (kind ? heavy() : gaussian());
    return x;
}

static double rel_l2(const float *x, const float *y, uint64_t n) {
    double num = 0, den = 0;
    for (uint64_t i = 0; i < n; i++) {
        double d = (double)x[i] - y[i];
        num += d * d;
        den += (double)x[i] * x[i];
    }
    return sqrt(num / den);
}

static CodecLayout flat(uint64_t n) {
    return (CodecLayout){HASH, n, NULL, 0};
}

static float *roundtrip(const CodecParams *p, const CodecLayout *L, const float *x, Blob *b) {
    char err[ERR_LEN];
    cr_assert_eq(codec_encode(p, L, x, b, err), 0, "%s", err);
    BlobInfo info;
    cr_assert_eq(codec_blob_inspect(b->data, b->len, L->table_hash, L->n, &info, err), 0, "%s",
                 err);
    cr_assert_eq(info.n, L->n);
    cr_assert_eq(info.params.id, p->id);
    float *y = malloc(L->n * sizeof *y);
    cr_assert_eq(codec_decode(b->data, b->len, y, L->n, err), 0, "%s", err);
    return y;
}

/* ---- lossless and cast codecs ------------------------------------------ */

/* The registry: every name it lists parses, names itself back, and makes
 * blobs whose header gives back the same parameters. */
Test(codec, every_registered_name_round_trips_through_a_blob) {
    char names[200], err[ERR_LEN];
    cr_assert_str_eq(codec_names(), "fp32, fp16, bf16, int8, topk or topk2");
    snprintf(names, sizeof names, "%s", codec_names());
    char * or = strstr(names, " or ");
    memcpy(or, ",   ", 4); /* one separator: ", " */
    float x[300];
    for (int i = 0; i < 300; i++) x[i] = sinf((float)i) * 0.01f;
    CodecLayout L = {0x1234, 300, NULL, 0};
    int seen = 0;
    for (char *save = NULL, *t = strtok_r(names, ", ", &save); t;
         t = strtok_r(NULL, ", ", &save), seen++) {
        CodecParams p, back;
        cr_assert_eq(codec_params_parse(t, &p, err), 0, "%s: %s", t, err);
        cr_assert_str_eq(codec_params_name(&p), t);
        cr_assert_eq(codec_params_check(&p, err), 0, "%s: %s", t, err);
        Blob b = {0};
        cr_assert_eq(codec_encode(&p, &L, x, &b, err), 0, "%s: %s", t, err);
        cr_assert_eq(codec_blob_params(b.data, b.len, &back, err), 0, "%s: %s", t, err);
        cr_assert_str_eq(codec_params_name(&back), t);
        cr_assert_eq(back.id, p.id);
        cr_assert_eq(back.block, p.block);
        cr_assert_eq(back.chunk, p.chunk);
        cr_assert_eq(back.value_bits, p.value_bits);
        cr_assert_float_eq(back.density, p.density, 1e-9);
        cr_assert_eq(codec_blob_max_len(&p, &L) >= b.len, 1, "%s: larger than its bound", t);
        blob_free(&b);
    }
    cr_assert_eq(seen, 6);
    CodecParams p;
    cr_assert_eq(codec_params_parse("int4", &p, err), -1);
    cr_assert_str_eq(err, "unknown codec 'int4'; use fp32, fp16, bf16, int8, topk or topk2");
}

Test(codec, fp32_is_bit_exact_with_and_without_zstd) {
    uint64_t n = 300000;
    float *x = make_vec(n, 1, 1e-3f);
    x[0] = 1e-40f; /* subnormal */
    x[1] = -0.0f;
    x[2] = 3.0e38f;
    uint64_t sizes[] = {1000, 2000000 - 1000000 - 999000 + 1000000 - 1000, 0};
    sizes[1] = n - 1000 - 5, sizes[2] = 5;
    CodecLayout L = {HASH, n, sizes, 3};
    for (int level = 0; level <= 3; level += 3) {
        CodecParams p = codec_params_default(CODEC_FP32);
        p.zstd_level = level;
        Blob b = {0};
        float *y = roundtrip(&p, &L, x, &b);
        cr_assert_eq(memcmp(x, y, n * 4), 0, "fp32 not bit-exact at zstd %d", level);
        free(y);
        blob_free(&b);
    }
    free(x);
}

/* The lossless stage of a float payload is byte planes (FORMATS.md): the
 * sign-and-exponent plane shrinks, the mantissa planes go as they are, and
 * the result is smaller than the same payload compressed whole. int8 and
 * top-k payloads are codes and tables: they are compressed whole. */
Test(codec, float_payloads_go_as_byte_planes_smaller_than_whole) {
    uint64_t n = 300000;
    float *x = make_vec(n, 0, 1e-3f);
    uint64_t sizes[] = {1000, n - 1000 - 5, 5};
    CodecLayout L = {HASH, n, sizes, 3};
    const char *codecs[] = {"fp32", "fp16", "bf16", "int8", "topk"};
    ZSTD_CCtx *zc = ZSTD_createCCtx();
    for (int c = 0; c < 5; c++) {
        CodecParams p, p0;
        codec_params_parse(codecs[c], &p, NULL);
        p0 = p, p0.zstd_level = 0;
        cr_assert_eq(p.zstd_level, 1, "zstd 1 is the default");
        Blob b = {0}, raw = {0};
        float *y = roundtrip(&p, &L, x, &b), *y0 = roundtrip(&p0, &L, x, &raw);
        cr_assert_eq(memcmp(y, y0, n * 4), 0, "%s: the lossless stage changed values", codecs[c]);
        int word = codec_ops(p.id)->word;
        size_t whole = 0, planes = 0, pos = BLOB_HEADER_LEN, pos0 = BLOB_HEADER_LEN;
        for (int i = 0; i < 3; i++) {
            const uint8_t *s = b.data + pos, *s0 = raw.data + pos0;
            uint32_t flags = ld32(s + 20), stored = ld32(s + 16), raw_len = ld32(s0 + 16);
            if (word && ld32(s + 8) > 100) /* a handful of values is not worth a table */
                cr_assert_eq(flags, SECTION_FLAG_PLANES, "%s section %d: flags %u", codecs[c], i,
                             flags);
            if (!word) cr_assert_neq(flags, SECTION_FLAG_PLANES, "%s has no words", codecs[c]);
            planes += stored;
            uint8_t *z = malloc(ZSTD_compressBound(raw_len));
            size_t zl = ZSTD_compressCCtx(zc, z, ZSTD_compressBound(raw_len),
                                          s0 + SECTION_HEADER_LEN, raw_len, 1);
            whole += zl < raw_len ? zl : raw_len;
            free(z);
            pos += SECTION_HEADER_LEN + stored, pos0 += SECTION_HEADER_LEN + raw_len;
        }
        if (word)
            cr_assert_lt(planes, whole, "%s: planes %zu, whole %zu", codecs[c], planes, whole);
        free(y), free(y0);
        blob_free(&b), blob_free(&raw);
    }
    ZSTD_freeCCtx(zc);
    free(x);
}

Test(codec, byte_planes_split_and_join_back) {
    size_t lens[] = {0, 1, 15, 16, 17, 33, 1000};
    for (int w = 2; w <= 4; w += 2)
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            size_t n = lens[k];
            uint8_t *words = malloc(n * 4 + 1), *planes = malloc(n * 4 + 1),
                    *back = malloc(n * 4 + 1);
            for (size_t i = 0; i < n * (size_t)w; i++) words[i] = (uint8_t)rng_next();
            planes_split(words, n, w, planes);
            for (size_t i = 0; i < n; i++)
                for (int j = 0; j < w; j++)
                    cr_assert_eq(planes[(size_t)j * n + i], words[i * (size_t)w + (size_t)j]);
            const uint8_t *pl[4] = {planes, planes + n, planes + 2 * n, planes + 3 * n};
            planes_join(pl, n, w, back);
            cr_assert_eq(memcmp(back, words, n * (size_t)w), 0, "w %d n %zu", w, n);
            free(words), free(planes), free(back);
        }
}

/* Sections of a few words, where the plane lengths alone outweigh the
 * payload: kept raw, and nothing written past the section (the blob is
 * allocated to its size, so SAN=1 sees a stray byte). */
Test(codec, tiny_word_sections_with_zstd_round_trip_in_place) {
    const char *names[] = {"fp32", "fp16", "bf16"};
    for (int c = 0; c < 3; c++)
        for (uint64_t n = 1; n <= 40; n++) {
            float x[40], y[40];
            for (uint64_t i = 0; i < n; i++) x[i] = 0.25f * (float)(i % 3);
            CodecParams p;
            char err[ERR_LEN];
            cr_assert_eq(codec_params_parse(names[c], &p, err), 0, "%s", err);
            p.zstd_level = 1;
            CodecLayout L = {7, n, NULL, 0};
            Blob b = {0};
            cr_assert_eq(codec_encode(&p, &L, x, &b, err), 0, "%s", err);
            cr_assert_eq(codec_decode(b.data, b.len, y, n, err), 0, "%s n %llu: %s", names[c],
                         (unsigned long long)n, err);
            for (uint64_t i = 0; i < n; i++)
                cr_assert_eq(y[i], x[i], "%s n %llu at %llu", names[c], (unsigned long long)n,
                             (unsigned long long)i);
            blob_free(&b);
        }
}

Test(codec, fp16_rounds_like_the_compiler_for_every_half_and_many_floats) {
#ifndef __FLT16_MAX__
    cr_skip_test("this compiler has no _Float16 to compare with (gcc 12 has)");
#else
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 ref;
        uint16_t hh = (uint16_t)h;
        memcpy(&ref, &hh, 2);
        float want = (float)ref, got = codec_f16_to_f32(hh);
        if (isnan(want))
            cr_assert(isnan(got));
        else
            cr_assert_eq(memcmp(&want, &got, 4), 0, "f16 %04x → %g, want %g", h, got, want);
    }
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rng_next();
        if (i < 1000) u = (uint32_t)(0x33000000u + (uint32_t)i * 0x2000u - 0x1000u); /* near ties */
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f)) continue;
        _Float16 r = (_Float16)f;
        uint16_t want;
        memcpy(&want, &r, 2);
        cr_assert_eq(codec_f32_to_f16(f), want, "f32 %08x → %04x, want %04x", u,
                     codec_f32_to_f16(f), want);
    }
#endif
}

Test(codec, bf16_rounds_to_nearest_even) {
    struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {{0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80}, {0x3f818000u, 0x3f82},
                 {0x3f808001u, 0x3f81}, {0xbf80ffffu, 0xbf81}, {0x7f7fffffu, 0x7f80},
                 {0x00000001u, 0x0000}, {0x80000000u, 0x8000}, {0x7fc00001u, 0x7fc0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float f;
        memcpy(&f, &cases[i].in, 4);
        cr_assert_eq(codec_f32_to_bf16(f), cases[i].out, "bf16(%08x) = %04x, want %04x",
                     cases[i].in, codec_f32_to_bf16(f), cases[i].out);
    }
}

Test(codec, lossy_codecs_stay_within_stated_error) {
    /* relative L2 error bounds, Gaussian then heavy-tailed (Student-t, 3 dof).
     * int8's scale is 6σ/256 by design, so it clips beyond ±3σ: on Gaussian
     * input clipping is most of its 1.7% error, and on Student-t(3), where
     * 1.4% of the values lie beyond, clipping makes it 33%. */
    struct {
        const char *codec;
        double gauss, heavy;
    } bounds[] = {{"fp16", 5e-4, 5e-4}, {"bf16", 4e-3, 4e-3}, {"int8", 2e-2, 0.36}};
    uint64_t n = 400000;
    for (int kind = 0; kind < 2; kind++) {
        float *x = make_vec(n, kind, 0.01f);
        CodecLayout L = flat(n);
        for (size_t c = 0; c < sizeof bounds / sizeof bounds[0]; c++) {
            CodecParams p;
            cr_assert_eq(codec_params_parse(bounds[c].codec, &p, NULL), 0);
            Blob b = {0};
            float *y = roundtrip(&p, &L, x, &b);
            double e = rel_l2(x, y, n), limit = kind ? bounds[c].heavy : bounds[c].gauss;
            cr_assert_leq(e, limit, "%s on %s input: relative L2 error %g over %g", bounds[c].codec,
                          kind ? "heavy-tailed" : "Gaussian", e, limit);
            free(y);
            blob_free(&b);
        }
        free(x);
    }
}

Test(codec, fp16_refuses_values_beyond_its_range) {
    float x[4] = {1.0f, 70000.0f, 2.0f, 3.0f};
    CodecLayout L = flat(4);
    CodecParams p = codec_params_default(CODEC_FP16);
    Blob b = {0};
    char err[ERR_LEN];
    cr_assert_eq(codec_encode(&p, &L, x, &b, err), -1);
    cr_assert_not_null(strstr(err, "beyond fp16 range"), "%s", err);
    x[1] = NAN;
    p = codec_params_default(CODEC_INT8);
    cr_assert_eq(codec_encode(&p, &L, x, &b, err), -1);
    cr_assert_not_null(strstr(err, "not finite"), "%s", err);
    blob_free(&b);
}

/* ---- int8 and top-k ---------------------------------------------------- */

Test(codec, int8_table_holds_bin_means) {
    /* a block whose values sit exactly on two bins: means equal the values */
    uint64_t n = 1024;
    float *x = malloc(n * 4);
    for (uint64_t i = 0; i < n; i++) x[i] = i % 2 ? 0.5f : -0.25f;
    CodecParams p = codec_params_default(CODEC_INT8);
    CodecLayout L = flat(n);
    Blob b = {0};
    float *y = roundtrip(&p, &L, x, &b);
    for (uint64_t i = 0; i < n; i++)
        cr_assert_float_eq(y[i], x[i], 1e-6f, "value %llu: %g, want %g", (unsigned long long)i,
                           y[i], x[i]);
    free(y);
    free(x);
    blob_free(&b);
}

static int cmp_sel(const void *a, const void *b, void *ctx) {
    const float *m = ctx;
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    if (m[i] != m[j]) return m[i] > m[j] ? -1 : 1;
    return (i > j) - (i < j);
}

static const float *sort_ctx;
static int cmp_sel_global(const void *a, const void *b) {
    return cmp_sel(a, b, (void *)sort_ctx);
}

Test(codec, topk_keeps_exactly_the_largest_with_index_tiebreak) {
    uint32_t chunk = 4096, n = chunk * 6 + 1000;
    float *x = make_vec(n, 1, 1.0f);
    /* ties and zeros: many equal magnitudes, of both signs */
    for (uint32_t i = 0; i < n; i += 7) x[i] = (i % 2 ? 2.5f : -2.5f);
    for (uint32_t i = chunk * 2; i < chunk * 3; i++) x[i] = 0.0f;
    CodecParams p = codec_params_default(CODEC_TOPK);
    p.zstd_level = 0;
    CodecLayout L = flat(n);
    Blob b = {0};
    float *y = roundtrip(&p, &L, x, &b);
    float *mag = malloc(chunk * 4);
    uint32_t *idx = malloc(chunk * 4);
    for (uint32_t c0 = 0; c0 < n; c0 += chunk) {
        uint32_t len = n - c0 < chunk ? n - c0 : chunk, k = topk_k(10000, len);
        for (uint32_t i = 0; i < len; i++) {
            mag[i] = fabsf(x[c0 + i]);
            idx[i] = i;
        }
        sort_ctx = mag;
        qsort(idx, len, 4, cmp_sel_global);
        char *kept = calloc(len, 1);
        for (uint32_t i = 0; i < k; i++) kept[idx[i]] = 1;
        for (uint32_t i = 0; i < len; i++) {
            if (kept[i]) {
                cr_assert(y[c0 + i] != 0.0f || x[c0 + i] == 0.0f,
                          "chunk at %u: index %u should be kept", c0, i);
                cr_assert(signbit(y[c0 + i]) == signbit(x[c0 + i]) || x[c0 + i] == 0.0f,
                          "sign lost at %u", c0 + i);
            } else {
                cr_assert_eq(y[c0 + i], 0.0f, "chunk at %u: index %u should be dropped", c0, i);
            }
        }
        free(kept);
    }
    free(mag);
    free(idx);
    free(y);
    free(x);
    blob_free(&b);
}

Test(codec, topk_values_are_close_to_the_kept_originals) {
    uint64_t n = 200000;
    float *x = make_vec(n, 0, 1.0f);
    for (int bits = 8; bits >= 2; bits -= 6) {
        CodecParams p = codec_params_default(CODEC_TOPK);
        p.value_bits = (uint32_t)bits;
        CodecLayout L = flat(n);
        Blob b = {0};
        float *y = roundtrip(&p, &L, x, &b);
        /* relative error over the kept coordinates only */
        double num = 0, den = 0;
        for (uint64_t i = 0; i < n; i++)
            if (y[i] != 0.0f) {
                num += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
                den += (double)x[i] * x[i];
            }
        double e = sqrt(num / den), limit = bits == 8 ? 0.01 : 0.12;
        cr_assert_leq(e, limit, "topk %d-bit values: relative error %g over %g", bits, e, limit);
        free(y);
        blob_free(&b);
    }
    free(x);
}

Test(codec, bytes_on_the_wire_meet_the_targets) {
    uint64_t n = 1 << 22;
    float *x = make_vec(n, 0, 0.01f);
    CodecLayout L = flat(n);
    struct {
        const char *codec;
        double min_ratio;
    } t[] = {{"fp16", 1.99}, {"int8", 3.9}, {"topk", 60.0}, {"topk2", 100.0}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        CodecParams p;
        codec_params_parse(t[i].codec, &p, NULL);
        Blob b = {0};
        char err[ERR_LEN];
        cr_assert_eq(codec_encode(&p, &L, x, &b, err), 0, "%s", err);
        double ratio = (double)(4 * n) / (double)b.len;
        cr_assert_geq(ratio, t[i].min_ratio, "%s is only %.2fx smaller than fp32", t[i].codec,
                      ratio);
        blob_free(&b);
    }
    free(x);
}

/* ---- decode-accumulate, determinism, error feedback --------------------- */

Test(codec, decode_accumulate_equals_decode_then_axpy_bit_for_bit) {
    uint64_t n = 150000;
    float *x = make_vec(n, 1, 0.02f);
    uint64_t sizes[] = {4096, 64, n - 4096 - 64};
    CodecLayout L = {HASH, n, sizes, 3};
    const char *codecs[] = {"fp32", "fp16", "bf16", "int8", "topk", "topk2"};
    float w = 0.37f;
    for (size_t c = 0; c < 6; c++) {
        CodecParams p;
        codec_params_parse(codecs[c], &p, NULL);
        Blob b = {0};
        float *dec = roundtrip(&p, &L, x, &b);
        float *s1 = malloc(n * 4), *s2 = malloc(n * 4);
        for (uint64_t i = 0; i < n; i++) s1[i] = s2[i] = 0.5f + (float)(i % 97) * 1e-3f;
        char err[ERR_LEN];
        cr_assert_eq(codec_decode_accumulate(b.data, b.len, w, s1, n, err), 0, "%s", err);
        for (uint64_t i = 0; i < n; i++) s2[i] = s2[i] + w * dec[i];
        cr_assert_eq(memcmp(s1, s2, n * 4), 0, "%s: decode_accumulate differs from decode+axpy",
                     codecs[c]);
        /* what an inspection kept (decompressed sections included) adds the
         * same floats, with the lossless stage and without */
        for (int z = 0; z < 2; z++) {
            CodecParams pz = p;
            pz.zstd_level = z;
            Blob bz = {0};
            cr_assert_eq(codec_encode(&pz, &L, x, &bz, err), 0, "%s", err);
            CodecChecked *ck = codec_checked_new();
            BlobInfo info;
            cr_assert_eq(codec_blob_check(bz.data, bz.len, HASH, n, &info, ck, err), 0, "%s", err);
            float *s3 = malloc(n * 4);
            for (uint64_t i = 0; i < n; i++) s3[i] = 0.5f + (float)(i % 97) * 1e-3f;
            codec_checked_accumulate(ck, w, s3, 0);
            cr_assert_eq(memcmp(s1, s3, n * 4), 0, "%s (zstd %d): the checked blob adds otherwise",
                         codecs[c], z);
            codec_checked_free(ck);
            free(s3);
            blob_free(&bz);
        }
        /* fresh: whatever the pages held, the sum starts from zeros */
        {
            CodecChecked *ck = codec_checked_new();
            cr_assert_eq(codec_blob_check(b.data, b.len, HASH, n, NULL, ck, err), 0, "%s", err);
            float *s5 = malloc(n * 4);
            for (uint64_t i = 0; i < n; i++) s5[i] = NAN;
            codec_checked_accumulate(ck, w, s5, 1);
            for (uint64_t i = 0; i < n; i++)
                cr_assert_eq(s5[i], 0.0f + w * dec[i], "%s: fresh sum at %llu", codecs[c],
                             (unsigned long long)i);
            codec_checked_free(ck);
            free(s5);
        }
        /* a refused blob keeps nothing: refilled with it, the check adds no value */
        CodecChecked *ck = codec_checked_new();
        cr_assert_eq(codec_blob_check(b.data, b.len, HASH, n, NULL, ck, err), 0, "%s", err);
        b.data[b.len - 1] ^= 1;
        cr_assert_neq(codec_blob_check(b.data, b.len, HASH, n, NULL, ck, err), 0);
        float *s4 = calloc(n, 4);
        codec_checked_accumulate(ck, w, s4, 0);
        for (uint64_t i = 0; i < n; i++) cr_assert_eq(s4[i], 0.0f);
        codec_checked_free(ck);
        free(s4);
        free(s1);
        free(s2);
        free(dec);
        blob_free(&b);
    }
    free(x);
}

/* A cursor reads any forward sequence of ranges with the values of a whole
 * decode: across tensor boundaries and CODEC_SECTION_MAX cuts, with zstd
 * and without, one value at a time or many; going back is refused. */
Test(codec, cursor_reads_forward_ranges_as_a_whole_decode) {
    uint64_t n = 2 * CODEC_SECTION_MAX + 70001; /* three cuts of the last tensor */
    float *x = make_vec(n, 1, 0.02f);
    uint64_t sizes[] = {4096, 64, n - 4096 - 64};
    CodecLayout L = {HASH, n, sizes, 3};
    const char *codecs[] = {"fp32", "int8", "topk2"};
    char err[ERR_LEN];
    for (size_t c = 0; c < 3; c++)
        for (int z = 0; z < 2; z++) {
            CodecParams p;
            codec_params_parse(codecs[c], &p, NULL);
            p.zstd_level = z;
            Blob b = {0};
            float *dec = roundtrip(&p, &L, x, &b), *got = malloc(n * 4);
            CodecCursor *cur = codec_cursor_open(b.data, b.len, n, err);
            cr_assert_not_null(cur, "%s", err);
            uint64_t at = 0, step = 1, s = 7;
            while (at < n) {
                uint64_t hi = at + step < n ? at + step : n;
                cr_assert_eq(codec_cursor_read(cur, at, hi, got + at, err), 0, "%s", err);
                at = hi;
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                step = 1 + (s >> 33) % 300000; /* ranges that start and end anywhere */
            }
            cr_assert_eq(memcmp(got, dec, n * 4), 0, "%s z%d: cursor differs from decode",
                         codecs[c], z);
            cr_assert_eq(codec_cursor_read(cur, 0, 10, got, err), -1, "a read backwards");
            cr_assert_not_null(strstr(err, "forward"), "%s", err);
            codec_cursor_close(cur);
            cr_assert_null(codec_cursor_open(b.data, b.len, n + 1, err), "a wrong length");
            free(dec), free(got);
            blob_free(&b);
        }
    free(x);
}

/* ---- the instruction-set tables against the scalar reference ----------- */

/* Inputs that reach every branch of the kernels: Gaussian, heavy tails,
 * spikes that clamp into the edge bins, exact halves (rounding ties), ties
 * of magnitude, signed zeros, subnormals, huge values, and lengths that are
 * not a multiple of any vector width. */
static float edge_value(int kind, uint64_t i) {
    switch (kind) {
    case 0:
        return 0.01f * gaussian();
    case 1:
        return 0.01f * heavy();
    case 2:
        return 0.01f * gaussian() * (rng_next() % 500 == 0 ? 1e4f : 1.0f);
    case 3:
        return (float)((int)(rng_next() % 9) - 4) * 0.5f;
    case 4:
        return (i % 3 == 0) ? -0.0f : (i % 3 == 1 ? 0.0f : 1e-3f);
    case 5:
        return 1e-39f * gaussian();
    case 6:
        return 1e30f * gaussian();
    default:
        return (float)(2 * uniform() - 1) * (float)(1u << (rng_next() % 24));
    }
}
#define EDGE_KINDS 8

static const char *ISAS[] = {"avx2", "avx512"};

Test(codec_simd, every_table_gives_the_reference_results_kernel_by_kernel) {
    const CodecSimd *ref = codec_simd_named("scalar");
    cr_assert_not_null(ref);
    uint32_t lens[] = {1, 5, 8, 15, 16, 17, 255, 256, 257, 1023, 1024, 1025, 4095, 4096};
    int ran = 0;
    for (size_t t = 0; t < sizeof ISAS / sizeof *ISAS; t++) {
        const CodecSimd *k = codec_simd_named(ISAS[t]);
        if (k == NULL) continue; /* this CPU lacks it */
        ran++;
        for (int kind = 0; kind < EDGE_KINDS; kind++)
            for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
                uint32_t n = lens[li];
                float x[4096], d1[4096], d2[4096], table[256];
                uint8_t c1[4096], c2[4096];
                int32_t t1[4096], t2[4096];
                uint32_t k1[4096 + SIMD_COLLECT_SLACK], k2[4096 + SIMD_COLLECT_SLACK];
                for (uint32_t i = 0; i < n; i++) x[i] = edge_value(kind, i);
                double s1 = ref->sumsq(x, n), s2 = k->sumsq(x, n);
                cr_assert(memcmp(&s1, &s2, sizeof s1) == 0, "%s sumsq kind %d n %u: %a vs %a",
                          k->name, kind, n, s1, s2);
                /* the scale int8 would pick, and a few that clamp or tie */
                float invs[] = {(float)(256.0 / (6.0 * sqrt(s1 / n))), 1.0f, 2.0f, 1e6f};
                for (size_t v = 0; v < 4; v++) {
                    if (!isfinite(invs[v]) || invs[v] > 1e30f) continue;
                    uint32_t m1 = ref->int8_codes(x, n, invs[v], c1, t1, k1);
                    uint32_t m2 = k->int8_codes(x, n, invs[v], c2, t2, k2);
                    cr_assert_eq(m1, m2, "%s clamped count kind %d n %u", k->name, kind, n);
                    cr_assert(memcmp(k1, k2, 4 * (size_t)m1) == 0, "%s clamped kind %d n %u",
                              k->name, kind, n);
                    for (uint32_t j = 0; j < m1; j++) cr_assert_eq(t1[k1[j]], 0);
                    cr_assert(memcmp(c1, c2, n) == 0, "%s codes kind %d n %u", k->name, kind, n);
                    cr_assert(memcmp(t1, t2, 4 * (size_t)n) == 0, "%s offsets kind %d n %u",
                              k->name, kind, n);
                }
                for (int q = 0; q < 256; q++) table[q] = edge_value(kind, (uint64_t)q);
                for (uint32_t i = 0; i < n; i++) {
                    c1[i] = (uint8_t)rng_next();
                    d1[i] = d2[i] = edge_value(0, i);
                }
                ref->lookup_acc(table, c1, n, 0.37f, d1);
                k->lookup_acc(table, c1, n, 0.37f, d2);
                cr_assert(memcmp(d1, d2, 4 * (size_t)n) == 0, "%s lookup_acc kind %d n %u", k->name,
                          kind, n);
                /* a blob's payload may sit at any byte: the same at an odd address */
                uint8_t odd[4 * 4096 + 1];
                memcpy(odd + 1, x, 4 * (size_t)n);
                double o1 = ref->sumsq(odd + 1, n), o2 = k->sumsq(odd + 1, n);
                cr_assert(memcmp(&o1, &s1, sizeof s1) == 0 && memcmp(&o2, &s1, sizeof s1) == 0,
                          "%s sumsq at an odd address, kind %d n %u", k->name, kind, n);
                ref->axpy(odd + 1, n, -1.25f, d1);
                k->axpy(odd + 1, n, -1.25f, d2);
                cr_assert(memcmp(d1, d2, 4 * (size_t)n) == 0, "%s axpy kind %d n %u", k->name, kind,
                          n);
                ref->lookup(table, c1, n, d1);
                k->lookup(table, c1, n, d2);
                cr_assert(memcmp(d1, d2, 4 * (size_t)n) == 0, "%s lookup kind %d n %u", k->name,
                          kind, n);
                /* the kernels that stream d out: with src and without, d
                 * aligned to a vector and not (their heads and tails) */
                float e[4096 + 16] __attribute__((aligned(64)));
                for (int at = 0; at < 16; at += 5)
                    for (int with = 0; with < 2; with++) {
                        const float *src = with ? x : NULL;
                        memset(e, 0xa5, sizeof e);
                        ref->axpy_to(odd + 1, n, -1.25f, src, d1);
                        k->axpy_to(odd + 1, n, -1.25f, src, e + at);
                        cr_assert(memcmp(d1, e + at, 4 * (size_t)n) == 0,
                                  "%s axpy_to kind %d n %u at %d", k->name, kind, n, at);
                        ref->lookup_to(table, c1, n, src, d1);
                        k->lookup_to(table, c1, n, src, e + at);
                        cr_assert(memcmp(d1, e + at, 4 * (size_t)n) == 0,
                                  "%s lookup_to kind %d n %u at %d", k->name, kind, n, at);
                        ref->scale_to(x, n, 0.37f, d1);
                        k->scale_to(x, n, 0.37f, e + at);
                        cr_assert(memcmp(d1, e + at, 4 * (size_t)n) == 0,
                                  "%s scale_to kind %d n %u at %d", k->name, kind, n, at);
                        uint8_t past[4];
                        memset(past, 0xa5, 4);
                        cr_assert(memcmp(e + at + n, past, 4) == 0, "%s writes past d", k->name);
                    }
                float th = fabsf(x[n / 2]);
                int b1, b2;
                uint32_t n1 = ref->collect(x, n, th, k1, &b1), n2 = k->collect(x, n, th, k2, &b2);
                cr_assert_eq(n1, n2, "%s collect count kind %d n %u", k->name, kind, n);
                cr_assert(memcmp(k1, k2, 4 * (size_t)n1) == 0, "%s collect kind %d n %u", k->name,
                          kind, n);
                cr_assert_eq(b1, 0);
                cr_assert_eq(b2, 0);
                cr_assert_eq(k->finite(x, n, NULL), 1);
                /* the copy it makes as it checks, at an odd address */
                uint8_t copy[4 * 4096 + 2];
                memset(copy, 0xa5, sizeof copy);
                cr_assert_eq(k->finite(x, n, copy + 1), 1);
                cr_assert(memcmp(copy + 1, x, 4 * (size_t)n) == 0, "%s copy, n %u", k->name, n);
                cr_assert_eq(copy[0], 0xa5);
                cr_assert_eq(copy[4 * (size_t)n + 1], 0xa5, "%s writes past the copy", k->name);
                /* one value that is not finite, at the last place or the first */
                float keep = x[n - 1];
                x[n - 1] = kind % 2 ? NAN : -INFINITY;
                cr_assert_eq(k->finite(x, n, NULL), 0, "%s misses a non-finite value, n %u",
                             k->name, n);
                cr_assert_eq(k->finite(x, n, copy), 0, "%s misses a non-finite value, n %u",
                             k->name, n);
                k->collect(x, n, th, k2, &b2);
                cr_assert_eq(b2, 1, "%s collect misses a non-finite value, n %u", k->name, n);
                x[n - 1] = keep;
            }
    }
    cr_log_info("instruction-set tables checked against scalar: %d", ran);
}

/* The half casts, kernel by kernel: every fp16 and bf16 half back to a
 * float (NaN apart: it stays NaN), and floats to halves around every place
 * rounding can go wrong (ties, the subnormal halves, the edge of range,
 * and values that become infinite), at odd addresses and lengths. */
Test(codec_simd, every_table_casts_halves_as_the_reference) {
    const CodecSimd *ref = codec_simd_named("scalar");
    int ran = 0;
    for (size_t t = 0; t < sizeof ISAS / sizeof *ISAS; t++) {
        const CodecSimd *k = codec_simd_named(ISAS[t]);
        if (k == NULL) continue;
        ran++;
        for (int bf = 0; bf < 2; bf++) {
            static uint8_t h[2 * 65536 + 1];
            static float f1[65536], f2[65536];
            for (uint32_t v = 0; v < 65536; v++) st16(h + 1 + 2 * v, (uint16_t)v);
            ref->from_half(h + 1, 65536, bf, f1);
            k->from_half(h + 1, 65536, bf, f2);
            for (uint32_t v = 0; v < 65536; v++) {
                if (isnan(f1[v])) {
                    cr_assert(isnan(f2[v]), "%s %s %04x: NaN became %g", k->name,
                              bf ? "bf16" : "fp16", v, f2[v]);
                    continue;
                }
                cr_assert(memcmp(&f1[v], &f2[v], 4) == 0, "%s %s %04x: %a vs %a", k->name,
                          bf ? "bf16" : "fp16", v, f1[v], f2[v]);
            }
            /* floats: every half's value and its neighbours, the midpoints
             * to the next half (ties), and random ones */
            static float x[3 * 65536 + 1000];
            uint32_t n = 0;
            for (uint32_t v = 0; v < 65535; v++) {
                float a = f1[v], b = f1[v + 1];
                if (!isfinite(a) || !isfinite(b) || (v & 0x7fffu) == 0x7fffu) continue;
                x[n++] = a, x[n++] = nextafterf(a, b), x[n++] = 0.5f * a + 0.5f * b;
            }
            for (int i = 0; i < 1000; i++) x[n++] = (float)(gaussian() * pow(10.0, rng_next() % 9));
            static uint8_t o1[2 * (3 * 65536 + 1000) + 1], o2[sizeof o1];
            for (uint32_t len = n; len + 8 > n && len > 0; len -= 3) { /* every tail length */
                int ok1 = ref->to_half(x, len, bf, o1 + 1), ok2 = k->to_half(x, len, bf, o2 + 1);
                cr_assert_eq(ok1, ok2, "%s %s: ok %d vs %d, n %u", k->name, bf ? "bf16" : "fp16",
                             ok1, ok2, len);
                if (ok1) cr_assert(memcmp(o1 + 1, o2 + 1, 2 * (size_t)len) == 0);
            }
            /* the values are valid or not, one at a time */
            for (int i = 0; i < 4000; i++) {
                float y[9];
                for (int j = 0; j < 9; j++) y[j] = x[(rng_next() % n)];
                int j = (int)(rng_next() % 9);
                float bad[] = {NAN, -NAN, INFINITY, -INFINITY, 65520.0f, -7e4f, 3.4e38f, -3.4e38f};
                y[j] = bad[rng_next() % 8];
                int ok1 = ref->to_half(y, 9, bf, o1), ok2 = k->to_half(y, 9, bf, o2);
                cr_assert_eq(ok1, ok2, "%s %s: %a at %d is %s by one and not the other", k->name,
                             bf ? "bf16" : "fp16", y[j], j, ok1 ? "taken" : "refused");
                if (ok1) cr_assert(memcmp(o1, o2, 18) == 0);
            }
        }
    }
    cr_log_info("half casts checked against scalar: %d tables", ran);
}

/* Whole blobs, every codec the tables serve, with section, block and chunk
 * cuts: the same bytes from every table (the CUDA kernels are held to the
 * same bytes by codec_cuda on a GPU machine). */
Test(codec_simd, every_table_makes_the_reference_blobs) {
    const CodecSimd *ref = codec_simd_named("scalar");
    uint64_t sizes[] = {1, 17, 4097, 70001, CODEC_SECTION_MAX + 4097};
    struct {
        const char *codec;
        uint32_t block, chunk;
        double density;
    } cases[] = {{"int8", 0, 0, 0},        {"int8", 1000, 0, 0},  {"int8", 3, 0, 0},
                 {"topk", 0, 0, 0},        {"topk", 0, 333, 0.1}, {"topk2", 0, 0, 0},
                 {"topk2", 0, 65536, 0.3}, {"fp16", 0, 0, 0},     {"bf16", 0, 0, 0}};
    for (int kind = 0; kind < EDGE_KINDS; kind++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            uint64_t n = sizes[si];
            float *x = malloc(n * sizeof *x), *sum_ref = malloc(n * sizeof *x),
                  *sum = malloc(n * sizeof *x);
            for (uint64_t i = 0; i < n; i++) x[i] = edge_value(kind, i);
            CodecLayout L = flat(n);
            for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
                if (n > 100000 && c % 3 != 0) continue; /* the big size once per codec */
                CodecParams p;
                codec_params_parse(cases[c].codec, &p, NULL);
                if (cases[c].block) p.block = cases[c].block;
                if (cases[c].chunk) p.chunk = cases[c].chunk, p.density = cases[c].density;
                char err[ERR_LEN], err_ref[ERR_LEN];
                Blob want = {0};
                codec_simd_use(ref);
                if (codec_encode(&p, &L, x, &want, err_ref) != 0) {
                    /* refused (fp16 of values beyond its range): by every table, alike */
                    cr_assert(p.id == CODEC_FP16, "%s: %s", cases[c].codec, err_ref);
                    for (size_t t = 0; t < sizeof ISAS / sizeof *ISAS; t++) {
                        const CodecSimd *k = codec_simd_named(ISAS[t]);
                        if (k == NULL) continue;
                        codec_simd_use(k);
                        Blob got = {0};
                        cr_assert_eq(codec_encode(&p, &L, x, &got, err), -1, "%s took it", k->name);
                        cr_assert_str_eq(err, err_ref);
                    }
                    blob_free(&want);
                    continue;
                }
                memset(sum_ref, 0, n * sizeof *x);
                cr_assert_eq(codec_decode_accumulate(want.data, want.len, 0.5f, sum_ref, n, err),
                             0);
                for (size_t t = 0; t < sizeof ISAS / sizeof *ISAS; t++) {
                    const CodecSimd *k = codec_simd_named(ISAS[t]);
                    if (k == NULL) continue;
                    codec_simd_use(k);
                    Blob got = {0};
                    cr_assert_eq(codec_encode(&p, &L, x, &got, err), 0, "%s", err);
                    cr_assert_eq(got.len, want.len, "%s %s kind %d n %llu", k->name, cases[c].codec,
                                 kind, (unsigned long long)n);
                    cr_assert(memcmp(got.data, want.data, got.len) == 0,
                              "%s %s (block %u chunk %u) kind %d n %llu: other bytes", k->name,
                              cases[c].codec, p.block, p.chunk, kind, (unsigned long long)n);
                    memset(sum, 0, n * sizeof *x);
                    cr_assert_eq(codec_decode_accumulate(got.data, got.len, 0.5f, sum, n, err), 0);
                    cr_assert(memcmp(sum, sum_ref, n * sizeof *x) == 0, "%s decode differs",
                              k->name);
                    blob_free(&got);
                }
                blob_free(&want);
            }
            free(x), free(sum_ref), free(sum);
        }
    codec_simd_use(codec_simd_named("scalar"));
}

/* A block of subnormal values has a scale below the smallest normal float,
 * whose reciprocal overflows (the encoder once made codes of inf·x): it is
 * encoded with scale 1, every code the centre bin, and decodes to finite
 * values no larger than the block's. */
Test(codec, int8_tiny_values_use_unit_scale) {
    uint64_t n = 5000;
    float x[5000], y[5000];
    for (uint64_t i = 0; i < n; i++) x[i] = 1e-39f * (1.0f + (float)(i % 7));
    CodecParams p = codec_params_default(CODEC_INT8);
    CodecLayout L = flat(n);
    Blob b = {0};
    char err[ERR_LEN];
    cr_assert_eq(codec_encode(&p, &L, x, &b, err), 0, "%s", err);
    const uint8_t *codes = b.data + BLOB_HEADER_LEN + SECTION_HEADER_LEN + 1024;
    for (uint64_t i = 0; i < n; i++)
        cr_assert_eq(codes[i], 128, "code %llu", (unsigned long long)i);
    cr_assert_eq(codec_decode(b.data, b.len, y, n, err), 0, "%s", err);
    for (uint64_t i = 0; i < n; i++) cr_assert(isfinite(y[i]) && fabsf(y[i]) <= 7e-39f);
    blob_free(&b);
}

Test(codec, encoding_is_the_same_for_any_thread_count) {
#ifndef STRAIT_HAVE_OPENMP
    cr_skip_test("built without OpenMP");
#else
    uint64_t n = 3 * CODEC_SECTION_MAX + 12345;
    float *x = make_vec(n, 1, 0.01f);
    CodecLayout L = flat(n);
    const char *codecs[] = {"int8", "topk", "fp16"};
    for (size_t c = 0; c < 3; c++) {
        CodecParams p;
        codec_params_parse(codecs[c], &p, NULL);
        Blob b1 = {0}, b2 = {0};
        omp_set_num_threads(1);
        cr_assert_eq(codec_encode(&p, &L, x, &b1, NULL), 0);
        omp_set_num_threads(4);
        cr_assert_eq(codec_encode(&p, &L, x, &b2, NULL), 0);
        cr_assert_eq(b1.len, b2.len);
        cr_assert_eq(memcmp(b1.data, b2.data, b1.len), 0, "%s differs across threads", codecs[c]);
        blob_free(&b1);
        blob_free(&b2);
    }
    free(x);
#endif
}

static double norm(const float *v, uint64_t n) {
    double s = 0;
    for (uint64_t i = 0; i < n; i++) s += (double)v[i] * v[i];
    return sqrt(s);
}

/* The same vector encoded over and over with top-k 1% and error feedback:
 * what was sent adds up to what was given, and the residual stays bounded. */
Test(codec, error_feedback_converges_and_stays_bounded, .timeout = 120) {
    uint64_t n = 65536;
    int steps = 600;
    float *g = make_vec(n, 1, 0.01f);
    CodecLayout L = flat(n);
    CodecParams p = codec_params_default(CODEC_TOPK);
    ErrorFeedback ef;
    char err[ERR_LEN];
    cr_assert_eq(ef_init(&ef, n, HASH, 1.0f, err), 0, "%s", err);
    double *sent = calloc(n, sizeof *sent);
    float *dec = malloc(n * 4);
    double gn = norm(g, n), max_mid = 0, worst = 0;
    Blob b = {0};
    for (int t = 1; t <= steps; t++) {
        cr_assert_eq(ef_encode(&ef, &p, &L, g, NULL, NULL, &b, err), 0, "%s", err);
        cr_assert_eq(codec_decode(b.data, b.len, dec, n, err), 0, "%s", err);
        for (uint64_t i = 0; i < n; i++) sent[i] += dec[i];
        double en = norm(ef.e, n);
        if (t >= steps / 3 && t <= steps * 2 / 3 && en > max_mid) max_mid = en;
        if (en > worst) worst = en;
    }
    /* residual = Σ inputs − Σ sent, and it does not grow with time */
    double num = 0, den = 0;
    for (uint64_t i = 0; i < n; i++) {
        double d = (double)steps * g[i] - sent[i];
        num += d * d;
        den += (double)steps * g[i] * (double)steps * g[i];
    }
    double final_rel = sqrt(num / den), en = norm(ef.e, n);
    cr_assert_leq(en, 1.25 * max_mid, "residual still growing: %g at the end, %g mid-run", en,
                  max_mid);
    cr_assert_leq(worst, 120 * gn, "residual norm %g is over 120x the input's %g", worst, gn);
    cr_assert_leq(final_rel, 0.2, "sent sum is %g away from the input sum", final_rel);
    cr_assert_float_eq(sqrt(num), en, en * 1e-3 + 1e-9, "residual is not inputs minus sent");
    /* serialise, damage, restore */
    Blob s = {0};
    cr_assert_eq(ef_serialize(&ef, &s, err), 0);
    char *dir = harness_tmpdir("ef"), path[512];
    snprintf(path, sizeof path, "%s/ef.bin", dir);
    cr_assert_eq(ef_save(&ef, path, 0600, err), 0, "%s", err); /* the same bytes, straight */
    char *saved;
    size_t saved_len;
    cr_assert_eq(file_read_all(path, 1u << 30, &saved, &saved_len, err), 0, "%s", err);
    cr_assert(saved_len == s.len && memcmp(saved, s.data, s.len) == 0,
              "ef_save wrote other bytes than ef_serialize");
    free(saved);
    cr_assert_eq(ef_save(&ef, "/nonexistent-dir/ef.bin", 0600, err), -1);
    cr_assert_not_null(strstr(err, "/nonexistent-dir/ef.bin"), "%s", err);
    harness_rmtree(dir);
    free(dir);
    ErrorFeedback back;
    cr_assert_eq(ef_deserialize(&back, s.data, s.len, err), 0, "%s", err);
    cr_assert_eq(memcmp(back.e, ef.e, n * 4), 0);
    cr_assert_eq(back.table_hash, HASH);
    ef_free(&back);
    s.data[100] ^= 1;
    cr_assert_eq(ef_deserialize(&back, s.data, s.len, err), -1);
    cr_assert_not_null(strstr(err, "checksum"), "%s", err);
    cr_assert_eq(ef_deserialize(&back, s.data, s.len - 3, err), -1);
    blob_free(&s);
    blob_free(&b);
    ef_free(&ef);
    free(sent);
    free(dec);
    free(g);
}

/* ---- malformed blobs ----------------------------------------------------- */

static Blob valid_blob(const char *codec, uint64_t n) {
    float *x = make_vec(n, 0, 1.0f);
    CodecParams p;
    codec_params_parse(codec, &p, NULL);
    CodecLayout L = flat(n);
    Blob b = {0};
    cr_assert_eq(codec_encode(&p, &L, x, &b, NULL), 0);
    free(x);
    return b;
}

/* Refused as malformed (-1), or with want_rc (CODEC_NON_FINITE), by
 * codec_blob_inspect and, for the same reason, by codec_inspect_decode */
static void expect_refused_as(const uint8_t *data, size_t len, uint64_t hash, uint64_t n,
                              const char *why, int want_rc) {
    char err[ERR_LEN] = "";
    BlobInfo info;
    cr_assert_eq(codec_blob_inspect(data, len, hash, n, &info, err), want_rc, "refused how: %s",
                 why);
    cr_assert_not_null(strstr(err, why), "want '%s', got '%s'", why, err);
    if (n == 0) return; /* inspect_decode always names its n */
    float *x = malloc(n * sizeof *x);
    char err2[ERR_LEN] = "";
    cr_assert_eq(codec_inspect_decode(data, len, hash, n, x, NULL, err2), want_rc,
                 "inspect_decode, refused how: %s", why);
    cr_assert_str_eq(err2, err);
    free(x);
}

static void expect_refused(const uint8_t *data, size_t len, uint64_t hash, uint64_t n,
                           const char *why) {
    expect_refused_as(data, len, hash, n, why, -1);
}

static void reseal_header(uint8_t *b) {
    st64(b + 40, XXH64(b, 40, 0));
}
static void reseal_section(uint8_t *s) {
    st64(s + 24, XXH64(s + SECTION_HEADER_LEN, ld32(s + 16), XXH64(s, 24, 0)));
}

Test(codec_malformed, every_truncation_is_refused) {
    const char *codecs[] = {"fp32", "int8", "topk", "topk2", "bf16"};
    for (int c = 0; c < 5; c++) {
        Blob b = valid_blob(codecs[c], 5000);
        for (size_t len = 0; len < b.len; len += (len < 200 ? 1 : 97)) {
            char err[ERR_LEN];
            cr_assert_eq(codec_blob_inspect(b.data, len, HASH, 5000, NULL, err), -1,
                         "%s truncated to %zu accepted", codecs[c], len);
        }
        blob_free(&b);
    }
}

Test(codec_malformed, header_faults_are_named) {
    Blob b = valid_blob("int8", 5000);
    uint8_t *c = malloc(b.len);
#define FRESH() memcpy(c, b.data, b.len)
    FRESH();
    c[0] ^= 0xff;
    expect_refused(c, b.len, HASH, 5000, "wrong magic");
    FRESH();
    c[20] ^= 1;
    expect_refused(c, b.len, HASH, 5000, "header checksum");
    FRESH();
    st16(c + 4, 9), reseal_header(c);
    expect_refused(c, b.len, HASH, 5000, "version 9 is not supported");
    FRESH();
    c[6] = 77, reseal_header(c);
    expect_refused(c, b.len, HASH, 5000, "unknown codec");
    expect_refused(b.data, b.len, HASH + 1, 5000, "parameter table");
    expect_refused(b.data, b.len, HASH, 5001, "this model has 5001");
    FRESH();
    st64(c + 16, 1ull << 40), reseal_header(c);
    expect_refused(c, b.len, 0, 0, "over the limit");
    FRESH();
    st32(c + 24, 0xffffffffu), reseal_header(c);
    expect_refused(c, b.len, 0, 0, "sections");
    FRESH();
    st32(c + 28, 0), reseal_header(c); /* int8 block of 0 */
    expect_refused(c, b.len, 0, 0, "int8 block 0");
    free(c);
    blob_free(&b);
}

Test(codec_malformed, section_faults_are_named) {
    Blob b = valid_blob("int8", 5000);
    uint8_t *c = malloc(b.len + 64), *s;
    FRESH();
    c[BLOB_HEADER_LEN + SECTION_HEADER_LEN + 10] ^= 4; /* payload byte */
    expect_refused(c, b.len, HASH, 5000, "checksum mismatch");
    FRESH();
    s = c + BLOB_HEADER_LEN;
    st32(s + 8, 0x7fffffffu), reseal_section(s); /* count overflowing the blob */
    expect_refused(c, b.len, HASH, 5000, "does not fit");
    FRESH();
    st64(s, 7), reseal_section(s);
    expect_refused(c, b.len, HASH, 5000, "expected 0");
    FRESH();
    st32(s + 12, ld32(s + 12) + 1), reseal_section(s);
    expect_refused(c, b.len, HASH, 5000, "raw length");
    FRESH();
    st32(s + 20, ld32(s + 20) | 8), reseal_section(s);
    expect_refused(c, b.len, HASH, 5000, "unknown flags");
    FRESH();
    c[b.len] = 0;
    expect_refused(c, b.len + 1, HASH, 5000, "bytes");
    free(c);
    blob_free(&b);
}

Test(codec_malformed, sealed_but_invalid_payloads_are_refused) {
    /* an attacker can recompute checksums: the payload itself is checked */
    Blob b = valid_blob("int8", 5000);
    uint8_t *c = malloc(b.len), *s = c + BLOB_HEADER_LEN;
    FRESH();
    if (ld32(s + 20) & SECTION_FLAG_ZSTD) {
        s[SECTION_HEADER_LEN + 20] ^= 0x55, reseal_section(s);
        expect_refused(c, b.len, HASH, 5000, "compressed");
    }
    blob_free(&b);
    free(c);

    CodecParams p = codec_params_default(CODEC_INT8);
    p.zstd_level = 0;
    float x[300];
    for (int i = 0; i < 300; i++) x[i] = gaussian();
    CodecLayout L = flat(300);
    Blob raw = {0};
    cr_assert_eq(codec_encode(&p, &L, x, &raw, NULL), 0);
    s = raw.data + BLOB_HEADER_LEN;
    stf(s + SECTION_HEADER_LEN + 4 * 7, NAN), reseal_section(s);
    expect_refused_as(raw.data, raw.len, HASH, 300, "non-finite", CODEC_NON_FINITE);
    blob_free(&raw);

    p = codec_params_default(CODEC_TOPK);
    p.zstd_level = 0;
    float y[8192];
    for (int i = 0; i < 8192; i++) y[i] = gaussian();
    L = flat(8192);
    cr_assert_eq(codec_encode(&p, &L, y, &raw, NULL), 0);
    s = raw.data + BLOB_HEADER_LEN;
    uint8_t *first_chunk = s + SECTION_HEADER_LEN + 4 + 1024;
    st16(first_chunk + 2, 9000), reseal_section(s); /* index past the chunk */
    expect_refused(raw.data, raw.len, HASH, 8192, "indices out of range");
    st16(first_chunk + 2, ld16(first_chunk + 4)), reseal_section(s); /* repeated index */
    expect_refused(raw.data, raw.len, HASH, 8192, "not ascending");
    st16(first_chunk, 3), reseal_section(s);
    expect_refused(raw.data, raw.len, HASH, 8192, "expected 41");
    blob_free(&raw);
}

/* Byte planes are checked like any payload a peer sends: plane lengths
 * against the section, each zstd plane's frame against its plane; and the
 * plane form only for payloads of words. A float section compressed whole,
 * as strait wrote it before planes, still reads. */
Test(codec_malformed, byte_plane_faults_are_named) {
    float *x = make_vec(5000, 0, 1e-3f);
    CodecParams p = codec_params_default(CODEC_FP32);
    CodecLayout L = flat(5000);
    Blob b = {0};
    cr_assert_eq(codec_encode(&p, &L, x, &b, NULL), 0);
    uint8_t *c = malloc(b.len), *s = c + BLOB_HEADER_LEN, *pl = s + SECTION_HEADER_LEN;
    FRESH();
    cr_assert_eq(ld32(s + 20), SECTION_FLAG_PLANES);
    cr_assert_eq(ld32(pl), 5000, "plane 0, mantissa, goes raw");
    cr_assert_lt(ld32(pl + 12), 5000, "plane 3, sign and exponent, is zstd");
    cr_assert_eq(codec_blob_inspect(c, b.len, HASH, 5000, NULL, NULL), 0);
    st32(pl, 5001), reseal_section(s);
    expect_refused(c, b.len, HASH, 5000, "byte plane 0 of 5001 bytes");
    FRESH();
    st32(pl, 4999), reseal_section(s);
    expect_refused(c, b.len, HASH, 5000, "do not fill");
    FRESH();
    st32(pl, 4999), st32(pl + 12, ld32(pl + 12) + 1), reseal_section(s);
    expect_refused(c, b.len, HASH, 5000, "compressed"); /* plane 0's bytes as a frame */
    FRESH();
    pl[16 + 3 * 5000 + 12] ^= 0x5a, reseal_section(s); /* inside plane 3's frame */
    expect_refused(c, b.len, HASH, 5000, "compressed");
    FRESH();
    st32(s + 20, SECTION_FLAG_PLANES | SECTION_FLAG_ZSTD), reseal_section(s);
    expect_refused(c, b.len, HASH, 5000, "unknown flags");
    FRESH();
    st32(s + 16, 8), reseal_section(s); /* a payload shorter than its 4 lengths */
    expect_refused(c, BLOB_HEADER_LEN + SECTION_HEADER_LEN + 8, HASH, 5000, "truncated");
    free(c);
    blob_free(&b);

    Blob q = valid_blob("int8", 5000); /* codes and tables: no words */
    s = q.data + BLOB_HEADER_LEN;
    st32(s + 20, SECTION_FLAG_PLANES), reseal_section(s);
    expect_refused(q.data, q.len, HASH, 5000, "no words");
    blob_free(&q);

    p.zstd_level = 0; /* fp32 compressed whole: the form before planes */
    cr_assert_eq(codec_encode(&p, &L, x, &b, NULL), 0);
    size_t bound = ZSTD_compressBound(20000);
    uint8_t *old = malloc(BLOB_HEADER_LEN + SECTION_HEADER_LEN + bound);
    memcpy(old, b.data, BLOB_HEADER_LEN + SECTION_HEADER_LEN);
    s = old + BLOB_HEADER_LEN;
    size_t zl = ZSTD_compress(s + SECTION_HEADER_LEN, bound,
                              b.data + BLOB_HEADER_LEN + SECTION_HEADER_LEN, 20000, 1);
    cr_assert_lt(zl, 20000);
    st32(s + 16, (uint32_t)zl), st32(s + 20, SECTION_FLAG_ZSTD), reseal_section(s);
    float *y = malloc(5000 * 4);
    char err[ERR_LEN];
    cr_assert_eq(codec_decode(old, BLOB_HEADER_LEN + SECTION_HEADER_LEN + zl, y, 5000, err), 0,
                 "%s", err);
    cr_assert_eq(memcmp(x, y, 5000 * 4), 0);
    free(y), free(old), free(x);
    blob_free(&b);
}

Test(codec_malformed, refused_blobs_never_touch_the_sum) {
    Blob b = valid_blob("topk", 20000);
    uint8_t *s = b.data + b.len - 1;
    *s ^= 0xff; /* last section's payload */
    float *sum = calloc(20000, 4);
    char err[ERR_LEN];
    BlobInfo info;
    cr_assert_eq(codec_blob_inspect(b.data, b.len, HASH, 20000, &info, err), -1);
    /* decode_accumulate validates the container before any section runs */
    cr_assert_eq(codec_decode_accumulate(b.data, b.len, 1.0f, sum, 20000, err), -1);
    for (int i = 0; i < 20000; i++) cr_assert_eq(sum[i], 0.0f, "sum touched at %d", i);
    cr_assert_eq(codec_decode_accumulate(b.data, b.len, 1.0f, sum, 19999, err), -1);
    free(sum);
    blob_free(&b);
}

/* ---- checkpoints --------------------------------------------------------- */

/* The planes are read side by side a chunk at a time (65 536 words): a
 * length off the chunks, into the caller's buffer, and the faults a
 * stream can hide — bytes after its frame, a frame cut short — refused. */
Test(checkpoint, decodes_across_chunks_into_a_buffer_and_refuses_hidden_faults) {
    size_t n = 2 * 65536 + 77;
    float *a = make_vec(n, 0, 0.02f), *b = malloc(n * 4), *got = malloc(n * 4);
    for (size_t i = 0; i < n; i++) b[i] = a[i] + 1e-5f * gaussian();
    char err[ERR_LEN];
    Blob d = {0};
    cr_assert_eq(ckpt_encode(b, n * 4, 4, a, 1, &d, err), 0, "%s", err);
    cr_assert_eq(ckpt_decode_into(d.data, d.len, a, n * 4, got, n * 4, err), 0, "%s", err);
    cr_assert_eq(memcmp(got, b, n * 4), 0);
    cr_assert_eq(ckpt_decode_into(d.data, d.len, a, n * 4, got, n * 4 - 4, err), -1);
    cr_assert_not_null(strstr(err, "expected"), "%s", err);
    /* the last plane (sign and exponent, XORed: it compresses) */
    size_t pos = 32, last = 0;
    for (int p = 0; p < 4; p++) {
        last = pos;
        pos += 32 + ld64(d.data + pos + 8);
    }
    cr_assert_eq(ld32(d.data + last + 16), 1u, "the top plane was not compressed");
    uint64_t stored = ld64(d.data + last + 8);
    /* four bytes after its frame, counted in its length */
    uint8_t *longer = malloc(d.len + 4);
    memcpy(longer, d.data, d.len);
    memset(longer + d.len, 0, 4);
    st64(longer + last + 8, stored + 4);
    cr_assert_eq(ckpt_decode_into(longer, d.len + 4, a, n * 4, got, n * 4, err), -1);
    cr_assert_not_null(strstr(err, "plane 3"), "%s", err);
    /* its frame cut short by as much */
    memcpy(longer, d.data, d.len);
    st64(longer + last + 8, stored - 4);
    cr_assert_eq(ckpt_decode_into(longer, d.len - 4, a, n * 4, got, n * 4, err), -1);
    /* one flipped byte in the middle of its frame */
    memcpy(longer, d.data, d.len);
    longer[last + 32 + stored / 2] ^= 0x40;
    cr_assert_eq(ckpt_decode_into(longer, d.len, a, n * 4, got, n * 4, err), -1);
    cr_assert_not_null(strstr(err, "plane 3"), "%s", err);
    free(longer);
    free(a), free(b), free(got);
    blob_free(&d);
}

Test(checkpoint, byte_grouping_round_trips_exactly_and_xor_helps) {
    size_t n = 1 << 18;
    float *a = make_vec(n, 0, 0.02f), *b = malloc(n * 4);
    for (size_t i = 0; i < n; i++) b[i] = a[i] + 1e-5f * gaussian(); /* the next checkpoint */
    char err[ERR_LEN];
    Blob plain = {0}, delta = {0}, half = {0};
    cr_assert_eq(ckpt_encode(b, n * 4, 4, NULL, 3, &plain, err), 0, "%s", err);
    cr_assert_eq(ckpt_encode(b, n * 4, 4, a, 3, &delta, err), 0, "%s", err);
    void *out;
    size_t len;
    cr_assert_eq(ckpt_decode(plain.data, plain.len, NULL, 0, &out, &len, err), 0, "%s", err);
    cr_assert_eq(len, n * 4);
    cr_assert_eq(memcmp(out, b, len), 0);
    free(out);
    cr_assert_eq(ckpt_decode(delta.data, delta.len, a, n * 4, &out, &len, err), 0, "%s", err);
    cr_assert_eq(memcmp(out, b, len), 0);
    free(out);
    cr_assert_lt(plain.len, n * 4, "byte grouping did not compress");
    cr_assert_lt(delta.len, plain.len, "XOR delta did not help: %zu vs %zu", delta.len, plain.len);
    cr_assert_eq(ckpt_decode(delta.data, delta.len, NULL, 0, &out, &len, err), -1);
    cr_assert_not_null(strstr(err, "is a delta"), "%s", err);
    /* bf16 words */
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = codec_f32_to_bf16(a[i]);
    cr_assert_eq(ckpt_encode(h, n * 2, 2, NULL, 3, &half, err), 0);
    cr_assert_eq(ckpt_decode(half.data, half.len, NULL, 0, &out, &len, err), 0);
    cr_assert_eq(memcmp(out, h, n * 2), 0);
    free(out);
    /* damage */
    for (size_t cut = 0; cut < half.len; cut += 501)
        cr_assert_eq(ckpt_decode(half.data, cut, NULL, 0, &out, &len, err), -1);
    half.data[half.len / 2] ^= 1;
    cr_assert_eq(ckpt_decode(half.data, half.len, NULL, 0, &out, &len, err), -1);
    cr_assert_eq(ckpt_encode(h, 7, 2, NULL, 3, &half, err), -1);
    free(h);
    blob_free(&plain);
    blob_free(&delta);
    blob_free(&half);
    free(a);
    free(b);
}

/* Lengths a peer declares are checked against the bytes present before
 * anything is allocated from them: a blob header claiming 2^24 sections in
 * 48 bytes, and a checkpoint whose zstd frames declare a GiB each in a few
 * bytes (a frame holds at most 32768 bytes per byte: one RLE block of
 * 128 KiB is 4 bytes). */
Test(codec_malformed, declared_lengths_are_checked_before_allocating) {
    Blob b = valid_blob("fp32", 1000);
    st32(b.data + 24, CODEC_MAX_SECTIONS), reseal_header(b.data);
    expect_refused(b.data, b.len, HASH, 1000, "sections in");
    blob_free(&b);

    enum { WORD = 2 };
    const uint64_t n = 1ull << 30; /* per plane: 2 GiB of checkpoint claimed */
    uint8_t ck[32 + WORD * (32 + 17)];
    memset(ck, 0, sizeof ck);
    st32(ck, 0x4b435453u); /* "STCK", version 1, 2-byte words */
    ck[4] = 1, ck[6] = WORD;
    st64(ck + 8, n * WORD);
    st64(ck + 24, XXH64(ck, 24, 0));
    size_t pos = 32;
    for (int p = 0; p < WORD; p++) {
        uint8_t *ph = ck + pos, *f = ph + 32;
        st64(ph, n), st64(ph + 8, 17), st32(ph + 16, 1); /* zstd, 17 bytes stored */
        st32(f, 0xFD2FB528u);                            /* a zstd frame */
        f[4] = 0xE0;                                     /* single segment, 8-byte content size */
        st64(f + 5, n);                                  /* that declares n bytes */
        uint32_t block = (1u << 17) << 3 | 1u << 1 | 1u; /* one last RLE block of 128 KiB */
        f[13] = (uint8_t)block, f[14] = (uint8_t)(block >> 8), f[15] = (uint8_t)(block >> 16);
        f[16] = 0;
        pos += 32 + 17;
    }
    void *out = NULL;
    size_t len = 0;
    char err[ERR_LEN];
    cr_assert_eq(ckpt_decode(ck, sizeof ck, NULL, 0, &out, &len, err), -1);
    cr_assert_not_null(strstr(err, "claims"), "%s", err);
    cr_assert_null(out);
}

/* topk_entries is how a GPU decode-accumulates a top-k section (a scatter
 * of its pairs): scattered on the CPU, its pairs give codec_decode_accumulate's
 * floats, for both value widths and a short last chunk. */
typedef struct Scatter {
    float w, *sum;
    uint64_t pairs;
} Scatter;

static int scatter_section(void *ctx, const CodecParams *p, const uint8_t *raw, uint64_t offset,
                           uint32_t count, char *err) {
    (void)err;
    Scatter *s = ctx;
    uint64_t K = topk_total_k(p, count);
    uint32_t *idx = malloc(4 * K);
    float *vals = malloc(4 * K);
    cr_assert_eq(topk_entries(p, raw, count, idx, vals), K);
    for (uint64_t i = 0; i < K; i++) {
        cr_assert_lt(idx[i], count);
        if (i > 0) cr_assert_gt(idx[i], idx[i - 1], "indices not ascending");
        float *d = s->sum + offset + idx[i];
        *d = *d + s->w * vals[i];
    }
    s->pairs += K;
    free(idx), free(vals);
    return 0;
}

Test(codec, topk_entries_scatter_to_the_decoded_values) {
    uint64_t n = CODEC_SECTION_MAX + 70001;
    float *x = make_vec(n, 2, 0.02f), *want = malloc(n * 4), *got = malloc(n * 4);
    CodecLayout L = flat(n);
    const char *names[] = {"topk", "topk2"};
    for (int c = 0; c < 2; c++) {
        CodecParams p;
        char err[ERR_LEN];
        cr_assert_eq(codec_params_parse(names[c], &p, err), 0, "%s", err);
        Blob b = {0};
        cr_assert_eq(codec_encode(&p, &L, x, &b, err), 0, "%s", err);
        for (uint64_t i = 0; i < n; i++) want[i] = got[i] = 0.5f - (float)(i % 7) * 0.125f;
        cr_assert_eq(codec_decode_accumulate(b.data, b.len, -0.75f, want, n, err), 0, "%s", err);
        Scatter s = {-0.75f, got, 0};
        cr_assert_eq(codec_for_each_section(b.data, b.len, n, scatter_section, &s, err), 0, "%s",
                     err);
        BlobInfo info;
        cr_assert_eq(codec_blob_inspect(b.data, b.len, 0, n, &info, err), 0, "%s", err);
        cr_assert_eq(s.pairs, info.nonzeros);
        cr_assert_eq(memcmp(want, got, n * 4), 0, "%s: the scattered pairs differ", names[c]);
        blob_free(&b);
    }
    free(x), free(want), free(got);
}

/* ef_encode(a, b) makes Δ = a − b as it adds it: the same blob and the same
 * residual, round after round, as the Δ made first and passed alone; and
 * both as the step spelt out: e = βe + Δ, blob = C(e), e += −1 × decode(blob)
 * of the whole blob (ef_encode subtracts each section's payload as it makes
 * it, before the lossless stage), the decoded values it hands back those of
 * the blob. Every codec, zstd on and off. */
Test(codec, error_feedback_of_a_difference_equals_that_of_its_delta) {
    uint64_t n = 70001;
    float *a = make_vec(n, 0, 1.0f), *b = malloc(n * 4), *d = malloc(n * 4);
    CodecLayout L = flat(n);
    float *spelt = malloc(n * 4), *dec = malloc(n * 4), *want = malloc(n * 4);
    const char *names[] = {"fp32", "fp16", "bf16", "int8", "topk", "topk2"};
    for (int c = 0; c < 12; c++) {
        CodecParams p;
        char err[ERR_LEN];
        cr_assert_eq(codec_params_parse(names[c / 2], &p, err), 0, "%s", err);
        p.zstd_level = c % 2 ? 3 : 0;
        ErrorFeedback one, two;
        cr_assert_eq(ef_init(&one, n, HASH, 0.9f, err), 0, "%s", err);
        cr_assert_eq(ef_init(&two, n, HASH, 0.9f, err), 0, "%s", err);
        memset(spelt, 0, n * 4);
        for (int round = 0; round < 3; round++) {
            for (uint64_t i = 0; i < n; i++) {
                b[i] = a[i] - 0.01f * (float)((i * 7 + (uint64_t)round * 3) % 11) + 0.003f;
                d[i] = a[i] - b[i];
                spelt[i] = 0.9f * spelt[i] + d[i];
            }
            Blob x = {0}, y = {0}, z = {0};
            cr_assert_eq(ef_encode(&one, &p, &L, a, b, dec, &x, err), 0, "%s", err);
            cr_assert_eq(ef_encode(&two, &p, &L, d, NULL, NULL, &y, err), 0, "%s", err);
            cr_assert_eq(codec_decode(x.data, x.len, want, n, err), 0, "%s", err);
            cr_assert_eq(memcmp(dec, want, n * 4), 0, "%s, round %d: decoded is not decode(blob)",
                         names[c / 2], round);
            cr_assert_eq(codec_encode(&p, &L, spelt, &z, err), 0, "%s", err);
            cr_assert_eq(codec_decode_accumulate(z.data, z.len, -1.0f, spelt, n, err), 0, "%s",
                         err);
            cr_assert(x.len == y.len && memcmp(x.data, y.data, x.len) == 0,
                      "%s, round %d: the blobs differ", names[c / 2], round);
            cr_assert(x.len == z.len && memcmp(x.data, z.data, x.len) == 0,
                      "%s, round %d: the blob differs from C(e)", names[c / 2], round);
            cr_assert_eq(memcmp(one.e, two.e, n * 4), 0, "%s, round %d: the residuals differ",
                         names[c / 2], round);
            cr_assert_eq(memcmp(one.e, spelt, n * 4), 0,
                         "%s (zstd %d), round %d: the residual is not e - decode(blob)",
                         names[c / 2], p.zstd_level, round);
            blob_free(&x), blob_free(&y), blob_free(&z);
        }
        ef_free(&one), ef_free(&two);
    }
    free(a), free(b), free(d), free(spelt), free(dec), free(want);
}

/* codec_inspect_decode, one pass, gives codec_decode's floats and
 * codec_blob_inspect's figures for every codec, zstd on and off. */
Test(codec, inspect_decode_is_inspect_then_decode) {
    uint64_t n = CODEC_SECTION_MAX + 4099;
    float *x = make_vec(n, 1, 0.01f), *want = malloc(n * 4), *got = malloc(n * 4);
    CodecLayout L = flat(n);
    const char *names[] = {"fp32", "fp16", "bf16", "int8", "topk", "topk2"};
    for (int c = 0; c < 12; c++) {
        CodecParams p;
        char err[ERR_LEN];
        cr_assert_eq(codec_params_parse(names[c / 2], &p, err), 0, "%s", err);
        p.zstd_level = c % 2;
        Blob b = {0};
        cr_assert_eq(codec_encode(&p, &L, x, &b, err), 0, "%s", err);
        BlobInfo a, z;
        cr_assert_eq(codec_blob_inspect(b.data, b.len, HASH, n, &a, err), 0, "%s", err);
        cr_assert_eq(codec_decode(b.data, b.len, want, n, err), 0, "%s", err);
        memset(got, 0xff, n * 4); /* NaNs: every value must be written */
        cr_assert_eq(codec_inspect_decode(b.data, b.len, HASH, n, got, &z, err), 0, "%s", err);
        cr_assert_eq(memcmp(want, got, n * 4), 0, "%s: decoded values differ", names[c / 2]);
        cr_assert(a.norm2 == z.norm2 && a.nonzeros == z.nonzeros && a.wire_bytes == z.wire_bytes,
                  "%s: the figures differ", names[c / 2]);
        cr_assert_eq(codec_inspect_decode(b.data, b.len, HASH + 1, n, got, NULL, err), -1);
        cr_assert_not_null(strstr(err, "parameter table"), "%s", err);
        blob_free(&b);
    }
    free(x), free(want), free(got);
}

/* ---- one pass: check and add ------------------------------------------- */

/* codec_blob_check_add against its two-pass definition, for every codec,
 * with and without the lossless stage, onto a sum and onto nothing: out is
 * copy-then-accumulate to the bit, the norm is the inspection's, the sum it
 * read is unchanged; a damaged, non-finite or other-model blob fails with
 * its code. */
Test(compress, check_add_is_check_then_accumulate_to_the_bit) {
    const char *codecs[] = {"fp32", "fp16", "bf16", "int8", "int8", "topk", "topk2"};
    uint64_t n = CODEC_SECTION_MAX + 123457, sizes[3] = {1000, CODEC_SECTION_MAX, 122457};
    CodecLayout L = {HASH, n, sizes, 3};
    float *x = make_vec(n, 1, 0.01f), *sum = make_vec(n, 0, 1.0f);
    float *want = malloc(n * 4), *got = malloc(n * 4), *kept = malloc(n * 4);
    memcpy(kept, sum, n * 4);
    char err[ERR_LEN];
    for (size_t c = 0; c < sizeof codecs / sizeof *codecs; c++)
        for (int z = 0; z < 2; z++)
            for (int fresh = 0; fresh < 2; fresh++) {
                CodecParams p;
                cr_assert_eq(codec_params_parse(codecs[c], &p, err), 0, "%s", err);
                p.zstd_level = z;
                if (c == 4) p.block = 1000; /* blocks that end inside a section */
                Blob b = {0};
                cr_assert_eq(codec_encode(&p, &L, x, &b, err), 0, "%s", err);
                CodecChecked *ck = codec_checked_new();
                BlobInfo ref, info;
                cr_assert_eq(codec_blob_check(b.data, b.len, HASH, n, &ref, ck, err), 0, "%s", err);
                if (fresh)
                    memset(want, 0, n * 4);
                else
                    memcpy(want, sum, n * 4);
                codec_checked_accumulate(ck, 0.75f, want, 0);
                memset(got, 0x7f, n * 4);
                cr_assert_eq(codec_blob_check_add(b.data, b.len, HASH, n, 0.75f, fresh ? NULL : sum,
                                                  got, &info, ck, err),
                             0, "%s: %s", codecs[c], err);
                cr_assert_eq(memcmp(want, got, n * 4), 0, "%s zstd %d fresh %d: not the bits",
                             codecs[c], z, fresh);
                cr_assert_eq(info.norm2, ref.norm2, "%s: norm %g against %g", codecs[c], info.norm2,
                             ref.norm2);
                cr_assert_eq(info.nonzeros, ref.nonzeros);
                cr_assert_eq(memcmp(sum, kept, n * 4), 0, "the sum it read changed");
                /* and what it kept accumulates as an inspection's does */
                memcpy(got, sum, n * 4);
                if (fresh) memset(got, 0, n * 4);
                codec_checked_accumulate(ck, 0.75f, got, 0);
                cr_assert_eq(memcmp(want, got, n * 4), 0);
                cr_assert_eq(
                    codec_blob_check_add(b.data, b.len, HASH + 1, n, 1, sum, got, NULL, ck, err),
                    CODEC_WRONG_MODEL);
                cr_assert_eq(
                    codec_blob_check_add(b.data, b.len, HASH, n - 1, 1, sum, got, NULL, ck, err),
                    CODEC_WRONG_MODEL);
                b.data[b.len - 7] ^= 0x10; /* the last section's payload */
                cr_assert_eq(
                    codec_blob_check_add(b.data, b.len, HASH, n, 1, sum, got, NULL, ck, err), -1,
                    "%s: a damaged blob passed", codecs[c]);
                cr_assert_not_null(strstr(err, "checksum"), "%s", err);
                codec_checked_free(ck);
                blob_free(&b);
            }
    /* a value that is not finite: refused as such, fp32 and int8 alike (one
     * section, its checksum made again, so only the value is wrong) */
    const char *raw_codecs[] = {"fp32", "int8"};
    CodecLayout small = flat(5000);
    for (int c = 0; c < 2; c++) {
        CodecParams p;
        cr_assert_eq(codec_params_parse(raw_codecs[c], &p, err), 0);
        p.zstd_level = 0;
        Blob b = {0};
        cr_assert_eq(codec_encode(&p, &small, x, &b, err), 0, "%s", err);
        uint8_t *sec = b.data + BLOB_HEADER_LEN;
        float inf = INFINITY; /* fp32: a value; int8: a table entry */
        memcpy(sec + SECTION_HEADER_LEN + 40, &inf, 4);
        reseal_section(sec);
        cr_assert_eq(codec_blob_check_add(b.data, b.len, HASH, 5000, 1, sum, got, NULL, NULL, err),
                     CODEC_NON_FINITE, "%s: %s", raw_codecs[c], err);
        blob_free(&b);
    }
    free(x), free(sum), free(want), free(got), free(kept);
}
