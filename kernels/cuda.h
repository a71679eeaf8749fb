/*
 * cuda.h — the CUDA kernels (kernels/cuda/), only in builds with
 * STRAIT_HAVE_CUDA: the twins of the CPU ops, AdamW and clipping, the Model
 * on the site's GPUs with NCCL, and the kernels behind compress/'s GPU
 * paths.
 */
#ifndef STRAIT_KERNELS_CUDA_H
#define STRAIT_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "kernels/train.h"

/* ---- CUDA kernels (kernels/cuda/; only in builds with STRAIT_HAVE_CUDA) -
 * Pointers without h_ are device memory; stream is a cudaStream_t (NULL:
 * the default stream), passed as void * so this header stays plain C.
 * Each produces the same bytes or floats as its CPU twin in compress/;
 * functions returning int give -1 when the input holds a non-finite value. */
#ifdef STRAIT_HAVE_CUDA
/* The interface between strait and its CUDA plugin (libstrait-cuda.so,
 * which exports it as strait_cuda_plugin_abi): one more whenever a
 * function here changes its arguments, or a struct the plugin reads
 * (Model, ModelConfig, ActLayout, Pass, Ops) changes its layout. The
 * loader refuses a plugin of another, which would be called with the
 * wrong ones. The plugin calls back into the executable that loads it
 * (model_pass_forward and _backward, die_at, calloc_check): every binary
 * that loads it must link those (make test runs a check of gpu_ops). */
#define STRAIT_CUDA_ABI 4
void *kernels_cuda_alloc(size_t bytes);
void kernels_cuda_free(void *p);
void kernels_cuda_to_device(void *d, const void *h, size_t bytes);
void kernels_cuda_to_host(void *h, const void *d, size_t bytes);
/* device to device, synchronous: the baseline of the codec kernels' speed */
void kernels_cuda_copy(void *d_dst, const void *d_src, size_t bytes);
/* GPU device's memory in use (by every process) and in all, in bytes: 0,
 * or -1 when CUDA cannot say; the calling thread's device unchanged */
int kernels_cuda_mem(int device, size_t *used, size_t *total);

/* The CUDA twins of the CPU ops as one Ops table (the plugin's ops_cuda,
 * kernels/cuda/ops.cu, ops_llama.cu): device pointers, a stream. Results
 * match the CPU's within the tolerances make test-gpu states. */
const Ops *kernels_cuda_ops(void);
/* The GPU matmuls' precision from the next op on: fp32 (0, the default,
 * what make test-gpu compares with the CPU) or TF32 tensor cores (1:
 * inputs rounded to 10 bits of mantissa, sums in fp32; llm.c's default) */
void kernels_cuda_set_tf32(int on);
/* Mixed precision on the calling thread's current device: from now on a
 * matmul (and the classifier) whose weight lies in the table f32 (n values)
 * reads its bf16 copy h at the same offset, rounds the other input to
 * bf16 and sums in fp32 — the CPU's --precision bf16 products. h NULL: off. */
void kernels_cuda_set_mirror(const float *f32, const uint16_t *h, size_t n);
/* out = x rounded to bf16 (nearest, ties to even: bf16_from_float's) */
void kernels_cuda_to_bf16(uint16_t *out, const float *x, size_t n, void *stream);
void adamw_cuda(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int step, void *stream);
/* global L2 norm of grads, scaled down to max_norm if above */
float clip_grad_norm_cuda(float *grads, size_t n, float max_norm, void *stream);
/* its parts: the sum of x's squares (each block's in float, the blocks'
 * in double in block order: the same sum every time; the stream
 * synchronized), and x *= s */
double sumsq_cuda(const float *x, size_t n, void *stream);
void scale_cuda(float *x, size_t n, float s, void *stream);

/* The Model on the site's GPUs (kernels/cuda/model_cuda.cu): one replica per
 * device, gradients averaged with NCCL. host gives the table, the initial
 * parameters and the layout for batches of (B, T) per GPU. */
typedef struct ModelCuda ModelCuda;
ModelCuda *model_cuda_create(Model *host, int n_gpus, int B, int T, char *err);
/* The same on one of `ranks` processes (a site under mpirun): every GPU of
 * every rank in one NCCL communicator (global rank rank × n_gpus + i),
 * bootstrapped by rank 0's id (model_cuda_nccl_id), which the caller has
 * broadcast. zero (TrainConfig's) with several GPUs in one process
 * (ranks 1) shards AdamW's state across them (ZeRO-1): each keeps the
 * moments of its share of the table, the gradients are reduce-scattered,
 * each updates its share and the shares are all-gathered; the host's
 * moments stay whole (model_cuda_to_host gathers them). */
#define MODEL_CUDA_NCCL_ID_BYTES 128
int model_cuda_nccl_id(void *id);
ModelCuda *model_cuda_create_world(Model *host, int n_gpus, int B, int T, int rank, int ranks,
                                   const void *nccl_id, int zero, char *err);
void model_cuda_free(ModelCuda *g);
/* One step on n_gpus batches of (B, T), one per replica; the mean loss. */
float model_cuda_step(ModelCuda *g, const int *inputs, const int *targets, const AdamWConfig *o,
                      float lr, float max_norm);
/* AdamW steps the replicas have taken: the host's at the last load of its
 * moments, and one a model_cuda_step since. */
int model_cuda_steps(ModelCuda *g);
/* The mean loss of replica 0's parameters on one (B, T) batch: forward only,
 * nothing updated (the held-out evaluator on a GPU site). */
float model_cuda_loss(ModelCuda *g, const int *inputs, const int *targets);
/* Every replica takes host's parameters (TRAINER_PARAMS) and AdamW state
 * (TRAINER_MOMENTS: m, v, step; zeros when host has taken no step yet),
 * each its share of the moments when they are sharded. */
void model_cuda_load_from_host(ModelCuda *g, const Model *host, int what);
/* Replica 0's parameters (TRAINER_PARAMS) and AdamW state (TRAINER_MOMENTS;
 * m, v allocated when absent; gathered from every replica's share when
 * sharded) into host: what a site saves after its inner steps, and its Δ
 * when it is made on the host. */
void model_cuda_to_host(ModelCuda *g, Model *host, int what);
/* From now on keep, on replica 0's device, a copy of the parameters every
 * replica holds now and takes at each model_cuda_load_from_host: the round's
 * θ, for its Δ on the device. */
void model_cuda_keep_base(ModelCuda *g);
/* Replica 0's parameters and (*base, when asked) the kept copy, NULL if
 * none: device memory. Makes replica 0's device the calling thread's
 * current one, where the caller's own allocations then land. */
const float *model_cuda_params(ModelCuda *g, const float **base);

/* A section's payload from x (device memory) into host memory. take_off:
 * x is error feedback's residual, and becomes x − the payload's decoded
 * values, made on the device from the payload still there (the floats of
 * ef.c's host loop); 0 leaves x as it is. -1: x holds a value that is not
 * finite, or beyond the format's range. */
/* fp32: x copied to h_out after a finite check */
int kernels_cuda_copy_checked(float *x, uint64_t n, float *h_out, int take_off, void *stream);
/* fp16 (bf16 = 0) or bf16, little-endian, into h_out (2n bytes) */
int kernels_cuda_cast_half(float *x, uint64_t n, int bf16, uint8_t *h_out, int take_off,
                           void *stream);
/* int8 (tables and codes, codec_int8.c's layout) */
int kernels_cuda_int8_encode(float *x, uint32_t count, uint32_t block, uint8_t *h_raw, int take_off,
                             void *stream);
/* sum[0..count) += w * decoded int8 payload h_raw */
void kernels_cuda_int8_accumulate(const uint8_t *h_raw, uint32_t count, uint32_t block, float w,
                                  float *sum, void *stream);
/* sum[0..n) += w * x for the n fp32 of h_raw (host memory, any alignment) */
void kernels_cuda_fp32_accumulate(const uint8_t *h_raw, uint64_t n, float w, float *sum,
                                  void *stream);
/* sum[0..n) += w * the fp16 (bf16 = 0) or bf16 payload h_raw (host memory) */
void kernels_cuda_half_accumulate(const uint8_t *h_raw, uint64_t n, int bf16, float w, float *sum,
                                  void *stream);
/* sum[h_idx[i]] += w * h_vals[i] for k distinct indices (host memory) */
void kernels_cuda_scatter_accumulate(const uint32_t *h_idx, const float *h_vals, uint64_t k,
                                     float w, float *sum, void *stream);
/* Error feedback's first step with the round's Δ made on the device:
 * e = beta * e + (base - local), the floats of ef_encode's host loop */
void kernels_cuda_ef_step(float *e, const float *base, const float *local, float beta, uint64_t n,
                          void *stream);
/* exact top-k of every chunk of a section: indices (ascending per chunk)
 * and values, total_k of each, chunk after chunk */
int kernels_cuda_topk_select(const float *x, uint32_t count, uint32_t chunk, uint32_t ppm,
                             uint64_t total_k, uint16_t *h_sel, float *h_vals, void *stream);
#endif

#endif /* STRAIT_KERNELS_CUDA_H */
