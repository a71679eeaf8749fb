/*
 * fuzz_tokenizer.c — libFuzzer target for the BPE tokenizer's readers and
 * encoder (kernels/tokenizer.c): vocab.json and merges.txt come from
 * whoever hands a site its tokenizer. The input is vocab NUL merges NUL
 * text; when the files are accepted, the text is encoded and decoded, and
 * anything but the same bytes back (less the bytes the vocabulary has no
 * token for, which are dropped) aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *v = (const char *)data, *end = v + size;
    const char *z1 = memchr(v, 0, size);
    if (z1 == NULL) return 0;
    const char *m = z1 + 1, *z2 = memchr(m, 0, (size_t)(end - m));
    if (z2 == NULL) return 0;
    const char *text = z2 + 1;
    size_t tlen = (size_t)(end - text);
    char err[512];
    Tokenizer *t = tokenizer_parse(v, (size_t)(z1 - v), m, (size_t)(z2 - m), err);
    if (t == NULL) return 0;
    char *want = malloc(tlen + 1);
    size_t wlen = 0;
    for (size_t i = 0; i < tlen; i++)
        if (tokenizer_byte_token(t, (uint8_t)text[i]) >= 0) want[wlen++] = text[i];
    TokenBuf b = {0};
    if (tokenizer_encode(t, text, tlen, &b, err) == 0) {
        size_t at = 0;
        for (size_t k = 0; k < b.n; k++) {
            size_t bl;
            const uint8_t *bytes = tokenizer_decode(t, b.ids[k], &bl);
            if (bytes == NULL || at + bl > wlen || memcmp(want + at, bytes, bl) != 0) abort();
            at += bl;
        }
        if (at != wlen) abort();
    }
    free(want);
    token_buf_free(&b);
    tokenizer_free(t);
    return 0;
}
