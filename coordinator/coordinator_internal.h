/*
 * coordinator_internal.h — the running coordinator's state, shared by
 * service.c (identity, Join, Hello, Admin) and rounds.c (the round loop).
 * Nothing outside coordinator/ includes it.
 */
#ifndef STRAIT_COORDINATOR_INTERNAL_H
#define STRAIT_COORDINATOR_INTERNAL_H

#include <pthread.h>

#include "compress/compress.h"
#include "coordinator.h"
#include "kernels/kernels.h"
#include "net/net.h"
#include "util/util.h"

#define MAX_REPORTS 256

typedef struct Rounds {
    GPT model;      /* θ of the current round in model.params; owned */
    OuterOpt outer; /* owned */
    RoundSum sum;   /* owned */
    CodecParams uplink;
    int robust; /* 0: streaming weighted mean; else kind + 1 */
    double trim;
    char kept[MAX_REPORTS][64]; /* robust rounds: the updates' files under spool/ */
    int n_kept;
    int64_t total, min_sites, deadline_ms, inner_steps, max_extensions;
    int64_t number, round_id, opened_ms;
    int extensions, finished;
    char reported[MAX_REPORTS][65];
    int n_reported;
    double eval_sum, eval_weight; /* token-weighted eval loss of the round */
    uint8_t *ckpt; /* the current model's checkpoint bytes, served by GetModel; owned */
    size_t ckpt_len;
    uint8_t ckpt_sha[32];
    /* the lossless delta (XOR byte planes, zstd) from the previous round's
     * model to the current one, for sites that hold the previous; owned */
    uint8_t *delta;
    size_t delta_len;
    uint8_t delta_sha[32];
    int64_t delta_from;     /* the round whose model the delta applies to; -1: none */
    int64_t bytes_down;     /* sent by GetModel this round */
    NetSpool *spool;        /* owned */
    pthread_mutex_t lock;   /* guards everything above */
    pthread_cond_t changed; /* a round committed or the federation finished */
    pthread_t ticker;
    int stop;
} Rounds;

typedef struct Coordinator {
    char dir[1024];
    char name[128];
    char model[32];
    char *ca, *ca_key, *server_chain, *server_key; /* owned PEM */
    char admin_sha[65];
    long site_cert_days;
    Store *store; /* owned, guarded by store_lock */
    pthread_mutex_t store_lock;
    int64_t started_ms;
    Rounds rounds;
} Coordinator;

/* The site behind the call's certificate, or a refusal set on the call. */
int coordinator_authorize_site(Coordinator *co, NetCall *c, StoreSite *site);

/* rounds.c */
int rounds_start(Coordinator *co, const Config *cfg, char *err); /* util Config */
void rounds_stop(Coordinator *co);
int rounds_add_methods(Coordinator *co, NetServer *srv, char *err);
/* what Hello tells a site about the federation */
void rounds_describe(Coordinator *co, uint64_t *round, uint64_t *total, uint64_t *table_hash,
                     uint32_t *inner_steps, int *finished, const char **codec);

#endif
