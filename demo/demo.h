/*
 * demo.h — a whole federation on this machine, from nothing: what
 * `strait demo` runs. A federation home, a coordinator process and N site
 * processes of this same program that join over mutual TLS and train on
 * disjoint parts of Debian's fortune collections (one language each when
 * non-IID); the committed rounds reported as they land, refusals and dead
 * processes watched, then the scores (demo_score): held-out loss, bytes
 * against dense exchange, with a baseline the centralized and
 * data-parallel runs at equal tokens, and DIR/summary.json.
 *
 * The caller never starts gRPC in its own process: every networked part is
 * a child, so forking stays safe.
 */
#ifndef STRAIT_DEMO_H
#define STRAIT_DEMO_H

#include <stdint.h>
#include <stdio.h>

#include "kernels/model.h"

#define DEMO_FORTUNES  "/usr/share/games/fortunes"
#define DEMO_MAX_SITES 12
#define DEMO_MAX_SETS  32

typedef struct DemoOptions {
    const char *exe;     /* the strait program the children run */
    const char *version; /* its version, for the report */
    const char *dir;     /* where it all goes; NULL: a new /tmp/strait-demo-XXXXXX */
    const char *model;   /* a byte-level preset (vocabulary 256) */
    const char *codec;   /* the uplink codec, or NULL for the recipe's */
    const char *recipe;  /* diloco, fedavg, ... */
    const char *device;  /* cpu or cuda, for the sites */
    int sites, rounds, steps, non_iid, baseline, seed; /* seed 0: the sites' own */
    const char *sets[DEMO_MAX_SETS];                   /* federation.ini edits, SECTION.KEY=VALUE */
    int n_sets;
    AdapterConfig lora; /* rank 0: the whole model trains; else adapters over its base */
    /* a fine-tune (finetune.c): the pretrained model (GGUF file or Hugging
     * Face folder) the sites start from, each on its own language's
     * collections tokenized by its tokenizer; NULL: a byte-level preset
     * from its seeded draw */
    const char *base;
    float lr;         /* the sites' learning rate; 0: site run's default */
    const char *data; /* a fine-tune's tokens (demo_finetune_data); set by demo_run */
} DemoOptions;

/* Checks what the caller could not: the model a byte-level preset, the
 * codec's parameters, the --set forms, the counts in range. 0, or -1 with
 * err saying which. */
int demo_check(const DemoOptions *o, char *err);
/* Runs the whole demo, reporting to out; stops every process it started
 * whatever happens. 0 when the federation finished and every site ended
 * well, -1 with err set (what stopped it and which log to read). */
int demo_run(const DemoOptions *o, FILE *out, char *err);

/* ---- scoring (score.c) ---- */

struct ModelConfig;
struct StoreTotals;
/* A finished demo federation, for scoring. */
typedef struct DemoRun {
    const char *exe, *dir, *fed, *model, *recipe; /* fed: the federation's folder */
    const struct ModelConfig *cfg;
    int sites, rounds, steps, non_iid, seed;
    int64_t fed_ms;
    char (*files)[512]; /* every site's collections */
    int n_files;
} DemoRun;
/* Scores the final model, prints the two-way bytes (tot) and, with
 * baseline, trains and scores the centralized and data-parallel runs;
 * writes DIR/summary.json. */
int demo_score(const DemoRun *d, const struct StoreTotals *tot, int baseline, FILE *out, char *err);

/* ---- a fine-tune of a pretrained model (finetune.c) ---- */

#define DEMO_FINETUNE_SITES 4 /* one per language: English, German, Spanish, Italian */
#define DEMO_FINETUNE_BATCH 4
#define DEMO_FINETUNE_SEQ   64
#define DEMO_FINETUNE_FULL_LR                                                                      \
    1e-3f /* --baseline's full fine-tune: a pretrained model's every                               \
           * parameter takes a smaller step than its adapters */

/* What a fine-tune needs that a byte-level demo does not: the base, at
 * most one site per language. */
int demo_finetune_check(const DemoOptions *o, char *err);
/* Tokenizes each site's collections with the base's tokenizer into
 * DATA/site-<i+1> (what it trains on) and DATA/site-<i+1>-held-out
 * (a collection of its language no site trains on), by this program's
 * `strait tokenize`. */
int demo_finetune_data(const DemoOptions *o, FILE *out, char *err);
/* site i's training data for --data, and its language's name */
void demo_finetune_site(const char *data, int i, char *path, size_t len, const char **lang);
/* The scores of a finished fine-tune: each site's held-out loss before and
 * after, the bytes a round moved both ways, the adapters exported for PEFT
 * and merged into a GGUF, a sample from the base and from the
 * merged model; with baseline, the same federation training every
 * parameter (full) and one centralized LoRA run on all the sites' text at
 * equal tokens (central), scored on the same held-out text. DIR/summary.json. */
int demo_finetune_score(const DemoOptions *o, const DemoRun *d, const struct StoreTotals *tot,
                        const DemoRun *full, const struct StoreTotals *full_tot, FILE *out,
                        char *err);

#endif /* STRAIT_DEMO_H */
