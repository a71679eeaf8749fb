/*
 * wan_bed.h — the WAN test bed (tests/wan/, make test-wan): a coordinator
 * namespace and one namespace per site, each site joined to the coordinator
 * by its own link — a wan_relay (tests/helpers/wan_relay.c) carrying packets
 * between a TUN device at each end, with tc tbf on both devices for the
 * bandwidth each way. Every address lives inside the namespaces: the
 * coordinator is 10.79.0.1 (on its loopback) to every site, site i is
 * 10.79.(i+1).2. Faults are the relay's commands (bed_command). Each
 * namespace's TCP buffers go to 64 MiB, as on a host tuned for long links.
 *
 * Needs CAP_NET_ADMIN and /dev/net/tun (bed_open says why it cannot);
 * bed_close kills whatever still runs in the namespaces and removes them,
 * and bed_open first removes the namespaces of beds whose test process has
 * died.
 */
#ifndef STRAIT_TESTS_WAN_BED_H
#define STRAIT_TESTS_WAN_BED_H

#include <stddef.h>

#include "util/util.h"

#define BED_SITES_MAX  8
#define BED_COORD_HOST "10.79.0.1"

typedef struct BedLink {
    double up_mbit, down_mbit; /* tbf rates: site → coordinator, back; 0: not limited */
    int delay_ms, jitter_ms;   /* one way, both directions (the RTT is twice the delay) */
    double loss;               /* each direction */
    int mtu;                   /* the link's, up to 9000 (0: 1500); jumbo frames let the
                                * relay carry 1 Gbit/s on two cores */
} BedLink;

typedef struct Bed {
    int n_sites;
    char coord_ns[32];
    char site_ns[BED_SITES_MAX][32];
    int relay_pid[BED_SITES_MAX];
    int relay_in[BED_SITES_MAX];  /* its commands */
    int relay_out[BED_SITES_MAX]; /* its replies */
} Bed;

/* Builds the bed: 0, or -1 with why (in why, len bytes) when this machine
 * cannot (no CAP_NET_ADMIN, no TUN, no tbf); then nothing is left made. */
int bed_open(Bed *b, int n_sites, const BedLink *links, char *why, size_t len);
void bed_close(Bed *b);
/* One command line to site's relay (wan_relay.c lists them); -1 when the
 * relay is gone. */
int bed_command(const Bed *b, int site, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The relay's "stats" line for site's link; -1 when it did not answer. */
int bed_stats(const Bed *b, int site, char *out, size_t len);
/* Starts argv (argv[0] a path) inside a namespace: where -1 the
 * coordinator's, else site where's. Its stderr goes to log (appended); its
 * stdout to a pipe in *out_fd when out_fd is set, else to log too. Its pid,
 * or -1. */
int bed_spawn(const Bed *b, int where, char *const argv[], const char *log, int *out_fd);
/* Runs argv to completion inside that namespace. */
ProcResult bed_run(const Bed *b, int where, char *const argv[]);

#endif
