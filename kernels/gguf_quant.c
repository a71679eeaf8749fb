/*
 * gguf_quant.c — ggml's tensor types (API: gguf.h): every type's name and
 * block geometry (what a GGUF reader needs to check a tensor's size, even
 * one it cannot decode), and dequantization to fp32 of F32, F16, BF16,
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K. Blocks are decoded
 * with the arithmetic llama.cpp's and the PyPI gguf package's reference
 * decoders use, in the same order (scale times quant, then the minimum
 * added or subtracted; the K types' sub-block scale multiplied into d
 * first), so the values are the same bits. Quantization (the writer's
 * Q8_0) rounds as both do: to nearest, halves away from zero.
 */
#include <math.h>
#include <string.h>

#include "kernels/gguf.h"
#include "kernels/half.h"
#include "util/util.h"

#define QK_K 256

typedef void (*Dequant)(const uint8_t *block, float *out);

static float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return half_to_float(h);
}

static void dq_f32(const uint8_t *b, float *y) {
    memcpy(y, b, 4);
}
static void dq_f16(const uint8_t *b, float *y) {
    *y = f16_at(b);
}
static void dq_bf16(const uint8_t *b, float *y) {
    uint16_t h;
    memcpy(&h, b, 2);
    *y = bf16_to_float(h);
}

/* Q8_0: d (f16), 32 int8 */
static void dq_q8_0(const uint8_t *b, float *y) {
    float d = f16_at(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* Q4_0: d, 16 bytes of nibbles: low nibbles are elements 0-15, high 16-31 */
static void dq_q4_0(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 0xF) - 8);
        y[j + 16] = d * (float)((qs[j] >> 4) - 8);
    }
}

/* Q4_1: d, m, 16 bytes of nibbles; x = d q + m */
static void dq_q4_1(const uint8_t *b, float *y) {
    float d = f16_at(b), m = f16_at(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 0xF) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

/* Q5_0: d, 32 high bits (little-endian u32, bit j for element j), nibbles */
static void dq_q5_0(const uint8_t *b, float *y) {
    float d = f16_at(b);
    uint32_t qh =
        (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)(lo - 16);
        y[j + 16] = d * (float)(hi - 16);
    }
}

/* Q5_1: d, m, high bits, nibbles; x = d q + m */
static void dq_q5_1(const uint8_t *b, float *y) {
    float d = f16_at(b), m = f16_at(b + 2);
    uint32_t qh =
        (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24;
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)lo + m;
        y[j + 16] = d * (float)hi + m;
    }
}

/* The K types' eight 6-bit scales and minimums, packed in 12 bytes. */
static void k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K: d, dmin, scales[12], qs[128]: 8 sub-blocks of 32; 32 bytes hold
 * sub-blocks 2g (low nibbles) and 2g + 1 (high); x = (d sc) q - (dmin m) */
static void dq_q4_k(const uint8_t *b, float *y) {
    float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        k_scale_min(scales, s, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (s / 2);
        int shift = 4 * (s % 2);
        for (int i = 0; i < 32; i++) y[32 * s + i] = d1 * (float)((q[i] >> shift) & 0xF) - m1;
    }
}

/* Q5_K: d, dmin, scales[12], qh[32] (bit s of byte i: sub-block s's
 * element i), qs[128] as Q4_K */
static void dq_q5_k(const uint8_t *b, float *y) {
    float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        k_scale_min(scales, s, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (s / 2);
        int shift = 4 * (s % 2);
        for (int i = 0; i < 32; i++) {
            int v = ((q[i] >> shift) & 0xF) | ((qh[i] >> s) & 1) << 4;
            y[32 * s + i] = d1 * (float)v - m1;
        }
    }
}

/* Q6_K: ql[128], qh[64], scales[16] (int8, one per 16), d. Element e of
 * half h = e / 128 (r = e % 128): low 4 bits from ql[64h + r % 64] (high
 * nibble when r >= 64), top 2 from qh[32h + r % 32] at bit 2 (r / 32);
 * x = (d sc) (q - 32) */
static void dq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = f16_at(b + 208);
    for (int e = 0; e < QK_K; e++) {
        int h = e / 128, r = e % 128;
        int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
        int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        y[e] = d * (float)scales[e / 16] * (float)((lo | hi << 4) - 32);
    }
}

/* ggml's types by number: name, elements a block, bytes a block, decoder */
static const struct GgmlType {
    const char *name;
    uint32_t block, bytes;
    Dequant dequant;
} TYPES[] = {
    [GGML_F32] = {"F32", 1, 4, dq_f32},
    [GGML_F16] = {"F16", 1, 2, dq_f16},
    [GGML_Q4_0] = {"Q4_0", 32, 18, dq_q4_0},
    [GGML_Q4_1] = {"Q4_1", 32, 20, dq_q4_1},
    [GGML_Q5_0] = {"Q5_0", 32, 22, dq_q5_0},
    [GGML_Q5_1] = {"Q5_1", 32, 24, dq_q5_1},
    [GGML_Q8_0] = {"Q8_0", 32, 34, dq_q8_0},
    [9] = {"Q8_1", 32, 40, NULL},
    [10] = {"Q2_K", 256, 84, NULL},
    [11] = {"Q3_K", 256, 110, NULL},
    [GGML_Q4_K] = {"Q4_K", 256, 144, dq_q4_k},
    [GGML_Q5_K] = {"Q5_K", 256, 176, dq_q5_k},
    [GGML_Q6_K] = {"Q6_K", 256, 210, dq_q6_k},
    [15] = {"Q8_K", 256, 292, NULL},
    [16] = {"IQ2_XXS", 256, 66, NULL},
    [17] = {"IQ2_XS", 256, 74, NULL},
    [18] = {"IQ3_XXS", 256, 98, NULL},
    [19] = {"IQ1_S", 256, 50, NULL},
    [20] = {"IQ4_NL", 32, 18, NULL},
    [21] = {"IQ3_S", 256, 110, NULL},
    [22] = {"IQ2_S", 256, 82, NULL},
    [23] = {"IQ4_XS", 256, 136, NULL},
    [24] = {"I8", 1, 1, NULL},
    [25] = {"I16", 1, 2, NULL},
    [26] = {"I32", 1, 4, NULL},
    [27] = {"I64", 1, 8, NULL},
    [28] = {"F64", 1, 8, NULL},
    [29] = {"IQ1_M", 256, 56, NULL},
    [GGML_BF16] = {"BF16", 1, 2, dq_bf16},
    [34] = {"TQ1_0", 256, 54, NULL},
    [35] = {"TQ2_0", 256, 66, NULL},
    [39] = {"MXFP4", 32, 17, NULL},
    [40] = {"NVFP4", 64, 36, NULL},
    [41] = {"Q1_0", 128, 18, NULL},
};
#define N_TYPES (uint32_t)(sizeof TYPES / sizeof TYPES[0])

const char *gguf_type_name(uint32_t type) {
    return type < N_TYPES && TYPES[type].name ? TYPES[type].name : NULL;
}

int gguf_type_block(uint32_t type, uint32_t *block, uint32_t *bytes) {
    if (type >= N_TYPES || TYPES[type].name == NULL) return -1;
    *block = TYPES[type].block;
    *bytes = TYPES[type].bytes;
    return 0;
}

int gguf_type_decodes(uint32_t type) {
    return type < N_TYPES && TYPES[type].dequant != NULL;
}

int gguf_dequantize(uint32_t type, const void *src, size_t n, float *dst, char *err) {
    if (!gguf_type_decodes(type)) {
        const char *name = gguf_type_name(type);
        if (name) return err_set(err, "type %s, which Strait does not decode", name);
        return err_set(err, "type %u, which this Strait does not know (a newer ggml?)", type);
    }
    const struct GgmlType *t = &TYPES[type];
    if (n % t->block != 0)
        return err_set(err, "%zu values are not whole %s blocks of %u", n, t->name, t->block);
    const uint8_t *b = src;
    for (size_t i = 0; i < n / t->block; i++) t->dequant(b + i * t->bytes, dst + i * t->block);
    return 0;
}

/* round half away from zero, as ggml's and numpy's Q8_0 quantizers do */
static float round_away(float x) {
    float a = fabsf(x), f = floorf(a), r = f + floorf(2 * (a - f));
    return x < 0 ? -r : r;
}

void gguf_quantize_q8_0(const float *x, size_t n, uint8_t *out) {
    for (size_t i = 0; i < n / 32; i++) {
        const float *b = x + 32 * i;
        uint8_t *o = out + 34 * i;
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(b[j]));
        float d = amax / 127, id = d != 0 ? 1 / d : 0;
        uint16_t h = float_to_half(d);
        memcpy(o, &h, 2);
        /* 1/d overflows for amax below ~3e-37 (d then rounds to an f16 0): the
         * quantized values are clamped, NaN (0 times infinity) to 0 */
        for (int j = 0; j < 32; j++) {
            float v = b[j] * id;
            v = v != v ? 0 : fminf(127, fmaxf(-127, v));
            o[2 + j] = (uint8_t)(int8_t)round_away(v);
        }
    }
}
