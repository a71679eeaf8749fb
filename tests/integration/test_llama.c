/*
 * test_llama.c — the Llama family in and out of Hugging Face's files, in
 * `make test` (the numpy of build/venv; transformers itself is
 * test_transformers.c, `make test-hf`): a tiny Llama (grouped-query
 * attention, untied output layer, Llama 3's rope scaling, a vocabulary
 * that pads) and a tiny Qwen2 (q/k/v biases, tied), their exports run by an
 * independent numpy forward pass (tests/python/llama_hf_numpy.py) to the
 * same logits, read back bit for bit; a sharded bf16 checkpoint loads; a
 * missing tensor, a bad shard name and settings Strait cannot compute are
 * refused naming them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "kernels/formats.h"
#include "kernels/model.h"
#include "tests/harness.h"
#include "util/util.h"

#define T_IDS 24

/* a preset with weights moved off their init (norms and biases too) */
static Model moved(const char *preset, int scaled_rope, int vocab) {
    ModelConfig cfg;
    cr_assert_eq(model_config_preset(preset, &cfg), 0);
    if (scaled_rope) cfg.rope = (RopeConfig){500000.0f, 8.0f, 1.0f, 4.0f, 16};
    if (vocab) cfg.V = vocab, cfg.Vp = (vocab + 63) / 64 * 64;
    Model m;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&m, &cfg, 5, err), 0, "%s", err);
    uint64_t s = 99;
    for (size_t i = 0; i < m.n_params; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        m.params[i] += 0.1f * (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    const char *padded[2] = {"wte", "lm_head.weight"};
    for (int k = 0; k < 2; k++) { /* padding rows stay zero */
        const ParamView *v = model_view(&m, padded[k]);
        for (size_t r = (size_t)cfg.V; v && r < (size_t)cfg.Vp; r++)
            memset(m.params + v->offset + r * (size_t)cfg.C, 0, sizeof(float) * (size_t)cfg.C);
    }
    return m;
}

/* the largest difference between numpy's logits of dir and Strait's */
static double numpy_diff(Model *m, const char *dir) {
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with numpy)");
    char ids_path[800], out[800], script[800], err[ERR_LEN];
    int ids[T_IDS];
    for (int i = 0; i < T_IDS; i++) ids[i] = (i * 71 + 3) % m->cfg.V;
    snprintf(ids_path, sizeof ids_path, "%s/ids", dir);
    snprintf(out, sizeof out, "%s/logits", dir);
    snprintf(script, sizeof script, "%s/tests/python/llama_hf_numpy.py", src);
    cr_assert_eq(file_write_atomic(ids_path, ids, sizeof ids, 0644, err), 0, "%s", err);
    char *argv[] = {(char *)py, script, (char *)dir, ids_path, out, NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "numpy: %s %s", r.out, r.err);
    proc_result_free(&r);
    char *theirs;
    size_t len;
    cr_assert_eq(file_read_all(out, 1 << 26, &theirs, &len, err), 0, "%s", err);
    cr_assert_eq(len, sizeof(float) * T_IDS * (size_t)m->cfg.V);
    float *ours = malloc(sizeof(float) * (size_t)m->cfg.V);
    double worst = 0;
    for (int t = 1; t <= T_IDS; t++) {
        model_next_logits(m, ids, t, ours);
        for (int v = 0; v < m->cfg.V; v++) {
            float x;
            memcpy(&x, theirs + 4 * ((size_t)(t - 1) * m->cfg.V + v), 4);
            worst = fmax(worst, fabs((double)x - ours[v]));
        }
    }
    free(ours), free(theirs);
    return worst;
}

Test(llama, exports_match_an_independent_numpy_forward_and_read_back_bit_for_bit, .timeout = 120) {
    char *dir = harness_tmpdir("llama"), out[700], err[ERR_LEN];
    const char *presets[2] = {"llama-tiny", "qwen2-tiny"};
    for (int k = 0; k < 2; k++) {
        Model m = moved(presets[k], k == 0, k == 0 ? 300 : 0), back;
        snprintf(out, sizeof out, "%s/%s", dir, presets[k]);
        cr_assert_eq(model_export_hf(&m, out, NULL, err), 0, "%s", err);
        double d = numpy_diff(&m, out);
        cr_assert_lt(d, 1e-4, "%s: logits differ from numpy's by %g", presets[k], d);
        fprintf(stderr, "%s: Strait against numpy, largest logit difference %.2e\n", presets[k], d);
        cr_assert_eq(model_import_hf(&back, out, err), 0, "%s", err);
        cr_assert_eq(back.cfg.arch, m.cfg.arch);
        cr_assert_eq(back.table_hash, m.table_hash, "another layout");
        cr_assert_eq(back.cfg.NKV, m.cfg.NKV);
        cr_assert_eq(back.cfg.tied, m.cfg.tied);
        cr_assert_eq(back.cfg.rope.factor, m.cfg.rope.factor);
        cr_assert_eq(back.cfg.rope.theta, m.cfg.rope.theta);
        cr_assert_eq(memcmp(back.params, m.params, m.n_params * 4), 0, "%s", presets[k]);
        model_free(&m), model_free(&back);
    }
    harness_rmtree(dir);
    free(dir);
}

/* python over an export: shard it in two as bf16 with an index, or damage it */
static void reshape(const char *out, const char *mode) {
    static const char script[] =
        "import sys, json, numpy as np\n"
        "from safetensors.numpy import load_file, save_file\n"
        "d, mode = sys.argv[1], sys.argv[2]\n"
        "t = load_file(d + '/model.safetensors')\n"
        "import os; os.remove(d + '/model.safetensors')\n"
        "if mode == 'missing': del t['model.layers.1.mlp.up_proj.weight']\n"
        "def bf16(a):\n"
        "    u = a.astype(np.float32).view(np.uint32)\n"
        "    return ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16)\n"
        "names = sorted(t)\n"
        "parts = [names[: len(names) // 2], names[len(names) // 2 :]]\n"
        "files = ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors']\n"
        "if mode == 'escape': files[1] = '../outside.safetensors'\n"
        "wm = {}\n"
        "for f, part in zip(files, parts):\n"
        "    head, blobs, off = {}, [], 0\n"
        "    for n in part:\n"
        "        f32 = mode == 'missing'  # bf16 would leave too few bytes for the config\n"
        "        b = (t[n].astype(np.float32) if f32 else bf16(t[n])).tobytes()\n"
        "        head[n] = {'dtype': 'F32' if f32 else 'BF16', 'shape': list(t[n].shape),\n"
        "                   'data_offsets': [off, off + len(b)]}\n"
        "        blobs.append(b); off += len(b)\n"
        "    h = json.dumps(head).encode(); h += b' ' * (-len(h) % 8)\n"
        "    with open(d + '/' + os.path.basename(f), 'wb') as o:\n"
        "        o.write(len(h).to_bytes(8, 'little') + h + b''.join(blobs))\n"
        "    wm.update({n: f for n in part})\n"
        "json.dump({'metadata': {}, 'weight_map': wm},\n"
        "          open(d + '/model.safetensors.index.json', 'w'))\n";
    char *argv[] = {getenv("STRAIT_PYTHON"), "-c", (char *)script, (char *)out, (char *)mode, NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "python said: %s", r.err);
    proc_result_free(&r);
}

Test(llama, sharded_bf16_loads_and_what_cannot_be_computed_is_refused, .timeout = 120) {
    cr_assert(getenv("STRAIT_PYTHON"), "run through make test (it builds build/venv)");
    char *dir = harness_tmpdir("llamashard"), out[700], err[ERR_LEN];
    snprintf(out, sizeof out, "%s/hf", dir);
    Model m = moved("llama-tiny", 1, 0), back;
    cr_assert_eq(model_export_hf(&m, out, NULL, err), 0, "%s", err);
    reshape(out, "bf16");
    cr_assert_eq(model_import_hf(&back, out, err), 0, "%s", err);
    for (size_t i = 0; i < m.n_params; i++) /* bf16 keeps 8 bits of mantissa */
        cr_assert_float_eq(back.params[i], m.params[i], 4e-3f * fabsf(m.params[i]) + 1e-30f,
                           "parameter %zu", i);
    model_free(&back);
    const char *modes[2] = {"missing", "escape"},
               *said[2] = {"model.layers.1.mlp.up_proj.weight", "../outside.safetensors"};
    for (int k = 0; k < 2; k++) {
        harness_rmtree(out);
        cr_assert_eq(model_export_hf(&m, out, NULL, err), 0, "%s", err);
        reshape(out, modes[k]);
        cr_assert_eq(model_import_hf(&back, out, err), -1, "a %s checkpoint was accepted",
                     modes[k]);
        cr_assert_not_null(strstr(err, said[k]) || (k == 1 && strstr(err, "same folder")), "%s: %s",
                           modes[k], err);
    }
    /* config.json settings Strait cannot compute exactly, each named */
    static const struct {
        const char *from, *to, *said;
    } bad[] = {
        {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act gelu"},
        {"\"attention_bias\": false", "\"attention_bias\": true", "attention_bias"},
        {"\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"", "rope_scaling of type yarn"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "key/value heads"},
        {"\"model_type\": \"llama\"", "\"model_type\": \"mamba\"", "model_type mamba"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        harness_rmtree(out);
        cr_assert_eq(model_export_hf(&m, out, NULL, err), 0, "%s", err);
        char cfg[800], *text;
        snprintf(cfg, sizeof cfg, "%s/config.json", out);
        cr_assert_eq(file_read_all(cfg, 1 << 20, &text, NULL, err), 0, "%s", err);
        char *at = strstr(text, bad[k].from);
        cr_assert_not_null(at, "%s in %s", bad[k].from, text);
        size_t fl = strlen(bad[k].from), tl = strlen(bad[k].to), n = strlen(text);
        char *edited = malloc(n + tl + 1);
        memcpy(edited, text, (size_t)(at - text));
        memcpy(edited + (at - text), bad[k].to, tl);
        strcpy(edited + (at - text) + tl, at + fl);
        cr_assert_eq(file_write_atomic(cfg, edited, strlen(edited), 0644, err), 0, "%s", err);
        free(text), free(edited);
        cr_assert_eq(model_import_hf(&back, out, err), -1, "%s was accepted", bad[k].to);
        cr_assert_not_null(strstr(err, bad[k].said), "%s: %s", bad[k].to, err);
    }
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}
