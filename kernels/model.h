/*
 * model.h — the language model: its configuration (an architecture and a
 * shape, kernels/config.c), the parameter table (one contiguous buffer of
 * named views, derived from the architecture's tensor table in
 * kernels/arch.h, which checkpoints, codecs and aggregation all walk),
 * seeded initialisation (kernels/model.c), forward and backward over an
 * Ops table, gradient clipping and next-token logits (kernels/graph.c).
 * Training it is train.h; its files are formats.h.
 *
 * The architectures: GPT-2 (learned positions, LayerNorm, GELU MLP, fused
 * qkv, tied embeddings) and the Llama family (RMSNorm, rotary embeddings,
 * SwiGLU, grouped-query attention, tied or untied embeddings; Qwen2 adds
 * q/k/v biases).
 */
#ifndef STRAIT_KERNELS_MODEL_H
#define STRAIT_KERNELS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

/* The architectures, in the registry's order (kernels/arch.c): a new one
 * is its file, kernels/arch_<name>.c, and a row here. */
#define ARCHES(X)          X(GPT2, gpt2) X(LLAMA, llama) X(QWEN2, qwen2)
#define ARCH_ENUM(up, low) ARCH_##up,
enum { ARCHES(ARCH_ENUM) ARCH_COUNT };
#undef ARCH_ENUM

/* Low-rank adapters (LoRA, as PEFT computes them): beside each adapted
 * projection W (out x in) of the frozen base, y = W x + (alpha / rank) B A x
 * with A (rank x in) and B (out x rank); only the adapters train and
 * travel. The projections, by their Hugging Face names: */
enum {
    LORA_Q = 1 << 0,    /* q_proj */
    LORA_K = 1 << 1,    /* k_proj */
    LORA_V = 1 << 2,    /* v_proj */
    LORA_O = 1 << 3,    /* o_proj */
    LORA_GATE = 1 << 4, /* gate_proj */
    LORA_UP = 1 << 5,   /* up_proj */
    LORA_DOWN = 1 << 6, /* down_proj */
    LORA_ALL = (1 << 7) - 1
};
#define LORA_RANK_MAX 1024
/* What trains and travels, and so what averaging the sites' adapters
 * averages (a federation's [model] rule):
 *   fedit  A and B both train (PEFT's LoRA); averaged apart they miss:
 *          mean(B)·mean(A) is not mean(B·A) (FedIT, the naive baseline)
 *   ffa    FFA-LoRA: A stays at its draw from a_seed, the same at every
 *          site, and only B trains: mean(B)·A is mean(B·A) exactly
 *   fedsb  Fed-SB (LoRA-SB's parametrization): y = W x + s·B·R·A x with A
 *          and B both at their draws from a_seed and R (rank x rank, zero
 *          at first) alone training: B·mean(R)·A is mean(B·R·A) exactly,
 *          in rank² values per adapted projection */
#define LORA_RULES(X)           X(FEDIT, fedit) X(FFA, ffa) X(FEDSB, fedsb)
#define LORA_RULE_ENUM(up, low) LORA_RULE_##up,
enum { LORA_RULES(LORA_RULE_ENUM) LORA_RULE_COUNT };
#undef LORA_RULE_ENUM
typedef struct AdapterConfig {
    int rank;          /* 0: none, the whole model trains; else 1..LORA_RANK_MAX */
    float alpha;       /* PEFT's lora_alpha: the adapters' output is scaled by alpha / rank */
    unsigned targets;  /* LORA_* adapted (PEFT's default for the Llama family: q and v) */
    uint64_t base;     /* the frozen base's fingerprint (model_base_fingerprint; 0: not taken) */
    int64_t base_seed; /* the seed a drawn base was drawn from; -1: a pretrained one */
    int rule;          /* LORA_RULE_* */
    uint64_t a_seed;   /* ffa, fedsb: what the rule freezes is drawn from it at every site */
    /* the base's matrices (matmuls, the classifier, the embedding) held
     * and multiplied in bf16 (inputs rounded to bf16, sums in fp32: ops.h's
     * matmul_*_bf16), its vectors (norms, biases) in fp32; 0: all in fp32 */
    int base_bf16;
    /* PEFT's lora_dropout: in training, each adapter's input (what A takes)
     * has this fraction of its values zeroed and the rest scaled by
     * 1 / (1 - dropout), a mask of its own a step; 0 <= dropout < 1 */
    float dropout;
} AdapterConfig;

typedef struct ModelConfig {
    char name[24];   /* preset name, or "custom", "hf", ... */
    int arch;        /* ARCH_* */
    int L, C, NH, T; /* layers, channels, heads, max sequence */
    int V, Vp;       /* vocabulary, and padded to a multiple of 64 */
    int NKV, HD, F;  /* key/value heads, head size, MLP hidden (GPT-2: NH, C/NH, 4C) */
    int tied;        /* the output layer is the token embedding */
    int qkv_bias;    /* biases on q, k and v (Qwen2; GPT-2's fused qkv always has one) */
    float eps;       /* the norms' epsilon */
    RopeConfig rope; /* the Llama family's rotary embeddings */
    AdapterConfig lora;
} ModelConfig;

/* the architecture's name ("gpt2", "llama", "qwen2"), transformers' class
 * for it ("GPT2LMHeadModel"), ARCH_* of a name (-1) */
const char *model_arch_name(int arch);
const char *model_hf_class(int arch);
int model_arch_of(const char *name);
/* every architecture's name, comma-separated, for messages and help */
const char *model_arch_names(void);

/* Parameters of a shape (its table's size), before anything is built. */
double model_config_params(const ModelConfig *cfg);
/* About what training a shape takes in host memory at batch B x T: what
 * trains (parameters, their gradients, AdamW's moments in fp32, or bf16
 * with moments_bf16), a frozen base's values (with adapters: loaded at 4
 * bytes a value, a bf16 one then held at 2 before the activations are
 * touched, so the larger of the two; a chip without bf16 instructions
 * keeps a bf16 base at 4, an fp32 one's figure: the caller asks for that,
 * bf16_units), and a step's activations and their gradients (the
 * architecture's own layout, those recompute names held once). */
double model_train_bytes(const ModelConfig *cfg, int B, int T, int moments_bf16, int recompute);
/* The adapters' values of a configuration, every one held (frozen or
 * not), and those that train and travel (0 without adapters). */
double model_adapter_params(const ModelConfig *cfg);
double model_adapter_trained(const ModelConfig *cfg);

/* presets: tiny, small, base, gpt2-124m (GPT-2); llama-tiny, qwen2-tiny,
 * smollm2-135m, smollm2-360m, llama-3.2-1b, qwen2.5-0.5b (their shapes,
 * random weights); -1 for an unknown name */
int model_config_preset(const char *name, ModelConfig *cfg);
/* The presets' names, comma-separated, for messages and help; and those of
 * the byte-level ones (a vocabulary of 256: what trains on text as it is,
 * the demo's). */
const char *model_preset_names(void);
const char *model_byte_preset_names(void);
struct TokenSet;
/* The vocabulary cfg (model `name`) trains with on ts: a byte-level preset
 * (256) takes vocab when it is given, else GPT-2's 50257 for shards (more
 * if their ids go higher); a published or pretrained shape keeps its own
 * (vocab must be 0 then). -1 with err when vocab is out of 1-65536 or the
 * data holds ids beyond the vocabulary. */
int model_config_fit_tokens(ModelConfig *cfg, int vocab, int pretrained, const struct TokenSet *ts,
                            const char *name, char *err);
/* A GPT-2 shape given by someone else (a config.json, a coordinator):
 * checked to be one this code can build — 1..256 layers, channels 1..65536
 * a multiple of heads, context 1..2^20, vocabulary 2..2^22, at most 4
 * billion parameters — and padded. */
int model_config_shape(ModelConfig *cfg, const char *name, long long L, long long C, long long NH,
                       long long T, long long V, char *err);
/* Any configuration from outside checked the same way (every field, its
 * architecture's rules: NH a multiple of NKV, an even head size for rotary
 * embeddings, ...), Vp set; -1 naming the first bad field. */
int model_config_check(ModelConfig *cfg, char *err);
/* The configuration as JSON text (owned by the caller): what a checkpoint's
 * metadata and Hello carry. A GPT-2's has the keys it always had (L, C,
 * NH, T, V, Vp, name) and nothing more, so its checkpoints stay the bytes
 * they were; another architecture's adds "arch" and its fields. */
char *model_config_json(const ModelConfig *cfg);
/* The reverse, checked by model_config_check; -1 with the reason. */
int model_config_parse(const char *text, size_t len, ModelConfig *cfg, char *err);

/* One named tensor in the flat parameter buffer. */
typedef struct ParamView {
    char name[64];
    int ndim;
    int shape[2];
    size_t offset, numel; /* in floats */
} ParamView;

/* Activation offsets (in floats) inside one buffer for a (B, T): each
 * activation of the architecture's graph, per layer ones `stride` apart.
 * The first three are every architecture's: the final hidden state (the
 * classifier's input), the per-token losses and their log-sum-exp.
 * Their gradients have a layout of their own (doff, dstride, dlen): the
 * backward needs one layer's at a time, so every layer's share one block
 * (the first dlayer floats, zeroed as each layer's backward starts), but
 * for the gradient that carries the residual stream from a layer to the
 * one below, which alternates between two slots. */
enum { ACT_OUT, ACT_LOSSES, ACT_LSE, ACT_MAX = 40 };
/* What a layer's backward computes again from what it keeps (Model's
 * recompute, --recompute): nothing; the MLP's activation (GELU, SwiGLU:
 * one elementwise pass a layer, as llm.c's default); also the norms'
 * outputs (a norm's forward again, two a layer). Attention keeps each
 * query row's log-sum-exp at every level and makes its probabilities
 * again in its backward (ops.h). */
enum { MODEL_RECOMPUTE_NONE, MODEL_RECOMPUTE_ACT, MODEL_RECOMPUTE_NORM, MODEL_RECOMPUTE_MAX = 2 };
/* the level strait train and strait site run take without --recompute
 * (a Model, TrainJob or SiteRunOptions made zeroed keeps everything) */
#define MODEL_RECOMPUTE_DEFAULT MODEL_RECOMPUTE_ACT
typedef struct ActLayout {
    size_t off[ACT_MAX], stride[ACT_MAX], len;
    size_t doff[ACT_MAX], dstride[ACT_MAX], dlen, dlayer;
    unsigned char kind[ACT_MAX]; /* arch.h's ACT_KIND_*: where the gradient lies */
    int B, T;
    int recompute; /* given to the layout: Model's recompute */
} ActLayout;

struct Arch;
typedef struct Model {
    ModelConfig cfg;
    const struct Arch *arch;
    /* What trains and travels (the federation's θ, the codecs' sections,
     * AdamW, checkpoints): the architecture's table, or with adapters
     * (cfg.lora.rank > 0) the adapters' alone, layer by layer, of each
     * adapted projection what its rule trains: A then B (fedit), B (ffa),
     * R (fedsb). */
    ParamView *views; /* owned */
    int n_views;
    size_t n_params;
    uint64_t table_hash;   /* FNV-1a of names, shapes and order */
    float *params, *grads; /* owned, n_params each */
    /* With adapters, the architecture's table (what the graph reads): the
     * frozen base, owned, with no gradients; NULL without them, when the
     * table above is the architecture's (model_base and the like give
     * whichever it is; a caller may swap params for another buffer). */
    ParamView *base_views;
    int n_base_views;
    int *row_view; /* owned: base view of table row r at layer l (r * L + l), -1 if absent */
    size_t n_base;
    float *base;
    /* with adapters (owned), per table row r at layer l (r * L + l): the
     * view of what trains last (B, or R with fedsb; -1: not adapted), A's
     * offset (into params with fedit, else into lora_frozen), B's offset
     * into lora_frozen (fedsb; NULL otherwise); lora_frozen holds what the
     * rule freezes (NULL with fedit) */
    int *lora_view;
    size_t *lora_a, *lora_b;
    float *lora_frozen;
    /* with adapters over a bf16 base (lora.base_bf16), from the first
     * pass (graph.c): the base's matrices held in bf16 (base16) while the
     * fp32 table keeps pages for its vectors alone (base_mapped bytes of
     * its own mapping), or, on a chip without bf16 instructions, rounded
     * in place; base_rounded then says the fp32 values are not the loaded
     * ones, whose fingerprint base_print keeps; and the CPU ops' stream
     * that points at them */
    uint16_t *base16;
    /* a base from a GGUF file whose projections are quantized
     * (gguf_model.c, model_import_base): those matrices, which a bf16 base
     * then holds as the file's blocks (the file kept open: held_file,
     * closed by held_close), unpacked to the same bf16 values at each use;
     * blocks_off holds them in bf16 anyway */
    HeldRows *held;
    int n_held, blocks_off;
    void *held_file;
    void (*held_close)(void *file);
    size_t base_mapped, base16_mapped; /* bytes of their own mappings */
    int base_rounded;
    uint64_t base_print;
    CpuStream cpu;
    float *m, *v;      /* AdamW moments, allocated at the first step */
    int moments_bf16;  /* keep them in bf16 instead (mh, vh): 12 bytes a parameter, not 16 */
    uint16_t *mh, *vh; /* bf16 moments (bits), allocated at the first step */
    int step;          /* AdamW steps taken */
    /* mixed precision on the CPU (without adapters; a chip with bf16
     * units): each forward takes a bf16 copy of the matrices (params16),
     * which the matmuls and the classifier read with fp32 sums; every
     * gradient, the norms, AdamW and the parameters themselves stay fp32 */
    int precision_bf16;
    uint16_t *params16;
    /* activations the backward computes again instead of keeping one per
     * layer (MODEL_RECOMPUTE_*; the trainer sets it): the same values, so
     * the same steps bit for bit, with less memory and a little more work */
    int recompute;
    /* ZeRO-1 across a site's ranks (the trainer sets it): the moments (m, v
     * or mh, vh) hold the table's [moments_lo, moments_hi) alone, and AdamW
     * updates that part of the parameters; both 0: the whole table */
    size_t moments_lo, moments_hi;
    /* the adapters' dropout masks of the training step under way (its
     * forward and backward draw the same ones from it); 0: none, as in
     * every pass that does not train */
    uint64_t drop_seed;
    /* activations of the last forward, and their gradients (owned) */
    float *acts, *dacts;
    size_t acts_cap, dacts_cap;
    int fwd_cap; /* B x T the buffers were sized for */
    ActLayout lay;
    int fwd_B, fwd_T, has_targets;
    int *inputs, *targets;
    float loss;
} Model;

/* The architecture's table: the frozen base's views, values and count
 * with adapters, else what trains (row_view indexes these views). */
static inline float *model_base(const Model *m) {
    return m->base ? m->base : m->params;
}
static inline const ParamView *model_base_views(const Model *m) {
    return m->base_views ? m->base_views : m->views;
}
static inline size_t model_base_count(const Model *m) {
    return m->base ? m->n_base : m->n_params;
}
static inline int model_base_n_views(const Model *m) {
    return m->base_views ? m->n_base_views : m->n_views;
}

/* Builds the table and initialises from a seed as the architecture says
 * (GPT-2: N(0, 0.02), residual projections scaled by 1/sqrt(2L); norms'
 * weights 1, biases 0), the same bits on every machine. With adapters in
 * cfg, the base is drawn so (from cfg's base_seed when it has one) and the
 * adapters added from seed; a pretrained base is only stood in for (the
 * caller loads it: model_import_base). */
int model_build(Model *m, const ModelConfig *cfg, uint64_t seed, char *err);
/* Freezes m's weights as the base and adds adapters: A drawn from seed
 * (from a->a_seed with ffa and fedsb) as PEFT draws it (uniform in
 * ±1/sqrt(in)); B zero, or with fedsb drawn from a->a_seed (uniform in
 * ±1/sqrt(rank)) and R zero; so the model computes what it did. The
 * configuration's lora is a with the base's fingerprint, and base_seed -1
 * (a pretrained base; model_build's drawn one sets its seed). -1 when m
 * has adapters already, or a is not one m's architecture takes. */
int model_add_adapters(Model *m, const AdapterConfig *a, uint64_t seed, char *err);
/* A fingerprint of the base's values (XXH3 of its floats, table order):
 * what a federation of adapters checks every site's base against. */
uint64_t model_base_fingerprint(const Model *m);
/* the rows of the architecture's table: r in model_lora_at (and row_view,
 * lora_view) is 0 to this, less one */
int model_table_rows(const Model *m);
/* Row r's adapter at layer l inside what trains (buf: params or grads):
 * A, R and B, a frozen one lora_frozen's (NULL in grads), R NULL unless
 * the rule is fedsb; the projection's (in, out). Its update to the
 * projection is (alpha / rank)·B·A, or (alpha / rank)·B·R·A. 0 when the
 * row is not adapted there. */
typedef struct LoraAt {
    const float *A, *R, *B; /* (rank, in), (rank, rank), (out, rank) */
    int in, out;
} LoraAt;
int model_lora_at(const Model *m, const float *buf, int r, int l, LoraAt *at);
/* a rule's name ("ffa"), LORA_RULE_* of a name (-1), every name for messages */
const char *model_lora_rule_name(int rule);
int model_lora_rule_of(const char *name);
const char *model_lora_rule_names(void);
/* "q,v"-style lists of LORA_* (every name, "all"): -1 naming an unknown one */
int model_lora_targets_parse(const char *list, unsigned *targets, char *err);
/* the names of targets, comma-separated, into out */
void model_lora_targets_names(unsigned targets, char *out, size_t cap);
void model_free(Model *m);
const ParamView *model_view(const Model *m, const char *name);
/* The layout of a (B, T) pass's activations (what a GPU replica sizes its
 * buffers by). */
void model_layout(const Model *m, int B, int T, ActLayout *lay);
/* inputs, targets (B,T) token ids; targets may be NULL (returns -1). */
float model_forward(Model *m, const int *inputs, const int *targets, int B, int T);
void model_zero_grad(Model *m);
void model_backward(Model *m);
/* global L2 norm of the gradients */
float model_grad_norm(const Model *m);
/* Its parts: the squares of the gradients summed per block of
 * MODEL_NORM_BLOCK values (in float lanes, then double), the blocks of
 * [lo, hi) (lo a multiple of the block) into part[0..]; model_grad_norm is
 * the root of their sum in table order, whatever the thread count, so a
 * rank that holds some blocks' parts computes the same bits. */
#define MODEL_NORM_BLOCK 4096
void model_grad_sumsq(const Model *m, size_t lo, size_t hi, double *part);
/* ... scaled down to max_norm if above (0: never); returns the norm before */
float model_clip_grad_norm(Model *m, float max_norm);
/* logits (V) for the token after ctx[0..n) (the last T of them), for sampling */
void model_next_logits(Model *m, const int *ctx, int n, float *logits);

/* One pass of the graph on one backend: host or device buffers laid out by
 * the model's table and `lay`. What a GPU replica runs (kernels/cuda/). */
typedef struct Pass {
    const Ops *ops;
    void *stream;
    /* the architecture's weights and their gradients (NULL: frozen), the
     * adapters' and theirs (NULL: none) */
    float *params, *grads, *lora, *dlora;
    /* what the adapters' rule freezes (A; with fedsb B too) laid out as
     * the model's lora_frozen, on the pass's device; NULL: lora_frozen
     * itself (the host's) */
    const float *frozen;
    float *acts, *dacts;
    const ActLayout *lay;
    const int *inputs, *targets;
    int B, T;
    uint64_t drop; /* the adapters' dropout masks' seed (Model's drop_seed); 0: none */
} Pass;
/* forward through the classifier: the mean loss, or -1 without targets */
float model_pass_forward(const Model *m, const Pass *p);
/* backward of the last forward with targets: zeroes dacts, accumulates grads */
void model_pass_backward(const Model *m, const Pass *p);

#endif /* STRAIT_KERNELS_MODEL_H */
