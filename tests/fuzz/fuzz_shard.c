/*
 * fuzz_shard.c — libFuzzer target for the token shard reader
 * (kernels/data.c): a site trains on .bin shards it was handed. The input
 * is written to a .bin file and loaded; an accepted shard's ids must all be
 * below the vocabulary the reader reports, or the model would read past
 * its embedding table.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[64];
    if (path[0] == '\0') snprintf(path, sizeof path, "/tmp/fuzz-shard-%d.bin", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (f == NULL) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    char err[512];
    TokenSet ts;
    const char *paths[1] = {path};
    if (tokens_load(&ts, paths, 1, err) != 0) return 0;
    for (size_t i = 0; i < ts.n; i++)
        if (ts.tokens[i] >= (uint32_t)ts.vocab) abort();
    tokens_free(&ts);
    return 0;
}
