/*
 * model.h — the GPT-2 style model: presets, the parameter table (one
 * contiguous buffer of named views, which checkpoints, codecs and
 * aggregation all walk), seeded initialisation (kernels/model.c), forward
 * and backward on the CPU ops, gradient clipping and next-token logits
 * (kernels/gpt.c). Training it is train.h; its files are formats.h.
 */
#ifndef STRAIT_KERNELS_MODEL_H
#define STRAIT_KERNELS_MODEL_H

#include <stddef.h>
#include <stdint.h>

typedef struct GPTConfig {
    char name[24];   /* preset name, or "custom" */
    int L, C, NH, T; /* layers, channels, heads, max sequence */
    int V, Vp;       /* vocabulary, and padded to a multiple of 64 */
} GPTConfig;

/* Parameters of a shape (its table's size), before anything is built. */
double gpt_config_params(const GPTConfig *cfg);
/* About what training a shape takes in host memory at batch B x T: the
 * parameters, their gradients, AdamW's moments and a step's activations. */
double gpt_train_bytes(const GPTConfig *cfg, int B, int T);

/* presets: tiny, small, base, gpt2-124m; -1 for an unknown name */
int gpt_config_preset(const char *name, GPTConfig *cfg);
/* A shape given by someone else (a config.json, a coordinator): checked to
 * be a GPT-2 this code can build — 1..256 layers, channels 1..65536 a
 * multiple of heads, context 1..2^20, vocabulary 2..2^22, at most 4
 * billion parameters — and padded. */
int gpt_config_shape(GPTConfig *cfg, const char *name, long long L, long long C, long long NH,
                     long long T, long long V, char *err);

/* One named tensor in the flat parameter buffer. */
typedef struct ParamView {
    char name[64];
    int ndim;
    int shape[2];
    size_t offset, numel; /* in floats */
} ParamView;

/* Activation offsets (in floats) inside GPT.acts for the current (B, T). */
typedef struct GPTActs {
    size_t encoded, ln1, ln1_mean, ln1_rstd, qkv, atty, preatt, att, attproj, residual2, ln2,
        ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, residual3, lnf, lnf_mean, lnf_rstd, losses, lse;
} GPTActs;

typedef struct GPT {
    GPTConfig cfg;
    ParamView *views; /* owned; wte, wpe, h.N.*, ln_f.* in order */
    int n_views;
    size_t n_params;
    uint64_t table_hash;   /* FNV-1a of names, shapes and order */
    float *params, *grads; /* owned, n_params each */
    float *m, *v;          /* AdamW moments, allocated at the first step */
    int step;              /* AdamW steps taken */
    /* activations of the last forward, and their gradients (owned) */
    float *acts, *dacts;
    size_t acts_len;
    GPTActs a;
    int act_B, act_T, fwd_B, fwd_T, has_targets;
    int *inputs, *targets;
    float loss;
} GPT;

/* Builds the table and initialises GPT-2 style from a seed: N(0, 0.02),
 * residual projections scaled by 1/sqrt(2L), the same bits on every
 * machine. */
int gpt_build(GPT *m, const GPTConfig *cfg, uint64_t seed, char *err);
void gpt_free(GPT *m);
const ParamView *gpt_view(const GPT *m, const char *name);
/* inputs, targets (B,T) token ids; targets may be NULL (returns -1). */
float gpt_forward(GPT *m, const int *inputs, const int *targets, int B, int T);
void gpt_zero_grad(GPT *m);
void gpt_backward(GPT *m);
/* global L2 norm of the gradients, scaled down to max_norm if above (0: never) */
/* global L2 norm of the gradients */
float gpt_grad_norm(const GPT *m);
float gpt_clip_grad_norm(GPT *m, float max_norm);
/* logits (V) for the token after ctx[0..n) (the last T of them), for sampling */
void gpt_next_logits(GPT *m, const int *ctx, int n, float *logits);

#endif /* STRAIT_KERNELS_MODEL_H */
