/*
 * fuzz_tokenizer_json.c — libFuzzer target for the tokenizer.json reader
 * (tokenizer_parse_json in kernels/tokenizer.c): `strait tokenize
 * --tokenizer DIR` reads downloaded folders. An accepted tokenizer encodes
 * a fixed text to ids that decode back to it, byte for byte, and
 * normalizes any bytes (its NFC, when it has one) without fault.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    Tokenizer *t = tokenizer_parse_json((const char *)data, size, err);
    if (t == NULL) return 0;
    static const char text[] = "It's 12345 \xe4\xb8\xad\xe6\x96\x87 <|endoftext|>  \n\n\xff ok";
    TokenBuf b = {0};
    if (tokenizer_encode(t, text, sizeof text - 1, &b, err) == 0) {
        size_t at = 0;
        for (size_t k = 0; k < b.n; k++) {
            size_t bl;
            const uint8_t *bytes = tokenizer_decode(t, (int)b.ids[k], &bl);
            if (bytes == NULL || at + bl > sizeof text - 1 || memcmp(text + at, bytes, bl) != 0)
                abort();
            at += bl;
        }
        if (at != sizeof text - 1) abort();
    }
    token_buf_free(&b);
    /* the normalizer over the input's own bytes, valid UTF-8 or not */
    char *norm;
    size_t nlen;
    if (tokenizer_normalize(t, (const char *)data, size, &norm, &nlen, err) == 0) free(norm);
    tokenizer_free(t);
    return 0;
}
