/*
 * half.h — 16-bit floats for kernels/ alone: bf16 and fp16 widened to fp32
 * exactly, fp32 rounded to bf16 or fp16 (to nearest, ties to even). The moments a
 * site keeps in bf16 (train.c), their files (safetensors.c) and Hugging
 * Face's F16 and BF16 tensors (hf.c) all convert here.
 */
#ifndef STRAIT_KERNELS_HALF_H
#define STRAIT_KERNELS_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t float_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, bits;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    bits = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* fp32 to IEEE half, to nearest with ties to even: past 65504 is inf, below
 * 2^-14 a subnormal, NaN stays NaN */
static inline uint16_t float_to_half(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
    if (a < 0x38800000u) { /* below 2^-14: a multiple of 2^-24, rounded half to even */
        float f;
        memcpy(&f, &a, 4);
        return (uint16_t)(sign | (uint32_t)nearbyintf(f * 16777216.0f));
    }
    uint32_t h = ((a >> 13) - (112u << 10)), rest = a & 0x1fffu;
    h += rest > 0x1000u || (rest == 0x1000u && (h & 1u)); /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

#endif /* STRAIT_KERNELS_HALF_H */
