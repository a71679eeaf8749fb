/*
 * compress_internal.h — what the files of compress/ share: the per-codec
 * section operations, the blob layout constants, and little-endian access.
 * Nothing outside compress/ includes this but compress's own tests.
 */
#ifndef STRAIT_COMPRESS_INTERNAL_H
#define STRAIT_COMPRESS_INTERNAL_H

#include <assert.h>
#include <string.h>

#include "compress.h"

#define BLOB_MAGIC          0x42525453u /* "STRB" */
#define CKPT_MAGIC          0x4b435453u /* "STCK" */
#define BLOB_VERSION        1
#define BLOB_HEADER_LEN     48
#define SECTION_HEADER_LEN  32
#define SECTION_FLAG_ZSTD   1u /* the payload is one zstd frame of the raw payload */
#define SECTION_FLAG_PLANES 2u /* the raw payload's words as byte planes, each maybe zstd */

/* The parameter fields a codec keeps in the blob header (FORMATS.md):
 * the byte at offset 7 and the words at 28 and 32; zero where unused. */
typedef struct CodecHeader {
    uint8_t bits;
    uint32_t a, b;
} CodecHeader;

/* A codec: its wire id and name, its parameters (defaults, ranges, header
 * fields) and its work on one section of `count` values. The raw payload
 * is what a section carries before the lossless stage (FORMATS.md). A new
 * codec is its own file defining one of these, plus one row of the
 * registry in blob.c. */
typedef struct CodecOps {
    CodecId id;
    const char *name;
    /* Bytes per value when the raw payload is a plain array of words, which
     * the lossless stage compresses as byte planes (fp32: 4; fp16, bf16: 2);
     * 0: a payload of codes and tables, compressed whole. */
    int word;
    /* Sets the codec's own fields of p to their defaults; NULL: none. */
    void (*defaults)(CodecParams *p);
    /* Checks the codec's own fields of p; NULL: it has none. */
    int (*check_params)(const CodecParams *p, char *err);
    /* The codec's fields into the header and back; get fills p and refuses
     * a field it does not use that is not zero. NULL: none (all zero). */
    CodecHeader (*header_put)(const CodecParams *p);
    int (*header_get)(CodecParams *p, CodecHeader h, char *err);
    /* The exact raw payload size for `count` values; the decoder requires
     * it, which bounds every allocation by the header. */
    size_t (*raw_len)(const CodecParams *p, uint32_t count);
    /* Appends the raw payload of x[0..count) to out (raw_len bytes). */
    int (*encode)(const CodecParams *p, const float *x, uint32_t count, uint8_t *out, char *err);
    /* Validates a raw payload: structure, indices, finite values; adds the
     * decoded values' squared norm and count of carried values. 0, -1, or
     * CODEC_NON_FINITE when only a value is not finite. */
    int (*check)(const CodecParams *p, const uint8_t *raw, uint32_t count, double *norm2,
                 uint64_t *nonzeros, char *err);
    /* check, and dst[i] = src[i] + w * v[i] (src NULL: 0 + w * v[i]), the
     * floats of apply's accumulate on a copy of src, over a whole section,
     * reading src once; NULL: check, then apply. dst
     * unspecified when it fails. */
    int (*check_add)(const CodecParams *p, const uint8_t *raw, uint32_t count, float w,
                     const float *src, float *dst, double *norm2, uint64_t *nonzeros, char *err);
    /* dst[i] = dst[i] + w * v[i] (accumulate) or dst[i] = v[i]; only after
     * check passed. */
    void (*apply)(const CodecParams *p, const uint8_t *raw, uint32_t count, float w, float *dst,
                  int accumulate);
} CodecOps;

extern const CodecOps codec_fp32_ops, codec_fp16_ops, codec_bf16_ops, codec_int8_ops,
    codec_topk_ops;
/* The codec of a wire id, from the registry; NULL if unknown. */
const CodecOps *codec_ops(CodecId id);

/* top-k: values kept of a chunk of len values */
static inline uint32_t topk_k(uint32_t density_ppm, uint32_t len) {
    uint64_t k = ((uint64_t)density_ppm * len + 999999u) / 1000000u;
    if (k < 1) k = 1;
    return (uint32_t)(k > len ? len : k);
}
uint32_t codec_density_ppm(const CodecParams *p);

/* Little-endian loads and stores that tolerate any alignment. The project
 * builds for little-endian hosts only (checked in blob.c). */
static inline uint16_t ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint32_t ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t ld64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline float ldf(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}
static inline void st16(uint8_t *p, uint16_t v) {
    memcpy(p, &v, 2);
}
static inline void st32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, 4);
}
static inline void st64(uint8_t *p, uint64_t v) {
    memcpy(p, &v, 8);
}
static inline void stf(uint8_t *p, float v) {
    memcpy(p, &v, 4);
}

/* fp16 and bf16 conversions, round-to-nearest-even, NaN made quiet with its
 * sign kept; the CUDA kernels use the same bit operations. */
uint16_t codec_f32_to_f16(float f);
float codec_f16_to_f32(uint16_t h);
uint16_t codec_f32_to_bf16(float f);
float codec_bf16_to_f32(uint16_t h);

int blob_reserve(Blob *b, size_t need, char *err);

/* Byte planes (planes.c) of n words of w bytes (2 or 4): split writes plane
 * j, byte j of every word, at planes + j·n; join is its inverse, from w
 * planes anywhere. */
void planes_split(const uint8_t *words, size_t n, int w, uint8_t *planes);
void planes_join(const uint8_t *const *plane, size_t n, int w, uint8_t *words);

/* ---- the codecs' inner loops, per instruction set (simd.c) --------------- */

#define SIMD_LANES   256         /* int8's sum of squares: lane j adds j, j+256, … */
#define SIMD_FIX_MID 16777216.0f /* 2^24: an int8 value's offset from its bin centre */
/* An int8 histogram term: a value's offset from its bin centre (·2^24, at
 * most 2^23 in magnitude) plus one count in bit 40, so a bin's sum of up to
 * 2^15 terms splits back into count (the high bits, rounded) and offset sum
 * (the rest) exactly. The kernels give the offset alone, as an int32 (half
 * the stores of the packed term); the histogram adds the count. */
#define SIMD_TERM_ONE      ((int64_t)1 << 40)
#define SIMD_TERM_TILE     4096 /* values a caller passes int8_codes at once */
#define SIMD_COLLECT_SLACK 16   /* a collect kernel stores whole vectors */

/* Every kernel gives the scalar reference's results exactly, for every
 * input (see simd.c for why). */
typedef struct CodecSimd {
    const char *name; /* "scalar", "avx2", "avx512" */
    /* ‖x‖² in double, in SIMD_LANES lanes reduced by simd_lanes_reduce; x
     * is n floats at any alignment (a blob's payload). Not finite iff some x
     * is not: the squares of finite floats cannot overflow the sum. */
    double (*sumsq)(const void *x, uint32_t n);
    /* int8 codes of x·inv (FORMATS.md) and each value's offset from its bin
     * centre ·2^24 (0 for a value clamped into an edge bin),
     * and the indices of the clamped ones, ascending, into clamped (room for
     * n + SIMD_COLLECT_SLACK); returns how many. n <= SIMD_TERM_TILE; x
     * finite. */
    uint32_t (*int8_codes)(const float *x, uint32_t n, float inv, uint8_t *codes, int32_t *off,
                           uint32_t *clamped);
    /* d[i] = d[i] + w·table[codes[i]] (a multiply, then an add: the same
     * floats as d[i] + wt[codes[i]] with wt[q] = w·table[q]) */
    void (*lookup_acc)(const float *table, const uint8_t *codes, uint32_t n, float w, float *d);
    /* d[i] = d[i] + w·x[i] (a multiply, then an add); x at any alignment */
    void (*axpy)(const void *x, uint32_t n, float w, float *d);
    /* d[i] = table[codes[i]] */
    void (*lookup)(const float *table, const uint8_t *codes, uint32_t n, float *d);
    /* The "_to" kernels fill d, a buffer nothing reads soon (a sum's stage,
     * a mean), around the caches where they can (non-temporal stores: no
     * read of d's lines before they are written, a third of the traffic);
     * each ends with a store fence. src NULL reads as zeros (0 + v: -0
     * becomes +0, as in a zeroed sum). */
    /* d[i] = src[i] + w·x[i] (a multiply, then an add); x at any alignment */
    void (*axpy_to)(const void *x, uint32_t n, float w, const float *src, float *d);
    /* d[i] = src[i] + wt[codes[i]] */
    void (*lookup_to)(const float *wt, const uint8_t *codes, uint32_t n, const float *src,
                      float *d);
    /* d[i] = s·x[i] */
    void (*scale_to)(const float *x, uint32_t n, float s, float *d);
    /* The indices i < len with |x[i]| >= t, ascending, into cand (room for
     * len + SIMD_COLLECT_SLACK); *bad = whether some x is not finite.
     * Returns how many. */
    uint32_t (*collect)(const float *x, uint32_t len, float t, uint32_t *cand, int *bad);
    /* whether every x[0..n) is finite; copy (may be NULL, any alignment)
     * takes x as it is read, so a copy costs no pass of its own */
    int (*finite)(const float *x, uint32_t n, void *copy);
    /* h[i] = x[i] as fp16 (bf 0) or bf16 (bf 1), rounded to nearest even,
     * stored little-endian at any alignment (codec_f32_to_f16 and _bf16);
     * 0 when some x is not finite or becomes infinite (h is then
     * unspecified: the caller names the value), else 1 */
    int (*to_half)(const float *x, uint32_t n, int bf, void *h);
    /* x[i] = the fp16 or bf16 h[i] (any alignment) as a float, exactly for
     * every half but NaN (a NaN stays a NaN, its payload unspecified) */
    void (*from_half)(const void *h, uint32_t n, int bf, float *x);
} CodecSimd;

/* The table for this CPU (or STRAIT_CODEC_ISA), chosen once. */
const CodecSimd *codec_simd(void);
/* Makes every codec use k from now on (tests compare the tables' blobs);
 * not safe while another thread encodes or decodes. */
void codec_simd_use(const CodecSimd *k);
/* A table by name; NULL where this CPU or build lacks it. */
const CodecSimd *codec_simd_named(const char *name);
extern const CodecSimd codec_simd_scalar; /* the reference */
/* The reference's tree over SIMD_LANES lanes (lane is overwritten). */
double simd_lanes_reduce(double *lane);
#if defined(__x86_64__)
extern const CodecSimd codec_simd_avx2, codec_simd_avx512;
#endif

/* Writes the raw payload of section [offset, offset + count) into out. */
typedef int (*SectionEncoder)(void *ctx, const CodecParams *p, uint64_t offset, uint32_t count,
                              uint8_t *out, char *err);
/* The container around any section encoder: plans sections, runs enc on
 * each (in parallel if asked), applies zstd, checksums, writes the blob. */
int codec_encode_sections(const CodecParams *p, const CodecLayout *layout, SectionEncoder enc,
                          void *ctx, int parallel, Blob *out, char *err);

/* Validates the container (header, section table, checksums) and calls fn
 * on each section's raw payload in order, serially. */
typedef int (*SectionVisitor)(void *ctx, const CodecParams *p, const uint8_t *raw, uint64_t offset,
                              uint32_t count, char *err);
int codec_for_each_section(const uint8_t *blob, size_t len, uint64_t n, SectionVisitor fn,
                           void *ctx, char *err);

/* top-k after selection: sel holds each chunk's k ascending indices, chunk
 * after chunk, and vals the K selected values; writes the raw payload. */
uint64_t topk_total_k(const CodecParams *p, uint32_t count);
int topk_encode_selected(const CodecParams *p, uint32_t count, const uint16_t *sel,
                         const float *vals, uint8_t *out, char *err);
/* The values a checked top-k payload carries, as decode-accumulate adds
 * them: idx (within the section, ascending) and vals, topk_total_k of
 * each; returns that count. */
uint64_t topk_entries(const CodecParams *p, const uint8_t *raw, uint32_t count, uint32_t *idx,
                      float *vals);

/* Frees ef's residual on the GPU (ef_encode_cuda's); none: nothing. */
void ef_release_device(ErrorFeedback *ef);

#endif
