/*
 * test_compress_cuda.c — the GPU codecs against the CPU ones on random
 * inputs: a GPU site must send byte-identical blobs and keep the same
 * error-feedback residual, and GPU decode-accumulate must give the same
 * floats. Skipped (reported as
 * skipped) where the build has no CUDA or the machine no GPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "compress/compress.h"
#include "kernels/device.h"
#include "kernels/cuda.h"
#include "util/util.h"

#ifdef STRAIT_HAVE_CUDA
static void skip_without_gpu(void) {
    char why[256];
    if (kernels_gpu_count(NULL, 0, why, sizeof why) == 0) cr_skip_test("no GPU here (%s)", why);
}

static float *random_update(uint64_t n, int heavy, unsigned seed) {
    float *x = malloc(n * 4);
    srand(seed);
    for (uint64_t i = 0; i < n; i++) {
        double u1 = (rand() + 1.0) / (RAND_MAX + 2.0), u2 = (rand() + 1.0) / (RAND_MAX + 2.0);
        double g = sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
        x[i] = (float)(heavy ? g / (0.05 + u2 * u2) : g) * 0.01f;
    }
    return x;
}
#endif

Test(codec_cuda, gpu_blobs_are_byte_identical_to_cpu_blobs, .timeout = 300) {
#ifndef STRAIT_HAVE_CUDA
    cr_skip_test("built without CUDA");
#else
    skip_without_gpu();
    uint64_t n = 3 * CODEC_SECTION_MAX + 4097;
    uint64_t sizes[] = {768 * 768, 50257, n - 768 * 768 - 50257};
    CodecLayout L = {0xfeed, n, sizes, 3};
    const char *codecs[] = {"fp32", "fp16", "bf16", "int8", "topk", "topk2"};
    for (int heavy = 0; heavy < 2; heavy++) {
        float *x = random_update(n, heavy, 7 + heavy);
        float *d_x = kernels_cuda_alloc(n * 4);
        kernels_cuda_to_device(d_x, x, n * 4);
        for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
            CodecParams p;
            codec_params_parse(codecs[c], &p, NULL);
            Blob cpu = {0}, gpu = {0};
            char err[ERR_LEN];
            cr_assert_eq(codec_encode(&p, &L, x, &cpu, err), 0, "%s", err);
            cr_assert_eq(codec_encode_cuda(&p, &L, d_x, &gpu, err), 0, "%s", err);
            cr_assert_eq(cpu.len, gpu.len, "%s: CPU blob %zu bytes, GPU %zu", codecs[c], cpu.len,
                         gpu.len);
            size_t first = 0;
            while (first < cpu.len && cpu.data[first] == gpu.data[first]) first++;
            cr_assert_eq(first, cpu.len, "%s (%s input): blobs differ from byte %zu", codecs[c],
                         heavy ? "heavy" : "Gaussian", first);
            blob_free(&cpu);
            blob_free(&gpu);
        }
        kernels_cuda_free(d_x);
        free(x);
    }
#endif
}

Test(codec_cuda, gpu_decode_accumulate_equals_cpu, .timeout = 120) {
#ifndef STRAIT_HAVE_CUDA
    cr_skip_test("built without CUDA");
#else
    skip_without_gpu();
    uint64_t n = 2 * CODEC_SECTION_MAX + 99;
    float *x = random_update(n, 1, 11), *sum = malloc(n * 4), *back = malloc(n * 4);
    CodecLayout L = {1, n, NULL, 0};
    float *d_sum = kernels_cuda_alloc(n * 4);
    const char *codecs[] = {"fp32", "fp16", "bf16", "int8", "topk", "topk2"};
    for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
        CodecParams p;
        codec_params_parse(codecs[c], &p, NULL);
        for (uint64_t i = 0; i < n; i++) sum[i] = 0.25f + (float)(i % 13) * 0.01f;
        Blob b = {0};
        char err[ERR_LEN];
        cr_assert_eq(codec_encode(&p, &L, x, &b, err), 0, "%s", err);
        kernels_cuda_to_device(d_sum, sum, n * 4);
        cr_assert_eq(codec_decode_accumulate_cuda(b.data, b.len, 0.7f, d_sum, n, err), 0, "%s: %s",
                     codecs[c], err);
        cr_assert_eq(codec_decode_accumulate(b.data, b.len, 0.7f, sum, n, err), 0, "%s", err);
        kernels_cuda_to_host(back, d_sum, n * 4);
        cr_assert_eq(memcmp(back, sum, n * 4), 0, "%s: GPU and CPU sums differ", codecs[c]);
        blob_free(&b);
    }
    kernels_cuda_free(d_sum);
    free(x), free(sum), free(back);
#endif
}

/* A GPU site's round: Δ = base - local and error feedback on the device
 * send the blobs a CPU site sends and keep the same residual, round after
 * round (the residual carries from one to the next), for every codec. */
Test(codec_cuda, gpu_error_feedback_equals_cpu_over_rounds, .timeout = 300) {
#ifndef STRAIT_HAVE_CUDA
    cr_skip_test("built without CUDA");
#else
    skip_without_gpu();
    uint64_t n = CODEC_SECTION_MAX + 5003;
    uint64_t sizes[] = {50257, n - 50257};
    CodecLayout L = {0xfeed, n, sizes, 2};
    float *base = random_update(n, 0, 21);
    float *local = malloc(n * 4);
    float *d_base = kernels_cuda_alloc(n * 4), *d_local = kernels_cuda_alloc(n * 4);
    kernels_cuda_to_device(d_base, base, n * 4);
    const char *codecs[] = {"fp32", "fp16", "bf16", "int8", "topk", "topk2"};
    for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
        CodecParams p;
        codec_params_parse(codecs[c], &p, NULL);
        ErrorFeedback cpu, gpu;
        char err[ERR_LEN];
        cr_assert_eq(ef_init(&cpu, n, 0xfeed, 0.9f, err), 0, "%s", err);
        cr_assert_eq(ef_init(&gpu, n, 0xfeed, 0.9f, err), 0, "%s", err);
        for (int round = 0; round < 3; round++) {
            float *step = random_update(n, round == 1, 100 + (unsigned)round);
            for (uint64_t i = 0; i < n; i++) local[i] = base[i] - step[i] * 0.1f;
            free(step);
            kernels_cuda_to_device(d_local, local, n * 4);
            Blob bc = {0}, bg = {0};
            cr_assert_eq(ef_encode(&cpu, &p, &L, base, local, NULL, &bc, err), 0, "%s", err);
            cr_assert_eq(ef_encode_cuda(&gpu, &p, &L, d_base, d_local, &bg, err), 0, "%s", err);
            cr_assert(bc.len == bg.len && memcmp(bc.data, bg.data, bc.len) == 0,
                      "%s, round %d: the GPU's blob differs from the CPU's", codecs[c], round);
            ef_to_host(&gpu);
            cr_assert_eq(memcmp(cpu.e, gpu.e, n * 4), 0,
                         "%s, round %d: the GPU's residual differs from the CPU's", codecs[c],
                         round);
            blob_free(&bc), blob_free(&bg);
        }
        ef_free(&cpu), ef_free(&gpu);
    }
    kernels_cuda_free(d_base), kernels_cuda_free(d_local);
    free(base), free(local);
#endif
}
