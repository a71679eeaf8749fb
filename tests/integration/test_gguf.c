/*
 * test_gguf.c — GGUF in and out (kernels/gguf.h) against the PyPI gguf
 * package (tests/python/gguf_reference.py, build/venv): random blocks of
 * every type Strait decodes give the package's dequantized values bit for
 * bit; SmolLM2-135M-Instruct's GGUF (STRAIT_SMOLLM2; skipped without it)
 * gives the held-out loss and greedy tokens of the package's dequantization
 * run by an independent numpy forward (llama.cpp's q/k interleaving undone
 * there on its own); exports read back by Strait (F32 exact, Q8_0 within
 * its step) and by the package's GGUFReader; a truncated file, a lying
 * offset, a NaN and a key Strait cannot honour are refused naming them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "kernels/data.h"
#include "kernels/gguf.h"
#include "kernels/model.h"
#include "kernels/formats.h"
#include "kernels/train.h"
#include "security/security.h"
#include "tests/harness.h"
#include "util/util.h"

/* runs gguf_reference.py with args; its stdout (owned) */
static char *reference(const char *a1, const char *a2, const char *a3, const char *a4,
                       const char *a5, const char *a6) {
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with the gguf package)");
    char script[800];
    snprintf(script, sizeof script, "%s/tests/python/gguf_reference.py", src);
    char *argv[] = {(char *)py, script,     (char *)a1, (char *)a2, (char *)a3,
                    (char *)a4, (char *)a5, (char *)a6, NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "gguf_reference.py %s: %s %s", a1, r.out, r.err);
    char *out = strdup(r.out ? r.out : "");
    proc_result_free(&r);
    return out;
}

Test(gguf, every_decoded_type_equals_the_gguf_packages_dequantization_bit_for_bit) {
    char *dir = harness_tmpdir("gguf-blocks"), path[600], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/blocks.gguf", dir);
    free(reference("blocks", path, NULL, NULL, NULL, NULL));
    Gguf *g = gguf_open(path, err);
    cr_assert(g, "%s", err);
    static const char *const types[] = {"F32",  "F16",  "BF16", "Q8_0", "Q4_0", "Q4_1",
                                        "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char ref_name[32];
        snprintf(ref_name, sizeof ref_name, "%s.ref", types[i]);
        const GgufTensor *t = gguf_tensor(g, types[i]), *ref = gguf_tensor(g, ref_name);
        cr_assert(t && ref, "%s", types[i]);
        cr_assert_str_eq(gguf_type_name(t->type), types[i]);
        cr_assert_eq(t->n_elems, ref->n_elems);
        float *ours = malloc(sizeof(float) * t->n_elems);
        cr_assert_eq(gguf_dequantize(t->type, t->data, t->n_elems, ours, err), 0, "%s", err);
        size_t differ = 0;
        for (size_t k = 0; k < t->n_elems; k++)
            differ += memcmp(ours + k, ref->data + 4 * k, 4) != 0;
        cr_assert_eq(differ, 0, "%s: %zu of %llu values differ from gguf.quants.dequantize",
                     types[i], differ, (unsigned long long)t->n_elems);
        free(ours);
    }
    TokenizerLists tl;
    cr_assert_eq(gguf_tokenizer_lists(g, &tl, err), -1);
    cr_assert(strstr(err, "llama") && strstr(err, "SentencePiece"), "%s", err);
    cr_assert_eq(gguf_dequantize(16, "", 256, NULL, err), -1);
    cr_assert(strstr(err, "IQ2_XXS"), "%s", err);
    gguf_close(g);
    harness_rmtree(dir);
    free(dir);
}

#define REAL_N 4
#define REAL_T 64

Test(gguf, smollm2_gives_the_references_held_out_loss_and_greedy_tokens, .timeout = 900) {
    const char *model = getenv("STRAIT_SMOLLM2");
    if (model == NULL || access(model, R_OK) != 0)
        cr_skip("STRAIT_SMOLLM2 is not a readable file (make models fetches SmolLM2's GGUF)");
    const char *text = "/usr/share/games/fortunes/wisdom";
    if (access(text, R_OK) != 0) cr_skip("no fortunes collection at %s", text);
    char *dir = harness_tmpdir("gguf-smollm2"), err[ERR_LEN], n[16], T[16];
    snprintf(n, sizeof n, "%d", REAL_N);
    snprintf(T, sizeof T, "%d", REAL_T);
    char *out = reference("model", model, text, n, T, dir);
    double ref_loss = 0;
    const char *at = strstr(out, "loss ");
    cr_assert(at && sscanf(at, "loss %lf", &ref_loss) == 1, "%s", out);
    int ref_greedy[8];
    at = strstr(out, "greedy ");
    cr_assert(at, "%s", out);
    at += 7;
    for (int i = 0; i < 8; i++) ref_greedy[i] = (int)strtol(at, (char **)&at, 10);

    Model m;
    cr_assert_eq(model_import_gguf(&m, model, err), 0, "%s", err);
    cr_assert_eq(m.cfg.L, 30);
    cr_assert_eq(m.cfg.C, 576);
    cr_assert_eq(m.cfg.NKV, 3);
    cr_assert_eq(m.cfg.V, 49152);
    cr_assert(m.cfg.tied);
    cr_assert_float_eq(m.cfg.rope.theta, 100000.0f, 1e-3);
    char shard[700];
    snprintf(shard, sizeof shard, "%s/tokens.bin", dir);
    const char *paths[1] = {shard};
    TokenSet ts;
    cr_assert_eq(tokens_load(&ts, paths, 1, err), 0, "%s", err);
    TokenView v = {ts.tokens, ts.n};
    double loss = model_eval_tokens(&m, v, 1, REAL_T, REAL_N);
    /* The same windows' loss from Strait's final hidden states, the
     * logits and their log-sum-exp in double: Strait's forward against
     * the reference's. The evaluator's figure (the fused classifier sums
     * 49152 exponentials in fp32) sits 1.6e-4 below both. */
    const float *wte = m.params + model_view(&m, "wte")->offset;
    double exact = 0;
    int in[REAL_T], tg[REAL_T], C = m.cfg.C, V = m.cfg.V;
    double *lg = malloc(sizeof(double) * (size_t)V);
    for (int k = 0; k < REAL_N; k++) {
        for (int i = 0; i < REAL_T; i++)
            in[i] = (int)ts.tokens[k * REAL_T + i], tg[i] = (int)ts.tokens[k * REAL_T + i + 1];
        model_forward(&m, in, tg, 1, REAL_T);
        const float *h = m.acts + m.lay.off[ACT_OUT];
        for (int t = 0; t < REAL_T; t++) {
            double mx = -INFINITY, sum = 0;
            for (int v = 0; v < V; v++) {
                double z = 0;
                for (int c = 0; c < C; c++) z += (double)h[t * C + c] * wte[(size_t)v * C + c];
                lg[v] = z, mx = fmax(mx, z);
            }
            for (int v = 0; v < V; v++) sum += exp(lg[v] - mx);
            exact += (mx + log(sum) - lg[tg[t]]) / (REAL_N * REAL_T);
        }
    }
    free(lg);
    fprintf(stderr,
            "SmolLM2-135M-Instruct (GGUF Q4_1), %d windows of %d: Strait %.6f (its evaluator "
            "%.6f), reference %.6f\n",
            REAL_N, REAL_T, exact, loss, ref_loss);
    cr_assert(fabs(exact - ref_loss) < 1e-4, "Strait's loss %.6f, the reference's %.6f", exact,
              ref_loss);
    cr_assert(fabs(loss - ref_loss) < 1e-4, "Strait's evaluator %.6f, the reference's %.6f", loss,
              ref_loss);
    int ctx[32];
    for (int i = 0; i < 12; i++) ctx[i] = (int)ts.tokens[i];
    float *logits = malloc(sizeof(float) * (size_t)m.cfg.V);
    for (int k = 0; k < 8; k++) {
        model_next_logits(&m, ctx, 12 + k, logits);
        int best = 0;
        for (int i = 1; i < m.cfg.V; i++)
            if (logits[i] > logits[best]) best = i;
        ctx[12 + k] = best;
        cr_assert_eq(best, ref_greedy[k], "greedy token %d: Strait %d, the reference %d", k, best,
                     ref_greedy[k]);
    }
    free(logits);
    tokens_free(&ts);

    /* its tokenizer lists, as the file holds them */
    Gguf *g = gguf_open(model, err);
    cr_assert(g, "%s", err);
    TokenizerLists tl;
    cr_assert_eq(gguf_tokenizer_lists(g, &tl, err), 0, "%s", err);
    cr_assert_eq(tl.n_tokens, 49152);
    cr_assert_eq(tl.n_merges, 48900);
    cr_assert_str_eq(tl.pre, "smollm");
    cr_assert_eq(tl.bos, 1);
    cr_assert_eq(tl.eos, 2);
    cr_assert(tl.chat_template && strstr(tl.chat_template, "<|im_start|>"));
    cr_assert_str_eq(tl.tokens[1], "<|im_start|>");

    /* out again as F32 with its tokenizer, and back: the same bits */
    char path[700];
    snprintf(path, sizeof path, "%s/out.gguf", dir);
    cr_assert_eq(model_export_gguf(&m, path, GGML_F32, &tl, NULL, err), 0, "%s", err);
    Model back;
    cr_assert_eq(model_import_gguf(&back, path, err), 0, "%s", err);
    cr_assert_eq(memcmp(back.params, m.params, m.n_params * sizeof(float)), 0);
    Gguf *g2 = gguf_open(path, err);
    cr_assert(g2, "%s", err);
    TokenizerLists tl2;
    cr_assert_eq(gguf_tokenizer_lists(g2, &tl2, err), 0, "%s", err);
    cr_assert_eq(tl2.n_merges, tl.n_merges);
    cr_assert_str_eq(tl2.merges[100], tl.merges[100]);
    cr_assert_str_eq(tl2.chat_template, tl.chat_template);
    cr_assert_eq(memcmp(tl2.types, tl.types, sizeof(int32_t) * 49152), 0);
    tokenizer_lists_free(&tl2);
    /* with the file as the tokenizer's source: every tokenizer.* key of it
     * (add_bos_token, add_space_prefix, ...) with its type and value, as the
     * gguf package reads both */
    cr_assert_eq(model_export_gguf(&m, path, GGML_F32, &tl, g, err), 0, "%s", err);
    char *same = reference("tokenizer_keys", model, path, NULL, NULL, NULL);
    cr_assert(strstr(same, "same 12"), "%s", same);
    free(same);
    tokenizer_lists_free(&tl);
    gguf_close(g2);
    gguf_close(g);
    model_free(&back);
    model_free(&m);
    free(out);
    harness_rmtree(dir);
    free(dir);
}

/* a preset with weights moved off their init */
static Model moved(const char *preset, int scaled_rope) {
    ModelConfig cfg;
    cr_assert_eq(model_config_preset(preset, &cfg), 0);
    if (scaled_rope) cfg.rope = (RopeConfig){500000.0f, 8.0f, 1.0f, 4.0f, 8192};
    Model m;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&m, &cfg, 5, err), 0, "%s", err);
    uint64_t s = 99;
    for (size_t i = 0; i < m.n_params; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        m.params[i] += 0.1f * (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    const ParamView *v = model_view(&m, "wte"); /* padding rows stay zero */
    for (size_t r = (size_t)cfg.V; r < (size_t)cfg.Vp; r++)
        memset(m.params + v->offset + r * (size_t)cfg.C, 0, sizeof(float) * (size_t)cfg.C);
    return m;
}

/* GGUFReader's view of path (gguf_reference.py read): as many keys and
 * n_tensors tensors (arch's block_count 2, alignment 32), each of the type, shape and dequantized
 * sum Strait's reader gives */
static void check_reader(const char *path, int n_tensors, const char *arch) {
    char err[ERR_LEN], *seen = reference("read", path, NULL, NULL, NULL, NULL), want[64];
    snprintf(want, sizeof want, "key %s.block_count 2\n", arch);
    cr_assert(strstr(seen, want) && strstr(seen, "key general.alignment 32\n") &&
                  strstr(seen, "key general.architecture ") && strstr(seen, arch),
              "%s", seen);
    Gguf *g = gguf_open(path, err);
    cr_assert(g, "%s", err);
    int keys = 0, tensors = 0;
    for (char *line = strtok(seen, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "key ", 4) == 0) {
            keys++;
            continue;
        }
        char name[128], type[16], shape[64];
        double sum;
        cr_assert_eq(sscanf(line, "tensor %127s %15s %63s %lf", name, type, shape, &sum), 4, "%s",
                     line);
        const GgufTensor *t = gguf_tensor(g, name);
        cr_assert(t, "GGUFReader sees %s; Strait's reader does not", name);
        cr_assert_str_eq(gguf_type_name(t->type), type, "%s", name);
        char ours[64];
        snprintf(ours, sizeof ours, "%llu", (unsigned long long)t->ne[0]);
        if (t->n_dims == 2)
            snprintf(ours + strlen(ours), sizeof ours - strlen(ours), "x%llu",
                     (unsigned long long)t->ne[1]);
        cr_assert_str_eq(ours, shape, "%s", name);
        float *x = malloc(sizeof(float) * t->n_elems);
        cr_assert_eq(gguf_dequantize(t->type, t->data, t->n_elems, x, err), 0, "%s", err);
        double s = 0;
        for (size_t k = 0; k < t->n_elems; k++) s += x[k];
        free(x);
        cr_assert(fabs(s - sum) < 1e-5 + 1e-7 * fabs(s), "%s: sum %.6f, GGUFReader's %.6f", name, s,
                  sum);
        tensors++;
    }
    cr_assert_eq(keys, gguf_n_kv(g));
    cr_assert_eq(tensors, gguf_n_tensors(g));
    cr_assert_eq(tensors, n_tensors);
    gguf_close(g);
    free(seen);
}

Test(gguf, exports_read_back_f32_exactly_and_q8_0_within_its_step) {
    char *dir = harness_tmpdir("gguf-out"), path[600], err[ERR_LEN];
    const char *presets[2] = {"llama-tiny", "qwen2-tiny"};
    for (int p = 0; p < 2; p++) {
        Model m = moved(presets[p], p == 0), back;
        snprintf(path, sizeof path, "%s/%s.gguf", dir, presets[p]);
        cr_assert_eq(model_export_gguf(&m, path, GGML_F32, NULL, NULL, err), 0, "%s", err);
        cr_assert_eq(model_import_gguf(&back, path, err), 0, "%s", err);
        cr_assert_eq(back.table_hash, m.table_hash, "%s", presets[p]);
        cr_assert_eq(memcmp(&back.cfg.rope, &m.cfg.rope, sizeof m.cfg.rope), 0, "%s", presets[p]);
        cr_assert_eq(memcmp(back.params, m.params, m.n_params * sizeof(float)), 0, "%s",
                     presets[p]);
        model_free(&back);
        /* the gguf package reads every key and tensor as Strait does */
        check_reader(path, m.n_views + (p == 0), p == 0 ? "llama" : "qwen2"); /* + rope_freqs */
        /* F16, BF16 and Q8_0: the bytes the gguf package's quantizers make of
         * the F32 export (every matrix: 7 a layer, the embedding, an untied output) */
        char f32[700];
        snprintf(f32, sizeof f32, "%s/%s.f32.gguf", dir, presets[p]);
        cr_assert_eq(rename(path, f32), 0);
        const int types[3] = {GGML_F16, GGML_BF16, GGML_Q8_0};
        for (int k = 0; k < 3; k++) {
            cr_assert_eq(model_export_gguf(&m, path, types[k], NULL, NULL, err), 0, "%s", err);
            char *same = reference("quantized", f32, path, NULL, NULL, NULL);
            char want[32];
            snprintf(want, sizeof want, "same %d", 7 * m.cfg.L + (p ? 1 : 2));
            cr_assert(strstr(same, want), "%s: %s, want %s", gguf_type_name((uint32_t)types[k]),
                      same, want);
            free(same);
        }
        /* Q8_0: each value within half a step of its block (d = amax / 127,
         * itself rounded to f16) */
        cr_assert_eq(model_export_gguf(&m, path, GGML_Q8_0, NULL, NULL, err), 0, "%s", err);
        cr_assert_eq(model_import_gguf(&back, path, err), 0, "%s", err);
        double worst = 0;
        for (size_t i = 0; i < m.n_params; i++)
            worst = fmax(worst, fabs((double)back.params[i] - m.params[i]));
        cr_assert(worst > 0 && worst < 0.6 * 0.2 / 127 * 1.01 + 1e-4, "Q8_0 error %g", worst);
        check_reader(path, m.n_views + (p == 0), p == 0 ? "llama" : "qwen2");
        model_free(&back);
        model_free(&m);
    }
    harness_rmtree(dir);
    free(dir);
}

/* the exported bytes of llama-tiny, for corrupting */
static char *exported(const char *dir, size_t *len, char *path) {
    Model m = moved("llama-tiny", 0);
    char err[ERR_LEN], *bytes;
    sprintf(path, "%s/tiny.gguf", dir);
    cr_assert_eq(model_export_gguf(&m, path, GGML_F32, NULL, NULL, err), 0, "%s", err);
    model_free(&m);
    cr_assert_eq(file_read_all(path, 1 << 26, &bytes, len, err), 0, "%s", err);
    return bytes;
}

static void refused(const char *path, const void *bytes, size_t len, const char *want1,
                    const char *want2) {
    char err[ERR_LEN];
    cr_assert_eq(file_write_atomic(path, bytes, len, 0644, err), 0, "%s", err);
    Model m;
    cr_assert_eq(model_import_gguf(&m, path, err), -1, "accepted; wanted %s", want1);
    cr_assert(strstr(err, path) && strstr(err, want1) && (!want2 || strstr(err, want2)), "%s", err);
}

Test(gguf, bad_files_are_refused_naming_the_tensor_or_key) {
    char *dir = harness_tmpdir("gguf-bad"), path[600], bad[700];
    size_t len;
    char *b = exported(dir, &len, path);
    snprintf(bad, sizeof bad, "%s/bad.gguf", dir);
    /* truncated: the last tensor lies past the end */
    refused(bad, b, len - 100, "output.weight", "past the end");
    /* a lying offset */
    char *c = malloc(len);
    memcpy(c, b, len);
    char *info = memmem(c, len, "blk.0.attn_q.weight", 19);
    cr_assert(info);
    uint64_t huge = 1ull << 40;
    memcpy(info + 19 + 4 + 16 + 4, &huge, 8);
    refused(bad, c, len, "blk.0.attn_q.weight", "past the end");
    /* a NaN in a tensor */
    memcpy(c, b, len);
    char err[ERR_LEN];
    Gguf *g = gguf_parse((const uint8_t *)c, len, "x", err);
    cr_assert(g, "%s", err);
    size_t at = (size_t)(gguf_tensor(g, "output_norm.weight")->data - (const uint8_t *)c);
    gguf_close(g);
    float nan = NAN;
    memcpy(c + at + 8, &nan, 4);
    refused(bad, c, len, "output_norm.weight", "NaN");
    /* a norm of the wrong length: its one dimension, and the configuration's */
    memcpy(c, b, len);
    info = memmem(c, len, "output_norm.weight", 18);
    cr_assert(info);
    uint64_t short_norm = 32;
    memcpy(info + 18 + 4, &short_norm, 8);
    refused(bad, c, len, "output_norm.weight", "shape [32]; the configuration makes it [64]");
    /* a key of the architecture's that Strait does not compute */
    memcpy(c, b, len);
    char *key = memmem(c, len, "llama.vocab_size", 16);
    cr_assert(key);
    memcpy(key, "llama.expert_cnt", 16);
    refused(bad, c, len, "llama.expert_cnt", NULL);
    /* a tensor given twice */
    memcpy(c, b, len);
    char *second = memmem(c, len, "blk.1.attn_q.weight", 19);
    memcpy(second, "blk.0", 5);
    refused(bad, c, len, "blk.0.attn_q.weight", "twice");
    /* not GGUF at all */
    refused(bad, "GGUF\x01\0\0\0", 8, "version 1", NULL);
    free(c);
    free(b);
    harness_rmtree(dir);
    free(dir);
}

Test(gguf, init_train_and_export_take_a_gguf_file, .timeout = 300) {
    char *dir = harness_tmpdir("gguf-cli"), src[600], fed[600], path[700], ck[700], out[700];
    char err[ERR_LEN], sha[65], want[120], *ini;
    Model m = moved("llama-tiny", 0), back;
    snprintf(src, sizeof src, "%s/tiny.gguf", dir);
    cr_assert_eq(model_export_gguf(&m, src, GGML_F32, NULL, NULL, err), 0, "%s", err);
    /* a federation's round 0 from it, its source named by the file's SHA-256 */
    snprintf(fed, sizeof fed, "%s/fed", dir);
    ProcResult r = harness_strait("init", fed, "--init-from", src);
    cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
    proc_result_free(&r);
    int64_t bytes;
    cr_assert_eq(security_sha256_file(src, sha, &bytes, err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/federation.ini", fed);
    cr_assert_eq(file_read_all(path, 1 << 20, &ini, NULL, err), 0, "%s", err);
    snprintf(want, sizeof want, "source_sha256 = %s", sha);
    cr_assert(strstr(ini, want), "%s", ini);
    free(ini);
    snprintf(path, sizeof path, "%s/model/initial.safetensors", fed);
    ModelConfig cfg;
    cr_assert_eq(model_read_config(path, &cfg, NULL, err), 0, "%s", err);
    cr_assert_eq(model_build(&back, &cfg, 0, err), 0, "%s", err);
    cr_assert_eq(model_load(&back, path, NULL, err), 0, "%s", err);
    cr_assert_eq(memcmp(back.params, m.params, m.n_params * sizeof(float)), 0);
    model_free(&back);
    /* trained from it, and out again in bf16 */
    uint32_t ids[2000];
    for (int i = 0; i < 2000; i++) ids[i] = (uint32_t)(i * 37 % 256);
    snprintf(path, sizeof path, "%s/ids.bin", dir);
    cr_assert_eq(tokens_write_bin(path, ids, 2000, err), 0, "%s", err);
    snprintf(ck, sizeof ck, "%s/ck.safetensors", dir);
    r = harness_strait("train", "--data", path, "--init-from", src, "--steps", "2", "--batch", "2",
                       "--seq", "16", "--out", ck);
    cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
    proc_result_free(&r);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    r = harness_strait("export", ck, "--format", "gguf", out, "--dtype", "bf16");
    cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
    proc_result_free(&r);
    cr_assert_eq(model_import_gguf(&back, out, err), 0, "%s", err);
    cr_assert_eq(back.table_hash, m.table_hash);
    model_free(&back);
    r = harness_strait("export", ck, "--format", "gguf", out, "--dtype", "q4_0");
    cr_assert_neq(r.status, 0);
    cr_assert(strstr(r.err, "q4_0"), "%s", r.err);
    proc_result_free(&r);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

/* Adapters over a quantized GGUF base: held in the file's blocks (the
 * default) or as a bf16 copy (--base-blocks off), training gives the same
 * checkpoint byte for byte, since both unpack to the same bf16 values; a
 * wrong value is refused by name. */
Test(gguf, a_quantized_base_trains_the_same_in_its_blocks_or_a_bf16_copy, .timeout = 300) {
    char *dir = harness_tmpdir("gguf-blocks"), src[600], data[600], ck[2][700], err[ERR_LEN];
    Model m = moved("llama-tiny", 0);
    snprintf(src, sizeof src, "%s/tiny-q8.gguf", dir);
    cr_assert_eq(model_export_gguf(&m, src, GGML_Q8_0, NULL, NULL, err), 0, "%s", err);
    uint32_t ids[2000];
    for (int i = 0; i < 2000; i++) ids[i] = (uint32_t)(i * 37 % 256);
    snprintf(data, sizeof data, "%s/ids.bin", dir);
    cr_assert_eq(tokens_write_bin(data, ids, 2000, err), 0, "%s", err);
    char *bytes[2];
    size_t len[2];
    for (int k = 0; k < 2; k++) {
        snprintf(ck[k], sizeof ck[k], "%s/ck%d.safetensors", dir, k);
        ProcResult r =
            harness_strait("train", "--data", data, "--init-from", src, "--lora-rank", "4",
                           "--lora-targets", "all", "--steps", "3", "--batch", "2", "--seq", "16",
                           "--base-blocks", k ? "off" : "on", "--out", ck[k]);
        cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
        proc_result_free(&r);
        cr_assert_eq(file_read_all(ck[k], 1 << 26, &bytes[k], &len[k], err), 0, "%s", err);
    }
    cr_assert(len[0] == len[1] && memcmp(bytes[0], bytes[1], len[0]) == 0,
              "the checkpoints differ (%zu and %zu bytes)", len[0], len[1]);
    free(bytes[0]), free(bytes[1]);
    ProcResult r = harness_strait("train", "--data", data, "--init-from", src, "--lora-rank", "4",
                                  "--base-blocks", "maybe");
    cr_assert_eq(r.status, 2, "%s %s", r.out, r.err);
    cr_assert(strstr(r.err, "--base-blocks is on") && strstr(r.err, "'maybe'"), "%s", r.err);
    proc_result_free(&r);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

Test(gguf, an_export_without_a_tokenizer_loads_as_llama_cpps_vocabulary_none) {
    char *dir = harness_tmpdir("gguf-notok"), path[600], err[ERR_LEN], *model = NULL;
    Model m = moved("llama-tiny", 0), back;
    snprintf(path, sizeof path, "%s/notok.gguf", dir);
    cr_assert_eq(model_export_gguf(&m, path, GGML_F32, NULL, NULL, err), 0, "%s", err);
    Gguf *g = gguf_open(path, err);
    cr_assert(g, "%s", err);
    cr_assert_eq(gguf_get_str(g, "tokenizer.ggml.model", &model, err), 1, "%s", err);
    cr_assert_str_eq(model, "none");
    int64_t vs = 0;
    cr_assert_eq(gguf_get_int(g, "llama.vocab_size", 0, 1 << 22, &vs, err), 1, "%s", err);
    cr_assert_eq(vs, m.cfg.V);
    TokenizerLists tl;
    cr_assert_eq(gguf_tokenizer_lists(g, &tl, err), -1);
    cr_assert(strstr(err, "has no tokenizer (tokenizer.ggml.model none)") &&
                  strstr(err, "--tokenizer"),
              "%s", err);
    gguf_close(g);
    cr_assert_eq(model_import_gguf(&back, path, err), 0, "%s", err);
    cr_assert_eq(back.cfg.V, m.cfg.V);
    cr_assert_eq(memcmp(back.params, m.params, m.n_params * sizeof(float)), 0);
    free(model);
    model_free(&back);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

/* rope_freqs.weight's divisors for c, read back from path */
static void divisors_read_back(const char *path, const ModelConfig *c) {
    char err[ERR_LEN];
    Model back;
    cr_assert_eq(model_import_gguf(&back, path, err), 0, "%s", err);
    cr_assert_eq(memcmp(&back.cfg.rope, &c->rope, sizeof c->rope), 0,
                 "factor %g low %g high %g ctx %d", back.cfg.rope.factor, back.cfg.rope.low_freq,
                 back.cfg.rope.high_freq, back.cfg.rope.original_ctx);
    model_free(&back);
}

Test(gguf, llama3_scaling_round_trips_any_setting_and_qwen2_has_none) {
    char *dir = harness_tmpdir("gguf-rope"), path[600], err[ERR_LEN];
    Model m = moved("llama-tiny", 0);
    snprintf(path, sizeof path, "%s/rope.gguf", dir);
    /* not Llama 3.1's low 1, high 4, context 8192 */
    m.cfg.rope = (RopeConfig){500000.0f, 16.0f, 2.0f, 8.0f, 4096};
    cr_assert_eq(model_export_gguf(&m, path, GGML_F32, NULL, NULL, err), 0, "%s", err);
    divisors_read_back(path, &m.cfg);
    /* a short head and a long original context: no divisor is the factor */
    m.cfg.rope = (RopeConfig){10000.0f, 8.0f, 1.0f, 4.0f, 65536};
    cr_assert_eq(model_export_gguf(&m, path, GGML_F32, NULL, NULL, err), 0, "%s", err);
    divisors_read_back(path, &m.cfg);
    /* without Strait's record of the setting the factor cannot be read: refused */
    size_t len;
    char *b;
    cr_assert_eq(file_read_all(path, 1 << 26, &b, &len, err), 0, "%s", err);
    for (char *at = b; (at = memmem(at, len - (size_t)(at - b), "strait.rope", 11)) != NULL;)
        memcpy(at, "straiX", 6);
    char bad[700];
    snprintf(bad, sizeof bad, "%s/bad.gguf", dir);
    refused(bad, b, len, "rope_freqs.weight", "factor");
    /* a qwen2 file with rope_freqs (the llama one's keys renamed): refused */
    cr_assert_eq(file_read_all(path, 1 << 26, &b, &len, err), 0, "%s", err);
    for (char *at = b; (at = memmem(at, len - (size_t)(at - b), "llama", 5)) != NULL;)
        memcpy(at, "qwen2", 5);
    refused(bad, b, len, "rope_freqs.weight", "qwen2");
    free(b);
    model_free(&m);
    /* and qwen2's export does not write it */
    m = moved("qwen2-tiny", 0);
    m.cfg.rope = (RopeConfig){500000.0f, 8.0f, 1.0f, 4.0f, 8192};
    cr_assert_eq(model_export_gguf(&m, path, GGML_F32, NULL, NULL, err), -1);
    cr_assert(strstr(err, "qwen2") && strstr(err, "rope_freqs"), "%s", err);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

Test(gguf, export_refuses_values_its_type_cannot_hold_before_writing) {
    char *dir = harness_tmpdir("gguf-range"), path[600], err[ERR_LEN];
    Model m = moved("llama-tiny", 0);
    snprintf(path, sizeof path, "%s/x.gguf", dir);
    float *up = m.params + model_view(&m, "h.0.mlp.up.weight")->offset; /* layer 0 */
    up[5] = NAN;
    cr_assert_eq(model_export_gguf(&m, path, GGML_BF16, NULL, NULL, err), -1);
    cr_assert(strstr(err, "blk.0.ffn_up.weight") && strstr(err, "NaN"), "%s", err);
    cr_assert_neq(access(path, F_OK), 0, "a file was written");
    up[5] = 1e5f;
    cr_assert_eq(model_export_gguf(&m, path, GGML_F16, NULL, NULL, err), -1);
    cr_assert(strstr(err, "blk.0.ffn_up.weight") && strstr(err, "f16") && strstr(err, "bf16"), "%s",
              err);
    cr_assert_neq(access(path, F_OK), 0, "a file was written");
    cr_assert_eq(model_export_gguf(&m, path, GGML_BF16, NULL, NULL, err), 0, "%s", err);
    up[5] = 1e9f; /* Q8_0's scale 1e9 / 127 is past f16's range */
    cr_assert_eq(model_export_gguf(&m, path, GGML_Q8_0, NULL, NULL, err), -1);
    cr_assert(strstr(err, "blk.0.ffn_up.weight") && strstr(err, "Q8_0"), "%s", err);
    model_free(&m);
    /* a block of values too small for 1/d: clamped, never cast from inf or NaN */
    float x[32] = {1e-38f, -1e-38f};
    uint8_t q[34];
    gguf_quantize_q8_0(x, 32, q);
    cr_assert_eq((int8_t)q[2], 127);
    cr_assert_eq((int8_t)q[3], -127);
    for (int j = 4; j < 34; j++) cr_assert_eq(q[j], 0, "byte %d", j);
    harness_rmtree(dir);
    free(dir);
}

Test(gguf, llama_with_qkv_bias_permutes_its_biases_like_the_weights) {
    char *dir = harness_tmpdir("gguf-bias"), path[600], err[ERR_LEN];
    ModelConfig cfg;
    cr_assert_eq(model_config_preset("llama-tiny", &cfg), 0);
    cfg.qkv_bias = 1;
    Model m, back;
    cr_assert_eq(model_build(&m, &cfg, 5, err), 0, "%s", err);
    for (size_t i = 0; i < m.n_params; i++) m.params[i] += 0.001f * (float)(i % 97);
    snprintf(path, sizeof path, "%s/bias.gguf", dir);
    cr_assert_eq(model_export_gguf(&m, path, GGML_F32, NULL, NULL, err), 0, "%s", err);
    /* the file's rows: Hugging Face's row h HD + p HD/2 + i at h HD + 2i + p */
    Gguf *g = gguf_open(path, err);
    cr_assert(g, "%s", err);
    const char *names[2][2] = {{"h.0.attn.q.bias", "blk.0.attn_q.bias"},
                               {"h.0.attn.k.bias", "blk.0.attn_k.bias"}};
    int HD = cfg.HD;
    for (int k = 0; k < 2; k++) {
        const float *ours = m.params + model_view(&m, names[k][0])->offset;
        const GgufTensor *t = gguf_tensor(g, names[k][1]);
        cr_assert(t, "%s", names[k][1]);
        for (uint64_t r = 0; r < t->ne[0]; r++) {
            int h = (int)r / HD, w = (int)r % HD, p = w / (HD / 2), i = w % (HD / 2);
            float f;
            memcpy(&f, t->data + 4 * (size_t)(h * HD + 2 * i + p), 4);
            cr_assert_eq(f, ours[r], "%s row %llu", names[k][1], (unsigned long long)r);
        }
    }
    gguf_close(g);
    cr_assert_eq(model_import_gguf(&back, path, err), 0, "%s", err);
    cr_assert(back.cfg.qkv_bias);
    cr_assert_eq(back.table_hash, m.table_hash);
    cr_assert_eq(memcmp(back.params, m.params, m.n_params * sizeof(float)), 0);
    model_free(&back);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

Test(gguf, q_and_k_rows_are_the_converters_permutation_of_the_hf_export) {
    char *dir = harness_tmpdir("gguf-perm"), hf[600], path[600], err[ERR_LEN];
    Model m = moved("llama-tiny", 0);
    cr_assert_lt(m.cfg.NKV, m.cfg.NH);
    snprintf(hf, sizeof hf, "%s/hf", dir);
    snprintf(path, sizeof path, "%s/perm.gguf", dir);
    HfExport o = HF_EXPORT_DEFAULTS;
    cr_assert_eq(model_export_hf(&m, hf, &o, err), 0, "%s", err);
    cr_assert_eq(model_export_gguf(&m, path, GGML_F32, NULL, NULL, err), 0, "%s", err);
    char *same = reference("permute", hf, path, NULL, NULL, NULL), want[32];
    snprintf(want, sizeof want, "same %d", 2 * m.cfg.L);
    cr_assert(strstr(same, want), "%s", same);
    free(same);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

Test(gguf, every_type_has_the_gguf_packages_geometry_and_newer_ones_are_named) {
    char *seen = reference("sizes", NULL, NULL, NULL, NULL, NULL), err[ERR_LEN];
    int n = 0;
    for (char *line = strtok(seen, "\n"); line; line = strtok(NULL, "\n")) {
        char name[32];
        unsigned type, block, bytes, ob, oy;
        cr_assert_eq(sscanf(line, "type %31s %u %u %u", name, &type, &block, &bytes), 4, "%s",
                     line);
        cr_assert(gguf_type_name(type), "%s (%u) is not known", name, type);
        cr_assert_str_eq(gguf_type_name(type), name);
        cr_assert_eq(gguf_type_block(type, &ob, &oy), 0);
        cr_assert(ob == block && oy == bytes, "%s: %u/%u, the package's %u/%u", name, ob, oy, block,
                  bytes);
        n++;
    }
    cr_assert_geq(n, 33, "%s", seen);
    cr_assert_str_eq(gguf_type_name(40), "NVFP4");
    cr_assert_str_eq(gguf_type_name(41), "Q1_0");
    cr_assert_eq(gguf_dequantize(42, "", 0, NULL, err), -1);
    cr_assert(strstr(err, "type 42, which this Strait does not know (a newer ggml?)"), "%s", err);
    free(seen);
}

/* a GGUF built by hand: keys only */
typedef struct Raw {
    uint8_t *p;
    size_t n;
} Raw;
static void raw_put(Raw *r, const void *v, size_t n) {
    r->p = realloc(r->p, r->n + n);
    memcpy(r->p + r->n, v, n);
    r->n += n;
}
static void raw_u32(Raw *r, uint32_t v) {
    raw_put(r, &v, 4);
}
static void raw_u64(Raw *r, uint64_t v) {
    raw_put(r, &v, 8);
}
static void raw_str(Raw *r, const char *s) {
    raw_u64(r, strlen(s));
    raw_put(r, s, strlen(s));
}
static Raw raw_head(uint64_t n_kv) {
    Raw r = {0};
    raw_put(&r, "GGUF", 4);
    raw_u32(&r, 3);
    raw_u64(&r, 0);
    raw_u64(&r, n_kv);
    return r;
}
static void raw_kv_str(Raw *r, const char *k, const char *v) {
    raw_str(r, k);
    raw_u32(r, GGUF_STRING);
    raw_str(r, v);
}
static void raw_kv_u32(Raw *r, const char *k, uint32_t v) {
    raw_str(r, k);
    raw_u32(r, GGUF_U32);
    raw_u32(r, v);
}

Test(gguf, names_from_the_file_are_shown_escaped_and_cut) {
    char key[1001], err[ERR_LEN];
    memset(key, 'A', 1000);
    key[1000] = '\0';
    key[3] = '\n', key[4] = '\x1b';
    Raw r = raw_head(1);
    raw_str(&r, key);
    raw_u32(&r, 99);
    cr_assert_null(gguf_parse(r.p, r.n, "hand", err));
    cr_assert(strstr(err, "value type 99") && strstr(err, "AAA\\x0a\\x1bAAA") && strstr(err, "..."),
              "%s", err);
    cr_assert(strchr(err, '\n') == NULL && strchr(err, '\x1b') == NULL && strlen(err) < 200, "%s",
              err);
    free(r.p);
}

Test(gguf, a_bad_bool_and_a_vocabulary_past_2_22_say_what_they_are) {
    char *dir = harness_tmpdir("gguf-keys"), path[600], err[ERR_LEN];
    TokenizerLists tl;
    for (int v = 1; v <= 2; v++) {
        Raw r = raw_head(2);
        raw_kv_str(&r, "tokenizer.ggml.model", "gpt2");
        raw_str(&r, "tokenizer.ggml.add_space_prefix");
        raw_u32(&r, GGUF_BOOL);
        uint8_t b = (uint8_t)v;
        raw_put(&r, &b, 1);
        Gguf *g = gguf_parse(r.p, r.n, "hand", err);
        cr_assert(g, "%s", err);
        cr_assert_eq(gguf_tokenizer_lists(g, &tl, err), -1);
        cr_assert(strstr(err, v == 1 ? "add_space_prefix is true" : "a bool holding the byte 2"),
                  "%s", err);
        gguf_close(g);
        free(r.p);
    }
    /* 2^22 + 1 tokens: counted before a string is copied, and named on import */
    Raw r = raw_head(9);
    raw_kv_str(&r, "general.architecture", "llama");
    raw_kv_u32(&r, "llama.block_count", 1);
    raw_kv_u32(&r, "llama.context_length", 8);
    raw_kv_u32(&r, "llama.embedding_length", 8);
    raw_kv_u32(&r, "llama.feed_forward_length", 8);
    raw_kv_u32(&r, "llama.attention.head_count", 2);
    raw_str(&r, "llama.attention.layer_norm_rms_epsilon");
    raw_u32(&r, GGUF_F32);
    float eps = 1e-5f;
    raw_put(&r, &eps, 4);
    raw_kv_str(&r, "tokenizer.ggml.model", "gpt2");
    raw_str(&r, "tokenizer.ggml.tokens");
    raw_u32(&r, GGUF_ARRAY);
    raw_u32(&r, GGUF_STRING);
    uint64_t n = (1u << 22) + 1;
    raw_u64(&r, n);
    size_t at = r.n;
    r.p = realloc(r.p, r.n + 8 * n);
    memset(r.p + at, 0, 8 * n); /* empty strings */
    r.n += 8 * n;
    Gguf *g = gguf_parse(r.p, r.n, "hand", err);
    cr_assert(g, "%s", err);
    cr_assert_eq(gguf_tokenizer_lists(g, &tl, err), -1);
    cr_assert(strstr(err, "tokenizer.ggml.tokens holds 4194305 entries"), "%s", err);
    gguf_close(g);
    snprintf(path, sizeof path, "%s/big.gguf", dir);
    cr_assert_eq(file_write_atomic(path, r.p, r.n, 0644, err), 0, "%s", err);
    Model m;
    cr_assert_eq(model_import_gguf(&m, path, err), -1);
    cr_assert(strstr(err, "tokenizer.ggml.tokens holds 4194305 tokens"), "%s", err);
    free(r.p);
    harness_rmtree(dir);
    free(dir);
}

/* A tokenizer converted for a model with more rows than tokens is padded
 * with unused tokens as llama.cpp's converter pads Qwen2.5's; one with more
 * tokens than the model has rows is not its tokenizer and is refused before
 * anything is written; --tokenizer none writes no tokenizer. */
Test(gguf, a_tokenizer_is_padded_to_the_models_rows_or_refused, .timeout = 300) {
    const char *smol = getenv("STRAIT_SMOLLM2");
    if (smol == NULL || access(smol, R_OK) != 0) cr_skip("no SmolLM2 GGUF (make models)");
    char *dir = harness_tmpdir("gguf-pad"), ck[700], out[700], err[ERR_LEN];
    ModelConfig cfg;
    cr_assert_eq(model_config_preset("llama-tiny", &cfg), 0);
    const int rows[2] = {49152 + 40, 300};
    for (int k = 0; k < 2; k++) {
        cfg.V = rows[k];
        cr_assert_eq(model_config_check(&cfg, err), 0, "%s", err);
        Model m;
        cr_assert_eq(model_build(&m, &cfg, 3, err), 0, "%s", err);
        snprintf(ck, sizeof ck, "%s/m%d.safetensors", dir, k);
        snprintf(out, sizeof out, "%s/m%d.gguf", dir, k);
        cr_assert_eq(model_save(&m, ck, 0, err), 0, "%s", err);
        model_free(&m);
        ProcResult r = harness_strait("export", ck, "--format", "gguf", "--tokenizer", smol, out);
        if (k == 1) { /* 49152 tokens for 300 rows */
            cr_assert_eq(r.status, 1, "%s", r.out);
            cr_assert(strstr(r.err, "not its tokenizer"), "%s", r.err);
            cr_assert_eq(access(out, F_OK), -1, "a refused export wrote %s", out);
            proc_result_free(&r);
            continue;
        }
        cr_assert_eq(r.status, 0, "%s", r.err);
        proc_result_free(&r);
        Gguf *g = gguf_open(out, err);
        cr_assert_not_null(g, "%s", err);
        TokenizerLists tl;
        cr_assert_eq(gguf_tokenizer_lists(g, &tl, err), 0, "%s", err);
        gguf_close(g);
        cr_assert_eq(tl.n_tokens, rows[k]);
        cr_assert_str_eq(tl.tokens[49152], "[PAD49152]");
        cr_assert_str_eq(tl.tokens[rows[k] - 1], "[PAD49191]");
        cr_assert(tl.types && tl.types[rows[k] - 1] == 5, "a pad is an unused token");
        cr_assert_str_eq(tl.tokens[2], "<|im_end|>"); /* the real ones stay where they were */
        tokenizer_lists_free(&tl);
        /* --tokenizer none: a file with no tokenizer, as llama.cpp's vocabulary none */
        r = harness_strait("export", ck, "--format", "gguf", "--tokenizer", "none", out);
        cr_assert_eq(r.status, 0, "%s", r.err);
        proc_result_free(&r);
        g = gguf_open(out, err);
        cr_assert_not_null(g, "%s", err);
        cr_assert_eq(gguf_tokenizer_lists(g, &tl, err), -1);
        cr_assert(strstr(err, "no tokenizer"), "%s", err);
        gguf_close(g);
    }
    harness_rmtree(dir);
    free(dir);
}
