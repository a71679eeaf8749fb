/*
 * fuzz_hf_index.c — libFuzzer target for the sharded-checkpoint index
 * reader (hf_index_parse in kernels/hf.c): model.safetensors.index.json
 * comes with a downloaded folder. An accepted index names only plain
 * *.safetensors files of the folder, each once.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    HfIndex ix;
    char err[512];
    if (hf_index_parse((const char *)data, size, &ix, err) != 0) return 0;
    for (int i = 0; i < ix.n_files; i++) {
        if (strchr(ix.files[i], '/') || ix.files[i][0] == '.') abort();
        for (int j = 0; j < i; j++)
            if (strcmp(ix.files[i], ix.files[j]) == 0) abort();
    }
    hf_index_free(&ix);
    return 0;
}
