/*
 * fuzz_state.c — libFuzzer target for the other decoders of bytes that come
 * from disk or a peer: the checkpoint codec (byte planes, zstd, XOR delta)
 * and the error-feedback state. The first byte picks the decoder.
 */
#include <stdint.h>
#include <stdlib.h>

#include "compress/compress.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char err[512];
    const uint8_t *b = data + 1;
    size_t len = size - 1;
    if (data[0] & 1) {
        ErrorFeedback ef;
        if (ef_deserialize(&ef, b, len, err) == 0) ef_free(&ef);
        return 0;
    }
    /* a previous checkpoint of every plausible length, for XOR deltas */
    static uint8_t prev[1 << 16];
    void *out = NULL;
    size_t out_len;
    size_t prev_len = (size_t)(data[0] >> 1) * 512;
    if (ckpt_decode(b, len, prev, prev_len, &out, &out_len, err) == 0) free(out);
    return 0;
}
