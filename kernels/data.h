/*
 * data.h — training data (kernels/data.c): plain text as byte tokens,
 * llm.c's token shards, a train/validation split and a loader of (B, T)
 * batches. Making shards from text is tokenizer.h.
 */
#ifndef STRAIT_KERNELS_DATA_H
#define STRAIT_KERNELS_DATA_H

#include <stddef.h>
#include <stdint.h>

/* Tokens read from text files (bytes) or .bin shards (ids of a BPE:
 * llm.c's uint16 version 1, or Strait's uint32 version 2 for larger
 * vocabularies); owned. vocab is the least vocabulary that
 * holds them: 256 for text, the largest id + 1 for shards. */
typedef struct TokenSet {
    uint32_t *tokens;
    size_t n;
    int vocab;
    int shards; /* read from .bin shards (a BPE), not text */
} TokenSet;

typedef struct TokenView {
    const uint32_t *tokens;
    size_t n;
} TokenView;

int tokens_load(TokenSet *ts, const char *const *paths, int n_paths, char *err);
void tokens_free(TokenSet *ts);
/* version 1 (uint16) when every id fits, else version 2 (uint32) */
int tokens_write_bin(const char *path, const uint32_t *tokens, size_t n, char *err);
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

#endif /* STRAIT_KERNELS_DATA_H */
