/*
 * safetensors.c — checkpoints in the safetensors format, readable by
 * PyTorch and Hugging Face tools: an 8-byte little-endian header length, a
 * JSON header (jansson) naming each tensor's dtype, shape and byte range,
 * then the raw little-endian tensors. __metadata__ carries the model
 * config, the step and the parameter-table hash. The AdamW moments go to a
 * second file beside it, "<name>.opt.safetensors".
 *
 * The reader checks the header length, every offset, dtype and shape against
 * the model before it touches tensor data.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/model.h"
#include "kernels/formats.h"
#include "kernels/half.h"
#include "util/util.h"

#define ST_MAX_HEADER (64u << 20)

/* Writes tensors (prefix + view name) from `base` with the metadata: F32,
 * or BF16 (elem 2: bases hold bf16 bits). */
/* where write_file_as takes the tensors' bytes: bases[b] in memory, or
 * fill's pieces (model_save_optimizer_from) */
typedef struct Source {
    const void *const *bases;
    void (*fill)(void *ctx, int k, size_t at, size_t n, void *buf);
    void *ctx;
} Source;

static int write_file_src(const char *path, const Model *m, const Source *src,
                          const char *const *prefixes, int n_bases, int step, int elem, char *err) {
    json_t *h = json_object(), *meta = json_object();
    char *cfg = model_config_json(&m->cfg);
    char hash[32], step_s[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)m->table_hash);
    snprintf(step_s, sizeof step_s, "%d", step);
    json_object_set_new(meta, "format", json_string("strait"));
    json_object_set_new(meta, "config", json_string(cfg));
    json_object_set_new(meta, "step", json_string(step_s));
    json_object_set_new(meta, "table_hash", json_string(hash));
    free(cfg);
    json_object_set_new(h, "__metadata__", meta);
    size_t off = 0;
    for (int b = 0; b < n_bases; b++)
        for (int i = 0; i < m->n_views; i++) {
            const ParamView *v = &m->views[i];
            char name[96];
            snprintf(name, sizeof name, "%s%s", prefixes[b], v->name);
            json_t *t = json_object(), *shape = json_array();
            for (int d = 0; d < v->ndim; d++)
                json_array_append_new(shape, json_integer(v->shape[d]));
            json_object_set_new(t, "dtype", json_string(elem == 2 ? "BF16" : "F32"));
            json_object_set_new(t, "shape", shape);
            json_object_set_new(
                t, "data_offsets",
                json_pack("[I,I]", (json_int_t)off, (json_int_t)(off + v->numel * (size_t)elem)));
            json_object_set_new(h, name, t);
            off += v->numel * (size_t)elem;
        }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
    AtomicFile *af = file_atomic_open(path, 0644, err);
    int rc = -1, bad = af == NULL;
    uint64_t len_le = padded;
    char spaces[8] = "        ";
    bad = bad || file_atomic_write(af, &len_le, 8, err) || file_atomic_write(af, text, hl, err) ||
          file_atomic_write(af, spaces, padded - hl, err);
    if (bad && src->fill == NULL) {
        if (af) file_atomic_abort(af);
        goto out;
    }
    if (src->fill == NULL) {
        for (int b = 0; b < n_bases; b++)
            for (int i = 0; i < m->n_views; i++)
                if (file_atomic_write(
                        af, (const uint8_t *)src->bases[b] + m->views[i].offset * (size_t)elem,
                        m->views[i].numel * (size_t)elem, err)) {
                    file_atomic_abort(af);
                    goto out;
                }
        rc = file_atomic_commit(af, err);
        goto out;
    }
    /* the views tile the table in order, so base b's bytes are the table's */
    for (int i = 0; i < m->n_views; i++)
        assert(m->views[i].offset == (i ? m->views[i - 1].offset + m->views[i - 1].numel : 0));
    uint8_t *buf = mallocCheck(MODEL_SAVE_PIECE * (size_t)elem);
    for (int b = 0; b < n_bases; b++)
        for (size_t at = 0; at < m->n_params; at += MODEL_SAVE_PIECE) {
            size_t k = m->n_params - at < MODEL_SAVE_PIECE ? m->n_params - at : MODEL_SAVE_PIECE;
            src->fill(src->ctx, b, at, k, buf); /* every piece, even after a failed write */
            bad = bad || file_atomic_write(af, buf, k * (size_t)elem, err) != 0;
        }
    free(buf);
    if (bad && af)
        file_atomic_abort(af);
    else if (!bad)
        rc = file_atomic_commit(af, err);
out:
    free(text);
    return rc;
}

static int write_file_as(const char *path, const Model *m, const void *const *bases,
                         const char *const *prefixes, int n_bases, int step, int elem, char *err) {
    Source src = {.bases = bases};
    return write_file_src(path, m, &src, prefixes, n_bases, step, elem, err);
}

static int write_file(const char *path, const Model *m, const float *const *bases,
                      const char *const *prefixes, int n_bases, int step, char *err) {
    return write_file_as(path, m, (const void *const *)bases, prefixes, n_bases, step, 4, err);
}

int model_save(const Model *m, const char *path, int step, char *err) {
    const float *bases[1] = {m->params};
    const char *prefixes[1] = {""};
    if (write_file(path, m, bases, prefixes, 1, step, err) != 0) return -1;
    if (m->m == NULL && m->mh == NULL) return 0;
    char opt[1100];
    snprintf(opt, sizeof opt, "%.*s.opt.safetensors",
             (int)(strlen(path) > 12 && strcmp(path + strlen(path) - 12, ".safetensors") == 0
                       ? strlen(path) - 12
                       : strlen(path)),
             path);
    return model_save_optimizer(m, opt, err);
}

int model_save_optimizer_from(const Model *m, const char *opt_path, int el,
                              void (*fill)(void *ctx, int k, size_t at, size_t n, void *buf),
                              void *ctx, char *err) {
    const char *prefixes[2] = {"adam_m.", "adam_v."};
    assert(el == 2 || el == 4);
    Source src = {.fill = fill, .ctx = ctx};
    return write_file_src(opt_path, m, &src, prefixes, 2, m->step, el, err);
}

int model_save_optimizer(const Model *m, const char *opt_path, char *err) {
    const char *prefixes[2] = {"adam_m.", "adam_v."};
    assert(m->moments_hi == 0); /* whole (a sharded trainer gathers them first) */
    if (m->mh && m->vh) {       /* bf16 moments, as they are kept */
        const void *bases[2] = {m->mh, m->vh};
        return write_file_as(opt_path, m, bases, prefixes, 2, m->step, 2, err);
    }
    if (m->m == NULL || m->v == NULL)
        return err_set(err, "%s: no optimizer state to save (no step has run)", opt_path);
    const float *bases[2] = {m->m, m->v};
    return write_file(opt_path, m, bases, prefixes, 2, m->step, err);
}

/* An open checkpoint: its parsed header, and where its tensor bytes lie.
 * Tensors are read straight into their destination: the file is never
 * held whole (a model's size of memory, and for the config alone a whole
 * model read to parse a few kilobytes). */
typedef struct StFile {
    int fd;
    json_t *h;
    uint64_t data_at, data_len; /* the tensor bytes: [data_at, data_at + data_len) */
} StFile;

/* len bytes at off, or an error naming path (a file cut short included) */
static int read_at(const char *path, int fd, void *buf, size_t len, uint64_t off, char *err) {
    uint8_t *b = buf;
    while (len > 0) {
        ssize_t got = pread(fd, b, len, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return err_set(err, "%s: read failed: %s", path, strerror(errno));
        if (got == 0) return err_set(err, "%s: the file ends early", path);
        b += got, len -= (size_t)got, off += (uint64_t)got;
    }
    return 0;
}

static void st_close(StFile *f) {
    if (f->fd >= 0) close(f->fd);
    json_decref(f->h);
    f->fd = -1, f->h = NULL;
}

/* Opens and checks a file's header. */
static int st_open(const char *path, StFile *f, char *err) {
    f->h = NULL;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) return err_set(err, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    uint64_t hl;
    if (fstat(f->fd, &sb) != 0) {
        err_set(err, "%s: %s", path, strerror(errno));
        goto fail;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        err_set(err, "%s: too short for a safetensors file", path);
        goto fail;
    }
    uint8_t lb[8];
    if (read_at(path, f->fd, lb, 8, 0, err) != 0) goto fail;
    memcpy(&hl, lb, 8);
    if (hl > ST_MAX_HEADER || hl > size - 8) {
        err_set(err, "%s: header length %llu does not fit the file of %llu bytes", path,
                (unsigned long long)hl, (unsigned long long)size);
        goto fail;
    }
    char *text = malloc(hl ? hl : 1);
    if (text == NULL) {
        err_set(err, "%s: out of memory for its header", path);
        goto fail;
    }
    if (read_at(path, f->fd, text, hl, 8, err) != 0) {
        free(text);
        goto fail;
    }
    json_error_t je;
    f->h = json_loadb(text, hl, 0, &je);
    free(text);
    if (f->h == NULL || !json_is_object(f->h)) {
        err_set(err, "%s: header is not a JSON object (%s)", path, f->h ? "" : je.text);
        goto fail;
    }
    f->data_at = 8 + hl;
    f->data_len = size - 8 - hl;
    return 0;
fail:
    st_close(f);
    return -1;
}

int model_read_config(const char *path, ModelConfig *cfg, int *step, char *err) {
    StFile f;
    if (st_open(path, &f, err) != 0) return -1;
    json_t *h = f.h;
    json_t *meta = json_object_get(h, "__metadata__");
    const char *cs = json_string_value(json_object_get(meta, "config"));
    int rc = -1;
    memset(cfg, 0, sizeof *cfg);
    char why[ERR_LEN];
    if (cs == NULL) {
        err_set(err, "%s: no Strait model config in __metadata__", path);
    } else if (model_config_parse(cs, strlen(cs), cfg, why) != 0) {
        err_set(err, "%s: the model config in __metadata__ is not valid: %s", path, why);
    } else {
        const char *st = json_string_value(json_object_get(meta, "step"));
        if (step) *step = st ? atoi(st) : 0;
        rc = 0;
    }
    st_close(&f);
    return rc;
}

/* Reads each view's tensor (prefix + name) into dst after checking it: dst
 * holds fp32 (elem 4) or bf16 bits (elem 2); an F32 or BF16 file tensor is
 * converted to it. */
static int load_tensors_as(const char *path, const StFile *f, const Model *m, void *dst, int elem,
                           const char *prefix, char *err) {
    json_t *h = f->h;
    uint64_t dlen = f->data_len;
    for (int i = 0; i < m->n_views; i++) {
        const ParamView *v = &m->views[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s", prefix, v->name);
        json_t *t = json_object_get(h, name);
        if (!json_is_object(t)) return err_set(err, "%s: tensor %s is missing", path, name);
        const char *dtype = json_string_value(json_object_get(t, "dtype"));
        int fe = dtype && strcmp(dtype, "F32") == 0    ? 4
                 : dtype && strcmp(dtype, "BF16") == 0 ? 2
                                                       : 0;
        if (fe == 0 || (fe == 2 && strncmp(prefix, "adam_", 5) != 0))
            return err_set(err, "%s: tensor %s has dtype %s, expected F32", path, name,
                           dtype ? dtype : "(none)");
        json_t *shape = json_object_get(t, "shape"), *offs = json_object_get(t, "data_offsets");
        if (!json_is_array(shape) || (int)json_array_size(shape) != v->ndim)
            return err_set(err, "%s: tensor %s has the wrong rank", path, name);
        for (int d = 0; d < v->ndim; d++)
            if (json_integer_value(json_array_get(shape, (size_t)d)) != v->shape[d])
                return err_set(err, "%s: tensor %s has shape differing from the model's", path,
                               name);
        if (!json_is_array(offs) || json_array_size(offs) != 2)
            return err_set(err, "%s: tensor %s lacks data_offsets", path, name);
        json_int_t b = json_integer_value(json_array_get(offs, 0));
        json_int_t e = json_integer_value(json_array_get(offs, 1));
        if (b < 0 || e < b || (uint64_t)e > dlen || (uint64_t)(e - b) != v->numel * (size_t)fe)
            return err_set(err, "%s: tensor %s's bytes [%lld, %lld) do not fit the file or shape",
                           path, name, (long long)b, (long long)e);
        uint8_t *out = (uint8_t *)dst + v->offset * (size_t)elem;
        if (fe == elem) {
            if (read_at(path, f->fd, out, v->numel * (size_t)fe, f->data_at + (uint64_t)b, err))
                return -1;
            continue;
        }
        /* moments kept the other way than saved: one tensor converted at a time */
        uint8_t *tmp = mallocCheck(v->numel * (size_t)fe);
        int rc = read_at(path, f->fd, tmp, v->numel * (size_t)fe, f->data_at + (uint64_t)b, err);
        for (size_t k = 0; rc == 0 && k < v->numel; k++) {
            if (fe == 4) {
                float x;
                memcpy(&x, tmp + 4 * k, 4);
                ((uint16_t *)out)[k] = float_to_bf16(x);
            } else {
                float x = bf16_to_float((uint16_t)(tmp[2 * k] | tmp[2 * k + 1] << 8));
                memcpy(out + 4 * k, &x, 4);
            }
        }
        free(tmp);
        if (rc != 0) return -1;
    }
    return 0;
}

static int load_tensors(const char *path, const StFile *f, const Model *m, float *dst,
                        const char *prefix, char *err) {
    return load_tensors_as(path, f, m, dst, 4, prefix, err);
}

int model_load(Model *m, const char *path, int *step, char *err) {
    StFile f;
    if (st_open(path, &f, err) != 0) return -1;
    json_t *h = f.h;
    const char *hash =
        json_string_value(json_object_get(json_object_get(h, "__metadata__"), "table_hash"));
    char want[32];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)m->table_hash);
    int rc = -1;
    if (hash && strcmp(hash, want) != 0) {
        err_set(err, "%s: parameter table %s differs from this model's %s", path, hash, want);
    } else if (load_tensors(path, &f, m, m->params, "", err) == 0) {
        const char *st =
            json_string_value(json_object_get(json_object_get(h, "__metadata__"), "step"));
        if (step) *step = st ? atoi(st) : 0;
        rc = 0;
    }
    st_close(&f);
    return rc;
}

int model_load_optimizer(Model *m, const char *opt_path, char *err) {
    StFile f;
    if (st_open(opt_path, &f, err) != 0) return -1;
    json_t *h = f.h;
    int bf = m->moments_bf16, el = bf ? 2 : 4;
    assert(m->moments_hi == 0); /* loaded whole; a sharded trainer shares them out */
    if (bf && m->mh == NULL) {
        m->mh = callocCheck(m->n_params, sizeof(uint16_t));
        m->vh = callocCheck(m->n_params, sizeof(uint16_t));
    } else if (!bf && m->m == NULL) {
        m->m = callocCheck(m->n_params, sizeof(float));
        m->v = callocCheck(m->n_params, sizeof(float));
    }
    void *dm = bf ? (void *)m->mh : (void *)m->m, *dv = bf ? (void *)m->vh : (void *)m->v;
    int rc = -1;
    if (load_tensors_as(opt_path, &f, m, dm, el, "adam_m.", err) == 0 &&
        load_tensors_as(opt_path, &f, m, dv, el, "adam_v.", err) == 0) {
        const char *st =
            json_string_value(json_object_get(json_object_get(h, "__metadata__"), "step"));
        m->step = st ? atoi(st) : 0;
        rc = 0;
    }
    st_close(&f);
    return rc;
}

int model_save_state(const Model *m, const char *path, const float *const *bases,
                     const char *const *prefixes, int n_bases, int step, char *err) {
    return write_file(path, m, bases, prefixes, n_bases, step, err);
}

int model_load_state(const Model *m, const char *path, float *const *dsts,
                     const char *const *prefixes, int n_bases, char *err) {
    StFile f;
    if (st_open(path, &f, err) != 0) return -1;
    int rc = 0;
    for (int b = 0; b < n_bases && rc == 0; b++)
        rc = load_tensors(path, &f, m, dsts[b], prefixes[b], err);
    st_close(&f);
    return rc;
}
