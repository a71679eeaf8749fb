/*
 * fuzz_hf.c — libFuzzer target for the Hugging Face GPT-2 reader
 * (model_import_hf in kernels/formats.c): `strait train --init-from` and
 * `strait init --init-from` read folders from the internet. The input is
 * config.json NUL model.safetensors, written to a folder and imported; the
 * table is built without ops (kernels/model.c), so no BLAS is needed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void put(const char *dir, const char *name, const uint8_t *p, size_t n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL) return;
    fwrite(p, 1, n, f);
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char dir[64];
    if (dir[0] == '\0') {
        snprintf(dir, sizeof dir, "/tmp/fuzz-hf-%d", (int)getpid());
        mkdir(dir, 0700);
    }
    const uint8_t *z = memchr(data, 0, size);
    if (z == NULL) return 0;
    put(dir, "config.json", data, (size_t)(z - data));
    put(dir, "model.safetensors", z + 1, size - (size_t)(z - data) - 1);
    char err[512];
    Model m;
    if (model_import_hf(&m, dir, err) == 0) model_free(&m);
    return 0;
}
