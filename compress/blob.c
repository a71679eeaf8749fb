/*
 * blob.c — the update blob container (schema/FORMATS.md): header, sections
 * with a checksum each, the optional zstd stage, and the drivers that run a
 * codec's section operations: encode, inspect (validate without applying),
 * decode-accumulate and decode.
 *
 * Sections are independent, so encode and decode run them in parallel with
 * OpenMP; every result is the same bytes or floats for any thread count.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>
#include <zstd.h>

#include "compress_internal.h"
#include "util/util.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "blobs are little-endian");

/* ---- parameters -------------------------------------------------------- */

/* The registry: every name a user can give a codec, in the order messages
 * list them. A codec may have several names for preset parameters (topk2:
 * top-k with 2-bit values). Adding a codec: its file with its CodecOps,
 * and one row here. */
static const struct {
    const char *name;
    const CodecOps *ops;
    uint32_t value_bits; /* a preset over the codec's defaults; 0: none */
} CODECS[] = {
    {"fp32", &codec_fp32_ops, 0}, {"fp16", &codec_fp16_ops, 0}, {"bf16", &codec_bf16_ops, 0},
    {"int8", &codec_int8_ops, 0}, {"topk", &codec_topk_ops, 0}, {"topk2", &codec_topk_ops, 2},
};
#define N_CODECS (sizeof CODECS / sizeof CODECS[0])

const CodecOps *codec_ops(CodecId id) {
    for (size_t i = 0; i < N_CODECS; i++)
        if (CODECS[i].ops->id == id) return CODECS[i].ops;
    return NULL;
}

const char *codec_name(CodecId id) {
    const CodecOps *ops = codec_ops(id);
    return ops ? ops->name : NULL;
}

const char *codec_params_name(const CodecParams *p) {
    const char *name = NULL;
    for (size_t i = 0; i < N_CODECS; i++)
        if (CODECS[i].ops->id == p->id &&
            (CODECS[i].value_bits == 0 ? name == NULL : CODECS[i].value_bits == p->value_bits))
            name = CODECS[i].name;
    return name;
}

static char names_list[160];
static void list_names(void) {
    size_t n = 0;
    for (size_t i = 0; i < N_CODECS && n < sizeof names_list; i++)
        n += (size_t)snprintf(names_list + n, sizeof names_list - n, "%s%s",
                              i == 0              ? ""
                              : i + 1 == N_CODECS ? " or "
                                                  : ", ",
                              CODECS[i].name);
}

const char *codec_names(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, list_names);
    return names_list;
}

BlobKind compress_blob_kind(const uint8_t *data, size_t len) {
    if (len < 4) return BLOB_KIND_NONE;
    if (ld32(data) == BLOB_MAGIC) return BLOB_KIND_UPDATE;
    if (ld32(data) == CKPT_MAGIC) return BLOB_KIND_CHECKPOINT;
    return BLOB_KIND_NONE;
}

CodecParams codec_params_default(CodecId id) {
    CodecParams p = {id, 0, 0, 0.0, 0, 1};
    const CodecOps *ops = codec_ops(id);
    if (ops && ops->defaults) ops->defaults(&p);
    return p;
}

int codec_params_parse(const char *name, CodecParams *out, char *err) {
    for (size_t i = 0; i < N_CODECS; i++) {
        if (strcmp(name, CODECS[i].name) != 0) continue;
        *out = codec_params_default(CODECS[i].ops->id);
        if (CODECS[i].value_bits) out->value_bits = CODECS[i].value_bits;
        return 0;
    }
    return err_set(err, "unknown codec '%s'; use %s", name, codec_names());
}

uint32_t codec_density_ppm(const CodecParams *p) {
    return (uint32_t)llround(p->density * 1e6);
}

int codec_params_check(const CodecParams *p, char *err) {
    const CodecOps *ops = codec_ops(p->id);
    if (ops == NULL) return err_set(err, "unknown codec id %d", (int)p->id);
    if (p->zstd_level < 0 || p->zstd_level > 19)
        return err_set(err, "zstd level %d out of range; use 0 (off) to 19", p->zstd_level);
    return ops->check_params ? ops->check_params(p, err) : 0;
}

void blob_free(Blob *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int blob_reserve(Blob *b, size_t need, char *err) {
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : need; /* a new blob: exactly (the sanitizers see past it) */
    while (cap < need) cap *= 2;
    uint8_t *grown = realloc(b->data, cap);
    if (grown == NULL) return err_set(err, "out of memory for a %zu-byte blob", need);
    b->data = grown;
    b->cap = cap;
    return 0;
}

/* ---- encode ------------------------------------------------------------ */

typedef struct SectionOut {
    uint64_t offset;
    uint32_t count;
    size_t raw_len;
    size_t at;      /* where its raw payload was encoded, in the output */
    uint32_t flags; /* 0: raw; SECTION_FLAG_ZSTD or _PLANES: the lossless stage's form,
                     * written over the raw payload at `at` (it is shorter) */
    size_t stored_len;
    uint64_t checksum;
    char err[ERR_LEN];
    int failed;
} SectionOut;

/* Cuts [0, n) at tensor boundaries and every CODEC_SECTION_MAX values. */
static SectionOut *plan_sections(const CodecLayout *L, size_t *n_out, char *err) {
    size_t cap = 0, n = 0;
    uint64_t total = 0;
    size_t tensors = L->sizes ? L->n_tensors : 1;
    for (size_t t = 0; t < tensors; t++) {
        uint64_t size = L->sizes ? L->sizes[t] : L->n;
        cap += (size_t)((size + CODEC_SECTION_MAX - 1) / CODEC_SECTION_MAX);
        total += size;
    }
    if (total != L->n) {
        err_set(err, "parameter table sizes add up to %llu, not %llu", (unsigned long long)total,
                (unsigned long long)L->n);
        return NULL;
    }
    if (cap > CODEC_MAX_SECTIONS) {
        err_set(err, "update needs %zu sections, over the limit of %u", cap, CODEC_MAX_SECTIONS);
        return NULL;
    }
    SectionOut *s = calloc(cap ? cap : 1, sizeof *s);
    if (s == NULL) {
        err_set(err, "out of memory planning sections");
        return NULL;
    }
    uint64_t off = 0;
    for (size_t t = 0; t < tensors; t++) {
        uint64_t size = L->sizes ? L->sizes[t] : L->n;
        for (uint64_t done = 0; done < size;) {
            uint64_t c = size - done < CODEC_SECTION_MAX ? size - done : CODEC_SECTION_MAX;
            s[n].offset = off;
            s[n].count = (uint32_t)c;
            n++;
            off += c;
            done += c;
        }
    }
    *n_out = n;
    return s;
}

static void section_header(uint8_t *h, const SectionOut *s) {
    st64(h, s->offset);
    st32(h + 8, s->count);
    st32(h + 12, (uint32_t)s->raw_len);
    st32(h + 16, (uint32_t)s->stored_len);
    st32(h + 20, s->flags);
}

static uint64_t section_checksum(const uint8_t *header, const uint8_t *payload, size_t len) {
    return XXH64(payload, len, XXH64(header, 24, 0));
}

/* A thread's scratch for the lossless stage, kept from section to section:
 * a fresh buffer per section costs a page fault per page (a quarter of an
 * fp32 encode's time). */
typedef struct Scratch {
    uint8_t *z, *planes;
    size_t z_cap, planes_cap;
} Scratch;

static uint8_t *scratch_get(uint8_t **buf, size_t *cap, size_t need) {
    if (need > *cap) {
        free(*buf);
        *buf = malloc(need);
        *cap = *buf ? need : 0;
    }
    return *buf;
}

/* The lossless stage of one section's raw payload: the form kept when it
 * is smaller than raw (written over raw, and s->flags, s->stored_len), else
 * nothing. Words go plane by plane: w u32 plane lengths, then the planes
 * (FORMATS.md), each plane zstd-compressed when that saves an eighth of it
 * at least: a plane zstd barely shrinks (a float's mantissa bytes) would
 * cost the receiver a decompression pass to save a few bytes. Other
 * payloads go as one zstd frame. */
static void section_compress(ZSTD_CCtx *zc, int level, int w, uint8_t *raw, Scratch *sc,
                             SectionOut *s) {
    if (w == 0) {
        size_t bound = ZSTD_compressBound(s->raw_len);
        uint8_t *z = scratch_get(&sc->z, &sc->z_cap, bound);
        if (z == NULL) return; /* kept raw: a valid blob, only larger */
        size_t len = ZSTD_compressCCtx(zc, z, bound, raw, s->raw_len, level);
        if (ZSTD_isError(len) || len >= s->raw_len) return;
        memcpy(raw, z, len);
        s->flags = SECTION_FLAG_ZSTD;
        s->stored_len = len;
        return;
    }
    /* planes: split out of raw, then written back over it, each plane
     * compressed straight into its place; put back together should the
     * lengths and planes not fit in less than raw */
    assert(s->raw_len == (size_t)w * s->count);
    if (s->raw_len <= 4 * (size_t)w) return; /* the lengths alone would not be shorter */
    uint8_t *planes = scratch_get(&sc->planes, &sc->planes_cap, s->raw_len);
    if (planes == NULL) return;
    planes_split(raw, s->count, w, planes);
    size_t len = 4 * (size_t)w;
    int fits = 1;
    for (int j = 0; j < w && fits; j++) {
        const uint8_t *plane = planes + (size_t)j * s->count;
        assert(len <= s->raw_len);
        size_t room = s->raw_len - len;
        size_t zl = ZSTD_compressCCtx(zc, raw + len, room, plane, s->count, level);
        if (ZSTD_isError(zl) || zl > s->count - s->count / 8) {
            fits = s->count <= room;
            if (fits) memcpy(raw + len, plane, s->count);
            zl = s->count;
        }
        st32(raw + 4 * (size_t)j, (uint32_t)zl);
        len += zl;
    }
    if (!fits || len >= s->raw_len) {
        const uint8_t *pl[4] = {planes, planes + s->count, planes + 2 * (size_t)s->count,
                                planes + 3 * (size_t)s->count};
        planes_join(pl, s->count, w, raw);
        return;
    }
    s->flags = SECTION_FLAG_PLANES;
    s->stored_len = len;
}

/* Every section's raw payload is encoded straight into the output at the
 * place it would have uncompressed, in parallel; then the sections that
 * the lossless stage shrinks are compressed (in parallel), and one serial
 * pass slides the payloads left into their final places and writes the
 * section headers. */
static int cpu_section(void *ctx, const CodecParams *p, uint64_t offset, uint32_t count,
                       uint8_t *out, char *err) {
    return codec_ops(p->id)->encode(p, (const float *)ctx + offset, count, out, err);
}

int codec_encode(const CodecParams *p, const CodecLayout *layout, const float *x, Blob *out,
                 char *err) {
    return codec_encode_sections(p, layout, cpu_section, (void *)x, 1, out, err);
}

int codec_encode_sections(const CodecParams *p, const CodecLayout *layout, SectionEncoder enc,
                          void *ctx, int parallel, Blob *out, char *err) {
    (void)parallel; /* read by the OpenMP pragma only */
    if (codec_params_check(p, err) != 0) return -1;
    if (layout->n > CODEC_MAX_ELEMENTS)
        return err_set(err, "update of %llu values is over the limit",
                       (unsigned long long)layout->n);
    const CodecOps *ops = codec_ops(p->id);
    size_t n_sec;
    SectionOut *secs = plan_sections(layout, &n_sec, err);
    if (secs == NULL) return -1;
    size_t total = BLOB_HEADER_LEN;
    for (size_t i = 0; i < n_sec; i++) {
        secs[i].raw_len = ops->raw_len(p, secs[i].count);
        secs[i].at = total + SECTION_HEADER_LEN;
        total += SECTION_HEADER_LEN + secs[i].raw_len;
    }
    out->len = 0;
    int rc = -1, failed = 0;
    if (blob_reserve(out, total, err) != 0) goto out;
    uint8_t *o = out->data;
#pragma omp parallel reduction(| : failed) if (parallel)
    {
        ZSTD_CCtx *zc = p->zstd_level > 0 ? ZSTD_createCCtx() : NULL;
        Scratch sc = {0};
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < n_sec; i++) {
            SectionOut *s = &secs[i];
            uint8_t *raw = o + s->at;
            if (enc(ctx, p, s->offset, s->count, raw, s->err) != 0) {
                s->failed = failed = 1;
                continue;
            }
            s->stored_len = s->raw_len;
            if (zc != NULL) section_compress(zc, p->zstd_level, ops->word, raw, &sc, s);
            uint8_t h[SECTION_HEADER_LEN];
            section_header(h, s);
            s->checksum = section_checksum(h, raw, s->stored_len);
        }
        free(sc.z), free(sc.planes);
        ZSTD_freeCCtx(zc);
    }
    if (failed) {
        for (size_t i = 0; i < n_sec; i++)
            if (secs[i].failed) {
                err_set(err, "%s", secs[i].err);
                break;
            }
        goto out;
    }
    memset(o, 0, BLOB_HEADER_LEN);
    st32(o, BLOB_MAGIC);
    st16(o + 4, BLOB_VERSION);
    CodecHeader h = ops->header_put ? ops->header_put(p) : (CodecHeader){0, 0, 0};
    o[6] = (uint8_t)p->id;
    o[7] = h.bits;
    st64(o + 8, layout->table_hash);
    st64(o + 16, layout->n);
    st32(o + 24, (uint32_t)n_sec);
    st32(o + 28, h.a);
    st32(o + 32, h.b);
    st32(o + 36, 0);
    st64(o + 40, XXH64(o, 40, 0));
    size_t pos = BLOB_HEADER_LEN;
    for (size_t i = 0; i < n_sec; i++) {
        SectionOut *s = &secs[i];
        section_header(o + pos, s);
        st64(o + pos + 24, s->checksum);
        if (s->at != pos + SECTION_HEADER_LEN)
            memmove(o + pos + SECTION_HEADER_LEN, o + s->at, s->stored_len);
        pos += SECTION_HEADER_LEN + s->stored_len;
    }
    out->len = pos;
    rc = 0;
out:
    free(secs);
    return rc;
}

/* ---- decode side ------------------------------------------------------- */

typedef struct Section {
    uint64_t offset;
    uint32_t count, raw_len, stored_len, flags;
    const uint8_t *stored;
} Section;

uint64_t codec_blob_max_len(const CodecParams *p, const CodecLayout *layout) {
    const CodecOps *ops = codec_ops(p->id);
    char err[ERR_LEN];
    size_t n_sec = 0;
    if (ops == NULL || codec_params_check(p, err) != 0) return 0;
    SectionOut *secs = plan_sections(layout, &n_sec, err);
    if (secs == NULL) return 0;
    uint64_t total = BLOB_HEADER_LEN;
    for (size_t i = 0; i < n_sec; i++) /* zstd is kept only where it is smaller */
        total += SECTION_HEADER_LEN + ops->raw_len(p, secs[i].count);
    free(secs);
    return total;
}

/* Parses and checks the header; fills params. */
static int read_header(const uint8_t *b, size_t len, CodecParams *p, uint64_t *hash, uint64_t *n,
                       uint32_t *n_sections, char *err) {
    if (len < BLOB_HEADER_LEN)
        return err_set(err, "blob of %zu bytes is shorter than its %d-byte header", len,
                       BLOB_HEADER_LEN);
    if (ld32(b) != BLOB_MAGIC) return err_set(err, "not an update blob (wrong magic)");
    if (ld16(b + 4) != BLOB_VERSION)
        return err_set(err, "blob version %u is not supported (this strait reads %d); upgrade",
                       ld16(b + 4), BLOB_VERSION);
    if (ld64(b + 40) != XXH64(b, 40, 0)) return err_set(err, "blob header checksum mismatch");
    if (ld32(b + 36) != 0) return err_set(err, "blob header has unknown flags");
    memset(p, 0, sizeof *p);
    p->id = (CodecId)b[6];
    const CodecOps *ops = codec_ops(p->id);
    if (ops == NULL) return err_set(err, "blob names unknown codec %u", b[6]);
    CodecHeader h = {b[7], ld32(b + 28), ld32(b + 32)};
    if (ops->header_get ? ops->header_get(p, h, err) != 0 : (h.bits || h.a || h.b))
        return ops->header_get ? -1
                               : err_set(err, "blob has parameters %s does not use", ops->name);
    char why[ERR_LEN];
    if (codec_params_check(p, why) != 0) return err_set(err, "blob parameters: %s", why);
    *hash = ld64(b + 8);
    *n = ld64(b + 16);
    *n_sections = ld32(b + 24);
    if (*n > CODEC_MAX_ELEMENTS)
        return err_set(err, "blob claims %llu values, over the limit", (unsigned long long)*n);
    if (*n_sections > CODEC_MAX_SECTIONS || (*n_sections == 0) != (*n == 0))
        return err_set(err, "blob claims %u sections for %llu values", *n_sections,
                       (unsigned long long)*n);
    /* every section has a header in the bytes present: a count the bytes
     * cannot hold is refused before the section table is allocated */
    if ((uint64_t)*n_sections > (len - BLOB_HEADER_LEN) / SECTION_HEADER_LEN)
        return err_set(err, "blob claims %u sections in %zu bytes", *n_sections, len);
    return 0;
}

int codec_blob_params(const uint8_t *blob, size_t len, CodecParams *out, char *err) {
    uint64_t hash, n;
    uint32_t n_sec;
    return read_header(blob, len, out, &hash, &n, &n_sec, err);
}

/* A read section's stored bytes against the checksum in its header. */
static int section_verify(const Section *s, char *err) {
    const uint8_t *h = s->stored - SECTION_HEADER_LEN;
    if (ld64(h + 24) != section_checksum(h, s->stored, s->stored_len))
        return err_set(err, "section at value %llu: checksum mismatch",
                       (unsigned long long)s->offset);
    return 0;
}

/* Reads the section header at *pos (and, with verify, its checksum). */
static int read_section(const CodecParams *p, const uint8_t *b, size_t len, size_t *pos,
                        uint64_t expect_offset, uint64_t n, int verify, Section *s, char *err) {
    if (len - *pos < SECTION_HEADER_LEN) return err_set(err, "blob truncated in a section header");
    const uint8_t *h = b + *pos;
    s->offset = ld64(h);
    s->count = ld32(h + 8);
    s->raw_len = ld32(h + 12);
    s->stored_len = ld32(h + 16);
    s->flags = ld32(h + 20);
    if (s->offset != expect_offset)
        return err_set(err, "section at value %llu, expected %llu", (unsigned long long)s->offset,
                       (unsigned long long)expect_offset);
    if (s->count == 0 || s->count > CODEC_SECTION_MAX || s->count > n - s->offset)
        return err_set(err, "section of %u values at %llu does not fit %llu", s->count,
                       (unsigned long long)s->offset, (unsigned long long)n);
    const CodecOps *ops = codec_ops(p->id);
    if ((s->flags & ~(SECTION_FLAG_ZSTD | SECTION_FLAG_PLANES)) ||
        s->flags == (SECTION_FLAG_ZSTD | SECTION_FLAG_PLANES))
        return err_set(err, "section has unknown flags");
    if ((s->flags & SECTION_FLAG_PLANES) && ops->word == 0)
        return err_set(err, "section claims byte planes; %s payloads have no words", ops->name);
    size_t want = ops->raw_len(p, s->count);
    if (s->raw_len != want)
        return err_set(err, "section raw length %u, the codec needs %zu for %u values", s->raw_len,
                       want, s->count);
    if (s->flags ? s->stored_len >= s->raw_len : s->stored_len != s->raw_len)
        return err_set(err, "section stored length %u is inconsistent", s->stored_len);
    if (len - *pos - SECTION_HEADER_LEN < s->stored_len)
        return err_set(err, "blob truncated in a section payload");
    s->stored = h + SECTION_HEADER_LEN;
    if (verify && section_verify(s, err) != 0) return -1;
    *pos += SECTION_HEADER_LEN + s->stored_len;
    return 0;
}

/* Room for need bytes in *buf; -1 out of memory. */
static int scratch_reserve(uint8_t **buf, size_t *cap, size_t need) {
    if (*cap >= need) return 0;
    uint8_t *grown = realloc(*buf, need);
    if (grown == NULL) return -1;
    *buf = grown;
    *cap = need;
    return 0;
}

/* A section's buffers for decoding: the raw payload when it is not in the
 * blob itself (kept by a CodecChecked, or reused), and zstd planes. */
typedef struct SectionScratch {
    ZSTD_DCtx *dz;
    uint8_t **raw; /* where the raw payload goes */
    size_t *raw_cap;
    uint8_t *planes; /* decompressed planes (owned by the caller) */
    size_t planes_cap;
} SectionScratch;

/* Decompresses one zstd frame of exactly want bytes into dst. */
static int unzstd(ZSTD_DCtx *dz, const Section *s, const uint8_t *src, size_t len, uint8_t *dst,
                  size_t want, char *err) {
    if (ZSTD_getFrameContentSize(src, len) != want)
        return err_set(err, "section at value %llu: compressed frame size does not match",
                       (unsigned long long)s->offset);
    size_t got = ZSTD_decompressDCtx(dz, dst, want, src, len);
    if (ZSTD_isError(got) || got != want)
        return err_set(err, "section at value %llu: corrupt compressed data",
                       (unsigned long long)s->offset);
    return 0;
}

/* The raw payload of a section: in place, or decoded into *x->raw. */
static const uint8_t *section_raw(const Section *s, int word, SectionScratch *x, char *err) {
    if (s->flags == 0) return s->stored;
    if (scratch_reserve(x->raw, x->raw_cap, s->raw_len) != 0) {
        err_set(err, "out of memory decompressing a section");
        return NULL;
    }
    if (s->flags & SECTION_FLAG_ZSTD)
        return unzstd(x->dz, s, s->stored, s->stored_len, *x->raw, s->raw_len, err) ? NULL
                                                                                    : *x->raw;
    /* byte planes: w lengths, then the planes; each is count bytes, raw, or
     * a zstd frame of count bytes when shorter */
    assert(word == 2 || word == 4);
    size_t head = 4 * (size_t)word, count = s->count;
    if (s->stored_len < head) {
        err_set(err, "section at value %llu: byte planes truncated", (unsigned long long)s->offset);
        return NULL;
    }
    const uint8_t *plane[4];
    size_t at = head, packed = 0;
    for (int j = 0; j < word; j++) {
        size_t len = ld32(s->stored + 4 * (size_t)j);
        if (len > count || len > s->stored_len - at) {
            err_set(err, "section at value %llu: byte plane %d of %zu bytes is inconsistent",
                    (unsigned long long)s->offset, j, len);
            return NULL;
        }
        plane[j] = s->stored + at;
        if (len < count) packed++;
        at += len;
    }
    if (at != s->stored_len) {
        err_set(err, "section at value %llu: byte planes do not fill the payload",
                (unsigned long long)s->offset);
        return NULL;
    }
    if (scratch_reserve(&x->planes, &x->planes_cap, packed * count) != 0) {
        err_set(err, "out of memory decompressing a section");
        return NULL;
    }
    packed = 0;
    for (int j = 0; j < word; j++) {
        size_t len = ld32(s->stored + 4 * (size_t)j);
        if (len == count) continue;
        uint8_t *dst = x->planes + packed++ * count;
        if (unzstd(x->dz, s, plane[j], len, dst, count, err) != 0) return NULL;
        plane[j] = dst;
    }
    planes_join(plane, count, word, *x->raw);
    return *x->raw;
}

struct CodecChecked {
    CodecParams p;
    uint32_t n_sec;      /* of the blob checked last; 0: empty */
    Section *secs;       /* owned, n_sec */
    const uint8_t **raw; /* each section's raw payload: in the blob, or own[i] */
    /* buffers for decompressed payloads, kept from one blob to the next (a
     * receiver checking update after update pays no fresh pages); owned */
    uint8_t **own;
    size_t *own_cap;
    uint32_t cap; /* entries of raw, own and own_cap */
};

CodecChecked *codec_checked_new(void) {
    return calloc(1, sizeof(CodecChecked));
}

void codec_checked_free(CodecChecked *c) {
    if (c == NULL) return;
    for (uint32_t i = 0; i < c->cap; i++) free(c->own[i]);
    free(c->own), free(c->own_cap), free(c->raw), free(c->secs), free(c);
}

/* Room for n sections (buffers kept); -1 out of memory. */
static int checked_reserve(CodecChecked *c, uint32_t n) {
    if (n <= c->cap) return 0;
    const uint8_t **raw = realloc(c->raw, sizeof *raw * n);
    if (raw) c->raw = raw;
    uint8_t **own = raw ? realloc(c->own, sizeof *own * n) : NULL;
    if (own) c->own = own;
    size_t *caps = own ? realloc(c->own_cap, sizeof *caps * n) : NULL;
    if (caps == NULL) return -1;
    c->own_cap = caps;
    for (uint32_t i = c->cap; i < n; i++) c->own[i] = NULL, c->own_cap[i] = 0;
    c->cap = n;
    return 0;
}

void codec_checked_accumulate(const CodecChecked *c, float weight, float *sum, int fresh) {
    const CodecOps *ops = codec_ops(c->p.id);
#pragma omp parallel for schedule(dynamic, 1)
    for (uint32_t i = 0; i < c->n_sec; i++) {
        float *dst = sum + c->secs[i].offset;
        if (fresh) memset(dst, 0, sizeof(float) * c->secs[i].count);
        ops->apply(&c->p, c->raw[i], c->secs[i].count, weight, dst, 1);
    }
}

/* Checks a section's raw payload and writes dst = src + w x its values
 * (src NULL: dst = 0 + w x its values) in one read of the payload from
 * memory: a codec's check_add does both (int8, fp32); for the others the
 * section is checked, then added from cache into dst holding src's copy.
 * Either way the norm is the codec's check of the section. dst is left
 * unspecified when it fails. */
static int check_add_section(const CodecOps *ops, const CodecParams *p, const Section *s,
                             const uint8_t *raw, float w, const float *src, float *dst,
                             double *norm2, uint64_t *nonzeros, char *err) {
    src = src ? src + s->offset : NULL;
    dst += s->offset;
    if (ops->check_add) return ops->check_add(p, raw, s->count, w, src, dst, norm2, nonzeros, err);
    int bad = ops->check(p, raw, s->count, norm2, nonzeros, err);
    if (bad) return bad;
    if (src)
        memcpy(dst, src, sizeof(float) * s->count);
    else
        memset(dst, 0, sizeof(float) * s->count);
    ops->apply(p, raw, s->count, w, dst, 1);
    return 0;
}

/* Walks all sections: reads and checks headers serially (cheap), then runs
 * `mode` on the sections in parallel, each section's checksum first. mode
 * 0: check; 1: accumulate; 2: set; 3: check, then set what passed; 4: check
 * and dst = src + w x values in one pass (check_add_section).
 * With kept (modes 0 and 4), what was checked is kept there for an apply. */
static int walk(const uint8_t *b, size_t len, uint64_t expect_hash, uint64_t expect_n, int mode,
                float w, const float *src, float *dst, BlobInfo *info, CodecChecked *kept,
                char *err) {
    if (kept) { /* empty until this blob passes, whatever it held */
        kept->n_sec = 0;
        free(kept->secs);
        kept->secs = NULL;
    }
    CodecParams p;
    uint64_t hash = 0, n = 0;
    uint32_t n_sec = 0;
    if (read_header(b, len, &p, &hash, &n, &n_sec, err) != 0) return -1;
    int wrong = mode == 4 ? CODEC_WRONG_MODEL : -1;
    if (expect_hash && hash != expect_hash)
        return err_set(err, "blob is for parameter table %016llx, this model's is %016llx",
                       (unsigned long long)hash, (unsigned long long)expect_hash),
               wrong;
    if ((expect_n || mode != 0) && n != expect_n)
        return err_set(err, "blob has %llu values, this model has %llu", (unsigned long long)n,
                       (unsigned long long)expect_n),
               wrong;
    Section *secs = malloc((n_sec ? n_sec : 1) * sizeof *secs);
    if (secs == NULL) return err_set(err, "out of memory reading %u sections", n_sec);
    size_t pos = BLOB_HEADER_LEN;
    uint64_t off = 0;
    for (uint32_t i = 0; i < n_sec; i++) {
        if (read_section(&p, b, len, &pos, off, n, 0, &secs[i], err) != 0) {
            free(secs);
            return -1;
        }
        off += secs[i].count;
    }
    if (off != n || pos != len) {
        free(secs);
        return err_set(err, "blob sections cover %llu of %llu values and %zu of %zu bytes",
                       (unsigned long long)off, (unsigned long long)n, pos, len);
    }
    const CodecOps *ops = codec_ops(p.id);
    double *norms = calloc(n_sec ? n_sec : 1, sizeof *norms);
    uint64_t *nnz = calloc(n_sec ? n_sec : 1, sizeof *nnz);
    int failed = 0;
    uint32_t first_bad = n_sec;
    int bad_rc = -1; /* the first bad section's: CODEC_NON_FINITE or -1 */
    char bad_err[ERR_LEN] = "";
    if (norms == NULL || nnz == NULL || (kept && checked_reserve(kept, n_sec ? n_sec : 1) != 0)) {
        failed = 1;
        err_set(bad_err, "out of memory");
    }
    uint32_t n_run = failed ? 0 : n_sec; /* out of memory already: no section is run */
#pragma omp parallel if (n_run > 0)
    {
        ZSTD_DCtx *dz = ZSTD_createDCtx();
        uint8_t *scratch = NULL;
        size_t scratch_cap = 0;
        SectionScratch x = {dz, &scratch, &scratch_cap, NULL, 0};
        char e[ERR_LEN];
#pragma omp for schedule(dynamic, 1)
        for (uint32_t i = 0; i < n_run; i++) {
            /* kept: a decompressed payload stays, in that section's buffer */
            x.raw = kept ? &kept->own[i] : &scratch;
            x.raw_cap = kept ? &kept->own_cap[i] : &scratch_cap;
            if (dz == NULL) err_set(e, "out of memory");
            const uint8_t *raw = dz == NULL || section_verify(&secs[i], e) != 0
                                     ? NULL
                                     : section_raw(&secs[i], ops->word, &x, e);
            if (raw != NULL && kept != NULL) kept->raw[i] = raw;
            int bad = raw == NULL ? -1 : 0;
            if (!bad && mode == 4)
                bad = check_add_section(ops, &p, &secs[i], raw, w, src, dst, &norms[i], &nnz[i], e);
            else if (!bad && (mode == 0 || mode == 3))
                bad = ops->check(&p, raw, secs[i].count, &norms[i], &nnz[i], e);
            if (!bad && mode != 0 && mode != 4)
                ops->apply(&p, raw, secs[i].count, w, dst + secs[i].offset, mode == 1);
            if (bad) {
#pragma omp critical
                {
                    failed = 1;
                    if (i < first_bad) {
                        first_bad = i;
                        bad_rc = bad == CODEC_NON_FINITE ? CODEC_NON_FINITE : -1;
                        snprintf(bad_err, sizeof bad_err, "%s", e);
                    }
                }
            }
        }
        free(scratch);
        free(x.planes);
        ZSTD_freeDCtx(dz);
    }
    if (!failed && info) {
        memset(info, 0, sizeof *info);
        info->params = p;
        info->table_hash = hash;
        info->n = n;
        info->n_sections = n_sec;
        info->raw_bytes = 4 * n;
        info->wire_bytes = len;
        for (uint32_t i = 0; i < n_sec; i++) {
            info->norm2 += norms[i];
            info->nonzeros += nnz[i];
        }
    }
    free(norms);
    free(nnz);
    if (kept && !failed) {
        kept->p = p, kept->n_sec = n_sec, kept->secs = secs; /* it owns secs now */
    } else {
        free(secs);
    }
    if (failed) return err_set(err, "%s", bad_err), bad_rc;
    return 0;
}

int codec_for_each_section(const uint8_t *b, size_t len, uint64_t expect_n, SectionVisitor fn,
                           void *ctx, char *err) {
    CodecParams p;
    uint64_t hash = 0, n = 0;
    uint32_t n_sec = 0;
    if (read_header(b, len, &p, &hash, &n, &n_sec, err) != 0) return -1;
    if (n != expect_n)
        return err_set(err, "blob has %llu values, expected %llu", (unsigned long long)n,
                       (unsigned long long)expect_n);
    ZSTD_DCtx *dz = ZSTD_createDCtx();
    uint8_t *scratch = NULL;
    size_t cap = 0, pos = BLOB_HEADER_LEN;
    SectionScratch x = {dz, &scratch, &cap, NULL, 0};
    uint64_t off = 0;
    int rc = dz ? 0 : err_set(err, "out of memory");
    for (uint32_t i = 0; rc == 0 && i < n_sec; i++) {
        Section s;
        const uint8_t *raw;
        if (read_section(&p, b, len, &pos, off, n, 1, &s, err) != 0 ||
            (raw = section_raw(&s, codec_ops(p.id)->word, &x, err)) == NULL ||
            fn(ctx, &p, raw, s.offset, s.count, err) != 0)
            rc = -1;
        off += s.count;
    }
    if (rc == 0 && (off != n || pos != len))
        rc = err_set(err, "blob sections do not cover it exactly");
    free(scratch);
    free(x.planes);
    ZSTD_freeDCtx(dz);
    return rc;
}

int codec_blob_inspect(const uint8_t *blob, size_t len, uint64_t expect_hash, uint64_t expect_n,
                       BlobInfo *info, char *err) {
    BlobInfo local;
    return walk(blob, len, expect_hash, expect_n, 0, 0.0f, NULL, NULL, info ? info : &local, NULL,
                err);
}

int codec_blob_check(const uint8_t *blob, size_t len, uint64_t expect_hash, uint64_t expect_n,
                     BlobInfo *info, CodecChecked *c, char *err) {
    BlobInfo local;
    return walk(blob, len, expect_hash, expect_n, 0, 0.0f, NULL, NULL, info ? info : &local, c,
                err);
}

int codec_blob_check_add(const uint8_t *blob, size_t len, uint64_t expect_hash, uint64_t n,
                         float weight, const float *sum, float *out, BlobInfo *info,
                         CodecChecked *c, char *err) {
    BlobInfo local;
    return walk(blob, len, expect_hash, n, 4, weight, sum, out, info ? info : &local, c, err);
}

int codec_inspect_decode(const uint8_t *blob, size_t len, uint64_t expect_hash, uint64_t n,
                         float *x, BlobInfo *info, char *err) {
    BlobInfo local;
    return walk(blob, len, expect_hash, n, 3, 0.0f, NULL, x, info ? info : &local, NULL, err);
}

int codec_decode_accumulate(const uint8_t *blob, size_t len, float weight, float *sum, uint64_t n,
                            char *err) {
    return walk(blob, len, 0, n, 1, weight, NULL, sum, NULL, NULL, err);
}

int codec_decode(const uint8_t *blob, size_t len, float *x, uint64_t n, char *err) {
    return walk(blob, len, 0, n, 2, 0.0f, NULL, x, NULL, NULL, err);
}

/* ---- sequential range reads: each section decoded once ---------------------------------- */

struct CodecCursor {
    const uint8_t *blob;
    size_t len, pos; /* pos: the next section header */
    CodecParams p;
    uint64_t n, next; /* next: the offset of the next section */
    uint32_t n_sec, read;
    uint64_t sec_offset; /* the decoded section: [sec_offset, sec_offset + sec_count) */
    uint32_t sec_count;
    float *values; /* CODEC_SECTION_MAX floats at most */
    uint8_t *scratch;
    size_t scratch_cap;
    SectionScratch x; /* its dz owned; raw: scratch */
};

CodecCursor *codec_cursor_open(const uint8_t *blob, size_t len, uint64_t n, char *err) {
    CodecCursor *c = calloc(1, sizeof *c);
    if (c == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    uint64_t hash, count;
    if (read_header(blob, len, &c->p, &hash, &count, &c->n_sec, err) != 0) {
        free(c);
        return NULL;
    }
    if (count != n) {
        err_set(err, "blob has %llu values, expected %llu", (unsigned long long)count,
                (unsigned long long)n);
        free(c);
        return NULL;
    }
    c->blob = blob, c->len = len, c->pos = BLOB_HEADER_LEN, c->n = n;
    c->x = (SectionScratch){ZSTD_createDCtx(), &c->scratch, &c->scratch_cap, NULL, 0};
    c->values = malloc(sizeof(float) * CODEC_SECTION_MAX);
    if (c->x.dz == NULL || c->values == NULL) {
        err_set(err, "out of memory for a section");
        codec_cursor_close(c);
        return NULL;
    }
    return c;
}

size_t codec_cursor_done(const CodecCursor *c) {
    return c->pos;
}

void codec_cursor_close(CodecCursor *c) {
    if (c == NULL) return;
    ZSTD_freeDCtx(c->x.dz);
    free(c->values), free(c->scratch), free(c->x.planes), free(c);
}

/* Decodes the next section into c->values. */
static int cursor_advance(CodecCursor *c, char *err) {
    if (c->read == c->n_sec)
        return err_set(err, "blob ends before value %llu", (unsigned long long)c->next);
    Section s;
    const uint8_t *raw;
    if (read_section(&c->p, c->blob, c->len, &c->pos, c->next, c->n, 1, &s, err) != 0 ||
        (raw = section_raw(&s, codec_ops(c->p.id)->word, &c->x, err)) == NULL)
        return -1;
    char why[ERR_LEN];
    double norm2;
    uint64_t nnz;
    const CodecOps *ops = codec_ops(c->p.id);
    if (ops->check(&c->p, raw, s.count, &norm2, &nnz, why) != 0) return err_set(err, "%s", why);
    ops->apply(&c->p, raw, s.count, 0.0f, c->values, 0);
    c->sec_offset = s.offset, c->sec_count = s.count;
    c->next = s.offset + s.count;
    c->read++;
    return 0;
}

int codec_cursor_read(CodecCursor *c, uint64_t lo, uint64_t hi, float *out, char *err) {
    if (lo > hi || hi > c->n)
        return err_set(err, "range [%llu, %llu) outside %llu values", (unsigned long long)lo,
                       (unsigned long long)hi, (unsigned long long)c->n);
    if (c->read > 0 && lo < c->sec_offset)
        return err_set(err, "cursor reads forward only: value %llu is behind it",
                       (unsigned long long)lo);
    for (uint64_t at = lo; at < hi;) {
        if (c->read == 0 || at >= c->sec_offset + c->sec_count) {
            if (cursor_advance(c, err) != 0) return -1;
            continue;
        }
        uint64_t end = c->sec_offset + c->sec_count < hi ? c->sec_offset + c->sec_count : hi;
        memcpy(out + (at - lo), c->values + (at - c->sec_offset),
               sizeof(float) * (size_t)(end - at));
        at = end;
    }
    return 0;
}
