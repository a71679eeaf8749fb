/*
 * arch.h — an architecture as data, for kernels/ alone: its tensor table
 * (each tensor's name, shape as a function of the configuration, when it
 * exists, its initialisation and its Hugging Face name and layout) and its
 * graph (the activation layout, and one forward and one backward over an
 * Ops table). The parameter table, the parameter count, checkpoints, HF
 * import and export are derived from the tensor table; nothing indexes
 * parameters by position. An architecture also brings its presets and its
 * rules for a configuration (the check hook).
 *
 * The registry is kernels/arch.c: a new architecture is one file
 * (kernels/arch_<name>.c) defining one Arch, and one row in ARCHES
 * (model.h). The arrows: arch_<name>.c use this header alone; arch.c
 * (the registry and the table walk) uses them; config.c (checks, presets,
 * JSON) uses arch.c; model.c (building) uses config.c and arch.c.
 */
#ifndef STRAIT_KERNELS_ARCH_H
#define STRAIT_KERNELS_ARCH_H

#include "kernels/model.h"
#include "kernels/ops.h"

/* a dimension of a tensor, as a function of the configuration */
typedef enum { DIM_NONE, DIM_C, DIM_3C, DIM_4C, DIM_VP, DIM_T, DIM_Q, DIM_KV, DIM_F } Dim;
/* DIM_VP rows are initialised only up to V: the padding stays zero */
typedef enum { INIT_ZERO, INIT_ONE, INIT_NORMAL, INIT_RESID } Init;
typedef enum { IF_ALWAYS, IF_UNTIED, IF_QKV_BIAS } When;

typedef struct ArchTensor {
    const char *name; /* Strait's name; a layer's is "h.<l>." and this */
    int layer;        /* 1: one per layer (the table's layer rows are contiguous) */
    Dim d0, d1;       /* d1 DIM_NONE: a vector */
    Init init;
    When when;
    const char *hf; /* Hugging Face's name, "%d" the layer */
    int hf_conv1d;  /* stored there as [in, out] (GPT-2's Conv1D) */
    unsigned lora;  /* the LORA_* bit of a projection adapters may adapt (0: none) */
} ArchTensor;

/* a published shape (random weights; the real ones come from --init-from) */
typedef struct ArchPreset {
    const char *name;
    int L, C, NH, NKV, F, T, V, tied, qkv_bias;
    float theta, eps;
    RopeConfig scaling; /* factor 0: none */
} ArchPreset;

struct json_t;
typedef struct Arch {
    const char *name;      /* "gpt2" */
    const char *hf_class;  /* transformers' class: "GPT2LMHeadModel" */
    const char *hf_type;   /* config.json's model_type */
    const char *hf_prefix; /* before every tensor's Hugging Face name ("transformer.") */
    const ArchTensor *tensors;
    int n_tensors;
    int embed_row, head_row; /* the token embedding's row; the output layer's (if untied) */
    /* the activations of a (B, T) pass; the graph through the final norm
     * into ACT_OUT, and its backward from dACT_OUT */
    void (*layout)(const ModelConfig *c, int B, int T, ActLayout *lay);
    void (*forward)(const Model *m, const Pass *p);
    void (*backward)(const Model *m, const Pass *p);
    /* Hugging Face's config.json: its fields into c's shape (checked
     * after by model_config_check), -1 naming a field Strait cannot
     * honour; and c as config.json */
    int (*hf_config_read)(struct json_t *j, ModelConfig *c, char *err);
    struct json_t *(*hf_config_write)(const ModelConfig *c);
    /* A configuration whose shape (L, C, NH, T, V) is in range: what
     * follows from the shape set, the rest checked (-1 naming the first bad
     * field). shape_only: everything follows from the shape, and the
     * configuration's JSON carries the shape alone. */
    int (*check)(ModelConfig *c, char *err);
    int shape_only;
    const ArchPreset *presets;
    int n_presets;
    const char *gguf_arch; /* llama.cpp's general.architecture (NULL: none) */
} Arch;

/* hf_config.c: config.json's fields for the architectures' readers. Every
 * field of a config is one the reader uses (HF_USED), one known not to
 * change the model (HF_HARMLESS: every config's own — architectures,
 * transformers_version, dtype, use_cache, … — need not be listed), a token
 * id (HF_TOKEN_ID: null, an id or a list of ids), or a setting Strait
 * computes only at its neutral value (absent or that value, or null where
 * that is false or 0: transformers reads None as both); any
 * other is refused by name, since it might change the arithmetic. */
typedef enum { HF_USED, HF_HARMLESS, HF_TOKEN_ID, HF_FALSE, HF_TRUE, HF_ZERO, HF_ONE } HfRule;
typedef struct HfField {
    const char *key;
    HfRule rule;
} HfField;
/* every field of j in fields, more (a second table, NULL: none) or the
 * fields every config.json carries, at a value its rule takes */
int hf_fields_check(struct json_t *j, const HfField *fields, int n, const HfField *more, int n_more,
                    char *err);
/* An integer field in [lo, hi] (absent or null: def, or an error naming it
 * when def < 0); a number (absent or null: def). */
int hf_int(struct json_t *j, const char *key, long long def, long long lo, long long hi, int *out,
           char *err);
int hf_num(struct json_t *j, const char *key, double def, float *out, char *err);

#define ARCH_EXTERN(up, low) extern const Arch arch_##low;
ARCHES(ARCH_EXTERN)
#undef ARCH_EXTERN
/* the registry's row for ARCH_* (NULL: none); the one named (NULL) */
const Arch *arch_of(int arch);
const Arch *arch_named(const char *name);

/* a dimension's size */
static inline int arch_dim(const ModelConfig *c, Dim d) {
    switch (d) {
    case DIM_NONE:
        return 1;
    case DIM_C:
        return c->C;
    case DIM_3C:
        return 3 * c->C;
    case DIM_4C:
        return 4 * c->C;
    case DIM_VP:
        return c->Vp;
    case DIM_T:
        return c->T;
    case DIM_Q:
        return c->NH * c->HD;
    case DIM_KV:
        return c->NKV * c->HD;
    case DIM_F:
        return c->F;
    }
    return 0;
}
/* whether a table row exists in this configuration */
static inline int arch_has(const ModelConfig *c, const ArchTensor *t) {
    return t->when == IF_ALWAYS || (t->when == IF_UNTIED && !c->tied) ||
           (t->when == IF_QKV_BIAS && c->qkv_bias);
}
/* Calls f for every tensor of the configuration in table order: its row,
 * layer (0 outside layers), name and shape. */
typedef void (*TensorFn)(void *ctx, int row, int layer, const char *name, int ndim, int d0, int d1);
void arch_each_tensor(const ModelConfig *c, TensorFn f, void *ctx);

/* table row r's tensor at layer l (0 for the others) inside base (the
 * base's weights or their gradients, host or device: laid out by
 * base_views), NULL if this configuration has none */
static inline float *arch_w(const Model *m, float *base, int r, int l) {
    int v = m->row_view[r * m->cfg.L + l];
    return v < 0 ? NULL : base + model_base_views(m)[v].offset;
}

/* the base's weight of row r at layer l inside base (NULL: none, or
 * frozen when base is NULL) */
static inline float *arch_wg(const Model *m, float *base, int r, int l) {
    return base ? arch_w(m, base, r, l) : NULL;
}

/* lora.c: the adapters inside an architecture's graph. lora_layout adds
 * activations a0 .. a0 + 8 (one per adapted projection, and a scratch);
 * lora_forward adds (alpha / rank) B A inp to out after row r's
 * projection at layer l, lora_backward its gradients (into dinp and the
 * adapters'), both nothing when row r is not adapted. */
#define LORA_ACTS 8
void lora_layout(const ModelConfig *c, int B, int T, ActLayout *lay, int a0);
void lora_forward(const Model *m, const Pass *p, int a0, int r, int l, const float *inp,
                  float *out);
void lora_backward(const Model *m, const Pass *p, int a0, int r, int l, const float *inp,
                   float *dinp, const float *dout);

/* model.c: a base's held matrices (Model's held) and their file let go,
 * when its blocks will not be read (graph.c) or the model is freed */
void model_drop_held(Model *m);

/* layout helpers: activation a of n floats (per layer when layers > 0);
 * act_carry marks the per-layer one whose gradient flows into the layer
 * below (the residual stream's); act_finish, after the last act_add,
 * places the gradients: the per-layer ones in one block every layer
 * shares, the carried one in two slots, layer l's in slot l % 2, then
 * those of the activations outside the layers. */
enum { ACT_KIND_NONE, ACT_KIND_ONCE, ACT_KIND_LAYER, ACT_KIND_CARRY };
static inline void act_add(ActLayout *lay, int a, size_t n, int layers) {
    lay->off[a] = lay->len;
    lay->stride[a] = layers > 0 ? n : 0;
    lay->len += layers > 0 ? n * (size_t)layers : n;
    lay->kind[a] = layers > 0 ? ACT_KIND_LAYER : ACT_KIND_ONCE;
    lay->dstride[a] = n; /* its size, until act_finish */
}
/* a per-layer activation one buffer holds for every layer when the pass
 * recomputes level's activations (lay->recompute >= level), its gradient
 * in the layers' shared block as act_add's; kept per layer otherwise */
static inline void act_add_recomputed(ActLayout *lay, int a, size_t n, int layers, int level) {
    act_add(lay, a, n, lay->recompute >= level ? 1 : layers);
    lay->kind[a] = ACT_KIND_LAYER;
    if (lay->recompute >= level) lay->stride[a] = 0;
}
/* whether a layer's backward computes level's activations again */
static inline int act_recomputes(const Pass *p, int level) {
    return p->lay->recompute >= level;
}
static inline void act_carry(ActLayout *lay, int a) {
    lay->kind[a] = ACT_KIND_CARRY;
}
static inline void act_finish(ActLayout *lay) {
    lay->dlen = lay->dlayer = 0;
    for (int k = ACT_KIND_LAYER; k >= ACT_KIND_ONCE; k--) /* the layers' block first */
        for (int a = 0; a < ACT_MAX; a++) {
            if (lay->kind[a] != k && !(k == ACT_KIND_ONCE && lay->kind[a] == ACT_KIND_CARRY))
                continue;
            size_t n = lay->dstride[a];
            lay->doff[a] = lay->dlen;
            lay->dstride[a] = lay->kind[a] == ACT_KIND_CARRY ? n : 0;
            lay->dlen += lay->kind[a] == ACT_KIND_CARRY ? 2 * n : n;
            if (k == ACT_KIND_LAYER) lay->dlayer = lay->dlen;
        }
}
/* activation a (at layer l) inside buffer base (the pass's acts) */
static inline float *act_at(const Pass *p, float *base, int a, int l) {
    return base + p->lay->off[a] + (size_t)l * p->lay->stride[a];
}
/* the gradient of activation a at layer l (in the pass's dacts): valid
 * from the start of layer l's backward (act_layer_start) to its end, the
 * carried one's until the backward of the layer below has read it */
static inline float *dact_at(const Pass *p, int a, int l) {
    const ActLayout *y = p->lay;
    return p->dacts + y->doff[a] +
           (y->kind[a] == ACT_KIND_CARRY ? (size_t)(l & 1) * y->dstride[a] : 0);
}
/* at the start of layer l's backward: the shared block zeroed, and the
 * carried gradient's slot for layer l - 1 (layer l + 1's, read by now) */
static inline void act_layer_start(const Pass *p, int carry, int l) {
    p->ops->zero(p->dacts, p->lay->dlayer, p->stream);
    p->ops->zero(dact_at(p, carry, l + 1), p->lay->dstride[carry], p->stream);
}

#endif /* STRAIT_KERNELS_ARCH_H */
