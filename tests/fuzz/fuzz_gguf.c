/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader (kernels/gguf.c: the
 * header, the metadata, the tensor infos), the dequantizers
 * (kernels/gguf_quant.c) and the model import (kernels/gguf_model.c):
 * `--init-from FILE.gguf` reads files from the internet. The input is
 * parsed in memory; every tensor of a decoded type is dequantized, the
 * tokenizer lists taken, and the bytes imported as a model from a file.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    Gguf *g = gguf_parse(data, size, "fuzz", err);
    if (g == NULL) return 0;
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const GgufTensor *t = gguf_tensor_at(g, i);
        if (!gguf_type_decodes(t->type) || t->n_elems > (1u << 20)) continue;
        float *out = malloc(sizeof(float) * (size_t)t->n_elems);
        if (out) gguf_dequantize(t->type, t->data, (size_t)t->n_elems, out, err);
        free(out);
    }
    TokenizerLists tl;
    if (gguf_tokenizer_lists(g, &tl, err) == 0) tokenizer_lists_free(&tl);
    gguf_close(g);
    static char path[64];
    if (path[0] == '\0') snprintf(path, sizeof path, "/tmp/fuzz-gguf-%d.gguf", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (f == NULL) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    Model m;
    if (model_import_gguf(&m, path, err) == 0) model_free(&m);
    return 0;
}
