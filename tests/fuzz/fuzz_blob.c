/*
 * fuzz_blob.c — libFuzzer target for the update blob decoder, the bytes a
 * coordinator takes from every site: inspect, and when inspection passes,
 * decode-accumulate and decode; and the one-pass inspect-and-decode a site
 * runs on the coordinator's update, held to inspection's verdict; and the
 * coordinator's one-pass check-and-add, held to the same verdict and to
 * decode-accumulate's floats. Any crash, out-of-bounds access,
 * leak or undefined behaviour is a finding (ASan and UBSan are on).
 *
 * Each input runs twice: as it is, and with its checksums recomputed (a
 * hostile site computes them too), so that mutations reach the payload
 * decoders — zstd frames, byte planes, int8 tables, top-k indices — rather
 * than stopping at a checksum mismatch.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "compress/compress.h"
#include "compress/compress_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void run(const uint8_t *data, size_t size) {
    char err[512], err2[512];
    BlobInfo info;
    int rc = codec_blob_inspect(data, size, 0, 0, &info, err);
    /* the one-pass decoder (a site's, of the coordinator's update) refuses
     * what inspection refuses, with the same reason, and decodes the rest */
    uint64_t n = size >= BLOB_HEADER_LEN ? ld64(data + 16) : 0;
    float *once = n > 0 && n <= (1u << 22) ? malloc(n * sizeof(float)) : NULL;
    if (once && (codec_inspect_decode(data, size, 0, n, once, NULL, err2) != rc ||
                 (rc != 0 && strcmp(err, err2) != 0)))
        abort();
    float *staged = once ? malloc(n * sizeof(float)) : NULL;
    if (staged &&
        codec_blob_check_add(data, size, 0, n, 0.5f, NULL, staged, NULL, NULL, err2) != rc)
        abort();
    if (rc != 0 || info.n > (1u << 22)) { /* refused, or valid but too large to decode here */
        free(once), free(staged);
        return;
    }
    float *sum = calloc(info.n ? info.n : 1, sizeof(float));
    if (sum == NULL) {
        free(once), free(staged);
        return;
    }
    if (codec_decode_accumulate(data, size, 0.5f, sum, info.n, err) != 0) abort();
    if (staged && memcmp(staged, sum, info.n * sizeof(float)) != 0) abort(); /* 0 + 0.5 v alike */
    if (codec_decode(data, size, sum, info.n, err) != 0) abort(); /* inspected: must decode */
    if (once && memcmp(once, sum, info.n * sizeof(float)) != 0) abort();
    free(sum), free(once), free(staged);
}

/* The header's and every section's checksum made right for their bytes,
 * walking the sections as far as their lengths stay inside the input. */
static void reseal(uint8_t *b, size_t len) {
    if (len < BLOB_HEADER_LEN) return;
    st64(b + 40, XXH64(b, 40, 0));
    uint32_t n_sec = ld32(b + 24);
    size_t pos = BLOB_HEADER_LEN;
    for (uint32_t i = 0; i < n_sec && len - pos >= SECTION_HEADER_LEN; i++) {
        uint8_t *h = b + pos;
        uint32_t stored = ld32(h + 16);
        if (len - pos - SECTION_HEADER_LEN < stored) break;
        st64(h + 24, XXH64(h + SECTION_HEADER_LEN, stored, XXH64(h, 24, 0)));
        pos += SECTION_HEADER_LEN + stored;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    run(data, size);
    uint8_t *copy = malloc(size ? size : 1);
    if (copy == NULL) return 0;
    memcpy(copy, data, size);
    reseal(copy, size);
    run(copy, size);
    free(copy);
    return 0;
}
