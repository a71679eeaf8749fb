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

    GPT m;
    cr_assert_eq(gpt_import_gguf(&m, model, err), 0, "%s", err);
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
    double loss = gpt_eval_tokens(&m, v, 1, REAL_T, REAL_N);
    /* The same windows' loss from Strait's final hidden states, the
     * logits and their log-sum-exp in double: Strait's forward against
     * the reference's. The evaluator's figure (the fused classifier sums
     * 49152 exponentials in fp32) sits 1.6e-4 below both. */
    const float *wte = m.params + gpt_view(&m, "wte")->offset;
    double exact = 0;
    int in[REAL_T], tg[REAL_T], C = m.cfg.C, V = m.cfg.V;
    double *lg = malloc(sizeof(double) * (size_t)V);
    for (int k = 0; k < REAL_N; k++) {
        for (int i = 0; i < REAL_T; i++)
            in[i] = (int)ts.tokens[k * REAL_T + i], tg[i] = (int)ts.tokens[k * REAL_T + i + 1];
        gpt_forward(&m, in, tg, 1, REAL_T);
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
        gpt_next_logits(&m, ctx, 12 + k, logits);
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
    cr_assert_eq(gpt_export_gguf(&m, path, GGML_F32, &tl, err), 0, "%s", err);
    GPT back;
    cr_assert_eq(gpt_import_gguf(&back, path, err), 0, "%s", err);
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
    tokenizer_lists_free(&tl);
    gguf_close(g2);
    gguf_close(g);
    gpt_free(&back);
    gpt_free(&m);
    free(out);
    harness_rmtree(dir);
    free(dir);
}

/* a preset with weights moved off their init */
static GPT moved(const char *preset, int scaled_rope) {
    GPTConfig cfg;
    cr_assert_eq(gpt_config_preset(preset, &cfg), 0);
    if (scaled_rope) cfg.rope = (RopeConfig){500000.0f, 8.0f, 1.0f, 4.0f, 8192};
    GPT m;
    char err[ERR_LEN];
    cr_assert_eq(gpt_build(&m, &cfg, 5, err), 0, "%s", err);
    uint64_t s = 99;
    for (size_t i = 0; i < m.n_params; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        m.params[i] += 0.1f * (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    const ParamView *v = gpt_view(&m, "wte"); /* padding rows stay zero */
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
        GPT m = moved(presets[p], p == 0), back;
        snprintf(path, sizeof path, "%s/%s.gguf", dir, presets[p]);
        cr_assert_eq(gpt_export_gguf(&m, path, GGML_F32, NULL, err), 0, "%s", err);
        cr_assert_eq(gpt_import_gguf(&back, path, err), 0, "%s", err);
        cr_assert_eq(back.table_hash, m.table_hash, "%s", presets[p]);
        cr_assert_eq(memcmp(&back.cfg.rope, &m.cfg.rope, sizeof m.cfg.rope), 0, "%s", presets[p]);
        cr_assert_eq(memcmp(back.params, m.params, m.n_params * sizeof(float)), 0, "%s",
                     presets[p]);
        gpt_free(&back);
        /* the gguf package reads every key and tensor as Strait does */
        check_reader(path, m.n_views + (p == 0), p == 0 ? "llama" : "qwen2"); /* + rope_freqs */
        /* F16, BF16 and Q8_0: the bytes the gguf package's quantizers make of
         * the F32 export (every matrix: 7 a layer, the embedding, an untied output) */
        char f32[700];
        snprintf(f32, sizeof f32, "%s/%s.f32.gguf", dir, presets[p]);
        cr_assert_eq(rename(path, f32), 0);
        const int types[3] = {GGML_F16, GGML_BF16, GGML_Q8_0};
        for (int k = 0; k < 3; k++) {
            cr_assert_eq(gpt_export_gguf(&m, path, types[k], NULL, err), 0, "%s", err);
            char *same = reference("quantized", f32, path, NULL, NULL, NULL);
            char want[32];
            snprintf(want, sizeof want, "same %d", 7 * m.cfg.L + (p ? 1 : 2));
            cr_assert(strstr(same, want), "%s: %s, want %s", gguf_type_name((uint32_t)types[k]),
                      same, want);
            free(same);
        }
        /* Q8_0: each value within half a step of its block (d = amax / 127,
         * itself rounded to f16) */
        cr_assert_eq(gpt_export_gguf(&m, path, GGML_Q8_0, NULL, err), 0, "%s", err);
        cr_assert_eq(gpt_import_gguf(&back, path, err), 0, "%s", err);
        double worst = 0;
        for (size_t i = 0; i < m.n_params; i++)
            worst = fmax(worst, fabs((double)back.params[i] - m.params[i]));
        cr_assert(worst > 0 && worst < 0.6 * 0.2 / 127 * 1.01 + 1e-4, "Q8_0 error %g", worst);
        check_reader(path, m.n_views + (p == 0), p == 0 ? "llama" : "qwen2");
        gpt_free(&back);
        gpt_free(&m);
    }
    harness_rmtree(dir);
    free(dir);
}

/* the exported bytes of llama-tiny, for corrupting */
static char *exported(const char *dir, size_t *len, char *path) {
    GPT m = moved("llama-tiny", 0);
    char err[ERR_LEN], *bytes;
    sprintf(path, "%s/tiny.gguf", dir);
    cr_assert_eq(gpt_export_gguf(&m, path, GGML_F32, NULL, err), 0, "%s", err);
    gpt_free(&m);
    cr_assert_eq(file_read_all(path, 1 << 26, &bytes, len, err), 0, "%s", err);
    return bytes;
}

static void refused(const char *path, const void *bytes, size_t len, const char *want1,
                    const char *want2) {
    char err[ERR_LEN];
    cr_assert_eq(file_write_atomic(path, bytes, len, 0644, err), 0, "%s", err);
    GPT m;
    cr_assert_eq(gpt_import_gguf(&m, path, err), -1, "accepted; wanted %s", want1);
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
    GPT m = moved("llama-tiny", 0), back;
    snprintf(src, sizeof src, "%s/tiny.gguf", dir);
    cr_assert_eq(gpt_export_gguf(&m, src, GGML_F32, NULL, err), 0, "%s", err);
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
    GPTConfig cfg;
    cr_assert_eq(gpt_read_config(path, &cfg, NULL, err), 0, "%s", err);
    cr_assert_eq(gpt_build(&back, &cfg, 0, err), 0, "%s", err);
    cr_assert_eq(gpt_load(&back, path, NULL, err), 0, "%s", err);
    cr_assert_eq(memcmp(back.params, m.params, m.n_params * sizeof(float)), 0);
    gpt_free(&back);
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
    cr_assert_eq(gpt_import_gguf(&back, out, err), 0, "%s", err);
    cr_assert_eq(back.table_hash, m.table_hash);
    gpt_free(&back);
    r = harness_strait("export", ck, "--format", "gguf", out, "--dtype", "q4_0");
    cr_assert_neq(r.status, 0);
    cr_assert(strstr(r.err, "q4_0"), "%s", r.err);
    proc_result_free(&r);
    gpt_free(&m);
    harness_rmtree(dir);
    free(dir);
}
