/*
 * fuzz_tokenizer_json.c — libFuzzer target for the tokenizer.json and
 * tokenizer_config.json readers (tokenizer_parse_json and
 * tokenizer_parse_config in kernels/tokenizer.c): `strait tokenize
 * --tokenizer DIR` reads downloaded folders. The input is tokenizer.json,
 * then optionally NUL and tokenizer_config.json. An accepted tokenizer
 * encodes a fixed text to ids that decode back to it, byte for byte, when
 * it has a token for each of the text's bytes; normalizes any bytes (its
 * NFC, when it has one) without fault; and takes the config or refuses it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    const uint8_t *z = memchr(data, 0, size);
    size_t jlen = z ? (size_t)(z - data) : size;
    Tokenizer *t = tokenizer_parse_json((const char *)data, jlen, err);
    if (t == NULL) return 0;
    static const char text[] = "It's 12345 \xe4\xb8\xad\xe6\x96\x87 <|endoftext|>  \n\n\xff ok";
    int every_byte = 1;
    for (size_t i = 0; i < sizeof text - 1; i++)
        every_byte &= tokenizer_byte_token(t, (uint8_t)text[i]) >= 0;
    TokenBuf b = {0};
    if (tokenizer_encode(t, text, sizeof text - 1, &b, err) == 0 && every_byte) {
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
    if (z && tokenizer_parse_config(t, (const char *)z + 1, size - jlen - 1, err) == 0) {
        int ids[4];
        const char *tpl;
        tokenizer_special(t, &ids[0], &ids[1], &ids[2], &ids[3], &tpl);
        for (int k = 0; k < 4; k++) {
            size_t bl;
            if (ids[k] >= 0 && tokenizer_decode(t, ids[k], &bl) == NULL) abort();
        }
    }
    tokenizer_free(t);
    return 0;
}
