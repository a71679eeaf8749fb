/*
 * checkpoint.c — lossless compression of model state (LMC, Waddington &
 * Constantinescu 2025): the bytes of each float word are grouped into
 * planes (sign and exponent apart from mantissa), optionally XORed first
 * with the previous checkpoint (consecutive checkpoints share most high
 * bytes), and each plane is zstd-compressed when that helps.
 *
 * Format (FORMATS.md "checkpoint blob"): a 32-byte header, then per plane a
 * 32-byte header and its payload. Exact round trip.
 */
#include <stdlib.h>

#include <xxhash.h>
#include <zstd.h>

#include "compress_internal.h"
#include "util/util.h"

#define CK_VERSION          1
#define CK_HEADER_LEN       32
#define CK_PLANE_HEADER_LEN 32
#define CK_FLAG_XOR         1u
#define CK_PLANE_ZSTD       1u

int ckpt_encode(const void *words, size_t len, int word, const void *prev, int zstd_level,
                Blob *out, char *err) {
    if (word != 2 && word != 4) return err_set(err, "checkpoint word size %d; use 2 or 4", word);
    if (len % (size_t)word) return err_set(err, "checkpoint of %zu bytes is not whole words", len);
    if (zstd_level < 0 || zstd_level > 19) return err_set(err, "bad zstd level %d", zstd_level);
    size_t n = len / (size_t)word;
    const uint8_t *src = words, *old = prev;
    uint8_t *plane = malloc(n ? n : 1);
    size_t bound = ZSTD_compressBound(n);
    uint8_t *z = malloc(bound);
    ZSTD_CCtx *zc = ZSTD_createCCtx();
    int rc = -1;
    out->len = 0;
    if (plane == NULL || z == NULL || zc == NULL) {
        err_set(err, "out of memory compressing a checkpoint");
        goto out;
    }
    if (blob_reserve(out, CK_HEADER_LEN, err) != 0) goto out;
    uint8_t *h = out->data;
    memset(h, 0, CK_HEADER_LEN);
    st32(h, CKPT_MAGIC);
    st16(h + 4, CK_VERSION);
    h[6] = (uint8_t)word;
    h[7] = old ? CK_FLAG_XOR : 0;
    st64(h + 8, len);
    st64(h + 24, XXH64(h, 24, 0));
    out->len = CK_HEADER_LEN;
    for (int b = 0; b < word; b++) {
        for (size_t i = 0; i < n; i++) {
            uint8_t v = src[i * (size_t)word + (size_t)b];
            plane[i] = old ? v ^ old[i * (size_t)word + (size_t)b] : v;
        }
        const uint8_t *payload = plane;
        size_t stored = n;
        uint32_t flags = 0;
        if (zstd_level > 0) {
            size_t zl = ZSTD_compressCCtx(zc, z, bound, plane, n, zstd_level);
            if (!ZSTD_isError(zl) && zl < n) {
                payload = z;
                stored = zl;
                flags = CK_PLANE_ZSTD;
            }
        }
        if (blob_reserve(out, out->len + CK_PLANE_HEADER_LEN + stored, err) != 0) goto out;
        uint8_t *ph = out->data + out->len;
        memset(ph, 0, CK_PLANE_HEADER_LEN);
        st64(ph, n);
        st64(ph + 8, stored);
        st32(ph + 16, flags);
        st64(ph + 24, XXH64(plane, n, 0)); /* of the plane itself: checks zstd too */
        memcpy(ph + CK_PLANE_HEADER_LEN, payload, stored);
        out->len += CK_PLANE_HEADER_LEN + stored;
    }
    rc = 0;
out:
    ZSTD_freeCCtx(zc);
    free(z);
    free(plane);
    return rc;
}

#define ZSTD_MAX_RATIO 32768
#define CK_CHUNK       65536 /* words a decode joins at a time */

/* One plane being read: in place when stored raw, through its own zstd
 * stream otherwise. */
typedef struct PlaneIn {
    const uint8_t *payload;
    uint64_t stored, sum;
    ZSTD_DCtx *dz; /* NULL: stored raw */
    ZSTD_inBuffer src;
    uint8_t *buf; /* CK_CHUNK bytes: a compressed plane's next chunk */
    XXH64_state_t *h;
    int ended; /* the zstd frame has ended */
} PlaneIn;

/* The plane's bytes [at, at + m): NULL when its stream is corrupt or ends
 * before them. */
static const uint8_t *plane_next(PlaneIn *p, uint64_t at, size_t m) {
    if (p->dz == NULL) return p->payload + at;
    ZSTD_outBuffer o = {p->buf, m, 0};
    while (o.pos < m) {
        size_t in0 = p->src.pos, out0 = o.pos;
        size_t r = ZSTD_decompressStream(p->dz, &o, &p->src);
        if (ZSTD_isError(r) || (r == 0 && o.pos < m)) return NULL;
        p->ended = r == 0;
        if (p->src.pos == in0 && o.pos == out0) return NULL; /* its bytes ran out */
    }
    return p->buf;
}

/* Whether a plane's stream ended exactly at its last byte, with nothing
 * after it (a raw plane always has). */
static int plane_finished(PlaneIn *p) {
    if (p->dz == NULL) return 1;
    uint8_t extra;
    while (!p->ended) { /* the frame's end may follow the last output byte */
        ZSTD_outBuffer o = {&extra, 1, 0};
        size_t in0 = p->src.pos;
        size_t r = ZSTD_decompressStream(p->dz, &o, &p->src);
        if (ZSTD_isError(r) || o.pos != 0 || (r != 0 && p->src.pos == in0)) return 0;
        p->ended = r == 0;
    }
    return p->src.pos == p->src.size;
}

/* into: the caller's buffer of into_len bytes, or NULL for a new one */
static int decode(const uint8_t *b, size_t blob_len, const void *prev, size_t prev_len, void *into,
                  size_t into_len, void **out, size_t *len_out, char *err) {
    *out = NULL;
    if (blob_len < CK_HEADER_LEN) return err_set(err, "checkpoint blob is truncated");
    if (ld32(b) != CKPT_MAGIC) return err_set(err, "not a checkpoint blob (wrong magic)");
    if (ld16(b + 4) != CK_VERSION)
        return err_set(err, "checkpoint blob version %u is not supported", ld16(b + 4));
    if (ld64(b + 24) != XXH64(b, 24, 0)) return err_set(err, "checkpoint header checksum mismatch");
    int word = b[6];
    uint64_t len = ld64(b + 8);
    if ((word != 2 && word != 4) || len % (uint64_t)word || len > 4 * CODEC_MAX_ELEMENTS ||
        (b[7] & ~CK_FLAG_XOR))
        return err_set(err, "checkpoint header is inconsistent");
    int xor = b[7] & CK_FLAG_XOR;
    if (xor&&(prev == NULL || prev_len != len))
        return err_set(err, "checkpoint is a delta; give the previous checkpoint of %llu bytes",
                       (unsigned long long)len);
    uint64_t n = len / (uint64_t)word;
    /* check every plane header before allocating the output */
    size_t pos = CK_HEADER_LEN;
    for (int p = 0; p < word; p++) {
        if (blob_len - pos < CK_PLANE_HEADER_LEN) return err_set(err, "checkpoint blob truncated");
        const uint8_t *ph = b + pos;
        uint64_t stored = ld64(ph + 8);
        uint32_t flags = ld32(ph + 16);
        if (ld64(ph) != n || (flags & ~CK_PLANE_ZSTD) || (flags ? stored >= n : stored != n) ||
            blob_len - pos - CK_PLANE_HEADER_LEN < stored)
            return err_set(err, "checkpoint plane %d header is inconsistent", p);
        /* no zstd frame expands more than ZSTD_MAX_RATIO times (an RLE block
         * holds 128 KiB in 4 bytes): a plane that claims more than its bytes
         * can hold is refused before the output is allocated */
        if (flags && n / ZSTD_MAX_RATIO > stored)
            return err_set(err, "checkpoint plane %d claims %llu bytes from %llu", p,
                           (unsigned long long)n, (unsigned long long)stored);
        if (flags && ZSTD_getFrameContentSize(ph + CK_PLANE_HEADER_LEN, stored) != n)
            return err_set(err, "checkpoint plane %d: compressed size does not match", p);
        pos += CK_PLANE_HEADER_LEN + stored;
    }
    if (pos != blob_len) return err_set(err, "checkpoint blob has trailing bytes");
    if (into && into_len != len)
        return err_set(err, "checkpoint holds %llu bytes where %zu were expected",
                       (unsigned long long)len, into_len);
    assert(into == NULL || into != prev);
    /* the planes are read side by side, CK_CHUNK words at a time, and joined
     * into whole words in one pass (not one strided pass per plane) */
    uint8_t *dst = into ? into : malloc(len ? len : 1);
    PlaneIn in[4];
    memset(in, 0, sizeof in);
    int rc = dst ? 0 : err_set(err, "out of memory decoding a checkpoint");
    pos = CK_HEADER_LEN;
    for (int p = 0; p < word; p++) {
        const uint8_t *ph = b + pos;
        in[p].payload = ph + CK_PLANE_HEADER_LEN;
        in[p].stored = ld64(ph + 8);
        in[p].sum = ld64(ph + 24);
        in[p].h = XXH64_createState();
        if (in[p].h == NULL || XXH64_reset(in[p].h, 0) != XXH_OK) rc = -1;
        if (ld32(ph + 16)) {
            in[p].dz = ZSTD_createDCtx();
            in[p].buf = malloc(CK_CHUNK);
            in[p].src = (ZSTD_inBuffer){in[p].payload, in[p].stored, 0};
            if (in[p].dz == NULL || in[p].buf == NULL) rc = -1;
        }
        pos += CK_PLANE_HEADER_LEN + in[p].stored;
    }
    if (rc != 0 && dst) rc = err_set(err, "out of memory decoding a checkpoint");
    const uint8_t *old = prev;
    for (uint64_t i0 = 0; rc == 0 && i0 < n; i0 += CK_CHUNK) {
        size_t m = n - i0 < CK_CHUNK ? (size_t)(n - i0) : CK_CHUNK;
        const uint8_t *pl[4];
        for (int p = 0; rc == 0 && p < word; p++) {
            pl[p] = plane_next(&in[p], i0, m);
            if (pl[p] == NULL)
                rc = err_set(err, "checkpoint plane %d: corrupt compressed data", p);
            else
                XXH64_update(in[p].h, pl[p], m);
        }
        if (rc != 0) break;
        uint8_t *d = dst + i0 * (uint64_t)word;
        planes_join(pl, m, word, d);
        if (xor) {
            const uint8_t *o = old + i0 * (uint64_t)word;
            for (size_t i = 0; i < m * (size_t)word; i++) d[i] ^= o[i];
        }
    }
    for (int p = 0; rc == 0 && p < word; p++) {
        if (!plane_finished(&in[p]))
            rc = err_set(err, "checkpoint plane %d: corrupt compressed data", p);
        else if (XXH64_digest(in[p].h) != in[p].sum)
            rc = err_set(err, "checkpoint plane %d: checksum mismatch", p);
    }
    for (int p = 0; p < word; p++) {
        ZSTD_freeDCtx(in[p].dz);
        free(in[p].buf);
        XXH64_freeState(in[p].h);
    }
    if (rc != 0) {
        if (into == NULL) free(dst);
        return -1;
    }
    *out = dst;
    *len_out = len;
    return 0;
}

int ckpt_decode(const uint8_t *blob, size_t blob_len, const void *prev, size_t prev_len, void **out,
                size_t *len_out, char *err) {
    return decode(blob, blob_len, prev, prev_len, NULL, 0, out, len_out, err);
}

int ckpt_decode_into(const uint8_t *blob, size_t blob_len, const void *prev, size_t prev_len,
                     void *dst, size_t dst_len, char *err) {
    void *out;
    size_t len;
    return decode(blob, blob_len, prev, prev_len, dst, dst_len, &out, &len, err);
}
