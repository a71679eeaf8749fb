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

/* a before b in the selection order: larger magnitude, then lower index */
static inline int before(const float *mag, uint32_t a, uint32_t b) {
    // cppcheck-suppress arrayIndexThenCheck ; a < b orders ties, it is no bounds check
    return mag[a] > mag[b] || (mag[a] == mag[b] && a < b);
}

/* Reorders idx[0..n) so its first k are the k first in selection order
 * (quickselect; the order is total, so the set is unique). */
static void select_first_k(const float *mag, uint32_t *idx, uint32_t n, uint32_t k) {
    if (k == 0 || k >= n) return;
    int64_t lo = 0, hi = (int64_t)n - 1, target = (int64_t)k - 1;
    while (lo < hi) {
        uint32_t a = idx[lo], b = idx[lo + (hi - lo) / 2], c = idx[hi], pivot;
        if (before(mag, a, b))
            pivot = before(mag, b, c) ? b : (before(mag, a, c) ? c : a);
        else
            pivot = before(mag, a, c) ? a : (before(mag, b, c) ? c : b);
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (before(mag, idx[i], pivot)) i++;
            while (before(mag, pivot, idx[j])) j--;
            if (i <= j) {
                uint32_t t = idx[i];
                idx[i] = idx[j];
                idx[j] = t;
                i++;
                j--;
            }
        }
        if (target <= j)
            hi = j;
        else if (target >= i)
            lo = i;
        else
            break; /* target sits on the pivot */
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The k indices of x[0..len) first in selection order, ascending, into out.
 * cmag, cand and jbuf are scratch of len entries. Candidates are kept in
 * index order, so a candidate's position orders ties as its index does. */
static void topk_select(const float *x, uint32_t len, uint32_t k, float *cmag, uint32_t *cand,
                        uint32_t *jbuf, uint16_t *out) {
    uint32_t n_cand = 0;
    if (k < len) {
        /* estimate a threshold with about 2k + 16 values above it */
        uint32_t s = len < SAMPLE ? len : SAMPLE, stride = len / s;
        uint32_t want = 2 * k + 16 < len ? 2 * k + 16 : len;
        uint32_t r = (uint32_t)((uint64_t)s * want / len);
        if (r < s) {
            float sample[SAMPLE];
            uint32_t sidx[SAMPLE];
            for (uint32_t i = 0; i < s; i++) {
                sample[i] = fabsf(x[i * stride]);
                sidx[i] = i;
            }
            select_first_k(sample, sidx, s, r + 1);
            float t = sample[sidx[0]];
            for (uint32_t i = 1; i <= r; i++)
                if (sample[sidx[i]] < t) t = sample[sidx[i]];
            for (uint32_t i = 0; i < len; i++) { /* branch-free collection */
                cand[n_cand] = i;
                n_cand += fabsf(x[i]) >= t;
            }
        }
    }
    if (n_cand < k) { /* estimate too high (or k == len): every index */
        n_cand = len;
        for (uint32_t i = 0; i < len; i++) cand[i] = i;
    }
    for (uint32_t j = 0; j < n_cand; j++) cmag[j] = fabsf(x[cand[j]]);
    /* select positions j, then map them back to indices */
    for (uint32_t j = 0; j < n_cand; j++) jbuf[j] = j;
    if (k < n_cand) select_first_k(cmag, jbuf, n_cand, k);
    qsort(jbuf, k, sizeof *jbuf, cmp_u32);
    for (uint32_t i = 0; i < k; i++) out[i] = (uint16_t)cand[jbuf[i]];
}

/* ---- value quantization ------------------------------------------------- */

static float lower_median_mag(const float *v, uint64_t n, float *scratch, uint32_t *idx) {
    for (uint64_t i = 0; i < n; i++) {
        scratch[i] = fabsf(v[i]);
        idx[i] = (uint32_t)i;
    }
    /* the element of rank floor((n-1)/2) ascending is rank n-1-that descending */
    uint32_t rank_desc = (uint32_t)(n - 1 - (n - 1) / 2);
    select_first_k(scratch, idx, (uint32_t)n, rank_desc + 1);
    float m = scratch[idx[0]];
    for (uint32_t i = 1; i <= rank_desc; i++)
        if (scratch[idx[i]] < m) m = scratch[idx[i]];
    return m;
}

static void quantize_values(const CodecParams *p, const float *v, uint64_t n, uint8_t *table,
                            uint8_t *codes, float *scratch, uint32_t *idx) {
    float amax = 0;
    for (uint64_t i = 0; i < n; i++)
        if (fabsf(v[i]) > amax) amax = fabsf(v[i]);
    if (!(amax > 0)) amax = 1.0f;
    if (p->value_bits == 8) {
        float inv = 127.0f / amax;
        int64_t sum[256] = {0};
        uint32_t cnt[256] = {0};
        for (uint64_t i = 0; i < n; i++) {
            float f = v[i] * inv, r = rintf(f);
            if (r > 127.0f) r = 127.0f;
            if (r < -127.0f) r = -127.0f;
            int q = (int)r + 128;
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
    float m = n ? lower_median_mag(v, n, scratch, idx) : 0.0f;
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
    uint32_t *idx = malloc(sizeof(uint32_t) * (K ? K : 1));
    if (scratch == NULL || idx == NULL) {
        free(scratch), free(idx);
        return err_set(err, "out of memory quantizing top-k values");
    }
    size_t table_len = 4 * ((size_t)1 << p->value_bits);
    st32(out, (uint32_t)K);
    uint8_t *table = out + 4, *w = table + table_len;
    uint64_t kv = 0;
    for (uint32_t c0 = 0; c0 < count; c0 += p->chunk) {
        uint32_t len = count - c0 < p->chunk ? count - c0 : p->chunk, k = topk_k(ppm, len);
        st16(w, (uint16_t)k);
        memcpy(w + 2, sel + kv, 2 * (size_t)k);
        w += 2 + 2 * (size_t)k;
        kv += k;
    }
    quantize_values(p, vals, K, table, w, scratch, idx);
    free(scratch), free(idx);
    return 0;
}

static int topk_encode(const CodecParams *p, const float *x, uint32_t count, uint8_t *out,
                       char *err) {
    uint32_t bad = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    if (bad) return err_set(err, "update holds a value that is not finite");
    uint64_t K = total_k(p, count);
    uint32_t ppm = codec_density_ppm(p), span = count < p->chunk ? count : p->chunk;
    float *cmag = malloc(sizeof(float) * span), *vals = malloc(sizeof(float) * (K ? K : 1));
    uint32_t *cand = malloc(sizeof(uint32_t) * span), *jbuf = malloc(sizeof(uint32_t) * span);
    uint16_t *sel = malloc(sizeof(uint16_t) * (K ? K : 1));
    int rc = -1;
    if (cmag == NULL || cand == NULL || jbuf == NULL || vals == NULL || sel == NULL) {
        err_set(err, "out of memory selecting top-k");
        goto out;
    }
    uint64_t kv = 0;
    for (uint32_t c0 = 0; c0 < count; c0 += p->chunk) {
        uint32_t len = count - c0 < p->chunk ? count - c0 : p->chunk, k = topk_k(ppm, len);
        topk_select(x + c0, len, k, cmag, cand, jbuf, sel + kv);
        for (uint32_t i = 0; i < k; i++) vals[kv + i] = x[c0 + sel[kv + i]];
        kv += k;
    }
    rc = topk_encode_selected(p, count, sel, vals, out, err);
out:
    free(cmag), free(cand), free(jbuf), free(vals), free(sel);
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

static void topk_apply(const CodecParams *p, const uint8_t *raw, uint32_t count, float w,
                       float *dst, int accumulate) {
    uint64_t K = ld32(raw);
    size_t n_table = (size_t)1 << p->value_bits;
    float table[256];
    memcpy(table, raw + 4, 4 * n_table);
    const uint8_t *r = raw + 4 + 4 * n_table;
    const uint8_t *codes = r + 2 * (size_t)n_chunks(p, count) + 2 * K;
    if (!accumulate) memset(dst, 0, sizeof(float) * count);
    uint64_t kv = 0;
    for (uint32_t c0 = 0; c0 < count; c0 += p->chunk) {
        uint32_t k = ld16(r);
        r += 2;
        float *d = dst + c0;
        for (uint32_t i = 0; i < k; i++) {
            float v = table[code_at(p, codes, kv++)];
            uint32_t idx = ld16(r + 2 * (size_t)i);
            d[idx] = accumulate ? d[idx] + w * v : v;
        }
        r += 2 * (size_t)k;
    }
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
