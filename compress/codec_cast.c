/*
 * codec_cast.c — the dense codecs: fp32 (the identity), fp16 and bf16
 * (round-to-nearest-even casts). fp16 pseudo-gradients lose nothing
 * measurable (OpenDiLoCo); a value beyond fp16's range is refused at encode
 * rather than sent as infinity. The casts themselves, one value at a time
 * and in lanes, are simd.c's: this file calls it, never the other way.
 */
#include <assert.h>
#include <math.h>

#include "compress_internal.h"
#include "util/util.h"

/* ---- fp32 -------------------------------------------------------------- */

static size_t fp32_raw_len(const CodecParams *p, uint32_t count) {
    (void)p;
    return (size_t)count * 4;
}

static int fp32_encode(const CodecParams *p, const float *x, uint32_t count, uint8_t *out,
                       char *err) {
    (void)p;
    if (!codec_simd()->finite(x, count, out)) /* checked as it is copied */
        return err_set(err, "update holds a value that is not finite");
    return 0;
}

static int fp32_check(const CodecParams *p, const uint8_t *raw, uint32_t count, double *norm2,
                      uint64_t *nonzeros, char *err) {
    (void)p;
    double s = codec_simd()->sumsq(raw, count); /* not finite iff a value is not */
    if (!isfinite(s)) return err_set(err, "update carries a non-finite value"), CODEC_NON_FINITE;
    *norm2 = s;
    *nonzeros = count;
    return 0;
}

static void fp32_apply(const CodecParams *p, const uint8_t *raw, uint32_t count, float w,
                       float *dst, int accumulate) {
    (void)p;
    if (!accumulate) {
        memcpy(dst, raw, (size_t)count * 4);
        return;
    }
    codec_simd()->axpy(raw, count, w, dst);
}

/* fp32_check, then d[i] = src[i] + w·x[i] (src NULL: 0 + w·x[i]), axpy's
 * floats, the section's payload read again from cache (a section is 4 MB:
 * in L3; 16 KB tiles checked and added in L1 were slower here). */
static int fp32_check_add(const CodecParams *p, const uint8_t *raw, uint32_t count, float w,
                          const float *src, float *d, double *norm2, uint64_t *nonzeros,
                          char *err) {
    int bad = fp32_check(p, raw, count, norm2, nonzeros, err);
    if (bad) return bad;
    codec_simd()->axpy_to(raw, count, w, src, d);
    return 0;
}

const CodecOps codec_fp32_ops = {.id = CODEC_FP32,
                                 .name = "fp32",
                                 .word = 4,
                                 .raw_len = fp32_raw_len,
                                 .encode = fp32_encode,
                                 .check = fp32_check,
                                 .check_add = fp32_check_add,
                                 .apply = fp32_apply};

/* ---- fp16 and bf16 ----------------------------------------------------- */

static size_t half_raw_len(const CodecParams *p, uint32_t count) {
    (void)p;
    return (size_t)count * 2;
}

static int half_encode(const CodecParams *p, const float *x, uint32_t count, uint8_t *out,
                       char *err) {
    assert(p->id == CODEC_BF16 || p->id == CODEC_FP16);
    int bf = p->id == CODEC_BF16;
    if (codec_simd()->to_half(x, count, bf, out)) return 0;
    for (uint32_t i = 0; i < count; i++) { /* which value, and why */
        if (!isfinite(x[i])) return err_set(err, "update value %u is not finite", i);
        uint16_t h = bf ? codec_f32_to_bf16(x[i]) : codec_f32_to_f16(x[i]);
        if ((h & 0x7fffu) >= (bf ? 0x7f80u : 0x7c00u))
            return err_set(err, "update value %g is beyond %s range; use bf16 or fp32",
                           (double)x[i], bf ? "bf16" : "fp16");
    }
    return err_set(err, "update could not be cast to %s", bf ? "bf16" : "fp16");
}

/* Halves go through floats a tile at a time (kept in L1), so the checks and
 * sums are the fp32 kernels': ‖v‖² is the sum over tiles of each tile's
 * sumsq, the same on every table. */
#define HALF_TILE 4096

static int half_check(const CodecParams *p, const uint8_t *raw, uint32_t count, double *norm2,
                      uint64_t *nonzeros, char *err) {
    assert(p->id == CODEC_BF16 || p->id == CODEC_FP16);
    const CodecSimd *k = codec_simd();
    int bf = p->id == CODEC_BF16;
    float tile[HALF_TILE];
    double s = 0;
    for (uint32_t t0 = 0; t0 < count; t0 += HALF_TILE) {
        uint32_t m = count - t0 < HALF_TILE ? count - t0 : HALF_TILE;
        k->from_half(raw + 2 * (size_t)t0, m, bf, tile);
        s += k->sumsq(tile, m); /* not finite iff a value is not */
    }
    if (!isfinite(s)) return err_set(err, "update carries a non-finite value"), CODEC_NON_FINITE;
    *norm2 = s;
    *nonzeros = count;
    return 0;
}

static void half_apply(const CodecParams *p, const uint8_t *raw, uint32_t count, float w,
                       float *dst, int accumulate) {
    assert(p->id == CODEC_BF16 || p->id == CODEC_FP16);
    const CodecSimd *k = codec_simd();
    int bf = p->id == CODEC_BF16;
    if (!accumulate) {
        k->from_half(raw, count, bf, dst);
        return;
    }
    float tile[HALF_TILE];
    for (uint32_t t0 = 0; t0 < count; t0 += HALF_TILE) {
        uint32_t m = count - t0 < HALF_TILE ? count - t0 : HALF_TILE;
        k->from_half(raw + 2 * (size_t)t0, m, bf, tile);
        k->axpy(tile, m, w, dst + t0);
    }
}

const CodecOps codec_fp16_ops = {.id = CODEC_FP16,
                                 .name = "fp16",
                                 .word = 2,
                                 .raw_len = half_raw_len,
                                 .encode = half_encode,
                                 .check = half_check,
                                 .apply = half_apply};
const CodecOps codec_bf16_ops = {.id = CODEC_BF16,
                                 .name = "bf16",
                                 .word = 2,
                                 .raw_len = half_raw_len,
                                 .encode = half_encode,
                                 .check = half_check,
                                 .apply = half_apply};
