/*
 * planes.c — byte planes: an array of w-byte words regrouped so that plane j
 * holds byte j of every word. Floats keep their sign and exponent in the top
 * byte, which zstd shrinks to a third, and their low mantissa bytes, which
 * it cannot shrink at all: compressed plane by plane, an fp32 update is
 * smaller than compressed whole, and decodes several times faster (zstd
 * runs on one plane of four; the others are copied). FORMATS.md, "Sections".
 */
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "compress_internal.h"

#if defined(__SSE2__)
/* The even bytes, then the odd bytes, of 32 bytes in two registers: the
 * low and high byte of each 16-bit lane, packed */
static inline __m128i even_bytes(__m128i a, __m128i b) {
    const __m128i lo8 = _mm_set1_epi16(0x00ff);
    return _mm_packus_epi16(_mm_and_si128(a, lo8), _mm_and_si128(b, lo8));
}
static inline __m128i odd_bytes(__m128i a, __m128i b) {
    return _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8));
}
#endif

/* Split with SSE2 (the x86-64 baseline): a word's even and odd bytes,
 * once for 16-bit words, twice for 32-bit ones. */
void planes_split(const uint8_t *words, size_t n, int w, uint8_t *planes) {
    assert(w == 2 || w == 4);
    size_t i = 0;
    if (w == 4) {
        uint8_t *p0 = planes, *p1 = planes + n, *p2 = planes + 2 * n, *p3 = planes + 3 * n;
#if defined(__SSE2__)
        for (; i + 16 <= n; i += 16) {
            const __m128i *in = (const __m128i *)(const void *)(words + 4 * i);
            __m128i a = _mm_loadu_si128(in), b = _mm_loadu_si128(in + 1),
                    c = _mm_loadu_si128(in + 2), d = _mm_loadu_si128(in + 3);
            /* bytes 0 and 2 of 16 words, then bytes 1 and 3 */
            __m128i e0 = even_bytes(a, b), e1 = even_bytes(c, d);
            __m128i o0 = odd_bytes(a, b), o1 = odd_bytes(c, d);
            _mm_storeu_si128((__m128i *)(void *)(p0 + i), even_bytes(e0, e1));
            _mm_storeu_si128((__m128i *)(void *)(p2 + i), odd_bytes(e0, e1));
            _mm_storeu_si128((__m128i *)(void *)(p1 + i), even_bytes(o0, o1));
            _mm_storeu_si128((__m128i *)(void *)(p3 + i), odd_bytes(o0, o1));
        }
#endif
        for (; i < n; i++) {
            uint32_t v = ld32(words + 4 * i);
            p0[i] = (uint8_t)v, p1[i] = (uint8_t)(v >> 8), p2[i] = (uint8_t)(v >> 16),
            p3[i] = (uint8_t)(v >> 24);
        }
        return;
    }
    uint8_t *p0 = planes, *p1 = planes + n;
#if defined(__SSE2__)
    for (; i + 16 <= n; i += 16) {
        const __m128i *in = (const __m128i *)(const void *)(words + 2 * i);
        __m128i a = _mm_loadu_si128(in), b = _mm_loadu_si128(in + 1);
        _mm_storeu_si128((__m128i *)(void *)(p0 + i), even_bytes(a, b));
        _mm_storeu_si128((__m128i *)(void *)(p1 + i), odd_bytes(a, b));
    }
#endif
    for (; i < n; i++) {
        uint16_t v = ld16(words + 2 * i);
        p0[i] = (uint8_t)v, p1[i] = (uint8_t)(v >> 8);
    }
}

void planes_join(const uint8_t *const *plane, size_t n, int w, uint8_t *words) {
    assert(w == 2 || w == 4);
    size_t i = 0;
    if (w == 4) {
        const uint8_t *a = plane[0], *b = plane[1], *c = plane[2], *d = plane[3];
#if defined(__SSE2__)
        for (; i + 16 <= n; i += 16) {
            __m128i A = _mm_loadu_si128((const __m128i *)(a + i));
            __m128i B = _mm_loadu_si128((const __m128i *)(b + i));
            __m128i C = _mm_loadu_si128((const __m128i *)(c + i));
            __m128i D = _mm_loadu_si128((const __m128i *)(d + i));
            __m128i ab0 = _mm_unpacklo_epi8(A, B), ab1 = _mm_unpackhi_epi8(A, B);
            __m128i cd0 = _mm_unpacklo_epi8(C, D), cd1 = _mm_unpackhi_epi8(C, D);
            __m128i *o = (__m128i *)(words + 4 * i);
            _mm_storeu_si128(o, _mm_unpacklo_epi16(ab0, cd0));
            _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(ab0, cd0));
            _mm_storeu_si128(o + 2, _mm_unpacklo_epi16(ab1, cd1));
            _mm_storeu_si128(o + 3, _mm_unpackhi_epi16(ab1, cd1));
        }
#endif
        for (; i < n; i++)
            st32(words + 4 * i, (uint32_t)a[i] | (uint32_t)b[i] << 8 | (uint32_t)c[i] << 16 |
                                    (uint32_t)d[i] << 24);
        return;
    }
    const uint8_t *a = plane[0], *b = plane[1];
#if defined(__SSE2__)
    for (; i + 16 <= n; i += 16) {
        __m128i A = _mm_loadu_si128((const __m128i *)(a + i));
        __m128i B = _mm_loadu_si128((const __m128i *)(b + i));
        __m128i *o = (__m128i *)(words + 2 * i);
        _mm_storeu_si128(o, _mm_unpacklo_epi8(A, B));
        _mm_storeu_si128(o + 1, _mm_unpackhi_epi8(A, B));
    }
#endif
    for (; i < n; i++) st16(words + 2 * i, (uint16_t)(a[i] | (uint32_t)b[i] << 8));
}
