/*
 * fuzz_tokenizer_lists.c — libFuzzer target for tokenizer_from_lists
 * (kernels/tokenizer.c): GGUF's tokenizer.ggml.* lists come from whoever
 * made the file. The input is pre NUL missing NUL tokens NUL merges NUL
 * text: the vocabulary is the 256 byte tokens in GPT-2's alphabet less the
 * bytes listed in missing, then the tokens, one a line (a first byte 1..9
 * is the line's GGUF type, else normal); merges one a line. When the
 * lists are accepted, the text's ids decode to the text less the bytes
 * without a token, and the tokenizer's own lists (tokenizer_to_lists) give
 * a tokenizer with the same ids; anything else aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* s[0..n) split at c into NUL-terminated copies appended to out */
static int split_lines(const char *s, size_t n, char **out, int32_t *types, int max) {
    int k = 0;
    for (size_t i = 0; i <= n && k < max;) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t len = nl ? (size_t)(nl - (s + i)) : n - i;
        int type = len > 0 && s[i] >= 1 && s[i] <= 9 ? s[i] : 1;
        size_t skip = type != 1 || (len > 0 && s[i] == 1) ? 1 : 0;
        out[k] = strndup(s + i + skip, len - skip);
        if (types) types[k] = type;
        k++;
        i += len + 1;
    }
    return k;
}

static int encode(Tokenizer *t, const char *text, size_t n, TokenBuf *b) {
    char err[512];
    return tokenizer_encode(t, text, n, b, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *part[5], *p = (const char *)data, *end = p + size;
    size_t len[5];
    for (int k = 0; k < 5; k++) {
        const char *z = k < 4 ? memchr(p, 0, (size_t)(end - p)) : end;
        if (z == NULL) return 0;
        part[k] = p, len[k] = (size_t)(z - p);
        p = z < end ? z + 1 : end;
    }
    enum { MAX = 4096 };
    char **tokens = calloc(256 + MAX, sizeof *tokens), **merges = calloc(MAX, sizeof *merges);
    int32_t *types = calloc(256 + MAX, sizeof *types);
    int n = 0, shift = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)shift++;
        if (memchr(part[1], b, len[1])) continue;
        char u[3] = {0};
        if (cp < 0x80)
            u[0] = (char)cp;
        else
            u[0] = (char)(0xc0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3f));
        tokens[n] = strdup(u), types[n++] = 1;
    }
    if (len[2] > 0) n += split_lines(part[2], len[2], tokens + n, types + n, MAX);
    int n_merges = len[3] > 0 ? split_lines(part[3], len[3], merges, NULL, MAX) : 0;
    char *pre = strndup(part[0], len[0]);
    TokenizerLists l = {tokens, n, types, merges, n_merges, pre, -1, -1, -1, -1, NULL};
    char err[512];
    Tokenizer *t = tokenizer_from_lists(&l, err);
    if (t != NULL) {
        const char *text = part[4];
        size_t tlen = len[4], wlen = 0, at = 0;
        char *want = malloc(tlen + 1);
        for (size_t i = 0; i < tlen; i++)
            if (tokenizer_byte_token(t, (uint8_t)text[i]) >= 0) want[wlen++] = text[i];
        TokenBuf b = {0}, b2 = {0};
        if (encode(t, text, tlen, &b) == 0) {
            for (size_t k = 0; k < b.n; k++) {
                size_t bl;
                const uint8_t *bytes = tokenizer_decode(t, (int)b.ids[k], &bl);
                if (bytes == NULL || at + bl > wlen || memcmp(want + at, bytes, bl) != 0) abort();
                at += bl;
            }
            if (at != wlen) abort();
        }
        TokenizerLists back;
        if (tokenizer_to_lists(t, &back, err) != 0) abort(); /* what came as lists goes as lists */
        Tokenizer *t2 = tokenizer_from_lists(&back, err);
        if (t2 == NULL) {
            fprintf(stderr, "%s\n", err);
            abort();
        }
        if (encode(t2, text, tlen, &b2) == 0 &&
            (b2.n != b.n || (b.n > 0 && memcmp(b2.ids, b.ids, b.n * sizeof *b.ids) != 0)))
            abort();
        tokenizer_free(t2);
        tokenizer_lists_free(&back);
        token_buf_free(&b), token_buf_free(&b2);
        free(want);
        tokenizer_free(t);
    }
    for (int i = 0; i < n; i++) free(tokens[i]);
    for (int i = 0; i < n_merges; i++) free(merges[i]);
    free(tokens), free(merges), free(types), free(pre);
    return 0;
}
