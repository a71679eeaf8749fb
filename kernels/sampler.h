/*
 * sampler.h — text from a model (as llm.c's llmc/sampler.h): the next
 * token from a row of logits, greedy or at a temperature with a seeded
 * generator of its own, and a prompt continued token by token.
 */
#ifndef STRAIT_KERNELS_SAMPLER_H
#define STRAIT_KERNELS_SAMPLER_H

#include <stdint.h>
#include <stdio.h>

#include "model.h"
#include "tokenizer.h"

/* A seeded generator (xorshift64): the same seed, the same text. */
typedef struct Sampler {
    uint64_t state;
    float temperature; /* 0: greedy, the largest logit */
} Sampler;

void sampler_init(Sampler *s, uint64_t seed, float temperature);
/* The next id of logits[0..usable): its argmax, or drawn from
 * softmax(logits / temperature). */
int sampler_next(Sampler *s, const float *logits, int usable);

/* Writes prompt and then n tokens the model continues it with to out; with
 * tok NULL, ids are bytes. Only ids the tokenizer has come out (a padded
 * or larger model's others never do). */
void model_sample_text(Model *m, Tokenizer *tok, const char *prompt, int n, float temperature,
                       uint64_t seed, FILE *out);

#endif
