/*
 * test_interop.c — a Strait checkpoint read by the reference safetensors
 * package from PyPI (in build/venv): every tensor compared with the model's
 * parameters, bit for bit.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "kernels/model.h"
#include "kernels/formats.h"
#include "tests/harness.h"
#include "util/util.h"

Test(interop, pytorch_safetensors_reads_every_tensor, .timeout = 120) {
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with safetensors)");
    char *dir = harness_tmpdir("interop"), ckpt[700], raw[700], index[700], script[700];
    char err[ERR_LEN];
    snprintf(ckpt, sizeof ckpt, "%s/m.safetensors", dir);
    snprintf(raw, sizeof raw, "%s/params.f32", dir);
    snprintf(index, sizeof index, "%s/index.json", dir);
    snprintf(script, sizeof script, "%s/tests/python/check_safetensors.py", src);
    ModelConfig cfg;
    model_config_preset("tiny", &cfg);
    Model m;
    cr_assert_eq(model_build(&m, &cfg, 11, err), 0);
    cr_assert_eq(model_save(&m, ckpt, 0, err), 0, "%s", err);
    cr_assert_eq(file_write_atomic(raw, m.params, m.n_params * 4, 0644, err), 0);
    json_t *arr = json_array();
    for (int i = 0; i < m.n_views; i++) {
        const ParamView *v = &m.views[i];
        json_t *shape = json_array();
        for (int d = 0; d < v->ndim; d++) json_array_append_new(shape, json_integer(v->shape[d]));
        json_array_append_new(arr, json_pack("{s:s,s:I,s:o}", "name", v->name, "offset",
                                             (json_int_t)v->offset, "shape", shape));
    }
    char *text = json_dumps(arr, 0);
    json_decref(arr);
    cr_assert_eq(file_write_atomic(index, text, strlen(text), 0644, err), 0);
    free(text);
    char *argv[] = {(char *)py, script, ckpt, raw, index, NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "python said: %s %s", r.out, r.err);
    char want[64];
    snprintf(want, sizeof want, "ok %d tensors", m.n_views);
    cr_assert_not_null(strstr(r.out, want), "%s", r.out);
    proc_result_free(&r);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

/* A tiny model with weights moved off their init, saved as a checkpoint. */
static Model trained_looking(const char *ckpt) {
    ModelConfig cfg;
    model_config_preset("tiny", &cfg);
    Model m;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&m, &cfg, 5, err), 0, "%s", err);
    uint64_t s = 99;
    for (size_t i = 0; i < m.n_params; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        m.params[i] += 0.05f * ((float)(s >> 40) / (float)(1 << 24) - 0.5f);
    }
    const ParamView *wte = model_view(&m, "wte");
    for (size_t i = (size_t)cfg.V * cfg.C; i < wte->numel; i++) m.params[wte->offset + i] = 0;
    cr_assert_eq(model_save(&m, ckpt, 0, err), 0, "%s", err);
    return m;
}

/* `strait export --format hf` scored by an independent numpy GPT-2 forward
 * pass that reads the folder the way transformers' GPT2LMHeadModel does
 * (tests/python/gpt2_hf_numpy.py): the same loss on the same tokens. */
Test(interop, hf_export_matches_an_independent_numpy_forward_pass, .timeout = 120) {
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with numpy)");
    char *dir = harness_tmpdir("hfexport"), ckpt[700], out[700], script[700];
    snprintf(ckpt, sizeof ckpt, "%s/m.safetensors", dir);
    snprintf(out, sizeof out, "%s/hf", dir);
    snprintf(script, sizeof script, "%s/tests/python/gpt2_hf_numpy.py", src);
    Model m = trained_looking(ckpt);
    ProcResult r = harness_strait("export", ckpt, "--format", "hf", out);
    cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
    proc_result_free(&r);
    enum { B = 2, T = 16 };
    int in[B * T], tg[B * T];
    char ins[B * T * 4 + 1] = "", tgs[B * T * 4 + 1] = "";
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 37 + 11) % 256, tg[i] = (i * 91 + 5) % 256;
        snprintf(ins + strlen(ins), sizeof ins - strlen(ins), "%s%d", i ? "," : "", in[i]);
        snprintf(tgs + strlen(tgs), sizeof tgs - strlen(tgs), "%s%d", i ? "," : "", tg[i]);
    }
    double strait = model_forward(&m, in, tg, B, T);
    char *argv[] = {(char *)py, script, out, "2", "16", ins, tgs, NULL};
    r = proc_run(argv);
    cr_assert_eq(r.status, 0, "python said: %s %s", r.out, r.err);
    double numpy = NAN;
    cr_assert_eq(sscanf(r.out, "loss %lf", &numpy), 1, "%s", r.out);
    cr_assert_float_eq(numpy, strait, 1e-4, "numpy %g, strait %g", numpy, strait);
    cr_assert_gt(strait, 1.0, "a loss that tests nothing: %g", strait);
    proc_result_free(&r);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

/* `strait export --format llmc`: llm.c's header (magic 20240326, version 3,
 * maxT, V, L, NH, C, Vp) and its order of tensors grouped across layers. */
Test(interop, llmc_export_has_llmcs_header_and_tensor_order) {
    char *dir = harness_tmpdir("llmc"), ckpt[700], out[700], err[ERR_LEN];
    snprintf(ckpt, sizeof ckpt, "%s/m.safetensors", dir);
    snprintf(out, sizeof out, "%s/model.bin", dir);
    Model m = trained_looking(ckpt);
    ProcResult r = harness_strait("export", ckpt, "--format", "llmc", out);
    cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
    proc_result_free(&r);
    char *bytes;
    size_t len;
    cr_assert_eq(file_read_all(out, 1 << 26, &bytes, &len, err), 0, "%s", err);
    cr_assert_eq(len, 1024 + m.n_params * 4);
    const int32_t *h = (const int32_t *)bytes;
    const ModelConfig *c = &m.cfg;
    int32_t want[8] = {20240326, 3, c->T, c->V, c->L, c->NH, c->C, c->Vp};
    for (int i = 0; i < 8; i++) cr_assert_eq(h[i], want[i], "header[%d] = %d", i, h[i]);
    const float *p = (const float *)(bytes + 1024);
    size_t C = (size_t)c->C, L = (size_t)c->L;
    /* wte, wpe, ln1w (L, C), ln1b (L, C), then qkvw (L, 3C, C): layer 1's */
    size_t at = (size_t)c->Vp * C + (size_t)c->T * C + 2 * L * C + 3 * C * C;
    const ParamView *qkv1 = model_view(&m, "h.1.attn.qkv.weight");
    cr_assert_eq(memcmp(p + at, m.params + qkv1->offset, qkv1->numel * 4), 0, "qkvw of layer 1");
    /* ... and last, lnfw and lnfb */
    const ParamView *lnfb = model_view(&m, "ln_f.bias");
    cr_assert_eq(memcmp(p + m.n_params - C, m.params + lnfb->offset, C * 4), 0, "lnfb");
    free(bytes);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

/* Export to Hugging Face and import back: every parameter, bit for bit
 * (the embedding's padded rows are zero in both). */
Test(interop, hf_import_reads_back_the_export_bit_for_bit) {
    char *dir = harness_tmpdir("hfround"), ckpt[700], out[700], err[ERR_LEN];
    snprintf(ckpt, sizeof ckpt, "%s/m.safetensors", dir);
    snprintf(out, sizeof out, "%s/hf", dir);
    Model m = trained_looking(ckpt), back;
    cr_assert_eq(model_export_hf(&m, out, NULL, err), 0, "%s", err);
    cr_assert_eq(model_import_hf(&back, out, err), 0, "%s", err);
    cr_assert_eq(back.table_hash, m.table_hash, "another layout");
    cr_assert_eq(back.n_params, m.n_params);
    size_t differ = 0;
    for (size_t i = 0; i < m.n_params; i++) differ += memcmp(&m.params[i], &back.params[i], 4) != 0;
    cr_assert_eq(differ, 0, "%zu parameters differ", differ);
    model_free(&m), model_free(&back);
    harness_rmtree(dir);
    free(dir);
}

/* fp16 tensors without the "transformer." prefix (as older GPT-2 files
 * are) load within fp16's rounding; a checkpoint missing a tensor, or
 * with one mis-shaped, is refused naming it. */
Test(interop, hf_import_takes_fp16_and_names_a_missing_or_misshaped_tensor, .timeout = 120) {
    const char *py = getenv("STRAIT_PYTHON");
    cr_assert(py, "run through make test (it builds build/venv with numpy)");
    char *dir = harness_tmpdir("hfin"), ckpt[700], out[700], err[ERR_LEN];
    snprintf(ckpt, sizeof ckpt, "%s/m.safetensors", dir);
    snprintf(out, sizeof out, "%s/hf", dir);
    Model m = trained_looking(ckpt), back;
    cr_assert_eq(model_export_hf(&m, out, NULL, err), 0, "%s", err);
    static const char script[] =
        "import sys, numpy as np\n"
        "from safetensors.numpy import load_file, save_file\n"
        "d, mode = sys.argv[1], sys.argv[2]\n"
        "t = {k.removeprefix('transformer.'): v for k, v in "
        "load_file(d + '/model.safetensors').items()}\n"
        "if mode == 'fp16': t = {k: v.astype(np.float16) for k, v in t.items()}\n"
        "if mode == 'missing': del t['h.1.mlp.c_fc.bias']\n"
        "if mode == 'shape': t['h.0.attn.c_proj.weight'] = t['h.0.attn.c_proj.weight'][:5]\n"
        "save_file(t, d + '/model.safetensors')\n";
    char *argv[] = {(char *)py, "-c", (char *)script, out, "fp16", NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "python said: %s", r.err);
    proc_result_free(&r);
    cr_assert_eq(model_import_hf(&back, out, err), 0, "%s", err);
    for (size_t i = 0; i < m.n_params; i++)
        cr_assert_float_eq(back.params[i], m.params[i], 1e-3f * fabsf(m.params[i]) + 1e-7f,
                           "parameter %zu", i);
    model_free(&back);
    const char *modes[2] = {"missing", "shape"},
               *said[2] = {"h.1.mlp.c_fc.bias", "h.0.attn.c_proj.weight has shape"};
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(model_export_hf(&m, out, NULL, err), 0, "%s", err);
        argv[4] = (char *)modes[k];
        r = proc_run(argv);
        cr_assert_eq(r.status, 0, "python said: %s", r.err);
        proc_result_free(&r);
        cr_assert_eq(model_import_hf(&back, out, err), -1, "a %s tensor was accepted", modes[k]);
        cr_assert_not_null(strstr(err, said[k]), "%s", err);
    }
    /* a config claiming far more than the file holds is refused before the
     * model it describes is allocated */
    cr_assert_eq(model_export_hf(&m, out, NULL, err), 0, "%s", err);
    char cfg[800], *text;
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    cr_assert_eq(file_read_all(cfg, 1 << 20, &text, NULL, err), 0, "%s", err);
    char *layers = strstr(text, "\"n_layer\": 2");
    cr_assert_not_null(layers, "%s", text);
    memcpy(layers, "\"n_layer\": 9", 12);
    cr_assert_eq(file_write_atomic(cfg, text, strlen(text), 0644, err), 0, "%s", err);
    free(text);
    cr_assert_eq(model_import_hf(&back, out, err), -1,
                 "a config larger than its file was accepted");
    cr_assert_not_null(strstr(err, "config.json describes"), "%s", err);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}
