/*
 * hf.c — a model in and out of Hugging Face's files (API: formats.h),
 * derived from the architecture's tensor table (kernels/arch.h): each
 * view's Hugging Face name and layout are its table row's; config.json is
 * read and written by the architecture's own functions.
 *
 * Out: DIR/config.json and DIR/model.safetensors in PyTorch's layout (F32),
 * as `save_pretrained` writes GPT2LMHeadModel, LlamaForCausalLM or
 * Qwen2ForCausalLM: padded embedding rows dropped, a tied output layer not
 * written (transformers ties it to the embedding).
 *
 * In: config.json and one model.safetensors, or shards named by
 * model.safetensors.index.json's weight_map; F32, F16 or BF16 tensors in
 * PyTorch's layout ("weight", nn.Linear [out, in], GPT-2's Conv1D
 * [in, out]) or Flax's ("kernel" [in, out] for a Dense, GPT-2's Conv1D
 * kernels [out, in]; "embedding"; LayerNorm's "scale"), GPT-2's with or
 * without the "transformer." prefix. The config's sizes are claims: the
 * files must hold the bytes they describe before the model is allocated,
 * and every tensor's name, dtype, shape and byte range is checked before
 * any is read. A missing or mis-shaped one is named.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/arch.h"
#include "kernels/formats.h"
#include "kernels/half.h"
#include "kernels/model.h"
#include "util/util.h"

#define HF_MAX_SHARDS 4096
#define HF_MAX_HEADER (64u << 20)

/* ---- the sharded index ----------------------------------------------------------- */

void hf_index_free(HfIndex *ix) {
    json_decref(ix->map);
    free(ix->files);
    memset(ix, 0, sizeof *ix);
}

/* a shard's name: a plain file in the folder */
static int shard_name_ok(const char *f) {
    size_t n = strlen(f);
    return n > 12 && n < HF_SHARD_NAME && f[0] != '.' && strchr(f, '/') == NULL &&
           strcmp(f + n - 12, ".safetensors") == 0;
}

int hf_index_parse(const char *text, size_t len, HfIndex *ix, char *err) {
    memset(ix, 0, sizeof *ix);
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        json_decref(root);
        return err_set(err, "model.safetensors.index.json has no weight_map object");
    }
    ix->map = json_incref(map);
    json_decref(root);
    const char *name;
    json_t *v;
    json_object_foreach(ix->map, name, v) {
        const char *f = json_string_value(v);
        if (f == NULL || !shard_name_ok(f)) { /* the message before the map it quotes goes */
            err_set(err,
                    "model.safetensors.index.json maps %.80s to %.80s; a shard is a "
                    "*.safetensors file in the same folder",
                    name, f ? f : "no file name");
            hf_index_free(ix);
            return -1;
        }
        int seen = 0;
        for (int i = 0; i < ix->n_files && !seen; i++) seen = strcmp(ix->files[i], f) == 0;
        if (seen) continue;
        if (ix->n_files == HF_MAX_SHARDS) {
            hf_index_free(ix);
            return err_set(err, "model.safetensors.index.json names more than %d shards",
                           HF_MAX_SHARDS);
        }
        ix->files = realloc(ix->files, sizeof *ix->files * (size_t)(ix->n_files + 1));
        if (ix->files == NULL) DIE("out of memory for a shard list");
        snprintf(ix->files[ix->n_files++], HF_SHARD_NAME, "%s", f);
    }
    if (ix->n_files == 0) {
        hf_index_free(ix);
        return err_set(err, "model.safetensors.index.json's weight_map is empty");
    }
    return 0;
}

/* ---- reading safetensors files ---------------------------------------------------- */

typedef struct Shard {
    char *text; /* the whole file (owned) */
    json_t *header;
    const uint8_t *data;
    size_t data_len;
} Shard;

typedef struct HfIn {
    HfIndex ix; /* n_files 0: one model.safetensors */
    Shard *shards;
    int n;
    size_t bytes; /* of tensor data, in all */
} HfIn;

static void hf_in_free(HfIn *in) {
    for (int i = 0; i < in->n; i++) json_decref(in->shards[i].header), free(in->shards[i].text);
    free(in->shards);
    hf_index_free(&in->ix);
}

static int shard_open(const char *dir, const char *file, Shard *s, char *err) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    size_t len;
    if (file_read_all(path, (size_t)1 << 37, &s->text, &len, err) != 0) return -1;
    uint64_t hl = 0;
    if (len >= 8) memcpy(&hl, s->text, 8);
    json_error_t je;
    s->header = len >= 8 && hl <= len - 8 && hl <= HF_MAX_HEADER
                    ? json_loadb(s->text + 8, (size_t)hl, 0, &je)
                    : NULL;
    if (!json_is_object(s->header)) return err_set(err, "%s: not a safetensors file", path);
    s->data = (const uint8_t *)s->text + 8 + hl;
    s->data_len = len - 8 - (size_t)hl;
    return 0;
}

static int hf_in_open(const char *dir, HfIn *in, char *err) {
    memset(in, 0, sizeof *in);
    char path[1200], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) == 0) {
        if (file_read_all(path, 64u << 20, &text, &len, err) != 0) return -1;
        char why[ERR_LEN];
        int rc = hf_index_parse(text, len, &in->ix, why);
        free(text);
        if (rc != 0) return err_set(err, "%s: %s", path, why);
    }
    int n = in->ix.n_files ? in->ix.n_files : 1;
    in->shards = callocCheck((size_t)n, sizeof(Shard));
    for (; in->n < n; in->n++) {
        const char *f = in->ix.n_files ? in->ix.files[in->n] : "model.safetensors";
        if (shard_open(dir, f, &in->shards[in->n], err) != 0) {
            in->n++;
            return -1;
        }
        in->bytes += in->shards[in->n].data_len;
    }
    return 0;
}

/* the header entry of tensor `name`, and its shard; NULL if absent */
static json_t *hf_find(const HfIn *in, const char *name, const Shard **shard) {
    int k = 0;
    if (in->ix.n_files) {
        const char *f = json_string_value(json_object_get(in->ix.map, name));
        if (f == NULL) return NULL;
        while (k < in->ix.n_files && strcmp(in->ix.files[k], f) != 0) k++;
        if (k == in->ix.n_files) return NULL;
    }
    json_t *t = json_object_get(in->shards[k].header, name);
    *shard = &in->shards[k];
    return json_is_object(t) ? t : NULL;
}

/* a table row's Hugging Face name at layer l ("%d" in the pattern) */
static void hf_name(char *out, size_t n, const char *pattern, int l) {
    const char *at = strstr(pattern, "%d");
    if (at == NULL)
        snprintf(out, n, "%s", pattern);
    else
        snprintf(out, n, "%.*s%d%s", (int)(at - pattern), pattern, l, at + 2);
}

/* The file's tensor for view v (table row t, layer l): found under its
 * PyTorch or Flax name, its dtype, shape and bytes checked; with dst, its
 * values converted to fp32 into Strait's layout. -1 naming it. */
static int hf_take(const HfIn *in, const GPT *m, const ArchTensor *t, int l, const char *prefix,
                   float *dst, char *err) {
    char base[160], full[200];
    hf_name(base, sizeof base, t->hf, l);
    static const char *const flax_end[] = {NULL, "embedding", "kernel", "scale"};
    json_t *e = NULL;
    const Shard *sh = NULL;
    int variant = 0;
    for (int pass = 0; pass < 2 && e == NULL; pass++) {
        const char *pre = pass == 0 ? prefix : "";
        if (pass == 1 && pre[0] == '\0' && prefix[0] == '\0') break;
        for (variant = 0; variant < 4 && e == NULL; variant++) {
            snprintf(full, sizeof full, "%s%s", pre, base);
            char *dot = strrchr(full, '.');
            if (variant > 0) {
                if (dot == NULL || strcmp(dot, ".weight") != 0) break;
                snprintf(dot + 1, sizeof full - (size_t)(dot + 1 - full), "%s", flax_end[variant]);
            }
            e = hf_find(in, full, &sh);
        }
    }
    if (e == NULL) return err_set(err, "the checkpoint has no tensor %s%s", prefix, base);
    variant--;
    int two_d = t->d1 != DIM_NONE;
    int rows = t->d0 == DIM_VP ? m->cfg.V : arch_dim(&m->cfg, t->d0);
    int cols = two_d ? arch_dim(&m->cfg, t->d1) : 1;
    /* PyTorch stores Conv1D transposed; Flax stores a Dense transposed */
    int transpose = two_d && (variant == 0 ? t->hf_conv1d : variant == 2 ? !t->hf_conv1d : 0);
    const char *dtype = json_string_value(json_object_get(e, "dtype"));
    int size = dtype && !strcmp(dtype, "F32")                               ? 4
               : dtype && (!strcmp(dtype, "F16") || !strcmp(dtype, "BF16")) ? 2
                                                                            : 0;
    if (size == 0)
        return err_set(err, "tensor %s has dtype %s; use F32, F16 or BF16", full,
                       dtype ? dtype : "(none)");
    json_t *shape = json_object_get(e, "shape"), *offs = json_object_get(e, "data_offsets");
    int want[2] = {transpose ? cols : rows, transpose ? rows : cols};
    int ndim = two_d ? 2 : 1;
    if (!json_is_array(shape) || (int)json_array_size(shape) != ndim)
        return err_set(err, "tensor %s should have %d dimensions", full, ndim);
    for (int d = 0; d < ndim; d++)
        if (json_integer_value(json_array_get(shape, (size_t)d)) != want[d])
            return err_set(err, "tensor %s has shape [%lld%s%lld], expected [%d%s%d]", full,
                           (long long)json_integer_value(json_array_get(shape, 0)),
                           two_d ? ", " : "",
                           two_d ? (long long)json_integer_value(json_array_get(shape, 1)) : 0LL,
                           want[0], two_d ? ", " : "", two_d ? want[1] : 0);
    size_t count = (size_t)rows * cols;
    json_int_t b = json_integer_value(json_array_get(offs, 0)),
               en = json_integer_value(json_array_get(offs, 1));
    if (!json_is_array(offs) || b < 0 || en < b || (uint64_t)en > sh->data_len ||
        (uint64_t)(en - b) != count * (uint64_t)size)
        return err_set(err, "tensor %s's bytes do not fit the file or its shape", full);
    if (dst == NULL) return 0;
    const uint8_t *src = sh->data + b;
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

/* every view of m from the files: all checked first (dst NULL), then read */
static int hf_take_all(const HfIn *in, GPT *m, const char *prefix, int read, char *err) {
    const Arch *a = m->arch;
    for (int r = 0; r < a->n_tensors; r++)
        for (int l = 0; l < (a->tensors[r].layer ? m->cfg.L : 1); l++) {
            float *dst = arch_w(m, m->params, r, l);
            if (dst == NULL) continue; /* not in this configuration */
            if (hf_take(in, m, &a->tensors[r], l, prefix, read ? dst : NULL, err) != 0) return -1;
        }
    return 0;
}

/* config.json's architecture: model_type, else (older GPT-2 files) gpt2 */
static const Arch *hf_arch(json_t *cfg, const char *path, char *err) {
    const char *type = json_string_value(json_object_get(cfg, "model_type"));
    if (type == NULL && json_object_get(cfg, "n_layer")) type = "gpt2";
    for (int i = 0; type && i < ARCH_COUNT; i++)
        if (strcmp(arch_of(i)->hf_type, type) == 0) return arch_of(i);
    err_set(err,
            "%s: model_type %s is not one Strait trains (gpt2, llama — SmolLM2 and Llama 2 and "
            "3 among them —, qwen2)",
            path, type ? type : "(none)");
    return NULL;
}

int gpt_import_hf(GPT *m, const char *dir, char *err) {
    memset(m, 0, sizeof *m);
    char path[1200], *text = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (file_read_all(path, 1 << 20, &text, NULL, err) != 0) return -1;
    json_error_t je;
    json_t *cj = json_loads(text, 0, &je);
    free(text);
    if (!json_is_object(cj)) {
        json_decref(cj);
        return err_set(err, "%s: not a JSON object (%s)", path, je.text);
    }
    GPTConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    char why[ERR_LEN];
    const Arch *a = hf_arch(cj, path, err);
    int rc = a == NULL ? -1 : a->hf_config_read(cj, &cfg, why);
    json_decref(cj);
    if (a == NULL) return -1;
    if (rc == 0) {
        cfg.arch = model_arch_of(a->name);
        snprintf(cfg.name, sizeof cfg.name, "hf");
        rc = model_config_check(&cfg, why);
    }
    if (rc != 0) return err_set(err, "%s: %s", path, why);
    HfIn in;
    if (hf_in_open(dir, &in, err) != 0) {
        hf_in_free(&in);
        return -1;
    }
    /* the config's sizes are claims: files too small for them are refused
     * before the model they describe is allocated (2 bytes a value at the
     * least, F16 or BF16) */
    double want = gpt_config_params(&cfg);
    rc = 2 * want > (double)in.bytes
             ? err_set(err, "%s holds %zu bytes of tensors; config.json describes %.0f values", dir,
                       in.bytes, want)
             : gpt_build(m, &cfg, 0, err);
    if (rc == 0) {
        memset(m->params, 0, m->n_params * 4); /* padded embedding rows stay zero */
        rc = hf_take_all(&in, m, a->hf_prefix, 0, err) || hf_take_all(&in, m, a->hf_prefix, 1, err)
                 ? -1
                 : 0;
    }
    hf_in_free(&in);
    if (rc != 0 && m->params) gpt_free(m);
    return rc;
}

/* ---- writing ---------------------------------------------------------------------- */

/* One tensor of the Hugging Face file: its name, shape and data (owned). */
typedef struct HfTensor {
    char name[160];
    int ndim, shape[2];
    float *data;
} HfTensor;

static int write_hf_safetensors(const char *path, HfTensor *ts, int n, char *err) {
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)ts[i].shape[0] * (ts[i].ndim == 2 ? (size_t)ts[i].shape[1] : 1) * 4;
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
        size_t count = (size_t)ts[i].shape[0] * (ts[i].ndim == 2 ? (size_t)ts[i].shape[1] : 1);
        rc = file_atomic_write(af, ts[i].data, count * 4, err);
    }
    free(text);
    if (af && rc != 0) file_atomic_abort(af);
    return rc == 0 ? file_atomic_commit(af, err) : -1;
}

int gpt_export_hf(const GPT *m, const char *dir, char *err) {
    const Arch *a = m->arch;
    if (file_mkdir_p(dir, 0755, err) != 0) return -1;
    HfTensor *ts = callocCheck((size_t)m->n_views, sizeof *ts);
    int n = 0;
    for (int r = 0; r < a->n_tensors; r++)
        for (int l = 0; l < (a->tensors[r].layer ? m->cfg.L : 1); l++) {
            const float *src = arch_w(m, m->params, r, l);
            if (src == NULL) continue;
            const ArchTensor *t = &a->tensors[r];
            HfTensor *o = &ts[n++];
            char base[160];
            hf_name(base, sizeof base, t->hf, l);
            snprintf(o->name, sizeof o->name, "%s%s", a->hf_prefix, base);
            int two_d = t->d1 != DIM_NONE;
            int rows = t->d0 == DIM_VP ? m->cfg.V : arch_dim(&m->cfg, t->d0); /* no padding */
            int cols = two_d ? arch_dim(&m->cfg, t->d1) : 1;
            o->ndim = two_d ? 2 : 1;
            o->data = mallocCheck((size_t)rows * cols * 4);
            if (two_d && t->hf_conv1d) { /* [out, in] → Conv1D's [in, out] */
                for (int i = 0; i < rows; i++)
                    for (int j = 0; j < cols; j++)
                        o->data[(size_t)j * rows + i] = src[(size_t)i * cols + j];
                o->shape[0] = cols, o->shape[1] = rows;
            } else {
                memcpy(o->data, src, (size_t)rows * cols * 4);
                o->shape[0] = rows, o->shape[1] = cols;
            }
        }
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = write_hf_safetensors(path, ts, n, err);
    for (int i = 0; i < n; i++) free(ts[i].data);
    free(ts);
    if (rc != 0) return -1;
    json_t *cfg = a->hf_config_write(&m->cfg);
    char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = file_write_atomic(path, text, strlen(text), 0644, err);
    free(text);
    return rc;
}
