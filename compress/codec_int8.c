/*
 * codec_int8.c — blockwise 8-bit quantization with a bin-mean table
 * (INTELLECT-1's quantizer, docs/design.md §3).
 *
 * Per block of `block` values: σ = ‖x‖₂/√n, scale = 6σ/256,
 * q = clamp(rint(x/scale) + 128, 0, 255), and a 256-entry fp32 table of the
 * mean of the original values in each bin travels with the codes; decoding
 * is table[q]. Payload of a block: table (1024 bytes), then the codes.
 *
 * Determinism across CPU, GPU and thread counts: ‖x‖² is summed in double
 * over 256 fixed lanes (lane j takes j, j+256, …, in order) and the lanes
 * are added in a fixed tree. Codes come from f = x·(1/scale) in float. Bin
 * means are sums of integers — each value's offset from its bin centre in
 * units of 2⁻²⁴ (values clamped into the edge bins in units of 2⁻²⁰ of the
 * scale, in a separate sum) — so their order does not matter.
 * kernels/cuda/compress.cu follows the same steps.
 */
#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress_internal.h"
#include "util/util.h"

#define FIX_EDGE   1048576.0 /* 2^20: values clamped into bin 0 or 255 */
#define FOLD_EVERY 65536u    /* values between folds of the packed histogram */

static size_t int8_raw_len(const CodecParams *p, uint32_t count) {
    size_t blocks = (count + p->block - 1) / p->block;
    return blocks * 1024 + count;
}

/* The scale of a block. Below the smallest normal float (0 included) its
 * reciprocal could overflow, so such blocks use 1. */
static float block_scale(double sumsq, uint32_t n) {
    double sigma = sqrt(sumsq / (double)n);
    float scale = (float)(6.0 * sigma / 256.0);
    return scale >= FLT_MIN && isfinite(scale) ? scale : 1.0f;
}

/* Four packed histograms (SIMD_TERM_ONE in compress_internal.h) into the
 * bins' counts and offset sums, leaving them zero. Each holds at most
 * FOLD_EVERY / 4 terms, so its offset sum is at most 2^37 in magnitude and
 * the split is exact. */
static void fold(int64_t (*h)[256], int64_t *mid_sum, uint32_t *mid_count) {
    for (int q = 0; q < 256; q++)
        for (int s = 0; s < 4; s++) {
            int64_t a = h[s][q];
            int64_t c = (a + (SIMD_TERM_ONE >> 1)) >> 40;
            mid_count[q] += (uint32_t)c;
            mid_sum[q] += a - c * SIMD_TERM_ONE;
            h[s][q] = 0;
        }
}

/* One block: codes (from the kernel, a tile at a time), then the bin-mean
 * table from the histogram terms; values clamped into the edge bins are
 * summed apart, measured from zero in a coarser unit. */
static void int8_encode_block(const CodecSimd *k, const float *restrict x, uint32_t n, float scale,
                              uint8_t *restrict table, uint8_t *restrict codes,
                              int32_t *restrict off, uint32_t *restrict clamped,
                              int64_t (*h)[256]) {
    assert(n > 0 && scale >= FLT_MIN && isfinite(scale)); /* block_scale's */
    float inv = 1.0f / scale;
    int64_t mid_sum[256] = {0}, edge_sum[2] = {0, 0};
    uint32_t mid_count[256] = {0}, edge_count[2] = {0, 0};
    for (uint32_t t0 = 0; t0 < n; t0 += SIMD_TERM_TILE) {
        uint32_t m = n - t0 < SIMD_TERM_TILE ? n - t0 : SIMD_TERM_TILE, i = 0;
        const uint8_t *c = codes + t0;
        uint32_t n_clamped = k->int8_codes(x + t0, m, inv, codes + t0, off, clamped);
        assert(n_clamped <= m);
        for (; i + 4 <= m; i += 4) {   /* neighbours often share a bin: four histograms */
            uint32_t q4 = ld32(c + i); /* one load for four codes */
            h[0][q4 & 255] += off[i] + SIMD_TERM_ONE;
            h[1][(q4 >> 8) & 255] += off[i + 1] + SIMD_TERM_ONE;
            h[2][(q4 >> 16) & 255] += off[i + 2] + SIMD_TERM_ONE;
            h[3][q4 >> 24] += off[i + 3] + SIMD_TERM_ONE;
        }
        for (; i < m; i++) h[0][c[i]] += off[i] + SIMD_TERM_ONE;
        for (uint32_t j = 0; j < n_clamped; j++) { /* counted in the edge sums instead */
            uint32_t at = clamped[j];
            h[at < (m & ~3u) ? at & 3 : 0][c[at]] -= SIMD_TERM_ONE; /* the one added above */
            float f = x[t0 + at] * inv;
            int hi = f > 0;
            edge_sum[hi] += llrint((double)f * FIX_EDGE);
            edge_count[hi]++;
        }
        if ((t0 + m) % FOLD_EVERY == 0 || t0 + m == n) fold(h, mid_sum, mid_count);
    }
    for (int q = 0; q < 256; q++) {
        /* edge bins also hold the values clamped into them */
        int edge = q == 0 ? 0 : q == 255 ? 1 : -1;
        double centre = (double)(q - 128);
        double total = (double)mid_count[q] * centre + (double)mid_sum[q] / SIMD_FIX_MID;
        uint32_t cnt = mid_count[q];
        if (edge >= 0) {
            total += (double)edge_sum[edge] / FIX_EDGE;
            cnt += edge_count[edge];
        }
        double mean = cnt ? total / (double)cnt : centre;
        assert(isfinite(mean));
        stf(table + 4 * q, (float)(mean * (double)scale));
    }
}

static int int8_encode(const CodecParams *p, const float *x, uint32_t count, uint8_t *out,
                       char *err) {
    assert(p->block > 0 && x != NULL && out != NULL);
    const CodecSimd *k = codec_simd();
    /* scratch: the four histograms, the tile's offsets, the clamped indices */
    int64_t(*h)[256] = malloc(sizeof(int64_t) * 4 * 256 +
                              sizeof(uint32_t) * (2 * SIMD_TERM_TILE + SIMD_COLLECT_SLACK));
    if (h == NULL) return err_set(err, "out of memory encoding int8");
    int32_t *off = (int32_t *)(void *)(h + 4);
    uint32_t *clamped = (uint32_t *)(off + SIMD_TERM_TILE);
    memset(h, 0, 4 * sizeof h[0]); /* zero from here on: every fold leaves it so */
    for (uint32_t b0 = 0; b0 < count; b0 += p->block) {
        uint32_t n = count - b0 < p->block ? count - b0 : p->block;
        double sumsq = k->sumsq(x + b0, n);
        if (!isfinite(sumsq)) {
            free(h);
            return err_set(err, "update value near %u is not finite", b0);
        }
        int8_encode_block(k, x + b0, n, block_scale(sumsq, n), out, out + 1024, off, clamped, h);
        out += 1024 + n;
    }
    free(h);
    return 0;
}

/* A block's table, refused when a value is not finite. */
static int int8_table(const uint8_t *raw, float *table, char *err) {
    memcpy(table, raw, 1024);
    for (int q = 0; q < 256; q++)
        if (!isfinite(table[q]))
            return err_set(err, "int8 table holds a non-finite value"), CODEC_NON_FINITE;
    return 0;
}

/* ‖block‖² is Σ table[q]² over its values, in INT8_LANES double lanes
 * (value i in lane i mod INT8_LANES, in order) added in lane order at the
 * end: the squares are exact in double, and the check alone and the check
 * that also adds (int8_check_add) sum them alike. */
#define INT8_LANES 16

static double lanes_sum(const double *acc) {
    double s = 0;
    for (int j = 0; j < INT8_LANES; j++) s += acc[j];
    return s;
}

/* A block's squared norm from its table and codes. */
static double block_norm2(const float *table, const uint8_t *codes, uint32_t n) {
    assert(n > 0);
    double sq[256], acc[INT8_LANES] = {0};
    for (int q = 0; q < 256; q++) sq[q] = (double)table[q] * table[q];
    uint32_t i = 0;
    for (; i + INT8_LANES <= n; i += INT8_LANES)
#pragma GCC unroll 16
        for (int j = 0; j < INT8_LANES; j++) acc[j] += sq[codes[i + j]];
    for (; i < n; i++) acc[i % INT8_LANES] += sq[codes[i]];
    return lanes_sum(acc);
}

static int int8_check(const CodecParams *p, const uint8_t *raw, uint32_t count, double *norm2,
                      uint64_t *nonzeros, char *err) {
    double s = 0;
    for (uint32_t b0 = 0; b0 < count; b0 += p->block) {
        uint32_t n = count - b0 < p->block ? count - b0 : p->block;
        float table[256];
        int bad = int8_table(raw, table, err);
        if (bad) return bad;
        s += block_norm2(table, raw + 1024, n);
        raw += 1024 + n;
    }
    *norm2 = s;
    *nonzeros = count;
    return 0;
}

/* int8_check and d[i] = src[i] + w·table[q] (lookup_acc's floats; src
 * NULL: 0 + w·table[q]) over a section: its codes are read from memory
 * once, for the norm, and again from cache to add them (a block at a time
 * was slower here: the sum's stream stalled between blocks). */
static int int8_check_add(const CodecParams *p, const uint8_t *raw, uint32_t count, float w,
                          const float *src, float *d, double *norm2, uint64_t *nonzeros,
                          char *err) {
    int bad = int8_check(p, raw, count, norm2, nonzeros, err);
    if (bad) return bad;
    const CodecSimd *k = codec_simd();
    for (uint32_t b0 = 0; b0 < count; b0 += p->block) {
        uint32_t n = count - b0 < p->block ? count - b0 : p->block;
        float table[256], wt[256];
        memcpy(table, raw, 1024);
        for (int q = 0; q < 256; q++) wt[q] = w * table[q];
        k->lookup_to(wt, raw + 1024, n, src ? src + b0 : NULL, d + b0);
        raw += 1024 + n;
    }
    return 0;
}

/* after int8_check: the tables are finite */
static void int8_apply(const CodecParams *p, const uint8_t *raw, uint32_t count, float w,
                       float *dst, int accumulate) {
    assert(p->block > 0);
    const CodecSimd *k = codec_simd();
    for (uint32_t b0 = 0; b0 < count; b0 += p->block) {
        uint32_t n = count - b0 < p->block ? count - b0 : p->block;
        float table[256];
        memcpy(table, raw, 1024);
        const uint8_t *codes = raw + 1024;
        float *d = dst + b0;
        if (accumulate)
            k->lookup_acc(table, codes, n, w, d);
        else
            k->lookup(table, codes, n, d);
        raw += 1024 + n;
    }
}

static void int8_defaults(CodecParams *p) {
    p->block = CODEC_INT8_BLOCK_DEFAULT;
}

static int int8_check_params(const CodecParams *p, char *err) {
    if (p->block < 1 || p->block > CODEC_SECTION_MAX)
        return err_set(err, "int8 block %u out of range; use 1 to %u", p->block, CODEC_SECTION_MAX);
    return 0;
}

static CodecHeader int8_header_put(const CodecParams *p) {
    return (CodecHeader){0, p->block, 0};
}

static int int8_header_get(CodecParams *p, CodecHeader h, char *err) {
    if (h.bits != 0 || h.b != 0) return err_set(err, "blob has parameters int8 does not use");
    p->block = h.a;
    return 0;
}

const CodecOps codec_int8_ops = {.id = CODEC_INT8,
                                 .name = "int8",
                                 .defaults = int8_defaults,
                                 .check_params = int8_check_params,
                                 .header_put = int8_header_put,
                                 .header_get = int8_header_get,
                                 .raw_len = int8_raw_len,
                                 .encode = int8_encode,
                                 .check = int8_check,
                                 .check_add = int8_check_add,
                                 .apply = int8_apply};
