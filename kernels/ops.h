/*
 * ops.h — the CPU reference ops (kernels/cpu/ops.c, classifier.c): fp32,
 * row-major; backward ops accumulate into gradients. Their CUDA twins, with
 * the same arguments and a trailing stream, are in cuda.h.
 */
#ifndef STRAIT_KERNELS_OPS_H
#define STRAIT_KERNELS_OPS_H

#include <stddef.h>

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
 * never held. classifier_forward returns the mean loss; losses (N) and lse
 * (N, each row's log-sum-exp) may be NULL. classifier_backward accumulates
 * dh and dwte of the mean loss from the forward's lse. */
float classifier_forward(float *losses, float *lse, const float *h, const float *wte,
                         const int *targets, int N, int C, int V);
void classifier_backward(float *dh, float *dwte, const float *h, const float *wte,
                         const int *targets, const float *lse, int N, int C, int V);
/* Both in one call (dh and dwte NULL: the forward only). */
float classifier_forward_backward(float *losses, float *dh, float *dwte, const float *h,
                                  const float *wte, const int *targets, int N, int C, int V);
/* logits (V) of one row h (C), for sampling */
void classifier_logits(float *logits, const float *h, const float *wte, int C, int V);

#endif /* STRAIT_KERNELS_OPS_H */
