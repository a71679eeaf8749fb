/*
 * gpu.c — the GPU figures, for a machine with one (`make bench-gpu`): the
 * codec kernels' throughput (codec_encode_cuda, the site's path: kernels,
 * the compressed bytes to the host, zstd and checksums there) in GB/s of
 * fp32 input beside the device's own memcpy (device to device) in the same
 * run, whether each blob is byte for byte the CPU's, and training tokens/s
 * of GPT-2 124M with 1 GPU and with every GPU (NCCL), the scaling beside;
 * and a GPU site's end of round (Δ, error feedback, encode) on the host
 * against on the device, same blobs checked; and GPT-2 124M on one GPU
 * with TF32 at B 4, 16 and 64 (T 1024) at each --recompute level, with
 * what the trainer holds on the GPU after the steps (a row whose training
 * state would not fit 90% of the free memory is reported, not run).
 * Without a GPU (or without a CUDA build) it prints one line saying why and
 * exits 0, so `make bench` runs everywhere.
 *
 *   build/bench/gpu [--full]     64 Mi values (256 Mi with --full)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "compress/compress.h"
#include "kernels/cuda.h"
#include "kernels/device.h"
#include "kernels/model.h"
#include "kernels/train.h"
#include "util/util.h"

#define REPEAT 3

static void emit_none(const char *why) {
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("gpu"));
    json_object_set_new(o, "case", json_string("no_device"));
    json_object_set_new(o, "reason", json_string(why));
    json_emit_line(stdout, o);
}

#ifdef STRAIT_HAVE_CUDA
static double median3(double a, double b, double c) {
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

/* matmul: 0 fp32, 1 TF32, 2 bf16 products with fp32 sums (--precision
 * bf16); recompute: Model's; *trainer_gb (may be NULL): what GPU 0 holds
 * after the steps beyond what it held before the trainer (NAN: CUDA could
 * not say) */
static double tokens_per_s(int gpus, int B, int T, int steps, int matmul, int recompute,
                           double *trainer_gb) {
    ModelConfig cfg;
    model_config_preset("gpt2-124m", &cfg);
    Model m;
    char err[ERR_LEN];
    if (model_build(&m, &cfg, 1, err) != 0) DIE("%s", err);
    m.precision_bf16 = matmul == 2;
    m.recompute = recompute;
    size_t bt = (size_t)B * T * (size_t)gpus;
    int *in = mallocCheck(sizeof(int) * bt), *tg = mallocCheck(sizeof(int) * bt);
    for (size_t i = 0; i < bt; i++)
        in[i] = (int)((i * 31) % 50257), tg[i] = (int)((i * 17 + 1) % 50257);
    TrainConfig c = train_defaults(3e-4f, steps + 2);
    c.tf32 = matmul >= 1; /* bf16: the products outside the table on TF32, as strait train */
    size_t before = 0, after = 0, total = 0;
    int known = kernels_cuda_mem(0, &before, &total) == 0;
    Trainer *t = trainer_create(&m, &c, gpus, B, T, err);
    if (t == NULL) DIE("%s", err);
    uint64_t t0 = 0;
    for (int s = 0; s < steps + 2; s++) {
        if (s == 2) t0 = time_monotonic_ns(); /* two warm-up steps */
        trainer_step(t, in, tg, 3e-4f, NULL);
    }
    double secs = (double)(time_monotonic_ns() - t0) / 1e9;
    known = known && kernels_cuda_mem(0, &after, &total) == 0;
    if (trainer_gb) *trainer_gb = known ? ((double)after - (double)before) / 1e9 : NAN;
    trainer_free(t);
    model_free(&m);
    free(in), free(tg);
    return (double)bt * steps / secs;
}

/* A GPU site's end of round with codec `name`: θ_local to the host, Δ and
 * error feedback there (the path a site takes with several ranks), against
 * Δ and error feedback on the device with only the payloads and the
 * residual (for the state) coming to the host. Both start from a zero
 * residual; their blobs must be the same bytes. */
static void site_round_row(const char *dev, const char *name, uint64_t n, const float *base,
                           const float *d_base) {
    char err[ERR_LEN];
    CodecParams p;
    if (codec_params_parse(name, &p, err) != 0) DIE("%s", err);
    CodecLayout L = {0x1234, n, NULL, 0};
    float *local = mallocCheck(n * 4);
    for (uint64_t i = 0; i < n; i++) local[i] = base[i] * 0.5f + 1e-3f;
    float *d_local = kernels_cuda_alloc(n * 4);
    kernels_cuda_to_device(d_local, local, n * 4);
    double host_s[REPEAT], dev_s[REPEAT];
    int same = 1;
    for (int r = 0; r < REPEAT; r++) {
        ErrorFeedback eh, ed;
        if (ef_init(&eh, n, 0x1234, 1.0f, err) != 0 || ef_init(&ed, n, 0x1234, 1.0f, err) != 0)
            DIE("%s", err);
        Blob bh = {0}, bd = {0};
        uint64_t t0 = time_monotonic_ns();
        kernels_cuda_to_host(local, d_local, n * 4);
        if (ef_encode(&eh, &p, &L, base, local, NULL, &bh, err) != 0) DIE("%s", err);
        host_s[r] = (double)(time_monotonic_ns() - t0) / 1e9;
        t0 = time_monotonic_ns();
        if (ef_encode_cuda(&ed, &p, &L, d_base, d_local, &bd, err) != 0) DIE("%s", err);
        ef_to_host(&ed);
        dev_s[r] = (double)(time_monotonic_ns() - t0) / 1e9;
        same = same && bh.len == bd.len && memcmp(bh.data, bd.data, bh.len) == 0 &&
               memcmp(eh.e, ed.e, n * 4) == 0;
        blob_free(&bh), blob_free(&bd);
        ef_free(&eh), ef_free(&ed);
    }
    double h = median3(host_s[0], host_s[1], host_s[2]), d = median3(dev_s[0], dev_s[1], dev_s[2]);
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("gpu"));
    json_object_set_new(o, "case", json_string("site_round_codec"));
    json_object_set_new(o, "device", json_string(dev));
    json_object_set_new(o, "codec", json_string(name));
    json_object_set_new(o, "n", json_integer((json_int_t)n));
    json_object_set_new(o, "host_path_s", json_real(h));
    json_object_set_new(o, "device_path_s", json_real(d));
    json_object_set_new(o, "speedup", json_real(h / d));
    json_object_set_new(o, "same_bytes_and_residual", json_boolean(same));
    json_emit_line(stdout, o);
    kernels_cuda_free(d_local);
    free(local);
}
#endif

int main(int argc, char **argv) {
    int full = argc > 1 && strcmp(argv[1], "--full") == 0;
    if (argc > 1 && !full) {
        fprintf(stderr, "usage: %s [--full]\n", argv[0]);
        return 2;
    }
    log_set_level(LOG_ERROR);
#ifndef STRAIT_HAVE_CUDA
    emit_none("this build has no CUDA (make CUDA=0, or no nvcc found)");
    return 0;
#else
    char name[256] = "", why[512] = "";
    int gpus = kernels_gpu_count(name, sizeof name, why, sizeof why);
    if (gpus == 0) {
        emit_none(why);
        return 0;
    }
    uint64_t n = full ? 256ull << 20 : 64ull << 20;
    float *x = mallocCheck(n * 4);
    bench_pseudo_gradient(x, n);
    float *d_x = kernels_cuda_alloc(n * 4), *d_y = kernels_cuda_alloc(n * 4);
    kernels_cuda_to_device(d_x, x, n * 4);
    double t[REPEAT];
    for (int r = 0; r < REPEAT; r++) {
        uint64_t t0 = time_monotonic_ns();
        kernels_cuda_copy(d_y, d_x, n * 4);
        t[r] = (double)(time_monotonic_ns() - t0) / 1e9;
    }
    double memcpy_gbps = 4.0 * (double)n / median3(t[0], t[1], t[2]) / 1e9;
    const char *codecs[] = {"fp16", "bf16", "int8", "topk", "topk2"};
    CodecLayout L = {0x1234, n, NULL, 0};
    char err[ERR_LEN];
    for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
        CodecParams p;
        if (codec_params_parse(codecs[c], &p, err) != 0) DIE("%s", err);
        int levels[2] = {0, p.zstd_level};
        for (int li = 0; li < 2; li++) {
            p.zstd_level = levels[li];
            Blob gpu = {0}, cpu = {0};
            for (int r = 0; r < REPEAT; r++) {
                uint64_t t0 = time_monotonic_ns();
                if (codec_encode_cuda(&p, &L, d_x, &gpu, err) != 0) DIE("%s: %s", codecs[c], err);
                t[r] = (double)(time_monotonic_ns() - t0) / 1e9;
            }
            double gbps = 4.0 * (double)n / median3(t[0], t[1], t[2]) / 1e9;
            if (codec_encode(&p, &L, x, &cpu, err) != 0) DIE("%s", err);
            int same = gpu.len == cpu.len && memcmp(gpu.data, cpu.data, gpu.len) == 0;
            json_t *o = json_object();
            json_object_set_new(o, "bench", json_string("gpu"));
            json_object_set_new(o, "case", json_string("codec"));
            json_object_set_new(o, "device", json_string(name));
            json_object_set_new(o, "codec", json_string(codecs[c]));
            json_object_set_new(o, "zstd", json_integer(p.zstd_level));
            json_object_set_new(o, "n", json_integer((json_int_t)n));
            json_object_set_new(o, "encode_gbps", json_real(gbps));
            json_object_set_new(o, "device_memcpy_gbps", json_real(memcpy_gbps));
            json_object_set_new(o, "ratio", json_real(gbps / memcpy_gbps));
            json_object_set_new(o, "same_bytes_as_cpu", json_boolean(same));
            json_emit_line(stdout, o);
            blob_free(&gpu), blob_free(&cpu);
        }
    }
    site_round_row(name, "int8", n, x, d_x);
    site_round_row(name, "topk", n, x, d_x);
    kernels_cuda_free(d_x), kernels_cuda_free(d_y);
    free(x);
    /* every matmul precision: fp32 (what make test-gpu compares with the
     * CPU), TF32 tensor cores (the default of strait train and site run
     * on GPUs, as of llm.c) and bf16 products (--precision bf16) */
    static const char *const matmuls[] = {"fp32", "tf32", "bf16"};
    int steps = full ? 20 : 5, B = 4, T = 1024;
    for (int mm = 0; mm <= 2; mm++) {
        double one = tokens_per_s(1, B, T, steps, mm, MODEL_RECOMPUTE_DEFAULT, NULL);
        for (int g = 1; g <= gpus; g = g < gpus && 2 * g > gpus ? gpus : 2 * g) {
            double tps =
                g == 1 ? one : tokens_per_s(g, B, T, steps, mm, MODEL_RECOMPUTE_DEFAULT, NULL);
            json_t *o = json_object();
            json_object_set_new(o, "bench", json_string("gpu"));
            json_object_set_new(o, "case", json_string("train"));
            json_object_set_new(o, "device", json_string(name));
            json_object_set_new(o, "model", json_string("gpt2-124m"));
            json_object_set_new(o, "matmul", json_string(matmuls[mm]));
            json_object_set_new(o, "B", json_integer(B));
            json_object_set_new(o, "T", json_integer(T));
            json_object_set_new(o, "gpus", json_integer(g));
            json_object_set_new(o, "recompute", json_integer(MODEL_RECOMPUTE_DEFAULT));
            json_object_set_new(o, "zero", json_boolean(g > 1)); /* train_defaults' ZeRO-1 */
            json_object_set_new(o, "tokens_per_s", json_real(tps));
            json_object_set_new(o, "scaling_vs_1_gpu", json_real(tps / one));
            json_emit_line(stdout, o);
            if (g == gpus) break;
        }
    }
    /* the batch a GPU holds at each --recompute level (TF32, one GPU) */
    static const int batches[] = {4, 16, 64};
    ModelConfig cfg;
    model_config_preset("gpt2-124m", &cfg);
    for (int b = 0; b < 3; b++)
        for (int level = 0; level <= MODEL_RECOMPUTE_MAX; level++) {
            size_t used = 0, total = 0;
            double need = model_train_bytes(&cfg, batches[b], T, 0, level);
            int known = kernels_cuda_mem(0, &used, &total) == 0; /* unknown: not run */
            int fits = known && need < 0.9 * (double)(total - used);
            double gb = NAN, tps = fits ? tokens_per_s(1, batches[b], T, steps, 1, level, &gb) : 0;
            json_t *o = json_object();
            json_object_set_new(o, "bench", json_string("gpu"));
            json_object_set_new(o, "case", json_string("train_recompute"));
            json_object_set_new(o, "device", json_string(name));
            json_object_set_new(o, "model", json_string("gpt2-124m"));
            json_object_set_new(o, "matmul", json_string("tf32"));
            json_object_set_new(o, "B", json_integer(batches[b]));
            json_object_set_new(o, "T", json_integer(T));
            json_object_set_new(o, "recompute", json_integer(level));
            json_object_set_new(o, "needs_gb", json_real(need / 1e9));
            json_object_set_new(o, "fits", known ? json_boolean(fits) : json_null());
            if (fits) {
                json_object_set_new(o, "tokens_per_s", json_real(tps));
                json_object_set_new(o, "trainer_gb", isnan(gb) ? json_null() : json_real(gb));
            }
            json_emit_line(stdout, o);
        }
    return 0;
#endif
}
