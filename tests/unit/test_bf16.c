/*
 * test_bf16.c — a frozen base held in bf16 (kernels/cpu/bf16.c): its
 * matmuls against fp64 sums of the rounded values, forward, backward and
 * mixed precision's weight gradient, on shapes oneDNN blocks and shapes it
 * does not; the classifier over a
 * bf16 output layer against the fp32 one's; an adapted model over a
 * bf16 base, against the same model in fp32 (close, not equal: the
 * rounding is applied), training without moving its base; and the
 * configuration's base_dtype, read back and refused when unknown; and
 * OpenBLAS's kernels ranked by the instructions they use, their products
 * checked (kernels/cpu/chip.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "kernels/device.h"
#include "kernels/gguf.h"
#include "kernels/half.h"
#include "kernels/model.h"
#include "kernels/ops.h"
#include "kernels/train.h"
#include "tests/harness.h"
#include "util/util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 40) / 8388608.0 - 1.0);
}
static float r16(float x) {
    return bf16_to_float(float_to_bf16(x));
}

/* out = inp · Wᵀ + bias and dinp += dout · W against fp64 sums of the
 * bf16-rounded values, each within fp32's rounding of its terms' sizes;
 * the weight as bf16 (oneDNN's path where the build has it) or widened
 * (sgemm's, as a chip without bf16 instructions runs it) */
static void check_path(int N, int C, int OC, int widened) {
    float *x = malloc(sizeof(float) * N * C), *w = malloc(sizeof(float) * OC * C);
    float *bias = malloc(sizeof(float) * OC), *out = malloc(sizeof(float) * N * OC);
    float *dout = malloc(sizeof(float) * N * OC), *dinp = malloc(sizeof(float) * N * C);
    uint16_t *w16 = malloc(sizeof(uint16_t) * OC * C);
    for (int i = 0; i < N * C; i++) x[i] = urand();
    for (int i = 0; i < OC * C; i++) w[i] = 0.1f * urand();
    for (int i = 0; i < OC; i++) bias[i] = urand();
    for (int i = 0; i < N * OC; i++) dout[i] = urand();
    for (int i = 0; i < N * C; i++) dinp[i] = 0.5f; /* it accumulates */
    float *wf = malloc(sizeof(float) * OC * C);
    bf16_from_float(w16, w, (size_t)OC * C);
    bf16_widen(wf, w16, (size_t)OC * C);
    for (int i = 0; i < OC * C; i++) cr_assert_eq(wf[i], r16(w[i]));
    BfWeight bw = widened ? (BfWeight){.f = wf} : (BfWeight){.h = w16};
    matmul_forward_bf16(out, x, &bw, bias, N, C, OC);
    matmul_backward_bf16(dinp, dout, &bw, N, C, OC);
    double worst = 0, rounding = 0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias[o], mag = fabs(bias[o]), exact = bias[o];
            for (int c = 0; c < C; c++) {
                double t = (double)r16(x[n * C + c]) * r16(w[o * C + c]);
                s += t, mag += fabs(t), exact += (double)x[n * C + c] * w[o * C + c];
            }
            worst = fmax(worst, fabs(out[n * OC + o] - s) / (mag * 1e-6 + 1e-30));
            rounding = fmax(rounding, fabs(s - exact));
        }
    cr_assert_leq(worst, 1.0, "forward %dx%dx%d: %g of 1e-6 of the terms' size", N, C, OC, worst);
    if ((size_t)N * C * OC > 1000)
        cr_assert_gt(rounding, 1e-4, "the inputs were rounded to bf16, so fp32's sums differ");
    worst = 0;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0.5, mag = 0.5;
            for (int o = 0; o < OC; o++) {
                double t = (double)r16(dout[n * OC + o]) * r16(w[o * C + c]);
                s += t, mag += fabs(t);
            }
            worst = fmax(worst, fabs(dinp[n * C + c] - s) / (mag * 1e-6));
        }
    cr_assert_leq(worst, 1.0, "backward %dx%dx%d: %g of 1e-6 of the terms' size", N, C, OC, worst);
    /* mixed precision's weight gradient: dweight += doutᵀ · inp over the
     * rounded values (oneDNN's, or sgemm's over them where it makes no
     * primitive), dbias += dout's column sums as they are */
    float *dw = malloc(sizeof(float) * OC * C), *db = malloc(sizeof(float) * OC);
    for (int i = 0; i < OC * C; i++) dw[i] = 0.25f;
    for (int i = 0; i < OC; i++) db[i] = -0.5f;
    matmul_weight_bf16(dw, db, dout, x, N, C, OC);
    worst = 0;
    for (int o = 0; o < OC; o++) {
        double sb = -0.5, magb = 0.5;
        for (int n = 0; n < N; n++) sb += dout[n * OC + o], magb += fabs(dout[n * OC + o]);
        worst = fmax(worst, fabs(db[o] - sb) / (magb * 1e-6));
        for (int c = 0; c < C; c++) {
            double s = 0.25, mag = 0.25;
            for (int n = 0; n < N; n++) {
                double t = (double)r16(dout[n * OC + o]) * r16(x[n * C + c]);
                s += t, mag += fabs(t);
            }
            worst = fmax(worst, fabs(dw[o * C + c] - s) / (mag * 1e-6));
        }
    }
    cr_assert_leq(worst, 1.0, "weight gradient %dx%dx%d: %g of 1e-6 of the terms' size", N, C, OC,
                  worst);
    free(dw), free(db);
    free(x), free(w), free(bias), free(out), free(dout), free(dinp), free(w16), free(wf);
}
static void check_shape(int N, int C, int OC) {
    check_path(N, C, OC, 0);
    check_path(N, C, OC, 1);
}

Test(bf16, matmuls_sum_the_rounded_values_in_fp32) {
    cr_log_info("bf16 matmuls by %s", kernels_bf16_isa());
    check_shape(1, 1, 1);
    check_shape(37, 70, 45); /* no multiple of any block */
    check_shape(128, 64, 192);
    check_shape(256, 576, 192); /* SmolLM2's k and v */
}

/* The classifier over a bf16 output layer against classifier.c's over the
 * same rounded values: the loss and each row's log-sum-exp to fp32's
 * sums, dh to the rounding of dlogits to bf16 (about 2^-9 of each term);
 * the layer as bf16 and widened, as check_shape's */
static void check_classifier(int widened) {
    int N = 300, C = 64, V = 5000; /* two row blocks, a chunk and a part */
    float *h = malloc(sizeof(float) * N * C), *hr = malloc(sizeof(float) * N * C);
    float *w = malloc(sizeof(float) * V * C);
    uint16_t *w16 = malloc(sizeof(uint16_t) * V * C);
    int *tg = malloc(sizeof(int) * N);
    for (int i = 0; i < N * C; i++) h[i] = urand(), hr[i] = r16(h[i]);
    for (int i = 0; i < V * C; i++) w[i] = 0.3f * urand();
    for (int i = 0; i < N; i++) tg[i] = (i * 7919) % V;
    bf16_from_float(w16, w, (size_t)V * C);
    bf16_widen(w, w16, (size_t)V * C);
    BfWeight bw = widened ? (BfWeight){.f = w} : (BfWeight){.h = w16};
    float *l16 = malloc(sizeof(float) * N), *l32 = malloc(sizeof(float) * N);
    float *dh16 = calloc((size_t)N * C, sizeof(float)),
          *dh32 = calloc((size_t)N * C, sizeof(float));
    float loss16 = classifier_forward_bf16(NULL, l16, h, &bw, tg, N, C, V);
    float loss32 = classifier_forward(NULL, l32, hr, w, tg, N, C, V);
    cr_assert_lt(fabsf(loss16 - loss32), 1e-5f * fabsf(loss32), "loss %f against %f", loss16,
                 loss32);
    for (int i = 0; i < N; i++)
        cr_assert_lt(fabsf(l16[i] - l32[i]), 1e-5f * fabsf(l32[i]) + 1e-5f, "row %d", i);
    classifier_backward_bf16(dh16, NULL, h, &bw, tg, l16, N, C, V);
    classifier_backward(dh32, NULL, hr, w, tg, l32, N, C, V);
    double d = 0, n = 0;
    for (int i = 0; i < N * C; i++) d += pow(dh16[i] - dh32[i], 2), n += pow(dh32[i], 2);
    cr_assert_lt(sqrt(d / n), 1e-2, "dh off by %g of its norm", sqrt(d / n));
    cr_assert_gt(sqrt(n), 1e-6, "a gradient to compare");
    free(h), free(hr), free(w), free(w16), free(tg), free(l16), free(l32), free(dh16), free(dh32);
}

Test(bf16, the_classifier_over_a_bf16_output_layer_is_the_fp32_ones_over_the_same_values) {
    check_classifier(0);
    check_classifier(1);
}

static Model adapted(int bf16) {
    ModelConfig cfg;
    char err[ERR_LEN];
    cr_assert_eq(model_config_preset("llama-tiny", &cfg), 0);
    Model m;
    cr_assert_eq(model_build(&m, &cfg, 7, err), 0, "%s", err);
    for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.05f * urand();
    AdapterConfig a = {.rank = 4,
                       .alpha = 8,
                       .targets = LORA_ALL,
                       .rule = LORA_RULE_FFA,
                       .a_seed = 3,
                       .base_bf16 = bf16};
    cr_assert_eq(model_add_adapters(&m, &a, 11, err), 0, "%s", err);
    cr_assert_eq(m.cfg.lora.base_bf16, bf16);
    for (size_t i = 0; i < m.n_params; i++) m.params[i] = 0.2f * urand();
    return m;
}

Test(bf16, an_adapted_model_over_a_bf16_base_is_close_to_fp32_and_keeps_its_base) {
    int B = 2, T = 16, in[32], tg[32];
    for (int i = 0; i < B * T; i++) in[i] = (i * 37) % 256, tg[i] = (i * 91 + 5) % 256;
    rng = 42;
    Model f = adapted(0);
    rng = 42;
    Model h = adapted(1);
    cr_assert_eq(memcmp(f.params, h.params, f.n_params * sizeof(float)), 0);
    uint64_t fp = model_base_fingerprint(&h);
    float lf = model_forward(&f, in, tg, B, T), lh = model_forward(&h, in, tg, B, T);
    /* only the bf16 base is held again: in bf16 where the chip multiplies
     * it, the fp32 table then an address range whose matrices have no
     * pages (a read faults) and whose vectors keep their values; else its
     * matrices rounded in place, its vectors kept */
    cr_assert(f.base16 == NULL && !f.base_rounded && f.base_mapped == 0);
    cr_assert(h.base_rounded && (h.base16 != NULL) == bf16_units());
    cr_assert((h.base_mapped != 0) == bf16_units());
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < h.n_base_views; i++) {
        const ParamView *v = &h.base_views[i];
        if (v->ndim == 1) { /* kept, bit for bit */
            cr_assert_eq(memcmp(h.base + v->offset, f.base + v->offset, v->numel * 4), 0, "%s",
                         v->name);
            continue;
        }
        uintptr_t lo = ((uintptr_t)(h.base + v->offset) + page - 1) / page * page;
        if (!bf16_units() || lo + page > (uintptr_t)(h.base + v->offset + v->numel)) continue;
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) { /* the child reads a matrix's fp32 value: it must not live */
            setrlimit(RLIMIT_CORE, &(struct rlimit){0, 0});
            signal(SIGSEGV, SIG_DFL); /* not ASan's report: the fault is the point */
            volatile float x = *(volatile const float *)lo;
            (void)x;
            _exit(0);
        }
        int st = 0;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV,
                  "%s: its fp32 values were still readable (status %d)", v->name, st);
    }
    cr_assert_neq(lf, lh, "the same loss: the bf16 path was not taken");
    cr_assert_lt(fabsf(lf - lh), 1e-2f * fabsf(lf), "losses %f (fp32) and %f (bf16)", lf, lh);
    model_zero_grad(&f), model_zero_grad(&h);
    model_backward(&f), model_backward(&h);
    double dot = 0, nf = 0, nh = 0;
    for (size_t i = 0; i < f.n_params; i++)
        dot += (double)f.grads[i] * h.grads[i], nf += (double)f.grads[i] * f.grads[i],
            nh += (double)h.grads[i] * h.grads[i];
    cr_assert_gt(dot / sqrt(nf * nh), 0.999, "the gradients point apart: cosine %g",
                 dot / sqrt(nf * nh));
    TrainConfig tc = train_defaults(1e-2f, 10);
    for (int s = 0; s < 10; s++) {
        model_forward(&h, in, tg, B, T);
        model_zero_grad(&h);
        model_backward(&h);
        model_adamw_step(&h, &tc.adamw, 1e-2f);
    }
    cr_assert_lt(model_forward(&h, in, tg, B, T), lh - 0.1f, "the adapters learn over bf16");
    cr_assert_eq(model_base_fingerprint(&h), fp, "the base's fingerprint is the loaded values'");
    /* next-token logits read the same bf16 output layer as the passes */
    int ctx[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float *lg_f = malloc(f.cfg.V * sizeof(float)), *lg_h = malloc(h.cfg.V * sizeof(float));
    model_free(&f);
    rng = 42;
    f = adapted(0);
    memcpy(f.params, h.params, f.n_params * sizeof(float));
    model_next_logits(&f, ctx, 8, lg_f);
    model_next_logits(&h, ctx, 8, lg_h);
    double d = 0, n = 0;
    for (int i = 0; i < f.cfg.V; i++) d += pow(lg_f[i] - lg_h[i], 2), n += pow(lg_f[i], 2);
    cr_assert_lt(sqrt(d / n), 1e-2, "logits off by %g of their norm", sqrt(d / n));
    free(lg_f), free(lg_h);
    model_free(&f), model_free(&h);
}

Test(bf16, the_configuration_says_the_bases_dtype_and_an_unknown_one_is_refused) {
    Model h = adapted(1);
    char *json = model_config_json(&h.cfg), err[ERR_LEN];
    cr_assert(strstr(json, "\"base_dtype\":\"bf16\""), "%s", json);
    ModelConfig back;
    cr_assert_eq(model_config_parse(json, strlen(json), &back, err), 0, "%s", err);
    cr_assert_eq(back.lora.base_bf16, 1);
    char *bad = strdup(json), *at = strstr(bad, "bf16");
    memcpy(at, "fp8!", 4);
    cr_assert_neq(model_config_parse(bad, strlen(bad), &back, err), 0);
    cr_assert(strstr(err, "base_dtype should be bf16 or f32"), "%s", err);
    free(bad), free(json);
    model_free(&h);
}

/* the kernels' ranks, and OpenBLAS's products checked here */
Test(chip, openblas_kernels_are_ranked_by_instructions_and_checked) {
    cr_assert_eq(kernels_blas_rank("Prescott"), 1);
    cr_assert_eq(kernels_blas_rank("haswell"), 3);
    cr_assert_eq(kernels_blas_rank("SkylakeX"), 4);
    cr_assert_eq(kernels_blas_rank("NoSuchCore"), 0, "an unknown kernel is not judged");
    cr_assert_geq(kernels_blas_rank(kernels_blas_core_for_chip()), 1);
    char err[ERR_LEN];
    cr_assert_eq(kernels_blas_check(err), 0, "%s", err);
}

/* A base from a GGUF file whose projections are quantized keeps them as
 * the file's blocks under a bf16 base (Q8_0 here; llama-tiny's down
 * projection, 176 wide, is F16 in the file and gets its bf16 copy): each
 * use unpacks the same bf16 values the copy would hold, so training is bit
 * for bit the same as with the copy, and the copy's pages for those
 * matrices are never made. */
Test(bf16, a_quantized_gguf_base_trains_from_its_blocks_as_from_a_bf16_copy) {
    ModelConfig cfg;
    char err[ERR_LEN], *dir = harness_tmpdir("blocks"), path[700];
    cr_assert_eq(model_config_preset("llama-tiny", &cfg), 0);
    Model src;
    cr_assert_eq(model_build(&src, &cfg, 7, err), 0, "%s", err);
    rng = 5;
    for (size_t i = 0; i < src.n_params; i++) src.params[i] += 0.05f * urand();
    snprintf(path, sizeof path, "%s/base.q8_0.gguf", dir);
    cr_assert_eq(model_export_gguf(&src, path, GGML_Q8_0, NULL, NULL, err), 0, "%s", err);
    model_free(&src);
    Model m[2];
    AdapterConfig a = {.rank = 4,
                       .alpha = 8,
                       .targets = LORA_ALL,
                       .rule = LORA_RULE_FFA,
                       .a_seed = 3,
                       .base_bf16 = 1};
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(model_import_frozen(&m[k], path, err), 0, "%s", err);
        /* q, k, v, o, gate and up at both layers; not down (F16), nor the embedding */
        cr_assert_eq(m[k].n_held, 12, "%d matrices held in blocks", m[k].n_held);
        m[k].blocks_off = k; /* the second holds a bf16 copy of every matrix */
        cr_assert_eq(model_add_adapters(&m[k], &a, 11, err), 0, "%s", err);
        rng = 9;
        for (size_t i = 0; i < m[k].n_params; i++) m[k].params[i] = 0.2f * urand();
    }
    cr_assert_eq(model_base_fingerprint(&m[0]), model_base_fingerprint(&m[1]));
    int B = 2, T = 16, in[32], tg[32];
    for (int i = 0; i < B * T; i++) in[i] = (i * 37) % 256, tg[i] = (i * 91 + 5) % 256;
    TrainConfig tc = train_defaults(1e-2f, 5);
    for (int s = 0; s < 5; s++) {
        float loss[2];
        for (int k = 0; k < 2; k++) {
            loss[k] = model_forward(&m[k], in, tg, B, T);
            model_zero_grad(&m[k]);
            model_backward(&m[k]);
            model_adamw_step(&m[k], &tc.adamw, 1e-2f);
        }
        cr_assert_eq(memcmp(&loss[0], &loss[1], sizeof(float)), 0, "step %d: losses %.9g and %.9g",
                     s, loss[0], loss[1]);
    }
    cr_assert_eq(memcmp(m[0].params, m[1].params, m[0].n_params * sizeof(float)), 0,
                 "the adapters trained apart");
    cr_assert_eq(model_base_fingerprint(&m[0]), model_base_fingerprint(&m[1]));
    /* the blocks stand in for the copy where the chip multiplies bf16 */
    cr_assert_eq(m[0].cpu.n_held, bf16_units() ? 12 : 0);
    cr_assert_eq(m[1].cpu.n_held, 0);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < m[0].cpu.n_held; i++) {
        const HeldRows *h = &m[0].held[i];
        uintptr_t lo = ((uintptr_t)(m[0].base16 + h->offset) + page - 1) / page * page;
        if (lo + page > (uintptr_t)(m[0].base16 + h->offset + h->rows * h->cols)) continue;
        unsigned char resident = 1;
        cr_assert_eq(mincore((void *)lo, page, &resident), 0);
        cr_assert_eq(resident & 1, 0, "a held matrix has a bf16 copy");
    }
    model_free(&m[0]), model_free(&m[1]);
    harness_rmtree(dir);
    free(dir);
}

/* Mixed precision on the CPU (strait train --precision bf16): the matmuls'
 * and the classifier's products in bf16 with fp32 sums, the weight
 * gradients' too, everything else fp32. Over 20 AdamW steps of a GPT-2 and
 * a Llama-family model the losses track fp32's within 5e-2 nats at every
 * step (the bound the GPU tests hold TF32's 10-bit products to; bf16 keeps
 * 7 bits), and the first one differs from fp32's (the setting took). */
Test(bf16, mixed_precision_training_tracks_fp32) {
    if (!bf16_units()) cr_skip_test("no bf16 instructions on this chip");
    const char *presets[2] = {"small", "llama-tiny"};
    for (int k = 0; k < 2; k++) {
        ModelConfig cfg;
        cr_assert_eq(model_config_preset(presets[k], &cfg), 0);
        Model m[2];
        char err[ERR_LEN];
        for (int j = 0; j < 2; j++) cr_assert_eq(model_build(&m[j], &cfg, 5, err), 0, "%s", err);
        m[1].precision_bf16 = 1;
        int B = 4, T = 32, in[4 * 32], tg[4 * 32];
        AdamWConfig o = {0.9f, 0.95f, 1e-8f, 0.1f};
        for (int s = 0; s < 20; s++) {
            for (int i = 0; i < B * T; i++)
                in[i] = (i * 31 + s * 7) % cfg.V, tg[i] = (in[i] * 5 + 1) % cfg.V;
            float loss[2];
            for (int j = 0; j < 2; j++) {
                loss[j] = model_forward(&m[j], in, tg, B, T);
                model_zero_grad(&m[j]);
                model_backward(&m[j]);
                model_clip_grad_norm(&m[j], 1.0f);
                model_adamw_step(&m[j], &o, 1e-3f);
            }
            cr_assert_leq(fabsf(loss[1] - loss[0]), 5e-2f, "%s step %d: bf16 %g, fp32 %g",
                          presets[k], s, loss[1], loss[0]);
            if (s == 0)
                cr_assert_neq(memcmp(&loss[0], &loss[1], sizeof(float)), 0,
                              "%s: bf16's first loss is fp32's to the bit", presets[k]);
        }
        model_free(&m[0]), model_free(&m[1]);
    }
}
