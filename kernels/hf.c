/*
 * hf.c — a model in and out of Hugging Face's files (API: formats.h),
 * derived from the architecture's tensor table (kernels/arch.h): each
 * view's Hugging Face name and layout are its table row's; config.json is
 * read and written by the architecture's own functions.
 *
 * Out: DIR/config.json and the tensors in PyTorch's layout, as
 * `save_pretrained` writes GPT2LMHeadModel, LlamaForCausalLM or
 * Qwen2ForCausalLM: F32, BF16 or F16 (rounded to nearest, ties to even),
 * padded embedding rows dropped, a tied output layer not written
 * (transformers ties it to the embedding); one model.safetensors, or
 * shards of at most max_shard bytes of tensors (one larger tensor alone
 * in its own) named model-0000i-of-0000n.safetensors and
 * model.safetensors.index.json; generation_config.json and the token ids
 * in config.json; and a tokenizer folder's files, copied. Everything is
 * read and checked before the first file is written; each file is written
 * atomically.
 *
 * In: config.json and one model.safetensors, or shards named by
 * model.safetensors.index.json's weight_map, each mapped read-only (a
 * tensor's pages are dropped once it is converted, so a file costs no
 * more memory than its largest tensor); F32, F16 or BF16 tensors in
 * PyTorch's layout ("weight", nn.Linear [out, in], GPT-2's Conv1D
 * [in, out]) or Flax's ("kernel" [in, out] for a Dense, GPT-2's Conv1D
 * kernels [out, in]; "embedding"; LayerNorm's "scale"), GPT-2's with or
 * without the "transformer." prefix. The config's sizes are claims: the
 * files must hold the bytes they describe before the model is allocated,
 * and every tensor's name, dtype, shape and byte range is checked before
 * any is read; a value that is not finite is refused, naming the tensor.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

typedef struct StMap {
    uint8_t *map; /* the whole file, mapped read-only (owned) */
    size_t len;
    json_t *header;
    const uint8_t *data;
    size_t data_len;
    char file[HF_SHARD_NAME];
} Shard;

typedef struct HfIn {
    HfIndex ix; /* n_files 0: one model.safetensors */
    Shard *shards;
    int n;
    size_t bytes; /* of tensor data, in all */
} HfIn;

static void hf_in_free(HfIn *in) {
    for (int i = 0; i < in->n; i++) {
        json_decref(in->shards[i].header);
        if (in->shards[i].map) munmap(in->shards[i].map, in->shards[i].len);
    }
    free(in->shards);
    hf_index_free(&in->ix);
}

static int shard_open(const char *dir, const char *file, Shard *s, char *err) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        err_set_errno(err, "%s", path);
        if (fd >= 0) close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < 8) {
        close(fd);
        return err_set(err, "%s: not a safetensors file", path);
    }
    snprintf(s->file, sizeof s->file, "%s", file);
    s->len = (size_t)st.st_size;
    void *map = mmap(NULL, s->len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return err_set_errno(err, "%s: mapping it", path);
    s->map = map;
    uint64_t hl = 0;
    memcpy(&hl, s->map, 8);
    json_error_t je;
    s->header = hl <= s->len - 8 && hl <= HF_MAX_HEADER
                    ? json_loadb((const char *)s->map + 8, (size_t)hl, 0, &je)
                    : NULL;
    if (!json_is_object(s->header)) return err_set(err, "%s: not a safetensors file", path);
    s->data = s->map + 8 + hl;
    s->data_len = s->len - 8 - (size_t)hl;
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

/* Tensor `full` of a mapped file (its header entry e): its dtype (F32, F16
 * or BF16), ndim dimensions of want, and bytes checked; with dst, its
 * values converted to fp32, transposed into dst when asked. -1 naming it. */
static int tensor_take(const Shard *sh, json_t *e, const char *full, int ndim, const int want[2],
                       int transpose, float *dst, char *err) {
    const char *dtype = json_string_value(json_object_get(e, "dtype"));
    int size = dtype && !strcmp(dtype, "F32")                               ? 4
               : dtype && (!strcmp(dtype, "F16") || !strcmp(dtype, "BF16")) ? 2
                                                                            : 0;
    if (size == 0)
        return err_set(err, "tensor %s has dtype %s; use F32, F16 or BF16", full,
                       dtype ? dtype : "(none)");
    json_t *shape = json_object_get(e, "shape"), *offs = json_object_get(e, "data_offsets");
    int two_d = ndim == 2;
    if (!json_is_array(shape) || (int)json_array_size(shape) != ndim)
        return err_set(err, "tensor %s should have %d dimensions", full, ndim);
    for (int d = 0; d < ndim; d++)
        if (json_integer_value(json_array_get(shape, (size_t)d)) != want[d])
            return err_set(err, "tensor %s has shape [%lld%s%lld], expected [%d%s%d]", full,
                           (long long)json_integer_value(json_array_get(shape, 0)),
                           two_d ? ", " : "",
                           two_d ? (long long)json_integer_value(json_array_get(shape, 1)) : 0LL,
                           want[0], two_d ? ", " : "", two_d ? want[1] : 0);
    size_t count = (size_t)want[0] * (size_t)want[1];
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
        if (!isfinite(v))
            return err_set(err, "%s: tensor %s holds %s at element %zu", sh->file, full,
                           isnan(v) ? "NaN" : "an infinity", i);
        /* source element i is at (r, c) of the source layout */
        size_t r = i / (size_t)want[1], c = i % (size_t)want[1];
        dst[transpose ? c * (size_t)want[0] + r : i] = v;
    }
    /* the tensor's pages are read: give them back (the file keeps them) */
    size_t page = (size_t)sysconf(_SC_PAGESIZE), from = (size_t)(src - sh->map) / page * page;
    madvise(sh->map + from, (size_t)(src - sh->map) + count * size - from, MADV_DONTNEED);
    return 0;
}

/* The file's tensor for view v (table row t, layer l): found under its
 * PyTorch or Flax name, its dtype, shape and bytes checked; with dst, its
 * values converted to fp32 into Strait's layout. -1 naming it. */
static int hf_take(const HfIn *in, const Model *m, const ArchTensor *t, int l, const char *prefix,
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
    int want[2] = {transpose ? cols : rows, transpose ? rows : cols};
    return tensor_take(sh, e, full, two_d ? 2 : 1, want, transpose, dst, err);
}

/* ---- one file, for other formats' readers (formats.h) ---------------------------- */

StMap *st_map(const char *dir, const char *file, char *err) {
    Shard *s = callocCheck(1, sizeof *s);
    if (shard_open(dir, file, s, err) == 0) return s;
    st_unmap(s);
    return NULL;
}

void st_unmap(StMap *s) {
    if (s == NULL) return;
    json_decref(s->header);
    if (s->map) munmap(s->map, s->len);
    free(s);
}

json_t *st_header(const StMap *s) {
    return s->header;
}

int st_take(const StMap *s, const char *name, int rows, int cols, float *dst, char *err) {
    json_t *e = json_object_get(s->header, name);
    if (!json_is_object(e) || strcmp(name, "__metadata__") == 0)
        return err_set(err, "%s has no tensor %s", s->file, name);
    int want[2] = {rows, cols};
    return tensor_take(s, e, name, 2, want, 0, dst, err);
}

/* every view of m from the files: all checked first (dst NULL), then read */
static int hf_take_all(const HfIn *in, Model *m, const char *prefix, int read, char *err) {
    const Arch *a = m->arch;
    for (int r = 0; r < a->n_tensors; r++)
        for (int l = 0; l < (a->tensors[r].layer ? m->cfg.L : 1); l++) {
            float *dst = arch_w(m, model_base(m), r, l);
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

int hf_config_load(const char *path, ModelConfig *cfg, char *err) {
    char *text = NULL;
    if (file_read_all(path, 1 << 20, &text, NULL, err) != 0) return -1;
    json_error_t je;
    json_t *cj = json_loads(text, 0, &je);
    free(text);
    if (!json_is_object(cj)) {
        json_decref(cj);
        return err_set(err, "%s: not a JSON object (%s)", path, je.text);
    }
    memset(cfg, 0, sizeof *cfg);
    char why[ERR_LEN];
    const Arch *a = hf_arch(cj, path, err);
    int rc = a == NULL ? -1 : a->hf_config_read(cj, cfg, why);
    json_decref(cj);
    if (a == NULL) return -1;
    if (rc == 0) {
        cfg->arch = model_arch_of(a->name);
        snprintf(cfg->name, sizeof cfg->name, "hf");
        rc = model_config_check(cfg, why);
    }
    return rc != 0 ? err_set(err, "%s: %s", path, why) : 0;
}

int model_import_hf(Model *m, const char *dir, char *err) {
    memset(m, 0, sizeof *m);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ModelConfig cfg;
    if (hf_config_load(path, &cfg, err) != 0) return -1;
    const Arch *a = arch_of(cfg.arch);
    int rc;
    HfIn in;
    if (hf_in_open(dir, &in, err) != 0) {
        hf_in_free(&in);
        return -1;
    }
    /* the config's sizes are claims: files too small for them are refused
     * before the model they describe is allocated (2 bytes a value at the
     * least, F16 or BF16; the files hold no padded embedding rows) */
    ModelConfig unpadded = cfg;
    unpadded.Vp = cfg.V;
    double want = model_config_params(&unpadded);
    rc = 2 * want > (double)in.bytes
             ? err_set(err, "%s holds %zu bytes of tensors; config.json describes %.0f values", dir,
                       in.bytes, want)
             : model_build(m, &cfg, 0, err);
    if (rc == 0) {
        memset(m->params, 0, m->n_params * 4); /* padded embedding rows stay zero */
        rc = hf_take_all(&in, m, a->hf_prefix, 0, err) || hf_take_all(&in, m, a->hf_prefix, 1, err)
                 ? -1
                 : 0;
    }
    hf_in_free(&in);
    if (rc != 0 && m->params) model_free(m);
    return rc;
}

/* ---- writing ---------------------------------------------------------------------- */

static const char *const DTYPE_ST[] = {[HF_F32] = "F32", [HF_BF16] = "BF16", [HF_F16] = "F16"};
static const char *const DTYPE_TORCH[] = {
    [HF_F32] = "float32", [HF_BF16] = "bfloat16", [HF_F16] = "float16"};
/* the files a tokenizer folder may hold, copied as they are */
static const char *const TOKENIZER_FILES[] = {"tokenizer.json",
                                              "tokenizer_config.json",
                                              "special_tokens_map.json",
                                              "vocab.json",
                                              "merges.txt",
                                              "chat_template.jinja",
                                              "tokenizer.model",
                                              "added_tokens.json",
                                              "generation_config.json"};
#define N_TOKENIZER_FILES (int)(sizeof TOKENIZER_FILES / sizeof TOKENIZER_FILES[0])
static const char *const ID_KEYS[] = {"bos_token_id", "eos_token_id", "pad_token_id"};

/* One tensor of the Hugging Face files: its name, shape, where its values
 * are in the model (Strait's layout) and the shard it goes to. */
typedef struct HfTensor {
    char name[160];
    int ndim, shape[2];
    const float *src;
    int conv1d; /* src is [shape[1], shape[0]]: write it transposed */
    size_t count;
    int shard;
} HfTensor;

static void tensor_encode(const HfTensor *t, int dtype, void *out) {
    size_t rows = (size_t)t->shape[0], cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
    for (size_t i = 0; i < t->count; i++) {
        /* element (r, c) of the file's layout; Conv1D's is Strait's transposed */
        size_t r = i / cols, c = i % cols;
        float v = t->conv1d ? t->src[c * rows + r] : t->src[i];
        if (dtype == HF_F32)
            ((float *)out)[i] = v;
        else
            ((uint16_t *)out)[i] = dtype == HF_BF16 ? float_to_bf16(v) : float_to_half(v);
    }
}

static int write_shard(const char *path, const HfTensor *ts, int n, int shard, int dtype,
                       char *err) {
    size_t elt = dtype == HF_F32 ? 4 : 2, off = 0, most = 0;
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    for (int i = 0; i < n; i++) {
        if (ts[i].shard != shard) continue;
        json_t *shape = json_array();
        for (int d = 0; d < ts[i].ndim; d++)
            json_array_append_new(shape, json_integer(ts[i].shape[d]));
        size_t bytes = ts[i].count * elt;
        json_object_set_new(h, ts[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", DTYPE_ST[dtype], "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + bytes)));
        off += bytes;
        most = bytes > most ? bytes : most;
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
    uint64_t len_le = padded;
    void *buf = mallocCheck(most ? most : 1);
    AtomicFile *af = file_atomic_open(path, 0644, err);
    int rc = af ? 0 : -1;
    if (rc == 0)
        rc = file_atomic_write(af, &len_le, 8, err) || file_atomic_write(af, text, hl, err) ||
                     file_atomic_write(af, "        ", padded - hl, err)
                 ? -1
                 : 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (ts[i].shard != shard) continue;
        tensor_encode(&ts[i], dtype, buf);
        rc = file_atomic_write(af, buf, ts[i].count * elt, err);
    }
    free(text), free(buf);
    if (af && rc != 0) file_atomic_abort(af);
    return rc == 0 ? file_atomic_commit(af, err) : -1;
}

int st_write(const char *path, const StTensor *ts, int n, char *err) {
    HfTensor *hs = callocCheck((size_t)(n ? n : 1), sizeof *hs);
    for (int i = 0; i < n; i++) {
        snprintf(hs[i].name, sizeof hs[i].name, "%s", ts[i].name);
        hs[i].ndim = 2, hs[i].shape[0] = ts[i].shape[0], hs[i].shape[1] = ts[i].shape[1];
        hs[i].src = ts[i].src;
        hs[i].count = (size_t)ts[i].shape[0] * (size_t)ts[i].shape[1];
    }
    int rc = write_shard(path, hs, n, 0, HF_F32, err);
    free(hs);
    return rc;
}

/* A tokenizer folder's files, read whole before anything is written. */
typedef struct HfFiles {
    char *text[N_TOKENIZER_FILES]; /* NULL: the folder has none (owned) */
    size_t len[N_TOKENIZER_FILES];
    json_t *ids; /* bos/eos/pad ids: generation_config.json's, else config.json's (owned) */
} HfFiles;

static void hf_files_free(HfFiles *f) {
    for (int i = 0; i < N_TOKENIZER_FILES; i++) free(f->text[i]);
    json_decref(f->ids);
}

/* the ids of a JSON file of the folder, those not already in f->ids */
static int ids_take(HfFiles *f, const char *dir, const char *file, const char *text, size_t len,
                    char *err) {
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return err_set(err, "%s/%s: not a JSON object (%s)", dir, file, je.text);
    }
    for (int k = 0; k < 3; k++) {
        json_t *v = json_object_get(j, ID_KEYS[k]);
        if (v == NULL || json_is_null(v) || json_object_get(f->ids, ID_KEYS[k])) continue;
        int ok = json_is_integer(v) || (json_is_array(v) && json_array_size(v) > 0);
        for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++)
            ok = ok && json_is_integer(json_array_get(v, i));
        if (!ok) {
            json_decref(j);
            return err_set(err, "%s/%s: %s should be a token id or a list of them", dir, file,
                           ID_KEYS[k]);
        }
        json_object_set(f->ids, ID_KEYS[k], v);
    }
    json_decref(j);
    return 0;
}

static int hf_files_read(HfFiles *f, const char *dir, char *err) {
    memset(f, 0, sizeof *f);
    f->ids = json_object();
    if (dir == NULL) return 0;
    char path[1200];
    int found = 0;
    for (int i = 0; i < N_TOKENIZER_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, TOKENIZER_FILES[i]);
        if (access(path, F_OK) != 0) continue;
        if (file_read_all(path, (size_t)1 << 30, &f->text[i], &f->len[i], err) != 0) return -1;
        found += i < N_TOKENIZER_FILES - 1; /* generation_config.json is not a tokenizer */
    }
    if (!found)
        return err_set(err,
                       "%s holds no tokenizer files (tokenizer.json, vocab.json and merges.txt, "
                       "tokenizer.model); name the Hugging Face folder the model came from",
                       dir);
    if (f->text[N_TOKENIZER_FILES - 1] &&
        ids_take(f, dir, "generation_config.json", f->text[N_TOKENIZER_FILES - 1],
                 f->len[N_TOKENIZER_FILES - 1], err) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    if (access(path, F_OK) != 0) return 0;
    if (file_read_all(path, 1 << 20, &text, &len, err) != 0) return -1;
    int rc = ids_take(f, dir, "config.json", text, len, err);
    free(text);
    return rc;
}

/* every id of v below V */
static int ids_fit(json_t *v, const char *key, int V, char *err) {
    for (size_t i = 0; i < (json_is_array(v) ? json_array_size(v) : 1); i++) {
        json_int_t id = json_integer_value(json_is_array(v) ? json_array_get(v, i) : v);
        if (id < 0 || id >= V)
            return err_set(err,
                           "%s %lld is outside the model's vocabulary of %d; give the tokenizer "
                           "the model was trained with",
                           key, (long long)id, V);
    }
    return 0;
}

/* Old files of another layout (a model.safetensors beside new shards, or
 * an index and its shards beside a new model.safetensors) would be read
 * before the new ones: removed. */
static void remove_stale(const char *dir, int sharded) {
    char path[1200], *text;
    size_t len;
    char err[ERR_LEN];
    if (sharded) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (file_read_all(path, 64u << 20, &text, &len, err) != 0) return;
    HfIndex ix;
    if (hf_index_parse(text, len, &ix, err) == 0) {
        for (int i = 0; i < ix.n_files; i++) {
            char shard[1500];
            snprintf(shard, sizeof shard, "%s/%s", dir, ix.files[i]);
            unlink(shard);
        }
        hf_index_free(&ix);
    }
    free(text);
    unlink(path);
}

static int write_json(const char *dir, const char *file, json_t *j, char *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    size_t n = strlen(text);
    text = realloc(text, n + 2);
    if (text == NULL) DIE("out of memory for %s", file);
    text[n] = '\n', text[n + 1] = '\0';
    int rc = file_write_atomic(path, text, n + 1, 0644, err);
    free(text);
    return rc;
}

int model_export_hf(const Model *m, const char *dir, const HfExport *opt, char *err) {
    HfExport o = HF_EXPORT_DEFAULTS;
    if (opt) o = *opt;
    if (o.dtype < HF_F32 || o.dtype > HF_F16) return err_set(err, "unknown dtype %d", o.dtype);
    size_t max_shard = o.max_shard ? o.max_shard : HF_SHARD_DEFAULT;
    const Arch *a = m->arch;
    HfFiles tok;
    if (hf_files_read(&tok, o.tokenizer_dir, err) != 0) {
        hf_files_free(&tok);
        return -1;
    }
    int given[3] = {o.bos, o.eos, o.pad};
    for (int k = 0; k < 3; k++)
        if (given[k] >= 0) json_object_set_new(tok.ids, ID_KEYS[k], json_integer(given[k]));
    for (int k = 0; k < 3; k++) {
        json_t *v = json_object_get(tok.ids, ID_KEYS[k]);
        if (v && ids_fit(v, ID_KEYS[k], m->cfg.V, err) != 0) {
            hf_files_free(&tok);
            return -1;
        }
    }
    if (file_mkdir_p(dir, 0755, err) != 0) {
        hf_files_free(&tok);
        return -1;
    }
    /* the tensors, in table order, cut into shards of at most max_shard bytes */
    assert(!m->base_rounded); /* the base as loaded, never after a bf16 pass */
    HfTensor *ts = callocCheck((size_t)model_base_n_views(m), sizeof *ts);
    size_t elt = o.dtype == HF_F32 ? 4 : 2, in_shard = 0, total = 0;
    int n = 0, shards = 1;
    for (int r = 0; r < a->n_tensors; r++)
        for (int l = 0; l < (a->tensors[r].layer ? m->cfg.L : 1); l++) {
            const float *src = arch_w(m, model_base(m), r, l);
            if (src == NULL) continue;
            const ArchTensor *t = &a->tensors[r];
            HfTensor *w = &ts[n++];
            char base[160];
            hf_name(base, sizeof base, t->hf, l);
            snprintf(w->name, sizeof w->name, "%s%s", a->hf_prefix, base);
            int two_d = t->d1 != DIM_NONE;
            int rows = t->d0 == DIM_VP ? m->cfg.V : arch_dim(&m->cfg, t->d0); /* no padding */
            int cols = two_d ? arch_dim(&m->cfg, t->d1) : 1;
            w->ndim = two_d ? 2 : 1;
            w->src = src;
            w->conv1d = two_d && t->hf_conv1d; /* [out, in] → Conv1D's [in, out] */
            w->shape[0] = w->conv1d ? cols : rows, w->shape[1] = w->conv1d ? rows : cols;
            w->count = (size_t)rows * cols;
            size_t bytes = w->count * elt;
            if (in_shard > 0 && in_shard + bytes > max_shard) shards++, in_shard = 0;
            w->shard = shards - 1;
            in_shard += bytes, total += bytes;
        }
    remove_stale(dir, shards > 1);
    char path[1200], file[64];
    json_t *map = json_object();
    int rc = 0;
    for (int s = 0; s < shards && rc == 0; s++) {
        if (shards == 1)
            snprintf(file, sizeof file, "model.safetensors");
        else
            snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, shards);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        rc = write_shard(path, ts, n, s, o.dtype, err);
        for (int i = 0; i < n; i++)
            if (ts[i].shard == s) json_object_set_new(map, ts[i].name, json_string(file));
    }
    double n_params = 0;
    for (int i = 0; i < n; i++) n_params += (double)ts[i].count;
    free(ts);
    if (rc == 0 && shards > 1) {
        json_t *ix =
            json_pack("{s:{s:I,s:I},s:o}", "metadata", "total_parameters", (json_int_t)n_params,
                      "total_size", (json_int_t)total, "weight_map", json_incref(map));
        rc = write_json(dir, "model.safetensors.index.json", ix, err);
        json_decref(ix);
    }
    json_decref(map);
    /* config.json: the architecture's, with the token ids and the files' dtype */
    json_t *cfg = a->hf_config_write(&m->cfg);
    json_object_set_new(cfg, "torch_dtype", json_string(DTYPE_TORCH[o.dtype]));
    for (int k = 0; k < 3; k++) {
        json_t *v = json_object_get(tok.ids, ID_KEYS[k]);
        if (v) json_object_set(cfg, ID_KEYS[k], v);
    }
    if (rc == 0) rc = write_json(dir, "config.json", cfg, err);
    /* generation_config.json: the tokenizer folder's, or one of the ids */
    json_t *gen = NULL;
    if (tok.text[N_TOKENIZER_FILES - 1])
        gen = json_loadb(tok.text[N_TOKENIZER_FILES - 1], tok.len[N_TOKENIZER_FILES - 1], 0, NULL);
    if (gen == NULL) gen = json_pack("{s:b}", "_from_model_config", 1);
    int any = 0;
    for (int k = 0; k < 3; k++) {
        json_t *v = json_object_get(cfg, ID_KEYS[k]);
        if (v && !json_is_null(v)) json_object_set(gen, ID_KEYS[k], v), any = 1;
    }
    if (rc == 0 && any) rc = write_json(dir, "generation_config.json", gen, err);
    json_decref(gen), json_decref(cfg);
    for (int i = 0; i < N_TOKENIZER_FILES - 1 && rc == 0; i++) {
        if (tok.text[i] == NULL) continue;
        snprintf(path, sizeof path, "%s/%s", dir, TOKENIZER_FILES[i]);
        rc = file_write_atomic(path, tok.text[i], tok.len[i], 0644, err);
    }
    hf_files_free(&tok);
    return rc;
}
