/*
 * fuzz_blob.c — libFuzzer target for the update blob decoder, the bytes a
 * coordinator takes from every site: inspect, and when inspection passes,
 * decode-accumulate and decode. Any crash, out-of-bounds access, leak or
 * undefined behaviour is a finding (ASan and UBSan are on).
 */
#include <stdint.h>
#include <stdlib.h>

#include "compress/compress.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    BlobInfo info;
    if (codec_blob_inspect(data, size, 0, 0, &info, err) != 0) return 0;
    if (info.n > (1u << 22)) return 0; /* valid but too large to decode here */
    float *sum = calloc(info.n ? info.n : 1, sizeof(float));
    if (sum == NULL) return 0;
    if (codec_decode_accumulate(data, size, 0.5f, sum, info.n, err) != 0) abort();
    if (codec_decode(data, size, sum, info.n, err) != 0) abort(); /* inspected: must decode */
    free(sum);
    return 0;
}
