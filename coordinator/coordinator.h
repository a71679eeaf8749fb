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

#include "store.h"

#define COORD_PROTOCOL_VERSION 1
#define COORD_ADMIN_NAME       "strait-admin"

typedef struct CoordInitOptions {
    const char *name;      /* federation name; default the folder's name */
    const char *listen;    /* default 0.0.0.0:7700 */
    const char *advertise; /* HOST:PORT sites use; default the listen address */
    const char *model;     /* model preset, default "small" */
    int force;             /* replace an existing federation */
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

#endif /* STRAIT_COORDINATOR_H */
