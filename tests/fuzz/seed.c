/*
 * seed.c — writes a seed corpus for the fuzz targets: valid update blobs of
 * every codec (with and without zstd, several tensor layouts), checkpoint
 * blobs (plain and XOR delta) and error-feedback states, so the fuzzer
 * starts deep inside the decoders instead of at the magic number.
 *
 * and safetensors checkpoints and states of fuzz_safetensors' small table.
 *
 *   seed BLOB_DIR STATE_DIR JOIN_DIR SAFETENSORS_DIR
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "kernels/kernels.h"
#include "security/security.h"

static void put(const char *dir, const char *name, const uint8_t *prefix, size_t plen,
                const uint8_t *data, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    fwrite(prefix, 1, plen, f);
    fwrite(data, 1, len, f);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: seed BLOB_DIR STATE_DIR JOIN_DIR SAFETENSORS_DIR\n");
        return 2;
    }
    enum { N = 3000 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)sin(i * 0.37) * (i % 17 ? 0.01f : 0.5f);
    const char *codecs[] = {"fp32", "fp16", "bf16", "int8", "topk", "topk2"};
    uint64_t sizes[] = {1000, 24, N - 1024};
    char err[512], name[64];
    for (int c = 0; c < 6; c++)
        for (int z = 0; z < 2; z++) {
            CodecParams p;
            codec_params_parse(codecs[c], &p, err);
            p.zstd_level = z;
            if (p.id == CODEC_INT8) p.block = 512;
            if (p.id == CODEC_TOPK) p.chunk = 700, p.density = 0.05;
            CodecLayout L = {42, N, z ? sizes : NULL, z ? 3 : 0};
            Blob b = {0};
            if (codec_encode(&p, &L, x, &b, err) != 0) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            snprintf(name, sizeof name, "%s-z%d", codecs[c], z);
            put(argv[1], name, NULL, 0, b.data, b.len);
            blob_free(&b);
        }
    Blob ck = {0};
    float prev[1024];
    for (int i = 0; i < 1024; i++) prev[i] = x[i] * 0.99f;
    uint8_t sel = 0; /* even first byte: checkpoint; prev_len = (byte >> 1) * 512 */
    ckpt_encode(x, 4096, 4, NULL, 1, &ck, err);
    put(argv[2], "ckpt", &sel, 1, ck.data, ck.len);
    sel = 16; /* 8 * 512 = 4096 bytes of prev */
    ckpt_encode(x, 4096, 4, prev, 1, &ck, err);
    put(argv[2], "ckpt-xor", &sel, 1, ck.data, ck.len);
    blob_free(&ck);
    ErrorFeedback ef;
    ef_init(&ef, 100, 42, 0.9f, err);
    for (int i = 0; i < 100; i++) ef.e[i] = x[i];
    Blob s = {0};
    ef_serialize(&ef, &s, err);
    sel = 1;
    put(argv[2], "ef", &sel, 1, s.data, s.len);
    blob_free(&s);
    ef_free(&ef);
    /* fuzz_safetensors' table: wte [4, 3] and ln_f.bias [3] */
    ParamView views[2] = {{"wte", 2, {4, 3}, 0, 12}, {"ln_f.bias", 1, {3, 0}, 12, 3}};
    GPT m;
    memset(&m, 0, sizeof m);
    m.cfg = (GPTConfig){.name = "fuzz", .L = 1, .C = 3, .NH = 1, .T = 4, .V = 4, .Vp = 4};
    m.views = views, m.n_views = 2, m.n_params = 15, m.table_hash = 0x1234, m.params = x;
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", argv[4]);
    const float *bases[1] = {x + 100};
    const char *prefixes[1] = {"outer_b."};
    if (gpt_save(&m, path, 3, err) != 0) fprintf(stderr, "%s\n", err);
    snprintf(path, sizeof path, "%s/state.safetensors", argv[4]);
    if (gpt_save_state(&m, path, bases, prefixes, 1, 3, err) != 0) fprintf(stderr, "%s\n", err);
    char *csr, *key;
    if (security_csr_create("seed-site", &csr, &key, err) == 0) {
        put(argv[3], "csr", NULL, 0, (const uint8_t *)csr, strlen(csr));
        free(csr), free(key);
    }
    return 0;
}
