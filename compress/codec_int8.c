/*
 * codec_int8.c — blockwise 8-bit quantization with a bin-mean table
 * (INTELLECT-1's quantizer, DESIGN.md §3).
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
#include <math.h>
#include <stdlib.h>

#include "compress_internal.h"
#include "util/util.h"

#define LANES    256
#define FIX_MID  16777216.0f /* 2^24: offsets from a bin centre, |d| <= 1/2 */
#define FIX_EDGE 1048576.0   /* 2^20: values clamped into bin 0 or 255 */

static size_t int8_raw_len(const CodecParams *p, uint32_t count) {
    size_t blocks = (count + p->block - 1) / p->block;
    return blocks * 1024 + count;
}

/* ‖x‖² in the fixed lane order. Not finite iff some x is not finite: the
 * squares of finite floats cannot overflow a double sum of 2^20 terms. */
static double sumsq_fixed(const float *x, uint32_t n) {
    double lane[LANES] = {0};
    uint32_t full = n - n % LANES;
    for (uint32_t i0 = 0; i0 < full; i0 += LANES)
        for (int j = 0; j < LANES; j++) lane[j] += (double)x[i0 + j] * (double)x[i0 + j];
    for (uint32_t j = 0; full + j < n; j++) lane[j] += (double)x[full + j] * (double)x[full + j];
    for (int s = LANES / 2; s > 0; s >>= 1)
        for (int j = 0; j < s; j++) lane[j] += lane[j + s];
    return lane[0];
}

static float block_scale(double sumsq, uint32_t n) {
    double sigma = sqrt(sumsq / (double)n);
    float scale = (float)(6.0 * sigma / 256.0);
    return scale > 0 && isfinite(scale) ? scale : 1.0f;
}

/* rint for |f| <= 2^22 under round-to-nearest-even, without SSE4.1 */
static inline float rint_small(float f) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    return (f + magic) - magic;
}

/* One block: codes, then the bin-mean table. Two passes: a branch-free one
 * that the compiler vectorizes (codes and each value's offset from its bin
 * centre), then the bin sums, which are scalar scatters. */
static void int8_encode_block(const float *restrict x, uint32_t n, float scale,
                              uint8_t *restrict table, uint8_t *restrict codes,
                              int32_t *restrict offset) {
    float inv = 1.0f / scale;
    uint32_t clamped = 0;
    for (uint32_t i = 0; i < n; i++) {
        float f = x[i] * inv;
        float fc = f < -129.0f ? -129.0f : f; /* one clamp per line: no branches */
        fc = fc > 129.0f ? 129.0f : fc;
        float r = rint_small(fc);
        float rq = r < -128.0f ? -128.0f : r;
        rq = rq > 127.0f ? 127.0f : rq;
        codes[i] = (uint8_t)(int32_t)(rq + 128.0f);
        offset[i] = (int32_t)lrintf((f - rq) * FIX_MID); /* exact f - rq unless clamped */
        clamped += r != rq;
    }
    int64_t mid_sum[256] = {0}, edge_sum[2] = {0, 0};
    uint32_t mid_count[256] = {0}, edge_count[2] = {0, 0};
    int64_t sum2[256] = {0};
    uint32_t count2[256] = {0}, i = 0;
    for (; i + 1 < n; i += 2) { /* two histograms: neighbours often share a bin */
        mid_sum[codes[i]] += offset[i];
        mid_count[codes[i]]++;
        sum2[codes[i + 1]] += offset[i + 1];
        count2[codes[i + 1]]++;
    }
    if (i < n) {
        mid_sum[codes[i]] += offset[i];
        mid_count[codes[i]]++;
    }
    for (int q = 0; q < 256; q++) {
        mid_sum[q] += sum2[q];
        mid_count[q] += count2[q];
    }
    if (clamped) {
        /* values beyond the edge bins: move them from the offset sums to
         * the edge sums, measured from zero in a coarser unit */
        for (uint32_t i = 0; i < n; i++) {
            if (codes[i] != 0 && codes[i] != 255) continue; /* only edge bins clamp */
            float f = x[i] * inv;
            float r = rint_small(f < -129.0f ? -129.0f : f > 129.0f ? 129.0f : f);
            if (r >= -128.0f && r <= 127.0f) continue;
            int hi = r > 0;
            mid_sum[codes[i]] -= offset[i];
            mid_count[codes[i]]--;
            edge_sum[hi] += llrint((double)f * FIX_EDGE);
            edge_count[hi]++;
        }
    }
    for (int q = 0; q < 256; q++) {
        /* edge bins also hold the values clamped into them */
        int edge = q == 0 ? 0 : q == 255 ? 1 : -1;
        double centre = (double)(q - 128);
        double total = (double)mid_count[q] * centre + (double)mid_sum[q] / FIX_MID;
        uint32_t c = mid_count[q];
        if (edge >= 0) {
            total += (double)edge_sum[edge] / FIX_EDGE;
            c += edge_count[edge];
        }
        double mean = c ? total / (double)c : centre;
        stf(table + 4 * q, (float)(mean * (double)scale));
    }
}

static int int8_encode(const CodecParams *p, const float *x, uint32_t count, uint8_t *out,
                       char *err) {
    uint32_t span = count < p->block ? count : p->block;
    int32_t *offset = malloc(sizeof(int32_t) * span);
    if (offset == NULL) return err_set(err, "out of memory encoding int8");
    for (uint32_t b0 = 0; b0 < count; b0 += p->block) {
        uint32_t n = count - b0 < p->block ? count - b0 : p->block;
        double sumsq = sumsq_fixed(x + b0, n);
        if (!isfinite(sumsq)) {
            free(offset);
            return err_set(err, "update value near %u is not finite", b0);
        }
        int8_encode_block(x + b0, n, block_scale(sumsq, n), out, out + 1024, offset);
        out += 1024 + n;
    }
    free(offset);
    return 0;
}

static int int8_check(const CodecParams *p, const uint8_t *raw, uint32_t count, double *norm2,
                      uint64_t *nonzeros, char *err) {
    double s = 0;
    for (uint32_t b0 = 0; b0 < count; b0 += p->block) {
        uint32_t n = count - b0 < p->block ? count - b0 : p->block;
        float table[256];
        memcpy(table, raw, 1024);
        for (int q = 0; q < 256; q++)
            if (!isfinite(table[q]))
                return err_set(err, "int8 table holds a non-finite value"), CODEC_NON_FINITE;
        uint32_t hist[256] = {0};
        const uint8_t *codes = raw + 1024;
        for (uint32_t i = 0; i < n; i++) hist[codes[i]]++;
        for (int q = 0; q < 256; q++) s += (double)hist[q] * table[q] * table[q];
        raw += 1024 + n;
    }
    *norm2 = s;
    *nonzeros = count;
    return 0;
}

static void int8_apply(const CodecParams *p, const uint8_t *raw, uint32_t count, float w,
                       float *dst, int accumulate) {
    for (uint32_t b0 = 0; b0 < count; b0 += p->block) {
        uint32_t n = count - b0 < p->block ? count - b0 : p->block;
        float table[256];
        memcpy(table, raw, 1024);
        const uint8_t *codes = raw + 1024;
        float *d = dst + b0;
        if (accumulate) {
            for (uint32_t i = 0; i < n; i++) d[i] = d[i] + w * table[codes[i]];
        } else {
            for (uint32_t i = 0; i < n; i++) d[i] = table[codes[i]];
        }
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
                                 .apply = int8_apply};
