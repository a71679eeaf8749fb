/*
 * gguf_model.c — the Llama family in from a GGUF file and out to one (API:
 * gguf.h).
 *
 * In: general.architecture "llama" or "qwen2"; the <arch>.* keys to a
 * ModelConfig, each one Strait cannot honour (an expert count, a sliding
 * window, a rope scaling type other than none, ...) refused by name; the
 * tensors under llama.cpp's names into Strait's table (GGUF lists a
 * matrix's dimensions as [in, out]: its bytes are PyTorch's [out, in]),
 * every one checked for shape and decodable type before the model is
 * allocated, then dequantized one at a time from the mapping (the peak is
 * the model and one tensor), checked finite. A tensor the file holds and
 * Strait would not use is refused: it could change the arithmetic.
 * llama.cpp's converter interleaves the two rotary halves of each head's q
 * and k rows for "llama" (row h·HD + p·HD/2 + i becomes h·HD + 2i + p);
 * import undoes it, export does it. Qwen2's rows are not permuted.
 *
 * Llama 3's rope_scaling is written by the converter as a tensor,
 * rope_freqs.weight (each frequency's divisor); it is taken when it equals
 * the divisors of Llama 3.1's and 3.2's published settings (low 1, high 4,
 * original context 8192, the factor its largest entry), refused otherwise.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/arch.h"
#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "kernels/half.h"
#include "util/util.h"

/* Strait's tensor (its table name) and llama.cpp's ("%d" the layer) */
static const struct {
    const char *strait, *gguf;
} NAMES[] = {
    {"wte", "token_embd.weight"},
    {"ln_1.weight", "blk.%d.attn_norm.weight"},
    {"attn.q.weight", "blk.%d.attn_q.weight"},
    {"attn.q.bias", "blk.%d.attn_q.bias"},
    {"attn.k.weight", "blk.%d.attn_k.weight"},
    {"attn.k.bias", "blk.%d.attn_k.bias"},
    {"attn.v.weight", "blk.%d.attn_v.weight"},
    {"attn.v.bias", "blk.%d.attn_v.bias"},
    {"attn.o.weight", "blk.%d.attn_output.weight"},
    {"ln_2.weight", "blk.%d.ffn_norm.weight"},
    {"mlp.gate.weight", "blk.%d.ffn_gate.weight"},
    {"mlp.up.weight", "blk.%d.ffn_up.weight"},
    {"mlp.down.weight", "blk.%d.ffn_down.weight"},
    {"ln_f.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};
#define N_NAMES    (int)(sizeof NAMES / sizeof NAMES[0])
#define ROPE_FREQS "rope_freqs.weight"

/* llama.cpp's name of table row t at layer l; -1 if the row has none */
static int gguf_name_of(const ArchTensor *t, int l, char *out, size_t n) {
    for (int i = 0; i < N_NAMES; i++)
        if (strcmp(NAMES[i].strait, t->name) == 0) {
            const char *at = strstr(NAMES[i].gguf, "%d");
            if (at == NULL)
                snprintf(out, n, "%s", NAMES[i].gguf);
            else
                snprintf(out, n, "%.*s%d%s", (int)(at - NAMES[i].gguf), NAMES[i].gguf, l, at + 2);
            return 0;
        }
    return -1;
}

/* the rows of q (heads NH) and k (NKV), weights and biases, are
 * interleaved per head for "llama" */
static int permuted_heads(const ModelConfig *c, const ArchTensor *t) {
    if (c->arch != ARCH_LLAMA) return 0;
    if (strncmp(t->name, "attn.q.", 7) == 0) return c->NH;
    if (strncmp(t->name, "attn.k.", 7) == 0) return c->NKV;
    return 0;
}

/* row r of the Hugging Face order is row perm_row(r) of llama.cpp's */
static size_t perm_row(size_t r, int HD) {
    size_t h = r / (size_t)HD, within = r % (size_t)HD, half = (size_t)HD / 2;
    size_t p = within / half, i = within % half;
    return h * (size_t)HD + 2 * i + p;
}

/* ---- the configuration ----------------------------------------------------------- */

/* <arch>.* keys Strait reads; any other in the namespace is refused */
static const char *const KNOWN[] = {"block_count",
                                    "context_length",
                                    "embedding_length",
                                    "feed_forward_length",
                                    "attention.head_count",
                                    "attention.head_count_kv",
                                    "attention.key_length",
                                    "attention.value_length",
                                    "attention.layer_norm_rms_epsilon",
                                    "rope.freq_base",
                                    "rope.dimension_count",
                                    "rope.scaling.type",
                                    "rope.scaling.factor",
                                    "rope.scaling.original_context_length",
                                    "rope.scaling.finetuned",
                                    "vocab_size"};

static int key_int(const Gguf *g, const char *arch, const char *key, int required, int64_t lo,
                   int64_t hi, int *out, char *err) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int64_t v;
    int rc = gguf_get_int(g, full, lo, hi, &v, err);
    if (rc == 0 && required) return err_set(err, "%s has no %s", gguf_name(g), full);
    if (rc == 1) *out = (int)v;
    return rc < 0 ? -1 : 0;
}

static int key_f32(const Gguf *g, const char *arch, const char *key, int required, float *out,
                   char *err) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int rc = gguf_get_f32(g, full, out, err);
    if (rc == 0 && required) return err_set(err, "%s has no %s", gguf_name(g), full);
    return rc < 0 ? -1 : 0;
}

/* Llama 3's divisors for a RopeConfig, as llama.cpp's converter computes them */
static void llama3_divisors(const ModelConfig *c, float *out) {
    const RopeConfig *r = &c->rope;
    double ctx = r->original_ctx, lo = ctx / r->low_freq, hi = ctx / r->high_freq;
    for (int i = 0; i < c->HD / 2; i++) {
        float f = 1.0f / powf(r->theta, (float)(2 * i) / (float)c->HD);
        double wavelen = 2 * 3.14159265358979323846 / f;
        if (wavelen < hi) {
            out[i] = 1;
        } else if (wavelen > lo) {
            out[i] = r->factor;
        } else {
            double smooth = (ctx / wavelen - r->low_freq) / (r->high_freq - r->low_freq);
            out[i] = (float)(1 / ((1 - smooth) / r->factor + smooth));
        }
    }
}

/* Strait's own record of the setting the divisors were made from (llama.cpp
 * reads no key for it) */
static const char *const SCALING[] = {
    "strait.rope.scaling.factor", "strait.rope.scaling.low_freq_factor",
    "strait.rope.scaling.high_freq_factor", "strait.rope.scaling.original_context_length"};

/* rope_freqs.weight to c->rope: the setting of the strait.rope.scaling.*
 * keys when the file has them, else Llama 3.1's and 3.2's published one
 * (low 1, high 4, the original context ctx) with the factor the divisors
 * of the longest wavelengths give; refused unless the setting gives the
 * divisors the file holds */
static int rope_freqs_read(const Gguf *g, ModelConfig *c, int ctx, char *err) {
    const GgufTensor *t = gguf_tensor(g, ROPE_FREQS);
    int have = 0;
    for (int i = 0; i < 4; i++) have += gguf_find_key(g, SCALING[i]) >= 0;
    if (t == NULL && have == 0) return 0;
    if (t == NULL || (have != 0 && have != 4))
        return err_set(err, "%s: %s and the four strait.rope.scaling.* keys come together",
                       gguf_name(g), ROPE_FREQS);
    if (c->arch != ARCH_LLAMA)
        return err_set(err,
                       "%s: tensor %s is set; llama.cpp's %s has no rotary divisors, so the "
                       "file does not say one model",
                       gguf_name(g), ROPE_FREQS, model_arch_name(c->arch));
    int n = c->HD / 2;
    if (t->type != GGML_F32 || t->n_dims != 1 || t->ne[0] != (uint64_t)n)
        return err_set(err, "%s: tensor %s should be F32 [%d]", gguf_name(g), ROPE_FREQS, n);
    float *have_d = mallocCheck(sizeof(float) * (size_t)n * 2), *want = have_d + n;
    memcpy(have_d, t->data, sizeof(float) * (size_t)n);
    RopeConfig *r = &c->rope;
    int rc = 0;
    if (have) {
        int64_t oc = 0;
        rc = gguf_get_f32(g, SCALING[0], &r->factor, err) < 0 ||
                     gguf_get_f32(g, SCALING[1], &r->low_freq, err) < 0 ||
                     gguf_get_f32(g, SCALING[2], &r->high_freq, err) < 0 ||
                     gguf_get_int(g, SCALING[3], 1, 1 << 24, &oc, err) < 0
                 ? -1
                 : 0;
        r->original_ctx = (int)oc;
        if (rc == 0 && !(r->factor >= 1 && r->low_freq > 0 && r->high_freq > r->low_freq))
            rc = err_set(err,
                         "%s: strait.rope.scaling.* should have factor >= 1 and 0 < low_freq "
                         "< high_freq",
                         gguf_name(g));
    } else {
        /* the factor shows only where a wavelength passes ctx / low */
        r->low_freq = 1, r->high_freq = 4, r->original_ctx = ctx, r->factor = have_d[n - 1];
        double longest = 2 * 3.14159265358979323846 * pow(r->theta, (double)(n - 1) * 2 / c->HD);
        if (longest <= ctx)
            rc = err_set(err,
                         "%s: tensor %s: no wavelength of these %d frequencies passes the "
                         "original context %d, so the divisors do not show Llama 3's factor; "
                         "Strait cannot tell the setting",
                         gguf_name(g), ROPE_FREQS, n, ctx);
    }
    if (rc == 0) {
        llama3_divisors(c, want);
        int same = 1;
        for (int i = 0; i < n && same; i++) same = fabsf(have_d[i] - want[i]) <= 1e-5f * want[i];
        if (!same)
            rc = err_set(err,
                         "%s: tensor %s holds rotary divisors that are not Llama 3's (factor %g, "
                         "low %g, high %g, original context %d); Strait computes no other "
                         "scaling",
                         gguf_name(g), ROPE_FREQS, r->factor, r->low_freq, r->high_freq,
                         r->original_ctx);
    }
    free(have_d);
    return rc;
}

static int config_read(const Gguf *g, ModelConfig *c, char *err) {
    memset(c, 0, sizeof *c);
    char *arch = NULL;
    int rc = gguf_get_str(g, "general.architecture", &arch, err);
    if (rc <= 0) return rc < 0 ? -1 : err_set(err, "%s has no general.architecture", gguf_name(g));
    c->arch = -1;
    for (int i = 0; i < ARCH_COUNT && c->arch < 0; i++)
        if (arch_of(i)->gguf_arch && strcmp(arch_of(i)->gguf_arch, arch) == 0) c->arch = i;
    char shown[GGUF_SHOWN];
    if (c->arch < 0) {
        err_set(err,
                "%s: general.architecture is %s; Strait reads llama (Llama 2 and 3, SmolLM2) "
                "and qwen2",
                gguf_name(g), gguf_shown(arch, shown));
        free(arch);
        return -1;
    }
    size_t al = strlen(arch);
    for (int i = 0; i < gguf_n_kv(g) && rc >= 0; i++) {
        const char *k = gguf_kv_key(g, i);
        if (strncmp(k, arch, al) != 0 || k[al] != '.') continue;
        int known = 0;
        for (size_t j = 0; j < sizeof KNOWN / sizeof KNOWN[0] && !known; j++)
            known = strcmp(k + al + 1, KNOWN[j]) == 0;
        if (!known)
            rc = err_set(err,
                         "%s: %s is set; Strait does not compute what it describes, so it "
                         "cannot reproduce this model",
                         gguf_name(g), gguf_shown(k, shown));
    }
    const char *a = arch;
    c->rope.theta = 10000.0f; /* llama.cpp's own when rope.freq_base is absent */
    int HD = 0, VD = 0, rot = 0, scaled_ctx = 8192;
    if (rc >= 0)
        rc = key_int(g, a, "block_count", 1, 1, 256, &c->L, err) ||
                     key_int(g, a, "context_length", 1, 1, 1 << 20, &c->T, err) ||
                     key_int(g, a, "embedding_length", 1, 1, 65536, &c->C, err) ||
                     key_int(g, a, "feed_forward_length", 1, 1, 1 << 20, &c->F, err) ||
                     key_int(g, a, "attention.head_count", 1, 1, 65536, &c->NH, err) ||
                     key_int(g, a, "attention.key_length", 0, 2, 1024, &HD, err) ||
                     key_int(g, a, "attention.value_length", 0, 2, 1024, &VD, err) ||
                     key_int(g, a, "rope.dimension_count", 0, 1, 65536, &rot, err) ||
                     key_int(g, a, "rope.scaling.original_context_length", 0, 1, 1 << 24,
                             &scaled_ctx, err) ||
                     key_f32(g, a, "attention.layer_norm_rms_epsilon", 1, &c->eps, err) ||
                     key_f32(g, a, "rope.freq_base", 0, &c->rope.theta, err)
                 ? -1
                 : 0;
    c->NKV = c->NH;
    if (rc == 0) rc = key_int(g, a, "attention.head_count_kv", 0, 1, 65536, &c->NKV, err);
    c->HD = HD ? HD : c->NH ? c->C / c->NH : 0;
    char full[128];
    if (rc == 0 && VD && VD != c->HD)
        rc = err_set(err,
                     "%s: %s.attention.value_length %d differs from the key length %d; "
                     "Strait's heads have one size",
                     gguf_name(g), a, VD, c->HD);
    if (rc == 0 && HD && c->arch == ARCH_QWEN2 && HD * c->NH != c->C)
        rc = err_set(err,
                     "%s: %s.attention.key_length %d; Qwen2's heads split the embedding "
                     "evenly",
                     gguf_name(g), a, HD);
    if (rc == 0 && rot && rot != c->HD)
        rc = err_set(err, "%s: %s.rope.dimension_count %d; Strait rotates the whole head of %d",
                     gguf_name(g), a, rot, c->HD);
    char *stype = NULL;
    snprintf(full, sizeof full, "%s.rope.scaling.type", a);
    if (rc == 0 && gguf_get_str(g, full, &stype, err) < 0) rc = -1;
    if (rc == 0 && stype && strcmp(stype, "none") != 0)
        rc = err_set(err, "%s: %s is %s; Strait computes no rope scaling but Llama 3's",
                     gguf_name(g), full, gguf_shown(stype, shown));
    free(stype);
    float sf = 0;
    if (rc == 0 && key_f32(g, a, "rope.scaling.factor", 0, &sf, err) != 0) rc = -1;
    if (rc == 0 && sf != 0 && sf != 1)
        rc = err_set(err, "%s: %s.rope.scaling.factor is %g; Strait computes no such scaling",
                     gguf_name(g), a, sf);
    if (rc == 0) rc = rope_freqs_read(g, c, scaled_ctx, err);
    /* the vocabulary: the token list's length, else vocab_size, else the embedding's rows */
    int64_t V = 0;
    if (rc == 0) {
        int vk = 0;
        uint64_t listed = 0;
        if (key_int(g, a, "vocab_size", 0, 2, 1 << 22, &vk, err) != 0) rc = -1;
        int ti = gguf_find_key(g, "tokenizer.ggml.tokens");
        const GgufTensor *e = gguf_tensor(g, "token_embd.weight");
        int at = -1;
        if (ti >= 0 && (gguf_kv_type(g, ti, &at) != GGUF_ARRAY || at != GGUF_STRING))
            rc = err_set(err, "%s: tokenizer.ggml.tokens is not an array of strings", gguf_name(g));
        else if (ti >= 0)
            listed = gguf_kv_len(g, ti);
        if (rc == 0 && listed > (1u << 22))
            rc = err_set(err,
                         "%s: tokenizer.ggml.tokens holds %llu tokens; Strait takes at most 2^22",
                         gguf_name(g), (unsigned long long)listed);
        V = (int64_t)listed;
        if (rc == 0 && vk && V && vk != V)
            rc = err_set(err, "%s: %s.vocab_size %d, but tokenizer.ggml.tokens holds %lld",
                         gguf_name(g), a, vk, (long long)V);
        if (V == 0) V = vk;
        if (V == 0 && e && e->n_dims == 2) V = (int64_t)e->ne[1];
        if (rc == 0 && (V < 2 || V > (1 << 22)))
            rc = err_set(err, "%s: a vocabulary of %lld tokens; Strait takes 2 to 2^22",
                         gguf_name(g), (long long)V);
        c->V = (int)V;
    }
    c->tied = gguf_tensor(g, "output.weight") == NULL;
    /* Llama's biases are optional (a Strait configuration may set them) */
    c->qkv_bias = c->arch == ARCH_QWEN2 || gguf_tensor(g, "blk.0.attn_q.bias") != NULL;
    snprintf(c->name, sizeof c->name, "gguf");
    free(arch);
    char why[ERR_LEN];
    if (rc == 0 && model_config_check(c, why) != 0) rc = err_set(err, "%s: %s", gguf_name(g), why);
    return rc < 0 ? -1 : 0;
}

/* ---- tensors in ------------------------------------------------------------------ */

/* row t at layer l's tensor in the file, its shape and type checked; with
 * dst, dequantized into it in Strait's layout (tmp: room for it) */
static int take(const Gguf *g, const ModelConfig *c, const ArchTensor *t, int l, float *dst,
                float *tmp, char *err) {
    char name[96];
    if (gguf_name_of(t, l, name, sizeof name) != 0)
        return err_set(err, "%s: Strait's tensor %s has no GGUF name", gguf_name(g), t->name);
    const GgufTensor *gt = gguf_tensor(g, name);
    if (gt == NULL) return err_set(err, "%s: tensor %s is missing", gguf_name(g), name);
    int two_d = t->d1 != DIM_NONE;
    uint64_t rows = t->d0 == DIM_VP ? (uint64_t)c->V : (uint64_t)arch_dim(c, t->d0);
    uint64_t cols = two_d ? (uint64_t)arch_dim(c, t->d1) : 1;
    int ok = gt->n_dims == (two_d ? 2 : 1) &&
             (two_d ? gt->ne[0] == cols && gt->ne[1] == rows : gt->ne[0] == rows);
    if (!ok) {
        char have[128], want[64];
        int at = snprintf(have, sizeof have, "[%llu", (unsigned long long)gt->ne[0]);
        for (int d = 1; d < gt->n_dims; d++)
            at += snprintf(have + at, sizeof have - (size_t)at, ", %llu",
                           (unsigned long long)gt->ne[d]);
        snprintf(have + at, sizeof have - (size_t)at, "]");
        if (two_d)
            snprintf(want, sizeof want, "[%llu, %llu]", (unsigned long long)cols,
                     (unsigned long long)rows);
        else
            snprintf(want, sizeof want, "[%llu]", (unsigned long long)rows);
        return err_set(err, "%s: tensor %s has shape %s; the configuration makes it %s",
                       gguf_name(g), name, have, want);
    }
    if (!gguf_type_decodes(gt->type)) {
        const char *tn = gguf_type_name(gt->type);
        return err_set(err,
                       "%s: tensor %s has type %s, which Strait does not decode (it reads F32, "
                       "F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K); convert the "
                       "model to one of them (llama-quantize)",
                       gguf_name(g), name, tn ? tn : "?");
    }
    if (dst == NULL) return 0;
    int heads = permuted_heads(c, t);
    size_t n = (size_t)(rows * cols);
    char why[ERR_LEN];
    if (gguf_dequantize(gt->type, gt->data, n, heads ? tmp : dst, why) != 0)
        return err_set(err, "%s: tensor %s: %s", gguf_name(g), name, why);
    if (heads) /* undo llama.cpp's interleaving of each head's rotary halves */
        for (size_t r = 0; r < rows; r++)
            memcpy(dst + r * cols, tmp + perm_row(r, c->HD) * cols, sizeof(float) * cols);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dst[i]))
            return err_set(err, "%s: tensor %s holds %s at element %zu; not a model to start from",
                           gguf_name(g), name, isnan(dst[i]) ? "NaN" : "an infinity", i);
    return 0;
}

/* every row of m's table: checked (read 0), then read */
static int take_all(const Gguf *g, const ModelConfig *c, Model *m, int read, char *err) {
    const Arch *a = arch_of(c->arch);
    float *tmp = NULL;
    if (read) {
        size_t most = 0;
        for (int i = 0; i < m->n_views; i++)
            if (m->views[i].numel > most) most = m->views[i].numel;
        tmp = mallocCheck(sizeof(float) * (most ? most : 1));
    }
    int rc = 0;
    for (int r = 0; r < a->n_tensors && rc == 0; r++)
        for (int l = 0; l < (a->tensors[r].layer ? c->L : 1) && rc == 0; l++) {
            if (!arch_has(c, &a->tensors[r])) continue;
            rc = take(g, c, &a->tensors[r], l, read ? arch_w(m, model_base(m), r, l) : NULL, tmp,
                      err);
        }
    free(tmp);
    return rc;
}

/* a tensor in the file that no row takes: refused by name */
static int unused_tensor(const Gguf *g, const ModelConfig *c, char *err) {
    const Arch *a = arch_of(c->arch);
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const char *name = gguf_tensor_at(g, i)->name;
        char shown[GGUF_SHOWN];
        int used = strcmp(name, ROPE_FREQS) == 0 && c->rope.factor > 0;
        for (int r = 0; r < a->n_tensors && !used; r++)
            for (int l = 0; l < (a->tensors[r].layer ? c->L : 1) && !used; l++) {
                char want[96];
                used = arch_has(c, &a->tensors[r]) &&
                       gguf_name_of(&a->tensors[r], l, want, sizeof want) == 0 &&
                       strcmp(want, name) == 0;
            }
        if (!used)
            return err_set(err,
                           "%s: tensor %s is one Strait's %s does not have; it would change "
                           "the model",
                           gguf_name(g), gguf_shown(name, shown), a->name);
    }
    return 0;
}

/* ---- a base held in its blocks ------------------------------------------------------ */

/* HeldRows' unpack: rows of a quantized matrix in the mapping, in Strait's
 * order (perm: the head size whose rotary interleave to undo, 0: none) */
static void unpack_rows(const HeldRows *h, size_t r0, size_t n, float *out) {
    uint32_t block, bytes;
    gguf_type_block(h->type, &block, &bytes);
    size_t row_bytes = h->cols / block * bytes;
    char why[ERR_LEN];
    for (size_t r = 0; r < n; r++) {
        size_t from = h->perm ? perm_row(r0 + r, h->perm) : r0 + r;
        assert(from < h->rows);
        /* the same bytes the load decoded: they decode again */
        if (gguf_dequantize(h->type, (const uint8_t *)h->src + from * row_bytes, h->cols,
                            out + r * h->cols, why) != 0)
            DIE("a held matrix no longer decodes: %s", why);
    }
}

static void close_file(void *g) {
    gguf_close(g);
}

static int by_offset(const void *a, const void *b) {
    size_t x = ((const HeldRows *)a)->offset, y = ((const HeldRows *)b)->offset;
    return x < y ? -1 : x > y;
}

/* m's quantized projections (not the embedding or the output layer, which
 * the classifier reads whole) as the file's blocks: m then owns g (closed
 * here when it has none, and at the first pass when a bf16 base will not
 * read them) */
static void hold_blocks(Gguf *g, Model *m) {
    const ModelConfig *c = &m->cfg;
    const Arch *a = m->arch;
    HeldRows *hs = callocCheck((size_t)m->n_views, sizeof *hs);
    int n = 0;
    for (int r = 0; r < a->n_tensors; r++)
        for (int l = 0; l < (a->tensors[r].layer ? c->L : 1); l++) {
            const ArchTensor *t = &a->tensors[r];
            char name[96];
            if (!arch_has(c, t) || t->d1 == DIM_NONE || r == a->embed_row || r == a->head_row ||
                gguf_name_of(t, l, name, sizeof name) != 0)
                continue;
            const GgufTensor *gt = gguf_tensor(g, name);
            if (gt == NULL || gt->type == GGML_F32 || gt->type == GGML_F16 || gt->type == GGML_BF16)
                continue;
            hs[n++] = (HeldRows){.offset = (size_t)(arch_w(m, m->params, r, l) - m->params),
                                 .rows = (size_t)arch_dim(c, t->d0),
                                 .cols = (size_t)arch_dim(c, t->d1),
                                 .src = gt->data,
                                 .type = gt->type,
                                 .perm = permuted_heads(c, t) ? c->HD : 0,
                                 .unpack = unpack_rows};
        }
    if (n == 0) { /* nothing quantized: nothing to keep */
        free(hs);
        gguf_close(g);
        return;
    }
    qsort(hs, (size_t)n, sizeof *hs, by_offset);
    m->held = hs, m->n_held = n;
    m->held_file = g, m->held_close = close_file;
    gguf_drop_pages(g); /* read again, a matrix at a time, when a pass unpacks it */
}

/* keep: a base's import, whose quantized projections may stay in the file */
static int import_gguf(Model *m, const char *path, int keep, char *err) {
    memset(m, 0, sizeof *m);
    Gguf *g = gguf_open(path, err);
    if (g == NULL) return -1;
    ModelConfig cfg;
    int rc = config_read(g, &cfg, err);
    /* every tensor's shape and type before the model is allocated */
    if (rc == 0) rc = unused_tensor(g, &cfg, err);
    if (rc == 0) rc = take_all(g, &cfg, NULL, 0, err);
    if (rc == 0) rc = model_build(m, &cfg, 0, err);
    if (rc == 0) {
        memset(m->params, 0, m->n_params * sizeof(float)); /* padded embedding rows stay zero */
        rc = take_all(g, &cfg, m, 1, err);
        if (rc != 0) model_free(m);
    }
    if (rc == 0 && keep) {
        hold_blocks(g, m);
        return 0;
    }
    gguf_close(g);
    return rc;
}

int model_import_gguf(Model *m, const char *path, char *err) {
    return import_gguf(m, path, 0, err);
}

int gguf_path_is(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int model_import_frozen(Model *m, const char *path, char *err) {
    return gguf_path_is(path) ? import_gguf(m, path, 1, err) : model_import_hf(m, path, err);
}

int model_import(Model *m, const char *path, char *err) {
    return gguf_path_is(path) ? model_import_gguf(m, path, err) : model_import_hf(m, path, err);
}

int model_import_base(Model *m, const ModelConfig *cfg, const char *base_path, char *err) {
    if (cfg->lora.rank == 0) return err_set(err, "the model has no adapters to put over a base");
    if (model_import_frozen(m, base_path, err) != 0) return -1;
    const ModelConfig *b = &m->cfg;
    int rc = 0;
    if (b->arch != cfg->arch || b->L != cfg->L || b->C != cfg->C || b->NH != cfg->NH ||
        b->NKV != cfg->NKV || b->HD != cfg->HD || b->F != cfg->F || b->V != cfg->V ||
        b->tied != cfg->tied || b->qkv_bias != cfg->qkv_bias || b->T != cfg->T ||
        b->eps != cfg->eps || memcmp(&b->rope, &cfg->rope, sizeof b->rope) != 0)
        rc = err_set(err,
                     "%s is a %s of %d layers and %d channels (and its context, norm epsilon and "
                     "rotary settings); the adapters were trained over a %s of %d layers and %d "
                     "channels: give the base they were made for, read as it was then",
                     base_path, model_arch_name(b->arch), b->L, b->C, model_arch_name(cfg->arch),
                     cfg->L, cfg->C);
    uint64_t fp = rc == 0 ? model_base_fingerprint(m) : 0;
    if (rc == 0 && fp != cfg->lora.base)
        rc = err_set(err,
                     "%s holds other weights than the base the adapters were trained over "
                     "(fingerprint %016llx, not %016llx): give that base, as it was read then",
                     base_path, (unsigned long long)fp, (unsigned long long)cfg->lora.base);
    if (rc == 0) rc = model_add_adapters(m, &cfg->lora, 0, err);
    if (rc == 0) memset(m->params, 0, m->n_params * sizeof(float));
    if (rc != 0) model_free(m);
    return rc;
}

int model_load_checkpoint(Model *m, const ModelConfig *cfg, const char *ckpt, const char *base_path,
                          char *err) {
    memset(m, 0, sizeof *m);
    int adapted = cfg->lora.rank > 0, rc;
    if (adapted && base_path)
        rc = model_import_base(m, cfg, base_path, err);
    else if (adapted && cfg->lora.base_seed < 0)
        return err_set(err,
                       "%s holds adapters trained over a pretrained base: give that base (the "
                       "GGUF file or Hugging Face folder) with --base",
                       ckpt);
    else
        rc = model_build(m, cfg, 0, err);
    if (rc == 0 && adapted && model_base_fingerprint(m) != cfg->lora.base)
        rc = err_set(err,
                     "%s: the base drawn from its seed is not the one its adapters were "
                     "trained over",
                     ckpt);
    if (rc == 0) rc = model_load(m, ckpt, NULL, err);
    if (rc != 0) model_free(m);
    return rc;
}

/* ---- out ------------------------------------------------------------------------- */

/* the header being written: metadata and tensor infos (owned) */
typedef struct Buf {
    uint8_t *p;
    size_t n, cap;
} Buf;

static void put(Buf *b, const void *v, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 4096;
        b->p = realloc(b->p, b->cap);
        if (b->p == NULL) DIE("out of memory for a GGUF header");
    }
    memcpy(b->p + b->n, v, n);
    b->n += n;
}
static void put_u32(Buf *b, uint32_t v) {
    put(b, &v, 4);
}
static void put_u64(Buf *b, uint64_t v) {
    put(b, &v, 8);
}
static void put_str(Buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_head(Buf *b, int *n, const char *key, uint32_t type) {
    put_str(b, key);
    put_u32(b, type);
    (*n)++;
}
static void kv_u32(Buf *b, int *n, const char *key, uint32_t v) {
    kv_head(b, n, key, GGUF_U32);
    put_u32(b, v);
}
static void kv_f32(Buf *b, int *n, const char *key, float v) {
    kv_head(b, n, key, GGUF_F32);
    put(b, &v, 4);
}
static void kv_str(Buf *b, int *n, const char *key, const char *v) {
    kv_head(b, n, key, GGUF_STRING);
    put_str(b, v);
}
static void kv_strs(Buf *b, int *n, const char *key, char *const *v, int count) {
    kv_head(b, n, key, GGUF_ARRAY);
    put_u32(b, GGUF_STRING);
    put_u64(b, (uint64_t)count);
    for (int i = 0; i < count; i++) put_str(b, v[i]);
}

int gguf_dtype_of(const char *name) {
    static const struct {
        const char *name;
        int type;
    } D[] = {{"f32", GGML_F32}, {"f16", GGML_F16}, {"bf16", GGML_BF16}, {"q8_0", GGML_Q8_0}};
    for (size_t i = 0; i < sizeof D / sizeof D[0]; i++)
        if (strcmp(D[i].name, name) == 0) return D[i].type;
    return -1;
}

/* one tensor of the file: its name, dims, type, and the fp32 values it is
 * made from in llama.cpp's order (owned when own) */
typedef struct OutTensor {
    char name[96];
    int n_dims;
    uint64_t ne[2];
    uint32_t type;
    const float *src;
    float *own;
    uint64_t bytes, offset;
} OutTensor;

static void encode(const OutTensor *t, uint8_t *out) {
    size_t n = (size_t)(t->ne[0] * (t->n_dims > 1 ? t->ne[1] : 1));
    if (t->type == GGML_F32) {
        memcpy(out, t->src, n * 4);
    } else if (t->type == GGML_Q8_0) {
        gguf_quantize_q8_0(t->src, n, out);
    } else {
        for (size_t i = 0; i < n; i++) {
            uint16_t h = t->type == GGML_F16 ? float_to_half(t->src[i]) : float_to_bf16(t->src[i]);
            memcpy(out + 2 * i, &h, 2);
        }
    }
}

static void put_tokenizer(Buf *b, int *n, const TokenizerLists *tok) {
    kv_str(b, n, "tokenizer.ggml.model", "gpt2");
    if (tok->pre) kv_str(b, n, "tokenizer.ggml.pre", tok->pre);
    kv_strs(b, n, "tokenizer.ggml.tokens", tok->tokens, tok->n_tokens);
    if (tok->types) {
        kv_head(b, n, "tokenizer.ggml.token_type", GGUF_ARRAY);
        put_u32(b, GGUF_I32);
        put_u64(b, (uint64_t)tok->n_tokens);
        put(b, tok->types, 4 * (size_t)tok->n_tokens);
    }
    kv_strs(b, n, "tokenizer.ggml.merges", tok->merges, tok->n_merges);
    static const char *const ids[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                      "tokenizer.ggml.unknown_token_id",
                                      "tokenizer.ggml.padding_token_id"};
    int v[] = {tok->bos, tok->eos, tok->unk, tok->pad};
    for (int i = 0; i < 4; i++)
        if (v[i] >= 0) kv_u32(b, n, ids[i], (uint32_t)v[i]);
    if (tok->chat_template) kv_str(b, n, "tokenizer.chat_template", tok->chat_template);
}

/* the tokenizer.* keys of src, verbatim; -1 unless its token list is V long */
static int put_tokenizer_of(Buf *b, int *n, const Gguf *src, int V, char *err) {
    int ti = gguf_find_key(src, "tokenizer.ggml.tokens"), at = -1;
    if (gguf_find_key(src, "tokenizer.ggml.model") < 0 || ti < 0)
        return err_set(err, "%s has no tokenizer (tokenizer.ggml.model and .tokens)",
                       gguf_name(src));
    if (gguf_kv_type(src, ti, &at) != GGUF_ARRAY || gguf_kv_len(src, ti) != (uint64_t)V)
        return err_set(err,
                       "%s: tokenizer.ggml.tokens holds %llu entries; the model's vocabulary is %d",
                       gguf_name(src), (unsigned long long)gguf_kv_len(src, ti), V);
    for (int i = 0; i < gguf_n_kv(src); i++) {
        const char *key = gguf_kv_key(src, i);
        if (strncmp(key, "tokenizer.", 10) != 0) continue;
        const uint8_t *v;
        size_t len = gguf_kv_value_bytes(src, i, &v);
        put_str(b, key);
        put(b, v, len);
        (*n)++;
    }
    return 0;
}

/* t's values, checked before a byte is written: finite, and inside what
 * its type holds */
static int values_fit(const OutTensor *t, char *err) {
    size_t n = (size_t)(t->ne[0] * t->ne[1]);
    for (size_t i = 0; i < n; i++) {
        float x = t->src[i];
        if (!isfinite(x))
            return err_set(err, "tensor %s holds %s at element %zu; nothing written", t->name,
                           isnan(x) ? "NaN" : "an infinity", i);
        if (t->type == GGML_F16 && isinf(half_to_float(float_to_half(x))))
            return err_set(err,
                           "tensor %s holds %g at element %zu, beyond f16's range (65504); "
                           "export in bf16 or f32",
                           t->name, (double)x, i);
        if (t->type == GGML_BF16 && isinf(bf16_to_float(float_to_bf16(x))))
            return err_set(err,
                           "tensor %s holds %g at element %zu, beyond bf16's range; export in f32",
                           t->name, (double)x, i);
        /* Q8_0's scale amax / 127 is an f16 */
        if (t->type == GGML_Q8_0 && isinf(half_to_float(float_to_half(fabsf(x) / 127))))
            return err_set(err,
                           "tensor %s holds %g at element %zu, beyond Q8_0's range (its scale "
                           "is an f16); export in bf16 or f32",
                           t->name, (double)x, i);
    }
    return 0;
}

int model_export_gguf(const Model *m, const char *path, int dtype, const TokenizerLists *tok,
                      const Gguf *tok_src, char *err) {
    const ModelConfig *c = &m->cfg;
    if (m->arch->gguf_arch == NULL)
        return err_set(err, "GGUF export takes the Llama family (llama, qwen2), not %s",
                       model_arch_name(c->arch));
    if (dtype != GGML_F32 && dtype != GGML_F16 && dtype != GGML_BF16 && dtype != GGML_Q8_0)
        return err_set(err, "GGUF export writes f32, f16, bf16 or q8_0");
    if (c->arch != ARCH_LLAMA && c->rope.factor > 0)
        return err_set(err,
                       "the model has Llama 3's rope scaling; llama.cpp's %s has no rotary "
                       "divisors (rope_freqs) to carry it",
                       model_arch_name(c->arch));
    if (tok_src) tok = NULL; /* the source's keys win */
    if (tok && tok->n_tokens != c->V)
        return err_set(err, "the tokenizer has %d tokens; the model's vocabulary is %d",
                       tok->n_tokens, c->V);
    const Arch *a = m->arch;
    const char *an = a->name;
    Buf b = {0};
    int n_kv = 0;
    char k[128];
#define KEY(s) (snprintf(k, sizeof k, "%s.%s", an, s), k)
    kv_str(&b, &n_kv, "general.architecture", an);
    kv_str(&b, &n_kv, "general.name", "strait");
    kv_u32(&b, &n_kv, "general.alignment", 32);
    /* llama.cpp's file types: all F32 0, mostly F16 1, Q8_0 7, BF16 32 */
    kv_u32(&b, &n_kv, "general.file_type",
           dtype == GGML_F32    ? 0
           : dtype == GGML_F16  ? 1
           : dtype == GGML_Q8_0 ? 7
                                : 32);
    if (dtype == GGML_Q8_0) kv_u32(&b, &n_kv, "general.quantization_version", 2);
    kv_u32(&b, &n_kv, KEY("block_count"), (uint32_t)c->L);
    kv_u32(&b, &n_kv, KEY("context_length"), (uint32_t)c->T);
    kv_u32(&b, &n_kv, KEY("embedding_length"), (uint32_t)c->C);
    kv_u32(&b, &n_kv, KEY("feed_forward_length"), (uint32_t)c->F);
    kv_u32(&b, &n_kv, KEY("attention.head_count"), (uint32_t)c->NH);
    kv_u32(&b, &n_kv, KEY("attention.head_count_kv"), (uint32_t)c->NKV);
    kv_f32(&b, &n_kv, KEY("rope.freq_base"), c->rope.theta);
    kv_f32(&b, &n_kv, KEY("attention.layer_norm_rms_epsilon"), c->eps);
    kv_u32(&b, &n_kv, KEY("rope.dimension_count"), (uint32_t)c->HD);
    kv_u32(&b, &n_kv, KEY("vocab_size"), (uint32_t)c->V);
    if (c->HD * c->NH != c->C) {
        kv_u32(&b, &n_kv, KEY("attention.key_length"), (uint32_t)c->HD);
        kv_u32(&b, &n_kv, KEY("attention.value_length"), (uint32_t)c->HD);
    }
#undef KEY
    if (c->rope.factor > 0) { /* rope_freqs' setting, for Strait's reader */
        kv_f32(&b, &n_kv, SCALING[0], c->rope.factor);
        kv_f32(&b, &n_kv, SCALING[1], c->rope.low_freq);
        kv_f32(&b, &n_kv, SCALING[2], c->rope.high_freq);
        kv_u32(&b, &n_kv, SCALING[3], (uint32_t)c->rope.original_ctx);
    }
    if (tok_src && put_tokenizer_of(&b, &n_kv, tok_src, c->V, err) != 0) {
        free(b.p);
        return -1;
    }
    if (tok) put_tokenizer(&b, &n_kv, tok);
    if (tok == NULL && tok_src == NULL) /* llama.cpp's vocabulary type none; vocab_size says V */
        kv_str(&b, &n_kv, "tokenizer.ggml.model", "none");
    /* the tensors, in the table's order; q and k interleaved for llama */
    assert(!m->base_rounded); /* the base as loaded, never after a bf16 pass */
    OutTensor *ts = callocCheck((size_t)model_base_n_views(m) + 1, sizeof *ts);
    int n = 0;
    for (int r = 0; r < a->n_tensors; r++)
        for (int l = 0; l < (a->tensors[r].layer ? c->L : 1); l++) {
            const float *src = arch_w(m, model_base(m), r, l);
            if (src == NULL) continue;
            const ArchTensor *t = &a->tensors[r];
            OutTensor *o = &ts[n++];
            gguf_name_of(t, l, o->name, sizeof o->name);
            int two_d = t->d1 != DIM_NONE;
            uint64_t rows = t->d0 == DIM_VP ? (uint64_t)c->V : (uint64_t)arch_dim(c, t->d0);
            uint64_t cols = two_d ? (uint64_t)arch_dim(c, t->d1) : 1;
            o->n_dims = two_d ? 2 : 1;
            o->ne[0] = two_d ? cols : rows, o->ne[1] = two_d ? rows : 1;
            /* 1-D in F32 as llama.cpp's converter keeps them; Q8_0 needs
             * rows of whole blocks, else F16 as the converter falls back */
            o->type = !two_d                            ? GGML_F32
                      : dtype == GGML_Q8_0 && cols % 32 ? GGML_F16
                                                        : (uint32_t)dtype;
            o->src = src;
            int heads = permuted_heads(c, t);
            if (heads) {
                o->own = mallocCheck(sizeof(float) * (size_t)(rows * cols));
                for (size_t rr = 0; rr < rows; rr++)
                    memcpy(o->own + perm_row(rr, c->HD) * cols, src + rr * cols,
                           sizeof(float) * cols);
                o->src = o->own;
            }
        }
    if (c->rope.factor > 0) { /* Llama 3's scaling, as the converter writes it */
        OutTensor *o = &ts[n++];
        snprintf(o->name, sizeof o->name, "%s", ROPE_FREQS);
        o->n_dims = 1, o->ne[0] = (uint64_t)c->HD / 2, o->ne[1] = 1, o->type = GGML_F32;
        o->own = mallocCheck(sizeof(float) * (size_t)c->HD / 2);
        llama3_divisors(c, o->own);
        o->src = o->own;
    }
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) rc = values_fit(&ts[i], err);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint32_t block, bytes;
        gguf_type_block(ts[i].type, &block, &bytes);
        ts[i].bytes = ts[i].ne[0] * ts[i].ne[1] / block * bytes;
        ts[i].offset = off;
        off += (ts[i].bytes + 31) / 32 * 32;
    }
    Buf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, (uint64_t)n);
    put_u64(&h, (uint64_t)n_kv);
    put(&h, b.p, b.n);
    for (int i = 0; i < n; i++) {
        put_str(&h, ts[i].name);
        put_u32(&h, (uint32_t)ts[i].n_dims);
        for (int d = 0; d < ts[i].n_dims; d++) put_u64(&h, ts[i].ne[d]);
        put_u32(&h, ts[i].type);
        put_u64(&h, ts[i].offset);
    }
    static const uint8_t zeros[32] = {0};
    put(&h, zeros, (32 - h.n % 32) % 32);
    AtomicFile *af = rc == 0 ? file_atomic_open(path, 0644, err) : NULL;
    if (rc == 0) rc = af ? file_atomic_write(af, h.p, h.n, err) : -1;
    uint8_t *enc = NULL;
    for (int i = 0; i < n && rc == 0; i++) {
        enc = realloc(enc, (size_t)ts[i].bytes + 32);
        if (enc == NULL) DIE("out of memory for a tensor");
        encode(&ts[i], enc);
        size_t pad = (32 - ts[i].bytes % 32) % 32;
        memset(enc + ts[i].bytes, 0, pad);
        rc = file_atomic_write(af, enc, (size_t)ts[i].bytes + pad, err);
    }
    free(enc);
    for (int i = 0; i < n; i++) free(ts[i].own);
    free(ts);
    free(b.p);
    free(h.p);
    if (af && rc != 0) file_atomic_abort(af);
    return rc == 0 ? file_atomic_commit(af, err) : -1;
}
