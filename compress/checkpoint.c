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

int ckpt_decode(const uint8_t *b, size_t blob_len, const void *prev, size_t prev_len, void **out,
                size_t *len_out, char *err) {
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
    uint8_t *dst = malloc(len ? len : 1), *plane = malloc(n ? n : 1);
    ZSTD_DCtx *dz = ZSTD_createDCtx();
    if (dst == NULL || plane == NULL || dz == NULL) {
        free(dst);
        free(plane);
        ZSTD_freeDCtx(dz);
        return err_set(err, "out of memory decoding a checkpoint");
    }
    const uint8_t *old = prev;
    pos = CK_HEADER_LEN;
    for (int p = 0; p < word; p++) {
        const uint8_t *ph = b + pos, *payload = ph + CK_PLANE_HEADER_LEN;
        uint64_t stored = ld64(ph + 8);
        if (ld32(ph + 16)) {
            size_t got = ZSTD_decompressDCtx(dz, plane, n, payload, stored);
            if (ZSTD_isError(got) || got != n) {
                free(dst);
                free(plane);
                ZSTD_freeDCtx(dz);
                return err_set(err, "checkpoint plane %d: corrupt compressed data", p);
            }
        } else {
            memcpy(plane, payload, n);
        }
        if (ld64(ph + 24) != XXH64(plane, n, 0)) {
            free(dst);
            free(plane);
            ZSTD_freeDCtx(dz);
            return err_set(err, "checkpoint plane %d: checksum mismatch", p);
        }
        for (uint64_t i = 0; i < n; i++) {
            uint8_t v = plane[i];
            dst[i * (uint64_t)word + (uint64_t)p] =
                xor? v ^ old[i * (uint64_t)word + (uint64_t)p] : v;
        }
        pos += CK_PLANE_HEADER_LEN + stored;
    }
    free(plane);
    ZSTD_freeDCtx(dz);
    *out = dst;
    *len_out = len;
    return 0;
}
