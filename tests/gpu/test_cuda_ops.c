/*
 * test_cuda_ops.c — `make test-gpu`: every op of the CUDA table against
 * the CPU table's on random inputs (grouped-query attention, rotary
 * embeddings with Llama 3's scaling, RMSNorm and SwiGLU among them), and
 * 50 training steps of `small`, `llama-small` and `qwen2-tiny` on the GPU
 * against the CPU trainer (in fp32, TF32, and with bf16 products: the
 * CPU's --precision bf16 against the GPU's), 30 of LoRA adapters of each rule over a frozen
 * base, the held-out evaluator on both, every --recompute level to the bit,
 * and ZeRO-1 over two GPUs (where there are two). Tolerances: forward ops
 * 1e-4 relative (5e-4 for attention), backward ops 2e-3, losses within 2e-2
 * nats over 50 steps, a held-out score 1e-3 relative (the sums run in other
 * orders). Skipped, and reported as skipped, without a GPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "kernels/device.h"
#include "kernels/ops.h"
#include "kernels/model.h"
#include "kernels/train.h"
#include "kernels/cuda.h"
#include "util/util.h"

static void need_gpu(void) {
#ifndef STRAIT_HAVE_CUDA
    cr_skip_test("built without CUDA");
#else
    char why[512];
    if (kernels_gpu_count(NULL, 0, why, sizeof why) > 0) return;
    /* a plugin that does not load is a broken build, not a machine without a GPU */
    if (strstr(why, "plugin") != NULL) cr_assert_fail("%s", why);
    cr_skip_test("no GPU here (%s)", why);
#endif
}

/* the plugin loads into this binary, with or without a GPU: it calls back
 * into the executable (cuda.h), and a symbol this binary lacks would make
 * every other test here skip as if there were no GPU (make test runs it) */
Test(cuda_ops, the_cuda_plugin_loads_into_this_binary) {
#ifndef STRAIT_HAVE_CUDA
    cr_skip_test("built without CUDA");
#else
    char why[512];
    int n = kernels_gpu_count(NULL, 0, why, sizeof why);
    cr_assert(n > 0 || strstr(why, "plugin") == NULL, "%s", why);
#endif
}

#ifdef STRAIT_HAVE_CUDA
static uint64_t rs = 77;
static float *rnd(size_t n, float scale) {
    float *x = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        x[i] = scale * (float)((double)(rs >> 11) / 4503599627370496.0 - 1.0);
    }
    return x;
}
static float *dev(const float *h, size_t n) {
    float *d = kernels_cuda_alloc(n * 4);
    kernels_cuda_to_device(d, h, n * 4);
    return d;
}
static void expect_close(const char *what, const float *cpu, const float *d_gpu, size_t n,
                         float tol) {
    float *g = malloc(n * 4);
    kernels_cuda_to_host(g, d_gpu, n * 4);
    for (size_t i = 0; i < n; i++)
        cr_assert_leq(fabsf(g[i] - cpu[i]), tol * (1.0f + fabsf(cpu[i])), "%s[%zu]: GPU %g, CPU %g",
                      what, i, g[i], cpu[i]);
    free(g);
}
#endif

/* Each test runs an op through both backends' tables, ops_cpu and the
 * plugin's: the graph calls nothing else. */
#ifdef STRAIT_HAVE_CUDA
#define CPU (&ops_cpu)
#define GPU (kernels_cuda_ops())
static float *dzeros(size_t n) {
    float *z = calloc(n, 4), *d = dev(z, n);
    free(z);
    return d;
}
#endif

Test(cuda_ops, matmul_norms_gelu_swiglu_match_the_cpu) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    int N = 96, C = 64, OC = 80;
    float *x = rnd((size_t)N * C, 1), *w = rnd((size_t)OC * C, 1), *b = rnd(OC, 1);
    float *out = calloc((size_t)N * OC, 4), *d_out = kernels_cuda_alloc((size_t)N * OC * 4);
    float *d_x = dev(x, (size_t)N * C), *d_w = dev(w, (size_t)OC * C), *d_b = dev(b, OC);
    CPU->matmul_forward(out, x, w, b, N, C, OC, NULL);
    GPU->matmul_forward(d_out, d_x, d_w, d_b, N, C, OC, NULL);
    expect_close("matmul out", out, d_out, (size_t)N * OC, 1e-4f);
    float *dout = rnd((size_t)N * OC, 1), *dx = calloc((size_t)N * C, 4),
          *dw = calloc((size_t)OC * C, 4);
    float *db = calloc(OC, 4), *d_dout = dev(dout, (size_t)N * OC), *d_dx = dev(dx, (size_t)N * C);
    float *d_dw = dev(dw, (size_t)OC * C), *d_db = dev(db, OC);
    CPU->matmul_backward(dx, dw, db, dout, x, w, N, C, OC, NULL);
    GPU->matmul_backward(d_dx, d_dw, d_db, d_dout, d_x, d_w, N, C, OC, NULL);
    expect_close("matmul dinp", dx, d_dx, (size_t)N * C, 2e-3f);
    expect_close("matmul dweight", dw, d_dw, (size_t)OC * C, 2e-3f);
    expect_close("matmul dbias", db, d_db, OC, 2e-3f);
    float *ln = calloc((size_t)N * C, 4), *mean = calloc(N, 4), *rstd = calloc(N, 4);
    float *d_ln = kernels_cuda_alloc((size_t)N * C * 4), *d_mean = kernels_cuda_alloc(N * 4);
    float *d_rstd = kernels_cuda_alloc(N * 4), *lw = rnd(C, 1), *lb = rnd(C, 1);
    float *d_lw = dev(lw, C), *d_lb = dev(lb, C);
    CPU->layernorm_forward(ln, mean, rstd, x, lw, lb, N, C, NULL);
    GPU->layernorm_forward(d_ln, d_mean, d_rstd, d_x, d_lw, d_lb, N, C, NULL);
    expect_close("layernorm out", ln, d_ln, (size_t)N * C, 1e-4f);
    /* RMSNorm, forward and backward */
    CPU->rmsnorm_forward(ln, rstd, x, lw, N, C, 1e-5f, NULL);
    GPU->rmsnorm_forward(d_ln, d_rstd, d_x, d_lw, N, C, 1e-5f, NULL);
    expect_close("rmsnorm out", ln, d_ln, (size_t)N * C, 1e-4f);
    float *dn = rnd((size_t)N * C, 1), *d_dn = dev(dn, (size_t)N * C);
    float *rdx = calloc((size_t)N * C, 4), *rdw = calloc(C, 4);
    float *d_rdx = dzeros((size_t)N * C), *d_rdw = dzeros(C);
    CPU->rmsnorm_backward(rdx, rdw, dn, x, lw, rstd, N, C, NULL);
    GPU->rmsnorm_backward(d_rdx, d_rdw, d_dn, d_x, d_lw, d_rstd, N, C, NULL);
    expect_close("rmsnorm dinp", rdx, d_rdx, (size_t)N * C, 2e-3f);
    expect_close("rmsnorm dw", rdw, d_rdw, C, 2e-3f);
    size_t n = (size_t)N * C;
    float *g = calloc(n, 4), *d_g = kernels_cuda_alloc(n * 4);
    CPU->gelu_forward(g, x, n, NULL);
    GPU->gelu_forward(d_g, d_x, n, NULL);
    expect_close("gelu", g, d_g, n, 1e-4f);
    /* SwiGLU: gate x, up dn */
    CPU->swiglu_forward(g, x, dn, n, NULL);
    GPU->swiglu_forward(d_g, d_x, d_dn, n, NULL);
    expect_close("swiglu", g, d_g, n, 1e-4f);
    float *dg = calloc(n, 4), *du = calloc(n, 4), *d_dg = dzeros(n), *d_du = dzeros(n);
    CPU->swiglu_backward(dg, du, ln, x, dn, n, NULL);
    kernels_cuda_to_device(d_ln, ln, n * 4);
    GPU->swiglu_backward(d_dg, d_du, d_ln, d_x, d_dn, n, NULL);
    expect_close("swiglu dgate", dg, d_dg, n, 2e-3f);
    expect_close("swiglu dup", du, d_du, n, 2e-3f);
    /* the adapters' dropout: the same mask from the same seed, written
     * and accumulated */
    CPU->dropout(g, x, 0.3f, 12345, n, 0, NULL);
    GPU->dropout(d_g, d_x, 0.3f, 12345, n, 0, NULL);
    expect_close("dropout", g, d_g, n, 0.0f); /* a product each: the same bits */
    CPU->dropout(g, dn, 0.3f, 777, n, 1, NULL);
    GPU->dropout(d_g, d_dn, 0.3f, 777, n, 1, NULL);
    expect_close("dropout accumulated", g, d_g, n, 1e-6f); /* the GPU may fuse the add */
#endif
}

/* Mixed precision's products: a matmul whose weight lies in the device's
 * mirrored table reads its bf16 copy and rounds the other input to bf16,
 * as the CPU's bf16 ops do (each product of two bf16 values is exact in
 * fp32, so only the order of the sums differs); the CPU's fp32 results lie
 * farther off than the tolerance, so a GPU that kept fp32 products fails */
Test(cuda_ops, bf16_products_match_the_cpus_mixed_precision) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    int N = 96, C = 64, OC = 80;
    size_t nw = (size_t)OC * C;
    float *x = rnd((size_t)N * C, 1), *w = rnd(nw, 1), *b = rnd(OC, 1);
    uint16_t *w16 = malloc(nw * 2);
    bf16_from_float(w16, w, nw);
    BfWeight bw = {w16, NULL};
    float *out = calloc((size_t)N * OC, 4), *out32 = calloc((size_t)N * OC, 4);
    matmul_forward_bf16(out, x, &bw, b, N, C, OC);
    matmul_forward(out32, x, w, b, N, C, OC);
    float far = 0;
    for (size_t i = 0; i < (size_t)N * OC; i++)
        far = fmaxf(far, fabsf(out[i] - out32[i]) / (1.0f + fabsf(out[i])));
    cr_assert_gt(far, 1e-3f, "bf16 and fp32 products agree to %g: the test cannot tell them apart",
                 far);
    float *d_x = dev(x, (size_t)N * C), *d_w = dev(w, nw), *d_b = dev(b, OC);
    uint16_t *d_w16 = kernels_cuda_alloc(nw * 2);
    kernels_cuda_to_bf16(d_w16, d_w, nw, NULL);
    uint16_t *back = malloc(nw * 2);
    kernels_cuda_to_host(back, d_w16, nw * 2);
    cr_assert_eq(memcmp(back, w16, nw * 2), 0, "the GPU's bf16 rounding is not the CPU's");
    kernels_cuda_set_mirror(d_w, d_w16, nw);
    float *d_out = kernels_cuda_alloc((size_t)N * OC * 4);
    GPU->matmul_forward(d_out, d_x, d_w, d_b, N, C, OC, NULL);
    expect_close("bf16 matmul out", out, d_out, (size_t)N * OC, 1e-4f);
    float *dout = rnd((size_t)N * OC, 1), *dx = rnd((size_t)N * C, 1), *dw = rnd(nw, 1);
    float *db = rnd(OC, 1); /* accumulated into, as the graph's gradients are */
    float *d_dout = dev(dout, (size_t)N * OC), *d_dx = dev(dx, (size_t)N * C), *d_dw = dev(dw, nw);
    float *d_db = dev(db, OC);
    matmul_backward_bf16(dx, dout, &bw, N, C, OC);
    matmul_weight_bf16(dw, db, dout, x, N, C, OC);
    GPU->matmul_backward(d_dx, d_dw, d_db, d_dout, d_x, d_w, N, C, OC, NULL);
    expect_close("bf16 matmul dinp", dx, d_dx, (size_t)N * C, 1e-4f);
    expect_close("bf16 matmul dweight", dw, d_dw, nw, 1e-4f);
    expect_close("bf16 matmul dbias", db, d_db, OC, 1e-4f);
    /* off: the same weight's products are fp32's again */
    kernels_cuda_set_mirror(NULL, NULL, 0);
    GPU->matmul_forward(d_out, d_x, d_w, d_b, N, C, OC, NULL);
    expect_close("fp32 matmul out after the mirror is off", out32, d_out, (size_t)N * OC, 1e-4f);
    /* the classifier's tiles inside a mirrored output layer: the CPU's bf16
     * classifier (its logits bf16 products, softmax and loss in fp32), two
     * vocabulary chunks on the GPU; fp32's loss lies farther off */
    int Nc = 300, V = 5000;
    size_t nv = (size_t)V * C;
    float *h = rnd((size_t)Nc * C, 1), *wte = rnd(nv, 0.3f);
    uint16_t *wte16 = malloc(nv * 2);
    bf16_from_float(wte16, wte, nv);
    BfWeight bwte = {wte16, NULL};
    int *tg = malloc(Nc * sizeof(int));
    for (int i = 0; i < Nc; i++) tg[i] = (i * 7919) % V;
    float *lse = calloc(Nc, 4), *dh = calloc((size_t)Nc * C, 4), *dwte = calloc(nv, 4);
    float loss = classifier_forward_bf16(NULL, lse, h, &bwte, tg, Nc, C, V);
    classifier_backward_bf16(dh, dwte, h, &bwte, tg, lse, Nc, C, V);
    float loss32 = classifier_forward(NULL, NULL, h, wte, tg, Nc, C, V);
    float *d_h = dev(h, (size_t)Nc * C), *d_wte = dev(wte, nv), *d_dh = dzeros((size_t)Nc * C);
    float *d_dwte = dzeros(nv);
    uint16_t *d_wte16 = kernels_cuda_alloc(nv * 2);
    int *d_tg = kernels_cuda_alloc(Nc * sizeof(int));
    kernels_cuda_to_device(d_tg, tg, Nc * sizeof(int));
    kernels_cuda_to_bf16(d_wte16, d_wte, nv, NULL);
    kernels_cuda_set_mirror(d_wte, d_wte16, nv);
    float gloss = GPU->classifier_forward(NULL, NULL, d_h, d_wte, d_tg, Nc, C, V, NULL);
    GPU->classifier_backward(d_dh, d_dwte, d_h, d_wte, d_tg, NULL, Nc, C, V, NULL);
    kernels_cuda_set_mirror(NULL, NULL, 0);
    cr_assert_gt(fabsf(loss - loss32), 20 * 1e-5f * (1 + fabsf(loss)),
                 "bf16 and fp32 classifier losses %g and %g: too close to tell apart", loss,
                 loss32);
    cr_assert_float_eq(gloss, loss, 1e-5f * (1 + fabsf(loss)), "GPU %g, CPU bf16 %g, CPU fp32 %g",
                       gloss, loss, loss32);
    expect_close("bf16 classifier dh", dh, d_dh, (size_t)Nc * C, 1e-4f);
    expect_close("bf16 classifier dwte", dwte, d_dwte, nv, 1e-4f);
#endif
}

#ifdef STRAIT_HAVE_CUDA
/* attention of one shape on both backends: q, k and v in buffers of their
 * own, or packed in rows of one (GPT-2's fused qkv, here also grouped).
 * Both keep each query row's log-sum-exp; the GPU's backward twice gives
 * the same bits. */
static void attention_both(int B, int T, int NH, int NKV, int HD, int packed) {
    int Qd = NH * HD, KVd = NKV * HD, W = Qd + 2 * KVd;
    size_t BT = (size_t)B * T, n = BT * W, nl = (size_t)B * NH * T;
    size_t ko = packed ? (size_t)Qd : BT * Qd, vo = packed ? (size_t)Qd + KVd : BT * (Qd + KVd);
    AttnShape s = {B, T, NH, NKV, HD, packed ? W : Qd, packed ? W : KVd};
    float *x = rnd(n, 2), *q = x, *k = x + ko, *v = x + vo, *d_x = dev(x, n);
    float *d_q = d_x, *d_k = d_x + ko, *d_v = d_x + vo;
    float *out = calloc(BT * Qd, 4), *lse = calloc(nl, 4), *d_out = dzeros(BT * Qd);
    float *d_lse = dzeros(nl);
    CPU->attention_forward(out, lse, q, k, v, &s, NULL);
    GPU->attention_forward(d_out, d_lse, d_q, d_k, d_v, &s, NULL);
    expect_close("attention out", out, d_out, BT * Qd, 5e-4f);
    expect_close("attention log-sum-exp", lse, d_lse, nl, 1e-4f);
    /* the gradients start from values of their own: the ops add to them */
    float *dout = rnd(BT * Qd, 1), *dx = rnd(n, 1);
    float *d_dout = dev(dout, BT * Qd), *d_dx = dev(dx, n), *d_dx2 = dev(dx, n);
    float *d_ds = dzeros(nl);
    CPU->attention_backward(dx, dx + ko, dx + vo, NULL, dout, q, k, v, out, lse, &s, NULL);
    GPU->attention_backward(d_dx, d_dx + ko, d_dx + vo, d_ds, d_dout, d_q, d_k, d_v, d_out, d_lse,
                            &s, NULL);
    expect_close("attention dq, dk, dv", dx, d_dx, n, 2e-3f);
    GPU->attention_backward(d_dx2, d_dx2 + ko, d_dx2 + vo, d_ds, d_dout, d_q, d_k, d_v, d_out,
                            d_lse, &s, NULL);
    float *g1 = malloc(n * 4), *g2 = malloc(n * 4);
    kernels_cuda_to_host(g1, d_dx, n * 4);
    kernels_cuda_to_host(g2, d_dx2, n * 4);
    cr_assert(memcmp(g1, g2, n * 4) == 0, "attention's backward gave other bits a second time");
    /* rotary embeddings on q, with Llama 3's scaling */
    RopeConfig r = {500000.0f, 8.0f, 1.0f, 4.0f, 16};
    CPU->rope_forward(q, B, T, NH, HD, s.ldq, &r, NULL);
    GPU->rope_forward(d_q, B, T, NH, HD, s.ldq, &r, NULL);
    expect_close("rope", x, d_x, n, 1e-4f);
    CPU->rope_backward(q, B, T, NH, HD, s.ldq, &r, NULL);
    GPU->rope_backward(d_q, B, T, NH, HD, s.ldq, &r, NULL);
    expect_close("rope back", x, d_x, n, 1e-4f);
    free(x), free(out), free(lse), free(dout), free(dx), free(g1), free(g2);
    kernels_cuda_free(d_x), kernels_cuda_free(d_out), kernels_cuda_free(d_lse);
    kernels_cuda_free(d_dout), kernels_cuda_free(d_dx), kernels_cuda_free(d_dx2);
    kernels_cuda_free(d_ds);
}
#endif

Test(cuda_ops, attention_rope_and_classifier_match_the_cpu) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    attention_both(2, 32, 4, 4, 16, 0); /* multi-head */
    attention_both(2, 32, 6, 2, 16, 0); /* grouped-query: 3 query heads per key/value head */
    /* the kernels' head sizes (HD rounded up to 32, 64, 128, 256), rows
     * past a block's 64 and a tile's keys, T not a multiple of either */
    attention_both(1, 300, 2, 2, 8, 0);   /* one thread a row, tiles of 128 keys */
    attention_both(2, 200, 4, 2, 64, 1);  /* packed rows, grouped */
    attention_both(1, 150, 2, 1, 80, 0);  /* 80 values in groups of 128 */
    attention_both(1, 70, 2, 2, 128, 1);  /* GPT-2's packed qkv at Llama 3 8B's head */
    attention_both(1, 40, 1, 1, 256, 0);  /* the largest head, tiles of 16 */
    attention_both(1, 100, 4, 2, 256, 0); /* and grouped, over blocks of 32 rows */
    int N = 300, V = 5000, C = 64;        /* two vocabulary chunks on the GPU, ten on the CPU */
    float *h = rnd((size_t)N * C, 1), *wte = rnd((size_t)V * C, 0.3f);
    int *tg = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) tg[i] = (i * 7919) % V;
    float *dh = calloc((size_t)N * C, 4), *dw = calloc((size_t)V * C, 4), *lse = calloc(N, 4);
    float loss = CPU->classifier_forward(NULL, lse, h, wte, tg, N, C, V, NULL);
    CPU->classifier_backward(dh, dw, h, wte, tg, lse, N, C, V, NULL);
    float *d_h = dev(h, (size_t)N * C), *d_wte = dev(wte, (size_t)V * C);
    float *d_dh = dzeros((size_t)N * C), *d_dw = dzeros((size_t)V * C);
    int *d_tg = kernels_cuda_alloc(N * sizeof(int));
    kernels_cuda_to_device(d_tg, tg, N * sizeof(int));
    float gloss = GPU->classifier_forward(NULL, NULL, d_h, d_wte, d_tg, N, C, V, NULL);
    GPU->classifier_backward(d_dh, d_dw, d_h, d_wte, d_tg, NULL, N, C, V, NULL);
    cr_assert_float_eq(gloss, loss, 1e-4f * (1 + fabsf(loss)));
    expect_close("classifier dh", dh, d_dh, (size_t)N * C, 2e-3f);
    expect_close("classifier dwte", dw, d_dw, (size_t)V * C, 2e-3f);
#endif
}

#ifdef STRAIT_HAVE_CUDA
/* mixed: both trainers with --precision bf16's products */
static void steps_beside_cpu(const char *preset, float tol, int mixed) {
    ModelConfig cfg;
    cr_assert_eq(model_config_preset(preset, &cfg), 0);
    Model cpu, host;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&cpu, &cfg, 3, err), 0);
    cr_assert_eq(model_build(&host, &cfg, 3, err), 0);
    cpu.precision_bf16 = host.precision_bf16 = mixed;
    int B = 4, T = 64;
    ModelCuda *g = model_cuda_create(&host, 1, B, T, err);
    cr_assert_not_null(g, "%s", err);
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    AdamWConfig o = {0.9f, 0.95f, 1e-8f, 0.1f};
    for (int s = 0; s < 50; s++) {
        if (s % 10 == 0) cr_log_info("%s: step %d of 50", preset, s); /* where a hang stands */
        for (int i = 0; i < B * T; i++)
            in[i] = (i * 31 + s * 7) % 256, tg[i] = (in[i] * 5 + 1) % 256;
        float lc = model_forward(&cpu, in, tg, B, T);
        model_zero_grad(&cpu);
        model_backward(&cpu);
        model_clip_grad_norm(&cpu, 1.0f);
        model_adamw_step(&cpu, &o, 1e-3f);
        float lg = model_cuda_step(g, in, tg, &o, 1e-3f, 1.0f);
        cr_assert_leq(fabsf(lg - lc), tol, "%s%s step %d: GPU loss %g, CPU loss %g", preset,
                      mixed ? " (bf16 products)" : "", s, lg, lc);
    }
    model_cuda_free(g);
    model_free(&cpu), model_free(&host);
}
static void fifty_steps(const char *preset, float tol) {
    steps_beside_cpu(preset, tol, 0);
}
#endif

/* --recompute on the GPU: 20 steps at each level give the same losses and
 * parameters to the bit as level 0 (the same kernels on the same values;
 * a backward that read a recomputed activation without computing it again
 * would read the last layer's) */
Test(cuda_ops, recomputed_activations_train_the_same_steps_on_the_gpu, .timeout = 300) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    const char *presets[] = {"small", "llama-small"};
    for (int k = 0; k < 2; k++) {
        enum { STEPS = 20 };
        float loss[MODEL_RECOMPUTE_MAX + 1][STEPS];
        float *params[MODEL_RECOMPUTE_MAX + 1];
        size_t n = 0;
        for (int level = 0; level <= MODEL_RECOMPUTE_MAX; level++) {
            ModelConfig cfg;
            cr_assert_eq(model_config_preset(presets[k], &cfg), 0);
            Model host;
            char err[ERR_LEN];
            cr_assert_eq(model_build(&host, &cfg, 3, err), 0);
            host.recompute = level;
            int B = 4, T = 64, in[4 * 64], tg[4 * 64];
            ModelCuda *g = model_cuda_create(&host, 1, B, T, err);
            cr_assert_not_null(g, "%s", err);
            AdamWConfig o = {0.9f, 0.95f, 1e-8f, 0.1f};
            for (int s = 0; s < STEPS; s++) {
                for (int i = 0; i < B * T; i++)
                    in[i] = (i * 31 + s * 7) % 256, tg[i] = (in[i] * 5 + 1) % 256;
                loss[level][s] = model_cuda_step(g, in, tg, &o, 1e-3f, 1.0f);
            }
            model_cuda_to_host(g, &host, TRAINER_PARAMS);
            n = host.n_params;
            params[level] = malloc(n * sizeof(float));
            memcpy(params[level], host.params, n * sizeof(float));
            model_cuda_free(g);
            model_free(&host);
        }
        for (int level = 1; level <= MODEL_RECOMPUTE_MAX; level++) {
            cr_assert_eq(memcmp(loss[level], loss[0], sizeof loss[0]), 0,
                         "%s, --recompute %d: last loss %.9g, not %.9g", presets[k], level,
                         loss[level][STEPS - 1], loss[0][STEPS - 1]);
            cr_assert_eq(memcmp(params[level], params[0], n * sizeof(float)), 0,
                         "%s, --recompute %d: other parameters", presets[k], level);
        }
        for (int level = 0; level <= MODEL_RECOMPUTE_MAX; level++) free(params[level]);
    }
#endif
}

/* ZeRO-1 over two GPUs of one process (--gpus 2, --zero 1): 10 steps of
 * a three-layer `tiny` (its table is not a whole number of 128-value
 * lines, so the last share is short and padded), each GPU on its own
 * batch, clipped for five steps and not for five (a sum taken for a mean
 * then shows in the moments), take the losses, parameters and AdamW
 * moments of the unsharded replicas (within 1e-5: NCCL's sums and the
 * norm's run in other orders); the moments come back whole from both
 * GPUs' shares, and a sharded trainer that loads them steps as the
 * unsharded one. Skipped with fewer than two GPUs. */
#ifdef STRAIT_HAVE_CUDA
static void zero1_steps(ModelCuda *a, ModelCuda *b, int s0, int steps, int B, int T) {
    int *in = malloc(sizeof(int) * 2 * B * T), *tg = malloc(sizeof(int) * 2 * B * T);
    AdamWConfig o = {0.9f, 0.95f, 1e-8f, 0.1f};
    for (int s = s0; s < s0 + steps; s++) {
        for (int i = 0; i < 2 * B * T; i++) /* the second GPU's batch is not the first's */
            in[i] = (i * 31 + (i / (B * T)) * 101 + s * 7) % 256, tg[i] = (in[i] * 5 + 1) % 256;
        float clip = s < 5 ? 1.0f : 0.0f;
        float la = model_cuda_step(a, in, tg, &o, 1e-3f, clip);
        float lb = model_cuda_step(b, in, tg, &o, 1e-3f, clip);
        cr_assert_float_eq(lb, la, 1e-5f, "step %d: sharded loss %.9g, unsharded %.9g", s, lb, la);
    }
    free(in), free(tg);
}
static void zero1_same_state(ModelCuda *ga, Model *a, ModelCuda *gb, Model *b, int steps) {
    model_cuda_to_host(ga, a, TRAINER_PARAMS | TRAINER_MOMENTS);
    model_cuda_to_host(gb, b, TRAINER_PARAMS | TRAINER_MOMENTS);
    cr_assert_eq(b->step, steps);
    for (size_t i = 0; i < a->n_params; i++) {
        cr_assert_float_eq(b->params[i], a->params[i], 1e-5f, "parameter %zu", i);
        cr_assert_float_eq(b->m[i], a->m[i], 1e-5f * (fabsf(a->m[i]) + 1e-3f), "m[%zu]", i);
        cr_assert_float_eq(b->v[i], a->v[i], 1e-4f * (fabsf(a->v[i]) + 1e-9f), "v[%zu]", i);
    }
}
#endif

Test(cuda_ops, zero1_over_two_gpus_steps_as_the_unsharded_replicas, .timeout = 300) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    char why[256];
    if (kernels_gpu_count(NULL, 0, why, sizeof why) < 2) cr_skip_test("one GPU here");
    ModelConfig cfg;
    cr_assert_eq(model_config_preset("tiny", &cfg), 0);
    cfg.L = 3;
    Model a, b;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&a, &cfg, 3, err), 0);
    cr_assert_eq(model_build(&b, &cfg, 3, err), 0);
    cr_assert_eq(a.n_params % 128, 64, "the shares should not end on a whole line");
    int B = 4, T = 64;
    ModelCuda *whole = model_cuda_create_world(&a, 2, B, T, 0, 1, NULL, 0, err);
    cr_assert_not_null(whole, "%s", err);
    ModelCuda *shared = model_cuda_create_world(&b, 2, B, T, 0, 1, NULL, 1, err);
    cr_assert_not_null(shared, "%s", err);
    zero1_steps(whole, shared, 0, 10, B, T);
    zero1_same_state(whole, &a, shared, &b, 10);
    model_cuda_free(shared);
    /* a resume: the gathered state into a new sharded trainer, each GPU its share */
    ModelCuda *again = model_cuda_create_world(&b, 2, B, T, 0, 1, NULL, 1, err);
    cr_assert_not_null(again, "%s", err);
    model_cuda_load_from_host(again, &b, TRAINER_PARAMS | TRAINER_MOMENTS);
    zero1_steps(whole, again, 10, 2, B, T);
    zero1_same_state(whole, &a, again, &b, 12);
    model_cuda_free(whole), model_cuda_free(again);
    model_free(&a), model_free(&b);
#endif
}

/* one graph, two tables: GPT-2's and the Llama family's blocks */
Test(cuda_ops, fifty_steps_of_small_and_llama_small_track_the_cpu_trainer, .timeout = 600) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    fifty_steps("small", 2e-2f);
    fifty_steps("llama-small", 2e-2f);
    fifty_steps("qwen2-tiny", 2e-2f);
#endif
}

/* TF32 tensor cores (strait train's and site run's default on GPUs): the
 * matmuls' inputs lose 13 bits of mantissa, so the same forward gives
 * another loss than fp32's (the setting took), and the losses still follow
 * the CPU's fp32 run step for step, within a wider bound */
Test(cuda_ops, fifty_steps_with_tf32_matmuls_track_the_cpu_trainer, .timeout = 600) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    ModelConfig cfg;
    cr_assert_eq(model_config_preset("small", &cfg), 0);
    Model host;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&host, &cfg, 3, err), 0);
    int B = 4, T = 64, in[4 * 64], tg[4 * 64];
    for (int i = 0; i < B * T; i++) in[i] = (i * 31) % 256, tg[i] = (in[i] * 5 + 1) % 256;
    ModelCuda *g = model_cuda_create(&host, 1, B, T, err);
    cr_assert_not_null(g, "%s", err);
    kernels_cuda_set_tf32(0);
    float fp32 = model_cuda_loss(g, in, tg);
    kernels_cuda_set_tf32(1);
    float tf32 = model_cuda_loss(g, in, tg);
    cr_assert_neq(memcmp(&fp32, &tf32, sizeof fp32), 0,
                  "the same forward gave loss %.9g with TF32 and with fp32: TF32 is not on", tf32);
    model_cuda_free(g);
    model_free(&host);
    fifty_steps("small", 5e-2f);
    fifty_steps("llama-small", 5e-2f);
    kernels_cuda_set_tf32(0);
#endif
}

/* --precision bf16 on the GPU: the same forward gives another loss than
 * fp32's (the bf16 copy is read), and 50 steps of `small` and
 * `llama-small` follow the CPU's own bf16-products run step for step (its
 * bf16 ops give the same products through sgemm on a chip without bf16
 * instructions) */
Test(cuda_ops, fifty_steps_with_bf16_products_track_the_cpu_trainer, .timeout = 600) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    ModelConfig cfg;
    cr_assert_eq(model_config_preset("small", &cfg), 0);
    Model a, b;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&a, &cfg, 3, err), 0);
    cr_assert_eq(model_build(&b, &cfg, 3, err), 0);
    b.precision_bf16 = 1;
    int B = 4, T = 64, in[4 * 64], tg[4 * 64];
    for (int i = 0; i < B * T; i++) in[i] = (i * 31) % 256, tg[i] = (in[i] * 5 + 1) % 256;
    kernels_cuda_set_tf32(0);
    ModelCuda *g32 = model_cuda_create(&a, 1, B, T, err),
              *g16 = model_cuda_create(&b, 1, B, T, err);
    cr_assert(g32 && g16, "%s", err);
    float fp32 = model_cuda_loss(g32, in, tg), bf16 = model_cuda_loss(g16, in, tg);
    cr_assert_neq(memcmp(&fp32, &bf16, sizeof fp32), 0,
                  "the same forward gave loss %.9g with bf16 products and with fp32", bf16);
    cr_assert_leq(fabsf(fp32 - bf16), 2e-2f, "bf16 products moved the loss %g -> %g", fp32, bf16);
    /* the fp32 trainer on the same device is untouched by the other's copy
     * (bf16 products moved the loss by far more than the sums' order can) */
    float again = model_cuda_loss(g32, in, tg);
    cr_assert_leq(fabsf(again - fp32), 1e-6f * (1 + fabsf(fp32)), "fp32 loss %g, then %g", fp32,
                  again);
    /* the GPU's bf16 loss is the CPU's bf16 one, not fp32's */
    float cpu32 = model_forward(&a, in, tg, B, T), cpu16 = model_forward(&b, in, tg, B, T);
    cr_assert_gt(fabsf(cpu16 - cpu32), 1e-4f, "CPU bf16 %g and fp32 %g: too close to tell apart",
                 cpu16, cpu32);
    cr_assert_lt(fabsf(bf16 - cpu16), 0.25f * fabsf(cpu16 - cpu32),
                 "GPU bf16 loss %g, CPU bf16 %g, CPU fp32 %g", bf16, cpu16, cpu32);
    model_cuda_free(g32), model_cuda_free(g16);
    model_free(&a), model_free(&b);
    steps_beside_cpu("small", 5e-2f, 1);
    steps_beside_cpu("llama-small", 5e-2f, 1);
#endif
}

/* A site's round on the GPU: the round's θ and the kept AdamW moments go
 * onto the replica, 10 steps run there, and what comes back (θ_local, m, v,
 * step) tracks the same 10 steps on the CPU from the same state. */
Test(cuda_ops, a_site_round_moves_state_to_the_gpu_and_back, .timeout = 300) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    ModelConfig cfg;
    model_config_preset("tiny", &cfg);
    Model cpu, site;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&cpu, &cfg, 5, err), 0);
    cr_assert_eq(model_build(&site, &cfg, 9, err),
                 0); /* other weights: the load must replace them */
    int B = 4, T = 32;
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    AdamWConfig o = {0.9f, 0.95f, 1e-8f, 0.1f};
    for (int s = 0; s < 3; s++) { /* earlier rounds: moments to keep */
        for (int i = 0; i < B * T; i++) in[i] = (i * 13 + s) % 256, tg[i] = (in[i] + 1) % 256;
        model_forward(&cpu, in, tg, B, T);
        model_zero_grad(&cpu);
        model_backward(&cpu);
        model_adamw_step(&cpu, &o, 1e-3f);
    }
    memcpy(site.params, cpu.params, cpu.n_params * 4);
    site.m = malloc(cpu.n_params * 4), site.v = malloc(cpu.n_params * 4);
    memcpy(site.m, cpu.m, cpu.n_params * 4), memcpy(site.v, cpu.v, cpu.n_params * 4);
    site.step = cpu.step;
    ModelCuda *g = model_cuda_create(&site, 1, B, T, err);
    cr_assert_not_null(g, "%s", err);
    model_cuda_load_from_host(g, &site, TRAINER_PARAMS | TRAINER_MOMENTS);
    for (int s = 0; s < 10; s++) {
        for (int i = 0; i < B * T; i++) in[i] = (i * 29 + s) % 256, tg[i] = (in[i] * 3) % 256;
        model_forward(&cpu, in, tg, B, T);
        model_zero_grad(&cpu);
        model_backward(&cpu);
        model_clip_grad_norm(&cpu, 1.0f);
        model_adamw_step(&cpu, &o, 1e-3f);
        model_cuda_step(g, in, tg, &o, 1e-3f, 1.0f);
    }
    model_cuda_to_host(g, &site, TRAINER_PARAMS | TRAINER_MOMENTS);
    cr_assert_eq(site.step, cpu.step);
    const float *want[3] = {cpu.params, cpu.m, cpu.v}, *got[3] = {site.params, site.m, site.v};
    const char *names[3] = {"theta_local", "adam m", "adam v"};
    for (int k = 0; k < 3; k++) {
        double worst = 0;
        for (size_t i = 0; i < cpu.n_params; i++) {
            double d = fabs((double)want[k][i] - got[k][i]) / (fabs(want[k][i]) + 1e-3);
            if (d > worst) worst = d;
        }
        cr_assert_leq(worst, 2e-2, "%s: worst relative difference %g", names[k], worst);
    }
    model_cuda_free(g);
    free(in), free(tg);
    model_free(&cpu), model_free(&site);
#endif
}

/* The held-out evaluator where a GPU site trains: trainer_eval_tokens on the
 * GPU scores the same batches as model_eval_tokens on the CPU, within the
 * forward's tolerance, and leaves the parameters where they were. */
Test(cuda_ops, the_gpu_evaluator_scores_as_the_cpu_one) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    ModelConfig cfg;
    model_config_preset("small", &cfg);
    Model m;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&m, &cfg, 11, err), 0);
    int B = 4, T = 64;
    size_t n = (size_t)B * T * 3 + 1;
    uint32_t *tok = malloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = (uint32_t)((i * 37 + i / 7) % 256);
    TokenView v = {tok, n};
    double cpu = model_eval_tokens(&m, v, B, T, 4); /* 3 batches fit */
    TrainConfig c = train_defaults(1e-3f, 10);
    Trainer *t = trainer_create(&m, &c, 1, B, T, err);
    cr_assert_not_null(t, "%s", err);
    trainer_from_host(t, TRAINER_PARAMS | TRAINER_MOMENTS);
    double gpu = trainer_eval_tokens(t, v, 4);
    cr_assert(isfinite(cpu) && fabs(gpu - cpu) <= 1e-3 * (1 + fabs(cpu)), "GPU %g, CPU %g", gpu,
              cpu);
    float *before = malloc(m.n_params * 4);
    memcpy(before, m.params, m.n_params * 4);
    trainer_to_host(t, TRAINER_PARAMS);
    cr_assert_eq(memcmp(before, m.params, m.n_params * 4), 0, "the evaluator moved parameters");
    trainer_free(t);
    free(before), free(tok);
    model_free(&m);
#endif
}

/* Replicas and ranks clip the same averaged gradients by the same factor:
 * the norm is the same bits every time (no atomics in its sum), and close
 * to the CPU's in double. */
Test(cuda_ops, the_gradient_norm_is_the_same_bits_every_time) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    size_t n = 12 * 1000 * 1000 + 7;
    float *g = rnd(n, 1e-3f), *d = dev(g, n);
    double want = 0;
    for (size_t i = 0; i < n; i++) want += (double)g[i] * g[i];
    want = sqrt(want);
    float first = clip_grad_norm_cuda(d, n, 0.0f, NULL); /* 0: measure, never scale */
    for (int k = 0; k < 20; k++) {
        float again = clip_grad_norm_cuda(d, n, 0.0f, NULL);
        cr_assert(memcmp(&again, &first, sizeof first) == 0, "call %d: norm %.9g, first %.9g", k,
                  (double)again, (double)first);
    }
    cr_assert_leq(fabs(first - want), 1e-5 * want, "GPU norm %g, CPU %g", (double)first, want);
    kernels_cuda_free(d);
    free(g);
#endif
}

/* Adapters on the GPU: the base frozen in fp32 on the device, what the
 * rule freezes (A; with fedsb B too) uploaded once, the adapters training
 * there: 30 steps of each rule (FedIT with dropout, whose masks the GPU
 * draws from the host's seed as the CPU does; FFA with a vocabulary of
 * 5000, past the classifier's first chunk of rows of a frozen head) track
 * the CPU's fp32 steps, and the adapters that come back are the CPU's
 * within the tolerance of the site round above. */
#ifdef STRAIT_HAVE_CUDA
static void adapted_steps(int rule, float dropout, int V) {
    ModelConfig cfg;
    cr_assert_eq(model_config_preset("llama-small", &cfg), 0);
    if (V) cfg.V = V, cfg.Vp = (V + 63) / 64 * 64;
    Model cpu, host;
    char err[ERR_LEN];
    AdapterConfig a = {.rank = 4,
                       .alpha = 8,
                       .targets = LORA_ALL,
                       .rule = rule,
                       .a_seed = 5,
                       .base_bf16 = 0,
                       .dropout = dropout};
    Model *both[2] = {&cpu, &host};
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(model_build(both[k], &cfg, 3, err), 0, "%s", err);
        cr_assert_eq(model_add_adapters(both[k], &a, 11, err), 0, "%s", err);
    }
    int B = 4, T = 64;
    ModelCuda *g = model_cuda_create(&host, 1, B, T, err);
    cr_assert_not_null(g, "%s", err);
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    AdamWConfig o = {0.9f, 0.95f, 1e-8f, 0.1f};
    for (int s = 0; s < 30; s++) {
        for (int i = 0; i < B * T; i++)
            in[i] = (i * 31 + s * 7) % cfg.V, tg[i] = (in[i] * 5 + 1) % cfg.V;
        uint64_t seed = dropout > 0 ? mix64(100 + (uint64_t)s) | 1 : 0;
        cpu.drop_seed = host.drop_seed = seed;
        float lc = model_forward(&cpu, in, tg, B, T);
        model_zero_grad(&cpu);
        model_backward(&cpu);
        model_clip_grad_norm(&cpu, 1.0f);
        model_adamw_step(&cpu, &o, 1e-2f);
        float lg = model_cuda_step(g, in, tg, &o, 1e-2f, 1.0f);
        cr_assert_leq(fabsf(lg - lc), 2e-2f, "%s step %d: GPU loss %g, CPU loss %g",
                      model_lora_rule_name(rule), s, lg, lc);
    }
    cr_assert_eq(model_cuda_steps(g), 30);
    model_cuda_to_host(g, &host, TRAINER_PARAMS);
    double worst = 0;
    for (size_t i = 0; i < cpu.n_params; i++) {
        double d = fabs((double)cpu.params[i] - host.params[i]) / (fabs(cpu.params[i]) + 1e-3);
        if (d > worst) worst = d;
    }
    cr_assert_leq(worst, 2e-2, "%s: adapters' worst relative difference %g",
                  model_lora_rule_name(rule), worst);
    model_cuda_free(g);
    free(in), free(tg);
    model_free(&cpu), model_free(&host);
}
#endif

Test(cuda_ops, adapters_of_every_rule_train_on_the_gpu_as_on_the_cpu, .timeout = 300) {
    need_gpu();
#ifdef STRAIT_HAVE_CUDA
    adapted_steps(LORA_RULE_FEDIT, 0.1f, 0);
    adapted_steps(LORA_RULE_FFA, 0, 5000);
    adapted_steps(LORA_RULE_FEDSB, 0, 0);
#endif
}
