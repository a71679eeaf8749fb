/*
 * kernels.h — the API of kernels/: the math of Strait and the devices it runs
 * on. CPU ops live in kernels/cpu/ and CUDA ops in kernels/cuda/ with
 * the same signatures (the CUDA one adds a trailing stream); the Makefile
 * picks the backend at build time (STRAIT_HAVE_CUDA).
 *
 * It holds: the build's capabilities and the machine's accelerators; the
 * CPU ops (kernels/cpu/ops.c, classifier.c); the GPT model with its
 * parameter table, AdamW and schedule (kernels/gpt.c); and the CUDA kernels
 * behind compress/'s GPU paths.
 */
#ifndef STRAIT_KERNELS_H
#define STRAIT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* What this binary was built with, as the Makefile's probes found it. */
typedef struct KernelsBuildCaps {
    int cuda;     /* CUDA kernels compiled in (nvcc, cudart, cuBLAS) */
    int nccl;     /* NCCL linked for multi-GPU data parallelism */
    int openblas; /* OpenBLAS for CPU matrix products */
    int openmp;   /* OpenMP for CPU threads */
} KernelsBuildCaps;

KernelsBuildCaps kernels_build_caps(void);

/* The machine's GPUs as the CUDA runtime sees them.
 * Returns the device count (0 when there is no GPU or no driver, with the
 * runtime's reason in `why`), and the first device's name in `name`.
 * Both buffers may be NULL. Never fails hard: no GPU is a normal state. */
int kernels_gpu_count(char *name, size_t name_len, char *why, size_t why_len);

/* NCCL's version as "2.27.7", or "" when NCCL is not linked. */
const char *kernels_nccl_version(void);

/* ---- CPU ops (fp32, row-major; backward ops accumulate into gradients) ---- */

/* n OpenMP threads for the ops (0: keep the default), OpenBLAS on one: the
 * ops split their products across the OpenMP threads themselves. */
void kernels_set_threads(int n);

void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                     int C);
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                      int C);
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                       const float *bias, int N, int C);
void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C);
/* out (N,OC) = inp (N,C) · weight (OC,C)ᵀ + bias (bias may be NULL) */
void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                    int C, int OC);
void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC);
/* inp (B,T,3C) = q,k,v; preatt, att (B,NH,T,T); out (B,T,C); causal */
void attention_forward(float *out, float *preatt, float *att, const float *inp, int B, int T, int C,
                       int NH);
void attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout,
                        const float *inp, const float *att, int B, int T, int C, int NH);
void gelu_forward(float *out, const float *inp, size_t N);
void gelu_backward(float *dinp, const float *inp, const float *dout, size_t N);
void residual_forward(float *out, const float *a, const float *b, size_t N);
void residual_backward(float *da, float *db, const float *dout, size_t N);
/* The fused classifier: logits = h (N,C) · wte (V,C)ᵀ and cross-entropy
 * against targets, by tiles with an online softmax — the (N,V) logits are
 * never held. Returns the mean loss; losses (N) may be NULL; with dh and
 * dwte non-NULL also accumulates their gradients of the mean loss. */
float classifier_forward_backward(float *losses, float *dh, float *dwte, const float *h,
                                  const float *wte, const int *targets, int N, int C, int V);
/* logits (V) of one row h (C), for sampling */
void classifier_logits(float *logits, const float *h, const float *wte, int C, int V);

/* ---- the GPT model ------------------------------------------------------------ */

typedef struct GPTConfig {
    char name[24];   /* preset name, or "custom" */
    int L, C, NH, T; /* layers, channels, heads, max sequence */
    int V, Vp;       /* vocabulary, and padded to a multiple of 64 */
} GPTConfig;

/* presets: tiny, small, base, gpt2-124m; -1 for an unknown name */
int gpt_config_preset(const char *name, GPTConfig *cfg);

/* One named tensor in the flat parameter buffer. */
typedef struct ParamView {
    char name[64];
    int ndim;
    int shape[2];
    size_t offset, numel; /* in floats */
} ParamView;

typedef struct AdamWConfig {
    float beta1, beta2, eps, weight_decay; /* decay applies to matrices only */
} AdamWConfig;

/* Activation offsets (in floats) inside GPT.acts for the current (B, T). */
typedef struct GPTActs {
    size_t encoded, ln1, ln1_mean, ln1_rstd, qkv, atty, preatt, att, attproj, residual2, ln2,
        ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, residual3, lnf, lnf_mean, lnf_rstd, losses;
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
float gpt_clip_grad_norm(GPT *m, float max_norm);
void gpt_adamw_step(GPT *m, const AdamWConfig *o, float lr);
/* logits (V) for the token after ctx[0..n) (the last T of them), for sampling */
void gpt_next_logits(GPT *m, const int *ctx, int n, float *logits);
/* linear warmup then cosine decay to max_lr * min_lr_frac */
float lr_schedule(int step, int total, int warmup, float max_lr, float min_lr_frac);

/* ---- checkpoints (safetensors) ------------------------------------------------ */

/* Writes the parameters (and, once AdamW has run, its moments to
 * "<path minus .safetensors>.opt.safetensors"), atomically. */
int gpt_save(const GPT *m, const char *path, int step, char *err);
/* Reads a checkpoint's model config and step from its metadata. */
int gpt_read_config(const char *path, GPTConfig *cfg, int *step, char *err);
/* Loads parameters into a model built with the same table; every offset,
 * dtype and shape is checked before data is copied. */
int gpt_load(GPT *m, const char *path, int *step, char *err);
/* Other per-parameter state laid out like the parameters (an outer
 * optimizer's momentum): tensor i of base b is named prefixes[b] + view name. */
int gpt_save_state(const GPT *m, const char *path, const float *const *bases,
                   const char *const *prefixes, int n_bases, int step, char *err);
int gpt_load_state(const GPT *m, const char *path, float *const *dsts, const char *const *prefixes,
                   int n_bases, char *err);
/* Loads AdamW's moments and step from a "<name>.opt.safetensors" file. */
int gpt_load_optimizer(GPT *m, const char *opt_path, char *err);

/* formats.c: the model for other tools. Hugging Face: DIR/config.json and
 * DIR/model.safetensors, loadable as transformers' GPT2LMHeadModel. llm.c:
 * the checkpoint file train_gpt2.c loads (header version 3, fp32). */
int gpt_export_hf(const GPT *m, const char *dir, char *err);
int gpt_export_llmc(const GPT *m, const char *path, char *err);
/* Builds m from a Hugging Face GPT-2 folder (config.json, model.safetensors
 * in F32, F16 or BF16, with or without the "transformer." prefix); m is
 * built here and freed on failure, which names the offending tensor. */
int gpt_import_hf(GPT *m, const char *dir, char *err);

/* ---- data ------------------------------------------------------------------- */

/* Tokens read from text files (bytes, vocabulary 256) or llm.c .bin shards
 * (uint16 GPT-2 tokens, vocabulary 50257); owned. */
typedef struct TokenSet {
    uint16_t *tokens;
    size_t n;
    int vocab;
} TokenSet;

typedef struct TokenView {
    const uint16_t *tokens;
    size_t n;
} TokenView;

int tokens_load(TokenSet *ts, const char *const *paths, int n_paths, char *err);
void tokens_free(TokenSet *ts);
int tokens_write_bin(const char *path, const uint16_t *tokens, size_t n, char *err);
/* the last val_frac of the tokens for validation */
void tokens_split(const TokenSet *all, double val_frac, TokenView *train, TokenView *val);

/* (B, T) batches read sequentially from a seeded start within one of
 * n_shards disjoint parts of the data, wrapping at the end. */
typedef struct Loader {
    TokenView data;
    int B, T;
    size_t pos;
} Loader;

int loader_init(Loader *ld, TokenView data, int B, int T, int shard, int n_shards, uint64_t seed,
                char *err);
void loader_next(Loader *ld, int *inputs, int *targets);

/* A held-out score: the mean loss of the model over the first `batches`
 * consecutive (B, T) batches of v (fewer when v is shorter), the same
 * tokens for every model scored; NAN when not even one batch fits. */
double gpt_eval_tokens(GPT *m, TokenView v, int B, int T, int batches);
/* The same score for a checkpoint file over text files or shards. */
int gpt_eval_checkpoint(const char *ckpt, const char *const *paths, int n_paths, int B, int T,
                        int batches, double *loss, char *err);

/* ---- CUDA kernels (kernels/cuda/; only in builds with STRAIT_HAVE_CUDA) -
 * Pointers without h_ are device memory; stream is a cudaStream_t (NULL:
 * the default stream), passed as void * so this header stays plain C.
 * Each produces the same bytes or floats as its CPU twin in compress/;
 * functions returning int give -1 when the input holds a non-finite value. */
#ifdef STRAIT_HAVE_CUDA
void *kernels_cuda_alloc(size_t bytes);
void kernels_cuda_free(void *p);
void kernels_cuda_to_device(void *d, const void *h, size_t bytes);
void kernels_cuda_to_host(void *h, const void *d, size_t bytes);

/* The CUDA twins of the CPU ops (kernels/cuda/ops.cu): same arguments on
 * device pointers, plus the stream. Results match the CPU within the
 * tolerances make test-gpu states. */
void encoder_forward_cuda(float *out, const int *inp, const float *wte, const float *wpe, int B,
                          int T, int C, void *stream);
void encoder_backward_cuda(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                           int T, int C, void *stream);
void layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *inp, const float *w,
                            const float *bias, int N, int C, void *stream);
void layernorm_backward_cuda(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C,
                             void *stream);
void matmul_forward_cuda(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC, void *stream);
void matmul_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC,
                          void *stream);
void attention_forward_cuda(float *out, float *preatt, float *att, const float *inp, int B, int T,
                            int C, int NH, void *stream);
void attention_backward_cuda(float *dinp, float *dpreatt, float *datt, const float *dout,
                             const float *inp, const float *att, int B, int T, int C, int NH,
                             void *stream);
void gelu_forward_cuda(float *out, const float *inp, size_t N, void *stream);
void gelu_backward_cuda(float *dinp, const float *inp, const float *dout, size_t N, void *stream);
void residual_forward_cuda(float *out, const float *a, const float *b, size_t N, void *stream);
void residual_backward_cuda(float *da, float *db, const float *dout, size_t N, void *stream);
float classifier_forward_backward_cuda(float *losses, float *dh, float *dwte, const float *h,
                                       const float *wte, const int *targets, int N, int C, int V,
                                       void *stream);
void adamw_cuda(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int step, void *stream);
/* global L2 norm of grads, scaled down to max_norm if above */
float clip_grad_norm_cuda(float *grads, size_t n, float max_norm, void *stream);

/* The GPT on the site's GPUs (kernels/cuda/gpt_cuda.cu): one replica per
 * device, gradients averaged with NCCL. host gives the table, the initial
 * parameters and the layout for batches of (B, T) per GPU. */
typedef struct GPTCuda GPTCuda;
GPTCuda *gpt_cuda_create(GPT *host, int n_gpus, int B, int T, char *err);
void gpt_cuda_free(GPTCuda *g);
/* One step on n_gpus batches of (B, T), one per replica; the mean loss. */
float gpt_cuda_step(GPTCuda *g, const int *inputs, const int *targets, const AdamWConfig *o,
                    float lr, float max_norm);
void gpt_cuda_params_to_host(GPTCuda *g, GPT *host);
/* Every replica takes host's parameters and AdamW state (m, v, step; zeros
 * when host has taken no step yet): a site's new round. */
void gpt_cuda_load_from_host(GPTCuda *g, const GPT *host);
/* Replica 0's parameters and AdamW state into host (m, v allocated when
 * absent): what a site encodes and saves after its inner steps. */
void gpt_cuda_state_to_host(GPTCuda *g, GPT *host);

/* fp32 section payload: x copied to h_out after a finite check */
int kernels_cuda_copy_checked(const float *x, uint64_t n, float *h_out, void *stream);
/* fp16 (bf16 = 0) or bf16 payload of x[0..n) into h_out */
int kernels_cuda_cast_half(const float *x, uint64_t n, int bf16, uint16_t *h_out, void *stream);
/* int8 payload of a section (tables and codes, codec_int8.c's layout) */
int kernels_cuda_int8_encode(const float *x, uint32_t count, uint32_t block, uint8_t *h_raw,
                             void *stream);
/* sum[0..count) += w * decoded int8 payload h_raw */
void kernels_cuda_int8_accumulate(const uint8_t *h_raw, uint32_t count, uint32_t block, float w,
                                  float *sum, void *stream);
/* exact top-k of every chunk of a section: indices (ascending per chunk)
 * and values, total_k of each, chunk after chunk */
int kernels_cuda_topk_select(const float *x, uint32_t count, uint32_t chunk, uint32_t ppm,
                             uint64_t total_k, uint16_t *h_sel, float *h_vals, void *stream);
#endif

#endif /* STRAIT_KERNELS_H */
