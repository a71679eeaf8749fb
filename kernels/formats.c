/*
 * formats.c — a Strait model in and out of the formats of the tools people
 * serve and train GPT-2 with:
 *
 * - Hugging Face: DIR/config.json and DIR/model.safetensors as
 *   `save_pretrained` writes a GPT2LMHeadModel — "transformer."-prefixed
 *   names, Conv1D weights stored [in, out] (Strait's are [out, in], like
 *   llm.c's), the fused c_attn, the embedding's padded rows dropped and the
 *   lm_head tied to it, GELU with the tanh approximation (gelu_new) and
 *   LayerNorm's epsilon 1e-5 as Strait computes them.
 * - llm.c: the checkpoint train_gpt2.c loads — a header of 256 int32
 *   (magic 20240326, version 3, maxT, V, L, NH, C, Vp) and the parameters
 *   in fp32, grouped by tensor across layers: wte (Vp, C), wpe (T, C),
 *   ln1w, ln1b, qkvw (L, 3C, C), qkvb, attprojw, attprojb, ln2w, ln2b, fcw,
 *   fcb, fcprojw, fcprojb, lnfw, lnfb.
 *
 * In: a Hugging Face GPT-2-family folder (config.json: n_layer, n_head,
 * n_embd, n_positions, vocab_size; model.safetensors with or without the
 * "transformer." prefix, F32, F16 or BF16 tensors). Every tensor's name,
 * dtype, shape and bytes are checked before any is copied; a missing or
 * mis-shaped one is named.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/model.h"
#include "kernels/formats.h"
#include "util/util.h"

#define LLMC_MAGIC   20240326
#define LLMC_VERSION 3

/* The per-layer suffixes in llm.c's order of tensor groups. */
static const char *const LAYER_TENSORS[] = {"ln_1.weight",   "ln_1.bias",        "attn.qkv.weight",
                                            "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                                            "ln_2.weight",   "ln_2.bias",        "mlp.fc.weight",
                                            "mlp.fc.bias",   "mlp.proj.weight",  "mlp.proj.bias"};
#define N_LAYER_TENSORS 12

static const ParamView *view_of(const GPT *m, const char *name, char *err) {
    const ParamView *v = gpt_view(m, name);
    if (v == NULL) err_set(err, "the model has no tensor %s", name);
    return v;
}

int gpt_export_llmc(const GPT *m, const char *path, char *err) {
    const GPTConfig *c = &m->cfg;
    int32_t header[256] = {LLMC_MAGIC, LLMC_VERSION, c->T, c->V, c->L, c->NH, c->C, c->Vp};
    AtomicFile *af = file_atomic_open(path, 0644, err);
    if (af == NULL) return -1;
    int rc = file_atomic_write(af, header, sizeof header, err);
    const char *head[2] = {"wte", "wpe"}, *tail[2] = {"ln_f.weight", "ln_f.bias"};
    for (int i = 0; i < 2 && rc == 0; i++) {
        const ParamView *v = view_of(m, head[i], err);
        rc = v ? file_atomic_write(af, m->params + v->offset, v->numel * 4, err) : -1;
    }
    for (int t = 0; t < N_LAYER_TENSORS && rc == 0; t++)
        for (int l = 0; l < c->L && rc == 0; l++) {
            char name[64];
            snprintf(name, sizeof name, "h.%d.%s", l, LAYER_TENSORS[t]);
            const ParamView *v = view_of(m, name, err);
            rc = v ? file_atomic_write(af, m->params + v->offset, v->numel * 4, err) : -1;
        }
    for (int i = 0; i < 2 && rc == 0; i++) {
        const ParamView *v = view_of(m, tail[i], err);
        rc = v ? file_atomic_write(af, m->params + v->offset, v->numel * 4, err) : -1;
    }
    if (rc != 0) {
        file_atomic_abort(af);
        return -1;
    }
    return file_atomic_commit(af, err);
}

/* One tensor of the Hugging Face file: its name, shape and data (owned). */
typedef struct HfTensor {
    char name[96];
    int ndim, shape[2];
    float *data;
} HfTensor;

/* Strait's tensor `from` under HF's `to`: as is, transposed ([out, in] →
 * [in, out]), or its first `rows` rows (the embedding without padding). */
static int hf_add(const GPT *m, HfTensor *t, const char *from, const char *to, int transpose,
                  int rows, char *err) {
    const ParamView *v = view_of(m, from, err);
    if (v == NULL) return -1;
    const float *src = m->params + v->offset;
    snprintf(t->name, sizeof t->name, "transformer.%s", to);
    t->ndim = v->ndim;
    t->shape[0] = rows > 0 ? rows : v->shape[0];
    t->shape[1] = v->shape[1];
    size_t n = v->ndim == 2 ? (size_t)t->shape[0] * t->shape[1] : v->numel;
    t->data = mallocCheck(n * 4);
    if (transpose) {
        int R = v->shape[0], C = v->shape[1];
        for (int i = 0; i < R; i++)
            for (int j = 0; j < C; j++) t->data[(size_t)j * R + i] = src[(size_t)i * C + j];
        t->shape[0] = C, t->shape[1] = R;
    } else {
        memcpy(t->data, src, n * 4);
    }
    return 0;
}

static int write_hf_safetensors(const char *path, HfTensor *ts, int n, char *err) {
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes =
            (ts[i].ndim == 2 ? (size_t)ts[i].shape[0] * ts[i].shape[1] : (size_t)ts[i].shape[0]) *
            4;
        json_t *shape = json_array();
        for (int d = 0; d < ts[i].ndim; d++)
            json_array_append_new(shape, json_integer(ts[i].shape[d]));
        json_object_set_new(h, ts[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", "F32", "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + bytes)));
        off += bytes;
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
    uint64_t len_le = padded;
    AtomicFile *af = file_atomic_open(path, 0644, err);
    int rc = af ? 0 : -1;
    if (rc == 0)
        rc = file_atomic_write(af, &len_le, 8, err) || file_atomic_write(af, text, hl, err) ||
                     file_atomic_write(af, "        ", padded - hl, err)
                 ? -1
                 : 0;
    for (int i = 0; i < n && rc == 0; i++) {
        size_t count =
            ts[i].ndim == 2 ? (size_t)ts[i].shape[0] * ts[i].shape[1] : (size_t)ts[i].shape[0];
        rc = file_atomic_write(af, ts[i].data, count * 4, err);
    }
    free(text);
    if (af && rc != 0) file_atomic_abort(af);
    return rc == 0 ? file_atomic_commit(af, err) : -1;
}

/* Strait's per-layer tensors and their Hugging Face names; 1: a Conv1D
 * weight, stored transposed ([in, out]). */
static const struct {
    const char *strait, *hf;
    int transpose;
} HF_LAYER[] = {{"ln_1.weight", "ln_1.weight", 0},
                {"ln_1.bias", "ln_1.bias", 0},
                {"attn.qkv.weight", "attn.c_attn.weight", 1},
                {"attn.qkv.bias", "attn.c_attn.bias", 0},
                {"attn.proj.weight", "attn.c_proj.weight", 1},
                {"attn.proj.bias", "attn.c_proj.bias", 0},
                {"ln_2.weight", "ln_2.weight", 0},
                {"ln_2.bias", "ln_2.bias", 0},
                {"mlp.fc.weight", "mlp.c_fc.weight", 1},
                {"mlp.fc.bias", "mlp.c_fc.bias", 0},
                {"mlp.proj.weight", "mlp.c_proj.weight", 1},
                {"mlp.proj.bias", "mlp.c_proj.bias", 0}};

int gpt_export_hf(const GPT *m, const char *dir, char *err) {
    const GPTConfig *c = &m->cfg;
    if (file_mkdir_p(dir, 0755, err) != 0) return -1;
    int cap = 4 + 12 * c->L, n = 0, rc = 0;
    HfTensor *ts = callocCheck((size_t)cap, sizeof *ts);
    rc = hf_add(m, &ts[n++], "wte", "wte.weight", 0, c->V, err) ||
         hf_add(m, &ts[n++], "wpe", "wpe.weight", 0, 0, err);
    for (int l = 0; l < c->L && rc == 0; l++)
        for (int k = 0; k < 12 && rc == 0; k++) {
            char from[64], to[64];
            snprintf(from, sizeof from, "h.%d.%s", l, HF_LAYER[k].strait);
            snprintf(to, sizeof to, "h.%d.%s", l, HF_LAYER[k].hf);
            rc = hf_add(m, &ts[n++], from, to, HF_LAYER[k].transpose, 0, err);
        }
    if (rc == 0)
        rc = hf_add(m, &ts[n++], "ln_f.weight", "ln_f.weight", 0, 0, err) ||
             hf_add(m, &ts[n++], "ln_f.bias", "ln_f.bias", 0, 0, err);
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (rc == 0) rc = write_hf_safetensors(path, ts, n, err);
    for (int i = 0; i < n; i++) free(ts[i].data);
    free(ts);
    if (rc != 0) return -1;
    json_t *cfg = json_pack(
        "{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:s,s:f,s:b,s:i,s:i,s:f,s:f,s:f}", "architectures",
        "GPT2LMHeadModel", "model_type", "gpt2", "vocab_size", c->V, "n_positions", c->T, "n_ctx",
        c->T, "n_embd", c->C, "n_layer", c->L, "n_head", c->NH, "activation_function", "gelu_new",
        "layer_norm_epsilon", 1e-5, "tie_word_embeddings", 1, "bos_token_id", c->V - 1,
        "eos_token_id", c->V - 1, "resid_pdrop", 0.0, "embd_pdrop", 0.0, "attn_pdrop", 0.0);
    char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = file_write_atomic(path, text, strlen(text), 0644, err);
    free(text);
    return rc;
}

/* ---- import ------------------------------------------------------------------ */

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, bits;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    bits = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* One tensor of the source: dtype size, shape and bytes, checked. */
typedef struct HfIn {
    json_t *header;
    const uint8_t *data;
    size_t data_len;
    const char *prefix; /* "transformer." or "" */
    int flax;           /* Flax's names (kernel, scale, embedding) and Dense layout [out, in] */
} HfIn;

/* Copies HF tensor `name` (want_rows x want_cols of the source layout, or
 * want_rows for a vector) into dst, transposing Conv1D weights, as fp32;
 * dst_cols is Strait's row length. -1 naming the tensor if it is missing,
 * mis-shaped, of another dtype or outside the file. */
static int hf_take(const HfIn *in, const char *name, int ndim, int rows, int cols, int transpose,
                   float *dst, char *err) {
    char full[128];
    snprintf(full, sizeof full, "%s%s", in->prefix, name);
    char *dot = strrchr(full, '.');
    if (in->flax && dot && strcmp(dot, ".weight") == 0) {
        int embedding = strstr(full, "wte.") != NULL || strstr(full, "wpe.") != NULL;
        snprintf(dot + 1, sizeof full - (size_t)(dot + 1 - full), "%s",
                 embedding   ? "embedding"
                 : ndim == 1 ? "scale"
                             : "kernel");
        transpose = 0; /* a Flax kernel is [out, in], Strait's layout already */
    }
    json_t *t = json_object_get(in->header, full);
    if (!json_is_object(t)) return err_set(err, "the checkpoint has no tensor %s", full);
    const char *dtype = json_string_value(json_object_get(t, "dtype"));
    int size = dtype && !strcmp(dtype, "F32")                               ? 4
               : dtype && (!strcmp(dtype, "F16") || !strcmp(dtype, "BF16")) ? 2
                                                                            : 0;
    if (size == 0)
        return err_set(err, "tensor %s has dtype %s; use F32, F16 or BF16", full,
                       dtype ? dtype : "(none)");
    json_t *shape = json_object_get(t, "shape"), *offs = json_object_get(t, "data_offsets");
    int want[2] = {transpose ? cols : rows, transpose ? rows : cols};
    if (!json_is_array(shape) || (int)json_array_size(shape) != ndim)
        return err_set(err, "tensor %s should have %d dimensions", full, ndim);
    for (int d = 0; d < ndim; d++)
        if (json_integer_value(json_array_get(shape, (size_t)d)) != want[d])
            return err_set(err, "tensor %s has shape [%lld%s], expected [%d%s]", full,
                           (long long)json_integer_value(json_array_get(shape, 0)),
                           ndim == 2 ? ", ..." : "", want[0], ndim == 2 ? ", ..." : "");
    size_t count = ndim == 2 ? (size_t)rows * cols : (size_t)rows;
    json_int_t b = json_integer_value(json_array_get(offs, 0)),
               e = json_integer_value(json_array_get(offs, 1));
    if (!json_is_array(offs) || b < 0 || e < b || (uint64_t)e > in->data_len ||
        (uint64_t)(e - b) != count * (uint64_t)size)
        return err_set(err, "tensor %s's bytes do not fit the file or its shape", full);
    const uint8_t *src = in->data + b;
    for (size_t i = 0; i < count; i++) {
        float v;
        if (size == 4) {
            memcpy(&v, src + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            v = dtype[0] == 'F' ? half_to_float(h) : bf16_to_float(h);
        }
        /* source element i is at (r, c) of the source layout */
        size_t r = i / (size_t)want[1], c = i % (size_t)want[1];
        dst[transpose ? c * (size_t)cols + r : i] = v;
    }
    return 0;
}

int gpt_import_hf(GPT *m, const char *dir, char *err) {
    memset(m, 0, sizeof *m);
    char path[1200], *text = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (file_read_all(path, 1 << 20, &text, NULL, err) != 0) return -1;
    json_error_t je;
    json_t *cfg_json = json_loads(text, 0, &je);
    free(text);
    if (cfg_json == NULL) return err_set(err, "%s: not JSON (%s)", path, je.text);
    GPTConfig cfg;
    json_int_t L = 0, H = 0, C = 0, T = 0, V = 0;
    const char *act_json = "gelu_new";
    int ok = json_unpack(cfg_json, "{s:I,s:I,s:I,s:I,s:I}", "n_layer", &L, "n_head", &H, "n_embd",
                         &C, "n_positions", &T, "vocab_size", &V) == 0;
    json_unpack(cfg_json, "{s?s}", "activation_function", &act_json);
    char act[64]; /* a copy: the string belongs to cfg_json */
    snprintf(act, sizeof act, "%s", act_json);
    int gelu_ok = strcmp(act, "gelu_new") == 0 || strcmp(act, "gelu_pytorch_tanh") == 0;
    json_decref(cfg_json);
    if (!ok)
        return err_set(err,
                       "%s: not a GPT-2 config (it needs n_layer, n_head, n_embd, n_positions "
                       "and vocab_size)",
                       path);
    if (!gelu_ok)
        return err_set(err, "%s: activation %s; Strait computes gelu_new (tanh)", path, act);
    char why[ERR_LEN];
    if (gpt_config_shape(&cfg, "hf", L, C, H, T, V, why) != 0)
        return err_set(err, "%s: %s", path, why);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len;
    if (file_read_all(path, (size_t)1 << 36, &text, &len, err) != 0) return -1;
    uint64_t hl = 0;
    if (len >= 8) memcpy(&hl, text, 8);
    json_t *h = len >= 8 && hl <= len - 8 && hl <= (64u << 20)
                    ? json_loadb(text + 8, (size_t)hl, 0, &je)
                    : NULL;
    if (h == NULL || !json_is_object(h)) {
        json_decref(h);
        free(text);
        return err_set(err, "%s: not a safetensors file", path);
    }
    int flax = json_object_get(h, "transformer.wte.embedding") != NULL ||
               json_object_get(h, "wte.embedding") != NULL;
    int prefixed = json_object_get(h, "transformer.wte.weight") != NULL ||
                   json_object_get(h, "transformer.wte.embedding") != NULL;
    HfIn in = {h, (const uint8_t *)text + 8 + hl, len - 8 - (size_t)hl,
               prefixed ? "transformer." : "", flax};
    /* the config's sizes are claims: a file too small for them is refused
     * before the model they describe is allocated (2 bytes a value at the
     * least, F16 or BF16) */
    double want = (double)cfg.V * cfg.C + (double)cfg.T * cfg.C +
                  (double)cfg.L * (12.0 * cfg.C * cfg.C + 13.0 * cfg.C) + 2.0 * cfg.C;
    int rc = 2 * want > (double)in.data_len
                 ? err_set(err, "%s holds %zu bytes of tensors; config.json describes %.0f values",
                           path, in.data_len, want)
                 : gpt_build(m, &cfg, 0, err);
    if (rc == 0) {
        memset(m->params, 0, m->n_params * 4); /* padded embedding rows stay zero */
        rc = hf_take(&in, "wte.weight", 2, cfg.V, cfg.C, 0, m->params + gpt_view(m, "wte")->offset,
                     err) ||
             hf_take(&in, "wpe.weight", 2, cfg.T, cfg.C, 0, m->params + gpt_view(m, "wpe")->offset,
                     err);
    }
    for (int l = 0; l < cfg.L && rc == 0; l++)
        for (int k = 0; k < 12 && rc == 0; k++) {
            char from[64], to[64];
            snprintf(from, sizeof from, "h.%d.%s", l, HF_LAYER[k].strait);
            snprintf(to, sizeof to, "h.%d.%s", l, HF_LAYER[k].hf);
            const ParamView *v = gpt_view(m, from);
            rc = hf_take(&in, to, v->ndim, v->shape[0], v->ndim == 2 ? v->shape[1] : 1,
                         HF_LAYER[k].transpose, m->params + v->offset, err);
        }
    if (rc == 0)
        rc = hf_take(&in, "ln_f.weight", 1, cfg.C, 1, 0,
                     m->params + gpt_view(m, "ln_f.weight")->offset, err) ||
             hf_take(&in, "ln_f.bias", 1, cfg.C, 1, 0, m->params + gpt_view(m, "ln_f.bias")->offset,
                     err);
    json_decref(h);
    free(text);
    if (rc != 0) {
        gpt_free(m);
        memset(m, 0, sizeof *m);
        return -1;
    }
    return 0;
}
