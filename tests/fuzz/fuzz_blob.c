/*
 * fuzz_blob.c — libFuzzer target for the update blob decoder, the bytes a
 * coordinator takes from every site: inspect, and when inspection passes,
 * decode-accumulate and decode. Any crash, out-of-bounds access, leak or
 * undefined behaviour is a finding (ASan and UBSan are on).
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
    char err[512];
    BlobInfo info;
    if (codec_blob_inspect(data, size, 0, 0, &info, err) != 0) return;
    if (info.n > (1u << 22)) return; /* valid but too large to decode here */
    float *sum = calloc(info.n ? info.n : 1, sizeof(float));
    if (sum == NULL) return;
    if (codec_decode_accumulate(data, size, 0.5f, sum, info.n, err) != 0) abort();
    if (codec_decode(data, size, sum, info.n, err) != 0) abort(); /* inspected: must decode */
    free(sum);
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
