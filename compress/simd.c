/*
 * simd.c — the inner loops of the int8 and top-k codecs, one table of
 * kernels per instruction set, chosen once at run time: AVX-512 or AVX2
 * where the CPU has them (simd_x86.c), else the scalar code here, which is
 * the reference every other table must equal byte for byte (test_compress
 * runs each table this CPU has against it, on random and edge inputs).
 * STRAIT_CODEC_ISA=scalar|avx2|avx512 forces one (refused, with a warning,
 * where the CPU lacks it).
 *
 * Why it is exact: every kernel does the same IEEE operations per value in
 * the same order (no fused multiply-add where the reference has a multiply
 * and an add, rounding to nearest even), and the only reductions are the
 * int8 sum of squares, which keeps the reference's 256 lanes and their tree,
 * and integer sums, whose order does not matter.
 */
#include <math.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "compress_internal.h"
#include "util/util.h"

/* ---- one value's casts (the scalar kernels' and codec_cast.c's) --------- */

uint16_t codec_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float codec_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t codec_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu); /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: infinity */
    if (a < 0x38800000u) {                       /* below 2^-14: subnormal or zero */
        if (a < 0x33000000u) return sign;        /* below 2^-25: rounds to zero */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = ((a - 0x38000000u) >> 13); /* rebias exponent 127 → 15 */
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return sign | (uint16_t)r;
}

float codec_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        if (m == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            e = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            u = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- the scalar reference ------------------------------------------------ */

static inline double sq_at(const void *x, uint32_t i) {
    float v;
    memcpy(&v, (const uint8_t *)x + 4 * (size_t)i, 4);
    return (double)v * (double)v;
}

static double scalar_sumsq(const void *x, uint32_t n) {
    double lane[SIMD_LANES] = {0};
    uint32_t full = n - n % SIMD_LANES;
    for (uint32_t i0 = 0; i0 < full; i0 += SIMD_LANES)
        for (uint32_t j = 0; j < SIMD_LANES; j++) lane[j] += sq_at(x, i0 + j);
    for (uint32_t j = 0; full + j < n; j++) lane[j] += sq_at(x, full + j);
    return simd_lanes_reduce(lane);
}

static void scalar_axpy(const void *restrict x, uint32_t n, float w, float *restrict d) {
    for (uint32_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, (const uint8_t *)x + 4 * (size_t)i, 4);
        d[i] = d[i] + w * v;
    }
}

static void scalar_axpy_to(const void *restrict x, uint32_t n, float w, const float *restrict src,
                           float *restrict d) {
    for (uint32_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, (const uint8_t *)x + 4 * (size_t)i, 4);
        d[i] = (src ? src[i] : 0.0f) + w * v;
    }
}

static void scalar_lookup_to(const float *restrict wt, const uint8_t *restrict codes, uint32_t n,
                             const float *restrict src, float *restrict d) {
    if (src)
        for (uint32_t i = 0; i < n; i++) d[i] = src[i] + wt[codes[i]];
    else
        for (uint32_t i = 0; i < n; i++) d[i] = 0.0f + wt[codes[i]];
}

static void scalar_scale_to(const float *restrict x, uint32_t n, float s, float *restrict d) {
    for (uint32_t i = 0; i < n; i++) d[i] = s * x[i];
}

/* rint for |f| <= 2^22 under round-to-nearest-even, without SSE4.1 */
static inline float rint_small(float f) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    return (f + magic) - magic;
}

static uint32_t scalar_int8_codes(const float *restrict x, uint32_t n, float inv,
                                  uint8_t *restrict codes, int32_t *restrict off,
                                  uint32_t *restrict clamped) {
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i++) {
        float f = x[i] * inv;
        float fc = f < -129.0f ? -129.0f : f; /* one clamp per line: no branches */
        fc = fc > 129.0f ? 129.0f : fc;
        float r = rint_small(fc);
        float rq = r < -128.0f ? -128.0f : r;
        rq = rq > 127.0f ? 127.0f : rq;
        codes[i] = (uint8_t)(int32_t)(rq + 128.0f);
        int keep = r == rq;
        /* f - rq is exact and at most 1/2 when kept; a clamped value's
         * offset is 0, never converted (it could overflow) */
        float d = keep ? f - rq : 0.0f;
        off[i] = (int32_t)lrintf(d * SIMD_FIX_MID);
        clamped[c] = i;
        c += !keep;
    }
    return c;
}

/* w·table[q] is the same float whether it is computed per value or once per
 * bin, so the bins are weighted first: a load and an add per value. */
static void scalar_lookup_acc(const float *restrict table, const uint8_t *restrict codes,
                              uint32_t n, float w, float *restrict d) {
    float wt[256];
    for (int q = 0; q < 256; q++) wt[q] = w * table[q];
    for (uint32_t i = 0; i < n; i++) d[i] = d[i] + wt[codes[i]];
}

static void scalar_lookup(const float *restrict table, const uint8_t *restrict codes, uint32_t n,
                          float *restrict d) {
    for (uint32_t i = 0; i < n; i++) d[i] = table[codes[i]];
}

static uint32_t scalar_collect(const float *restrict x, uint32_t len, float t,
                               uint32_t *restrict cand, int *bad) {
    uint32_t n = 0, nonfinite = 0;
    for (uint32_t i = 0; i < len; i++) { /* branch-free collection */
        uint32_t u;
        memcpy(&u, &x[i], 4);
        nonfinite |= (u & 0x7f800000u) == 0x7f800000u;
        cand[n] = i;
        n += fabsf(x[i]) >= t;
    }
    *bad = nonfinite != 0;
    return n;
}

static int scalar_finite(const float *x, uint32_t n, void *copy) {
    uint32_t bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    if (copy) memcpy(copy, x, 4 * (size_t)n);
    return !bad;
}

static int scalar_to_half(const float *x, uint32_t n, int bf, void *h) {
    uint8_t *o = h;
    uint16_t inf = bf ? 0x7f80u : 0x7c00u;
    int ok = 1;
    for (uint32_t i = 0; i < n; i++) {
        uint16_t v = bf ? codec_f32_to_bf16(x[i]) : codec_f32_to_f16(x[i]);
        ok &= isfinite(x[i]) && (v & 0x7fffu) < inf;
        st16(o + 2 * (size_t)i, v);
    }
    return ok;
}

static void scalar_from_half(const void *h, uint32_t n, int bf, float *x) {
    const uint8_t *b = h;
    for (uint32_t i = 0; i < n; i++) {
        uint16_t v = ld16(b + 2 * (size_t)i);
        x[i] = bf ? codec_bf16_to_f32(v) : codec_f16_to_f32(v);
    }
}

const CodecSimd codec_simd_scalar = {.name = "scalar",
                                     .sumsq = scalar_sumsq,
                                     .int8_codes = scalar_int8_codes,
                                     .lookup_acc = scalar_lookup_acc,
                                     .axpy = scalar_axpy,
                                     .lookup = scalar_lookup,
                                     .axpy_to = scalar_axpy_to,
                                     .lookup_to = scalar_lookup_to,
                                     .scale_to = scalar_scale_to,
                                     .collect = scalar_collect,
                                     .finite = scalar_finite,
                                     .to_half = scalar_to_half,
                                     .from_half = scalar_from_half};

/* ---- dispatch ------------------------------------------------------------ */

double simd_lanes_reduce(double *lane) {
    for (int s = SIMD_LANES / 2; s > 0; s >>= 1)
        for (int j = 0; j < s; j++) lane[j] += lane[j + s];
    return lane[0];
}

const CodecSimd *codec_simd_named(const char *name) {
    if (strcmp(name, "scalar") == 0) return &codec_simd_scalar;
#if defined(__x86_64__)
    __builtin_cpu_init();
    unsigned a, b, c, d; /* F16C, for the half casts of both tables (CPUID 1, ECX bit 29;
                            clang's __builtin_cpu_supports does not know it) */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 29))) return NULL;
    if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2")) return &codec_simd_avx2;
    if (strcmp(name, "avx512") == 0 && __builtin_cpu_supports("avx512f")) return &codec_simd_avx512;
#endif
    return NULL;
}

static const CodecSimd *chosen;
static void choose(void) {
    const char *want = getenv("STRAIT_CODEC_ISA");
    if (want != NULL && *want != '\0') {
        chosen = codec_simd_named(want);
        if (chosen != NULL) return;
        log_warn("compress",
                 "STRAIT_CODEC_ISA=%s: this CPU or build lacks it (use scalar, avx2 or avx512); "
                 "choosing for this CPU",
                 want);
    }
    const char *order[] = {"avx512", "avx2", "scalar"};
    for (size_t i = 0; chosen == NULL; i++) chosen = codec_simd_named(order[i]);
}

const CodecSimd *codec_simd(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, choose);
    return chosen;
}

void codec_simd_use(const CodecSimd *k) {
    (void)codec_simd(); /* past the one-time choice, so it cannot override k */
    chosen = k;
}

const char *codec_isa(void) {
    return codec_simd()->name;
}

void codec_scale(const float *x, uint64_t n, float s, float *out) {
    const CodecSimd *k = codec_simd();
    const uint64_t piece = 1u << 20; /* values a call: a whole number of vectors */
    int64_t pieces = (int64_t)((n + piece - 1) / piece);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < pieces; i++) {
        uint64_t at = (uint64_t)i * piece, m = n - at < piece ? n - at : piece;
        k->scale_to(x + at, (uint32_t)m, s, out + at);
    }
}
