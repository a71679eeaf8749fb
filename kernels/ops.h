/*
 * ops.h — the ops a model's graph is written against: the CPU reference
 * ops (kernels/cpu/: fp32, row-major; backward ops accumulate into their
 * gradients) and `Ops`, one table of them per backend. The graphs in
 * kernels/arch_*.c call only through an Ops table, so one forward and one
 * backward serve the CPU (ops_cpu, kernels/cpu/table.c) and the GPUs (the
 * CUDA plugin's ops_cuda, kernels/cuda/ops.cu, reached through
 * kernels_cuda_ops in cuda.h): the same arguments, on host or on device
 * pointers, and a trailing stream (NULL on the CPU).
 */
#ifndef STRAIT_KERNELS_OPS_H
#define STRAIT_KERNELS_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* Causal attention's shapes: q (B,T,NH·HD) rows of ldq floats, k and v
 * (B,T,NKV·HD) rows of ldkv (GPT-2's packed qkv: all three inside one row
 * of 3C); out (B,T,NH·HD) dense; lse (B,NH,T), each query row's
 * log-sum-exp of its scores, what the forward keeps for the backward in
 * place of the (B,NH,T,T) probabilities. Query head h reads key/value
 * head h / (NH/NKV) (grouped-query attention; NKV = NH is multi-head). */
typedef struct AttnShape {
    int B, T, NH, NKV, HD, ldq, ldkv;
} AttnShape;

/* Rotary position embeddings as Hugging Face's Llama computes them: pairs
 * (i, i + HD/2) of each head turned by t · inv_freq[i], inv_freq[i] =
 * theta^(-2i/HD), and with factor > 0 Llama 3's rope_scaling (frequencies
 * whose wavelength exceeds original_ctx / low_freq are divided by factor,
 * those under original_ctx / high_freq kept, the ones between blended). */
typedef struct RopeConfig {
    float theta;
    float factor, low_freq, high_freq; /* factor 0: no scaling */
    int original_ctx;
} RopeConfig;
/* inv_freq[0 .. HD/2): here, so the CPU ops and the CUDA plugin compute the
 * same floats from one definition */
static inline void rope_inv_freq(const RopeConfig *r, int HD, float *inv_freq) {
    for (int i = 0; i < HD / 2; i++) {
        /* theta^(-2i/HD) in float, as transformers computes it */
        float f = 1.0f / powf(r->theta, (float)(2 * i) / (float)HD);
        if (r->factor > 0) { /* Llama 3's rope_scaling ("rope_type": "llama3") */
            double ctx = r->original_ctx, wavelen = 2 * 3.14159265358979323846 / f;
            double low_wavelen = ctx / r->low_freq, high_wavelen = ctx / r->high_freq;
            if (wavelen > low_wavelen) {
                f = f / r->factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (ctx / wavelen - r->low_freq) / (r->high_freq - r->low_freq);
                f = (float)((1 - smooth) * f / r->factor + smooth * f);
            }
        }
        inv_freq[i] = f;
    }
}

/* Dropout's mask, drawn again wherever it is needed (the forward, the
 * backward, the CPU or a GPU) rather than kept: value i of a mask seeded s
 * survives when a hash of (s, i) is at least threshold = p·2^32, so a
 * fraction p of the values drops. Here, so both backends draw the same
 * bits from one definition. */
#ifdef __CUDACC__
#define OPS_HOST_DEVICE __host__ __device__
#else
#define OPS_HOST_DEVICE
#endif
/* SplitMix64's finalizer: a well-mixed 64 bits of z (model.c's seeded
 * draws, the dropout masks and their seeds) */
static inline OPS_HOST_DEVICE uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline OPS_HOST_DEVICE uint32_t dropout_threshold(float p) {
    double t = (double)p * 4294967296.0;
    return t <= 0 ? 0u : t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
}
static inline OPS_HOST_DEVICE int dropout_keep(uint64_t s, uint64_t i, uint32_t threshold) {
    return (uint32_t)(mix64(s + (i + 1) * 0x9E3779B97F4A7C15ull) >> 32) >= threshold;
}

void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                     int C); /* wpe NULL: token embeddings alone */
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                      int C);
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                       const float *bias, int N, int C);
void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C);
/* out = x / rms(x) ⊙ w per row, rms = sqrt(mean(x²) + eps); rstd (N) kept */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                     float eps);
void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                      const float *rstd, int N, int C);
/* out (N,OC) = inp (N,C) · weight (OC,C)ᵀ + bias (bias may be NULL) */
void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                    int C, int OC);
void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC);
/* The same over a frozen weight held in bf16 (cpu/bf16.c): the input (or
 * dout) rounded to bf16, the products summed in fp32. The weight is its
 * bf16 values (h), run on oneDNN's bf16 kernels where the chip has bf16
 * instructions (bf16_units), or the same values widened back to fp32 (f)
 * for sgemm where it has none; one of the two. The backward makes dinp
 * (+=) alone: a frozen weight has no gradient. */
typedef struct BfWeight {
    const uint16_t *h;
    const float *f;
} BfWeight;
void matmul_forward_bf16(float *out, const float *inp, const BfWeight *w, const float *bias, int N,
                         int C, int OC);
void matmul_backward_bf16(float *dinp, const float *dout, const BfWeight *w, int N, int C, int OC);
/* dweight (OC,C) += doutᵀ · inp and dbias += dout's column sums (NULL:
 * none), the product's inputs rounded to bf16 and summed in fp32: mixed
 * precision's weight gradient */
void matmul_weight_bf16(float *dweight, float *dbias, const float *dout, const float *inp, int N,
                        int C, int OC);
/* The fused classifier (as above) over a frozen bf16 output layer: its
 * logits bf16 products, its softmax and loss in fp32 and fp64; dwte (NULL:
 * frozen) += dlogitsᵀ h (matmul_weight_bf16). */
float classifier_forward_bf16(float *losses, float *lse, const float *h, const BfWeight *wte,
                              const int *targets, int N, int C, int V);
void classifier_backward_bf16(float *dh, float *dwte, const float *h, const BfWeight *wte,
                              const int *targets, const float *lse, int N, int C, int V);
/* rounded to nearest, ties to even; widened back exactly */
void bf16_from_float(uint16_t *out, const float *x, size_t n);
void bf16_widen(float *out, const uint16_t *h, size_t n);
void bf16_round(float *out, const float *x, size_t n); /* rounded, kept as fp32 */
/* whether this chip runs bf16 products natively (oneDNN on AVX-512 BF16
 * or AMX): hold a frozen table as bf16 (h), else widened (f) */
int bf16_units(void);
/* A frozen matrix of rows x cols at offset (in floats) of a table, held
 * in another form (a GGUF file's quantized blocks): unpack writes its rows
 * [r0, r0 + n) as fp32 into out (n x cols), the values the table had. */
typedef struct HeldRows HeldRows;
struct HeldRows {
    size_t offset, rows, cols;
    const void *src; /* what unpack reads */
    uint32_t type;
    int perm; /* the unpacker's own: a row order to undo (0: none) */
    void (*unpack)(const HeldRows *h, size_t r0, size_t n, float *out);
};
/* The CPU table's stream (NULL for none): a frozen table of n values at
 * f32, held again in bf16 (h or f as above). A matmul or classifier whose
 * weight lies inside it, with no weight gradient asked, runs on the copy;
 * one of the `held` matrices (sorted by offset) is unpacked to bf16 into
 * scratch (scratch_cap values, grown as needed) at each use: the same
 * bf16 values as the copy would hold. */
typedef struct CpuStream {
    const float *f32;
    BfWeight copy;
    size_t n;
    /* the fp32 table is the parameters in training, kept (mixed precision:
     * the matmuls and the classifier read the bf16 copy, the rest fp32) */
    int live;
    const HeldRows *held;
    int n_held;
    uint16_t *scratch;
    size_t scratch_cap;
} CpuStream;
void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                       const AttnShape *s);
/* dq, dk, dv laid out as q, k, v; out the forward's; scratch (B,NH,T) is
 * the CUDA op's (the CPU's holds its own, a block of rows a thread) */
void attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                        const float *q, const float *k, const float *v, const float *out,
                        const float *lse, const AttnShape *s);
/* x (B,T,NH,HD) in rows of ld floats, turned in place; the backward turns
 * the gradient back (the rotation's transpose) */
void rope_forward(float *x, int B, int T, int NH, int HD, int ld, const RopeConfig *r);
void rope_backward(float *dx, int B, int T, int NH, int HD, int ld, const RopeConfig *r);
void gelu_forward(float *out, const float *inp, size_t N);
void gelu_backward(float *dinp, const float *inp, const float *dout, size_t N);
/* out = silu(gate) ⊙ up */
void swiglu_forward(float *out, const float *gate, const float *up, size_t N);
void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                     const float *up, size_t N);
void residual_forward(float *out, const float *a, const float *b, size_t N);
void residual_backward(float *da, float *db, const float *dout, size_t N);
/* The fused classifier: logits = h (N,C) · w (V,C)ᵀ and cross-entropy
 * against targets, by tiles with an online softmax — the (N,V) logits are
 * never held. classifier_forward returns the mean loss; losses (N) and lse
 * (N, each row's log-sum-exp) may be NULL. classifier_backward accumulates
 * dh and dw of the mean loss from the forward's lse. */
float classifier_forward(float *losses, float *lse, const float *h, const float *wte,
                         const int *targets, int N, int C, int V);
void classifier_backward(float *dh, float *dwte, const float *h, const float *wte,
                         const int *targets, const float *lse, int N, int C, int V);
/* Both in one call (dh and dwte NULL: the forward only). */
float classifier_forward_backward(float *losses, float *dh, float *dwte, const float *h,
                                  const float *wte, const int *targets, int N, int C, int V);
/* logits (V) of one row h (C), for sampling */
void classifier_logits(float *logits, const float *h, const float *wte, int C, int V);

/* One backend's ops: the functions above with a trailing stream (a
 * cudaStream_t on the GPU, ignored on the CPU). A backend may skip lse
 * (the CUDA classifier recomputes it in its backward). A weight's gradient
 * (matmul's dweight and dbias, rmsnorm's dw, the classifier's dw) may be
 * NULL: the weight is frozen, and only the input's gradient is made
 * (LayerNorm's may not: GPT-2 takes no adapters). */
typedef struct Ops {
    const char *name;
    void (*zero)(float *p, size_t n, void *st);
    void (*encoder_forward)(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C, void *st);
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C, void *st);
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *bias, int N, int C, void *st);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C, void *st);
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                            float eps, void *st);
    void (*rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int C, void *st);
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC, void *st);
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC, void *st);
    void (*attention_forward)(float *out, float *lse, const float *q, const float *k,
                              const float *v, const AttnShape *s, void *st);
    void (*attention_backward)(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                               const float *q, const float *k, const float *v, const float *out,
                               const float *lse, const AttnShape *s, void *st);
    void (*rope_forward)(float *x, int B, int T, int NH, int HD, int ld, const RopeConfig *r,
                         void *st);
    void (*rope_backward)(float *dx, int B, int T, int NH, int HD, int ld, const RopeConfig *r,
                          void *st);
    void (*gelu_forward)(float *out, const float *inp, size_t N, void *st);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t N, void *st);
    void (*swiglu_forward)(float *out, const float *gate, const float *up, size_t N, void *st);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t N, void *st);
    void (*residual_forward)(float *out, const float *a, const float *b, size_t N, void *st);
    void (*residual_backward)(float *da, float *db, const float *dout, size_t N, void *st);
    float (*classifier_forward)(float *losses, float *lse, const float *h, const float *w,
                                const int *targets, int N, int C, int V, void *st);
    void (*classifier_backward)(float *dh, float *dw, const float *h, const float *w,
                                const int *targets, const float *lse, int N, int C, int V,
                                void *st);
    /* y += a·x (an adapter's scaled output, and its gradient) */
    void (*scale_add)(float *y, const float *x, float a, size_t N, void *st);
    /* y = x·mask/(1 - p), or y += that when accumulate (an adapter's input
     * in training, and its gradient), the mask dropout_keep's of seed */
    void (*dropout)(float *y, const float *x, float p, uint64_t seed, size_t N, int accumulate,
                    void *st);
} Ops;

extern const Ops ops_cpu;

#endif /* STRAIT_KERNELS_OPS_H */
