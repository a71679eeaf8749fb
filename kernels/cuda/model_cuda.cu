/*
 * model_cuda.cu — the Model trained on the site's GPUs: one replica per device
 * in one process, the forward and backward passes of kernels/graph.c built
 * from the CUDA ops, gradients averaged across the replicas with NCCL
 * (ncclCommInitAll, ncclAllReduce with ncclAvg on each replica's stream),
 * and AdamW on every replica so their parameters stay identical. Each
 * replica steps on a host thread of its own (NCCL's one thread per
 * communicator), so the synchronizations inside a step (the loss, the
 * clipping norm) hold up only their own GPU. With adapters, what trains
 * (params, grads, moments) is the adapters' table, and each replica also
 * holds the frozen base in fp32 and what the rule freezes (A, or A and B),
 * uploaded once, without gradients.
 *
 * ZeRO-1 over a process's GPUs (shard > 0): the table is cut into equal
 * shares of `shard` values, one a replica (parameters and gradients padded
 * with zeros to n_gpus shares, so NCCL's equal counts fit); each replica
 * keeps the moments of its share alone. A step's gradients are
 * reduce-scattered (ncclAvg) instead of all-reduced, the clipping norm is
 * the sum of each share's squares gathered from every replica and added in
 * replica order (the same norm everywhere), AdamW updates each replica's
 * share, and the shares are all-gathered into every replica's parameters.
 *
 * Mixed precision (the host's precision_bf16, whole-model training): each
 * replica also holds a bf16 copy of its parameters, rounded from the fp32
 * ones at the start of every step and every held-out pass (after AdamW or
 * a load from the host wrote them), which the matmuls and the classifier
 * read (kernels_cuda_set_mirror); everything else, the gradients, AdamW
 * and its moments stay fp32, so the parameters a site sends stay the fp32
 * model.
 *
 * The host Model (model_build) supplies the table, the initial parameters and
 * the activation layout; the graph is the host's own (model_pass_forward
 * and model_pass_backward in the executable, which is linked -rdynamic)
 * run over the CUDA ops table, ops_cuda.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#ifdef STRAIT_HAVE_NCCL
#include <nccl.h>
#endif

extern "C" {
#include "kernels/ops.h"
#include "kernels/model.h"
#include "kernels/train.h"
#include "kernels/cuda.h"
#include "util/util.h"
}
#include "cuda_common.h"

#ifdef STRAIT_HAVE_NCCL
#define ncclCheck(call)                                                                            \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "fatal (%s:%d): NCCL: %s\n", __FILE__, __LINE__,                       \
                    ncclGetErrorString(r_));                                                       \
            abort();                                                                               \
        }                                                                                          \
    } while (0)
#endif

#define MAX_GPUS 16

extern "C" const Ops ops_cuda;

typedef struct Replica {
    int device;
    cudaStream_t stream;
    float *params, *grads, *m, *v, *acts, *dacts; /* device, owned */
    float *base, *frozen;  /* device, owned: with adapters, the frozen base and adapters */
    uint16_t *params16;    /* device, owned: mixed precision's bf16 copy, else NULL */
    double *parts;         /* device, owned: ZeRO-1's squares of every share, else NULL */
    int *inputs, *targets; /* device, owned */
} Replica;

struct ModelCuda {
    const Model *host; /* table and layout, not owned */
    int n;
    Replica r[MAX_GPUS];
#ifdef STRAIT_HAVE_NCCL
    ncclComm_t comms[MAX_GPUS];
#endif
    int B, T, step;
    int world;    /* replicas in the communicator: this process's GPUs x the ranks */
    size_t shard; /* ZeRO-1: each replica's share of the table (values); 0: none */
    float *base; /* on replica 0's device: the parameters of the last load (model_cuda_keep_base) */
    ActLayout lay; /* the activations of a (B, T) pass */
};

extern "C" int model_cuda_nccl_id(void *id) {
#ifdef STRAIT_HAVE_NCCL
    static_assert(sizeof(ncclUniqueId) == MODEL_CUDA_NCCL_ID_BYTES, "NCCL's id size");
    return ncclGetUniqueId((ncclUniqueId *)id) == ncclSuccess ? 0 : -1;
#else
    (void)id;
    return -1;
#endif
}

extern "C" ModelCuda *model_cuda_create(Model *host, int n_gpus, int B, int T, char *err) {
    return model_cuda_create_world(host, n_gpus, B, T, 0, 1, NULL, 1, err);
}

extern "C" ModelCuda *model_cuda_create_world(Model *host, int n_gpus, int B, int T, int rank,
                                              int ranks, const void *nccl_id, int zero, char *err) {
    int have = 0;
    cudaError_t ce = cudaGetDeviceCount(&have);
    if (ce != cudaSuccess || have == 0) {
        cudaGetLastError();
        snprintf(err, 512, "no CUDA device here (%s); train with --device cpu",
                 ce != cudaSuccess ? cudaGetErrorString(ce) : "none found");
        return NULL;
    }
    if (n_gpus < 1 || n_gpus > have || n_gpus > MAX_GPUS) {
        snprintf(err, 512, "%d GPUs asked for, %d present", n_gpus, have);
        return NULL;
    }
#ifndef STRAIT_HAVE_NCCL
    if (n_gpus > 1 || ranks > 1) {
        snprintf(err, 512, "more than one GPU needs NCCL, which this build lacks");
        return NULL;
    }
#endif
    if (ranks > 1 && nccl_id == NULL) {
        snprintf(err, 512, "a GPU trainer on %d ranks needs rank 0's NCCL id", ranks);
        return NULL;
    }
    if (host->cfg.HD > ATTN_MAX_HD) {
        snprintf(err, 512,
                 "attention on the GPU takes heads of up to %d values and this model's have %d; "
                 "train it with --device cpu",
                 ATTN_MAX_HD, host->cfg.HD);
        return NULL;
    }
    for (int i = 0; host->precision_bf16 && i < n_gpus; i++) {
        cudaDeviceProp prop;
        cudaCheck(cudaGetDeviceProperties(&prop, i));
        if (prop.major < 8) {
            snprintf(err, 512,
                     "--precision bf16 needs GPUs of compute capability 8.0 or newer; GPU %d "
                     "(%s) is %d.%d: train in fp32 or TF32",
                     i, prop.name, prop.major, prop.minor);
            return NULL;
        }
    }
    int adapted = host->cfg.lora.rank > 0;
    if (adapted && (host->base_rounded || host->cpu.f32 != NULL)) {
        snprintf(err, 512,
                 "the base is held in bf16 on the host already; make the GPU trainer "
                 "before any pass on the CPU");
        return NULL;
    }
    /* what the rule freezes: every adapter value that does not train */
    size_t nf = adapted ? (size_t)model_adapter_params(&host->cfg) - host->n_params : 0;
    ModelCuda *g = (ModelCuda *)calloc(1, sizeof *g);
    g->host = host, g->n = n_gpus, g->B = B, g->T = T, g->world = n_gpus * ranks;
    model_layout(host, B, T, &g->lay); /* the replicas' own: the host may run other shapes */
    size_t n = host->n_params;
    if (zero && ranks == 1 && n_gpus > 1) /* shares of whole 64-value lines */
        g->shard = (n + (size_t)n_gpus * 64 - 1) / ((size_t)n_gpus * 64) * 64;
    size_t padded = g->shard ? g->shard * (size_t)n_gpus : n; /* what NCCL moves */
    size_t np = n * sizeof(float), na = g->lay.len * sizeof(float);
    size_t nm = (g->shard ? g->shard : n) * sizeof(float); /* each moment */
    size_t nd = g->lay.dlen * sizeof(float);               /* one layer's gradients at a time */
    /* what each GPU is about to hold, against what it has free: a model
     * that does not fit is refused here in a line, not by a fatal
     * cudaMalloc in the middle of the loop below. Beside the buffers
     * below: the round's model a site keeps on GPU 0 (model_cuda_keep_base,
     * one process), and room for what the ops, cuBLAS and NCCL take as
     * they run (the larger of 256 MiB and 2% of the GPU) */
    double need = 2.0 * padded * sizeof(float) + 2.0 * nm + na + nd + 2.0 * sizeof(int) * B * T +
                  (g->shard ? sizeof(double) * n_gpus : 0) +
                  (host->precision_bf16 && !adapted ? n * sizeof(uint16_t) : 0) +
                  (adapted ? host->n_base * sizeof(float) + nf * sizeof(float) : 0);
    for (int i = 0; i < n_gpus; i++) {
        size_t free_b = 0, total = 0;
        cudaCheck(cudaSetDevice(i));
        cudaCheck(cudaMemGetInfo(&free_b, &total));
        double room = fmax(256.0 * (1 << 20), 0.02 * (double)total);
        double here = need + room + (i == 0 && ranks == 1 ? (double)np : 0.0);
        if (here <= (double)free_b) continue;
        const char *more = n_gpus == 1 && zero
                               ? ", or on more GPUs (--gpus N shares AdamW's moments)"
                           : n_gpus > 1 && !g->shard && ranks == 1 ? ", or with --zero 1"
                                                                   : "";
        snprintf(err, 512,
                 "training at batch %d x %d needs %.2f GB on GPU %d and it has %.2f GB free of "
                 "%.2f; train with a smaller --batch or --seq%s%s",
                 B, T, here / 1e9, i, free_b / 1e9, total / 1e9,
                 host->recompute < MODEL_RECOMPUTE_MAX ? ", with --recompute 2" : "", more);
        cudaCheck(cudaSetDevice(0)); /* replica 0's, as the other calls leave it */
        free(g);
        return NULL;
    }
    for (int i = 0; i < n_gpus; i++) {
        Replica *r = &g->r[i];
        r->device = i;
        cudaCheck(cudaSetDevice(i));
        cudaCheck(cudaStreamCreate(&r->stream));
        cudaCheck(cudaMalloc((void **)&r->params, padded * sizeof(float)));
        cudaCheck(cudaMalloc((void **)&r->grads, padded * sizeof(float)));
        cudaCheck(cudaMemset(r->params, 0, padded * sizeof(float))); /* the padding stays 0 */
        cudaCheck(cudaMemset(r->grads, 0, padded * sizeof(float)));
        cudaCheck(cudaMalloc((void **)&r->m, nm));
        cudaCheck(cudaMalloc((void **)&r->v, nm));
        if (g->shard) cudaCheck(cudaMalloc((void **)&r->parts, sizeof(double) * (size_t)n_gpus));
        cudaCheck(cudaMalloc((void **)&r->acts, na));
        cudaCheck(cudaMalloc((void **)&r->dacts, nd));
        cudaCheck(cudaMalloc((void **)&r->inputs, sizeof(int) * (size_t)B * T));
        cudaCheck(cudaMalloc((void **)&r->targets, sizeof(int) * (size_t)B * T));
        cudaCheck(cudaMemcpy(r->params, host->params, np, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemset(r->m, 0, nm));
        cudaCheck(cudaMemset(r->v, 0, nm));
        if (host->precision_bf16 && !adapted)
            cudaCheck(cudaMalloc((void **)&r->params16, host->n_params * sizeof(uint16_t)));
        if (!adapted) continue;
        size_t nb = host->n_base * sizeof(float);
        cudaCheck(cudaMalloc((void **)&r->base, nb));
        cudaCheck(cudaMemcpy(r->base, host->base, nb, cudaMemcpyHostToDevice));
        if (nf > 0 && host->lora_frozen) {
            cudaCheck(cudaMalloc((void **)&r->frozen, nf * sizeof(float)));
            cudaCheck(cudaMemcpy(r->frozen, host->lora_frozen, nf * sizeof(float),
                                 cudaMemcpyHostToDevice));
        }
    }
#ifdef STRAIT_HAVE_NCCL
    if (ranks > 1) { /* every GPU of every rank in one communicator, bootstrapped by rank 0's id */
        ncclUniqueId id;
        memcpy(&id, nccl_id, sizeof id);
        ncclCheck(ncclGroupStart());
        for (int i = 0; i < n_gpus; i++) {
            cudaCheck(cudaSetDevice(i));
            ncclCheck(ncclCommInitRank(&g->comms[i], g->world, id, rank * n_gpus + i));
        }
        ncclCheck(ncclGroupEnd());
    } else if (n_gpus > 1) {
        int devs[MAX_GPUS];
        for (int i = 0; i < n_gpus; i++) devs[i] = i;
        ncclCheck(ncclCommInitAll(g->comms, n_gpus, devs));
    }
#endif
    return g;
}

extern "C" void model_cuda_free(ModelCuda *g) {
    if (g == NULL) return;
    for (int i = 0; i < g->n; i++) {
        Replica *r = &g->r[i];
        cudaCheck(cudaSetDevice(r->device));
        cudaFree(r->params), cudaFree(r->grads), cudaFree(r->m), cudaFree(r->v);
        cudaFree(r->acts), cudaFree(r->dacts), cudaFree(r->inputs), cudaFree(r->targets);
        cudaFree(r->base), cudaFree(r->frozen), cudaFree(r->params16), cudaFree(r->parts);
        cudaStreamDestroy(r->stream);
        if (i == 0) cudaFree(g->base);
#ifdef STRAIT_HAVE_NCCL
        if (g->world > 1) ncclCommDestroy(g->comms[i]);
#endif
    }
    free(g);
}

/* one pass of the host model's graph on replica r's buffers: with
 * adapters, the frozen base, and the adapters training; the dropout masks
 * from the host's step under way (its drop_seed, set by the trainer), each
 * replica's own, as each CPU rank draws its own */
static Pass replica_pass(const ModelCuda *g, Replica *r, int with_targets) {
    int adapted = g->host->cfg.lora.rank > 0;
    Pass p = {
        .ops = &ops_cuda,
        .stream = r->stream,
        .params = adapted ? r->base : r->params,
        .grads = adapted ? NULL : r->grads,
        .lora = adapted ? r->params : NULL,
        .dlora = adapted ? r->grads : NULL,
        .frozen = r->frozen,
        .acts = r->acts,
        .dacts = r->dacts,
        .lay = &g->lay,
        .inputs = r->inputs,
        .targets = with_targets ? r->targets : NULL,
        .B = g->B,
        .T = g->T,
        /* replica 0 draws the host's masks (those the CPU would), the others their own */
        .drop = r->device == 0 || g->host->drop_seed == 0
                    ? g->host->drop_seed
                    : mix64(g->host->drop_seed + (uint64_t)r->device * 0x9E3779B97F4A7C15ull) | 1};
    return p;
}

/* Mixed precision: the replica's bf16 copy made from its parameters as
 * they are now, and the matmuls pointed at it (on); off after the pass.
 * Nothing without a copy. */
static void replica_mirror(const ModelCuda *g, Replica *r, int on) {
    if (r->params16 == NULL) return;
    size_t n = g->host->n_params;
    if (on) kernels_cuda_to_bf16(r->params16, r->params, n, r->stream);
    kernels_cuda_set_mirror(r->params, on ? r->params16 : NULL, n);
}

/* One replica's whole step, on its own host thread: its batch up, forward,
 * backward, the gradients averaged with the others (its own communicator:
 * NCCL takes one thread per communicator from ncclCommInitAll), clipping
 * and AdamW. The loss and the clipping norm synchronize only this thread,
 * so N GPUs step side by side instead of one after another. */
typedef struct ReplicaStep {
    ModelCuda *g;
    int i;
    const int *inputs, *targets;
    const AdamWConfig *o;
    float lr, max_norm, loss;
} ReplicaStep;

/* AdamW on the table's values [lo, hi), whose moments are the replica's
 * from lo on; decay on matrices only, as on the CPU: per view */
static void replica_adamw(const ReplicaStep *rs, Replica *r, size_t lo, size_t hi) {
    const Model *m = rs->g->host;
    for (int v = 0; v < m->n_views; v++) {
        const ParamView *pv = &m->views[v];
        size_t a = pv->offset > lo ? pv->offset : lo;
        size_t b = pv->offset + pv->numel < hi ? pv->offset + pv->numel : hi;
        if (a >= b) continue;
        adamw_cuda(r->params + a, r->grads + a, r->m + (a - lo), r->v + (a - lo), b - a, rs->lr,
                   rs->o->beta1, rs->o->beta2, rs->o->eps,
                   pv->ndim >= 2 ? rs->o->weight_decay : 0.0f, rs->g->step + 1, r->stream);
    }
}

#ifdef STRAIT_HAVE_NCCL
/* ZeRO-1's end of a step (see the top): reduce-scatter, the norm from
 * every share's squares, AdamW on this replica's share, all-gather */
static void replica_sharded_update(const ReplicaStep *rs, Replica *r) {
    ModelCuda *g = rs->g;
    ncclComm_t comm = g->comms[rs->i];
    size_t S = g->shard, n = g->host->n_params, lo = (size_t)rs->i * S;
    size_t hi = lo + S < n ? lo + S : n, mine = hi > lo ? hi - lo : 0;
    ncclCheck(ncclReduceScatter(r->grads, r->grads + lo, S, ncclFloat, ncclAvg, comm, r->stream));
    double part = sumsq_cuda(r->grads + lo, mine, r->stream), parts[MAX_GPUS], sq = 0;
    cudaCheck(
        cudaMemcpyAsync(r->parts + rs->i, &part, sizeof part, cudaMemcpyHostToDevice, r->stream));
    ncclCheck(ncclAllGather(r->parts + rs->i, r->parts, 1, ncclDouble, comm, r->stream));
    cudaCheck(cudaMemcpyAsync(parts, r->parts, sizeof(double) * (size_t)g->n,
                              cudaMemcpyDeviceToHost, r->stream));
    cudaCheck(cudaStreamSynchronize(r->stream));
    for (int k = 0; k < g->n; k++) sq += parts[k]; /* replica order: the same everywhere */
    float norm = (float)sqrt(sq);
    if (rs->max_norm > 0 && norm > rs->max_norm)
        scale_cuda(r->grads + lo, mine, rs->max_norm / norm, r->stream);
    replica_adamw(rs, r, lo, hi);
    ncclCheck(ncclAllGather(r->params + lo, r->params, S, ncclFloat, comm, r->stream));
    cudaCheck(cudaStreamSynchronize(r->stream));
}
#endif

static void *replica_step(void *arg) {
    ReplicaStep *rs = (ReplicaStep *)arg;
    ModelCuda *g = rs->g;
    const Model *m = g->host;
    Replica *r = &g->r[rs->i];
    size_t bt = (size_t)g->B * g->T;
    cudaCheck(cudaSetDevice(r->device));
    cudaCheck(cudaMemcpyAsync(r->inputs, rs->inputs + rs->i * bt, bt * sizeof(int),
                              cudaMemcpyHostToDevice, r->stream));
    cudaCheck(cudaMemcpyAsync(r->targets, rs->targets + rs->i * bt, bt * sizeof(int),
                              cudaMemcpyHostToDevice, r->stream));
    Pass p = replica_pass(g, r, 1);
    replica_mirror(g, r, 1);
    rs->loss = model_pass_forward(m, &p);
    cudaCheck(cudaMemsetAsync(r->grads, 0, m->n_params * sizeof(float), r->stream));
    model_pass_backward(m, &p);
    replica_mirror(g, r, 0);
#ifdef STRAIT_HAVE_NCCL
    if (g->shard) {
        replica_sharded_update(rs, r);
        return NULL;
    }
    if (g->world > 1) /* in order on the replica's stream: after its backward, before its step */
        ncclCheck(ncclAllReduce(r->grads, r->grads, m->n_params, ncclFloat, ncclAvg,
                                g->comms[rs->i], r->stream));
#endif
    clip_grad_norm_cuda(r->grads, m->n_params, rs->max_norm, r->stream);
    replica_adamw(rs, r, 0, m->n_params);
    cudaCheck(cudaStreamSynchronize(r->stream));
    return NULL;
}

/* One step on every replica: inputs/targets hold n_gpus batches of (B, T),
 * replica i takes the i-th. Returns the mean loss over all replicas. */
extern "C" float model_cuda_step(ModelCuda *g, const int *inputs, const int *targets,
                                 const AdamWConfig *o, float lr, float max_norm) {
    ReplicaStep rs[MAX_GPUS];
    pthread_t th[MAX_GPUS];
    for (int i = 0; i < g->n; i++) rs[i] = ReplicaStep{g, i, inputs, targets, o, lr, max_norm, 0};
    if (g->n == 1) {
        replica_step(&rs[0]);
    } else {
        for (int i = 0; i < g->n; i++)
            if (pthread_create(&th[i], NULL, replica_step, &rs[i]) != 0)
                DIE("cannot start a thread for GPU %d", i);
        for (int i = 0; i < g->n; i++) pthread_join(th[i], NULL);
    }
    g->step++;
    float loss = 0;
    for (int i = 0; i < g->n; i++) loss += rs[i].loss / g->n;
    return loss;
}

extern "C" int model_cuda_steps(ModelCuda *g) {
    return g->step;
}

extern "C" float model_cuda_loss(ModelCuda *g, const int *inputs, const int *targets) {
    const Model *m = g->host;
    Replica *r = &g->r[0];
    size_t bt = (size_t)g->B * g->T;
    cudaCheck(cudaSetDevice(r->device));
    cudaCheck(
        cudaMemcpyAsync(r->inputs, inputs, bt * sizeof(int), cudaMemcpyHostToDevice, r->stream));
    cudaCheck(
        cudaMemcpyAsync(r->targets, targets, bt * sizeof(int), cudaMemcpyHostToDevice, r->stream));
    Pass p = replica_pass(g, r, 1);
    replica_mirror(g, r, 1);
    float loss = model_pass_forward(m, &p); /* the loss comes back to the host: in order */
    replica_mirror(g, r, 0);
    return loss;
}

/* the table's values replica i keeps moments of: from *lo, the count */
static size_t replica_share(const ModelCuda *g, int i, size_t *lo) {
    size_t n = g->host->n_params;
    if (g->shard == 0) return *lo = 0, n;
    *lo = (size_t)i * g->shard < n ? (size_t)i * g->shard : n;
    return *lo + g->shard < n ? g->shard : n - *lo;
}

extern "C" void model_cuda_load_from_host(ModelCuda *g, const Model *host, int what) {
    size_t np = host->n_params * sizeof(float);
    for (int i = 0; i < g->n; i++) {
        Replica *r = &g->r[i];
        cudaCheck(cudaSetDevice(r->device));
        if (what & TRAINER_PARAMS) {
            cudaCheck(cudaMemcpy(r->params, host->params, np, cudaMemcpyHostToDevice));
            if (i == 0 && g->base)
                cudaCheck(cudaMemcpy(g->base, r->params, np, cudaMemcpyDeviceToDevice));
        }
        if (!(what & TRAINER_MOMENTS)) continue;
        size_t lo, k = replica_share(g, i, &lo) * sizeof(float); /* its moments' values */
        if (host->m) {
            cudaCheck(cudaMemcpy(r->m, host->m + lo, k, cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(r->v, host->v + lo, k, cudaMemcpyHostToDevice));
        } else {
            cudaCheck(cudaMemset(r->m, 0, k));
            cudaCheck(cudaMemset(r->v, 0, k));
        }
    }
    if (what & TRAINER_MOMENTS) g->step = host->step;
    cudaCheck(cudaSetDevice(g->r[0].device)); /* replica 0's, as the other calls leave it */
}

extern "C" void model_cuda_keep_base(ModelCuda *g) {
    size_t np = g->host->n_params * sizeof(float);
    cudaCheck(cudaSetDevice(g->r[0].device));
    if (g->base == NULL) cudaCheck(cudaMalloc((void **)&g->base, np));
    cudaCheck(cudaMemcpy(g->base, g->r[0].params, np, cudaMemcpyDeviceToDevice));
}

extern "C" const float *model_cuda_params(ModelCuda *g, const float **base) {
    cudaCheck(cudaSetDevice(g->r[0].device));
    if (base) *base = g->base;
    return g->r[0].params;
}

extern "C" void model_cuda_to_host(ModelCuda *g, Model *host, int what) {
    size_t np = host->n_params * sizeof(float);
    cudaCheck(cudaSetDevice(g->r[0].device));
    if (what & TRAINER_PARAMS)
        cudaCheck(cudaMemcpy(host->params, g->r[0].params, np, cudaMemcpyDeviceToHost));
    if (what & TRAINER_MOMENTS) {
        if (host->m == NULL) {
            host->m = (float *)callocCheck(host->n_params, sizeof(float));
            host->v = (float *)callocCheck(host->n_params, sizeof(float));
        }
        for (int i = 0; i < (g->shard ? g->n : 1); i++) { /* every share, or replica 0's whole */
            size_t lo, k = replica_share(g, i, &lo) * sizeof(float);
            cudaCheck(cudaSetDevice(g->r[i].device));
            cudaCheck(cudaMemcpy(host->m + lo, g->r[i].m, k, cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(host->v + lo, g->r[i].v, k, cudaMemcpyDeviceToHost));
        }
        host->step = g->step;
        cudaCheck(cudaSetDevice(g->r[0].device)); /* as it found it: replica 0's */
    }
}
