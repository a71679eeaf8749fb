/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors reader
 * (kernels/safetensors.c): a site loads the checkpoints the coordinator
 * sends, and anyone loads checkpoints from disk. The input is written to a
 * file and read three ways: its model config (model_read_config), its
 * parameters into a small model table (model_load), and per-parameter state
 * under a prefix (model_load_state). The table is built here by hand (two
 * tensors, no ops), so the target needs no BLAS.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/model.h"
#include "kernels/formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[64];
    if (path[0] == '\0') snprintf(path, sizeof path, "/tmp/fuzz-safetensors-%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (f == NULL) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    char err[512];
    ModelConfig cfg;
    int step;
    model_read_config(path, &cfg, &step, err);
    /* wte [4, 3] and ln_f.bias [3], as a real table names them */
    static ParamView views[2] = {{"wte", 2, {4, 3}, 0, 12}, {"ln_f.bias", 1, {3, 0}, 12, 3}};
    static float params[15], state[15];
    Model m;
    memset(&m, 0, sizeof m);
    m.views = views;
    m.n_views = 2;
    m.n_params = 15;
    m.table_hash = 0x1234;
    m.params = params;
    model_load(&m, path, &step, err);
    float *dsts[1] = {state};
    const char *prefixes[1] = {"outer_b."};
    model_load_state(&m, path, dsts, prefixes, 1, err);
    return 0;
}
