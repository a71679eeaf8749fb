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
    const char *exe;    /* the strait program the children run */
    const char *dir;    /* where it all goes; NULL: a new /tmp/strait-demo-XXXXXX */
    const char *model;  /* a byte-level preset (vocabulary 256) */
    const char *codec;  /* the uplink codec, or NULL for the recipe's */
    const char *recipe; /* diloco, fedavg, ... */
    const char *device; /* cpu or cuda, for the sites */
    int sites, rounds, steps, non_iid, baseline, seed; /* seed 0: the sites' own */
    const char *sets[DEMO_MAX_SETS];                   /* federation.ini edits, SECTION.KEY=VALUE */
    int n_sets;
    AdapterConfig lora; /* rank 0: the whole model trains; else adapters over its seeded base */
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

#endif /* STRAIT_DEMO_H */
