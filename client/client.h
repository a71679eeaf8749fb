/*
 * client.h — the API of client/: the site agent. For now: joining a
 * federation (key made here, CSR, token, pinned CA), greeting the
 * coordinator with the site's certificate, and renewing that certificate.
 *
 * The site folder SITEDIR:
 *   site.key (0600), site.crt   the site's key and certificate
 *   ca.crt                      the federation CA (pinned at join)
 *   site.ini                    [site] name, coordinator
 */
#ifndef STRAIT_CLIENT_H
#define STRAIT_CLIENT_H

#include <stdint.h>
#include <stddef.h>

/* 2: secure aggregation's phases; 3: its KEYS answer with the neighbours'
 * keys alone, and distributed DP */
#define CLIENT_PROTOCOL_VERSION 3

typedef struct SiteJoinOptions {
    const char *site_dir;
    const char *name;        /* the name the token was issued for */
    const char *coordinator; /* HOST:PORT */
    const char *token;
    const char *ca_sha256; /* the CA fingerprint to pin */
    const char *join;      /* the enrollment listener's HOST:PORT (NULL: the coordinator's host,
                            * the next port) */
} SiteJoinOptions;

/* Joins: writes SITEDIR (refusing one that already holds a site). */
int client_join(const SiteJoinOptions *o, char *err);

typedef struct SiteHello {
    char federation[128];
    char site_name[65]; /* as the coordinator sees this site */
    char model[32];
} SiteHello;

/* An authenticated Hello with the site's certificate. */
int client_hello(const char *site_dir, SiteHello *out, char *err);

/* A new key and certificate for the same site, over the authenticated
 * channel; replaces site.key and site.crt (a crash mid-way is finished at
 * the next start). */
int client_renew(const char *site_dir, char *err);

typedef struct SiteRunOptions {
    const char *site_dir;
    const char *const *data; /* local training text or .bin shards */
    int n_data;
    int threads;    /* 0: all cores */
    int batch, seq; /* 0: 8 and min(model T, 128) */
    float lr;       /* inner AdamW peak rate; 0: 3e-3 */
    int cuda, gpus; /* train on gpus GPUs (NCCL data parallel), each with its own batch */
    uint64_t seed;  /* the data order; 0: from the clock */
    /* a Hugging Face GPT-2 folder the site holds: when the federation
     * started from the same model, round 0 is built from it, not downloaded */
    const char *init_from;
    /* the most memory this site may take (bytes); 0: what the machine has
     * available when it starts. A federation whose model needs more is
     * refused before anything is allocated. */
    uint64_t max_memory;
    /* AdamW's moments in bf16 (CPU sites): 12 bytes a parameter instead of
     * 16; θ and every update stay fp32 and bit-exact */
    int moments_bf16;
    /* GPU sites: matmuls on TF32 tensor cores (TrainConfig's tf32) */
    int tf32;
    /* a quantized GGUF base under adapters held as a bf16 copy, not in its
     * blocks (Model's blocks_off): faster, more memory, the same values */
    int blocks_off;
    /* CPU ranks: every rank keeps the whole of AdamW's state (--zero 0),
     * instead of its share (ZeRO-1, the default; the same steps bit for bit) */
    int unsharded;
    /* the CPU's matmuls and classifier in bf16 (Model's precision_bf16) */
    int precision_bf16;
    int recompute; /* Model's recompute: MODEL_RECOMPUTE_* (0: keep everything) */
    /* a folder for TensorBoard's event file (a new one each run; NULL:
     * none): rank 0 writes each step's loss, learning rate, gradient norm
     * and tokens/s, and each round's held-out loss before and after */
    const char *tensorboard;
    /* this site's own floor on privacy (0: none): it sends updates only
     * under secure aggregation with distributed DP at a noise multiplier
     * of at least min_noise, whatever the coordinator is configured with */
    double min_noise;
} SiteRunOptions;

/* The site's loop, round after round, until the federation finishes.
 * Transient failures are retried with backoff; returns -1 only on a
 * permanent refusal or a local error. */
int client_run(const SiteRunOptions *o, char *err);

#endif /* STRAIT_CLIENT_H */
