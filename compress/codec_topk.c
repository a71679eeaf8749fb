/*
 * codec_topk.c — sparse updates: per chunk of `chunk` values keep the k
 * largest by magnitude (k = ceil(density·len)), send their uint16 indices,
 * and quantize the kept values with a bin-mean table shared by the section:
 * 8-bit (255 symmetric bins over [-max|v|, max|v|]) or 2-bit (sign × below or
 * above the median magnitude), as in DGC and SparseLoCo.
 *
 * Selection is exact and unique — the order is magnitude descending, then
 * index ascending — so any algorithm, CPU or GPU, picks the same set. This
 * one estimates a threshold from a strided sample of the chunk, collects the
 * candidates above it in one pass, and selects among them (a second pass
 * over the whole chunk only when the estimate was too high). No sorting of
 * the chunk.
 *
 * Section payload: u32 K; table (2^bits floats); per chunk u16 k and k
 * ascending u16 indices; then K codes (bytes, or 2-bit fields packed four
 * to a byte, first in the low bits).
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>

#include "compress_internal.h"
#include "util/util.h"

#define SAMPLE   128
#define FIX_MID  16777216.0f     /* 2^24 */
#define FIX_UNIT 1099511627776.0 /* 2^40 */

static uint32_t n_chunks(const CodecParams *p, uint32_t count) {
    return (count + p->chunk - 1) / p->chunk;
}

static uint64_t total_k(const CodecParams *p, uint32_t count) {
    uint32_t ppm = codec_density_ppm(p), full = count / p->chunk, last = count % p->chunk;
    return (uint64_t)full * topk_k(ppm, p->chunk) + (last ? topk_k(ppm, last) : 0);
}

static size_t codes_len(const CodecParams *p, uint64_t k) {
    return p->value_bits == 8 ? (size_t)k : (size_t)((k + 3) / 4);
}

static size_t topk_raw_len(const CodecParams *p, uint32_t count) {
    uint64_t k = total_k(p, count);
    return 4 + 4 * ((size_t)1 << p->value_bits) + 2 * (size_t)n_chunks(p, count) + 2 * k +
           codes_len(p, k);
}

/* ---- selection ---------------------------------------------------------- */

/* The k-th largest of v[0..n) (1 <= k <= n), counting repeats; reorders v.
 * Quickselect with branch-free partitions (magnitudes of a random update
 * defeat any branch predictor): [lo, hi) is cut into the values above the
 * pivot, then those equal to it, then the rest. */
static float kth_largest(float *v, uint32_t n, uint32_t k) {
    assert(k >= 1 && k <= n);
    uint32_t lo = 0, hi = n, target = k - 1;
    for (;;) {
        float a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi - 1], pivot;
        if (a > b)
            pivot = b > c ? b : (a > c ? c : a);
        else
            pivot = a > c ? a : (b > c ? c : b);
        uint32_t gt = lo;
        for (uint32_t i = lo; i < hi; i++) {
            float t = v[i];
            v[i] = v[gt];
            v[gt] = t;
            gt += t > pivot;
        }
        if (target < gt) {
            hi = gt; /* the pivot itself is not above: the range shrank */
            continue;
        }
        uint32_t eq = gt;
        for (uint32_t i = gt; i < hi; i++) {
            float t = v[i];
            v[i] = v[eq];
            v[eq] = t;
            eq += t == pivot;
        }
        if (target < eq) return pivot; /* eq > gt: the pivot is in the range */
        lo = eq;
    }
}

/* The k indices of x[0..len) first in selection order, ascending, into out;
 * -1 if some x is not finite (checked before anything is ordered: NaN has
 * no order). cmag and tmp are scratch of len floats, cand of len +
 * SIMD_COLLECT_SLACK. With v the k-th largest magnitude among the
 * candidates, the selection is every candidate above v and the first ones
 * equal to v, in index order. */
static int topk_select(const CodecSimd *ks, const float *x, uint32_t len, uint32_t k, float *cmag,
                       float *tmp, uint32_t *cand, uint16_t *out) {
    assert(k <= len && len <= 65536);
    uint32_t n_cand = 0;
    int checked = 0;
    if (k < len) {
        /* estimate a threshold with about 2k + 16 values above it */
        uint32_t s = len < SAMPLE ? len : SAMPLE, stride = len / s;
        uint32_t want = 2 * k + 16 < len ? 2 * k + 16 : len;
        uint32_t r = (uint32_t)((uint64_t)s * want / len);
        if (r < s) {
            float sample[SAMPLE];
            for (uint32_t i = 0; i < s; i++) sample[i] = fabsf(x[i * stride]);
            int bad;
            if (!ks->finite(sample, s, NULL)) return -1;
            n_cand = ks->collect(x, len, kth_largest(sample, s, r + 1), cand, &bad);
            if (bad) return -1;
            checked = 1;
        }
    }
    assert(n_cand <= len);
    if (n_cand < k) { /* estimate too high (or k == len): every index */
        if (!checked && !ks->finite(x, len, NULL)) return -1;
        n_cand = len;
        for (uint32_t i = 0; i < len; i++) cand[i] = i;
    }
    for (uint32_t j = 0; j < n_cand; j++) cmag[j] = tmp[j] = fabsf(x[cand[j]]);
    float v = kth_largest(tmp, n_cand, k);
    uint32_t above = 0, o = 0;
    for (uint32_t j = 0; j < n_cand; j++) above += cmag[j] > v;
    for (uint32_t j = 0, ties = k - above; j < n_cand; j++)
        if (cmag[j] > v || (cmag[j] == v && ties > 0 && ties--)) out[o++] = (uint16_t)cand[j];
    assert(o == k);
    return 0;
}

/* ---- value quantization ------------------------------------------------- */

static float lower_median_mag(const float *v, uint64_t n, float *scratch) {
    for (uint64_t i = 0; i < n; i++) scratch[i] = fabsf(v[i]);
    /* the element of rank floor((n-1)/2) ascending is rank n-1-that descending */
    return kth_largest(scratch, (uint32_t)n, (uint32_t)(n - (n - 1) / 2));
}

static void quantize_values(const CodecParams *p, const float *v, uint64_t n, uint8_t *table,
                            uint8_t *codes, float *scratch) {
    assert(p->value_bits == 8 || p->value_bits == 2);
    float amax = 0;
    for (uint64_t i = 0; i < n; i++)
        if (fabsf(v[i]) > amax) amax = fabsf(v[i]);
    if (!(amax > 0)) amax = 1.0f;
    if (p->value_bits == 8) {
        /* below 2^-120, 127 / amax would overflow (and once made codes of inf) */
        if (amax < 0x1p-120f) amax = 1.0f;
        float inv = 127.0f / amax;
        int64_t sum[256] = {0};
        uint32_t cnt[256] = {0};
        for (uint64_t i = 0; i < n; i++) {
            float f = v[i] * inv, r = rintf(f);
            if (r > 127.0f) r = 127.0f;
            if (r < -127.0f) r = -127.0f;
            int q = (int)r + 128;
            assert(q >= 1 && q <= 255); /* bin 0 is never a code: its value is 0 */
            codes[i] = (uint8_t)q;
            sum[q] += lrintf((f - r) * FIX_MID);
            cnt[q]++;
        }
        for (int q = 0; q < 256; q++) {
            double centre = (double)(q - 128);
            double mean = cnt[q] ? centre + (double)sum[q] / FIX_MID / (double)cnt[q] : centre;
            stf(table + 4 * q, q == 0 ? 0.0f : (float)(mean * (double)amax / 127.0));
        }
        return;
    }
    float m = n ? lower_median_mag(v, n, scratch) : 0.0f;
    int64_t sum[4] = {0};
    uint32_t cnt[4] = {0};
    memset(codes, 0, codes_len(p, n));
    for (uint64_t i = 0; i < n; i++) {
        int q = (v[i] < 0 ? 0 : 2) + (fabsf(v[i]) > m);
        codes[i / 4] |= (uint8_t)(q << (2 * (i % 4)));
        sum[q] += llrint((double)v[i] / (double)amax * FIX_UNIT);
        cnt[q]++;
    }
    for (int q = 0; q < 4; q++) {
        double fallback = (q & 2 ? 1.0 : -1.0) * (q & 1 ? (double)amax : (double)m);
        double mean = cnt[q] ? (double)sum[q] / (double)cnt[q] / FIX_UNIT * (double)amax : fallback;
        stf(table + 4 * q, (float)mean);
    }
}

uint64_t topk_total_k(const CodecParams *p, uint32_t count) {
    return total_k(p, count);
}

int topk_encode_selected(const CodecParams *p, uint32_t count, const uint16_t *sel,
                         const float *vals, uint8_t *out, char *err) {
    uint64_t K = total_k(p, count);
    uint32_t ppm = codec_density_ppm(p);
    float *scratch = malloc(sizeof(float) * (K ? K : 1));
    if (scratch == NULL) return err_set(err, "out of memory quantizing top-k values");
    size_t table_len = 4 * ((size_t)1 << p->value_bits);
    st32(out, (uint32_t)K);
    uint8_t *table = out + 4, *w = table + table_len;
    uint64_t kv = 0;
    for (uint32_t c0 = 0; c0 < count; c0 += p->chunk) {
        uint32_t len = count - c0 < p->chunk ? count - c0 : p->chunk, k = topk_k(ppm, len);
        assert(k <= len && len <= 65536 && kv + k <= K); /* an index fits 16 bits */
        st16(w, (uint16_t)k);
        memcpy(w + 2, sel + kv, 2 * (size_t)k);
        w += 2 + 2 * (size_t)k;
        kv += k;
    }
    assert(kv == K);
    quantize_values(p, vals, K, table, w, scratch);
    free(scratch);
    return 0;
}

static int topk_encode(const CodecParams *p, const float *x, uint32_t count, uint8_t *out,
                       char *err) {
    const CodecSimd *ks = codec_simd();
    uint64_t K = total_k(p, count);
    uint32_t ppm = codec_density_ppm(p), span = count < p->chunk ? count : p->chunk;
    float *cmag = malloc(sizeof(float) * 2 * span), *vals = malloc(sizeof(float) * (K ? K : 1));
    uint32_t *cand = malloc(sizeof(uint32_t) * (span + SIMD_COLLECT_SLACK));
    uint16_t *sel = malloc(sizeof(uint16_t) * (K ? K : 1));
    int rc = -1;
    if (cmag == NULL || cand == NULL || vals == NULL || sel == NULL) {
        err_set(err, "out of memory selecting top-k");
        goto out;
    }
    uint64_t kv = 0;
    for (uint32_t c0 = 0; c0 < count; c0 += p->chunk) {
        uint32_t len = count - c0 < p->chunk ? count - c0 : p->chunk, k = topk_k(ppm, len);
        if (topk_select(ks, x + c0, len, k, cmag, cmag + span, cand, sel + kv) != 0) {
            err_set(err, "update holds a value that is not finite");
            goto out;
        }
        for (uint32_t i = 0; i < k; i++) vals[kv + i] = x[c0 + sel[kv + i]];
        kv += k;
    }
    rc = topk_encode_selected(p, count, sel, vals, out, err);
out:
    free(cmag), free(cand), free(vals), free(sel);
    return rc;
}

/* ---- decoding ----------------------------------------------------------- */

static inline int code_at(const CodecParams *p, const uint8_t *codes, uint64_t i) {
    return p->value_bits == 8 ? codes[i] : (codes[i / 4] >> (2 * (i % 4))) & 3;
}

static int topk_check(const CodecParams *p, const uint8_t *raw, uint32_t count, double *norm2,
                      uint64_t *nonzeros, char *err) {
    uint64_t K = total_k(p, count);
    if (ld32(raw) != K)
        return err_set(err, "topk section carries %u values, expected %llu", ld32(raw),
                       (unsigned long long)K);
    size_t n_table = (size_t)1 << p->value_bits;
    float table[256];
    memcpy(table, raw + 4, 4 * n_table);
    for (size_t q = 0; q < n_table; q++)
        if (!isfinite(table[q]))
            return err_set(err, "topk table holds a non-finite value"), CODEC_NON_FINITE;
    const uint8_t *r = raw + 4 + 4 * n_table;
    const uint8_t *codes = r + 2 * (size_t)n_chunks(p, count) + 2 * K;
    uint32_t ppm = codec_density_ppm(p);
    uint64_t kv = 0;
    double s = 0;
    for (uint32_t c0 = 0; c0 < count; c0 += p->chunk) {
        uint32_t len = count - c0 < p->chunk ? count - c0 : p->chunk;
        uint32_t k = ld16(r);
        if (k != topk_k(ppm, len))
            return err_set(err, "topk chunk carries %u values, expected %u", k, topk_k(ppm, len));
        r += 2;
        for (uint32_t i = 0; i < k; i++) {
            uint32_t idx = ld16(r + 2 * (size_t)i);
            if (idx >= len || (i > 0 && idx <= ld16(r + 2 * (size_t)(i - 1))))
                return err_set(err, "topk indices out of range or not ascending");
            float v = table[code_at(p, codes, kv++)];
            s += (double)v * v;
        }
        r += 2 * (size_t)k;
    }
    *norm2 = s;
    *nonzeros = K;
    return 0;
}

/* The one reader of a checked payload's carried values: fn(ctx, index in
 * the section, value) for each, in order; returns how many. Always inlined,
 * so fn is too: called through a pointer, decode ran at 0.7 of the speed. */
typedef void (*TopkVisit)(void *ctx, uint64_t nth, uint32_t idx, float v);

__attribute__((always_inline)) static inline uint64_t
topk_each(const CodecParams *p, const uint8_t *raw, uint32_t count, TopkVisit fn, void *ctx) {
    uint64_t K = ld32(raw);
    size_t n_table = (size_t)1 << p->value_bits;
    float table[256];
    memcpy(table, raw + 4, 4 * n_table);
    const uint8_t *r = raw + 4 + 4 * n_table;
    const uint8_t *codes = r + 2 * (size_t)n_chunks(p, count) + 2 * K;
    uint64_t kv = 0;
    for (uint32_t c0 = 0; c0 < count; c0 += p->chunk) {
        uint32_t k = ld16(r);
        r += 2;
        for (uint32_t i = 0; i < k; i++, kv++)
            fn(ctx, kv, c0 + ld16(r + 2 * (size_t)i), table[code_at(p, codes, kv)]);
        r += 2 * (size_t)k;
    }
    assert(kv == K);
    return K;
}

typedef struct TopkApply {
    float w, *dst;
    int accumulate;
} TopkApply;

static void apply_one(void *ctx, uint64_t nth, uint32_t idx, float v) {
    TopkApply *a = ctx;
    (void)nth;
    a->dst[idx] = a->accumulate ? a->dst[idx] + a->w * v : v;
}

static void topk_apply(const CodecParams *p, const uint8_t *raw, uint32_t count, float w,
                       float *dst, int accumulate) {
    if (!accumulate) memset(dst, 0, sizeof(float) * count);
    TopkApply a = {w, dst, accumulate};
    topk_each(p, raw, count, apply_one, &a);
}

typedef struct TopkList {
    uint32_t *idx;
    float *vals;
} TopkList;

static void list_one(void *ctx, uint64_t nth, uint32_t idx, float v) {
    TopkList *l = ctx;
    l->idx[nth] = idx;
    l->vals[nth] = v;
}

uint64_t topk_entries(const CodecParams *p, const uint8_t *raw, uint32_t count, uint32_t *idx,
                      float *vals) {
    TopkList l = {idx, vals};
    return topk_each(p, raw, count, list_one, &l);
}

static void topk_defaults(CodecParams *p) {
    p->chunk = CODEC_TOPK_CHUNK_DEFAULT;
    p->density = 0.01;
    p->value_bits = 8;
}

static int topk_check_params(const CodecParams *p, char *err) {
    if (p->chunk < 1 || p->chunk > CODEC_TOPK_CHUNK_MAX)
        return err_set(err, "topk chunk %u out of range; use 1 to %u", p->chunk,
                       CODEC_TOPK_CHUNK_MAX);
    uint32_t ppm = codec_density_ppm(p);
    if (!(p->density > 0) || ppm < 1 || ppm > 500000)
        return err_set(err, "topk density %g out of range; use 0.000001 to 0.5", p->density);
    if (p->value_bits != 8 && p->value_bits != 2)
        return err_set(err, "topk value bits %u unsupported; use 8 or 2", p->value_bits);
    return 0;
}

static CodecHeader topk_header_put(const CodecParams *p) {
    return (CodecHeader){(uint8_t)p->value_bits, p->chunk, codec_density_ppm(p)};
}

static int topk_header_get(CodecParams *p, CodecHeader h, char *err) {
    (void)err;
    p->value_bits = h.bits;
    p->chunk = h.a;
    p->density = h.b / 1e6;
    return 0;
}

const CodecOps codec_topk_ops = {.id = CODEC_TOPK,
                                 .name = "topk",
                                 .defaults = topk_defaults,
                                 .check_params = topk_check_params,
                                 .header_put = topk_header_put,
                                 .header_get = topk_header_get,
                                 .raw_len = topk_raw_len,
                                 .encode = topk_encode,
                                 .check = topk_check,
                                 .apply = topk_apply};
