/*
 * train.h — the one trainer (kernels/train.c): AdamW and its defaults, the
 * learning-rate schedule, one optimizer step on the CPU or the site's GPUs,
 * a whole run over token data, and the one held-out evaluator. `strait
 * train`, `strait site run`, the demo's baselines and bench/ all train
 * through it.
 */
#ifndef STRAIT_KERNELS_TRAIN_H
#define STRAIT_KERNELS_TRAIN_H

#include "kernels/data.h"
#include "kernels/model.h"

typedef struct AdamWConfig {
    float beta1, beta2, eps, weight_decay; /* decay applies to matrices only */
} AdamWConfig;

/* One AdamW step on m's gradients (moments allocated at the first); the
 * scaled one takes the gradients times grad_scale (clipping, in the pass). */
void model_adamw_step(Model *m, const AdamWConfig *o, float lr);
void model_adamw_step_scaled(Model *m, const AdamWConfig *o, float lr, float grad_scale);
/* linear warmup then cosine decay to max_lr * min_lr_frac */
float lr_schedule(int step, int total, int warmup, float max_lr, float min_lr_frac);

/* How Strait trains, in one place. train_defaults gives AdamW β (0.9,
 * 0.95), ε 1e-8, weight decay 0.1 on matrices; gradients clipped to norm 1;
 * linear warmup over min(total/10, 100) steps, then cosine to 10% of lr. */
typedef struct TrainConfig {
    AdamWConfig adamw;
    float lr;            /* peak learning rate */
    float min_lr_frac;   /* the cosine's floor, as a fraction of lr */
    float max_grad_norm; /* 0: no clipping */
    int warmup, total_steps;
    int tf32; /* GPU trainers: matmuls on TF32 tensor cores (kernels_cuda_set_tf32) */
    /* the adapters' dropout masks (lora.dropout) are drawn from it and the
     * model's step: a site's data seed (and its rank), so each draws its own */
    uint64_t seed;
    /* CPU ranks: 1 (train_defaults') shards AdamW's moments across them
     * (ZeRO-1: each keeps and updates its share of the table, the
     * gradients' mean summed at each share's owner, the updated shares sent
     * to all), bit for bit the unsharded step; several GPUs in one process
     * shard it over NCCL (model_cuda_create_world); 0: every rank and GPU
     * keeps the whole state */
    int zero;
} TrainConfig;

TrainConfig train_defaults(float lr, int total_steps);
/* the learning rate of step (0-based) under c's schedule */
float train_lr(const TrainConfig *c, int step);

/* A held-out score: the mean loss of the model over the first `batches`
 * consecutive (B, T) batches of v (fewer when v is shorter), the same
 * tokens for every model scored; NAN when not even one batch fits. */
double model_eval_tokens(Model *m, TokenView v, int B, int T, int batches);
/* The same score for a checkpoint file over text files or shards. */
int model_eval_checkpoint(const char *ckpt, const char *const *paths, int n_paths, int B, int T,
                          int batches, double *loss, char *err);

/* A trainer of one model: on the CPU (gpus 0), or with one replica on each
 * of gpus GPUs, gradients averaged with NCCL (CUDA builds). A GPU trainer
 * works on its own copy: trainer_to_host and trainer_from_host move the
 * parameters and AdamW state between it and m (no-ops on the CPU). */
typedef struct Trainer Trainer;

Trainer *trainer_create(Model *m, const TrainConfig *c, int gpus, int B, int T, char *err);
/* The same as one of the ranks of a site (kernels/ranks.h; every rank calls
 * it): on the CPU the gradients are averaged over the ranks with MPI and
 * every rank takes rank 0's clip factor; on GPUs every GPU of every rank is
 * in one NCCL communicator bootstrapped over MPI.
 * A step takes trainer_replicas() batches; the ranks' steps together are
 * one step on all their batches. rk NULL or of size 1: trainer_create. */
struct Ranks;
Trainer *trainer_create_ranks(Model *m, const TrainConfig *c, int gpus, int B, int T,
                              const struct Ranks *rk, char *err);
void trainer_free(Trainer *t);
/* batches a step takes: 1 on the CPU, gpus on GPUs */
int trainer_replicas(const Trainer *t);
Model *trainer_model(Trainer *t);
/* One optimizer step at learning rate lr on trainer_replicas() batches of
 * (B, T) laid one after another in in and tg; the mean loss. *grad_norm
 * (may be NULL): the norm before clipping, NAN on GPUs. */
float trainer_step(Trainer *t, const int *in, const int *tg, float lr, float *grad_norm);
/* Data parallelism across processes (a site's ranks, kernels/ranks.h): a
 * CPU step calls mean(ctx, x, n) on its gradients right after the backward
 * pass, so every rank steps on the mean of them all, and root(ctx, x, 1) on
 * the clip factor and the loss, so every rank takes rank 0's (the norm's
 * sum depends on the thread count; the ranks' parameters must stay equal
 * to the bit). NULL: none. GPU trainers refuse it (-1). */
typedef struct TrainCollectives {
    void (*mean)(void *ctx, float *x, size_t n);
    void (*root)(void *ctx, float *x, size_t n);
    void *ctx;
} TrainCollectives;
int trainer_set_collectives(Trainer *t, const TrainCollectives *c, char *err);
/* AdamW's moments and step saved to path (model_save_optimizer's file) by
 * rank 0, path NULL at the other ranks. With ZeRO-1 (TrainConfig's zero on
 * CPU ranks) every rank calls it, and each share goes to rank 0's writer
 * piece by piece, so no rank ever holds more than its share; otherwise rank
 * 0 writes its own whole state and the others do nothing. */
int trainer_save_moments(Trainer *t, const char *path, char *err);
/* whether AdamW's state is sharded across the ranks (ZeRO-1); the same at every rank */
int trainer_sharded(const Trainer *t);
/* whether a trainer of n_params values made with zero on, over ranks CPU
 * ranks (gpus 0) will shard it: every rank a share of whole blocks, or
 * none (what a caller that moves state before it exists must know) */
int trainer_will_shard(size_t n_params, int ranks, int gpus, int zero);
/* Why --precision bf16 (bf16 products, fp32 sums; Model's precision_bf16)
 * cannot train here, NULL if it can: whole-model training on GPUs (of
 * compute capability 8.0 or newer, which model_cuda_create checks) or on a
 * CPU with bf16 instructions; adapters train over a bf16 base already. */
const char *trainer_precision_refusal(int gpus, int adapted);
/* What trainer_to_host copies: the parameters, AdamW's state, or both. */
enum { TRAINER_PARAMS = 1, TRAINER_MOMENTS = 2 };
/* m takes the GPUs' parameters and/or AdamW's state (what: TRAINER_*) */
void trainer_to_host(Trainer *t, int what);
/* The GPUs take m's parameters and/or AdamW's state (what: TRAINER_*). A
 * site's round takes its θ; the GPUs keep their moments from one round to
 * the next, so only the first round after a start takes them (a resumed
 * state's, or zeros), and the host's copy is only ever the saved state's. */
void trainer_from_host(Trainer *t, int what);
/* The round's Δ made on the GPUs (no copy of the parameters to the host):
 * trainer_keep_base makes trainer_from_host keep a copy of the parameters
 * it loads, one model's size more on the first GPU, from the current ones
 * on; trainer_device_params gives replica 0's parameters and that copy,
 * device pointers, with the first GPU the calling thread's current one.
 * Both -1 for a CPU trainer. */
int trainer_keep_base(Trainer *t);
int trainer_device_params(Trainer *t, const float **d_params, const float **d_base);
/* model_eval_tokens of the trainer's model on its (B, T) batches where it
 * trains: on the CPU, the host model; on GPUs, replica 0's parameters (no
 * copy to the host; the forward on the GPU). */
double trainer_eval_tokens(Trainer *t, TokenView v, int batches);

/* What train_run reports after every step. */
typedef struct TrainProgress {
    int step, steps; /* 1-based: steps done of steps */
    float loss, lr, grad_norm;
    double tokens_per_s;
} TrainProgress;

/* Called after each step; the model is on the host only after
 * trainer_to_host. Nonzero stops the run. */
typedef int (*TrainObserver)(void *ctx, Trainer *t, const TrainProgress *p);

/* c->total_steps steps on (B, T) batches read from data from a seeded
 * start, on the CPU or gpus GPUs; m holds the result. obs may be NULL. */
int train_run(Model *m, const TrainConfig *c, TokenView data, int gpus, int B, int T, uint64_t seed,
              TrainObserver obs, void *ctx, char *err);

/* What `strait train` runs, the baseline every federated run is measured
 * against: the model (a preset, or a Hugging Face folder's shape and
 * weights), its vocabulary fitted to the data (model_config_fit_tokens), the
 * last 10% of the tokens held out, `steps` of train_run under
 * train_defaults(lr), and a checkpoint at out (NULL: none). */
typedef struct TrainJob {
    const char *const *data;
    int n_data;
    const char *preset, *init_from, *out; /* init_from: an HF folder, a GGUF file, or NULL */
    int vocab;                            /* a byte-level preset's vocabulary; 0: its rule */
    int steps, B, T;                      /* T 0: the model's context */
    int gpus;                             /* 0: the CPU */
    int moments_bf16;
    int tf32; /* on GPUs: TrainConfig's tf32 */
    /* a quantized GGUF base under adapters held as a bf16 copy, not in its
     * blocks (Model's blocks_off): faster, more memory, the same values */
    int blocks_off;
    /* the CPU's matmuls and classifier in bf16 (Model's precision_bf16) */
    int precision_bf16;
    int recompute; /* Model's recompute: MODEL_RECOMPUTE_* (0: keep everything) */
    int unsharded; /* several GPUs keep AdamW's whole state each (TrainConfig's zero 0) */
    float lr;
    uint64_t seed;
    AdapterConfig lora;   /* rank 0: the whole model trains; else adapters over it, frozen */
    const char *adapters; /* a PEFT adapter folder over init_from to go on from (or NULL) */
} TrainJob;
/* What the job tells its caller before the first step. */
typedef struct TrainJobStart {
    const char *name;              /* the preset or the folder */
    size_t n_params, train_tokens; /* n_params: what trains */
    size_t n_frozen;               /* the frozen base's parameters (0: none) */
    int base_bf16;                 /* its matrices held in bf16 (lora.base_bf16) */
    TokenView val;                 /* the held-out tokens, for a caller that scores on them */
    int T;                         /* the sequence length it trains at */
} TrainJobStart;
int train_job(const TrainJob *j, void (*started)(void *ctx, const TrainJobStart *s),
              TrainObserver obs, void *ctx, char *err);

#endif /* STRAIT_KERNELS_TRAIN_H */
