/*
 * gguf.c — the GGUF reader (API: gguf.h): the header, the metadata and the
 * tensor infos parsed from a mapped file, every claim checked before use,
 * and tokenizer.ggml.* as TokenizerLists.
 *
 * Layout (little-endian): "GGUF", version (u32: 2 or 3), tensor count and
 * key count (u64); each key a string (u64 length, bytes) and a typed value
 * (an array: element type, u64 count, elements); each tensor its name,
 * dimension count (u32, 1-4), dimensions (u64), type (u32) and offset
 * (u64, from the data section). The data section starts at the first
 * multiple of general.alignment (default 32) after the infos.
 *
 * Ownership: a Gguf owns its mapping (gguf_open) or borrows the caller's
 * bytes (gguf_parse), and owns its keys', tensors' and names' arrays.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/gguf.h"
#include "util/util.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" */

typedef struct Kv {
    char *key;          /* owned */
    uint32_t type;      /* GGUF_* */
    uint32_t atype;     /* an array's element type */
    uint64_t n;         /* an array's count, a string's length */
    const uint8_t *v;   /* the value (a string's bytes; an array's first element) */
    const uint8_t *raw; /* the value as the file holds it: its type, then its bytes */
    size_t raw_n;
} Kv;

struct Gguf {
    char name[512];
    const uint8_t *base;
    size_t len;
    int mapped;
    uint32_t version, alignment;
    Kv *kv;
    int n_kv;
    GgufTensor *t;
    int n_t;
};

/* ---- a cursor over untrusted bytes ----------------------------------------------- */

typedef struct Cur {
    const uint8_t *p;
    size_t left;
} Cur;

static int take(Cur *c, size_t n, const uint8_t **out) {
    if (n > c->left) return -1;
    if (out) *out = c->p;
    c->p += n, c->left -= n;
    return 0;
}
static int u32_at(Cur *c, uint32_t *v) {
    const uint8_t *p;
    if (take(c, 4, &p)) return -1;
    memcpy(v, p, 4);
    return 0;
}
static int u64_at(Cur *c, uint64_t *v) {
    const uint8_t *p;
    if (take(c, 8, &p)) return -1;
    memcpy(v, p, 8);
    return 0;
}
static int str_at(Cur *c, uint64_t *n, const uint8_t **s) {
    return u64_at(c, n) || *n > c->left || take(c, (size_t)*n, s) ? -1 : 0;
}

static const uint32_t SCALAR_SIZE[GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *const TYPE_NAME[GGUF_NTYPES] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};

/* an owned NUL-terminated copy of n bytes; NULL if they hold a NUL */
static char *dup_bytes(const uint8_t *s, uint64_t n) {
    if (memchr(s, 0, (size_t)n)) return NULL;
    char *d = mallocCheck((size_t)n + 1);
    memcpy(d, s, (size_t)n);
    d[n] = '\0';
    return d;
}

const char *gguf_shown(const char *s, char *buf) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0, i = 0;
    for (; i < GGUF_SHOWN_MAX && s[i]; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
            buf[o++] = (char)ch;
        } else {
            buf[o++] = '\\', buf[o++] = 'x', buf[o++] = hex[ch >> 4], buf[o++] = hex[ch & 15];
        }
    }
    if (s[i]) buf[o++] = '.', buf[o++] = '.', buf[o++] = '.';
    buf[o] = '\0';
    return buf;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}
/* the first name given twice, or NULL (sorting a copy of the pointers) */
static const char *duplicate(char **names, int n) {
    char **s = mallocCheck(sizeof *s * (size_t)(n ? n : 1));
    memcpy(s, names, sizeof *s * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_str_ptr);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(s[i - 1], s[i]) == 0) dup = s[i];
    free(s);
    return dup;
}

typedef struct Span {
    uint64_t off, end;
    int i;
} Span;
static int cmp_span(const void *a, const void *b) {
    const Span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* ---- parsing --------------------------------------------------------------------- */

static int parse_value(Gguf *g, Cur *c, Kv *kv, const char *sk, char *err);

static int parse_kv(Gguf *g, Cur *c, Kv *kv, char *err) {
    uint64_t kl;
    const uint8_t *ks;
    char sk[GGUF_SHOWN];
    if (str_at(c, &kl, &ks))
        return err_set(err, "%s: a key runs past the end of the file", g->name);
    if (kl == 0 || kl > 65535 || (kv->key = dup_bytes(ks, kl)) == NULL)
        return err_set(err, "%s: a key of %llu bytes (or holding a NUL); not GGUF", g->name,
                       (unsigned long long)kl);
    gguf_shown(kv->key, sk);
    kv->raw = c->p;
    int rc = parse_value(g, c, kv, sk, err);
    kv->raw_n = (size_t)(c->p - kv->raw);
    return rc;
}

/* kv's type and value at c; sk: its key as messages show it */
static int parse_value(Gguf *g, Cur *c, Kv *kv, const char *sk, char *err) {
    if (u32_at(c, &kv->type) || kv->type >= GGUF_NTYPES)
        return err_set(err, "%s: key %s has value type %u, not one GGUF defines", g->name, sk,
                       kv->type);
    if (kv->type == GGUF_STRING) {
        if (str_at(c, &kv->n, &kv->v))
            return err_set(err, "%s: key %s's string runs past the end of the file", g->name, sk);
        return 0;
    }
    if (kv->type != GGUF_ARRAY) {
        kv->n = 1;
        if (take(c, SCALAR_SIZE[kv->type], &kv->v))
            return err_set(err, "%s: key %s's value runs past the end of the file", g->name, sk);
        return 0;
    }
    if (u32_at(c, &kv->atype) || kv->atype >= GGUF_NTYPES || kv->atype == GGUF_ARRAY)
        return err_set(err,
                       "%s: key %s is an array of type %u; GGUF's arrays hold scalars or "
                       "strings",
                       g->name, sk, kv->atype);
    if (u64_at(c, &kv->n))
        return err_set(err, "%s: key %s's array runs past the end of the file", g->name, sk);
    kv->v = c->p;
    if (kv->atype != GGUF_STRING) {
        if (kv->n > c->left / SCALAR_SIZE[kv->atype] ||
            take(c, (size_t)kv->n * SCALAR_SIZE[kv->atype], NULL))
            return err_set(err, "%s: key %s claims %llu elements, more than the file holds",
                           g->name, sk, (unsigned long long)kv->n);
        return 0;
    }
    if (kv->n > c->left / 8)
        return err_set(err, "%s: key %s claims %llu strings, more than the file holds", g->name, sk,
                       (unsigned long long)kv->n);
    for (uint64_t i = 0; i < kv->n; i++) {
        uint64_t sl;
        if (str_at(c, &sl, NULL))
            return err_set(err, "%s: key %s's string %llu runs past the end of the file", g->name,
                           sk, (unsigned long long)i);
    }
    return 0;
}

static int parse_tensor_info(Gguf *g, Cur *c, GgufTensor *t, char *err) {
    uint64_t nl, off;
    const uint8_t *ns;
    uint32_t nd = 0;
    char sn[GGUF_SHOWN];
    if (str_at(c, &nl, &ns))
        return err_set(err, "%s: a tensor name runs past the end of the file", g->name);
    if (nl == 0 || nl > 255 || (t->name = dup_bytes(ns, nl)) == NULL)
        return err_set(err, "%s: a tensor name of %llu bytes (or holding a NUL); GGUF's are 1-255",
                       g->name, (unsigned long long)nl);
    gguf_shown(t->name, sn);
    if (u32_at(c, &nd) || nd < 1 || nd > GGUF_MAX_DIMS)
        return err_set(err, "%s: tensor %s has %u dimensions; GGUF's have 1 to %d", g->name, sn, nd,
                       GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    t->n_elems = 1;
    for (int d = 0; d < t->n_dims; d++) {
        if (u64_at(c, &t->ne[d]))
            return err_set(err, "%s: tensor %s's dimensions run past the end of the file", g->name,
                           sn);
        if (t->ne[d] == 0 || t->ne[d] > ((uint64_t)1 << 40) / t->n_elems)
            return err_set(err,
                           "%s: tensor %s has a dimension of %llu (beyond 2^40 values, or "
                           "zero)",
                           g->name, sn, (unsigned long long)t->ne[d]);
        t->n_elems *= t->ne[d];
    }
    for (int d = t->n_dims; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    uint32_t block, bytes;
    if (u32_at(c, &t->type) || u64_at(c, &off))
        return err_set(err, "%s: tensor %s's info runs past the end of the file", g->name, sn);
    if (gguf_type_block(t->type, &block, &bytes) != 0)
        return err_set(err,
                       "%s: tensor %s has type %u, which this Strait does not know (a newer ggml?)",
                       g->name, sn, t->type);
    if (t->ne[0] % block != 0)
        return err_set(err, "%s: tensor %s's rows of %llu are not whole %s blocks of %u", g->name,
                       sn, (unsigned long long)t->ne[0], gguf_type_name(t->type), block);
    t->n_bytes = t->n_elems / block * bytes;
    t->offset = off;
    return 0;
}

static void gguf_free_parts(Gguf *g) {
    for (int i = 0; i < g->n_kv; i++) free(g->kv[i].key);
    for (int i = 0; i < g->n_t; i++) free(g->t[i].name);
    free(g->kv);
    free(g->t);
}

void gguf_drop_pages(const Gguf *g) {
    if (g->mapped && g->len) madvise((void *)(uintptr_t)g->base, g->len, MADV_DONTNEED);
}

void gguf_close(Gguf *g) {
    if (g == NULL) return;
    gguf_free_parts(g);
    if (g->mapped && g->len) munmap((void *)(uintptr_t)g->base, g->len);
    free(g);
}

static int parse(Gguf *g, char *err) {
    Cur c = {g->base, g->len};
    uint32_t magic = 0;
    uint64_t n_t, n_kv;
    if (u32_at(&c, &magic) || magic != GGUF_MAGIC)
        return err_set(err, "%s: not a GGUF file (no GGUF magic)", g->name);
    if (u32_at(&c, &g->version) || (g->version != 2 && g->version != 3))
        return err_set(err, "%s: GGUF version %u; Strait reads versions 2 and 3", g->name,
                       g->version);
    if (u64_at(&c, &n_t) || u64_at(&c, &n_kv))
        return err_set(err, "%s: the GGUF header is cut short", g->name);
    /* a key takes at least 8 + 1 + 4 + 1 bytes, a tensor info 8 + 1 + 4 + 8 + 4 + 8 */
    if (n_kv > c.left / 14 || n_t > c.left / 33 || n_kv > (1u << 20) || n_t > (1u << 20))
        return err_set(err,
                       "%s: the header claims %llu keys and %llu tensors, more than the "
                       "file holds",
                       g->name, (unsigned long long)n_kv, (unsigned long long)n_t);
    g->kv = callocCheck((size_t)n_kv + 1, sizeof *g->kv);
    g->t = callocCheck((size_t)n_t + 1, sizeof *g->t);
    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv++;
        if (parse_kv(g, &c, &g->kv[i], err) != 0) return -1;
    }
    char **names = mallocCheck(sizeof *names * ((size_t)(n_kv > n_t ? n_kv : n_t) + 1));
    for (int i = 0; i < g->n_kv; i++) names[i] = g->kv[i].key;
    const char *dup = duplicate(names, g->n_kv);
    char shown[GGUF_SHOWN], shown2[GGUF_SHOWN];
    if (dup) {
        free(names);
        return err_set(err, "%s: key %s is given twice", g->name, gguf_shown(dup, shown));
    }
    g->alignment = 32;
    int ai = gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        const Kv *kv = &g->kv[ai];
        uint32_t a = 0;
        if (kv->type == GGUF_U32) memcpy(&a, kv->v, 4);
        if (kv->type != GGUF_U32 || a == 0 || (a & (a - 1)) != 0 || a > (1u << 24)) {
            free(names);
            return err_set(err, "%s: general.alignment should be a u32 power of two", g->name);
        }
        g->alignment = a;
    }
    for (uint64_t i = 0; i < n_t; i++) {
        g->n_t++;
        if (parse_tensor_info(g, &c, &g->t[i], err) != 0) {
            free(names);
            return -1;
        }
    }
    for (int i = 0; i < g->n_t; i++) names[i] = g->t[i].name;
    dup = duplicate(names, g->n_t);
    free(names);
    if (dup) return err_set(err, "%s: tensor %s is given twice", g->name, gguf_shown(dup, shown));
    /* the data section, and each tensor's bytes inside it */
    size_t at = g->len - c.left, pad = (g->alignment - at % g->alignment) % g->alignment;
    if (g->n_t > 0 && pad > c.left)
        return err_set(err, "%s: the file ends before its tensor data", g->name);
    size_t data_start = g->n_t > 0 ? at + pad : at, data_len = g->len - data_start;
    Span *sp = mallocCheck(sizeof *sp * ((size_t)g->n_t + 1));
    int rc = 0;
    for (int i = 0; i < g->n_t && rc == 0; i++) {
        GgufTensor *t = &g->t[i];
        uint64_t off = t->offset;
        if (off % g->alignment != 0)
            rc =
                err_set(err, "%s: tensor %s's offset %llu is not a multiple of the alignment %u",
                        g->name, gguf_shown(t->name, shown), (unsigned long long)off, g->alignment);
        else if (off > data_len || t->n_bytes > data_len - off)
            rc = err_set(err,
                         "%s: tensor %s's %llu bytes at offset %llu lie past the end of the "
                         "file (truncated?)",
                         g->name, gguf_shown(t->name, shown), (unsigned long long)t->n_bytes,
                         (unsigned long long)off);
        if (rc == 0) t->data = g->base + data_start + off;
        sp[i] = (Span){off, off + t->n_bytes, i};
    }
    if (rc == 0) {
        qsort(sp, (size_t)g->n_t, sizeof *sp, cmp_span);
        for (int i = 1; i < g->n_t && rc == 0; i++)
            if (sp[i].off < sp[i - 1].end)
                rc = err_set(err, "%s: tensors %s and %s overlap", g->name,
                             gguf_shown(g->t[sp[i - 1].i].name, shown),
                             gguf_shown(g->t[sp[i].i].name, shown2));
    }
    free(sp);
    return rc;
}

Gguf *gguf_parse(const uint8_t *data, size_t len, const char *name, char *err) {
    Gguf *g = callocCheck(1, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", name);
    g->base = data, g->len = len;
    if (parse(g, err) != 0) {
        gguf_close(g);
        return NULL;
    }
    return g;
}

Gguf *gguf_open(const char *path, char *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err_set_errno(err, "%s", path);
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        err_set(err, "%s: not a regular file", path);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    void *p = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (p == MAP_FAILED) {
        err_set_errno(err, "%s: mapping it", path);
        return NULL;
    }
    Gguf *g = callocCheck(1, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", path);
    g->base = p, g->len = len, g->mapped = 1;
    if (parse(g, err) != 0) {
        gguf_close(g);
        return NULL;
    }
    return g;
}

const char *gguf_name(const Gguf *g) {
    return g->name;
}
int gguf_n_kv(const Gguf *g) {
    return g->n_kv;
}
const char *gguf_kv_key(const Gguf *g, int i) {
    return g->kv[i].key;
}
int gguf_kv_type(const Gguf *g, int i, int *array_type) {
    if (array_type) *array_type = g->kv[i].type == GGUF_ARRAY ? (int)g->kv[i].atype : -1;
    return (int)g->kv[i].type;
}

uint64_t gguf_kv_len(const Gguf *g, int i) {
    return g->kv[i].n;
}

size_t gguf_kv_value_bytes(const Gguf *g, int i, const uint8_t **p) {
    *p = g->kv[i].raw;
    return g->kv[i].raw_n;
}

int gguf_find_key(const Gguf *g, const char *key) {
    for (int i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0) return i;
    return -1;
}

int gguf_n_tensors(const Gguf *g) {
    return g->n_t;
}
const GgufTensor *gguf_tensor_at(const Gguf *g, int i) {
    return &g->t[i];
}
const GgufTensor *gguf_tensor(const Gguf *g, const char *name) {
    for (int i = 0; i < g->n_t; i++)
        if (strcmp(g->t[i].name, name) == 0) return &g->t[i];
    return NULL;
}

/* ---- metadata getters ------------------------------------------------------------ */

/* an integer scalar of any width at p; 0, or -1 if type is not an integer
 * (or a u64 past INT64_MAX) */
static int int_of(uint32_t type, const uint8_t *p, int64_t *out) {
    switch (type) {
    case GGUF_U8:
        *out = *p;
        return 0;
    case GGUF_I8:
        *out = (int8_t)*p;
        return 0;
    case GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 0;
    }
    case GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 0;
    }
    case GGUF_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 0;
    }
    case GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 0;
    }
    case GGUF_I64:
        memcpy(out, p, 8);
        return 0;
    case GGUF_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > INT64_MAX) return -1;
        *out = (int64_t)v;
        return 0;
    }
    default:
        return -1;
    }
}

static const Kv *kv_of(const Gguf *g, const char *key) {
    int i = gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

static const char *type_name(uint32_t t) {
    return t < GGUF_NTYPES ? TYPE_NAME[t] : "?";
}

int gguf_get_int(const Gguf *g, const char *key, int64_t lo, int64_t hi, int64_t *out, char *err) {
    const Kv *kv = kv_of(g, key);
    if (kv == NULL) return 0;
    int64_t v;
    if (int_of(kv->type, kv->v, &v) != 0)
        return err_set(err, "%s: %s is a %s, not an integer", g->name, key, type_name(kv->type));
    if (v < lo || v > hi)
        return err_set(err, "%s: %s is %lld; it should be from %lld to %lld", g->name, key,
                       (long long)v, (long long)lo, (long long)hi);
    *out = v;
    return 1;
}

int gguf_get_f32(const Gguf *g, const char *key, float *out, char *err) {
    const Kv *kv = kv_of(g, key);
    if (kv == NULL) return 0;
    if (kv->type == GGUF_F32) {
        memcpy(out, kv->v, 4);
    } else if (kv->type == GGUF_F64) {
        double d;
        memcpy(&d, kv->v, 8);
        *out = (float)d;
    } else {
        return err_set(err, "%s: %s is a %s, not a number", g->name, key, type_name(kv->type));
    }
    if (!isfinite(*out)) return err_set(err, "%s: %s is not a finite number", g->name, key);
    return 1;
}

/* a bool (its byte 0 or 1) */
static int gguf_get_bool(const Gguf *g, const char *key, int *out, char *err) {
    const Kv *kv = kv_of(g, key);
    if (kv == NULL) return 0;
    if (kv->type != GGUF_BOOL)
        return err_set(err, "%s: %s is a %s, not a boolean", g->name, key, type_name(kv->type));
    if (kv->v[0] > 1)
        return err_set(err, "%s: %s is a bool holding the byte %u; GGUF's bools are 0 or 1",
                       g->name, key, kv->v[0]);
    *out = kv->v[0];
    return 1;
}

int gguf_get_str(const Gguf *g, const char *key, char **out, char *err) {
    const Kv *kv = kv_of(g, key);
    if (kv == NULL) return 0;
    if (kv->type != GGUF_STRING)
        return err_set(err, "%s: %s is a %s, not a string", g->name, key, type_name(kv->type));
    if ((*out = dup_bytes(kv->v, kv->n)) == NULL)
        return err_set(err, "%s: %s holds a NUL byte", g->name, key);
    return 1;
}

static void gguf_strings_free(char **s, size_t n) {
    for (size_t i = 0; s && i < n; i++) free(s[i]);
    free(s);
}

/* arrays: of strings (owned copies, free with gguf_strings_free), of
 * integers that fit an int32 (owned) */
static int gguf_get_strs(const Gguf *g, const char *key, char ***out, size_t *n, char *err) {
    const Kv *kv = kv_of(g, key);
    if (kv == NULL) return 0;
    if (kv->type != GGUF_ARRAY || kv->atype != GGUF_STRING)
        return err_set(err, "%s: %s is not an array of strings", g->name, key);
    char **s = callocCheck((size_t)kv->n + 1, sizeof *s);
    Cur c = {kv->v, g->len - (size_t)(kv->v - g->base)}; /* checked whole by parse_kv */
    for (uint64_t i = 0; i < kv->n; i++) {
        uint64_t sl;
        const uint8_t *sb;
        if (str_at(&c, &sl, &sb) != 0 || (s[i] = dup_bytes(sb, sl)) == NULL) {
            gguf_strings_free(s, (size_t)i);
            return err_set(err, "%s: %s's string %llu holds a NUL byte", g->name, key,
                           (unsigned long long)i);
        }
    }
    *out = s;
    *n = (size_t)kv->n;
    return 1;
}

static int gguf_get_i32s(const Gguf *g, const char *key, int32_t **out, size_t *n, char *err) {
    const Kv *kv = kv_of(g, key);
    if (kv == NULL) return 0;
    int64_t v;
    if (kv->type != GGUF_ARRAY || kv->atype == GGUF_F32 || kv->atype == GGUF_F64 ||
        kv->atype == GGUF_BOOL || kv->atype == GGUF_STRING)
        return err_set(err, "%s: %s is not an array of integers", g->name, key);
    int32_t *a = mallocCheck(sizeof *a * ((size_t)kv->n + 1));
    for (uint64_t i = 0; i < kv->n; i++) {
        if (int_of(kv->atype, kv->v + i * SCALAR_SIZE[kv->atype], &v) != 0 || v < INT32_MIN ||
            v > INT32_MAX) {
            free(a);
            return err_set(err, "%s: %s's element %llu does not fit 32 bits", g->name, key,
                           (unsigned long long)i);
        }
        a[i] = (int32_t)v;
    }
    *out = a;
    *n = (size_t)kv->n;
    return 1;
}

/* ---- the tokenizer --------------------------------------------------------------- */

int gguf_tokenizer_lists(const Gguf *g, TokenizerLists *out, char *err) {
    memset(out, 0, sizeof *out);
    out->bos = out->eos = out->unk = out->pad = -1;
    char *model = NULL;
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc <= 0)
        return rc < 0 ? -1 : err_set(err, "%s has no tokenizer (tokenizer.ggml.model)", g->name);
    char shown[GGUF_SHOWN];
    if (strcmp(model, "none") == 0 || strcmp(model, "no_vocab") == 0) {
        err_set(err,
                "%s: the file has no tokenizer (tokenizer.ggml.model %s): give --tokenizer with "
                "a GGUF file or a Hugging Face folder that has one",
                g->name, model);
        free(model);
        return -1;
    }
    if (strcmp(model, "gpt2") != 0) {
        err_set(err, "%s: tokenizer.ggml.model is %s; Strait reads byte-level BPE (gpt2) only%s",
                g->name, gguf_shown(model, shown),
                strcmp(model, "llama") == 0 ? " (llama is SentencePiece)" : "");
        free(model);
        return -1;
    }
    free(model);
    int space = 0;
    rc = gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &space, err);
    if (rc < 0) return -1;
    if (space)
        return err_set(err,
                       "%s: tokenizer.ggml.add_space_prefix is true; Strait's byte-level BPE "
                       "adds no prefix space",
                       g->name);
    /* the counts before any string is copied */
    static const char *const lists[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"};
    for (int i = 0; i < 2; i++) {
        int k = gguf_find_key(g, lists[i]);
        if (k >= 0 && gguf_kv_len(g, k) > (1u << 22))
            return err_set(err, "%s: %s holds %llu entries; Strait takes at most 2^22", g->name,
                           lists[i], (unsigned long long)gguf_kv_len(g, k));
    }
    size_t nt = 0, nm = 0, ny = 0;
    rc = gguf_get_strs(g, "tokenizer.ggml.tokens", &out->tokens, &nt, err);
    if (rc == 0) rc = err_set(err, "%s has no tokenizer.ggml.tokens", g->name);
    out->n_tokens = (int)nt;
    if (rc > 0) rc = gguf_get_strs(g, "tokenizer.ggml.merges", &out->merges, &nm, err);
    out->n_merges = (int)nm;
    if (rc >= 0) rc = gguf_get_i32s(g, "tokenizer.ggml.token_type", &out->types, &ny, err);
    if (rc > 0 && ny != nt)
        rc = err_set(err, "%s: tokenizer.ggml.token_type has %zu entries for %zu tokens", g->name,
                     ny, nt);
    if (rc >= 0) rc = gguf_get_str(g, "tokenizer.ggml.pre", &out->pre, err);
    if (rc >= 0) rc = gguf_get_str(g, "tokenizer.chat_template", &out->chat_template, err);
    static const char *const ids[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                      "tokenizer.ggml.unknown_token_id",
                                      "tokenizer.ggml.padding_token_id"};
    int *dst[] = {&out->bos, &out->eos, &out->unk, &out->pad};
    for (int i = 0; i < 4 && rc >= 0; i++) {
        int64_t v;
        rc = gguf_get_int(g, ids[i], 0, (int64_t)nt - 1, &v, err);
        if (rc == 1) *dst[i] = (int)v;
    }
    if (rc < 0) {
        tokenizer_lists_free(out);
        out->bos = out->eos = out->unk = out->pad = -1;
        return -1;
    }
    return 0;
}
