/*
 * export.c — a Strait model in the formats of the tools people serve and
 * train GPT-2 with:
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
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
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

int gpt_export_hf(const GPT *m, const char *dir, char *err) {
    const GPTConfig *c = &m->cfg;
    if (file_mkdir_p(dir, 0755, err) != 0) return -1;
    int cap = 4 + 12 * c->L, n = 0, rc = 0;
    HfTensor *ts = callocCheck((size_t)cap, sizeof *ts);
    static const struct {
        const char *from, *to;
        int transpose;
    } layer[] = {{"ln_1.weight", "ln_1.weight", 0},
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
    rc = hf_add(m, &ts[n++], "wte", "wte.weight", 0, c->V, err) ||
         hf_add(m, &ts[n++], "wpe", "wpe.weight", 0, 0, err);
    for (int l = 0; l < c->L && rc == 0; l++)
        for (int k = 0; k < 12 && rc == 0; k++) {
            char from[64], to[64];
            snprintf(from, sizeof from, "h.%d.%s", l, layer[k].from);
            snprintf(to, sizeof to, "h.%d.%s", l, layer[k].to);
            rc = hf_add(m, &ts[n++], from, to, layer[k].transpose, 0, err);
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
