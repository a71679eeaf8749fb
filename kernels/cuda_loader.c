/*
 * cuda_loader.c — the CUDA kernels as a plugin. In a CUDA build the .cu
 * code, cuBLAS, the CUDA runtime and NCCL live in libstrait-cuda.so, not in
 * the strait binary: linking cuBLAS alone costs a process about 210 MB of
 * resident memory at start, which a coordinator or a CPU site would pay
 * for nothing. Every function of cuda.h (and the device query of device.h)
 * is defined here as a forwarder that loads the plugin on first use and
 * calls the plugin's function of the same name.
 *
 * The plugin is looked for in $STRAIT_CUDA_PLUGIN, then beside the
 * executable, one folder up (build/tests/ → build/), and in ../lib/strait/
 * (make install). It is linked -Bsymbolic, so its own calls stay inside it;
 * the host functions it calls (the model's graph, model_pass_forward and
 * model_pass_backward) come from the executable, which is linked -rdynamic.
 */
#ifdef STRAIT_HAVE_CUDA
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda.h"
#include "kernels/device.h"
#include "util/util.h"

#define PLUGIN "libstrait-cuda.so"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *handle;
static char why_not[PATH_MAX + 1200];

static void *try_open(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(why_not, sizeof why_not, "cannot load the CUDA plugin %s: %s", path,
                 e ? e : "unknown error");
        return NULL;
    }
    const int *abi = dlsym(h, "strait_cuda_plugin_abi");
    if (abi == NULL || *abi != STRAIT_CUDA_ABI) { /* its functions take other arguments */
        if (abi == NULL)
            snprintf(why_not, sizeof why_not,
                     "%s is not a strait CUDA plugin, or one from before its interface was "
                     "numbered (no strait_cuda_plugin_abi); install strait's own (make install)",
                     path);
        else
            snprintf(why_not, sizeof why_not,
                     "the CUDA plugin %s is from another build of strait (interface %d, this "
                     "strait's %d); install the two together (make install)",
                     path, *abi, STRAIT_CUDA_ABI);
        dlclose(h);
        return NULL;
    }
    return h;
}

static void load(void) {
    const char *env = getenv("STRAIT_CUDA_PLUGIN");
    if (env && env[0]) {
        handle = try_open(env);
        return;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(why_not, sizeof why_not, "cannot find the executable to find %s beside it",
                 PLUGIN);
        return;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    static const char *const places[] = {"/", "/../", "/../lib/strait/"};
    snprintf(why_not, sizeof why_not, "%s is not beside %s nor in ../lib/strait/", PLUGIN, exe);
    for (size_t i = 0; i < sizeof places / sizeof places[0]; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s%s%s", exe, places[i], PLUGIN);
        if (access(path, F_OK) != 0) continue;
        if ((handle = try_open(path)) != NULL) return;
    }
}

/* The plugin's function `name`, or NULL with the reason in why_not. */
static void *plugin_sym(const char *name) {
    pthread_once(&once, load);
    if (handle == NULL) return NULL;
    void *f = dlsym(handle, name);
    if (f == NULL) snprintf(why_not, sizeof why_not, "the CUDA plugin has no %s", name);
    return f;
}

/* For functions only reachable after the plugin answered (a ModelCuda exists,
 * device memory was allocated): a missing one is a broken install. */
static void *need_sym(const char *name) {
    void *f = plugin_sym(name);
    if (f == NULL) DIE("%s", why_not);
    return f;
}

#define FORWARD(ret, name, params, args)                                                           \
    ret name params {                                                                              \
        static ret(*fn) params;                                                                    \
        if (fn == NULL) *(void **)&fn = need_sym(#name);                                           \
        return fn args;                                                                            \
    }
#define FORWARD_VOID(name, params, args)                                                           \
    void name params {                                                                             \
        static void(*fn) params;                                                                   \
        if (fn == NULL) *(void **)&fn = need_sym(#name);                                           \
        fn args;                                                                                   \
    }

int kernels_gpu_count(char *name, size_t name_len, char *why, size_t why_len) {
    static int (*fn)(char *, size_t, char *, size_t);
    if (fn == NULL && (*(void **)&fn = plugin_sym("kernels_gpu_count")) == NULL) {
        if (name && name_len) name[0] = '\0';
        if (why && why_len) snprintf(why, why_len, "%s", why_not);
        return 0;
    }
    return fn(name, name_len, why, why_len);
}

const char *kernels_nccl_version(void) {
    static const char *(*fn)(void);
    if (fn == NULL && (*(void **)&fn = plugin_sym("kernels_nccl_version")) == NULL) return "";
    return fn();
}

ModelCuda *model_cuda_create(Model *host, int n_gpus, int B, int T, char *err) {
    static ModelCuda *(*fn)(Model *, int, int, int, char *);
    if (fn == NULL && (*(void **)&fn = plugin_sym("model_cuda_create")) == NULL) {
        err_set(err, "%s", why_not);
        return NULL;
    }
    return fn(host, n_gpus, B, T, err);
}

ModelCuda *model_cuda_create_world(Model *host, int n_gpus, int B, int T, int rank, int ranks,
                                   const void *nccl_id, int zero, char *err) {
    static ModelCuda *(*fn)(Model *, int, int, int, int, int, const void *, int, char *);
    if (fn == NULL && (*(void **)&fn = plugin_sym("model_cuda_create_world")) == NULL) {
        err_set(err, "%s", why_not);
        return NULL;
    }
    return fn(host, n_gpus, B, T, rank, ranks, nccl_id, zero, err);
}

int model_cuda_nccl_id(void *id) {
    static int (*fn)(void *);
    if (fn == NULL && (*(void **)&fn = plugin_sym("model_cuda_nccl_id")) == NULL) return -1;
    return fn(id);
}

/* the plugin's ops table: one symbol, not one forwarder per op */
const Ops *kernels_cuda_ops(void) {
    static const Ops *ops;
    if (ops == NULL) ops = need_sym("ops_cuda");
    return ops;
}

FORWARD(void *, kernels_cuda_alloc, (size_t bytes), (bytes))
FORWARD_VOID(kernels_cuda_free, (void *p), (p))
FORWARD_VOID(kernels_cuda_to_device, (void *d, const void *h, size_t bytes), (d, h, bytes))
FORWARD_VOID(kernels_cuda_to_host, (void *h, const void *d, size_t bytes), (h, d, bytes))
FORWARD_VOID(kernels_cuda_copy, (void *d_dst, const void *d_src, size_t bytes),
             (d_dst, d_src, bytes))
FORWARD_VOID(adamw_cuda,
             (float *params, const float *grads, float *m, float *v, size_t n, float lr,
              float beta1, float beta2, float eps, float weight_decay, int step, void *stream),
             (params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, step, stream))
FORWARD(float, clip_grad_norm_cuda, (float *grads, size_t n, float max_norm, void *stream),
        (grads, n, max_norm, stream))
FORWARD(double, sumsq_cuda, (const float *x, size_t n, void *stream), (x, n, stream))
FORWARD_VOID(scale_cuda, (float *x, size_t n, float s, void *stream), (x, n, s, stream))
FORWARD(int, kernels_cuda_mem, (int device, size_t *used, size_t *total), (device, used, total))
FORWARD_VOID(model_cuda_free, (ModelCuda * g), (g))
FORWARD(float, model_cuda_step,
        (ModelCuda * g, const int *inputs, const int *targets, const AdamWConfig *o, float lr,
         float max_norm),
        (g, inputs, targets, o, lr, max_norm))
FORWARD(int, model_cuda_steps, (ModelCuda * g), (g))
FORWARD(float, model_cuda_loss, (ModelCuda * g, const int *inputs, const int *targets),
        (g, inputs, targets))
FORWARD_VOID(model_cuda_load_from_host, (ModelCuda * g, const Model *host, int what),
             (g, host, what))
FORWARD_VOID(model_cuda_to_host, (ModelCuda * g, Model *host, int what), (g, host, what))
FORWARD_VOID(model_cuda_keep_base, (ModelCuda * g), (g))
FORWARD(const float *, model_cuda_params, (ModelCuda * g, const float **base), (g, base))
FORWARD_VOID(kernels_cuda_set_tf32, (int on), (on))
FORWARD_VOID(kernels_cuda_set_mirror, (const float *f32, const uint16_t *h, size_t n), (f32, h, n))
FORWARD_VOID(kernels_cuda_to_bf16, (uint16_t * out, const float *x, size_t n, void *stream),
             (out, x, n, stream))
FORWARD(int, kernels_cuda_copy_checked,
        (float *x, uint64_t n, float *h_out, int take_off, void *stream),
        (x, n, h_out, take_off, stream))
FORWARD(int, kernels_cuda_cast_half,
        (float *x, uint64_t n, int bf16, uint8_t *h_out, int take_off, void *stream),
        (x, n, bf16, h_out, take_off, stream))
FORWARD(int, kernels_cuda_int8_encode,
        (float *x, uint32_t count, uint32_t block, uint8_t *h_raw, int take_off, void *stream),
        (x, count, block, h_raw, take_off, stream))
FORWARD_VOID(kernels_cuda_int8_accumulate,
             (const uint8_t *h_raw, uint32_t count, uint32_t block, float w, float *sum,
              void *stream),
             (h_raw, count, block, w, sum, stream))
FORWARD(int, kernels_cuda_topk_select,
        (const float *x, uint32_t count, uint32_t chunk, uint32_t ppm, uint64_t total_k,
         uint16_t *h_sel, float *h_vals, void *stream),
        (x, count, chunk, ppm, total_k, h_sel, h_vals, stream))
FORWARD_VOID(kernels_cuda_fp32_accumulate,
             (const uint8_t *h_raw, uint64_t n, float w, float *sum, void *stream),
             (h_raw, n, w, sum, stream))
FORWARD_VOID(kernels_cuda_half_accumulate,
             (const uint8_t *h_raw, uint64_t n, int bf16, float w, float *sum, void *stream),
             (h_raw, n, bf16, w, sum, stream))
FORWARD_VOID(kernels_cuda_scatter_accumulate,
             (const uint32_t *h_idx, const float *h_vals, uint64_t k, float w, float *sum,
              void *stream),
             (h_idx, h_vals, k, w, sum, stream))
FORWARD_VOID(kernels_cuda_ef_step,
             (float *e, const float *base, const float *local, float beta, uint64_t n,
              void *stream),
             (e, base, local, beta, n, stream))
#else
typedef int cuda_loader_unused; /* a CPU-only build has no plugin to load */
#endif
