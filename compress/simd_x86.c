/*
 * simd_x86.c — the codecs' inner loops for AVX2 and AVX-512 (the table of
 * simd.c), compiled with per-function target attributes so the rest of the
 * build stays baseline x86-64 and codec_simd() picks them at run time.
 *
 * Each kernel repeats the scalar reference's operations per value: the same
 * multiply, clamps and round-to-nearest-even (the same 1.5·2^23 trick), the
 * same conversions (truncation for codes, the current rounding mode for
 * offsets, as lrintf). The sum of squares keeps the reference's 256 lanes;
 * a fused multiply-add of x·x is the reference's multiply then add, since
 * the square of a float is exact in double. Tails go to the scalar table.
 */
#include "compress_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define T2   __attribute__((target("avx2")))
#define T512 __attribute__((target("avx512f")))

static const float MAGIC = 12582912.0f; /* 1.5 * 2^23: rint for |f| <= 2^22 */

/* The values past the last whole row go to lanes 0, 1, … (the reference's order). */
static void tail_sumsq(const float *x, uint32_t full, uint32_t n, double *lane) {
    for (uint32_t j = 0; full + j < n; j++) {
        float v;
        memcpy(&v, x + full + j, 4);
        lane[j] += (double)v * (double)v;
    }
}

/* ---- AVX2 ------------------------------------------------------------------ */

T2 static double avx2_sumsq(const void *xv, uint32_t n) {
    const float *x = xv; /* read only through unaligned loads */
    double lane[SIMD_LANES] __attribute__((aligned(32))) = {0};
    uint32_t full = n - n % SIMD_LANES;
    for (uint32_t i0 = 0; i0 < full; i0 += SIMD_LANES)
        for (int j = 0; j < SIMD_LANES; j += 4) {
            __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i0 + j));
            _mm256_store_pd(lane + j, _mm256_add_pd(_mm256_load_pd(lane + j), _mm256_mul_pd(v, v)));
        }
    tail_sumsq(x, full, n, lane);
    return simd_lanes_reduce(lane);
}

T2 static void avx2_axpy(const void *xv, uint32_t n, float w, float *restrict d) {
    const float *x = xv;
    const __m256 vw = _mm256_set1_ps(w);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(d + i),
                                              _mm256_mul_ps(vw, _mm256_loadu_ps(x + i))));
    if (i < n) codec_simd_scalar.axpy(x + i, n - i, w, d + i);
}

/* The values before d is aligned to `align` bytes (at most n). */
static uint32_t head_to(const float *d, uint32_t n, uintptr_t align) {
    uint32_t h = (uint32_t)(((align - ((uintptr_t)d & (align - 1))) & (align - 1)) / 4);
    return h < n ? h : n;
}

T2 static void avx2_axpy_to(const void *xv, uint32_t n, float w, const float *src, float *d) {
    const float *x = xv;
    uint32_t i = head_to(d, n, 32);
    codec_simd_scalar.axpy_to(x, i, w, src, d);
    const __m256 vw = _mm256_set1_ps(w), zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8)
        _mm256_stream_ps(d + i, _mm256_add_ps(src ? _mm256_loadu_ps(src + i) : zero,
                                              _mm256_mul_ps(vw, _mm256_loadu_ps(x + i))));
    codec_simd_scalar.axpy_to(x + i, n - i, w, src ? src + i : NULL, d + i);
    _mm_sfence();
}

T2 static void avx2_scale_to(const float *x, uint32_t n, float s, float *d) {
    uint32_t i = head_to(d, n, 32);
    codec_simd_scalar.scale_to(x, i, s, d);
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8) _mm256_stream_ps(d + i, _mm256_mul_ps(vs, _mm256_loadu_ps(x + i)));
    codec_simd_scalar.scale_to(x + i, n - i, s, d + i);
    _mm_sfence();
}

/* The lookups a tile at a time into L1 by scalar loads (faster than a
 * gather, below), then added and streamed out whole vectors at a time. */
#define LOOKUP_TILE 256
T2 static void avx2_lookup_to(const float *restrict wt, const uint8_t *restrict codes, uint32_t n,
                              const float *restrict src, float *restrict d) {
    float t[LOOKUP_TILE] __attribute__((aligned(32)));
    uint32_t i = head_to(d, n, 32);
    codec_simd_scalar.lookup_to(wt, codes, i, src, d);
    const __m256 zero = _mm256_setzero_ps();
    for (; i + LOOKUP_TILE <= n; i += LOOKUP_TILE) {
        for (int j = 0; j < LOOKUP_TILE; j++) t[j] = wt[codes[i + j]];
        for (int j = 0; j < LOOKUP_TILE; j += 8)
            _mm256_stream_ps(d + i + j, _mm256_add_ps(src ? _mm256_loadu_ps(src + i + j) : zero,
                                                      _mm256_load_ps(t + j)));
    }
    codec_simd_scalar.lookup_to(wt, codes + i, n - i, src ? src + i : NULL, d + i);
    _mm_sfence();
}

T2 static uint32_t avx2_int8_codes(const float *restrict x, uint32_t n, float inv,
                                   uint8_t *restrict codes, int32_t *restrict off,
                                   uint32_t *restrict clamped) {
    const __m256 vinv = _mm256_set1_ps(inv), m129 = _mm256_set1_ps(-129.0f),
                 p129 = _mm256_set1_ps(129.0f), m128 = _mm256_set1_ps(-128.0f),
                 p127 = _mm256_set1_ps(127.0f), c128 = _mm256_set1_ps(128.0f),
                 magic = _mm256_set1_ps(MAGIC), fix = _mm256_set1_ps(SIMD_FIX_MID);
    /* byte 0 of each dword, per 128-bit half */
    const __m256i pick =
        _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                         -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    uint32_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 f = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
        __m256 fc = _mm256_min_ps(_mm256_max_ps(f, m129), p129);
        __m256 r = _mm256_sub_ps(_mm256_add_ps(fc, magic), magic);
        __m256 rq = _mm256_min_ps(_mm256_max_ps(r, m128), p127);
        __m256 keep = _mm256_cmp_ps(r, rq, _CMP_EQ_OQ);
        __m256i code = _mm256_shuffle_epi8(_mm256_cvttps_epi32(_mm256_add_ps(rq, c128)), pick);
        uint64_t bytes = (uint32_t)_mm256_extract_epi32(code, 0) |
                         (uint64_t)(uint32_t)_mm256_extract_epi32(code, 4) << 32;
        memcpy(codes + i, &bytes, 8);
        __m256 d = _mm256_and_ps(_mm256_sub_ps(f, rq), keep);
        _mm256_storeu_si256((__m256i *)(void *)(off + i),
                            _mm256_cvtps_epi32(_mm256_mul_ps(d, fix)));
        for (unsigned m = ~(unsigned)_mm256_movemask_ps(keep) & 0xffu; m; m &= m - 1)
            clamped[c++] = i + (uint32_t)__builtin_ctz(m);
    }
    if (i < n) {
        uint32_t got =
            codec_simd_scalar.int8_codes(x + i, n - i, inv, codes + i, off + i, clamped + c);
        for (uint32_t j = 0; j < got; j++) clamped[c + j] += i;
        c += got;
    }
    return c;
}

T2 static uint32_t avx2_collect(const float *restrict x, uint32_t len, float t,
                                uint32_t *restrict cand, int *bad) {
    const __m256 vt = _mm256_set1_ps(t), inf = _mm256_set1_ps(__builtin_inff());
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    uint32_t n = 0, i = 0;
    int nonfinite = 0;
    for (; i + 8 <= len; i += 8) {
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), absmask);
        nonfinite |= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, vt, _CMP_GE_OQ));
        for (; m; m &= m - 1) cand[n++] = i + (uint32_t)__builtin_ctz(m);
    }
    if (i < len) {
        int tail_bad;
        uint32_t got = codec_simd_scalar.collect(x + i, len - i, t, cand + n, &tail_bad);
        for (uint32_t j = 0; j < got; j++) cand[n + j] += i;
        n += got;
        nonfinite |= tail_bad;
    }
    *bad = nonfinite != 0;
    return n;
}

T2 static int avx2_finite(const float *x, uint32_t n, void *copy) {
    const __m256 inf = _mm256_set1_ps(__builtin_inff());
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 bad = _mm256_setzero_ps();
    float *c = copy;
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (c) _mm256_storeu_ps(c + i, v);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(v, absmask), inf, _CMP_NLT_UQ));
    }
    return codec_simd_scalar.finite(x + i, n - i, c ? c + i : NULL) && _mm256_movemask_ps(bad) == 0;
}

/* The lookups stay the reference's in both tables: measured on Zen 5, an
 * 8-wide gather lost to scalar loads (0.50 against 0.29 ns a value from L1),
 * and from memory a 16-wide lookup by permutes and blends (5.4 against 7.5
 * GB/s) and a 64-wide one by VBMI byte planes (10.7 against 11.8 GB/s) did
 * not beat them once the bins are weighted before the loop: decode-
 * accumulate is bound by one core's memory traffic, not by its lookups. */
static void ref_lookup_acc(const float *table, const uint8_t *codes, uint32_t n, float w,
                           float *d) {
    codec_simd_scalar.lookup_acc(table, codes, n, w, d);
}
static void ref_lookup(const float *table, const uint8_t *codes, uint32_t n, float *d) {
    codec_simd_scalar.lookup(table, codes, n, d);
}

/* Half casts, in both tables: F16C's conversions round to nearest even
 * as the reference does (with the rounding in the instruction, not
 * MXCSR's), and bf16's is the reference's integer rounding, eight at a
 * time. A bad value anywhere is found by the flags; the caller names it. */
#define TH __attribute__((target("avx2,f16c")))

TH static int x86_to_half(const float *x, uint32_t n, int bf, void *h) {
    uint8_t *o = h;
    const __m256i expo = _mm256_set1_epi32(0x7f800000), one = _mm256_set1_epi32(1),
                  round = _mm256_set1_epi32(0x7fff);
    const __m128i mag = _mm_set1_epi16(0x7fff), inf1 = _mm_set1_epi16(bf ? 0x7f7f : 0x7bff);
    __m256i bad_in = _mm256_setzero_si256();
    __m128i bad_out = _mm_setzero_si128();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(x + i));
        bad_in = _mm256_or_si256(bad_in, _mm256_cmpeq_epi32(_mm256_and_si256(u, expo), expo));
        __m128i v;
        if (bf) {
            __m256i r = _mm256_add_epi32(
                u, _mm256_add_epi32(round, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
            r = _mm256_srli_epi32(r, 16);
            v = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        } else {
            v = _mm256_cvtps_ph(_mm256_castsi256_ps(u),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        }
        bad_out = _mm_or_si128(bad_out, _mm_cmpgt_epi16(_mm_and_si128(v, mag), inf1));
        _mm_storeu_si128((__m128i *)(void *)(o + 2 * (size_t)i), v);
    }
    int ok = _mm256_testz_si256(bad_in, bad_in) && _mm_testz_si128(bad_out, bad_out);
    if (i < n) ok &= codec_simd_scalar.to_half(x + i, n - i, bf, o + 2 * (size_t)i);
    return ok;
}

TH static void x86_from_half(const void *h, uint32_t n, int bf, float *x) {
    const uint8_t *b = h;
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + 2 * (size_t)i));
        __m256 f = bf ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
                      : _mm256_cvtph_ps(v);
        _mm256_storeu_ps(x + i, f);
    }
    if (i < n) codec_simd_scalar.from_half(b + 2 * (size_t)i, n - i, bf, x + i);
}

const CodecSimd codec_simd_avx2 = {.name = "avx2",
                                   .sumsq = avx2_sumsq,
                                   .int8_codes = avx2_int8_codes,
                                   .lookup_acc = ref_lookup_acc,
                                   .axpy = avx2_axpy,
                                   .lookup = ref_lookup,
                                   .axpy_to = avx2_axpy_to,
                                   .lookup_to = avx2_lookup_to,
                                   .scale_to = avx2_scale_to,
                                   .collect = avx2_collect,
                                   .finite = avx2_finite,
                                   .to_half = x86_to_half,
                                   .from_half = x86_from_half};

/* ---- AVX-512 ------------------------------------------------------------------ */

T512 static double avx512_sumsq(const void *xv, uint32_t n) {
    const float *x = xv; /* read only through unaligned loads */
    double lane[SIMD_LANES] __attribute__((aligned(64))) = {0};
    uint32_t full = n - n % SIMD_LANES, i0 = 0;
    /* four rows at a time: lane j still adds its values in row order */
    for (; i0 + 4 * SIMD_LANES <= full; i0 += 4 * SIMD_LANES)
        for (int j = 0; j < SIMD_LANES; j += 8) {
            if (j % 16 == 0) /* the first pass over a block is the one from memory */
                for (int r = 0; r < 4; r++)
                    _mm_prefetch((const char *)(x + i0 + 8 * SIMD_LANES + r * SIMD_LANES + j),
                                 _MM_HINT_T0);
            __m512d l = _mm512_load_pd(lane + j);
            for (int r = 0; r < 4; r++) {
                __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i0 + r * SIMD_LANES + j));
                l = _mm512_fmadd_pd(v, v, l);
            }
            _mm512_store_pd(lane + j, l);
        }
    for (; i0 < full; i0 += SIMD_LANES)
        for (int j = 0; j < SIMD_LANES; j += 8) {
            __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i0 + j));
            _mm512_store_pd(lane + j, _mm512_fmadd_pd(v, v, _mm512_load_pd(lane + j)));
        }
    tail_sumsq(x, full, n, lane);
    return simd_lanes_reduce(lane);
}

T512 static void avx512_axpy(const void *xv, uint32_t n, float w, float *restrict d) {
    const float *x = xv;
    const __m512 vw = _mm512_set1_ps(w);
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_add_ps(_mm512_loadu_ps(d + i),
                                              _mm512_mul_ps(vw, _mm512_loadu_ps(x + i))));
    if (i < n) codec_simd_scalar.axpy(x + i, n - i, w, d + i);
}

T512 static void avx512_axpy_to(const void *xv, uint32_t n, float w, const float *src, float *d) {
    const float *x = xv;
    uint32_t i = head_to(d, n, 64);
    codec_simd_scalar.axpy_to(x, i, w, src, d);
    const __m512 vw = _mm512_set1_ps(w), zero = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16)
        _mm512_stream_ps(d + i, _mm512_add_ps(src ? _mm512_loadu_ps(src + i) : zero,
                                              _mm512_mul_ps(vw, _mm512_loadu_ps(x + i))));
    codec_simd_scalar.axpy_to(x + i, n - i, w, src ? src + i : NULL, d + i);
    _mm_sfence();
}

T512 static void avx512_scale_to(const float *x, uint32_t n, float s, float *d) {
    uint32_t i = head_to(d, n, 64);
    codec_simd_scalar.scale_to(x, i, s, d);
    const __m512 vs = _mm512_set1_ps(s);
    for (; i + 16 <= n; i += 16) _mm512_stream_ps(d + i, _mm512_mul_ps(vs, _mm512_loadu_ps(x + i)));
    codec_simd_scalar.scale_to(x + i, n - i, s, d + i);
    _mm_sfence();
}

T512 static void avx512_lookup_to(const float *restrict wt, const uint8_t *restrict codes,
                                  uint32_t n, const float *restrict src, float *restrict d) {
    float t[LOOKUP_TILE] __attribute__((aligned(64)));
    uint32_t i = head_to(d, n, 64);
    codec_simd_scalar.lookup_to(wt, codes, i, src, d);
    const __m512 zero = _mm512_setzero_ps();
    for (; i + LOOKUP_TILE <= n; i += LOOKUP_TILE) {
        for (int j = 0; j < LOOKUP_TILE; j++) t[j] = wt[codes[i + j]];
        for (int j = 0; j < LOOKUP_TILE; j += 16)
            _mm512_stream_ps(d + i + j, _mm512_add_ps(src ? _mm512_loadu_ps(src + i + j) : zero,
                                                      _mm512_load_ps(t + j)));
    }
    codec_simd_scalar.lookup_to(wt, codes + i, n - i, src ? src + i : NULL, d + i);
    _mm_sfence();
}

T512 static uint32_t avx512_int8_codes(const float *restrict x, uint32_t n, float inv,
                                       uint8_t *restrict codes, int32_t *restrict off,
                                       uint32_t *restrict clamped) {
    const __m512 vinv = _mm512_set1_ps(inv), m129 = _mm512_set1_ps(-129.0f),
                 p129 = _mm512_set1_ps(129.0f), m128 = _mm512_set1_ps(-128.0f),
                 p127 = _mm512_set1_ps(127.0f), c128 = _mm512_set1_ps(128.0f),
                 magic = _mm512_set1_ps(MAGIC), fix = _mm512_set1_ps(SIMD_FIX_MID);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i += 16, idx = _mm512_add_epi32(idx, step)) {
        __mmask16 live = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 f = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, x + i), vinv);
        __m512 fc = _mm512_min_ps(_mm512_max_ps(f, m129), p129);
        __m512 r = _mm512_sub_ps(_mm512_add_ps(fc, magic), magic);
        __m512 rq = _mm512_min_ps(_mm512_max_ps(r, m128), p127);
        __mmask16 keep = _mm512_cmp_ps_mask(r, rq, _CMP_EQ_OQ);
        __m512i code = _mm512_cvttps_epi32(_mm512_add_ps(rq, c128));
        _mm512_mask_cvtepi32_storeu_epi8(codes + i, live, code);
        _mm512_mask_storeu_epi32(
            off + i, live,
            _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_sub_ps(keep, f, rq), fix)));
        __mmask16 cm = live & (__mmask16)~keep;
        if (cm) { /* rare (a normal update clamps 0.3%): a branch that predicts */
            _mm512_storeu_si512(clamped + c, _mm512_maskz_compress_epi32(cm, idx));
            c += (uint32_t)__builtin_popcount((unsigned)cm);
        }
    }
    return c;
}

T512 static uint32_t avx512_collect(const float *restrict x, uint32_t len, float t,
                                    uint32_t *restrict cand, int *bad) {
    const __m512 vt = _mm512_set1_ps(t), inf = _mm512_set1_ps(__builtin_inff());
    const __m512i step = _mm512_set1_epi32(16);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __mmask16 nonfinite = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < len; i += 16, idx = _mm512_add_epi32(idx, step)) {
        __mmask16 live = len - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (len - i)) - 1);
        __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(live, x + i));
        nonfinite |= _mm512_mask_cmp_ps_mask(live, a, inf, _CMP_NLT_UQ);
        __mmask16 m = _mm512_mask_cmp_ps_mask(live, a, vt, _CMP_GE_OQ);
        /* no branch (whether a vector has a candidate is a coin toss): a
         * whole vector is stored every time, hence SIMD_COLLECT_SLACK */
        _mm512_storeu_si512(cand + n, _mm512_maskz_compress_epi32(m, idx));
        n += (uint32_t)__builtin_popcount(m);
    }
    *bad = nonfinite != 0;
    return n;
}

T512 static int avx512_finite(const float *x, uint32_t n, void *copy) {
    const __m512 inf = _mm512_set1_ps(__builtin_inff());
    __mmask16 bad = 0;
    float *c = copy;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        if (c) _mm512_storeu_ps(c + i, v);
        bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(v), inf, _CMP_NLT_UQ);
    }
    if (i < n) {
        __mmask16 live = (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(live, x + i);
        if (c) _mm512_mask_storeu_ps(c + i, live, v);
        bad |= _mm512_mask_cmp_ps_mask(live, _mm512_abs_ps(v), inf, _CMP_NLT_UQ);
    }
    return bad == 0;
}

const CodecSimd codec_simd_avx512 = {.name = "avx512",
                                     .sumsq = avx512_sumsq,
                                     .int8_codes = avx512_int8_codes,
                                     .lookup_acc = ref_lookup_acc,
                                     .axpy = avx512_axpy,
                                     .lookup = ref_lookup,
                                     .axpy_to = avx512_axpy_to,
                                     .lookup_to = avx512_lookup_to,
                                     .scale_to = avx512_scale_to,
                                     .collect = avx512_collect,
                                     .finite = avx512_finite,
                                     .to_half = x86_to_half,
                                     .from_half = x86_from_half};
#endif
