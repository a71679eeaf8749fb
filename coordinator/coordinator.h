/*
 * coordinator.h — the API of coordinator/: the federation's home folder
 * (what `strait init` creates), enrollment of sites, and the coordinator
 * service. The store has its own header, store.h.
 *
 * The home folder DIR:
 *   federation.ini        settings (documented in the file itself)
 *   ca.crt, ca.key        the federation CA (key 0600)
 *   server.crt, .key      the coordinator's TLS certificate chain and key
 *   admin.crt, .key       the administrator's client certificate and key
 *   strait.db             the store; checkpoints/ and spool/ beside it
 */
#ifndef STRAIT_COORDINATOR_H
#define STRAIT_COORDINATOR_H

#include <stddef.h>
#include <stdint.h>

#include "compress/compress.h"
#include "store.h"

#define COORD_PROTOCOL_VERSION 1
#define COORD_ADMIN_NAME       "strait-admin"

typedef struct CoordInitOptions {
    const char *name;      /* federation name; default the folder's name */
    const char *listen;    /* default 0.0.0.0:7700 */
    const char *advertise; /* HOST:PORT sites use; default the listen address */
    const char *model;     /* model preset, default "small" */
    int force;             /* replace an existing federation */
    /* round settings written to federation.ini; 0 or NULL: the defaults */
    int rounds, min_sites, inner_steps;
    const char *uplink, *deadline;
} CoordInitOptions;

/* Creates the home folder. Refuses an existing federation unless force.
 * ca_sha256 gets the CA's fingerprint (what sites pin). */
int coordinator_init_home(const char *dir, const CoordInitOptions *o, char ca_sha256[65],
                          char *err);

/* The CA fingerprint and advertised address of a home. */
int coordinator_home_info(const char *dir, char ca_sha256[65], char *advertise, size_t adv_len,
                          char *err);

/* Valid site names: 1-64 of letters, digits, '-', '_', '.'. */
int coordinator_valid_site_name(const char *name);

/* Records a one-time token for a site (only its SHA-256 is kept). */
int coordinator_enroll(const char *dir, const char *site, int64_t ttl_ms, char token[65],
                       char *err);

/* Revokes a site and its certificates; effective on the next call. */
int coordinator_revoke(const char *dir, const char *site, const char *actor, char *err);

/* Runs the coordinator until SIGINT or SIGTERM. listening(port, ctx) is
 * called once the port is bound (may be NULL). */
int coordinator_run(const char *dir, void (*listening)(int port, void *ctx), void *ctx, char *err);

/* ---- aggregation (coordinator/aggregate.c) -------------------------------- */

/* The round's weighted sum of site updates, built one update at a time
 * (streaming: memory is O(model) whatever the number of sites). An update is
 * inspected whole — table, size, finite values, its norm against the gate —
 * before anything is added, so a refused one is never half-applied. */
typedef struct RoundSum {
    uint64_t n, table_hash;
    float *sum;    /* owned, n floats: Σ w_i Δ_i */
    double weight; /* Σ w_i */
    int accepted;
    double *norms; /* owned: the accepted updates' norms, for the gate */
    int norms_cap;
    double norm_gate; /* refuse norms above gate × median of the accepted (0: off) */
    int gate_min;     /* the gate applies once this many updates are in */
} RoundSum;

int round_sum_init(RoundSum *rs, uint64_t n, uint64_t table_hash, double norm_gate, char *err);
void round_sum_free(RoundSum *rs);
/* Inspects and adds weight × update; 0 added, 1 refused (reason in why,
 * nothing added), -1 on an internal failure. */
int round_sum_add(RoundSum *rs, const uint8_t *blob, size_t len, double weight, char *why);
/* The same gates without adding: for robust rounds, whose updates are kept
 * whole until the round closes. 0 passed (counted), 1 refused, -1 failure. */
int round_sum_check(RoundSum *rs, const uint8_t *blob, size_t len, double weight, char *why);
/* mean (n) = Σ w_i Δ_i / Σ w_i; -1 when nothing was accepted. */
int round_sum_mean(const RoundSum *rs, float *mean, char *err);

/* Coordinate-wise robust aggregation over spooled updates (untrusted silos),
 * block by block so memory stays O(block × updates): the median, or the
 * mean after dropping the trim fraction from each end. */
typedef enum RobustKind { ROBUST_MEDIAN, ROBUST_TRIMMED_MEAN } RobustKind;
int robust_aggregate(const uint8_t *const *blobs, const size_t *lens, int n_updates, uint64_t n,
                     RobustKind kind, double trim, float *out, char *err);

/* The outer optimizer applied to θ with the round's mean pseudo-gradient Δ̄
 * (DESIGN.md §1): Nesterov SGD (DiLoCo: b ← μb + Δ̄; θ ← θ − η(Δ̄ + μb)),
 * plain averaging (FedAvg: θ ← θ − Δ̄), or Adam (FedAdam). Owns its state. */
typedef enum OuterKind { OUTER_NESTEROV, OUTER_AVG, OUTER_ADAM } OuterKind;
typedef struct OuterOpt {
    OuterKind kind;
    float lr, momentum, beta1, beta2, eps;
    uint64_t n;
    int step;
    float *b, *v; /* owned: momentum (Nesterov) or first moment (Adam); second moment */
} OuterOpt;

int outer_init(OuterOpt *o, OuterKind kind, uint64_t n, float lr, float momentum, char *err);
void outer_free(OuterOpt *o);
void outer_step(OuterOpt *o, float *theta, const float *delta_mean);
/* "nesterov", "avg", "adam" → kind; -1 if unknown */
int outer_kind_parse(const char *name, OuterKind *out);

#endif /* STRAIT_COORDINATOR_H */
