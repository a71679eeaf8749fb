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

#define CK_CHUNK 65536 /* words split (encode) or joined (decode) at a time */

/* d = a ^ b over n bytes, eight at a time (d may be a) */
static void xor_bytes(uint8_t *d, const uint8_t *a, const uint8_t *b, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) st64(d + i, ld64(a + i) ^ ld64(b + i));
    for (; i < n; i++) d[i] = a[i] ^ b[i];
}

/* Words [i0, i0 + m) XORed with the previous checkpoint's (when given) into
 * tmp, then split into m-byte planes. */
static void chunk_planes(const uint8_t *src, const uint8_t *old, uint64_t i0, size_t m, int word,
                         uint8_t *tmp, uint8_t *planes) {
    const uint8_t *w = src + i0 * (uint64_t)word;
    if (old) {
        xor_bytes(tmp, w, old + i0 * (uint64_t)word, m * (size_t)word);
        w = tmp;
    }
    planes_split(w, m, word, planes);
}

/* One plane being written: its checksum, and its zstd stream while that
 * stays shorter than the plane (past that it is stored raw). */
typedef struct PlaneOut {
    XXH64_state_t *h;
    ZSTD_CCtx *zc;     /* NULL: stored raw */
    ZSTD_outBuffer zo; /* at most n - 1 bytes, in the plane's region of the output */
} PlaneOut;

static void plane_give_up(PlaneOut *p) { /* stored raw after all */
    ZSTD_freeCCtx(p->zc);
    p->zc = NULL;
}

/* Feeds the plane's next bytes (end: its last) to its stream; gives up on
 * zstd when the output would not be shorter than the plane. */
static void plane_feed(PlaneOut *p, const uint8_t *bytes, size_t m, int end) {
    if (p->zc == NULL) return;
    ZSTD_inBuffer in = {bytes, m, 0};
    for (;;) {
        size_t left = ZSTD_compressStream2(p->zc, &p->zo, &in, end ? ZSTD_e_end : ZSTD_e_continue);
        if (ZSTD_isError(left)) return plane_give_up(p);
        if (end ? left == 0 : in.pos == in.size) return;
        if (p->zo.pos == p->zo.size) return plane_give_up(p); /* not shorter */
    }
}

/* Sign and exponent apart from the mantissa: one pass over the words (and
 * the previous checkpoint) feeds every plane's checksum and zstd stream a
 * chunk at a time, each stream writing into the output where its plane
 * would lie stored raw; then the streams slide left into place, and a
 * second pass writes the planes stored raw, if any. The output's pages are
 * touched only where bytes land, and its tail is given back. */
int ckpt_encode(const void *words, size_t len, int word, const void *prev, int zstd_level,
                Blob *out, char *err) {
    if (word != 2 && word != 4) return err_set(err, "checkpoint word size %d; use 2 or 4", word);
    if (len % (size_t)word) return err_set(err, "checkpoint of %zu bytes is not whole words", len);
    if (zstd_level < 0 || zstd_level > 19) return err_set(err, "bad zstd level %d", zstd_level);
    size_t n = len / (size_t)word;
    const uint8_t *src = words, *old = prev;
    uint8_t *tmp = malloc((size_t)word * CK_CHUNK), *planes = malloc((size_t)word * CK_CHUNK);
    PlaneOut po[4];
    memset(po, 0, sizeof po);
    /* plane p's region: where it would lie were every plane stored raw */
    size_t region = CK_PLANE_HEADER_LEN + n, total = CK_HEADER_LEN + (size_t)word * region;
    out->len = 0;
    int rc = tmp && planes && blob_reserve(out, total, err) == 0 ? 0 : -1;
    for (int p = 0; rc == 0 && p < word; p++) {
        po[p].h = XXH64_createState();
        if (po[p].h == NULL || XXH64_reset(po[p].h, 0) != XXH_OK) rc = -1;
        if (zstd_level == 0 || n < 2) continue;
        po[p].zc = ZSTD_createCCtx();
        if (po[p].zc == NULL ||
            ZSTD_isError(ZSTD_CCtx_setParameter(po[p].zc, ZSTD_c_compressionLevel, zstd_level)) ||
            ZSTD_isError(ZSTD_CCtx_setPledgedSrcSize(po[p].zc, n)))
            rc = -1;
        uint8_t *at = out->data + CK_HEADER_LEN + (size_t)p * region + CK_PLANE_HEADER_LEN;
        po[p].zo = (ZSTD_outBuffer){at, n - 1, 0};
    }
    if (rc != 0) {
        err_set(err, "out of memory compressing a checkpoint");
        goto out;
    }
    for (uint64_t i0 = 0; i0 < n; i0 += CK_CHUNK) {
        size_t m = n - i0 < CK_CHUNK ? (size_t)(n - i0) : CK_CHUNK;
        chunk_planes(src, old, i0, m, word, tmp, planes);
        /* the planes' streams are independent: side by side on the cores */
#pragma omp parallel for schedule(dynamic, 1) if (zstd_level > 0)
        for (int p = 0; p < word; p++) {
            XXH64_update(po[p].h, planes + (size_t)p * m, m);
            plane_feed(&po[p], planes + (size_t)p * m, m, i0 + m == n);
        }
    }
    uint8_t *h = out->data;
    memset(h, 0, CK_HEADER_LEN);
    st32(h, CKPT_MAGIC);
    st16(h + 4, CK_VERSION);
    h[6] = (uint8_t)word;
    h[7] = old ? CK_FLAG_XOR : 0;
    st64(h + 8, len);
    st64(h + 24, XXH64(h, 24, 0));
    /* in plane order, each stream slides left to just after the plane
     * before it (never onto a later plane's region), then its header */
    size_t at[4], end = CK_HEADER_LEN;
    int raw = 0;
    for (int p = 0; p < word; p++) {
        at[p] = end + CK_PLANE_HEADER_LEN;
        size_t stored = po[p].zc ? po[p].zo.pos : n;
        assert(at[p] <= CK_HEADER_LEN + (size_t)p * region + CK_PLANE_HEADER_LEN);
        if (po[p].zc) memmove(out->data + at[p], po[p].zo.dst, stored);
        raw |= po[p].zc == NULL;
        uint8_t *ph = out->data + at[p] - CK_PLANE_HEADER_LEN;
        memset(ph, 0, CK_PLANE_HEADER_LEN);
        st64(ph, n);
        st64(ph + 8, stored);
        st32(ph + 16, po[p].zc ? CK_PLANE_ZSTD : 0);
        st64(ph + 24, XXH64_digest(po[p].h)); /* of the plane itself: checks zstd too */
        end = at[p] + stored;
    }
    for (uint64_t i0 = 0; raw && i0 < n; i0 += CK_CHUNK) {
        size_t m = n - i0 < CK_CHUNK ? (size_t)(n - i0) : CK_CHUNK;
        chunk_planes(src, old, i0, m, word, tmp, planes);
        for (int p = 0; p < word; p++)
            if (po[p].zc == NULL) memcpy(out->data + at[p] + i0, planes + (size_t)p * m, m);
    }
    out->len = end;
    uint8_t *fit = realloc(out->data, end); /* the regions' tails were touched */
    if (fit) out->data = fit, out->cap = end;
out:
    for (int p = 0; p < word; p++) {
        XXH64_freeState(po[p].h);
        ZSTD_freeCCtx(po[p].zc);
    }
    free(tmp);
    free(planes);
    return rc;
}

#define ZSTD_MAX_RATIO 32768

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
    int rc = dst ? 0 : err_set(err, "out of memory decoding a checkpoint"), compressed = 0;
    pos = CK_HEADER_LEN;
    for (int p = 0; p < word; p++) {
        const uint8_t *ph = b + pos;
        in[p].payload = ph + CK_PLANE_HEADER_LEN;
        in[p].stored = ld64(ph + 8);
        in[p].sum = ld64(ph + 24);
        in[p].h = XXH64_createState();
        if (in[p].h == NULL || XXH64_reset(in[p].h, 0) != XXH_OK) rc = -1;
        if (ld32(ph + 16)) {
            compressed++;
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
        /* the planes' streams are independent: side by side on the cores */
#pragma omp parallel for schedule(dynamic, 1) if (compressed > 1)
        for (int p = 0; p < word; p++) {
            pl[p] = plane_next(&in[p], i0, m);
            if (pl[p]) XXH64_update(in[p].h, pl[p], m);
        }
        for (int p = 0; rc == 0 && p < word; p++)
            if (pl[p] == NULL) rc = err_set(err, "checkpoint plane %d: corrupt compressed data", p);
        if (rc != 0) break;
        uint8_t *d = dst + i0 * (uint64_t)word;
        planes_join(pl, m, word, d);
        if (xor) xor_bytes(d, d, old + i0 * (uint64_t)word, m * (size_t)word);
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
